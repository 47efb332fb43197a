/*
 * main.c — the `spark` command: dispatch to a sub-command.
 */
#include "cli/commands.h"

#include <stdio.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"run", cmd_run, "generate text from a prompt (the main command)"},
    {"chat", cmd_chat, "an interactive conversation that keeps its KV cache between turns"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server with a chat page"}, /* issue 9 */
    {"perplexity", cmd_perplexity, "teacher-forced perplexity of a text file"},
    {"steer-extract", cmd_steer_extract, "a steering direction from two prompt sets (difference of mean residuals)"},
    {"inspect", cmd_inspect, "print a checkpoint's architecture, tensors and memory needs"},
    {"logits", cmd_logits, "write the raw logits for a list of token ids to a .npy file"},
    /* ---- tokenizer commands ---- */
    {"tokenize", cmd_tokenize, "text to token ids (HF directory, tokenizer.json or GGUF)"},
    {"detokenize", cmd_detokenize, "token ids to text"},
    {"chat-template", cmd_chat_template, "render a conversation in the Spark chat format, with its ids"},
    /* ---- performance commands ---- */
    {"bench", cmd_bench, "prefill / decode throughput vs measured memory bandwidth and FMA peak"},
    {"quantize", cmd_quantize, "write a checkpoint as GGUF with q8_0 / q4_k / q6_k / q4_0 / bf16 / f16 / f32 matrices"},
};

static void print_usage(FILE *to)
{
    fprintf(to, "usage: spark COMMAND [options]   (spark COMMAND --help for its options)\n\n"
                "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(to, "  %-14s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "spark: unknown command '%s' (spark --help lists them)\n", argv[1]);
    return 2;
}
