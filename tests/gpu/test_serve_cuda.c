/* test_serve_cuda.c — the CUDA backend's batched step (src/cuda/serve.cu: serve_sizes / serve_open / step_batch) on
 * small random models built here (a Qwen3.5-like hybrid with 128 x 128 DeltaNet heads (Hv = 2 Hk: in_proj rows a
 * multiple of 8, as the prefill kernels need) and gated attention, and a
 * Qwen3-like dense model), with sequence A fed as a 24-token prefill chunk and then 48 decode steps:
 *   - A alone through step_batch vs the single-sequence forward() (prefill + decode steps) and vs the CPU backend's
 *     fp32 logits, per logits row within the bound test_decode uses (bf16 activations: worst < 0.06, or one
 *     ill-conditioned row < 0.15 with the rest < 0.06);
 *   - in deterministic mode, batch invariance: A among 7 other sequences (other slots, other lengths, prefill chunks
 *     and decode rows mixed in the same steps, A at a rotating place in the item list, A's KV in other blocks) gives
 *     bitwise the same logits rows as A alone;
 *   - the prefix-cache hooks: A continued from a snapshot of its state loaded into another slot and from copies of its
 *     KV blocks (the originals overwritten) gives bitwise the rows of A alone; in deterministic mode also A's prompt
 *     cut into chunks of 5, and resumed from a snapshot and block copies at 1, 7, 16, 17 and 23 ids (every token's
 *     bits independent of the chunking: a cache hit can resume anywhere, issue 29);
 *   - snapshots taken inside a step (BatchItem.snap_off, after 1 .. 23 of the prompt's 24 tokens; alone and beside
 *     another sequence): A resumed from one gives bitwise the rows of A alone in deterministic mode, and rows within
 *     the forward() bound in the default mode (the DeltaNet prefill's point states: solo and batched);
 *   - in the default mode (lone decode rows on the single-sequence step, serve.cu solo_step), A alone, among others,
 *     from a snapshot, alone and then joined by others, and alone while other sequences' ends are announced
 *     (Backend.seq_end drops only that slot's solo state), each within the forward() bound;
 *   - a lone prompt's greedy pick (the LM head screen outside deterministic mode) is its logits row's argmax within
 *     one bf16 rounding;
 *   - the prompt graphs (a lone prompt from position 0 replayed as a graph of a bucket of rows, its ids padded):
 *     against a context opened with no_graph, the picks and the next chunk's row bitwise; a snapshot inside a
 *     graphed prompt resumed bitwise as the eager prompt's;
 *   - device sampling (BatchItem.sample): a prompt chunk's and decode rows' draws equal the host sampler's on the
 *     same rows with the same u, with their logprobs; top_k 1 is the argmax; in deterministic mode alone = among;
 *   - bad items (a slot outside the layout, a block outside the pool), snapshots and blocks are refused with
 *     Q35_ERR_ARG; --ablate lists (serve_step's measurement) with unknown kinds are refused, and a valid one opens,
 *     steps and changes the rows;
 *   - all of it again on the Qwen3.5-like model quantized to FP8 (model_quantize_fp8: FP8 GEMVs and skinny GEMMs,
 *     the FP8 weights also on the skinny GEMM of short prefill pieces, bf16 copies in the tiled prefill GEMMs, the CPU
 *     on the dequantized weights);
 *   - and with bf16 DeltaNet states (ServeLayout.state_bf16: slots and snapshots of half the state bytes, the CPU
 *     reference serving with bf16 states too and its rows moved off its fp32-state rows; a lone sequence on the
 *     single-sequence step entering from and leaving to a bf16 slot);
 *   - and with an fp8 KV cache (ServeLayout.kv_fp8: e4m3 pools of half the bytes; the reference of every "vs forward()"
 *     check is the CPU serving with e4m3-rounded K / V, and lone sequences take the batched step).
 * Usage: test_serve_cuda [seed]. Skips (exit 0, "no GPU") without a GPU. */
#include "backend.h"
#include "sampler.h"
#include "test.h"
#include "tiny_weights.h"
#include "gpu_common.h"
#include "test_tensors.h"

static Rng rng;

/* tiny_fill_weights' tensor maker: tt_tensor on this test's generator */
static Tensor mk(int64_t rows, int64_t cols, DType dt, float offset, float scale) {
    return tt_tensor(&rng, rows, cols, dt, offset, scale);
}

/* qwen35 = 1: layers D D A D A (D = DeltaNet with Hk = 2, Hv = 4 heads of 128 x 128, A = gated attention with partial
 * RoPE); 0: Qwen3-like, 3 plain attention layers. */
static int g_vocab; /* small_model's vocabulary when not 0 (test_lm_argmax) */

static void small_model(Model *m, int qwen35) {
    memset(m, 0, sizeof *m);
    Config *c = &m->config;
    c->family = qwen35 ? FAMILY_QWEN35 : FAMILY_QWEN3;
    snprintf(c->model_type, sizeof c->model_type, "%s", qwen35 ? "qwen3_5_text" : "qwen3");
    c->hidden_size = 256;
    c->num_hidden_layers = qwen35 ? 5 : 3;
    c->intermediate_size = qwen35 ? 384 : 320;
    c->rms_norm_eps = 1e-6f;
    c->vocab_size = g_vocab ? g_vocab : qwen35 ? 1000 : 800;
    c->tie_word_embeddings = qwen35;
    c->num_attention_heads = 4;
    c->num_key_value_heads = qwen35 ? 2 : 4;
    c->head_dim = 128;
    c->attn_output_gate = qwen35;
    c->rope_theta = qwen35 ? 1e7f : 1e6f;
    c->partial_rotary_factor = qwen35 ? 0.25f : 1.0f;
    c->linear_num_key_heads = qwen35 ? 2 : 0;
    c->linear_num_value_heads = qwen35 ? 4 : 0;
    c->linear_key_head_dim = qwen35 ? 128 : 0;
    c->linear_value_head_dim = qwen35 ? 128 : 0;
    c->linear_conv_kernel_dim = qwen35 ? 4 : 0;
    c->max_position_embeddings = 4096;
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_types[l] = !qwen35 || l == 2 || l == 4 ? LAYER_FULL_ATTN : LAYER_LINEAR_ATTN;
    Err cerr = {0};
    const int crc = config_finish(c, "tiny model", &cerr);
    CHECK(crc == 0, "tiny config: %s", cerr.msg);
    tiny_fill_weights(m, mk, tt_keep, !qwen35);
}

/* Logits rows vs a reference, per row (test_decode's logits_near_cpu bound). */
static int rows_near(const float *got, const float *ref, int n, int V, double *worst) {
    double w1 = 0, w2 = 0;
    for (int t = 0; t < n; t++) {
        const double e = rel_l2(got + (size_t)t * V, ref + (size_t)t * V, V);
        if (e > w1)
            w2 = w1, w1 = e;
        else if (e > w2)
            w2 = e;
    }
    *worst = w1;
    return w1 < 0.06 || (w1 < 0.15 && w2 < 0.06);
}

#define MAX_SEQ  128
#define BLOCK    16
#define N_SLOTS  8
#define N_BLOCKS 64
#define LA       72 /* A's tokens: its decode rows at positions >= 64 take two attention splits (pa_chunk) */
#define CHUNK_A  24 /* A's prefill chunk; then LA - CHUNK_A decode steps */
#define N_STEPS  (1 + LA - CHUNK_A)
#define N_OTHER  7

typedef struct Seq {
    int slot, len, prompt, ids[MAX_SEQ], table[MAX_SEQ / BLOCK];
} Seq;

/* A's schedule on backend be, alone (others 0) or among N_OTHER others, who join from step `join` on (A alone until
 * then); A's logits rows [N_STEPS][V] to outA. */
