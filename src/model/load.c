/*
 * load.c — spark_model_load(): decide the checkpoint's format, read its
 * config, map its tensors and bind the weights.
 *
 * A directory is a Hugging Face checkpoint (config.json + safetensors); a
 * file starting with the bytes "GGUF" is a GGUF file. Anything else is
 * refused with a message saying what was expected.
 */
#include "model/model.h"

#include "base/error.h"
#include "base/mem.h"
#include "io/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static spark_status load_hf(spark_model *m)
{
    char config_path[4096];
    snprintf(config_path, sizeof config_path, "%s/config.json", m->path);
    TRY(config_from_hf(config_path, &m->cfg, &m->layer_kind, &m->tied_head));
    TRY(safetensors_open_dir(m->path, &m->hf_tensors));
    m->tensors = &m->hf_tensors;
    return weights_bind(m);
}

static spark_status load_gguf(spark_model *m)
{
    TRY(gguf_open(m->path, &m->gguf));
    m->tensors = &m->gguf.tensors;
    TRY(config_from_gguf(&m->gguf, &m->cfg, &m->layer_kind));
    m->tied_head = 1; /* GGUF says "tied" by leaving `output.weight` out */
    return weights_bind(m);
}

static spark_status detect_format(const char *path, model_format *format)
{
    struct stat st;
    if (stat(path, &st) != 0) return spark_fail(SPARK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        *format = MODEL_FORMAT_HF;
        return SPARK_OK;
    }
    FILE *f = fopen(path, "rb");
    if (!f) return spark_fail(SPARK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got == 4 && !memcmp(magic, "GGUF", 4)) {
        *format = MODEL_FORMAT_GGUF;
        return SPARK_OK;
    }
    return spark_fail(SPARK_ERR_FORMAT,
                      "%s: not a model: expected a GGUF file (magic \"GGUF\") or a Hugging Face directory "
                      "(config.json + model.safetensors)", path);
}

spark_status spark_model_load(const char *path, spark_model **out)
{
    *out = NULL;
    spark_clear_error();
    if (!path || !*path) return spark_fail(SPARK_ERR_ARG, "no model path given");
    spark_model *m = spark_calloc(1, sizeof *m, "model");
    if (!m) return SPARK_ERR_NOMEM;
    m->path = spark_strdup(path);
    spark_status st = m->path ? detect_format(path, &m->format) : SPARK_ERR_NOMEM;
    if (st == SPARK_OK) st = m->format == MODEL_FORMAT_HF ? load_hf(m) : load_gguf(m);
    if (st != SPARK_OK) {
        spark_model_free(m);
        return st;
    }
    *out = m;
    return SPARK_OK;
}

void spark_model_free(spark_model *m)
{
    if (!m) return;
    weights_release(m);
    tensor_dir_free(&m->hf_tensors);
    gguf_close(&m->gguf);
    free(m->layer_kind);
    free(m->path);
    free(m);
}

const spark_model_config *spark_model_get_config(const spark_model *m) { return &m->cfg; }

uint64_t spark_model_weight_bytes(const spark_model *m) { return m->weight_bytes; }
