/*
 * gguf.c — a validating reader for GGUF v2/v3 files.
 *
 * Layout (all little-endian): magic "GGUF", u32 version, u64 n_tensors,
 * u64 n_kv, then n_kv metadata entries (string key, u32 value type, value),
 * then n_tensors tensor infos (string name, u32 n_dims, n_dims x i64 ne,
 * u32 ggml type, u64 offset), padding to `general.alignment` (default 32),
 * and the data section; each tensor's offset is relative to its start.
 * A string is a u64 byte count followed by that many bytes (no NUL). An
 * array is u32 element type, u64 count, elements; arrays may nest.
 *
 * Every read goes through a bounds-checked cursor (`reader`) that knows what
 * it is reading, so a short file reports e.g. "truncated while reading
 * metadata key #5 ('spark2_5.block_count')". Counts are checked against the
 * bytes left before anything is allocated: every entry occupies at least a
 * few bytes of file, so allocations are bounded by the file size and loops
 * by the bytes they consume (a count of 2^60 in a small file allocates a
 * handful of entries, then reports the first one that is not there). Metadata values stay in the mapping (strings
 * and arrays point into it); only keys, tensor names and string-array
 * offsets are copied.
 *
 * Ownership after gguf_open: the mapping lives in tensors.files[0] (the
 * gguf_file.file member stays zeroed), so the strings and arrays returned by
 * the accessors stay valid until gguf_close.
 */
#include "io/gguf.h"

#include "base/error.h"
#include "base/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    GGUF_DEFAULT_ALIGNMENT = 32,
    GGUF_MAX_ARRAY_DEPTH = 16,   /* nested arrays deeper than this are refused (stack safety) */
    GGUF_MIN_KV_BYTES = 8 + 4 + 1,     /* empty key, type, a one-byte value */
    GGUF_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8, /* empty name, n_dims = 0, type, offset */
    GGUF_MIN_ARRAY_BYTES = 4 + 8,      /* a nested array: element type + count */
    GGUF_NAME_SHOWN = 160,             /* longest key/name quoted in an error */
};

