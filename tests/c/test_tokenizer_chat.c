/*
 * test_tokenizer_chat.c — the chat renderer's text (no tokenizer needed)
 * and the incremental output parser: reasoning / content / tool calls
 * recovered from synthetic model output fed whole, cut at every position,
 * and byte by byte; JSON values and schema strings; unfinished and
 * malformed calls.
 */
#include "check.h"

#include "spark.h"

#include <stdlib.h>
#include <string.h>

#define SOS "<｜start▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"

static void test_render_text_without_tokenizer(void)
{
    spark_tool_call calls[] = {{"get_weather", "{\"city\":\"Paris\",\"days\":3}"}};
    spark_chat_message msgs[] = {
        {SPARK_CHAT_SYSTEM, "Be brief.", NULL, NULL, 0},
        {SPARK_CHAT_USER, "Hi", NULL, NULL, 0},
        {SPARK_CHAT_ASSISTANT, "Hello.", "thinking...", NULL, 0},
        {SPARK_CHAT_USER, "Weather?", NULL, NULL, 0},
        {SPARK_CHAT_ASSISTANT, NULL, NULL, calls, 1},
        {SPARK_CHAT_TOOL, "21C", NULL, NULL, 0},
    };
    spark_chat c = spark_chat_default();
    c.messages = msgs;
    c.n_messages = 6;
    char *text;
    size_t len;
    CHECK(spark_chat_render(NULL, &c, &text, &len, NULL) == SPARK_OK);
    const char *want = SOS "<|System|>\nyou are a helpful assistant.\n\nBe brief." EOS
        SOS "<|User|>Hi" EOS SOS "<|Bot|></think>Hello." EOS SOS "<|User|>Weather?" EOS
        SOS "<|Bot|></think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>" EOS
        SOS "<|Tool|><tool_response>21C</tool_response>" EOS SOS "<|Bot|><think>";
    CHECK_MSG(!strcmp(text, want), "got %s", text);
    CHECK(len == strlen(want));
    free(text);
    c.enable_thinking = 0;
    c.n_messages = 0;
    CHECK(spark_chat_render(NULL, &c, &text, &len, NULL) == SPARK_OK);
    CHECK(!strcmp(text, SOS "<|System|>\nyou are a helpful assistant." EOS SOS "<|Bot|></think>"));
    free(text);
    /* Errors name the message. */
    spark_tool_call bad[] = {{"f", "[1,2]"}};
    spark_chat_message m2[] = {{SPARK_CHAT_ASSISTANT, "", NULL, bad, 1}};
    c.messages = m2, c.n_messages = 1;
    CHECK(spark_chat_render(NULL, &c, &text, &len, NULL) == SPARK_ERR_ARG);
    CHECK_ERROR_MENTIONS("message 0");
    c.tools_json = "{\"not\": \"an array\"}";
    c.n_messages = 0;
    CHECK(spark_chat_render(NULL, &c, &text, &len, NULL) == SPARK_ERR_ARG);
    spark_token_buf ids = {0};
    CHECK(spark_chat_render(NULL, &c, NULL, NULL, &ids) == SPARK_ERR_ARG); /* ids need a tokenizer */
}

/* What a parser run produced, accumulated. */
typedef struct parsed {
    char reasoning[1024], content[1024], calls[1024]; /* calls: "name args;" ... */
    int n_calls;
} parsed;

static void drain(spark_chat_parser *p, parsed *out)
{
    for (spark_chat_event e; (e = spark_chat_parser_next(p)).kind != SPARK_CHAT_EVENT_NONE;) {
        if (e.kind == SPARK_CHAT_EVENT_REASONING) strncat(out->reasoning, e.text, e.len);
        if (e.kind == SPARK_CHAT_EVENT_CONTENT) strncat(out->content, e.text, e.len);
        if (e.kind == SPARK_CHAT_EVENT_TOOL_CALL) {
            strcat(out->calls, e.name);
            strcat(out->calls, " ");
            strcat(out->calls, e.arguments_json);
            strcat(out->calls, ";");
            out->n_calls++;
        }
    }
}

