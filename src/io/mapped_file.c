/*
 * mapped_file.c — map a whole file read-only so weights are never copied.
 *
 * The mapping is MAP_PRIVATE + PROT_READ: the process can never write into a
 * checkpoint, and pages are shared with the page cache. The descriptor is
 * closed right after mmap (the mapping keeps the file alive). An empty file is
 * valid and maps to data == NULL, size == 0, because mmap refuses length 0;
 * the format readers then reject it as too short with their own message.
 */
#include "io/mapped_file.h"

#include "base/error.h"
#include "base/mem.h"

#include <errno.h>
#include <fcntl.h>
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

static spark_status map_fd(int fd, const char *path, uint64_t size, const uint8_t **data)
{
    *data = NULL;
    if (size == 0) return SPARK_OK;
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return spark_fail(SPARK_ERR_IO, "%s: mmap of %llu bytes failed: %s", path, (unsigned long long)size, strerror(errno));
    *data = p;
    return SPARK_OK;
}

spark_status mapped_file_open(const char *path, mapped_file *out)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return spark_fail(SPARK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));

    struct stat st;
    spark_status status = SPARK_OK;
    if (fstat(fd, &st) != 0) status = spark_fail(SPARK_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (status == SPARK_OK) status = check_regular(path, &st);

    const uint8_t *data = NULL;
    if (status == SPARK_OK) status = map_fd(fd, path, (uint64_t)st.st_size, &data);
    close(fd);
    if (status != SPARK_OK) return status;

    char *copy = spark_strdup(path);
    if (!copy) {
        if (data) munmap((void *)data, (size_t)st.st_size);
        return SPARK_ERR_NOMEM;
    }
    out->path = copy;
    out->data = data;
    out->size = (uint64_t)st.st_size;
    return SPARK_OK;
}

void mapped_file_close(mapped_file *file)
{
    if (!file) return;
    if (file->data) munmap((void *)file->data, (size_t)file->size);
    free(file->path);
    memset(file, 0, sizeof *file);
}
