/* fuzz_request.c — libFuzzer target for the server's request parsers (src/server/openai.c, responses.c,
 * anthropic.c): request JSON -> validated parameters, and the JSON written back (build: make fuzz-request; run:
 * build/fuzz_request -runs=1000000 DIR, DIR a copy of tests/fuzz/request). The first input byte picks the endpoint
 * ("r": /v1/responses, "a": /v1/messages, "A": its count_tokens, else odd: chat, even: completions), the rest is the
 * body. Accepted requests must hold only values in their documented ranges; rejected ones must carry a 400 and an
 * error object that cJSON reads back with the same message. Any violation aborts. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"
#include "server/openai.h"
#include "server/responses.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "fuzz_request: %s:%d: %s\n", __FILE__, __LINE__, #c);                                      \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

enum { VOCAB = 151936 };

static void check_accepted(const OaiRequest *r, int kind) {
    REQUIRE(r->kind == kind);
    if (kind == OAI_CHAT) {
        REQUIRE(r->n_messages > 0 && r->messages);
        for (int i = 0; i < r->n_messages; i++) {
            const char *role = r->messages[i].role;
            REQUIRE(!strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "assistant") ||
                    !strcmp(role, "tool"));
            const OaiMessage *m = &r->messages[i];
            REQUIRE(m->content);
            REQUIRE(m->n_tool_calls == 0 || (!strcmp(role, "assistant") && m->tool_calls));
            for (int k = 0; k < m->n_tool_calls; k++) REQUIRE(m->tool_calls[k].name && m->tool_calls[k].name[0]);
        }
        /* tools: re-printed array that cJSON reads back, of n_tools function objects */
        REQUIRE(!r->tools == !r->n_tools);
        if (r->tools) {
            cJSON *t = cJSON_Parse(r->tools);
            REQUIRE(cJSON_IsArray(t) && cJSON_GetArraySize(t) == r->n_tools);
            cJSON_Delete(t);
        }
        REQUIRE(r->tool_choice >= Q35_TOOL_CHOICE_AUTO && r->tool_choice <= Q35_TOOL_CHOICE_FUNCTION);
        REQUIRE(r->tool_choice < Q35_TOOL_CHOICE_REQUIRED || r->n_tools > 0);
        REQUIRE((r->tool_choice == Q35_TOOL_CHOICE_FUNCTION) == !!r->tool_choice_name);
        if (r->tool_choice_name) REQUIRE(r->tools && strstr(r->tools, r->tool_choice_name));
    } else {
        REQUIRE(!r->tools && !r->tool_choice && !r->tool_choice_name);
        REQUIRE(!!r->prompt != (r->n_prompt_ids > 0));
        for (int i = 0; i < r->n_prompt_ids; i++) REQUIRE(r->prompt_ids[i] >= 0 && r->prompt_ids[i] < VOCAB);
    }
    REQUIRE(r->max_tokens == -1 || r->max_tokens >= 1);
    REQUIRE(!(r->set & OAI_SET_TEMPERATURE) || (r->temperature >= 0 && r->temperature <= 2));
    REQUIRE(!(r->set & OAI_SET_TOP_P) || (r->top_p > 0 && r->top_p <= 1));
    REQUIRE(!(r->set & OAI_SET_MIN_P) || (r->min_p >= 0 && r->min_p <= 1));
    REQUIRE(!(r->set & OAI_SET_REPETITION) || r->repetition_penalty > 0);
    REQUIRE(fabsf(r->presence_penalty) <= 2 && fabsf(r->frequency_penalty) <= 2);
    REQUIRE(r->top_k >= 0);
    REQUIRE(r->top_logprobs >= -1 && r->top_logprobs <= Q35_MAX_TOP_LOGPROBS);
    REQUIRE(r->n_stop >= 0 && r->n_stop <= OAI_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++) REQUIRE(r->stop[i] && r->stop[i][0]);
    REQUIRE(!r->include_usage || r->stream);
    REQUIRE(r->n >= 1 && r->n <= OAI_MAX_N);
    REQUIRE(r->n_prompts >= 1 && r->n * r->n_prompts <= OAI_MAX_CHOICES &&
            (kind == OAI_COMPLETION || r->n_prompts == 1));
    REQUIRE(!r->echo || kind == OAI_COMPLETION);
    REQUIRE(r->min_tokens >= 0 && (r->max_tokens < 0 || r->min_tokens <= r->max_tokens));
    REQUIRE(r->n_stop_ids >= 0 && r->n_stop_ids <= OAI_MAX_STOP);
    for (int i = 0; i < r->n_stop_ids; i++) REQUIRE(r->stop_ids[i] >= 0 && r->stop_ids[i] < VOCAB);
    /* logit_bias: distinct ids in the vocabulary, biases in [-100, 100] */
    REQUIRE(r->n_bias >= 0 && r->n_bias <= 1024 && (!r->n_bias || (r->bias_ids && r->bias)));
    for (int i = 0; i < r->n_bias; i++) {
        REQUIRE(r->bias_ids[i] >= 0 && r->bias_ids[i] < VOCAB && r->bias[i] >= -100 && r->bias[i] <= 100);
        for (int k = 0; k < i; k++) REQUIRE(r->bias_ids[k] != r->bias_ids[i]);
    }
    /* response_format: a schema that cJSON reads back, never with a forced tool call */
    if (r->response_schema) {
        cJSON *sc = cJSON_Parse(r->response_schema);
        REQUIRE(sc && (cJSON_IsObject(sc) || cJSON_IsBool(sc)));
        cJSON_Delete(sc);
        REQUIRE(r->tool_choice < Q35_TOOL_CHOICE_REQUIRED);
    }
    /* the request's own text goes back out through the response writer */
    OaiMeta m = {"id-0", 1, r->model ? r->model : "m"};
    OaiTokenLogprob lp = {r->n_stop ? r->stop[0] : "x", -0.5f, 1, {{"y", -1.0f}}};
    /* the first message's tool calls (if any) go back out as generated calls */
    OaiCallOut calls[4];
    int n_calls = 0;
    for (int k = 0; kind == OAI_CHAT && k < r->messages[0].n_tool_calls && n_calls < 4; k++)
        calls[n_calls++] = (OaiCallOut){k, r->messages[0].tool_calls[k].id, r->messages[0].tool_calls[k].name,
                                        r->messages[0].tool_calls[k].arguments};
    OaiOutput o = {.content = r->prompt ? r->prompt : (r->n_messages ? r->messages[0].content : ""),
                   .calls = calls,
                   .n_calls = n_calls,
                   .logprobs = &lp,
                   .n_logprobs = 1,
                   .want_logprobs = 1,
                   .finish_reason = n_calls ? "tool_calls" : "stop"};
    OaiUsage u = {1, 2, 0, 1};
    char *s = oai_response_json(kind, &m, &o, 1, &u);
    REQUIRE(s);
    cJSON *back = cJSON_Parse(s);
    REQUIRE(back);
    cJSON_Delete(back);
    free(s);
    s = oai_chunk_json(kind, &m, &o, 1, &u, 1);
    REQUIRE(s && (back = cJSON_Parse(s)));
    cJSON_Delete(back);
    free(s);
}

