/* fuzz_chat_parse.c — libFuzzer target over the chat output parser (src/chat_parse.c).
 * Input: byte 0 picks the options (family, thinking, tool_choice), byte 1 the piece size pattern; the rest
 * is the generated text. The text is parsed twice, whole and in pieces, and the two event streams must agree
 * (reasoning text, content text, calls with their arguments); every call's arguments must be a JSON object.
 * Build: make fuzz (-> build/fuzz/fuzz_chat_parse); run: make fuzz-run, or
 * build/fuzz/fuzz_chat_parse -runs=1000000 CORPUS_DIR tests/fuzz/chat_parse */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qwen35.h"
#include "strbuf.h"

typedef struct Out {
    StrBuf reasoning, content, calls, args;
    int in_call;
} Out;

static void end_call(Out *o) {
    if (!o->in_call) return;
    cJSON *j = cJSON_ParseWithLength(o->args.p ? o->args.p : "", o->args.n);
    if (!cJSON_IsObject(j)) abort(); /* arguments must be a JSON object */
    cJSON_Delete(j);
    sb_put(&o->calls, o->args.p ? o->args.p : "", o->args.n);
    sb_putc(&o->calls, '|');
    sb_free(&o->args);
    o->in_call = 0;
}

static int on_event(void *user, const Q35ChatEvent *ev) {
    Out *o = user;
    switch (ev->type) {
    case Q35_CHAT_EV_REASONING:
        end_call(o);
        sb_put(&o->reasoning, ev->text, ev->len);
        break;
    case Q35_CHAT_EV_CONTENT:
        end_call(o);
        sb_put(&o->content, ev->text, ev->len);
        break;
    case Q35_CHAT_EV_TOOL_START:
        end_call(o);
        o->in_call = 1;
        sb_puts(&o->calls, ev->name);
        sb_puts(&o->calls, ev->id);
        break;
    case Q35_CHAT_EV_TOOL_ARGS:
        if (!o->in_call) abort();
        sb_put(&o->args, ev->text, ev->len);
        break;
    default: abort();
    }
    return 0;
}

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"s\": {\"type\": \"string\"}, \"i\": {\"type\": \"integer\"}, \"n\": {\"type\": \"number\"}, \"b\": {\"type\": "
    "\"boolean\"}, \"o\": {\"type\": \"object\"}, \"a\": {\"type\": \"array\"}}}}}]";

static void parse(const Q35ChatParseOptions *opt, const char *t, size_t n, unsigned pat, Out *o) {
    Q35ChatParser *p;
    Q35Err err;
    memset(o, 0, sizeof *o);
    if (q35_chat_parser_open(&p, NULL, opt, &err)) abort();
    size_t i = 0, k = 0;
    while (i < n) {
        size_t piece = pat ? 1 + ((pat >> (k++ % 8)) & 7) : n;
        if (piece > n - i) piece = n - i;
        if (q35_chat_parser_push(p, t + i, piece, on_event, o, &err)) abort();
        i += piece;
    }
    int nc;
    if (q35_chat_parser_finish(p, on_event, o, &nc, &err)) abort();
    end_call(o);
    q35_chat_parser_close(p);
}

static int same(const StrBuf *a, const StrBuf *b) { return a->n == b->n && (!a->n || !memcmp(a->p, b->p, a->n)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    Q35ChatParseOptions opt = {.family = data[0] & 1 ? Q35_TOK_QWEN3 : Q35_TOK_QWEN35,
                               .thinking = (data[0] >> 1) & 1,
                               .tools = (data[0] >> 2) & 1 ? NULL : TOOLS,
                               .tool_choice = (data[0] >> 3) & 3,
                               .id_seed = data[0]};
    Out a, b;
    parse(&opt, (const char *)data + 2, size - 2, 0, &a);
    parse(&opt, (const char *)data + 2, size - 2, data[1] | 1u, &b);
    if (!same(&a.reasoning, &b.reasoning) || !same(&a.content, &b.content) || !same(&a.calls, &b.calls)) abort();
    Out *v[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        sb_free(&v[i]->reasoning);
        sb_free(&v[i]->content);
        sb_free(&v[i]->calls);
        sb_free(&v[i]->args);
    }
    return 0;
}
