/* test_chat_schema.c — the response_format reader (src/chat_schema.c) and its guide (q35_guide_* with
 * response_schema): documents it accepts, completes or refuses, byte by byte; the compile errors (one line, naming
 * the keyword and where); and a property check: a random "sampler" that only takes pieces the guide allows writes
 * replies that cJSON parses and that an independent validator (written here, over the parsed value) accepts. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_schema.h"
#include "qwen35.h"
#include "test.h"

/* clang-format off */
static const char *PERSON =
    "{\"type\": \"object\", \"title\": \"ignored\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 5, \"format\": \"ignored\"}, \"age\": {\"type\": \"integer\"}, "
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"red\", \"green\", 1, 12]}, \"maxItems\": 3}, "
    "\"x\": {\"anyOf\": [{\"type\": \"number\"}, {\"type\": \"null\"}, {\"type\": \"object\"}], \"default\": null}}, "
    "\"required\": [\"name\", \"age\"]}";
static const char *TREE =
    "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, "
    "\"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/node\"}}}, \"required\": [\"v\"]}}, "
    "\"$ref\": \"#/$defs/node\"}";
static const char *LIST = "{\"type\": \"array\", \"items\": {\"type\": [\"string\", \"boolean\"], \"minLength\": 1}, "
                          "\"minItems\": 1}";
static const char *OBJECT = "{\"type\": \"object\"}";
static const char *ENUM = "{\"enum\": [1, 12, \"a\", {\"k\": [true]}]}";
static const char *NUMBER = "{\"type\": \"number\"}";
/* clang-format on */

static Schema *compile(const char *text) {
    Schema *s = NULL;
    Q35Err err;
    int rc = schema_compile(text, strlen(text), "schema", &s, &err);
    CHECK(rc == 0, "compile %s: %s", text, err.msg);
    return s;
}

/* 0: refused at some byte; 1: every byte taken, not complete; 2: taken and complete */
static int read_doc(const Schema *s, const char *doc) {
    SchemaState st;
    schema_start(s, &st);
    for (const char *p = doc; *p; p++) {
        SchemaState t = st;
        if (!schema_step(s, &t, (unsigned char)*p)) return 0;
        st = t;
    }
    return schema_done(s, &st) ? 2 : 1;
}

typedef struct Case {
    const char **schema, *doc;
    int want;
} Case;

static void check_documents(void) {
    static const Case cases[] = {
        {&PERSON, "{\"name\": \"Bob\", \"age\": 3}", 2},
        {&PERSON, "  {\"age\": -0,\n  \"name\": \"Bob\"}", 2},
        {&PERSON, "{\"name\": \"Bob\"}", 0},
        {&PERSON, "{\"name\": \"Bob\", \"age\": 3", 1},
        {&PERSON, "{\"name\": \"Bobbyx\", \"age\": 1}", 0},
        {&PERSON, "{\"name\": \"\\u00e9\\n\\\"é\", \"age\": 0}", 2},
        {&PERSON, "{\"name\": \"a\x01\"", 0},
        {&PERSON, "{\"name\": \"\\ud83d\\ude00\", \"age\": 0}", 2},
        {&PERSON, "{\"name\": \"\\ud83dx", 0},
        {&PERSON, "{\"name\": \"\\ud83d\\n", 0},
        {&PERSON, "{\"name\": \"\\ude00", 0},
        {&PERSON, "{\"name\": \"\\ud83d\\ud83d", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1.5}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1e3}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 01}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"zz\": 1}", 0},
        {&PERSON, "{\"name\": \"B\", \"name\": \"C\", \"age\": 1}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"tags\": [\"red\", 12, 1]}", 2},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"tags\": [\"blue\"]}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"tags\": [1, 2]}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"tags\": [1,]}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"tags\": [\"red\", \"red\", \"red\", \"red\"]}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"x\": null}", 2},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"x\": -2.5E+3}", 2},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"x\": {\"q\": [1, {}]}}", 2},
        {&PERSON, "{\"name\": \"B\", \"age\": 1, \"x\": \"s\"}", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1} ", 0},
        {&PERSON, "{\"name\": \"B\", \"age\": 1}{", 0},
        {&PERSON, "[]", 0},
        {&TREE, "{\"v\": 1, \"kids\": [{\"v\": 2}, {\"kids\": [], \"v\": 3}]}", 2},
        {&TREE, "{\"v\": 1, \"kids\": [{\"w\": 2}]}", 0},
        {&LIST, "[\"a\", true, false]", 2},
        {&LIST, "[]", 0},
        {&LIST, "[\"\"]", 0},
        {&LIST, "[null]", 0},
        {&OBJECT, "{\"any\": [1, \"x\", null, {\"deep\": {}}], \"b\": -1.5e-3}", 2},
        {&OBJECT, "{}", 2},
        {&OBJECT, "[1]", 0},
        {&OBJECT, "{\"a\": tru}", 0},
        {&OBJECT, "{\"a\" 1}", 0},
        {&OBJECT, "{\"a\": 1,}", 0},
        {&ENUM, "1", 2},
        {&ENUM, "12", 2},
        {&ENUM, "13", 0},
        {&ENUM, "\"a\"", 2},
        {&ENUM, "{\"k\": [true]}", 2},
        {&ENUM, "{\"k\": [false]}", 0},
        {&NUMBER, "-", 1},
        {&NUMBER, "-1", 2},
        {&NUMBER, "1e", 1},
        {&NUMBER, "1e5", 2},
        {&NUMBER, "0.25", 2},
        {&NUMBER, "01", 0},
        {&NUMBER, "1.", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        Schema *s = compile(*cases[i].schema);
        if (!s) continue;
        int got = read_doc(s, cases[i].doc);
        CHECK(got == cases[i].want, "%s under %.40s...: got %d want %d", cases[i].doc, *cases[i].schema, got,
              cases[i].want);
        schema_free(s);
    }
    /* whitespace between tokens is bounded */
    Schema *s = compile(OBJECT);
    char doc[200] = "{";
    memset(doc + 1, ' ', 64);
    CHECK(read_doc(s, doc) == 1, "64 blanks in a row taken");
    strcat(doc, " ");
    CHECK(read_doc(s, doc) == 0, "65 blanks in a row refused");
    schema_free(s);
}

