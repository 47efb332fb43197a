/*
 * mapped_file.c — hold a whole file read-only in memory, mapped or copied.
 *
 * Mapped: MAP_PRIVATE + PROT_READ: the process can never write into a
 * checkpoint, and pages are shared with the page cache. The descriptor is
 * closed right after mmap (the mapping keeps the file alive).
 *
 * Copied: the file is read() in large chunks into an anonymous mapping whose
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

enum { HUGE_ALIGN = 2 << 20, READ_CHUNK = 64 << 20 };

static double gb(uint64_t bytes) { return (double)bytes / 1e9; }

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
    uint64_t done = 0;
    spark_status status = SPARK_OK;
    while (done < size) {
        size_t want = size - done < READ_CHUNK ? (size_t)(size - done) : (size_t)READ_CHUNK;
        ssize_t got = read(fd, p + done, want);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int e = errno;
            status = e == ENOMEM ? spark_fail(SPARK_ERR_NOMEM, "%s: out of memory reading %.2f GB into memory after %.2f GB (--mmap maps it instead)",
                                              path, gb(size), gb(done))
                                 : spark_fail(SPARK_ERR_IO, "%s: read failed at byte %llu of %llu: %s", path,
                                              (unsigned long long)done, (unsigned long long)size, strerror(e));
            break;
        }
        if (got == 0) {
            status = spark_fail(SPARK_ERR_IO, "%s: short read: the file ended at byte %llu of the %llu it had when opened (truncated while loading?)",
                                path, (unsigned long long)done, (unsigned long long)size);
            break;
        }
        done += (uint64_t)got;
        if (o->progress) o->progress(done, size, o->user);
    }
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
