/* chat_guide.c — guided generation as a byte-level automaton over the output (qwen35.h q35_guide_*): tool_choice
 * "required" / a named function, or a response_format JSON Schema. A sampler asks whether the bytes of a candidate
 * token keep the output a prefix of an allowed one; the guide never looks at token ids.
 * response_format: [thinking: any bytes until "</think>", then "\n\n"] then one JSON value that the schema's reader
 * (chat_schema.c) accepts, nothing after it. Tool-call modes:
 *   THINK   (thinking on) any bytes until "</think>", then the literal "\n\n"
 *   LIT     a fixed literal, then the mode stored in `after`
 *   NAME    bytes that are a prefix of one candidate function's "NAME>\n" (Qwen3: "NAME\", \"arguments\": ")
 *   ITEM    Qwen3.5: "<parameter=P>\n" for a declared P not given yet (any P when the function declares no
 *           properties), or "</function>\n</tool_call>" once every required P was given
 *   VALUE   any bytes until "\n</parameter>\n"
 *   JSON    Qwen3: a JSON object (the schema reader of chat_schema.c with {"type": "object"}), then
 *           "}\n</tool_call>"
 *   AFTER   a call is complete: stop, or (required) "\n<tool_call>\n..." for the next call
 * Values are not typed here: the parser types them, and a value that does not read as its type stays a
 * string. */
#include <stdlib.h>

#include "chat.h"
#include "chat_schema.h"

enum { G_THINK, G_LIT, G_NAME, G_ITEM, G_VALUE, G_JSON, G_AFTER };

typedef struct GFunc {
    const char *name;
    const char **props; /* declared property names */
    int n_props;
    int open;          /* no "properties": any parameter name */
    uint64_t required; /* bit i: props[i] is required (first 64) */
} GFunc;

typedef struct GState {
    int mode, after; /* after: the mode once the literal is done */
    const char *lit; /* LIT: the literal; pos: bytes matched */
    int pos;
    char buf[512]; /* NAME / ITEM: bytes of the current token */
    int nbuf;
    int fn;         /* the chosen function */
    uint64_t seen;  /* parameters given */
    int tail;       /* THINK / VALUE: bytes of the closing tag matched */
    int tc;         /* VALUE / JSON: bytes of "</tool_call>" matched (it may not occur: the parser ends there) */
    SchemaState js; /* JSON: the arguments object */
    int calls;
} GState;

/* response_format: the reply's state */
enum { R_THINK, R_LIT, R_VALUE };
typedef struct RState {
    int mode, tail, pos; /* THINK: bytes of "</think>" matched; LIT: bytes of "\n\n" matched */
    SchemaState v;
} RState;

struct Q35Guide {
    Schema *schema; /* response_format (then st is unused), else NULL */
    Schema *args;   /* Qwen3 calls: the arguments, any JSON object */
    RState rs;
    int q35, named;
    ChatTools tools;
    GFunc *fns;
    int n_fns;
    GState st;
    StrBuf forced;
};

static const char Q35_OPEN[] = "<tool_call>\n<function=", Q35_NEXT[] = "\n<tool_call>\n<function=";
static const char Q3_OPEN[] = "<tool_call>\n{\"name\": \"", Q3_NEXT[] = "\n<tool_call>\n{\"name\": \"";
static const char Q35_END[] = "</function>\n</tool_call>", Q3_END[] = "}\n</tool_call>";
static const char END_THINK[] = "</think>", END_VALUE[] = "\n</parameter>\n";

static void lit(GState *s, const char *l, int after) {
    s->mode = G_LIT;
    s->lit = l;
    s->pos = 0;
    s->after = after;
}

/* Is b[0..n) a prefix of x (1), equal to it (2), or neither (0)? */
static int prefix(const char *b, int n, const char *x) {
    int k = (int)strlen(x);
    if (n > k || memcmp(b, x, (size_t)n)) return 0;
    return n == k ? 2 : 1;
}

/* NAME: candidate functions; *which = the function when b is complete. */
static int name_ok(const Q35Guide *g, const char *b, int n, int *which) {
    int any = 0;
    for (int i = 0; i < g->n_fns; i++) {
        if (g->named >= 0 && i != g->named) continue;
        const char *nm = g->fns[i].name;
        int k = (int)strlen(nm);
        if (n <= k) {
            if (!memcmp(b, nm, (size_t)n)) any = 1;
            continue;
        }
        if (memcmp(b, nm, (size_t)k)) continue;
        int r = prefix(b + k, n - k, g->q35 ? ">\n" : "\", \"arguments\": ");
        if (r == 2) {
            *which = i;
            return 2;
        }
        any |= r;
    }
    return any;
}

/* ITEM (Qwen3.5): *param = the property index (-1: an undeclared name of an open function) on "<parameter=P>\n",
 * -2 on the end of the call. */
