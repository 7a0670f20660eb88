/* test_prefix.c — the prefix cache (q35_seq_open_cached / q35_seq_snapshot) on the CPU backend in deterministic
 * mode, on the golden fixtures (Qwen3.5 hybrid and Qwen3 dense):
 *   (a) exactness (tests/prefix_check.h, which tests/gpu/test_prefix_cuda.c runs on CUDA): a request resumed from a
 *       snapshot recorded at L ids of another request (which diverges right there; the snapshot taken between steps,
 *       and again inside a step: Q35StepItem.snap_at) gives greedy ids, logprobs and
 *       top ids / logprobs bitwise equal to the same request fed cold on an engine without a cache, for L = 1, 63, 64,
 *       65, 527, 529, 4096 (blocks of 16 and of 64 tokens on the hybrid, 16 on the dense model); sampled with a seed
 *       (blocks of 16, L <= 529) likewise;
 *   (b) an exactly repeated short prompt hits n - 1 ids; a multi-turn chat whose second turn resends the history
 *       with the reply re-rendered resumes at the first turn's assistant header (only the rest is fed);
 *   (c) two requests sharing a long prefix: the second reports the divergence point (matched), a snapshot there
 *       makes the third resume at it;
 *   (d) a tiny budget (a few snapshots and blocks) evicts least-recently-used entries and still serves exact output;
 *       a pool full of cached blocks never blocks a new sequence (cached blocks count as free and are reclaimed);
 *   (e) the host tier (tests/prefix_check.h, also run on CUDA): a snapshot moved out of the full device tier still
 *       gives hits at exactly L bitwise equal to cold, for L = 1, 63, 64, 65, 527, 529, with a host tier of 4 (which
 *       evicts its own least recently used) and none (the same requests miss); a host snapshot hit while a device id
 *       is free moves back, and all three kinds of hit (host, host then moved, device) equal cold. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwen35.h"
#include "test.h"
#include "prefix_check.h"
#include "st_write.h"
#include "util.h"

#define CTX       2304
#define EXACT_CTX (4096 + PREFIX_TAIL + PREFIX_GEN)

static Q35Engine *open_engine(const char *dir, int ctx) {
    Q35Options o;
    q35_options_init(&o);
    o.model_dir = dir;
    o.backend = "cpu";
    o.max_seq = ctx;
    o.threads = 1;
    o.deterministic = 1;
    Q35Engine *e = NULL;
    Q35Err err = {0};
    if (q35_engine_open(&e, &o, &err)) fprintf(stderr, "open %s: %s\n", dir, err.msg);
    return e;
}

/* (a) on a copy of the fixture `dir` whose config.json says max_position_embeddings 8192 (the fixtures say 4096,
 * short of L = 4096 plus the rest of the request; the model computes nothing from it, RoPE is plain), beside a link
 * to its weights. */
static void test_exact(const char *dir, const int *blocks, int n_blocks) {
    static const int lens[] = {1, 63, 64, 65, 527, 529, 4096};
    char tmp[] = "/tmp/q35_prefix_XXXXXX", p[512], real[4096], *cfg = NULL;
    Err err = {0};
    if (read_file(pj(p, sizeof p, dir, "config.json"), &cfg, NULL, &err)) fprintf(stderr, "%s\n", err.msg);
    char *at = cfg ? strstr(cfg, "\"max_position_embeddings\": 4096") : NULL;
    if (at) memcpy(at + strlen("\"max_position_embeddings\": "), "8192", 4);
    const int made = at && make_tmpdir(tmp);
    const int ok = made && realpath(pj(p, sizeof p, dir, "model.safetensors"), real) &&
                   write_text(pj(p, sizeof p, tmp, "config.json"), cfg) == 0 &&
                   symlink(real, pj(p, sizeof p, tmp, "model.safetensors")) == 0;
    free(cfg);
    CHECK(ok, "%s: a copy with a longer context in %s", dir, tmp);
    Q35Engine *cold = ok ? open_engine(tmp, EXACT_CTX) : NULL, *warm = ok ? open_engine(tmp, EXACT_CTX) : NULL;
    CHECK(cold && warm, "engines for %s", dir);
    for (int i = 0; cold && warm && i < n_blocks; i++)
        for (int in_step = 0; in_step < 2; in_step++) {
            const PrefixExact x = {dir, blocks[i], 0, 0, lens, (int)(sizeof lens / sizeof lens[0]), NULL, in_step};
            prefix_check_exact(cold, warm, &x);
        }
    /* sampled with a seed, blocks of 16, L <= 529 */
    const Q35SeqParams sampled = {
        .sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.0f, .seed = 77},
        .top_logprobs = 5};
    const PrefixExact xs = {dir, 16, 0, 0, lens, (int)(sizeof lens / sizeof lens[0]) - 1, &sampled, 1};
    if (cold && warm) prefix_check_exact(cold, warm, &xs);
    q35_engine_close(cold);
    q35_engine_close(warm);
    if (made) rm_rf(tmp);
}

