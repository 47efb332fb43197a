/*
 * error.c — the thread-local last-error message behind spark_last_error().
 */
#include "base/error.h"

#include <stdarg.h>
#include <string.h>

enum { ERROR_TEXT_MAX = 1024 };
static _Thread_local char error_text[ERROR_TEXT_MAX];

spark_status spark_fail(spark_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    return status;
}

void spark_error_prefix(const char *fmt, ...)
{
    char prefix[ERROR_TEXT_MAX], old[ERROR_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_text, sizeof old);
    snprintf(error_text, sizeof error_text, "%s: %s", prefix, old);
}

void spark_clear_error(void) { error_text[0] = '\0'; }

const char *spark_last_error(void) { return error_text; }

const char *spark_status_str(spark_status status)
{
    static const char *const names[SPARK_STATUS_COUNT] = {
        [SPARK_OK] = "SPARK_OK",
        [SPARK_ERR_IO] = "SPARK_ERR_IO",
        [SPARK_ERR_FORMAT] = "SPARK_ERR_FORMAT",
        [SPARK_ERR_UNSUPPORTED] = "SPARK_ERR_UNSUPPORTED",
        [SPARK_ERR_MISSING] = "SPARK_ERR_MISSING",
        [SPARK_ERR_SHAPE] = "SPARK_ERR_SHAPE",
        [SPARK_ERR_ARG] = "SPARK_ERR_ARG",
        [SPARK_ERR_CONTEXT] = "SPARK_ERR_CONTEXT",
        [SPARK_ERR_NOMEM] = "SPARK_ERR_NOMEM",
        [SPARK_ERR_INTERNAL] = "SPARK_ERR_INTERNAL",
    };
    if ((unsigned)status >= SPARK_STATUS_COUNT) return "SPARK_ERR_UNKNOWN";
    return names[status];
}