/* Parse `s` fed in pieces at the cut points (cuts[0..n) ascending). */
static parsed parse_cut(const char *s, const size_t *cuts, int n, int in_reasoning, const char *tools)
{
    parsed out;
    memset(&out, 0, sizeof out);
    spark_chat_parser *p;
    if (spark_chat_parser_create(in_reasoning, tools, &p) != SPARK_OK) return out;
    size_t at = 0, len = strlen(s);
    for (int i = 0; i <= n; i++) {
        size_t end = i < n ? cuts[i] : len;
        spark_chat_parser_feed(p, s + at, end - at);
        drain(p, &out);
        at = end;
    }
    spark_chat_parser_finish(p);
    drain(p, &out);
    spark_chat_parser_free(p);
    return out;
}

static int same(const parsed *a, const parsed *b)
{
    return !strcmp(a->reasoning, b->reasoning) && !strcmp(a->content, b->content) && !strcmp(a->calls, b->calls);
}

static const char OUTPUT[] =
    "Let me check the weather </thin k>.</think>Sure: <b>tags</b> stay.<tool_call>get_weather"
    "<arg_key>city</arg_key><arg_value>São Paulo</arg_value><arg_key>days</arg_key><arg_value>3</arg_value>"
    "<arg_key>opts</arg_key><arg_value>{\"metric\": true}</arg_value></tool_call>\n<tool_call>now</tool_call>";

static void test_parser_whole_and_every_cut(void)
{
    parsed whole = parse_cut(OUTPUT, NULL, 0, 1, NULL);
    CHECK(!strcmp(whole.reasoning, "Let me check the weather </thin k>."));
    CHECK(!strcmp(whole.content, "Sure: <b>tags</b> stay.\n"));
    CHECK_MSG(!strcmp(whole.calls, "get_weather {\"city\":\"São Paulo\",\"days\":3,\"opts\":{\"metric\":true}};"
                                   "now {};"),
              "calls: %s", whole.calls);
    CHECK(whole.n_calls == 2);
    size_t len = strlen(OUTPUT);
    int bad = 0;
    for (size_t c = 1; c < len; c++) {
        parsed p = parse_cut(OUTPUT, &c, 1, 1, NULL);
        bad += !same(&p, &whole);
        size_t two[2] = {c / 2, c};
        p = parse_cut(OUTPUT, two, c / 2 < c ? 2 : 1, 1, NULL);
        bad += !same(&p, &whole);
    }
    CHECK_MSG(bad == 0, "%d cut positions parsed differently", bad);
    size_t *all = malloc(len * sizeof *all);
    for (size_t i = 0; i + 1 < len; i++) all[i] = i + 1;
    parsed bytewise = parse_cut(OUTPUT, all, (int)len - 1, 1, NULL);
    CHECK(same(&bytewise, &whole));
    free(all);
}

static void test_parser_values_and_schema(void)
{
    const char *out = "</think><tool_call>f<arg_key>n</arg_key><arg_value>42</arg_value>"
                      "<arg_key>s</arg_key><arg_value>hello world</arg_value>"
                      "<arg_key>q</arg_key><arg_value>\"quoted\"</arg_value>"
                      "<arg_key>b</arg_key><arg_value>false</arg_value>"
                      "<arg_key>z</arg_key><arg_value>null</arg_value></tool_call>";
    parsed p = parse_cut(out, NULL, 0, 1, NULL);
    CHECK_MSG(!strcmp(p.calls, "f {\"n\":42,\"s\":\"hello world\",\"q\":\"\\\"quoted\\\"\",\"b\":false,\"z\":null};"),
              "%s", p.calls);
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"n\":{\"type\":\"string\"},\"b\":{\"type\":\"boolean\"}}}}}]";
    p = parse_cut(out, NULL, 0, 1, tools);
    CHECK_MSG(strstr(p.calls, "\"n\":\"42\"") && strstr(p.calls, "\"b\":false"), "%s", p.calls);
    spark_chat_parser *bad;
    CHECK(spark_chat_parser_create(1, "{oops", &bad) == SPARK_ERR_ARG);
}

