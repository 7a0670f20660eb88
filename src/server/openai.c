/* openai.c — OpenAI request JSON -> OaiRequest (validated: every bad field is a 400 naming it) and the
 * response / chunk / error JSON, all through cJSON. The body is read by pyjson_parse (one JSON value, nothing but
 * blanks after it; each number keeps its literal), so that the parts handed on as JSON text (tools, a tool call's
 * arguments given as an object, a response_format schema) are written back with their numbers as the client wrote
 * them: a template's tojson prints 1.0 as "1.0", where cJSON would print "1". Ranges follow OpenAI where it defines
 * one (temperature [0, 2], penalties [-2, 2], top_logprobs [0, 20], n = 1) and vLLM for its extensions (top_k,
 * min_p, repetition_penalty, ignore_eos, chat_template_kwargs). Unknown fields are ignored, as OpenAI's SDKs send
 * fields newer than any server. */
#include "server/openai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyjson.h"

int oai_fail(OaiError *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad(OaiError *e, const char *param, const char *what) {
    return oai_fail(e, 400, "invalid_request_error", NULL, param, "'%s' %s", param, what);
}

/* Field lookup: absent and JSON null read alike (SDKs send null for "not given"). */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(v) ? NULL : v;
}

static int get_bool(const cJSON *o, const char *name, int *out, OaiError *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad(e, name, "must be a boolean");
    *out = cJSON_IsTrue(v);
    return 1;
}

/* A number in [lo, hi]; returns 1 if present, 0 if absent, -1 on error. */
static int get_num(const cJSON *o, const char *name, double lo, double hi, float *out, OaiError *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        char what[96];
        snprintf(what, sizeof what, "must be a number in [%g, %g]", lo, hi);
        return bad(e, name, what);
    }
    *out = (float)v->valuedouble;
    return 1;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, int64_t *out, OaiError *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d) || d < lo || d > hi) {
        char what[96];
        snprintf(what, sizeof what, "must be an integer in [%.0f, %.0f]", lo, hi);
        return bad(e, name, what);
    }
    *out = (int64_t)d;
    return 1;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts (joined), or null. */
static int content_text(const cJSON *c, const char *param, char **out, OaiError *e) {
    if (!c) return (*out = strdup("")) ? 0 : oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (cJSON_IsString(c))
        return (*out = strdup(c->valuestring)) ? 0 : oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (!cJSON_IsArray(c)) return bad(e, param, "must be a string or an array of text parts");
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x))
            return bad(e, param, "parts must be {\"type\": \"text\", \"text\": string} (no images or audio)");
        len += strlen(x->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    len = 0;
    cJSON_ArrayForEach(p, c) {
        const char *x = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(x);
        memcpy(s + len, x, n);
        len += n;
    }
    s[len] = 0;
    *out = s;
    return 0;
}

static int oom(OaiError *e) { return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"); }

int oai_parse_body(const char *body, size_t len, cJSON **root, OaiError *e) {
    Err err;
    const int rc = pyjson_parse(body, len, "body", root, &err);
    if (rc == Q35_ERR_OOM) return oom(e);
    if (rc)
        return oai_fail(e, 400, "invalid_request_error", NULL, NULL, "the request body is not valid JSON (%s)",
                        err.msg);
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return oai_fail(e, 400, "invalid_request_error", NULL, NULL, "the request body must be a JSON object");
    }
    return 0;
}

/* v as JSON text (malloc'd; NULL out of memory), its numbers' literals kept (pyjson_parse). */
static char *json_text(const cJSON *v) {
    StrBuf b = {0};
    pyjson_dump_strict(&b, v);
    if (b.oom || !b.p) {
        sb_free(&b);
        return NULL;
    }
    return b.p;
}

/* One assistant tool_calls[k]: {"id"?, "type"?: "function", "function": {"name", "arguments"}}; arguments is
 * OpenAI's JSON string (kept as sent: the renderer reads it), an object is accepted too (re-printed). */
