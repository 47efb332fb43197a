/*
 * steer_file.c — spark_steering_load(): steering directions from a
 * llama.cpp control-vector GGUF (one `direction.N` tensor per steered layer,
 * applied after 0-based layer N, as llama.cpp applies them) or from a .npy
 * array [n_layer, n_embd] (a row of zeros = that layer is not steered).
 */
#include "spark.h"

#include "base/error.h"
#include "base/mem.h"
#include "io/gguf.h"
#include "io/npy.h"

#include <stdlib.h>
#include <string.h>

static spark_status from_gguf(const char *path, int32_t n_layer, int32_t n_embd, float *dirs, uint8_t *present)
{
    gguf_file g;
    TRY(gguf_open(path, &g));
    spark_status st = SPARK_OK;
    int found = 0;
    for (int64_t i = 0; st == SPARK_OK && i < g.tensors.n_tensors; i++) {
        const tensor_info *t = &g.tensors.tensors[i];
        char *end;
        if (strncmp(t->name, "direction.", 10)) continue;
        long layer = strtol(t->name + 10, &end, 10);
        if (*end || end == t->name + 10 || layer < 0 || layer >= n_layer) {
            st = spark_fail(SPARK_ERR_SHAPE, "%s: tensor '%s' names no layer in [0, %d)", path, t->name, n_layer);
        } else if (t->n_dims != 1 || t->shape[0] != n_embd ||
                   (t->dtype != SPARK_DTYPE_F32 && t->dtype != SPARK_DTYPE_F16)) {
            st = spark_fail(SPARK_ERR_SHAPE, "%s: tensor '%s' must be an F32/F16 vector of %d values", path, t->name,
                            n_embd);
        } else {
            float *row = dirs + (size_t)layer * n_embd;
            for (int32_t k = 0; k < n_embd; k++)
                row[k] = t->dtype == SPARK_DTYPE_F32 ? ((const float *)t->data)[k]
                                                     : f16_to_f32(((const uint16_t *)t->data)[k]);
            present[layer] = 1;
            found++;
        }
    }
    gguf_close(&g);
    if (st == SPARK_OK && !found) st = spark_fail(SPARK_ERR_MISSING, "%s: no 'direction.N' tensors", path);
    return st;
}

static spark_status from_npy(const char *path, int32_t n_layer, int32_t n_embd, float *dirs, uint8_t *present)
{
    float *data;
    int64_t shape[NPY_MAX_DIMS];
    int ndim;
    TRY(npy_read_f32(path, &data, shape, &ndim));
    if (ndim != 2 || shape[0] != n_layer || shape[1] != n_embd) {
        free(data);
        return spark_fail(SPARK_ERR_SHAPE, "%s: steering array must have shape [%d, %d] (layers, hidden)", path, n_layer,
                          n_embd);
    }
    memcpy(dirs, data, (size_t)n_layer * n_embd * sizeof(float));
    free(data);
    for (int32_t l = 0; l < n_layer; l++)
        for (int32_t k = 0; k < n_embd; k++)
            if (dirs[(size_t)l * n_embd + k] != 0) {
                present[l] = 1;
                break;
            }
    return SPARK_OK;
}

spark_status spark_steering_load(const char *path, int32_t n_layer, int32_t n_embd, float **directions,
                                 uint8_t **present)
{
    *directions = spark_calloc((size_t)n_layer * n_embd, sizeof(float), "steering directions");
    *present = spark_calloc((size_t)n_layer, 1, "steering layers");
    if (!*directions || !*present) {
        free(*directions);
        free(*present);
        return SPARK_ERR_NOMEM;
    }
    size_t len = strlen(path);
    int is_npy = len >= 4 && !strcmp(path + len - 4, ".npy");
    spark_status st = is_npy ? from_npy(path, n_layer, n_embd, *directions, *present)
                             : from_gguf(path, n_layer, n_embd, *directions, *present);
    if (st != SPARK_OK) {
        free(*directions);
        free(*present);
        *directions = NULL;
        *present = NULL;
    }
    return st;
}
