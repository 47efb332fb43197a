/*
 * test_gguf.c — the GGUF reader and the dtype tables it relies on.
 *
 * Files are assembled byte by byte with a small GGUF builder, so every test
 * states exactly what is on disk. The valid file carries every metadata type
 * (scalars, arrays, an array of arrays) and tensors of supported and
 * unsupported GGML types; the error tests break one thing each and check the
 * status and that the message names the file and the key/tensor. The
 * truncation test cuts the valid file at every byte of its header, metadata
 * and tensor infos (and at points in the data): each must fail cleanly.
 *
 * With SPARK_FUZZ_SEEDS=DIR set, the valid files are also written into DIR
 * as a seed corpus for tests/fuzz/fuzz_gguf.c.
 */
#include "check.h"
#include "testfile.h"

#include "base/error.h"
#include "io/dtype.h"
#include "io/gguf.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a GGUF builder ------------------------------------------------------- */

typedef struct gb {
    uint32_t version;
    uint64_t align;         /* padding the builder applies; general.alignment is a separate kv */
    tbuf kv, ti, data;
    uint64_t n_kv, n_tensors;
} gb;

static gb gb_new(void) { return (gb){.version = 3, .align = 32}; }

static void put_str(tbuf *b, const char *s)
{
    tb_u64(b, strlen(s));
    tb_bytes(b, s, strlen(s));
}

static tbuf *gb_key(gb *g, const char *key, gguf_type t)
{
    put_str(&g->kv, key);
    tb_u32(&g->kv, t);
    g->n_kv++;
    return &g->kv;
}

static void gb_u32(gb *g, const char *key, uint32_t v) { tb_u32(gb_key(g, key, GGUF_TYPE_UINT32), v); }
static void gb_string(gb *g, const char *key, const char *v) { put_str(gb_key(g, key, GGUF_TYPE_STRING), v); }

static void gb_info(gb *g, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t offset)
{
    put_str(&g->ti, name);
    tb_u32(&g->ti, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) tb_u64(&g->ti, (uint64_t)ne[d]);
    tb_u32(&g->ti, type);
    tb_u64(&g->ti, offset);
    g->n_tensors++;
}

/* A tensor whose data is `n` bytes of a recognisable pattern (or `bytes`). */
static void gb_tensor(gb *g, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, const void *bytes, size_t n)
{
    tb_pad(&g->data, g->align);
    gb_info(g, name, n_dims, ne, type, g->data.len);
    if (bytes) tb_bytes(&g->data, bytes, n);
    else
        for (size_t i = 0; i < n; i++) tb_u8(&g->data, (uint8_t)(i * 7 + 1));
}

/* The whole file; *infos_end (if given) receives the offset where the tensor
 * infos end. Frees the builder's parts. */
static tbuf gb_finish(gb *g, size_t *infos_end)
{
    tbuf f = {0};
    tb_bytes(&f, "GGUF", 4);
    tb_u32(&f, g->version);
    tb_u64(&f, g->n_tensors);
    tb_u64(&f, g->n_kv);
    tb_bytes(&f, g->kv.data, g->kv.len);
    tb_bytes(&f, g->ti.data, g->ti.len);
    if (infos_end) *infos_end = f.len;
    tb_pad(&f, g->align);
    tb_bytes(&f, g->data.data, g->data.len);
    tb_free(&g->kv);
    tb_free(&g->ti);
    tb_free(&g->data);
    return f;
}

/* Write `f` to a temp file, open it, return the status; the path comes back
 * in *path (caller unlinks/frees) so messages can be checked against it. */
static spark_status open_bytes(const void *data, size_t n, gguf_file *g, char **path)
{
    *path = tf_write_temp(data, n, ".gguf");
    spark_clear_error();
    return gguf_open(*path, g);
}

static void drop_path(char *path)
{
    unlink(path);
    free(path);
}

/* Open `f` expecting failure with `want`, the path and `needle` in the error. */
static void expect_error(tbuf *f, spark_status want, const char *needle)
{
    gguf_file g;
    char *path;
    spark_status st = open_bytes(f->data, f->len, &g, &path);
    CHECK_MSG(st == want, "got %s, want %s (%s)", spark_status_str(st), spark_status_str(want), spark_last_error());
    CHECK_ERROR_MENTIONS(path);
    if (needle) CHECK_ERROR_MENTIONS(needle);
    gguf_file zero = {0};
    CHECK(memcmp(&g, &zero, sizeof g) == 0); /* left zeroed */
    if (st == SPARK_OK) gguf_close(&g);
    drop_path(path);
    tb_free(f);
}

static void maybe_write_seed(const tbuf *f, const char *name)
{
    const char *dir = getenv("SPARK_FUZZ_SEEDS");
    if (!dir) return;
    char *path = tf_join(dir, name);
    tf_write(path, f->data, f->len);
    free(path);
}

/* ---- the valid file --------------------------------------------------------- */