static int parse_call(const cJSON *c, const char *param, OaiToolCall *tc, OaiError *e) {
    if (!cJSON_IsObject(c)) return bad(e, param, "must be an object");
    const cJSON *id = field(c, "id"), *type = field(c, "type"), *fn = field(c, "function");
    if (id && !cJSON_IsString(id)) return bad(e, param, "has an 'id' that is not a string");
    if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function")))
        return bad(e, param, "must have \"type\": \"function\"");
    if (!cJSON_IsObject(fn)) return bad(e, param, "needs a 'function' object");
    const cJSON *name = field(fn, "name"), *args = field(fn, "arguments");
    if (!cJSON_IsString(name) || !name->valuestring[0]) return bad(e, param, "needs a non-empty 'function.name'");
    if (args && !cJSON_IsString(args) && !cJSON_IsObject(args))
        return bad(e, param, "has 'function.arguments' that is neither a JSON string nor an object");
    if (id && !(tc->id = strdup(id->valuestring))) return oom(e);
    if (!(tc->name = strdup(name->valuestring))) return oom(e);
    if (args && !(tc->arguments = cJSON_IsString(args) ? strdup(args->valuestring) : json_text(args))) return oom(e);
    return 0;
}

/* An assistant message's tool_calls and a tool message's tool_call_id (message i). */
static int parse_message_tools(const cJSON *m, int i, OaiMessage *om, OaiError *e) {
    char param[64];
    const cJSON *calls = field(m, "tool_calls"), *tcid = field(m, "tool_call_id");
    if (calls) {
        snprintf(param, sizeof param, "messages[%d].tool_calls", i);
        if (strcmp(om->role, "assistant")) return bad(e, param, "are only allowed in an assistant message");
        if (!cJSON_IsArray(calls)) return bad(e, param, "must be an array");
        int n = cJSON_GetArraySize(calls);
        if (n > 0 && !(om->tool_calls = calloc((size_t)n, sizeof *om->tool_calls))) return oom(e);
        const cJSON *c;
        cJSON_ArrayForEach(c, calls) {
            snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, om->n_tool_calls);
            if (parse_call(c, param, &om->tool_calls[om->n_tool_calls++], e)) return -1;
        }
    }
    if (tcid) {
        snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
        if (!cJSON_IsString(tcid)) return bad(e, param, "must be a string");
        if (!(om->tool_call_id = strdup(tcid->valuestring))) return oom(e);
    }
    return 0;
}

static int parse_messages(const cJSON *root, OaiRequest *r, OaiError *e) {
    const cJSON *ms = field(root, "messages");
    if (!ms) return bad(e, "messages", "is required");
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0) return bad(e, "messages", "must be a non-empty array");
    int n = cJSON_GetArraySize(ms);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, ms) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return bad(e, param, "must be an object");
        const cJSON *role = field(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) return bad(e, param, "must be a string");
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system"; /* OpenAI's newer name for the system role */
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))
            return bad(e, param, "must be one of system, developer, user, assistant, tool");
        OaiMessage *om = &r->messages[i];
        r->n_messages = ++i;
        if (!(om->role = strdup(rs))) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        snprintf(param, sizeof param, "messages[%d].content", i - 1);
        const cJSON *content = field(m, "content");
        if (!content && strcmp(rs, "assistant")) return bad(e, param, "is required");
        if (content_text(content, param, &om->content, e)) return -1;
        const cJSON *rc = field(m, "reasoning_content");
        if (rc) {
            snprintf(param, sizeof param, "messages[%d].reasoning_content", i - 1);
            if (!cJSON_IsString(rc)) return bad(e, param, "must be a string");
            if (!(om->reasoning = strdup(rc->valuestring)))
                return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        if (parse_message_tools(m, i - 1, om, e)) return -1;
    }
    return 0;
}

/* prompt: a string, an array of ids, or a one-element array of either (batches of prompts are not served). */
/* Token ids of p (a non-empty array of ids below vocab) into *ids (malloc'ed; NULL: only checked). */
static int prompt_ids(const cJSON *p, int vocab, const char *param, int **ids, int *n, OaiError *e) {
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return bad(e, param, "must be a string, a non-empty array of token ids, or an array of those");
    if (ids && !(*ids = malloc(sizeof(int) * (size_t)cJSON_GetArraySize(p))))
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *x;
    int k = 0;
    cJSON_ArrayForEach(x, p) {
        double d = cJSON_IsNumber(x) ? x->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d) || d < 0 || d >= vocab) {
            char what[96];
            snprintf(what, sizeof what, "must hold token ids in [0, %d)", vocab);
            return bad(e, param, what);
        }
        if (ids) (*ids)[k] = (int)d;
        k++;
    }
    if (n) *n = k;
    return 0;
}

