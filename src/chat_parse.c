/* chat_parse.c — the streaming parser of generated chat text (qwen35.h q35_chat_parser_*): splits it into
 * reasoning, content and tool calls.
 *   states: THINK_OPEN ("<think>" written by the model, Qwen3) -> REASONING -> "</think>" -> SKIP_NL ->
 *           CONTENT <-> CALL ("<tool_call>" ... "</tool_call>", then SKIP_NL -> CONTENT)
 * held: the bytes not yet emitted. Outside a call it is only the tail that may still become a tag (a proper
 * prefix of "</think>" or "<tool_call>", with the newlines before it); inside a call it is the call's text
 * from "<tool_call>", kept whole so that a call that does not parse comes out as content unchanged.
 * Qwen3.5 call: "<function=NAME>" then "<parameter=P>\nVALUE\n</parameter>" items, "</function>"; a value
 * ends at the first "\n</parameter>" followed (after whitespace) by "<parameter=", "</function>" or the end
 * (so "</parameter>" inside a value survives); a missing "</parameter>" ends at the next "<parameter=" /
 * "</function>". Qwen3 call: a JSON object {"name", "arguments"} between the tags. */
#include <stdio.h>
#include <stdlib.h>

#include "chat.h"
#include "pyjson.h"

enum { S_THINK_OPEN, S_REASONING, S_SKIP_NL, S_CONTENT, S_CALL };

struct Q35ChatParser {
    int q35;      /* XML calls (Qwen3.5) or JSON calls (Qwen3) */
    int calls_on; /* tools given and tool_choice != none */
    ChatTools tools;
    uint64_t id_seed;
    int state;
    int reasoning_started; /* a non-newline byte of reasoning was emitted */
    StrBuf held;
    int n_calls;
    int finished;
    Q35ChatEventFn fn;
    void *user;
    int stop; /* the callback's non-zero return */
};

static const char TAG_THINK[] = "<think>", TAG_END_THINK[] = "</think>";
static const char TAG_CALL[] = "<tool_call>", TAG_END_CALL[] = "</tool_call>";
#define LEN(s) (sizeof(s) - 1)

static const char *find(const char *h, size_t n, const char *needle, size_t k) {
    for (size_t i = 0; i + k <= n; i++)
        if (h[i] == needle[0] && !memcmp(h + i, needle, k)) return h + i;
    return NULL;
}

/* Bytes at the end of h[0..n) that may still begin tag: the longest proper prefix of tag ending h, and the
 * newlines before it. */
static size_t holdback(const char *h, size_t n, const char *tag, size_t t) {
    size_t k = 0;
    for (size_t m = t - 1 < n ? t - 1 : n; m > 0; m--)
        if (!memcmp(h + n - m, tag, m)) {
            k = m;
            break;
        }
    while (k < n && h[n - k - 1] == '\n') k++;
    return k;
}

static void emit(Q35ChatParser *p, int type, const char *text, size_t len) {
    if (p->stop || (!len && (type == Q35_CHAT_EV_REASONING || type == Q35_CHAT_EV_CONTENT))) return;
    Q35ChatEvent ev = {.type = type, .index = p->n_calls, .text = text, .len = len};
    p->stop = p->fn ? p->fn(p->user, &ev) : 0;
}

/* A NUL-terminated copy for an event (events promise NUL-terminated text). */
static void emit_copy(Q35ChatParser *p, int type, const char *text, size_t len) {
    StrBuf b = {0};
    sb_put(&b, text, len);
    if (b.oom)
        p->stop = Q35_ERR_OOM;
    else
        emit(p, type, b.p, len);
    sb_free(&b);
}

