/*
 * hook_opts.c — parsing and applying the instrument flags (see hook_opts.h),
 * and writing what they collected: capture as .npy [positions, layers,
 * hidden] with a JSON sidecar, FFN statistics as JSON + .npy.
 */
#include "cli/hook_opts.h"

#include "cli/cli_util.h"
#include "io/npy.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char hook_opts_help[] =
    "  --steer FILE            steering directions: control-vector GGUF (direction.N) or .npy\n"
    "                          [layers, hidden]; repeatable; the next three flags apply to\n"
    "                          the last --steer given\n"
    "  --steer-mode MODE       add (default) | ablate | clamp | renorm\n"
    "  --steer-strength A      strength (default 1.0)\n"
    "  --steer-layers A-B      only layers A..B (0-based; default: every layer in the file)\n"
    "  --capture FILE.npy      write the residual stream after each layer (after steering)\n"
    "                          as float32 [positions, layers, hidden] + FILE.json\n"
    "  --capture-layers A-B    layers to capture (default all)\n"
    "  --capture-positions P   last (the last prompt token, default) | all\n"
    "  --ffn-hist FILE.json    FFN activation statistics (+ FILE.npy: per-neuron mass)\n"
    "  --ffn-topk K            neurons compared between consecutive tokens (default 32)\n"
    "  --timing                print the time split embed / attention / FFN / head\n";

void hook_opts_init(hook_opts *h)
{
    memset(h, 0, sizeof *h);
    h->capture_first = h->capture_last = -1;
    h->ffn_topk = 32;
}

static int parse_range(const char *command, const char *flag, const char *v, int32_t *a, int32_t *b)
{
    char *end;
    long x = strtol(v, &end, 10), y = x;
    if (*end == '-') y = strtol(end + 1, &end, 10);
    if (end == v || *end || x < 0 || y < x || y > 1 << 20) {
        fprintf(stderr, "spark %s: %s expects A-B or A (0-based layers), got '%s'\n", command, flag, v);
        return -1;
    }
    *a = (int32_t)x;
    *b = (int32_t)y;
    return 1;
}

static int steer_flag(hook_opts *h, const char *a, const char *v, const char *cmd)
{
    if (!strcmp(a, "--steer")) {
        if (h->n_steer == HOOK_MAX_STEER) {
            fprintf(stderr, "spark %s: at most %d --steer files\n", cmd, HOOK_MAX_STEER);
            return -1;
        }
        h->steer[h->n_steer++] = (steer_opt){v, SPARK_STEER_ADD, 1.0f, -1, -1};
        return 1;
    }
    if (h->n_steer == 0) {
        fprintf(stderr, "spark %s: %s must follow a --steer FILE\n", cmd, a);
        return -1;
    }
    steer_opt *s = &h->steer[h->n_steer - 1];
    if (!strcmp(a, "--steer-mode")) {
        static const char *const modes[] = {"add", "ablate", "clamp", "renorm"};
        for (int m = 0; m < SPARK_STEER_MODE_COUNT; m++)
            if (!strcmp(v, modes[m])) return s->mode = (spark_steer_mode)m, 1;
        fprintf(stderr, "spark %s: --steer-mode expects add, ablate, clamp or renorm, got '%s'\n", cmd, v);
        return -1;
    }
    if (!strcmp(a, "--steer-strength")) {
        double x;
        if (!cli_parse_float(cmd, a, v, &x)) return -1;
        s->strength = (float)x;
        return 1;
    }
    return parse_range(cmd, a, v, &s->first_layer, &s->last_layer);
}

int hook_opts_parse(hook_opts *h, int argc, char **argv, int *i, const char *command)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--timing")) return h->timing = 1;
    static const char *const valued[] = {"--steer", "--steer-mode", "--steer-strength", "--steer-layers", "--capture",
                                         "--capture-layers", "--capture-positions", "--ffn-hist", "--ffn-topk", NULL};
    int k = 0;
    while (valued[k] && strcmp(a, valued[k])) k++;
    if (!valued[k]) return 0;
    const char *v = cli_flag_value(argc, argv, i, command);
    if (!v) return -1;
    if (!strncmp(a, "--steer", 7)) return steer_flag(h, a, v, command);
    if (!strcmp(a, "--capture")) return h->capture_file = v, 1;
    if (!strcmp(a, "--capture-layers")) return parse_range(command, a, v, &h->capture_first, &h->capture_last);
    if (!strcmp(a, "--capture-positions")) {
        if (strcmp(v, "last") && strcmp(v, "all")) {
            fprintf(stderr, "spark %s: --capture-positions expects last or all, got '%s'\n", command, v);
            return -1;
        }
        h->capture_all_positions = !strcmp(v, "all");
        return 1;
    }
    if (!strcmp(a, "--ffn-hist")) return h->ffn_file = v, 1;
    return cli_parse_int(command, a, v, 1, 1 << 20, &h->ffn_topk) ? 1 : -1;
}