/* Encoded size of a scalar value type; 0 for STRING / ARRAY. */
static const uint8_t scalar_bytes[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = 1,  [GGUF_TYPE_INT8] = 1,    [GGUF_TYPE_UINT16] = 2, [GGUF_TYPE_INT16] = 2,
    [GGUF_TYPE_UINT32] = 4, [GGUF_TYPE_INT32] = 4,   [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,
    [GGUF_TYPE_UINT64] = 8, [GGUF_TYPE_INT64] = 8,   [GGUF_TYPE_FLOAT64] = 8,
};

const char *gguf_type_name(gguf_type t)
{
    static const char *const names[GGUF_TYPE_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
        "bool", "string", "array", "uint64", "int64", "float64",
    };
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "invalid";
}

static bool type_is_unsigned(gguf_type t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

static bool type_is_signed(gguf_type t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

static bool type_is_float(gguf_type t) { return t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64; }

/* ---- little-endian decoding (independent of the host's byte order) ------ */

static uint64_t load_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int64_t load_signed(const uint8_t *p, unsigned n)
{
    uint64_t raw = load_le(p, n);
    if (n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    int64_t v;
    memcpy(&v, &raw, sizeof v);
    return v;
}

static double load_float(const uint8_t *p, gguf_type t)
{
    if (t == GGUF_TYPE_FLOAT32) {
        uint32_t raw = (uint32_t)load_le(p, 4);
        float f;
        memcpy(&f, &raw, sizeof f);
        return f;
    }
    uint64_t raw = load_le(p, 8);
    double d;
    memcpy(&d, &raw, sizeof d);
    return d;
}

/* ---- the bounds-checked cursor ------------------------------------------ */

typedef struct reader {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    const char *path;
    char what[256]; /* what is being read now, e.g. "metadata key #5 ('x')" */
} reader;

static uint64_t left(const reader *r) { return r->size - r->pos; }

static spark_status truncated(const reader *r, uint64_t need)
{
    return spark_fail(SPARK_ERR_FORMAT, "%s: truncated while reading %s (needs %llu bytes at byte %llu, file has %llu)",
                      r->path, r->what, (unsigned long long)need, (unsigned long long)r->pos,
                      (unsigned long long)r->size);
}

static spark_status take(reader *r, uint64_t n, const uint8_t **p)
{
    if (n > left(r)) return truncated(r, n);
    *p = r->base + r->pos;
    r->pos += n;
    return SPARK_OK;
}

static spark_status read_u32(reader *r, uint32_t *v)
{
    const uint8_t *p = NULL;
    TRY(take(r, 4, &p));
    *v = (uint32_t)load_le(p, 4);
    return SPARK_OK;
}

static spark_status read_u64(reader *r, uint64_t *v)
{
    const uint8_t *p = NULL;
    TRY(take(r, 8, &p));
    *v = load_le(p, 8);
    return SPARK_OK;
}

static spark_status read_str(reader *r, gguf_str *s)
{
    uint64_t len;
    TRY(read_u64(r, &len));
    if (len > left(r))
        return spark_fail(SPARK_ERR_FORMAT, "%s: truncated while reading %s: string of %llu bytes at byte %llu, only %llu left",
                          r->path, r->what, (unsigned long long)len, (unsigned long long)r->pos,
                          (unsigned long long)left(r));
    s->ptr = (const char *)r->base + r->pos;
    s->len = len;
    r->pos += len;
    return SPARK_OK;
}

/* A NUL-terminated copy of a key or name; names with embedded NULs would
 * silently compare equal to their prefix, so they are refused. */
static spark_status copy_name(const reader *r, gguf_str s, char **out)
{
    if (memchr(s.ptr, 0, s.len))
        return spark_fail(SPARK_ERR_FORMAT, "%s: %s contains a NUL byte", r->path, r->what);
    if (s.len >= SIZE_MAX) return spark_fail(SPARK_ERR_NOMEM, "%s: name too long", r->path);
    char *copy = malloc((size_t)s.len + 1);
    if (!copy) return spark_fail(SPARK_ERR_NOMEM, "%s: out of memory copying %s", r->path, r->what);
    memcpy(copy, s.ptr, (size_t)s.len);
    copy[s.len] = '\0';
    *out = copy;
    return SPARK_OK;
}

static int shown_len(uint64_t len) { return len > GGUF_NAME_SHOWN ? GGUF_NAME_SHOWN : (int)len; }

/* ---- metadata values ----------------------------------------------------- */

static spark_status check_type(const reader *r, uint32_t t)
{
    if (t >= GGUF_TYPE_COUNT) return spark_fail(SPARK_ERR_FORMAT, "%s: %s has unknown value type %u", r->path, r->what, t);
    return SPARK_OK;
}

static spark_status check_bools(const reader *r, const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1) return spark_fail(SPARK_ERR_FORMAT, "%s: %s holds bool value %u (expected 0 or 1)", r->path, r->what, p[i]);
    return SPARK_OK;
}

/* Smallest encoding of one value of type t, to bound element counts. */
static uint64_t min_value_bytes(gguf_type t)
{
    if (t == GGUF_TYPE_STRING) return 8;
    if (t == GGUF_TYPE_ARRAY) return GGUF_MIN_ARRAY_BYTES;
    return scalar_bytes[t];
}

/* Validate and step over n values of type t. For string elements, records
 * each one's offset from `start` in str_offsets when given. Nested arrays
 * recurse with depth + 1. */
static spark_status skip_values(reader *r, gguf_type t, uint64_t n, int depth, uint64_t start, uint64_t *str_offsets)
{
    if (n > left(r) / min_value_bytes(t))
        return spark_fail(SPARK_ERR_FORMAT, "%s: truncated while reading %s: array of %llu %s values cannot fit in the %llu bytes left",
                          r->path, r->what, (unsigned long long)n, gguf_type_name(t), (unsigned long long)left(r));
    if (scalar_bytes[t]) {
        const uint8_t *p = NULL;
        TRY(take(r, n * scalar_bytes[t], &p));
        return t == GGUF_TYPE_BOOL ? check_bools(r, p, n) : SPARK_OK;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (t == GGUF_TYPE_STRING) {
            gguf_str s;
            if (str_offsets) str_offsets[i] = r->pos - start;
            TRY(read_str(r, &s));
            continue;
        }
        if (depth >= GGUF_MAX_ARRAY_DEPTH)
            return spark_fail(SPARK_ERR_FORMAT, "%s: %s nests arrays deeper than %d levels", r->path, r->what, GGUF_MAX_ARRAY_DEPTH);
        uint32_t inner;
        uint64_t inner_n;
        TRY(read_u32(r, &inner));
        TRY(check_type(r, inner));
        TRY(read_u64(r, &inner_n));
        TRY(skip_values(r, (gguf_type)inner, inner_n, depth + 1, 0, NULL));
    }
    return SPARK_OK;
}

static spark_status read_array(reader *r, gguf_kv *kv)
{
    uint32_t t;
    TRY(read_u32(r, &t));
    TRY(check_type(r, t));
    TRY(read_u64(r, &kv->arr_len));
    kv->arr_type = (gguf_type)t;
    kv->arr_data = r->base + r->pos;
    if (t == GGUF_TYPE_STRING) {
        /* Bound the allocation by the bytes left before making it. */
        if (kv->arr_len > left(r) / 8) return skip_values(r, kv->arr_type, kv->arr_len, 1, 0, NULL);
        kv->str_offsets = spark_calloc((size_t)kv->arr_len, sizeof *kv->str_offsets, "string array offsets");
        if (!kv->str_offsets) return SPARK_ERR_NOMEM;
    }
    return skip_values(r, kv->arr_type, kv->arr_len, 1, r->pos, kv->str_offsets);
}

static spark_status read_scalar(reader *r, gguf_kv *kv)
{
    const uint8_t *p = NULL;
    unsigned n = scalar_bytes[kv->type];
    TRY(take(r, n, &p));
    if (type_is_unsigned(kv->type)) kv->v.u64 = load_le(p, n);
    else if (type_is_signed(kv->type)) kv->v.i64 = load_signed(p, n);
    else if (type_is_float(kv->type)) kv->v.f64 = load_float(p, kv->type);
    else {
        TRY(check_bools(r, p, 1));
        kv->v.u64 = p[0];
    }
    return SPARK_OK;
}

/* The name that opens entry #index of a section (kind: "metadata key",
 * "tensor info"), copied to *name; r->what then names the entry for the
 * errors that follow. */
static spark_status read_entry_name(reader *r, const char *kind, int64_t index, char **name)
{
    gguf_str s;
    snprintf(r->what, sizeof r->what, "the name of %s #%lld", kind, (long long)index);
    TRY(read_str(r, &s));
    TRY(copy_name(r, s, name));
    snprintf(r->what, sizeof r->what, "%s #%lld ('%.*s')", kind, (long long)index, shown_len(s.len), *name);
    return SPARK_OK;
}

static spark_status read_kv(reader *r, int64_t index, gguf_kv *kv)
{
    TRY(read_entry_name(r, "metadata key", index, &kv->key));
    uint32_t t;
    TRY(read_u32(r, &t));
    TRY(check_type(r, t));
    kv->type = (gguf_type)t;
    if (kv->type == GGUF_TYPE_ARRAY) return read_array(r, kv);
    if (kv->type == GGUF_TYPE_STRING) return read_str(r, &kv->v.str);
    return read_scalar(r, kv);
}

static int compare_kv_keys(const void *a, const void *b)
{
    return strcmp((*(const gguf_kv *const *)a)->key, (*(const gguf_kv *const *)b)->key);
}

static spark_status check_unique_keys(const gguf_file *g, const char *path)
{
    if (g->n_kvs < 2) return SPARK_OK;
    const gguf_kv **sorted = spark_calloc((size_t)g->n_kvs, sizeof *sorted, "metadata key index");
    if (!sorted) return SPARK_ERR_NOMEM;
    for (int64_t i = 0; i < g->n_kvs; i++) sorted[i] = &g->kvs[i];
    qsort(sorted, (size_t)g->n_kvs, sizeof *sorted, compare_kv_keys);
    spark_status status = SPARK_OK;
    for (int64_t i = 1; i < g->n_kvs && status == SPARK_OK; i++)
        if (strcmp(sorted[i - 1]->key, sorted[i]->key) == 0)
            status = spark_fail(SPARK_ERR_FORMAT, "%s: metadata key '%.*s' appears twice", path, GGUF_NAME_SHOWN, sorted[i]->key);
    free(sorted);
    return status;
}

/* ---- header -------------------------------------------------------------- */

static spark_status check_version(const char *path, uint32_t version)
{
    if (version == 2 || version == 3) return SPARK_OK;
    uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= 1 && swapped <= 3)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: big-endian GGUF file (version %u) is not supported; use a little-endian conversion", path, swapped);
    if (version == 1)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (only 2 and 3); re-convert the model", path);
    if (version == 0) return spark_fail(SPARK_ERR_FORMAT, "%s: invalid GGUF version 0", path);
    return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (only 2 and 3)", path, version);
}

static spark_status read_header(reader *r, gguf_file *g, uint64_t *n_tensors, uint64_t *n_kv)
{
    if (r->size == 0) return spark_fail(SPARK_ERR_FORMAT, "%s: file is empty, expected a GGUF file", r->path);
    if (r->size < 4 || memcmp(r->base, "GGUF", 4) != 0) {
        if (r->size >= 4 || memcmp(r->base, "GGUF", (size_t)r->size) != 0)
            return spark_fail(SPARK_ERR_FORMAT, "%s: not a GGUF file (bad magic, expected \"GGUF\")", r->path);
    }
    snprintf(r->what, sizeof r->what, "the header");
    const uint8_t *magic = NULL;
    TRY(take(r, 4, &magic));
    TRY(read_u32(r, &g->version));
    TRY(check_version(r->path, g->version));
    TRY(read_u64(r, n_tensors));
    TRY(read_u64(r, n_kv));
    return SPARK_OK;
}

/* How many entries of at least `min_bytes` each can follow: allocations are
 * sized by this, never by a count read from the file. One more than fits is
 * allowed for, because reading that entry is what reports the truncation
 * (naming it); after `room` minimal entries less than `min_bytes` are left,
 * so entry number room + 1 can never be stored. */
static uint64_t entries_room(const reader *r, uint64_t count, uint64_t min_bytes)
{
    uint64_t room = left(r) / min_bytes + 1;
    return count < room ? count : room;
}

static spark_status read_alignment(gguf_file *g, const char *path)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(g, "general.alignment");
    if (!kv) return SPARK_OK;
    if (!type_is_unsigned(kv->type) && !type_is_signed(kv->type))
        return spark_fail(SPARK_ERR_FORMAT, "%s: metadata key 'general.alignment' has type %s, expected an integer", path, gguf_type_name(kv->type));
    uint64_t a = kv->v.u64; /* a negative signed value shows up huge, and fails below */
    if (a == 0 || (a & (a - 1)) != 0 || a > (UINT64_C(1) << 62))
        return spark_fail(SPARK_ERR_FORMAT, "%s: metadata key 'general.alignment' is %lld, expected a non-zero power of two", path, (long long)kv->v.i64);
    g->alignment = a;
    return SPARK_OK;
}

/* ---- tensor infos -------------------------------------------------------- */

/* Size one tensor from its ne[] and GGML type; fills dtype, shape, nbytes. */
static spark_status size_tensor(const reader *r, tensor_info *t, const int64_t *ne, uint32_t ggml)
{
    uint32_t blk_elems, blk_bytes;
    if (!ggml_type_block(ggml, &blk_elems, &blk_bytes))
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' has unknown GGML type %u", r->path, t->name, ggml);
    /* The product of the non-zero dims must fit, so that a zero dim cannot
     * hide an overflow that multiplying in another order would hit. */
    int64_t numel = 1, bound = 1;
    for (int d = 0; d < t->n_dims; d++) {
        if (__builtin_mul_overflow(bound, ne[d] ? ne[d] : 1, &bound))
            return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' element count overflows (ne = [%lld, %lld, %lld, %lld])",
                              r->path, t->name, (long long)ne[0], (long long)ne[1], (long long)ne[2], (long long)ne[3]);
        numel *= ne[d]; /* numel <= bound, so this cannot overflow */
    }
    int64_t row = t->n_dims ? ne[0] : 1;
    if (row % blk_elems != 0)
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' rows of %lld elements are not a multiple of the %s block size %u",
                          r->path, t->name, (long long)row, ggml_type_name(ggml), blk_elems);
    if (__builtin_mul_overflow((uint64_t)numel / blk_elems, (uint64_t)blk_bytes, &t->nbytes))
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' byte size overflows", r->path, t->name);
    int dtype = dtype_from_ggml(ggml);
    t->dtype = dtype >= 0 ? (spark_dtype)dtype : SPARK_DTYPE_COUNT; /* meaningless: see ggml_types */
    for (int d = 0; d < t->n_dims; d++) t->shape[d] = ne[t->n_dims - 1 - d]; /* outermost first */
    return SPARK_OK;
}