static const float f32_data[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
static const int64_t ne_f32[2] = {3, 2}, ne_f16[1] = {4}, ne_bf16[3] = {2, 2, 2}, ne_q8[2] = {32, 2},
                     ne_256[1] = {256}, ne_q6[2] = {256, 1}, ne_q51[1] = {64};

static void add_every_metadata_type(gb *g)
{
    gb_string(g, "general.architecture", "spark2_5");
    tb_u8(gb_key(g, "t.u8", GGUF_TYPE_UINT8), 200);
    tb_u8(gb_key(g, "t.i8", GGUF_TYPE_INT8), (uint8_t)-100);
    tb_u16(gb_key(g, "t.u16", GGUF_TYPE_UINT16), 60000);
    tb_u16(gb_key(g, "t.i16", GGUF_TYPE_INT16), (uint16_t)-30000);
    gb_u32(g, "t.u32", 4000000000u);
    tb_u32(gb_key(g, "t.i32", GGUF_TYPE_INT32), (uint32_t)-2000000000);
    tb_f32(gb_key(g, "t.f32", GGUF_TYPE_FLOAT32), 1.5f);
    tb_u8(gb_key(g, "t.bool", GGUF_TYPE_BOOL), 1);
    gb_string(g, "t.str", "h\xc3\xa9llo");
    tb_u64(gb_key(g, "t.u64", GGUF_TYPE_UINT64), (UINT64_C(1) << 63) + 5);
    tb_u64(gb_key(g, "t.i64", GGUF_TYPE_INT64), (uint64_t)-(INT64_C(1) << 62));
    tb_f64(gb_key(g, "t.f64", GGUF_TYPE_FLOAT64), 2.718281828459045);

    tbuf *b = gb_key(g, "t.arr_i32", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_INT32), tb_u64(b, 3), tb_u32(b, 1), tb_u32(b, (uint32_t)-2), tb_u32(b, 3);
    b = gb_key(g, "t.arr_f32", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_FLOAT32), tb_u64(b, 2), tb_f32(b, 0.5f), tb_f32(b, -1.25f);
    b = gb_key(g, "t.arr_bool", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_BOOL), tb_u64(b, 3), tb_u8(b, 1), tb_u8(b, 0), tb_u8(b, 1);
    b = gb_key(g, "t.arr_str", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_STRING), tb_u64(b, 3), put_str(b, "a"), put_str(b, ""), put_str(b, "ccc");
    b = gb_key(g, "t.arr_empty", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_UINT8), tb_u64(b, 0);
    b = gb_key(g, "t.arr_u64", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_UINT64), tb_u64(b, 2), tb_u64(b, 7), tb_u64(b, UINT64_C(1) << 40);
    /* An array of arrays: [[1, 2] as uint16, ["x"], [[true]]]. */
    b = gb_key(g, "t.arr_arr", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_ARRAY), tb_u64(b, 3);
    tb_u32(b, GGUF_TYPE_UINT16), tb_u64(b, 2), tb_u16(b, 1), tb_u16(b, 2);
    tb_u32(b, GGUF_TYPE_STRING), tb_u64(b, 1), put_str(b, "x");
    tb_u32(b, GGUF_TYPE_ARRAY), tb_u64(b, 1), tb_u32(b, GGUF_TYPE_BOOL), tb_u64(b, 1), tb_u8(b, 1);
    gb_u32(g, "t.after", 7); /* proves the nested array was skipped exactly */
}

static void add_tensors(gb *g)
{
    uint16_t f16[4], bf16[8];
    for (int i = 0; i < 4; i++) f16[i] = f32_to_f16((float)i - 1.5f);
    for (int i = 0; i < 8; i++) bf16[i] = f32_to_bf16((float)i * 0.25f);
    gb_tensor(g, "w.f32", 2, ne_f32, 0, f32_data, sizeof f32_data);
    gb_tensor(g, "w.f16", 1, ne_f16, 1, f16, sizeof f16);
    gb_tensor(g, "w.bf16", 3, ne_bf16, 30, bf16, sizeof bf16);
    gb_tensor(g, "w.q8_0", 2, ne_q8, 8, NULL, 68);
    gb_tensor(g, "w.q4_k", 1, ne_256, 12, NULL, 144);
    gb_tensor(g, "w.q6_k", 2, ne_q6, 14, NULL, 210);
    gb_tensor(g, "w.q5_1", 1, ne_q51, 7, NULL, 48);     /* known to GGML, no dtype of ours */
    gb_tensor(g, "w.iq2_xxs", 1, ne_256, 16, NULL, 66); /* likewise */
    gb_tensor(g, "w.scalar", 0, NULL, 0, f32_data, 4);
}

static tbuf valid_file(uint32_t version, size_t *infos_end)
{
    gb g = gb_new();
    g.version = version;
    add_every_metadata_type(&g);
    add_tensors(&g);
    return gb_finish(&g, infos_end);
}

/* ---- dtype tables and conversions ---------------------------------------- */

static void test_dtype_tables(void)
{
    static const struct { spark_dtype d; const char *name; int elems, bytes; uint32_t ggml; } want[] = {
        {SPARK_DTYPE_F32, "f32", 1, 4, 0},        {SPARK_DTYPE_F16, "f16", 1, 2, 1},
        {SPARK_DTYPE_BF16, "bf16", 1, 2, 30},     {SPARK_DTYPE_Q8_0, "q8_0", 32, 34, 8},
        {SPARK_DTYPE_Q4_0, "q4_0", 32, 18, 2},    {SPARK_DTYPE_Q4_K, "q4_K", 256, 144, 12},
        {SPARK_DTYPE_Q6_K, "q6_K", 256, 210, 14},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(strcmp(dtype_name(want[i].d), want[i].name) == 0);
        CHECK(dtype_block_elems(want[i].d) == want[i].elems);
        CHECK(dtype_block_bytes(want[i].d) == want[i].bytes);
        CHECK(dtype_to_ggml(want[i].d) == want[i].ggml);
        CHECK(dtype_from_ggml(want[i].ggml) == (int)want[i].d);
        CHECK(strcmp(ggml_type_name(want[i].ggml), want[i].name) == 0);
    }
    CHECK(strcmp(dtype_name(SPARK_DTYPE_COUNT), "invalid") == 0);
    CHECK(dtype_row_bytes(SPARK_DTYPE_Q4_K, 512) == 288);
    CHECK(dtype_row_bytes(SPARK_DTYPE_Q8_0, 33) == 0);
    CHECK(dtype_row_bytes(SPARK_DTYPE_F32, UINT64_MAX / 2) == 0); /* overflow */
    CHECK(dtype_from_ggml(7) == -1 && dtype_from_ggml(4) == -1);
    CHECK(strcmp(ggml_type_name(7), "q5_1") == 0 && ggml_type_name(4) == NULL && ggml_type_name(1000) == NULL);
    uint32_t e = 0, b = 0;
    CHECK(ggml_type_block(10, &e, &b) && e == 256 && b == 84);  /* q2_K */
    CHECK(ggml_type_block(15, &e, &b) && e == 256 && b == 292); /* q8_K */
    CHECK(ggml_type_block(23, &e, &b) && e == 256 && b == 136); /* iq4_xs */
    CHECK(ggml_type_block(28, &e, &b) && e == 1 && b == 8);     /* f64 */
    CHECK(!ggml_type_block(5, &e, &b) && !ggml_type_block(31, &e, &b) && !ggml_type_block(77, &e, &b));
    CHECK(dtype_from_safetensors("BF16") == SPARK_DTYPE_BF16 && dtype_from_safetensors("F64") == -1);
    CHECK(dtype_from_safetensors("bf16") == -1);
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_f16_conversions(void)
{
    CHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0xc000) == -2.0f);
    CHECK(f16_to_f32(0x0001) == ldexpf(1, -24));           /* smallest subnormal */
    CHECK(f16_to_f32(0x03ff) == ldexpf(1023, -24));        /* largest subnormal */
    CHECK(f16_to_f32(0x0400) == ldexpf(1, -14));           /* smallest normal */
    CHECK(f16_to_f32(0x7bff) == 65504.0f);
    CHECK(isinf(f16_to_f32(0x7c00)) && f16_to_f32(0xfc00) < 0);
    CHECK(isnan(f16_to_f32(0x7e00)) && isnan(f16_to_f32(0xfc01)));
    CHECK(bits(f16_to_f32(0x8000)) == 0x80000000u);
    /* Every half survives f16 -> f32 -> f16 (NaNs stay NaN). */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = f16_to_f32((uint16_t)h);
        uint16_t back = f32_to_f16(f);
        if (isnan(f) ? !isnan(f16_to_f32(back)) || (back & 0x8000) != (h & 0x8000) : back != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d halves do not round-trip", bad);
    /* Rounding: ties to even, overflow, underflow into subnormals. */
    CHECK(f32_to_f16(65519.0f) == 0x7bff && f32_to_f16(65520.0f) == 0x7c00 && f32_to_f16(1e9f) == 0x7c00);
    CHECK(f32_to_f16(-1e9f) == 0xfc00);
    CHECK(f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00);                  /* tie, even below */
    CHECK(f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02);              /* tie, even above */
    CHECK(f32_to_f16(ldexpf(1, -25)) == 0x0000);                         /* tie to 0 */
    CHECK(f32_to_f16(ldexpf(1.5f, -25)) == 0x0001);
    CHECK(f32_to_f16(ldexpf(3, -25)) == 0x0002);                         /* 1.5 units: tie to even 2 */
    CHECK(f32_to_f16(ldexpf(1, -14) - ldexpf(1, -26)) == 0x0400);        /* rounds up into the normals */
    CHECK(f32_to_f16(ldexpf(1, -30)) == 0 && f32_to_f16(-ldexpf(1, -30)) == 0x8000);
    CHECK(f32_to_f16(NAN) != 0x7c00 && isnan(f16_to_f32(f32_to_f16(NAN))));
    CHECK(isnan(f16_to_f32(f32_to_f16(from_bits(0x7f800001u))))); /* payload only in low bits */
#ifdef __FLT16_MAX__
    /* Against the compiler's own conversion on a spread of floats. */
    uint32_t x = 12345, mismatches = 0;
    for (int i = 0; i < 2000000; i++) {
        x = x * 1664525u + 1013904223u;
        float f = from_bits(x);
        if (isnan(f)) continue;
        _Float16 h = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &h, sizeof hb);
        if (hb != f32_to_f16(f)) mismatches++;
    }
    CHECK_MSG(mismatches == 0, "%u conversions differ from _Float16", mismatches);
#endif
}

