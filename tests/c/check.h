/*
 * check.h — the few macros C unit tests use.
 *
 * A test program defines functions `static void test_xxx(void)` and lists
 * them in main() with RUN(test_xxx). Each prints "PASS name" or
 * "FAIL name: reason" (tests/run.py counts these lines); the program exits
 * non-zero if any failed.
 */
#ifndef SPARK_TESTS_CHECK_H
#define SPARK_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_failures_in_test;
static int check_failed_tests;
static int check_passed_tests;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            printf("  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);              \
            check_failures_in_test++;                                                      \
        }                                                                                  \
    } while (0)

#define CHECK_MSG(cond, ...)                                                               \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            printf("  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);              \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
            check_failures_in_test++;                                                      \
        }                                                                                  \
    } while (0)

/* The error message must mention `needle` (a tensor, key or file name). */
#define CHECK_ERROR_MENTIONS(needle)                                                       \
    CHECK_MSG(strstr(spark_last_error(), (needle)) != NULL, "error \"%s\" lacks \"%s\"",  \
              spark_last_error(), (needle))

#define CHECK_NEAR(a, b, tol)                                                              \
    CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%g vs %g (tol %g)", (double)(a), \
              (double)(b), (double)(tol))

#define RUN(fn)                                                                            \
    do {                                                                                   \
        check_failures_in_test = 0;                                                        \
        fn();                                                                              \
        if (check_failures_in_test) {                                                      \
            printf("FAIL %s\n", #fn);                                                      \
            check_failed_tests++;                                                          \
        } else {                                                                           \
            printf("PASS %s\n", #fn);                                                      \
            check_passed_tests++;                                                          \
        }                                                                                  \
        fflush(stdout);                                                                    \
    } while (0)

#define CHECK_EXIT() return check_failed_tests ? 1 : 0

#endif
