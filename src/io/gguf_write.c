/*
 * gguf_write.c — GGUF v3 writer (layout in gguf.c's header comment).
 *
 * Metadata and tensor infos are encoded into growable byte buffers as they
 * are declared; begin_data writes them after the header, pads to the
 * alignment, and from then on bytes go straight to the file through a large
 * stdio buffer. Every declared size is known up front, so tensor offsets are
 * assigned at declaration and each tensor's padding is emitted as soon as
 * its last byte is written.
 */
#include "io/gguf_write.h"

#include "base/error.h"
#include "base/mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DEFAULT_ALIGNMENT = 32, GGUF_VERSION = 3, FILE_BUFFER = 4 << 20 };

typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
} bytes;

typedef struct tensor_slot {
    uint64_t size;    /* bytes of data */
    uint64_t written;
} tensor_slot;

struct gguf_writer {
    char *path;
    FILE *f;
    char *file_buffer;
    uint32_t alignment;
    spark_status failed; /* sticky */
    int data_started, finished;
    bytes kv, ti;        /* encoded metadata and tensor infos */
    uint64_t n_kv;
    char **keys;         /* for the uniqueness check */
    tensor_slot *tensors;
    uint64_t n_tensors, cap_tensors, next_offset, current;
};

/* ---- byte buffers ---------------------------------------------------------------- */

static spark_status put(gguf_writer *w, bytes *b, const void *data, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) return w->failed = spark_fail(SPARK_ERR_NOMEM, "%s: out of memory encoding GGUF metadata", w->path);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    return SPARK_OK;
}

static spark_status put_le(gguf_writer *w, bytes *b, uint64_t v, int n)
{
    uint8_t le[8];
    for (int i = 0; i < n; i++) le[i] = (uint8_t)(v >> (8 * i));
    return put(w, b, le, (size_t)n);
}

static spark_status put_str(gguf_writer *w, bytes *b, const char *s, uint64_t len)
{
    TRY(put_le(w, b, len, 8));
    return put(w, b, s, (size_t)len);
}

/* ---- metadata ---------------------------------------------------------------------- */

int gguf_writer_has_key(const gguf_writer *w, const char *key)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return 1;
    return 0;
}

/* Checks and the key + type prefix of a new entry. */
static spark_status begin_kv(gguf_writer *w, const char *key, gguf_type type)
{
    if (w->failed) return w->failed;
    if (w->data_started)
        return w->failed = spark_fail(SPARK_ERR_ARG, "%s: metadata key '%s' set after the tensor data began", w->path, key);
    if (gguf_writer_has_key(w, key))
        return w->failed = spark_fail(SPARK_ERR_ARG, "%s: metadata key '%s' set twice", w->path, key);
    char **keys = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *keys);
    if (!keys) return w->failed = spark_fail(SPARK_ERR_NOMEM, "%s: out of memory", w->path);
    w->keys = keys;
    if (!(w->keys[w->n_kv] = spark_strdup(key))) return w->failed = SPARK_ERR_NOMEM;
    w->n_kv++;
    TRY(put_str(w, &w->kv, key, strlen(key)));
    return put_le(w, &w->kv, (uint64_t)type, 4);
}

spark_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    TRY(begin_kv(w, key, GGUF_TYPE_UINT32));
    return put_le(w, &w->kv, v, 4);
}

spark_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    TRY(begin_kv(w, key, GGUF_TYPE_INT32));
    return put_le(w, &w->kv, (uint32_t)v, 4);
}

spark_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    TRY(begin_kv(w, key, GGUF_TYPE_FLOAT32));
    return put_le(w, &w->kv, bits, 4);
}

spark_status gguf_writer_set_bool(gguf_writer *w, const char *key, int v)
{
    TRY(begin_kv(w, key, GGUF_TYPE_BOOL));
    return put_le(w, &w->kv, v ? 1 : 0, 1);
}

spark_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s, size_t len)
{
    TRY(begin_kv(w, key, GGUF_TYPE_STRING));
    return put_str(w, &w->kv, s, len);
}

