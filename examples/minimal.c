/*
 * minimal.c — the smallest complete use of spark.h: load a checkpoint,
 * encode a prompt, generate greedily, print the text as it comes.
 *
 *   build/examples/minimal MODEL "PROMPT" [N_TOKENS]
 *
 * With the same model and prompt it prints exactly what
 * `spark run -m MODEL -p PROMPT -n N --temp 0` prints on stdout.
 */
#include <spark.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int print_piece(void *user, int32_t id, const char *text, size_t len)
{
    (void)user;
    (void)id;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* keep going */
}

static int fail(const char *what)
{
    fprintf(stderr, "minimal: %s: %s\n", what, spark_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: minimal MODEL PROMPT [N_TOKENS]\n");
        return 2;
    }
    int n_tokens = argc > 3 ? atoi(argv[3]) : 32;

    spark_model *model;
    spark_tokenizer *tok;
    spark_session *session;
    spark_sampler *sampler;
    if (spark_model_load(argv[1], &model) != SPARK_OK) return fail("load model");
    if (spark_tokenizer_load(argv[1], &tok) != SPARK_OK) return fail("load tokenizer");
    if (spark_session_create(model, NULL, &session) != SPARK_OK) return fail("create session");

    spark_sampler_params sp = spark_model_sampler_defaults(model);
    sp.temperature = 0; /* greedy */
    if (spark_sampler_create(&sp, spark_model_get_config(model)->n_vocab, &sampler) != SPARK_OK)
        return fail("create sampler");

    spark_token_buf prompt = {0};
    if (spark_tokenizer_encode(tok, argv[2], strlen(argv[2]), SPARK_ENCODE_PARSE_SPECIAL, &prompt) != SPARK_OK)
        return fail("encode");

    spark_generate_params gp = {.max_tokens = n_tokens, .on_token = print_piece};
    spark_generate_result result;
    if (spark_generate(session, tok, sampler, prompt.ids, (int32_t)prompt.n, &gp, &result) != SPARK_OK)
        return fail("generate");
    fprintf(stderr, "\n%d prompt tokens, %d generated\n", result.n_prompt, result.n_generated);

    spark_token_buf_free(&prompt);
    spark_sampler_free(sampler);
    spark_session_free(session);
    spark_tokenizer_free(tok);
    spark_model_free(model);
    return 0;
}
