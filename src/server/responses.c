/* responses.c — POST /v1/responses (responses.h): the Responses API request as a chat completions request, and the
 * response object and stream events, through cJSON. The translation:
 *   instructions -> a system message first; input (a string: one user message; or items):
 *     message {role user / system / developer / assistant, content: string or input_text / output_text parts}
 *       -> that message (developer as system);
 *     function_call {call_id, name, arguments} -> a tool call of the assistant message before it (a new, empty one
 *       when the item before was not an assistant's);
 *     function_call_output {call_id, output} -> a tool message;
 *     reasoning {content: reasoning_text parts, or summary} -> reasoning_content of the next assistant message;
 *   tools [{type function, name, description, parameters, strict}] -> chat's {type, function: {...}};
 *   tool_choice "auto" / "none" / "required" / {type function, name}; text.format -> response_format;
 *   reasoning.effort "none" / "minimal" -> thinking off, any other effort -> on (absent: the server's default);
 *   max_output_tokens -> max_tokens; temperature, top_p, parallel_tool_calls, stream, and the chat path's
 *   extensions (top_k, min_p, penalties, seed, stop, ...) as they are.
 * Refused with a 400 naming the field: previous_response_id, conversation, background, a stored prompt,
 * item_reference and non-text items, non-function tools, truncation "auto": this server keeps nothing between
 * requests. include "message.output_text.logprobs" turns on the text's logprobs (with top_logprobs alternatives);
 * store, metadata, user, other includes and the like are accepted and ignored. */
#include "server/responses.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyjson.h"
#include "server/translate.h"

static const char *const MSG_PARTS[] = {"input_text", "output_text", "text", NULL};
static const char *const REASONING_PARTS[] = {"reasoning_text", NULL};
static const char *const SUMMARY_PARTS[] = {"summary_text", NULL};
static const char *const OUTPUT_PARTS[] = {"input_text", "output_text", NULL};

