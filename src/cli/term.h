/*
 * term.h — generation on a terminal: streamed text (with reasoning hidden,
 * or dimmed with --show-think), a progress bar for long prompts, Ctrl-C
 * handling (first press stops generating, second exits), speeds on stderr.
 */
#ifndef SPARK_CLI_TERM_H
#define SPARK_CLI_TERM_H

#include "cli/gen_opts.h"

/* Install the SIGINT handler (idempotent). */
void term_install_sigint(void);

/* Non-zero after Ctrl-C; term_clear_interrupt() re-arms the first press. */
int term_interrupted(void);
void term_clear_interrupt(void);

/* Generate from ids (appended to the session) and print. result may be
 * NULL. Returns 0, or an exit status after printing the error. */
int term_generate(gen_env *env, const gen_opts *o, const int32_t *ids, int32_t n, const char *command,
                  spark_generate_result *result);

#endif
