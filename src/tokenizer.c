/* tokenizer.c — loading a HF tokenizer.json (byte-level BPE: vocab, merges in "a b" or ["a","b"] form,
 * added tokens, NFC normalizer, Split regex + ByteLevel pre-tokenizer), the side files
 * (tokenizer_config.json, generation_config.json, chat_template.jinja), decoding, and the streaming
 * detokenizer. Byte-level alphabet (TOKENIZER.md §3): bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to the
 * same code point; the other 68 bytes, in increasing order, to U+0100..U+0143. Every vocab string is
 * stored as the raw bytes it stands for, so BPE runs on bytes and decoding is a table lookup. */
#include "tokenizer.h"

#include "strbuf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

/* Qwen3 / Qwen3.5 split patterns (TOKENIZER.md §4); only the \p{M} differs. */
static const char QWEN3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char QWEN35_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* GPT-2's pattern: what a ByteLevel pre-tokenizer with use_regex = true splits with. */
static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Code point of the symbol for byte b. */
static int byte_to_cp(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
    return 0x100 + n;
}

/* Maps a byte-level symbol string to bytes: returns the byte count, or -1 if some character is not a
 * byte symbol. inv[cp] = byte + 1 for cp < 0x144, 0 otherwise. */
static int symbols_to_bytes(const unsigned char *s, const uint16_t *inv, unsigned char *out) {
    int n = 0;
    while (*s) {
        uint32_t cp;
        if (s[0] < 0x80) { cp = s[0]; s += 1; }
        else if ((s[0] & 0xE0) == 0xC0 && s[1]) { cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); s += 2; }
        else return -1; /* 3- and 4-byte characters are never byte symbols */
        if (cp >= 0x144 || !inv[cp]) return -1;
        out[n++] = (unsigned char)(inv[cp] - 1);
    }
    return n;
}

static int strmap_init(StrMap *m, int n) {
    uint32_t cap = 1024;
    while (cap < (uint32_t)n * 2) cap <<= 1;
    m->slot = calloc(cap, sizeof *m->slot);
    m->mask = cap - 1;
    return m->slot ? 0 : -1;
}
/* The inline part of a key and its hash (over the inline words, the length and any bytes past 12). */
static inline uint64_t strkey(const unsigned char *s, size_t n, uint64_t *k0, uint32_t *k1) {
    *k0 = 0;
    *k1 = 0;
    memcpy(k0, s, n < 8 ? n : 8);
    if (n > 8) memcpy(k1, s + 8, n < 12 ? n - 8 : 4);
    uint64_t h = (*k0 ^ ((uint64_t)*k1 << 32 | *k1) * 0xC2B2AE3D27D4EB4Full ^ n) * 0x9E3779B97F4A7C15ull;
    if (n > 12) h ^= tok_hash_bytes(s + 12, n - 12);
    return h ^ (h >> 31);
}
/* Finds the id of bytes s[0..n) among t's arena strings, or -1. */
static int strmap_get(const Tokenizer *t, const StrMap *m, const void *s, size_t n) {
    uint64_t k0;
    uint32_t k1, ln = (uint32_t)(n < 255 ? n : 255);
    for (uint32_t i = (uint32_t)strkey(s, n, &k0, &k1) & m->mask;; i = (i + 1) & m->mask) {
        const StrSlot *e = &m->slot[i];
        if (!e->meta) return -1;
        if (e->k0 != k0 || e->k1 != k1 || e->meta >> 24 != ln) continue;
        int id = (int)(e->meta & 0xFFFFFF) - 1;
        if (n <= 12 || (t->len[id] == n && !memcmp(t->arena + t->off[id] + 12, (const char *)s + 12, n - 12))) return id;
    }
}
static void strmap_put(const Tokenizer *t, StrMap *m, int id) {
    const unsigned char *s = (const unsigned char *)t->arena + t->off[id];
    size_t n = t->len[id];
    uint64_t k0;
    uint32_t k1, i = (uint32_t)strkey(s, n, &k0, &k1) & m->mask;
    while (m->slot[i].meta) i = (i + 1) & m->mask;
    m->slot[i] = (StrSlot){k0, k1, (uint32_t)(id + 1) | (uint32_t)(n < 255 ? n : 255) << 24};
}

