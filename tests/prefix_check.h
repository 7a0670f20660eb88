/* prefix_check.h — the prefix cache's exactness check (issue 29), shared by tests/test_prefix.c (CPU backend) and
 * tests/gpu/test_prefix_cuda.c (CUDA backend). Public API only (q35_serve_open / q35_seq_open_cached /
 * q35_seq_snapshot / q35_step), on two deterministic-mode engines of the same model: `cold` serves without a cache,
 * `warm` with one. For each prefix length L, request A (L + PREFIX_TAIL ids) is served cold; on `warm` a request B
 * that equals A's first L ids and diverges right after them records a snapshot at L (fed in chunks of 100); then A on
 * `warm` must resume at exactly L (cached = matched = L, only the PREFIX_TAIL other ids fed, in chunks of 300) and
 * give the cold run's PREFIX_GEN sampled ids, their logprobs and the top ids and logprobs, bit for bit.
 * Include after test.h. */
#ifndef Q35_PREFIX_CHECK_H
#define Q35_PREFIX_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwen35.h"

#define PREFIX_GEN  6  /* tokens sampled per request */
#define PREFIX_TAIL 37 /* ids of request A after the shared prefix */

/* Serves e with blocks of `block` tokens, 4 slots and kv_bytes (0: 256 MiB) of KV memory; no_cache turns the prefix
 * cache off; prefix_bytes 0: its default budget. */
static int prefix_serve(Q35Engine *e, int block, int no_cache, size_t kv_bytes, size_t prefix_bytes) {
    Q35ServeOptions so = {0};
    so.max_seqs = 4;
    so.kv_bytes = kv_bytes ? kv_bytes : (size_t)256 << 20;
    so.kv_block = block;
    so.no_prefix_cache = no_cache;
    so.prefix_bytes = prefix_bytes;
    Q35Err err = {0};
    int rc = q35_serve_open(e, &so, &err);
    if (rc) fprintf(stderr, "serve_open: %s\n", err.msg);
    return rc;
}

/* ids[i] in [1, 499] from a linear congruential generator */
static void prefix_make_prompt(int *ids, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        ids[i] = 1 + (int)((seed >> 8) % 499u);
    }
}

typedef struct PrefixOut {
    int ids[PREFIX_GEN], top_id[PREFIX_GEN][5];
    float lp[PREFIX_GEN], top[PREFIX_GEN][5];
    int cached, matched, fed;
} PrefixOut;

/* Greedy with the chosen id's logprob and 5 top logprobs. */
static const Q35SeqParams prefix_greedy = {.sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f}, .top_logprobs = 5};

/* One request with parameters p (NULL: prefix_greedy): open (from the cache or not), feed prompt[cached, n) in chunks
 * of `chunk` (recording a snapshot when the fed length reaches one of snaps[]), then PREFIX_GEN sampled tokens (at
 * most 5 top logprobs kept). 0 on success. */
static int prefix_request(Q35Engine *e, const Q35SeqParams *p, const int *prompt, int n, int cached, int chunk,
                          const int *snaps, int n_snaps, PrefixOut *o) {
    memset(o, 0, sizeof *o);
    if (!p) p = &prefix_greedy;
    Q35Err err = {0};
    int seq, rc;
    Q35PrefixHit hit = {0};
    rc = cached ? q35_seq_open_cached(e, p, prompt, n, &seq, &hit, &err) : q35_seq_open(e, p, &seq, &err);
    if (rc) {
        fprintf(stderr, "open: %s\n", err.msg);
        return rc;
    }
    o->cached = hit.cached;
    o->matched = hit.matched;
    int pos = hit.cached, tok = -1;
    for (int g = 0; g < PREFIX_GEN && !rc;) {
        Q35StepItem it = {.seq = seq};
        if (pos < n) {
            int end = n - pos > chunk ? pos + chunk : n;
            for (int i = 0; i < n_snaps; i++)
                if (snaps[i] > pos && snaps[i] < end) end = snaps[i];
            it.ids = prompt + pos;
            it.n = end - pos;
            it.sample = end == n;
            o->fed += it.n;
            pos = end;
        } else {
            it.ids = &tok;
            it.n = 1;
            it.sample = 1;
        }
        Q35StepOut out;
        if ((rc = q35_step(e, &it, 1, &out, &err))) break;
        for (int i = 0; i < n_snaps && it.ids != &tok; i++)
            if (snaps[i] == pos && (rc = q35_seq_snapshot(e, seq, &err))) break;
        if (!it.sample) continue;
        o->ids[g] = tok = out.id;
        o->lp[g] = out.logprob;
        for (int j = 0; j < out.n_top && j < 5; j++) {
            o->top_id[g][j] = out.top_id[j];
            o->top[g][j] = out.top_logprob[j];
        }
        g++;
    }
    if (rc) fprintf(stderr, "step: %s\n", err.msg);
    q35_seq_close(e, seq);
    return rc;
}

