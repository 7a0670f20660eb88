/* prefill.cu — the CUDA backend's forward(n > 1): the prompt goes through the model layer
 * by layer, T tokens at a time (MODEL.md §3.7; kernels in gemm.cu, attention_prefill.cu,
 * deltanet_prefill.cu, rows.cu), in pieces of at most `tmax` tokens so the activation buffers
 * (allocated once in open) stay bounded for any prompt length. Per piece of T tokens at
 * positions P .. P+T-1:
 *   x = E[tokens]                                              fp32 [T][D] (bf16 values)
 *   attention layer:  h = norm(x, ln1) -> proj = h W_in^T (bf16 [T][q|gate, k, v])
 *                     -> attn_prep (q/k norm + RoPE, K/V appended to the cache) -> flash attention
 *                     (+ sigmoid gate) -> x = bf16(x + bf16(act W_o^T))
 *   DeltaNet layer:   h = norm(x, ln1) -> proj = h W_in^T ([qkv | z | b | a]) -> chunked DeltaNet
 *                     (conv ring and state S updated in place) -> x = bf16(x + bf16(act W_out^T))
 *   MLP:              h = norm(x, ln2) -> act = SwiGLU(h W_gu^T) -> x = bf16(x + bf16(act W_down^T))
 *   logits:           rows of x -> final norm -> h -> h lm_head^T (fp32 [rows][V], bf16 values),
 *                     the last row only, or every row in chunks of lm_rows (all_logits).
 * What decode continues from is exactly the sequence state the decode step keeps: the KV cache
 * rows, each DeltaNet layer's conv ring (row p % K = pre-conv input of position p) and S, and
 * n_past; the residual stream is per token, so nothing else is handed over.
 * The launches are written out here (not through cuda_prefill_layer_*) so the bench can put an
 * event around each one. Shapes the kernels do not cover (DeltaNet dk or dv != 128, head_dim
 * outside {32, 64, 128, 256}, widths not multiples of 8) leave ctx->pf NULL: forward(n > 1) then
 * runs n decode steps (backend.cu). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/backend.cuh"

#define PF_TMAX        2048               /* default tokens per piece */
#define PF_LM_BYTES    ((size_t)64 << 20) /* fp32 logits rows per LM-head GEMM: at most this many bytes */
#define PF_MAX_OPS     512                /* launches recorded for the bench breakdown */
#define PF_SKINNY_ROWS 128 /* pieces of at most this many tokens: narrow projections on the skinny GEMM */
#define PF_SKINNY_WIDE 64  /* ... and at most this many (one skinny m-block): every projection on it */
#define PF_DN_C        64  /* DeltaNet chunk length (FLOP count) */
#define PF_GRAPH_B     5   /* prompt graphs: buckets of 16 << b rows, b < PF_GRAPH_B */
#define PF_GRAPH_T     (16 << (PF_GRAPH_B - 1)) /* the largest bucket */

enum { PF_LM_NONE, PF_LM_ROW, PF_LM_SCREEN }; /* pf_run's lm */

/* A prompt graph's inputs, copied in by the graph from pinned memory (one copy up to ids[bucket rows]): the DeltaNet
 * snapshot points inside the prompt, its real row count, its ids padded with id 0 */
typedef struct PfGraphIn {
    DnPtsDev pts;
    int32_t t_real;
    int32_t ids[PF_GRAPH_T];
} PfGraphIn;

struct CudaPrefill {
    int tmax, lm_rows;
    PrefillDims d;
    void *buf;      /* the one allocation below */
    float *x;       /* fp32 [tmax][D] residual stream */
    uint16_t *h;    /* bf16 [tmax][D] */
    uint16_t *proj; /* bf16 [tmax][max in_rows] */
    uint16_t *q;    /* bf16 [tmax][Hq*hd] */
    uint16_t *act;  /* bf16 [tmax][max(F, Hq*hd, Hv*dv)] */
    void *scratch;  /* DeltaNet scratch for tmax tokens */
    float *lm;      /* fp32 [lm_rows][V] */
    int32_t *tok;   /* [max_seq] token ids of the current call */
    float *skw;     /* the skinny GEMM's split-K partial sums (pf_gemm), skw_floats */
    size_t skw_floats;
    int n_sm;
    int split_m; /* GemmParams.split_m of the skinny GEMMs: outside deterministic mode */
    /* h holds norm(x rows [0, h_rows)) with weight h_norm_w: a residual GEMM's reduction computed it (pf_gemm), so the
     * pf_norm that asks for exactly that launches nothing; NULL when h holds anything else */
    const float *h_norm_w;
    int h_rows;
    /* FP8: the tiled GEMMs read bf16 copies of the weights, dequantized a layer ahead on a side stream (pf_copy_*):
     * the copies of the piece's j-th layer with any (copy_mask[l]: bits 1 << CW_*) go to set j % 2 (wset, set_elems
     * each) once the GEMMs of layer j - 2 are done, while the main stream runs the layer before; the main stream
     * waits once per such layer, before its first kernel (a wait is a PDL boundary lost), so the layer's GEMMs, which
     * load weights before their PDL wait, start only after its copies are complete */
    cudaStream_t side;
    cudaEvent_t fork, ready[2], freed[2];
    uint16_t *wset[2], *cur[4]; /* cur: the running layer's copies by CW_* */
    size_t set_elems;
    int *copy_mask, *copy_layers, n_copy_layers, c_used;
    /* bench: an event before every launch; ablate: bench --ablate's list (the "pf." kinds are prefill launches left
     * out, measurement only: the outputs are garbage then), else NULL */
    int rec, n_ops, ev_ready;
    const char *ablate;
    cudaEvent_t ev[PF_MAX_OPS + 1];
    BenchOp ops[PF_MAX_OPS];
    /* Short prompts from position 0 (pf_graph): one graph per bucket of 16 << b rows and LM mode (row, screen),
     * captured at first use, replayed on in_host's inputs (PfGraphIn: the ids padded with id 0 to the bucket, the
     * real row count for DeltaNetPrefillParams.t_real and cuda_row_last, the snapshot points), which the graph copies
     * to in_dev. While pf_run captures one, run_tok, t_real and pts point into in_dev (else run_tok NULL: the ids are
     * tok; t_real and pts NULL). */
    cudaGraphExec_t gx[PF_GRAPH_B][2];
    unsigned char g_failed[PF_GRAPH_B][2];
    PfGraphIn *in_dev, *in_host;
    const int32_t *run_tok, *t_real;
    const DnPtsDev *pts;
};

static int pf_fail(int rc, const char *what, int layer, Err *err) {
    if (layer >= 0)
        return err_set(err, Q35_ERR_CUDA, "cuda prefill: %s (layer %d): %s", what, layer,
                       cudaGetErrorString((cudaError_t)rc));
    return err_set(err, Q35_ERR_CUDA, "cuda prefill: %s: %s", what, cudaGetErrorString((cudaError_t)rc));
}

/* ---- shapes and buffers ----------------------------------------------------------------------- */

static int norm_mode_of(const Config *c) { return c->family == FAMILY_QWEN35 ? NORM_ZC : NORM_PLAIN; }

/* 1 when every prefill kernel supports the model's shapes. */
static int pf_supported(const Config *c) {
    if (c->vocab_size % 8 || c->hidden_size % 8 || c->intermediate_size % 8) return 0;
    if (c->n_full_layers) {
        const int hd = c->head_dim;
        if (hd != 32 && hd != 64 && hd != 128 && hd != 256) return 0;
        if ((c->q_proj_rows + 2 * c->kv_dim) % 8 || c->attn_dim % 8 || c->rotary_dim < 2 || c->rotary_dim % 2 ||
            c->rotary_dim > hd || c->num_key_value_heads < 1 || c->num_attention_heads % c->num_key_value_heads)
            return 0;
    }
    if (c->n_linear_layers) {
        const int Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads, K = c->linear_conv_kernel_dim;
        if (c->linear_key_head_dim != 128 || c->linear_value_head_dim != 128 || Hk < 1 || Hv % Hk || K < 2 || K > 4 ||
            (c->conv_dim + c->value_dim + 2 * Hv) % 8)
            return 0;
    }
    return 1;
}

typedef struct PfArena {
    char *base;
    size_t off;
} PfArena;
static void *pf_carve(PfArena *a, size_t bytes) {
    const size_t o = (a->off + 255) & ~(size_t)255;
    a->off = o + bytes;
    return a->base ? a->base + o : NULL;
}