static int has_string(const cJSON *o, const char *key, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && !strcmp(v->valuestring, want);
}
/* True when the key is absent, null, false, "" or 0 — the "feature off" values of HF files. */
static int is_off(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsString(v) && !v->valuestring[0]) ||
           (cJSON_IsNumber(v) && v->valuedouble == 0);
}

/* normalizer: NFC; pre_tokenizer: Sequence[Split(Regex, Isolated), ByteLevel(use_regex false)] or a
 * lone ByteLevel(use_regex true). Sets *pattern (borrowed from the JSON or static). */
static int check_pipeline(const cJSON *root, const char *what, const char **pattern, int *literal, Err *err) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!has_string(norm, "type", "NFC"))
        return err_set(err, Q35_ERR_UNSUPPORTED, "%s: normalizer must be {\"type\":\"NFC\"}", what);
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *split = NULL, *bl = NULL;
    if (has_string(pre, "type", "Sequence")) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
        if (cJSON_GetArraySize(seq) == 2) {
            split = cJSON_GetArrayItem(seq, 0);
            bl = cJSON_GetArrayItem(seq, 1);
            if (!has_string(split, "type", "Split") || !has_string(bl, "type", "ByteLevel")) split = bl = NULL;
        }
    } else if (has_string(pre, "type", "ByteLevel")) {
        bl = pre;
    }
    if (!bl) return err_set(err, Q35_ERR_UNSUPPORTED, "%s: pre_tokenizer must be Sequence[Split, ByteLevel] or ByteLevel", what);
    if (!is_off(bl, "add_prefix_space"))
        return err_set(err, Q35_ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel add_prefix_space is not supported", what);
    *literal = 0;
    if (!split) {
        if (is_off(bl, "use_regex"))
            return err_set(err, Q35_ERR_UNSUPPORTED, "%s: lone ByteLevel pre_tokenizer without use_regex", what);
        *pattern = GPT2_REGEX;
        return 0;
    }
    if (!is_off(bl, "use_regex"))
        return err_set(err, Q35_ERR_UNSUPPORTED, "%s: ByteLevel use_regex after a Split is not supported", what);
    if (!has_string(split, "behavior", "Isolated") || !is_off(split, "invert"))
        return err_set(err, Q35_ERR_UNSUPPORTED, "%s: Split must have behavior Isolated and invert false", what);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(split, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    if (cJSON_IsString(re)) *pattern = re->valuestring;
    else if (cJSON_IsString(str)) { *pattern = str->valuestring; *literal = 1; }
    else return err_set(err, Q35_ERR_FORMAT, "%s: pre_tokenizer Split.pattern has no Regex or String", what);
    return 0;
}

static int check_model(const cJSON *model, const char *what, Err *err) {
    if (!has_string(model, "type", "BPE")) return err_set(err, Q35_ERR_UNSUPPORTED, "%s: model.type must be BPE", what);
    static const char *off_keys[] = {"byte_fallback", "ignore_merges", "continuing_subword_prefix",
                                     "end_of_word_suffix", "dropout", "unk_token"};
    for (size_t i = 0; i < sizeof off_keys / sizeof *off_keys; i++)
        if (!is_off(model, off_keys[i]))
            return err_set(err, Q35_ERR_UNSUPPORTED, "%s: model.%s is set; only plain byte-level BPE is supported",
                           what, off_keys[i]);
    return 0;
}

/* Fills arena/off/len/kind for the vocab and the added tokens, and the vocab map. */
static int load_strings(Tokenizer *t, const cJSON *vocab, const cJSON *added, const uint16_t *inv, const char *what,
                        Err *err) {
    int nv = cJSON_GetArraySize(vocab), na = cJSON_GetArraySize(added);
    size_t bytes = 0;
    int max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= 0xFFFFFF || !it->string)
            return err_set(err, Q35_ERR_FORMAT, "%s: model.vocab entry \"%.40s\" has no valid id", what,
                           it->string ? it->string : "");
        bytes += strlen(it->string);
        if (it->valueint > max_id) max_id = it->valueint;
    }
    t->n_vocab = max_id + 1;
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= 0xFFFFFF || !cJSON_IsString(c) ||
            !c->valuestring[0])
            return err_set(err, Q35_ERR_FORMAT, "%s: added_tokens entry without id/content", what);
        static const char *unsup[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (!is_off(it, unsup[k]))
                return err_set(err, Q35_ERR_UNSUPPORTED, "%s: added token \"%s\" has %s set (not supported)", what,
                               c->valuestring, unsup[k]);
        bytes += strlen(c->valuestring);
        if (id->valueint > max_id) max_id = id->valueint;
    }
    t->n_total = max_id + 1;
    t->arena = malloc(bytes + 1);
    t->off = calloc((size_t)t->n_total, sizeof *t->off);
    t->len = calloc((size_t)t->n_total, sizeof *t->len);
    t->kind = calloc((size_t)t->n_total, 1);
    t->added = calloc((size_t)na + 1, sizeof *t->added);
    if (!t->arena || !t->off || !t->len || !t->kind || !t->added || strmap_init(&t->vocab, nv))
        return err_set(err, Q35_ERR_OOM, "%s: out of memory", what);
    size_t pos = 0;
    cJSON_ArrayForEach(it, vocab) {
        int id = it->valueint, n = symbols_to_bytes((const unsigned char *)it->string, inv,
                                                     (unsigned char *)t->arena + pos);
        if (t->kind[id]) return err_set(err, Q35_ERR_FORMAT, "%s: model.vocab id %d appears twice", what, id);
        int byte_level = n >= 0;
        if (!byte_level) { /* HF's ByteLevel decoder emits such a token's UTF-8 as is */
            n = (int)strlen(it->string);
            memcpy(t->arena + pos, it->string, (size_t)n);
        }
        t->off[id] = (uint32_t)pos;
        t->len[id] = (uint32_t)n;
        t->kind[id] = 1;
        pos += (size_t)n;
        if (byte_level && n > 0) {
            if (strmap_get(t, &t->vocab, t->arena + t->off[id], (size_t)n) >= 0)
                return err_set(err, Q35_ERR_FORMAT, "%s: model.vocab has \"%.40s\" twice", what, it->string);
            strmap_put(t, &t->vocab, id);
        }
    }
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        const char *c = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        /* decoded bytes: the byte-symbol mapping when every character is a byte symbol, else raw UTF-8 */
        int n = symbols_to_bytes((const unsigned char *)c, inv, (unsigned char *)t->arena + pos);
        if (n < 0) {
            n = (int)strlen(c);
            memcpy(t->arena + pos, c, (size_t)n);
        }
        if (t->kind[id] != 1) { /* an id also in model.vocab keeps the vocab bytes (the vocab map needs them) */
            t->off[id] = (uint32_t)pos;
            t->len[id] = (uint32_t)n;
            pos += (size_t)n;
        }
        t->kind[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special")) ? 3 : 2;
        AddedToken *a = &t->added[t->n_added++];
        a->content = c; /* re-pointed to owned memory below */
        a->len = (int)strlen(c);
        a->id = id;
        a->special = t->kind[id] == 3;
    }
    return 0;
}

