/*
 * tensor_dir.c — the format-neutral list of named tensors and the mappings
 * their data points into.
 *
 * Ownership: the dir owns every tensor name and every mapped_file in
 * `files`; tensor_info.data and tensor_info.file point into those, so nothing
 * here is ever copied and tensor_dir_free releases everything at once.
 * Lookups are linear: a checkpoint holds a few hundred tensors and the model
 * loader looks each one up once.
 */
#include "io/tensor_dir.h"

#include "base/error.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

const tensor_info *tensor_dir_find(const tensor_dir *dir, const char *name)
{
    for (int64_t i = 0; i < dir->n_tensors; i++)
        if (strcmp(dir->tensors[i].name, name) == 0) return &dir->tensors[i];
    return NULL;
}

int64_t tensor_numel(const tensor_info *t)
{
    /* Readers have already checked that this product fits in int64_t. */
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
    return n;
}

void tensor_dir_free(tensor_dir *dir)
{
    if (!dir) return;
    for (int64_t i = 0; i < dir->n_tensors; i++) free(dir->tensors[i].name);
    free(dir->tensors);
    for (int i = 0; i < dir->n_files; i++) mapped_file_close(&dir->files[i]);
    free(dir->files);
    memset(dir, 0, sizeof *dir);
}

spark_status tensor_dir_reserve(tensor_dir *dir, int64_t extra)
{
    ASSERT(extra >= 0 && dir->n_tensors >= 0);
    uint64_t want = (uint64_t)dir->n_tensors + (uint64_t)extra, bytes;
    if (want == 0) return SPARK_OK;
    if (want > (uint64_t)INT64_MAX || spark_mul_overflows(want, sizeof(tensor_info), &bytes) || bytes > SIZE_MAX)
        return spark_fail(SPARK_ERR_NOMEM, "too many tensors (%llu)", (unsigned long long)want);
    tensor_info *grown = realloc(dir->tensors, (size_t)bytes);
    if (!grown) return spark_fail(SPARK_ERR_NOMEM, "out of memory listing %llu tensors", (unsigned long long)want);
    memset(grown + dir->n_tensors, 0, (size_t)extra * sizeof *grown);
    dir->tensors = grown;
    return SPARK_OK;
}

spark_status tensor_dir_adopt_file(tensor_dir *dir, mapped_file *file)
{
    mapped_file *grown = realloc(dir->files, ((size_t)dir->n_files + 1) * sizeof *grown);
    if (!grown) return spark_fail(SPARK_ERR_NOMEM, "out of memory adopting %s", file->path);
    dir->files = grown;
    dir->files[dir->n_files++] = *file;
    memset(file, 0, sizeof *file);
    return SPARK_OK;
}

static int compare_by_name(const void *a, const void *b)
{
    const tensor_info *ta = *(const tensor_info *const *)a;
    const tensor_info *tb = *(const tensor_info *const *)b;
    return strcmp(ta->name, tb->name);
}

static spark_status duplicate_error(const tensor_info *a, const tensor_info *b)
{
    const char *fa = a->file ? a->file : "?", *fb = b->file ? b->file : "?";
    if (strcmp(fa, fb) == 0) return spark_fail(SPARK_ERR_FORMAT, "%s: tensor '%s' appears twice", fa, a->name);
    return spark_fail(SPARK_ERR_FORMAT, "tensor '%s' appears in both %s and %s", a->name, fa, fb);
}

spark_status tensor_dir_check_unique(const tensor_dir *dir)
{
    if (dir->n_tensors < 2) return SPARK_OK;
    const tensor_info **sorted = spark_calloc((size_t)dir->n_tensors, sizeof *sorted, "tensor name index");
    if (!sorted) return SPARK_ERR_NOMEM;
    for (int64_t i = 0; i < dir->n_tensors; i++) sorted[i] = &dir->tensors[i];
    qsort(sorted, (size_t)dir->n_tensors, sizeof *sorted, compare_by_name);
    spark_status status = SPARK_OK;
    for (int64_t i = 1; i < dir->n_tensors && status == SPARK_OK; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            /* Report in file order so the message is deterministic. */
            const tensor_info *a = sorted[i - 1] < sorted[i] ? sorted[i - 1] : sorted[i];
            const tensor_info *b = sorted[i - 1] < sorted[i] ? sorted[i] : sorted[i - 1];
            status = duplicate_error(a, b);
        }
    free(sorted);
    return status;
}