static GemmParams pf_proj_shape(const CudaPrefill *pf, const CudaLayer *ly, int which, int T);

static void pf_layout(CudaCtx *ctx, CudaPrefill *pf, PfArena *a) {
    size_t nh, nproj, nq, nact, nscr;
    cuda_prefill_buffer_sizes(&pf->d, pf->tmax, &nh, &nproj, &nq, &nact, &nscr);
    pf->x = (float *)pf_carve(a, sizeof(float) * (size_t)pf->tmax * pf->d.D);
    pf->h = (uint16_t *)pf_carve(a, 2 * nh);
    pf->proj = (uint16_t *)pf_carve(a, 2 * nproj);
    pf->q = (uint16_t *)pf_carve(a, 2 * (nq > 0 ? nq : 1));
    pf->act = (uint16_t *)pf_carve(a, 2 * nact);
    pf->scratch = pf_carve(a, nscr > 0 ? nscr : 1);
    pf->lm = (float *)pf_carve(a, sizeof(float) * (size_t)pf->lm_rows * ctx->c->vocab_size);
    pf->tok = (int32_t *)pf_carve(a, sizeof(int32_t) * (size_t)ctx->max_seq);
    pf->in_dev = (PfGraphIn *)pf_carve(a, sizeof(PfGraphIn));
    /* pf_gemm's skinny projections: N = D, K = F, Hq hd or Hv dv, at most PF_SKINNY_ROWS rows */
    const PrefillDims *d = &pf->d;
    const int M = pf->tmax < PF_SKINNY_ROWS ? pf->tmax : PF_SKINNY_ROWS, ks[3] = {d->F, d->Hq * d->hd, d->Hv * d->dv};
    pf->skw_floats = 0;
    for (int i = 0; i < 3; i++) {
        if (ks[i] <= 0) continue;
        const size_t w = cuda_gemm_skinny_work(M, d->D, ks[i], pf->n_sm, GEMM_EPI_ADD_F32, 1),
                     wn = cuda_gemm_skinny_work(M, d->D, ks[i], pf->n_sm, GEMM_EPI_ADD_F32_NORM, 1);
        pf->skw_floats = w > pf->skw_floats ? w : pf->skw_floats;
        pf->skw_floats = wn > pf->skw_floats ? wn : pf->skw_floats;
    }
    /* ... and every projection that pf_skinny may give the skinny GEMM at <= M rows, so that the check of its work
     * against skw_floats never depends on the row count (a prompt graph's bucket takes the paths of its prompt) */
    for (int l = 0; l < ctx->c->num_hidden_layers; l++)
        for (int w = CW_IN; w <= CW_DOWN; w++) {
            GemmParams g = pf_proj_shape(pf, &ctx->layers[l], w, M), t;
            const int parts = cuda_layer_gemm_tail(&ctx->layers[l], w, &g, &t) ? 2 : 1;
            for (int k = 0; k < parts; k++) {
                const GemmParams *x = k ? &t : &g;
                const size_t wk = cuda_gemm_skinny_work(M, x->N, x->K, pf->n_sm, x->epi, x->glu_group);
                pf->skw_floats = wk > pf->skw_floats ? wk : pf->skw_floats;
            }
        }
    pf->skw = (float *)pf_carve(a, sizeof(float) * (pf->skw_floats > 0 ? pf->skw_floats : 1));
    pf->set_elems = 0;
    for (int l = 0; ctx->fp8 && l < ctx->c->num_hidden_layers; l++) { /* the largest layer's FP8 projections */
        size_t n = 0;
        for (int w = CW_IN; w <= CW_DOWN; w++) {
            const GemmParams g = pf_proj_shape(pf, &ctx->layers[l], w, 1);
            if (g.w8) n += (size_t)g.N * g.K;
        }
        pf->set_elems = n > pf->set_elems ? n : pf->set_elems;
    }
    for (int i = 0; i < 2; i++) pf->wset[i] = pf->set_elems ? (uint16_t *)pf_carve(a, 2 * pf->set_elems) : NULL;
}

void cuda_prefill_dims(const CudaCtx *ctx, PrefillDims *d) {
    const Config *c = ctx->c;
    memset(d, 0, sizeof *d);
    d->D = c->hidden_size;
    d->F = c->intermediate_size;
    d->Hq = c->num_attention_heads;
    d->Hkv = c->num_key_value_heads;
    d->hd = c->head_dim;
    d->R = c->rotary_dim;
    d->attn_gate = c->attn_output_gate;
    d->norm_mode = norm_mode_of(c);
    if (c->n_linear_layers) {
        d->Hk = c->linear_num_key_heads;
        d->Hv = c->linear_num_value_heads;
        d->dk = c->linear_key_head_dim;
        d->dv = c->linear_value_head_dim;
        d->K = c->linear_conv_kernel_dim;
    }
    d->glu_group = 1;
    d->max_seq = ctx->max_seq;
    d->gemm_algo = GEMM_ALGO_AUTO;
    d->eps = c->rms_norm_eps;
}

int cuda_prefill_open(CudaCtx *ctx, int piece, Err *err) {
    const Config *c = ctx->c;
    ctx->pf = NULL;
    if (!pf_supported(c)) return 0;
    CudaPrefill *pf = (CudaPrefill *)calloc(1, sizeof *pf);
    if (!pf) return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    const int want = piece > 0 ? piece : PF_TMAX;
    pf->tmax = want < ctx->max_seq ? want : ctx->max_seq;
    const size_t row_bytes = sizeof(float) * (size_t)c->vocab_size;
    const size_t lm = PF_LM_BYTES / row_bytes;
    pf->lm_rows = lm < 1 ? 1 : lm > (size_t)pf->tmax ? pf->tmax : (int)lm;
    cuda_prefill_dims(ctx, &pf->d);
    pf->n_sm = ctx->n_sm;
    pf->split_m = !ctx->deterministic;
    PfArena a = {NULL, 0};
    pf_layout(ctx, pf, &a);
    cudaError_t e = cudaMalloc(&pf->buf, a.off);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(pf);
        return err_set(err, Q35_ERR_OOM, "GPU out of memory: the prefill buffers (%d tokens per piece) need %.0f MiB",
                       want < ctx->max_seq ? want : ctx->max_seq, a.off / 1048576.0);
    }
    a.base = (char *)pf->buf;
    a.off = 0;
    pf_layout(ctx, pf, &a);
    ctx->pf = pf;
    if (cudaMallocHost((void **)&pf->in_host, sizeof(PfGraphIn)) != cudaSuccess) {
        (void)cudaGetLastError(); /* no prompt graphs: every prompt runs eager */
        pf->in_host = NULL;
    }
    if (pf->set_elems) { /* the side stream of the weight copies */
        pf->copy_mask = (int *)calloc((size_t)c->num_hidden_layers, sizeof(int));
        pf->copy_layers = (int *)calloc((size_t)c->num_hidden_layers, sizeof(int));
        e = pf->copy_mask && pf->copy_layers ? cudaStreamCreateWithFlags(&pf->side, cudaStreamNonBlocking)
                                             : cudaErrorMemoryAllocation;
        cudaEvent_t *ev[5] = {&pf->fork, &pf->ready[0], &pf->ready[1], &pf->freed[0], &pf->freed[1]};
        for (int i = 0; i < 5 && e == cudaSuccess; i++) e = cudaEventCreateWithFlags(ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            cuda_prefill_close(ctx);
            return err_set(err, Q35_ERR_CUDA, "cuda prefill: the weight copies' stream: %s", cudaGetErrorString(e));
        }
    }
    return 0;
}

void cuda_prefill_graphs_drop(CudaCtx *ctx) {
    CudaPrefill *pf = ctx ? ctx->pf : NULL;
    if (!pf) return;
    for (int b = 0; b < PF_GRAPH_B; b++)
        for (int m = 0; m < 2; m++) {
            if (pf->gx[b][m]) cudaGraphExecDestroy(pf->gx[b][m]);
            pf->gx[b][m] = NULL;
        }
}

