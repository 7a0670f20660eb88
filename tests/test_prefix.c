/* test_prefix.c — the prefix cache (q35_seq_open_cached / q35_seq_snapshot) on the CPU backend in deterministic
 * mode, on the golden fixtures (Qwen3.5 hybrid and Qwen3 dense):
 *   (a) exactness: a request resumed from a snapshot recorded at L ids of another request (which diverges right
 *       there) gives greedy ids, logprobs and top logprobs bitwise equal to the same request fed cold on an engine
 *       without a cache, for L = 1, 63, 64, 65, 527, 529, 2000 (blocks of 16 and of 64 tokens);
 *   (b) an exactly repeated short prompt hits n - 1 ids; a multi-turn chat whose second turn resends the history
 *       with the reply re-rendered resumes at the first turn's assistant header (only the rest is fed);
 *   (c) two requests sharing a long prefix: the second reports the divergence point (matched), a snapshot there
 *       makes the third resume at it;
 *   (d) a tiny budget (a few snapshots and blocks) evicts least-recently-used entries and still serves exact output;
 *       a pool full of cached blocks never blocks a new sequence (cached blocks count as free and are reclaimed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwen35.h"
#include "test.h"

#define CTX 2304
#define GEN 6

static Q35Engine *open_engine(const char *dir) {
    Q35Options o;
    q35_options_init(&o);
    o.model_dir = dir;
    o.backend = "cpu";
    o.max_seq = CTX;
    o.threads = 1;
    o.deterministic = 1;
    Q35Engine *e = NULL;
    Q35Err err = {0};
    if (q35_engine_open(&e, &o, &err)) fprintf(stderr, "open %s: %s\n", dir, err.msg);
    return e;
}

static int serve(Q35Engine *e, int block, int no_cache, size_t kv_bytes, size_t prefix_bytes) {
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

static void make_prompt(int *ids, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        ids[i] = 1 + (int)((seed >> 8) % 499u);
    }
}

typedef struct Out {
    int ids[GEN];
    float lp[GEN], top[GEN][5];
    int cached, matched, fed;
} Out;

/* One greedy request: open (cached or not), feed prompt[cached, n) in chunks of `chunk` (recording a snapshot when
 * the fed length reaches one of snaps[]), then GEN greedy tokens with 5 top logprobs. 0 on success. */
static int request(Q35Engine *e, const int *prompt, int n, int cached, int chunk, const int *snaps, int n_snaps,
                   Out *o) {
    memset(o, 0, sizeof *o);
    Q35SeqParams p = {0};
    p.sampling.top_p = 1.0f;
    p.sampling.repetition_penalty = 1.0f;
    p.top_logprobs = 5;
    Q35Err err = {0};
    int seq, rc;
    Q35PrefixHit hit = {0};
    rc = cached ? q35_seq_open_cached(e, &p, prompt, n, &seq, &hit, &err) : q35_seq_open(e, &p, &seq, &err);
    if (rc) {
        fprintf(stderr, "open: %s\n", err.msg);
        return rc;
    }
    o->cached = hit.cached;
    o->matched = hit.matched;
    int pos = hit.cached, tok = -1;
    for (int g = 0; g < GEN && !rc;) {
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
        for (int j = 0; j < 5; j++) o->top[g][j] = out.top_logprob[j];
        g++;
    }
    if (rc) fprintf(stderr, "step: %s\n", err.msg);
    q35_seq_close(e, seq);
    return rc;
}

static int same(const Out *a, const Out *b) {
    return !memcmp(a->ids, b->ids, sizeof a->ids) && !memcmp(a->lp, b->lp, sizeof a->lp) &&
           !memcmp(a->top, b->top, sizeof a->top);
}

/* (a) */
static void test_exact(const char *dir, int block) {
    static const int lens[] = {1, 63, 64, 65, 527, 529, 2000};
    Q35Engine *cold = open_engine(dir), *warm = open_engine(dir);
    if (!cold || !warm || serve(cold, block, 1, 0, 0) || serve(warm, block, 0, 0, 0)) {
        CHECK(0, "engines for %s", dir);
        q35_engine_close(cold);
        q35_engine_close(warm);
        return;
    }
    int *a = malloc(sizeof(int) * CTX), *b = malloc(sizeof(int) * CTX);
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        const int L = lens[k], n = L + 37;
        make_prompt(a, n, 7u + (unsigned)k);
        memcpy(b, a, sizeof(int) * (size_t)L);
        make_prompt(b + L, n - L, 1000u + (unsigned)k); /* diverges right after L */
        if (b[L] == a[L]) b[L] = a[L] % 499 + 1;
        Out ref, first, hit;
        int rc = request(cold, a, n, 0, n, NULL, 0, &ref);
        rc |= request(warm, b, n, 1, 100, &L, 1, &first); /* records a snapshot at L */
        rc |= request(warm, a, n, 1, 300, NULL, 0, &hit);
        CHECK(!rc, "%s block %d L %d: requests ran", dir, block, L);
        CHECK(first.cached == 0 || first.cached < L, "%s L %d: the first request found %d cached", dir, L,
              first.cached);
        CHECK(hit.cached == L && hit.fed == n - L && hit.matched == L, "%s block %d L %d: cached %d matched %d fed %d",
              dir, block, L, hit.cached, hit.matched, hit.fed);
        CHECK(same(&ref, &hit), "%s block %d L %d: cached ids / logprobs equal cold (id0 %d vs %d, lp0 %.9g vs %.9g)",
              dir, block, L, ref.ids[0], hit.ids[0], ref.lp[0], hit.lp[0]);
        CHECK(same(&ref, &first) == 0 || L == 0, "%s L %d: the diverging request differs (the test sees outputs)", dir,
              L);
    }
    free(a);
    free(b);
    q35_engine_close(cold);
    q35_engine_close(warm);
}