static void test_parser_edge_cases(void)
{
    /* Thinking off: plain content; a reply that opens with its own <think>. */
    parsed p = parse_cut("Just an answer.", NULL, 0, 0, NULL);
    CHECK(!strcmp(p.content, "Just an answer.") && !p.reasoning[0]);
    size_t cut = 3;
    p = parse_cut("<think>hmm</think>ok", &cut, 1, 0, NULL);
    CHECK(!strcmp(p.reasoning, "hmm") && !strcmp(p.content, "ok"));
    /* Cut short inside reasoning, inside a tag, inside a call. */
    p = parse_cut("still thinking </thi", NULL, 0, 1, NULL);
    CHECK(!strcmp(p.reasoning, "still thinking </thi"));
    p = parse_cut("</think>a <tool_ca", NULL, 0, 1, NULL);
    CHECK(!strcmp(p.content, "a <tool_ca"));
    const char *unfinished = "</think>x<tool_call>f<arg_key>k</arg_key><arg_value>v";
    p = parse_cut(unfinished, NULL, 0, 1, NULL);
    CHECK_MSG(!strcmp(p.content, "x<tool_call>f<arg_key>k</arg_key><arg_value>v"), "%s", p.content);
    CHECK(p.n_calls == 0);
    /* Malformed: text between </arg_key> and <arg_value>. */
    p = parse_cut("</think><tool_call>f<arg_key>k</arg_key>junk<arg_value>v</arg_value></tool_call>tail", NULL, 0,
                  1, NULL);
    CHECK(p.n_calls == 0);
    CHECK_MSG(strstr(p.content, "junk") && strstr(p.content, "tail"), "%s", p.content);
    /* Empty feeds and finish twice are harmless. */
    spark_chat_parser *q;
    CHECK(spark_chat_parser_create(0, NULL, &q) == SPARK_OK);
    CHECK(spark_chat_parser_feed(q, "", 0) == SPARK_OK);
    CHECK(spark_chat_parser_finish(q) == SPARK_OK);
    CHECK(spark_chat_parser_finish(q) == SPARK_OK);
    CHECK(spark_chat_parser_next(q).kind == SPARK_CHAT_EVENT_NONE);
    spark_chat_parser_free(q);
}

/* Random soup of tags, tag fragments and text, fed in random pieces: the
 * parser must never crash or leak (run under ASan), and text without any
 * tag must come back unchanged. */
static void test_parser_fuzz(void)
{
    static const char *const bits[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                                       "</arg_key>", "<arg_value>", "</arg_value>", "<", "</", "<tool", "x",
                                       " ", "\n", "{\"a\":1}", "12", "é", "<arg_"};
    uint64_t r = 12345;
    for (int iter = 0; iter < 2000; iter++) {
        char buf[512] = "";
        int parts = (int)(r % 20);
        for (int k = 0; k < parts; k++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            strcat(buf, bits[r % (sizeof bits / sizeof bits[0])]);
        }
        size_t cuts[8], len = strlen(buf);
        int n = 0;
        for (size_t k = 0; k < 8 && len; k++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            size_t c = r % len;
            if (n == 0 || c > cuts[n - 1]) cuts[n++] = c;
        }
        parsed p = parse_cut(buf, cuts, n, (int)(r & 1), NULL);
        if (!strchr(buf, '<') && !(r & 1)) CHECK(!strcmp(p.content, buf));
        if (!strchr(buf, '<') && (r & 1)) CHECK(!strcmp(p.reasoning, buf));
    }
}

static void test_chat_doc_parse(void)
{
    const char *json = "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{\"name\":\"f\","
                       "\"arguments\":\"{\\\"x\\\":1}\"}}]}],\"tools\":[{\"name\":\"f\"}]}";
    spark_chat_doc *d;
    CHECK(spark_chat_doc_parse(json, strlen(json), &d) == SPARK_OK);
    if (!d) return;
    spark_chat c = spark_chat_doc_view(d);
    CHECK(c.n_messages == 3 && c.messages[0].role == SPARK_CHAT_SYSTEM);
    CHECK(!strcmp(c.messages[1].content, "ab"));
    CHECK(c.messages[2].n_tool_calls == 1 && !strcmp(c.messages[2].tool_calls[0].arguments_json, "{\"x\":1}"));
    CHECK(!strcmp(c.tools_json, "[{\"name\":\"f\"}]"));
    spark_chat_doc_free(d);
    CHECK(spark_chat_doc_parse("[{\"role\":1}]", 12, &d) == SPARK_ERR_ARG && d == NULL);
    CHECK_ERROR_MENTIONS("messages[0]");
}

int main(void)
{
    RUN(test_render_text_without_tokenizer);
    RUN(test_parser_whole_and_every_cut);
    RUN(test_parser_values_and_schema);
    RUN(test_parser_edge_cases);
    RUN(test_parser_fuzz);
    RUN(test_chat_doc_parse);
    CHECK_EXIT();
}
