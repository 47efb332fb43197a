/*
 * safetensors.c — a validating reader for Hugging Face safetensors files and
 * sharded checkpoints.
 *
 * A .safetensors file is: u64 little-endian header length N, N bytes of JSON
 * (an object: tensor name -> {"dtype", "shape", "data_offsets": [begin, end]},
 * plus an optional "__metadata__" object of strings), then the data section,
 * which the offsets index from its first byte. The JSON is copied out of the
 * mapping and NUL-terminated before cJSON sees it, so the parser can never
 * read past the header whatever the bytes are; tensor data is never copied.
 *
 * A sharded checkpoint has DIR/model.safetensors.index.json whose
 * "weight_map" maps each tensor to its shard file; every distinct shard is
 * loaded once, and every listed tensor must really be in its shard.
 */
#include "io/safetensors.h"

#include "base/error.h"
#include "base/mem.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { ST_MAX_HEADER = 100 * 1000 * 1000 }; /* the reference implementation's limit */
static const double ST_MAX_EXACT_INT = 9007199254740992.0; /* 2^53: JSON numbers are doubles */

/* ---- small helpers -------------------------------------------------------- */

/* Parse `len` bytes of JSON that need not be NUL-terminated; the copy makes
 * cJSON's scanning stop at our NUL. Trailing bytes must be whitespace (the
 * format pads headers with spaces). */
static spark_status parse_json(const char *path, const char *what, const uint8_t *bytes, uint64_t len, cJSON **out)
{
    *out = NULL;
    char *buf = malloc((size_t)len + 1);
    if (!buf) return spark_fail(SPARK_ERR_NOMEM, "%s: out of memory reading %s (%llu bytes)", path, what, (unsigned long long)len);
    if (len) memcpy(buf, bytes, (size_t)len);
    buf[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, (size_t)len, &end, 0);
    spark_status status = SPARK_OK;
    if (!root) {
        long at = end ? (long)(end - buf) : -1;
        status = spark_fail(SPARK_ERR_FORMAT, "%s: %s is not valid JSON (error near byte %ld)", path, what, at);
    } else {
        for (const char *p = end; p < buf + len && status == SPARK_OK; p++)
            if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
                status = spark_fail(SPARK_ERR_FORMAT, "%s: %s has trailing bytes after the JSON value", path, what);
        if (status == SPARK_OK && !cJSON_IsObject(root))
            status = spark_fail(SPARK_ERR_FORMAT, "%s: %s is not a JSON object", path, what);
    }
    free(buf);
    if (status != SPARK_OK) cJSON_Delete(root);
    else *out = root;
    return status;
}

/* A JSON number that is a non-negative integer exactly representable. */
static bool json_uint(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item)) return false;
    double v = item->valuedouble;
    if (!(v >= 0 && v <= ST_MAX_EXACT_INT) || (double)(uint64_t)v != v) return false;
    *out = (uint64_t)v;
    return true;
}

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] == '/';
    char *p = malloc(a + b + 2);
    if (!p) {
        spark_fail(SPARK_ERR_NOMEM, "out of memory joining %s and %s", dir, name);
        return NULL;
    }
    memcpy(p, dir, a);
    if (!slash) p[a++] = '/';
    memcpy(p + a, name, b + 1);
    return p;
}

/* true when path names something (stat succeeds or fails for a reason other
 * than absence, in which case opening it reports the real error). */
static bool path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 || (errno != ENOENT && errno != ENOTDIR);
}

/* ---- one tensor entry ----------------------------------------------------- */

typedef struct st_file {
    const char *path;
    const uint8_t *data; /* the data section */
    uint64_t data_len;
} st_file;

static spark_status read_shape(const st_file *f, const char *name, const cJSON *shape, tensor_info *t)
{
    if (!cJSON_IsArray(shape)) return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' has no \"shape\" array", f->path, name);
    int n = cJSON_GetArraySize(shape);
    if (n > TENSOR_MAX_DIMS)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions (at most %d supported)", f->path, name, n, TENSOR_MAX_DIMS);
    t->n_dims = n;
    int d = 0;
    for (const cJSON *dim = shape->child; dim; dim = dim->next, d++) {
        uint64_t v;
        if (!json_uint(dim, &v))
            return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' shape[%d] is not a non-negative integer", f->path, name, d);
        t->shape[d] = (int64_t)v;
    }
    return SPARK_OK;
}