static int apply_steer(const steer_opt *o, spark_model *model, spark_session *session, const char *command)
{
    const spark_model_config *c = spark_model_get_config(model);
    float *dirs;
    uint8_t *present;
    if (spark_steering_load(o->file, c->n_layer, c->n_embd, &dirs, &present) != SPARK_OK)
        return cli_report_error(command);
    int rc = 0, used = 0;
    for (int32_t l = 0; l < c->n_layer && rc == 0; l++) {
        if (!present[l] || (o->first_layer >= 0 && (l < o->first_layer || l > o->last_layer))) continue;
        if (spark_session_add_steering(session, l, dirs + (size_t)l * c->n_embd, o->mode, o->strength) != SPARK_OK)
            rc = cli_report_error(command);
        used++;
    }
    if (rc == 0 && !used) {
        fprintf(stderr, "spark %s: %s has no direction for the chosen layers\n", command, o->file);
        rc = EXIT_RUNTIME;
    }
    free(dirs);
    free(present);
    return rc;
}

int hook_opts_apply(const hook_opts *h, spark_model *model, spark_session *session, int32_t last_pos,
                    const char *command)
{
    const spark_model_config *c = spark_model_get_config(model);
    for (int i = 0; i < h->n_steer; i++) {
        int rc = apply_steer(&h->steer[i], model, session, command);
        if (rc) return rc;
    }
    if (h->capture_file) {
        int32_t first = h->capture_first < 0 ? 0 : h->capture_first;
        int32_t last = h->capture_last < 0 ? c->n_layer - 1 : h->capture_last;
        if (spark_session_capture_start(session, first, last, h->capture_all_positions, last_pos) != SPARK_OK)
            return cli_report_error(command);
    }
    if (h->ffn_file && spark_session_ffn_stats_start(session, (int32_t)h->ffn_topk) != SPARK_OK)
        return cli_report_error(command);
    if (h->timing) spark_session_timing(session, 1);
    return 0;
}

static char *sidecar_path(const char *path, const char *ext)
{
    size_t n = strlen(path);
    const char *dot = strrchr(path, '.');
    size_t stem = dot && !strchr(dot, '/') ? (size_t)(dot - path) : n;
    char *out = malloc(stem + strlen(ext) + 1);
    if (out) {
        memcpy(out, path, stem);
        strcpy(out + stem, ext);
    }
    return out;
}

static int write_json(const char *path, cJSON *obj, const char *command)
{
    char *text = cJSON_Print(obj);
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    free(text);
    if (!ok) fprintf(stderr, "spark %s: cannot write %s\n", command, path);
    return ok ? 0 : EXIT_RUNTIME;
}

static int finish_capture(const hook_opts *h, const spark_model_config *c, spark_session *session,
                          const int32_t *ids, int32_t n_ids, const char *command)
{
    int32_t count = spark_session_capture_count(session);
    int32_t first = h->capture_first < 0 ? 0 : h->capture_first;
    int32_t last = h->capture_last < 0 ? c->n_layer - 1 : h->capture_last;
    int64_t shape[3] = {count, last - first + 1, c->n_embd};
    const float *data = spark_session_capture_data(session);
    float empty = 0;
    if (npy_write_f32(h->capture_file, data ? data : &empty, shape, 3) != SPARK_OK) return cli_report_error(command);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "prompt_ids", cJSON_CreateIntArray(ids, n_ids));
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int32_t l = first; l <= last; l++) cJSON_AddItemToArray(layers, cJSON_CreateNumber(l));
    cJSON_AddItemToObject(o, "positions", cJSON_CreateIntArray(spark_session_capture_positions(session), count));
    cJSON_AddStringToObject(o, "shape", "[positions, layers, hidden]");
    cJSON_AddStringToObject(o, "point", "residual stream after the layer's FFN add and steering");
    char *side = sidecar_path(h->capture_file, ".json");
    int rc = side ? write_json(side, o, command) : EXIT_RUNTIME;
    free(side);
    cJSON_Delete(o);
    return rc;
}