/* the sampled ids, their logprobs and the top-5 ids and logprobs are bitwise equal */
static int prefix_same(const PrefixOut *a, const PrefixOut *b) {
    return !memcmp(a->ids, b->ids, sizeof a->ids) && !memcmp(a->lp, b->lp, sizeof a->lp) &&
           !memcmp(a->top_id, b->top_id, sizeof a->top_id) && !memcmp(a->top, b->top, sizeof a->top);
}

typedef struct PrefixExact {
    const char *name;    /* the model, in messages */
    int block;           /* tokens per KV block */
    size_t kv_bytes;     /* per engine; 0: 256 MiB */
    size_t prefix_bytes; /* the warm engine's cache budget; 0: its default */
    const int *lens;     /* prefix lengths L; L + PREFIX_TAIL + PREFIX_GEN must fit the engines' context */
    int n_lens;
    const Q35SeqParams *params; /* NULL: prefix_greedy */
} PrefixExact;

/* The check described at the top, for each of x->lens; serves cold and warm (not serving yet) for its duration. */
static void prefix_check_exact(Q35Engine *cold, Q35Engine *warm, const PrefixExact *x) {
    const Q35SeqParams *sp = x->params ? x->params : &prefix_greedy;
    char how[64];
    snprintf(how, sizeof how, "%s, %d top logprobs", sp->sampling.temperature > 0 ? "sampled" : "greedy",
             sp->top_logprobs);
    if (prefix_serve(cold, x->block, 1, x->kv_bytes, 0) ||
        prefix_serve(warm, x->block, 0, x->kv_bytes, x->prefix_bytes)) {
        CHECK(0, "%s block %d: serving", x->name, x->block);
        q35_serve_close(cold);
        q35_serve_close(warm);
        return;
    }
    int max_n = 0;
    for (int k = 0; k < x->n_lens; k++)
        if (x->lens[k] + PREFIX_TAIL > max_n) max_n = x->lens[k] + PREFIX_TAIL;
    int *a = malloc(sizeof(int) * (size_t)max_n), *b = malloc(sizeof(int) * (size_t)max_n);
    for (int k = 0; k < x->n_lens; k++) {
        const int L = x->lens[k], n = L + PREFIX_TAIL;
        prefix_make_prompt(a, n, 7u + (unsigned)k);
        memcpy(b, a, sizeof(int) * (size_t)L);
        prefix_make_prompt(b + L, n - L, 1000u + (unsigned)k); /* diverges right after L */
        if (b[L] == a[L]) b[L] = a[L] % 499 + 1;
        PrefixOut ref, first, hit;
        int rc = prefix_request(cold, sp, a, n, 0, n, NULL, 0, &ref);
        rc |= prefix_request(warm, sp, b, n, 1, 100, &L, 1, &first); /* records a snapshot at L */
        rc |= prefix_request(warm, sp, a, n, 1, 300, NULL, 0, &hit);
        CHECK(!rc, "%s block %d %s L %d: requests ran", x->name, x->block, how, L);
        CHECK(first.cached == 0 || first.cached < L, "%s L %d: the first request found %d cached", x->name, L,
              first.cached);
        CHECK(hit.cached == L && hit.fed == n - L && hit.matched == L,
              "%s block %d %s L %d: cached %d matched %d fed %d", x->name, x->block, how, L, hit.cached, hit.matched,
              hit.fed);
        CHECK(prefix_same(&ref, &hit),
              "%s block %d %s L %d: cached ids / logprobs equal cold (id0 %d vs %d, lp0 %.9g vs %.9g)", x->name,
              x->block, how, L, ref.ids[0], hit.ids[0], ref.lp[0], hit.lp[0]);
        CHECK(!prefix_same(&ref, &first), "%s %s L %d: the diverging request differs (the test sees outputs)", x->name,
              how, L);
    }
    free(a);
    free(b);
    q35_serve_close(cold);
    q35_serve_close(warm);
}
#endif
