/* decode.cu — the launches of one decode step (MODEL.md §3.7), every phase a fused kernel:
 *   x = E[tok]                                         (prologue of layer 0's first GEMV)
 *   per layer l:
 *     proj = W_in · norm1(x)                           GEMV, prologue: residual add + RMSNorm
 *     mix  = mixer(proj)                               DeltaNet step | attention (cudab kernels)
 *     pa   = W_out · mix                               split-K GEMV (atomic or partials)
 *     x    = bf16(x + bf16(pa));  mlp = bf16(silu(W_g h)) * (W_u h),  h = norm2(x)
 *                                                      GEMV on interleaved gate/up, SwiGLU epilogue
 *     pb   = W_down · mlp                              split-K GEMV
 *   x = bf16(x + bf16(pb)); logits = lm_head · norm(x); id = argmax   (one GEMV + last-block argmax)
 *   [sampling graph: id = sample(logits)]
 * The residual add of each split-K output happens in the NEXT GEMV's prologue (all its blocks
 * recompute the 4 KiB norm; block 0 stores x), so there is no separate add/norm kernel.
 * Fused MLP (ctx->mlp_fused: wherever the shapes allow it; atomic mode
 * only): the gate_up and down GEMVs become one kernel (mlp.cu: x = bf16(x + bf16(pa)), pb += W_down SwiGLU(W_gu norm2(x)), with the
 * transposed copy w_dT of W_down), so a layer is in, mixer, out, mlp; at short contexts (cuda_step_short) a
 * full-attention layer is qkv, attn_o (attention + o_proj, attention.cu cuda_attn_short), mlp.
 * Atomic split-K zeroing contract: an accumulator is zeroed (after pdl_wait) by a kernel that runs
 * strictly after the buffer's last reader and strictly before its adder, and does not read it
 * itself. Each kernel's pdl_wait waits for the previous grid to complete, and grids complete in
 * order (PDL contract in common.cuh), so the zeroes land after every earlier read and before the
 * first add. Who zeroes what (layer l; reader = the prologue that adds the buffer into x):
 *   pa: adder out_proj/o_proj(l); last reader gate_up(l-1) | mlp(l-1); zeroed by in(l), which
 *       runs two phases after gate_up(l-1) (default) or right after mlp(l-1) (fused); the LM head
 *       zeroes it too (read last by the final layer's gate_up | mlp), for the next step's in(0).
 *   pb: adder down(l) | mlp(l); last reader in(l) (pb of layer l-1, or the previous step's LM head
 *       for l = 0); zeroed by gate_up(l) (default: three phases after in(l), one before down(l)) or,
 *       fused, by out_proj/o_proj(l) (two phases after in(l), one before mlp(l)).
 * Deterministic mode writes per-split partials (no zeroing) and never takes the fused MLP. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/common.cuh"
#include "cuda/backend.cuh"

/* ---- the step's first launch: its params in ------------------------------------------------ */

/* StepParams from the host's pinned copy (read through its mapped address) into device memory: one warp (a kernel
 * starts sooner than a memcpy node). The host's lm_key and lm_gmax are 0, so
 * the copy also resets the screen's key and running max (a memset node for them cost 0.8 us). No PDL: it has no
 * predecessor in the step, and the step's first kernel (launched without PDL too) starts after it has completed, so
 * every later kernel may read step_dev before its own pdl_wait, as with the memcpy node. */
__global__ void step_load_k(StepParams *dst, const StepParams *src) {
    static_assert(sizeof(StepParams) % 8 == 0 && sizeof(StepParams) <= 256, "StepParams: whole 8-byte words");
    if (threadIdx.x < sizeof(StepParams) / 8)
        reinterpret_cast<unsigned long long *>(dst)[threadIdx.x] =
            reinterpret_cast<const volatile unsigned long long *>(src)[threadIdx.x];
}

static int cuda_fail(int rc, const char *what, Err *err) {
    return err_set(err, Q35_ERR_CUDA, "cuda: %s: %s", what, cudaGetErrorString((cudaError_t)rc));
}

/* Event before a launch (bench --ops timing). */
static void op_begin(CudaCtx *ctx) {
    if (ctx->rec_ops == 2 && ctx->n_ops < CUDA_MAX_OPS) cudaEventRecord(ctx->ev[ctx->n_ops], ctx->stream);
}
/* Checks a launch and records its name and bytes when recording. */
static int op_end(CudaCtx *ctx, int rc, const char *name, double bytes, Err *err) {
    if (rc) return cuda_fail(rc, name, err);
    if (ctx->rec_ops && ctx->n_ops < CUDA_MAX_OPS) {
        CudaOp *o = &ctx->ops[ctx->n_ops++];
        snprintf(o->name, sizeof o->name, "%s", name);
        o->bytes = bytes;
    }
    return 0;
}

