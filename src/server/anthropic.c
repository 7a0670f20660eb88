/* anthropic.c — POST /v1/messages and /v1/messages/count_tokens (anthropic.h): Anthropic's Messages API request as a
 * chat completions request, and the message object, stream events and error objects. The translation:
 *   system (a string or text blocks) -> a system message first;
 *   messages[i] role user: text blocks (or a string) -> a user message; tool_result blocks {tool_use_id, content:
 *     a string or text blocks} -> tool messages, in their order among the text;
 *   messages[i] role assistant: text -> content, thinking -> reasoning_content, tool_use {id, name, input} -> a tool
 *     call whose arguments are input's JSON text (redacted_thinking is dropped: it cannot be read);
 *   tools [{name, description, input_schema}] -> chat's {type function, function: {name, description,
 *     parameters}}; tool_choice {type auto / any / tool (name) / none, disable_parallel_tool_use} -> auto /
 *     required / the named function / none, parallel_tool_calls;
 *   thinking {type enabled (budget_tokens: not enforced) / adaptive} -> thinking on, {type disabled} -> off;
 *   max_tokens (required but for count_tokens), temperature, top_p, top_k, stop_sequences -> stop, stream, and the
 *   chat path's extensions (seed, min_p, penalties, logit_bias, stop_token_ids, ...) as they are.
 * Refused with a 400 naming the field: images and documents, server tools (a type other than "custom"),
 * mcp_servers, a container. metadata and service_tier are accepted and ignored. */
#include "server/anthropic.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyjson.h"
#include "server/translate.h"

static const char *const TEXT_BLOCK[] = {"text", NULL};