static int item_ok(const GFunc *f, const GState *s, int *param) {
    const char *b = s->buf;
    int n = s->nbuf, any = 0;
    int all_req = (f->required & ~s->seen) == 0;
    if (all_req) {
        int r = prefix(b, n, Q35_END);
        if (r == 2) {
            *param = -2;
            return 2;
        }
        any |= r;
    }
    int can_param = f->open;
    for (int i = 0; i < f->n_props && !can_param; i++) can_param = i >= 64 || !(s->seen >> i & 1);
    int r = can_param ? prefix(b, n < 11 ? n : 11, "<parameter=") : 0;
    if (!r) return any;
    if (n <= 11) return 1;
    const char *p = b + 11;
    int pn = n - 11;
    for (int i = 0; i < f->n_props; i++) {
        if (i < 64 && (s->seen >> i & 1)) continue;
        int k = (int)strlen(f->props[i]);
        if (pn <= k) {
            if (!memcmp(p, f->props[i], (size_t)pn)) any = 1;
            continue;
        }
        if (memcmp(p, f->props[i], (size_t)k)) continue;
        int q = prefix(p + k, pn - k, ">\n");
        if (q == 2) {
            *param = i;
            return 2;
        }
        any |= q;
    }
    if (f->open) { /* [^<>\n]+ ">\n" */
        int i = 0;
        while (i < pn && p[i] != '>' && p[i] != '<' && p[i] != '\n') i++;
        if (i == pn) return 1;
        if (i > 0 && p[i] == '>') {
            int q = prefix(p + i, pn - i, ">\n");
            if (q == 2) {
                *param = -1;
                return 2;
            }
            any |= q;
        }
    }
    return any;
}

/* Tracks "</tool_call>" in free text; 0 when c would complete it. */
static int no_end_call(GState *s, unsigned char c) {
    static const char tag[] = "</tool_call>";
    s->tc = c == (unsigned char)tag[s->tc] ? s->tc + 1 : c == '<';
    return s->tc < (int)sizeof tag - 1;
}

/* Advances s over byte c; 0 if c is not allowed (s is then garbage: callers work on copies). */
static int step(const Q35Guide *g, GState *s, unsigned char c) {
    switch (s->mode) {
    case G_THINK:
        s->tail = c == (unsigned char)END_THINK[s->tail] ? s->tail + 1 : c == '<';
        if (s->tail == 8) lit(s, g->q35 ? "\n\n<tool_call>\n<function=" : "\n\n<tool_call>\n{\"name\": \"", G_NAME);
        return 1;
    case G_LIT:
        if (c != (unsigned char)s->lit[s->pos]) return 0;
        if (!s->lit[++s->pos]) {
            s->mode = s->after;
            s->nbuf = 0;
            s->tail = 0;
            if (s->mode == G_ITEM) s->seen = 0;
        }
        return 1;
    case G_NAME: {
        if (s->nbuf == (int)sizeof s->buf) return 0;
        s->buf[s->nbuf++] = (char)c;
        int which = -1, r = name_ok(g, s->buf, s->nbuf, &which);
        if (r == 2) {
            s->fn = which;
            s->nbuf = 0;
            s->mode = g->q35 ? G_ITEM : G_JSON;
            s->seen = 0;
            if (!g->q35) schema_start(g->args, &s->js);
            s->tc = 0;
        }
        return r != 0;
    }
    case G_ITEM: {
        if (s->nbuf == (int)sizeof s->buf) return 0;
        s->buf[s->nbuf++] = (char)c;
        int param = 0, r = item_ok(&g->fns[s->fn], s, &param);
        if (r == 2) {
            s->nbuf = 0;
            if (param == -2) {
                s->calls++;
                s->mode = G_AFTER;
            } else {
                if (param >= 0 && param < 64) s->seen |= 1ull << param;
                s->mode = G_VALUE;
                s->tail = 0;
                s->tc = 0;
            }
        }
        return r != 0;
    }
    case G_VALUE:
        /* "\n</parameter>" only as the start of the closing "\n</parameter>\n" (the parser ends the value at it) */
        if (s->tail == (int)sizeof END_VALUE - 2 && c != '\n') return 0;
        if (!no_end_call(s, c)) return 0;
        s->tail = c == (unsigned char)END_VALUE[s->tail] ? s->tail + 1 : c == '\n';
        if (s->tail == (int)sizeof END_VALUE - 1) {
            s->mode = G_ITEM;
            s->nbuf = 0;
            s->tc = 0;
        }
        return 1;
    case G_JSON: {
        if (!no_end_call(s, c)) return 0;
        int r = schema_step(g->args, &s->js, c);
        if (r == 2) {
            s->calls++;
            lit(s, Q3_END, G_AFTER);
        }
        return r != 0;
    }
    case G_AFTER:
        if (g->named >= 0) return 0; /* exactly one call */
        lit(s, g->q35 ? Q35_NEXT : Q3_NEXT, G_NAME);
        return step(g, s, c);
    }
    return 0;
}