static spark_status read_tensor_info(reader *r, int64_t index, tensor_info *t, uint32_t *ggml, uint64_t *offset)
{
    TRY(read_entry_name(r, "tensor info", index, &t->name));
    uint32_t n_dims;
    TRY(read_u32(r, &n_dims));
    if (n_dims > TENSOR_MAX_DIMS)
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (at most %d)", r->path, t->name, n_dims, TENSOR_MAX_DIMS);
    t->n_dims = (int)n_dims;
    int64_t ne[TENSOR_MAX_DIMS] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t raw;
        TRY(read_u64(r, &raw));
        if (raw > (uint64_t)INT64_MAX)
            return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' has negative dimension ne[%u] = %lld", r->path, t->name, d, (long long)raw);
        ne[d] = (int64_t)raw;
    }
    TRY(read_u32(r, ggml));
    TRY(read_u64(r, offset));
    return size_tensor(r, t, ne, *ggml);
}

/* Check a tensor's offset against the alignment and the file, then point it
 * into the mapping. */
static spark_status place_tensor(const gguf_file *g, const mapped_file *mf, tensor_info *t, uint64_t offset)
{
    if (offset % g->alignment != 0)
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' offset %llu is not a multiple of the alignment %llu",
                          mf->path, t->name, (unsigned long long)offset, (unsigned long long)g->alignment);
    uint64_t start, end;
    if (__builtin_add_overflow(g->data_offset, offset, &start) || __builtin_add_overflow(start, t->nbytes, &end) || end > mf->size)
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' data [offset %llu, %llu bytes] runs past end of file (size %llu)",
                          mf->path, t->name, (unsigned long long)offset, (unsigned long long)t->nbytes,
                          (unsigned long long)mf->size);
    t->data = mf->data + start;
    return SPARK_OK;
}