static void check_errors(void) {
    static const char *bad[][2] = {
        {"{\"type\": \"string\", \"pattern\": \"^a\"}", "schema: 'pattern' is not supported"},
        {"{\"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 0}}}",
         "schema.properties.a: 'minimum' is not supported"},
        {"{\"allOf\": [{\"type\": \"object\"}]}", "'allOf' is not supported"},
        {"{\"anyOf\": [{\"type\": \"object\"}, {\"type\": \"object\", \"properties\": {}}]}", "first byte"},
        {"{\"anyOf\": [{\"type\": \"integer\"}, {\"enum\": [1]}]}", "first byte"},
        {"{\"$ref\": \"#/components/x\"}", "'$ref' #/components/x: only"},
        {"{\"$ref\": \"#/$defs/missing\"}", "names nothing"},
        {"{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/a\"}}, \"$ref\": \"#/$defs/a\"}", "cycle"},
        {"{\"$ref\": \"#\", \"type\": \"object\"}", "'type' beside"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "required 'b' is not in"},
        {"{\"type\": \"strnig\"}", "'type' must be"},
        {"{\"type\": []}", "empty list"},
        {"false", "accepts nothing"},
        {"{\"items\": [{}]}", "tuple form"},
        {"{\"enum\": []}", "1 to 64 values"},
        {"{\"maxLength\": -1}", "non-negative"},
        {"{\"minItems\": 3, \"maxItems\": 2}", "below its minimum"},
        {"{\"type\": \"object\",", "schema"},
        {"[1]", "an object or a boolean"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        Schema *s = NULL;
        Q35Err err = {0};
        int rc = schema_compile(bad[i][0], strlen(bad[i][0]), "schema", &s, &err);
        CHECK(rc != 0 && !s && strstr(err.msg, bad[i][1]) && !strchr(err.msg, '\n'), "%s: rc %d [%s] want [%s]",
              bad[i][0], rc, err.msg, bad[i][1]);
        schema_free(s);
    }
}

/* ---- an independent validator over the parsed reply ---- */

static int utf8_chars(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int valid(const cJSON *sc, const cJSON *v, const cJSON *root, int depth) {
    if (depth > 64) return 0;
    if (cJSON_IsTrue(sc)) return 1;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sc, "$ref");
    if (ref) {
        const char *r = ref->valuestring;
        return valid(!strcmp(r, "#")
                         ? root
                         : cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "$defs"), r + 8),
                     v, root, depth + 1);
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(sc, "anyOf"), *a;
    if (any) {
        int k = 0;
        cJSON_ArrayForEach(a, any) k += valid(a, v, root, depth + 1);
        return k > 0;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sc, "enum");
    if (en) {
        int k = 0;
        cJSON_ArrayForEach(a, en) k += cJSON_Compare(a, v, 1);
        return k > 0;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sc, "type");
    if (ty) {
        int ok = 0;
        const cJSON *one = cJSON_IsArray(ty) ? ty->child : ty;
        for (; one; one = cJSON_IsArray(ty) ? one->next : NULL) {
            const char *t = one->valuestring;
            ok |= (!strcmp(t, "object") && cJSON_IsObject(v)) || (!strcmp(t, "array") && cJSON_IsArray(v)) ||
                  (!strcmp(t, "string") && cJSON_IsString(v)) || (!strcmp(t, "boolean") && cJSON_IsBool(v)) ||
                  (!strcmp(t, "null") && cJSON_IsNull(v)) || (!strcmp(t, "number") && cJSON_IsNumber(v)) ||
                  (!strcmp(t, "integer") && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble));
        }
        if (!ok) return 0;
    }
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(sc, "maxLength"),
                *mn = cJSON_GetObjectItemCaseSensitive(sc, "minLength");
    if (cJSON_IsString(v) &&
        ((mx && utf8_chars(v->valuestring) > mx->valueint) || (mn && utf8_chars(v->valuestring) < mn->valueint)))
        return 0;
    if (cJSON_IsArray(v)) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(sc, "items");
        mx = cJSON_GetObjectItemCaseSensitive(sc, "maxItems");
        mn = cJSON_GetObjectItemCaseSensitive(sc, "minItems");
        int n = cJSON_GetArraySize(v);
        if ((mx && n > mx->valueint) || (mn && n < mn->valueint)) return 0;
        cJSON_ArrayForEach(a, v) if (it && !valid(it, a, root, depth + 1)) return 0;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(sc, "properties"), *r;
        cJSON_ArrayForEach(a, v) {
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(props, a->string);
            if (p && !valid(p, a, root, depth + 1)) return 0;
            if (!p && props) return 0; /* no additionalProperties: none when properties are given */
            for (const cJSON *b = v->child; b != a && props; b = b->next)
                if (!strcmp(b->string, a->string)) return 0; /* a declared key twice (free objects may repeat keys) */
        }
        cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(sc, "required")) {
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return 0;
        }
    }
    return 1;
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A random sampler over JSON-ish pieces under the guide: every reply it completes must parse and validate. */
static void check_sampler(const char *schema, int thinking) {
    /* clang-format off */
    static const char *vocab[] = {
        "{", "}", "[", "]", ",", ":", " ", "\n", "\"", "\"name\"", "\"age\"", "\"tags\"", "\"x\"", "\"v\"",
        "\"kids\"", "a", "é", "\\n", "\\u00e9", "1", "0", "-", ".", "5", "e", "true", "false", "null", "\"red\"",
        "\"green\"", ": ", ", ", "12", "\"name\": \"", "\", ", "}]", "\"k\"", "[true]", "  ", "\t", "</think>",
        "\n\n", "hmm", "abcdef", "ab cd", "日本"};
    /* clang-format on */
    const int nv = (int)(sizeof vocab / sizeof *vocab);
    cJSON *root = cJSON_Parse(schema);
    uint64_t seed = 0x2545F4914F6CDD1Dull;
    int bad = 0, done = 0, mismatch = 0;
    for (int trial = 0; trial < 400; trial++) {
        Q35ChatRequest rq = {.family = Q35_TOK_QWEN35, .thinking = thinking, .response_schema = schema};
        Q35Guide *g;
        Q35Err err;
        if (q35_guide_open(&g, NULL, &rq, &err)) {
            CHECK(0, "guide open: %s", err.msg);
            break;
        }
        char out[8192];
        size_t n = 0;
        int ok = 1;
        /* without thinking, the guide must answer as the schema reader stepped byte by byte (its fast paths too) */
        Schema *ms = NULL;
        SchemaState mst;
        if (!thinking && !schema_compile(schema, strlen(schema), "m", &ms, &err)) schema_start(ms, &mst);
        for (int step = 0; step < 400 && ok; step++) {
            for (int v = 0; ms && v < nv; v++) {
                SchemaState t = mst;
                int want = 1;
                for (const char *p = vocab[v]; *p && want; p++) want = schema_step(ms, &t, (unsigned char)*p) != 0;
                mismatch += want != q35_guide_allows(g, vocab[v], strlen(vocab[v]));
            }
            if (q35_guide_can_stop(g) && rnd(&seed) % 2 == 0) break;
            const char *piece = NULL;
            for (int k = 0; k < 12 && !piece; k++) {
                int v = (int)(rnd(&seed) % (uint64_t)nv);
                if (q35_guide_allows(g, vocab[v], strlen(vocab[v]))) piece = vocab[v];
            }
            for (int k = 0, v0 = (int)(rnd(&seed) % (uint64_t)nv); k < nv && !piece; k++)
                if (q35_guide_allows(g, vocab[(v0 + k) % nv], strlen(vocab[(v0 + k) % nv])))
                    piece = vocab[(v0 + k) % nv];
            char one[2] = {0, 0};
            for (int c = 1; c < 256 && !piece; c++)
                if (q35_guide_allows(g, (char[]){(char)c, 0}, 1)) {
                    one[0] = (char)c;
                    piece = one;
                }
            if (!piece) break;
            size_t k = strlen(piece);
            if (n + k >= sizeof out) break;
            ok = q35_guide_push(g, piece, k, &err) == 0;
            for (size_t i = 0; ms && ok && i < k; i++) schema_step(ms, &mst, (unsigned char)piece[i]);
            memcpy(out + n, piece, k);
            n += k;
        }
        schema_free(ms);
        out[n] = 0;
        if (ok && q35_guide_can_stop(g)) {
            done++;
            const char *json = out;
            if (thinking) {
                const char *e = strstr(out, "</think>\n\n");
                json = e ? e + 10 : "";
            }
            cJSON *v = cJSON_Parse(json);
            int good = v && valid(root, v, root, 0);
            if (!good && bad++ < 3) fprintf(stderr, "guided reply does not validate: [%s]\n", json);
            cJSON_Delete(v);
        }
        CHECK(ok, "a piece the guide allowed was refused on push: [%s]", out);
        q35_guide_close(g);
    }
    cJSON_Delete(root);
    CHECK(done >= 100 && bad == 0 && mismatch == 0,
          "guided sampler (%.40s..., thinking %d): %d complete, %d bad, %d answers unlike the reader's", schema,
          thinking, done, bad, mismatch);
}

