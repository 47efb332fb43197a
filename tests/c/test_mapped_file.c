/*
 * test_mapped_file.c — the two ways the loader holds a file (mapped, or read
 * into 2 MiB-aligned anonymous memory), their errors, and SPARK_LOAD_AUTO's
 * choice between them.
 */
#include "check.h"
#include "testfile.h"

#include "io/mapped_file.h"
#include "model/model.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const mapped_file_opts COPY = {.copy = 1};

static void test_copy_matches_map(void)
{
    size_t n = (3u << 20) + 12345; /* past one huge page, not a multiple of anything */
    uint8_t *bytes = malloc(n);
    for (size_t i = 0; i < n; i++) bytes[i] = (uint8_t)(i * 2654435761u >> 7);
    char *path = tf_write_temp(bytes, n, ".bin");
    mapped_file a, b;
    CHECK(mapped_file_open(path, &a) == SPARK_OK);
    CHECK(mapped_file_open_ex(path, &COPY, &b) == SPARK_OK);
    CHECK(a.size == n && b.size == n);
    CHECK(!a.copied && b.copied);
    CHECK(a.data && b.data && memcmp(a.data, bytes, n) == 0 && memcmp(b.data, bytes, n) == 0);
    CHECK(((uintptr_t)b.data & ((2u << 20) - 1)) == 0); /* huge-page aligned */
    CHECK(strcmp(b.path, path) == 0);
    mapped_file_close(&a);
    mapped_file_close(&b);
    CHECK(b.data == NULL && b.path == NULL); /* zeroed */
    mapped_file_close(&b);                   /* and safe to close again */
    unlink(path);
    free(path);
    free(bytes);
}

static void test_copy_empty_file(void)
{
    char *path = tf_write_temp("", 0, ".bin");
    mapped_file f;
    CHECK(mapped_file_open_ex(path, &COPY, &f) == SPARK_OK);
    CHECK(f.data == NULL && f.size == 0);
    mapped_file_close(&f);
    unlink(path);
    free(path);
}

static void test_copy_errors_name_the_file(void)
{
    mapped_file f;
    CHECK(mapped_file_open_ex("/nonexistent/spark-weights.gguf", &COPY, &f) == SPARK_ERR_IO);
    CHECK_ERROR_MENTIONS("/nonexistent/spark-weights.gguf");
    char *dir = tf_make_dir();
    CHECK(mapped_file_open_ex(dir, &COPY, &f) == SPARK_ERR_IO);
    CHECK_ERROR_MENTIONS("is a directory");
    CHECK(f.data == NULL && f.path == NULL);
    tf_remove_dir(dir);
    free(dir);
}

typedef struct progress_log {
    uint64_t last, total;
    int calls, monotonic;
    const char *truncate_path; /* shrink this file after the first chunk */
} progress_log;

static void on_progress(uint64_t done, uint64_t total, void *user)
{
    progress_log *p = user;
    if (done < p->last || done > total) p->monotonic = 0;
    p->last = done, p->total = total;
    p->calls++;
    if (p->truncate_path && p->calls == 1) CHECK(truncate(p->truncate_path, 4096) == 0);
}

/* A file read in several chunks reports each one, ending at its size. */
static void test_copy_progress(void)
{
    char *path = tf_write_temp("x", 1, ".bin");
    CHECK(truncate(path, (150u << 20) + 7) == 0); /* sparse: cheap to make and to read */
    progress_log log = {.monotonic = 1};
    mapped_file_opts o = {.copy = 1, .progress = on_progress, .user = &log};
    mapped_file f;
    CHECK(mapped_file_open_ex(path, &o, &f) == SPARK_OK);
    CHECK(log.calls >= 2 && log.monotonic); /* the calling thread reports its pieces, then the end */
    CHECK(log.last == (150u << 20) + 7 && log.total == log.last);
    CHECK(f.data && f.data[0] == 'x' && f.data[f.size - 1] == 0);
    mapped_file_close(&f);
    unlink(path);
    free(path);
}