static spark_status read_tensor_infos(reader *r, gguf_file *g, uint64_t n_tensors, uint64_t cap, uint64_t *offsets)
{
    tensor_dir *dir = &g->tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        ASSERT(i < cap); /* see entries_room */
        tensor_info *t = &dir->tensors[i];
        t->file = dir->files[0].path;
        dir->n_tensors = (int64_t)i + 1; /* so cleanup frees the name on failure */
        TRY(read_tensor_info(r, (int64_t)i, t, &g->ggml_types[i], &offsets[i]));
    }
    return tensor_dir_check_unique(dir);
}

/* ---- open / close --------------------------------------------------------- */

static spark_status parse_metadata(reader *r, gguf_file *g, uint64_t n_kv)
{
    uint64_t cap = entries_room(r, n_kv, GGUF_MIN_KV_BYTES);
    g->kvs = spark_calloc((size_t)cap, sizeof *g->kvs, "GGUF metadata");
    if (!g->kvs) return SPARK_ERR_NOMEM;
    for (uint64_t i = 0; i < n_kv; i++) {
        ASSERT(i < cap); /* see entries_room */
        g->n_kvs = (int64_t)i + 1; /* so cleanup frees the key on failure */
        TRY(read_kv(r, (int64_t)i, &g->kvs[i]));
    }
    TRY(check_unique_keys(g, r->path));
    return read_alignment(g, r->path);
}