static void test_bf16_conversions(void)
{
    CHECK(bf16_to_f32(0x3f80) == 1.0f && bf16_to_f32(0xc040) == -3.0f);
    CHECK(bf16_to_f32(0x0001) == from_bits(0x00010000u)); /* subnormal */
    CHECK(f32_to_bf16(from_bits(0x3f808000u)) == 0x3f80); /* tie, even below */
    CHECK(f32_to_bf16(from_bits(0x3f818000u)) == 0x3f82); /* tie, even above */
    CHECK(f32_to_bf16(from_bits(0x3f808001u)) == 0x3f81);
    CHECK(f32_to_bf16(from_bits(0x3f807fffu)) == 0x3f80);
    CHECK(f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80); /* max float rounds to inf */
    CHECK(f32_to_bf16(INFINITY) == 0x7f80 && f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(f32_to_bf16(from_bits(0x00008000u)) == 0x0000); /* subnormal tie to even 0 */
    CHECK(f32_to_bf16(from_bits(0x00018000u)) == 0x0002);
    uint16_t n = f32_to_bf16(from_bits(0x7f800001u)); /* NaN whose payload would round away */
    CHECK(isnan(bf16_to_f32(n)));
    CHECK(isnan(bf16_to_f32(f32_to_bf16(from_bits(0xffffffffu)))) && (f32_to_bf16(from_bits(0xffffffffu)) & 0x8000));
    int bad = 0;
    for (uint32_t b = 0; b < 0x10000; b++) {
        float f = bf16_to_f32((uint16_t)b);
        if (isnan(f) ? !isnan(bf16_to_f32(f32_to_bf16(f))) : f32_to_bf16(f) != b) bad++;
    }
    CHECK_MSG(bad == 0, "%d bf16 values do not round-trip", bad);
}

/* ---- valid files -------------------------------------------------------------- */

static void check_metadata(const gguf_file *g)
{
    int64_t i = 0;
    double f = 0;
    bool b = false;
    gguf_str s = {0};
    CHECK(g->n_kvs == 21);
    CHECK(gguf_get_str(g, "general.architecture", &s) == SPARK_OK && s.len == 8 && !memcmp(s.ptr, "spark2_5", 8));
    CHECK(gguf_get_i64(g, "t.u8", &i) == SPARK_OK && i == 200);
    CHECK(gguf_get_i64(g, "t.i8", &i) == SPARK_OK && i == -100);
    CHECK(gguf_get_i64(g, "t.u16", &i) == SPARK_OK && i == 60000);
    CHECK(gguf_get_i64(g, "t.i16", &i) == SPARK_OK && i == -30000);
    CHECK(gguf_get_i64(g, "t.u32", &i) == SPARK_OK && i == 4000000000LL);
    CHECK(gguf_get_i64(g, "t.i32", &i) == SPARK_OK && i == -2000000000LL);
    CHECK(gguf_get_f64(g, "t.f32", &f) == SPARK_OK && f == 1.5);
    CHECK(gguf_get_bool(g, "t.bool", &b) == SPARK_OK && b);
    CHECK(gguf_get_str(g, "t.str", &s) == SPARK_OK && s.len == 6 && !memcmp(s.ptr, "h\xc3\xa9llo", 6));
    CHECK(gguf_find(g, "t.u64")->type == GGUF_TYPE_UINT64 && gguf_find(g, "t.u64")->v.u64 == (UINT64_C(1) << 63) + 5);
    CHECK(gguf_get_i64(g, "t.i64", &i) == SPARK_OK && i == -(INT64_C(1) << 62));
    CHECK(gguf_get_f64(g, "t.f64", &f) == SPARK_OK && f == 2.718281828459045);
    CHECK(gguf_get_f64(g, "t.i32", &f) == SPARK_OK && f == -2e9); /* integers widen to float */
    CHECK(gguf_get_i64(g, "t.after", &i) == SPARK_OK && i == 7);
}

static void check_arrays(const gguf_file *g)
{
    const gguf_kv *kv = gguf_find(g, "t.arr_i32");
    CHECK(kv && kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_INT32 && kv->arr_len == 3);
    if (kv) CHECK(gguf_arr_i64(kv, 0) == 1 && gguf_arr_i64(kv, 1) == -2 && gguf_arr_i64(kv, 2) == 3 && gguf_arr_f64(kv, 1) == -2);
    kv = gguf_find(g, "t.arr_f32");
    CHECK(kv && kv->arr_type == GGUF_TYPE_FLOAT32 && kv->arr_len == 2);
    if (kv) CHECK(gguf_arr_f64(kv, 0) == 0.5 && gguf_arr_f64(kv, 1) == -1.25);
    kv = gguf_find(g, "t.arr_bool");
    CHECK(kv && kv->arr_type == GGUF_TYPE_BOOL && kv->arr_len == 3);
    if (kv) CHECK(gguf_arr_i64(kv, 0) == 1 && gguf_arr_i64(kv, 1) == 0 && gguf_arr_i64(kv, 2) == 1);
    kv = gguf_find(g, "t.arr_str");
    CHECK(kv && kv->arr_type == GGUF_TYPE_STRING && kv->arr_len == 3);
    if (kv) {
        gguf_str a = gguf_arr_str(kv, 0), e = gguf_arr_str(kv, 1), c = gguf_arr_str(kv, 2);
        CHECK(a.len == 1 && a.ptr[0] == 'a' && e.len == 0 && c.len == 3 && !memcmp(c.ptr, "ccc", 3));
    }
    kv = gguf_find(g, "t.arr_empty");
    CHECK(kv && kv->arr_type == GGUF_TYPE_UINT8 && kv->arr_len == 0);
    kv = gguf_find(g, "t.arr_u64");
    CHECK(kv && kv->arr_len == 2);
    if (kv) CHECK(gguf_arr_i64(kv, 1) == (INT64_C(1) << 40) && gguf_arr_f64(kv, 0) == 7);
    kv = gguf_find(g, "t.arr_arr");
    CHECK(kv && kv->arr_type == GGUF_TYPE_ARRAY && kv->arr_len == 3 && kv->str_offsets == NULL);
}

static void check_getter_errors(const gguf_file *g, const char *path)
{
    int64_t i;
    double f;
    bool b;
    gguf_str s;
    CHECK(gguf_get_i64(g, "t.u64", &i) == SPARK_ERR_FORMAT); /* 2^63 + 5 does not fit */
    CHECK_ERROR_MENTIONS("t.u64");
    CHECK(gguf_get_i64(g, "t.f32", &i) == SPARK_ERR_FORMAT);
    CHECK_ERROR_MENTIONS("t.f32");
    CHECK_ERROR_MENTIONS(path);
    CHECK(gguf_get_str(g, "t.u32", &s) == SPARK_ERR_FORMAT);
    CHECK_ERROR_MENTIONS("t.u32");
    CHECK(gguf_get_bool(g, "t.u8", &b) == SPARK_ERR_FORMAT);
    CHECK(gguf_get_f64(g, "t.str", &f) == SPARK_ERR_FORMAT);
    CHECK(gguf_get_i64(g, "t.arr_i32", &i) == SPARK_ERR_FORMAT);
    CHECK_ERROR_MENTIONS("array");
    CHECK(gguf_get_i64(g, "no.such.key", &i) == SPARK_ERR_MISSING);
    CHECK_ERROR_MENTIONS("no.such.key");
    CHECK(gguf_find(g, "no.such.key") == NULL);
}

static void check_tensor(const gguf_file *g, int64_t i, const char *name, spark_dtype dt, uint32_t ggml, int n_dims,
                         const int64_t *shape, uint64_t nbytes)
{
    const tensor_info *t = tensor_dir_find(&g->tensors, name);
    CHECK_MSG(t == &g->tensors.tensors[i], "tensor %s", name);
    if (!t) return;
    if (ggml == 7 || ggml == 16) CHECK(t->dtype == SPARK_DTYPE_COUNT);
    else CHECK(t->dtype == dt);
    CHECK(g->ggml_types[i] == ggml);
    CHECK(t->n_dims == n_dims);
    for (int d = 0; d < n_dims; d++) CHECK_MSG(t->shape[d] == shape[d], "%s shape[%d]", name, d);
    CHECK_MSG(t->nbytes == nbytes, "%s: %llu bytes", name, (unsigned long long)t->nbytes);
    const uint8_t *base = g->tensors.files[0].data;
    CHECK(((const uint8_t *)t->data - base - g->data_offset) % g->alignment == 0);
    CHECK(t->file == g->tensors.files[0].path);
}

static void check_tensors(const gguf_file *g)
{
    CHECK(g->tensors.n_tensors == 9 && g->tensors.n_files == 1);
    CHECK(g->alignment == 32 && g->data_offset % 32 == 0);
    static const int64_t s_f32[] = {2, 3}, s_f16[] = {4}, s_bf16[] = {2, 2, 2}, s_q8[] = {2, 32}, s_256[] = {256},
                         s_q6[] = {1, 256}, s_q51[] = {64};
    check_tensor(g, 0, "w.f32", SPARK_DTYPE_F32, 0, 2, s_f32, 24);
    check_tensor(g, 1, "w.f16", SPARK_DTYPE_F16, 1, 1, s_f16, 8);
    check_tensor(g, 2, "w.bf16", SPARK_DTYPE_BF16, 30, 3, s_bf16, 16);
    check_tensor(g, 3, "w.q8_0", SPARK_DTYPE_Q8_0, 8, 2, s_q8, 68);
    check_tensor(g, 4, "w.q4_k", SPARK_DTYPE_Q4_K, 12, 1, s_256, 144);
    check_tensor(g, 5, "w.q6_k", SPARK_DTYPE_Q6_K, 14, 2, s_q6, 210);
    check_tensor(g, 6, "w.q5_1", SPARK_DTYPE_COUNT, 7, 1, s_q51, 48);
    check_tensor(g, 7, "w.iq2_xxs", SPARK_DTYPE_COUNT, 16, 1, s_256, 66);
    check_tensor(g, 8, "w.scalar", SPARK_DTYPE_F32, 0, 0, NULL, 4);
    const tensor_info *t = tensor_dir_find(&g->tensors, "w.f32");
    if (t) {
        CHECK(memcmp(t->data, f32_data, sizeof f32_data) == 0);
        CHECK(tensor_numel(t) == 6);
    }
    t = tensor_dir_find(&g->tensors, "w.bf16");
    if (t) CHECK(bf16_to_f32(((const uint16_t *)t->data)[5]) == 1.25f);
    t = tensor_dir_find(&g->tensors, "w.f16");
    if (t) CHECK(f16_to_f32(((const uint16_t *)t->data)[0]) == -1.5f);
    t = tensor_dir_find(&g->tensors, "w.q8_0");
    if (t) CHECK(((const uint8_t *)t->data)[1] == 8); /* the builder's byte pattern */
    CHECK(tensor_dir_find(&g->tensors, "w.nope") == NULL);
}

static void check_valid(uint32_t version)
{
    tbuf f = valid_file(version, NULL);
    maybe_write_seed(&f, version == 3 ? "valid_v3.gguf" : "valid_v2.gguf");
    gguf_file g;
    char *path;
    spark_status st = open_bytes(f.data, f.len, &g, &path);
    CHECK_MSG(st == SPARK_OK, "%s", spark_last_error());
    if (st == SPARK_OK) {
        CHECK(g.version == version);
        CHECK(g.file.data == NULL && g.file.path == NULL); /* the mapping moved to tensors.files[0] */
        CHECK(strcmp(g.tensors.files[0].path, path) == 0 && g.tensors.files[0].size == f.len);
        check_metadata(&g);
        check_arrays(&g);
        check_getter_errors(&g, path);
        check_tensors(&g);
        gguf_close(&g);
        gguf_close(&g); /* idempotent on the zeroed struct */
    }
    drop_path(path);
    tb_free(&f);
}

static void test_gguf_every_type_v3(void) { check_valid(3); }
static void test_gguf_version2(void) { check_valid(2); }

static void test_gguf_alignment_64(void)
{
    gb g = gb_new();
    g.align = 64;
    gb_u32(&g, "general.alignment", 64);
    gb_string(&g, "pad", "xyz"); /* pushes the infos' end off any 64 boundary */
    static const int64_t ne1[1] = {5}, ne2[1] = {16};
    gb_tensor(&g, "a", 1, ne1, 0, NULL, 20);
    gb_tensor(&g, "b", 1, ne2, 0, NULL, 64);
    tbuf f = gb_finish(&g, NULL);
    maybe_write_seed(&f, "align64.gguf");
    gguf_file gg;
    char *path;
    spark_status st = open_bytes(f.data, f.len, &gg, &path);
    CHECK_MSG(st == SPARK_OK, "%s", spark_last_error());
    if (st == SPARK_OK) {
        CHECK(gg.alignment == 64 && gg.data_offset % 64 == 0);
        const uint8_t *base = gg.tensors.files[0].data;
        CHECK((const uint8_t *)gg.tensors.tensors[1].data - base == (ptrdiff_t)(gg.data_offset + 64));
        CHECK(((const uint8_t *)gg.tensors.tensors[1].data)[0] == 1);
        gguf_close(&gg);
    }
    drop_path(path);
    tb_free(&f);

    /* The same tensor at offset 32 is misaligned under alignment 64. */
    g = gb_new();
    g.align = 64;
    gb_u32(&g, "general.alignment", 64);
    gb_info(&g, "blk.0.misaligned", 1, ne1, 0, 32);
    tb_zeros(&g.data, 128);
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "blk.0.misaligned");
    CHECK_ERROR_MENTIONS("alignment");
}

