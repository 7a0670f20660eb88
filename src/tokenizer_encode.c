/* tokenizer_encode.c — text -> ids (TOKENIZER.md §1, §4, §5):
 *   1. added tokens: leftmost match, longest first, on the raw text; each becomes its id;
 *   2. NFC of every other segment (utf8proc, only around characters that NFC can change);
 *   3. the Split regex (PCRE2, UTF + UCP, JIT), behaviour Isolated: matches and gaps are pieces;
 *   4. BPE inside each piece over byte symbols: repeatedly merge the adjacent pair of lowest merge rank
 *      (ties: leftmost). Short pieces use an array with cached pair ranks (O(n) lookups, O(n^2) compares);
 *      long ones a binary heap keyed (rank, position) over a linked list (O(n log n)). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <utf8proc.h>

#include "tokenizer.h"

enum { MAX_CP = 0x110000, SMALL_PIECE = 128 };

int idvec_push(IdVec *a, int id) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 64;
        int *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* ---- regex ---- */

/* Unicode White_Space, which is what \s means in Oniguruma (HF's regex engine). PCRE2's \s differs
 * (e.g. it takes U+180E), so \s and \S are spelled out with this set before compiling. */
static const char WHITE_SPACE[] = "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
                                  "\\x{202F}\\x{205F}\\x{3000}";

/* Copies pattern with \s -> [WS] (or WS inside a class) and \S -> [^WS] outside classes. */
static char *rewrite_spaces(const char *pattern) {
    size_t n = strlen(pattern), ws = strlen(WHITE_SPACE);
    char *out = malloc(n * (ws + 4) + 1), *o = out;
    if (!out) return NULL;
    int in_class = 0;
    for (const char *p = pattern; *p; p++) {
        if (*p == '\\' && p[1]) {
            if (p[1] == 's' || (p[1] == 'S' && !in_class)) {
                if (!in_class) *o++ = '[';
                if (p[1] == 'S') *o++ = '^';
                memcpy(o, WHITE_SPACE, ws);
                o += ws;
                if (!in_class) *o++ = ']';
            } else {
                *o++ = p[0];
                *o++ = p[1];
            }
            p++;
            continue;
        }
        if (!in_class && *p == '[') {
            in_class = 1;
            *o++ = *p;
            if (p[1] == '^') *o++ = *++p;
            if (p[1] == ']') *o++ = *++p; /* a leading ] is literal */
            continue;
        }
        if (in_class && *p == ']') in_class = 0;
        *o++ = *p;
    }
    *o = 0;
    return out;
}

int tokenizer_compile_regex(Tokenizer *t, const char *pattern, Err *err) {
    int ec;
    PCRE2_SIZE eo;
    char *rewritten = rewrite_spaces(pattern);
    if (!rewritten) return err_set(err, Q35_ERR_OOM, "out of memory");
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)rewritten, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    free(rewritten);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return err_set(err, Q35_ERR_FORMAT, "split regex does not compile at offset %zu: %s", (size_t)eo, (char *)msg);
    }
    t->re = re;
    t->re_jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    t->regex = strdup(pattern);
    if (!t->regex) return err_set(err, Q35_ERR_OOM, "out of memory");
    return 0;
}

void tokenizer_free_regex(Tokenizer *t) {
    pcre2_code_free((pcre2_code *)t->re);
    t->re = NULL;
    free(t->regex);
    t->regex = NULL;
}

/* ---- NFC ----
 * A code point is "inert" when NFC can neither change it nor combine it with what precedes it:
 * combining class 0, not the second part of any canonical composition, and NFC(c) = c with a
 * decomposition that starts with such a starter. Text between two inert characters normalises on its own
 * (they are stable boundaries), so only the stretches around non-inert characters go through utf8proc. */
static inline int bit(const uint8_t *m, uint32_t c) { return (m[c >> 3] >> (c & 7)) & 1; }
static inline void set_bit(uint8_t *m, uint32_t c) { m[c >> 3] |= (uint8_t)(1u << (c & 7)); }

static int decompose(int32_t c, int32_t *buf) {
    int bc = 0;
    if (c >= 0xD800 && c <= 0xDFFF) return 0;
    const utf8proc_property_t *p = utf8proc_get_property(c);
    if (p->decomp_seqindex == UINT16_MAX && !(c >= 0xAC00 && c <= 0xD7A3)) return 0;
    utf8proc_ssize_t n = utf8proc_decompose_char(c, buf, 16, UTF8PROC_DECOMPOSE, &bc);
    return (n > 1 || (n == 1 && buf[0] != c)) && n <= 16 ? (int)n : 0;
}

