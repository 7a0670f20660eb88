/* test_chat_parse.c — the streaming chat output parser (src/chat_parse.c) on hand-written model outputs:
 * well-formed calls, several calls, typed and nested values, any argument order, missing closing tags, text
 * after a call, a stop in the middle, reasoning with and without "</think>", Qwen3's JSON calls. Every case is
 * fed whole, one byte at a time, and split in two at every byte boundary; all must give the same events.
 * Each call's argument pieces must concatenate to a JSON object (cJSON). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "strbuf.h"
#include "test.h"

typedef struct Got {
    StrBuf reasoning, content, calls; /* calls: "name(args)|" per call */
    StrBuf args;                      /* the current call's argument pieces */
    int n_start, cur, bad_order, bad_json;
    char first_id[64];
    char ids[8][40];
} Got;

static void close_call(Got *g) {
    if (g->cur < 0) return;
    cJSON *j = cJSON_Parse(g->args.p ? g->args.p : "");
    g->bad_json += !cJSON_IsObject(j);
    cJSON_Delete(j);
    sb_put(&g->calls, g->args.p ? g->args.p : "", g->args.n);
    sb_puts(&g->calls, ")|");
    sb_free(&g->args);
    g->cur = -1;
}

static int on_event(void *user, const Q35ChatEvent *ev) {
    Got *g = user;
    if (ev->type == Q35_CHAT_EV_REASONING || ev->type == Q35_CHAT_EV_CONTENT) {
        g->bad_order += ev->len == 0 || ev->text[ev->len] != 0;
        close_call(g);
        sb_put(ev->type == Q35_CHAT_EV_REASONING ? &g->reasoning : &g->content, ev->text, ev->len);
    } else if (ev->type == Q35_CHAT_EV_TOOL_START) {
        close_call(g);
        g->bad_order += ev->index != g->n_start || !ev->id || strncmp(ev->id, "call_", 5) || strlen(ev->id) != 29;
        if (g->n_start < 8) snprintf(g->ids[g->n_start], sizeof g->ids[0], "%s", ev->id);
        g->cur = g->n_start++;
        sb_puts(&g->calls, ev->name);
        sb_putc(&g->calls, '(');
    } else {
        g->bad_order += ev->index != g->cur || ev->type != Q35_CHAT_EV_TOOL_ARGS;
        sb_put(&g->args, ev->text, ev->len);
    }
    return 0;
}

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"location\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"search_docs\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"query\": {\"type\": \"string\"}, \"max_results\": {\"type\": \"integer\"}, \"threshold\": "
    "{\"type\": [\"number\", \"null\"]}, \"exact\": {\"type\": \"boolean\"}, \"filters\": {\"type\": \"object\"}, "
    "\"tags\": {\"type\": \"array\"}}}}}]";

typedef struct Want {
    const char *reasoning, *content, *calls;
    int n_calls;
} Want;

/* Runs text through a parser in pieces: split = 0 whole, 1 byte by byte, else two pieces at split - 2. */
static int run(const Q35ChatParseOptions *o, const char *text, size_t split, Got *g, int *n_calls) {
    Q35ChatParser *p;
    Err err;
    memset(g, 0, sizeof *g);
    g->cur = -1;
    if (q35_chat_parser_open(&p, NULL, o, &err)) return fprintf(stderr, "open: %s\n", err.msg), -1;
    size_t n = strlen(text);
    int rc = 0;
    if (split == 0)
        rc = q35_chat_parser_push(p, text, n, on_event, g, &err);
    else if (split == 1)
        for (size_t i = 0; i < n && !rc; i++) rc = q35_chat_parser_push(p, text + i, 1, on_event, g, &err);
    else {
        rc = q35_chat_parser_push(p, text, split - 2, on_event, g, &err);
        if (!rc) rc = q35_chat_parser_push(p, text + split - 2, n - (split - 2), on_event, g, &err);
    }
    if (!rc) rc = q35_chat_parser_finish(p, on_event, g, n_calls, &err);
    close_call(g);
    q35_chat_parser_close(p);
    return rc;
}

