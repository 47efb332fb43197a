/*
 * fuzz_safetensors.c — libFuzzer entry point for the safetensors reader.
 *
 * Each input becomes an in-memory file (memfd) loaded with
 * safetensors_append_file through its /proc/self/fd path; accepted tensors
 * have their first and last byte read so a wrong offset shows up under ASan.
 * Not built by the Makefile.
 *
 * Build: clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude -Isrc tests/fuzz/fuzz_safetensors.c src/io/safetensors.c src/io/dtype.c src/io/tensor_dir.c src/io/mapped_file.c src/base/error.c src/base/mem.c -lcjson -o build-fuzz/fuzz_safetensors
 * Run:   build-fuzz/fuzz_safetensors -max_total_time=60 build-fuzz/safetensors
 */
#include "base/error.h"
#include "io/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
        if (fd < 0) return 0;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    tensor_dir dir = {0};
    if (safetensors_append_file(path, &dir) == SPARK_OK) {
        for (int64_t t = 0; t < dir.n_tensors; t++) {
            const tensor_info *ti = &dir.tensors[t];
            const uint8_t *p = ti->data;
            if (ti->nbytes) sink += p[0] + p[ti->nbytes - 1];
            sink += (uint64_t)tensor_numel(ti);
        }
    }
    tensor_dir_free(&dir);
    return 0;
}