void cuda_prefill_close(CudaCtx *ctx) {
    CudaPrefill *pf = ctx ? ctx->pf : NULL;
    if (!pf) return;
    for (int i = 0; i <= PF_MAX_OPS && pf->ev_ready; i++)
        if (pf->ev[i]) cudaEventDestroy(pf->ev[i]);
    const cudaEvent_t ev[5] = {pf->fork, pf->ready[0], pf->ready[1], pf->freed[0], pf->freed[1]};
    for (int i = 0; i < 5; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    if (pf->side) cudaStreamDestroy(pf->side);
    for (int b = 0; b < PF_GRAPH_B; b++)
        for (int m = 0; m < 2; m++)
            if (pf->gx[b][m]) cudaGraphExecDestroy(pf->gx[b][m]);
    if (pf->in_host) cudaFreeHost(pf->in_host);
    free(pf->copy_mask);
    free(pf->copy_layers);
    if (pf->buf) cudaFree(pf->buf);
    free(pf);
    ctx->pf = NULL;
}

/* ---- launches ---------------------------------------------------------------------------------- */

/* 1 when bench --ablate leaves the launch `what` out ("pf." what in its list). */
static int pf_ablated(const CudaPrefill *pf, const char *what) {
    if (!pf->ablate) return 0;
    char kind[40];
    snprintf(kind, sizeof kind, "pf.%s", what);
    return cuda_ablate_listed(pf->ablate, kind);
}

static void op_begin(CudaPrefill *pf, cudaStream_t s) {
    if (pf->rec && pf->n_ops < PF_MAX_OPS) cudaEventRecord(pf->ev[pf->n_ops], s);
}
static int op_end(CudaPrefill *pf, int rc, int layer, const char *what, double flop, double bytes, Err *err) {
    if (rc) return pf_fail(rc, what, layer, err);
    if (pf->rec && pf->n_ops < PF_MAX_OPS) {
        BenchOp *o = &pf->ops[pf->n_ops++];
        if (layer >= 0)
            snprintf(o->name, sizeof o->name, "L%02d.%s", layer, what);
        else
            snprintf(o->name, sizeof o->name, "%s", what);
        o->flop = flop;
        o->bytes = bytes;
        o->us = 0;
    }
    return 0;
}

/* A short piece's narrow residual projections (down, out_proj, o_proj: N = D) go to the skinny GEMM: the tiled GEMM
 * gives them N / 128 CTAs (8 on 0.8B), each streaming a 128-row slice of W alone, where the skinny GEMM splits K over
 * the whole GPU. The wide ones (>= n_sm / 4 tiles: in_proj, gate_up, qkv, the LM head) go there too while the piece
 * is one skinny m-block (<= 64 tokens): each weight is streamed once, and sk_plan gives wide weights one split, so
 * no reduction. Longer pieces keep them on the tiled GEMM, which reads each weight once per 128 rows. */
static int pf_skinny(const CudaPrefill *pf, const GemmParams *g) {
    const int tiles = ((g->M + 127) / 128) * ((g->N + 127) / 128), narrow = 4 * tiles < pf->n_sm;
    const int shape = g->N >= 8 && g->N % 8 == 0 && (!g->w8 || (g->K % 16 == 0 && g->ldw % 16 == 0)); /* the kernel's */
    return shape && (g->M <= PF_SKINNY_WIDE || (g->M <= PF_SKINNY_ROWS && narrow)) &&
           (g->epi != GEMM_EPI_ADD_F32 || narrow) &&
           cuda_gemm_skinny_work(g->M, g->N, g->K, pf->n_sm, g->epi, 1) <= pf->skw_floats;
}

/* Y = X W^T with g's weight: bf16 (g->w), or FP8 (g->w8: only where pf_skinny takes it). norm_w (a residual GEMM,
 * y = x + X W^T with x the residual stream): the RMSNorm that comes next, h = norm(y) with that weight, fused into the
 * skinny GEMM's split reduction where pf_skinny takes the GEMM (bitwise the separate norm kernel; one launch fewer). */
static int pf_gemm(CudaPrefill *pf, const CudaLaunch *lc, const GemmParams *g, const float *norm_w, int layer,
                   const char *what, Err *err) {
    const int swiglu = g->epi == GEMM_EPI_SWIGLU_BF16, ycols = swiglu ? g->N / 2 : g->N;
    const double yb = g->epi == GEMM_EPI_ADD_F32 ? 8.0 : g->epi == GEMM_EPI_F32 ? 4.0 : 2.0;
    const double bytes = 2.0 * g->M * g->K + (g->w8 ? 1.0 : 2.0) * g->N * g->K + yb * g->M * ycols;
    const int skinny = pf_skinny(pf, g),
              fuse = skinny && norm_w && g->epi == GEMM_EPI_ADD_F32 && g->y == pf->x && g->N == pf->d.D &&
                     g->N <= 2048 &&
                     cuda_gemm_skinny_work(g->M, g->N, g->K, pf->n_sm, GEMM_EPI_ADD_F32_NORM, 1) <= pf->skw_floats;
    GemmParams sg = *g;
    sg.split_m = pf->split_m;
    pf->h_norm_w = NULL; /* h is about to be rewritten, or x (whose norm it holds) */
    if (pf_ablated(pf, what)) {
        if (fuse) pf->h_norm_w = norm_w, pf->h_rows = g->M; /* as if it ran: no norm launch in its place */
        return 0;
    }
    op_begin(pf, lc->stream);
    const int rc = fuse ? cuda_gemm_skinny_norm(&sg, norm_w, pf->d.norm_mode, pf->d.eps, pf->h, pf->skw, pf->skw_floats,
                                                pf->n_sm, lc)
                   : skinny ? cuda_gemm_skinny(&sg, pf->skw, pf->skw_floats, pf->n_sm, lc)
                   : g->w8  ? (int)cudaErrorInvalidValue
                            : cuda_gemm_bf16(g, lc);
    if (!rc && fuse) pf->h_norm_w = norm_w, pf->h_rows = g->M;
    return op_end(pf, rc, layer, what, 2.0 * g->M * (double)g->N * g->K, bytes, err);
}

/* ---- FP8: the tiled GEMMs' bf16 weight copies, dequantized ahead on a side stream ---------------------------- */

/* The GEMM pf_proj runs for layer ly's projection `which` on a T-row piece: shape, epilogue and weight (x, y unset) */
static GemmParams pf_proj_shape(const CudaPrefill *pf, const CudaLayer *ly, int which, int T) {
    const PrefillDims *d = &pf->d;
    GemmParams g;
    memset(&g, 0, sizeof g);
    g.M = T;
    g.N = which == CW_IN ? ly->in_rows : which == CW_GU ? 2 * d->F : d->D;
    g.K = which == CW_OUT ? ly->out_cols : which == CW_DOWN ? d->F : d->D;
    g.ldx = g.K;
    g.ldy = which == CW_GU ? d->F : g.N;
    g.epi = which == CW_IN ? GEMM_EPI_BF16 : which == CW_GU ? GEMM_EPI_SWIGLU_BF16 : GEMM_EPI_ADD_F32;
    g.glu_group = which == CW_GU;
    g.algo = d->gemm_algo;
    cuda_layer_gemm_w(ly, which, g.K, &g);
    return g;
}

/* 1 when the FP8 weight g (pf_proj's, cuda_layer_gemm_w applied) runs on the skinny GEMM as it is */
static int pf_fp8_skinny(const CudaPrefill *pf, const CudaLayer *ly, int which, const GemmParams *g) {
    GemmParams s = *g, t;
    const int tail = cuda_layer_gemm_tail(ly, which, &s, &t);
    return pf_skinny(pf, &s) && (!tail || pf_skinny(pf, &t));
}

/* The copies of layer l (copy_mask[l]) into set j % 2 on the side stream, after the GEMMs of the layer that used
 * the set before (j - 2). */
static int pf_copy_issue(CudaCtx *ctx, CudaPrefill *pf, int j, Err *err) {
    const int b = j % 2, l = pf->copy_layers[j];
    cudaError_t e = j >= 2 ? cudaStreamWaitEvent(pf->side, pf->freed[b], 0) : cudaSuccess;
    if (e != cudaSuccess) return pf_fail((int)e, "weight copy wait", l, err);
    const CudaLaunch ls = {pf->side, 0, NULL, 0};
    size_t off = 0;
    int rc = 0;
    for (int w = CW_IN; w <= CW_DOWN && !rc; w++) {
        if (!(pf->copy_mask[l] & (1 << w))) continue;
        const GemmParams g = pf_proj_shape(pf, &ctx->layers[l], w, 1); /* the offsets pf_copy_enter hands out */
        const uint16_t *m = NULL;
        size_t n = 0;
        rc = cuda_layer_w_bf16(ctx, &ctx->layers[l], w, &ls, pf->wset[b] + off, &m, &n);
        if (!rc && n != (size_t)g.N * g.K) rc = (int)cudaErrorInvalidValue;
        off += (size_t)g.N * g.K;
    }
    if (!rc) rc = (int)cudaEventRecord(pf->ready[b], pf->side);
    return rc ? pf_fail(rc, "fp8_to_bf16", l, err) : 0;
}

/* Which projections of which layers the GEMMs of a T-row piece read as bf16 copies (copy_mask, copy_layers); returns
 * how many layers have any. */
static int pf_copy_plan(CudaCtx *ctx, CudaPrefill *pf, int T) {
    pf->n_copy_layers = pf->c_used = 0;
    if (!pf->side) return 0;
    for (int l = 0; l < ctx->c->num_hidden_layers; l++) {
        pf->copy_mask[l] = 0;
        for (int w = CW_IN; w <= CW_DOWN; w++) {
            const GemmParams g = pf_proj_shape(pf, &ctx->layers[l], w, T);
            if (g.w8 && !pf_fp8_skinny(pf, &ctx->layers[l], w, &g)) pf->copy_mask[l] |= 1 << w;
        }
        if (pf->copy_mask[l]) pf->copy_layers[pf->n_copy_layers++] = l;
    }
    return pf->n_copy_layers;
}

/* At the start of a T-row piece: which projections of which layers its GEMMs read as copies, the side stream
 * ordered after what the main stream holds, the first two layers' copies issued. */
static int pf_copy_start(CudaCtx *ctx, CudaPrefill *pf, int T, cudaStream_t main, Err *err) {
    if (!pf_copy_plan(ctx, pf, T)) return 0;
    cudaError_t e = cudaEventRecord(pf->fork, main);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(pf->side, pf->fork, 0);
    if (e != cudaSuccess) return pf_fail((int)e, "weight copy stream", -1, err);
    int rc = 0;
    for (int j = 0; j < 2 && j < pf->n_copy_layers && !rc; j++) rc = pf_copy_issue(ctx, pf, j, err);
    return rc;
}

/* Before layer l's first kernel: the main stream waits for its copies; cur[] points at them. */
static int pf_copy_enter(CudaCtx *ctx, CudaPrefill *pf, int l, cudaStream_t main, Err *err) {
    if (!pf->n_copy_layers || !pf->copy_mask[l]) return 0;
    const int j = pf->c_used;
    if (j >= pf->n_copy_layers || pf->copy_layers[j] != l)
        return err_set(err, Q35_ERR_CUDA, "cuda prefill: weight copies of layer %d out of order", l);
    const cudaError_t e = cudaStreamWaitEvent(main, pf->ready[j % 2], 0);
    if (e != cudaSuccess) return pf_fail((int)e, "weight copy wait", l, err);
    size_t off = 0;
    for (int w = CW_IN; w <= CW_DOWN; w++) {
        pf->cur[w] = NULL;
        if (!(pf->copy_mask[l] & (1 << w))) continue;
        const GemmParams g = pf_proj_shape(pf, &ctx->layers[l], w, 1);
        pf->cur[w] = pf->wset[j % 2] + off;
        off += (size_t)g.N * g.K;
    }
    return 0;
}

/* After layer l's last kernel: its set is free for the copies two layers ahead. */
static int pf_copy_leave(CudaCtx *ctx, CudaPrefill *pf, int l, cudaStream_t main, Err *err) {
    if (!pf->n_copy_layers || !pf->copy_mask[l]) return 0;
    const int j = pf->c_used++;
    const cudaError_t e = cudaEventRecord(pf->freed[j % 2], main);
    if (e != cudaSuccess) return pf_fail((int)e, "weight copy", l, err);
    return j + 2 < pf->n_copy_layers ? pf_copy_issue(ctx, pf, j + 2, err) : 0;
}

/* pf_gemm with layer ly's projection `which` as the weight (g's x, y, shape and epilogue given). An FP8 weight goes
 * to the skinny GEMM as it is where that takes the piece (as in the batched step: the FP8 DeltaNet in_proj's bf16
 * b / a rows as a second skinny GEMM into the columns after its FP8 rows); the tiled GEMM reads a bf16 copy. */
static int pf_proj(CudaCtx *ctx, CudaPrefill *pf, const CudaLaunch *lc, GemmParams g, const CudaLayer *ly, int which,
                   const float *norm_w, int layer, const char *what, Err *err) {
    cuda_layer_gemm_w(ly, which, g.K, &g);
    if (g.w8) {
        if (pf_fp8_skinny(pf, ly, which, &g)) {
            GemmParams s = g, t;
            const int tail = cuda_layer_gemm_tail(ly, which, &s, &t);
            int rc = pf_gemm(pf, lc, &s, tail ? NULL : norm_w, layer, what, err);
            if (!rc && tail) rc = pf_gemm(pf, lc, &t, NULL, layer, "gemm_ba", err);
            return rc;
        }
        if (!pf->n_copy_layers || !(pf->copy_mask[layer] & (1 << which)) || !pf->cur[which])
            return err_set(err, Q35_ERR_CUDA, "cuda prefill: no bf16 copy of layer %d's projection %d", layer, which);
        g.w = pf->cur[which];
        g.w8 = NULL;
        g.w8_scale = NULL;
    }
    return pf_gemm(pf, lc, &g, norm_w, layer, what, err);
}

/* h = bf16 norm of rows [0, T) of x (fp32 [T][D]); no launch where the residual GEMM that wrote x computed exactly
 * that in its reduction (pf_gemm's norm_w). The row norm kernels read only the (immutable) weights before pdl_wait(),
 * so with PDL they may start while the kernel that wrote x drains. */
static int pf_norm(CudaPrefill *pf, const CudaLaunch *lc, const float *x, const float *w, int T, int layer,
                   const char *what, Err *err) {
    if (pf->h_norm_w && pf->h_norm_w == w && x == pf->x && T == pf->h_rows) {
        pf->h_norm_w = NULL;
        return 0; /* the residual GEMM's reduction wrote it */
    }
    RmsnormRowsParams np = {x, w, pf->h, T, pf->d.D, pf->d.norm_mode, pf->d.eps};
    if (pf_ablated(pf, what)) return 0;
    op_begin(pf, lc->stream);
    return op_end(pf, cuda_rmsnorm_rows_bf16(&np, lc), layer, what, 4.0 * T * pf->d.D, 6.0 * T * pf->d.D, err);
}

/* x += down(SwiGLU(gate_up(norm(x, ln2)))) */
static int pf_mlp(CudaCtx *ctx, CudaPrefill *pf, const CudaLaunch *lc, const CudaLayer *ly, int T, int l, Err *err) {
    const int D = pf->d.D, F = pf->d.F, algo = pf->d.gemm_algo;
    int rc = pf_norm(pf, lc, pf->x, ly->ln2, T, l, "norm", err);
    if (rc) return rc;
    const GemmParams gu = {pf->h, NULL, pf->act, T, 2 * F, D, D, D, F, GEMM_EPI_SWIGLU_BF16, 1, algo};
    if ((rc = pf_proj(ctx, pf, lc, gu, ly, CW_GU, NULL, l, "gemm_gate_up", err))) return rc;
    const GemmParams dn = {pf->act, NULL, pf->x, T, D, F, F, F, D, GEMM_EPI_ADD_F32, 0, algo};
    const float *next = l + 1 < ctx->c->num_hidden_layers ? ctx->layers[l + 1].ln1 : NULL; /* the next layer's norm */
    return pf_proj(ctx, pf, lc, dn, ly, CW_DOWN, next, l, "gemm_down", err);
}

static int pf_attn_layer(CudaCtx *ctx, CudaPrefill *pf, const CudaLaunch *lc, int l, int T, int P, Err *err) {
    const PrefillDims *d = &pf->d;
    const CudaLayer *ly = &ctx->layers[l];
    const int D = d->D, hd = d->hd, nq = d->Hq * hd * (d->attn_gate ? 2 : 1), n = ly->in_rows, no = ly->out_cols;
    int rc = pf_norm(pf, lc, pf->x, ly->ln1, T, l, "norm", err);
    if (rc) return rc;
    const GemmParams qkv = {pf->h, NULL, pf->proj, T, n, D, D, D, n, GEMM_EPI_BF16, 0, d->gemm_algo};
    if ((rc = pf_proj(ctx, pf, lc, qkv, ly, CW_IN, NULL, l, "gemm_qkv", err))) return rc;
    AttnPrepParams pp = {pf->proj,
                         n,
                         d->attn_gate ? 2 * hd : hd,
                         nq,
                         nq + d->Hkv * hd,
                         ly->q_norm,
                         ly->k_norm,
                         ctx->inv_freq,
                         pf->q,
                         ly->Kc,
                         ly->Vc,
                         T,
                         P,
                         d->Hq,
                         d->Hkv,
                         hd,
                         d->R,
                         d->max_seq,
                         d->norm_mode,
                         d->eps,
                         ctx->kv_e4m3};
    op_begin(pf, lc->stream);
    rc = pf_ablated(pf, "attn_prep") ? 0
                                     : op_end(pf, cuda_attn_prep(&pp, lc), l, "attn_prep", 0.0,
                                              2.0 * T * n + 2.0 * T * (d->Hq + 2 * d->Hkv) * hd, err);
    if (rc) return rc;
    AttnPrefillParams ap = {pf->q,      ly->Kc,
                            ly->Vc,     d->attn_gate ? pf->proj + hd : NULL,
                            n,          2 * hd,
                            pf->act,    T,
                            P,          d->Hq,
                            d->Hkv,     hd,
                            d->max_seq, 1.0f / sqrtf((float)hd)};
    const double pairs = (double)T * P + 0.5 * (double)T * (T + 1);
    op_begin(pf, lc->stream);
    rc = pf_ablated(pf, "attn_flash")
             ? 0
             : op_end(pf, cuda_attn_prefill(&ap, lc), l, "attn_flash", 4.0 * d->Hq * hd * pairs,
                      2.0 * T * d->Hq * hd * 3 + 4.0 * d->Hkv * (double)(P + T) * hd, err);
    if (rc) return rc;
    const GemmParams o = {pf->act, NULL, pf->x, T, D, no, no, no, D, GEMM_EPI_ADD_F32, 0, d->gemm_algo};
    if ((rc = pf_proj(ctx, pf, lc, o, ly, CW_OUT, ly->ln2, l, "gemm_o", err))) return rc;
    return pf_mlp(ctx, pf, lc, ly, T, l, err);
}

/* FLOPs of the chunked DeltaNet mixer for T tokens (per v-head and token: A = K K^T, W, U, the
 * state pass V' = W S and S += K^T V', the output Q S, (Q K^T) and P V'), plus the conv. */
static double dn_flops(const PrefillDims *d, int conv_dim, double T) {
    const double C = PF_DN_C, dk = d->dk, dv = d->dv;
    return d->Hv * T * (6 * C * dk + 4 * C * dv + 6 * dk * dv) + 2.0 * d->K * conv_dim * T;
}

void cuda_dn_snap_points(DeltaNetPrefillParams *dp, const DnSnaps *ps, int q) {
    dp->n_pts = 0;
    dp->pt_bf16 = ps ? ps->state_bf16 : 0;
    for (int i = 0; ps && i < ps->n; i++) {
        if (ps->at[i] < dp->pos || ps->at[i] >= dp->pos + dp->T) continue;
        char *S = ps->base[i] + (size_t)q * ps->lstride;
        dp->pt_off[dp->n_pts] = ps->at[i] - dp->pos;
        dp->pt_state[dp->n_pts] = (float *)S;
        dp->pt_ring[dp->n_pts++] = (uint16_t *)(S + ps->ring_off);
    }
}

static int pf_dn_layer(CudaCtx *ctx, CudaPrefill *pf, const CudaLaunch *lc, int l, int T, int P, Err *err) {
    const PrefillDims *d = &pf->d;
    const CudaLayer *ly = &ctx->layers[l];
    const int D = d->D, vd = d->Hv * d->dv, cd = 2 * d->Hk * d->dk + vd, n = ly->in_rows;
    int rc = pf_norm(pf, lc, pf->x, ly->ln1, T, l, "norm", err);
    if (rc) return rc;
    const GemmParams in = {pf->h, NULL, pf->proj, T, n, D, D, D, n, GEMM_EPI_BF16, 0, d->gemm_algo};
    if ((rc = pf_proj(ctx, pf, lc, in, ly, CW_IN, NULL, l, "gemm_qkvzba", err))) return rc;
    DeltaNetPrefillParams dp;
    memset(&dp, 0, sizeof dp);
    dp.proj = pf->proj;
    dp.ld_proj = n;
    dp.z_off = cd;
    dp.b_off = cd + vd;
    dp.a_off = cd + vd + d->Hv;
    dp.conv_w = ly->conv_w;
    dp.A_log = ly->A_log;
    dp.dt_bias = ly->dt_bias;
    dp.norm_w = ly->lin_norm;
    dp.conv_ring = ly->conv_ring;
    dp.state = ly->S;
    dp.y = pf->act;
    dp.scratch = pf->scratch;
    dp.T = T;
    dp.pos = P;
    dp.Hk = d->Hk;
    dp.Hv = d->Hv;
    dp.dk = d->dk;
    dp.dv = d->dv;
    dp.K = d->K;
    dp.eps = d->eps;
    dp.t_real = pf->t_real;
    int q = 0; /* the layer's DeltaNet ordinal */
    for (int k = 0; k < l; k++) q += ctx->layers[k].type != LAYER_FULL_ATTN;
    if (pf->pts) { /* a prompt graph: its points on the device */
        dp.pts = pf->pts;
        dp.pts_q = q;
    } else if (ctx->pf_snaps) {
        cuda_dn_snap_points(&dp, ctx->pf_snaps, q);
    }
    const double scr = (double)cuda_deltanet_prefill_scratch(NULL, NULL, T, d->Hk, d->Hv, d->dk, d->dv);
    static const char *const dn_kinds[4] = {"dn_conv", "dn_local", "dn_scan", "dn_norm"};
    for (int k = 0; k < 4; k++) dp.skip |= pf_ablated(pf, dn_kinds[k]) << k;
    op_begin(pf, lc->stream);
    rc = op_end(pf, cuda_deltanet_prefill(&dp, lc), l, "deltanet", dn_flops(d, cd, T),
                2.0 * T * n + 2.0 * T * vd + 2.0 * scr + 8.0 * d->Hv * d->dk * d->dv, err);
    if (rc) return rc;
    const GemmParams o = {pf->act, NULL, pf->x, T, D, vd, vd, vd, D, GEMM_EPI_ADD_F32, 0, d->gemm_algo};
    if ((rc = pf_proj(ctx, pf, lc, o, ly, CW_OUT, ly->ln2, l, "gemm_out", err))) return rc;
    return pf_mlp(ctx, pf, lc, ly, T, l, err);
}

/* Logits of rows [r0, r0+m) of the piece into pf->lm, then (host != NULL) to host[m][V]. */
static int pf_logits(CudaCtx *ctx, CudaPrefill *pf, const CudaLaunch *lc, int r0, int m, float *host, Err *err) {
    const int D = pf->d.D, V = ctx->c->vocab_size;
    int rc = pf_norm(pf, lc, pf->x + (size_t)r0 * D, ctx->final_norm, m, -1, "final_norm", err);
    if (rc) return rc;
    GemmParams g = {pf->h, ctx->lm_head, pf->lm, m, V, D, D, D, V, GEMM_EPI_F32, 0, pf->d.gemm_algo};
    if ((rc = pf_gemm(pf, lc, &g, NULL, -1, "gemm_lm_head", err))) return rc;
    if (!host) return 0;
    /* pageable destination: returns once the copy is done, so pf->lm is free again */
    cudaError_t e = cudaMemcpyAsync(host, pf->lm, sizeof(float) * (size_t)m * V, cudaMemcpyDeviceToHost, lc->stream);
    return e == cudaSuccess ? 0 : pf_fail((int)e, "logits readback", -1, err);
}

/* The greedy id of row r of the piece: the final norm and the LM head's argmax through the quantized screen
 * (lm_screen.cu), the decode step's kernel, into *ctx->lm_key (cuda_lm_key_id). The screen reads the 6-bit head (~195
 * MB at the 0.8B shape) instead of the bf16 one (509 MB); its id is the bf16 GEMV's argmax of the row, bit for bit
 * (the full head's GEMM sums the row in another order, so a near-tie may fall the other way). */
static int pf_screen(CudaCtx *ctx, CudaPrefill *pf, const CudaLaunch *lc, int r, Err *err) {
    const int D = pf->d.D, V = ctx->c->vocab_size;
    MatvecParams head;
    memset(&head, 0, sizeof head);
    head.W = ctx->lm_head;
    head.rows = V;
    head.cols = D;
    head.splits = 1;
    head.blocks = ctx->lm_blocks;
    head.in_mode = MV_IN_RESIDUAL; /* no parts: the row of x itself, normed in the prologue */
    head.x = pf->x + (size_t)r * D;
    head.norm_w = ctx->final_norm;
    head.norm_mode = pf->d.norm_mode;
    head.eps = pf->d.eps;
    head.out_mode = MV_OUT_ARGMAX;
    head.step = ctx->step_dev;
    head.n_valid = ctx->n_valid;
    const LmScreenParams ls = cuda_lm_screen_params(ctx, &head);
    const double qb = ctx->lm_p ? 0.75 * V * D : (double)V * D;
    if (pf_ablated(pf, "lm_screen")) return 0;
    op_begin(pf, lc->stream);
    return op_end(pf, cuda_lm_screen(&ls, lc), -1, "lm_screen", 2.0 * V * D, qb + 16.0 * V, err);
}

/* The whole prefill of pf->tok[0 .. n) at positions pos .. pos+n-1, enqueued on ctx->stream.
 * logits: NULL, [V] or [n][V] (all_logits); lm: PF_LM_ROW runs the LM head on the last row even when logits is NULL
 * (bench), PF_LM_SCREEN (logits NULL) its greedy id through the screen instead (pf_screen). Does not synchronise at
 * the end. */
static int pf_run(CudaCtx *ctx, int n, int pos, int all_logits, float *logits, int lm, Err *err) {
    CudaPrefill *pf = ctx->pf;
    const Config *c = ctx->c;
    const int V = c->vocab_size, D = c->hidden_size;
    const CudaLaunch lc = {ctx->stream, ctx->pdl, NULL, 0}; /* every prefill kernel starts with pdl_begin() */
    int rc = 0;
    if (lm == PF_LM_SCREEN) { /* the screen's key and running max start from 0 (a decode step's params copy resets
                                 them there); zeroed here, so that no copy stands between the last layer and it */
        cudaError_t e = cudaMemsetAsync(&ctx->step_dev->lm_key, 0, sizeof ctx->step_dev->lm_key, lc.stream);
        if (e == cudaSuccess) e = cudaMemsetAsync(&ctx->step_dev->lm_gmax, 0, sizeof ctx->step_dev->lm_gmax, lc.stream);
        if (e != cudaSuccess) return pf_fail((int)e, "screen reset", -1, err);
    }
    for (int p0 = 0; p0 < n && !rc; p0 += pf->tmax) {
        const int T = n - p0 < pf->tmax ? n - p0 : pf->tmax, P = pos + p0;
        if ((rc = pf_copy_start(ctx, pf, T, lc.stream, err))) break;
        EmbedRowsParams ep = {(pf->run_tok ? pf->run_tok : pf->tok) + p0, ctx->embed, pf->x, T, D, V};
        pf->h_norm_w = NULL;
        op_begin(pf, lc.stream);
        if (!pf_ablated(pf, "embed") &&
            (rc = op_end(pf, cuda_embed_rows(&ep, &lc), -1, "embed", 0.0, 6.0 * T * D, err)))
            break;
        for (int l = 0; l < c->num_hidden_layers && !rc; l++) {
            if ((rc = pf_copy_enter(ctx, pf, l, lc.stream, err))) break;
            rc = ctx->layers[l].type == LAYER_FULL_ATTN ? pf_attn_layer(ctx, pf, &lc, l, T, P, err)
                                                        : pf_dn_layer(ctx, pf, &lc, l, T, P, err);
            if (!rc) rc = pf_copy_leave(ctx, pf, l, lc.stream, err);
        }
        if (rc) break;
        if (pf->t_real && (logits || lm)) { /* a padded prompt graph: its last real row to row T - 1 */
            op_begin(pf, lc.stream);
            if ((rc = op_end(pf, cuda_row_last(pf->x, pf->t_real, T, D, &lc), -1, "row_last", 0.0, 8.0 * D, err)))
                break;
        }
        if (logits && all_logits) {
            for (int r0 = 0; r0 < T && !rc; r0 += pf->lm_rows) {
                const int m = T - r0 < pf->lm_rows ? T - r0 : pf->lm_rows;
                rc = pf_logits(ctx, pf, &lc, r0, m, logits + (size_t)(p0 + r0) * V, err);
            }
        } else if (lm == PF_LM_SCREEN && !logits && p0 + T == n) {
            rc = pf_screen(ctx, pf, &lc, T - 1, err);
        } else if ((logits || lm) && p0 + T == n) {
            rc = pf_logits(ctx, pf, &lc, T - 1, 1, logits, err);
        }
    }
    if (pf->rec && pf->n_ops <= PF_MAX_OPS) cudaEventRecord(pf->ev[pf->n_ops], lc.stream);
    return rc;
}

static int pf_upload_tokens(CudaCtx *ctx, const int *tokens, int n, Err *err) {
    static_assert(sizeof(int) == sizeof(int32_t), "token ids are copied as int32");
    cudaError_t e =
        cudaMemcpyAsync(ctx->pf->tok, tokens, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice, ctx->stream);
    return e == cudaSuccess ? 0 : pf_fail((int)e, "token upload", -1, err);
}

/* The bucket of a prompt of n ids at pos whose prefill can replay a graph (pf_graph), else -1: from position 0, at
 * most PF_GRAPH_T ids, one piece, its LM head on the last row only (lm PF_LM_ROW or PF_LM_SCREEN),
 * graphs allowed (not --no-graph, deterministic mode, probes, bench timing or ablation), and the bucket's KV rows
 * within the context. An FP8 model's bf16 weight copies (pf_copy_*) are captured with the rest: the side stream
 * forks from the capturing stream at pf_copy_start and every copy is joined back by the layer that waits for it. */
static int pf_graph_bucket(CudaCtx *ctx, CudaPrefill *pf, int n, int pos, int lm) {
    if (pos != 0 || n < 1 || n > PF_GRAPH_T || (lm != PF_LM_ROW && lm != PF_LM_SCREEN) || !pf->in_host ||
        ctx->no_graph || ctx->deterministic || ctx->probe.dir || pf->rec || pf->ablate)
        return -1;
    int b = 0;
    while ((16 << b) < n) b++;
    const int Tb = 16 << b;
    if (Tb > pf->tmax || Tb > ctx->max_seq || pf->g_failed[b][lm == PF_LM_SCREEN]) return -1;
    return b;
}

/* The prompt graph of bucket b and LM mode lm, captured at first use (pf_run of 16 << b rows on the inputs in_dev);
 * NULL where the capture failed (the bucket then runs eager from then on). */
static cudaGraphExec_t pf_graph(CudaCtx *ctx, CudaPrefill *pf, int b, int lm) {
    const int m = lm == PF_LM_SCREEN;
    if (pf->gx[b][m] || pf->g_failed[b][m]) return pf->gx[b][m];
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    Err cap = {0};
    int rc = (int)cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal);
    if (!rc) { /* the reset's scratch zeroed, the pinned ids copied in, then the prefill */
        rc = cuda_state_zero(ctx, CUDA_DIRTY_SCRATCH, &cap);
        if (!rc)
            rc = (int)cudaMemcpyAsync(pf->in_dev, pf->in_host, offsetof(PfGraphIn, ids) + sizeof(int32_t) * (16 << b),
                                      cudaMemcpyHostToDevice, ctx->stream);
        pf->run_tok = pf->in_dev->ids;
        pf->t_real = &pf->in_dev->t_real;
        pf->pts = &pf->in_dev->pts;
        if (!rc) rc = pf_run(ctx, 16 << b, 0, 0, NULL, lm, &cap);
        pf->run_tok = pf->t_real = NULL;
        pf->pts = NULL;
        const cudaError_t e = cudaStreamEndCapture(ctx->stream, &g);
        if (!rc) rc = (int)e;
    }
    if (!rc) rc = (int)cudaGraphInstantiate(&x, g, 0);
    if (g) cudaGraphDestroy(g);
    if (rc) { /* a slower path, not an error: said once per bucket and mode */
        (void)cudaGetLastError();
        pf->g_failed[b][m] = 1;
        fprintf(stderr,
                "warning: cuda prefill: the prompt graph of %d rows could not be captured (%s); such prompts run "
                "eager\n",
                16 << b, cap.msg[0] ? cap.msg : cudaGetErrorString((cudaError_t)rc));
        return NULL;
    }
    return pf->gx[b][m] = x;
}

