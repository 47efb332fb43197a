/*
 * cmd_quantize.c — `spark quantize IN OUT --type T [--recipe q4_k_m]`: write
 * a checkpoint's matrices in another format as a GGUF v3 file
 * (model/quantize_file.c does the work).
 */
#include "cli/cli_util.h"
#include "cli/commands.h"

#include "model/quantize.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char quantize_usage[] =
    "usage: spark quantize IN OUT --type TYPE [--recipe q4_k_m] [options]\n"
    "\n"
    "Converts a checkpoint (Hugging Face directory or GGUF file) to a GGUF v3 file whose\n"
    "matrices are stored as TYPE; norms stay F32 and all metadata (tokenizer included) is kept.\n"
    "\n"
    "  --type TYPE       f32, f16, bf16, q8_0, q4_0, q4_k or q6_k\n"
    "  --recipe q4_k_m   llama.cpp's Q4_K_M mix: Q6_K for the embedding and for attn_qkv and\n"
    "                    ffn_down in the first/last eighth of the layers and every third one\n"
    "                    between, Q4_K elsewhere (implies --type q4_k)\n"
    "  -t, --threads N   threads (default: all cores)\n"
    "  -q, --quiet       no per-tensor lines\n";

static int parse_type(const char *s, spark_dtype *out)
{
    static const struct {
        const char *name;
        spark_dtype dtype;
    } types[] = {{"f32", SPARK_DTYPE_F32},   {"f16", SPARK_DTYPE_F16},   {"bf16", SPARK_DTYPE_BF16},
                 {"q8_0", SPARK_DTYPE_Q8_0}, {"q4_0", SPARK_DTYPE_Q4_0}, {"q4_k", SPARK_DTYPE_Q4_K},
                 {"q6_k", SPARK_DTYPE_Q6_K}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcasecmp(s, types[i].name)) {
            *out = types[i].dtype;
            return 1;
        }
    return 0;
}

typedef struct quantize_args {
    const char *in, *out, *type, *recipe;
    long threads;
    int quiet;
} quantize_args;

static int parse_quantize_args(int argc, char **argv, quantize_args *a)
{
    static const char cmd[] = "quantize";
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fputs(quantize_usage, stdout);
            exit(0);
        } else if (!strcmp(arg, "--type")) {
            if (!(a->type = cli_flag_value(argc, argv, &i, cmd))) return 0;
        } else if (!strcmp(arg, "--recipe")) {
            if (!(a->recipe = cli_flag_value(argc, argv, &i, cmd))) return 0;
        } else if (!strcmp(arg, "-q") || !strcmp(arg, "--quiet")) {
            a->quiet = 1;
        } else if (!strcmp(arg, "-t") || !strcmp(arg, "--threads")) {
            if (!(v = cli_flag_value(argc, argv, &i, cmd)) || !cli_parse_int(cmd, arg, v, 1, 4096, &a->threads))
                return 0;
        } else if (arg[0] == '-') {
            fprintf(stderr, "spark quantize: unknown option '%s' (spark quantize --help)\n", arg);
            return 0;
        } else if (!a->in) {
            a->in = arg;
        } else if (!a->out) {
            a->out = arg;
        } else {
            fprintf(stderr, "spark quantize: unexpected argument '%s'\n", arg);
            return 0;
        }
    }
    if (!a->in || !a->out || (!a->type && !a->recipe)) {
        fprintf(stderr, "spark quantize: IN, OUT and --type (or --recipe) are required (spark quantize --help)\n");
        return 0;
    }
    return 1;
}

/* Options from the arguments; 0 (after a message) when they do not make sense. */
static int make_options(const quantize_args *a, quantize_options *o)
{
    *o = (quantize_options){.type = SPARK_DTYPE_Q4_K, .n_threads = (int)a->threads, .verbose = !a->quiet};
    if (a->type && !parse_type(a->type, &o->type)) {
        fprintf(stderr, "spark quantize: --type expects f32, f16, bf16, q8_0, q4_0, q4_k or q6_k, got '%s'\n", a->type);
        return 0;
    }
    if (a->recipe) {
        if (strcasecmp(a->recipe, "q4_k_m")) {
            fprintf(stderr, "spark quantize: --recipe expects q4_k_m, got '%s'\n", a->recipe);
            return 0;
        }
        if (a->type && o->type != SPARK_DTYPE_Q4_K) {
            fprintf(stderr, "spark quantize: --recipe q4_k_m goes with --type q4_k, not %s\n", a->type);
            return 0;
        }
        o->recipe = QUANT_RECIPE_Q4_K_M;
        o->type = SPARK_DTYPE_Q4_K;
    }
    return 1;
}

/* Writing over the input would truncate the file we are reading. */
static int same_file(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

int cmd_quantize(int argc, char **argv)
{
    quantize_args a = {0};
    quantize_options o;
    if (!parse_quantize_args(argc, argv, &a) || !make_options(&a, &o)) return EXIT_USAGE;
    if (same_file(a.in, a.out)) {
        fprintf(stderr, "spark quantize: OUT is the input file; choose another path\n");
        return EXIT_USAGE;
    }
    quantize_report r;
    if (quantize_model_file(a.in, a.out, &o, &r) != SPARK_OK) return cli_report_error("quantize");
    fprintf(stderr, "spark quantize: %s -> %s: %lld tensors, %.2f MiB -> %.2f MiB (", a.in, a.out,
            (long long)r.n_tensors, (double)r.bytes_in / (1 << 20), (double)r.bytes_out / (1 << 20));
    const char *sep = "";
    for (int d = 0; d < SPARK_DTYPE_COUNT; d++)
        if (r.count[d]) {
            fprintf(stderr, "%s%lld %s", sep, (long long)r.count[d], dtype_name((spark_dtype)d));
            sep = ", ";
        }
    fprintf(stderr, ")\n");
    if (r.n_fallback)
        fprintf(stderr, "spark quantize: %lld matrices have rows that do not fill the type's blocks; kept as Q8_0/F16\n",
                (long long)r.n_fallback);
    return 0;
}