static void check_guide(void) {
    Q35ChatRequest rq = {.family = Q35_TOK_QWEN35,
                         .thinking = Q35_THINK_OFF,
                         .response_schema = OBJECT,
                         .tools = "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]",
                         .tool_choice = Q35_TOOL_CHOICE_REQUIRED};
    Q35Guide *g;
    Q35Err err;
    CHECK(q35_guide_open(&g, NULL, &rq, &err) == Q35_ERR_ARG && strstr(err.msg, "does not go with"),
          "tool_choice required with a response format: %s", err.msg);
    rq.tool_choice = Q35_TOOL_CHOICE_AUTO;
    rq.response_schema = "{\"type\": \"string\", \"pattern\": \"x\"}";
    CHECK(q35_guide_open(&g, NULL, &rq, &err) == Q35_ERR_ARG && !strcmp(err.msg, "response_format: 'pattern' is not "
                                                                                 "supported"),
          "unsupported keyword: [%s]", err.msg);
    rq.response_schema = NUMBER;
    if (q35_guide_open(&g, NULL, &rq, &err) == 0) {
        CHECK(!q35_guide_can_stop(g) && !strcmp(q35_guide_forced(g), ""), "nothing yet");
        CHECK(!q35_guide_allows(g, "Sure: 1", 7), "text before the value refused");
        CHECK(q35_guide_push(g, "-12", 3, &err) == 0 && q35_guide_can_stop(g), "a number may stop or go on");
        CHECK(q35_guide_allows(g, "5", 1) && !q35_guide_allows(g, "x", 1), "digits go on, text does not");
        q35_guide_close(g);
    }
    rq.thinking = Q35_THINK_ON;
    rq.response_schema = OBJECT;
    if (q35_guide_open(&g, NULL, &rq, &err) == 0) {
        CHECK(q35_guide_push(g, "plan {not json</thi", 19, &err) == 0, "reasoning is free");
        CHECK(!q35_guide_allows(g, "nk>{}", 5), "\\n\\n after </think>");
        CHECK(q35_guide_push(g, "nk>\n\n{\"a\": ", 11, &err) == 0 && !q35_guide_can_stop(g), "the value begins");
        CHECK(q35_guide_push(g, "[]}", 3, &err) == 0 && q35_guide_can_stop(g), "the value ends");
        q35_guide_close(g);
    }
}

int main(void) {
    check_documents();
    check_errors();
    check_guide();
    check_sampler(PERSON, Q35_THINK_OFF);
    check_sampler(TREE, Q35_THINK_OFF);
    check_sampler(LIST, Q35_THINK_OFF);
    check_sampler(OBJECT, Q35_THINK_ON);
    check_sampler(OBJECT, Q35_THINK_OFF);
    check_sampler(ENUM, Q35_THINK_OFF);
    return TEST_SUMMARY("chat_schema");
}