static spark_status parse_tensors(reader *r, gguf_file *g, uint64_t n_tensors)
{
    uint64_t cap = entries_room(r, n_tensors, GGUF_MIN_TENSOR_BYTES);
    uint64_t *offsets = spark_calloc((size_t)cap, sizeof *offsets, "GGUF tensor offsets");
    g->ggml_types = spark_calloc((size_t)cap, sizeof *g->ggml_types, "GGUF tensor types");
    spark_status status = offsets && g->ggml_types ? tensor_dir_reserve(&g->tensors, (int64_t)cap) : SPARK_ERR_NOMEM;
    if (status == SPARK_OK) status = read_tensor_infos(r, g, n_tensors, cap, offsets);
    if (status == SPARK_OK) {
        /* The data section starts at the next multiple of the alignment. */
        uint64_t pad = (g->alignment - r->pos % g->alignment) % g->alignment;
        if (__builtin_add_overflow(r->pos, pad, &g->data_offset))
            status = spark_fail(SPARK_ERR_FORMAT, "%s: data section offset overflows", r->path);
    }
    for (int64_t i = 0; i < g->tensors.n_tensors && status == SPARK_OK; i++)
        status = place_tensor(g, &g->tensors.files[0], &g->tensors.tensors[i], offsets[i]);
    free(offsets);
    return status;
}

