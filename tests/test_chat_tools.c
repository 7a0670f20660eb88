/* test_chat_tools.c — the C renderer (tools, tool calls, tool results, reasoning, thinking on/off) against
 * the official templates: every conversation of tests/fixtures/chat/cases.jsonl rendered by
 * q35_chat_render_request equals, byte for byte, the golden text of tests/fixtures/chat/golden.jsonl
 * (tools/make_chat_golden.py: HF apply_chat_template on the sha256-pinned template texts), and its Qwen3
 * tokenization equals the golden ids. Cases the template rejects (raise_exception) must fail here too.
 * Plus unit checks of the Python-compatible JSON printing (pyjson.c). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "pyjson.h"
#include "test.h"
#include "tokenizer.h"

static char *slurp(const char *path) {
    char *d = NULL;
    size_t n;
    Err err;
    return read_file(path, &d, &n, &err) ? NULL : d;
}

static const char *str_or_null(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

#define MAX_MSG   32
#define MAX_CALLS 64

/* Renders one case; *got (malloc'ed) or the error code. */
static int render_case(const cJSON *c, char **got, Err *err) {
    static Q35ChatMessage mm[MAX_MSG];
    static Q35ChatToolCall calls[MAX_CALLS];
    int k = 0, nc = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "messages")) {
        if (k == MAX_MSG) return err_set(err, Q35_ERR_ARG, "too many messages");
        Q35ChatMessage *q = &mm[k++];
        *q = (Q35ChatMessage){.role = str_or_null(m, "role"),
                              .content = str_or_null(m, "content"),
                              .reasoning = str_or_null(m, "reasoning_content"),
                              .tool_call_id = str_or_null(m, "tool_call_id")};
        const cJSON *tc;
        q->tool_calls = &calls[nc];
        cJSON_ArrayForEach(tc, cJSON_GetObjectItem(m, "tool_calls")) {
            if (nc == MAX_CALLS) return err_set(err, Q35_ERR_ARG, "too many calls");
            const cJSON *fn = cJSON_GetObjectItem(tc, "function");
            calls[nc++] = (Q35ChatToolCall){.id = str_or_null(tc, "id"),
                                            .name = str_or_null(fn, "name"),
                                            .arguments = str_or_null(fn, "arguments")};
            q->n_tool_calls++;
        }
    }
    const char *tpl = str_or_null(c, "template");
    const cJSON *think = cJSON_GetObjectItem(c, "enable_thinking");
    Q35ChatRequest rq = {.messages = mm,
                         .n_messages = k,
                         .tools = str_or_null(c, "tools"),
                         .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                         .thinking = cJSON_IsTrue(think)    ? Q35_THINK_ON
                                     : cJSON_IsFalse(think) ? Q35_THINK_OFF
                                                            : Q35_THINK_DEFAULT};
    /* the 4B/9B template differs only in its default: thinking on */
    ChatFormat f = {!strcmp(tpl, "qwen3") ? Q35_TOK_QWEN3 : Q35_TOK_QWEN35,
                    !strcmp(tpl, "qwen35") ? Q35_THINK_OFF : Q35_THINK_ON};
    return chat_render_request(&f, &rq, got, err);
}