/* cuda_prefill_forward, with dev_row the last row's logits left on the device (*dev_row, fp32 [V], valid until the
 * next prefill) instead of copied to logits, with id (and no logits) the last row's greedy id through the screen */
static int pf_forward(CudaCtx *ctx, const int *tokens, int n, int pos, int all_logits, float *logits,
                      const float **dev_row, int *id, Err *err) {
    const int V = ctx->c->vocab_size;
    if (pos != ctx->n_past)
        return err_set(err, Q35_ERR_ARG, "cuda forward: pos %d but the sequence holds %d tokens (reset to restart)",
                       pos, ctx->n_past);
    if (n < 1 || (int64_t)pos + n > ctx->max_seq)
        return err_set(err, Q35_ERR_CONTEXT, "cuda forward: %d + %d tokens exceed the context of %d", pos, n,
                       ctx->max_seq);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return err_set(err, Q35_ERR_ARG, "cuda forward: token id %d at index %d outside [0, %d)", tokens[i], i, V);
    CudaPrefill *pf = ctx->pf;
    const int lm = id ? PF_LM_SCREEN : dev_row ? PF_LM_ROW : PF_LM_NONE;
    /* as a graph, the last row's logits for the host are the row graph's, then copied */
    const int glm = lm != PF_LM_NONE ? lm : logits && !all_logits ? PF_LM_ROW : PF_LM_NONE;
    const int b = pf_graph_bucket(ctx, pf, n, pos, glm);
    /* from position 0 the DeltaNet prefill reads neither S nor the conv rings, and writes both whole: a reset's
     * scratch is zeroed (by the prompt graph itself), S and the rings are not */
    int rc = pos > 0 ? cuda_state_clean(ctx, err) : 0;
    if (rc) return rc;
    const cudaGraphExec_t gx = b >= 0 ? pf_graph(ctx, pf, b, glm) : NULL;
    if (gx) { /* the graph's inputs (it copies them in): the points inside the prompt, its length, its padded ids */
        const int Tb = 16 << b;
        PfGraphIn *in = pf->in_host;
        const DnSnaps *ps = ctx->pf_snaps;
        memset(&in->pts, 0, sizeof in->pts);
        for (int i = 0; ps && i < ps->n; i++) {
            if (ps->at[i] >= n) continue; /* pos 0: the points in [0, n) */
            in->pts.off[in->pts.n] = ps->at[i];
            in->pts.base[in->pts.n++] = (unsigned long long)(uintptr_t)ps->base[i];
        }
        in->pts.lstride = ps ? ps->lstride : 0;
        in->pts.ring_off = ps ? ps->ring_off : 0;
        in->pts.bf16 = ps ? ps->state_bf16 : 0;
        in->t_real = n;
        memcpy(in->ids, tokens, sizeof(int32_t) * (size_t)n);
        memset(in->ids + n, 0, sizeof(int32_t) * (size_t)(Tb - n));
        cudaError_t e = cudaGraphLaunch(gx, ctx->stream);
        if (e == cudaSuccess && logits) /* pageable destination: returns once the copy is done */
            e = cudaMemcpyAsync(logits, pf->lm, sizeof(float) * (size_t)V, cudaMemcpyDeviceToHost, ctx->stream);
        if (e != cudaSuccess) rc = pf_fail((int)e, "prompt graph", -1, err);
    } else {
        if (pos == 0 && (ctx->state_dirty & CUDA_DIRTY_SCRATCH)) rc = cuda_state_zero(ctx, CUDA_DIRTY_SCRATCH, err);
        if (!rc) rc = pf_upload_tokens(ctx, tokens, n, err);
        if (!rc) rc = pf_run(ctx, n, pos, all_logits, logits, lm, err);
    }
    if (pos == 0) ctx->state_dirty = 0;
    if (!rc && id) {
        const cudaError_t k =
            cudaMemcpyAsync(ctx->key_host, ctx->lm_key, sizeof *ctx->key_host, cudaMemcpyDeviceToHost, ctx->stream);
        if (k != cudaSuccess) rc = pf_fail((int)k, "id readback", -1, err);
    }
    cudaError_t e = cudaStreamSynchronize(ctx->stream);
    if (rc) return rc;
    if (e != cudaSuccess) return pf_fail((int)e, "prefill", -1, err);
    ctx->n_past += n;
    if (dev_row) *dev_row = ctx->pf->lm;
    if (id) *id = cuda_lm_key_id(*ctx->key_host, NULL);
    return 0;
}