/* The file shrinks while it is read: a short read, named, nothing leaked. */
static void test_copy_short_read(void)
{
    char *path = tf_write_temp("x", 1, ".bin");
    CHECK(truncate(path, 400u << 20) == 0); /* many chunks: some are still unread when it shrinks */
    progress_log log = {.monotonic = 1, .truncate_path = path};
    mapped_file_opts o = {.copy = 1, .progress = on_progress, .user = &log};
    mapped_file f;
    CHECK(mapped_file_open_ex(path, &o, &f) == SPARK_ERR_IO);
    CHECK_ERROR_MENTIONS(path);
    CHECK_ERROR_MENTIONS("short read");
    CHECK(f.data == NULL && f.path == NULL);
    unlink(path);
    free(path);
}

static thp_setting thp_from(const char *text)
{
    char *path = tf_write_temp(text, strlen(text), ".thp");
    setenv("SPARK_THP_ENABLED_FILE", path, 1);
    thp_setting s = mapped_file_thp_setting();
    unsetenv("SPARK_THP_ENABLED_FILE");
    unlink(path);
    free(path);
    return s;
}

static void test_thp_setting(void)
{
    CHECK(thp_from("always [madvise] never\n") == THP_MADVISE);
    CHECK(thp_from("[always] madvise never\n") == THP_ALWAYS);
    CHECK(thp_from("always madvise [never]\n") == THP_NEVER);
    CHECK(thp_from("garbage\n") == THP_UNKNOWN);
    setenv("SPARK_THP_ENABLED_FILE", "/nonexistent/thp", 1);
    CHECK(mapped_file_thp_setting() == THP_UNKNOWN);
    unsetenv("SPARK_THP_ENABLED_FILE");
    CHECK(!strcmp(thp_setting_name(THP_NEVER), "never"));
}

/* With "never" a copy is still made (measured faster than a file mapping),
 * but MADV_HUGEPAGE is not asked for. */
static void test_copy_without_thp(void)
{
    char *thp = tf_write_temp("always madvise [never]\n", 23, ".thp");
    setenv("SPARK_THP_ENABLED_FILE", thp, 1);
    char *path = tf_write_temp("abc", 3, ".bin");
    mapped_file f;
    CHECK(mapped_file_open_ex(path, &COPY, &f) == SPARK_OK);
    CHECK(f.copied && !f.huge && f.size == 3 && !memcmp(f.data, "abc", 3));
    mapped_file_close(&f);
    unsetenv("SPARK_THP_ENABLED_FILE");
    unlink(path);
    unlink(thp);
    free(path);
    free(thp);
}

static void test_auto_choice(void)
{
    char why[192];
    const uint64_t G = 1000000000ull;
    /* fits with a quarter to spare: copy, huge pages named */
    CHECK(model_choose_load(8 * G, 24 * G, THP_MADVISE, why, sizeof why) == SPARK_LOAD_COPY);
    CHECK(strstr(why, "huge pages") && strstr(why, "madvise"));
    /* THP off: still a copy, said so */
    CHECK(model_choose_load(8 * G, 24 * G, THP_NEVER, why, sizeof why) == SPARK_LOAD_COPY);
    CHECK(strstr(why, "never") != NULL);
    /* too big for comfort (needs max(2 GB, avail/4) spare), or at all: map */
    CHECK(model_choose_load(19 * G, 24 * G, THP_MADVISE, why, sizeof why) == SPARK_LOAD_MMAP);
    CHECK(strstr(why, "memory-mapped") && strstr(why, "do not fit"));
    CHECK(model_choose_load(30 * G, 24 * G, THP_MADVISE, why, sizeof why) == SPARK_LOAD_MMAP);
    CHECK(model_choose_load(1 * G, 2 * G, THP_MADVISE, why, sizeof why) == SPARK_LOAD_MMAP); /* 2 GB spare minimum */
    CHECK(model_choose_load(10000000, 2100000000ull, THP_MADVISE, why, sizeof why) == SPARK_LOAD_COPY);
    /* unknown memory: map */
    CHECK(model_choose_load(1000, 0, THP_MADVISE, why, sizeof why) == SPARK_LOAD_MMAP);
    CHECK(strstr(why, "unknown") != NULL);
}

int main(void)
{
    RUN(test_copy_matches_map);
    RUN(test_copy_empty_file);
    RUN(test_copy_errors_name_the_file);
    RUN(test_copy_progress);
    RUN(test_copy_short_read);
    RUN(test_thp_setting);
    RUN(test_copy_without_thp);
    RUN(test_auto_choice);
    CHECK_EXIT();
}