static const char *s(const StrBuf *b) { return b->p ? b->p : ""; }
static void got_free(Got *g) {
    sb_free(&g->reasoning);
    sb_free(&g->content);
    sb_free(&g->calls);
    sb_free(&g->args);
}

static void expect(const char *what, int family, int thinking, const char *tools, int choice, const char *text,
                   Want w) {
    Q35ChatParseOptions o = {
        .family = family, .thinking = thinking, .tools = tools, .tool_choice = choice, .id_seed = 42};
    size_t n = strlen(text);
    int fails = 0;
    for (size_t split = 0; split < n + 3 && fails < 2; split++) {
        Got g;
        int nc = -1;
        int rc = run(&o, text, split, &g, &nc);
        int ok = rc == 0 && !strcmp(s(&g.reasoning), w.reasoning ? w.reasoning : "") &&
                 !strcmp(s(&g.content), w.content ? w.content : "") && !strcmp(s(&g.calls), w.calls ? w.calls : "") &&
                 nc == w.n_calls && g.n_start == w.n_calls && !g.bad_order && !g.bad_json;
        if (!ok) {
            fails++;
            fprintf(stderr,
                    "%s (split %zu): rc %d n_calls %d bad_order %d bad_json %d\n  reasoning [%s]\n  content [%s]\n"
                    "  calls [%s]\n",
                    what, split, rc, nc, g.bad_order, g.bad_json, s(&g.reasoning), s(&g.content), s(&g.calls));
        }
        got_free(&g);
    }
    CHECK(fails == 0, "%s", what);
}

#define Q35  Q35_TOK_QWEN35
#define Q3   Q35_TOK_QWEN3
#define AUTO Q35_TOOL_CHOICE_AUTO

static const char *CALL_W = "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n"
                            "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>";
#define W_ARGS "get_weather({\"location\": \"Paris, France\", \"unit\": \"celsius\"})|"