/* input -> chat messages (after the instructions' system message). */
static int input_messages(const cJSON *input, cJSON *msgs, OaiError *e) {
    if (cJSON_IsString(input)) return tr_add_message(msgs, "user", input->valuestring) ? 0 : tr_oom(e);
    if (!cJSON_IsArray(input) || cJSON_GetArraySize(input) == 0)
        return tr_bad(e, "input", "must be a string or a non-empty array of items");
    cJSON *assistant = NULL; /* the assistant message a function_call joins */
    char *reasoning = NULL;  /* a reasoning item's text, for the next assistant message */
    const cJSON *it;
    int i = 0, rc = 0;
    char param[80];
    cJSON_ArrayForEach(it, input) {
        snprintf(param, sizeof param, "input[%d]", i);
        if (!cJSON_IsObject(it)) {
            rc = tr_bad(e, param, "must be an object");
            break;
        }
        const cJSON *type = tr_field(it, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : type ? "" : "message";
        char *text = NULL;
        if (!strcmp(t, "message")) {
            const cJSON *role = tr_field(it, "role");
            snprintf(param, sizeof param, "input[%d].role", i);
            const char *r = cJSON_IsString(role) ? role->valuestring : "";
            if (!strcmp(r, "developer")) r = "system";
            if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "assistant")) {
                rc = tr_bad(e, param, "must be one of user, system, developer, assistant");
                break;
            }
            snprintf(param, sizeof param, "input[%d].content", i);
            const cJSON *c = tr_field(it, "content");
            if (!c) {
                rc = tr_bad(e, param, "is required");
                break;
            }
            if ((rc = tr_parts_text(c, MSG_PARTS, param, &text, e))) break;
            cJSON *m = tr_add_message(msgs, r, text);
            if (m && !strcmp(r, "assistant") && reasoning &&
                !cJSON_AddStringToObject(m, "reasoning_content", reasoning))
                m = NULL;
            if (!m) {
                free(text);
                rc = tr_oom(e);
                break;
            }
            if (!strcmp(r, "assistant")) {
                free(reasoning);
                reasoning = NULL;
            }
            assistant = strcmp(r, "assistant") ? NULL : m;
        } else if (!strcmp(t, "function_call")) {
            const cJSON *id = tr_field(it, "call_id"), *name = tr_field(it, "name"), *args = tr_field(it, "arguments");
            const char *f = !cJSON_IsString(id) || !id->valuestring[0]       ? "call_id"
                            : !cJSON_IsString(name) || !name->valuestring[0] ? "name"
                            : !cJSON_IsString(args)                          ? "arguments"
                                                                             : NULL;
            if (f) {
                snprintf(param, sizeof param, "input[%d].%s", i, f);
                rc = tr_bad(e, param, "must be a non-empty string (arguments: the call's JSON text)");
                break;
            }
            if (!assistant) {
                assistant = tr_add_message(msgs, "assistant", "");
                if (assistant && reasoning && !cJSON_AddStringToObject(assistant, "reasoning_content", reasoning))
                    assistant = NULL;
                free(reasoning);
                reasoning = NULL;
                if (!assistant) {
                    rc = tr_oom(e);
                    break;
                }
            }
            cJSON *calls = cJSON_GetObjectItemCaseSensitive(assistant, "tool_calls");
            if (!calls) calls = cJSON_AddArrayToObject(assistant, "tool_calls");
            cJSON *c = cJSON_CreateObject();
            cJSON *fn =
                c && cJSON_AddStringToObject(c, "id", id->valuestring) && cJSON_AddStringToObject(c, "type", "function")
                    ? cJSON_AddObjectToObject(c, "function")
                    : NULL;
            if (!calls || !fn || !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
                !cJSON_AddStringToObject(fn, "arguments", args->valuestring)) {
                cJSON_Delete(c);
                rc = tr_oom(e);
                break;
            }
            cJSON_AddItemToArray(calls, c);
        } else if (!strcmp(t, "function_call_output")) {
            const cJSON *id = tr_field(it, "call_id"), *out = tr_field(it, "output");
            if (!cJSON_IsString(id) || !id->valuestring[0]) {
                snprintf(param, sizeof param, "input[%d].call_id", i);
                rc = tr_bad(e, param, "must be a non-empty string");
                break;
            }
            snprintf(param, sizeof param, "input[%d].output", i);
            if (!out) {
                rc = tr_bad(e, param, "is required");
                break;
            }
            if ((rc = tr_parts_text(out, OUTPUT_PARTS, param, &text, e))) break;
            cJSON *m = tr_add_message(msgs, "tool", text);
            if (!m || !cJSON_AddStringToObject(m, "tool_call_id", id->valuestring)) {
                free(text);
                rc = tr_oom(e);
                break;
            }
            assistant = NULL;
        } else if (!strcmp(t, "reasoning")) {
            const cJSON *c = tr_field(it, "content"), *s = tr_field(it, "summary");
            snprintf(param, sizeof param, "input[%d].%s", i, c ? "content" : "summary");
            if ((rc = c || s ? tr_parts_text(c ? c : s, c ? REASONING_PARTS : SUMMARY_PARTS, param, &text, e)
                      : (text = strdup("")) ? 0
                                            : tr_oom(e)))
                break;
            free(reasoning);
            reasoning = text;
            text = NULL;
        } else {
            snprintf(param, sizeof param, "input[%d].type", i);
            rc = tr_bad(e, param,
                        !strcmp(t, "item_reference")
                            ? "item_reference is not supported (this server stores no items: send them whole)"
                            : "must be message, function_call, function_call_output or reasoning");
            break;
        }
        free(text);
        i++;
    }
    free(reasoning);
    return rc;
}

static int translate_tools(const cJSON *tools, cJSON *chat, OaiError *e) {
    static const char *const keys[][2] = {
        {"name", "name"}, {"description", "description"}, {"parameters", "parameters"}, {"strict", "strict"}};
    return tr_tools(tools, chat, "function", 0,
                    "must be {\"type\": \"function\", \"name\", ...} (no built-in tools here)", keys, 4, e);
}