/* prompt: a string, an array of ids, or (a list of prompts) an array of strings or of id arrays; prompt `at` of the
 * list into r (all of them checked), their count into r->n_prompts. */
static int parse_prompt(const cJSON *root, int vocab, int at, OaiRequest *r, OaiError *e) {
    const cJSON *p = field(root, "prompt");
    if (!p) return bad(e, "prompt", "is required");
    const int list = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0));
    r->n_prompts = list ? cJSON_GetArraySize(p) : 1;
    const cJSON *x, *all = list ? p : NULL;
    int i = 0;
    cJSON_ArrayForEach(x, all) { /* every prompt of a list: one kind, each well-formed */
        char param[32];
        snprintf(param, sizeof param, "prompt[%d]", i++);
        if (cJSON_IsString(x) != cJSON_IsString(cJSON_GetArrayItem(p, 0)))
            return bad(e, param, "is not of the first prompt's kind (all strings, or all arrays of token ids)");
        if (!cJSON_IsString(x) && prompt_ids(x, vocab, param, NULL, NULL, e)) return -1;
    }
    if (list) p = cJSON_GetArrayItem(p, at);
    if (!p) return bad(e, "prompt", "has fewer prompts than asked for");
    if (cJSON_IsString(p))
        return (r->prompt = strdup(p->valuestring)) ? 0 : oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return prompt_ids(p, vocab, "prompt", &r->prompt_ids, &r->n_prompt_ids, e);
}

static int parse_stop(const cJSON *root, OaiRequest *r, OaiError *e) {
    const cJSON *s = field(root, "stop");
    if (!s) return 0;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0]) return 0; /* "" stops nothing */
        if (!(r->stop[r->n_stop++] = strdup(s->valuestring)))
            return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return 0;
    }
    if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > OAI_MAX_STOP) {
        char what[96];
        snprintf(what, sizeof what, "must be a string or an array of at most %d strings", OAI_MAX_STOP);
        return bad(e, "stop", what);
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, s) {
        if (!cJSON_IsString(x)) return bad(e, "stop", "must hold only strings");
        if (!x->valuestring[0]) continue;
        if (!(r->stop[r->n_stop++] = strdup(x->valuestring)))
            return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

/* stop_token_ids (vLLM's): up to OAI_MAX_STOP ids in [0, vocab). */
static int parse_stop_ids(const cJSON *root, int vocab, OaiRequest *r, OaiError *e) {
    const cJSON *s = field(root, "stop_token_ids"), *x;
    if (!s) return 0;
    if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > OAI_MAX_STOP)
        return oai_fail(e, 400, "invalid_request_error", NULL, "stop_token_ids",
                        "'stop_token_ids' must be an array of at most %d token ids", OAI_MAX_STOP);
    cJSON_ArrayForEach(x, s) {
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble < vocab) ||
            x->valuedouble != floor(x->valuedouble))
            return oai_fail(e, 400, "invalid_request_error", NULL, "stop_token_ids",
                            "'stop_token_ids' must hold token ids in [0, %d)", vocab);
        r->stop_ids[r->n_stop_ids++] = (int)x->valuedouble;
    }
    return 0;
}

static int parse_sampling(const cJSON *root, OaiRequest *r, OaiError *e) {
    static const struct {
        const char *name;
        double lo, hi;
        size_t off;
        int flag;
    } nums[] = {
        {"temperature", 0, 2, offsetof(OaiRequest, temperature), OAI_SET_TEMPERATURE},
        {"top_p", 1e-9, 1, offsetof(OaiRequest, top_p), OAI_SET_TOP_P},
        {"min_p", 0, 1, offsetof(OaiRequest, min_p), OAI_SET_MIN_P},
        {"presence_penalty", -2, 2, offsetof(OaiRequest, presence_penalty), OAI_SET_PRESENCE},
        {"frequency_penalty", -2, 2, offsetof(OaiRequest, frequency_penalty), 0},
        {"repetition_penalty", 1e-6, 100, offsetof(OaiRequest, repetition_penalty), OAI_SET_REPETITION},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        int k = get_num(root, nums[i].name, nums[i].lo, nums[i].hi, (float *)((char *)r + nums[i].off), e);
        if (k < 0) return -1;
        if (k) r->set |= nums[i].flag;
    }
    int64_t v;
    int k = get_int(root, "top_k", -1, 1 << 24, &v, e);
    if (k < 0) return -1;
    if (k) {
        r->top_k = v < 0 ? 0 : (int)v;
        r->set |= OAI_SET_TOP_K;
    }
    if ((k = get_int(root, "seed", -9007199254740991.0, 9007199254740991.0, &v, e)) < 0) return -1;
    if (k) {
        r->seed = (uint64_t)v;
        r->set |= OAI_SET_SEED;
    }
    return 0;
}

