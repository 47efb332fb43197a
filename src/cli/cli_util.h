/*
 * cli_util.h — helpers shared by the sub-commands: strict number parsing,
 * flag values, id lists, and a .npy writer.
 */
#ifndef SPARK_CLI_UTIL_H
#define SPARK_CLI_UTIL_H

#include "spark.h"

#include <stdint.h>
#include <stdio.h>

/* Exit statuses: runtime failure vs. bad usage. */
enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

/* The value after flag argv[*i]; advances *i. Prints a usage line and
 * returns NULL when it is missing. */
const char *cli_flag_value(int argc, char **argv, int *i, const char *command);

/* Whole-string integer / float parsing with range checks; on failure print
 * "spark CMD: FLAG expects ..." and return 0. */
int cli_parse_int(const char *command, const char *flag, const char *text, long min, long max, long *out);
int cli_parse_float(const char *command, const char *flag, const char *text, double *out);

/* "12,7,99" -> malloc'd ids; returns 0 (after printing) on a bad list. */
int cli_parse_ids(const char *command, const char *text, int32_t **ids, int *n);

/* Read a whole stream into a malloc'd NUL-terminated buffer (*len bytes);
 * NULL on a read error or out of memory. */
char *cli_read_all(FILE *f, size_t *len);

/* --mmap / --no-mmap: 1 when `arg` is one of them (and sets *mode), else 0. */
int cli_load_flag(const char *arg, int *mode);

/* The help lines of --mmap / --no-mmap. */
extern const char cli_load_help[];

/* Load the model as `mode` (spark_load_mode) says; AUTO maps the files when
 * the model runs on a GPU (gpu != 0). Shows progress on a terminal while a
 * copy is read. Returns SPARK_OK, or the status with spark_last_error() set. */
int cli_load_model(const char *path, int mode, int gpu, spark_model **out);

/* Print "spark CMD: <spark_last_error()>" to stderr and return EXIT_RUNTIME. */
int cli_report_error(const char *command);

#endif
