/* forward.c — the fp32 reference forward pass (MODEL.md §3, §5, §7), one block per layer kind:
 *   x = E[tok];  per layer: x += mixer(norm1(x));  x += mlp(norm2(x));  logits = lm_head·norm(x)
 * mixer = gated full attention (KV cache) or Gated DeltaNet (conv rows + recurrent state).
 * The layer code runs on a CpuSeq: the single sequence (cpu_forward) or a serving slot with a
 * paged KV cache (cpu_step_batch, one item after the other: a sequence's bits never depend on
 * the other items, their order or the thread count, since every op splits only outer loops).
 * Tokens go through the stack in passes of up to CPU_TB rows. A call with n > 1 runs the
 * chunked DeltaNet (§3.4); n == 1 runs the recurrence (§3.3). Nothing is rounded to bf16.
 * Probes (when a probe dir is set), each [T][width] for the tokens of the current pass:
 *   Lxx.attn.q / Lxx.attn.k (after norm + RoPE), Lxx.attn.core (gated, before o_proj),
 *   Lxx.attn.out, Lxx.delta.conv (conv + SiLU), Lxx.delta.core (before the gated norm),
 *   Lxx.delta.out, Lxx.mlp.out, Lxx.resid (x after the layer), final.norm, logits. */
#include <math.h>
#include <omp.h>
#include <stdio.h>

#include "cpu/forward.h"
#include "cpu/ops.h"

static void probe_l(const CpuCtx *ctx, int l, const char *what, const float *x, int64_t n) {
    if (!ctx->probe.dir) return;
    char name[64];
    snprintf(name, sizeof name, "L%02d.%s", l, what);
    probe(&ctx->probe, name, x, (size_t)n);
}

/* Y[T][rows] = X[T][cols] · Wᵀ with rows = W.shape[0] (checked at open). exact: one row's bits never depend on
 * T (cpu_matmul computes each row alone; cpu_matvec sums in another order). */
static void linear_x(float *Y, const float *X, const Tensor *W, int T, int exact) {
    const int rows = (int)W->shape[0], cols = (int)(W->numel / W->shape[0]);
    if (T == 1 && !exact)
        cpu_matvec(Y, X, W->data, W->dtype, rows, cols);
    else
        cpu_matmul(Y, X, W->data, W->dtype, T, rows, cols);
}

#define linear(Y, X, W, T) linear_x(Y, X, W, T, ctx->exact)

