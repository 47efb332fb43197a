/*
 * cmd_chat.c — `spark chat`: an interactive multi-turn conversation that
 * keeps the KV cache between turns.
 *
 * Each turn appends only its own tokens (the user turn and the assistant
 * opener) to the session: earlier turns are never re-evaluated. The cache
 * therefore holds the model's earlier reasoning as it was generated, where
 * the chat template would drop it; /reset, /system, /load and the overflow
 * policy rebuild the cache from the canonical rendering.
 *
 * Overflow policy: when the next turn (plus room for the reply, -n or 256
 * tokens) would not fit in the context, the oldest user/assistant exchanges
 * are dropped (the system message stays), a notice is printed, and the
 * remaining conversation is re-evaluated.
 */
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/gen_opts.h"
#include "cli/term.h"

#include "base/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char chat_usage[] =
    "usage: spark chat [-m MODEL] [options]\n"
    "\n"
    "An interactive conversation in the Spark chat format. Type a message and press\n"
    "Enter (end a line with \\ to continue it on the next). Commands:\n"
    "  /reset           forget the conversation\n"
    "  /system TEXT     set the system message (and restart the conversation's cache)\n"
    "  /save FILE       write the conversation as JSON (OpenAI messages)\n"
    "  /load FILE       read a conversation written by /save\n"
    "  /help            this list;  /exit or Ctrl-D quits\n"
    "Ctrl-C stops a reply; a second Ctrl-C exits.\n"
    "\n";

typedef struct turn {
    spark_chat_role role;
    char *content;
} turn;

typedef struct chat_state {
    gen_env env;
    gen_opts opts;
    turn *turns;
    int n_turns, cap;
    char *system;
    int cache_open;   /* the session ends inside an assistant turn: close it with EOS */
    int interactive;
} chat_state;

static void notice(const chat_state *c, const char *fmt, const char *arg)
{
    fprintf(stderr, c->interactive ? "\033[33m" : "");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, c->interactive ? "\033[0m\n" : "\n");
}

static int add_turn(chat_state *c, spark_chat_role role, const char *content)
{
    if (c->n_turns == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        turn *grown = realloc(c->turns, (size_t)cap * sizeof *grown);
        if (!grown) return 0;
        c->turns = grown;
        c->cap = cap;
    }
    c->turns[c->n_turns++] = (turn){role, strdup(content ? content : "")};
    return 1;
}

static void clear_turns(chat_state *c)
{
    for (int i = 0; i < c->n_turns; i++) free(c->turns[i].content);
    c->n_turns = 0;
}

/* Render turns [0, n) (+ the system message) to ids. */
static spark_status render(const chat_state *c, int n, int gen_prompt, spark_token_buf *ids)
{
    spark_chat_message *msgs = calloc((size_t)n + 1, sizeof *msgs);
    if (!msgs) return SPARK_ERR_NOMEM;
    int m = 0;
    if (c->system) msgs[m++] = (spark_chat_message){.role = SPARK_CHAT_SYSTEM, .content = c->system};
    for (int i = 0; i < n; i++) msgs[m++] = (spark_chat_message){.role = c->turns[i].role, .content = c->turns[i].content};
    spark_chat chat = spark_chat_default();
    chat.messages = msgs;
    chat.n_messages = m;
    chat.enable_thinking = !c->opts.no_think;
    chat.add_generation_prompt = gen_prompt;
    spark_status st = spark_chat_render(c->env.tok, &chat, NULL, NULL, ids);
    free(msgs);
    return st;
}

static spark_status push_ids(spark_token_buf *b, const int32_t *ids, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2;
        int32_t *grown = realloc(b->ids, cap * sizeof *grown);
        if (!grown) return SPARK_ERR_NOMEM;
        b->ids = grown;
        b->cap = cap;
    }
    memcpy(b->ids + b->n, ids, n * sizeof *ids);
    b->n += n;
    return SPARK_OK;
}

/* Ids that take the cache from "turns [0, n_turns-1) rendered" to "all
 * turns + the assistant opener": the new turn's tokens, led by the EOS that
 * closes the previous reply when the cache still lacks it. */