static void test_gguf_bad_alignment(void)
{
    static const uint32_t bad[] = {0, 48, 3};
    for (size_t i = 0; i < 3; i++) {
        gb g = gb_new();
        gb_u32(&g, "general.alignment", bad[i]);
        tbuf f = gb_finish(&g, NULL);
        expect_error(&f, SPARK_ERR_FORMAT, "general.alignment");
    }
    gb g = gb_new();
    gb_string(&g, "general.alignment", "32");
    tbuf f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "general.alignment");
}

/* ---- header errors -------------------------------------------------------------- */

static tbuf header_only(const char *magic, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    tbuf f = {0};
    tb_bytes(&f, magic, 4);
    tb_u32(&f, version);
    tb_u64(&f, n_tensors);
    tb_u64(&f, n_kv);
    return f;
}

static void test_gguf_bad_magic(void)
{
    tbuf f = header_only("GGUX", 3, 0, 0);
    expect_error(&f, SPARK_ERR_FORMAT, "magic");
    f = header_only("\x89PNG", 3, 0, 0);
    expect_error(&f, SPARK_ERR_FORMAT, "not a GGUF file");
}

static void test_gguf_versions(void)
{
    tbuf f = header_only("GGUF", 1, 0, 0);
    expect_error(&f, SPARK_ERR_UNSUPPORTED, "version 1");
    f = header_only("GGUF", 99, 0, 0);
    expect_error(&f, SPARK_ERR_UNSUPPORTED, "version 99");
    f = header_only("GGUF", 0, 0, 0);
    expect_error(&f, SPARK_ERR_FORMAT, "version 0");
    f = header_only("GGUF", 0x03000000u, 0, 0); /* a big-endian v3 file read little-endian */
    expect_error(&f, SPARK_ERR_UNSUPPORTED, "big-endian");
    f = header_only("GGUF", 3, 0, 0); /* empty but complete: fine */
    gguf_file g;
    char *path;
    CHECK(open_bytes(f.data, f.len, &g, &path) == SPARK_OK);
    CHECK(g.n_kvs == 0 && g.tensors.n_tensors == 0 && g.alignment == 32);
    gguf_close(&g);
    drop_path(path);
    tb_free(&f);
}