static int scalar_size(gguf_type t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

spark_status gguf_writer_set_array(gguf_writer *w, const char *key, gguf_type elem, const void *data, uint64_t n)
{
    int size = scalar_size(elem);
    if (!size)
        return w->failed = spark_fail(SPARK_ERR_ARG, "%s: key '%s': arrays of %s need their own call", w->path, key,
                                      gguf_type_name(elem));
    TRY(begin_kv(w, key, GGUF_TYPE_ARRAY));
    TRY(put_le(w, &w->kv, (uint64_t)elem, 4));
    TRY(put_le(w, &w->kv, n, 8));
    return put(w, &w->kv, data, (size_t)(n * (uint64_t)size));
}

spark_status gguf_writer_set_str_array(gguf_writer *w, const char *key, const gguf_str *items, uint64_t n)
{
    TRY(begin_kv(w, key, GGUF_TYPE_ARRAY));
    TRY(put_le(w, &w->kv, GGUF_TYPE_STRING, 4));
    TRY(put_le(w, &w->kv, n, 8));
    for (uint64_t i = 0; i < n; i++) TRY(put_str(w, &w->kv, items[i].ptr, items[i].len));
    return SPARK_OK;
}

static spark_status copy_scalar(gguf_writer *w, const gguf_kv *kv)
{
    int size = scalar_size(kv->type);
    uint64_t raw = kv->v.u64;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        float f = (float)kv->v.f64;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        raw = bits;
    } else if (kv->type == GGUF_TYPE_FLOAT64) {
        memcpy(&raw, &kv->v.f64, 8);
    } else if (kv->type == GGUF_TYPE_INT8 || kv->type == GGUF_TYPE_INT16 || kv->type == GGUF_TYPE_INT32 ||
               kv->type == GGUF_TYPE_INT64) {
        memcpy(&raw, &kv->v.i64, 8);
    }
    return put_le(w, &w->kv, raw, size);
}

spark_status gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv)
{
    if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_ARRAY)
        return w->failed = spark_fail(SPARK_ERR_UNSUPPORTED, "%s: metadata key '%s' is a nested array, which is not copied",
                                      w->path, kv->key);
    if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING) {
        TRY(begin_kv(w, kv->key, GGUF_TYPE_ARRAY));
        TRY(put_le(w, &w->kv, GGUF_TYPE_STRING, 4));
        TRY(put_le(w, &w->kv, kv->arr_len, 8));
        for (uint64_t i = 0; i < kv->arr_len; i++) {
            gguf_str s = gguf_arr_str(kv, i);
            TRY(put_str(w, &w->kv, s.ptr, s.len));
        }
        return SPARK_OK;
    }
    if (kv->type == GGUF_TYPE_ARRAY) /* scalar elements are stored little-endian in the mapping already */
        return gguf_writer_set_array(w, kv->key, kv->arr_type, kv->arr_data, kv->arr_len);
    if (kv->type == GGUF_TYPE_STRING) return gguf_writer_set_str(w, kv->key, kv->v.str.ptr, (size_t)kv->v.str.len);
    TRY(begin_kv(w, kv->key, kv->type));
    return copy_scalar(w, kv);
}

/* ---- tensors --------------------------------------------------------------------- */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

spark_status gguf_writer_add_tensor(gguf_writer *w, const char *name, spark_dtype dtype, int n_dims,
                                    const int64_t *shape)
{
    if (w->failed) return w->failed;
    if (w->data_started)
        return w->failed = spark_fail(SPARK_ERR_ARG, "%s: tensor '%s' declared after the data began", w->path, name);
    if (n_dims < 1 || n_dims > TENSOR_MAX_DIMS)
        return w->failed = spark_fail(SPARK_ERR_ARG, "%s: tensor '%s' has %d dimensions", w->path, name, n_dims);
    uint64_t numel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (shape[d] < 0 || spark_mul_overflows(numel, (uint64_t)shape[d], &numel))
            return w->failed = spark_fail(SPARK_ERR_ARG, "%s: tensor '%s' has a bad shape", w->path, name);
    }
    uint64_t inner = (uint64_t)shape[n_dims - 1];
    uint64_t row = dtype_row_bytes(dtype, inner);
    if (inner && !row)
        return w->failed = spark_fail(SPARK_ERR_ARG, "%s: tensor '%s': %llu values per row do not fill %s blocks of %d",
                                      w->path, name, (unsigned long long)inner, dtype_name(dtype),
                                      dtype_block_elems(dtype));
    uint64_t size = inner ? numel / inner * row : 0;
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        tensor_slot *t = realloc(w->tensors, (size_t)cap * sizeof *t);
        if (!t) return w->failed = spark_fail(SPARK_ERR_NOMEM, "%s: out of memory", w->path);
        w->tensors = t;
        w->cap_tensors = cap;
    }
    w->tensors[w->n_tensors++] = (tensor_slot){.size = size, .written = 0};
    TRY(put_str(w, &w->ti, name, strlen(name)));
    TRY(put_le(w, &w->ti, (uint64_t)n_dims, 4));
    for (int d = n_dims - 1; d >= 0; d--) TRY(put_le(w, &w->ti, (uint64_t)shape[d], 8)); /* ne: innermost first */
    TRY(put_le(w, &w->ti, dtype_to_ggml(dtype), 4));
    TRY(put_le(w, &w->ti, w->next_offset, 8));
    w->next_offset = align_up(w->next_offset + size, w->alignment);
    return SPARK_OK;
}