/* (b) */
static void test_repeat_and_turns(const char *dir) {
    Q35Engine *cold = open_engine(dir, CTX), *warm = open_engine(dir, CTX);
    if (!cold || !warm || prefix_serve(cold, 16, 1, 0, 0) || prefix_serve(warm, 16, 0, 0, 0)) {
        CHECK(0, "engines");
        q35_engine_close(cold);
        q35_engine_close(warm);
        return;
    }
    int p[12];
    prefix_make_prompt(p, 12, 99u);
    int last = 11;
    PrefixOut ref, one, two;
    int rc = prefix_request(cold, NULL, p, 12, 0, 12, NULL, 0, &ref);
    rc |= prefix_request(warm, NULL, p, 12, 1, 12, &last, 1, &one);
    rc |= prefix_request(warm, NULL, p, 12, 1, 12, &last, 1, &two);
    CHECK(!rc && one.cached == 0 && two.cached == 11 && two.fed == 1, "repeat: cached %d then %d (fed %d)", one.cached,
          two.cached, two.fed);
    CHECK(prefix_same(&ref, &two) && prefix_same(&ref, &one), "repeat: same output as cold");

    /* turn 1: system + user + "<|im_start|>assistant\n" (3 ids: 7 8 9) + empty think (4 ids); snapshot after the
     * header and at n - 1 */
    enum { SYS = 300, U1 = 40, HDR = 3, THINK = 4, REPLY = 25, U2 = 30 };
    static int t1[SYS + U1 + HDR + THINK], t2[SYS + U1 + HDR + REPLY + 2 + U2 + HDR + THINK];
    prefix_make_prompt(t1, SYS + U1, 5u);
    const int hdr[HDR] = {7, 8, 9}, think[THINK] = {11, 12, 12, 13};
    memcpy(t1 + SYS + U1, hdr, sizeof hdr);
    memcpy(t1 + SYS + U1 + HDR, think, sizeof think);
    const int n1 = SYS + U1 + HDR + THINK, b1 = SYS + U1 + HDR;
    int snaps1[2] = {b1, n1 - 1};
    PrefixOut r1;
    rc = prefix_request(warm, NULL, t1, n1, 1, 128, snaps1, 2, &r1);
    /* turn 2 resends the history with the reply rendered without the think block */
    int n2 = 0;
    memcpy(t2, t1, sizeof(int) * (size_t)b1);
    n2 = b1;
    prefix_make_prompt(t2 + n2, REPLY, 77u);
    n2 += REPLY;
    t2[n2++] = 14; /* <|im_end|> \n */
    t2[n2++] = 15;
    prefix_make_prompt(t2 + n2, U2, 78u);
    n2 += U2;
    memcpy(t2 + n2, hdr, sizeof hdr);
    n2 += HDR;
    memcpy(t2 + n2, think, sizeof think);
    n2 += THINK;
    PrefixOut c2, w2;
    rc |= prefix_request(cold, NULL, t2, n2, 0, n2, NULL, 0, &c2);
    rc |= prefix_request(warm, NULL, t2, n2, 1, 128, NULL, 0, &w2);
    CHECK(!rc && w2.cached == b1 && w2.fed == n2 - b1,
          "turn 2 resumes at the turn-1 assistant header: cached %d (want %d), fed %d of %d", w2.cached, b1, w2.fed,
          n2);
    CHECK(prefix_same(&c2, &w2), "turn 2: same output as cold");
    q35_engine_close(cold);
    q35_engine_close(warm);
}