static void test_gguf_missing_and_empty_file(void)
{
    gguf_file g;
    spark_clear_error();
    CHECK(gguf_open("/tmp/spark-test-does-not-exist.gguf", &g) == SPARK_ERR_IO);
    CHECK_ERROR_MENTIONS("/tmp/spark-test-does-not-exist.gguf");
    CHECK(gguf_open("/tmp", &g) == SPARK_ERR_IO);
    CHECK_ERROR_MENTIONS("directory");
    tbuf empty = {0};
    expect_error(&empty, SPARK_ERR_FORMAT, "empty");
}

static void test_gguf_huge_counts(void)
{
    tbuf f = header_only("GGUF", 3, 0, UINT64_C(1) << 60);
    expect_error(&f, SPARK_ERR_FORMAT, "metadata key #0");
    f = header_only("GGUF", 3, UINT64_C(1) << 60, 0);
    expect_error(&f, SPARK_ERR_FORMAT, "tensor info #0");
    f = header_only("GGUF", 3, 0, UINT64_C(1) << 60); /* room for 3 minimal entries, then the 4th is missing */
    for (int i = 0; i < 3; i++) tb_u64(&f, 1), tb_u8(&f, (uint8_t)('a' + i)), tb_u32(&f, GGUF_TYPE_UINT8), tb_u8(&f, 0);
    tb_zeros(&f, 12);
    expect_error(&f, SPARK_ERR_FORMAT, "metadata key #3");
    f = header_only("GGUF", 3, UINT64_MAX, UINT64_MAX);
    expect_error(&f, SPARK_ERR_FORMAT, NULL);
    /* Counts that fit the bytes left but whose entries are not there. */
    f = header_only("GGUF", 3, 0, 2);
    tb_u64(&f, 0), tb_u32(&f, GGUF_TYPE_UINT64), tb_u64(&f, 0); /* key #0: "" = 0 */
    tb_zeros(&f, 6);                                            /* key #1: cut short */
    expect_error(&f, SPARK_ERR_FORMAT, "metadata key #1");
}