/* ---- probes (eager, synchronous) ---------------------------------------------------------- */

static int probe_fetch(CudaCtx *ctx, float *host, const float *dev, size_t n, Err *err) {
    cudaError_t e = cudaStreamSynchronize(ctx->stream);
    if (e == cudaSuccess) e = cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? 0 : cuda_fail((int)e, "probe readback", err);
}

static int probe_dev(CudaCtx *ctx, const char *name, const float *dev, size_t n, Err *err) {
    int rc = probe_fetch(ctx, ctx->probe_buf, dev, n, err);
    if (!rc) probe(&ctx->probe, name, ctx->probe_buf, n);
    return rc;
}

/* Split-K output as the consumer sees it: out = bf16(sum_s parts[s]); when res is set, also
 * resid = bf16(res + out) (the residual stream after the add), dumped as <l>.resid. */
static int probe_parts(CudaCtx *ctx, int l, const char *what, const float *parts, int n_parts, const float *res,
                       Err *err) {
    const int D = ctx->c->hidden_size;
    float *h = ctx->probe_buf, *p = h + D, *r = p + (size_t)n_parts * D;
    int rc = probe_fetch(ctx, p, parts, (size_t)n_parts * D, err);
    if (!rc && res) rc = probe_fetch(ctx, r, res, (size_t)D, err);
    if (rc) return rc;
    for (int i = 0; i < D; i++) {
        float a = 0.0f;
        for (int s = 0; s < n_parts; s++) a += p[(size_t)s * D + i];
        h[i] = round_bf16(a);
    }
    char name[64];
    snprintf(name, sizeof name, "L%02d.%s", l, what);
    probe(&ctx->probe, name, h, (size_t)D);
    if (res) {
        for (int i = 0; i < D; i++) h[i] = round_bf16(r[i] + h[i]);
        snprintf(name, sizeof name, "L%02d.resid", l);
        probe(&ctx->probe, name, h, (size_t)D);
    }
    return 0;
}

/* ---- ablation (measurement only) ------------------------------------------------------------ */

/* ctx->ablate = "kind,kind,..." (bench --ablate; kinds: cuda_ablate_kinds): those launches are left out of the
 * step, so `qwen35 bench` measures what each kind costs inside the graph (the step's time with and without it).
 * The outputs are garbage then: a measurement aid, never for use. name: "Lnn.kind" or "lm_head". */
/* 1 when the comma-separated list holds the n-character kind. */
static int in_list(const char *list, const char *kind, size_t n) {
    for (const char *t = list; *t;) {
        const char *e = strchr(t, ',');
        const size_t m = e ? (size_t)(e - t) : strlen(t);
        if (m == n && !strncmp(t, kind, n)) return 1;
        t += m + (e != NULL);
    }
    return 0;
}
const char cuda_ablate_kinds[] =
    "qkvzba,qkvz,ba,qkv,deltanet,dnlayer,attention,attn_o,out_proj,o_proj,mlp,gate_up,down,"
    "lm_head,"
    /* the batched step's launches (serve.cu; serve_step --ablate) */
    "sv.in_proj,sv.qkv,sv.paged_prep,sv.attn,sv.dn_prep,sv.dn_state,sv.out_proj,sv.o_proj,sv.gate_up,sv.down,"
    /* the prefill's launches (prefill.cu; the DeltaNet mixer's four kernels through DeltaNetPrefillParams.skip) */
    "pf.embed,pf.norm,pf.final_norm,pf.gemm_qkvzba,pf.gemm_ba,pf.dn_conv,pf.dn_local,pf.dn_scan,pf.dn_norm,pf.gemm_out,"
    "pf.gemm_qkv,pf.attn_prep,pf.attn_flash,pf.gemm_o,pf.gemm_gate_up,pf.gemm_down,pf.gemm_lm_head,pf.lm_screen";

int cuda_ablate_listed(const char *list, const char *kind) { return in_list(list, kind, strlen(kind)); }

/* 1 when every kind in list is known (bench checks its --ablate list with it). */
int cuda_ablate_check(const char *list, char *bad, size_t n) {
    for (const char *t = list; t && *t;) {
        const char *e = strchr(t, ',');
        const size_t m = e ? (size_t)(e - t) : strlen(t);
        if (!in_list(cuda_ablate_kinds, t, m)) {
            snprintf(bad, n, "%.*s", (int)m, t);
            return 0;
        }
        t += m + (e != NULL);
    }
    return 1;
}

static int ablated(const CudaCtx *ctx, const char *name) {
    if (!ctx->ablate || !*ctx->ablate) return 0;
    const char *kind = name[0] == 'L' && name[3] == '.' ? name + 4 : name;
    return in_list(ctx->ablate, kind, strlen(kind));
}

