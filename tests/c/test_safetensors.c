/*
 * test_safetensors.c — the safetensors reader: single files, sharded
 * checkpoints with an index, and every malformed case it must refuse.
 *
 * Each test writes a checkpoint directory under /tmp with hand-written JSON
 * headers, so the bytes on disk are exactly what the test says. Error tests
 * check the status and that the message names the file and the tensor (or
 * the index key) at fault.
 */
#include "check.h"
#include "testfile.h"

#include "base/error.h"
#include "io/dtype.h"
#include "io/safetensors.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 40 bytes of data: 4 f32, 6 bf16, 4 f16, 1 f32 */
static const float norm[4] = {1, 2, 3, 4};

static tbuf data_section(void)
{
    tbuf d = {0};
    tb_bytes(&d, norm, sizeof norm);
    for (int i = 0; i < 6; i++) tb_u16(&d, f32_to_bf16((float)i - 2));
    for (int i = 0; i < 4; i++) tb_u16(&d, f32_to_f16((float)i * 0.5f));
    tb_f32(&d, 42);
    return d;
}

static const char *const VALID_HEADER =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
    "\"model.embedding.weight\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[16,28]},"
    "\"x.f16\":{\"dtype\":\"F16\",\"shape\":[2,1,1,2],\"data_offsets\":[28,36]},"
    "\"x.scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[36,40]}}";

/* A whole .safetensors file: header padded with spaces to 8 bytes, as the
 * reference writer does. */
static tbuf st_bytes(const char *header, const void *data, size_t n)
{
    tbuf f = {0};
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    tb_u64(&f, padded);
    tb_bytes(&f, header, len);
    for (size_t i = len; i < padded; i++) tb_u8(&f, ' ');
    tb_bytes(&f, data, n);
    return f;
}

/* Write a safetensors file `name` into `dir`; returns its malloc'd path. */
static char *put_st(const char *dir, const char *name, const char *header, const void *data, size_t n)
{
    tbuf f = st_bytes(header, data, n);
    char *path = tf_join(dir, name);
    tf_write(path, f.data, f.len);
    tb_free(&f);
    return path;
}

static void put_text(const char *dir, const char *name, const char *text)
{
    char *path = tf_join(dir, name);
    tf_write(path, text, strlen(text));
    free(path);
}

/* Open one file with `header` over the standard data, expecting `want` and an
 * error naming the file and `needle`. */
static void expect_file_error(const char *header, spark_status want, const char *needle)
{
    tbuf d = data_section();
    char *dir = tf_make_dir();
    char *path = put_st(dir, "model.safetensors", header, d.data, d.len);
    tensor_dir td;
    spark_clear_error();
    spark_status st = safetensors_open_dir(dir, &td);
    CHECK_MSG(st == want, "got %s, want %s (%s)", spark_status_str(st), spark_status_str(want), spark_last_error());
    CHECK_ERROR_MENTIONS(path);
    if (needle) CHECK_ERROR_MENTIONS(needle);
    CHECK(td.n_tensors == 0 && td.tensors == NULL && td.n_files == 0);
    if (st == SPARK_OK) tensor_dir_free(&td);
    free(path);
    tf_remove_dir(dir);
    free(dir);
    tb_free(&d);
}

/* ---- valid checkpoints -------------------------------------------------------- */

