/*
 * npy.c — reading and writing NumPy .npy arrays (little-endian float32 and
 * float64, C order). The header is a Python dict literal; we parse only the
 * three keys the format defines and refuse anything else we cannot honour.
 */
#include "io/npy.h"

#include "base/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static spark_status write_array(const char *path, const void *data, size_t elem, const char *descr,
                                const int64_t *shape, int ndim)
{
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
        count *= (size_t)shape[i];
    }
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    int pad = (64 - (10 + len + 1) % 64) % 64; /* header total is a multiple of 64 */
    unsigned hlen = (unsigned)(len + pad + 1);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xFF),
                             (unsigned char)(hlen >> 8)};
    FILE *f = fopen(path, "wb");
    if (!f) return spark_fail(SPARK_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)len, f) == (size_t)len;
    for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    ok = ok && fwrite(data, elem, count, f) == count; /* hosts we support are little-endian */
    if (fclose(f) != 0) ok = 0;
    return ok ? SPARK_OK : spark_fail(SPARK_ERR_IO, "%s: write failed: %s", path, strerror(errno));
}

spark_status npy_write_f32(const char *path, const float *data, const int64_t *shape, int ndim)
{
    return write_array(path, data, sizeof(float), "<f4", shape, ndim);
}

spark_status npy_write_f64(const char *path, const double *data, const int64_t *shape, int ndim)
{
    return write_array(path, data, sizeof(double), "<f8", shape, ndim);
}

/* The value text after 'key': in the header dict, or NULL. */
static const char *dict_value(const char *header, const char *key)
{
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", key);
    const char *at = strstr(header, quoted);
    if (!at) return NULL;
    at = strchr(at + strlen(quoted), ':');
    if (!at) return NULL;
    while (*++at == ' ') {}
    return at;
}

static spark_status parse_header(const char *path, const char *h, int *is_f64, int64_t *shape, int *ndim)
{
    const char *descr = dict_value(h, "descr"), *order = dict_value(h, "fortran_order"), *sh = dict_value(h, "shape");
    if (!descr || !order || !sh) return spark_fail(SPARK_ERR_FORMAT, "%s: malformed .npy header", path);
    if (!strncmp(descr, "'<f4'", 5)) *is_f64 = 0;
    else if (!strncmp(descr, "'<f8'", 5)) *is_f64 = 1;
    else return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: .npy dtype %.8s (expected '<f4' or '<f8')", path, descr);
    if (strncmp(order, "False", 5)) return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: Fortran-order .npy arrays are not read", path);
    if (*sh != '(') return spark_fail(SPARK_ERR_FORMAT, "%s: malformed .npy shape", path);
    *ndim = 0;
    for (const char *p = sh + 1; *p && *p != ')';) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        if (*ndim == NPY_MAX_DIMS || v < 0)
            return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: .npy shape with more than %d dims or negative", path, NPY_MAX_DIMS);
        shape[(*ndim)++] = v;
        p = end;
    }
    return SPARK_OK;
}

static spark_status read_header(const char *path, FILE *f, int *is_f64, int64_t *shape, int *ndim)
{
    unsigned char pre[12];
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6))
        return spark_fail(SPARK_ERR_FORMAT, "%s: not a .npy file (bad magic)", path);
    size_t hlen;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) return spark_fail(SPARK_ERR_FORMAT, "%s: truncated .npy header", path);
        hlen = pre[8] | (size_t)pre[9] << 8;
    } else {
        if (fread(pre + 8, 1, 4, f) != 4) return spark_fail(SPARK_ERR_FORMAT, "%s: truncated .npy header", path);
        hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    }
    if (hlen > 1 << 20) return spark_fail(SPARK_ERR_FORMAT, "%s: .npy header of %zu bytes", path, hlen);
    char *h = malloc(hlen + 1);
    if (!h) return spark_fail(SPARK_ERR_NOMEM, "%s: out of memory", path);
    spark_status st = fread(h, 1, hlen, f) == hlen ? SPARK_OK : spark_fail(SPARK_ERR_FORMAT, "%s: truncated .npy header", path);
    h[hlen] = '\0';
    if (st == SPARK_OK) st = parse_header(path, h, is_f64, shape, ndim);
    free(h);
    return st;
}

spark_status npy_read_f32(const char *path, float **data, int64_t *shape, int *ndim)
{
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return spark_fail(SPARK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int is_f64 = 0;
    spark_status st = read_header(path, f, &is_f64, shape, ndim);
    uint64_t count = 1;
    for (int i = 0; st == SPARK_OK && i < *ndim; i++)
        if (__builtin_mul_overflow(count, (uint64_t)shape[i], &count) || count > (1ull << 34))
            st = spark_fail(SPARK_ERR_FORMAT, "%s: .npy array too large", path);
    size_t elem = is_f64 ? 8 : 4;
    void *raw = st == SPARK_OK ? malloc(count * elem + 1) : NULL;
    if (st == SPARK_OK && !raw) st = spark_fail(SPARK_ERR_NOMEM, "%s: out of memory", path);
    if (st == SPARK_OK && fread(raw, elem, count, f) != count)
        st = spark_fail(SPARK_ERR_FORMAT, "%s: .npy data truncated (expected %llu values)", path,
                        (unsigned long long)count);
    fclose(f);
    if (st != SPARK_OK) {
        free(raw);
        return st;
    }
    if (is_f64) {
        float *out = malloc(count * sizeof(float) + 1);
        if (!out) {
            free(raw);
            return spark_fail(SPARK_ERR_NOMEM, "%s: out of memory", path);
        }
        for (uint64_t i = 0; i < count; i++) out[i] = (float)((double *)raw)[i];
        free(raw);
        raw = out;
    }
    *data = raw;
    return SPARK_OK;
}