/* ---- one GEMV ------------------------------------------------------------------------------ */

static int gemv(CudaCtx *ctx, const CudaLaunch *lc, MatvecParams *mv, const char *name, Err *err) {
    mv->eps = ctx->c->rms_norm_eps;
    mv->early_trigger = 1;
    if (mv->blocks <= 0)
        mv->blocks = mv->W8 ? cuda_matvec_blocks_fp8(mv->rows, mv->cols, mv->splits, ctx->n_sm)
                            : cuda_matvec_blocks(mv->rows, mv->cols, mv->splits, ctx->n_sm);
    double bytes = (mv->W8 ? 1.0 + 4.0 / 128 : 2.0) * mv->rows * mv->cols + 4.0 * mv->cols * (1 + mv->n_parts) +
                   4.0 * mv->rows * (mv->out_mode == MV_OUT_SPLITK && !mv->atomic ? mv->splits : 1);
    if (ablated(ctx, name)) return 0;
    op_begin(ctx);
    return op_end(ctx, cuda_matvec(mv, lc), name, bytes, err);
}

/* ---- mixers ---------------------------------------------------------------------------------- */

static int deltanet(CudaCtx *ctx, const CudaLaunch *lc, int l, Err *err) {
    const Config *c = ctx->c;
    CudaLayer *ly = &ctx->layers[l];
    DeltanetStepParams p;
    memset(&p, 0, sizeof p);
    p.proj = ctx->proj;
    p.conv_w = ly->conv_w;
    p.conv_ring = ly->conv_ring;
    p.A_log = ly->A_log;
    p.dt_bias = ly->dt_bias;
    p.norm_w = ly->lin_norm;
    p.S = ly->S;
    p.y = ctx->mix;
    p.o = ctx->probe.dir ? ctx->probe_dev : NULL;
    if (ctx->dn_gn) { /* out_proj does the gated norm */
        p.gated_out = 1;
        p.y = NULL;
        p.o = ctx->mix;
    }
    p.step = ctx->step_dev;
    p.Hk = c->linear_num_key_heads;
    p.Hv = c->linear_num_value_heads;
    p.dk = c->linear_key_head_dim;
    p.dv = c->linear_value_head_dim;
    p.K = c->linear_conv_kernel_dim;
    p.eps = c->rms_norm_eps;
    const double state = 4.0 * p.Hv * p.dk * p.dv;
    const double bytes = 2 * state + 2.0 * p.K * c->conv_dim + 4.0 * c->conv_dim * p.K +
                         4.0 * (c->conv_dim + c->value_dim + 2 * p.Hv) + 4.0 * c->value_dim;
    char name[40];
    snprintf(name, sizeof name, "L%02d.deltanet", l);
    if (ablated(ctx, name)) return 0;
    op_begin(ctx);
    int rc = op_end(ctx, cuda_deltanet_step(&p, lc), name, bytes, err);
    if (!rc && ctx->probe.dir) {
        snprintf(name, sizeof name, "L%02d.delta.core", l);
        rc = probe_dev(ctx, name, ctx->dn_gn ? ctx->mix : ctx->probe_dev, (size_t)c->value_dim, err);
    }
    return rc;
}

/* The attention's parameters for layer l (cuda_attn_decode; cuda_attn_short takes the same). */
static void attn_params(CudaCtx *ctx, int l, AttnDecodeParams *p) {
    const Config *c = ctx->c;
    CudaLayer *ly = &ctx->layers[l];
    memset(p, 0, sizeof *p);
    p->qkv = ctx->proj;
    p->q_norm_w = ly->q_norm;
    p->k_norm_w = ly->k_norm;
    p->inv_freq = ctx->inv_freq;
    p->k_cache = ly->Kc;
    p->v_cache = ly->Vc;
    p->out = ctx->mix;
    p->work = ctx->attn_work;
    p->q_out = ctx->probe.dir ? ctx->probe_dev : NULL;
    p->step = ctx->step_dev;
    p->Hq = c->num_attention_heads;
    p->Hkv = c->num_key_value_heads;
    p->hd = c->head_dim;
    p->R = c->rotary_dim;
    p->max_seq = ctx->max_seq;
    p->gated = c->attn_output_gate;
    p->norm_mode = c->family == FAMILY_QWEN35 ? NORM_ZC : NORM_PLAIN;
    p->eps = c->rms_norm_eps;
    p->kv_e4m3 = ctx->kv_e4m3;
}

/* Short contexts (cuda_step_short): the attention and o_proj of layer l as one kernel, y = pa (+=), zeroing
 * pb as o_proj would (the fused MLP adds into it next). */