static int parse_logprobs(const cJSON *root, OaiRequest *r, OaiError *e) {
    int64_t v;
    if (r->kind == OAI_COMPLETION) { /* legacy: logprobs is the number of alternatives */
        int k = get_int(root, "logprobs", 0, Q35_MAX_TOP_LOGPROBS, &v, e);
        if (k < 0) return -1;
        if (k) r->top_logprobs = (int)v;
        return 0;
    }
    int on = 0;
    if (get_bool(root, "logprobs", &on, e) < 0) return -1;
    int k = get_int(root, "top_logprobs", 0, Q35_MAX_TOP_LOGPROBS, &v, e);
    if (k < 0) return -1;
    if (k && !on) return bad(e, "top_logprobs", "needs \"logprobs\": true");
    if (on) r->top_logprobs = k ? (int)v : 0;
    return 0;
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}] (chat only);
 * tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name"}} naming one of them. */
static int parse_tools(const cJSON *root, OaiRequest *r, OaiError *e) {
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    if (r->kind != OAI_CHAT) {
        if (tools) return bad(e, "tools", "are only accepted by /v1/chat/completions");
        if (choice) return bad(e, "tool_choice", "is only accepted by /v1/chat/completions");
        return 0;
    }
    if (tools) {
        if (!cJSON_IsArray(tools)) return bad(e, "tools", "must be an array of function tools");
        const cJSON *t;
        int k = 0;
        cJSON_ArrayForEach(t, tools) {
            char param[64];
            snprintf(param, sizeof param, "tools[%d]", k++);
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            const cJSON *params = field(fn, "parameters");
            if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
                return bad(e, param, "must be {\"type\": \"function\", \"function\": {...}}");
            if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0])
                return bad(e, param, "needs a 'function' object with a non-empty 'name'");
            if (params && !cJSON_IsObject(params))
                return bad(e, param, "has 'function.parameters' that is not an object");
        }
        r->n_tools = k;
        if (k > 0 && !(r->tools = json_text(tools))) return oom(e);
    }
    if (!choice) return 0;
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (!strcmp(c, "auto"))
            r->tool_choice = Q35_TOOL_CHOICE_AUTO;
        else if (!strcmp(c, "none"))
            r->tool_choice = Q35_TOOL_CHOICE_NONE;
        else if (!strcmp(c, "required"))
            r->tool_choice = Q35_TOOL_CHOICE_REQUIRED;
        else
            return bad(e, "tool_choice", "must be \"auto\", \"none\", \"required\" or a function object");
    } else {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(choice) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
            !cJSON_IsString(name))
            return bad(e, "tool_choice",
                       "must be \"auto\", \"none\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        int found = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            found |= !strcmp(n->valuestring, name->valuestring);
        }
        if (!found) return bad(e, "tool_choice", "names a function that is not in 'tools'");
        r->tool_choice = Q35_TOOL_CHOICE_FUNCTION;
        if (!(r->tool_choice_name = strdup(name->valuestring))) return oom(e);
    }
    if (r->tool_choice >= Q35_TOOL_CHOICE_REQUIRED && !r->n_tools)
        return bad(e, "tool_choice", "needs a non-empty 'tools' array");
    return 0;
}

/* logit_bias: {"ID": bias, ...} with ID a token id (decimal, < vocab) and bias in [-100, 100] (OpenAI's range: -100
 * bans the id, 100 all but forces it), at most 1024 entries. */