/* ---- metadata errors ------------------------------------------------------------- */

static void test_gguf_huge_string_lengths(void)
{
    gb g = gb_new(); /* the key's own length */
    tb_u64(&g.kv, UINT64_C(1) << 62);
    tb_zeros(&g.kv, 16);
    g.n_kv = 1;
    tbuf f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "metadata key #0");
    CHECK_ERROR_MENTIONS("truncated");

    g = gb_new(); /* a string value */
    tb_u64(gb_key(&g, "tokenizer.chat_template", GGUF_TYPE_STRING), UINT64_MAX);
    tb_zeros(&g.kv, 16);
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "tokenizer.chat_template");

    g = gb_new(); /* one string inside a string array */
    tbuf *b = gb_key(&g, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_STRING), tb_u64(b, 2), put_str(b, "ok"), tb_u64(b, UINT64_C(1) << 50);
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "tokenizer.ggml.tokens");

    g = gb_new(); /* a tensor name */
    tb_u64(&g.ti, UINT64_C(1) << 61);
    tb_zeros(&g.ti, 24);
    g.n_tensors = 1;
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "tensor info #0");
}

static void test_gguf_huge_array_counts(void)
{
    static const gguf_type types[] = {GGUF_TYPE_UINT8, GGUF_TYPE_FLOAT64, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY};
    for (size_t i = 0; i < 4; i++) {
        gb g = gb_new();
        tbuf *b = gb_key(&g, "spark2_5.attention.sliding_window_pattern", GGUF_TYPE_ARRAY);
        tb_u32(b, types[i]), tb_u64(b, UINT64_C(1) << 60);
        tb_zeros(b, 64);
        tbuf f = gb_finish(&g, NULL);
        expect_error(&f, SPARK_ERR_FORMAT, "spark2_5.attention.sliding_window_pattern");
    }
}