static uint64_t mix64(uint64_t x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void emit_start(Q35ChatParser *p, const char *name, size_t n) {
    char id[40];
    uint64_t a = mix64(p->id_seed ^ mix64((uint64_t)p->n_calls + 1)), b = mix64(a);
    snprintf(id, sizeof id, "call_%016llx%08llx", (unsigned long long)a, (unsigned long long)(b >> 32));
    StrBuf nm = {0};
    sb_put(&nm, name, n);
    if (nm.oom) {
        p->stop = Q35_ERR_OOM;
        return;
    }
    Q35ChatEvent ev = {.type = Q35_CHAT_EV_TOOL_START, .index = p->n_calls, .id = id, .name = nm.p};
    if (!p->stop) p->stop = p->fn ? p->fn(p->user, &ev) : 0;
    sb_free(&nm);
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static int ci_eq(const char *a, size_t n, const char *b) {
    if (strlen(b) != n) return 0;
    for (size_t i = 0; i < n; i++) {
        char x = a[i] >= 'A' && a[i] <= 'Z' ? (char)(a[i] + 32) : a[i];
        if (x != b[i]) return 0;
    }
    return 1;
}
static int starts(const char *h, size_t n, const char *x) {
    size_t k = strlen(x);
    return n >= k && !memcmp(h, x, k);
}

/* JSON number literal syntax: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int json_number(const char *s, size_t n, int *is_int) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i >= n || s[i] < '0' || s[i] > '9') return 0;
    if (s[i] == '0')
        i++;
    else
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    *is_int = 1;
    if (i < n && s[i] == '.') {
        *is_int = 0;
        if (++i >= n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        *is_int = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    return i == n;
}

/* A parameter value as JSON, typed by the declared schema type (NULL: string). */
static void put_value(StrBuf *s, const char *ty, const char *v, size_t n) {
    int is_int;
    if (ty && strcmp(ty, "string") && (ci_eq(v, n, "null") || ci_eq(v, n, "none"))) {
        sb_puts(s, "null");
        return;
    }
    if (ty && (!strcmp(ty, "integer") || !strcmp(ty, "number")) && json_number(v, n, &is_int)) {
        sb_put(s, v, n);
        return;
    }
    if (ty && !strcmp(ty, "boolean") && (ci_eq(v, n, "true") || ci_eq(v, n, "false"))) {
        sb_puts(s, ci_eq(v, n, "true") ? "true" : "false");
        return;
    }
    if (ty && (!strcmp(ty, "object") || !strcmp(ty, "array"))) {
        cJSON *j;
        Err err;
        if (!pyjson_parse(v, n, "value", &j, &err)) {
            pyjson_dump_strict(s, j);
            cJSON_Delete(j);
            return;
        }
    }
    pyjson_dump_string(s, v, n);
}

typedef struct Span {
    const char *p;
    size_t n;
} Span;

/* The end of a parameter value starting at v (body ends at e): the first "\n</parameter>" followed by
 * whitespace and "<parameter=" / "</function>" / the end; else the first "</parameter>"; else the next
 * "\n<parameter=" / "\n</function>" / the end. *next: where the following item starts. */
static const char *value_end(const char *v, const char *e, const char **next) {
    static const char close[] = "\n</parameter>";
    for (const char *q = v; (q = find(q, (size_t)(e - q), close, LEN(close))); q++) {
        const char *r = q + LEN(close);
        while (r < e && is_ws(*r)) r++;
        if (r == e || starts(r, (size_t)(e - r), "<parameter=") || starts(r, (size_t)(e - r), "</function>")) {
            *next = q + LEN(close);
            return q;
        }
    }
    const char *q = find(v, (size_t)(e - v), close + 1, LEN(close) - 1);
    if (q) {
        *next = q + LEN(close) - 1;
        return q > v && q[-1] == '\n' ? q - 1 : q;
    }
    const char *a = find(v, (size_t)(e - v), "<parameter=", 11), *b = find(v, (size_t)(e - v), "</function>", 11);
    q = a && (!b || a < b) ? a : b ? b : e;
    *next = q;
    return q > v && q[-1] == '\n' ? q - 1 : q;
}

/* Parses a Qwen3.5 call h[0..n) (from "<tool_call>"; closed: "</tool_call>" ends it) and emits it. Returns
 * 0 when it is not a well-formed call (nothing emitted). */
static int xml_call(Q35ChatParser *p, const char *h, size_t n, int closed) {
    const char *b = h + LEN(TAG_CALL), *e = h + n - (closed ? LEN(TAG_END_CALL) : 0);
    while (b < e && is_ws(*b)) b++;
    while (e > b && is_ws(e[-1])) e--;
    if (!starts(b, (size_t)(e - b), "<function=")) return 0;
    const char *name = b + 10, *gt = name;
    while (gt < e && *gt != '>' && *gt != '\n' && *gt != '<') gt++;
    if (gt == e || *gt != '>' || gt == name) return 0;
    const cJSON *fn = chat_tool_find(&p->tools, name, (size_t)(gt - name));
    Span params[64];
    int np = 0, have_end = 0;
    for (const char *q = gt + 1;;) {
        while (q < e && is_ws(*q)) q++;
        if (q == e) break;
        if (starts(q, (size_t)(e - q), "</function>")) {
            q += 11;
            while (q < e && is_ws(*q)) q++;
            if (q != e) return 0; /* text after </function> inside the call */
            have_end = 1;
            break;
        }
        if (!starts(q, (size_t)(e - q), "<parameter=") || np == 64) return 0;
        const char *pn = q + 11, *pg = pn;
        while (pg < e && *pg != '>' && *pg != '\n' && *pg != '<') pg++;
        if (pg == e || *pg != '>' || pg == pn) return 0;
        const char *v = pg + 1, *next;
        if (v < e && *v == '\n') v++;
        const char *ve = value_end(v, e, &next);
        params[np++] = (Span){pn, (size_t)(pg - pn)};
        params[np++] = (Span){v, (size_t)(ve - v)};
        q = next;
    }
    if (!have_end && !closed) return 0; /* an unfinished call at the end of generation */
    emit_start(p, name, (size_t)(gt - name));
    emit(p, Q35_CHAT_EV_TOOL_ARGS, "{", 1);
    for (int i = 0; i < np; i += 2) {
        StrBuf a = {0};
        if (i) sb_puts(&a, ", ");
        pyjson_dump_string(&a, params[i].p, params[i].n);
        sb_puts(&a, ": ");
        put_value(&a, fn ? chat_param_type(fn, params[i].p, params[i].n) : NULL, params[i + 1].p, params[i + 1].n);
        if (a.oom)
            p->stop = Q35_ERR_OOM;
        else
            emit(p, Q35_CHAT_EV_TOOL_ARGS, a.p, a.n);
        sb_free(&a);
    }
    emit(p, Q35_CHAT_EV_TOOL_ARGS, "}", 1);
    return 1;
}

/* Parses a Qwen3 call: {"name": "...", "arguments": {...}} between the tags (arguments may also be a
 * string holding JSON, or absent = {}). */
static int json_call(Q35ChatParser *p, const char *h, size_t n, int closed) {
    if (!closed) return 0;
    const char *b = h + LEN(TAG_CALL);
    size_t len = n - LEN(TAG_CALL) - LEN(TAG_END_CALL);
    cJSON *j, *args = NULL;
    Err err;
    if (pyjson_parse(b, len, "tool call", &j, &err)) return 0;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    int ok = cJSON_IsObject(j) && cJSON_IsString(name) && name->valuestring[0];
    if (ok && cJSON_IsString(a)) {
        ok = !pyjson_parse(a->valuestring, strlen(a->valuestring), "arguments", &args, &err);
        a = args;
    }
    ok = ok && (!a || cJSON_IsObject(a));
    if (ok) {
        StrBuf s = {0};
        if (a)
            pyjson_dump_strict(&s, a);
        else
            sb_puts(&s, "{}");
        emit_start(p, name->valuestring, strlen(name->valuestring));
        if (s.oom)
            p->stop = Q35_ERR_OOM;
        else
            emit(p, Q35_CHAT_EV_TOOL_ARGS, s.p, s.n);
        sb_free(&s);
    }
    cJSON_Delete(args);
    cJSON_Delete(j);
    return ok;
}

/* One call's text (from "<tool_call>"): emitted as a call, or as content when it does not parse. */
static void call_or_content(Q35ChatParser *p, const char *h, size_t n, int closed) {
    if (p->q35 ? xml_call(p, h, n, closed) : json_call(p, h, n, closed))
        p->n_calls++;
    else
        emit_copy(p, Q35_CHAT_EV_CONTENT, h, n);
}

/* Emits h[0..k) of held as type and drops the first drop bytes of held. */
static void emit_drop(Q35ChatParser *p, int type, size_t k, size_t drop) {
    emit_copy(p, type, p->held.p, k);
    sb_drop(&p->held, drop);
}

static void process(Q35ChatParser *p, int final) {
    while (!p->stop) {
        const char *h = p->held.p ? p->held.p : "";
        size_t n = p->held.n;
        if (p->state == S_THINK_OPEN) {
            if (n >= LEN(TAG_THINK) && !memcmp(h, TAG_THINK, LEN(TAG_THINK))) {
                sb_drop(&p->held, LEN(TAG_THINK));
            } else if (!final && n < LEN(TAG_THINK) && !memcmp(h, TAG_THINK, n)) {
                return; /* may still be "<think>" */
            }
            p->state = S_REASONING;
        } else if (p->state == S_REASONING) {
            size_t lead = 0;
            while (!p->reasoning_started && lead < n && h[lead] == '\n') lead++;
            if (lead) {
                sb_drop(&p->held, lead);
                continue;
            }
            const char *e = find(h, n, TAG_END_THINK, LEN(TAG_END_THINK));
            size_t k = e ? (size_t)(e - h) : n,
                   keep = e || final ? 0 : holdback(h, n, TAG_END_THINK, LEN(TAG_END_THINK));
            size_t out = k - keep;
            if (e || final)
                while (out && h[out - 1] == '\n') out--; /* newlines before the tag belong to it */
            if (out) p->reasoning_started = 1;
            emit_drop(p, Q35_CHAT_EV_REASONING, out, e ? k + LEN(TAG_END_THINK) : final ? n : k - keep);
            if (!e) return;
            p->state = S_SKIP_NL;
        } else if (p->state == S_SKIP_NL) {
            size_t lead = 0;
            while (lead < n && h[lead] == '\n') lead++;
            sb_drop(&p->held, lead);
            if (lead == n) return;
            p->state = S_CONTENT;
        } else if (p->state == S_CONTENT) {
            const char *e = p->calls_on ? find(h, n, TAG_CALL, LEN(TAG_CALL)) : NULL;
            if (e) {
                size_t k = (size_t)(e - h), out = k;
                while (out && h[out - 1] == '\n') out--;
                emit_drop(p, Q35_CHAT_EV_CONTENT, out, k);
                p->state = S_CALL;
                continue;
            }
            size_t keep = p->calls_on && !final ? holdback(h, n, TAG_CALL, LEN(TAG_CALL)) : 0;
            emit_drop(p, Q35_CHAT_EV_CONTENT, n - keep, n - keep);
            return;
        } else { /* S_CALL: held starts with "<tool_call>" */
            const char *e = find(h + LEN(TAG_CALL), n - LEN(TAG_CALL), TAG_END_CALL, LEN(TAG_END_CALL));
            if (!e && !final) return;
            size_t k = e ? (size_t)(e - h) + LEN(TAG_END_CALL) : n;
            call_or_content(p, h, k, e != NULL);
            sb_drop(&p->held, k);
            p->state = S_SKIP_NL;
            if (!e) return;
        }
    }
}

int q35_chat_parser_open(Q35ChatParser **out, const Q35Tokenizer *t, const Q35ChatParseOptions *o, Q35Err *err) {
    *out = NULL;
    ChatFormat f;
    int rc = chat_format_for(t, o->family, &f, err);
    if (rc) return rc;
    Q35ChatParser *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, Q35_ERR_OOM, "out of memory");
    if ((rc = chat_tools_parse(&p->tools, o->tools, err))) {
        free(p);
        return rc;
    }
    p->q35 = f.family == Q35_TOK_QWEN35;
    p->calls_on = p->tools.root && o->tool_choice != Q35_TOOL_CHOICE_NONE;
    p->id_seed = o->id_seed;
    int thinking = o->thinking == Q35_THINK_DEFAULT ? f.default_thinking : o->thinking;
    p->state = thinking ? S_THINK_OPEN : S_CONTENT;
    *out = p;
    return 0;
}

static int run(Q35ChatParser *p, const char *text, size_t len, int final, Q35ChatEventFn fn, void *user, Err *err) {
    if (p->finished) return err_set(err, Q35_ERR_ARG, "chat parser: already finished");
    p->fn = fn;
    p->user = user;
    sb_put(&p->held, text, len);
    if (p->held.oom) return err_set(err, Q35_ERR_OOM, "out of memory");
    process(p, final);
    if (p->stop == Q35_ERR_OOM) return err_set(err, Q35_ERR_OOM, "out of memory");
    return p->stop;
}

int q35_chat_parser_push(Q35ChatParser *p, const char *text, size_t len, Q35ChatEventFn fn, void *user, Q35Err *err) {
    return run(p, text, len, 0, fn, user, err);
}

int q35_chat_parser_finish(Q35ChatParser *p, Q35ChatEventFn fn, void *user, int *n_tool_calls, Q35Err *err) {
    int rc = run(p, "", 0, 1, fn, user, err);
    p->finished = 1;
    if (n_tool_calls) *n_tool_calls = p->n_calls;
    return rc;
}

void q35_chat_parser_close(Q35ChatParser *p) {
    if (!p) return;
    chat_tools_free(&p->tools);
    sb_free(&p->held);
    free(p);
}
