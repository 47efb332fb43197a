/*
 * pretokenize.c — the pre-tokenizer: a sequence of regex "isolate" splits.
 *
 * HF's Sequence of Split(behavior = Isolated) steps works piecewise: step k
 * runs its regex over each piece step k-1 produced, on its own (so a
 * lookahead such as `\s+(?!\S)` sees the end of the piece, not the next
 * character of the text), and every match and every gap between matches
 * becomes a piece. Digits(individual_digits) is the same with `\p{N}`. We
 * mirror that exactly, depth first, so no piece list is ever materialised:
 * step k hands each sub-piece straight to step k+1 and the last step hands
 * it to the BPE callback.
 *
 * Regexes run on PCRE2 with UTF + UCP (Unicode classes for \p{..} and \s)
 * and its JIT. The input is valid UTF-8 by construction (encode.c repairs
 * it), so matching skips PCRE2's UTF check.
 *
 * The reference (HF tokenizers, Oniguruma) knows a newer Unicode than the
 * system PCRE2 (16 vs 14 on Debian 12): characters assigned since then
 * (new emoji, CJK extensions) would be "unassigned" to PCRE2 and split
 * differently. Each \p{X} of a pattern is therefore widened with the ranges
 * in unicode_extra.h (generated from the reference engine).
 */
#include "tokenizer/tokenizer.h"

#include "base/error.h"
#include "tokenizer/unicode_extra.h"

#include <stdlib.h>
#include <string.h>

/* SPEC §5, in order. Step 4 (every digit on its own) is HF's Digits. */
static const char *const spark_steps[] = {
    "\\p{N}{1,3}",
    "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+"
    "|[\\r\\n]"
    "|\\s+(?!\\S)"
    "|\\s+",
    "\\p{N}",
};

/* Index of X in "LMNPS" for the text "\\p{X}" at s, or -1. */
static int extra_class(const char *s, size_t left)
{
    static const char classes[] = "LMNPS";
    if (left < 5 || s[0] != '\\' || s[1] != 'p' || s[2] != '{' || s[4] != '}' || !s[3]) return -1;
    const char *c = strchr(classes, s[3]);
    return c ? (int)(c - classes) : -1;
}

/* pattern with every \p{X} (X in L M N P S) widened by unicode_extra[X]:
 * "\p{L}" becomes "[\p{L}<ranges>]" outside a class and "\p{L}<ranges>"
 * inside one. Returns a malloc'ed string (NULL when out of memory). */
static char *widen_classes(const char *pat, size_t len, size_t *out_len)
{
    size_t cap = len + 1;
    for (size_t i = 0; i + 4 < len; i++)
        if (extra_class(pat + i, len - i) >= 0) cap += strlen(unicode_extra[extra_class(pat + i, len - i)]) + 2;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; i < len;) {
        int x = extra_class(pat + i, len - i);
        if (x >= 0) {
            o += (size_t)sprintf(out + o, in_class ? "\\p{%c}%s" : "[\\p{%c}%s]", pat[i + 3], unicode_extra[x]);
            i += 5;
        } else if (pat[i] == '\\' && i + 1 < len) {
            out[o++] = pat[i++];
            out[o++] = pat[i++];
        } else {
            if (!in_class && pat[i] == '[') {
                in_class = true;
                out[o++] = pat[i++];
                if (i < len && pat[i] == '^') out[o++] = pat[i++];
                if (i < len && pat[i] == ']') out[o++] = pat[i++]; /* a literal ] first */
                continue;
            }
            if (in_class && pat[i] == ']') in_class = false;
            out[o++] = pat[i++];
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

spark_status pretok_add_regex(pretok *p, const char *pattern, size_t len, const char *what)
{
    if (p->n_steps == PRETOK_MAX_STEPS)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer steps", what,
                          PRETOK_MAX_STEPS);
    int err;
    PCRE2_SIZE off;
    size_t wide_len;
    char *wide = widen_classes(pattern, len, &wide_len);
    if (!wide) return spark_fail(SPARK_ERR_NOMEM, "out of memory compiling a regex");
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)wide, wide_len, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    free(wide);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: pre-tokenizer regex /%.*s/ at offset %zu: %s",
                          what, (int)len, pattern, (size_t)off, (const char *)msg);
    }
    /* No JIT (some platforms lack it) only costs speed; matching still works. */
    p->jit[p->n_steps] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    p->step[p->n_steps++] = re;
    return SPARK_OK;
}

spark_status pretok_init_spark(pretok *p)
{
    for (size_t i = 0; i < sizeof spark_steps / sizeof spark_steps[0]; i++)
        TRY(pretok_add_regex(p, spark_steps[i], strlen(spark_steps[i]), "spark2_5 pre-tokenizer"));
    return SPARK_OK;
}

void pretok_free(pretok *p)
{
    for (int i = 0; i < p->n_steps; i++) pcre2_code_free(p->step[i]);
    p->n_steps = 0;
}

spark_status pretok_scratch_init(pretok_scratch *s)
{
    memset(s, 0, sizeof *s);
    s->md = pcre2_match_data_create(4, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    /* A long whitespace or letter run needs more than the 32 KiB default. */
    s->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->md || !s->mctx || !s->jit_stack) {
        pretok_scratch_free(s);
        return spark_fail(SPARK_ERR_NOMEM, "out of memory for regex match data");
    }
    pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
    return SPARK_OK;
}

void pretok_scratch_free(pretok_scratch *s)
{
    if (s->md) pcre2_match_data_free(s->md);
    if (s->mctx) pcre2_match_context_free(s->mctx);
    if (s->jit_stack) pcre2_jit_stack_free(s->jit_stack);
    memset(s, 0, sizeof *s);
}

typedef struct split_run {
    const pretok *p;
    pretok_scratch *scr;
    pretok_piece_fn fn;
    void *ctx;
} split_run;

static spark_status split_step(split_run *r, int k, const char *s, size_t len);

/* Pass a piece to the next step, or to the callback after the last one. */
static spark_status emit(split_run *r, int k, const char *s, size_t len)
{
    if (len == 0) return SPARK_OK;
    if (k + 1 < r->p->n_steps) return split_step(r, k + 1, s, len);
    int rc = r->fn(r->ctx, s, len);
    return rc ? (spark_status)rc : SPARK_OK;
}

static size_t utf8_char_len(uint8_t b)
{
    return b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
}

static spark_status split_step(split_run *r, int k, const char *s, size_t len)
{
    const pcre2_code *re = r->p->step[k];
    size_t pos = 0, gap = 0;
    while (pos <= len) {
        int rc = r->p->jit[k]
                     ? pcre2_jit_match(re, (PCRE2_SPTR)s, len, pos, 0, r->scr->md, r->scr->mctx)
                     : pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, r->scr->md,
                                   r->scr->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return spark_fail(SPARK_ERR_INTERNAL, "pre-tokenizer regex failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->scr->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: HF drops it; step over one character */
            if (ms >= len) break;
            pos = ms + utf8_char_len((uint8_t)s[ms]);
            continue;
        }
        TRY(emit(r, k, s + gap, ms - gap));
        TRY(emit(r, k, s + ms, me - ms));
        gap = pos = me;
    }
    return emit(r, k, s + gap, len - gap);
}

spark_status pretok_split(const pretok *p, pretok_scratch *scr, const char *s, size_t len,
                          pretok_piece_fn fn, void *ctx)
{
    split_run r = {p, scr, fn, ctx};
    if (p->n_steps == 0) {
        int rc = len ? fn(ctx, s, len) : 0;
        return rc ? (spark_status)rc : SPARK_OK;
    }
    return split_step(&r, 0, s, len);
}