static void test_gguf_bad_values(void)
{
    gb g = gb_new();
    tb_u32(gb_key(&g, "bad.type", (gguf_type)13), 0);
    tbuf f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "bad.type");
    CHECK_ERROR_MENTIONS("13");

    g = gb_new();
    tbuf *b = gb_key(&g, "bad.elem_type", GGUF_TYPE_ARRAY);
    tb_u32(b, 99), tb_u64(b, 1), tb_u32(b, 0);
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "bad.elem_type");

    g = gb_new();
    tb_u8(gb_key(&g, "bad.bool", GGUF_TYPE_BOOL), 2);
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "bad.bool");

    g = gb_new();
    b = gb_key(&g, "bad.bools", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_BOOL), tb_u64(b, 3), tb_u8(b, 1), tb_u8(b, 0), tb_u8(b, 255);
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "bad.bools");

    g = gb_new(); /* a key with a NUL byte inside */
    tb_u64(&g.kv, 7), tb_bytes(&g.kv, "bad\0key", 7), tb_u32(&g.kv, GGUF_TYPE_UINT32), tb_u32(&g.kv, 1);
    g.n_kv = 1;
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "NUL");
}

static void test_gguf_nested_arrays(void)
{
    /* 17 levels of arrays: refused, not a stack overflow. */
    gb g = gb_new();
    tbuf *b = gb_key(&g, "deep", GGUF_TYPE_ARRAY);
    for (int i = 0; i < 17; i++) tb_u32(b, GGUF_TYPE_ARRAY), tb_u64(b, 1);
    tb_u32(b, GGUF_TYPE_UINT8), tb_u64(b, 0);
    tbuf f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "deep");
    CHECK_ERROR_MENTIONS("nests");

    /* An inner array that claims more than is there. */
    g = gb_new();
    b = gb_key(&g, "inner", GGUF_TYPE_ARRAY);
    tb_u32(b, GGUF_TYPE_ARRAY), tb_u64(b, 2);
    tb_u32(b, GGUF_TYPE_UINT32), tb_u64(b, 1), tb_u32(b, 5);
    tb_u32(b, GGUF_TYPE_UINT32), tb_u64(b, 1000);
    f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "inner");
}

static void test_gguf_duplicate_key(void)
{
    gb g = gb_new();
    gb_u32(&g, "spark2_5.block_count", 4);
    gb_string(&g, "general.name", "x");
    gb_u32(&g, "spark2_5.block_count", 5);
    tbuf f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "spark2_5.block_count");
    CHECK_ERROR_MENTIONS("twice");
}

/* ---- tensor info errors ------------------------------------------------------------ */

static tbuf one_bad_tensor(const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t offset, size_t data)
{
    gb g = gb_new();
    gb_string(&g, "general.architecture", "spark2_5");
    gb_info(&g, name, n_dims, ne, type, offset);
    tb_zeros(&g.data, data);
    return gb_finish(&g, NULL);
}

static void test_gguf_tensor_past_eof(void)
{
    static const int64_t ne[2] = {256, 4}; /* 4096 bytes of f32 */
    tbuf f = one_bad_tensor("blk.3.attn_qkv", 2, ne, 0, 0, 2000);
    expect_error(&f, SPARK_ERR_FORMAT, "blk.3.attn_qkv");
    CHECK_ERROR_MENTIONS("runs past end of file");
    CHECK_ERROR_MENTIONS("4096 bytes");
    f = one_bad_tensor("blk.0.ffn_up", 2, ne, 0, UINT64_MAX - 31, 8192); /* offset + size wraps */
    expect_error(&f, SPARK_ERR_FORMAT, "blk.0.ffn_up");
}

static void test_gguf_misaligned_offset(void)
{
    static const int64_t ne[1] = {4};
    tbuf f = one_bad_tensor("output_norm.weight", 1, ne, 0, 4, 64);
    expect_error(&f, SPARK_ERR_FORMAT, "output_norm.weight");
    CHECK_ERROR_MENTIONS("offset 4");
}

static void test_gguf_unknown_ggml_type(void)
{
    static const int64_t ne[1] = {32};
    tbuf f = one_bad_tensor("token_embd.weight", 1, ne, 77, 0, 256);
    expect_error(&f, SPARK_ERR_FORMAT, "token_embd.weight");
    CHECK_ERROR_MENTIONS("77");
    f = one_bad_tensor("token_embd.weight", 1, ne, 4, 0, 256); /* q4_2: removed from the format */
    expect_error(&f, SPARK_ERR_FORMAT, "unknown GGML type 4");
}

static void test_gguf_bad_dims(void)
{
    static const int64_t ne5[5] = {1, 1, 1, 1, 1};
    tbuf f = one_bad_tensor("blk.1.attn_gate.weight", 5, ne5, 0, 0, 64);
    expect_error(&f, SPARK_ERR_FORMAT, "blk.1.attn_gate.weight");
    CHECK_ERROR_MENTIONS("5 dimensions");

    static const int64_t neg[2] = {4, -1};
    f = one_bad_tensor("neg", 2, neg, 0, 0, 64);
    expect_error(&f, SPARK_ERR_FORMAT, "negative");

    static const int64_t q8_31[1] = {31}; /* q8_0 rows must be whole blocks */
    f = one_bad_tensor("blk.2.ffn_down.weight", 1, q8_31, 8, 0, 64);
    expect_error(&f, SPARK_ERR_FORMAT, "blk.2.ffn_down.weight");
    CHECK_ERROR_MENTIONS("block size");
}