/* Gated full attention (Qwen3.5) or plain attention (Qwen3) for T tokens at pos0..; h -> out. */
static void attention_block(CpuCtx *ctx, const CpuSeq *sq, int l, int T, int pos0) {
    const Config *c = ctx->c;
    const LayerWeights *w = &ctx->m->w.layers[l];
    const CpuLayer *cl = &ctx->layers[l];
    const int Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, hd = c->head_dim;
    const int unit = c->family == FAMILY_QWEN35;
    if (c->attn_output_gate) {
        /* q_proj rows per head: [q_j | gate_j], hd each */
        linear(ctx->proj, ctx->h, &w->q_proj, T);
        for (int t = 0; t < T; t++) {
            for (int j = 0; j < Hq; j++) {
                const float *src = ctx->proj + (int64_t)t * c->q_proj_rows + (int64_t)j * 2 * hd;
                memcpy(ctx->q + ((int64_t)t * Hq + j) * hd, src, (size_t)hd * sizeof(float));
                memcpy(ctx->gate + ((int64_t)t * Hq + j) * hd, src + hd, (size_t)hd * sizeof(float));
            }
        }
    } else {
        linear(ctx->q, ctx->h, &w->q_proj, T);
    }
    linear(ctx->k, ctx->h, &w->k_proj, T);
    linear(ctx->v, ctx->h, &w->v_proj, T);
    cpu_rmsnorm(ctx->q, ctx->q, cl->q_norm, T * Hq, hd, c->rms_norm_eps, unit);
    cpu_rmsnorm(ctx->k, ctx->k, cl->k_norm, T * Hkv, hd, c->rms_norm_eps, unit);
    cpu_rope(ctx->q, T, Hq, hd, c->rotary_dim, pos0, ctx->inv_freq);
    cpu_rope(ctx->k, T, Hkv, hd, c->rotary_dim, pos0, ctx->inv_freq);
    probe_l(ctx, l, "attn.q", ctx->q, (int64_t)T * Hq * hd);
    probe_l(ctx, l, "attn.k", ctx->k, (int64_t)T * Hkv * hd);
    /* append to the cache: position p -> row p % B of block blocks[p / B], pool [n_blocks][Hkv][B][hd] */
    const int B = sq->block;
    for (int t = 0; t < T; t++) {
        const int p = pos0 + t;
        for (int i = 0; i < Hkv; i++) {
            const int64_t dst = (((int64_t)sq->blocks[p / B] * Hkv + i) * B + p % B) * hd;
            const int64_t src = ((int64_t)t * Hkv + i) * hd;
            memcpy(sq->K[l] + dst, ctx->k + src, (size_t)hd * sizeof(float));
            memcpy(sq->V[l] + dst, ctx->v + src, (size_t)hd * sizeof(float));
            if (sq->kv_fp8)
                for (int e = 0; e < hd; e++) {
                    sq->K[l][dst + e] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(sq->K[l][dst + e]));
                    sq->V[l][dst + e] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(sq->V[l][dst + e]));
                }
        }
    }
    const float scale = (float)(1.0 / sqrt((double)hd));
    cpu_attention_paged(ctx->o, ctx->q, sq->K[l], sq->V[l], sq->blocks, B, T, pos0, Hq, Hkv, hd, scale);
    if (c->attn_output_gate) cpu_sigmoid_mul(ctx->o, ctx->gate, (int64_t)T * c->attn_dim);
    probe_l(ctx, l, "attn.core", ctx->o, (int64_t)T * c->attn_dim);
    linear(ctx->out, ctx->o, &w->o_proj, T);
    probe_l(ctx, l, "attn.out", ctx->out, (int64_t)T * c->hidden_size);
}

/* S[i] = bf16(S[i]), i < n: the state as a bf16 store keeps it (CpuSeq.state_bf16) */
static void state_to_bf16(float *S, int64_t n) {
    for (int64_t i = 0; i < n; i++) S[i] = round_bf16(S[i]);
}

/* Gated DeltaNet for T tokens; h -> out. chunked: use §3.4 (else the §3.3 recurrence). */
static void deltanet_block(CpuCtx *ctx, const CpuSeq *sq, int l, int T, int chunked) {
    const Config *c = ctx->c;
    const LayerWeights *w = &ctx->m->w.layers[l];
    CpuLayer *cl = &ctx->layers[l];
    const int Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads;
    const int dk = c->linear_key_head_dim, dv = c->linear_value_head_dim, kd = c->key_dim, vd = c->value_dim;
    linear(ctx->proj, ctx->h, &w->in_proj_qkv, T);
    linear(ctx->gate, ctx->h, &w->in_proj_z, T);
    linear(ctx->b, ctx->h, &w->in_proj_b, T);
    linear(ctx->a, ctx->h, &w->in_proj_a, T);
    cpu_conv1d(ctx->conv, sq->conv[l], ctx->proj, cl->conv_w, T, c->conv_dim, c->linear_conv_kernel_dim);
    probe_l(ctx, l, "delta.conv", ctx->conv, (int64_t)T * c->conv_dim);
    /* split each conv row into q [Hk][dk] | k [Hk][dk] | v [Hv][dv] */
    for (int t = 0; t < T; t++) {
        const float *row = ctx->conv + (int64_t)t * c->conv_dim;
        memcpy(ctx->q + (int64_t)t * kd, row, (size_t)kd * sizeof(float));
        memcpy(ctx->k + (int64_t)t * kd, row + kd, (size_t)kd * sizeof(float));
        memcpy(ctx->v + (int64_t)t * vd, row + 2 * kd, (size_t)vd * sizeof(float));
    }
    cpu_l2norm(ctx->q, T * Hk, dk, (float)(1.0 / sqrt((double)dk)));
    cpu_l2norm(ctx->k, T * Hk, dk, 1.0f);
    cpu_deltanet_gates(ctx->beta, ctx->g, ctx->b, ctx->a, cl->A_log, cl->dt_bias, T, Hv);
    const int64_t S_n = (int64_t)Hv * dk * dv;
    if (chunked && !ctx->exact) {
        cpu_deltanet_chunked(ctx->o, sq->S[l], ctx->q, ctx->k, ctx->v, ctx->g, ctx->beta, T, Hk, Hv, dk, dv,
                             ctx->dn_scratch);
        if (sq->state_bf16) state_to_bf16(sq->S[l], S_n);
    } else {
        for (int t = 0; t < T; t++) {
            cpu_deltanet_step(ctx->o + (int64_t)t * vd, sq->S[l], ctx->q + (int64_t)t * kd, ctx->k + (int64_t)t * kd,
                              ctx->v + (int64_t)t * vd, ctx->g + (int64_t)t * Hv, ctx->beta + (int64_t)t * Hv, Hk, Hv,
                              dk, dv);
            if (sq->state_bf16) state_to_bf16(sq->S[l], S_n);
        }
    }
    probe_l(ctx, l, "delta.core", ctx->o, (int64_t)T * vd);
    cpu_gated_rmsnorm(ctx->o, ctx->o, ctx->gate, cl->lin_norm, T * Hv, dv, c->rms_norm_eps);
    linear(ctx->out, ctx->o, &w->out_proj, T);
    probe_l(ctx, l, "delta.out", ctx->out, (int64_t)T * c->hidden_size);
}