static spark_status new_turn_ids(chat_state *c, spark_token_buf *delta)
{
    spark_token_buf before = {0}, after = {0};
    int32_t eos = spark_model_get_config(c->env.model)->eos_id;
    delta->n = 0;
    spark_status st = render(c, c->n_turns - 1, 0, &before);
    if (st == SPARK_OK) st = render(c, c->n_turns, 1, &after);
    if (st == SPARK_OK && (after.n < before.n || memcmp(after.ids, before.ids, before.n * sizeof(int32_t))))
        st = spark_fail(SPARK_ERR_INTERNAL, "the chat rendering of a longer conversation is not an extension");
    if (st == SPARK_OK && c->cache_open) st = push_ids(delta, &eos, 1);
    if (st == SPARK_OK) st = push_ids(delta, after.ids + before.n, after.n - before.n);
    spark_token_buf_free(&before);
    spark_token_buf_free(&after);
    return st;
}

/* Rebuild the cache from the canonical rendering of every turn but the
 * last, which is left out so the caller appends it as a delta. */
static spark_status reprefill(chat_state *c)
{
    spark_session_reset(c->env.session);
    c->cache_open = 0;
    spark_token_buf ids = {0};
    spark_status st = render(c, c->n_turns > 0 ? c->n_turns - 1 : 0, 0, &ids);
    if (st == SPARK_OK && ids.n) st = spark_session_eval(c->env.session, ids.ids, (int32_t)ids.n, NULL, 0);
    spark_token_buf_free(&ids);
    return st;
}

/* Overflow policy: drop the oldest messages (never the system message or
 * the new one) until the conversation and a reply fit, then re-read it.
 * Returns 0 when even the new message alone does not fit. */
static int make_room(chat_state *c, spark_token_buf *delta)
{
    int32_t n_ctx = spark_session_n_ctx(c->env.session);
    size_t reserve = c->opts.n_predict > 0 ? (size_t)c->opts.n_predict : 256;
    if (reserve >= (size_t)n_ctx) reserve = (size_t)n_ctx / 2;
    if (spark_session_pos(c->env.session) + delta->n + reserve <= (size_t)n_ctx) return 1;
    int dropped = 0;
    for (;;) {
        spark_token_buf ids = {0};
        spark_status st = render(c, c->n_turns, 1, &ids);
        size_t need = ids.n;
        spark_token_buf_free(&ids);
        if (st != SPARK_OK) return 0;
        if (need + reserve <= (size_t)n_ctx) break;
        if (c->n_turns <= 1) {
            fprintf(stderr, "spark chat: the message needs %zu tokens, more than the context of %d leaves room for "
                            "(%zu kept for the reply); not sent\n", need, n_ctx, reserve);
            return 0;
        }
        free(c->turns[0].content);
        memmove(c->turns, c->turns + 1, (size_t)(c->n_turns - 1) * sizeof *c->turns);
        c->n_turns--;
        dropped++;
    }
    char count[32];
    snprintf(count, sizeof count, "%d", dropped);
    notice(c, "[context full: dropped the %s oldest message(s) and re-read the rest]", count);
    return reprefill(c) == SPARK_OK && new_turn_ids(c, delta) == SPARK_OK;
}

/* The answer text of the reply just generated (reasoning and tool-call
 * markup removed), read back from the session's tokens. */
static char *reply_content(chat_state *c, int32_t from)
{
    int32_t to = spark_session_pos(c->env.session);
    char *text = NULL, *out = NULL;
    size_t len = 0, out_len = 0;
    if (spark_tokenizer_decode(c->env.tok, spark_session_tokens(c->env.session) + from, (size_t)(to - from), 0, &text,
                               &len) != SPARK_OK)
        return strdup("");
    spark_chat_parser *p;
    if (spark_chat_parser_create(!c->opts.no_think, NULL, &p) == SPARK_OK) {
        spark_chat_parser_feed(p, text, len);
        spark_chat_parser_finish(p);
        for (spark_chat_event e; (e = spark_chat_parser_next(p)).kind != SPARK_CHAT_EVENT_NONE;) {
            if (e.kind != SPARK_CHAT_EVENT_CONTENT) continue;
            char *grown = realloc(out, out_len + e.len + 1);
            if (!grown) break;
            out = grown;
            memcpy(out + out_len, e.text, e.len);
            out_len += e.len;
            out[out_len] = '\0';
        }
        spark_chat_parser_free(p);
    }
    free(text);
    return out ? out : strdup("");
}