static int parse_logit_bias(const cJSON *root, int vocab, OaiRequest *r, OaiError *e) {
    const cJSON *lb = field(root, "logit_bias"), *it;
    if (!lb) return 0;
    if (!cJSON_IsObject(lb)) return bad(e, "logit_bias", "must be an object of token ids to biases");
    const int n = cJSON_GetArraySize(lb);
    if (n > 1024) return bad(e, "logit_bias", "has more than 1024 entries");
    if (!n) return 0;
    r->bias_ids = malloc(sizeof(int) * (size_t)n);
    r->bias = malloc(sizeof(float) * (size_t)n);
    if (!r->bias_ids || !r->bias) return oom(e);
    cJSON_ArrayForEach(it, lb) {
        const char *key = it->string;
        size_t nd = strspn(key, "0123456789");
        long id = nd && nd <= 9 && !key[nd] ? strtol(key, NULL, 10) : -1; /* decimal digits only */
        if (id < 0 || id >= vocab)
            return oai_fail(e, 400, "invalid_request_error", NULL, "logit_bias",
                            "'logit_bias' key '%.40s' is not a token id in [0, %d)", key, vocab);
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return oai_fail(e, 400, "invalid_request_error", NULL, "logit_bias",
                            "'logit_bias' value for %ld must be a number in [-100, 100]", id);
        int k = 0; /* an id given twice ("5", "05"): the last value, as a JSON object read into a dict keeps */
        while (k < r->n_bias && r->bias_ids[k] != (int)id) k++;
        r->bias_ids[k] = (int)id;
        r->bias[k] = (float)it->valuedouble;
        r->n_bias += k == r->n_bias;
    }
    return 0;
}

/* response_format: {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "json_schema": {"name",
 * "schema", "strict"}} (no schema: any JSON value). The schema itself is checked where the guide compiles it. */
static int parse_response_format(const cJSON *root, OaiRequest *r, OaiError *e) {
    const cJSON *rf = field(root, "response_format");
    if (!rf) return 0;
    const cJSON *type = field(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return bad(e, "response_format", "must be an object with a 'type'");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        if (!(r->response_schema = strdup("{\"type\": \"object\"}"))) return oom(e);
        return 0;
    }
    if (strcmp(t, "json_schema"))
        return bad(e, "response_format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
    const cJSON *js = field(rf, "json_schema");
    if (!cJSON_IsObject(js)) return bad(e, "response_format.json_schema", "must be an object");
    const cJSON *name = field(js, "name"), *schema = field(js, "schema"), *strict = field(js, "strict");
    if (name && !cJSON_IsString(name)) return bad(e, "response_format.json_schema.name", "must be a string");
    if (strict && !cJSON_IsBool(strict)) return bad(e, "response_format.json_schema.strict", "must be a boolean");
    if (schema && !cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return bad(e, "response_format.json_schema.schema", "must be a JSON Schema (an object)");
    if (!(r->response_schema = schema ? json_text(schema) : strdup("true"))) return oom(e);
    return 0;
}

static int parse_fields(const cJSON *root, int vocab, int at, OaiRequest *r, OaiError *e) {
    const cJSON *model = field(root, "model");
    if (model) {
        if (!cJSON_IsString(model)) return bad(e, "model", "must be a string");
        if (!(r->model = strdup(model->valuestring)))
            return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    r->n_prompts = 1;
    if (r->kind == OAI_CHAT ? parse_messages(root, r, e) : parse_prompt(root, vocab, at, r, e)) return -1;
    if (get_bool(root, "stream", &r->stream, e) < 0) return -1;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return bad(e, "stream_options", "must be an object");
        if (!r->stream) return bad(e, "stream_options", "is only allowed with \"stream\": true");
        if (get_bool(so, "include_usage", &r->include_usage, e) < 0) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return -1;
        }
    }
    int64_t v;
    int k;
    r->n = 1;
    if ((k = get_int(root, "n", 1, OAI_MAX_N, &v, e)) < 0) return -1;
    if (k) r->n = (int)v;
    if (r->n * r->n_prompts > OAI_MAX_CHOICES) {
        char what[96];
        snprintf(what, sizeof what, "times the %d prompts must be at most %d choices", r->n_prompts, OAI_MAX_CHOICES);
        return bad(e, "n", what);
    }
    if ((k = get_int(root, "best_of", 1, OAI_MAX_N, &v, e)) < 0) return -1;
    if (k && v != r->n) return bad(e, "best_of", "must equal 'n' (the best of more drawn choices is not supported)");
    if ((k = get_int(root, "max_completion_tokens", 1, 2147483647.0, &v, e)) < 0) return -1;
    if (k) r->max_tokens = (int)v;
    if ((k = get_int(root, "max_tokens", 1, 2147483647.0, &v, e)) < 0) return -1;
    if (k) r->max_tokens = (int)v;
    if (parse_sampling(root, r, e) || parse_stop(root, r, e) || parse_stop_ids(root, vocab, r, e) ||
        parse_logprobs(root, r, e))
        return -1;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) < 0) return -1;
    if ((k = get_int(root, "min_tokens", 0, 2147483647.0, &v, e)) < 0) return -1;
    if (k) r->min_tokens = (int)v;
    if (r->max_tokens > 0 && r->min_tokens > r->max_tokens)
        return bad(e, "min_tokens", "must not be more than max_tokens");
    int parallel = 1;
    if (get_bool(root, "parallel_tool_calls", &parallel, e) < 0) return -1;
    r->one_call = !parallel;
    if (get_bool(root, "echo", &r->echo, e) < 0) return -1;
    if (r->echo && r->kind == OAI_CHAT) return bad(e, "echo", "is for completions only");
    const cJSON *suffix = field(root, "suffix"); /* completions: text after the insertion (fill-in-the-middle) */
    if (suffix && (!cJSON_IsString(suffix) || suffix->valuestring[0])) return bad(e, "suffix", "is not supported");
    if (parse_tools(root, r, e) || parse_response_format(root, r, e) || parse_logit_bias(root, vocab, r, e)) return -1;
    if (r->response_schema && r->tool_choice >= Q35_TOOL_CHOICE_REQUIRED)
        return bad(e, "response_format", "does not go with tool_choice \"required\" or a named function");
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (kw) {
        if (!cJSON_IsObject(kw)) return bad(e, "chat_template_kwargs", "must be an object");
        int on;
        k = get_bool(kw, "enable_thinking", &on, e);
        if (k < 0) {
            snprintf(e->param, sizeof e->param, "chat_template_kwargs.enable_thinking");
            return -1;
        }
        if (k) r->thinking = on ? Q35_THINK_ON : Q35_THINK_OFF;
    }
    return 0;
}