/* The table depends on Unicode (utf8proc) only, not on the tokenizer: built once per process (two passes over
 * all code points, milliseconds) and shared read-only by every tokenizer. */
static uint8_t nfc_inert_table[MAX_CP / 8];
static pthread_once_t nfc_once = PTHREAD_ONCE_INIT;

static void build_nfc_inert(void) {
    static uint8_t second[MAX_CP / 8]; /* code points that occur after the first in a decomposition */
    uint8_t *inert = nfc_inert_table;
    int32_t buf[16];
    for (int32_t c = 0; c < MAX_CP; c++) {
        int n = decompose(c, buf);
        for (int i = 1; i < n; i++) set_bit(second, (uint32_t)buf[i]);
    }
    for (int32_t c = 0; c < MAX_CP; c++) {
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        if (utf8proc_get_property(c)->combining_class || bit(second, (uint32_t)c)) continue;
        int n = decompose(c, buf);
        if (n) {
            if (bit(second, (uint32_t)buf[0]) || utf8proc_get_property(buf[0])->combining_class) continue;
            if (utf8proc_normalize_utf32(buf, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE) != 1 || buf[0] != c) continue;
        }
        set_bit(inert, (uint32_t)c);
    }
}

int tokenizer_build_nfc_table(Tokenizer *t, Err *err) {
    (void)err;
    pthread_once(&nfc_once, build_nfc_inert);
    t->nfc_inert = nfc_inert_table;
    return 0;
}

/* Decodes the (valid) UTF-8 character at s; sets *n to its length. */
static inline uint32_t cp_at(const unsigned char *s, int *n) {
    if (s[0] < 0x80) { *n = 1; return s[0]; }
    if (s[0] < 0xE0) { *n = 2; return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); }
    if (s[0] < 0xF0) { *n = 3; return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); }
    *n = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

typedef struct Bytes {
    unsigned char *p;
    size_t n, cap;
} Bytes;
static int bytes_put(Bytes *b, const void *s, size_t n) {
    if (!n) return 0;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* NFC of s[0..n): returns s itself when it is already NFC by the inert test, else the normalised text
 * built in tmp. NULL on failure. */
static const unsigned char *nfc(const Tokenizer *t, const unsigned char *s, size_t n, size_t *out_n, Bytes *tmp,
                                Err *err) {
    size_t i = 0, last_inert = 0, done = 0;
    int k;
    tmp->n = 0;
    while (i < n) {
        if (s[i] < 0x80) { last_inert = i++; continue; }
        uint32_t c = cp_at(s + i, &k);
        if (bit(t->nfc_inert, c)) { last_inert = i; i += (size_t)k; continue; }
        /* a run that NFC may change: from the last inert character up to the next one */
        size_t start = last_inert >= done && bit(t->nfc_inert, cp_at(s + last_inert, &k)) ? last_inert : done;
        size_t end = i;
        while (end < n) {
            if (s[end] < 0x80) break;
            uint32_t d = cp_at(s + end, &k);
            if (end > i && bit(t->nfc_inert, d)) break;
            end += (size_t)k;
        }
        utf8proc_uint8_t *norm = NULL;
        utf8proc_ssize_t m = utf8proc_map(s + start, (utf8proc_ssize_t)(end - start), &norm,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m < 0 || bytes_put(tmp, s + done, start - done) || bytes_put(tmp, norm, (size_t)m)) {
            free(norm);
            err_set(err, m < 0 ? Q35_ERR_UTF8 : Q35_ERR_OOM, "NFC failed: %s",
                    m < 0 ? utf8proc_errmsg(m) : "out of memory");
            return NULL;
        }
        free(norm);
        done = i = last_inert = end;
    }
    if (done == 0) {
        *out_n = n;
        return s;
    }
    if (bytes_put(tmp, s + done, n - done)) {
        err_set(err, Q35_ERR_OOM, "out of memory");
        return NULL;
    }
    *out_n = tmp->n;
    return tmp->p;
}

/* ---- BPE ---- */

typedef struct HeapEntry {
    uint64_t key; /* rank << 32 | left node */
    uint32_t left, right, merged;
} HeapEntry;

typedef struct Scratch {
    Bytes nfc;
    uint32_t *id;
    int *prev, *next;
    HeapEntry *heap;
    size_t cap, heap_cap;
} Scratch;

static void heap_push(HeapEntry *h, size_t *n, HeapEntry e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key <= e.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}
static HeapEntry heap_pop(HeapEntry *h, size_t *n) {
    HeapEntry top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1].key < h[c].key) c++;
        if (h[c].key >= last.key) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

