/* chat_schema.c — a JSON Schema compiled into nodes, and the byte-level reader of the JSON values they accept
 * (chat_schema.h). Node 0 accepts any JSON value. The reader keeps a stack of open objects and arrays
 * (SchemaFrame) and, for the token in progress, a mode: a string, number, literal, enum value or object key. A
 * value starts at its first byte, which picks the anyOf alternative (the compile checks that the alternatives
 * start differently) and the type. Keys are matched against the declared property names as they are written
 * (their JSON-escaped bytes); a key that names no declared property is allowed only where additionalProperties
 * is. Whitespace between tokens is allowed as JSON allows it, at most WS_MAX bytes in a row, so that a guided
 * reply always moves on. */
#include "chat_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyjson.h"
#include "strbuf.h"

#define WS_MAX    64
#define MAX_NODES 4096
#define MAX_ALTS  16
#define MAX_ENUM  64
#define MAX_PROPS 64

enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_INT = 8, T_NUM = 16, T_BOOL = 32, T_NULL = 64, T_ALL = 127 };
/* the classes of a value's first byte: what anyOf alternatives are told apart by */
enum { C_OBJ = 1, C_ARR = 2, C_STR = 4, C_NUM = 8, C_TRUE = 16, C_FALSE = 32, C_NULL = 64 };

typedef struct SNode {
    int ref;    /* $ref: the node this one stands for, else -1 */
    int types;  /* T_*: the types a value may have */
    int n_enum; /* enum / const: the values' JSON texts (n_enum >= 1), else 0 */
    char **enum_txt;
    int n_props; /* properties: the names as JSON-escaped bytes (no quotes), their nodes */
    char **key;
    int *prop;
    uint64_t required;
    int addl;                 /* additionalProperties: the node of other keys' values, -1: no other keys */
    int items;                /* the node of every array item */
    int min_items, max_items; /* max -1: none */
    int min_len, max_len;     /* string characters; max -1: none */
    int n_alts;               /* anyOf / oneOf: the alternatives */
    int alts[MAX_ALTS];
} SNode;

struct Schema {
    SNode *n;
    const cJSON **src; /* the schema object each node was compiled from ($ref targets are found by it) */
    int nn, cap;
    cJSON *root;
};

/* ---- compile ---- */

typedef struct Compiler {
    Schema *s;
    Err *err;
    char path[256];
} Compiler;

static int cfail(Compiler *c, const char *fmt, const char *a) {
    char m[160];
    snprintf(m, sizeof m, fmt, a);
    return err_set(c->err, Q35_ERR_ARG, "%s: %s", c->path, m);
}

/* cfail for the functions that return a node: -1 */
static int cerr(Compiler *c, const char *fmt, const char *a) {
    cfail(c, fmt, a);
    return -1;
}

static int new_node(Compiler *c, const cJSON *src) {
    Schema *s = c->s;
    if (s->nn == MAX_NODES) return cerr(c, "more than %s schema nodes", "4096");
    if (s->nn == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        SNode *n = realloc(s->n, sizeof *n * (size_t)cap);
        if (n) s->n = n;
        const cJSON **q = realloc(s->src, sizeof *q * (size_t)cap);
        if (q) s->src = q;
        if (!n || !q) return (err_set(c->err, Q35_ERR_OOM, "out of memory"), -1);
        s->cap = cap;
    }
    SNode *n = &s->n[s->nn];
    memset(n, 0, sizeof *n);
    n->ref = -1;
    n->types = T_ALL;
    n->max_items = n->max_len = -1;
    s->src[s->nn] = src;
    return s->nn++;
}

/* keywords that assert something this reader does not enforce */
static const char *const UNSUPPORTED[] = {"pattern",
                                          "patternProperties",
                                          "propertyNames",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "multipleOf",
                                          "allOf",
                                          "not",
                                          "if",
                                          "then",
                                          "else",
                                          "prefixItems",
                                          "contains",
                                          "minContains",
                                          "maxContains",
                                          "uniqueItems",
                                          "minProperties",
                                          "maxProperties",
                                          "dependentRequired",
                                          "dependentSchemas",
                                          "dependencies",
                                          "unevaluatedProperties",
                                          "unevaluatedItems",
                                          "additionalItems",
                                          "$dynamicRef",
                                          "$recursiveRef",
                                          NULL};