/* (c) and (d) */
static void test_diverge_and_evict(const char *dir) {
    Q35Engine *cold = open_engine(dir, CTX), *warm = open_engine(dir, CTX);
    Q35ServeInfo in;
    /* block 16; a budget of 2 slots + 100 blocks: half of it in snapshots, the rest in ~50 cached blocks */
    size_t sb = 0, bb = 0;
    if (cold && !prefix_serve(cold, 16, 1, 0, 0)) {
        q35_serve_info(cold, &in);
        sb = in.slot_bytes;
        bb = in.block_bytes;
    }
    const size_t pb = 2 * sb + 100 * bb;
    if (!cold || !warm || !sb || prefix_serve(warm, 16, 0, 0, pb)) {
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
    prefix_make_prompt(a, N, 1u);
    memcpy(b, a, sizeof(int) * SHARED);
    memcpy(c, a, sizeof(int) * SHARED);
    prefix_make_prompt(b + SHARED, N - SHARED, 2u);
    prefix_make_prompt(c + SHARED, N - SHARED, 3u);
    int end = N - 1;
    PrefixOut ra, rb, rc_, cold_c;
    int rc = prefix_request(warm, NULL, a, N, 1, 256, &end, 1, &ra);
    rc |= prefix_request(warm, NULL, b, N, 1, 256, NULL, 0, &rb);
    CHECK(!rc && rb.cached == 0 && rb.matched == SHARED, "diverging request: cached %d, matched %d (want 0, %d)",
          rb.cached, rb.matched, SHARED);
    const int at = rb.matched;
    rc |=
        prefix_request(warm, NULL, b, N, 1, 256, &at, 1, &rb); /* the scheduler records a snapshot at the divergence */
    rc |= prefix_request(warm, NULL, c, N, 1, 256, NULL, 0, &rc_);
    rc |= prefix_request(cold, NULL, c, N, 0, N, NULL, 0, &cold_c);
    CHECK(!rc && rc_.cached == SHARED && rc_.fed == N - SHARED, "third request resumes at the divergence: cached %d",
          rc_.cached);
    CHECK(prefix_same(&cold_c, &rc_), "third request equals cold");
    /* more distinct prompts than snapshots: the oldest go, output stays exact */
    long long ev0 = 0;
    q35_serve_info(warm, &in);
    ev0 = in.prefix_evicted;
    for (int k = 0; k < 8; k++) {
        static int d[300];
        prefix_make_prompt(d, 300, 50u + (unsigned)k);
        int e1 = 299;
        PrefixOut w, cl, again;
        rc = prefix_request(warm, NULL, d, 300, 1, 300, &e1, 1, &w);
        rc |= prefix_request(warm, NULL, d, 300, 1, 300, NULL, 0, &again);
        rc |= prefix_request(cold, NULL, d, 300, 0, 300, NULL, 0, &cl);
        CHECK(!rc && prefix_same(&w, &cl) && prefix_same(&again, &cl) && again.cached == 299,
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
    Q35Engine *e = open_engine(dir, CTX);
    if (!e || prefix_serve(e, 16, 1, 0, 0)) {
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
        prefix_make_prompt(p, 2200, 200u + (unsigned)k);
        int snap = 2199;
        PrefixOut o;
        rc |= prefix_request(e, NULL, p, 2200, 1, 512, &snap, 1, &o);
    }
    q35_serve_info(e, &in);
    CHECK(!rc, "three 2200-token requests each got their 138 blocks from a pool of %d with a full cache (%d cached)",
          in.n_blocks, in.prefix_used_blocks);
    q35_engine_close(e);
}

/* (e) */
static void test_host_tier(const char *dir) {
    static const int lens[] = {1, 63, 64, 65, 527, 529};
    Q35Engine *cold = open_engine(dir, CTX), *warm = open_engine(dir, CTX);
    CHECK(cold && warm, "engines for %s", dir);
    if (cold && warm) {
        const PrefixExact x = {dir, 16, 0, 0, lens, (int)(sizeof lens / sizeof lens[0]), NULL, 0};
        prefix_check_host(cold, warm, &x, 4);
        prefix_check_host(cold, warm, &x, 0);
        prefix_check_promote(cold, warm, dir, 16);
    }
    q35_engine_close(cold);
    q35_engine_close(warm);
}

int main(void) {
    static const int b16_64[] = {16, 64}, b16[] = {16};
    test_exact("tests/fixtures/qwen35_text", b16_64, 2);
    test_exact("tests/fixtures/qwen3_dense", b16, 1);
    test_repeat_and_turns("tests/fixtures/qwen35_text");
    test_diverge_and_evict("tests/fixtures/qwen35_text");
    test_full_pool("tests/fixtures/qwen35_text");
    test_host_tier("tests/fixtures/qwen35_text");
    return TEST_SUMMARY("prefix");
}