/* SwiGLU MLP: out = W_down (silu(W_gate h) * (W_up h)). */
static void mlp_block(CpuCtx *ctx, int l, int T) {
    const LayerWeights *w = &ctx->m->w.layers[l];
    linear(ctx->mlp_g, ctx->h, &w->gate_proj, T);
    linear(ctx->mlp_u, ctx->h, &w->up_proj, T);
    cpu_silu_mul(ctx->mlp_g, ctx->mlp_g, ctx->mlp_u, (int64_t)T * ctx->c->intermediate_size);
    linear(ctx->out, ctx->mlp_g, &w->down_proj, T);
    probe_l(ctx, l, "mlp.out", ctx->out, (int64_t)T * ctx->c->hidden_size);
}

/* One pass of T <= CPU_TB tokens at pos0... logits_mode: 0 none, 1 all rows into logits
 * [T][V], 2 the last row only into logits [V]. */
static void forward_pass(CpuCtx *ctx, const CpuSeq *sq, const int *tok, int T, int pos0, int chunked, int logits_mode,
                         float *logits) {
    const Config *c = ctx->c;
    const Weights *w = &ctx->m->w;
    const int D = c->hidden_size, V = c->vocab_size, unit = c->family == FAMILY_QWEN35;
    const float eps = c->rms_norm_eps;
    for (int t = 0; t < T; t++)
        cpu_embed(ctx->x + (int64_t)t * D, w->embed_tokens.data, w->embed_tokens.dtype, tok[t], D);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CpuLayer *cl = &ctx->layers[l];
        cpu_rmsnorm(ctx->h, ctx->x, cl->ln1, T, D, eps, unit);
        if (c->layer_types[l] == LAYER_FULL_ATTN)
            attention_block(ctx, sq, l, T, pos0);
        else
            deltanet_block(ctx, sq, l, T, chunked);
        cpu_add(ctx->x, ctx->out, (int64_t)T * D);
        cpu_rmsnorm(ctx->h, ctx->x, cl->ln2, T, D, eps, unit);
        mlp_block(ctx, l, T);
        cpu_add(ctx->x, ctx->out, (int64_t)T * D);
        probe_l(ctx, l, "resid", ctx->x, (int64_t)T * D);
    }
    if (logits_mode == 1) {
        cpu_rmsnorm(ctx->h, ctx->x, ctx->final_norm, T, D, eps, unit);
        probe(&ctx->probe, "final.norm", ctx->h, (size_t)T * D);
        linear(logits, ctx->h, &w->lm_head, T);
        probe(&ctx->probe, "logits", logits, (size_t)T * V);
    } else if (logits_mode == 2) {
        cpu_rmsnorm(ctx->h, ctx->x + (int64_t)(T - 1) * D, ctx->final_norm, 1, D, eps, unit);
        probe(&ctx->probe, "final.norm", ctx->h, (size_t)D);
        linear(logits, ctx->h, &w->lm_head, 1);
        probe(&ctx->probe, "logits", logits, (size_t)V);
    }
}

