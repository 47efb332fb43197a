/*
 * testfile.c — byte buffers and temporary files for format tests (see
 * testfile.h).
 */
#include "testfile.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what)
{
    perror(what);
    abort();
}

void tb_bytes(tbuf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *grown = realloc(b->data, cap);
        if (!grown) die("tbuf");
        b->data = grown;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void tb_le(tbuf *b, uint64_t v, int n)
{
    uint8_t bytes[8];
    for (int i = 0; i < n; i++) bytes[i] = (uint8_t)(v >> (8 * i));
    tb_bytes(b, bytes, (size_t)n);
}

void tb_u8(tbuf *b, uint8_t v) { tb_le(b, v, 1); }
void tb_u16(tbuf *b, uint16_t v) { tb_le(b, v, 2); }
void tb_u32(tbuf *b, uint32_t v) { tb_le(b, v, 4); }
void tb_u64(tbuf *b, uint64_t v) { tb_le(b, v, 8); }

void tb_f32(tbuf *b, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    tb_u32(b, u);
}

void tb_f64(tbuf *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    tb_u64(b, u);
}

void tb_zeros(tbuf *b, size_t n)
{
    for (size_t i = 0; i < n; i++) tb_u8(b, 0);
}

void tb_pad(tbuf *b, size_t align)
{
    while (b->len % align) tb_u8(b, 0);
}

void tb_put_u64(tbuf *b, size_t at, uint64_t v)
{
    for (int i = 0; i < 8; i++) b->data[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

void tb_free(tbuf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

char *tf_write_temp(const void *data, size_t n, const char *suffix)
{
    char *path = malloc(64 + strlen(suffix));
    if (!path) die("tf_write_temp");
    sprintf(path, "/tmp/spark-test-XXXXXX%s", suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    if (fd < 0) die("mkstemps");
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, (const uint8_t *)data + done, n - done);
        if (w <= 0) die("write");
        done += (size_t)w;
    }
    close(fd);
    return path;
}

void tf_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) die(path);
}

char *tf_make_dir(void)
{
    char *path = strdup("/tmp/spark-test-XXXXXX");
    if (!path || !mkdtemp(path)) die("mkdtemp");
    return path;
}

char *tf_join(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    if (!p) die("tf_join");
    sprintf(p, "%s/%s", dir, name);
    return p;
}

void tf_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = tf_join(dir, e->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}