static void test_gguf_ne_overflow(void)
{
    static const int64_t big[3] = {INT64_C(1) << 32, INT64_C(1) << 32, INT64_C(1) << 32};
    tbuf f = one_bad_tensor("blk.0.ffn_gate.weight", 3, big, 0, 0, 64);
    expect_error(&f, SPARK_ERR_FORMAT, "blk.0.ffn_gate.weight");
    CHECK_ERROR_MENTIONS("overflows");
    static const int64_t zero[3] = {0, INT64_C(1) << 40, INT64_C(1) << 40}; /* 0 elements, but not in every order */
    f = one_bad_tensor("blk.0.zero", 3, zero, 0, 0, 64);
    expect_error(&f, SPARK_ERR_FORMAT, "blk.0.zero");
    CHECK_ERROR_MENTIONS("overflows");
    static const int64_t bytes[1] = {INT64_C(1) << 62}; /* 2^62 f32 = 2^64 bytes */
    f = one_bad_tensor("blk.0.ffn_up.weight", 1, bytes, 0, 0, 64);
    expect_error(&f, SPARK_ERR_FORMAT, "blk.0.ffn_up.weight");
    CHECK_ERROR_MENTIONS("overflows");
    static const int64_t q[4] = {INT64_C(1) << 40, 1, 1, INT64_C(1) << 22}; /* fits, far past EOF */
    f = one_bad_tensor("blk.0.q", 4, q, 12, 0, 64);
    expect_error(&f, SPARK_ERR_FORMAT, "runs past end of file");
}

static void test_gguf_duplicate_tensor(void)
{
    gb g = gb_new();
    static const int64_t ne[1] = {8};
    gb_tensor(&g, "blk.0.attn_norm.weight", 1, ne, 0, NULL, 32);
    gb_tensor(&g, "output_norm.weight", 1, ne, 0, NULL, 32);
    gb_tensor(&g, "blk.0.attn_norm.weight", 1, ne, 0, NULL, 32);
    tbuf f = gb_finish(&g, NULL);
    expect_error(&f, SPARK_ERR_FORMAT, "blk.0.attn_norm.weight");
    CHECK_ERROR_MENTIONS("twice");
}

/* ---- truncation everywhere ------------------------------------------------------------ */

static void test_gguf_truncated_everywhere(void)
{
    size_t infos_end = 0;
    tbuf f = valid_file(3, &infos_end);
    size_t data_start = (infos_end + 31) / 32 * 32;
    int failures = 0, unclear = 0, cuts = 0;
    char *path = tf_write_temp(f.data, f.len, ".gguf");
    for (size_t cut = 0; cut < f.len; cut++) {
        /* Every byte of the header, metadata and infos; then a stride through the data. */
        if (cut > data_start + 8 && cut != f.len - 1 && cut % 37 != 0) continue;
        if (truncate(path, (off_t)cut) != 0) break;
        gguf_file g;
        spark_clear_error();
        spark_status st = gguf_open(path, &g);
        cuts++;
        if (st != SPARK_ERR_FORMAT) {
            if (failures++ < 5) printf("  cut at %zu: %s %s\n", cut, spark_status_str(st), spark_last_error());
            if (st == SPARK_OK) gguf_close(&g);
        } else if (!strstr(spark_last_error(), path)) {
            if (unclear++ < 5) printf("  cut at %zu: message lacks the path: %s\n", cut, spark_last_error());
        }
    }
    CHECK_MSG(failures == 0 && unclear == 0, "%d of %d cuts were not clean FORMAT errors", failures + unclear, cuts);
    CHECK(cuts > (int)infos_end);

    /* A cut inside one value names the key being read. */
    const uint8_t *key = memmem(f.data, f.len, "t.u32", 5);
    CHECK(key != NULL);
    if (key) {
        tf_write(path, f.data, f.len);
        CHECK(truncate(path, (off_t)(key - f.data + 5 + 4 + 2)) == 0);
        gguf_file g;
        CHECK(gguf_open(path, &g) == SPARK_ERR_FORMAT);
        CHECK_ERROR_MENTIONS("truncated while reading metadata key #5 ('t.u32')");
    }
    const uint8_t *name = memmem(f.data, f.len, "w.q6_k", 6);
    CHECK(name != NULL);
    if (name) {
        tf_write(path, f.data, f.len);
        CHECK(truncate(path, (off_t)(name - f.data + 6 + 4 + 3)) == 0);
        gguf_file g;
        CHECK(gguf_open(path, &g) == SPARK_ERR_FORMAT);
        CHECK_ERROR_MENTIONS("tensor info #5 ('w.q6_k')");
    }
    drop_path(path);
    tb_free(&f);
}

int main(void)
{
    RUN(test_dtype_tables);
    RUN(test_f16_conversions);
    RUN(test_bf16_conversions);
    RUN(test_gguf_every_type_v3);
    RUN(test_gguf_version2);
    RUN(test_gguf_alignment_64);
    RUN(test_gguf_bad_alignment);
    RUN(test_gguf_bad_magic);
    RUN(test_gguf_versions);
    RUN(test_gguf_missing_and_empty_file);
    RUN(test_gguf_huge_counts);
    RUN(test_gguf_huge_string_lengths);
    RUN(test_gguf_huge_array_counts);
    RUN(test_gguf_bad_values);
    RUN(test_gguf_nested_arrays);
    RUN(test_gguf_duplicate_key);
    RUN(test_gguf_tensor_past_eof);
    RUN(test_gguf_misaligned_offset);
    RUN(test_gguf_unknown_ggml_type);
    RUN(test_gguf_bad_dims);
    RUN(test_gguf_ne_overflow);
    RUN(test_gguf_duplicate_tensor);
    RUN(test_gguf_truncated_everywhere);
    CHECK_EXIT();
}