static int translate_tool_choice(const cJSON *tc, cJSON *chat, OaiError *e) {
    if (cJSON_IsString(tc)) return tr_put(chat, "tool_choice", tc) ? tr_oom(e) : 0; /* validated by the chat parser */
    const cJSON *type = tr_field(tc, "type"), *name = tr_field(tc, "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
        return tr_bad(e, "tool_choice",
                      "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\"}");
    cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice"), *fn = c ? cJSON_AddObjectToObject(c, "function") : NULL;
    if (!fn || !cJSON_AddStringToObject(c, "type", "function") ||
        !cJSON_AddStringToObject(fn, "name", name->valuestring))
        return tr_oom(e);
    return 0;
}

static int translate_format(const cJSON *text, cJSON *chat, OaiError *e) {
    if (!cJSON_IsObject(text)) return tr_bad(e, "text", "must be an object");
    const cJSON *f = tr_field(text, "format");
    if (!f) return 0;
    const cJSON *type = tr_field(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(type))
        return tr_bad(e, "text.format", "must be an object with a \"type\"");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    if (!rf || !cJSON_AddStringToObject(rf, "type", type->valuestring)) return tr_oom(e);
    if (strcmp(type->valuestring, "json_schema")) return 0; /* text / json_object; others: the chat parser's 400 */
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    if (!js) return tr_oom(e);
    static const char *const keys[] = {"name", "schema", "strict", "description"};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = tr_field(f, keys[k]);
        cJSON *d = v ? cJSON_Duplicate(v, 1) : NULL;
        if (v && !d) return tr_oom(e);
        if (d) cJSON_AddItemToObject(js, keys[k], d);
    }
    return 0;
}