int q35_guide_open(Q35Guide **out, const Q35Tokenizer *t, const Q35ChatRequest *rq, Q35Err *err) {
    *out = NULL;
    ChatFormat f;
    int rc = chat_format_for(t, rq->family, &f, err);
    if (rc) return rc;
    const int tools = rq->tool_choice == Q35_TOOL_CHOICE_REQUIRED || rq->tool_choice == Q35_TOOL_CHOICE_FUNCTION;
    if (tools == (rq->response_schema != NULL))
        return err_set(err, Q35_ERR_ARG, "guide: %s",
                       tools ? "tool_choice required / a named function does not go with a response format"
                             : "needs tool_choice required / a named function, or a response format");
    const int thinking = rq->thinking == Q35_THINK_DEFAULT ? f.default_thinking : rq->thinking;
    Q35Guide *g = calloc(1, sizeof *g);
    if (!g) return err_set(err, Q35_ERR_OOM, "out of memory");
    if (!tools) {
        if ((rc = schema_compile(rq->response_schema, strlen(rq->response_schema), "response_format", &g->schema,
                                 err))) {
            free(g);
            return rc;
        }
        g->rs.mode = thinking ? R_THINK : R_VALUE;
        schema_start(g->schema, &g->rs.v);
        *out = g;
        return 0;
    }
    if ((rc = chat_tools_parse(&g->tools, rq->tools, err))) {
        free(g);
        return rc;
    }
    g->q35 = f.family == Q35_TOK_QWEN35;
    g->named = -1;
    static const char OBJECT[] = "{\"type\": \"object\"}";
    if (!g->q35 && (rc = schema_compile(OBJECT, sizeof OBJECT - 1, "arguments", &g->args, err))) {
        q35_guide_close(g);
        return rc;
    }
    g->fns = calloc((size_t)g->tools.n + 1, sizeof *g->fns);
    if (!g->fns) {
        q35_guide_close(g);
        return err_set(err, Q35_ERR_OOM, "out of memory");
    }
    for (int i = 0; i < g->tools.n; i++) {
        const cJSON *fn = chat_tool_function(&g->tools, i), *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || !nm->valuestring[0]) continue;
        GFunc *gf = &g->fns[g->n_fns];
        gf->name = nm->valuestring;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
        gf->open = !cJSON_IsObject(props);
        int np = cJSON_IsObject(props) ? cJSON_GetArraySize(props) : 0;
        gf->props = calloc((size_t)np + 1, sizeof *gf->props);
        if (!gf->props) {
            q35_guide_close(g);
            return err_set(err, Q35_ERR_OOM, "out of memory");
        }
        for (const cJSON *p = np ? props->child : NULL; p; p = p->next) gf->props[gf->n_props++] = p->string;
        const cJSON *req;
        cJSON_ArrayForEach(req, cJSON_GetObjectItemCaseSensitive(params, "required")) {
            for (int k = 0; k < gf->n_props && k < 64; k++)
                if (cJSON_IsString(req) && !strcmp(req->valuestring, gf->props[k])) gf->required |= 1ull << k;
        }
        if (rq->tool_choice == Q35_TOOL_CHOICE_FUNCTION && rq->tool_choice_name &&
            !strcmp(rq->tool_choice_name, gf->name))
            g->named = g->n_fns;
        g->n_fns++;
    }
    if (g->n_fns == 0 || (rq->tool_choice == Q35_TOOL_CHOICE_FUNCTION && g->named < 0)) {
        const char *why = g->n_fns ? "tool_choice names no function in tools" : "no named function in tools";
        q35_guide_close(g);
        return err_set(err, Q35_ERR_ARG, "guide: %s", why);
    }
    if (thinking)
        g->st.mode = G_THINK;
    else
        lit(&g->st, g->q35 ? Q35_OPEN : Q3_OPEN, G_NAME);
    *out = g;
    return 0;
}

/* response_format: advances r over byte c; 0 if c is not allowed (r is then garbage) */
static int rstep(const Q35Guide *g, RState *r, unsigned char c) {
    static const char sep[] = "\n\n";
    switch (r->mode) {
    case R_THINK:
        r->tail = c == (unsigned char)END_THINK[r->tail] ? r->tail + 1 : c == '<';
        if (r->tail == 8) {
            r->mode = R_LIT;
            r->pos = 0;
        }
        return 1;
    case R_LIT:
        if (c != (unsigned char)sep[r->pos]) return 0;
        if (!sep[++r->pos]) r->mode = R_VALUE;
        return 1;
    default: return schema_step(g->schema, &r->v, c) != 0;
    }
}

