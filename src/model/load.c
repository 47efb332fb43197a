/*
 * load.c — spark_model_load(): decide the checkpoint's format, read its
 * config, map its tensors and bind the weights.
 *
 * A directory is a Hugging Face checkpoint (config.json + safetensors); a
 * file starting with the bytes "GGUF" is a GGUF file. Anything else is
 * refused with a message saying what was expected.
 *
 * The weight files are then either memory-mapped or read into anonymous
 * memory with transparent huge pages (spark_load_mode). The copy is what a
 * CPU decode wants: on the development machine a file mapping streams at
 * ~26 GB/s and the same bytes in anonymous memory at ~30 (bench/RESULTS.md),
 * and decode is bound by that stream. AUTO copies when the files fit with room
 * to spare and maps them otherwise (a copy that does not fit would push the
 * system into swap or the OOM killer; a mapping just pages).
 */
#include "model/model.h"

#include "base/error.h"
#include "base/mem.h"
#include "io/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static spark_status load_hf(spark_model *m, const mapped_file_opts *fo)
{
    char config_path[4096];
    snprintf(config_path, sizeof config_path, "%s/config.json", m->path);
    TRY(config_from_hf(config_path, &m->cfg, &m->layer_kind, &m->tied_head));
    TRY(safetensors_open_dir_ex(m->path, fo, &m->hf_tensors));
    m->tensors = &m->hf_tensors;
    return weights_bind(m);
}

static spark_status load_gguf(spark_model *m, const mapped_file_opts *fo)
{
    TRY(gguf_open_ex(m->path, fo, &m->gguf));
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

/* ---- how to hold the files ------------------------------------------------ */

static uint64_t read_number(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, strlen(key))) continue;
        v = strtoull(line + strlen(key), NULL, 10);
        break;
    }
    fclose(f);
    return v;
}

uint64_t model_memory_available(void)
{
    uint64_t avail = read_number("/proc/meminfo", "MemAvailable:") * 1024;
    uint64_t limit = read_number("/sys/fs/cgroup/memory.max", ""); /* "max" reads as 0 = none */
    uint64_t used = read_number("/sys/fs/cgroup/memory.current", "");
    if (limit && limit > used && limit - used < avail) avail = limit - used;
    return avail;
}

static double gb(uint64_t bytes) { return (double)bytes / 1e9; }

spark_load_mode model_choose_load(uint64_t file_bytes, uint64_t avail, thp_setting thp, char *why, size_t n)
{
    const uint64_t min_spare = (uint64_t)2000000000; /* KV cache, scratch, everything else */
    uint64_t spare = avail / 4 > min_spare ? avail / 4 : min_spare;
    if (!avail) {
        snprintf(why, n, "memory-mapped: the memory available is unknown");
        return SPARK_LOAD_MMAP;
    }
    if (file_bytes > avail || avail - file_bytes < spare) {
        snprintf(why, n, "memory-mapped: %.2f GB of weights do not fit comfortably in %.2f GB available (want %.2f GB spare)",
                 gb(file_bytes), gb(avail), gb(spare));
        return SPARK_LOAD_MMAP;
    }
    if (thp == THP_NEVER) {
        snprintf(why, n, "read into memory without huge pages (transparent huge pages are 'never' here): %.2f GB of %.2f GB available",
                 gb(file_bytes), gb(avail));
        return SPARK_LOAD_COPY;
    }
    snprintf(why, n, "read into memory with huge pages (THP '%s'): %.2f GB of weights, %.2f GB available",
             thp_setting_name(thp), gb(file_bytes), gb(avail));
    return SPARK_LOAD_COPY;
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Bytes of the files the loader will hold: the GGUF file, or every
 * .safetensors file of an HF directory. */
static uint64_t weight_file_bytes(const spark_model *m)
{
    struct stat st;
    if (m->format == MODEL_FORMAT_GGUF) return stat(m->path, &st) == 0 ? (uint64_t)st.st_size : 0;
    uint64_t total = 0;
    DIR *d = opendir(m->path);
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!has_suffix(e->d_name, ".safetensors")) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", m->path, e->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) total += (uint64_t)st.st_size;
    }
    closedir(d);
    return total;
}

typedef struct progress_acc {
    const spark_model_load_options *o;
    uint64_t before, total; /* bytes of the files already read; all files */
    uint64_t last;          /* what the current file reported last */
} progress_acc;

/* Per-file progress to whole-model progress (shards are read one by one). */
static void progress_relay(uint64_t done, uint64_t total, void *user)
{
    progress_acc *p = user;
    (void)total;
    if (done < p->last) p->before += p->last; /* a new file started */
    p->last = done;
    uint64_t all = p->before + done;
    p->o->progress(all, p->total > all ? p->total : all, p->o->progress_user);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

spark_model_load_options spark_model_default_load_options(void)
{
    spark_model_load_options o = {.mode = SPARK_LOAD_AUTO};
    return o;
}

const char *spark_load_mode_name(spark_load_mode mode)
{
    switch (mode) {
    case SPARK_LOAD_AUTO: return "auto";
    case SPARK_LOAD_MMAP: return "mmap";
    case SPARK_LOAD_COPY: return "copy";
    default: return "invalid";
    }
}

spark_status spark_model_load(const char *path, spark_model **out) { return spark_model_load_ex(path, NULL, out); }

spark_status spark_model_load_ex(const char *path, const spark_model_load_options *opts, spark_model **out)
{
    *out = NULL;
    spark_clear_error();
    spark_model_load_options o = opts ? *opts : spark_model_default_load_options();
    if (!path || !*path) return spark_fail(SPARK_ERR_ARG, "no model path given");
    if ((unsigned)o.mode >= SPARK_LOAD_MODE_COUNT) return spark_fail(SPARK_ERR_ARG, "load mode %d is not a spark_load_mode", (int)o.mode);
    spark_model *m = spark_calloc(1, sizeof *m, "model");
    if (!m) return SPARK_ERR_NOMEM;
    double t0 = now_s();
    m->path = spark_strdup(path);
    spark_status st = m->path ? detect_format(path, &m->format) : SPARK_ERR_NOMEM;
    mapped_file_opts fo = {0};
    progress_acc acc = {.o = &o};
    if (st == SPARK_OK) {
        spark_model_load_info *li = &m->load;
        thp_setting thp = mapped_file_thp_setting();
        li->file_bytes = weight_file_bytes(m);
        if (o.mode == SPARK_LOAD_AUTO)
            li->mode = model_choose_load(li->file_bytes, model_memory_available(), thp, li->why, sizeof li->why);
        else {
            li->mode = o.mode;
            if (o.mode == SPARK_LOAD_MMAP) snprintf(li->why, sizeof li->why, "memory-mapped (asked for)");
            else snprintf(li->why, sizeof li->why, "read into memory (asked for)%s",
                          thp == THP_NEVER ? " without huge pages (transparent huge pages are 'never' here)" : "");
        }
        fo.copy = li->mode == SPARK_LOAD_COPY;
        acc.total = li->file_bytes;
        if (o.progress) fo.progress = progress_relay, fo.user = &acc;
        st = m->format == MODEL_FORMAT_HF ? load_hf(m, &fo) : load_gguf(m, &fo);
    }
    if (st != SPARK_OK) {
        spark_model_free(m);
        return st;
    }
    const tensor_dir *td = m->tensors;
    m->load.huge_pages = td && td->n_files > 0 && td->files[0].huge;
    m->load.seconds = now_s() - t0;
    *out = m;
    return SPARK_OK;
}

const spark_model_load_info *spark_model_get_load_info(const spark_model *m) { return &m->load; }

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