static void check_qwen35(void) {
    char buf[2048];
    expect("one call", Q35, 0, TOOLS, AUTO, CALL_W, (Want){.calls = W_ARGS, .n_calls = 1});
    snprintf(buf, sizeof buf, "Let me check.\n\n%s\n%s", CALL_W, CALL_W);
    expect("content and two calls", Q35, 0, TOOLS, AUTO, buf,
           (Want){.content = "Let me check.", .calls = W_ARGS W_ARGS, .n_calls = 2});
    expect("typed values, any order, undeclared parameter", Q35, 0, TOOLS, AUTO,
           "<tool_call>\n<function=search_docs>\n<parameter=exact>\nTrue\n</parameter>\n<parameter=query>\nmulti\n"
           "line \"q\" \\ \x01\n</parameter>\n<parameter=max_results>\n10\n</parameter>\n<parameter=threshold>\n"
           "0.75\n</parameter>\n<parameter=filters>\n{\"a\": {\"b\": [1, {\"c\": null}, 2.50]}}\n</parameter>\n"
           "<parameter=tags>\n[\"x\", \"東京 🗾\"]\n</parameter>\n<parameter=extra>\n42\n</parameter>\n</function>\n"
           "</tool_call>",
           (Want){.calls = "search_docs({\"exact\": true, \"query\": \"multi\\nline \\\"q\\\" \\\\ \\u0001\", "
                           "\"max_results\": 10, \"threshold\": 0.75, \"filters\": {\"a\": {\"b\": [1, {\"c\": null}, "
                           "2.5]}}, \"tags\": [\"x\", \"東京 🗾\"], \"extra\": \"42\"})|",
                  .n_calls = 1});
    expect("values that do not read as their type stay strings", Q35, 0, TOOLS, AUTO,
           "<tool_call>\n<function=search_docs>\n<parameter=max_results>\nten\n</parameter>\n<parameter=exact>\n"
           "maybe\n</parameter>\n<parameter=filters>\n{bad\n</parameter>\n<parameter=threshold>\nNone\n</parameter>\n"
           "<parameter=query>\nnull\n</parameter>\n</function>\n</tool_call>",
           (Want){.calls = "search_docs({\"max_results\": \"ten\", \"exact\": \"maybe\", \"filters\": \"{bad\", "
                           "\"threshold\": null, \"query\": \"null\"})|",
                  .n_calls = 1});
    expect("numbers beyond a double keep their literals", Q35, 0, TOOLS, AUTO,
           "<tool_call>\n<function=search_docs>\n<parameter=threshold>\n1e999\n</parameter>\n<parameter=filters>\n"
           "{\"a\": [-1e400]}\n</parameter>\n</function>\n</tool_call>",
           (Want){.calls = "search_docs({\"threshold\": 1e999, \"filters\": {\"a\": [-1e400]}})|", .n_calls = 1});
    expect("</parameter> inside a value", Q35, 0, TOOLS, AUTO,
           "<tool_call>\n<function=get_weather>\n<parameter=location>\na\n</parameter> b\n</parameter>\n</function>\n"
           "</tool_call>",
           (Want){.calls = "get_weather({\"location\": \"a\\n</parameter> b\"})|", .n_calls = 1});
    expect("no parameters", Q35, 0, TOOLS, AUTO, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
           (Want){.calls = "get_time({})|", .n_calls = 1});
    expect("missing </parameter>", Q35, 0, TOOLS, AUTO,
           "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n<parameter=unit>\nC\n</function>\n"
           "</tool_call>",
           (Want){.calls = "get_weather({\"location\": \"Paris\", \"unit\": \"C\"})|", .n_calls = 1});
    expect("missing </function> before </tool_call>", Q35, 0, TOOLS, AUTO,
           "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</tool_call>",
           (Want){.calls = "get_weather({\"location\": \"Paris\"})|", .n_calls = 1});
    expect("missing </tool_call> at the end", Q35, 0, TOOLS, AUTO,
           "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n",
           (Want){.calls = "get_weather({\"location\": \"Paris\"})|", .n_calls = 1});
    const char *cut = "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nPar";
    expect("a stop in the middle of a call: content", Q35, 0, TOOLS, AUTO, cut,
           (Want){.content = "Sure.<tool_call>\n<function=get_weather>\n<parameter=location>\nPar"});
    expect("a stop inside the tag", Q35, 0, TOOLS, AUTO, "Hi <tool_ca", (Want){.content = "Hi <tool_ca"});
    snprintf(buf, sizeof buf, "%s\nDone, see above.\n", CALL_W);
    expect("text after the call", Q35, 0, TOOLS, AUTO, buf,
           (Want){.content = "Done, see above.\n", .calls = W_ARGS, .n_calls = 1});
    expect("malformed call: content", Q35, 0, TOOLS, AUTO, "A <tool_call>\nhello\n</tool_call> B",
           (Want){.content = "A <tool_call>\nhello\n</tool_call> B"});
    snprintf(buf, sizeof buf, "<tool_call>\n<function=bad name\n</tool_call>\n%s", CALL_W);
    expect("a malformed call then a good one", Q35, 0, TOOLS, AUTO, buf,
           (Want){.content = "<tool_call>\n<function=bad name\n</tool_call>", .calls = W_ARGS, .n_calls = 1});
    expect("text after </function> inside the call: content", Q35, 0, TOOLS, AUTO,
           "<tool_call>\n<function=f>\n</function>\noops\n</tool_call>",
           (Want){.content = "<tool_call>\n<function=f>\n</function>\noops\n</tool_call>"});
    expect("tool_choice none: all content", Q35, 0, TOOLS, Q35_TOOL_CHOICE_NONE, CALL_W, (Want){.content = CALL_W});
    expect("no tools: all content", Q35, 0, NULL, AUTO, CALL_W, (Want){.content = CALL_W});
    expect("not a tag", Q35, 0, TOOLS, AUTO, "a <b> <tool <tool_cal x\n\ny",
           (Want){.content = "a <b> <tool <tool_cal x\n\ny"});

    /* reasoning */
    expect("thinking: reasoning then content", Q35, 1, TOOLS, AUTO, "\nLet me think.\n\nMore.\n\n</think>\n\nAnswer\n",
           (Want){.reasoning = "Let me think.\n\nMore.", .content = "Answer\n"});
    snprintf(buf, sizeof buf, "Need weather.\n</think>\n\nChecking.\n\n%s", CALL_W);
    expect("thinking and a call", Q35, 1, TOOLS, AUTO, buf,
           (Want){.reasoning = "Need weather.", .content = "Checking.", .calls = W_ARGS, .n_calls = 1});
    expect("thinking, stopped before </think>", Q35, 1, TOOLS, AUTO, "Hmm <tool_call> not here\n\n",
           (Want){.reasoning = "Hmm <tool_call> not here"});
    expect("thinking: model-written <think>", Q3, 1, NULL, AUTO, "<think>\nabc\n</think>\n\nxyz",
           (Want){.reasoning = "abc", .content = "xyz"});
    expect("thinking: a short reply that only looks like <think>", Q3, 1, NULL, AUTO, "<thi",
           (Want){.reasoning = "<thi"});
    expect("non-thinking: think tags are content", Q35, 0, TOOLS, AUTO, "<think>x</think>y",
           (Want){.content = "<think>x</think>y"});
}