static int run_steps(const Backend *be, void *ctx, const int *idsA, int others, int join, float *outA, int V,
                     Err *err) {
    Seq s[1 + N_OTHER];
    int perm[N_BLOCKS];
    for (int i = 0; i < N_BLOCKS; i++) perm[i] = i;
    if (others)
        for (int i = N_BLOCKS - 1; i > 0; i--) { /* blocks shuffled: A's KV lands elsewhere than alone */
            const int j = (int)(rng_u64(&rng) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
    const int n_seq = others ? 1 + N_OTHER : 1;
    for (int k = 0; k < n_seq; k++) {
        memset(&s[k], 0, sizeof s[k]);
        s[k].slot = others ? (k == 0 ? 5 : (k <= 5 ? k - 1 : k)) : 3;
        for (int b = 0; b < MAX_SEQ / BLOCK; b++) s[k].table[b] = perm[k * (MAX_SEQ / BLOCK) + b];
        s[k].prompt = k == 0 ? CHUNK_A : 5 + 9 * k;
        for (int i = 0; i < MAX_SEQ; i++) s[k].ids[i] = k == 0 ? (i < LA ? idsA[i] : 0) : (int)(rng_u64(&rng) % V);
    }
    BatchItem items[1 + N_OTHER];
    float *lg = malloc(sizeof(float) * (size_t)(1 + N_OTHER) * V);
    int rc = 0;
    for (int step = 0; step < N_STEPS && !rc; step++) {
        int n = 0, a_row = -1, n_out = 0;
        for (int k = 0; k < n_seq; k++) {
            Seq *q = &s[k];
            if (k > 0 && step < join + k % 3) continue; /* others join late */
            int m;
            if (q->len < q->prompt) {
                const int chunk = k == 0 ? CHUNK_A : 7 + 3 * k;
                m = q->prompt - q->len < chunk ? q->prompt - q->len : chunk;
            } else {
                m = 1;
            }
            if (q->len + m > MAX_SEQ) continue;
            BatchItem *it = &items[n];
            memset(it, 0, sizeof *it);
            it->slot = q->slot, it->tokens = q->ids + q->len, it->n = m, it->pos = q->len, it->blocks = q->table;
            it->logits = k == 0 || (k + step) % 2 == 0;
            q->len += m;
            n++;
        }
        /* rotate: A's item to index step % n */
        const int at = step % n;
        BatchItem t = items[0];
        items[0] = items[at], items[at] = t;
        for (int i = 0; i < n; i++) {
            if (items[i].slot == s[0].slot) a_row = n_out;
            n_out += items[i].logits;
        }
        rc = be->step_batch(ctx, items, n, lg, err);
        if (!rc) memcpy(outA + (size_t)step * V, lg + (size_t)a_row * V, sizeof(float) * V);
    }
    free(lg);
    return rc;
}

/* Prefix-cache hooks: A's chunk in slot 3 (blocks 0 ..), its state saved to snapshot 0 and loaded into slot 6, its
 * KV blocks copied to blocks 40 ..; then slot 3 and block 0 are overwritten by another sequence, and A's decode steps
 * continue in slot 6 on the copies. Logits rows [N_STEPS][V] to out. */
static int run_snap(void *ctx, const int *idsA, float *out, int V, Err *err) {
    int t1[MAX_SEQ / BLOCK], t2[MAX_SEQ / BLOCK], other[5] = {1, 2, 3, 4, 5};
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = b, t2[b] = 40 + b;
    BatchItem it = {.slot = 3, .tokens = idsA, .n = CHUNK_A, .pos = 0, .blocks = t1, .logits = 1};
    int rc = cuda_backend.step_batch(ctx, &it, 1, out, err);
    if (!rc) rc = cuda_backend.snap_save(ctx, 3, 0, err);
    if (!rc) rc = cuda_backend.snap_load(ctx, 0, 6, err);
    for (int b = 0; b <= (CHUNK_A - 1) / BLOCK && !rc; b++) rc = cuda_backend.block_copy(ctx, t1[b], t2[b], err);
    BatchItem ov = {.slot = 3, .tokens = other, .n = 5, .pos = 0, .blocks = t1, .logits = 0};
    if (!rc) rc = cuda_backend.step_batch(ctx, &ov, 1, NULL, err);
    for (int t = CHUNK_A; t < LA && !rc; t++) {
        BatchItem d = {.slot = 6, .tokens = idsA + t, .n = 1, .pos = t, .blocks = t2, .logits = 1};
        rc = cuda_backend.step_batch(ctx, &d, 1, out + (size_t)(1 + t - CHUNK_A) * V, err);
    }
    return rc;
}

/* A alone in slot 4 with its prompt cut into chunks of `chunk` tokens (the last one shorter), then its decode steps:
 * logits rows [N_STEPS][V] (the prompt's last row, then one per decode step) to out. */
static int run_chunked(void *ctx, const int *idsA, int chunk, float *out, int V, Err *err) {
    int t1[MAX_SEQ / BLOCK];
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 48 + b % 16;
    int rc = 0;
    for (int p = 0; p < CHUNK_A && !rc; p += chunk) {
        const int m = CHUNK_A - p < chunk ? CHUNK_A - p : chunk;
        BatchItem it = {.slot = 4, .tokens = idsA + p, .n = m, .pos = p, .blocks = t1, .logits = p + m == CHUNK_A};
        rc = cuda_backend.step_batch(ctx, &it, 1, out, err);
    }
    for (int t = CHUNK_A; t < LA && !rc; t++) {
        BatchItem d = {.slot = 4, .tokens = idsA + t, .n = 1, .pos = t, .blocks = t1, .logits = 1};
        rc = cuda_backend.step_batch(ctx, &d, 1, out + (size_t)(1 + t - CHUNK_A) * V, err);
    }
    return rc;
}

/* The rest of a resume at L once snapshot 0 holds A's state after L tokens in slot 2 (blocks 16 ..): the snapshot
 * loaded into slot 7, the blocks holding positions < L copied to 32 .., slot 2 and block 16 overwritten by another
 * sequence; then A's ids [L, end) as one chunk (end >= CHUNK_A: the rest of the prompt, or past it) and A's decode
 * steps after it on slot 7 and the copies. Logits rows [N_STEPS][V] to out: the chunk's last row, then the decode
 * step of position t at row 1 + t - CHUNK_A. */
static int resume_from_snapshot(void *ctx, const int *idsA, int L, int end, float *out, int V, Err *err) {
    int t1[MAX_SEQ / BLOCK], t2[MAX_SEQ / BLOCK], other[5] = {1, 2, 3, 4, 5};
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 16 + b, t2[b] = 32 + b;
    int rc = cuda_backend.snap_load(ctx, 0, 7, err);
    for (int b = 0; b <= (L - 1) / BLOCK && !rc; b++) rc = cuda_backend.block_copy(ctx, t1[b], t2[b], err);
    BatchItem ov = {.slot = 2, .tokens = other, .n = 5, .pos = 0, .blocks = t1, .logits = 0};
    if (!rc) rc = cuda_backend.step_batch(ctx, &ov, 1, NULL, err);
    BatchItem rest = {.slot = 7, .tokens = idsA + L, .n = end - L, .pos = L, .blocks = t2, .logits = 1};
    if (!rc) rc = cuda_backend.step_batch(ctx, &rest, 1, out, err);
    for (int t = end; t < LA && !rc; t++) {
        BatchItem d = {.slot = 7, .tokens = idsA + t, .n = 1, .pos = t, .blocks = t2, .logits = 1};
        rc = cuda_backend.step_batch(ctx, &d, 1, out + (size_t)(1 + t - CHUNK_A) * V, err);
    }
    return rc;
}

/* A resumed at an arbitrary position, as a prefix-cache hit does: its first L tokens in slot 2 (blocks 16 ..), the
 * slot's state saved to snapshot 0; then resume_from_snapshot. */
static int run_resume(void *ctx, const int *idsA, int L, float *out, int V, Err *err) {
    int t1[MAX_SEQ / BLOCK];
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 16 + b;
    BatchItem it = {.slot = 2, .tokens = idsA, .n = L, .pos = 0, .blocks = t1, .logits = 0};
    int rc = cuda_backend.step_batch(ctx, &it, 1, NULL, err);
    if (!rc) rc = cuda_backend.snap_save(ctx, 2, 0, err);
    return rc ? rc : resume_from_snapshot(ctx, idsA, L, CHUNK_A, out, V, err);
}

/* A resumed from a snapshot taken inside a step (BatchItem.snap_off): its whole prompt chunk in slot 2 (blocks 16 ..)
 * with the snapshot after its first L tokens (alone: the context's own prefill, solo; with_other: beside a sequence
 * in slot 5, a batched pass), then its end announced (seq_end: a sequence the context hosts is dropped, so the KV
 * rows before L must be in the pages by then); then resume_from_snapshot. */
static int run_resume_in_step(void *ctx, const int *idsA, int L, int with_other, float *out, int V, Err *err) {
    int t1[MAX_SEQ / BLOCK], t3[MAX_SEQ / BLOCK], other[5] = {1, 2, 3, 4, 5};
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 16 + b, t3[b] = 56 + b;
    const int off = L, snap = 0;
    const BatchItem it[2] = {{.slot = 2,
                              .tokens = idsA,
                              .n = CHUNK_A,
                              .pos = 0,
                              .blocks = t1,
                              .logits = 0,
                              .n_snaps = 1,
                              .snap_off = &off,
                              .snap_id = &snap},
                             {.slot = 5, .tokens = other, .n = 5, .pos = 0, .blocks = t3, .logits = 0}};
    int rc = cuda_backend.step_batch(ctx, it, with_other ? 2 : 1, NULL, err);
    cuda_backend.seq_end(ctx, 2);
    return rc ? rc : resume_from_snapshot(ctx, idsA, L, CHUNK_A, out, V, err);
}

/* Backend.seq_end between solo steps: a lone step of sequence D in slot 5; then A alone in slot 4 (its prompt chunk,
 * then its decode steps), with D's end announced before every step of A (A's solo state must stay); halfway a lone
 * step of sequence C in slot 6 (A's state goes back to its slot) whose end is announced before A goes on. Logits rows
 * [N_STEPS][V] to out. */
static int run_ended(void *ctx, const int *idsA, float *out, int V, Err *err) {
    int tA[MAX_SEQ / BLOCK], tC[MAX_SEQ / BLOCK], other[5] = {1, 2, 3, 4, 5};
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) tA[b] = 48 + b, tC[b] = 56 + b;
    BatchItem d = {.slot = 5, .tokens = other, .n = 5, .pos = 0, .blocks = tC, .logits = 0};
    int rc = cuda_backend.step_batch(ctx, &d, 1, NULL, err);
    BatchItem it = {.slot = 4, .tokens = idsA, .n = CHUNK_A, .pos = 0, .blocks = tA, .logits = 1};
    if (!rc) rc = cuda_backend.step_batch(ctx, &it, 1, out, err);
    for (int t = CHUNK_A; t < LA && !rc; t++) {
        cuda_backend.seq_end(ctx, 5);
        if (t == (CHUNK_A + LA) / 2) {
            BatchItem c = {.slot = 6, .tokens = other, .n = 5, .pos = 0, .blocks = tC, .logits = 0};
            if ((rc = cuda_backend.step_batch(ctx, &c, 1, NULL, err))) break;
            cuda_backend.seq_end(ctx, 6);
        }
        BatchItem a = {.slot = 4, .tokens = idsA + t, .n = 1, .pos = t, .blocks = tA, .logits = 1};
        rc = cuda_backend.step_batch(ctx, &a, 1, out + (size_t)(1 + t - CHUNK_A) * V, err);
    }
    return rc;
}

/* BatchItem.pick: the same chunk in slots 1 and 2 (other blocks), slot 1's row asked for as its argmax, slot 2's
 * whole: the device argmax equals the host argmax (sampler_argmax's rule) of slot 2's row, which is slot 1's row
 * (batch invariance, checked above); slot 1's place in the output is left alone. Returns the mismatch count. */
static int check_argmax(void *ctx, const int *ids, int n_valid, int V, Err *err) {
    int t1[MAX_SEQ / BLOCK], t2[MAX_SEQ / BLOCK], am = -1;
    float lp = NAN;
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 8 + b, t2[b] = 24 + b;
    float *lg = malloc(sizeof(float) * 2 * V);
    for (int i = 0; i < 2 * V; i++) lg[i] = -7.0f;
    BatchItem it[2] = {
        {.slot = 1, .tokens = ids, .n = CHUNK_A, .pos = 0, .blocks = t1, .logits = 1, .pick = &am, .logprob = &lp},
        {.slot = 2, .tokens = ids, .n = CHUNK_A, .pos = 0, .blocks = t2, .logits = 1}};
    int bad = 1;
    if (!cuda_backend.step_batch(ctx, it, 2, lg, err)) {
        int best = 0;
        for (int i = 1; i < n_valid; i++)
            if (lg[V + i] > lg[V + best]) best = i;
        double sum = 0;
        for (int i = 0; i < n_valid; i++) sum += exp((double)lg[V + i] - lg[V + best]);
        const double want = -log(sum); /* the argmax's log-softmax, as core's host logprobs */
        bad = (am != best) + (lg[0] != -7.0f) + !(fabs(lp - want) <= 1e-4 + 1e-5 * fabs(want));
        printf("  device argmax %d, host argmax of the same row %d; logprob %.6f, host %.6f\n", am, best, lp, want);
    }
    free(lg);
    return bad;
}

/* A lone prompt's greedy pick (BatchItem.pick, no logprob: outside deterministic mode the prefill ends in the LM
 * head screen, serve.cu solo_step) against the logits row of the same prompt fed alone in another slot: the pick's
 * logit is the row's largest within one bf16 rounding (the screen sums a row as the decode GEMV does, the prefill's
 * head GEMM in another order). Returns 1 on a mismatch. */
static int check_greedy_prompt(void *ctx, const int *ids, int n_valid, int V, Err *err) {
    int t1[MAX_SEQ / BLOCK], t2[MAX_SEQ / BLOCK], am = -1;
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 8 + b, t2[b] = 24 + b;
    float *lg = malloc(sizeof(float) * V);
    BatchItem a = {.slot = 1, .tokens = ids, .n = CHUNK_A, .pos = 0, .blocks = t1, .logits = 1, .pick = &am};
    BatchItem b = {.slot = 2, .tokens = ids, .n = CHUNK_A, .pos = 0, .blocks = t2, .logits = 1};
    int bad = 1;
    if (!cuda_backend.step_batch(ctx, &a, 1, lg, err) && !cuda_backend.step_batch(ctx, &b, 1, lg, err)) {
        int best = 0;
        for (int i = 1; i < n_valid; i++)
            if (lg[i] > lg[best]) best = i;
        const double ulp = ldexp(1.0, ilogb(fabs(lg[best]) > 0 ? fabs(lg[best]) : 1.0) - 7); /* bf16: 8 bits */
        bad = !(am >= 0 && am < n_valid && lg[am] >= lg[best] - ulp);
        printf("  greedy prompt pick %d (logit %.5f), argmax of the same prompt's row %d (%.5f)\n", am,
               am >= 0 && am < V ? lg[am] : NAN, best, lg[best]);
    }
    free(lg);
    return bad;
}

/* One lone prompt of L ids from position 0 on ctx (slot 3: its greedy pick through the screen, *pk; slot 4: its argmax
 * and logprob from the bf16 head, *pa, *lp), then slot 4's next PG_NEXT ids as a prompt chunk with its last logits row
 * on the host (row[V]: the prefill kernels, no atomic sums, on the KV rows, conv ring and state the prompt left). */
#define PG_NEXT 8
static int prompt_then_chunk(void *ctx, const int *ids, int L, int *pk, int *pa, float *lp, float *row, Err *err) {
    int t3[MAX_SEQ / BLOCK], t4[MAX_SEQ / BLOCK];
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t3[b] = 40 + b, t4[b] = 48 + b;
    BatchItem g = {.slot = 3, .tokens = ids, .n = L, .pos = 0, .blocks = t3, .logits = 1, .pick = pk};
    BatchItem a = {.slot = 4, .tokens = ids, .n = L, .pos = 0, .blocks = t4, .logits = 1, .pick = pa, .logprob = lp};
    BatchItem c = {.slot = 4, .tokens = ids + L, .n = PG_NEXT, .pos = L, .blocks = t4, .logits = 1};
    int rc = cuda_backend.step_batch(ctx, &g, 1, row, err);
    if (!rc) rc = cuda_backend.step_batch(ctx, &a, 1, row, err);
    if (!rc) rc = cuda_backend.step_batch(ctx, &c, 1, row, err);
    return rc;
}

/* The prompt graphs (prefill.cu pf_graph: a lone prompt from position 0 replayed as a graph captured for a bucket of
 * 16 << b rows, its ids padded with id 0): ctx (graphs on) against ectx (the same model opened with no_graph: the
 * prompt eager and unpadded), for prompts of 2 .. 120 ids (inside a bucket, on its edge, one past it), each followed
 * by a chunk of PG_NEXT more ids run eager on both. All must be bitwise equal: the screen pick, the argmax and its
 * logprob, and the next chunk's row. No real row depends on the padding (the kernels compute rows independently, and
 * every GEMM takes the path the unpadded prompt takes; the DeltaNet scan gets the padding as zero rows, as the
 * unpadded call pads its last chunk), and the state, conv ring and KV rows the chunk reads are the unpadded prompt's.
 * Returns the failures. */
static int check_prompt_graphs(const char *name, void *ctx, void *ectx, int V, Err *err) {
    int ids[MAX_SEQ], bad = 0;
    for (int i = 0; i < MAX_SEQ; i++) ids[i] = (int)(rng_u64(&rng) % (uint64_t)V);
    float *row[2] = {malloc(sizeof(float) * V), malloc(sizeof(float) * V)};
    static const int Ls[] = {2, 5, 16, 17, 24, 63, 64, 65, 100, MAX_SEQ - PG_NEXT};
    for (size_t k = 0; k < sizeof Ls / sizeof Ls[0]; k++) {
        const int L = Ls[k];
        int pk[2] = {-1, -1}, pa[2] = {-1, -1}, rc = 0;
        float lp[2] = {NAN, NAN};
        for (int c = 0; c < 2 && !rc; c++)
            rc = prompt_then_chunk(c ? ectx : ctx, ids, L, &pk[c], &pa[c], &lp[c], row[c], err);
        if (rc) {
            CHECK(0, "%s: prompt graph, %d ids: %s", name, L, err->msg);
            bad++;
            continue;
        }
        const double e = rel_l2(row[0], row[1], V);
        const int ok = pk[0] == pk[1] && pa[0] == pa[1] && memcmp(&lp[0], &lp[1], sizeof(float)) == 0 &&
                       memcmp(row[0], row[1], sizeof(float) * V) == 0;
        CHECK(ok,
              "%s: prompt of %d ids, graph vs eager: screen pick %d vs %d, argmax %d vs %d, logprob %.9g vs %.9g, "
              "the next chunk's row rel L2 %.3g",
              name, L, pk[0], pk[1], pa[0], pa[1], lp[0], lp[1], e);
        bad += !ok;
    }
    printf("  %s: prompt graphs vs eager, %d prompts of 2 to %d ids: %d differ\n", name,
           (int)(sizeof Ls / sizeof Ls[0]), MAX_SEQ - PG_NEXT, bad);
    free(row[0]), free(row[1]);
    return bad;
}

/* The prompt graphs with a snapshot inside the prompt (DnPtsDev: the points read on the device): A's prompt chunk with
 * its greedy pick and a snapshot after its first L tokens, on ctx (graphs on) and on ectx (no_graph), each then
 * resumed from that snapshot (resume_from_snapshot: the rest of the prompt as an eager chunk from L, then decode
 * steps). The pick and the resumed chunk's row must be bitwise equal (a 24-id prompt: bucket 32, one skinny m-block):
 * the snapshot's state and conv window are the eager prompt's. The chunk is at least two ids (after L = 23, ids 23
 * and 24): one id would be a decode step, whose split-K sums by atomics are not reproducible outside deterministic
 * mode. Returns the failures. */
static int check_prompt_graph_snaps(const char *name, void *ctx, void *ectx, int V, Err *err) {
    int ids[LA], bad = 0, t1[MAX_SEQ / BLOCK];
    for (int i = 0; i < LA; i++) ids[i] = (int)(rng_u64(&rng) % (uint64_t)V);
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 16 + b;
    float *out[2] = {malloc(sizeof(float) * N_STEPS * V), malloc(sizeof(float) * N_STEPS * V)};
    const int Ls[] = {1, 7, 16, CHUNK_A - 1};
    for (size_t k = 0; k < sizeof Ls / sizeof Ls[0]; k++) {
        const int off = Ls[k], snap = 0;
        int pk[2] = {-1, -1}, rc = 0;
        for (int c = 0; c < 2 && !rc; c++) {
            void *x = c ? ectx : ctx;
            const BatchItem it = {.slot = 2,
                                  .tokens = ids,
                                  .n = CHUNK_A,
                                  .pos = 0,
                                  .blocks = t1,
                                  .logits = 1,
                                  .pick = &pk[c],
                                  .n_snaps = 1,
                                  .snap_off = &off,
                                  .snap_id = &snap};
            rc = cuda_backend.step_batch(x, &it, 1, out[c], err);
            cuda_backend.seq_end(x, 2);
            if (!rc) rc = resume_from_snapshot(x, ids, off, off + 2 > CHUNK_A ? off + 2 : CHUNK_A, out[c], V, err);
        }
        const int ok = !rc && pk[0] == pk[1] && memcmp(out[0], out[1], sizeof(float) * V) == 0;
        CHECK(ok,
              "%s: prompt graph with a snapshot after %d ids: pick %d vs %d, the resumed chunk's row rel L2 %.3g (%s)",
              name, off, pk[0], pk[1], rc ? NAN : rel_l2(out[0], out[1], V), rc ? err->msg : "");
        bad += !ok;
    }
    free(out[0]), free(out[1]);
    return bad;
}

/* Device sampling in the batched step (BatchItem.sample): A's chunk and then N_DRAW decode steps (the same fed ids)
 * in slots 1 and 2, slot 1's rows drawn on the device (temperature 0.8, top-p 0.9, min-p 0.02, step t), slot 2's
 * whole. Each draw must be the host sampler's on slot 2's row with the same u (sampler_sample_at: the same rules in
 * double; a u within rounding of a boundary may land on the neighbour, so one miss in N_DRAW is let through), and its
 * logprob the row's log-softmax at it; with top_k 1 the draw is the argmax. In deterministic mode slot 1 alone draws
 * bitwise the same ids and logprobs as among the other. Returns the failures; prints the counts. */
#define N_DRAW 12
/* The two items of a draw step: slot 1 (its pick, logprob and sampling settings, or NULL: its row comes back) and
 * slot 2 (its row), both fed ids[pos .. pos + n) on their own block tables. */
static void draw_items(BatchItem it[2], const int *ids, int pos, int n, const int *t1, const int *t2, int *pick,
                       float *lp, const DeviceSampling *ds) {
    it[0] = (BatchItem){.slot = 1,
                        .tokens = ids + pos,
                        .n = n,
                        .pos = pos,
                        .blocks = t1,
                        .logits = 1,
                        .pick = pick,
                        .logprob = lp,
                        .sample = ds};
    it[1] = (BatchItem){.slot = 2, .tokens = ids + pos, .n = n, .pos = pos, .blocks = t2, .logits = 1};
}
static int run_draws(void *ctx, const int *ids, int with_other, int top_k, int *pick, float *lp, float *rows, int V,
                     Err *err) { /* pick NULL: slot 1's rows come to the host too */
    int t1[MAX_SEQ / BLOCK], t2[MAX_SEQ / BLOCK];
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 8 + b, t2[b] = 24 + b;
    int rc = 0;
    for (int t = 0; t <= N_DRAW && !rc; t++) {
        const int pos = t ? CHUNK_A + t - 1 : 0, n = t ? 1 : CHUNK_A;
        DeviceSampling ds = {
            .temperature = 0.8f, .top_p = 0.9f, .min_p = 0.02f, .top_k = top_k, .seed = 1234, .step = (uint64_t)t};
        BatchItem it[2];
        draw_items(it, ids, pos, n, t1, t2, pick ? &pick[t] : NULL, pick ? &lp[t] : NULL, pick ? &ds : NULL);
        if (pick) pick[t] = -1;
        rc = cuda_backend.step_batch(ctx, it, with_other ? 2 : 1, rows + (size_t)t * 2 * V, err);
    }
    return rc;
}

static int check_sampled(void *ctx, const int *ids, int det, int V, Err *err) {
    int pick[N_DRAW + 1], pick1[N_DRAW + 1], miss = 0, lp_bad = 0, alone_diff = 0, k1_bad = 0;
    float lp[N_DRAW + 1], lp1[N_DRAW + 1];
    float *rows = malloc(sizeof(float) * 2 * V * (N_DRAW + 1)), *w = malloc(sizeof(float) * V);
    Q35Sampling cfg = {0};
    cfg.temperature = 0.8f, cfg.top_p = 0.9f, cfg.min_p = 0.02f, cfg.repetition_penalty = 1.0f, cfg.seed = 1234;
    Sampler sm;
    int rc = sampler_init(&sm, &cfg, V, V, err);
    if (!rc) rc = run_draws(ctx, ids, 1, 0, pick, lp, rows, V, err);
    for (int t = 0; t <= N_DRAW && !rc; t++) {
        const float *row = rows + ((size_t)t * 2 + 1) * V; /* slot 2's */
        memcpy(w, row, sizeof(float) * V);
        const int want = sampler_sample_at(&sm, w, (uint64_t)t);
        miss += pick[t] != want;
        double mx = row[0], sum = 0;
        for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
        const double want_lp = pick[t] >= 0 && pick[t] < V ? row[pick[t]] - mx - log(sum) : NAN;
        lp_bad += !(fabs(lp[t] - want_lp) <= 1e-4 + 1e-5 * fabs(want_lp));
    }
    if (!rc && det) { /* alone: bitwise the same draws */
        rc = run_draws(ctx, ids, 0, 0, pick1, lp1, rows, V, err);
        for (int t = 0; t <= N_DRAW && !rc; t++) alone_diff += pick1[t] != pick[t] || memcmp(&lp1[t], &lp[t], 4);
    }
    if (!rc) { /* top_k 1: the argmax of slot 2's row */
        rc = run_draws(ctx, ids, 1, 1, pick1, lp1, rows, V, err);
        for (int t = 0; t <= N_DRAW && !rc; t++) {
            const float *row = rows + ((size_t)t * 2 + 1) * V;
            int best = 0;
            for (int i = 1; i < V; i++) best = row[i] > row[best] ? i : best;
            k1_bad += pick1[t] != best;
        }
    }
    /* default mode, alone (serve.cu solo_pick: the row stays on the device): the draws and argmax picks vs the host's
     * on the rows of another lone run (solo kernels are not bitwise reproducible: a near-tie may flip, so one miss of
     * each kind is let through, and a logit may move by a bf16 step of an activation: logprobs within 0.05, where a
     * wrong id or log-sum-exp is off by O(1)). On a near-flat row a logit moved that much moves the top-p / min-p
     * cuts and the draw's cumulative positions, so the host's own draws on two lone runs' rows may differ too: the
     * draws may miss as often as those do (solo_noise), plus a third of the draws: the noise of two runs is itself a
     * sample (replaying seed 1095966572, the host's draws on two lone runs agreed while a third run's device draws
     * missed 3 of 13 on qwen3-like, logprobs within 0.016). What this part checks is the plumbing of a lone item's
     * pick (its row, seed, step and cuts), and a fault there moves nearly every draw on these near-flat rows. */
    int solo_miss = 0, solo_lp = 0, solo_k1 = 0, solo_noise = 0;
    double solo_worst = 0;
    if (!rc && !det) {
        float *host = malloc(sizeof(float) * 2 * V * (N_DRAW + 1)), *w2 = malloc(sizeof(float) * V);
        rc = run_draws(ctx, ids, 0, 0, NULL, NULL, host, V, err);
        if (!rc) rc = run_draws(ctx, ids, 0, 0, NULL, NULL, rows, V, err); /* a second lone run: the noise */
        for (int t = 0; t <= N_DRAW && !rc; t++) {
            memcpy(w, host + (size_t)t * 2 * V, sizeof(float) * V);
            memcpy(w2, rows + (size_t)t * 2 * V, sizeof(float) * V);
            solo_noise += sampler_sample_at(&sm, w, (uint64_t)t) != sampler_sample_at(&sm, w2, (uint64_t)t);
        }
        free(w2);
        for (int k = 0; k < 2 && !rc; k++) {
            rc = run_draws(ctx, ids, 0, k, pick1, lp1, rows, V, err);
            for (int t = 0; t <= N_DRAW && !rc; t++) {
                const float *row = host + (size_t)t * 2 * V; /* slot 1's own row */
                memcpy(w, row, sizeof(float) * V);
                int want = 0;
                if (k == 0)
                    want = sampler_sample_at(&sm, w, (uint64_t)t);
                else
                    for (int i = 1; i < V; i++) want = row[i] > row[want] ? i : want;
                (k ? &solo_k1 : &solo_miss)[0] += pick1[t] != want;
                double mx = row[0], sum = 0;
                for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
                for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
                const double want_lp = pick1[t] >= 0 && pick1[t] < V ? row[pick1[t]] - mx - log(sum) : NAN;
                solo_lp += !(fabs(lp1[t] - want_lp) <= 0.05);
                solo_worst = fmax(solo_worst, fabs(lp1[t] - want_lp));
            }
        }
        free(host);
        printf("  alone (solo): draws vs the host sampler's %d of %d differ (the host's on two lone runs: %d), top_k 1 "
               "vs argmax %d differ, logprobs off %d (worst %.2g)\n",
               solo_miss, N_DRAW + 1, solo_noise, solo_k1, solo_lp, solo_worst);
    }
    sampler_free(&sm);
    free(rows), free(w);
    printf("  device draws vs the host sampler's: %d of %d differ; logprobs off %d; alone vs among: %d differ; top_k 1 "
           "vs argmax: %d differ\n",
           miss, N_DRAW + 1, lp_bad, alone_diff, k1_bad);
    return rc ? 1
              : (miss > 1) + (lp_bad > 0) + (alone_diff > 0) + (k1_bad > 0) +
                    (solo_miss > solo_noise + (N_DRAW + 1) / 3) + (solo_k1 > 1) + (solo_lp > 0);
}

/* Logit changes on the device (DeviceSampling.pen, src/cuda/penalty.cu): the run_draws sequence with a repetition,
 * presence and frequency penalty, a logit bias and a min_tokens ban, the fed ids counted as generated after the
 * prompt; slot 1 picks on the device (its entries from the host sampler's list), slot 2's raw row comes back. Each pick
 * must be the host sampler's on that raw row after the same changes (sampler_sample_at), its logprob the raw row's
 * log-softmax. temp 0 (greedy): every pick exactly, and a bias of -3 on the raw argmax a previous run of the same step
 * saw (argmax[t], or none when NULL) sends the device through the path where the raw argmax is itself changed; the
 * picks that differ from the raw argmax are counted in *moved. temp 0.8: one miss in N_DRAW let through, as
 * run_draws. alone (det): slot 1 without slot 2, picks into pick / lp only. Returns the failures. */
static int run_penalized(void *ctx, const int *ids, float temp, int alone, const int *argmax, int *pick, float *lp,
                         int *moved, int *raw_am, int V, Err *err) {
    int t1[MAX_SEQ / BLOCK], t2[MAX_SEQ / BLOCK];
    for (int b = 0; b < MAX_SEQ / BLOCK; b++) t1[b] = 8 + b, t2[b] = 24 + b;
    Q35Sampling cfg = {0};
    cfg.temperature = temp, cfg.top_p = 0.9f, cfg.min_p = 0.02f, cfg.repetition_penalty = 1.3f;
    cfg.presence_penalty = 1.5f, cfg.seed = 1234, cfg.frequency_penalty = 0.4f;
    Sampler sm;
    float *row = malloc(sizeof(float) * 2 * V), *w = malloc(sizeof(float) * V);
    int rc = sampler_init(&sm, &cfg, V, V, err), bad = 0, miss = 0, lp_bad = 0;
    const int stop[2] = {ids[CHUNK_A], 3}; /* banned for the first 4 picks: one of them the first fed id */
    if (!rc) rc = sampler_set_ban(&sm, stop, 2, 4, err);
    for (int i = 0; i < CHUNK_A; i++) sampler_observe(&sm, ids[i], 0);
    for (int t = 0; t <= N_DRAW && !rc; t++) {
        const int pos = t ? CHUNK_A + t - 1 : 0, n = t ? 1 : CHUNK_A;
        if (t) sampler_observe(&sm, ids[pos], 1);
        const int bid[3] = {5 + t, 11, argmax ? argmax[t] : 17};
        const float bv[3] = {2.0f, -1.0f, argmax ? -3.0f : 1.0f};
        if ((rc = sampler_set_bias(&sm, bid, bv, 3, err))) break;
        const SamplePenalty *pen;
        const int n_pen = sampler_penalties(&sm, &pen);
        DeviceSampling ds = {.temperature = temp,
                             .top_p = 0.9f,
                             .min_p = 0.02f,
                             .seed = 1234,
                             .step = (uint64_t)t,
                             .repetition = 1.3f,
                             .presence = 1.5f,
                             .frequency = 0.4f,
                             .n_pen = n_pen,
                             .pen = pen};
        BatchItem it[2];
        draw_items(it, ids, pos, n, t1, t2, &pick[t], &lp[t], &ds);
        pick[t] = -1;
        if ((rc = cuda_backend.step_batch(ctx, it, alone ? 1 : 2, row, err)) || alone) continue;
        const float *raw = row + V; /* slot 2's (slot 1's place in the output stays) */
        int am = 0;
        for (int i = 1; i < V; i++) am = raw[i] > raw[am] ? i : am;
        if (raw_am) raw_am[t] = am;
        memcpy(w, raw, sizeof(float) * V);
        const int want = sampler_sample_at(&sm, w, (uint64_t)t);
        bad += pick[t] < 0; /* the device did not pick (it declined the list): not what this checks */
        (temp > 0 ? &miss : &bad)[0] += pick[t] != want;
        *moved += pick[t] != am;
        double mx = raw[0], sum = 0;
        for (int i = 1; i < V; i++) mx = raw[i] > mx ? raw[i] : mx;
        for (int i = 0; i < V; i++) sum += exp((double)raw[i] - mx);
        const double want_lp = pick[t] >= 0 && pick[t] < V ? raw[pick[t]] - mx - log(sum) : NAN;
        lp_bad += !(fabs(lp[t] - want_lp) <= 1e-4 + 1e-5 * fabs(want_lp));
    }
    sampler_free(&sm);
    free(row), free(w);
    if (!alone)
        printf("  logit changes on the device (temperature %g%s): picks vs the host sampler's %d of %d differ, "
               "logprobs off %d\n",
               temp, argmax ? ", the raw argmax biased" : "", temp > 0 ? miss : bad, N_DRAW + 1, lp_bad);
    return rc ? 1 : bad + (miss > 1) + (lp_bad > 0);
}

static int check_penalized(void *ctx, const int *ids, int det, int V, Err *err) {
    int pick[N_DRAW + 1], pick1[N_DRAW + 1], am[N_DRAW + 1], moved = 0, fails = 0;
    float lp[N_DRAW + 1], lp1[N_DRAW + 1];
    fails += run_penalized(ctx, ids, 0.8f, 0, NULL, pick, lp, &moved, NULL, V, err);
    fails += run_penalized(ctx, ids, 0.0f, 0, NULL, pick, lp, &moved, am, V, err);
    fails += run_penalized(ctx, ids, 0.0f, 0, am, pick, lp, &moved, NULL, V, err);
    if (det) { /* alone: bitwise the picks and logprobs among the other */
        int diff = 0;
        fails += run_penalized(ctx, ids, 0.8f, 0, NULL, pick, lp, &moved, NULL, V, err);
        fails += run_penalized(ctx, ids, 0.8f, 1, NULL, pick1, lp1, &moved, NULL, V, err);
        for (int t = 0; t <= N_DRAW; t++) diff += pick1[t] != pick[t] || memcmp(&lp1[t], &lp[t], 4);
        printf("  logit changes on the device, alone vs among: %d of %d picks or logprobs differ\n", diff, N_DRAW + 1);
        fails += diff > 0;
    } else { /* alone (serve.cu solo_pick): greedy picks vs the batched run's, within the solo kernels' noise */
        int diff = 0;
        fails += run_penalized(ctx, ids, 0.0f, 0, NULL, pick, lp, &moved, NULL, V, err);
        fails += run_penalized(ctx, ids, 0.0f, 1, NULL, pick1, lp1, &moved, NULL, V, err);
        for (int t = 0; t <= N_DRAW; t++) diff += pick1[t] != pick[t];
        printf("  logit changes on the device, alone (solo) vs among: %d of %d greedy picks differ\n", diff,
               N_DRAW + 1);
        fails += diff > 2;
    }
    printf("  logit changes on the device: %d greedy picks moved off the raw argmax\n", moved);
    return fails + (moved == 0);
}

/* det = 1: deterministic mode, every check bitwise where the issue asks for exactness. det = 0: the default mode, in
 * which a lone decode row runs the single-sequence step on the context's own state (serve.cu solo_step): alone,
 * among others, from a snapshot, and alone and then joined by others (the solo state and KV rows handed back to the
 * slot and pages), each within the bound against forward(). */
static void test_model(int qwen35, int det, int fp8, int bf16, int kv8) {
    char name[64];
    snprintf(name, sizeof name, "%s%s%s%s%s", qwen35 ? "qwen3.5-like" : "qwen3-like", fp8 ? " fp8" : "",
             bf16 ? " bf16-states" : "", kv8 ? " fp8-kv" : "", det ? " det" : "");
    Model m;
    small_model(&m, qwen35);
    if (fp8) { /* --weights fp8: FP8 projections (the DeltaNet in_proj's b / a rows stay bf16), the CPU dequantizes */
        Err qerr = {0};
        CHECK(model_quantize_fp8(&m, &qerr) == 0 && model_fp8_count(&m, NULL) > 0, "%s: quantize: %s", name, qerr.msg);
    }
    const int V = m.config.vocab_size;
    int ids[LA];
    for (int i = 0; i < LA; i++) ids[i] = (int)(rng_u64(&rng) % (uint64_t)V);
    float *alone = malloc(sizeof(float) * N_STEPS * V), *among = malloc(sizeof(float) * N_STEPS * V);
    float *fwd = malloc(sizeof(float) * N_STEPS * V), *cpu_all = malloc(sizeof(float) * LA * V);
    float *cpu = malloc(sizeof(float) * N_STEPS * V);
    void *ctx = NULL, *cctx = NULL;
    Err err = {0};
    BackendOptions o;
    memset(&o, 0, sizeof o);
    o.max_seq = MAX_SEQ;
    o.deterministic = det;
    if (cpu_backend.open(&cctx, &m, &o, &err) || cpu_backend.forward(cctx, ids, LA, 0, 1, cpu_all, &err)) {
        CHECK(0, "%s: cpu: %s", name, err.msg);
        goto done;
    }
    memcpy(cpu, cpu_all + (size_t)(CHUNK_A - 1) * V, sizeof(float) * V);
    memcpy(cpu + V, cpu_all + (size_t)CHUNK_A * V, sizeof(float) * (size_t)(LA - CHUNK_A) * V);
    if (cuda_backend.open(&ctx, &m, &o, &err)) {
        CHECK(0, "%s: cuda open: %s", name, err.msg);
        goto done;
    }
    CHECK(cuda_backend.serve_sizes && cuda_backend.serve_open && cuda_backend.step_batch, "no batched step");
    ServeSizes z;
    ServeSizes z32;
    if (cuda_backend.serve_sizes(ctx, BLOCK, bf16, kv8, &z, &err) ||
        cuda_backend.serve_sizes(ctx, BLOCK, 0, 0, &z32, &err)) {
        CHECK(0, "%s: serve_sizes: %s", name, err.msg);
        goto done;
    }
    const Config *c = &m.config;
    const size_t want_block =
        (size_t)c->n_full_layers * 2 * c->num_key_value_heads * BLOCK * c->head_dim * (kv8 ? 1 : 2);
    CHECK(z.block_bytes == want_block, "%s: block_bytes %zu, expected %zu", name, z.block_bytes, want_block);
    CHECK(qwen35 ? z.slot_bytes >= (size_t)c->n_linear_layers * 4 * 128 * 128 * (bf16 ? 2 : 4) : z.slot_bytes == 0,
          "%s: slot_bytes %zu", name, z.slot_bytes);
    CHECK(!bf16 || z.slot_bytes + (size_t)c->n_linear_layers * 4 * 128 * 128 * 2 <= z32.slot_bytes,
          "%s: bf16 slots of %zu bytes against fp32 ones of %zu", name, z.slot_bytes, z32.slot_bytes);
    CHECK(z.mem_bytes > 0 && z.mem_fraction > 0 && z.mem_fraction <= 1, "%s: mem %zu fraction %g", name, z.mem_bytes,
          z.mem_fraction);
    ServeLayout lay = {.n_slots = N_SLOTS,
                       .n_blocks = N_BLOCKS,
                       .block = BLOCK,
                       .max_blocks = MAX_SEQ / BLOCK,
                       .n_snaps = 1,
                       .state_bf16 = bf16,
                       .kv_fp8 = kv8};
    /* serve_step --ablate: only the batched step's kinds, each known */
    const char *bad_ablate[3] = {"sv.nope", "sv.attn,pf.embed", "lm_head"};
    for (int k = 0; k < 3; k++) {
        lay.ablate = bad_ablate[k];
        CHECK(cuda_backend.serve_open(ctx, &lay, &err) == Q35_ERR_ARG && strstr(err.msg, "ablate"),
              "%s: --ablate %s refused: %s", name, bad_ablate[k], err.msg);
    }
    if (qwen35 && det && !fp8 && !bf16 && !kv8) { /* a valid list opens and steps, and the kinds are left out */
        float *abl = malloc(sizeof(float) * 2 * N_STEPS * V);
        int rc = 0;
        for (int k = 0; k < 2 && !rc; k++) {
            lay.ablate = k ? NULL : "sv.attn,sv.dn_state,sv.gate_up";
            rc = cuda_backend.serve_open(ctx, &lay, &err);
            if (!rc) rc = run_steps(&cuda_backend, ctx, ids, N_OTHER, 0, abl + (size_t)k * N_STEPS * V, V, &err);
            cuda_backend.serve_close(ctx);
        }
        const int same = !rc && !memcmp(abl, abl + (size_t)N_STEPS * V, sizeof(float) * N_STEPS * V);
        CHECK(rc == 0 && !same, "%s: --ablate sv.attn,sv.dn_state,sv.gate_up: %s", name,
              rc ? err.msg : "the rows equal those of the full step");
        free(abl);
    }
    lay.ablate = NULL;
    if (cuda_backend.serve_open(ctx, &lay, &err)) {
        CHECK(0, "%s: serve_open: %s", name, err.msg);
        goto done;
    }
    double w_cpu32 = 0; /* bf16 states / fp8 KV: the CPU's default rows against the CPU's own serve with them */
    if (bf16 || kv8) {
        memcpy(among, cpu, sizeof(float) * N_STEPS * V);
        if (cpu_backend.serve_open(cctx, &lay, &err) || run_steps(&cpu_backend, cctx, ids, 0, 0, cpu, V, &err)) {
            CHECK(0, "%s: the CPU's bf16-state serve: %s", name, err.msg);
            goto done;
        }
        rows_near(among, cpu, N_STEPS, V, &w_cpu32);
        int same = 0;
        for (int t = 0; t < N_STEPS; t++) same += !memcmp(among + (size_t)t * V, cpu + (size_t)t * V, 4 * V);
        CHECK(same < N_STEPS, "%s: the CPU's bf16 states / fp8 KV change nothing", name);
    }
    /* forward(): the single sequence beside the pools */
    int rc = cuda_backend.reset(ctx, &err);
    if (!rc) rc = cuda_backend.forward(ctx, ids, CHUNK_A, 0, 0, fwd, &err);
    for (int t = CHUNK_A; t < LA && !rc; t++)
        rc = cuda_backend.forward(ctx, ids + t, 1, t, 0, fwd + (size_t)(1 + t - CHUNK_A) * V, &err);
    CHECK(rc == 0, "%s: forward: %s", name, err.msg);
    /* fp8 KV: forward() keeps bf16 K / V; the reference of every "vs forward()" check below is the CPU serving with
     * e4m3 K / V instead */
    if (kv8) memcpy(fwd, cpu, sizeof(float) * N_STEPS * V);
    if ((rc = run_steps(&cuda_backend, ctx, ids, 0, 0, alone, V, &err))) {
        CHECK(0, "%s: step_batch alone: %s", name, err.msg);
        goto done;
    }
    double w_fwd = 0, w_cpu = 0;
    CHECK(rows_near(alone, fwd, N_STEPS, V, &w_fwd), "%s: step_batch vs forward(): worst rel L2 %.4f", name, w_fwd);
    CHECK(rows_near(alone, cpu, N_STEPS, V, &w_cpu), "%s: step_batch vs the CPU: worst rel L2 %.4f", name, w_cpu);
    if ((rc = run_steps(&cuda_backend, ctx, ids, 1, 0, among, V, &err))) {
        CHECK(0, "%s: step_batch among others: %s", name, err.msg);
        goto done;
    }
    int diff_rows = 0;
    double w_among = 0, w_snap = 0, w_join = 0;
    for (int t = 0; t < N_STEPS; t++) diff_rows += memcmp(alone + (size_t)t * V, among + (size_t)t * V, 4 * V) != 0;
    if (det)
        CHECK(diff_rows == 0,
              "%s: batch invariance: %d of %d logits rows differ alone vs among %d others (rel L2 %.3g)", name,
              diff_rows, N_STEPS, N_OTHER, rel_l2(among, alone, (int64_t)N_STEPS * V));
    else
        CHECK(rows_near(among, fwd, N_STEPS, V, &w_among), "%s: among others vs forward(): worst rel L2 %.4f", name,
              w_among);
    /* and once more alone: run to run */
    if (det && (rc = run_steps(&cuda_backend, ctx, ids, 0, 0, among, V, &err)) == 0)
        CHECK(memcmp(alone, among, sizeof(float) * N_STEPS * V) == 0, "%s: step_batch differs run to run", name);
    /* prefix-cache hooks: continuing from a loaded snapshot and copied blocks */
    int diff_snap = -1;
    if ((rc = run_snap(ctx, ids, among, V, &err)) == 0) {
        diff_snap = 0;
        for (int t = 0; t < N_STEPS; t++) diff_snap += memcmp(alone + (size_t)t * V, among + (size_t)t * V, 4 * V) != 0;
    }
    if (det)
        CHECK(diff_snap == 0, "%s: from a snapshot and copied blocks: %d rows differ (%s)", name, diff_snap,
              rc ? err.msg : "");
    else
        CHECK(rc == 0 && rows_near(among, fwd, N_STEPS, V, &w_snap),
              "%s: from a snapshot and copied blocks vs forward(): worst rel L2 %.4f (%s)", name, w_snap,
              rc ? err.msg : "");
    if (!det) { /* A alone (solo steps) for half its decode steps, then the others join (a batched step hands A back) */
        rc = run_steps(&cuda_backend, ctx, ids, 1, N_STEPS / 2, among, V, &err);
        CHECK(rc == 0 && rows_near(among, fwd, N_STEPS, V, &w_join),
              "%s: alone then joined by others vs forward(): worst rel L2 %.4f (%s)", name, w_join, rc ? err.msg : "");
        double w_end = 0;
        CHECK(cuda_backend.seq_end != NULL, "%s: no seq_end hook", name);
        rc = cuda_backend.seq_end ? run_ended(ctx, ids, among, V, &err) : -1;
        CHECK(rc == 0 && rows_near(among, fwd, N_STEPS, V, &w_end),
              "%s: other sequences' ends announced between A's solo steps vs forward(): worst rel L2 %.4f (%s)", name,
              w_end, rc > 0 ? err.msg : "");
        for (int L = 1; L < CHUNK_A; L += 6) /* 1, 7, 13, 19: snapshots inside the prefill's chunk */
            for (int wo = 0; wo < 2; wo++) {
                double w_in = 0;
                rc = run_resume_in_step(ctx, ids, L, wo, among, V, &err);
                CHECK(rc == 0 && rows_near(among, fwd, N_STEPS, V, &w_in),
                      "%s: resumed at %d ids from a snapshot inside a step (%s) vs forward(): worst rel L2 %.4f (%s)",
                      name, L, wo ? "batched" : "solo", w_in, rc ? err.msg : "");
            }
    }
    if (det) { /* deterministic mode: a token's bits do not depend on the chunking of its prompt (prefix-cache hits) */
        int diff_chunk = -1;
        if ((rc = run_chunked(ctx, ids, 5, among, V, &err)) == 0) {
            diff_chunk = 0;
            for (int t = 0; t < N_STEPS; t++)
                diff_chunk += memcmp(alone + (size_t)t * V, among + (size_t)t * V, 4 * V) != 0;
        }
        CHECK(diff_chunk == 0, "%s: prompt in chunks of 5 instead of %d: %d of %d rows differ (%s)", name, CHUNK_A,
              diff_chunk, N_STEPS, rc ? err.msg : "");
        /* resumed at 1 id, inside a block, at a block's end and just past it: bitwise the rows of A fed cold */
        const int Ls[] = {1, 7, 16, 17, CHUNK_A - 1};
        for (size_t k = 0; k < sizeof Ls / sizeof Ls[0]; k++) {
            int diff_res = -1;
            if ((rc = run_resume(ctx, ids, Ls[k], among, V, &err)) == 0) {
                diff_res = 0;
                for (int t = 0; t < N_STEPS; t++)
                    diff_res += memcmp(alone + (size_t)t * V, among + (size_t)t * V, 4 * V) != 0;
            }
            CHECK(diff_res == 0, "%s: resumed at %d ids: %d of %d rows differ from cold (%s)", name, Ls[k], diff_res,
                  N_STEPS, rc ? err.msg : "");
            for (int wo = 0; wo < 2; wo++) { /* the snapshot taken inside the step: the slot after that token */
                diff_res = -1;
                if ((rc = run_resume_in_step(ctx, ids, Ls[k], wo, among, V, &err)) == 0) {
                    diff_res = 0;
                    for (int t = 0; t < N_STEPS; t++)
                        diff_res += memcmp(alone + (size_t)t * V, among + (size_t)t * V, 4 * V) != 0;
                }
                CHECK(diff_res == 0, "%s: resumed at %d ids from a snapshot inside a step%s: %d of %d rows differ (%s)",
                      name, Ls[k], wo ? " beside another" : "", diff_res, N_STEPS, rc ? err.msg : "");
            }
        }
    }
    CHECK(cuda_backend.snap_save(ctx, 0, 1, &err) == Q35_ERR_ARG, "%s: snapshot 1 of 1 not refused", name);
    CHECK(cuda_backend.block_copy(ctx, 0, N_BLOCKS, &err) == Q35_ERR_ARG, "%s: block %d not refused", name, N_BLOCKS);
    CHECK(check_argmax(ctx, ids, V, V, &err) == 0, "%s: the device argmax of a row differs from the host's (%s)", name,
          err.msg);
    CHECK(check_greedy_prompt(ctx, ids, V, V, &err) == 0,
          "%s: a lone prompt's greedy pick is not its row's argmax (%s)", name, err.msg);
    CHECK(check_sampled(ctx, ids, det, V, &err) == 0, "%s: device sampling in the batched step (%s)", name, err.msg);
    CHECK(check_penalized(ctx, ids, det, V, &err) == 0, "%s: logit changes on the device (%s)", name, err.msg);
    if (!det) { /* the prompt graphs against the same prompts eager */
        void *ectx = NULL;
        BackendOptions eo = o;
        eo.no_graph = 1;
        if (cuda_backend.open(&ectx, &m, &eo, &err) || cuda_backend.serve_open(ectx, &lay, &err))
            CHECK(0, "%s: cuda open (no_graph): %s", name, err.msg);
        else if (!check_prompt_graphs(name, ctx, ectx, V, &err))
            check_prompt_graph_snaps(name, ctx, ectx, V, &err);
        if (ectx) {
            cuda_backend.serve_close(ectx);
            cuda_backend.close(ectx);
        }
    }
    /* bad items */
    int blocks[MAX_SEQ / BLOCK] = {0};
    BatchItem bad = {.slot = N_SLOTS, .tokens = ids, .n = 1, .pos = 0, .blocks = blocks, .logits = 1};
    CHECK(cuda_backend.step_batch(ctx, &bad, 1, fwd, &err) == Q35_ERR_ARG, "%s: slot %d not refused", name, N_SLOTS);
    bad.slot = 0;
    blocks[0] = N_BLOCKS;
    CHECK(cuda_backend.step_batch(ctx, &bad, 1, fwd, &err) == Q35_ERR_ARG, "%s: block %d not refused", name, N_BLOCKS);
    if (bf16 || kv8)
        printf("  %s: the CPU's rows with %s: worst rel L2 %.4f\n", name,
               kv8 ? "bf16 vs fp8 K / V" : "fp32 vs bf16 states", w_cpu32);
    if (det)
        printf("  %s: step_batch vs forward() worst rel L2 %.4f, vs CPU %.4f; alone vs among %d others: %d of %d rows "
               "differ\n",
               name, w_fwd, w_cpu, N_OTHER, diff_rows, N_STEPS);
    else
        printf("  %s: vs forward() worst rel L2: alone %.4f, among %d others %.4f, from a snapshot %.4f, alone then "
               "joined %.4f; vs CPU %.4f\n",
               name, w_fwd, N_OTHER, w_among, w_snap, w_join, w_cpu);
    cuda_backend.serve_close(ctx);
done:
    if (ctx) cuda_backend.close(ctx);
    if (cctx) {
        cpu_backend.serve_close(cctx);
        cpu_backend.close(cctx);
    }
    free(alone), free(among), free(fwd), free(cpu_all), free(cpu);
}

/* The greedy LM head with the picks in its epilogue (serve.cu sv_lm_argmax: >= 128 rows, every one greedy with its pick
 * on the device, a vocabulary wide enough that the prefill GEMM takes the LM head: the Qwen3.5-like model with 16384
 * ids): LM_SEQS sequences, their prompts of 2-4 ids in one pass, then two decode steps of all of them (a graph of the
 * 160-row bucket), run twice on fresh contexts: once with every logits row to the host, once with every row picked on
 * the device. The picks must be the host argmax of the first run's rows (the same layers, the same LM head sums), their
 * logprobs the rows' log-softmax there within 1e-4; in the prompt pass (eager) and in both decode steps. The same with
 * 50 and 7 sequences and no logprob asked: those passes take the int8 screen (sv_lm_screen), whose picks must be the
 * logits rows' argmax too (decode graphs of the 56- and 8-row buckets). */
#define LM_SEQS 130
static int lm_run(void *ctx, const int *ids, int V, int ns, int picked, float *rows, float *scratch, int *pick,
                  float *lp, Err *err) {
    static int tables[LM_SEQS];
    BatchItem it[LM_SEQS];
    int len[LM_SEQS], rc = 0;
    for (int step = 0; step < 3 && !rc; step++) {
        for (int k = 0; k < ns; k++) {
            const int n = step ? 1 : 2 + k % 3;
            if (!step) len[k] = 0;
            tables[k] = k;
            memset(&it[k], 0, sizeof it[k]);
            it[k].slot = k, it[k].tokens = ids + 8 * k + len[k], it[k].n = n, it[k].pos = len[k];
            it[k].blocks = &tables[k], it[k].logits = 1;
            if (picked) it[k].pick = pick + step * ns + k, it[k].logprob = lp ? lp + step * ns + k : NULL;
            if (picked) *it[k].pick = -1;
            len[k] += n;
        }
        rc = cuda_backend.step_batch(ctx, it, ns, picked ? scratch : rows + (size_t)step * ns * V, err);
    }
    return rc;
}

/* ns sequences; want_lp 0: no logprob asked, so that passes of <= 64 rows take the LM head's int8 screen
 * (lm_screen_rows.cu) where the device has it */
static void test_lm_argmax(int ns, int want_lp) {
    Model m;
    g_vocab = 16384;
    small_model(&m, 1);
    g_vocab = 0;
    const int V = m.config.vocab_size;
    int *ids = malloc(sizeof(int) * 8 * LM_SEQS), *pick = malloc(sizeof(int) * 3 * LM_SEQS);
    float *rows = malloc(sizeof(float) * 3 * LM_SEQS * (size_t)V), *lp = malloc(sizeof(float) * 3 * LM_SEQS);
    float *scratch = malloc(sizeof(float) * LM_SEQS * (size_t)V); /* the picked run's output (no row is written) */
    for (int i = 0; i < 8 * LM_SEQS; i++) ids[i] = (int)(rng_u64(&rng) % (uint64_t)V);
    BackendOptions o;
    memset(&o, 0, sizeof o);
    o.max_seq = 512; /* passes of up to 512 rows: all the prompts in one */
    Err err = {0};
    int rc = 0, wrong = 0, unpicked = 0;
    double lp_err = 0;
    for (int picked = 0; picked < 2 && !rc; picked++) {
        void *ctx = NULL;
        ServeLayout lay = {.n_slots = LM_SEQS, .n_blocks = LM_SEQS, .block = BLOCK, .max_blocks = 512 / BLOCK};
        rc = cuda_backend.open(&ctx, &m, &o, &err);
        if (!rc) rc = cuda_backend.serve_open(ctx, &lay, &err);
        if (!rc) rc = lm_run(ctx, ids, V, ns, picked, rows, scratch, pick, want_lp ? lp : NULL, &err);
        if (ctx) {
            cuda_backend.serve_close(ctx);
            cuda_backend.close(ctx);
        }
    }
    CHECK(rc == 0, "lm argmax: %s", err.msg);
    for (int r = 0; r < 3 * ns && !rc; r++) {
        const float *x = rows + (size_t)r * V;
        int b = 0;
        for (int i = 1; i < V; i++)
            if (x[i] > x[b]) b = i;
        double s = 0;
        for (int i = 0; i < V; i++) s += exp((double)x[i] - x[b]);
        unpicked += pick[r] < 0;
        wrong += pick[r] != b;
        const double e = want_lp ? fabs(lp[r] + log(s)) : 0.0;
        if (!(e <= lp_err)) lp_err = e;
    }
    printf("  qwen3.5-like, %d ids, %d greedy rows a pass%s: picks in the LM head vs the logits rows' argmax: %d of %d "
           "differ (%d left to the host), logprobs within %.2g\n",
           V, ns, want_lp ? "" : " (no logprobs: the screen up to 64 rows)", wrong, 3 * ns, unpicked, lp_err);
    CHECK(!rc && wrong == 0 && lp_err <= 1e-4, "lm argmax (%d rows): %d of %d picks differ, logprobs off by %.3g", ns,
          wrong, 3 * ns, lp_err);
    free(ids), free(pick), free(rows), free(lp), free(scratch);
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("serve_cuda");
    rng_seed(&rng, test_seed(argc, argv, "test_serve_cuda"));
    for (int det = 1; det >= 0; det--) {
        test_model(1, det, 0, 0, 0);
        test_model(0, det, 0, 0, 0);
        test_model(1, det, 1, 0, 0);
        test_model(1, det, 0, 1, 0); /* bf16 DeltaNet states (ServeLayout.state_bf16) */
        test_model(1, det, 0, 0, 1); /* fp8 KV cache (ServeLayout.kv_fp8) */
        test_model(0, det, 0, 0, 1);
    }
    test_lm_argmax(LM_SEQS, 1);
    test_lm_argmax(50, 0);
    test_lm_argmax(7, 0);
    tt_free_all();
    return TEST_SUMMARY("serve_cuda");
}
