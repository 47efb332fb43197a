/*
 * mem.c — allocation helpers that turn failure into SPARK_ERR_NOMEM.
 */
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

void *spark_calloc(size_t count, size_t size, const char *what)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) spark_fail(SPARK_ERR_NOMEM, "out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}

void *spark_alloc_aligned(size_t bytes, const char *what)
{
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    if (posix_memalign(&p, 64, rounded) != 0) {
        spark_fail(SPARK_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
        return NULL;
    }
    memset(p, 0, rounded);
    return p;
}

void spark_free_aligned(void *ptr) { free(ptr); }

char *spark_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (!p) {
        spark_fail(SPARK_ERR_NOMEM, "out of memory copying a string of %zu bytes", n);
        return NULL;
    }
    memcpy(p, s, n);
    return p;
}

int spark_mul_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}