/* keywords that may not stand beside $ref or anyOf / oneOf here */
static const char *const ASSERTS[] = {"type",     "properties", "required",  "additionalProperties",
                                      "items",    "enum",       "const",     "minItems",
                                      "maxItems", "minLength",  "maxLength", NULL};

static int compile(Compiler *c, const cJSON *js);

/* compile js under path + suffix */
static int compile_at(Compiler *c, const cJSON *js, const char *fmt, const char *a) {
    size_t n = strlen(c->path);
    snprintf(c->path + n, sizeof c->path - n, fmt, a);
    int r = compile(c, js);
    c->path[n] = 0;
    return r;
}

static int get_count(Compiler *c, const cJSON *js, const char *k, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(js, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != (int)v->valuedouble)
        return cfail(c, "'%s' must be a non-negative integer", k);
    *out = (int)v->valuedouble;
    return 0;
}

static int type_bits(Compiler *c, const cJSON *t, int *bits) {
    static const char *const names[] = {"object", "array", "string", "integer", "number", "boolean", "null"};
    static const int b[] = {T_OBJ, T_ARR, T_STR, T_INT, T_NUM | T_INT, T_BOOL, T_NULL};
    const cJSON *one = t;
    *bits = 0;
    if (cJSON_IsArray(t)) one = t->child;
    for (; one; one = cJSON_IsArray(t) ? one->next : NULL) {
        int k = 0;
        while (k < 7 && !(cJSON_IsString(one) && !strcmp(one->valuestring, names[k]))) k++;
        if (k == 7) return cfail(c, "%s", "'type' must be a type name or a list of them");
        *bits |= b[k];
    }
    if (!*bits) return cfail(c, "%s", "'type' is an empty list");
    return 0;
}

/* enum / const: the values' texts, as the reply must write them (json.dumps spacing) */
static int enum_texts(Compiler *c, int id, const cJSON *vals, int n) {
    if (n < 1 || n > MAX_ENUM) return cfail(c, "%s", "'enum' must list 1 to 64 values");
    char **t = calloc((size_t)n, sizeof *t);
    if (!t) return err_set(c->err, Q35_ERR_OOM, "out of memory");
    c->s->n[id].enum_txt = t;
    c->s->n[id].n_enum = n;
    int i = 0;
    for (const cJSON *v = vals; v && i < n; v = v->next, i++) {
        StrBuf b = {0};
        pyjson_dump_strict(&b, v);
        if (b.oom || !b.p) {
            sb_free(&b);
            return err_set(c->err, Q35_ERR_OOM, "out of memory");
        }
        t[i] = b.p;
    }
    return 0;
}

/* A property name as a reply writes it between the quotes (JSON-escaped), malloc'ed; NULL when out of memory. */
static char *key_text(const char *name) {
    StrBuf b = {0};
    pyjson_dump_string(&b, name, strlen(name));
    if (b.oom || !b.p) {
        sb_free(&b);
        return NULL;
    }
    b.p[b.n - 1] = 0; /* without the quotes */
    memmove(b.p, b.p + 1, b.n - 1);
    return b.p;
}

