/*
 * testfile.h — build files byte by byte for the format readers' tests.
 *
 * A `tbuf` is a growable byte buffer with little-endian writers; tests
 * assemble a file in one, then write it to a fresh temporary path. Linked
 * into every test program, so it stays small and format-agnostic (GGUF and
 * safetensors specifics live in their own tests). Allocation failure aborts:
 * a test cannot do anything useful without memory.
 */
#ifndef SPARK_TESTS_TESTFILE_H
#define SPARK_TESTS_TESTFILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct tbuf {
    uint8_t *data;
    size_t len, cap;
} tbuf;

void tb_bytes(tbuf *b, const void *p, size_t n);
void tb_u8(tbuf *b, uint8_t v);
void tb_u16(tbuf *b, uint16_t v);
void tb_u32(tbuf *b, uint32_t v);
void tb_u64(tbuf *b, uint64_t v);
void tb_f32(tbuf *b, float v);
void tb_f64(tbuf *b, double v);
void tb_zeros(tbuf *b, size_t n);
/* Append zero bytes until len is a multiple of `align`. */
void tb_pad(tbuf *b, size_t align);
/* Overwrite 8 bytes at `at` with v, little-endian (at + 8 <= len). */
void tb_put_u64(tbuf *b, size_t at, uint64_t v);
void tb_free(tbuf *b);

/* Write n bytes to a new file /tmp/spark-test-XXXXXX<suffix>; returns the
 * malloc'd path (unlink + free it when done). */
char *tf_write_temp(const void *data, size_t n, const char *suffix);
/* Write n bytes to `path` (created or truncated). */
void tf_write(const char *path, const void *data, size_t n);
/* A new empty directory /tmp/spark-test-XXXXXX (malloc'd path). */
char *tf_make_dir(void);
/* malloc'd "dir/name". */
char *tf_join(const char *dir, const char *name);
/* Remove `dir` and the plain files directly inside it. */
void tf_remove_dir(const char *dir);

#endif