static spark_status parse(gguf_file *g)
{
    const mapped_file *mf = &g->tensors.files[0];
    reader r = {.base = mf->data, .size = mf->size, .pos = 0, .path = mf->path};
    uint64_t n_tensors, n_kv;
    TRY(read_header(&r, g, &n_tensors, &n_kv));
    TRY(parse_metadata(&r, g, n_kv));
    return parse_tensors(&r, g, n_tensors);
}

spark_status gguf_open(const char *path, gguf_file *out) { return gguf_open_ex(path, NULL, out); }

spark_status gguf_open_ex(const char *path, const mapped_file_opts *opts, gguf_file *out)
{
    memset(out, 0, sizeof *out);
    gguf_file g = {0};
    mapped_file mf;
    TRY(mapped_file_open_ex(path, opts, &mf));
    spark_status status = tensor_dir_adopt_file(&g.tensors, &mf);
    if (status != SPARK_OK) {
        mapped_file_close(&mf);
        return status;
    }
    status = parse(&g);
    if (status != SPARK_OK) {
        gguf_close(&g);
        return status;
    }
    *out = g;
    return SPARK_OK;
}

void gguf_close(gguf_file *g)
{
    if (!g) return;
    for (int64_t i = 0; i < g->n_kvs; i++) {
        free(g->kvs[i].key);
        free(g->kvs[i].str_offsets);
    }
    free(g->kvs);
    free(g->ggml_types);
    tensor_dir_free(&g->tensors);
    mapped_file_close(&g->file);
    memset(g, 0, sizeof *g);
}

/* ---- lookups -------------------------------------------------------------- */

static const char *gguf_path(const gguf_file *g) { return g->tensors.n_files ? g->tensors.files[0].path : "(gguf)"; }

const gguf_kv *gguf_find(const gguf_file *g, const char *key)
{
    for (int64_t i = 0; i < g->n_kvs; i++)
        if (strcmp(g->kvs[i].key, key) == 0) return &g->kvs[i];
    return NULL;
}

static spark_status lookup(const gguf_file *g, const char *key, const gguf_kv **kv)
{
    *kv = gguf_find(g, key);
    if (!*kv) return spark_fail(SPARK_ERR_MISSING, "%s: metadata key '%s' is missing", gguf_path(g), key);
    return SPARK_OK;
}