int cuda_prefill_forward(CudaCtx *ctx, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err) {
    return pf_forward(ctx, tokens, n, pos, all_logits, logits, NULL, NULL, err);
}

int cuda_prefill_forward_dev(CudaCtx *ctx, const int *tokens, int n, int pos, const float **dev_row, Err *err) {
    return pf_forward(ctx, tokens, n, pos, 0, NULL, dev_row, NULL, err);
}

int cuda_prefill_forward_greedy(CudaCtx *ctx, const int *tokens, int n, int pos, int *id, Err *err) {
    if (!ctx->lm_screen || !ctx->lm_key) return err_set(err, Q35_ERR_ARG, "cuda prefill: no LM head screen");
    return pf_forward(ctx, tokens, n, pos, 0, NULL, NULL, id, err);
}

/* ---- bench ------------------------------------------------------------------------------------- */

/* Useful FLOPs of a prefill of n tokens from position 0 with last-row logits (MODEL.md §6.3):
 * 2 x linear-layer parameters x n, causal attention 4 Hq hd n(n+1)/2 per layer, the chunked
 * DeltaNet (dn_flops) and conv per DeltaNet layer, the LM head for one row. */
static double pf_flops(const CudaCtx *ctx, int n) {
    const Config *c = ctx->c;
    const PrefillDims *d = &ctx->pf->d;
    const double D = c->hidden_size, F = c->intermediate_size;
    double lin = 0, mix = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CudaLayer *ly = &ctx->layers[l];
        lin += (double)ly->in_rows * D + D * ly->out_cols + 3.0 * F * D;
        if (ly->type == LAYER_FULL_ATTN)
            mix += 4.0 * d->Hq * d->hd * 0.5 * (double)n * (n + 1);
        else
            mix += dn_flops(d, c->conv_dim, n);
    }
    return 2.0 * lin * n + mix + 2.0 * c->vocab_size * D;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Our GEMM (cuda_gemm_bf16, AUTO algo; cuBLAS is not used anywhere) on 4096^3 bf16. */
