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
 * of `chunk` (recording a snapshot at each of snaps[]: a chunk ends there and q35_seq_snapshot follows, or with
 * in_step the chunk's step takes it, Q35StepItem.snap_at), then PREFIX_GEN sampled tokens (at most 5 top logprobs
 * kept). 0 on success. */
static int prefix_request_x(Q35Engine *e, const Q35SeqParams *p, const int *prompt, int n, int cached, int chunk,
                            const int *snaps, int n_snaps, int in_step, PrefixOut *o) {
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
        int inside[Q35_MAX_STEP_SNAPS];
        if (pos < n) {
            int end = n - pos > chunk ? pos + chunk : n;
            for (int i = 0; i < n_snaps && !in_step; i++)
                if (snaps[i] > pos && snaps[i] < end) end = snaps[i];
            for (int i = 0; i < n_snaps && in_step; i++) /* snaps[] ascending */
                if (snaps[i] > pos && snaps[i] < end && it.n_snap_at < Q35_MAX_STEP_SNAPS)
                    inside[it.n_snap_at++] = snaps[i];
            it.snap_at = inside;
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

static int prefix_request(Q35Engine *e, const Q35SeqParams *p, const int *prompt, int n, int cached, int chunk,
                          const int *snaps, int n_snaps, PrefixOut *o) {
    return prefix_request_x(e, p, prompt, n, cached, chunk, snaps, n_snaps, 0, o);
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
    int in_step;                /* 1: request B's snapshot at L is taken inside a step (Q35StepItem.snap_at) */
} PrefixExact;

/* The check described at the top, for each of x->lens; serves cold and warm (not serving yet) for its duration. */
static void prefix_check_exact(Q35Engine *cold, Q35Engine *warm, const PrefixExact *x) {
    const Q35SeqParams *sp = x->params ? x->params : &prefix_greedy;
    char how[64];
    snprintf(how, sizeof how, "%s, %d top logprobs%s", sp->sampling.temperature > 0 ? "sampled" : "greedy",
             sp->top_logprobs, x->in_step ? ", snapshot inside a step" : "");
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
        /* records a snapshot at L: in chunks of 100 cut there, or in one chunk whose step takes it (for L = 4096 at
         * the start of a backend's third piece of 2048) */
        rc |= prefix_request_x(warm, sp, b, n, 1, x->in_step ? n : 100, &L, 1, x->in_step, &first);
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
/* ---- the host tier (Q35ServeOptions.prefix_host_bytes) ---- */

/* Slot and block bytes of e served with blocks of `block` (no cache), and its context; 0 on success. */
static int prefix_sizes(Q35Engine *e, int block, size_t *sb, size_t *bb, int *ctx) {
    if (prefix_serve(e, block, 1, 0, 0)) return -1;
    Q35ServeInfo in;
    q35_serve_info(e, &in);
    q35_serve_close(e);
    *sb = in.slot_bytes;
    *bb = in.block_bytes;
    *ctx = in.max_context;
    return 0;
}

/* Serves e with blocks of `block`, max_seqs slots, kv_bytes (0: 256 MiB) of KV memory, a prefix cache of
 * prefix_bytes and a host tier of n_host snapshots (0: off); *in gets the sizes. 0 on success. */
static int prefix_serve_host(Q35Engine *e, int block, int max_seqs, size_t kv_bytes, size_t prefix_bytes,
                             size_t slot_bytes, int n_host, Q35ServeInfo *in) {
    Q35ServeOptions so = {0};
    so.max_seqs = max_seqs;
    so.kv_bytes = kv_bytes ? kv_bytes : (size_t)256 << 20;
    so.kv_block = block;
    so.prefix_bytes = prefix_bytes;
    so.prefix_host_bytes = (size_t)n_host * slot_bytes;
    so.no_prefix_host = n_host == 0;
    Q35Err err = {0};
    int rc = q35_serve_open(e, &so, &err);
    if (rc) fprintf(stderr, "serve_open: %s\n", err.msg);
    if (!rc) q35_serve_info(e, in);
    return rc;
}

/* Records n tiny entries (3 ids from [500, 512), distinct for the first 1728 k; the last id varies fastest, so 12 in a
 * row share their first two: about one cached block each) with a snapshot at their end: each takes a device
 * snapshot id, moving the least recently used one out. 0 on success. */
static int prefix_push(Q35Engine *e, int *k, int n) {
    for (int i = 0; i < n; i++, (*k)++) {
        const int ids[3] = {500 + *k / 144 % 12, 500 + *k / 12 % 12, 500 + *k % 12};
        const Q35SeqParams p = {.sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f}, .top_logprobs = -1};
        Q35Err err = {0};
        int seq, rc = q35_seq_open(e, &p, &seq, &err);
        if (rc) return rc;
        Q35StepItem it = {.seq = seq, .ids = ids, .n = 3};
        rc = q35_step(e, &it, 1, NULL, &err);
        if (!rc) rc = q35_seq_snapshot(e, seq, &err);
        q35_seq_close(e, seq);
        if (rc) {
            fprintf(stderr, "push: %s\n", err.msg);
            return rc;
        }
    }
    return 0;
}

/* For each L of x->lens, as prefix_check_exact: B records a snapshot at L; then enough tiny entries (prefix_push)
 * that B's is the least recently used device snapshot when the last one comes, so it moves to the host tier of
 * n_host snapshots (which is full after a few L: its own least recently used entries go); A must then resume at
 * exactly L from the host tier and give the cold run's output bitwise. n_host 0 (no host tier): B's entry is evicted
 * and A misses (cached 0), with the same output. The cached blocks' budget holds B and every tiny entry, so only
 * snapshot pressure moves or evicts B. */
static void prefix_check_host(Q35Engine *cold, Q35Engine *warm, const PrefixExact *x, int n_host) {
    const Q35SeqParams *sp = x->params ? x->params : &prefix_greedy;
    size_t sb = 0, bb = 0;
    int ctx = 0, max_n = 0;
    for (int k = 0; k < x->n_lens; k++)
        if (x->lens[k] + PREFIX_TAIL > max_n) max_n = x->lens[k] + PREFIX_TAIL;
    Q35ServeInfo in = {0};
    int rc = prefix_sizes(warm, x->block, &sb, &bb, &ctx);
    /* blocks the cache must keep: B's, one per host entry, some slack (`need`), and up to 1.25 per tiny entry (n_dev
     * of them, n_dev = pb / 2 / sb): cb - 1.25 n_dev >= pb / 2 (1 / bb - 1.25 / sb) - 1 with cb = (pb - n_dev sb) / bb;
     * lens ascending */
    const double need = (double)((x->lens[x->n_lens - 1] + x->block) / x->block + n_host + 16);
    const size_t pb =
        4 * sb > 5 * bb ? (size_t)(2.0 * (need + 1) / (1.0 / (double)bb - 1.25 / (double)sb)) + 2 * sb : 0;
    CHECK(!rc && pb, "%s block %d host tier %d: sizes (snapshot %zu B, block %zu B)", x->name, x->block, n_host, sb,
          bb);
    if (rc || !pb || prefix_serve(cold, x->block, 1, x->kv_bytes, 0) ||
        prefix_serve_host(warm, x->block, 4, x->kv_bytes, pb, sb, n_host, &in)) {
        CHECK(0, "%s block %d host tier %d: serving", x->name, x->block, n_host);
        q35_serve_close(cold);
        q35_serve_close(warm);
        return;
    }
    const int n_dev = in.prefix_snaps;
    CHECK(in.prefix_host_snaps == n_host && n_dev >= 1 && in.prefix_max_blocks >= (int)need + n_dev + n_dev / 4,
          "%s block %d: %d device + %d host snapshots (want %d host), %d cached blocks", x->name, x->block, n_dev,
          in.prefix_host_snaps, n_host, in.prefix_max_blocks);
    int *a = malloc(sizeof(int) * (size_t)max_n), *b = malloc(sizeof(int) * (size_t)max_n), pushed = 0;
    for (int k = 0; k < x->n_lens; k++) {
        const int L = x->lens[k], n = L + PREFIX_TAIL;
        prefix_make_prompt(a, n, 7u + (unsigned)k);
        memcpy(b, a, sizeof(int) * (size_t)L);
        prefix_make_prompt(b + L, n - L, 1000u + (unsigned)k);
        if (b[L] == a[L]) b[L] = a[L] % 499 + 1;
        PrefixOut ref, first, hit;
        rc = prefix_request(cold, sp, a, n, 0, n, NULL, 0, &ref);
        rc |= prefix_request(warm, sp, b, n, 1, 100, &L, 1, &first);
        Q35ServeInfo i0, i1, i2;
        q35_serve_info(warm, &i0);
        rc |= prefix_push(warm, &pushed, n_dev); /* free ids first, then the older entries, B's last */
        q35_serve_info(warm, &i1);
        rc |= prefix_request(warm, sp, a, n, 1, 300, NULL, 0, &hit);
        q35_serve_info(warm, &i2);
        CHECK(!rc, "%s block %d host %d L %d: requests ran", x->name, x->block, n_host, L);
        if (n_host) {
            CHECK(i1.prefix_demoted > i0.prefix_demoted && i1.prefix_used_host_snaps >= 1,
                  "%s L %d: snapshots moved to the host tier (%lld, %d there)", x->name, L,
                  i1.prefix_demoted - i0.prefix_demoted, i1.prefix_used_host_snaps);
            CHECK(hit.cached == L && hit.matched == L && hit.fed == n - L && i2.prefix_promoted == i1.prefix_promoted,
                  "%s block %d host %d L %d: resumed from the host tier: cached %d matched %d fed %d", x->name,
                  x->block, n_host, L, hit.cached, hit.matched, hit.fed);
        } else {
            CHECK(hit.cached == 0 && i1.prefix_demoted == 0 && i1.prefix_evicted > i0.prefix_evicted,
                  "%s L %d, no host tier: B's snapshot evicted, A misses (cached %d)", x->name, L, hit.cached);
        }
        CHECK(prefix_same(&ref, &hit), "%s block %d host %d L %d: ids / logprobs equal cold (id0 %d vs %d)", x->name,
              x->block, n_host, L, ref.ids[0], hit.ids[0]);
    }
    q35_serve_info(warm, &in);
    printf("  %s, blocks of %d: %d device + %d host snapshots, %d cached blocks: %lld moved to the host tier, %lld "
           "evicted\n",
           x->name, x->block, n_dev, n_host, in.prefix_max_blocks, in.prefix_demoted, in.prefix_evicted);
    CHECK(in.prefix_used_snaps <= n_dev && in.prefix_used_host_snaps <= n_host && in.free_blocks == in.n_blocks &&
              (n_host == 0 || in.prefix_evicted > 0),
          "%s host %d: %d + %d snapshots held, %lld evicted, %d of %d blocks free or cached", x->name, n_host,
          in.prefix_used_snaps, in.prefix_used_host_snaps, in.prefix_evicted, in.free_blocks, in.n_blocks);
    free(a);
    free(b);
    q35_serve_close(cold);
    q35_serve_close(warm);
}

/* A host snapshot moves back to the device when a device id is free: on `warm` with 2 device snapshots, 4 host
 * ones, 2 slots and a pool of floor(ctx / block) + 1 blocks, three 12-id prompts record a snapshot at 11 (1 block
 * each; P0's moves to the host tier); P0 hits from the host (no device id free: it stays); a request of
 * floor(ctx / block) blocks reclaims the two least recently used entries (P1, P2), freeing both device ids; P0 hits
 * again and moves back (prefix_promoted 1), then hits from the device. Each hit equals the cold run bitwise. */
static void prefix_check_promote(Q35Engine *cold, Q35Engine *warm, const char *name, int block) {
    size_t sb = 0, bb = 0;
    int ctx = 0;
    Q35ServeInfo in = {0};
    int rc = prefix_sizes(warm, block, &sb, &bb, &ctx);
    const int T = ctx / block, N = T + 1;
    if (rc || prefix_serve(cold, block, 1, 0, 0) ||
        prefix_serve_host(warm, block, 2, 2 * sb + (size_t)N * bb, 4 * sb, sb, 4, &in)) {
        CHECK(0, "%s: serving", name);
        q35_serve_close(cold);
        q35_serve_close(warm);
        return;
    }
    CHECK(in.n_blocks == N && in.max_seqs == 2 && in.prefix_snaps == 2 && in.prefix_host_snaps == 4 &&
              in.prefix_max_blocks >= 3,
          "%s: a pool of %d blocks (want %d), %d slots, %d + %d snapshots, %d cached blocks", name, in.n_blocks, N,
          in.max_seqs, in.prefix_snaps, in.prefix_host_snaps, in.prefix_max_blocks);
    int p[3][12];
    for (int k = 0; k < 3; k++) prefix_make_prompt(p[k], 12, 300u + (unsigned)k);
    p[1][0] = p[0][0] % 499 + 1;
    p[2][0] = p[1][0] % 499 + 1;
    const int at = 11;
    PrefixOut ref, o, h[3];
    for (int k = 0; k < 3; k++) rc |= prefix_request(warm, NULL, p[k], 12, 1, 12, &at, 1, &o);
    rc |= prefix_request(cold, NULL, p[0], 12, 0, 12, NULL, 0, &ref);
    Q35ServeInfo i[4];
    q35_serve_info(warm, &i[0]);
    rc |= prefix_request(warm, NULL, p[0], 12, 1, 12, NULL, 0, &h[0]);
    q35_serve_info(warm, &i[1]);
    const int big = T * block - (PREFIX_GEN - 1);
    int *q = malloc(sizeof(int) * (size_t)big);
    prefix_make_prompt(q, big, 400u);
    rc |= prefix_request(warm, NULL, q, big, 0, 512, NULL, 0, &o);
    free(q);
    q35_serve_info(warm, &i[2]);
    rc |= prefix_request(warm, NULL, p[0], 12, 1, 12, NULL, 0, &h[1]);
    q35_serve_info(warm, &i[3]);
    rc |= prefix_request(warm, NULL, p[0], 12, 1, 12, NULL, 0, &h[2]);
    CHECK(!rc, "%s: requests ran", name);
    CHECK(i[0].prefix_used_host_snaps == 1 && i[0].prefix_used_snaps == 2 && i[0].prefix_demoted == 1,
          "%s: three entries: %d + %d snapshots, %lld demoted", name, i[0].prefix_used_snaps,
          i[0].prefix_used_host_snaps, i[0].prefix_demoted);
    CHECK(h[0].cached == at && i[1].prefix_promoted == 0 && i[1].prefix_used_host_snaps == 1,
          "%s: hit from the host tier, no free device id: cached %d, %lld promoted", name, h[0].cached,
          i[1].prefix_promoted);
    CHECK(i[2].prefix_used_snaps == 0 && i[2].prefix_used_host_snaps == 1 && i[2].prefix_evicted == 2,
          "%s: the long request reclaimed the two device entries: %d + %d snapshots, %lld evicted", name,
          i[2].prefix_used_snaps, i[2].prefix_used_host_snaps, i[2].prefix_evicted);
    CHECK(h[1].cached == at && h[2].cached == at && i[3].prefix_promoted == 1 && i[3].prefix_used_snaps == 1 &&
              i[3].prefix_used_host_snaps == 0,
          "%s: hit from the host tier moved back to the device: cached %d then %d, %lld promoted, %d + %d", name,
          h[1].cached, h[2].cached, i[3].prefix_promoted, i[3].prefix_used_snaps, i[3].prefix_used_host_snaps);
    for (int k = 0; k < 3; k++)
        CHECK(prefix_same(&ref, &h[k]), "%s: hit %d (host, host then promoted, device) equals cold", name, k);
    q35_serve_close(cold);
    q35_serve_close(warm);
}
#endif
