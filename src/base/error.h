/*
 * error.h — how every layer reports failure.
 *
 * A fallible internal function returns a spark_status and, before doing so,
 * calls spark_fail() with one line that names the file / tensor / field and
 * what was expected. The text is thread-local and read back through
 * spark_last_error(). ASSERT guards internal invariants (bugs, not input).
 */
#ifndef SPARK_BASE_ERROR_H
#define SPARK_BASE_ERROR_H

#include "spark.h"

#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__)
#define SPARK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SPARK_PRINTF(a, b)
#endif

/* Record `status` with a printf-style message; returns `status` so callers
 * can write `return spark_fail(SPARK_ERR_SHAPE, "...")`. */
spark_status spark_fail(spark_status status, const char *fmt, ...) SPARK_PRINTF(2, 3);

/* Prefix the current message with more context ("loading X: <old message>"). */
void spark_error_prefix(const char *fmt, ...) SPARK_PRINTF(1, 2);

void spark_clear_error(void);

#define ASSERT(cond)                                                                   \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: internal invariant failed: %s\n", __FILE__,       \
                    __LINE__, #cond);                                                  \
            abort();                                                                   \
        }                                                                              \
    } while (0)

#define TRY(expr)                                                                      \
    do {                                                                               \
        spark_status try_status_ = (expr);                                             \
        if (try_status_ != SPARK_OK) return try_status_;                               \
    } while (0)

#endif
