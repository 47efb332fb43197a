/*
 * term.c — printing a generation as it happens (see term.h).
 */
#include "cli/term.h"

#include "cli/cli_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t interrupts;
static volatile int cancel_flag;

static void on_sigint(int sig)
{
    (void)sig;
    if (++interrupts >= 2) _exit(130);
    cancel_flag = 1;
}

void term_install_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    /* a parent may hand us SIGINT blocked (test harnesses do): unblock it */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

int term_interrupted(void) { return cancel_flag; }

void term_clear_interrupt(void)
{
    interrupts = 0;
    cancel_flag = 0;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A bar with the rate so far and the time left. Attention makes later
 * chunks of a long prompt slower (each sees more keys), so the ETA
 * extrapolates the rate of the chunks so far: an underestimate that
 * corrects itself as the prompt proceeds. */
static void show_progress(void *user, int32_t done, int32_t total)
{
    (void)user;
    static double start;        /* when the first chunk of this prompt finished */
    static int32_t first, last; /* tokens done then, and at the previous call */
    if (done <= last) last = 0; /* a new prompt */
    if (!last) {
        start = now_seconds();
        first = done;
    }
    last = done;
    double elapsed = now_seconds() - start;
    int width = 30, filled = (int)((int64_t)width * done / total);
    fprintf(stderr, "\r\033[2Kprompt [");
    for (int i = 0; i < width; i++) fputc(i < filled ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d", done, total);
    if (elapsed > 0 && done > first && done < total) {
        double rate = (done - first) / elapsed, left = (total - done) / rate;
        fprintf(stderr, "  %.0f tok/s, ETA %d:%02d", rate, (int)(left / 60), (int)left % 60);
    }
    if (done == total) {
        fprintf(stderr, "\r\033[2K");
        last = 0;
    }
    fflush(stderr);
}

typedef struct printer {
    spark_chat_parser *parser; /* chat mode: splits reasoning / answer / tool calls */
    int show_think, color, in_dim;
} printer;

static void print_event(printer *pr, const spark_chat_event *e)
{
    if (e->kind == SPARK_CHAT_EVENT_REASONING) {
        if (!pr->show_think) return;
        if (pr->color && !pr->in_dim) fputs("\033[2m", stdout);
        pr->in_dim = 1;
        fwrite(e->text, 1, e->len, stdout);
        return;
    }
    if (pr->in_dim) {
        if (pr->color) fputs("\033[0m", stdout);
        fputs(pr->color ? "" : "\n", stdout);
        pr->in_dim = 0;
    }
    if (e->kind == SPARK_CHAT_EVENT_CONTENT) fwrite(e->text, 1, e->len, stdout);
    if (e->kind == SPARK_CHAT_EVENT_TOOL_CALL) printf("\n[tool call] %s %s\n", e->name, e->arguments_json);
}

static void drain(printer *pr)
{
    for (spark_chat_event e; (e = spark_chat_parser_next(pr->parser)).kind != SPARK_CHAT_EVENT_NONE;)
        print_event(pr, &e);
}

static int on_token(void *user, int32_t id, const char *text, size_t len)
{
    printer *pr = user;
    (void)id;
    if (!len) return 0;
    if (!pr->parser) {
        fwrite(text, 1, len, stdout);
    } else {
        spark_chat_parser_feed(pr->parser, text, len);
        drain(pr);
    }
    fflush(stdout);
    return 0;
}

static void print_speeds(const spark_generate_result *r)
{
    double pp = r->prompt_seconds > 0 ? r->n_prompt / r->prompt_seconds : 0;
    double tg = r->generate_seconds > 0 ? r->n_generated / r->generate_seconds : 0;
    fprintf(stderr, "\nprompt: %d tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s%s\n", r->n_prompt, pp,
            r->n_generated, tg, r->finish == SPARK_FINISH_CANCELLED ? " (stopped)" : "");
}

int term_generate(gen_env *env, const gen_opts *o, const int32_t *ids, int32_t n, const char *command,
                  spark_generate_result *result)
{
    term_install_sigint();
    printer pr = {.show_think = o->show_think, .color = isatty(STDOUT_FILENO)};
    if (o->chat && spark_chat_parser_create(!o->no_think, NULL, &pr.parser) != SPARK_OK)
        return cli_report_error(command);
    if (isatty(STDERR_FILENO) && n > 256) spark_session_set_progress(env->session, show_progress, NULL);
    spark_generate_params gp = {.max_tokens = o->n_predict < 0 ? 0 : (int32_t)o->n_predict,
                                .stop = o->stop,
                                .n_stop = o->n_stop,
                                .ignore_eos = o->ignore_eos,
                                .on_token = on_token,
                                .user = &pr,
                                .cancel = &cancel_flag};
    spark_generate_result r;
    spark_status st = spark_generate(env->session, env->tok, env->sampler, ids, n, &gp, &r);
    spark_session_set_progress(env->session, NULL, NULL);
    if (pr.parser) {
        spark_chat_parser_finish(pr.parser);
        drain(&pr);
        if (pr.in_dim && pr.color) fputs("\033[0m", stdout);
        spark_chat_parser_free(pr.parser);
    }
    fflush(stdout);
    if (result) *result = r;
    if (st != SPARK_OK) return cli_report_error(command);
    print_speeds(&r);
    return 0;
}