static spark_status read_offsets(const st_file *f, const char *name, const cJSON *offs, uint64_t *begin, uint64_t *end)
{
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(offs->child, begin) || !json_uint(offs->child->next, end))
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' \"data_offsets\" is not a pair of non-negative integers", f->path, name);
    if (*begin > *end || *end > f->data_len)
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' data_offsets [%llu, %llu] lie outside the data section of %llu bytes",
                          f->path, name, (unsigned long long)*begin, (unsigned long long)*end, (unsigned long long)f->data_len);
    return SPARK_OK;
}

static void format_shape(const tensor_info *t, char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < t->n_dims && at < size; d++)
        at += (size_t)snprintf(buf + at, size - at, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (at < size) snprintf(buf + at, size - at, "]");
}

/* Validate one header entry and fill *t (its name is copied last, so on
 * failure *t owns nothing). */
static spark_status read_entry(const st_file *f, const cJSON *item, tensor_info *t)
{
    const char *name = item->string;
    if (!cJSON_IsObject(item)) return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' entry is not a JSON object", f->path, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dtype)) return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' has no \"dtype\" string", f->path, name);
    int dt = dtype_from_safetensors(dtype->valuestring);
    if (dt < 0)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which is not supported (F32, F16 and BF16 are)",
                          f->path, name, dtype->valuestring);
    t->dtype = (spark_dtype)dt;
    TRY(read_shape(f, name, cJSON_GetObjectItemCaseSensitive(item, "shape"), t));
    uint64_t begin = 0, end = 0, numel = 1, nbytes = 0;
    TRY(read_offsets(f, name, cJSON_GetObjectItemCaseSensitive(item, "data_offsets"), &begin, &end));
    /* As in the GGUF reader: the non-zero dims' product must fit, whatever
     * order tensor_numel later multiplies them in. */
    bool overflow = false;
    uint64_t bound = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t dim = (uint64_t)t->shape[d];
        numel *= dim;
        overflow |= spark_mul_overflows(bound, dim ? dim : 1, &bound) || bound > (uint64_t)INT64_MAX;
    }
    overflow |= spark_mul_overflows(numel, (uint64_t)dtype_block_bytes(t->dtype), &nbytes);
    if (overflow || nbytes != end - begin) {
        char shape_text[128];
        format_shape(t, shape_text, sizeof shape_text);
        if (overflow)
            return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' shape %s of %s overflows a 64-bit byte count",
                              f->path, name, shape_text, dtype->valuestring);
        return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' shape %s of %s needs %llu bytes, but data_offsets [%llu, %llu] span %llu",
                          f->path, name, shape_text, dtype->valuestring, (unsigned long long)nbytes,
                          (unsigned long long)begin, (unsigned long long)end, (unsigned long long)(end - begin));
    }
    t->data = f->data + begin;
    t->nbytes = nbytes;
    t->file = f->path;
    t->name = spark_strdup(name);
    return t->name ? SPARK_OK : SPARK_ERR_NOMEM;
}

/* ---- one file ------------------------------------------------------------- */

static spark_status split_file(const mapped_file *mf, uint64_t *header_len, st_file *f)
{
    if (mf->size < 8)
        return spark_fail(SPARK_ERR_FORMAT, "%s: file of %llu bytes is too small for a safetensors header", mf->path, (unsigned long long)mf->size);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)mf->data[i] << (8 * i);
    if (n < 2 || n > mf->size - 8 || n > ST_MAX_HEADER)
        return spark_fail(SPARK_ERR_FORMAT, "%s: header length %llu is impossible for a file of %llu bytes (not a safetensors file?)",
                          mf->path, (unsigned long long)n, (unsigned long long)mf->size);
    *header_len = n;
    f->path = mf->path;
    f->data = mf->data + 8 + n;
    f->data_len = mf->size - 8 - n;
    return SPARK_OK;
}

/* Fill entries dir->tensors[n_tensors ...] from the header; *n_new counts the
 * ones filled (and owning a name) even on failure, for the caller to undo. */
static spark_status read_entries(const st_file *f, const cJSON *root, tensor_dir *dir, int64_t *n_new)
{
    *n_new = 0;
    TRY(tensor_dir_reserve(dir, cJSON_GetArraySize(root)));
    for (const cJSON *item = root->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) continue;
        TRY(read_entry(f, item, &dir->tensors[dir->n_tensors + *n_new]));
        (*n_new)++;
    }
    return SPARK_OK;
}

