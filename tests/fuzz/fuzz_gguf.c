/*
 * fuzz_gguf.c — libFuzzer entry point for the GGUF reader.
 *
 * Each input is written to an in-memory file (memfd) and opened through its
 * /proc/self/fd path, so the real open + mmap path is what gets fuzzed. When
 * a file is accepted, every metadata value, array element, string and the
 * first and last byte of every tensor are read, so an accepted-but-wrong
 * offset shows up under ASan. Not built by the Makefile.
 *
 * Build: clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude -Isrc tests/fuzz/fuzz_gguf.c src/io/gguf.c src/io/dtype.c src/io/tensor_dir.c src/io/mapped_file.c src/base/error.c src/base/mem.c -o build-fuzz/fuzz_gguf
 * Seeds: mkdir -p build-fuzz/gguf && SPARK_FUZZ_SEEDS=build-fuzz/gguf build/tests/test_gguf
 * Run:   build-fuzz/fuzz_gguf -max_total_time=60 build-fuzz/gguf
 */
#include "base/error.h"
#include "io/gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile uint64_t sink;

static void touch_array(const gguf_kv *kv)
{
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        if (kv->arr_type == GGUF_TYPE_STRING) {
            gguf_str s = gguf_arr_str(kv, i);
            sink += s.len ? (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1] : 0;
        } else if (kv->arr_type == GGUF_TYPE_FLOAT32 || kv->arr_type == GGUF_TYPE_FLOAT64) {
            sink += (uint64_t)(gguf_arr_f64(kv, i) != 0);
        } else if (kv->arr_type != GGUF_TYPE_ARRAY) {
            sink += (uint64_t)gguf_arr_i64(kv, i) + (uint64_t)(gguf_arr_f64(kv, i) != 0);
        }
    }
}

static void touch_kv(const gguf_file *g, const gguf_kv *kv)
{
    int64_t i;
    double f;
    bool b;
    gguf_str s;
    if (kv->type == GGUF_TYPE_ARRAY) touch_array(kv);
    if (gguf_get_i64(g, kv->key, &i) == SPARK_OK) sink += (uint64_t)i;
    if (gguf_get_f64(g, kv->key, &f) == SPARK_OK) sink += (uint64_t)(f != 0);
    if (gguf_get_bool(g, kv->key, &b) == SPARK_OK) sink += b;
    if (gguf_get_str(g, kv->key, &s) == SPARK_OK && s.len) sink += (uint8_t)s.ptr[s.len - 1];
}

static void touch(const gguf_file *g)
{
    for (int64_t k = 0; k < g->n_kvs; k++) touch_kv(g, &g->kvs[k]);
    for (int64_t t = 0; t < g->tensors.n_tensors; t++) {
        const tensor_info *ti = &g->tensors.tensors[t];
        const uint8_t *p = ti->data;
        if (ti->nbytes) sink += p[0] + p[ti->nbytes - 1];
        sink += (uint64_t)tensor_numel(ti) + (tensor_dir_find(&g->tensors, ti->name) != NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz.gguf", MFD_CLOEXEC);
        if (fd < 0) return 0;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    gguf_file g;
    if (gguf_open(path, &g) == SPARK_OK) {
        touch(&g);
        gguf_close(&g);
    }
    return 0;
}