static int try_push(const Tokenizer *t, Scratch *sc, size_t *hn, int left) {
    int right = sc->next[left];
    if (right < 0) return 0;
    const MergeSlot *m = tok_merge_find(t, sc->id[left], sc->id[right]);
    if (!m) return 0;
    if (*hn == sc->heap_cap) {
        size_t cap = sc->heap_cap * 2;
        HeapEntry *h = realloc(sc->heap, cap * sizeof *h);
        if (!h) return -1;
        sc->heap = h;
        sc->heap_cap = cap;
    }
    heap_push(sc->heap, hn, (HeapEntry){((uint64_t)m->rank << 32) | (uint32_t)left, sc->id[left], sc->id[right], m->id});
    return 0;
}

static int bpe_large(const Tokenizer *t, const unsigned char *p, size_t n, Scratch *sc, IdVec *out) {
    if (n > sc->cap) {
        free(sc->id); free(sc->prev); free(sc->next); free(sc->heap);
        sc->id = malloc(n * sizeof *sc->id);
        sc->prev = malloc(n * sizeof *sc->prev);
        sc->next = malloc(n * sizeof *sc->next);
        sc->heap = malloc(n * sizeof *sc->heap);
        sc->cap = sc->heap_cap = n;
        if (!sc->id || !sc->prev || !sc->next || !sc->heap) { sc->cap = sc->heap_cap = 0; return -1; }
    }
    sc->heap_cap = sc->cap;
    for (size_t i = 0; i < n; i++) {
        sc->id[i] = (uint32_t)t->byte_id[p[i]];
        sc->prev[i] = (int)i - 1;
        sc->next[i] = i + 1 < n ? (int)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (try_push(t, sc, &hn, (int)i)) return -1;
    while (hn) {
        HeapEntry e = heap_pop(sc->heap, &hn);
        int l = (int)(uint32_t)e.key, r = sc->next[l];
        if (sc->id[l] != e.left || r < 0 || sc->id[r] != e.right) continue; /* stale */
        sc->id[l] = e.merged;
        sc->id[r] = UINT32_MAX;
        sc->next[l] = sc->next[r];
        if (sc->next[r] >= 0) sc->prev[sc->next[r]] = l;
        if (sc->prev[l] >= 0 && try_push(t, sc, &hn, sc->prev[l])) return -1;
        if (try_push(t, sc, &hn, l)) return -1;
    }
    for (int i = 0; i >= 0; i = sc->next[i])
        if (idvec_push(out, (int)sc->id[i])) return -1;
    return 0;
}

/* One piece of n bytes -> ids appended to out. */
static int bpe(const Tokenizer *t, const unsigned char *p, size_t n, Scratch *sc, IdVec *out) {
    if (n == 1) return idvec_push(out, t->byte_id[p[0]]);
    if (t->direct) {
        int id = tokenizer_vocab_find(t, p, n);
        if (id >= 0 && bit(t->direct, (uint32_t)id)) return idvec_push(out, id);
    }
    if (n > SMALL_PIECE) return bpe_large(t, p, n, sc, out);
    uint32_t sym[SMALL_PIECE], rank[SMALL_PIECE], merged[SMALL_PIECE];
    int m = (int)n;
    for (int i = 0; i < m; i++) sym[i] = (uint32_t)t->byte_id[p[i]];
    for (int i = 0; i + 1 < m; i++) {
        const MergeSlot *s = tok_merge_find(t, sym[i], sym[i + 1]);
        rank[i] = s ? s->rank : UINT32_MAX;
        merged[i] = s ? s->id : 0;
    }
    while (m > 1) {
        int best = 0;
        for (int i = 1; i + 1 < m; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        /* sym[best] + sym[best+1] -> merged[best]; pair slots best-1 and best change */
        sym[best] = merged[best];
        memmove(sym + best + 1, sym + best + 2, (size_t)(m - best - 2) * sizeof *sym);
        if (best + 2 < m) {
            memmove(rank + best + 1, rank + best + 2, (size_t)(m - best - 3) * sizeof *rank);
            memmove(merged + best + 1, merged + best + 2, (size_t)(m - best - 3) * sizeof *merged);
        }
        m--;
        for (int i = best - 1; i <= best; i++) {
            if (i < 0 || i + 1 >= m) continue;
            const MergeSlot *s = tok_merge_find(t, sym[i], sym[i + 1]);
            rank[i] = s ? s->rank : UINT32_MAX;
            merged[i] = s ? s->id : 0;
        }
    }
    for (int i = 0; i < m; i++)
        if (idvec_push(out, (int)sym[i])) return -1;
    return 0;
}

/* direct[id] = 1 when BPE of the token's own bytes gives back exactly [id]. A piece whose bytes equal
 * such a token can then skip BPE: BPE depends only on the piece's bytes, so this is exact (checked for
 * every token here, not assumed), and common words take one hash lookup instead of ~2n merge lookups. */
int tokenizer_build_direct(Tokenizer *t, Err *err) {
    t->direct = calloc((size_t)t->n_vocab / 8 + 1, 1);
    if (!t->direct) return err_set(err, Q35_ERR_OOM, "out of memory");
    Scratch sc = {0};
    IdVec v = {0};
    int rc = 0;
    for (int id = 0; id < t->n_vocab && !rc; id++) {
        if (t->kind[id] != 1 || !t->len[id]) continue;
        v.n = 0;
        if (bpe(t, (const unsigned char *)t->arena + t->off[id], t->len[id], &sc, &v)) rc = -1;
        else if (v.n == 1 && v.v[0] == id) set_bit(t->direct, (uint32_t)id);
    }
    free(v.v);
    free(sc.id);
    free(sc.prev);
    free(sc.next);
    free(sc.heap);
    return rc ? err_set(err, Q35_ERR_OOM, "out of memory") : 0;
}

/* ---- segments ---- */

/* NFC, split and BPE of one segment free of added tokens. */
static int encode_segment(const Tokenizer *t, const unsigned char *s, size_t n, pcre2_match_data *md, Scratch *sc,
                          IdVec *out, Err *err) {
    if (!n) return 0;
    size_t m;
    const unsigned char *x = nfc(t, s, n, &m, &sc->nfc, err);
    if (!x) return err->code;
    const pcre2_code *re = t->re;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t pos = 0;
    while (pos < m) {
        int rc = t->re_jit ? pcre2_jit_match(re, x, m, pos, PCRE2_NOTEMPTY, md, NULL)
                           : pcre2_match(re, x, m, pos, PCRE2_NOTEMPTY | PCRE2_NO_UTF_CHECK, md, NULL);
        size_t a = m, b = m;
        if (rc >= 0) { a = ov[0]; b = ov[1]; }
        else if (rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return err_set(err, Q35_ERR_UNSUPPORTED, "split regex failed at byte %zu: %s", pos, (char *)msg);
        }
        if (a > pos && bpe(t, x + pos, a - pos, sc, out)) return err_set(err, Q35_ERR_OOM, "out of memory");
        if (b > a && bpe(t, x + a, b - a, sc, out)) return err_set(err, Q35_ERR_OOM, "out of memory");
        pos = b;
    }
    return 0;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, IdVec *out, Err *err) {
    const unsigned char *s = (const unsigned char *)text;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!md) return err_set(err, Q35_ERR_OOM, "out of memory");
    Scratch sc = {0};
    int rc = 0;
    size_t seg = 0, i = 0;
    while (i < len && !rc) {
        int lo = t->added_first[s[i]], hi = t->added_first[s[i] + 1], hit = -1;
        for (int j = lo; j < hi && hit < 0; j++)
            if ((size_t)t->added[j].len <= len - i && !memcmp(s + i, t->added[j].content, (size_t)t->added[j].len))
                hit = j;
        if (hit < 0) { i++; continue; }
        rc = encode_segment(t, s + seg, i - seg, md, &sc, out, err);
        if (!rc && idvec_push(out, t->added[hit].id)) rc = err_set(err, Q35_ERR_OOM, "out of memory");
        i += (size_t)t->added[hit].len;
        seg = i;
    }
    if (!rc) rc = encode_segment(t, s + seg, len - seg, md, &sc, out, err);
    pcre2_match_data_free(md);
    free(sc.nfc.p);
    free(sc.id);
    free(sc.prev);
    free(sc.next);
    free(sc.heap);
    return rc;
}

int q35_tokenize(const Q35Tokenizer *t, const char *text, size_t len, int **ids, int *n, Q35Err *err) {
    *ids = NULL;
    *n = 0;
    size_t bad = utf8_first_invalid((const unsigned char *)text, len);
    if (bad < len)
        return err_set(err, Q35_ERR_UTF8, "invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad,
                       (unsigned char)text[bad]);
    IdVec out = {0};
    int rc = tokenizer_encode(t, text, len, &out, err);
    if (rc) {
        free(out.v);
        return rc;
    }
    if (!out.v && !(out.v = malloc(sizeof(int)))) return err_set(err, Q35_ERR_OOM, "out of memory");
    *ids = out.v;
    *n = out.n;
    return 0;
}
