/* fuzz_tokenizer.c — libFuzzer target for the tokenizer (build: make fuzz-tokenizer; run from the repo
 * root so .cache/qwen3-tokenizer is found: build/fuzz_tokenizer -runs=1000000 tests/fuzz/seeds).
 * The first input byte picks the mode:
 *   text:  valid UTF-8 must encode, and decode(encode(s)) must equal s with NFC applied to each stretch
 *          between added tokens (computed here independently: naive longest match + utf8proc); invalid
 *          UTF-8 must fail with Q35_ERR_UTF8 at the first bad byte; streaming decode == batch decode.
 *   ids:   arbitrary ids decode (or fail cleanly with Q35_ERR_ARG), streaming == batch, output valid UTF-8.
 *   chat:  arbitrary message text renders and encodes.
 * Any violation aborts, which libFuzzer reports with the input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer.h"

static Tokenizer *tok; /* harness state, loaded once */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    Err err;
    if (q35_tokenizer_load(&tok, ".cache/qwen3-tokenizer", &err)) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repo root after scripts/fetch_tokenizer.sh)\n", err.msg);
        abort();
    }
    return 0;
}

#define REQUIRE(c)                                                            \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "fuzz_tokenizer: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                          \
        }                                                                     \
    } while (0)

/* Streams ids through the detokenizer into a malloc'ed buffer; *n its length. */
static char *stream(const int *ids, int n, int skip, size_t *len) {
    Q35Detok *d;
    Err err;
    REQUIRE(q35_detok_open(&d, tok, skip, &err) == 0);
    size_t cap = 64, k = 0;
    char *out = malloc(cap);
    for (int i = 0; i <= n; i++) {
        const char *s;
        size_t m;
        if (i < n) REQUIRE(q35_detok_push(d, ids[i], &s, &m, &err) == 0);
        else q35_detok_flush(d, &s, &m);
        REQUIRE(utf8_first_invalid((const unsigned char *)s, m) == m);
        while (k + m + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + k, s, m);
        k += m;
    }
    q35_detok_close(d);
    *len = k;
    return out;
}

/* s with NFC applied between added tokens (leftmost, longest), independently of the encoder. */
static char *expected_text(const unsigned char *s, size_t n, size_t *len) {
    char *out = malloc(4 * n + 16);
    size_t k = 0, seg = 0, i = 0;
    while (i <= n) {
        int best = -1;
        if (i < n)
            for (int j = 0; j < tok->n_added; j++) {
                size_t l = (size_t)tok->added[j].len;
                if (l <= n - i && !memcmp(s + i, tok->added[j].content, l) && (best < 0 || l > (size_t)tok->added[best].len))
                    best = j;
            }
        if (best < 0 && i < n) { i++; continue; }
        if (i > seg) {
            utf8proc_uint8_t *norm;
            utf8proc_ssize_t m = utf8proc_map(s + seg, (utf8proc_ssize_t)(i - seg), &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            REQUIRE(m >= 0);
            out = realloc(out, k + (size_t)m + 4 * n + 16);
            memcpy(out + k, norm, (size_t)m);
            k += (size_t)m;
            free(norm);
        }
        if (best < 0) break;
        memcpy(out + k, tok->added[best].content, (size_t)tok->added[best].len);
        k += (size_t)tok->added[best].len;
        i += (size_t)tok->added[best].len;
        seg = i;
    }
    *len = k;
    return out;
}

static void fuzz_text(const unsigned char *s, size_t n) {
    int *ids, m;
    Err err;
    size_t bad = utf8_first_invalid(s, n);
    int rc = q35_tokenize(tok, (const char *)s, n, &ids, &m, &err);
    if (bad < n) {
        char want[48];
        snprintf(want, sizeof want, "byte offset %zu ", bad);
        REQUIRE(rc == Q35_ERR_UTF8 && strstr(err.msg, want));
        return;
    }
    REQUIRE(rc == 0);
    for (int i = 0; i < m; i++) REQUIRE(ids[i] >= 0 && ids[i] < tok->n_total);
    size_t got_n, want_n;
    char *got = stream(ids, m, 0, &got_n), *want = expected_text(s, n, &want_n);
    REQUIRE(got_n == want_n && !memcmp(got, want, got_n));
    free(got);
    free(want);
    free(ids);
}

static void fuzz_ids(const unsigned char *s, size_t n) {
    int m = (int)(n / 3), *ids = malloc(((size_t)m + 1) * sizeof *ids), any_bad = 0;
    for (int i = 0; i < m; i++) {
        ids[i] = (int)((s[3 * i] | s[3 * i + 1] << 8 | s[3 * i + 2] << 16) % (unsigned)(tok->n_total + 8));
        any_bad |= !tok->kind[ids[i] < tok->n_total ? ids[i] : 0] || ids[i] >= tok->n_total;
    }
    char *text;
    Err err;
    int skip = n & 1, rc = q35_detokenize(tok, ids, m, skip, &text, &err);
    if (any_bad) {
        REQUIRE(rc == Q35_ERR_ARG);
    } else {
        REQUIRE(rc == 0);
        size_t k;
        char *st = stream(ids, m, skip, &k);
        REQUIRE(utf8_first_invalid((const unsigned char *)text, strlen(text)) == strlen(text));
        if (!memchr(st, 0, k)) REQUIRE(strlen(text) == k && !memcmp(text, st, k));
        free(st);
        free(text);
    }
    free(ids);
}

static void fuzz_chat(const unsigned char *s, size_t n) {
    char *a = malloc(n + 1);
    memcpy(a, s, n);
    a[n] = 0;
    char *nl = memchr(a, '\n', n), *b = nl ? nl + 1 : a;
    if (nl) *nl = 0;
    static const char *roles[] = {"system", "user", "assistant", "tool"};
    Q35ChatMessage m[3] = {{.role = roles[n % 4], .content = a},
                          {.role = roles[(n / 4) % 4], .content = b, .reasoning = (n & 16) ? a : NULL},
                          {.role = "user", .content = b}};
    char *out;
    Err err;
    int rc = q35_chat_render(tok, m, 1 + (int)(n % 3), (int)(n & 32), (int)(n % 3) - 1, &out, &err);
    REQUIRE(rc == 0);
    int *ids, k;
    rc = q35_tokenize(tok, out, strlen(out), &ids, &k, &err);
    REQUIRE(rc == 0 || rc == Q35_ERR_UTF8);
    if (!rc) free(ids);
    free(out);
    free(a);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] % 8) {
    case 0: fuzz_ids(data + 1, size - 1); break;
    case 1: fuzz_chat(data + 1, size - 1); break;
    default: fuzz_text(data + 1, size - 1); break;
    }
    return 0;
}