static void test_st_single_file(void)
{
    tbuf d = data_section();
    char *dir = tf_make_dir();
    char *path = put_st(dir, "model.safetensors", VALID_HEADER, d.data, d.len);
    tensor_dir td;
    spark_status st = safetensors_open_dir(dir, &td);
    CHECK_MSG(st == SPARK_OK, "%s", spark_last_error());
    if (st == SPARK_OK) {
        CHECK(td.n_tensors == 4 && td.n_files == 1);
        CHECK(tensor_dir_find(&td, "__metadata__") == NULL);
        const tensor_info *t = tensor_dir_find(&td, "model.norm.weight");
        CHECK(t && t->dtype == SPARK_DTYPE_F32 && t->n_dims == 1 && t->shape[0] == 4 && t->nbytes == 16);
        if (t) CHECK(memcmp(t->data, norm, sizeof norm) == 0 && strcmp(t->file, path) == 0);
        t = tensor_dir_find(&td, "model.embedding.weight");
        CHECK(t && t->dtype == SPARK_DTYPE_BF16 && t->n_dims == 2 && t->shape[0] == 3 && t->shape[1] == 2);
        if (t) CHECK(tensor_numel(t) == 6 && bf16_to_f32(((const uint16_t *)t->data)[5]) == 3.0f);
        t = tensor_dir_find(&td, "x.f16");
        CHECK(t && t->dtype == SPARK_DTYPE_F16 && t->n_dims == 4 && t->shape[3] == 2 && t->nbytes == 8);
        if (t) CHECK(f16_to_f32(((const uint16_t *)t->data)[3]) == 1.5f);
        t = tensor_dir_find(&td, "x.scalar");
        CHECK(t && t->n_dims == 0 && tensor_numel(t) == 1);
        if (t) CHECK(*(const float *)t->data == 42.0f);
        tensor_dir_free(&td);
        tensor_dir_free(&td); /* safe on the zeroed struct */
    }
    free(path);
    tf_remove_dir(dir);
    free(dir);
    tb_free(&d);
}

static const char *const SHARD1 = "model-00001-of-00002.safetensors";
static const char *const SHARD2 = "model-00002-of-00002.safetensors";

/* Two shards: a, b in the first; c in the second. */
static char *make_sharded_dir(const char *index_json)
{
    char *dir = tf_make_dir();
    static const float v[4] = {1, 2, 3, 4};
    free(put_st(dir, SHARD1,
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[8,16]}}",
                v, sizeof v));
    free(put_st(dir, SHARD2, "{\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", v + 3, 4));
    put_text(dir, "model.safetensors.index.json", index_json);
    return dir;
}

static const char *const GOOD_INDEX =
    "{\"metadata\":{\"total_size\":20},\"weight_map\":{"
    "\"a\":\"model-00001-of-00002.safetensors\","
    "\"c\":\"model-00002-of-00002.safetensors\","
    "\"b\":\"model-00001-of-00002.safetensors\"}}";

static void test_st_sharded(void)
{
    char *dir = make_sharded_dir(GOOD_INDEX);
    tensor_dir td;
    spark_status st = safetensors_open_dir(dir, &td);
    CHECK_MSG(st == SPARK_OK, "%s", spark_last_error());
    if (st == SPARK_OK) {
        CHECK(td.n_tensors == 3 && td.n_files == 2); /* shard 1 loaded once */
        const tensor_info *a = tensor_dir_find(&td, "a"), *b = tensor_dir_find(&td, "b"), *c = tensor_dir_find(&td, "c");
        CHECK(a && b && c);
        if (a && b && c) {
            CHECK(strstr(a->file, SHARD1) && a->file == b->file && strstr(c->file, SHARD2));
            CHECK(((const float *)a->data)[1] == 2 && ((const float *)b->data)[0] == 3 && *(const float *)c->data == 4);
            CHECK(b->n_dims == 2 && b->shape[0] == 1 && b->shape[1] == 2);
        }
        tensor_dir_free(&td);
    }
    tf_remove_dir(dir);
    free(dir);
}

/* ---- header errors ------------------------------------------------------------ */

static void expect_raw_error(const void *bytes, size_t n, const char *needle)
{
    char *dir = tf_make_dir();
    char *path = tf_join(dir, "model.safetensors");
    tf_write(path, bytes, n);
    tensor_dir td;
    spark_clear_error();
    spark_status st = safetensors_open_dir(dir, &td);
    CHECK_MSG(st == SPARK_ERR_FORMAT, "got %s (%s)", spark_status_str(st), spark_last_error());
    CHECK_ERROR_MENTIONS(path);
    if (needle) CHECK_ERROR_MENTIONS(needle);
    if (st == SPARK_OK) tensor_dir_free(&td);
    free(path);
    tf_remove_dir(dir);
    free(dir);
}