static int finish_ffn(const hook_opts *h, spark_session *session, const char *command)
{
    const spark_ffn_stats *st = spark_session_ffn_stats(session);
    if (!st) return 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tokens", (double)st->n_tokens);
    cJSON_AddNumberToObject(o, "top_k", st->top_k);
    cJSON_AddNumberToObject(o, "bucket_min_exp", SPARK_FFN_BUCKET_MIN_EXP);
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int32_t l = 0; l < st->n_layer; l++) {
        cJSON *L = cJSON_CreateObject();
        double total = 0;
        for (int32_t i = 0; i < st->n_ff; i++) total += st->mass[(size_t)l * st->n_ff + i];
        cJSON_AddNumberToObject(L, "mass", total);
        cJSON *hist = cJSON_AddArrayToObject(L, "histogram");
        for (int b = 0; b < SPARK_FFN_BUCKETS; b++)
            cJSON_AddItemToArray(hist, cJSON_CreateNumber((double)st->histogram[(size_t)l * SPARK_FFN_BUCKETS + b]));
        cJSON_AddNumberToObject(L, "topk_overlap", st->n_pairs ? st->overlap_sum[l] / st->n_pairs : 0);
        cJSON_AddItemToArray(layers, L);
    }
    int rc = write_json(h->ffn_file, o, command);
    cJSON_Delete(o);
    char *npy = sidecar_path(h->ffn_file, ".npy");
    int64_t shape[2] = {st->n_layer, st->n_ff};
    if (rc == 0 && (!npy || npy_write_f64(npy, st->mass, shape, 2) != SPARK_OK)) rc = cli_report_error(command);
    free(npy);
    return rc;
}

void hook_opts_print_timing(spark_session *session, FILE *out)
{
    spark_phase_times t = spark_session_phase_times(session);
    double total = t.embed + t.attention + t.ffn + t.head + t.hooks + t.sampling;
    if (total <= 0) return;
    fprintf(out, "phase timing over %lld tokens in %lld calls%s:\n", (long long)t.tokens, (long long)t.calls,
            t.device ? " (host: issuing the work, waiting for the device, sampling)" : "");
    const char *names[] = {"embed", "attention", "ffn", "hooks", "head", "sampling"};
    double v[] = {t.embed, t.attention, t.ffn, t.hooks, t.head, t.sampling};
    for (int i = 0; i < 6; i++)
        fprintf(out, "  %-10s %9.3f ms  %5.1f %%\n", names[i], v[i] * 1e3, 100 * v[i] / total);
    if (!t.device) return;
    fprintf(out, "  of which waiting for the device: %.3f ms (%.1f %%); issuing: %.3f ms\n", t.device_wait * 1e3,
            100 * t.device_wait / total, (total - t.device_wait - t.sampling) * 1e3);
    double dev = t.device_embed + t.device_attention + t.device_ffn + t.device_hooks + t.device_head;
    if (dev <= 0) return;
    fprintf(out, "device time (timestamps between the phases on the GPU; the gather counts as attention):\n");
    const char *dn[] = {"attention", "ffn", "hooks", "head"};
    double dv[] = {t.device_embed + t.device_attention, t.device_ffn, t.device_hooks, t.device_head};
    for (int i = 0; i < 4; i++)
        fprintf(out, "  %-10s %9.3f ms  %5.1f %%\n", dn[i], dv[i] * 1e3, 100 * dv[i] / dev);
}

int hook_opts_finish(const hook_opts *h, const spark_model *model, spark_session *session, const int32_t *ids,
                     int32_t n_ids, const char *command)
{
    int rc = 0;
    if (h->capture_file) rc = finish_capture(h, spark_model_get_config(model), session, ids, n_ids, command);
    if (rc == 0 && h->ffn_file) rc = finish_ffn(h, session, command);
    if (h->timing) hook_opts_print_timing(session, stderr);
    return rc;
}
