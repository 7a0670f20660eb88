/* test_serve_engine.c — many sequences in one engine (q35_serve_open / q35_seq_* / q35_step) on the CPU backend, on
 * the golden fixtures, both through the batched step and through the one-sequence fallback (single_seq):
 *   (a) a sequence fed through q35_step in chunks gives logits bitwise equal to q35_forward's with the same chunks
 *       on a fresh engine, and greedy ids / logprobs equal to the host's argmax / log softmax of those logits;
 *   (b) batch invariance: a request's tokens, logprobs and logits alone vs among 1, 7 and 20 others with other
 *       lengths and chunkings (and in another item position) are bitwise identical;
 *   (c) block accounting: blocks_needed, free blocks after close, Q35_ERR_OOM with nothing changed when blocks run
 *       out, slot exhaustion, context overflow, a too-small memory budget;
 *   (d) sampling: a sequence with its own seed equals q35_generate with that seed (alone and among neighbours);
 *       frequency / presence penalties move the greedy choice exactly as the host computes it; logprobs sum-check;
 *   (e) bad steps (ids out of range, a sequence twice, a closed sequence, a foreign id after a sample) change
 *       nothing; preemption and recompute give the tokens of an unpreempted run;
 *   (f) bf16 DeltaNet states (Q35ServeOptions.state_bf16): after each step every entry of a slot's states is a bf16
 *       value (per token in deterministic mode and in decode steps, at the end of a chunk otherwise), batch
 *       invariance holds, the logits move off the fp32-state run's but stay within a bf16 bound of it, and the
 *       one-sequence fallback refuses the option;
 *   (g) the same for an fp8 KV cache (Q35ServeOptions.kv_fp8): every K / V entry the steps wrote to the pools is an
 *       e4m3 value, batch invariance, logits within an fp8 bound of the bf16-KV run's, the fallback refuses it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/forward.h"
#include "model.h"
#include "qwen35.h"
#include "test.h"

#define CTX 128

static Q35Engine *open_engine(const char *dir, int threads) {
    Q35Options o;
    q35_options_init(&o);
    o.model_dir = dir;
    o.backend = "cpu";
    o.max_seq = CTX;
    o.threads = threads;
    Q35Engine *e = NULL;
    Q35Err err = {0};
    if (q35_engine_open(&e, &o, &err)) fprintf(stderr, "open %s: %s\n", dir, err.msg);
    return e;
}

static int serve(Q35Engine *e, int single, int max_seqs, size_t kv_bytes, int block) {
    Q35ServeOptions so = {0};
    so.single_seq = single;
    so.max_seqs = max_seqs;
    so.kv_bytes = kv_bytes ? kv_bytes : (size_t)64 << 20;
    so.kv_block = block;
    Q35Err err = {0};
    int rc = q35_serve_open(e, &so, &err);
    if (rc) fprintf(stderr, "serve_open: %s\n", err.msg);
    return rc;
}

static Q35SeqParams greedy_params(int top) {
    Q35SeqParams p;
    memset(&p, 0, sizeof p);
    p.sampling.top_p = 1.0f;
    p.sampling.repetition_penalty = 1.0f;
    p.top_logprobs = top;
    return p;
}

/* deterministic pseudo-random prompt ids in [1, 500) */
static void make_prompt(int *ids, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        ids[i] = 1 + (int)((seed >> 8) % 499u);
    }
}

/* host log softmax over [0, nv) in double: the chosen id's and the k best (logit descending, id ascending) */
static double lse_of(const float *l, int nv) {
    float mx = l[0];
    for (int i = 1; i < nv; i++)
        if (l[i] > mx) mx = l[i];
    double s = 0;
    for (int i = 0; i < nv; i++) s += exp((double)l[i] - mx);
    return mx + log(s);
}