static int cmp_added(const void *pa, const void *pb) {
    const AddedToken *a = pa, *b = pb;
    unsigned char fa = (unsigned char)a->content[0], fb = (unsigned char)b->content[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    return b->len - a->len; /* longest first */
}

/* Copies the added-token contents into one owned block, sorts them and builds added_first. */
static int index_added(Tokenizer *t, Err *err) {
    size_t total = 0;
    for (int i = 0; i < t->n_added; i++) total += (size_t)t->added[i].len + 1;
    char *block = malloc(total + 1);
    if (!block) return err_set(err, Q35_ERR_OOM, "out of memory");
    size_t p = 0;
    for (int i = 0; i < t->n_added; i++) {
        memcpy(block + p, t->added[i].content, (size_t)t->added[i].len + 1);
        t->added[i].content = block + p;
        p += (size_t)t->added[i].len + 1;
    }
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    /* added[0].content is the block start (it is freed through it) only if sorted first; keep it apart */
    t->added[t->n_added].content = block;
    int j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < t->n_added && (unsigned char)t->added[j].content[0] < b) j++;
        t->added_first[b] = j;
    }
    return 0;
}

/* Reads model.merges (strings "a b" or pairs ["a","b"]); rank = index. */
static int load_merges(Tokenizer *t, const cJSON *merges, const uint16_t *inv, const char *what, Err *err) {
    int nm = cJSON_GetArraySize(merges);
    uint32_t cap = 1024;
    while (cap < (uint32_t)nm * 2) cap <<= 1;
    t->merges = calloc(cap, sizeof *t->merges);
    t->merge_mask = cap - 1;
    if (!t->merges) return err_set(err, Q35_ERR_OOM, "%s: out of memory", what);
    unsigned char a[1024], b[512];
    char tmp[1024];
    int rank = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, merges) {
        const char *sa, *sb;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            size_t la = sp ? (size_t)(sp - it->valuestring) : 0;
            if (!sp || strchr(sp + 1, ' ') || la >= sizeof tmp)
                return err_set(err, Q35_ERR_FORMAT, "%s: model.merges[%d] \"%.40s\" is not \"a b\"", what, rank,
                               it->valuestring);
            memcpy(tmp, it->valuestring, la);
            tmp[la] = 0;
            sa = tmp;
            sb = sp + 1;
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            sa = it->child->valuestring;
            sb = it->child->next->valuestring;
        } else {
            return err_set(err, Q35_ERR_FORMAT, "%s: model.merges[%d] is neither \"a b\" nor [\"a\",\"b\"]", what, rank);
        }
        if (strlen(sa) >= sizeof b || strlen(sb) >= sizeof b)
            return err_set(err, Q35_ERR_FORMAT, "%s: model.merges[%d] is too long", what, rank);
        int na = symbols_to_bytes((const unsigned char *)sa, inv, a);
        int nb = na < 0 ? -1 : symbols_to_bytes((const unsigned char *)sb, inv, b);
        if (na <= 0 || nb <= 0) { /* not byte symbols: BPE over bytes can never form it */
            rank++;
            continue;
        }
        int ia = strmap_get(t, &t->vocab, a, (size_t)na), ib = strmap_get(t, &t->vocab, b, (size_t)nb);
        memcpy(a + na, b, (size_t)nb);
        int im = strmap_get(t, &t->vocab, a, (size_t)(na + nb));
        if (ia < 0 || ib < 0 || im < 0)
            return err_set(err, Q35_ERR_FORMAT, "%s: model.merges[%d] (\"%s\", \"%s\"): %s not in model.vocab", what,
                           rank, sa, sb, ia < 0 ? "left part" : ib < 0 ? "right part" : "merged token");
        uint64_t key = tok_pair_key((uint32_t)ia, (uint32_t)ib);
        uint32_t i = tok_pair_slot(key, t->merge_mask);
        while (t->merges[i].key && t->merges[i].key != key) i = (i + 1) & t->merge_mask;
        /* a repeated pair keeps its last rank, as HF's map insert does */
        t->merges[i] = (MergeSlot){key, (uint32_t)rank, (uint32_t)im};
        rank++;
    }
    return 0;
}