/* The settings echoed in the response object: as sent, or their defaults. */
static cJSON *echo_of(const cJSON *root) {
    cJSON *o = cJSON_CreateObject();
    static const char *const keys[][2] = {{"instructions", "null"},
                                          {"max_output_tokens", "null"},
                                          {"temperature", "null"},
                                          {"top_p", "null"},
                                          {"tools", "[]"},
                                          {"tool_choice", "\"auto\""},
                                          {"text", "{\"format\": {\"type\": \"text\"}}"},
                                          {"reasoning", "{\"effort\": null, \"summary\": null}"},
                                          {"metadata", "{}"},
                                          {"user", "null"},
                                          {"top_logprobs", "null"}};
    for (int k = 0; o && k < (int)(sizeof keys / sizeof keys[0]); k++) {
        const cJSON *v = tr_field(root, keys[k][0]);
        cJSON *d = v ? cJSON_Duplicate(v, 1) : cJSON_Parse(keys[k][1]);
        if (!d) {
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToObject(o, keys[k][0], d);
    }
    const cJSON *ptc = tr_field(root, "parallel_tool_calls");
    if (o && !cJSON_AddBoolToObject(o, "parallel_tool_calls", !cJSON_IsFalse(ptc))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The chat request for root (an object) into *chat. */
static int translate(const cJSON *root, cJSON **chat, OaiError *e) {
    static const char *const refused[][2] = {
        {"previous_response_id", "is not supported: this server stores no responses (send the conversation as input)"},
        {"conversation", "is not supported: this server stores no conversations (send the conversation as input)"},
        {"prompt", "(a stored prompt template) is not supported"}};
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
        if (tr_field(root, refused[k][0])) return tr_bad(e, refused[k][0], refused[k][1]);
    if (cJSON_IsTrue(tr_field(root, "background"))) return tr_bad(e, "background", "is not supported");
    const cJSON *tr = tr_field(root, "truncation");
    if (tr && (!cJSON_IsString(tr) || strcmp(tr->valuestring, "disabled")))
        return tr_bad(e, "truncation", "must be \"disabled\" (a prompt over the context is refused, not truncated)");
    const cJSON *inc = tr_field(root, "include"), *x;
    if (inc && !cJSON_IsArray(inc)) return tr_bad(e, "include", "must be an array of strings");
    int logprobs = 0; /* the text's logprobs, with top_logprobs alternatives (0 when absent) */
    cJSON_ArrayForEach(x, inc) logprobs |= cJSON_IsString(x) && !strcmp(x->valuestring, "message.output_text.logprobs");

    cJSON *c = *chat = cJSON_CreateObject();
    cJSON *msgs = c ? cJSON_AddArrayToObject(c, "messages") : NULL;
    if (!msgs) return tr_oom(e);
    const cJSON *ins = tr_field(root, "instructions"), *input = tr_field(root, "input");
    if (ins && !cJSON_IsString(ins)) return tr_bad(e, "instructions", "must be a string");
    if (ins && !tr_add_message(msgs, "system", ins->valuestring)) return tr_oom(e);
    if (!input) return tr_bad(e, "input", "is required");
    if (input_messages(input, msgs, e)) return -1;
    const cJSON *v;
    if ((v = tr_field(root, "tools")) && translate_tools(v, c, e)) return -1;
    if ((v = tr_field(root, "tool_choice")) && translate_tool_choice(v, c, e)) return -1;
    if ((v = tr_field(root, "text")) && translate_format(v, c, e)) return -1;
    if ((v = tr_field(root, "reasoning"))) {
        if (!cJSON_IsObject(v)) return tr_bad(e, "reasoning", "must be an object");
        const cJSON *eff = tr_field(v, "effort");
        if (eff && !cJSON_IsString(eff)) return tr_bad(e, "reasoning.effort", "must be a string");
        if (eff) {
            const int off = !strcmp(eff->valuestring, "none") || !strcmp(eff->valuestring, "minimal");
            cJSON *kw = cJSON_AddObjectToObject(c, "chat_template_kwargs");
            if (!kw || !cJSON_AddBoolToObject(kw, "enable_thinking", !off)) return tr_oom(e);
        }
    }
    if ((v = tr_field(root, "max_output_tokens")) && tr_put(c, "max_tokens", v)) return tr_oom(e);
    if (logprobs && !cJSON_AddBoolToObject(c, "logprobs", 1)) return tr_oom(e);
    if (logprobs && (v = tr_field(root, "top_logprobs")) && tr_put(c, "top_logprobs", v)) return tr_oom(e);
    if (((v = tr_field(root, "stop")) && tr_put(c, "stop", v)) ||
        ((v = tr_field(root, "parallel_tool_calls")) && tr_put(c, "parallel_tool_calls", v)))
        return tr_oom(e);
    return tr_chat_fields(root, c, e); /* the sampling fields, and the chat path's extensions */
}

int oai_parse_responses(const char *body, size_t len, int vocab, OaiRequest *r, OaiError *e) {
    memset(r, 0, sizeof *r);
    cJSON *root = NULL, *chat = NULL, *echo = NULL;
    if (oai_parse_body(body, len, &root, e)) return -1;
    int rc = translate(root, &chat, e);
    StrBuf et = {0};
    if (!rc) {
        echo = echo_of(root);
        if (echo) pyjson_dump_strict(&et, echo);
        if (!echo || et.oom || !et.p) rc = tr_oom(e);
    }
    /* the chat parser's params as the Responses API names them (messages' indices are not the input items') */
    static const TrRename names[] = {{"messages", "input", 1},
                                     {"max_tokens", "max_output_tokens", 0},
                                     {"response_format.json_schema", "text.format", 0},
                                     {"response_format", "text.format", 0},
                                     {"chat_template_kwargs.enable_thinking", "reasoning.effort", 0}};
    if (!rc) rc = tr_parse_chat(chat, vocab, r, names, sizeof names / sizeof names[0], e);
    if (!rc) {
        r->responses = 1;
        r->resp_echo = et.p;
        et.p = NULL;
    }
    sb_free(&et);
    cJSON_Delete(root);
    cJSON_Delete(chat);
    cJSON_Delete(echo);
    return rc;
}

/* ---- output ---- */

static const char *const ITEM_STATUS[3] = {"in_progress", "completed", "incomplete"};

static cJSON *text_part(const OaiRespItem *it) {
    cJSON *p = cJSON_CreateObject();
    const int message = it->type == OAI_ITEM_MESSAGE;
    cJSON_AddStringToObject(p, "type", message ? "output_text" : "reasoning_text");
    cJSON_AddStringToObject(p, "text", it->done && it->text ? it->text : "");
    if (message) {
        cJSON_AddItemToObject(p, "annotations", cJSON_CreateArray());
        cJSON_AddItemToObject(
            p, "logprobs", it->done ? oai_logprobs_array(it->lps, it->n_lps, OAI_PART_CONTENT) : cJSON_CreateArray());
    }
    return p;
}

static cJSON *item_json(const OaiRespItem *it) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", it->id);
    switch (it->type) {
    case OAI_ITEM_REASONING:
        cJSON_AddStringToObject(o, "type", "reasoning");
        cJSON_AddItemToObject(o, "summary", cJSON_CreateArray());
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "content"), it->done ? text_part(it) : NULL);
        break;
    case OAI_ITEM_MESSAGE:
        cJSON_AddStringToObject(o, "type", "message");
        cJSON_AddStringToObject(o, "role", "assistant");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "content"), it->done ? text_part(it) : NULL);
        break;
    default:
        cJSON_AddStringToObject(o, "type", "function_call");
        cJSON_AddStringToObject(o, "call_id", it->call_id);
        cJSON_AddStringToObject(o, "name", it->name);
        cJSON_AddStringToObject(o, "arguments", it->done && it->text ? it->text : "");
    }
    cJSON_AddStringToObject(o, "status", ITEM_STATUS[it->done >= 0 && it->done <= 2 ? it->done : 1]);
    return o;
}