int oai_parse_request(const char *body, size_t len, int kind, int vocab, OaiRequest *r, OaiError *e) {
    return oai_parse_request_at(body, len, kind, vocab, 0, r, e);
}

int oai_parse_request_at(const char *body, size_t len, int kind, int vocab, int at, OaiRequest *r, OaiError *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->top_logprobs = -1;
    r->thinking = Q35_THINK_DEFAULT;
    cJSON *root;
    if (oai_parse_body(body, len, &root, e)) return -1;
    int rc = parse_fields(root, vocab, at, r, e);
    cJSON_Delete(root);
    if (rc) oai_request_free(r);
    return rc;
}

void oai_request_free(OaiRequest *r) {
    for (int i = 0; i < r->n_messages; i++) {
        OaiMessage *m = &r->messages[i];
        free(m->role);
        free(m->content);
        free(m->reasoning);
        for (int k = 0; k < m->n_tool_calls; k++) {
            free(m->tool_calls[k].id);
            free(m->tool_calls[k].name);
            free(m->tool_calls[k].arguments);
        }
        free(m->tool_calls);
        free(m->tool_call_id);
    }
    free(r->tools);
    free(r->tool_choice_name);
    free(r->response_schema);
    free(r->bias_ids);
    free(r->bias);
    free(r->messages);
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    free(r->resp_echo);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* ---- output ---- */

static char *print(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *oai_error_json(const OaiError *e) {
    cJSON *o = cJSON_CreateObject(), *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "message", e->message);
    cJSON_AddStringToObject(x, "type", e->type ? e->type : "server_error");
    if (e->param[0])
        cJSON_AddStringToObject(x, "param", e->param);
    else
        cJSON_AddNullToObject(x, "param");
    if (e->code)
        cJSON_AddStringToObject(x, "code", e->code);
    else
        cJSON_AddNullToObject(x, "code");
    return print(o);
}

/* A token's UTF-8 bytes, as numbers. */
static cJSON *bytes_array(const char *s) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

cJSON *oai_logprobs_array(const OaiTokenLogprob *lps, int n, int part) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        const OaiTokenLogprob *t = &lps[i];
        if (part >= 0 && t->part != part) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "token", t->token);
        cJSON_AddNumberToObject(x, "logprob", t->logprob);
        cJSON_AddItemToObject(x, "bytes", bytes_array(t->token));
        cJSON *top = cJSON_AddArrayToObject(x, "top_logprobs");
        for (int j = 0; j < t->n_top; j++) {
            cJSON *y = cJSON_CreateObject();
            cJSON_AddStringToObject(y, "token", t->top[j].token);
            cJSON_AddNumberToObject(y, "logprob", t->top[j].logprob);
            cJSON_AddItemToObject(y, "bytes", bytes_array(t->top[j].token));
            cJSON_AddItemToArray(top, y);
        }
        cJSON_AddItemToArray(a, x);
    }
    return a;
}