static spark_status wrong_type(const gguf_file *g, const gguf_kv *kv, const char *expected)
{
    if (kv->type == GGUF_TYPE_ARRAY)
        return spark_fail(SPARK_ERR_FORMAT, "%s: metadata key '%s' is an array of %s, expected %s", gguf_path(g), kv->key,
                          gguf_type_name(kv->arr_type), expected);
    return spark_fail(SPARK_ERR_FORMAT, "%s: metadata key '%s' has type %s, expected %s", gguf_path(g), kv->key,
                      gguf_type_name(kv->type), expected);
}

spark_status gguf_get_i64(const gguf_file *g, const char *key, int64_t *out)
{
    const gguf_kv *kv;
    TRY(lookup(g, key, &kv));
    if (type_is_signed(kv->type)) {
        *out = kv->v.i64;
        return SPARK_OK;
    }
    if (!type_is_unsigned(kv->type)) return wrong_type(g, kv, "an integer");
    if (kv->v.u64 > (uint64_t)INT64_MAX)
        return spark_fail(SPARK_ERR_FORMAT, "%s: metadata key '%s' value %llu does not fit in a signed 64-bit integer",
                          gguf_path(g), key, (unsigned long long)kv->v.u64);
    *out = (int64_t)kv->v.u64;
    return SPARK_OK;
}

spark_status gguf_get_f64(const gguf_file *g, const char *key, double *out)
{
    const gguf_kv *kv;
    TRY(lookup(g, key, &kv));
    if (type_is_float(kv->type)) *out = kv->v.f64;
    else if (type_is_signed(kv->type)) *out = (double)kv->v.i64;
    else if (type_is_unsigned(kv->type)) *out = (double)kv->v.u64;
    else return wrong_type(g, kv, "a number");
    return SPARK_OK;
}

spark_status gguf_get_bool(const gguf_file *g, const char *key, bool *out)
{
    const gguf_kv *kv;
    TRY(lookup(g, key, &kv));
    if (kv->type != GGUF_TYPE_BOOL) return wrong_type(g, kv, "bool");
    *out = kv->v.u64 != 0;
    return SPARK_OK;
}

spark_status gguf_get_str(const gguf_file *g, const char *key, gguf_str *out)
{
    const gguf_kv *kv;
    TRY(lookup(g, key, &kv));
    if (kv->type != GGUF_TYPE_STRING) return wrong_type(g, kv, "string");
    *out = kv->v.str;
    return SPARK_OK;
}

gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i)
{
    ASSERT(kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING && i < kv->arr_len);
    const uint8_t *p = kv->arr_data + kv->str_offsets[i];
    gguf_str s = {(const char *)p + 8, load_le(p, 8)}; /* bounds were checked at open */
    return s;
}

int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i)
{
    gguf_type t = kv->arr_type;
    ASSERT(kv->type == GGUF_TYPE_ARRAY && i < kv->arr_len && (type_is_signed(t) || type_is_unsigned(t) || t == GGUF_TYPE_BOOL));
    const uint8_t *p = kv->arr_data + i * scalar_bytes[t];
    if (type_is_signed(t)) return load_signed(p, scalar_bytes[t]);
    uint64_t raw = load_le(p, scalar_bytes[t]);
    int64_t v;
    memcpy(&v, &raw, sizeof v); /* uint64 values above INT64_MAX wrap to negative */
    return v;
}

double gguf_arr_f64(const gguf_kv *kv, uint64_t i)
{
    gguf_type t = kv->arr_type;
    ASSERT(kv->type == GGUF_TYPE_ARRAY && i < kv->arr_len && t != GGUF_TYPE_STRING && t != GGUF_TYPE_ARRAY);
    if (type_is_float(t)) return load_float(kv->arr_data + i * scalar_bytes[t], t);
    if (type_is_unsigned(t) || t == GGUF_TYPE_BOOL) return (double)load_le(kv->arr_data + i * scalar_bytes[t], scalar_bytes[t]);
    return (double)gguf_arr_i64(kv, i);
}