/* n tokens of one sequence at pos.. in passes of CPU_TB; the chunked DeltaNet when n > 1. */
static void run_tokens(CpuCtx *ctx, const CpuSeq *sq, const int *tokens, int n, int pos, int all_logits,
                       float *logits) {
    const int V = ctx->c->vocab_size;
    for (int t0 = 0; t0 < n; t0 += CPU_TB) {
        const int T = n - t0 < CPU_TB ? n - t0 : CPU_TB, last = t0 + T == n;
        int mode = 0;
        float *dst = NULL;
        if (logits && all_logits) {
            mode = 1;
            dst = logits + (int64_t)t0 * V;
        } else if (logits && last) {
            mode = 2;
            dst = logits;
        }
        forward_pass(ctx, sq, tokens + t0, T, pos + t0, n > 1, mode, dst);
    }
}

int cpu_forward(CpuCtx *ctx, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err) {
    const Config *c = ctx->c;
    if (n <= 0 || !tokens) return err_set(err, Q35_ERR_ARG, "cpu forward: %d tokens", n);
    if (pos != ctx->n_past)
        return err_set(err, Q35_ERR_ARG, "cpu forward: pos %d but the sequence holds %d tokens (reset to restart)", pos,
                       ctx->n_past);
    if ((int64_t)pos + n > ctx->max_seq)
        return err_set(err, Q35_ERR_CONTEXT, "cpu forward: %d + %d tokens exceed the context of %d", pos, n,
                       ctx->max_seq);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return err_set(err, Q35_ERR_ARG, "cpu forward: token id %d at index %d outside [0, %d)", tokens[i], i,
                           c->vocab_size);
    const int prev_threads = omp_get_max_threads();
    if (ctx->threads > 0) omp_set_num_threads(ctx->threads);
    run_tokens(ctx, &ctx->solo, tokens, n, pos, all_logits, logits);
    ctx->n_past += n;
    omp_set_num_threads(prev_threads);
    return 0;
}

int cpu_snap_copy(CpuCtx *ctx, int slot, int snap, int save, Err *err) {
    const Config *c = ctx->c;
    if (slot < 0 || slot >= ctx->n_slots || snap < 0 || snap >= ctx->n_snaps)
        return err_set(err, Q35_ERR_ARG, "cpu snapshot: slot %d / snapshot %d outside [0, %d) / [0, %d)", slot, snap,
                       ctx->n_slots, ctx->n_snaps);
    const int64_t conv_n = (int64_t)(c->linear_conv_kernel_dim - 1) * c->conv_dim;
    const int64_t S_n = (int64_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CpuLayer *cl = &ctx->layers[l];
        if (c->layer_types[l] == LAYER_FULL_ATTN) continue;
        float *cs = cl->conv_slots + slot * conv_n, *cn = cl->conv_snaps + snap * conv_n;
        float *ss = cl->S_slots + slot * S_n, *sn = cl->S_snaps + snap * S_n;
        memcpy(save ? cn : cs, save ? cs : cn, (size_t)conv_n * sizeof(float));
        memcpy(save ? sn : ss, save ? ss : sn, (size_t)S_n * sizeof(float));
    }
    return 0;
}

int cpu_snap_to_snap(CpuCtx *ctx, int src, int dst, Err *err) {
    const Config *c = ctx->c;
    if (src < 0 || src >= ctx->n_snaps || dst < 0 || dst >= ctx->n_snaps)
        return err_set(err, Q35_ERR_ARG, "cpu snapshot copy: %d -> %d outside [0, %d)", src, dst, ctx->n_snaps);
    const int64_t conv_n = (int64_t)(c->linear_conv_kernel_dim - 1) * c->conv_dim;
    const int64_t S_n = (int64_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CpuLayer *cl = &ctx->layers[l];
        if (c->layer_types[l] == LAYER_FULL_ATTN) continue;
        memcpy(cl->conv_snaps + dst * conv_n, cl->conv_snaps + src * conv_n, (size_t)conv_n * sizeof(float));
        memcpy(cl->S_snaps + dst * S_n, cl->S_snaps + src * S_n, (size_t)S_n * sizeof(float));
    }
    return 0;
}