/* Chat: {"content": [every token's entry]}. */
static cJSON *chat_logprobs(const OaiOutput *o) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddItemToObject(lp, "content", oai_logprobs_array(o->logprobs, o->n_logprobs, -1));
    return lp;
}

/* Completions (legacy): {"tokens","token_logprobs","top_logprobs":[{tok: lp}],"text_offset"} (an entry with a NAN
 * logprob, an echoed prompt's first token, has null for both); text_offset counts
 * bytes from the start of this choice's text (offset: bytes already sent before this chunk). */
static cJSON *completion_logprobs(const OaiOutput *o, size_t offset) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *lps = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs"), *offs = cJSON_AddArrayToObject(lp, "text_offset");
    for (int i = 0; i < o->n_logprobs; i++) {
        const OaiTokenLogprob *t = &o->logprobs[i];
        cJSON_AddItemToArray(toks, cJSON_CreateString(t->token));
        if (isnan(t->logprob)) { /* a prompt's first token (echo): no logprob, no alternatives */
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
            offset += strlen(t->token);
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t->logprob));
        cJSON *top = cJSON_CreateObject();
        for (int j = 0; j < t->n_top; j++)
            if (!cJSON_GetObjectItemCaseSensitive(top, t->top[j].token))
                cJSON_AddNumberToObject(top, t->top[j].token, t->top[j].logprob);
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        offset += strlen(t->token);
    }
    return lp;
}

static cJSON *usage_json(const OaiUsage *u) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(x, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(x, "total_tokens", u->prompt_tokens + u->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(x, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    d = cJSON_AddObjectToObject(x, "completion_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "reasoning_tokens", u->reasoning_tokens);
    return x;
}

static cJSON *envelope(int kind, const OaiMeta *m, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)m->created);
    cJSON_AddStringToObject(o, "model", m->model);
    (void)kind;
    return o;
}

static void finish(cJSON *choice, const OaiOutput *o) {
    if (o->finish_reason)
        cJSON_AddStringToObject(choice, "finish_reason", o->finish_reason);
    else
        cJSON_AddNullToObject(choice, "finish_reason");
}

/* tool_calls: [{"index"?, "id", "type": "function", "function": {"name", "arguments"}}]; a stream delta after the
 * first one of a call carries only index and function.arguments. */
static cJSON *calls_json(const OaiOutput *o, int delta) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < o->n_calls; i++) {
        const OaiCallOut *c = &o->calls[i];
        cJSON *x = cJSON_CreateObject();
        if (delta) cJSON_AddNumberToObject(x, "index", c->index);
        if (c->id) {
            cJSON_AddStringToObject(x, "id", c->id);
            cJSON_AddStringToObject(x, "type", "function");
        }
        cJSON *f = cJSON_AddObjectToObject(x, "function");
        if (c->name) cJSON_AddStringToObject(f, "name", c->name);
        cJSON_AddStringToObject(f, "arguments", c->arguments ? c->arguments : "");
        cJSON_AddItemToArray(a, x);
    }
    return a;
}

/* A choice's "logprobs": chat's content list or completions' legacy form, null when not asked for. */
static void add_logprobs(cJSON *choice, int kind, const OaiOutput *o) {
    if (!o->want_logprobs)
        cJSON_AddNullToObject(choice, "logprobs");
    else
        cJSON_AddItemToObject(choice, "logprobs",
                              kind == OAI_CHAT ? chat_logprobs(o) : completion_logprobs(o, o->text_offset));
}