static void user_turn(chat_state *c, const char *text)
{
    if (!add_turn(c, SPARK_CHAT_USER, text)) return;
    spark_token_buf delta = {0};
    spark_status st = new_turn_ids(c, &delta);
    if (st != SPARK_OK && reprefill(c) == SPARK_OK) st = new_turn_ids(c, &delta);
    if (st != SPARK_OK) cli_report_error("chat");
    if (st != SPARK_OK || !make_room(c, &delta)) {
        free(c->turns[--c->n_turns].content); /* the turn did not happen */
        spark_token_buf_free(&delta);
        return;
    }
    int32_t from = spark_session_pos(c->env.session) + (int32_t)delta.n;
    spark_generate_result r;
    int rc = term_generate(&c->env, &c->opts, delta.ids, (int32_t)delta.n, "chat", &r);
    spark_token_buf_free(&delta);
    term_clear_interrupt();
    if (rc != 0) {
        free(c->turns[--c->n_turns].content);
        reprefill(c);
        return;
    }
    if (r.finish == SPARK_FINISH_CONTEXT) notice(c, "%s", "[the reply filled the context]");
    char *content = reply_content(c, from);
    add_turn(c, SPARK_CHAT_ASSISTANT, content);
    free(content);
    c->cache_open = 1;
}

/* The cache holds every turn, canonically rendered (after /system, /load). */
static void reload_cache(chat_state *c)
{
    spark_session_reset(c->env.session);
    c->cache_open = 0;
    spark_token_buf ids = {0};
    if (render(c, c->n_turns, 0, &ids) != SPARK_OK ||
        (ids.n && spark_session_eval(c->env.session, ids.ids, (int32_t)ids.n, NULL, 0) != SPARK_OK))
        cli_report_error("chat");
    spark_token_buf_free(&ids);
}

static void save_conversation(chat_state *c, const char *path)
{
    cJSON *arr = cJSON_CreateArray();
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    if (c->system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", c->system);
        cJSON_AddItemToArray(arr, m);
    }
    for (int i = 0; i < c->n_turns; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", roles[c->turns[i].role]);
        cJSON_AddStringToObject(m, "content", c->turns[i].content);
        cJSON_AddItemToArray(arr, m);
    }
    char *text = cJSON_Print(arr);
    FILE *f = fopen(path, "w");
    if (!f || !text || fputs(text, f) < 0)
        fprintf(stderr, "spark chat: cannot write %s: %s\n", path, strerror(errno));
    else
        notice(c, "[saved to %s]", path);
    if (f) fclose(f);
    free(text);
    cJSON_Delete(arr);
}

static void load_conversation(chat_state *c, const char *path)
{
    FILE *f = fopen(path, "rb");
    size_t len;
    char *text = f ? cli_read_all(f, &len) : NULL;
    if (f) fclose(f);
    spark_chat_doc *doc = NULL;
    if (!text || spark_chat_doc_parse(text, len, &doc) != SPARK_OK) {
        fprintf(stderr, "spark chat: cannot load %s: %s\n", path, text ? spark_last_error() : strerror(errno));
        free(text);
        return;
    }
    spark_chat view = spark_chat_doc_view(doc);
    clear_turns(c);
    free(c->system);
    c->system = NULL;
    for (int i = 0; i < view.n_messages; i++) {
        const spark_chat_message *m = &view.messages[i];
        if (m->role == SPARK_CHAT_SYSTEM && !c->system)
            c->system = strdup(m->content ? m->content : "");
        else
            add_turn(c, m->role, m->content);
    }
    spark_chat_doc_free(doc);
    free(text);
    reload_cache(c);
    notice(c, "[loaded %s]", path);
}