/* A /v1/responses request is a chat request with the settings to echo; its response object and events are JSON
 * that cJSON reads back. */
static void check_responses(const OaiRequest *r) {
    check_accepted(r, OAI_CHAT);
    REQUIRE(r->responses && r->resp_echo);
    cJSON *echo = cJSON_Parse(r->resp_echo);
    REQUIRE(cJSON_IsObject(echo));
    cJSON_Delete(echo);
    const OaiMessage *m = &r->messages[0];
    const OaiRespItem items[3] = {{OAI_ITEM_REASONING, "rs_0", m->reasoning ? m->reasoning : "", NULL, NULL, 1},
                                  {OAI_ITEM_MESSAGE, "msg_0", m->content, NULL, NULL, 2},
                                  {OAI_ITEM_CALL, "fc_0", m->n_tool_calls ? m->tool_calls[0].arguments : "{}", "call_0",
                                   m->n_tool_calls ? m->tool_calls[0].name : "f", 1}};
    OaiMeta meta = {"resp_0", 1, r->model ? r->model : "m"};
    OaiUsage u = {1, 2, 0, 1};
    char *s[4] = {
        oai_resp_json(&meta, r, "completed", items, 3, &u, NULL),
        oai_resp_event_item("response.output_item.added", 0, 1, &items[1]),
        oai_resp_event_part("response.content_part.done", 1, 1, &items[1]),
        oai_resp_event_text("response.function_call_arguments.done", 2, 2, &items[2], items[2].text, NULL, 0)};
    for (int i = 0; i < 4; i++) {
        cJSON *back = s[i] ? cJSON_Parse(s[i]) : NULL;
        REQUIRE(back);
        cJSON_Delete(back);
        free(s[i]);
    }
}