/* (b) */
static void test_repeat_and_turns(const char *dir) {
    Q35Engine *cold = open_engine(dir), *warm = open_engine(dir);
    if (!cold || !warm || serve(cold, 16, 1, 0, 0) || serve(warm, 16, 0, 0, 0)) {
        CHECK(0, "engines");
        q35_engine_close(cold);
        q35_engine_close(warm);
        return;
    }
    int p[12];
    make_prompt(p, 12, 99u);
    int last = 11;
    Out ref, one, two;
    int rc = request(cold, p, 12, 0, 12, NULL, 0, &ref);
    rc |= request(warm, p, 12, 1, 12, &last, 1, &one);
    rc |= request(warm, p, 12, 1, 12, &last, 1, &two);
    CHECK(!rc && one.cached == 0 && two.cached == 11 && two.fed == 1, "repeat: cached %d then %d (fed %d)", one.cached,
          two.cached, two.fed);
    CHECK(same(&ref, &two) && same(&ref, &one), "repeat: same output as cold");

    /* turn 1: system + user + "<|im_start|>assistant\n" (3 ids: 7 8 9) + empty think (4 ids); snapshot after the
     * header and at n - 1 */
    enum { SYS = 300, U1 = 40, HDR = 3, THINK = 4, REPLY = 25, U2 = 30 };
    static int t1[SYS + U1 + HDR + THINK], t2[SYS + U1 + HDR + REPLY + 2 + U2 + HDR + THINK];
    make_prompt(t1, SYS + U1, 5u);
    const int hdr[HDR] = {7, 8, 9}, think[THINK] = {11, 12, 12, 13};
    memcpy(t1 + SYS + U1, hdr, sizeof hdr);
    memcpy(t1 + SYS + U1 + HDR, think, sizeof think);
    const int n1 = SYS + U1 + HDR + THINK, b1 = SYS + U1 + HDR;
    int snaps1[2] = {b1, n1 - 1};
    Out r1;
    rc = request(warm, t1, n1, 1, 128, snaps1, 2, &r1);
    /* turn 2 resends the history with the reply rendered without the think block */
    int n2 = 0;
    memcpy(t2, t1, sizeof(int) * (size_t)b1);
    n2 = b1;
    make_prompt(t2 + n2, REPLY, 77u);
    n2 += REPLY;
    t2[n2++] = 14; /* <|im_end|> \n */
    t2[n2++] = 15;
    make_prompt(t2 + n2, U2, 78u);
    n2 += U2;
    memcpy(t2 + n2, hdr, sizeof hdr);
    n2 += HDR;
    memcpy(t2 + n2, think, sizeof think);
    n2 += THINK;
    Out c2, w2;
    rc |= request(cold, t2, n2, 0, n2, NULL, 0, &c2);
    rc |= request(warm, t2, n2, 1, 128, NULL, 0, &w2);
    CHECK(!rc && w2.cached == b1 && w2.fed == n2 - b1,
          "turn 2 resumes at the turn-1 assistant header: cached %d (want %d), fed %d of %d", w2.cached, b1, w2.fed,
          n2);
    CHECK(same(&c2, &w2), "turn 2: same output as cold");
    q35_engine_close(cold);
    q35_engine_close(warm);
}