/* ---- the file ------------------------------------------------------------------ */

static spark_status io_error(gguf_writer *w, const char *what)
{
    return w->failed = spark_fail(SPARK_ERR_IO, "%s: cannot %s: %s", w->path, what, strerror(errno));
}

static spark_status write_raw(gguf_writer *w, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, w->f) != n) return io_error(w, "write");
    return SPARK_OK;
}

static spark_status write_zeros(gguf_writer *w, uint64_t n)
{
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        TRY(write_raw(w, zeros, k));
        n -= k;
    }
    return SPARK_OK;
}

spark_status gguf_writer_create(const char *path, uint32_t alignment, gguf_writer **out)
{
    *out = NULL;
    if (alignment == 0) alignment = DEFAULT_ALIGNMENT;
    if (alignment & (alignment - 1))
        return spark_fail(SPARK_ERR_ARG, "%s: alignment %u is not a power of two", path, alignment);
    gguf_writer *w = spark_calloc(1, sizeof *w, "GGUF writer");
    if (!w) return SPARK_ERR_NOMEM;
    w->alignment = alignment;
    w->path = spark_strdup(path);
    w->file_buffer = malloc(FILE_BUFFER);
    if (!w->path || !w->file_buffer) {
        gguf_writer_free(w);
        return spark_fail(SPARK_ERR_NOMEM, "%s: out of memory", path);
    }
    w->f = fopen(path, "wb");
    if (!w->f) {
        spark_status st = spark_fail(SPARK_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        gguf_writer_free(w);
        return st;
    }
    setvbuf(w->f, w->file_buffer, _IOFBF, FILE_BUFFER);
    if (alignment != DEFAULT_ALIGNMENT) {
        spark_status st = gguf_writer_set_u32(w, "general.alignment", alignment);
        if (st != SPARK_OK) {
            gguf_writer_free(w);
            return st;
        }
    }
    *out = w;
    return SPARK_OK;
}

spark_status gguf_writer_begin_data(gguf_writer *w)
{
    if (w->failed) return w->failed;
    if (w->data_started) return SPARK_OK;
    bytes head = {0};
    spark_status st = put(w, &head, "GGUF", 4);
    if (st == SPARK_OK) st = put_le(w, &head, GGUF_VERSION, 4);
    if (st == SPARK_OK) st = put_le(w, &head, w->n_tensors, 8);
    if (st == SPARK_OK) st = put_le(w, &head, w->n_kv, 8);
    if (st == SPARK_OK) st = write_raw(w, head.p, head.n);
    free(head.p);
    TRY(st);
    TRY(write_raw(w, w->kv.p, w->kv.n));
    TRY(write_raw(w, w->ti.p, w->ti.n));
    uint64_t pos = 4 + 4 + 8 + 8 + w->kv.n + w->ti.n;
    TRY(write_zeros(w, align_up(pos, w->alignment) - pos));
    w->data_started = 1;
    w->current = 0;
    return SPARK_OK;
}

spark_status gguf_writer_write(gguf_writer *w, const void *data, size_t n)
{
    if (w->failed) return w->failed;
    if (!w->data_started) TRY(gguf_writer_begin_data(w));
    const uint8_t *p = data;
    while (n) {
        while (w->current < w->n_tensors && w->tensors[w->current].written == w->tensors[w->current].size)
            w->current++;
        if (w->current >= w->n_tensors)
            return w->failed = spark_fail(SPARK_ERR_ARG, "%s: %zu bytes written past the last tensor", w->path, n);
        tensor_slot *t = &w->tensors[w->current];
        uint64_t room = t->size - t->written;
        size_t k = n < room ? n : (size_t)room;
        TRY(write_raw(w, p, k));
        t->written += k;
        p += k;
        n -= k;
        if (t->written == t->size) TRY(write_zeros(w, align_up(t->size, w->alignment) - t->size));
    }
    return SPARK_OK;
}

spark_status gguf_writer_finish(gguf_writer *w)
{
    if (w->failed) return w->failed;
    if (!w->data_started) TRY(gguf_writer_begin_data(w));
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].written != w->tensors[i].size) {
            if (w->tensors[i].size == 0) continue;
            return w->failed = spark_fail(SPARK_ERR_ARG, "%s: tensor #%llu has %llu of %llu bytes written", w->path,
                                          (unsigned long long)i, (unsigned long long)w->tensors[i].written,
                                          (unsigned long long)w->tensors[i].size);
        }
    int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0) return io_error(w, "close");
    w->finished = 1;
    return SPARK_OK;
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    if (w->f) fclose(w->f);
    if (!w->finished && w->path) remove(w->path);
    free(w->file_buffer);
    free(w->kv.p);
    free(w->ti.p);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->tensors);
    free(w->path);
    free(w);
}