static cJSON *resp_object(const OaiMeta *m, const OaiRequest *rq, const char *status, const OaiRespItem *items, int n,
                          const OaiUsage *u, const OaiError *err) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)m->created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddBoolToObject(o, "background", 0);
    if (err && err->status) {
        cJSON *x = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(x, "code", err->status >= 500 ? "server_error" : "invalid_prompt");
        cJSON_AddStringToObject(x, "message", err->message);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(status, "incomplete"))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    cJSON_AddStringToObject(o, "model", m->model);
    cJSON *out = cJSON_AddArrayToObject(o, "output");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(out, item_json(&items[i]));
    cJSON *echo = rq && rq->resp_echo ? cJSON_Parse(rq->resp_echo) : NULL;
    for (cJSON *x = echo ? echo->child : NULL; x;) {
        cJSON *next = x->next;
        cJSON_AddItemToObject(o, x->string, cJSON_DetachItemViaPointer(echo, x));
        x = next;
    }
    cJSON_Delete(echo);
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON_AddBoolToObject(o, "store", 0);
    cJSON_AddStringToObject(o, "truncation", "disabled");
    if (u) {
        cJSON *x = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(x, "input_tokens", u->prompt_tokens);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(x, "input_tokens_details"), "cached_tokens", u->cached_tokens);
        cJSON_AddNumberToObject(x, "output_tokens", u->completion_tokens);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(x, "output_tokens_details"), "reasoning_tokens",
                                u->reasoning_tokens);
        cJSON_AddNumberToObject(x, "total_tokens", u->prompt_tokens + u->completion_tokens);
    } else {
        cJSON_AddNullToObject(o, "usage");
    }
    return o;
}

static char *print(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *oai_resp_json(const OaiMeta *m, const OaiRequest *rq, const char *status, const OaiRespItem *items, int n,
                    const OaiUsage *u, const OaiError *err) {
    return print(resp_object(m, rq, status, items, n, u, err));
}

static cJSON *event(const char *type, int seq) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", seq);
    return o;
}

char *oai_resp_event_response(const char *type, int seq, const OaiMeta *m, const OaiRequest *rq, const char *status,
                              const OaiRespItem *items, int n, const OaiUsage *u, const OaiError *err) {
    cJSON *o = event(type, seq);
    cJSON_AddItemToObject(o, "response", resp_object(m, rq, status, items, n, u, err));
    return print(o);
}

char *oai_resp_event_item(const char *type, int seq, int output_index, const OaiRespItem *item) {
    cJSON *o = event(type, seq);
    cJSON_AddNumberToObject(o, "output_index", output_index);
    cJSON_AddItemToObject(o, "item", item_json(item));
    return print(o);
}

char *oai_resp_event_part(const char *type, int seq, int output_index, const OaiRespItem *item) {
    cJSON *o = event(type, seq);
    cJSON_AddStringToObject(o, "item_id", item->id);
    cJSON_AddNumberToObject(o, "output_index", output_index);
    cJSON_AddNumberToObject(o, "content_index", 0);
    cJSON_AddItemToObject(o, "part", text_part(item));
    return print(o);
}

char *oai_resp_event_text(const char *type, int seq, int output_index, const OaiRespItem *item, const char *value,
                          const OaiTokenLogprob *lps, int n_lps) {
    cJSON *o = event(type, seq);
    cJSON_AddStringToObject(o, "item_id", item->id);
    cJSON_AddNumberToObject(o, "output_index", output_index);
    const size_t n = strlen(type);
    const int delta = n > 6 && !strcmp(type + n - 6, ".delta");
    if (item->type != OAI_ITEM_CALL) {
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddStringToObject(o, delta ? "delta" : "text", value);
        if (item->type == OAI_ITEM_MESSAGE)
            cJSON_AddItemToObject(o, "logprobs", oai_logprobs_array(lps, n_lps, OAI_PART_CONTENT));
    } else {
        cJSON_AddStringToObject(o, delta ? "delta" : "arguments", value);
        if (!delta) cJSON_AddStringToObject(o, "name", item->name);
    }
    return print(o);
}