static int compile_object(Compiler *c, int id, const cJSON *js) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(js, "properties");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(js, "additionalProperties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(js, "required");
    if (props && !cJSON_IsObject(props)) return cfail(c, "%s", "'properties' must be an object");
    int np = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) np += !pyjson_key_shadowed(props->child, p);
    if (np > MAX_PROPS) return cfail(c, "%s", "more than 64 'properties'");
    if (np) {
        char **key = calloc((size_t)np, sizeof *key);
        int *prop = calloc((size_t)np, sizeof *prop);
        c->s->n[id].key = key;
        c->s->n[id].prop = prop;
        if (!key || !prop) return err_set(c->err, Q35_ERR_OOM, "out of memory");
        for (const cJSON *p = props->child; p; p = p->next) {
            if (pyjson_key_shadowed(props->child, p)) continue; /* a repeated name: its last schema, as a dict */
            int k = c->s->n[id].n_props++;
            if (!(c->s->n[id].key[k] = key_text(p->string))) return err_set(c->err, Q35_ERR_OOM, "out of memory");
            int r = compile_at(c, pyjson_key_value(p), ".properties.%s", p->string);
            if (r < 0) return -1;
            c->s->n[id].prop[k] = r;
        }
    }
    int a = props ? -1 : 0;
    if (addl) {
        if (cJSON_IsFalse(addl))
            a = -1;
        else if ((a = compile_at(c, addl, "%s", ".additionalProperties")) < 0)
            return -1;
    }
    c->s->n[id].addl = a;
    if (req) {
        if (!cJSON_IsArray(req)) return cfail(c, "%s", "'required' must be a list of names");
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            if (!cJSON_IsString(r)) return cfail(c, "%s", "'required' must be a list of names");
            char *t = key_text(r->valuestring);
            if (!t) return err_set(c->err, Q35_ERR_OOM, "out of memory");
            const SNode *n = &c->s->n[id];
            int k = 0;
            while (k < n->n_props && strcmp(n->key[k], t)) k++;
            free(t);
            if (k == n->n_props) return cfail(c, "required '%s' is not in 'properties'", r->valuestring);
            c->s->n[id].required |= 1ull << k;
        }
    }
    return 0;
}

/* The node of $ref target text ("#", "#/$defs/NAME", "#/definitions/NAME"). */
static int compile_ref(Compiler *c, const char *ref) {
    const cJSON *t = NULL;
    if (!strcmp(ref, "#"))
        t = c->s->root;
    else if (!strncmp(ref, "#/$defs/", 8))
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->s->root, "$defs"), ref + 8);
    else if (!strncmp(ref, "#/definitions/", 14))
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->s->root, "definitions"), ref + 14);
    else
        return cerr(c, "'$ref' %s: only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported", ref);
    if (!t) return cerr(c, "'$ref' %s names nothing", ref);
    return compile_at(c, t, "%s", "");
}