static int family_of(const Tokenizer *t) {
    int im = q35_token_id(t, "<|im_start|>");
    if (im == 151644) return Q35_TOK_QWEN3;
    if (im == 248045) return Q35_TOK_QWEN35;
    if (t->n_vocab >= 248000 && im >= 0) return Q35_TOK_QWEN35;
    return Q35_TOK_OTHER;
}

int tokenizer_load_json(Tokenizer **out, const char *json, size_t len, const char *what, Err *err) {
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return err_set(err, Q35_ERR_FORMAT, "%s: not valid JSON (near byte %td)", what,
                              cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : (ptrdiff_t)0);
    Tokenizer *t = calloc(1, sizeof *t);
    int rc = t ? 0 : err_set(err, Q35_ERR_OOM, "out of memory");
    const char *pattern = NULL;
    int literal = 0;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!rc) rc = check_pipeline(root, what, &pattern, &literal, err);
    if (!rc) rc = check_model(model, what, err);
    if (!rc && (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)))
        rc = err_set(err, Q35_ERR_FORMAT, "%s: model.vocab (object) or model.merges (list) missing", what);
    if (!rc && added && !cJSON_IsArray(added)) rc = err_set(err, Q35_ERR_FORMAT, "%s: added_tokens is not a list", what);
    uint16_t inv[0x144] = {0};
    for (int b = 0; b < 256; b++) inv[byte_to_cp(b)] = (uint16_t)(b + 1);
    if (!rc) rc = load_strings(t, vocab, added, inv, what, err);
    if (!rc) rc = index_added(t, err);
    for (int b = 0; !rc && b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if ((t->byte_id[b] = strmap_get(t, &t->vocab, &c, 1)) < 0)
            rc = err_set(err, Q35_ERR_FORMAT, "%s: model.vocab lacks the byte symbol U+%04X", what, byte_to_cp(b));
    }
    if (!rc) rc = load_merges(t, merges, inv, what, err);
    if (!rc) {
        t->family = family_of(t);
        if (literal) { /* a String pattern: match it literally */
            size_t n = strlen(pattern);
            char *q = malloc(2 * n + 1), *p = q;
            if (!q) rc = err_set(err, Q35_ERR_OOM, "out of memory");
            for (size_t i = 0; q && i < n; i++) {
                if (strchr("\\^$.|?*+()[]{}", pattern[i])) *p++ = '\\';
                *p++ = pattern[i];
            }
            if (q) { *p = 0; rc = tokenizer_compile_regex(t, q, err); free(q); }
        } else {
            if (t->family == Q35_TOK_QWEN35 && !strcmp(pattern, QWEN3_REGEX)) {
                snprintf(t->warning, sizeof t->warning,
                         "%s: Qwen3.5 vocabulary with the stale Qwen3 split regex; using the Qwen3.5 (\\p{M}) regex", what);
                pattern = QWEN35_REGEX;
            }
            rc = tokenizer_compile_regex(t, pattern, err);
        }
    }
    cJSON_Delete(root);
    if (!rc) rc = tokenizer_build_nfc_table(t, err);
    if (!rc) rc = tokenizer_build_direct(t, err);
    if (rc) { q35_tokenizer_free(t); return rc; }
    /* stop ids until a config says otherwise */
    const char *stops[] = {"<|im_end|>", "<|endoftext|>"};
    for (int i = 0; i < 2; i++) {
        int id = q35_token_id(t, stops[i]);
        if (id >= 0) t->stop_ids[t->n_stop++] = id;
    }
    *out = t;
    return 0;
}