static int attn_short(CudaCtx *ctx, const CudaLaunch *lc, int l, float *pa, float *pb, Err *err) {
    const Config *c = ctx->c;
    AttnShortParams p;
    memset(&p, 0, sizeof p);
    attn_params(ctx, l, &p.a);
    p.w_o = ctx->layers[l].w_out;
    p.w8_o = ctx->layers[l].w8_out; /* FP8 o_proj: e4m3 rows, per-row scales */
    p.s_o = ctx->layers[l].s_out;
    p.y = pa;
    p.zero = pb;
    p.n_zero = c->hidden_size;
    p.D = c->hidden_size;
    p.max_len = ctx->attn_short;
    const double kv_len = ctx->step_host->pos + 1.0;
    const double bytes = 4.0 * (c->q_proj_rows + 2 * c->kv_dim) + 2.0 * 2 * p.a.Hkv * kv_len * p.a.hd +
                         (p.w8_o ? 1.0 + 4.0 / 128 : 2.0) * c->hidden_size * c->attn_dim + 8.0 * c->hidden_size;
    char name[40];
    snprintf(name, sizeof name, "L%02d.attn_o", l);
    if (ablated(ctx, name)) return 0;
    op_begin(ctx);
    return op_end(ctx, cuda_attn_short(&p, lc), name, bytes, err);
}