static void test_st_bad_header_length(void)
{
    tbuf f = st_bytes(VALID_HEADER, norm, sizeof norm);
    tb_put_u64(&f, 0, f.len); /* longer than the file */
    expect_raw_error(f.data, f.len, "header length");
    tb_put_u64(&f, 0, UINT64_C(1) << 63);
    expect_raw_error(f.data, f.len, "header length");
    tb_put_u64(&f, 0, 0);
    expect_raw_error(f.data, f.len, "header length 0");
    expect_raw_error(f.data, 5, "too small");
    expect_raw_error(f.data, 0, "too small");
    tb_free(&f);
}

static void test_st_header_not_json(void)
{
    expect_file_error("{\"a\": {\"dtype\": \"F32\", ", SPARK_ERR_FORMAT, "not valid JSON");
    expect_file_error("{} trailing", SPARK_ERR_FORMAT, "trailing");
    expect_file_error("[1, 2]", SPARK_ERR_FORMAT, "not a JSON object");
    expect_file_error("{\"a\": 5}", SPARK_ERR_FORMAT, "'a'");
    /* Raw bytes with a NUL inside the header: the parser stops there. */
    static const uint8_t nul[8 + 8] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' ', ' ', ' ', ' ', ' '};
    expect_raw_error(nul, sizeof nul, "trailing");
}

static void test_st_offsets_past_end(void)
{
    expect_file_error("{\"model.layers.0.mlp.up_proj.weight\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[0,1000]}}",
                      SPARK_ERR_FORMAT, "model.layers.0.mlp.up_proj.weight");
    CHECK_ERROR_MENTIONS("outside the data section");
    expect_file_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", SPARK_ERR_FORMAT, "'w'");
    expect_file_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1e300,1e300]}}", SPARK_ERR_FORMAT, "'w'");
    expect_file_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", SPARK_ERR_FORMAT, "'w'");
}

static void test_st_size_mismatch(void)
{
    expect_file_error("{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", SPARK_ERR_FORMAT,
                      "model.norm.weight");
    CHECK_ERROR_MENTIONS("span 12");
    expect_file_error("{\"big\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
                      SPARK_ERR_FORMAT, "'big'");
    expect_file_error("{\"zero\":{\"dtype\":\"F32\",\"shape\":[0,4294967296,4294967296],\"data_offsets\":[0,0]}}",
                      SPARK_ERR_FORMAT, "'zero'");
}

static void test_st_unknown_dtype(void)
{
    expect_file_error("{\"model.layers.3.self_attn.g_proj.weight\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
                      SPARK_ERR_UNSUPPORTED, "model.layers.3.self_attn.g_proj.weight");
    CHECK_ERROR_MENTIONS("F64");
    expect_file_error("{\"q\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}", SPARK_ERR_UNSUPPORTED, "I8");
    expect_file_error("{\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", SPARK_ERR_UNSUPPORTED,
                      "F8_E4M3");
}

static void test_st_bad_entries(void)
{
    expect_file_error("{\"nodtype\":{\"shape\":[4],\"data_offsets\":[0,16]}}", SPARK_ERR_FORMAT, "nodtype");
    expect_file_error("{\"noshape\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}", SPARK_ERR_FORMAT, "noshape");
    expect_file_error("{\"neg\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", SPARK_ERR_FORMAT, "neg");
    expect_file_error("{\"frac\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,6]}}", SPARK_ERR_FORMAT, "frac");
    expect_file_error("{\"str\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", SPARK_ERR_FORMAT, "str");
    expect_file_error("{\"five\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}}", SPARK_ERR_UNSUPPORTED,
                      "five");
    expect_file_error("{\"three\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16,16]}}", SPARK_ERR_FORMAT, "three");
    expect_file_error("{\"nooffs\":{\"dtype\":\"F32\",\"shape\":[4]}}", SPARK_ERR_FORMAT, "nooffs");
    expect_file_error("{\"dtnum\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,16]}}", SPARK_ERR_FORMAT, "dtnum");
}