/* ---- side files ---- */

static cJSON *read_json(const char *dir, const char *name, int *rc, Err *err) {
    char path[4096];
    char *data;
    size_t n;
    *rc = 0;
    if (path_join(path, sizeof path, dir, name) || !file_exists(path)) return NULL;
    if ((*rc = read_file(path, &data, &n, err))) return NULL;
    cJSON *j = cJSON_ParseWithLength(data, n);
    free(data);
    if (!j) *rc = err_set(err, Q35_ERR_FORMAT, "%s: not valid JSON", path);
    return j;
}

static void add_stop(Tokenizer *t, int id) {
    if (id < 0 || t->n_stop >= (int)(sizeof t->stop_ids / sizeof *t->stop_ids)) return;
    for (int i = 0; i < t->n_stop; i++)
        if (t->stop_ids[i] == id) return;
    t->stop_ids[t->n_stop++] = id;
}

int tokenizer_load_configs(Tokenizer *t, const char *dir, Err *err) {
    int rc;
    cJSON *cfg = read_json(dir, "tokenizer_config.json", &rc, err);
    if (rc) return rc;
    if (cfg) {
        const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
        if (cJSON_IsObject(eos)) eos = cJSON_GetObjectItemCaseSensitive(eos, "content");
        if (cJSON_IsString(eos)) {
            int id = q35_token_id(t, eos->valuestring);
            if (id >= 0) { /* eos first, then what was there */
                t->n_stop = 0;
                add_stop(t, id);
                add_stop(t, q35_token_id(t, "<|im_end|>"));
                add_stop(t, q35_token_id(t, "<|endoftext|>"));
            }
        }
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsArray(tpl)) { /* [{name, template}]: take "default" */
            const cJSON *e, *found = NULL;
            cJSON_ArrayForEach(e, tpl) if (has_string(e, "name", "default")) found = e;
            tpl = cJSON_GetObjectItemCaseSensitive(found, "template");
        }
        if (cJSON_IsString(tpl) && !(t->chat_template = strdup(tpl->valuestring)))
            rc = err_set(err, Q35_ERR_OOM, "out of memory");
        cJSON_Delete(cfg);
        if (rc) return rc;
    }
    char path[4096];
    if (!path_join(path, sizeof path, dir, "chat_template.jinja") && file_exists(path)) {
        char *data;
        size_t n;
        if ((rc = read_file(path, &data, &n, err))) return rc;
        free(t->chat_template);
        t->chat_template = data;
    }
    cJSON *gen = read_json(dir, "generation_config.json", &rc, err);
    if (rc) return rc;
    if (gen) {
        const cJSON *eos = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id");
        if (cJSON_IsNumber(eos) || cJSON_IsArray(eos)) t->n_stop = 0;
        if (cJSON_IsNumber(eos)) add_stop(t, eos->valueint);
        const cJSON *e;
        if (cJSON_IsArray(eos)) cJSON_ArrayForEach(e, eos) if (cJSON_IsNumber(e)) add_stop(t, e->valueint);
        cJSON_Delete(gen);
        for (int i = 0; i < t->n_stop; i++)
            if (t->stop_ids[i] >= t->n_total)
                return err_set(err, Q35_ERR_CONFIG, "%s/generation_config.json: eos_token_id %d is past the vocab (%d)",
                               dir, t->stop_ids[i], t->n_total);
    }
    return 0;
}