static void drop_entries(tensor_dir *dir, int64_t from, int64_t n)
{
    for (int64_t i = from; i < from + n; i++) {
        free(dir->tensors[i].name);
        memset(&dir->tensors[i], 0, sizeof dir->tensors[i]);
    }
}

/* Commit the new entries: they must not repeat a name, and the dir must take
 * the mapping. On failure everything is rolled back. */
static spark_status commit_entries(tensor_dir *dir, mapped_file *mf, int64_t n_new)
{
    int64_t old = dir->n_tensors;
    dir->n_tensors += n_new;
    spark_status status = tensor_dir_check_unique(dir);
    if (status == SPARK_OK) status = tensor_dir_adopt_file(dir, mf);
    if (status != SPARK_OK) {
        dir->n_tensors = old;
        drop_entries(dir, old, n_new);
    }
    return status;
}

spark_status safetensors_append_file(const char *path, tensor_dir *dir) { return safetensors_append_file_ex(path, NULL, dir); }

spark_status safetensors_append_file_ex(const char *path, const mapped_file_opts *opts, tensor_dir *dir)
{
    mapped_file mf;
    TRY(mapped_file_open_ex(path, opts, &mf));
    uint64_t header_len = 0;
    st_file f = {0};
    cJSON *root = NULL;
    int64_t n_new = 0;
    spark_status status = split_file(&mf, &header_len, &f);
    if (status == SPARK_OK) status = parse_json(mf.path, "header", mf.data + 8, header_len, &root);
    if (status == SPARK_OK) status = read_entries(&f, root, dir, &n_new);
    cJSON_Delete(root);
    if (status == SPARK_OK) status = commit_entries(dir, &mf, n_new); /* rolls back itself */
    else drop_entries(dir, dir->n_tensors, n_new);
    if (status != SPARK_OK) mapped_file_close(&mf);
    return status;
}

/* ---- sharded checkpoints -------------------------------------------------- */

static const char *const SINGLE_FILE = "model.safetensors";
static const char *const INDEX_FILE = "model.safetensors.index.json";

static int compare_item_keys(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static int compare_item_values(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->valuestring, (*(const cJSON *const *)b)->valuestring);
}

static int compare_tensor_names(const void *a, const void *b)
{
    return strcmp((*(const tensor_info *const *)a)->name, (*(const tensor_info *const *)b)->name);
}

static int compare_name_to_tensor(const void *key, const void *elem)
{
    return strcmp((const char *)key, (*(const tensor_info *const *)elem)->name);
}

/* A shard must be a file inside the checkpoint directory: no absolute path,
 * no ".." component. */
static bool shard_name_ok(const char *s)
{
    if (!*s || s[0] == '/') return false;
    for (const char *c = s; *c;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        if (len == 2 && c[0] == '.' && c[1] == '.') return false;
        c += len + (slash ? 1 : 0);
    }
    return true;
}

/* Collect and validate the weight_map entries into *items (owned by caller),
 * sorted by tensor name; a name listed twice is refused. */
static spark_status read_weight_map(const char *index_path, const cJSON *root, const cJSON ***items, int *n)
{
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) return spark_fail(SPARK_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
    *n = cJSON_GetArraySize(map);
    *items = spark_calloc((size_t)*n, sizeof **items, "weight_map entries");
    if (!*items) return SPARK_ERR_NOMEM;
    int i = 0;
    for (const cJSON *item = map->child; item; item = item->next) {
        if (!cJSON_IsString(item) || !shard_name_ok(item->valuestring))
            return spark_fail(SPARK_ERR_FORMAT, "%s: weight_map entry for tensor '%s' is not a file name inside the checkpoint directory",
                              index_path, item->string);
        (*items)[i++] = item;
    }
    qsort(*items, (size_t)*n, sizeof **items, compare_item_keys);
    for (i = 1; i < *n; i++)
        if (strcmp((*items)[i - 1]->string, (*items)[i]->string) == 0)
            return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' is listed twice in weight_map", index_path, (*items)[i]->string);
    return SPARK_OK;
}