static void test_st_duplicate_in_one_file(void)
{
    expect_file_error("{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                      "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}",
                      SPARK_ERR_FORMAT, "model.norm.weight");
    CHECK_ERROR_MENTIONS("twice");
}

/* Every cut of a valid file is a clean error. */
static void test_st_truncated_everywhere(void)
{
    tbuf d = data_section();
    tbuf f = st_bytes(VALID_HEADER, d.data, d.len);
    char *dir = tf_make_dir();
    char *path = tf_join(dir, "model.safetensors");
    int bad = 0;
    for (size_t cut = 0; cut < f.len; cut++) {
        tf_write(path, f.data, cut);
        tensor_dir td;
        spark_clear_error();
        spark_status st = safetensors_open_dir(dir, &td);
        if (st != SPARK_ERR_FORMAT || !strstr(spark_last_error(), path)) {
            if (bad++ < 5) printf("  cut at %zu: %s %s\n", cut, spark_status_str(st), spark_last_error());
            if (st == SPARK_OK) tensor_dir_free(&td);
        }
    }
    CHECK_MSG(bad == 0, "%d cuts were not clean errors", bad);
    free(path);
    tf_remove_dir(dir);
    free(dir);
    tb_free(&f);
    tb_free(&d);
}

/* ---- sharded errors ------------------------------------------------------------ */

static void expect_dir_error(const char *index_json, spark_status want, const char *n1, const char *n2)
{
    char *dir = make_sharded_dir(index_json);
    tensor_dir td;
    spark_clear_error();
    spark_status st = safetensors_open_dir(dir, &td);
    CHECK_MSG(st == want, "got %s, want %s (%s)", spark_status_str(st), spark_status_str(want), spark_last_error());
    CHECK_ERROR_MENTIONS(dir);
    if (n1) CHECK_ERROR_MENTIONS(n1);
    if (n2) CHECK_ERROR_MENTIONS(n2);
    CHECK(td.n_tensors == 0 && td.n_files == 0);
    if (st == SPARK_OK) tensor_dir_free(&td);
    tf_remove_dir(dir);
    free(dir);
}

static void test_st_missing_shard(void)
{
    expect_dir_error("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"z\":\"model-00003-of-00003.safetensors\"}}",
                     SPARK_ERR_MISSING, "model-00003-of-00003.safetensors", "model.safetensors.index.json");
    CHECK_ERROR_MENTIONS("'z'");
}

static void test_st_tensor_missing_from_shard(void)
{
    expect_dir_error("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"model.layers.0.mlp.down_proj.weight\":\"model-00002-of-00002.safetensors\"}}",
                     SPARK_ERR_MISSING, "model.layers.0.mlp.down_proj.weight", "model-00002-of-00002.safetensors");
    CHECK_ERROR_MENTIONS("model.safetensors.index.json");
}

static void test_st_tensor_in_other_shard(void)
{
    expect_dir_error("{\"weight_map\":{\"b\":\"model-00002-of-00002.safetensors\","
                     "\"c\":\"model-00001-of-00002.safetensors\"}}",
                     SPARK_ERR_FORMAT, "'b'", "model-00002-of-00002.safetensors");
}