static int attention(CudaCtx *ctx, const CudaLaunch *lc, int l, Err *err) {
    const Config *c = ctx->c;
    CudaLayer *ly = &ctx->layers[l];
    AttnDecodeParams p;
    attn_params(ctx, l, &p);
    const double kv_len = ctx->step_host->pos + 1.0;
    const double bytes = 4.0 * (c->q_proj_rows + 2 * c->kv_dim) + 2.0 * 2 * p.Hkv * kv_len * p.hd + 4.0 * c->attn_dim +
                         4.0 * p.Hq * ctx->attn_splits * (p.hd + 2) * 2;
    char name[40];
    snprintf(name, sizeof name, "L%02d.attention", l);
    if (ablated(ctx, name)) return 0;
    op_begin(ctx);
    int rc = op_end(ctx, cuda_attn_decode(&p, lc), name, bytes, err);
    if (rc || !ctx->probe.dir) return rc;
    /* L..attn.q, L..attn.k (the cache row at pos), L..attn.core (gated, before o_proj) */
    snprintf(name, sizeof name, "L%02d.attn.q", l);
    if ((rc = probe_dev(ctx, name, ctx->probe_dev, (size_t)c->attn_dim, err))) return rc;
    const int Hkv = p.Hkv, hd = p.hd, pos = ctx->step_host->pos;
    uint16_t *kb = (uint16_t *)(ctx->probe_buf + c->kv_dim);
    cudaError_t e = cudaMemcpy2D(kb, (size_t)hd * 2, ly->Kc + (size_t)pos * hd, (size_t)ctx->max_seq * hd * 2,
                                 (size_t)hd * 2, (size_t)Hkv, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return cuda_fail((int)e, "probe readback", err);
    for (int i = 0; i < Hkv * hd; i++) ctx->probe_buf[i] = bf16_to_f32(kb[i]);
    snprintf(name, sizeof name, "L%02d.attn.k", l);
    probe(&ctx->probe, name, ctx->probe_buf, (size_t)Hkv * hd);
    snprintf(name, sizeof name, "L%02d.attn.core", l);
    return probe_dev(ctx, name, ctx->mix, (size_t)c->attn_dim, err);
}

/* ---- fused MLP ----------------------------------------------------------------- */

/* x_out = bf16(x + bf16(pa)); pb += W_down · SwiGLU(W_gu · norm2(x_out)) (pb zeroed by out_proj). */
static int mlp_fused(CudaCtx *ctx, const CudaLaunch *lc, int l, const float *x, float *x_out, const float *pa,
                     float *pb, Err *err) {
    const Config *c = ctx->c;
    const CudaLayer *ly = &ctx->layers[l];
    const int D = c->hidden_size, F = c->intermediate_size;
    MlpFusedParams p;
    memset(&p, 0, sizeof p);
    p.w_gu = ly->w_gu;
    p.w_dT = ly->w_dT;
    p.w8_gu = ly->w8_gu; /* FP8: the down weights' scales are W_down's own (ops.h MlpFusedParams s_dT) */
    p.s_gu = ly->s_gu;
    p.w8_dT = ly->w8_dT;
    p.s_dT = ly->w8_dT ? ly->s_down : NULL;
    p.D = D;
    p.F = F;
    p.blocks = cuda_mlp_fused_blocks(F, ctx->n_sm);
    p.x = x;
    p.parts = pa;
    p.n_parts = 1;
    p.x_out = x_out;
    p.norm_w = ly->ln2;
    p.norm_mode = c->family == FAMILY_QWEN35 ? NORM_ZC : NORM_PLAIN;
    p.eps = c->rms_norm_eps;
    p.y = pb;
    p.early_trigger = 1;
    const double bytes = (ly->w8_dT ? 3.0 * (1.0 + 4.0 / 128) : 6.0) * F * D + 4.0 * D * 3 + 4.0 * D;
    char name[40];
    snprintf(name, sizeof name, "L%02d.mlp", l);
    if (ablated(ctx, name)) return 0;
    op_begin(ctx);
    return op_end(ctx, cuda_mlp_fused(&p, lc), name, bytes, err);
}

/* The DeltaNet layer's in_proj, step and out_proj as one kernel (deltanet_layer.cu; ctx->dn_fused): x = embedding
 * (l = 0) or x + pb_prev, pa += W_out mixer(W_in norm1(x)); zeroes zero0 and zero1 ([D] each). */
static int dn_layer(CudaCtx *ctx, const CudaLaunch *lc, int l, const float *x, const float *pb_prev, float *x_out,
                    float *pa, float *zero0, float *zero1, Err *err) {
    const Config *c = ctx->c;
    const CudaLayer *ly = &ctx->layers[l];
    DnLayerParams p;
    memset(&p, 0, sizeof p);
    p.w_in = ly->w_in;
    p.w_out = ly->w_out;
    p.w8_in = ly->w8_in; /* FP8 (cuda_dn_layer_fp8_ok): q/k/v/z rows and W_out as e4m3, b / a bf16 in w_ba */
    p.s_in = ly->s_in;
    p.w_ba = ly->w_ba;
    p.w8_out = ly->w8_out;
    p.s_out = ly->s_out;
    if (l == 0)
        p.embed = ctx->embed;
    else {
        p.x = x;
        p.parts = pb_prev;
        p.n_parts = 1;
    }
    p.x_out = x_out;
    p.ln1 = ly->ln1;
    p.norm_mode = c->family == FAMILY_QWEN35 ? NORM_ZC : NORM_PLAIN;
    p.conv_w = ly->conv_w;
    p.conv_ring = ly->conv_ring;
    p.A_log = ly->A_log;
    p.dt_bias = ly->dt_bias;
    p.norm_w = ly->lin_norm;
    p.S = ly->S;
    p.y = pa;
    p.zero0 = zero0;
    p.zero1 = zero1;
    p.n_zero = c->hidden_size;
    p.step = ctx->step_dev;
    p.D = c->hidden_size;
    p.Hk = c->linear_num_key_heads;
    p.Hv = c->linear_num_value_heads;
    p.dk = c->linear_key_head_dim;
    p.dv = c->linear_value_head_dim;
    p.K = c->linear_conv_kernel_dim;
    p.eps = c->rms_norm_eps;
    if (ctx->dn_fused == 1) {
        p.xbuf = ctx->dn_xbuf;
        p.xcnt = ctx->dn_xcnt;
        p.xcnt_stride = 32;
    }
    const double D = c->hidden_size, state = 4.0 * p.Hv * p.dk * p.dv;
    const double wb =
        ly->w8_in ? (1.0 + 4.0 / 128) * D * (ly->in8_rows + ly->out_cols) + 2.0 * D * (ly->in_rows - ly->in8_rows)
                  : 2.0 * D * (ly->in_rows + ly->out_cols);
    const double bytes = wb + 2 * state + 2.0 * p.K * c->conv_dim + 4.0 * c->conv_dim * p.K + 4.0 * D * 4;
    char name[40];
    snprintf(name, sizeof name, "L%02d.dnlayer", l);
    if (ablated(ctx, name)) return 0;
    op_begin(ctx);
    CudaLaunch lw = *lc;
    int dn_index = 0; /* this layer's place among the DeltaNet layers: the first l2_state_layers keep S in L2 */
    for (int i = 0; i < l; i++) dn_index += ctx->layers[i].type != LAYER_FULL_ATTN;
    if (ctx->l2_state && dn_index < ctx->l2_state_layers) {
        lw.l2_base = ly->S;
        lw.l2_bytes = ctx->l2_state;
    }
    return op_end(ctx, cuda_dn_layer(&p, &lw), name, bytes, err);
}

/* ---- the step ------------------------------------------------------------------------------ */

int cuda_step_short(const CudaCtx *ctx) {
    return ctx->attn_short > 0 && ctx->mlp_fused && !ctx->deterministic && !ctx->probe.dir &&
           ctx->step_host->pos + 1 <= ctx->attn_short;
}

LmScreenParams cuda_lm_screen_params(const CudaCtx *ctx, const MatvecParams *head) {
    LmScreenParams ls;
    memset(&ls, 0, sizeof ls);
    ls.head = *head;
    ls.Wq = ctx->lm_q;
    ls.Wp = ctx->lm_p;
    ls.meta = ctx->lm_meta;
    ls.stats = ctx->lm_stats;
    ls.reg = ctx->lm_screen == 2;
    ls.key = ctx->lm_key;
    ls.gmax = &ctx->step_dev->lm_gmax;
    return ls;
}

int cuda_step_screen(const CudaCtx *ctx, int sample) {
    return ctx->lm_screen && !sample && !ctx->step_host->write_logits && !ctx->probe.dir;
}

int cuda_step_enqueue(CudaCtx *ctx, int sample, Err *err) {
    const Config *c = ctx->c;
    const int D = c->hidden_size, F = c->intermediate_size, L = c->num_hidden_layers, V = c->vocab_size;
    const int nm = c->family == FAMILY_QWEN35 ? NORM_ZC : NORM_PLAIN, det = ctx->deterministic;
    const int probing = ctx->probe.dir != NULL, fused = ctx->mlp_fused && !det;
    /* the fused DeltaNet mixer (deltanet_layer.cu) adds into pa while it reads pb, with no kernel between it and
     * the MLP: so pa and pb alternate between two buffers by layer parity (pa + (l & 1) D, pb likewise),
     * and the zeroing contract (header) becomes: pa of layer l + 1 is zeroed by the first kernel of layer l
     * (dn_layer) or of layer l + 1 (the in_proj GEMV, both buffers) and by the LM head (both); pb of layer l by
     * dn_layer(l), out_proj/o_proj(l) or, at short contexts, attn_o(l) (attention + o_proj in one kernel,
     * cuda_step_short: it adds into pa as o_proj would). */
    const int par = ctx->dn_fused && fused && !probing;
    const int shrt = cuda_step_short(ctx);
    CudaLaunch lc = {ctx->stream, ctx->pdl && !probing && ctx->rec_ops != 2, NULL, 0};
    ctx->n_ops = 0;
    int xi = 0, rc = 0, pb_parts = 1;
    /* the step's params (step_load_k; the copy also zeroes the screen's key and running max) */
    CudaLaunch lc_first = lc; /* step_load_k and the step's first kernel: no PDL (step_load_k's comment) */
    lc_first.pdl = 0;
    op_begin(ctx);
    step_load_k<<<1, 32, 0, ctx->stream>>>(ctx->step_dev, ctx->step_host_dev);
    if ((rc = op_end(ctx, launch_status(ctx->stream), "step_load", 2.0 * sizeof(StepParams), err))) return rc;
    char name[40];
    for (int l = 0; l < L && !rc; l++) {
        CudaLayer *ly = &ctx->layers[l];
        const CudaLaunch *lf = l == 0 ? &lc_first : &lc; /* the layer's first launch */
        const int full = ly->type == LAYER_FULL_ATTN, so = ly->splits_out;
        float *pa = ctx->pa + (par ? (size_t)(l & 1) * D : 0), *pb = ctx->pb + (par ? (size_t)(l & 1) * D : 0);
        float *pb_prev = ctx->pb + (par ? (size_t)((l + 1) & 1) * D : 0);
        MatvecParams mv;
        if (par && !full && ctx->dn_fused) { /* in_proj, step and out_proj in one kernel, then the fused MLP */
            const float *xin = ctx->x[xi];
            if (l == 0) xi = 0;
            const int xo = l == 0 ? 0 : xi ^ 1; /* dn_layer's x_out; the MLP's: xo ^ 1 */
            rc = dn_layer(ctx, lf, l, xin, pb_prev, ctx->x[xo], pa, ctx->pa + (size_t)((l + 1) & 1) * D, pb, err);
            if (rc) break;
            if (l > 0) xi ^= 1;
            if ((rc = mlp_fused(ctx, &lc, l, ctx->x[xi], ctx->x[xi ^ 1], pa, pb, err))) break;
            xi ^= 1;
            pb_parts = 1;
            continue;
        }
        /* proj = W_in · norm1(x), x = embedding (l = 0) or x + down-proj of layer l-1 */
        memset(&mv, 0, sizeof mv);
        mv.W = ly->w_in;
        mv.W8 = ly->w8_in;
        mv.w8_scale = ly->s_in;
        mv.rows = ly->w8_in ? ly->in8_rows : ly->in_rows;
        mv.cols = D;
        mv.splits = 1;
        if (l == 0) {
            mv.in_mode = MV_IN_EMBED;
            mv.embed = ctx->embed;
            mv.step = ctx->step_dev;
            mv.x_out = ctx->x[0];
            xi = 0;
        } else {
            mv.in_mode = MV_IN_RESIDUAL;
            mv.x = ctx->x[xi];
            mv.parts = pb_prev;
            mv.n_parts = pb_parts;
            mv.x_out = ctx->x[xi ^ 1];
            xi ^= 1;
        }
        mv.norm_w = ly->ln1;
        mv.norm_mode = nm;
        if (!det) {
            mv.zero = ctx->pa;
            mv.n_zero = par ? 2 * D : D;
        }
        mv.out_mode = MV_OUT_STORE;
        mv.y = ctx->proj;
        snprintf(name, sizeof name, "L%02d.%s", l, full ? "qkv" : ly->w_ba ? "qkvz" : "qkvzba");
        if ((rc = gemv(ctx, lf, &mv, name, err))) break;
        if (ly->w_ba) { /* FP8 in_proj: its bf16 b / a rows from the same input (the prologue again, no stores) */
            mv.W = ly->w_ba;
            mv.W8 = NULL;
            mv.w8_scale = NULL;
            mv.y = ctx->proj + ly->in8_rows;
            mv.rows = ly->in_rows - ly->in8_rows;
            mv.blocks = 0;
            mv.x_out = NULL;
            mv.zero = NULL;
            mv.n_zero = 0;
            snprintf(name, sizeof name, "L%02d.ba", l);
            if ((rc = gemv(ctx, &lc, &mv, name, err))) break;
        }

        if (full && shrt) { /* attention + o_proj in one kernel (pa += ..., pb zeroed), then the fused MLP */
            if ((rc = attn_short(ctx, &lc, l, pa, pb, err))) break;
            if ((rc = mlp_fused(ctx, &lc, l, ctx->x[xi], ctx->x[xi ^ 1], pa, pb, err))) break;
            xi ^= 1;
            pb_parts = 1;
            continue;
        }
        rc = full ? attention(ctx, &lc, l, err) : deltanet(ctx, &lc, l, err);
        if (rc) break;

        /* pa = W_out · mix (split-K) */
        memset(&mv, 0, sizeof mv);
        mv.W = ly->w_out;
        mv.W8 = ly->w8_out;
        mv.w8_scale = ly->s_out;
        mv.rows = D;
        mv.cols = ly->out_cols;
        mv.splits = so;
        mv.in_mode = MV_IN_VEC;
        mv.x = ctx->mix;
        if (!full && ctx->dn_gn) { /* mix holds o: the gated norm in the prologue (ops.h MV_IN_GATED) */
            mv.in_mode = MV_IN_GATED;
            mv.gate = ctx->proj + c->conv_dim;
            mv.norm_w = ly->lin_norm;
            mv.group = c->linear_value_head_dim;
        }
        mv.out_mode = MV_OUT_SPLITK;
        mv.atomic = !det;
        mv.y = pa;
        if (fused) { /* the fused MLP adds into pb next (header comment) */
            mv.zero = pb;
            mv.n_zero = D;
        }
        snprintf(name, sizeof name, "L%02d.%s", l, full ? "o_proj" : "out_proj");
        if ((rc = gemv(ctx, &lc, &mv, name, err))) break;
        const int pa_parts = det ? so : 1;
        if (probing && (rc = probe_parts(ctx, l, full ? "attn.out" : "delta.out", pa, pa_parts, NULL, err))) break;

        if (fused) { /* x = x + pa; pb += W_down · SwiGLU(W_gu · norm2(x)) in one kernel */
            if ((rc = mlp_fused(ctx, &lc, l, ctx->x[xi], ctx->x[xi ^ 1], pa, pb, err))) break;
            xi ^= 1;
            pb_parts = 1;
            if (probing && (rc = probe_parts(ctx, l, "mlp.out", pb, pb_parts, ctx->x[xi], err))) break;
            continue;
        }

        /* mlp = SwiGLU(W_gu · norm2(x + pa)) */
        memset(&mv, 0, sizeof mv);
        mv.W = ly->w_gu;
        mv.W8 = ly->w8_gu;
        mv.w8_scale = ly->s_gu;
        mv.rows = 2 * F;
        mv.cols = D;
        mv.splits = 1;
        mv.in_mode = MV_IN_RESIDUAL;
        mv.x = ctx->x[xi];
        mv.parts = pa;
        mv.n_parts = pa_parts;
        mv.x_out = ctx->x[xi ^ 1];
        xi ^= 1;
        mv.norm_w = ly->ln2;
        mv.norm_mode = nm;
        if (!det) {
            mv.zero = pb;
            mv.n_zero = D;
        }
        mv.out_mode = MV_OUT_SILU_MUL;
        mv.y = ctx->mlp;
        snprintf(name, sizeof name, "L%02d.gate_up", l);
        if ((rc = gemv(ctx, &lc, &mv, name, err))) break;

        /* pb = W_down · mlp (split-K) */
        memset(&mv, 0, sizeof mv);
        mv.W = ly->w_down;
        mv.W8 = ly->w8_down;
        mv.w8_scale = ly->s_down;
        mv.rows = D;
        mv.cols = F;
        mv.splits = ly->splits_down;
        mv.in_mode = MV_IN_VEC;
        mv.x = ctx->mlp;
        mv.out_mode = MV_OUT_SPLITK;
        mv.atomic = !det;
        mv.y = pb;
        snprintf(name, sizeof name, "L%02d.down", l);
        if ((rc = gemv(ctx, &lc, &mv, name, err))) break;
        pb_parts = det ? ly->splits_down : 1;
        if (probing && (rc = probe_parts(ctx, l, "mlp.out", pb, pb_parts, ctx->x[xi], err))) break;
    }
    if (rc) return rc;

    /* logits = lm_head · norm(x + pb); id = argmax over the tokenizer's ids */
    MatvecParams mv;
    memset(&mv, 0, sizeof mv);
    mv.W = ctx->lm_head;
    mv.rows = V;
    mv.cols = D;
    mv.splits = 1;
    mv.blocks = ctx->lm_blocks;
    mv.in_mode = MV_IN_RESIDUAL;
    mv.x = ctx->x[xi];
    mv.parts = ctx->pb + (par ? (size_t)((L - 1) & 1) * D : 0);
    mv.n_parts = pb_parts;
    mv.norm_w = ctx->final_norm;
    mv.norm_mode = nm;
    mv.h_out = probing ? ctx->probe_dev : NULL;
    if (!det) {
        mv.zero = ctx->pa;
        mv.n_zero = par ? 2 * D : D;
    }
    mv.out_mode = MV_OUT_ARGMAX;
    mv.step = ctx->step_dev;
    mv.logits = ctx->logits;
    mv.n_valid = ctx->n_valid;
    mv.am_val = ctx->am_val;
    mv.am_idx = ctx->am_idx;
    mv.am_count = ctx->am_count;
    mv.work = ctx->lm_dyn ? ctx->lm_work : NULL;
    mv.work_tail = ctx->lm_dyn;
    mv.out_id = ctx->out_id;
    mv.out_max = ctx->out_max;
    if (cuda_step_screen(ctx, sample)) { /* the argmax through the quantized screen (lm_screen.cu): same id and value */
        LmScreenParams ls = cuda_lm_screen_params(ctx, &mv);
        ls.head.logits = NULL;
        ls.head.work = NULL;
        ls.head.work_tail = 0;
        ls.head.eps = ctx->c->rms_norm_eps;
        op_begin(ctx);
        const double qb = ctx->lm_p ? 0.75 * V * D : (double)V * D; /* + ~14 exact bf16 rows per block */
        rc = op_end(ctx, cuda_lm_screen(&ls, &lc), "lm_screen", qb + 16.0 * V, err);
        if (rc) return rc;
    } else if ((rc = gemv(ctx, &lc, &mv, "lm_head", err))) {
        return rc;
    }
    if (ctx->rec_ops) ctx->ops[ctx->n_ops - 1].bytes += 4.0 * V * ctx->step_host->write_logits;
    if (probing) {
        if ((rc = probe_dev(ctx, "final.norm", ctx->probe_dev, (size_t)D, err))) return rc;
        if (ctx->step_host->write_logits && (rc = probe_dev(ctx, "logits", ctx->logits, (size_t)V, err))) return rc;
    }
    if (sample == 2) { /* the logit changes (penalty.cu): out_id moves to the changed row's argmax */
        PenaltyParams pp = {ctx->logits,  1,           ctx->n_valid, (size_t)V, ctx->pen_row, ctx->pen,
                            ctx->pen_raw, ctx->out_id, ctx->pen_lp};
        op_begin(ctx);
        if ((rc = op_end(ctx, cuda_penalty_apply(&pp, &lc), "penalties", 0.0, err))) return rc;
    }
    if (sample) {
        SampleParams sp;
        memset(&sp, 0, sizeof sp);
        sp.logits = ctx->logits;
        sp.n_valid = ctx->n_valid;
        sp.step = ctx->step_dev;
        sp.max_logit = sample == 2 ? NULL : ctx->out_max; /* NULL: the changed row's maximum, l'[out_id] */
        sp.scratch = ctx->sample_scratch;
        sp.out_id = ctx->out_id;
        op_begin(ctx);
        if ((rc = op_end(ctx, cuda_sample(&sp, &lc), "sample", 8.0 * ctx->n_valid, err))) return rc;
    }
    if (ctx->rec_ops == 2) cudaEventRecord(ctx->ev[ctx->n_ops < CUDA_MAX_OPS ? ctx->n_ops : CUDA_MAX_OPS], ctx->stream);
    return 0;
}
