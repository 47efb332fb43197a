/*
 * commands.h — one function per `spark` sub-command, each in its own
 * cmd_*.c file. A command gets argv starting at its own name and returns the
 * process exit status: 0 success, 1 runtime failure (message printed),
 * 2 bad usage (one line naming the flag).
 */
#ifndef SPARK_CLI_COMMANDS_H
#define SPARK_CLI_COMMANDS_H

int cmd_inspect(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv); /* cmd_serve.c, server in src/server/ */
int cmd_steer_extract(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
/* ---- tokenizer commands (cmd_tokenize.c) ---- */
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
/* ---- performance commands ---- */
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

#endif