/* A user message's content: text (joined per run of text blocks) and tool results as tool messages, in order. */
static int user_message(const cJSON *content, int i, cJSON *msgs, OaiError *e) {
    char param[80];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (cJSON_IsString(content)) return tr_add_message(msgs, "user", content->valuestring) ? 0 : tr_oom(e);
    if (!cJSON_IsArray(content)) return tr_bad(e, param, "must be a string or an array of content blocks");
    StrBuf text = {0};
    int j = 0, rc = 0, any = 0; /* any: text blocks waiting in `text` */
    const cJSON *b;
    cJSON_ArrayForEach(b, content) {
        const cJSON *type = tr_field(b, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        snprintf(param, sizeof param, "messages[%d].content[%d]", i, j);
        if (!strcmp(t, "text")) {
            const cJSON *x = tr_field(b, "text");
            if (!cJSON_IsString(x)) {
                rc = tr_bad(e, param, "must be {\"type\": \"text\", \"text\": string}");
                break;
            }
            sb_puts(&text, x->valuestring);
            any = 1;
        } else if (!strcmp(t, "tool_result")) {
            const cJSON *id = tr_field(b, "tool_use_id"), *c = tr_field(b, "content");
            if (!cJSON_IsString(id) || !id->valuestring[0]) {
                snprintf(param, sizeof param, "messages[%d].content[%d].tool_use_id", i, j);
                rc = tr_bad(e, param, "must be a non-empty string");
                break;
            }
            if (any) { /* the text before it is a message of its own */
                if (!tr_add_message(msgs, "user", text.p ? text.p : "")) {
                    rc = tr_oom(e);
                    break;
                }
                sb_free(&text);
                text = (StrBuf){0};
                any = 0;
            }
            char *out = NULL;
            snprintf(param, sizeof param, "messages[%d].content[%d].content", i, j);
            if (!c)
                out = strdup("");
            else if ((rc = tr_parts_text(c, TEXT_BLOCK, param, &out, e)))
                break;
            cJSON *m = out ? tr_add_message(msgs, "tool", out) : NULL;
            free(out);
            if (!m || !cJSON_AddStringToObject(m, "tool_call_id", id->valuestring)) {
                rc = tr_oom(e);
                break;
            }
        } else {
            rc = tr_bad(e, param,
                        "must be a text or tool_result block (no images or documents: the model reads text only)");
            break;
        }
        j++;
    }
    if (!rc && (any || j == 0) && !tr_add_message(msgs, "user", text.p ? text.p : "")) rc = tr_oom(e);
    if (!rc && text.oom) rc = tr_oom(e);
    sb_free(&text);
    return rc;
}

/* An assistant message's content: text, thinking (reasoning_content) and tool_use blocks (its tool calls). */
static int assistant_message(const cJSON *content, int i, cJSON *msgs, OaiError *e) {
    char param[80];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (cJSON_IsString(content)) return tr_add_message(msgs, "assistant", content->valuestring) ? 0 : tr_oom(e);
    if (!cJSON_IsArray(content)) return tr_bad(e, param, "must be a string or an array of content blocks");
    StrBuf text = {0}, thinking = {0};
    cJSON *calls = cJSON_CreateArray();
    int j = 0, rc = calls ? 0 : tr_oom(e);
    const cJSON *b;
    for (b = rc ? NULL : content->child; b; b = b->next, j++) {
        const cJSON *type = tr_field(b, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        snprintf(param, sizeof param, "messages[%d].content[%d]", i, j);
        if (!strcmp(t, "text") || !strcmp(t, "thinking")) {
            const cJSON *x = tr_field(b, t); /* "text": {text}, "thinking": {thinking, signature} */
            if (!cJSON_IsString(x)) {
                rc = tr_bad(e, param, "needs a string with the block's text");
                break;
            }
            sb_puts(!strcmp(t, "text") ? &text : &thinking, x->valuestring);
        } else if (!strcmp(t, "redacted_thinking")) {
            continue;
        } else if (!strcmp(t, "tool_use")) {
            const cJSON *id = tr_field(b, "id"), *name = tr_field(b, "name"), *input = tr_field(b, "input");
            const char *f = !cJSON_IsString(id) || !id->valuestring[0]       ? "id"
                            : !cJSON_IsString(name) || !name->valuestring[0] ? "name"
                            : input && !cJSON_IsObject(input)                ? "input"
                                                                             : NULL;
            if (f) {
                snprintf(param, sizeof param, "messages[%d].content[%d].%s", i, j, f);
                rc = tr_bad(e, param, !strcmp(f, "input") ? "must be an object" : "must be a non-empty string");
                break;
            }
            StrBuf args = {0};
            if (input)
                pyjson_dump_strict(&args, input);
            else
                sb_puts(&args, "{}");
            cJSON *c = cJSON_CreateObject();
            cJSON *fn =
                c && cJSON_AddStringToObject(c, "id", id->valuestring) && cJSON_AddStringToObject(c, "type", "function")
                    ? cJSON_AddObjectToObject(c, "function")
                    : NULL;
            const int ok = fn && !args.oom && args.p && cJSON_AddStringToObject(fn, "name", name->valuestring) &&
                           cJSON_AddStringToObject(fn, "arguments", args.p);
            sb_free(&args);
            if (!ok) {
                cJSON_Delete(c);
                rc = tr_oom(e);
                break;
            }
            cJSON_AddItemToArray(calls, c);
        } else {
            rc = tr_bad(e, param, "must be a text, thinking or tool_use block");
            break;
        }
    }
    cJSON *m = rc ? NULL : tr_add_message(msgs, "assistant", text.p ? text.p : "");
    if (!rc && (!m || text.oom || thinking.oom ||
                (thinking.p && !cJSON_AddStringToObject(m, "reasoning_content", thinking.p))))
        rc = tr_oom(e);
    if (!rc && cJSON_GetArraySize(calls) > 0) {
        cJSON_AddItemToObject(m, "tool_calls", calls);
        calls = NULL;
    }
    cJSON_Delete(calls);
    sb_free(&text);
    sb_free(&thinking);
    return rc;
}

static int translate_tools(const cJSON *tools, cJSON *chat, OaiError *e) {
    static const char *const keys[][2] = {
        {"name", "name"}, {"description", "description"}, {"input_schema", "parameters"}};
    return tr_tools(tools, chat, "custom", 1,
                    "must be a client tool {name, description, input_schema} (no server tools here)", keys, 3, e);
}

static int translate_tool_choice(const cJSON *tc, cJSON *chat, OaiError *e) {
    const cJSON *type = tr_field(tc, "type"), *name = tr_field(tc, "name");
    const char *t = cJSON_IsObject(tc) && cJSON_IsString(type) ? type->valuestring : "";
    const cJSON *dp = tr_field(tc, "disable_parallel_tool_use");
    if (dp && !cJSON_IsBool(dp)) return tr_bad(e, "tool_choice.disable_parallel_tool_use", "must be a boolean");
    if (cJSON_IsTrue(dp) && !cJSON_AddBoolToObject(chat, "parallel_tool_calls", 0)) return tr_oom(e);
    static const char *const plain[][2] = {{"auto", "auto"}, {"any", "required"}, {"none", "none"}};
    for (int k = 0; k < 3; k++)
        if (!strcmp(t, plain[k][0])) return cJSON_AddStringToObject(chat, "tool_choice", plain[k][1]) ? 0 : tr_oom(e);
    if (strcmp(t, "tool"))
        return tr_bad(e, "tool_choice", "must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    if (!cJSON_IsString(name)) return tr_bad(e, "tool_choice.name", "must be a string");
    cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON *fn = c && cJSON_AddStringToObject(c, "type", "function") ? cJSON_AddObjectToObject(c, "function") : NULL;
    return fn && cJSON_AddStringToObject(fn, "name", name->valuestring) ? 0 : tr_oom(e);
}

/* The chat request for root into *chat. */
static int translate(const cJSON *root, int count, cJSON **chat, OaiError *e) {
    if (tr_field(root, "mcp_servers")) return tr_bad(e, "mcp_servers", "are not supported");
    if (tr_field(root, "container")) return tr_bad(e, "container", "is not supported");
    cJSON *c = *chat = cJSON_CreateObject();
    cJSON *msgs = c ? cJSON_AddArrayToObject(c, "messages") : NULL;
    if (!msgs) return tr_oom(e);
    const cJSON *sys = tr_field(root, "system"), *ms = tr_field(root, "messages"), *v;
    if (sys) {
        char *text = NULL;
        if (tr_parts_text(sys, TEXT_BLOCK, "system", &text, e)) return -1;
        cJSON *m = tr_add_message(msgs, "system", text);
        free(text);
        if (!m) return tr_oom(e);
    }
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0) return tr_bad(e, "messages", "must be a non-empty array");
    int i = 0;
    cJSON_ArrayForEach(v, ms) {
        char param[48];
        const cJSON *role = tr_field(v, "role"), *content = tr_field(v, "content");
        snprintf(param, sizeof param, "messages[%d].role", i);
        const char *r = cJSON_IsObject(v) && cJSON_IsString(role) ? role->valuestring : "";
        if (strcmp(r, "user") && strcmp(r, "assistant")) return tr_bad(e, param, "must be \"user\" or \"assistant\"");
        snprintf(param, sizeof param, "messages[%d].content", i);
        if (!content) return tr_bad(e, param, "is required");
        if (r[0] == 'u' ? user_message(content, i, msgs, e) : assistant_message(content, i, msgs, e)) return -1;
        i++;
    }
    if ((v = tr_field(root, "tools")) && translate_tools(v, c, e)) return -1;
    if ((v = tr_field(root, "tool_choice")) && translate_tool_choice(v, c, e)) return -1;
    if ((v = tr_field(root, "thinking"))) {
        const cJSON *type = tr_field(v, "type");
        const char *t = cJSON_IsObject(v) && cJSON_IsString(type) ? type->valuestring : "";
        if (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive"))
            return tr_bad(e, "thinking", "must be {\"type\": \"enabled\" | \"disabled\" | \"adaptive\"}");
        cJSON *kw = cJSON_AddObjectToObject(c, "chat_template_kwargs");
        if (!kw || !cJSON_AddBoolToObject(kw, "enable_thinking", strcmp(t, "disabled") != 0)) return tr_oom(e);
    }
    v = tr_field(root, "max_tokens");
    if (!v && !count) return tr_bad(e, "max_tokens", "is required");
    if (v && tr_put(c, "max_tokens", v)) return tr_oom(e);
    if ((v = tr_field(root, "stop_sequences"))) {
        if (!cJSON_IsArray(v)) return tr_bad(e, "stop_sequences", "must be an array of strings");
        if (tr_put(c, "stop", v)) return tr_oom(e);
    }
    return tr_chat_fields(root, c, e); /* the sampling fields, and the chat path's extensions */
}

int ant_parse_messages(const char *body, size_t len, int vocab, int count, OaiRequest *r, OaiError *e) {
    memset(r, 0, sizeof *r);
    cJSON *root = NULL, *chat = NULL;
    if (oai_parse_body(body, len, &root, e)) return -1;
    static const TrRename names[] = {{"stop", "stop_sequences", 0},
                                     {"chat_template_kwargs.enable_thinking", "thinking", 1},
                                     {"parallel_tool_calls", "tool_choice.disable_parallel_tool_use", 1}};
    int rc = translate(root, count, &chat, e);
    if (!rc) rc = tr_parse_chat(chat, vocab, r, names, sizeof names / sizeof names[0], e);
    if (!rc) r->anthropic = 1;
    cJSON_Delete(root);
    cJSON_Delete(chat);
    return rc;
}

/* ---- output ---- */

static char *print(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *ant_error_json(const OaiError *e) {
    const char *type = e->status == 401   ? "authentication_error"
                       : e->status == 403 ? "permission_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status == 413 ? "request_too_large"
                       : e->status == 429 ? "rate_limit_error"
                       : e->status == 503 ? "overloaded_error"
                       : e->status >= 500 ? "api_error"
                                          : "invalid_request_error";
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "error");
    cJSON *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "type", type);
    cJSON_AddStringToObject(x, "message", e->message);
    return print(o);
}

static const char *stop_reason(const AntStop *st) {
    if (st->stop_sequence) return "stop_sequence";
    if (!st->finish_reason) return "end_turn";
    if (!strcmp(st->finish_reason, "length")) return "max_tokens";
    if (!strcmp(st->finish_reason, "tool_calls")) return "tool_use";
    return "end_turn";
}

/* A content block; done: with its text / input (else empty, as content_block_start sends it). */
static cJSON *block_json(const OaiRespItem *it, int done) {
    cJSON *o = cJSON_CreateObject();
    const char *text = done && it->text ? it->text : "";
    switch (it->type) {
    case OAI_ITEM_REASONING:
        cJSON_AddStringToObject(o, "type", "thinking");
        cJSON_AddStringToObject(o, "thinking", text);
        cJSON_AddStringToObject(o, "signature", "");
        break;
    case OAI_ITEM_MESSAGE:
        cJSON_AddStringToObject(o, "type", "text");
        cJSON_AddStringToObject(o, "text", text);
        break;
    default: {
        cJSON_AddStringToObject(o, "type", "tool_use");
        cJSON_AddStringToObject(o, "id", it->call_id);
        cJSON_AddStringToObject(o, "name", it->name);
        cJSON *input = done ? cJSON_Parse(text) : NULL;
        if (!cJSON_IsObject(input)) { /* the chat parser's arguments are an object's text */
            cJSON_Delete(input);
            input = cJSON_CreateObject();
        }
        cJSON_AddItemToObject(o, "input", input);
    }
    }
    return o;
}

static cJSON *usage_json(const OaiUsage *u, int output_tokens) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "input_tokens", u->prompt_tokens - u->cached_tokens);
    cJSON_AddNumberToObject(x, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(x, "cache_read_input_tokens", u->cached_tokens);
    cJSON_AddNumberToObject(x, "output_tokens", output_tokens);
    return x;
}

static cJSON *message_object(const OaiMeta *m, const OaiRespItem *items, int n, const AntStop *st, const OaiUsage *u) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", m->model);
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(content, block_json(&items[i], 1));
    if (st) {
        cJSON_AddStringToObject(o, "stop_reason", stop_reason(st));
        if (st->stop_sequence)
            cJSON_AddStringToObject(o, "stop_sequence", st->stop_sequence);
        else
            cJSON_AddNullToObject(o, "stop_sequence");
    } else {
        cJSON_AddNullToObject(o, "stop_reason");
        cJSON_AddNullToObject(o, "stop_sequence");
    }
    cJSON_AddItemToObject(o, "usage", usage_json(u, st ? u->completion_tokens : 0));
    return o;
}