enum { P_LT = 1, P_NL = 2, P_JSON = 4 }; /* plain()'s refusals: '<'; '\n'; '"', '\\' and bytes below 0x20 */

/* Whether x[0..n) holds none of the bytes that the flags name; *chars: its characters (first bytes of UTF-8
 * sequences). */
static int plain(const char *x, size_t n, int flags, int *chars) {
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)x[i];
        if (c <= '<' && (((flags & P_LT) && c == '<') || ((flags & P_NL) && c == '\n') ||
                         ((flags & P_JSON) && (c < 0x20 || c == '"'))))
            return 0;
        if (c == '\\' && (flags & P_JSON)) return 0;
        k += c < 0x80 || c >= 0xC0;
    }
    *chars = k;
    return 1;
}

/* The allows() answers that need no copy of the state (most of the vocabulary, in the free-text parts): free
 * reasoning without '<' (no "</think>" can start), a JSON string's inside without '"', '\\' or control bytes (and,
 * in a Qwen3 call, without '<'), a Qwen3.5 parameter value without '\n' or '<'. -1: not decided here. */
static int allows_fast(const Q35Guide *g, const char *x, size_t n) {
    int chars, left;
    if (g->schema) {
        if (g->rs.mode == R_THINK) return g->rs.tail == 0 && plain(x, n, P_LT, &chars) ? 1 : -1;
        if (g->rs.mode == R_VALUE && schema_in_string(g->schema, &g->rs.v, &left) && plain(x, n, P_JSON, &chars))
            return left < 0 || chars <= left;
        return -1;
    }
    const GState *s = &g->st;
    if (s->mode == G_THINK) return s->tail == 0 && plain(x, n, P_LT, &chars) ? 1 : -1;
    if (s->mode == G_VALUE) return s->tail == 0 && s->tc == 0 && plain(x, n, P_NL | P_LT, &chars) ? 1 : -1;
    if (s->mode == G_JSON && s->tc == 0 && schema_in_string(g->args, &s->js, &left) &&
        plain(x, n, P_JSON | P_LT, &chars))
        return 1;
    return -1;
}

int q35_guide_allows(const Q35Guide *g, const char *x, size_t n) {
    const int fast = allows_fast(g, x, n);
    if (fast >= 0) return fast;
    if (g->schema) {
        RState r = g->rs;
        for (size_t i = 0; i < n; i++)
            if (!rstep(g, &r, (unsigned char)x[i])) return 0;
        return 1;
    }
    GState s = g->st;
    for (size_t i = 0; i < n; i++)
        if (!step(g, &s, (unsigned char)x[i])) return 0;
    return 1;
}

int q35_guide_push(Q35Guide *g, const char *x, size_t n, Q35Err *err) {
    if (g->schema) {
        RState r = g->rs;
        for (size_t i = 0; i < n; i++)
            if (!rstep(g, &r, (unsigned char)x[i]))
                return err_set(err, Q35_ERR_ARG, "guide: byte %zu (0x%02x) is not allowed here", i,
                               (unsigned char)x[i]);
        g->rs = r;
        return 0;
    }
    GState s = g->st;
    for (size_t i = 0; i < n; i++)
        if (!step(g, &s, (unsigned char)x[i]))
            return err_set(err, Q35_ERR_ARG, "guide: byte %zu (0x%02x) is not allowed here", i, (unsigned char)x[i]);
    g->st = s;
    return 0;
}

int q35_guide_can_stop(const Q35Guide *g) {
    if (g->schema) return g->rs.mode == R_VALUE && schema_done(g->schema, &g->rs.v);
    return g->st.mode == G_AFTER;
}

const char *q35_guide_forced(const Q35Guide *g) {
    Q35Guide *m = (Q35Guide *)g; /* the forced-text buffer is scratch */
    m->forced.n = 0;
    sb_put(&m->forced, "", 0);
    if (g->schema) return m->forced.oom ? "" : m->forced.p; /* a reply's shape is the model's to choose */
    GState s = g->st;
    while (s.mode != G_AFTER && s.mode != G_THINK && s.mode != G_VALUE && s.mode != G_JSON) {
        int only = -1, count = 0;
        for (int c = 1; c < 256 && count < 2; c++) {
            GState t = s;
            if (step(g, &t, (unsigned char)c)) {
                only = c;
                count++;
            }
        }
        if (count != 1) break;
        step(g, &s, (unsigned char)only);
        sb_putc(&m->forced, (char)only);
    }
    return m->forced.oom ? "" : m->forced.p;
}

void q35_guide_close(Q35Guide *g) {
    if (!g) return;
    schema_free(g->schema);
    schema_free(g->args);
    for (int i = 0; g->fns && i < g->n_fns; i++) free(g->fns[i].props);
    free(g->fns);
    chat_tools_free(&g->tools);
    sb_free(&g->forced);
    free(g);
}
