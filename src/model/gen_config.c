/*
 * gen_config.c — the checkpoint's recommended sampling settings:
 * generation_config.json next to an HF checkpoint, or the
 * `general.sampling.*` keys of a GGUF file. Absent values keep the
 * library defaults (spark_sampler_default_params).
 */
#include "model/model.h"

#include "base/error.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

static void read_number(const cJSON *root, const char *field, float *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field);
    if (cJSON_IsNumber(v)) *out = (float)v->valuedouble;
}

static void from_hf(const spark_model *m, spark_sampler_params *p)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", m->path);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf);
    if (!root) return; /* a broken optional file only loses the recommendation */
    const cJSON *sample = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    if (cJSON_IsFalse(sample)) {
        p->temperature = 0;
    } else {
        read_number(root, "temperature", &p->temperature);
    }
    read_number(root, "top_p", &p->top_p);
    read_number(root, "min_p", &p->min_p);
    read_number(root, "repetition_penalty", &p->repeat_penalty);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    if (cJSON_IsNumber(k)) p->top_k = k->valueint;
    cJSON_Delete(root);
}

static void from_gguf(const spark_model *m, spark_sampler_params *p)
{
    double v;
    int64_t k;
    if (gguf_get_f64(&m->gguf, "general.sampling.temp", &v) == SPARK_OK) p->temperature = (float)v;
    if (gguf_get_f64(&m->gguf, "general.sampling.top_p", &v) == SPARK_OK) p->top_p = (float)v;
    if (gguf_get_f64(&m->gguf, "general.sampling.min_p", &v) == SPARK_OK) p->min_p = (float)v;
    if (gguf_get_i64(&m->gguf, "general.sampling.top_k", &k) == SPARK_OK) p->top_k = (int32_t)k;
    spark_clear_error();
}

spark_sampler_params spark_model_sampler_defaults(const spark_model *m)
{
    spark_sampler_params p = spark_sampler_default_params();
    if (m->format == MODEL_FORMAT_HF)
        from_hf(m, &p);
    else
        from_gguf(m, &p);
    /* keep whatever the file says inside the sampler's valid ranges */
    if (!(p.temperature >= 0)) p.temperature = 1.0f;
    if (!(p.top_p > 0 && p.top_p <= 1)) p.top_p = 1.0f;
    if (!(p.min_p >= 0 && p.min_p <= 1)) p.min_p = 0.0f;
    if (!(p.repeat_penalty > 0)) p.repeat_penalty = 1.0f;
    if (p.top_k < 0) p.top_k = 0;
    return p;
}