/* Load each distinct shard once (in file-name order). */
static spark_status load_shards(const char *dir, const char *index_path, const cJSON **items, int n,
                                const mapped_file_opts *opts, tensor_dir *out)
{
    const cJSON **by_shard = spark_calloc((size_t)n, sizeof *by_shard, "weight_map shards");
    if (!by_shard) return SPARK_ERR_NOMEM;
    memcpy(by_shard, items, (size_t)n * sizeof *by_shard);
    qsort(by_shard, (size_t)n, sizeof *by_shard, compare_item_values);
    spark_status status = SPARK_OK;
    for (int i = 0; i < n && status == SPARK_OK; i++) {
        if (i > 0 && strcmp(by_shard[i - 1]->valuestring, by_shard[i]->valuestring) == 0) continue;
        char *path = join_path(dir, by_shard[i]->valuestring);
        if (!path) status = SPARK_ERR_NOMEM;
        else if (!path_exists(path))
            status = spark_fail(SPARK_ERR_MISSING, "%s: shard '%s' (listed for tensor '%s') does not exist: %s", index_path,
                                by_shard[i]->valuestring, by_shard[i]->string, path);
        else status = safetensors_append_file_ex(path, opts, out);
        free(path);
    }
    free(by_shard);
    return status;
}

/* Every tensor the index lists must be in the shard it names. */
static spark_status verify_weight_map(const char *dir, const char *index_path, const cJSON **items, int n, const tensor_dir *out)
{
    const tensor_info **sorted = spark_calloc((size_t)out->n_tensors, sizeof *sorted, "tensor name index");
    if (!sorted) return SPARK_ERR_NOMEM;
    for (int64_t i = 0; i < out->n_tensors; i++) sorted[i] = &out->tensors[i];
    qsort(sorted, (size_t)out->n_tensors, sizeof *sorted, compare_tensor_names);
    spark_status status = SPARK_OK;
    for (int i = 0; i < n && status == SPARK_OK; i++) {
        const char *name = items[i]->string, *shard = items[i]->valuestring;
        const tensor_info *const *hit = bsearch(name, sorted, (size_t)out->n_tensors, sizeof *sorted, compare_name_to_tensor);
        char *expected = hit ? join_path(dir, shard) : NULL;
        if (!hit)
            status = spark_fail(SPARK_ERR_MISSING, "%s: tensor '%s' is listed in weight_map for shard '%s', but that shard does not contain it",
                                index_path, name, shard);
        else if (!expected) status = SPARK_ERR_NOMEM;
        else if (strcmp(expected, (*hit)->file) != 0)
            status = spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' is listed in weight_map for shard '%s', but it is in %s",
                                index_path, name, shard, (*hit)->file);
        free(expected);
    }
    free(sorted);
    return status;
}

static spark_status open_sharded(const char *dir, const char *index_path, const mapped_file_opts *opts, tensor_dir *out)
{
    mapped_file mf;
    TRY(mapped_file_open(index_path, &mf));
    cJSON *root = NULL;
    const cJSON **items = NULL;
    int n = 0;
    spark_status status = parse_json(index_path, "index", mf.data, mf.size, &root);
    mapped_file_close(&mf);
    if (status == SPARK_OK) status = read_weight_map(index_path, root, &items, &n);
    if (status == SPARK_OK) status = load_shards(dir, index_path, items, n, opts, out);
    if (status == SPARK_OK) status = verify_weight_map(dir, index_path, items, n, out);
    free(items);
    cJSON_Delete(root);
    return status;
}

spark_status safetensors_open_dir(const char *dir, tensor_dir *out) { return safetensors_open_dir_ex(dir, NULL, out); }

spark_status safetensors_open_dir_ex(const char *dir, const mapped_file_opts *opts, tensor_dir *out)
{
    memset(out, 0, sizeof *out);
    char *single = join_path(dir, SINGLE_FILE), *index = join_path(dir, INDEX_FILE);
    spark_status status;
    if (!single || !index) status = SPARK_ERR_NOMEM;
    else if (path_exists(single)) status = safetensors_append_file_ex(single, opts, out);
    else if (path_exists(index)) status = open_sharded(dir, index, opts, out);
    else status = spark_fail(SPARK_ERR_MISSING, "%s: neither %s nor %s found", dir, SINGLE_FILE, INDEX_FILE);
    free(single);
    free(index);
    if (status != SPARK_OK) tensor_dir_free(out);
    return status;
}