/* A /v1/messages request is a chat request; its message object and events are JSON that cJSON reads back. */
static void check_messages(const OaiRequest *r) {
    check_accepted(r, OAI_CHAT);
    REQUIRE(r->anthropic);
    const OaiMessage *m = &r->messages[r->n_messages - 1];
    const OaiRespItem items[3] = {{OAI_ITEM_REASONING, "thk_0", m->reasoning ? m->reasoning : "", NULL, NULL, 1},
                                  {OAI_ITEM_MESSAGE, "txt_0", m->content, NULL, NULL, 1},
                                  {OAI_ITEM_CALL, "toolu_0", m->n_tool_calls ? m->tool_calls[0].arguments : "{}",
                                   "call_0", m->n_tool_calls ? m->tool_calls[0].name : "f", 1}};
    OaiMeta meta = {"msg_0", 1, r->model ? r->model : "m"};
    OaiUsage u = {3, 2, 1, 0};
    const AntStop st = {"length", r->n_stop ? r->stop[0] : NULL};
    char *s[4] = {ant_message_json(&meta, items, 3, &st, &u), ant_event_start(&meta, &u),
                  ant_event_block_delta(2, &items[2], items[2].text), ant_event_delta(&st, &u)};
    for (int i = 0; i < 4; i++) {
        cJSON *back = s[i] ? cJSON_Parse(s[i]) : NULL;
        REQUIRE(back);
        cJSON_Delete(back);
        free(s[i]);
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1) return 0;
    /* the seeds: "c..." chat, "d..." completions, "r..." responses, "a..." messages (Anthropic's), "A..." its
     * count_tokens */
    const int count = data[0] == 'A';
    int kind = data[0] == 'r'                     ? OAI_RESPONSES
               : data[0] == 'a' || data[0] == 'A' ? OAI_MESSAGES
               : data[0] & 1                      ? OAI_CHAT
                                                  : OAI_COMPLETION;
    OaiRequest r;
    OaiError e;
    memset(&e, 0, sizeof e);
    const char *body = (const char *)data + 1;
    const int rc = kind == OAI_RESPONSES  ? oai_parse_responses(body, size - 1, VOCAB, &r, &e)
                   : kind == OAI_MESSAGES ? ant_parse_messages(body, size - 1, VOCAB, count, &r, &e)
                                          : oai_parse_request(body, size - 1, kind, VOCAB, &r, &e);
    if (rc == 0) {
        if (kind == OAI_RESPONSES)
            check_responses(&r);
        else if (kind == OAI_MESSAGES)
            check_messages(&r);
        else
            check_accepted(&r, kind);
        oai_request_free(&r);
        return 0;
    }
    REQUIRE(e.status == 400 && e.type && e.message[0]);
    REQUIRE(!r.messages && !r.prompt && !r.prompt_ids && !r.model && r.n_stop == 0 && !r.tools && !r.tool_choice_name &&
            !r.resp_echo);
    char *s = kind == OAI_MESSAGES ? ant_error_json(&e) : oai_error_json(&e);
    REQUIRE(s);
    cJSON *back = cJSON_Parse(s), *err = cJSON_GetObjectItemCaseSensitive(back, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    REQUIRE(cJSON_IsString(msg) && !strcmp(msg->valuestring, e.message));
    cJSON_Delete(back);
    free(s);
    return 0;
}
