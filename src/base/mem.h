/*
 * mem.h — allocation helpers. Allocation failure is reported as
 * SPARK_ERR_NOMEM in one place instead of being checked ad hoc.
 */
#ifndef SPARK_BASE_MEM_H
#define SPARK_BASE_MEM_H

#include "base/error.h"

#include <stddef.h>
#include <stdint.h>

/* calloc that records SPARK_ERR_NOMEM (naming `what`) on failure. */
void *spark_calloc(size_t count, size_t size, const char *what);

/* 64-byte aligned, zeroed; free with spark_free_aligned. */
void *spark_alloc_aligned(size_t bytes, const char *what);
void spark_free_aligned(void *ptr);

/* strdup that records SPARK_ERR_NOMEM on failure. */
char *spark_strdup(const char *s);

/* true when a*b overflows size_t (the product is stored in *out otherwise). */
int spark_mul_overflows(uint64_t a, uint64_t b, uint64_t *out);

#endif