int q35_tokenizer_load_file(Q35Tokenizer **out, const char *path, Q35Err *err) {
    *out = NULL;
    char *data;
    size_t n;
    int rc = read_file(path, &data, &n, err);
    if (rc) return rc;
    Tokenizer *t;
    rc = tokenizer_load_json(&t, data, n, path, err);
    free(data);
    if (rc) return rc;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    if ((rc = tokenizer_load_configs(t, dir, err))) { q35_tokenizer_free(t); return rc; }
    *out = t;
    return 0;
}

int q35_tokenizer_load(Q35Tokenizer **out, const char *model_dir, Q35Err *err) {
    char path[4096];
    *out = NULL;
    if (path_join(path, sizeof path, model_dir, "tokenizer.json"))
        return err_set(err, Q35_ERR_ARG, "model path too long: %s", model_dir);
    return q35_tokenizer_load_file(out, path, err);
}

void q35_tokenizer_free(Q35Tokenizer *t) {
    if (!t) return;
    tokenizer_free_regex(t);
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->kind);
    free(t->vocab.slot);
    free(t->merges);
    if (t->added) free((void *)t->added[t->n_added].content);
    free(t->added);
    free(t->direct);
    free(t->chat_template);
    free(t);
}

int tokenizer_vocab_find(const Tokenizer *t, const void *s, size_t n) { return strmap_get(t, &t->vocab, s, n); }

int q35_tokenizer_size(const Q35Tokenizer *t) { return t ? t->n_total : 0; }
int q35_tokenizer_family(const Q35Tokenizer *t) { return t->family; }
const char *q35_tokenizer_warning(const Q35Tokenizer *t) { return t->warning[0] ? t->warning : NULL; }
int q35_tokenizer_stop_ids(const Q35Tokenizer *t, const int **ids) {
    *ids = t->stop_ids;
    return t->n_stop;
}
int q35_token_is_special(const Q35Tokenizer *t, int id) { return id >= 0 && id < t->n_total && t->kind[id] == 3; }

int q35_token_id(const Q35Tokenizer *t, const char *text) {
    size_t n = strlen(text);
    if (!n) return -1;
    unsigned char b = (unsigned char)text[0];
    for (int i = t->added_first[b]; i < t->added_first[b + 1]; i++)
        if ((size_t)t->added[i].len == n && !memcmp(t->added[i].content, text, n)) return t->added[i].id;
    return strmap_get(t, &t->vocab, text, n);
}