char *ant_message_json(const OaiMeta *m, const OaiRespItem *items, int n, const AntStop *st, const OaiUsage *u) {
    return print(message_object(m, items, n, st, u));
}

static cJSON *event(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

char *ant_event_start(const OaiMeta *m, const OaiUsage *u) {
    cJSON *o = event("message_start");
    cJSON_AddItemToObject(o, "message", message_object(m, NULL, 0, NULL, u));
    return print(o);
}

char *ant_event_block_start(int index, const OaiRespItem *item) {
    cJSON *o = event("content_block_start");
    cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddItemToObject(o, "content_block", block_json(item, 0));
    return print(o);
}

char *ant_event_block_delta(int index, const OaiRespItem *item, const char *value) {
    static const char *const kinds[3][2] = {
        {"thinking_delta", "thinking"}, {"text_delta", "text"}, {"input_json_delta", "partial_json"}};
    const int k = item->type >= 0 && item->type <= 2 ? item->type : 1;
    cJSON *o = event("content_block_delta"), *d;
    cJSON_AddNumberToObject(o, "index", index);
    d = cJSON_AddObjectToObject(o, "delta");
    cJSON_AddStringToObject(d, "type", kinds[k][0]);
    cJSON_AddStringToObject(d, kinds[k][1], value);
    return print(o);
}

char *ant_event_block_stop(int index) {
    cJSON *o = event("content_block_stop");
    cJSON_AddNumberToObject(o, "index", index);
    return print(o);
}

char *ant_event_delta(const AntStop *st, const OaiUsage *u) {
    cJSON *o = event("message_delta"), *d = cJSON_AddObjectToObject(o, "delta");
    cJSON_AddStringToObject(d, "stop_reason", stop_reason(st));
    if (st->stop_sequence)
        cJSON_AddStringToObject(d, "stop_sequence", st->stop_sequence);
    else
        cJSON_AddNullToObject(d, "stop_sequence");
    cJSON_AddItemToObject(o, "usage", usage_json(u, u->completion_tokens));
    return print(o);
}

char *ant_event_stop(void) { return print(event("message_stop")); }

char *ant_count_json(int n) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", n);
    return print(o);
}