static int argmax(const float *l, int nv) {
    int b = 0;
    for (int i = 1; i < nv; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* One request: prompt fed in chunks, then decode steps (greedy or sampled by its params). */
typedef struct Req {
    int prompt[CTX];
    int n_prompt;
    int chunks[16]; /* prompt chunk sizes (sum n_prompt) */
    int n_chunks;
    int n_decode; /* sampled tokens */
    Q35SeqParams p;
    /* results */
    int seq, ci, fed, done;
    int ids[CTX];
    int n_ids;
    Q35StepOut outs[CTX];
    float *logits; /* [n_decode][V] the logits of each sampled position */
} Req;

static void req_init(Req *r, int n_prompt, unsigned seed, const int *chunks, int n_chunks, int n_decode, int V) {
    memset(r, 0, sizeof *r);
    r->n_prompt = n_prompt;
    make_prompt(r->prompt, n_prompt, seed);
    int sum = 0;
    for (int i = 0; i < n_chunks; i++) sum += chunks[i];
    memcpy(r->chunks, chunks, sizeof(int) * (size_t)n_chunks);
    r->n_chunks = n_chunks;
    if (sum < n_prompt) r->chunks[r->n_chunks++] = n_prompt - sum;
    r->n_decode = n_decode;
    r->p = greedy_params(20);
    r->logits = malloc(sizeof(float) * (size_t)V * (size_t)(n_decode > 0 ? n_decode : 1));
}

/* Runs the requests together: each step takes every unfinished request's next item, in the order given by perm.
 * Returns 0 or the first error. */
static int run_together(Q35Engine *e, Req **rs, int n, int rotate) {
    Q35Err err = {0};
    for (int i = 0; i < n; i++) {
        int rc = q35_seq_open(e, &rs[i]->p, &rs[i]->seq, &err);
        if (rc) {
            fprintf(stderr, "seq_open: %s\n", err.msg);
            return rc;
        }
    }
    Q35StepItem items[64];
    Q35StepOut outs[64];
    Req *who[64];
    for (int step = 0;; step++) {
        int m = 0;
        for (int k = 0; k < n; k++) {
            Req *r = rs[(k + (rotate ? step : 0)) % n];
            if (r->done) continue;
            Q35StepItem it = {0};
            it.seq = r->seq;
            if (r->ci < r->n_chunks) {
                it.ids = r->prompt + r->fed;
                it.n = r->chunks[r->ci];
                it.sample = r->ci == r->n_chunks - 1;
            } else {
                it.ids = &r->ids[r->n_ids - 1];
                it.n = 1;
                it.sample = 1;
            }
            if (it.sample) it.logits = r->logits + (size_t)r->n_ids * (size_t)q35_vocab_size(e);
            items[m] = it;
            who[m++] = r;
        }
        if (m == 0) break;
        int rc = q35_step(e, items, m, outs, &err);
        if (rc) {
            fprintf(stderr, "step: %s\n", err.msg);
            return rc;
        }
        for (int i = 0; i < m; i++) {
            Req *r = who[i];
            if (r->ci < r->n_chunks) {
                r->fed += items[i].n;
                r->ci++;
            }
            if (items[i].sample) {
                r->outs[r->n_ids] = outs[i];
                r->ids[r->n_ids++] = outs[i].id;
                if (r->n_ids == r->n_decode) r->done = 1;
            }
        }
    }
    for (int i = 0; i < n; i++) q35_seq_close(e, rs[i]->seq);
    return 0;
}

/* (a) the step path against q35_forward with the same chunks on a fresh engine */
static void test_equals_forward(const char *dir, int single) {
    Q35Engine *a = open_engine(dir, 1), *b = open_engine(dir, 1);
    if (!a || !b || serve(a, single, 4, 0, 16)) {
        CHECK(0, "engines open");
        return;
    }
    const int V = q35_vocab_size(a), nv = V;
    const int chunks[] = {5, 1, 16, 15, 64, 3};
    Req r;
    req_init(&r, 104, 7u, chunks, 6, 12, V);
    CHECK(run_together(a, (Req *[]){&r}, 1, 0) == 0 && r.n_ids == 12, "%s single=%d: 12 ids", dir, single);
    float *l = malloc(sizeof(float) * (size_t)V);
    Q35Err err = {0};
    int fed = 0, ok = 1;
    for (int c = 0; c < r.n_chunks; c++) {
        ok &= q35_forward(b, r.prompt + fed, r.chunks[c], 0, l, &err) == 0;
        fed += r.chunks[c];
    }
    int same_logits = 1, same_ids = 1, same_lp = 1;
    for (int t = 0; t < r.n_ids && ok; t++) {
        same_logits &= !memcmp(l, r.logits + (size_t)t * V, sizeof(float) * (size_t)V);
        same_ids &= argmax(l, nv) == r.ids[t];
        const double lse = lse_of(l, nv);
        const Q35StepOut *o = &r.outs[t];
        same_lp &= fabs(o->logprob - (l[o->id] - lse)) < 1e-5 && o->n_top == 20 && o->top_id[0] == o->id;
        for (int j = 0; j < o->n_top; j++) {
            same_lp &= fabs(o->top_logprob[j] - (l[o->top_id[j]] - lse)) < 1e-5;
            if (j > 0)
                same_lp &= l[o->top_id[j]] < l[o->top_id[j - 1]] ||
                           (l[o->top_id[j]] == l[o->top_id[j - 1]] && o->top_id[j] > o->top_id[j - 1]);
        }
        int above = 0; /* ids with a larger logit than the 20th alternative: exactly 19 */
        for (int i = 0; i < nv; i++) above += l[i] > l[o->top_id[19]];
        same_lp &= above <= 19;
        if (t + 1 < r.n_ids) ok &= q35_forward(b, &r.ids[t], 1, 0, l, &err) == 0;
    }
    CHECK(ok, "reference forward: %s", err.msg);
    CHECK(same_logits, "%s single=%d: step logits bitwise equal to q35_forward's", dir, single);
    CHECK(same_ids, "%s single=%d: greedy ids are the host argmax", dir, single);
    CHECK(same_lp, "%s single=%d: logprobs and top-20 are the host log softmax", dir, single);
    double mass = 0;
    for (int j = 0; j < r.outs[0].n_top; j++) mass += exp(r.outs[0].top_logprob[j]);
    CHECK(mass <= 1.0 + 1e-6 && mass > 0, "top-20 probability mass %g in (0, 1]", mass);
    /* after serve_close the single-sequence calls work again, from an empty sequence */
    q35_serve_close(a);
    float *l1 = malloc(sizeof(float) * (size_t)V), *l2 = malloc(sizeof(float) * (size_t)V);
    q35_reset(b, &err);
    CHECK(q35_forward(a, r.prompt, 9, 0, l1, &err) == 0 && q35_position(a) == 9 &&
              q35_forward(b, r.prompt, 9, 0, l2, &err) == 0 && !memcmp(l1, l2, sizeof(float) * (size_t)V),
          "single=%d: q35_forward after serve_close starts a fresh sequence (%s)", single, err.msg);
    free(l1);
    free(l2);
    free(l);
    free(r.logits);
    q35_engine_close(a);
    q35_engine_close(b);
}

typedef struct Collect {
    int ids[CTX];
    int n;
} Collect;

static int collect(void *user, int id) {
    Collect *c = user;
    if (c->n < CTX) c->ids[c->n++] = id;
    return 0;
}

/* (d) a sampled sequence equals q35_generate with the same settings and seed, alone and among neighbours */
static void test_sampling(const char *dir, int single) {
    Q35Engine *a = open_engine(dir, 1), *b = open_engine(dir, 1);
    if (!a || !b || serve(a, single, 8, 0, 16)) {
        CHECK(0, "engines open");
        return;
    }
    const int V = q35_vocab_size(a);
    Q35SeqParams p = greedy_params(-1);
    p.sampling.temperature = 0.9f;
    p.sampling.top_k = 50;
    p.sampling.top_p = 0.95f;
    p.sampling.min_p = 0.02f;
    p.sampling.presence_penalty = 0.3f;
    p.sampling.repetition_penalty = 1.1f;
    p.sampling.seed = 42;
    const int one[] = {0};
    Req r;
    req_init(&r, 23, 11u, one, 0, 16, V);
    r.p = p;
    CHECK(run_together(a, (Req *[]){&r}, 1, 0) == 0 && r.n_ids == 16, "%s single=%d: 16 sampled ids", dir, single);
    Collect c = {.n = 0};
    Q35Err err = {0};
    CHECK(q35_generate(b, r.prompt, r.n_prompt, 16, &p.sampling, collect, &c, NULL, &err) == 0, "%s", err.msg);
    CHECK(c.n == 16 && !memcmp(c.ids, r.ids, sizeof(int) * 16), "%s single=%d: sampled ids equal q35_generate's", dir,
          single);
    CHECK(r.outs[0].logprob == 0 && r.outs[0].n_top == 0, "no logprobs asked: none given");
    /* another seed gives other ids (the seed is the sequence's own) */
    Req r2;
    req_init(&r2, 23, 11u, one, 0, 16, V);
    r2.p = p;
    r2.p.sampling.seed = 43;
    CHECK(run_together(a, (Req *[]){&r2}, 1, 0) == 0 && memcmp(r2.ids, r.ids, sizeof(int) * 16),
          "seed 43 samples other ids than seed 42");
    free(r.logits);
    free(r2.logits);
    q35_engine_close(a);
    q35_engine_close(b);
}

/* (d) frequency and presence penalties: the greedy id is the argmax of the raw logits minus the penalties, computed
 * here from the counts of the ids generated so far. */
static void test_penalties(const char *dir, int single) {
    Q35Engine *a = open_engine(dir, 1);
    if (!a || serve(a, single, 2, 0, 16)) {
        CHECK(0, "engine opens");
        return;
    }
    const int V = q35_vocab_size(a);
    const int one[] = {0};
    float fs[3] = {0.0f, 0.7f, 100.0f}, ps[3] = {0.0f, 0.4f, 0.0f};
    int repeats[3] = {0};
    for (int k = 0; k < 3; k++) {
        Req r;
        req_init(&r, 9, 5u, one, 0, 40, V);
        r.p.sampling.frequency_penalty = fs[k];
        r.p.sampling.presence_penalty = ps[k];
        CHECK(run_together(a, (Req *[]){&r}, 1, 0) == 0 && r.n_ids == 40, "40 ids");
        int count[4096] = {0}, ok = 1;
        for (int t = 0; t < r.n_ids; t++) {
            const float *l = r.logits + (size_t)t * V;
            int best = 0;
            float bv = -INFINITY;
            for (int i = 0; i < V; i++) {
                float v = l[i];
                if (count[i]) v -= ps[k];
                v -= fs[k] * (float)count[i];
                if (v > bv) bv = v, best = i;
            }
            ok &= best == r.ids[t];
            repeats[k] += count[r.ids[t]] > 0;
            count[r.ids[t]]++;
        }
        CHECK(ok, "frequency %g presence %g: greedy ids are the argmax of the penalised logits", fs[k], ps[k]);
        free(r.logits);
    }
    CHECK(repeats[0] > 0, "without penalties the greedy run repeats ids (%d)", repeats[0]);
    CHECK(repeats[2] == 0, "frequency 100 never repeats an id (%d)", repeats[2]);
    q35_engine_close(a);
}

/* the request under test in (b): chunked prompt, sampled with its own seed, logprobs */
static void target_req(Req *r, int V, int n_decode) {
    const int chunks[] = {7, 20};
    req_init(r, 40, 3u, chunks, 2, n_decode, V);
    r->p.sampling.temperature = 0.8f;
    r->p.sampling.top_k = 30;
    r->p.sampling.seed = 99;
    r->p.sampling.frequency_penalty = 0.5f;
    r->p.top_logprobs = 5;
}

static int same_req(const Req *x, const Req *y, int V) {
    return x->n_ids == y->n_ids && !memcmp(x->ids, y->ids, sizeof(int) * (size_t)x->n_ids) &&
           !memcmp(x->outs, y->outs, sizeof(Q35StepOut) * (size_t)x->n_ids) &&
           !memcmp(x->logits, y->logits, sizeof(float) * (size_t)V * (size_t)x->n_ids);
}

/* (b) batch invariance: the target alone, then among 1, 7 and 20 others (other lengths, chunkings, params, and the
 * item order rotating every step), and alone with 2 threads */
static void test_batch_invariance(const char *dir) {
    Q35Engine *a = open_engine(dir, 1);
    if (!a || serve(a, 0, 24, 0, 16)) {
        CHECK(0, "engine opens");
        return;
    }
    const int V = q35_vocab_size(a);
    Req alone;
    target_req(&alone, V, 10);
    CHECK(run_together(a, (Req *[]){&alone}, 1, 0) == 0 && alone.n_ids == 10, "%s: the target alone", dir);
    const int ks[3] = {1, 7, 20};
    for (int c = 0; c < 3; c++) {
        Req *list[21], others[20], t;
        target_req(&t, V, 10);
        int m = 0;
        for (int i = 0; i < ks[c]; i++) {
            const int chunks[] = {1 + i % 5, 2 + (7 * i) % 13, 16};
            req_init(&others[i], 3 + (11 * i + 5 * c) % 70, 100u + (unsigned)i, chunks, 1 + i % 3, 1 + (5 * i) % 14, V);
            others[i].p.top_logprobs = i % 3 == 0 ? -1 : i % 21;
            if (i % 2) {
                others[i].p.sampling.temperature = 1.0f;
                others[i].p.sampling.seed = (uint64_t)i;
            }
            if (i == ks[c] / 2) list[m++] = &t;
            list[m++] = &others[i];
        }
        CHECK(run_together(a, list, m, 1) == 0, "%s: %d requests together", dir, m);
        CHECK(same_req(&t, &alone, V), "%s: among %d others the target's ids, logprobs and logits are bitwise its own",
              dir, ks[c]);
        int moved = 0; /* the neighbours are not copies of the target */
        for (int i = 0; i < ks[c]; i++) moved += others[i].n_ids > 0 && others[i].ids[0] != t.ids[0];
        CHECK(ks[c] == 1 || moved > 0, "neighbours sample their own ids");
        free(t.logits);
        for (int i = 0; i < ks[c]; i++) free(others[i].logits);
    }
    q35_engine_close(a);
    Q35Engine *a2 = open_engine(dir, 2);
    Req two;
    target_req(&two, V, 10);
    CHECK(a2 && serve(a2, 0, 4, 0, 16) == 0 && run_together(a2, (Req *[]){&two}, 1, 0) == 0 &&
              same_req(&two, &alone, V),
          "%s: 2 threads give the target's bits", dir);
    free(two.logits);
    free(alone.logits);
    q35_engine_close(a2);
}

static int step1(Q35Engine *e, int seq, const int *ids, int n, int sample, Q35StepOut *o, Q35Err *err) {
    Q35StepItem it = {.seq = seq, .ids = ids, .n = n, .sample = sample};
    return q35_step(e, &it, 1, o, err);
}

/* (c) block and slot accounting, context overflow, a budget too small; (e) bad steps change nothing */
static void test_accounting(const char *dir) {
    Q35Engine *e = open_engine(dir, 1);
    if (!e || serve(e, 0, 2, 0, 16)) {
        CHECK(0, "engine opens");
        return;
    }
    Q35ServeInfo in;
    q35_serve_info(e, &in);
    const size_t sb = in.slot_bytes, bb = in.block_bytes;
    CHECK(bb == (size_t)2 * 2 * 16 * 32 * 4 && sb > 0, "%s: a block is K+V of 1 layer, 2 heads, 16 x 32 fp32 (%zu)",
          dir, bb);
    q35_serve_close(e);
    Q35ServeOptions so = {0};
    so.max_seqs = 2;
    so.kv_block = 16;
    so.kv_bytes = sb + 7 * bb; /* a full context (128 tokens) needs 8 blocks */
    Q35Err err = {0};
    CHECK(q35_serve_open(e, &so, &err) == Q35_ERR_OOM && strstr(err.msg, "too small"), "small budget: %s", err.msg);
    so.kv_bytes = 2 * sb + 12 * bb;
    so.ablate = "sv.attn"; /* a measurement aid of the CUDA step: refused here, batched or not */
    CHECK(q35_serve_open(e, &so, &err) == Q35_ERR_UNSUPPORTED && strstr(err.msg, "ablate"), "ablate refused: %s",
          err.msg);
    so.single_seq = 1;
    CHECK(q35_serve_open(e, &so, &err) == Q35_ERR_UNSUPPORTED && strstr(err.msg, "ablate"),
          "ablate refused (one sequence): %s", err.msg);
    so.single_seq = 0;
    so.ablate = "";
    CHECK(q35_serve_open(e, &so, &err) == 0, "%s", err.msg);
    q35_serve_info(e, &in);
    CHECK(in.max_seqs == 2 && in.n_blocks == 12 && in.free_blocks == 12 && in.kv_block == 16 && in.max_context == CTX &&
              in.open_seqs == 0,
          "layout: %d slots, %d blocks (%d free), block %d, context %d", in.max_seqs, in.n_blocks, in.free_blocks,
          in.kv_block, in.max_context);
    Q35SeqParams p = greedy_params(-1);
    int s1, s2, s3;
    const int big_id = 1 << 30;
    const float one = 1.0f;
    Q35SeqParams badp = p;
    badp.bias_ids = &big_id;
    badp.bias = &one;
    badp.n_bias = 1;
    CHECK(q35_seq_open(e, &badp, &s1, &err) == Q35_ERR_ARG && strstr(err.msg, "logit bias"), "bias id refused: %s",
          err.msg);
    badp = p;
    badp.min_tokens = 2;
    badp.min_ids = &big_id;
    badp.n_min_ids = 1;
    CHECK(q35_seq_open(e, &badp, &s1, &err) == Q35_ERR_ARG && strstr(err.msg, "min_tokens"), "ban id refused: %s",
          err.msg);
    q35_serve_info(e, &in);
    CHECK(in.open_seqs == 0, "a refused open takes no slot");
    CHECK(q35_seq_open(e, &p, &s1, &err) == 0 && q35_seq_open(e, &p, &s2, &err) == 0, "two sequences open");
    CHECK(q35_seq_open(e, &p, &s3, &err) == Q35_ERR_OOM && strstr(err.msg, "slots"), "no third slot: %s", err.msg);
    CHECK(q35_seq_blocks_needed(e, s1, 1) == 1 && q35_seq_blocks_needed(e, s1, 16) == 1 &&
              q35_seq_blocks_needed(e, s1, 17) == 2 && q35_seq_blocks_needed(e, s1, 128) == 8,
          "blocks_needed on an empty sequence");
    int ids[CTX];
    make_prompt(ids, CTX, 9u);
    Q35StepOut o;
    CHECK(step1(e, s1, ids, 100, 1, &o, &err) == 0 && q35_seq_length(e, s1) == 100, "100 tokens: %s", err.msg);
    q35_serve_info(e, &in);
    CHECK(in.free_blocks == 5 && in.open_seqs == 2, "7 blocks taken, %d free", in.free_blocks);
    CHECK(q35_seq_blocks_needed(e, s1, 12) == 0 && q35_seq_blocks_needed(e, s1, 13) == 1, "blocks_needed at 100");
    CHECK(step1(e, s2, ids, 97, 0, NULL, &err) == Q35_ERR_OOM, "97 tokens need 7 blocks, 5 free: OOM (%s)", err.msg);
    q35_serve_info(e, &in);
    CHECK(in.free_blocks == 5 && q35_seq_length(e, s2) == 0 && q35_seq_length(e, s1) == 100, "OOM changed nothing");
    Q35StepItem two[2] = {{.seq = s1, .ids = &o.id, .n = 1, .sample = 1}, {.seq = s2, .ids = ids, .n = 80}};
    Q35StepOut outs[2];
    CHECK(q35_step(e, two, 2, outs, &err) == 0 && outs[1].id == -1, "both: 0 + 5 blocks (%s)", err.msg);
    q35_serve_info(e, &in);
    CHECK(in.free_blocks == 0 && q35_seq_length(e, s1) == 101 && q35_seq_length(e, s2) == 80, "all blocks taken");
    /* context: 101 + 1 + 27 > 128 */
    int nxt[28];
    nxt[0] = outs[0].id;
    memcpy(nxt + 1, ids, sizeof(int) * 27);
    CHECK(step1(e, s1, nxt, 28, 0, NULL, &err) == Q35_ERR_CONTEXT && strstr(err.msg, "context"), "%s", err.msg);
    CHECK(q35_seq_length(e, s1) == 101, "context overflow changed nothing");
    /* (e) bad steps */
    Q35StepItem bad[2] = {{.seq = s2, .ids = ids, .n = 1}, {.seq = s1, .ids = nxt, .n = 1}};
    int big[1] = {q35_vocab_size(e)};
    bad[0].ids = big;
    CHECK(q35_step(e, bad, 2, NULL, &err) == Q35_ERR_ARG && strstr(err.msg, "item 0") && strstr(err.msg, "range"),
          "an id out of range names its item: %s", err.msg);
    bad[0].ids = ids;
    bad[1].seq = s2;
    CHECK(q35_step(e, bad, 2, NULL, &err) == Q35_ERR_ARG && strstr(err.msg, "twice"), "%s", err.msg);
    int foreign = (outs[0].id + 1) % 500;
    CHECK(step1(e, s1, &foreign, 1, 0, NULL, &err) == Q35_ERR_ARG && strstr(err.msg, "sampled"),
          "an id other than the sampled one: %s", err.msg);
    CHECK(q35_seq_length(e, s1) == 101 && q35_seq_length(e, s2) == 80, "bad steps changed nothing");
    q35_seq_close(e, s1);
    q35_serve_info(e, &in);
    CHECK(in.free_blocks == 7 && in.open_seqs == 1, "close gives back 7 blocks (%d free)", in.free_blocks);
    CHECK(q35_seq_length(e, s1) == Q35_ERR_ARG && q35_seq_blocks_needed(e, s1, 1) == Q35_ERR_ARG,
          "a closed handle is refused");
    CHECK(step1(e, s1, ids, 1, 0, NULL, &err) == Q35_ERR_ARG && strstr(err.msg, "not open"), "%s", err.msg);
    CHECK(q35_seq_open(e, &p, &s3, &err) == 0 && s3 != s1 && q35_seq_length(e, s1) == Q35_ERR_ARG,
          "a reopened slot gets a new handle (%d, was %d)", s3, s1);
    CHECK(q35_forward(e, ids, 1, 0, NULL, &err) == Q35_ERR_ARG, "q35_forward is refused while serving");
    q35_serve_close(e);
    q35_engine_close(e);
}

/* preemption: blocks back, then the history fed again in the same chunks gives the run's own continuation */
static void test_preempt(const char *dir, int single) {
    Q35Engine *e = open_engine(dir, 1);
    if (!e || serve(e, single, 2, 0, 16)) {
        CHECK(0, "engine opens");
        return;
    }
    const int V = q35_vocab_size(e);
    Req full;
    target_req(&full, V, 12);
    CHECK(run_together(e, (Req *[]){&full}, 1, 0) == 0 && full.n_ids == 12, "unpreempted run");
    Req r;
    target_req(&r, V, 12);
    Q35Err err = {0};
    int seq, ok = q35_seq_open(e, &r.p, &seq, &err) == 0, fed = 0;
    Q35StepOut o;
    int got[12], n = 0;
    for (int c = 0; c < r.n_chunks; c++, fed += r.chunks[c - 1])
        ok &= step1(e, seq, r.prompt + fed, r.chunks[c], c == r.n_chunks - 1, &o, &err) == 0;
    got[n++] = o.id;
    for (; n < 6; n++) {
        ok &= step1(e, seq, &got[n - 1], 1, 1, &o, &err) == 0;
        got[n] = o.id;
    }
    Q35ServeInfo in;
    q35_serve_info(e, &in);
    const int free_before = in.free_blocks;
    ok &= q35_seq_preempt(e, seq, &err) == 0;
    q35_serve_info(e, &in);
    const int *h;
    const int nh = q35_seq_history(e, seq, &h);
    CHECK(in.free_blocks == free_before + 3 && q35_seq_length(e, seq) == 0 && nh == 46,
          "preempt: 3 blocks back (%d -> %d), length 0, history 46 (%d)", free_before, in.free_blocks, nh);
    int hist[64];
    memcpy(hist, h, sizeof(int) * (size_t)nh);
    /* recompute: the prompt chunks, then the generated ids one by one; sample on the last */
    fed = 0;
    for (int c = 0; c < r.n_chunks; c++, fed += r.chunks[c - 1])
        ok &= step1(e, seq, hist + fed, r.chunks[c], 0, NULL, &err) == 0;
    for (int t = fed; t < nh; t++) ok &= step1(e, seq, &hist[t], 1, t == nh - 1, &o, &err) == 0;
    got[n++] = o.id;
    for (; n < 12; n++) {
        ok &= step1(e, seq, &got[n - 1], 1, 1, &o, &err) == 0;
        got[n] = o.id;
    }
    CHECK(ok, "%s", err.msg);
    CHECK(!memcmp(got, full.ids, sizeof got), "single=%d: a preempted and recomputed run samples the same 12 ids",
          single);
    free(full.logits);
    free(r.logits);
    q35_engine_close(e);
}

/* rel L2 of a vs b over n */
static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static int is_e4m3(float x) { return fp8_e4m3_to_f32(f32_to_fp8_e4m3(x)) == x; }

/* (f) the backend: slot states that are bf16 values after every step; exact: deterministic mode (per token). (g) kv8:
 * the same for the K / V rows of the slot's blocks as e4m3 values */
static void check_slot_states_bf16(const char *dir, int exact, int kv8) {
    Model m;
    Err err = {0};
    ModelLoadOptions lo = {.keep_f32_params = 0, .strict = 0};
    if (model_load(&m, dir, &lo, &err)) {
        CHECK(0, "%s: model_load: %s", dir, err.msg);
        return;
    }
    BackendOptions bo = {.max_seq = CTX, .threads = 1, .deterministic = exact};
    void *ctx = NULL;
    ServeLayout lay = {
        .n_slots = 2, .n_blocks = 2 * CTX / 16, .block = 16, .max_blocks = CTX / 16, .state_bf16 = !kv8, .kv_fp8 = kv8};
    if (cpu_backend.open(&ctx, &m, &bo, &err) || cpu_backend.serve_open(ctx, &lay, &err)) {
        CHECK(0, "%s: cpu backend: %s", dir, err.msg);
        if (ctx) cpu_backend.close(ctx);
        model_free(&m);
        return;
    }
    const CpuCtx *cx = ctx;
    const Config *c = &m.config;
    const int64_t S_n = (int64_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    int prompt[24], blocks[CTX / 16], all_bf16 = 1, nonzero = 0, steps_ok = 1;
    make_prompt(prompt, 24, 5u);
    for (int b = 0; b < CTX / 16; b++) blocks[b] = b;
    float *lg = malloc(sizeof(float) * (size_t)c->vocab_size);
    for (int s = 0; s < 4 && steps_ok; s++) { /* a 21-token chunk, then 3 decode tokens */
        BatchItem it = {.slot = 1,
                        .tokens = prompt + (s ? 20 + s : 0),
                        .n = s ? 1 : 21,
                        .pos = s ? 20 + s : 0,
                        .blocks = blocks,
                        .logits = 1};
        steps_ok = cpu_backend.step_batch(ctx, &it, 1, lg, &err) == 0;
        for (int l = 0; l < c->num_hidden_layers; l++) {
            if (kv8 && c->layer_types[l] == LAYER_FULL_ATTN) { /* positions 0 .. 20 + s of blocks 0, 1 */
                const int64_t row = (int64_t)c->num_key_value_heads * c->head_dim; /* block 16: [Hkv][16][hd] */
                for (int b = 0; b < 2; b++)
                    for (int64_t i = 0; i < 16 * row; i++) {
                        const int p = b * 16 + (int)((i / c->head_dim) % 16);
                        if (p > 20 + s) continue;
                        const float k = cx->layers[l].Kp[b * 16 * row + i], v = cx->layers[l].Vp[b * 16 * row + i];
                        all_bf16 &= is_e4m3(k) && is_e4m3(v);
                        nonzero += k != 0.0f;
                    }
            }
            if (kv8 || c->layer_types[l] == LAYER_FULL_ATTN) continue;
            const float *S = cx->layers[l].S_slots + S_n;
            for (int64_t i = 0; i < S_n; i++) {
                all_bf16 &= S[i] == round_bf16(S[i]);
                nonzero += S[i] != 0.0f;
            }
        }
    }
    CHECK(steps_ok, "%s: step_batch: %s", dir, err.msg);
    CHECK(all_bf16 && nonzero > 0, "%s%s: the slot's %s values after each step (%d nonzero entries)", dir,
          exact ? " (deterministic)" : "", kv8 ? "K / V are e4m3" : "states are bf16", nonzero);
    free(lg);
    cpu_backend.serve_close(ctx);
    cpu_backend.close(ctx);
    model_free(&m);
}

static int serve_bf16(Q35Engine *e, int single, int kv8) {
    Q35ServeOptions so = {
        .single_seq = single, .max_seqs = 24, .kv_bytes = (size_t)64 << 20, .state_bf16 = !kv8, .kv_fp8 = kv8};
    Q35Err err = {0};
    const int rc = q35_serve_open(e, &so, &err);
    if (rc && !single) fprintf(stderr, "serve_open: %s\n", err.msg);
    return rc;
}

/* (f) through the engine: batch invariance with bf16 states, and their distance from the fp32-state run; (g) kv8: the
 * same with an fp8 KV cache (and fp32 states) against the bf16-KV run */
static void test_state_bf16(const char *dir, int kv8) {
    const char *what = kv8 ? "fp8 KV" : "bf16 states";
    check_slot_states_bf16(dir, 0, kv8);
    check_slot_states_bf16(dir, 1, kv8);
    Q35Engine *a = open_engine(dir, 1), *b = open_engine(dir, 1);
    if (!a || !b || serve_bf16(a, 0, kv8)) {
        CHECK(0, "%s: engines open", dir);
        if (a) q35_engine_close(a);
        if (b) q35_engine_close(b);
        return;
    }
    Q35ServeInfo in;
    q35_serve_info(a, &in);
    CHECK(in.state_bf16 == !kv8 && in.kv_fp8 == kv8, "%s: serve info says %s", dir, what);
    const int V = q35_vocab_size(a);
    Req alone, t, others[7];
    target_req(&alone, V, 10);
    CHECK(run_together(a, (Req *[]){&alone}, 1, 0) == 0 && alone.n_ids == 10, "%s: %s: the target alone", dir, what);
    Req *list[8];
    int m = 0;
    target_req(&t, V, 10);
    for (int i = 0; i < 7; i++) {
        const int chunks[] = {1 + i % 5, 2 + (7 * i) % 13, 16};
        req_init(&others[i], 3 + 11 * i % 70, 200u + (unsigned)i, chunks, 1 + i % 3, 1 + (5 * i) % 14, V);
        if (i == 3) list[m++] = &t;
        list[m++] = &others[i];
    }
    CHECK(run_together(a, list, m, 1) == 0 && same_req(&t, &alone, V),
          "%s: %s: among 7 others the target's ids, logprobs and logits are bitwise its own", dir, what);
    /* the fp32 states of the single-sequence forward (bitwise the fp32 serving step's, (a)) on the same chunks and
     * the target's own ids */
    Q35Err err = {0};
    float *lg = malloc(sizeof(float) * (size_t)V);
    double worst = 0;
    int differ = 0, fed = 0, ok = 1;
    for (int c = 0; c < alone.n_chunks && ok; c++) {
        ok = q35_forward(b, alone.prompt + fed, alone.chunks[c], 0, lg, &err) == 0;
        fed += alone.chunks[c];
    }
    for (int k = 0; k < alone.n_ids && ok; k++) {
        const double e = rel_err(alone.logits + (size_t)k * V, lg, (size_t)V);
        worst = e > worst ? e : worst;
        differ += memcmp(alone.logits + (size_t)k * V, lg, sizeof(float) * (size_t)V) != 0;
        if (k + 1 < alone.n_ids) ok = q35_forward(b, &alone.ids[k], 1, 0, lg, &err) == 0;
    }
    CHECK(ok, "%s: the fp32-state run: %s", dir, err.msg);
    /* fp8 K / V: a 3-bit mantissa (relative steps of 1/16) where bf16 has 8; the bound is 10x bf16 states' */
    CHECK(differ > 0 && worst < (kv8 ? 0.1 : 0.02),
          "%s: %s vs the default: %d of %d logits rows differ, worst rel L2 %.2g", dir, what, differ, alone.n_ids,
          worst);
    printf("  %s: %s vs the default: %d of %d rows differ, worst rel L2 %.3g\n", dir, what, differ, alone.n_ids, worst);
    free(lg);
    free(alone.logits), free(t.logits);
    for (int i = 0; i < 7; i++) free(others[i].logits);
    q35_engine_close(a);
    q35_engine_close(b);
    Q35Engine *s = open_engine(dir, 1);
    CHECK(s && serve_bf16(s, 1, kv8) == Q35_ERR_UNSUPPORTED, "%s: the one-sequence fallback refuses %s", dir, what);
    if (s) q35_engine_close(s);
}

int main(void) {
    for (int single = 0; single <= 1; single++) {
        test_equals_forward("tests/fixtures/qwen35_text", single);
        test_equals_forward("tests/fixtures/qwen3_dense", single);
        test_sampling("tests/fixtures/qwen35_text", single);
        test_penalties("tests/fixtures/qwen35_text", single);
        test_preempt("tests/fixtures/qwen35_text", single);
    }
    test_batch_invariance("tests/fixtures/qwen35_text");
    test_batch_invariance("tests/fixtures/qwen3_dense");
    test_accounting("tests/fixtures/qwen35_text");
    test_state_bf16("tests/fixtures/qwen35_text", 0);
    test_state_bf16("tests/fixtures/qwen35_text", 1);
    test_state_bf16("tests/fixtures/qwen3_dense", 1);
    return TEST_SUMMARY("serve_engine");
}