static void check_qwen3(void) {
    expect(
        "Qwen3 JSON call", Q3, 0, TOOLS, AUTO,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"n\": 1.0}}\n</tool_call>",
        (Want){.calls = "get_weather({\"location\": \"Paris\", \"n\": 1.0})|", .n_calls = 1});
    expect("Qwen3 arguments as a JSON string, two calls", Q3, 0, TOOLS, AUTO,
           "ok\n<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": [1,2]}\"}\n</tool_call>\n<tool_call>\n"
           "{\"name\": \"b\"}\n</tool_call>",
           (Want){.content = "ok", .calls = "a({\"x\": [1, 2]})|b({})|", .n_calls = 2});
    expect("Qwen3 malformed JSON: content", Q3, 0, TOOLS, AUTO,
           "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call>",
           (Want){.content = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call>"});
    expect("Qwen3 unfinished call: content", Q3, 0, TOOLS, AUTO, "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n",
           (Want){.content = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n"});
    expect("Qwen3 number beyond a double: its literal, valid JSON", Q3, 0, TOOLS, AUTO,
           "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": {\"y\": -1e400}, \"z\": 1E+999}}\n</tool_call>",
           (Want){.calls = "a({\"x\": {\"y\": -1e400}, \"z\": 1E+999})|", .n_calls = 1});
    expect("Qwen3 thinking and a call", Q3, 1, TOOLS, AUTO,
           "<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
           (Want){.reasoning = "plan", .calls = "get_weather({})|", .n_calls = 1});
}

/* Only text that may still be a tag is held back: after each push, what came out is checked. */
static void check_holdback(void) {
    Q35ChatParseOptions o = {.family = Q35, .tools = TOOLS};
    Q35ChatParser *p;
    Err err;
    Got g;
    memset(&g, 0, sizeof g);
    g.cur = -1;
    CHECK(q35_chat_parser_open(&p, NULL, &o, &err) == 0, "open");
    static const struct {
        const char *push, *content;
    } steps[] = {{"Hello <to", "Hello "},      {"ol", "Hello "},           {"X", "Hello <toolX"},
                 {" ok\n", "Hello <toolX ok"}, {"\n<", "Hello <toolX ok"}, {"b", "Hello <toolX ok\n\n<b"}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        q35_chat_parser_push(p, steps[i].push, strlen(steps[i].push), on_event, &g, &err);
        CHECK(!strcmp(s(&g.content), steps[i].content), "after push %zu: [%s] want [%s]", i, s(&g.content),
              steps[i].content);
    }
    int nc;
    CHECK(q35_chat_parser_finish(p, on_event, &g, &nc, &err) == 0 && nc == 0, "finish");
    CHECK(q35_chat_parser_push(p, "x", 1, on_event, &g, &err) == Q35_ERR_ARG, "push after finish refused");
    q35_chat_parser_close(p);
    got_free(&g);
    /* ids: deterministic per seed, distinct per index */
    Got a, b;
    int n1, n2;
    Q35ChatParseOptions o2 = {.family = Q35, .tools = TOOLS, .id_seed = 7};
    char two[1024];
    snprintf(two, sizeof two, "%s\n%s", CALL_W, CALL_W);
    run(&o2, two, 0, &a, &n1);
    run(&o2, two, 1, &b, &n2);
    CHECK(n1 == 2 && !strcmp(a.ids[0], b.ids[0]) && strcmp(a.ids[0], a.ids[1]), "call ids %s %s", a.ids[0], a.ids[1]);
    got_free(&a);
    got_free(&b);
    /* a callback's non-zero return stops the push and comes back */
    CHECK(q35_chat_parser_open(&p, NULL, &o, &err) == 0, "open");
    int stop(void *u, const Q35ChatEvent *ev);
    CHECK(q35_chat_parser_push(p, "abc", 3, stop, NULL, &err) == 7, "callback stop returned");
    q35_chat_parser_close(p);
    o.tools = "{bad";
    CHECK(q35_chat_parser_open(&p, NULL, &o, &err) == Q35_ERR_FORMAT, "malformed tools refused");
}
int stop(void *u, const Q35ChatEvent *ev) {
    (void)u;
    (void)ev;
    return 7;
}

/* Round trip: a parsed Qwen3.5 call, rendered back by the template code, is the model's text again. */
static void check_round_trip(void) {
    const char *text = "<tool_call>\n<function=search_docs>\n<parameter=query>\nü \"q\"\n</parameter>\n"
                       "<parameter=max_results>\n3\n</parameter>\n<parameter=exact>\nTrue\n</parameter>\n"
                       "<parameter=filters>\n{\"a\": [1, 2.5]}\n</parameter>\n</function>\n</tool_call>";
    Q35ChatParseOptions o = {.family = Q35, .tools = TOOLS};
    Got g;
    int nc;
    CHECK(run(&o, text, 0, &g, &nc) == 0 && nc == 1, "round trip parse");
    /* calls: "search_docs(ARGS)|" */
    char args[512];
    const char *c = s(&g.calls), *lp = strchr(c, '(');
    snprintf(args, sizeof args, "%.*s", lp ? (int)(strlen(lp) - 3) : 0, lp ? lp + 1 : "");
    Q35ChatToolCall call = {.name = "search_docs", .arguments = args};
    Q35ChatMessage m[] = {{.role = "user", .content = "q"},
                          {.role = "assistant", .tool_calls = &call, .n_tool_calls = 1}};
    Q35ChatRequest rq = {.messages = m, .n_messages = 2, .family = Q35};
    char *out = NULL;
    Err err;
    int rc = q35_chat_render_request(NULL, &rq, &out, &err);
    CHECK(rc == 0 && strstr(out, text) != NULL, "round trip render: %s", rc ? err.msg : out);
    free(out);
    got_free(&g);
}

int main(void) {
    check_round_trip();
    check_qwen35();
    check_qwen3();
    check_holdback();
    return TEST_SUMMARY("chat_parse");
}