/* (c) and (d) */
static void test_diverge_and_evict(const char *dir) {
    Q35Engine *cold = open_engine(dir), *warm = open_engine(dir);
    Q35ServeInfo in;
    /* block 16; a budget of 2 slots + 100 blocks: half of it in snapshots, the rest in ~50 cached blocks */
    size_t sb = 0, bb = 0;
    if (cold && !serve(cold, 16, 1, 0, 0)) {
        q35_serve_info(cold, &in);
        sb = in.slot_bytes;
        bb = in.block_bytes;
    }
    const size_t pb = 2 * sb + 100 * bb;
    if (!cold || !warm || !sb || serve(warm, 16, 0, 0, pb)) {
        CHECK(0, "engines");
        q35_engine_close(cold);
        q35_engine_close(warm);
        return;
    }
    q35_serve_info(warm, &in);
    const int want_snaps = (int)(pb / 2 / sb), want_blocks = (int)((pb - (size_t)want_snaps * sb) / bb);
    CHECK(in.prefix_snaps == want_snaps && in.prefix_max_blocks == want_blocks && want_blocks < 80,
          "tiny budget: %d snapshots, %d blocks (want %d, %d)", in.prefix_snaps, in.prefix_max_blocks, want_snaps,
          want_blocks);
    enum { SHARED = 500, N = 560 };
    static int a[N], b[N], c[N];
    make_prompt(a, N, 1u);
    memcpy(b, a, sizeof(int) * SHARED);
    memcpy(c, a, sizeof(int) * SHARED);
    make_prompt(b + SHARED, N - SHARED, 2u);
    make_prompt(c + SHARED, N - SHARED, 3u);
    int end = N - 1;
    Out ra, rb, rc_, cold_c;
    int rc = request(warm, a, N, 1, 256, &end, 1, &ra);
    rc |= request(warm, b, N, 1, 256, NULL, 0, &rb);
    CHECK(!rc && rb.cached == 0 && rb.matched == SHARED, "diverging request: cached %d, matched %d (want 0, %d)",
          rb.cached, rb.matched, SHARED);
    const int at = rb.matched;
    rc |= request(warm, b, N, 1, 256, &at, 1, &rb); /* the scheduler records a snapshot at the divergence */
    rc |= request(warm, c, N, 1, 256, NULL, 0, &rc_);
    rc |= request(cold, c, N, 0, N, NULL, 0, &cold_c);
    CHECK(!rc && rc_.cached == SHARED && rc_.fed == N - SHARED, "third request resumes at the divergence: cached %d",
          rc_.cached);
    CHECK(same(&cold_c, &rc_), "third request equals cold");
    /* more distinct prompts than snapshots: the oldest go, output stays exact */
    long long ev0 = 0;
    q35_serve_info(warm, &in);
    ev0 = in.prefix_evicted;
    for (int k = 0; k < 8; k++) {
        static int d[300];
        make_prompt(d, 300, 50u + (unsigned)k);
        int e1 = 299;
        Out w, cl, again;
        rc = request(warm, d, 300, 1, 300, &e1, 1, &w);
        rc |= request(warm, d, 300, 1, 300, NULL, 0, &again);
        rc |= request(cold, d, 300, 0, 300, NULL, 0, &cl);
        CHECK(!rc && same(&w, &cl) && same(&again, &cl) && again.cached == 299,
              "evicting cache, prompt %d: exact (cached %d)", k, again.cached);
    }
    q35_serve_info(warm, &in);
    CHECK(in.prefix_evicted > ev0 && in.prefix_used_snaps <= want_snaps && in.prefix_used_blocks <= want_blocks,
          "evictions %lld, %d snapshots, %d blocks cached", in.prefix_evicted - ev0, in.prefix_used_snaps,
          in.prefix_used_blocks);
    /* cached blocks count as free: a sequence of the whole pool still gets its blocks */
    CHECK(in.free_blocks == in.n_blocks, "all %d blocks free or cached-only (%d)", in.n_blocks, in.free_blocks);
    q35_serve_close(warm);
    q35_engine_close(cold);
    q35_engine_close(warm);
}

/* a pool smaller than what the cache would like: new sequences reclaim cached blocks */
static void test_full_pool(const char *dir) {
    Q35Engine *e = open_engine(dir);
    if (!e || serve(e, 16, 1, 0, 0)) {
        CHECK(0, "engine");
        q35_engine_close(e);
        return;
    }
    Q35ServeInfo in;
    q35_serve_info(e, &in);
    const size_t sb = in.slot_bytes, bb = in.block_bytes;
    q35_serve_close(e);
    /* 2 slots, 160 blocks (2560 tokens, one context + a bit), a cache allowed to keep 160 blocks */
    Q35ServeOptions so = {
        .max_seqs = 2, .kv_bytes = 2 * sb + 160 * bb, .kv_block = 16, .prefix_bytes = 4 * sb + 160 * bb};
    Q35Err err = {0};
    if (q35_serve_open(e, &so, &err)) {
        CHECK(0, "serve: %s", err.msg);
        q35_engine_close(e);
        return;
    }
    static int p[2200];
    int rc = 0;
    for (int k = 0; k < 3; k++) {
        make_prompt(p, 2200, 200u + (unsigned)k);
        int snap = 2199;
        Out o;
        rc |= request(e, p, 2200, 1, 512, &snap, 1, &o);
    }
    q35_serve_info(e, &in);
    CHECK(!rc, "three 2200-token requests each got their 138 blocks from a pool of %d with a full cache (%d cached)",
          in.n_blocks, in.prefix_used_blocks);
    q35_engine_close(e);
}

int main(void) {
    test_exact("tests/fixtures/qwen35_text", 16);
    test_exact("tests/fixtures/qwen35_text", 64);
    test_exact("tests/fixtures/qwen3_dense", 16);
    test_repeat_and_turns("tests/fixtures/qwen35_text");
    test_diverge_and_evict("tests/fixtures/qwen35_text");
    test_full_pool("tests/fixtures/qwen35_text");
    return TEST_SUMMARY("prefix");
}