/* Returns 0 to quit. */
static int command(chat_state *c, char *line)
{
    char *arg = strchr(line, ' ');
    if (arg) *arg++ = '\0';
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) return 0;
    if (!strcmp(line, "/help")) {
        fputs(chat_usage, stdout);
    } else if (!strcmp(line, "/reset")) {
        clear_turns(c);
        spark_session_reset(c->env.session);
        c->cache_open = 0;
        notice(c, "%s", "[conversation reset]");
    } else if (!strcmp(line, "/system")) {
        free(c->system);
        c->system = arg && *arg ? strdup(arg) : NULL;
        reload_cache(c);
        notice(c, "[system message %s]", c->system ? "set" : "cleared");
    } else if (!strcmp(line, "/save") && arg && *arg) {
        save_conversation(c, arg);
    } else if (!strcmp(line, "/load") && arg && *arg) {
        load_conversation(c, arg);
    } else {
        notice(c, "unknown command %s (/help lists them)", line);
    }
    return 1;
}

/* One message from stdin (lines ending in '\' continue). NULL at EOF. */
static char *read_message(chat_state *c, int *interrupted)
{
    char *msg = NULL;
    size_t len = 0;
    char line[8192];
    *interrupted = 0;
    if (c->interactive) fputs("\033[1m> \033[0m", stdout), fflush(stdout);
    for (;;) {
        errno = 0;
        if (!fgets(line, sizeof line, stdin)) {
            if (errno == EINTR || term_interrupted()) {
                clearerr(stdin);
                *interrupted = 1;
            }
            return msg;
        }
        size_t n = strlen(line);
        int more = n >= 2 && line[n - 2] == '\\' && line[n - 1] == '\n';
        if (more) line[n - 2] = '\n', line[n - 1] = '\0', n--;
        else if (n && line[n - 1] == '\n') line[--n] = '\0';
        char *grown = realloc(msg, len + n + 1);
        if (!grown) return msg;
        msg = grown;
        memcpy(msg + len, line, n + 1);
        len += n;
        if (!more) return msg;
    }
}

static int parse_chat_args(int argc, char **argv, gen_opts *o)
{
    gen_opts_init(o, -1);
    for (int i = 1; i < argc; i++) {
        int r = gen_opts_parse(o, argc, argv, &i, "chat");
        if (r < 0) return 0;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s%s", chat_usage, gen_opts_help);
            exit(0);
        }
        fprintf(stderr, "spark chat: unknown option '%s' (spark chat --help)\n", argv[i]);
        return 0;
    }
    o->chat = 1;
    return 1;
}

int cmd_chat(int argc, char **argv)
{
    chat_state c;
    memset(&c, 0, sizeof c);
    if (!parse_chat_args(argc, argv, &c.opts)) return EXIT_USAGE;
    int rc = gen_env_open(&c.env, &c.opts, "chat");
    if (rc) {
        gen_env_close(&c.env);
        return rc;
    }
    c.interactive = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    c.system = c.opts.system ? strdup(c.opts.system) : NULL;
    term_install_sigint();
    if (c.interactive) fprintf(stderr, "spark chat — /help for commands, Ctrl-D to quit\n");
    for (;;) {
        int interrupted;
        char *msg = read_message(&c, &interrupted);
        if (!msg && interrupted) {
            fputs("\n(Ctrl-C again or /exit to quit)\n", stderr);
            continue;
        }
        if (!msg) break;
        int go_on = 1;
        if (msg[0] == '/') go_on = command(&c, msg);
        else if (msg[0]) user_turn(&c, msg);
        free(msg);
        if (!go_on) break;
    }
    if (c.interactive) fputc('\n', stdout);
    clear_turns(&c);
    free(c.turns);
    free(c.system);
    gen_env_close(&c.env);
    return 0;
}