/* ---- decoding ---- */

size_t utf8_first_invalid(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) { i++; continue; }
        int k = utf8_valid_prefix(s + i, len - i);
        int need = s[i] >= 0xF0 ? 4 : s[i] >= 0xE0 ? 3 : 2;
        if (k != need) return i;
        i += (size_t)need;
    }
    return len;
}

/* Longest prefix of s[0..n) (at most one sequence) that is a valid start of a UTF-8 sequence; a complete
 * sequence gives its full length. 0 if s[0] cannot start one. (Unicode Table 3-7.) */
int utf8_valid_prefix(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    int k = 1;
    for (; k < need && (size_t)k < n; k++) {
        unsigned char x = s[k];
        if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) break;
    }
    return k;
}

/* Appends s[0..n) to out with each maximal invalid subpart replaced by U+FFFD (as Rust's
 * from_utf8_lossy). If hold, an incomplete but so-far-valid tail is not written; returns its length. */
static int put_lossy(StrBuf *out, const unsigned char *s, size_t n, int hold, size_t *held) {
    size_t i = 0, start = 0;
    *held = 0;
    if (!n) return sb_put(out, "", 0);
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        int need = s[i] >= 0xF0 ? 4 : s[i] >= 0xE0 ? 3 : 2;
        int k = utf8_valid_prefix(s + i, n - i);
        if (k == need) { i += (size_t)k; continue; }
        if (k > 0 && i + (size_t)k == n && hold) { /* incomplete at the end: keep it back */
            *held = (size_t)k;
            break;
        }
        if (sb_put(out, (const char *)s + start, i - start) || sb_put(out, "\xEF\xBF\xBD", 3)) return -1;
        i += k > 0 ? (size_t)k : 1;
        start = i;
    }
    return sb_put(out, (const char *)s + start, i - start);
}

static int check_id(const Tokenizer *t, int id, Err *err) {
    if (id < 0 || id >= t->n_total || !t->kind[id])
        return err_set(err, Q35_ERR_ARG, "token id %d is not in the vocabulary (size %d)", id, t->n_total);
    return 0;
}

int q35_detokenize(const Q35Tokenizer *t, const int *ids, int n, int skip_special, char **text, Q35Err *err) {
    *text = NULL;
    StrBuf raw = {0}, out = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = check_id(t, ids[i], err))) break;
        if (skip_special && t->kind[ids[i]] == 3) continue;
        if (sb_put(&raw, t->arena + t->off[ids[i]], (size_t)t->len[ids[i]])) rc = err_set(err, Q35_ERR_OOM, "out of memory");
    }
    size_t held;
    if (!rc && (put_lossy(&out, (const unsigned char *)raw.p, raw.n, 0, &held) || sb_put(&out, "", 0)))
        rc = err_set(err, Q35_ERR_OOM, "out of memory");
    sb_free(&raw);
    if (rc) {
        sb_free(&out);
        return rc;
    }
    *text = out.p;
    return 0;
}

/* ---- streaming ---- */

struct Q35Detok {
    const Tokenizer *t;
    int skip_special;
    unsigned char pend[8]; /* incomplete UTF-8 tail (at most 3 bytes) */
    size_t n_pend;
    StrBuf out;
};

int q35_detok_open(Q35Detok **out, const Q35Tokenizer *t, int skip_special, Q35Err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) return err_set(err, Q35_ERR_OOM, "out of memory");
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    return 0;
}