static int compile(Compiler *c, const cJSON *js) {
    if (cJSON_IsTrue(js)) return 0;
    if (cJSON_IsFalse(js)) return cerr(c, "%s", "the schema false accepts nothing");
    if (!cJSON_IsObject(js)) return cerr(c, "%s", "a schema must be an object or a boolean");
    for (int i = 0; i < c->s->nn; i++)
        if (c->s->src[i] == js) return i; /* compiled already (a shared or recursive $ref) */
    for (int i = 0; UNSUPPORTED[i]; i++)
        if (cJSON_GetObjectItemCaseSensitive(js, UNSUPPORTED[i]))
            return cerr(c, "'%s' is not supported", UNSUPPORTED[i]);
    const int id = new_node(c, js);
    if (id < 0) return -1;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(js, "$ref");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(js, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(js, "oneOf");
    if (ref || any) {
        for (int i = 0; ASSERTS[i]; i++)
            if (cJSON_GetObjectItemCaseSensitive(js, ASSERTS[i]))
                return cerr(c, "'%s' beside '$ref' / 'anyOf' / 'oneOf' is not supported", ASSERTS[i]);
        if (ref && any) return cerr(c, "%s", "'$ref' beside 'anyOf' / 'oneOf' is not supported");
    }
    if (ref) {
        if (!cJSON_IsString(ref)) return cerr(c, "%s", "'$ref' must be a string");
        int r = compile_ref(c, ref->valuestring);
        if (r < 0) return -1;
        c->s->n[id].ref = r;
        return id;
    }
    if (any) {
        int n = cJSON_GetArraySize(any), i = 0;
        if (!cJSON_IsArray(any) || n < 1 || n > MAX_ALTS) return cerr(c, "%s", "'anyOf' must list 1 to 16 schemas");
        for (const cJSON *a = any->child; a; a = a->next, i++) {
            char sfx[24];
            snprintf(sfx, sizeof sfx, ".anyOf[%d]", i);
            int r = compile_at(c, a, "%s", sfx);
            if (r < 0) return -1;
            c->s->n[id].alts[c->s->n[id].n_alts++] = r;
        }
        return id;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(js, "type");
    if (t && type_bits(c, t, &c->s->n[id].types)) return -1;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(js, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(js, "const");
    if (en && cn) return cerr(c, "%s", "'enum' beside 'const' is not supported");
    if (en && !cJSON_IsArray(en)) return cerr(c, "%s", "'enum' must be a list");
    if (en && enum_texts(c, id, en->child, cJSON_GetArraySize(en))) return -1;
    if (cn && enum_texts(c, id, cn, 1)) return -1;
    if (compile_object(c, id, js)) return -1;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(js, "items");
    if (items) {
        if (cJSON_IsArray(items)) return cerr(c, "%s", "'items' as a list (tuple form) is not supported");
        int r = compile_at(c, items, "%s", ".items");
        if (r < 0) return -1;
        c->s->n[id].items = r;
    }
    SNode *n = &c->s->n[id];
    if (get_count(c, js, "minItems", &n->min_items) || get_count(c, js, "maxItems", &n->max_items) ||
        get_count(c, js, "minLength", &n->min_len) || get_count(c, js, "maxLength", &n->max_len))
        return -1;
    if ((n->max_items >= 0 && n->max_items < n->min_items) || (n->max_len >= 0 && n->max_len < n->min_len))
        return cerr(c, "%s", "a maximum below its minimum accepts nothing");
    return id;
}

/* The node a value of node id is read by ($ref followed); -1 on a cycle of $refs. */
static int resolve(const Schema *s, int id) {
    for (int k = 0; k <= s->nn && id >= 0; k++) {
        if (s->n[id].ref < 0) return id;
        id = s->n[id].ref;
    }
    return -1;
}

/* The classes (C_*) of the first bytes of node id's values; depth guards a cycle of alternatives. */
static int classes(const Schema *s, int id, int depth) {
    id = resolve(s, id);
    if (id < 0 || depth > 32) return 0;
    const SNode *n = &s->n[id];
    int cl = 0;
    if (n->n_alts) {
        for (int i = 0; i < n->n_alts; i++) cl |= classes(s, n->alts[i], depth + 1);
        return cl;
    }
    if (n->n_enum) {
        for (int i = 0; i < n->n_enum; i++) {
            char f = n->enum_txt[i][0];
            cl |= f == '{'   ? C_OBJ
                  : f == '[' ? C_ARR
                  : f == '"' ? C_STR
                  : f == 't' ? C_TRUE
                  : f == 'f' ? C_FALSE
                  : f == 'n' ? C_NULL
                             : C_NUM;
        }
        return cl;
    }
    return (n->types & T_OBJ ? C_OBJ : 0) | (n->types & T_ARR ? C_ARR : 0) | (n->types & T_STR ? C_STR : 0) |
           (n->types & (T_INT | T_NUM) ? C_NUM : 0) | (n->types & T_BOOL ? C_TRUE | C_FALSE : 0) |
           (n->types & T_NULL ? C_NULL : 0);
}

int schema_compile(const char *text, size_t len, const char *what, Schema **out, Err *err) {
    *out = NULL;
    Schema *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, Q35_ERR_OOM, "out of memory");
    Compiler c = {s, err, ""};
    snprintf(c.path, sizeof c.path, "%s", what);
    int rc = pyjson_parse(text, len, what, &s->root, err);
    if (!rc && (new_node(&c, NULL) < 0 || compile(&c, s->root) < 0)) rc = err->code;
    for (int i = 0; !rc && i < s->nn; i++) {
        if (resolve(s, i) < 0) {
            snprintf(c.path, sizeof c.path, "%s", what);
            rc = cfail(&c, "%s", "a cycle of '$ref's accepts nothing");
        }
        const SNode *n = &s->n[i];
        int seen = 0;
        for (int a = 0; !rc && a < n->n_alts; a++) {
            int cl = classes(s, n->alts[a], 0);
            if (cl & seen) {
                snprintf(c.path, sizeof c.path, "%s", what);
                rc = cfail(&c, "%s",
                           "'anyOf' / 'oneOf' alternatives that a value's first byte cannot tell apart (two objects, "
                           "two strings, ...) are not supported");
            }
            seen |= cl;
        }
    }
    if (rc) {
        schema_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void schema_free(Schema *s) {
    if (!s) return;
    for (int i = 0; i < s->nn; i++) {
        SNode *n = &s->n[i];
        for (int k = 0; k < n->n_enum; k++) free(n->enum_txt[k]);
        for (int k = 0; k < n->n_props; k++) free(n->key[k]);
        free(n->enum_txt);
        free(n->key);
        free(n->prop);
    }
    free(s->n);
    free(s->src);
    cJSON_Delete(s->root);
    free(s);
}

/* ---- the reader ---- */

enum { M_VALUE, M_STRUCT, M_STR, M_NUM, M_LIT, M_ENUM, M_KEY, M_DONE };
enum { P_KEY_OR_END, P_KEY, P_COLON, P_AFTER, P_ITEM_OR_END, P_ITEM };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

void schema_start(const Schema *s, SchemaState *st) {
    memset(st, 0, sizeof *st);
    st->mode = M_VALUE;
    st->node = s->nn > 1 ? 1 : 0;
}

static int is_ws(unsigned c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static int is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static int is_hex(unsigned c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* a value closed: 2 at the top, else back to its container */
static int value_end(SchemaState *st) {
    st->mode = st->depth ? M_STRUCT : M_DONE;
    return st->depth ? 1 : 2;
}

static uint64_t all_props(const SNode *n) { return n->n_props == 64 ? ~0ull : (1ull << n->n_props) - 1; }

/* The enum values of n still matching after sub bytes whose byte sub is c. */
static uint64_t enum_next(const SNode *n, uint64_t alive, int sub, unsigned c) {
    uint64_t a = 0;
    for (int i = 0; i < n->n_enum; i++)
        if ((alive >> i & 1) && (unsigned char)n->enum_txt[i][sub] == c && c) a |= 1ull << i;
    return a;
}
/* Whether one of the alive values is exactly sub bytes long; *longer: one goes on. */
static int enum_complete(const SNode *n, uint64_t alive, int sub, int *longer) {
    int done = 0;
    *longer = 0;
    for (int i = 0; i < n->n_enum; i++)
        if (alive >> i & 1) {
            if ((int)strlen(n->enum_txt[i]) == sub)
                done = 1;
            else
                *longer = 1;
        }
    return done;
}

static int start_value(const Schema *s, SchemaState *st, int id, unsigned c) {
    id = resolve(s, id);
    int cl = c == '{'                  ? C_OBJ
             : c == '['                ? C_ARR
             : c == '"'                ? C_STR
             : c == 't'                ? C_TRUE
             : c == 'f'                ? C_FALSE
             : c == 'n'                ? C_NULL
             : c == '-' || is_digit(c) ? C_NUM
                                       : 0;
    if (!cl) return 0;
    for (int k = 0; id >= 0 && s->n[id].n_alts && k < 32; k++) { /* the alternative c starts */
        const SNode *n = &s->n[id];
        int pick = -1;
        for (int a = 0; a < n->n_alts && pick < 0; a++)
            if (classes(s, n->alts[a], 0) & cl) pick = n->alts[a];
        if (pick < 0) return 0;
        id = resolve(s, pick);
    }
    if (id < 0) return 0;
    const SNode *n = &s->n[id];
    st->node = id;
    if (n->n_enum) {
        uint64_t all = n->n_enum == 64 ? ~0ull : (1ull << n->n_enum) - 1;
        st->alive = enum_next(n, all, 0, c);
        if (!st->alive) return 0;
        st->mode = M_ENUM;
        st->sub = 1;
        int longer, done = enum_complete(n, st->alive, 1, &longer);
        return done && !longer ? value_end(st) : 1;
    }
    switch (cl) {
    case C_OBJ:
    case C_ARR:
        if (!(n->types & (cl == C_OBJ ? T_OBJ : T_ARR)) || st->depth == SCHEMA_DEPTH) return 0;
        st->f[st->depth++] = (SchemaFrame){0, id, 0, cl == C_OBJ, cl == C_OBJ ? P_KEY_OR_END : P_ITEM_OR_END};
        st->mode = M_STRUCT;
        return 1;
    case C_STR:
        if (!(n->types & T_STR)) return 0;
        st->mode = M_STR;
        st->len = st->esc = st->hi = 0;
        return 1;
    case C_NUM:
        if (!(n->types & (T_INT | T_NUM))) return 0;
        st->mode = M_NUM;
        st->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        return 1;
    default:
        if (!(n->types & (cl == C_NULL ? T_NULL : T_BOOL))) return 0;
        st->mode = M_LIT;
        st->lit = cl == C_TRUE ? "true" : cl == C_FALSE ? "false" : "null";
        st->sub = 1;
        return 1;
    }
}

/* The string lexer shared by values and keys: 0 refused, 1 a byte inside, 2 the closing quote; *begins: c begins
 * a character (a backslash, or a character's first byte; a \uXXXX pair of surrogates counts as two). */
static int str_byte(SchemaState *st, unsigned c, int *begins) {
    *begins = 0;
    if (st->esc == 1) {
        if (c == 'u') {
            st->esc = 2;
            st->sub = 4;
            st->hex = 0;
            return 1;
        }
        if (st->hi || !c || !strchr("\"\\/bfnrt", (int)c)) return 0; /* a high surrogate wants \u + a low one */
        st->esc = 0;
        return 1;
    }
    if (st->esc == 2) {
        if (!is_hex(c)) return 0;
        st->hex = st->hex << 4 | (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        if (--st->sub) return 1;
        st->esc = 0;
        const int low = st->hex >= 0xDC00 && st->hex <= 0xDFFF;
        if (low != st->hi) return 0; /* unpaired surrogates are not text (cJSON and UTF-8 both refuse them) */
        st->hi = st->hex >= 0xD800 && st->hex <= 0xDBFF;
        return 1;
    }
    if (st->hi && c != '\\') return 0;
    if (c < 0x20) return 0;
    if (c == '"') return 2;
    if (c == '\\') st->esc = 1;
    *begins = c < 0x80 || c >= 0xC0;
    return 1;
}

static int key_possible(const SNode *n, uint64_t seen) { return (seen & all_props(n)) != all_props(n) || n->addl >= 0; }

static int close_frame(SchemaState *st) {
    st->depth--;
    return value_end(st);
}

int schema_step(const Schema *s, SchemaState *st, unsigned c) {
    switch (st->mode) {
    case M_STR: {
        const SNode *n = &s->n[st->node];
        int begins, r = str_byte(st, c, &begins);
        if (r == 2) return st->len >= n->min_len ? value_end(st) : 0;
        if (begins && n->max_len >= 0 && st->len >= n->max_len) return 0;
        st->len += begins;
        return r;
    }
    case M_KEY: {
        SchemaFrame *f = &st->f[st->depth - 1];
        const SNode *n = &s->n[f->node];
        int begins, r = str_byte(st, c, &begins);
        if (!r) return 0;
        if (r == 2) { /* the key is complete: a declared property of exactly these bytes, else another key */
            int k = -1;
            for (int i = 0; i < n->n_props && k < 0; i++)
                if ((st->alive >> i & 1) && (int)strlen(n->key[i]) == st->len) k = i;
            if (k < 0 && !st->key_other) return 0;
            if (k >= 0) f->seen |= 1ull << k;
            st->node = k >= 0 ? n->prop[k] : n->addl;
            f->phase = P_COLON;
            st->mode = M_STRUCT;
            return 1;
        }
        uint64_t a = 0;
        for (int i = 0; i < n->n_props; i++)
            if ((st->alive >> i & 1) && (unsigned char)n->key[i][st->len] == c) a |= 1ull << i;
        st->alive = a;
        st->len++; /* key bytes matched */
        return a || st->key_other;
    }
    case M_NUM: {
        int x = st->sub, next = -1, int_only = !(s->n[st->node].types & T_NUM);
        if (x == N_MINUS)
            next = c == '0' ? N_ZERO : is_digit(c) ? N_INT : -1;
        else if (x == N_INT && is_digit(c))
            next = N_INT;
        else if ((x == N_ZERO || x == N_INT) && c == '.' && !int_only)
            next = N_DOT;
        else if ((x == N_DOT || x == N_FRAC) && is_digit(c))
            next = N_FRAC;
        else if ((x == N_ZERO || x == N_INT || x == N_FRAC) && (c == 'e' || c == 'E') && !int_only)
            next = N_E;
        else if (x == N_E && (c == '+' || c == '-'))
            next = N_ESIGN;
        else if ((x == N_E || x == N_ESIGN || x == N_EXP) && is_digit(c))
            next = N_EXP;
        if (next >= 0) {
            st->sub = next;
            return 1;
        }
        if (x != N_ZERO && x != N_INT && x != N_FRAC && x != N_EXP) return 0;
        if (value_end(st) == 2) return 0; /* nothing may follow the top-level value */
        return schema_step(s, st, c);
    }
    case M_LIT:
        if (c != (unsigned char)st->lit[st->sub]) return 0;
        return st->lit[++st->sub] ? 1 : value_end(st);
    case M_ENUM: {
        const SNode *n = &s->n[st->node];
        uint64_t a = enum_next(n, st->alive, st->sub, c);
        int longer;
        if (!a) { /* a value that more bytes could have extended (a number) ends before c */
            if (!enum_complete(n, st->alive, st->sub, &longer) || value_end(st) == 2) return 0;
            return schema_step(s, st, c);
        }
        st->alive = a;
        st->sub++;
        int done = enum_complete(n, a, st->sub, &longer);
        return done && !longer ? value_end(st) : 1;
    }
    case M_DONE: return 0;
    }
    if (is_ws(c)) return ++st->ws <= WS_MAX;
    st->ws = 0;
    if (st->mode == M_VALUE) return start_value(s, st, st->node, c);
    /* M_STRUCT: between the tokens of the open container */
    SchemaFrame *f = &st->f[st->depth - 1];
    const SNode *n = &s->n[f->node];
    if (f->obj) {
        const int may_close = (n->required & ~f->seen) == 0;
        switch (f->phase) {
        case P_KEY_OR_END:
        case P_KEY:
            if (c == '}' && f->phase == P_KEY_OR_END) return may_close ? close_frame(st) : 0;
            if (c != '"' || !key_possible(n, f->seen)) return 0;
            st->mode = M_KEY;
            st->alive = all_props(n) & ~f->seen;
            st->key_other = n->addl >= 0;
            st->len = st->esc = st->hi = 0;
            return 1;
        case P_COLON:
            if (c != ':') return 0;
            f->phase = P_AFTER;
            st->mode = M_VALUE;
            return 1;
        default: /* P_AFTER */
            if (c == '}') return may_close ? close_frame(st) : 0;
            if (c != ',' || !key_possible(n, f->seen)) return 0;
            f->phase = P_KEY;
            return 1;
        }
    }
    const int may_close = f->count >= n->min_items, more = n->max_items < 0 || f->count < n->max_items;
    if (c == ']') return may_close && f->phase != P_ITEM ? close_frame(st) : 0;
    if (f->phase == P_AFTER) {
        if (c != ',' || !more) return 0;
        f->phase = P_ITEM; /* an item must follow */
        return 1;
    }
    if (!more || f->count == 0xFFFF) return 0;
    f->count++;
    f->phase = P_AFTER;
    return start_value(s, st, n->items, c);
}

int schema_in_string(const Schema *s, const SchemaState *st, int *left) {
    if (st->esc || st->hi) return 0;
    if (st->mode == M_KEY && !st->alive && st->key_other) { /* a key that can only be an undeclared one */
        *left = -1;
        return 1;
    }
    if (st->mode != M_STR) return 0;
    const int max = s->n[st->node].max_len;
    *left = max < 0 ? -1 : max - st->len;
    return 1;
}

int schema_done(const Schema *s, const SchemaState *st) {
    if (st->mode == M_DONE) return 1;
    if (st->depth) return 0;
    if (st->mode == M_NUM) return st->sub == N_ZERO || st->sub == N_INT || st->sub == N_FRAC || st->sub == N_EXP;
    int longer;
    return st->mode == M_ENUM && enum_complete(&s->n[st->node], st->alive, st->sub, &longer);
}
