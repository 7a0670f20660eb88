/* test_chat_guide.c — the tool_choice automaton (src/chat_guide.c): forced prefixes, what it allows and
 * refuses (wrong name, missing required parameter, a repeated parameter, text before the call, a second
 * call for a named function), thinking, Qwen3's JSON form; and a property check: outputs built by a
 * random "sampler" that only takes pieces the guide allows parse as calls of the allowed functions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwen35.h"
#include "test.h"
#include "util.h"

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"location\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\"}}, \"required\": "
    "[\"location\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {}}}}, {\"type\": \"function\", \"function\": {\"name\": \"free\"}}]";

static Q35Guide *open_guide(int family, int choice, const char *name, int thinking) {
    Q35ChatRequest rq = {
        .tools = TOOLS, .tool_choice = choice, .tool_choice_name = name, .thinking = thinking, .family = family};
    Q35Guide *g;
    Err err;
    int rc = q35_guide_open(&g, NULL, &rq, &err);
    CHECK(rc == 0, "guide open: %s", err.msg);
    return rc ? NULL : g;
}

static int push(Q35Guide *g, const char *x) {
    Err err;
    return q35_guide_push(g, x, strlen(x), &err);
}

static const char *CALL = "<tool_call>\n<function=get_weather>\n<parameter=unit>\nC\n</parameter>\n"
                          "<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>";

static void check_qwen35(void) {
    Q35Guide *g = open_guide(Q35_TOK_QWEN35, Q35_TOOL_CHOICE_FUNCTION, "get_weather", Q35_THINK_OFF);
    if (!g) return;
    CHECK(!strcmp(q35_guide_forced(g), "<tool_call>\n<function=get_weather>\n<parameter="), "forced: [%s]",
          q35_guide_forced(g));
    CHECK(!q35_guide_allows(g, "Sure", 4), "no text before the call");
    CHECK(!q35_guide_allows(g, "<tool_call>\n<function=get_time>", 32), "named: another function refused");
    CHECK(!q35_guide_allows(g, "<tool_call>\n<function=get_weather>\n</function>", 46),
          "a required parameter missing: no </function>");
    CHECK(!q35_guide_allows(g, "<tool_call>\n<function=get_weather>\n<parameter=city>", 51),
          "an undeclared parameter refused");
    CHECK(!q35_guide_can_stop(g), "no stop before the call");
    for (const char *p = CALL; *p; p++)
        CHECK(q35_guide_allows(g, p, 1) && push(g, (char[]){*p, 0}) == 0, "byte %ld", (long)(p - CALL));
    CHECK(q35_guide_can_stop(g), "stop after the call");
    CHECK(!q35_guide_allows(g, "\n", 1), "named: one call only");
    q35_guide_close(g);

    g = open_guide(Q35_TOK_QWEN35, Q35_TOOL_CHOICE_REQUIRED, NULL, Q35_THINK_OFF);
    CHECK(!strcmp(q35_guide_forced(g), "<tool_call>\n<function="), "required: forced [%s]", q35_guide_forced(g));
    CHECK(push(g, "<tool_call>\n<function=get_weather>\n<parameter=location>\nA\n</parameter>\n") == 0, "partial");
    CHECK(!q35_guide_allows(g, "<parameter=location>", 20), "a parameter twice refused");
    CHECK(push(g, "</function>\n</tool_call>") == 0 && q35_guide_can_stop(g), "first call");
    CHECK(push(g, "\n<tool_call>\n<function=free>\n<parameter=anything>\nx\n</parameter>\n</function>\n</tool_call>") ==
              0,
          "second call; a function without properties takes any name");
    CHECK(push(g, "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>") == 0, "third call, no parameters");
    CHECK(push(g, "x") != 0 && q35_guide_can_stop(g), "text after a call refused, state kept");
    q35_guide_close(g);

    g = open_guide(Q35_TOK_QWEN35, Q35_TOOL_CHOICE_FUNCTION, "get_time", Q35_THINK_ON);
    CHECK(!strcmp(q35_guide_forced(g), ""), "thinking: nothing forced yet");
    CHECK(push(g, "I think </thi <tool_call> anything\n") == 0 && !q35_guide_can_stop(g), "reasoning is free");
    CHECK(push(g, "</think>") == 0, "end of thinking");
    CHECK(!strcmp(q35_guide_forced(g), "\n\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
          "after thinking: [%s]", q35_guide_forced(g));
    q35_guide_close(g);

    Q35ChatRequest rq = {
        .tools = TOOLS, .tool_choice = Q35_TOOL_CHOICE_FUNCTION, .tool_choice_name = "nope", .family = Q35_TOK_QWEN35};
    Err err;
    CHECK(q35_guide_open(&g, NULL, &rq, &err) == Q35_ERR_ARG, "unknown named function refused");
    rq.tool_choice = Q35_TOOL_CHOICE_AUTO;
    CHECK(q35_guide_open(&g, NULL, &rq, &err) == Q35_ERR_ARG, "auto needs no guide");
}

static void check_qwen3(void) {
    Q35Guide *g = open_guide(Q35_TOK_QWEN3, Q35_TOOL_CHOICE_FUNCTION, "get_weather", Q35_THINK_OFF);
    if (!g) return;
    CHECK(!strcmp(q35_guide_forced(g), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
          "Qwen3 forced: [%s]", q35_guide_forced(g));
    CHECK(!q35_guide_allows(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [", 51),
          "arguments must be an object");
    CHECK(push(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"a}\\\"]\", \"x\": [{}]}") ==
              0,
          "JSON with braces in strings");
    CHECK(!strcmp(q35_guide_forced(g), "}\n</tool_call>"), "closing forced: [%s]", q35_guide_forced(g));
    CHECK(push(g, "}\n</tool_call>") == 0 && q35_guide_can_stop(g), "Qwen3 call complete");
    q35_guide_close(g);
}

/* Each event of a parse, flattened. */
typedef struct Flat {
    char text[4096];
    size_t n;
    int calls, content;
} Flat;
static int on_event(void *user, const Q35ChatEvent *ev) {
    Flat *f = user;
    if (ev->type == Q35_CHAT_EV_TOOL_START) {
        f->calls++;
        f->n += (size_t)snprintf(f->text + f->n, sizeof f->text - f->n, "%s", ev->name);
    } else if (ev->type == Q35_CHAT_EV_CONTENT) {
        f->content++;
    }
    return 0;
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A random sampler over a small vocabulary of pieces, constrained by the guide: every output it completes
 * must parse into calls only (no content), with the right count. */
static void check_sampler(int family, int choice, const char *name) {
    /* clang-format off */
    static const char *q35_vocab[] = {
        "<tool_call>", "\n", "<function=", "get_weather", "get_time", "free", ">", "<parameter=", "location",
        "unit", "zz", "Paris", " ", "</parameter>", "</function>", "</tool_call>", "x", "{", "}", "\"", "<", "a>b",
        "\n\n", "\n</parameter>\n", "</function>\n</tool_call>", "\n</parameter> <parameter=unit>"};
    static const char *q3_vocab[] = {
        "<tool_call>", "\n", "{\"name\": \"", "get_weather", "get_time", "free", "\", \"arguments\": ", "{", "}",
        "[", "]", "\"", "\\", "a", ":", ",", " ", "</tool_call>", "\"}", "\"location\"", ": ", "1.5e3", "-0", "true",
        "null", ", ", "\"x\\u00e9\"", "}\n</tool_call>"};
    /* clang-format on */
    const char **vocab = family == Q35_TOK_QWEN35 ? q35_vocab : q3_vocab;
    int nv = family == Q35_TOK_QWEN35 ? (int)(sizeof q35_vocab / sizeof *q35_vocab)
                                      : (int)(sizeof q3_vocab / sizeof *q3_vocab);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int bad = 0, done = 0;
    for (int trial = 0; trial < 300; trial++) {
        Q35Guide *g = open_guide(family, choice, name, Q35_THINK_OFF);
        if (!g) return;
        char out[4096];
        size_t n = 0;
        int ok = 1;
        for (int step = 0; step < 1000 && ok; step++) {
            if (q35_guide_can_stop(g) && rnd(&seed) % 3 == 0) break;
            int picked = -1;
            for (int k = 0; k < 8 && picked < 0; k++) { /* a few random candidates, then the forced bytes */
                int v = (int)(rnd(&seed) % (uint64_t)nv);
                if (q35_guide_allows(g, vocab[v], strlen(vocab[v]))) picked = v;
            }
            const char *piece = picked >= 0 ? vocab[picked] : NULL;
            char one[2] = {0, 0};
            if (!piece) {
                const char *f = q35_guide_forced(g);
                if (!*f) { /* a free position: any piece the guide takes, else one byte */
                    int v0 = (int)(rnd(&seed) % (uint64_t)nv);
                    for (int k = 0; k < nv && !*f; k++)
                        if (q35_guide_allows(g, vocab[(v0 + k) % nv], strlen(vocab[(v0 + k) % nv])))
                            f = vocab[(v0 + k) % nv];
                    for (const char *c = "az\"}]:,0\n"; !*f && *c; c++)
                        if (q35_guide_allows(g, c, 1)) {
                            one[0] = *c;
                            f = one;
                        }
                }
                piece = f;
            }
            size_t k = strlen(piece);
            if (!k || n + k >= sizeof out) break;
            Err err;
            ok = q35_guide_push(g, piece, k, &err) == 0;
            memcpy(out + n, piece, k);
            n += k;
        }
        if (!q35_guide_can_stop(g)) {
            q35_guide_close(g);
            continue; /* ran out of steps */
        }
        done++;
        Q35ChatParseOptions o = {.family = family, .tools = TOOLS};
        Q35ChatParser *p;
        Err err;
        Flat f = {0};
        int nc = 0;
        q35_chat_parser_open(&p, NULL, &o, &err);
        q35_chat_parser_push(p, out, n, on_event, &f, &err);
        q35_chat_parser_finish(p, on_event, &f, &nc, &err);
        q35_chat_parser_close(p);
        int good = ok && nc >= 1 && f.content == 0 && (!name || (nc == 1 && !strcmp(f.text, name)));
        if (!good && bad++ < 3)
            fprintf(stderr, "sampler output not parsed as calls (%d, content %d): [%.*s]\n", nc, f.content, (int)n,
                    out);
        q35_guide_close(g);
    }
    CHECK(done >= 50 && bad == 0, "guided sampler (family %d, choice %d): %d complete, %d bad", family, choice, done,
          bad);
}

int main(void) {
    check_qwen35();
    check_qwen3();
    check_sampler(Q35_TOK_QWEN35, Q35_TOOL_CHOICE_REQUIRED, NULL);
    check_sampler(Q35_TOK_QWEN35, Q35_TOOL_CHOICE_FUNCTION, "get_weather");
    check_sampler(Q35_TOK_QWEN3, Q35_TOOL_CHOICE_REQUIRED, NULL);
    check_sampler(Q35_TOK_QWEN3, Q35_TOOL_CHOICE_FUNCTION, "get_time");
    return TEST_SUMMARY("chat_guide");
}