int q35_detok_push(Q35Detok *d, int id, const char **text, size_t *len, Q35Err *err) {
    d->out.n = 0;
    if (sb_put(&d->out, "", 0)) return err_set(err, Q35_ERR_OOM, "out of memory");
    *text = d->out.p;
    *len = 0;
    int rc = check_id(d->t, id, err);
    if (rc) return rc;
    if (d->skip_special && d->t->kind[id] == 3) return 0;
    const unsigned char *s = (const unsigned char *)d->t->arena + d->t->off[id];
    size_t n = d->t->len[id], held;
    /* complete the pending tail byte by byte, then run the rest */
    size_t used = 0;
    while (d->n_pend && used < n) {
        d->pend[d->n_pend++] = s[used++];
        int need = d->pend[0] >= 0xF0 ? 4 : d->pend[0] >= 0xE0 ? 3 : 2;
        int k = utf8_valid_prefix(d->pend, d->n_pend);
        if (k == (int)d->n_pend && k < need) continue; /* still incomplete */
        unsigned char tmp[8];
        size_t m = d->n_pend;
        memcpy(tmp, d->pend, m);
        d->n_pend = 0;
        if (put_lossy(&d->out, tmp, m, 1, &held)) return err_set(err, Q35_ERR_OOM, "out of memory");
        if (held) { /* the last bytes start a new incomplete sequence */
            memcpy(d->pend, tmp + m - held, held);
            d->n_pend = held;
        }
    }
    if (!d->n_pend && used < n) {
        if (put_lossy(&d->out, s + used, n - used, 1, &held)) return err_set(err, Q35_ERR_OOM, "out of memory");
        memcpy(d->pend, s + n - held, held);
        d->n_pend = held;
    }
    *text = d->out.p;
    *len = d->out.n;
    return 0;
}

void q35_detok_flush(Q35Detok *d, const char **text, size_t *len) {
    d->out.n = 0;
    size_t held;
    if (sb_put(&d->out, "", 0) == 0 && d->n_pend) put_lossy(&d->out, d->pend, d->n_pend, 0, &held);
    d->n_pend = 0;
    *text = d->out.p ? d->out.p : "";
    *len = d->out.n;
}

void q35_detok_close(Q35Detok *d) {
    if (!d) return;
    sb_free(&d->out);
    free(d);
}

/* ---- JSON string literals ----
 * cJSON keeps strings NUL-terminated, so a "\u0000" inside one would cut it short; the --jsonl input and
 * the test corpus need every code point, so this decodes one literal (RFC 8259 escapes, surrogate pairs).
 * s points at the opening quote; returns 0 and a malloc'ed *out (NUL-terminated, *n bytes) with *end just
 * past the closing quote, or -1 on a malformed literal (lone surrogates included). */
static int hex4(const char *s, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

int tokenizer_json_string(const char *s, char **out, size_t *n, const char **end) {
    *out = NULL;
    if (*s != '"') return -1;
    size_t cap = strlen(s) + 1, k = 0;
    unsigned char *o = malloc(cap);
    if (!o) return -1;
    const char *p = s + 1;
    for (;;) {
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c < 0x20) goto bad; /* includes the terminating NUL */
        if (c != '\\') { o[k++] = c; p++; continue; }
        p++;
        uint32_t u;
        switch (*p) {
        case '"': case '\\': case '/': o[k++] = (unsigned char)*p; p++; continue;
        case 'b': o[k++] = '\b'; p++; continue;
        case 'f': o[k++] = '\f'; p++; continue;
        case 'n': o[k++] = '\n'; p++; continue;
        case 'r': o[k++] = '\r'; p++; continue;
        case 't': o[k++] = '\t'; p++; continue;
        case 'u':
            if (hex4(p + 1, &u)) goto bad;
            p += 5;
            if (u >= 0xDC00 && u <= 0xDFFF) goto bad;
            if (u >= 0xD800 && u <= 0xDBFF) {
                uint32_t lo;
                if (p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) goto bad;
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (u < 0x80) o[k++] = (unsigned char)u;
            else if (u < 0x800) { o[k++] = (unsigned char)(0xC0 | (u >> 6)); o[k++] = (unsigned char)(0x80 | (u & 0x3F)); }
            else if (u < 0x10000) {
                o[k++] = (unsigned char)(0xE0 | (u >> 12));
                o[k++] = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
                o[k++] = (unsigned char)(0x80 | (u & 0x3F));
            } else {
                o[k++] = (unsigned char)(0xF0 | (u >> 18));
                o[k++] = (unsigned char)(0x80 | ((u >> 12) & 0x3F));
                o[k++] = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
                o[k++] = (unsigned char)(0x80 | (u & 0x3F));
            }
            continue;
        default: goto bad;
        }
    }
    o[k] = 0;
    *out = (char *)o;
    *n = k;
    *end = p + 1;
    return 0;
bad:
    free(o);
    return -1;
}
