/*
 * mapped_file.c — hold a whole file read-only in memory, mapped or copied.
 *
 * Mapped: MAP_PRIVATE + PROT_READ: the process can never write into a
 * checkpoint, and pages are shared with the page cache. The descriptor is
 * closed right after mmap (the mapping keeps the file alive).
 *
 * Copied: the file is read in large chunks (by up to 4 threads) into an anonymous mapping whose
 * start is 2 MiB-aligned and which asks for transparent huge pages
 * (MADV_HUGEPAGE), then made read-only. Streaming weights from such memory
 * is measurably faster than from a 4 KiB-page file mapping (bench/RESULTS.md,
 * CPU backend), at the price of the copy's RAM and the time to read it.
 *
 * An empty file is valid and gives data == NULL, size == 0, because mmap
 * refuses length 0; the format readers then reject it as too short with their
 * own message.
 */
#include "io/mapped_file.h"

#include "base/error.h"
#include "base/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reject what cannot be mapped as a plain file (directories, devices) with a
 * message that says so, rather than mmap's less helpful ENODEV. */
static spark_status check_regular(const char *path, const struct stat *st)
{
    if (S_ISDIR(st->st_mode)) return spark_fail(SPARK_ERR_IO, "%s: is a directory, expected a file", path);
    if (!S_ISREG(st->st_mode)) return spark_fail(SPARK_ERR_IO, "%s: not a regular file", path);
    if ((uint64_t)st->st_size > (uint64_t)SIZE_MAX)
        return spark_fail(SPARK_ERR_IO, "%s: file of %lld bytes is too large to map", path, (long long)st->st_size);
    return SPARK_OK;
}

static spark_status map_fd(int fd, const char *path, uint64_t size, mapped_file *out)
{
    if (size == 0) return SPARK_OK;
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return spark_fail(SPARK_ERR_IO, "%s: mmap of %llu bytes failed: %s", path, (unsigned long long)size, strerror(errno));
    out->data = p;
    out->region = p;
    out->region_len = (size_t)size;
    return SPARK_OK;
}

enum { HUGE_ALIGN = 2 << 20, READ_CHUNK = 32 << 20, MAX_READERS = 4 };

static double gb(uint64_t bytes) { return (double)bytes / 1e9; }

/* The copy is read by a few threads at once, each claiming READ_CHUNK-sized
 * pieces in order: most of the time goes into faulting in (and zeroing) the
 * fresh pages, which is per-thread work, so on the 2-core development VM two
 * readers take the 8 GB bf16 4B file from ~28 s to about half that. */
typedef struct copy_job {
    int fd;
    uint8_t *dst;
    uint64_t size;
    _Atomic uint64_t next, done;
    _Atomic int failed;  /* 0, or the first failure: 1 + errno (1 = the file ended early) */
    uint64_t failed_at;  /* written by the thread that set `failed` */
    const mapped_file_opts *o; /* progress, reported by the calling thread only */
} copy_job;

static void copy_pieces(copy_job *j, int report)
{
    for (;;) {
        if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return;
        uint64_t off = atomic_fetch_add(&j->next, (uint64_t)READ_CHUNK);
        if (off >= j->size) return;
        size_t want = j->size - off < READ_CHUNK ? (size_t)(j->size - off) : (size_t)READ_CHUNK, got = 0;
        while (got < want) {
            ssize_t r = pread(j->fd, j->dst + off + got, want - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                int expected = 0;
                if (atomic_compare_exchange_strong(&j->failed, &expected, r < 0 ? 1 + errno : 1)) j->failed_at = off + got;
                return;
            }
            got += (size_t)r;
        }
        uint64_t done = atomic_fetch_add(&j->done, (uint64_t)want) + want;
        if (report && j->o->progress) j->o->progress(done, j->size, j->o->user);
    }
}

static void *copy_thread(void *arg)
{
    copy_pieces(arg, 0);
    return NULL;
}

/* Read the whole file into a fresh anonymous mapping, 2 MiB-aligned so that
 * every full 2 MiB of it can be one huge page. */
