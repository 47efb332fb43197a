/*
 * run.c — one job on one session.
 *
 * Prompt-prefix reuse: the session remembers the ids in its cache. The job
 * keeps the longest common prefix (rewinding the session to it) and
 * evaluates only the rest; at least one prompt token is always evaluated
 * because generation samples from the last prompt position's logits. The
 * reused ids are fed to the sampler's penalty history as well, so a request
 * samples the same way whether or not its prefix was cached.
 */
#include "server/server.h"

#include <stdio.h>

/* Rewind the session to the longest prefix it shares with the prompt,
 * leaving at least one token to evaluate. Returns the tokens kept. */
static int32_t reuse_prefix(spark_session *session, const spark_token_buf *prompt)
{
    int32_t have = spark_session_pos(session), n = (int32_t)prompt->n;
    const int32_t *ids = spark_session_tokens(session);
    int32_t k = 0;
    while (k < have && k < n - 1 && ids[k] == prompt->ids[k]) k++;
    if (k == have) return k;
    if (k == 0 || spark_session_rewind(session, k) != SPARK_OK) {
        spark_session_reset(session);
        return 0;
    }
    return k;
}

/* One line per generation on stderr: the server's access log. */
static void log_job(const job *j)
{
    static const char *const reasons[SPARK_FINISH_REASON_COUNT] = {"length", "eos", "stop", "context",
                                                                   "cancelled (client gone)"};
    const spark_generate_result *g = &j->result;
    double tps = g->generate_seconds > 0 ? g->n_generated / g->generate_seconds : 0;
    fprintf(stderr, "spark serve: %s %s: prompt %zu (%d cached) + %d tokens, %.1f tok/s, %s, %.2f s\n", j->id,
            j->stream ? "stream" : "json", j->prompt.n, (int)j->n_cached, (int)g->n_generated, tps,
            g->finish < SPARK_FINISH_REASON_COUNT ? reasons[g->finish] : "?", mono_now() - j->t_submit);
}

void run_job(server *srv, spark_session *session, job *j)
{
    if (j->cancel) {
        metrics_cancelled(srv->metrics);
        job_finish(j, 499, "the client closed the connection");
        fprintf(stderr, "spark serve: %s: cancelled before it started (client gone)\n", j->id);
        return;
    }
    j->n_cached = reuse_prefix(session, &j->prompt);
    for (int32_t i = 0; i < j->n_cached; i++) spark_sampler_accept(j->sampler, j->prompt.ids[i]);
    if (output_begin(j) != 0) {
        output_fail(j, 500, "out of memory starting the reply");
        return;
    }
    spark_generate_params gp = {.max_tokens = j->max_tokens,
                                .stop = (const char *const *)j->stop,
                                .n_stop = j->n_stop,
                                .stop_ids = j->stop_ids,
                                .n_stop_ids = j->n_stop_ids,
                                .on_token = output_token,
                                .user = j,
                                .cancel = &j->cancel};
    const int32_t *rest = j->prompt.ids + j->n_cached;
    int32_t n_rest = (int32_t)j->prompt.n - j->n_cached;
    spark_status st = srv->script
                          ? script_generate(srv->script, session, srv->tok, rest, n_rest, &gp, &j->result)
                          : spark_generate(session, srv->tok, j->sampler, rest, n_rest, &gp, &j->result);
    if (st != SPARK_OK) {
        fprintf(stderr, "spark serve: %s: %s\n", j->id, spark_last_error());
        spark_session_reset(session); /* its state after a failure is not worth trusting */
    }
    if (j->result.finish == SPARK_FINISH_CANCELLED) metrics_cancelled(srv->metrics);
    metrics_generation(srv->metrics, j);
    output_end(j, st);
    log_job(j);
}
