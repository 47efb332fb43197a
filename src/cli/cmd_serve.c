/*
 * cmd_serve.c — `spark serve`: the OpenAI-compatible HTTP server (the
 * server itself lives in src/server/). This file reads the flags, starts the
 * server, and waits for SIGINT / SIGTERM to shut it down cleanly.
 *
 * Signals are blocked before any thread exists, so every thread inherits the
 * mask and the main thread alone takes them with sigwait(): no handler runs
 * in the middle of a worker, and shutdown is ordinary code.
 */
#include "cli/cli_util.h"
#include "cli/hook_opts.h"
#include "cli/commands.h"
#include "cli/gen_opts.h"

#include "server/server.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char serve_usage[] =
    "usage: spark serve [-m MODEL] [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions\n"
    "(streamed with \"stream\": true), GET /v1/models, /health, /metrics (Prometheus),\n"
    "and a chat page at /. Ctrl-C or SIGTERM stops it.\n"
    "\n"
    "  -m, --model PATH     HF directory or GGUF file (default: $SPARK_MODEL, else the\n"
    "                       embedded models/spark-tiny)\n"
    "  --host ADDR          address to listen on (default 127.0.0.1: this machine only)\n"
    "  --port N             TCP port (default 8080; 0 picks a free one, printed)\n"
    "  --api-key KEY        require 'Authorization: Bearer KEY' on /v1/* and /metrics\n"
    "                       (default: $SPARK_API_KEY when set, else no auth)\n"
    "  --parallel N         requests generated at once, each with its own KV cache (default 2)\n"
    "  -c, --ctx N          context per session (default: the model's maximum, at most 4096)\n"
    "  --queue N            requests that may wait for a session before 503 (default 64)\n"
    "  -t, --threads N      CPU threads per session (default: cores / parallel)\n"
    "  --max-body BYTES     request body limit, larger gets 413 (default 4194304)\n"
    "  --gpu                run the sessions on the GPU (CUDA; each session holds the weights)\n";

/* Steering for every session (--steer and its companions, as on spark run). */
static int setup_steering(void *user, spark_model *model, spark_session *session)
{
    return hook_opts_apply(user, model, session, -1, "serve");
}

static const char serve_steer_help[] =
    "  --steer FILE         steer every request: control-vector GGUF or .npy [layers, hidden]\n"
    "  --steer-mode MODE    add (default) | ablate | clamp | renorm\n"
    "  --steer-strength A   strength (default 1.0)\n"
    "  --steer-layers A-B   only layers A..B\n";

static int parse_serve_args(int argc, char **argv, srv_config *c, hook_opts *hooks)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("%s%s%s", serve_usage, cli_load_help, serve_steer_help);
            exit(0);
        }
        if (cli_load_flag(a, &c->load_mode)) continue;
        if (!strcmp(a, "--gpu")) {
            c->gpu = 1;
            continue;
        }
        if (!strncmp(a, "--steer", 7)) {
            if (hook_opts_parse(hooks, argc, argv, &i, "serve") < 0) return 0;
            continue;
        }
        static const char *const valued[] = {"-m", "--model", "--host", "--port", "--api-key", "--parallel", "-c",
                                             "--ctx", "--queue", "-t", "--threads", "--max-body", NULL};
        int k = 0;
        while (valued[k] && strcmp(a, valued[k])) k++;
        if (!valued[k]) {
            fprintf(stderr, "spark serve: unknown option '%s' (spark serve --help)\n", a);
            return 0;
        }
        if (!(v = cli_flag_value(argc, argv, &i, "serve"))) return 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) c->model_path = v;
        else if (!strcmp(a, "--host")) c->host = v;
        else if (!strcmp(a, "--api-key")) c->api_key = v;
        else if (!strcmp(a, "--port")) {
            if (!cli_parse_int("serve", a, v, 0, 65535, &n)) return 0;
            c->port = (int)n;
        } else if (!strcmp(a, "--parallel")) {
            if (!cli_parse_int("serve", a, v, 1, 256, &n)) return 0;
            c->parallel = (int)n;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            if (!cli_parse_int("serve", a, v, 2, 1 << 30, &n)) return 0;
            c->n_ctx = (int)n;
        } else if (!strcmp(a, "--queue")) {
            if (!cli_parse_int("serve", a, v, 0, 4096, &n)) return 0;
            c->queue = (int)n;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_parse_int("serve", a, v, 1, 4096, &n)) return 0;
            c->threads = (int)n;
        } else {
            if (!cli_parse_int("serve", a, v, 1024, 1L << 30, &n)) return 0;
            c->max_body = (size_t)n;
        }
    }
    if (c->api_key && !*c->api_key) {
        fprintf(stderr, "spark serve: --api-key must not be empty\n");
        return 0;
    }
    return 1;
}

int cmd_serve(int argc, char **argv)
{
    srv_config c = {.host = "127.0.0.1", .port = 8080, .parallel = 2, .queue = 64, .max_body = 4u << 20};
    const char *env_key = getenv("SPARK_API_KEY");
    if (env_key && *env_key) c.api_key = env_key;
    hook_opts hooks;
    hook_opts_init(&hooks);
    if (!parse_serve_args(argc, argv, &c, &hooks)) return EXIT_USAGE;
    if (hooks.n_steer) {
        c.setup_session = setup_steering;
        c.setup_user = &hooks;
    }
    if (!c.model_path) c.model_path = gen_default_model();
    /* test-only: replies replayed from a file (see src/server/script.c) */
    c.script = getenv("SPARK_SERVE_SCRIPT");
    if (c.script && !*c.script) c.script = NULL;

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN); /* a vanished client must not kill the server */

    server *srv;
    if (server_open(&c, &srv)) return EXIT_RUNTIME;
    const char *host = c.host;
    int bracket = strchr(host, ':') != NULL;
    fprintf(stderr, "spark serve: listening on http://%s%s%s:%d%s\n", bracket ? "[" : "", host, bracket ? "]" : "",
            server_port(srv), c.api_key ? " (API key required)" : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&stop, &sig);
    fprintf(stderr, "spark serve: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
    server_close(srv);
    return 0;
}