static int gemm_rate(CudaCtx *ctx, BenchResult *res, Err *err) {
    const int M = 4096, N = 4096, K = 4096;
    uint16_t *x = NULL, *w = NULL, *y = NULL;
    if (cudaMalloc(&x, (size_t)M * K * 2) != cudaSuccess || cudaMalloc(&w, (size_t)N * K * 2) != cudaSuccess ||
        cudaMalloc(&y, (size_t)M * N * 2) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(x), cudaFree(w), cudaFree(y);
        return 0; /* no room: leave 0 */
    }
    const CudaLaunch lc = {ctx->stream, 0, NULL, 0};
    FillParams fx = {x, (int64_t)M * K, 11, 1.0f}, fw = {w, (int64_t)N * K, 12, 1.0f};
    int rc = cuda_fill_bf16(&fx, &lc);
    if (!rc) rc = cuda_fill_bf16(&fw, &lc);
    GemmParams g = {x, w, y, M, N, K, K, K, N, GEMM_EPI_BF16, 0, GEMM_ALGO_AUTO};
    cudaEvent_t a = NULL, b = NULL;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    double t[5];
    for (int i = 0; i < 3 && !rc; i++) rc = cuda_gemm_bf16(&g, &lc); /* warm-up */
    for (int bt = 0; bt < 5 && !rc; bt++) {
        cudaEventRecord(a, ctx->stream);
        for (int i = 0; i < 10 && !rc; i++) rc = cuda_gemm_bf16(&g, &lc);
        cudaEventRecord(b, ctx->stream);
        cudaError_t e = cudaEventSynchronize(b);
        if (!rc && e != cudaSuccess) rc = (int)e;
        float f = 0;
        cudaEventElapsedTime(&f, a, b);
        t[bt] = f / 10.0;
    }
    if (!rc) {
        qsort(t, 5, sizeof t[0], cmp_double);
        res->gemm_tflops = 2.0 * M * N * (double)K / (t[2] * 1e-3) / 1e12;
        res->gemm_m = M;
        res->gemm_n = N;
        res->gemm_k = K;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(x), cudaFree(w), cudaFree(y);
    return rc ? pf_fail(rc, "bench gemm", -1, err) : 0;
}

static int clear_state(CudaCtx *ctx, Err *err) {
    cudaError_t e = cudaMemsetAsync((char *)ctx->arena + ctx->state_off, 0, ctx->state_bytes, ctx->stream);
    return e == cudaSuccess ? 0 : pf_fail((int)e, "state clear", -1, err);
}

/* One timed prefill of n tokens from position 0 (state cleared first, outside the timing). */
static int time_prefill(CudaCtx *ctx, int n, cudaEvent_t a, cudaEvent_t b, double *ms, Err *err) {
    int rc = clear_state(ctx, err);
    if (rc) return rc;
    cudaEventRecord(a, ctx->stream);
    rc = pf_run(ctx, n, 0, 0, NULL, PF_LM_ROW, err);
    cudaEventRecord(b, ctx->stream);
    cudaError_t e = cudaEventSynchronize(b);
    if (rc) return rc;
    if (e != cudaSuccess) return pf_fail((int)e, "prefill", -1, err);
    float f = 0;
    cudaEventElapsedTime(&f, a, b);
    *ms = f;
    return 0;
}

/* The prefill of n tokens from position 0 captured into a graph, then replayed (state cleared before each replay,
 * outside the timing): the median of `runs` replays in *ms, 0 when the capture fails. */
static int time_prefill_graph(CudaCtx *ctx, int n, int runs, cudaEvent_t a, cudaEvent_t b, double *ms, Err *err) {
    *ms = 0;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    if (cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    Err cap = {0};
    const int rc = pf_run(ctx, n, 0, 0, NULL, PF_LM_ROW, &cap);
    const cudaError_t e = cudaStreamEndCapture(ctx->stream, &g);
    if (rc || e != cudaSuccess || cudaGraphInstantiate(&x, g, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return 0;
    }
    double t[5];
    int r = 0, rc2 = 0;
    for (; r < runs && r < 5 && !rc2; r++) {
        if ((rc2 = clear_state(ctx, err))) break;
        cudaEventRecord(a, ctx->stream);
        cudaGraphLaunch(x, ctx->stream);
        cudaEventRecord(b, ctx->stream);
        const cudaError_t se = cudaEventSynchronize(b);
        if (se != cudaSuccess) rc2 = pf_fail((int)se, "prefill graph", -1, err);
        float f = 0;
        cudaEventElapsedTime(&f, a, b);
        t[r] = f;
    }
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    if (rc2) return rc2;
    qsort(t, (size_t)r, sizeof t[0], cmp_double);
    *ms = t[r / 2];
    return 0;
}

int cuda_prefill_bench(CudaCtx *ctx, const BenchRequest *rq, BenchResult *res, Err *err) {
    memset(res, 0, sizeof *res);
    CudaPrefill *pf = ctx->pf;
    if (!pf)
        return err_set(err, Q35_ERR_UNSUPPORTED,
                       "cuda bench: the prefill kernels do not cover this model's shapes (forward(n > 1) runs decode "
                       "steps)");
    if (ctx->probe.dir) return err_set(err, Q35_ERR_ARG, "cuda bench: not with probes");
    const int np = rq->n_prefill < 8 ? rq->n_prefill : 8;
    int max_len = 1;
    for (int i = 0; i < np; i++) {
        if (rq->prefill_lens[i] < 1 || rq->prefill_lens[i] > ctx->max_seq)
            return err_set(err, Q35_ERR_CONTEXT, "cuda bench: prefill of %d tokens does not fit the context of %d",
                           rq->prefill_lens[i], ctx->max_seq);
        if (rq->prefill_lens[i] > max_len) max_len = rq->prefill_lens[i];
    }
    cudaDeviceProp prop;
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        snprintf(res->device, sizeof res->device, "%.63s", prop.name);
    res->n_sm = ctx->n_sm;
    res->prefill_piece = pf->tmax;
    int rc = gemm_rate(ctx, res, err);
    if (rc) return rc;

    /* token ids: the same pseudo-random pattern as `qwen35 bench` */
    const int V = ctx->c->vocab_size, nv = ctx->n_valid < 50000 ? ctx->n_valid : 50000;
    int *ids = (int *)malloc(sizeof(int) * (size_t)max_len);
    if (!ids) return err_set(err, Q35_ERR_OOM, "cuda bench: out of host memory");
    for (int i = 0; i < max_len; i++)
        ids[i] = (int)((1103515245u * (unsigned)i + 12345u) % (unsigned)(nv < V ? nv : V));
    rc = pf_upload_tokens(ctx, ids, max_len, err);
    free(ids);
    if (rc) return rc;

    pf->ablate = rq->ablate && *rq->ablate ? rq->ablate : NULL; /* checked by be_bench; until the end of this call:
                                                                  * no return before */
    cudaEvent_t a = NULL, b = NULL;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    double warm = 0;
    rc = time_prefill(ctx, max_len < 256 ? max_len : 256, a, b, &warm, err); /* first launches, smem attributes */
    for (int i = 0; i < np && !rc; i++) {
        const int n = rq->prefill_lens[i], runs = n <= 2048 ? 5 : n <= 8192 ? 3 : 1, pdl0 = ctx->pdl;
        double t[5], t0[5];
        for (int r = 0; r < runs && !rc; r++) rc = time_prefill(ctx, n, a, b, &t[r], err);
        ctx->pdl = 0;
        for (int r = 0; r < runs && !rc; r++) rc = time_prefill(ctx, n, a, b, &t0[r], err);
        ctx->pdl = pdl0;
        if (rc) break;
        qsort(t, (size_t)runs, sizeof t[0], cmp_double);
        qsort(t0, (size_t)runs, sizeof t0[0], cmp_double);
        Q35BenchPrefill *o = &res->prefill[res->n_prefill++];
        o->tokens = n;
        o->ms = t[runs / 2];
        o->ms_nopdl = t0[runs / 2];
        if (n <= pf->tmax && (rc = time_prefill_graph(ctx, n, runs, a, b, &o->ms_graph, err))) break;
        o->tflop = pf_flops(ctx, n) / 1e12;
    }

    /* per-launch breakdown of one eager prefill (one piece) */
    if (!rc && rq->ops) {
        /* the longest requested length up to 2048 (else 2048), as one piece */
        int n = 0;
        for (int i = 0; i < np; i++)
            if (rq->prefill_lens[i] <= 2048 && rq->prefill_lens[i] > n) n = rq->prefill_lens[i];
        if (!n) n = 2048;
        if (n > pf->tmax) n = pf->tmax;
        if (!pf->ev_ready) {
            for (int i = 0; i <= PF_MAX_OPS && !rc; i++)
                if (cudaEventCreate(&pf->ev[i]) != cudaSuccess)
                    rc = pf_fail((int)cudaGetLastError(), "events", -1, err);
            pf->ev_ready = !rc;
        }
        if (!rc) rc = clear_state(ctx, err);
        if (!rc) {
            pf->rec = 1;
            pf->n_ops = 0;
            rc = pf_run(ctx, n, 0, 0, NULL, PF_LM_ROW, err);
            pf->rec = 0;
            cudaError_t e = cudaStreamSynchronize(ctx->stream);
            if (!rc && e != cudaSuccess) rc = pf_fail((int)e, "prefill", -1, err);
        }
        if (!rc) {
            res->ops_tokens = n;
            res->n_ops = pf->n_ops < BENCH_MAX_OPS ? pf->n_ops : BENCH_MAX_OPS;
            for (int i = 0; i < res->n_ops; i++) {
                res->ops[i] = pf->ops[i];
                float f = 0;
                cudaEventElapsedTime(&f, pf->ev[i], pf->ev[i + 1]);
                res->ops[i].us = 1e3 * f;
            }
        }
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    pf->ablate = NULL;
    return rc;
}