static void test_st_duplicate_across_shards(void)
{
    char *dir = make_sharded_dir("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                                 "\"c\":\"model-00002-of-00002.safetensors\"}}");
    static const float v = 9;
    free(put_st(dir, SHARD2, "{\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                             "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", &v, 4));
    tensor_dir td;
    spark_clear_error();
    CHECK(safetensors_open_dir(dir, &td) == SPARK_ERR_FORMAT);
    CHECK_ERROR_MENTIONS("'b'");
    CHECK_ERROR_MENTIONS(SHARD1);
    CHECK_ERROR_MENTIONS(SHARD2);
    CHECK(td.n_tensors == 0);
    tf_remove_dir(dir);
    free(dir);
}

static void test_st_bad_index(void)
{
    expect_dir_error("{\"weight_map\": ", SPARK_ERR_FORMAT, "model.safetensors.index.json", "not valid JSON");
    expect_dir_error("{\"metadata\":{}}", SPARK_ERR_FORMAT, "model.safetensors.index.json", "weight_map");
    expect_dir_error("{\"weight_map\":{\"a\":\"../model-00001-of-00002.safetensors\"}}", SPARK_ERR_FORMAT, "'a'", NULL);
    expect_dir_error("{\"weight_map\":{\"a\":\"/etc/passwd\"}}", SPARK_ERR_FORMAT, "'a'", NULL);
    expect_dir_error("{\"weight_map\":{\"a\":1}}", SPARK_ERR_FORMAT, "'a'", NULL);
    expect_dir_error("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"a\":\"model-00001-of-00002.safetensors\"}}",
                     SPARK_ERR_FORMAT, "'a'", "twice");
    /* A shard that is itself malformed reports the shard's path. */
    char *dir = make_sharded_dir(GOOD_INDEX);
    put_text(dir, SHARD2, "short");
    tensor_dir td;
    CHECK(safetensors_open_dir(dir, &td) == SPARK_ERR_FORMAT);
    CHECK_ERROR_MENTIONS(SHARD2);
    tf_remove_dir(dir);
    free(dir);
}

static void test_st_neither_file(void)
{
    char *dir = tf_make_dir();
    tensor_dir td;
    spark_clear_error();
    CHECK(safetensors_open_dir(dir, &td) == SPARK_ERR_MISSING);
    CHECK_ERROR_MENTIONS(dir);
    CHECK_ERROR_MENTIONS("model.safetensors ");
    CHECK_ERROR_MENTIONS("model.safetensors.index.json");
    CHECK(safetensors_open_dir("/tmp/spark-test-no-such-dir", &td) == SPARK_ERR_MISSING);
    tf_remove_dir(dir);
    free(dir);
}

/* A failed append leaves the dir exactly as it was. */
static void test_st_append_rolls_back(void)
{
    tbuf d = data_section();
    char *dir = tf_make_dir();
    char *good = put_st(dir, "good.safetensors", VALID_HEADER, d.data, d.len);
    char *bad = put_st(dir, "bad.safetensors",
                       "{\"fresh\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                       "\"x.f16\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                       d.data, d.len);
    tensor_dir td = {0};
    CHECK(safetensors_append_file(good, &td) == SPARK_OK);
    spark_clear_error();
    CHECK(safetensors_append_file(bad, &td) == SPARK_ERR_FORMAT); /* x.f16 repeats */
    CHECK_ERROR_MENTIONS("x.f16");
    CHECK(td.n_tensors == 4 && td.n_files == 1 && tensor_dir_find(&td, "fresh") == NULL);
    CHECK(safetensors_append_file(good, &td) == SPARK_ERR_FORMAT); /* every name repeats */
    CHECK(td.n_tensors == 4 && td.n_files == 1);
    tensor_dir_free(&td);
    free(good);
    free(bad);
    tf_remove_dir(dir);
    free(dir);
    tb_free(&d);
}

int main(void)
{
    RUN(test_st_single_file);
    RUN(test_st_sharded);
    RUN(test_st_bad_header_length);
    RUN(test_st_header_not_json);
    RUN(test_st_offsets_past_end);
    RUN(test_st_size_mismatch);
    RUN(test_st_unknown_dtype);
    RUN(test_st_bad_entries);
    RUN(test_st_duplicate_in_one_file);
    RUN(test_st_truncated_everywhere);
    RUN(test_st_missing_shard);
    RUN(test_st_tensor_missing_from_shard);
    RUN(test_st_tensor_in_other_shard);
    RUN(test_st_duplicate_across_shards);
    RUN(test_st_bad_index);
    RUN(test_st_neither_file);
    RUN(test_st_append_rolls_back);
    CHECK_EXIT();
}