/* One choice of a non-streamed response. */
static cJSON *choice_json(int kind, const OaiOutput *o) {
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", o->index);
    if (kind == OAI_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (o->n_calls && (!o->content || !o->content[0]))
            cJSON_AddNullToObject(msg, "content");
        else
            cJSON_AddStringToObject(msg, "content", o->content ? o->content : "");
        if (o->reasoning) cJSON_AddStringToObject(msg, "reasoning_content", o->reasoning);
        if (o->n_calls) cJSON_AddItemToObject(msg, "tool_calls", calls_json(o, 0));
    } else {
        cJSON_AddStringToObject(choice, "text", o->content ? o->content : "");
    }
    add_logprobs(choice, kind, o);
    finish(choice, o);
    return choice;
}

char *oai_response_json(int kind, const OaiMeta *m, const OaiOutput *o, int n_choices, const OaiUsage *u) {
    cJSON *root = envelope(kind, m, kind == OAI_CHAT ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < n_choices; i++) cJSON_AddItemToArray(choices, choice_json(kind, &o[i]));
    cJSON_AddItemToObject(root, "usage", usage_json(u));
    return print(root);
}

char *oai_chunk_json(int kind, const OaiMeta *m, const OaiOutput *o, int first, const OaiUsage *u, int with_usage) {
    cJSON *root = envelope(kind, m, kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    if (o) {
        cJSON *choice = cJSON_CreateObject();
        cJSON_AddNumberToObject(choice, "index", o->index);
        if (kind == OAI_CHAT) {
            cJSON *d = cJSON_AddObjectToObject(choice, "delta");
            if (first) cJSON_AddStringToObject(d, "role", "assistant");
            if (o->reasoning) cJSON_AddStringToObject(d, "reasoning_content", o->reasoning);
            if (o->content) cJSON_AddStringToObject(d, "content", o->content);
            if (o->n_calls) cJSON_AddItemToObject(d, "tool_calls", calls_json(o, 1));
        } else {
            cJSON_AddStringToObject(choice, "text", o->content ? o->content : "");
        }
        add_logprobs(choice, kind, o);
        finish(choice, o);
        cJSON_AddItemToArray(choices, choice);
    }
    if (with_usage) {
        if (u)
            cJSON_AddItemToObject(root, "usage", usage_json(u));
        else
            cJSON_AddNullToObject(root, "usage");
    }
    return print(root);
}

static cJSON *model_object(const char *model, long created, int max_model_len) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "qwen35");
    cJSON_AddNumberToObject(m, "max_model_len", max_model_len);
    return m;
}

char *oai_models_json(const char *model, long created, int max_model_len) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), model_object(model, created, max_model_len));
    return print(root);
}

char *oai_model_json(const char *model, long created, int max_model_len) {
    return print(model_object(model, created, max_model_len));
}

int oai_tokenize_kind(const char *body, size_t len, int *kind, OaiError *e) {
    cJSON *root;
    if (oai_parse_body(body, len, &root, e)) return -1;
    *kind = field(root, "messages") ? OAI_CHAT : OAI_COMPLETION;
    cJSON_Delete(root);
    return 0;
}

char *oai_tokenize_json(const int *ids, int n, int max_model_len) {
    cJSON *root = cJSON_CreateObject(), *t = NULL;
    cJSON_AddNumberToObject(root, "count", n);
    cJSON_AddNumberToObject(root, "max_model_len", max_model_len);
    if (!(t = cJSON_CreateIntArray(ids, n))) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddItemToObject(root, "tokens", t);
    return print(root);
}

int oai_parse_detokenize(const char *body, size_t len, int vocab, int **ids, int *n, OaiError *e) {
    *ids = NULL;
    *n = 0;
    cJSON *root;
    if (oai_parse_body(body, len, &root, e)) return -1;
    const cJSON *t = field(root, "tokens"), *v;
    int rc = 0;
    if (!cJSON_IsArray(t)) rc = bad(e, "tokens", "must be an array of token ids");
    if (!rc && !(*ids = malloc(sizeof(int) * ((size_t)cJSON_GetArraySize(t) + 1)))) rc = oom(e);
    for (v = rc ? NULL : t->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < vocab) ||
            v->valuedouble != floor(v->valuedouble)) {
            rc = oai_fail(e, 400, "invalid_request_error", NULL, "tokens", "'tokens' must hold ids in [0, %d)", vocab);
            break;
        }
        (*ids)[(*n)++] = (int)v->valuedouble;
    }
    cJSON_Delete(root);
    if (rc) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return rc;
}

char *oai_detokenize_json(const char *text) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "prompt", text);
    return print(root);
}