int cpu_block_copy(CpuCtx *ctx, int src, int dst, Err *err) {
    const Config *c = ctx->c;
    if (src < 0 || src >= ctx->n_blocks || dst < 0 || dst >= ctx->n_blocks)
        return err_set(err, Q35_ERR_ARG, "cpu block copy: %d -> %d outside [0, %d)", src, dst, ctx->n_blocks);
    const int64_t bn = (int64_t)c->num_key_value_heads * ctx->block * c->head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CpuLayer *cl = &ctx->layers[l];
        if (c->layer_types[l] != LAYER_FULL_ATTN) continue;
        memcpy(cl->Kp + dst * bn, cl->Kp + src * bn, (size_t)bn * sizeof(float));
        memcpy(cl->Vp + dst * bn, cl->Vp + src * bn, (size_t)bn * sizeof(float));
    }
    return 0;
}

int cpu_step_batch(CpuCtx *ctx, const BatchItem *items, int n, float *logits, Err *err) {
    const Config *c = ctx->c;
    if (!ctx->n_slots) return err_set(err, Q35_ERR_ARG, "cpu step: serving is not open");
    for (int i = 0; i < n; i++) {
        const BatchItem *it = &items[i];
        if (it->slot < 0 || it->slot >= ctx->n_slots || it->n <= 0 || !it->tokens || it->pos < 0 ||
            (int64_t)it->pos + it->n > ctx->max_seq || !it->blocks)
            return err_set(err, Q35_ERR_ARG, "cpu step: item %d (slot %d, %d tokens at %d) is outside the layout", i,
                           it->slot, it->n, it->pos);
        for (int j = 0; j <= (it->pos + it->n - 1) / ctx->block; j++)
            if (it->blocks[j] < 0 || it->blocks[j] >= ctx->n_blocks)
                return err_set(err, Q35_ERR_ARG, "cpu step: item %d: block %d outside [0, %d)", i, it->blocks[j],
                               ctx->n_blocks);
    }
    const int prev_threads = omp_get_max_threads();
    if (ctx->threads > 0) omp_set_num_threads(ctx->threads);
    const int L = c->num_hidden_layers, K = c->linear_conv_kernel_dim;
    const int64_t conv_n = (int64_t)(K - 1) * c->conv_dim;
    const int64_t S_n = (int64_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    CpuSeq *sq = &ctx->slot;
    float *row = logits;
    for (int i = 0; i < n; i++) {
        const BatchItem *it = &items[i];
        sq->blocks = it->blocks;
        for (int l = 0; l < L; l++) {
            const CpuLayer *cl = &ctx->layers[l];
            if (c->layer_types[l] == LAYER_FULL_ATTN) continue;
            sq->conv[l] = cl->conv_slots + it->slot * conv_n;
            sq->S[l] = cl->S_slots + it->slot * S_n;
            if (it->pos == 0) { /* a new sequence starts from zero state */
                memset(sq->conv[l], 0, (size_t)conv_n * sizeof(float));
                memset(sq->S[l], 0, (size_t)S_n * sizeof(float));
            }
        }
        int done = 0; /* the item in runs cut at its snapshot points, each snapshot taken after its run */
        for (int k = 0; k < it->n_snaps; k++) {
            const int to = it->snap_off[k];
            if (to <= done || to >= it->n) continue;
            run_tokens(ctx, sq, it->tokens + done, to - done, it->pos + done, 0, NULL);
            done = to;
            const int rc = it->snap_id[k] >= 0 ? cpu_snap_copy(ctx, it->slot, it->snap_id[k], 1, err) : 0;
            if (rc) {
                omp_set_num_threads(prev_threads);
                return rc;
            }
        }
        run_tokens(ctx, sq, it->tokens + done, it->n - done, it->pos + done, 0, it->logits ? row : NULL);
        if (it->logits) row += c->vocab_size;
    }
    omp_set_num_threads(prev_threads);
    return 0;
}
