/*
 * cmd_run.c — `spark run`: one prompt in, the completion streamed out, with
 * prompt-eval and generation speed on stderr.
 */
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/gen_opts.h"
#include "cli/hook_opts.h"
#include "cli/term.h"

#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char run_usage[] =
    "usage: spark run [-m MODEL] [-p PROMPT | -f FILE] [options]\n"
    "\n"
    "Generates a completion of PROMPT (or of FILE's text, or of standard input when\n"
    "neither is given and it is not a terminal) and prints it as it is generated.\n"
    "Speeds go to stderr. Ctrl-C stops generating; a second Ctrl-C exits.\n"
    "\n"
    "  -p, --prompt TEXT       the prompt (special-token text such as <|User|> is parsed)\n"
    "  -f, --file FILE         read the prompt from FILE (must be valid UTF-8)\n";

typedef struct run_args {
    gen_opts g;
    hook_opts hooks;
    const char *prompt, *file;
} run_args;

static int parse_run_args(int argc, char **argv, run_args *a)
{
    gen_opts_init(&a->g, 256);
    hook_opts_init(&a->hooks);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int r = gen_opts_parse(&a->g, argc, argv, &i, "run");
        if (r == 0) r = hook_opts_parse(&a->hooks, argc, argv, &i, "run");
        if (r < 0) return 0;
        if (r > 0) continue;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            printf("%s%s%s", run_usage, gen_opts_help, hook_opts_help);
            exit(0);
        } else if (!strcmp(arg, "-p") || !strcmp(arg, "--prompt")) {
            if (!(a->prompt = cli_flag_value(argc, argv, &i, "run"))) return 0;
        } else if (!strcmp(arg, "-f") || !strcmp(arg, "--file")) {
            if (!(a->file = cli_flag_value(argc, argv, &i, "run"))) return 0;
        } else {
            fprintf(stderr, "spark run: unknown option '%s' (spark run --help)\n", arg);
            return 0;
        }
    }
    if (a->prompt && a->file) {
        fprintf(stderr, "spark run: give -p or -f, not both\n");
        return 0;
    }
    return 1;
}

/* Offset of the first byte that does not start a valid UTF-8 sequence, or len. */
static size_t first_invalid_utf8(const char *text, size_t len)
{
    size_t at = 0;
    while (at < len) {
        size_t n = utf8_seq_len((const uint8_t *)text + at, len - at);
        if (n == 0) return at;
        at += n;
    }
    return len;
}

/* The prompt text, malloc'd; NULL after printing why not. */
static char *read_prompt(const run_args *a, size_t *len)
{
    char *text = NULL;
    const char *source = a->file ? a->file : "standard input";
    if (a->prompt) {
        text = strdup(a->prompt);
        *len = strlen(a->prompt);
        source = "-p";
    } else if (a->file || !isatty(STDIN_FILENO)) {
        FILE *f = a->file ? fopen(a->file, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "spark run: cannot open %s: %s\n", a->file, strerror(errno));
            return NULL;
        }
        text = cli_read_all(f, len);
        if (a->file) fclose(f);
    } else {
        fprintf(stderr, "spark run: no prompt: give -p TEXT, -f FILE or pipe text in (spark run --help)\n");
        return NULL;
    }
    if (!text) {
        fprintf(stderr, "spark run: cannot read %s\n", source);
        return NULL;
    }
    size_t at = first_invalid_utf8(text, *len);
    if (at < *len) {
        fprintf(stderr, "spark run: %s: invalid UTF-8 at byte %zu (the prompt must be UTF-8 text)\n", source, at);
        free(text);
        return NULL;
    }
    if (*len == 0) {
        fprintf(stderr, "spark run: the prompt from %s is empty\n", source);
        free(text);
        return NULL;
    }
    return text;
}

/* Prompt ids: raw text, or the Spark chat format around it. */
static spark_status encode_prompt(const gen_env *env, const run_args *a, const char *text, size_t len,
                                  spark_token_buf *ids)
{
    if (!a->g.chat) {
        uint32_t flags = SPARK_ENCODE_PARSE_SPECIAL;
        if (spark_tokenizer_get_specials(env->tok).add_bos) flags |= SPARK_ENCODE_ADD_BOS;
        return spark_tokenizer_encode(env->tok, text, len, flags, ids);
    }
    spark_chat_message msgs[2];
    int n = 0;
    if (a->g.system) msgs[n++] = (spark_chat_message){.role = SPARK_CHAT_SYSTEM, .content = a->g.system};
    msgs[n++] = (spark_chat_message){.role = SPARK_CHAT_USER, .content = text};
    spark_chat chat = spark_chat_default();
    chat.messages = msgs;
    chat.n_messages = n;
    chat.enable_thinking = !a->g.no_think;
    return spark_chat_render(env->tok, &chat, NULL, NULL, ids);
}

int cmd_run(int argc, char **argv)
{
    run_args a;
    memset(&a, 0, sizeof a);
    if (!parse_run_args(argc, argv, &a)) return EXIT_USAGE;
    size_t len;
    char *text = read_prompt(&a, &len);
    if (!text) return EXIT_RUNTIME;

    gen_env env;
    int rc = gen_env_open(&env, &a.g, "run");
    spark_token_buf ids = {0};
    if (rc == 0 && encode_prompt(&env, &a, text, len, &ids) != SPARK_OK) rc = cli_report_error("run");
    if (rc == 0 && ids.n == 0) {
        fprintf(stderr, "spark run: the prompt encodes to no tokens\n");
        rc = EXIT_RUNTIME;
    }
    if (rc == 0) rc = hook_opts_apply(&a.hooks, env.model, env.session, (int32_t)ids.n - 1, "run");
    if (rc == 0) rc = term_generate(&env, &a.g, ids.ids, (int32_t)ids.n, "run", NULL);
    if (rc == 0) rc = hook_opts_finish(&a.hooks, env.model, env.session, ids.ids, (int32_t)ids.n, "run");
    spark_token_buf_free(&ids);
    gen_env_close(&env);
    free(text);
    return rc;
}