static spark_status copy_fd(int fd, const char *path, uint64_t size, const mapped_file_opts *o, mapped_file *out)
{
    if (size == 0) return SPARK_OK;
    size_t len = (size_t)size;
    size_t rounded = (len + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN;
    size_t region_len = rounded + HUGE_ALIGN; /* slack to align the start */
    void *region = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        return spark_fail(SPARK_ERR_NOMEM, "%s: cannot allocate %.2f GB to read the file into memory: %s (--mmap maps it instead)",
                          path, gb(size), strerror(errno));
    uint8_t *p = (uint8_t *)(((uintptr_t)region + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
    int huge = 0;
#ifdef MADV_HUGEPAGE
    if (!o->no_huge && mapped_file_thp_setting() != THP_NEVER) huge = madvise(p, rounded, MADV_HUGEPAGE) == 0;
#endif
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    copy_job j = {.fd = fd, .dst = p, .size = size, .o = o};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int readers = size <= READ_CHUNK ? 1 : cpus < 1 ? 1 : cpus > MAX_READERS ? MAX_READERS : (int)cpus;
    pthread_t helpers[MAX_READERS];
    int started = 0;
    for (int i = 1; i < readers; i++)
        if (pthread_create(&helpers[started], NULL, copy_thread, &j) == 0) started++; /* fewer is fine */
    copy_pieces(&j, 1);
    for (int i = 0; i < started; i++) pthread_join(helpers[i], NULL);
    spark_status status = SPARK_OK;
    int failed = atomic_load(&j.failed);
    if (!failed && o->progress) o->progress(size, size, o->user); /* the helpers may have read the last pieces */
    if (failed == 1)
        status = spark_fail(SPARK_ERR_IO, "%s: short read: the file ended at byte %llu of the %llu it had when opened (truncated while loading?)",
                            path, (unsigned long long)j.failed_at, (unsigned long long)size);
    else if (failed == 1 + ENOMEM)
        status = spark_fail(SPARK_ERR_NOMEM, "%s: out of memory reading %.2f GB into memory (--mmap maps it instead)", path, gb(size));
    else if (failed)
        status = spark_fail(SPARK_ERR_IO, "%s: read failed at byte %llu of %llu: %s", path, (unsigned long long)j.failed_at,
                            (unsigned long long)size, strerror(failed - 1));
    if (status == SPARK_OK && mprotect(p, rounded, PROT_READ) != 0)
        status = spark_fail(SPARK_ERR_IO, "%s: cannot make the in-memory copy read-only: %s", path, strerror(errno));
    if (status != SPARK_OK) {
        munmap(region, region_len);
        return status;
    }
    out->data = p;
    out->region = region;
    out->region_len = region_len;
    out->copied = 1;
    out->huge = huge;
    return SPARK_OK;
}

spark_status mapped_file_open_ex(const char *path, const mapped_file_opts *opts, mapped_file *out)
{
    static const mapped_file_opts map_only = {0};
    if (!opts) opts = &map_only;
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return spark_fail(SPARK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));

    struct stat st;
    spark_status status = SPARK_OK;
    if (fstat(fd, &st) != 0) status = spark_fail(SPARK_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (status == SPARK_OK) status = check_regular(path, &st);

    mapped_file mf = {0};
    if (status == SPARK_OK)
        status = opts->copy ? copy_fd(fd, path, (uint64_t)st.st_size, opts, &mf) : map_fd(fd, path, (uint64_t)st.st_size, &mf);
    close(fd);
    if (status != SPARK_OK) return status;

    mf.path = spark_strdup(path);
    if (!mf.path) {
        if (mf.region) munmap(mf.region, mf.region_len);
        return SPARK_ERR_NOMEM;
    }
    mf.size = (uint64_t)st.st_size;
    *out = mf;
    return SPARK_OK;
}

spark_status mapped_file_open(const char *path, mapped_file *out) { return mapped_file_open_ex(path, NULL, out); }

void mapped_file_close(mapped_file *file)
{
    if (!file) return;
    if (file->region) munmap(file->region, file->region_len);
    free(file->path);
    memset(file, 0, sizeof *file);
}

thp_setting mapped_file_thp_setting(void)
{
    const char *path = getenv("SPARK_THP_ENABLED_FILE");
    if (!path || !*path) path = "/sys/kernel/mm/transparent_hugepage/enabled";
    FILE *f = fopen(path, "r");
    if (!f) return THP_UNKNOWN;
    char line[256] = {0};
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    if (!ok) return THP_UNKNOWN;
    /* "always [madvise] never": the bracketed word is in force */
    if (strstr(line, "[always]")) return THP_ALWAYS;
    if (strstr(line, "[madvise]")) return THP_MADVISE;
    if (strstr(line, "[never]")) return THP_NEVER;
    return THP_UNKNOWN;
}

const char *thp_setting_name(thp_setting s)
{
    switch (s) {
    case THP_ALWAYS: return "always";
    case THP_MADVISE: return "madvise";
    case THP_NEVER: return "never";
    default: return "unknown";
    }
}