static void check_goldens(const Tokenizer *t) {
    char *cases = slurp("tests/fixtures/chat/cases.jsonl"), *gold = slurp("tests/fixtures/chat/golden.jsonl");
    CHECK(cases && gold, "tests/fixtures/chat/{cases,golden}.jsonl missing");
    if (!cases || !gold) {
        free(cases);
        free(gold);
        return;
    }
    cJSON *golds = cJSON_CreateObject(); /* id -> golden row */
    char *save, *line = strtok_r(gold, "\n", &save);
    cJSON *head = cJSON_Parse(line);
    CHECK(head && !strcmp(str_or_null(head, "format") ? str_or_null(head, "format") : "", "q35-chat-golden"),
          "golden header");
    printf("goldens: %s, ids from %s\n", str_or_null(head, "renderer"), str_or_null(head, "ids_from"));
    cJSON_Delete(head);
    while ((line = strtok_r(NULL, "\n", &save))) {
        cJSON *g = cJSON_Parse(line);
        if (g) cJSON_AddItemToObject(golds, str_or_null(g, "id"), g);
    }
    int n = 0, n35 = 0, n3 = 0, bad_text = 0, bad_ids = 0, errors = 0;
    for (line = strtok_r(cases, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *c = cJSON_Parse(line);
        const char *id = str_or_null(c, "id");
        const cJSON *g = id ? cJSON_GetObjectItemCaseSensitive(golds, id) : NULL;
        CHECK(g != NULL, "no golden for case %s", id ? id : "?");
        if (!g) {
            cJSON_Delete(c);
            continue;
        }
        n++;
        n3 += !strcmp(str_or_null(c, "template"), "qwen3");
        n35 += !!strcmp(str_or_null(c, "template"), "qwen3");
        char *got = NULL;
        Err err = {0};
        int rc = render_case(c, &got, &err);
        const char *want = str_or_null(g, "text");
        if (!want) { /* the template raises: so must we */
            errors++;
            CHECK(rc != 0, "case %s: the template raises (%s) but C rendered", id, str_or_null(g, "error"));
        } else if (rc || strcmp(got, want)) {
            bad_text++;
            size_t at = 0;
            while (!rc && got[at] && got[at] == want[at]) at++;
            fprintf(stderr, "case %s: %s\n", id, rc ? err.msg : "differs");
            if (!rc)
                fprintf(stderr, "  at byte %zu:\n   got [%.80s]\n  want [%.80s]\n", at, got + (at > 20 ? at - 20 : 0),
                        want + (at > 20 ? at - 20 : 0));
        } else {
            int *ids, ni;
            const cJSON *wid = cJSON_GetObjectItem(g, "ids");
            int ok = q35_tokenize(t, got, strlen(got), &ids, &ni, &err) == 0 && ni == cJSON_GetArraySize(wid);
            for (int q = 0; ok && q < ni; q++) ok = ids[q] == cJSON_GetArrayItem(wid, q)->valueint;
            if (!ok) fprintf(stderr, "case %s: ids differ\n", id);
            bad_ids += !ok;
            free(ids);
        }
        free(got);
        cJSON_Delete(c);
    }
    CHECK(n >= 40 && n35 >= 20 && n3 >= 10, "only %d cases (%d Qwen3.5, %d Qwen3)", n, n35, n3);
    CHECK(bad_text == 0, "%d of %d renders differ from the goldens", bad_text, n);
    CHECK(bad_ids == 0, "%d of %d renders tokenize differently", bad_ids, n);
    printf("chat goldens: %d conversations (%d Qwen3.5, %d Qwen3, %d template errors), %d text and %d id "
           "mismatches\n",
           n, n35, n3, errors, bad_text, bad_ids);
    cJSON_Delete(golds);
    free(cases);
    free(gold);
}

static void expect_dump(const char *json, const char *want_dump, const char *want_str) {
    cJSON *v;
    Err err;
    int rc = pyjson_parse(json, strlen(json), "test", &v, &err);
    CHECK(rc == 0, "parse %s: %s", json, err.msg);
    if (rc) return;
    StrBuf a = {0}, b = {0};
    pyjson_dump(&a, v);
    pyjson_str(&b, v);
    CHECK(a.p && !strcmp(a.p, want_dump), "dump %s: got [%s] want [%s]", json, a.p, want_dump);
    CHECK(b.p && !strcmp(b.p, want_str), "str %s: got [%s] want [%s]", json, b.p, want_str);
    sb_free(&a);
    sb_free(&b);
    cJSON_Delete(v);
}

static void check_pyjson(void) {
    expect_dump("1.0", "1.0", "1.0");
    expect_dump("-0", "0", "0");
    expect_dump("-0.0", "-0.0", "-0.0");
    expect_dump("007", "7", "7"); /* cJSON reads it; Python's json would not */
    expect_dump("1e-7", "1e-07", "1e-07");
    expect_dump("1E16", "1e+16", "1e+16");
    expect_dump("1e15", "1000000000000000.0", "1000000000000000.0");
    expect_dump("0.0001", "0.0001", "0.0001");
    expect_dump("0.00001", "1e-05", "1e-05");
    expect_dump("0.1", "0.1", "0.1");
    expect_dump("123456789012345678.0", "1.2345678901234568e+17", "1.2345678901234568e+17");
    expect_dump("1e400", "Infinity", "inf");
    StrBuf strict = {0};
    cJSON *big;
    Err perr;
    if (!pyjson_parse("[1e400, -1E+999, 1.5]", 21, "test", &big, &perr)) {
        pyjson_dump_strict(&strict, big);
        cJSON_Delete(big);
    }
    CHECK(strict.p && !strcmp(strict.p, "[1e400, -1E+999, 1.5]"), "strict dump keeps out-of-range literals: [%s]",
          strict.p);
    sb_free(&strict);
    expect_dump("12345678901234567890", "12345678901234567890", "12345678901234567890");
    expect_dump("true", "true", "True");
    expect_dump("null", "null", "None");
    expect_dump("\"a\\u0001\\u007f\\\"\\\\\\n\\/é\\ud83d\\ude00\"", "\"a\\u0001\x7f\\\"\\\\\\n/é😀\"",
                "a\x01\x7f\"\\\n/é😀");
    expect_dump("{\"b\": [1, {\"c\": 2.50}], \"a\": \"x\", \"b\": 3}", "{\"b\": 3, \"a\": \"x\"}",
                "{\"b\": 3, \"a\": \"x\"}");
    expect_dump(" [ ] ", "[]", "[]");
    cJSON *v;
    Err err;
    CHECK(pyjson_parse("[1,", 3, "x", &v, &err) == Q35_ERR_FORMAT, "truncated JSON rejected");
    CHECK(pyjson_parse("[1] x", 5, "x", &v, &err) == Q35_ERR_FORMAT, "trailing bytes rejected");
}

/* API-level checks the goldens cannot express. */
static void check_api(void) {
    ChatFormat f = {Q35_TOK_QWEN35, Q35_THINK_OFF};
    Q35ChatMessage m[] = {{.role = "user", .content = "hi"}};
    Q35ChatRequest rq = {.messages = m, .n_messages = 1, .tools = "{\"not\": \"array\"}"};
    char *out;
    Err err;
    CHECK(chat_render_request(&f, &rq, &out, &err) == Q35_ERR_FORMAT, "tools must be an array");
    rq.tools = "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";
    rq.tool_choice = Q35_TOOL_CHOICE_FUNCTION;
    rq.tool_choice_name = "g";
    CHECK(chat_render_request(&f, &rq, &out, &err) == Q35_ERR_ARG, "tool_choice names an unknown function");
    rq.tool_choice_name = "f";
    CHECK(chat_render_request(&f, &rq, &out, &err) == 0, "tool_choice names a known function: %s", err.msg);
    free(out);
    Q35ChatToolCall bad = {.name = "f", .arguments = "[1, 2]"};
    Q35ChatMessage m2[] = {{.role = "user", .content = "hi"},
                           {.role = "assistant", .tool_calls = &bad, .n_tool_calls = 1}};
    rq = (Q35ChatRequest){.messages = m2, .n_messages = 2};
    CHECK(chat_render_request(&f, &rq, &out, &err) == Q35_ERR_ARG, "Qwen3.5: array arguments rejected");
    bad.arguments = "{\"a\": ";
    CHECK(chat_render_request(&f, &rq, &out, &err) == Q35_ERR_FORMAT, "malformed arguments rejected");
    bad.arguments = "[1, 2]";
    f.family = Q35_TOK_QWEN3;
    CHECK(chat_render_request(&f, &rq, &out, &err) == 0, "Qwen3: tojson of any arguments");
    CHECK(strstr(out, "\"arguments\": [1, 2]}") != NULL, "Qwen3 arguments dumped: %s", out);
    free(out);
    CHECK(q35_chat_render_request(NULL, &rq, &out, &err) == Q35_ERR_ARG, "no tokenizer and no family");
    rq.family = Q35_TOK_QWEN35;
    bad.arguments = "{\"x\": 1}";
    CHECK(q35_chat_render_request(NULL, &rq, &out, &err) == 0, "family without tokenizer: %s", err.msg);
    free(out);
}

int main(void) {
    check_pyjson();
    check_api();
    Tokenizer *t;
    Err err;
    int rc = q35_tokenizer_load(&t, ".cache/qwen3-tokenizer", &err);
    CHECK(rc == 0, "Qwen3 tokenizer (run scripts/fetch_tokenizer.sh): %s", err.msg);
    if (!rc) {
        check_goldens(t);
        q35_tokenizer_free(t);
    }
    return TEST_SUMMARY("chat_tools");
}
