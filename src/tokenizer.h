/* tokenizer.h — Qwen byte-level BPE (HF tokenizer.json): the internal view shared by
 * tokenizer.c (loading, config files, decoding), tokenizer_encode.c (added tokens, NFC, split regex,
 * merge-rank BPE) and chat.c. The public calls are the q35_tokenize* / q35_detok* / q35_chat* of
 * include/qwen35.h. Encode = added tokens -> NFC -> regex split -> byte symbols -> BPE (TOKENIZER.md §1). */
#ifndef Q35_TOKENIZER_H
#define Q35_TOKENIZER_H

#include <stdint.h>

#include "util.h"

typedef struct Q35Tokenizer Tokenizer;

/* An added token: matched in raw text before anything else, emitted as one id. */
typedef struct AddedToken {
    const char *content; /* UTF-8, as in the file */
    int len;
    int id;
    int special;
} AddedToken;

/* Byte string -> id, open addressing. A slot keeps the first 12 bytes of its key inline (zero-padded),
 * so a probe of a key of <= 12 bytes touches one 16-byte slot; longer keys are confirmed in the arena.
 * meta = (id + 1) | min(len, 255) << 24; 0 = empty. */
typedef struct StrSlot {
    uint64_t k0;
    uint32_t k1;
    uint32_t meta;
} StrSlot;
typedef struct StrMap {
    StrSlot *slot;
    uint32_t mask;
} StrMap;

/* (left id, right id) -> (rank, merged id); key 0 = empty. */
typedef struct MergeSlot {
    uint64_t key;
    uint32_t rank;
    uint32_t id;
} MergeSlot;

struct Q35Tokenizer {
    int family;   /* Q35_TOK_* */
    int n_vocab;  /* 1 + largest model.vocab id */
    int n_total;  /* 1 + largest id over the vocab and the added tokens */
    /* Per id: the bytes that decoding emits (vocab: byte-level symbols mapped back; added: content as
     * HF's ByteLevel decoder maps it). kind: 0 unused id, 1 vocab, 2 added, 3 added + special. */
    char *arena;
    uint32_t *off, *len;
    uint8_t *kind;
    StrMap vocab;       /* token bytes -> id, for entries made only of byte-level symbols */
    MergeSlot *merges;  /* merge_mask + 1 slots */
    uint32_t merge_mask;
    int byte_id[256];   /* id of the one-byte token of each byte */
    AddedToken *added;  /* sorted by first byte, then longest first */
    int n_added;
    int added_first[257]; /* added[added_first[b] .. added_first[b+1]) start with byte b */
    void *re;           /* pcre2_code_8 * (the Split regex, JIT-compiled when possible) */
    int re_jit;
    char *regex;        /* the pattern in use */
    const uint8_t *nfc_inert; /* bitmap over code points 0..0x10FFFF: NFC-stable boundary chars (see encode); shared */
    uint8_t *direct;    /* bitmap over vocab ids: BPE(bytes of id) == [id] (see tokenizer_build_direct) */
    char warning[256];
    int stop_ids[8], n_stop;
    char *chat_template; /* tokenizer_config.json chat_template or chat_template.jinja; may be NULL */
};

/* Loads from a tokenizer.json already in memory (what names the source in errors). */
int tokenizer_load_json(Tokenizer **out, const char *json, size_t len, const char *what, Err *err);
/* Reads tokenizer_config.json / generation_config.json / chat_template.jinja from dir (all optional). */
int tokenizer_load_configs(Tokenizer *t, const char *dir, Err *err);

/* Built by tokenizer_load_json; used by the encoder. */
int tokenizer_build_nfc_table(Tokenizer *t, Err *err);
int tokenizer_build_direct(Tokenizer *t, Err *err);
/* Id of the vocab entry whose bytes are s[0..n), or -1. */
int tokenizer_vocab_find(const Tokenizer *t, const void *s, size_t n);
int tokenizer_compile_regex(Tokenizer *t, const char *pattern, Err *err);
void tokenizer_free_regex(Tokenizer *t);

/* Offset of the first byte that is not valid UTF-8 (overlongs, surrogates, > U+10FFFF, truncated
 * sequences included), or len if all of s is valid. */
size_t utf8_first_invalid(const unsigned char *s, size_t len);
/* Length of the longest valid-so-far prefix of an incomplete sequence at s (1..3), 0 if s[0..n) is not
 * the start of a valid sequence; used by the decoders' U+FFFD replacement. */
int utf8_valid_prefix(const unsigned char *s, size_t n);

/* Decodes the JSON string literal at s (which must start with '"'): malloc'ed *out of *n bytes, *end past
 * the closing quote. Unlike cJSON it keeps "\u0000". Returns 0, or -1 if the literal is malformed. */
int tokenizer_json_string(const char *s, char **out, size_t *n, const char **end);

/* Growable id list. */
typedef struct IdVec {
    int *v;
    int n, cap;
} IdVec;
int idvec_push(IdVec *a, int id);

/* Encodes len bytes of valid UTF-8 (the caller has checked) and appends the ids to out. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, IdVec *out, Err *err);

/* 64-bit FNV-1a style string hash and the (left, right) pair key used by the merge table. */
static inline uint64_t tok_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}
static inline uint64_t tok_pair_key(uint32_t a, uint32_t b) { return ((uint64_t)(a + 1) << 32) | b; }
static inline uint32_t tok_pair_slot(uint64_t key, uint32_t mask) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & mask;
}
/* Looks up the merge of (a, b): returns its slot or NULL. */
static inline const MergeSlot *tok_merge_find(const Tokenizer *t, uint32_t a, uint32_t b) {
    uint64_t key = tok_pair_key(a, b);
    for (uint32_t i = tok_pair_slot(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
        const MergeSlot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == 0) return NULL;
    }
}

#endif
