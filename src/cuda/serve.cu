/* serve.cu — the CUDA backend's batched step for many sequences (backend.h serve_sizes / serve_open / serve_close /
 * step_batch; docs/SERVE_ENGINE.md). A step's items are flattened into T rows (a decode item 1 row, a prefill chunk n
 * rows) and run layer by layer like the prefill path (prefill.cu), with what differs per row done per row:
 *   x = E[tokens]                                                        fp32 [T][D] (bf16 values)
 *   attention:  h = norm(x) -> proj = h W_in^T -> paged_prep (q/k norm + RoPE at each row's position, K/V into the
 *               paged pools through the row's block table) -> decode rows: paged_attn (each row over positions
 *               0 .. pos of its own sequence, + gate); prefill chunks: the sequence's K/V gathered from the pools
 *               into the single-sequence layout (paged_gather) and forward()'s flash kernel (cuda_attn_prefill)
 *               -> x = bf16(x + bf16(act W_o^T))
 *   DeltaNet:   h = norm(x) -> proj = h W_in^T -> decode rows (items of 1 token): the recurrent step on their slots'
 *               S and conv windows (dn_batch_step) + gated norm; prefill chunks (n > 1): cuda_deltanet_prefill on the
 *               item's slot -> x = bf16(x + bf16(act W_out^T))
 *   MLP:        as prefill.cu
 *   logits:     the rows with logits = 1 gathered, final norm, h lm_head^T (fp32, bf16 values) -> host rows.
 * Batch invariance: every kernel above computes a row (or an item) alone. The decode rows come first in a pass and
 * their GEMMs are the skinny kernel's (gemm_skinny.cu: split-K from the weight's shape alone, partials added in split
 * order); the prefill chunks' rows are the prefill GEMM's, one tile family whatever M (serve_algo: the 128 x 128 TMA
 * tiles on sm_90, cooperative or ping-pong by size, both m64n128k16 wgmma over K in the same order); the LM head is
 * the skinny kernel's for every row. So a row's sums do not depend on the other rows.
 * Items are packed into passes of at most `tmax` rows; an item longer than tmax is cut into pieces of tmax (as
 * forward() cuts a prompt), which depends on the item alone.
 * Memory: slot s of the slot pool holds, per DeltaNet layer, S fp32 [Hv][dk][dv] then the conv ring bf16 [K][conv_dim]
 * (the decode step's ring: row p % K = pre-conv input of position p; K rows, not K - 1, so the prefill and step
 * kernels use it unchanged); per full-attention layer a K pool and a V pool bf16 [n_blocks][Hkv][block][hd].
 * Decode passes (every row one token of a running sequence) replay a CUDA graph per bucket of row counts (sv_buckets),
 * padded with rows on a spare slot and block; passes with prefill chunks or new sequences launch eagerly. Needs the
 * prefill kernels' shapes (ctx->pf); else serve_sizes says unsupported. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/backend.cuh"
#include "cuda/serve_ops.h"

#define SV_TMAX       2048      /* rows per pass (the prefill piece) */
#define SV_MAX_PIECES 256       /* pieces per pass: up to 256 decode rows share one read of the weights */
#define SV_N_BUCKETS  19        /* decode-pass graphs: row counts 1 .. 256 (sv_buckets) */
#define SV_PEN_CAP    (1 << 20) /* logit-change entries per pass (at least the vocabulary: a lone row always fits) */
/* a pass's LM head kind after sv_smp_fill's 0 / 1 / 2: every row greedy, picked in the LM head's epilogue
 * (sv_lm_argmax); every row greedy with no logprob, at most 64 rows: picked through the int8 screen (sv_lm_screen) */
#define SV_LM_ARGMAX 3
#define SV_LM_SCREEN 4

struct CudaServe {
    ServeLayout lay; /* the pools hold one slot and one block more: the spare ones of padded graph rows */
    int tmax, lm_rows, major, n_sm;
    PrefillDims d;
    size_t slot_bytes;        /* one slot: n_dn layer pieces of lstride bytes */
    size_t lstride;           /* one slot's piece of one DeltaNet layer: its S, then its conv ring */
    int n_dn;                 /* DeltaNet layers */
    size_t *S_off, *ring_off; /* [L]: byte offsets of slot 0's S and ring of layer l in sv->slots (DeltaNet layers) */
    size_t pool_bytes;        /* one K (or V) pool of one full-attention layer */
    char *slots;              /* layer-major (slot_layout): (n_slots + 1) * slot_bytes */
    char *snaps;              /* n_snaps * slot_bytes: prefix-cache snapshots of slots (NULL when none) */
    char *host_snaps;         /* n_host_snaps * slot_bytes, pinned host memory: the cache's host tier (NULL: none) */
    char *kv;                 /* per full-attention layer (in layer order) its K pool, then its V pool */
    int *kv_index;            /* [L]: index of layer l among the full-attention layers */
    void *buf;                /* activations (below) */
    float *x, *xg, *lm;
    uint16_t *h, *proj, *q, *act, *o;
    uint16_t *kc, *vc; /* a prefill chunk's sequence gathered from the pools: bf16 [Hkv][max_seq][hd] each */
    void *scratch;
    float *pa_work; /* cuda_paged_attn's split partials: pa_work_n floats */
    size_t pa_work_n;
    void *am_work; /* cuda_rows_argmax's chunk bests: am_work_bytes */
    size_t am_work_bytes;
    float *skw; /* cuda_gemm_skinny's split-K partial sums: skw_floats */
    size_t skw_floats;
    int32_t
        *ints; /* device: tok, pos, tab, dn_row, dn_slot, out_row [tmax] each, then tables, then [tmax] argmax ids */
    int32_t *ints_host;
    size_t n_ints;
    StepParams *smp, *smp_host; /* [lm_rows] the logits rows' sampling settings (temperature 0: argmax), device and
                                 * pinned host */
    PenaltyRow *pen_row, *pen_row_host; /* [lm_rows] the rows' logit changes (penalty.cu), device and pinned host */
    SamplePenalty *pen, *pen_host;      /* [pen_cap] their entries, device and pinned host; a pass uses pen_used */
    float *pen_raw;                     /* [pen_cap] penalty.cu's raw logits of the entries */
    int pen_cap, pen_used;
    void *smp_scratch; /* [lm_rows] cuda_sample's scratch, zeroed at open */
    size_t smp_scratch_bytes;
    /* decode passes by bucket, [1]: with sampled rows, [2]: and logit changes, [SV_LM_ARGMAX]: greedy rows only,
     * picked in the LM head, [SV_LM_SCREEN]: through the screen; captured at first use */
    cudaGraphExec_t graph[SV_LM_SCREEN + 1][SV_N_BUCKETS];
    /* the LM head's int8 screen of greedy rows (lm_screen_rows.cu), when lmr: its tiles and coefficients
     * (cuda_lm_quantize at open) and its workspace (zeroed at open) */
    int lmr;
    int8_t *lm_wt;
    float *lm_meta_rows;
    void *lm_ws;
    int no_graph;                        /* a capture failed: eager passes from then on */
    int det;                             /* deterministic mode: the skinny GEMM for every decode row */
    char *ctx_dn;                        /* the context's DeltaNet states as n_dn pieces of lstride bytes (the
                                          * first layer's S), or NULL when its layout differs: per-layer copies */
    int solo_slot, solo_start, solo_len; /* the slot the context's own state hosts (solo_step), or -1; positions
                                          * solo_start .. solo_len - 1 are in its contiguous caches only */
    int solo_keep; /* positions below it are shared by the prefix cache (snapshots taken inside its steps): they go to
                    * the pages even when the hosted sequence ends (cuda_seq_end) */
    int32_t *solo_tab; /* [max_blocks] that sequence's block table as of its last solo step */
    char *ablate;      /* measurement only: ServeLayout.ablate's kinds (a copy), or NULL */
};

/* 1 when serve_step --ablate leaves the launch kind out of the pass (measurement only: outputs are garbage) */
static int sv_ablated(const CudaServe *sv, const char *kind) {
    return sv->ablate && cuda_ablate_listed(sv->ablate, kind);
}

static int sv_fail(int rc, const char *what, int layer, Err *err) {
    if (layer >= 0)
        return err_set(err, Q35_ERR_CUDA, "cuda step: %s (layer %d): %s", what, layer,
                       cudaGetErrorString((cudaError_t)rc));
    return err_set(err, Q35_ERR_CUDA, "cuda step: %s: %s", what, cudaGetErrorString((cudaError_t)rc));
}

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* The DeltaNet slots, layer-major: layer piece q (the q-th DeltaNet layer) of slot s at (q n_tot + s) lstride, n_tot
 * slots in all (the spare included), a piece being the layer's S then its conv ring. A layer's pass over the slots
 * (the batched state pass, one layer at a time) reads one region of n_tot pieces instead of one piece out of every
 * slot. A snapshot is a slot's pieces one after the other (slot_bytes), so slots and snapshots copy as 2-D copies of
 * n_dn rows of lstride bytes. Offsets of slot 0 into S_off / ring_off (may be NULL). S is fp32, or bf16 with
 * state_bf16 (ServeLayout.state_bf16). */
static void slot_layout(const Config *c, int n_tot, int state_bf16, size_t *S_off, size_t *ring_off, size_t *slot_bytes,
                        size_t *lstride, int *n_dn) {
    const size_t S =
        (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim * (state_bf16 ? 2 : 4);
    const size_t ring = (size_t)c->linear_conv_kernel_dim * c->conv_dim * 2, ls = al256(S) + al256(ring);
    int q = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_types[l] == LAYER_FULL_ATTN) continue;
        if (S_off) S_off[l] = (size_t)q * n_tot * ls;
        if (ring_off) ring_off[l] = (size_t)q * n_tot * ls + al256(S);
        q++;
    }
    *slot_bytes = (size_t)q * ls;
    if (lstride) *lstride = ls;
    if (n_dn) *n_dn = q;
}

/* The context's own DeltaNet states (backend.cu's layout: each layer's S then its conv ring, 256-byte aligned, one
 * layer after the other) as a snapshot lays a slot out: n_dn pieces of lstride bytes from the first layer's S; NULL
 * when they are not laid out so. */
static char *ctx_dn_region(const CudaCtx *ctx, const CudaServe *sv) {
    const Config *c = ctx->c;
    const size_t S = (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim * 4;
    char *base = NULL;
    int q = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CudaLayer *ly = &ctx->layers[l];
        if (ly->type == LAYER_FULL_ATTN) continue;
        char *st = (char *)ly->S;
        if (!base) base = st;
        if (st != base + (size_t)q * sv->lstride || (char *)ly->conv_ring != st + al256(S)) return NULL;
        q++;
    }
    return q == sv->n_dn && q > 0 ? base : NULL;
}

/* Slot `slot`'s pieces to or from `other`, which holds them one after the other (a snapshot); to_slot picks the
 * direction. */
static cudaError_t slot_copy(const CudaServe *sv, int slot, char *other, int to_slot, cudaStream_t st) {
    char *a = sv->slots + (size_t)slot * sv->lstride;
    const size_t pitch = (size_t)(sv->lay.n_slots + 1) * sv->lstride;
    return to_slot
               ? cudaMemcpy2DAsync(a, pitch, other, sv->lstride, sv->lstride, (size_t)sv->n_dn, cudaMemcpyDefault, st)
               : cudaMemcpy2DAsync(other, sv->lstride, a, pitch, sv->lstride, (size_t)sv->n_dn, cudaMemcpyDefault, st);
}

/* kv_fp8: the pools hold e4m3 codes, one byte an element (serve_ops.h) */
static size_t block_bytes_of(const Config *c, int block, int kv_fp8) {
    return (size_t)c->n_full_layers * 2 * c->num_key_value_heads * (size_t)block * c->head_dim * (kv_fp8 ? 1 : 2);
}

/* ---- activations ----------------------------------------------------------------------------------------------- */

typedef struct SvArena {
    char *base;
    size_t off;
} SvArena;
static void *sv_carve(SvArena *a, size_t bytes) {
    const size_t o = al256(a->off);
    a->off = o + bytes;
    return a->base ? a->base + o : NULL;
}

/* The skinny GEMMs' workspace for SV_MAX_PIECES decode rows (deterministic mode: every row of a pass): the largest
 * any layer's projection asks for. */
static size_t skinny_work(const CudaCtx *ctx, const CudaServe *sv) {
    const PrefillDims *d = &sv->d;
    const int M = sv->det || SV_MAX_PIECES > sv->tmax ? sv->tmax : SV_MAX_PIECES, ns = sv->n_sm > 0 ? sv->n_sm : 1;
    size_t w = 0;
    for (int l = 0; l < ctx->c->num_hidden_layers; l++) {
        const CudaLayer *ly = &ctx->layers[l];
        const size_t v[4] = {cuda_gemm_skinny_work(M, ly->in_rows, d->D, ns, GEMM_EPI_BF16, 1),
                             cuda_gemm_skinny_work(M, d->D, ly->out_cols, ns, GEMM_EPI_ADD_F32_NORM, 1),
                             cuda_gemm_skinny_work(M, 2 * d->F, d->D, ns, GEMM_EPI_SWIGLU_BF16, d->glu_group),
                             cuda_gemm_skinny_work(M, d->D, d->F, ns, GEMM_EPI_ADD_F32_NORM, 1)};
        for (int i = 0; i < 4; i++) w = v[i] > w ? v[i] : w;
    }
    const size_t lm = cuda_gemm_skinny_work(sv->lm_rows, ctx->c->vocab_size, d->D, ns, GEMM_EPI_F32, 1);
    return lm > w ? lm : w;
}

static void sv_layout(const CudaCtx *ctx, CudaServe *sv, SvArena *a, int n_tables) {
    size_t nh, nproj, nq, nact, nscr;
    const int T = sv->tmax, D = sv->d.D;
    cuda_prefill_buffer_sizes(&sv->d, T, &nh, &nproj, &nq, &nact, &nscr);
    sv->x = (float *)sv_carve(a, sizeof(float) * (size_t)T * D);
    sv->xg = (float *)sv_carve(a, sizeof(float) * (size_t)sv->lm_rows * D);
    sv->h = (uint16_t *)sv_carve(a, 2 * nh);
    sv->proj = (uint16_t *)sv_carve(a, 2 * nproj);
    sv->q = (uint16_t *)sv_carve(a, 2 * (nq > 0 ? nq : 1));
    sv->act = (uint16_t *)sv_carve(a, 2 * nact);
    sv->o = (uint16_t *)sv_carve(a, 2 * (size_t)T * (sv->d.Hv * sv->d.dv > 0 ? sv->d.Hv * sv->d.dv : 1));
    /* scratch: the prefill chunks' DeltaNet scratch, and the decode rows' workspace of cuda_dn_batch_step before
     * them */
    const size_t nws = cuda_dn_batch_ws_bytes(T, sv->d.Hk, sv->d.Hv, sv->d.dk, sv->d.dv);
    sv->scratch = sv_carve(a, nscr > nws ? nscr : nws > 0 ? nws : 1);
    const size_t kvn = ctx->c->n_full_layers ? (size_t)sv->d.Hkv * ctx->max_seq * sv->d.hd : 1;
    sv->kc = (uint16_t *)sv_carve(a, 2 * kvn);
    sv->vc = (uint16_t *)sv_carve(a, 2 * kvn);
    sv->lm = (float *)sv_carve(a, sizeof(float) * (size_t)sv->lm_rows * ctx->c->vocab_size);
    /* decode rows of a pass: at most one per piece (SV_MAX_PIECES), in deterministic mode every row; logits rows: at
     * most T */
    const int pa_rows = sv->det || T < SV_MAX_PIECES ? T : SV_MAX_PIECES;
    sv->pa_work_n = ctx->c->n_full_layers ? paged_attn_work_floats(pa_rows, sv->d.Hq, sv->d.hd) : 1;
    sv->pa_work = (float *)sv_carve(a, sizeof(float) * sv->pa_work_n);
    const size_t amw = rows_argmax_work_bytes(T, ctx->c->vocab_size),
                 amg = gemm_argmax_work_bytes(sv->lm_rows, ctx->c->vocab_size);
    sv->am_work_bytes = amw > amg ? amw : amg;
    sv->am_work = sv_carve(a, sv->am_work_bytes);
    sv->skw_floats = skinny_work(ctx, sv);
    sv->skw = (float *)sv_carve(a, sizeof(float) * (sv->skw_floats ? sv->skw_floats : 1));
    sv->smp = (StepParams *)sv_carve(a, sizeof(StepParams) * (size_t)sv->lm_rows);
    sv->smp_scratch_bytes = cuda_sample_scratch_bytes(sv->n_sm) * (size_t)sv->lm_rows;
    sv->smp_scratch = sv_carve(a, sv->smp_scratch_bytes);
    sv->pen_row = (PenaltyRow *)sv_carve(a, sizeof(PenaltyRow) * (size_t)sv->lm_rows);
    sv->pen = (SamplePenalty *)sv_carve(a, sizeof(SamplePenalty) * (size_t)sv->pen_cap);
    sv->pen_raw = (float *)sv_carve(a, sizeof(float) * (size_t)sv->pen_cap);
    sv->n_ints = 8 * (size_t)T + (size_t)n_tables; /* the last 2 T: argmax ids, then their logprobs (float bits) */
    sv->ints = (int32_t *)sv_carve(a, sizeof(int32_t) * sv->n_ints);
    if (sv->lmr) {
        const int V = ctx->c->vocab_size;
        sv->lm_wt = (int8_t *)sv_carve(a, cuda_lm_rows_tiles_bytes(V, D));
        sv->lm_meta_rows = (float *)sv_carve(a, sizeof(float) * 4 * (size_t)V);
        sv->lm_ws = sv_carve(a, cuda_lm_rows_ws_bytes(V, D));
    }
}

static void sv_dims(const CudaCtx *ctx, CudaServe *sv) {
    cuda_prefill_dims(ctx, &sv->d);
    sv->tmax = SV_TMAX < ctx->max_seq ? SV_TMAX : ctx->max_seq;
    sv->lm_rows = SV_MAX_PIECES < sv->tmax ? SV_MAX_PIECES : sv->tmax; /* a pass's logits rows at most */
    sv->pen_cap = SV_PEN_CAP > ctx->c->vocab_size ? SV_PEN_CAP : ctx->c->vocab_size;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sv->major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&sv->n_sm, cudaDevAttrMultiProcessorCount, dev);
    /* the screen's exact sums are the skinny GEMM's in one split (GemmParams.gather): the plan of the head's shape */
    sv->lmr = cuda_lm_rows_ok(ctx->c->vocab_size, sv->d.D) &&
              cuda_gemm_skinny_work(1, ctx->c->vocab_size, sv->d.D, sv->n_sm, GEMM_EPI_F32, 1) == 0;
}

/* ---- Backend hooks --------------------------------------------------------------------------------------------- */

extern "C" int cuda_serve_sizes(void *p, int block, int state_bf16, int kv_fp8, ServeSizes *s, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    if (!ctx->pf)
        return err_set(
            err, Q35_ERR_UNSUPPORTED,
            "cuda serve: the batched step needs the prefill kernels, which do not cover this model's shapes");
    if (block < 1) return err_set(err, Q35_ERR_ARG, "cuda serve: block of %d tokens", block);
    memset(s, 0, sizeof *s);
    s->block_bytes = block_bytes_of(ctx->c, block, kv_fp8);
    slot_layout(ctx->c, 1, state_bf16, NULL, NULL, &s->slot_bytes, NULL, NULL);
    /* the activations of one pass come out of the same memory (sized here with room for 4096 table entries) */
    CudaServe tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.det = ctx->deterministic; /* its workspaces cover every row of a pass */
    sv_dims(ctx, &tmp);
    SvArena a = {NULL, 0};
    sv_layout(ctx, &tmp, &a, 4096);
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaMemGetInfo(&fr, &tot);
    if (e != cudaSuccess) return sv_fail((int)e, "cudaMemGetInfo", -1, err);
    /* activations, the spare slot and block of padded graph rows, 256 MiB for the runtime */
    const size_t reserve = a.off + s->slot_bytes + s->block_bytes + ((size_t)256 << 20);
    s->mem_bytes = fr > reserve ? fr - reserve : 0;
    s->mem_fraction = 0.9;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE); /* the host tier's memory */
    s->host_mem_bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    return 0;
}

/* The context's own caches hold e4m3 values while it serves over fp8 KV pools: its captured steps then store
 * different K/V, so they are captured again. */
static void ctx_kv_e4m3(CudaCtx *ctx, int on) {
    if (ctx->kv_e4m3 == on) return;
    ctx->kv_e4m3 = on;
    cuda_graphs_drop(ctx);
    cuda_prefill_graphs_drop(ctx);
}

extern "C" void cuda_serve_close(void *p) {
    CudaCtx *ctx = (CudaCtx *)p;
    CudaServe *sv = ctx ? ctx->sv : NULL;
    if (!sv) return;
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    ctx_kv_e4m3(ctx, 0);
    for (int k = 0; k <= SV_LM_SCREEN; k++)
        for (int i = 0; i < SV_N_BUCKETS; i++)
            if (sv->graph[k][i]) cudaGraphExecDestroy(sv->graph[k][i]);
    if (sv->slots) cudaFree(sv->slots);
    if (sv->snaps) cudaFree(sv->snaps);
    if (sv->host_snaps) cudaFreeHost(sv->host_snaps);
    if (sv->kv) cudaFree(sv->kv);
    if (sv->buf) cudaFree(sv->buf);
    if (sv->ints_host) cudaFreeHost(sv->ints_host);
    if (sv->smp_host) cudaFreeHost(sv->smp_host);
    if (sv->pen_row_host) cudaFreeHost(sv->pen_row_host);
    if (sv->pen_host) cudaFreeHost(sv->pen_host);
    free(sv->S_off);
    free(sv->ring_off);
    free(sv->kv_index);
    free(sv->solo_tab);
    free(sv->ablate);
    free(sv);
    ctx->sv = NULL;
}

extern "C" int cuda_serve_open(void *p, const ServeLayout *l, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    const Config *c = ctx->c;
    cuda_serve_close(ctx);
    if (!ctx->pf)
        return err_set(
            err, Q35_ERR_UNSUPPORTED,
            "cuda serve: the batched step needs the prefill kernels, which do not cover this model's shapes");
    if (l->n_slots < 1 || l->n_blocks < 1 || l->block < 1 || l->max_blocks < 1 ||
        (int64_t)l->max_blocks * l->block < ctx->max_seq)
        return err_set(err, Q35_ERR_ARG, "cuda serve: layout of %d slots, %d blocks of %d (%d per table)", l->n_slots,
                       l->n_blocks, l->block, l->max_blocks);
    CudaServe *sv = (CudaServe *)calloc(1, sizeof *sv);
    if (!sv) return err_set(err, Q35_ERR_OOM, "cuda serve: out of host memory");
    ctx->sv = sv;
    sv->lay = *l;
    sv->lay.ablate = NULL;
    if (l->ablate && *l->ablate) {
        char bad[64];
        int ok = cuda_ablate_check(l->ablate, bad, sizeof bad);
        for (const char *t = l->ablate; ok && t; t = strchr(t, ',') ? strchr(t, ',') + 1 : NULL)
            ok = !strncmp(t, "sv.", 3);
        if (!ok) {
            cuda_serve_close(ctx);
            return err_set(err, Q35_ERR_ARG, "cuda serve: --ablate takes the batched step's kinds (sv.*): '%s'",
                           l->ablate);
        }
        if (!(sv->ablate = strdup(l->ablate))) {
            cuda_serve_close(ctx);
            return err_set(err, Q35_ERR_OOM, "cuda serve: out of host memory");
        }
    }
    sv->det = ctx->deterministic;
    sv->solo_slot = -1;
    sv_dims(ctx, sv);
    const int L = c->num_hidden_layers;
    sv->S_off = (size_t *)calloc((size_t)L, sizeof(size_t));
    sv->ring_off = (size_t *)calloc((size_t)L, sizeof(size_t));
    sv->kv_index = (int *)calloc((size_t)L, sizeof(int));
    sv->solo_tab = (int32_t *)calloc((size_t)l->max_blocks, sizeof(int32_t));
    if (!sv->S_off || !sv->ring_off || !sv->kv_index || !sv->solo_tab) {
        cuda_serve_close(ctx);
        return err_set(err, Q35_ERR_OOM, "cuda serve: out of host memory");
    }
    slot_layout(c, l->n_slots + 1, l->state_bf16, sv->S_off, sv->ring_off, &sv->slot_bytes, &sv->lstride, &sv->n_dn);
    sv->ctx_dn = l->state_bf16 ? NULL : ctx_dn_region(ctx, sv); /* the context's own states are fp32 */
    for (int i = 0, k = 0; i < L; i++) sv->kv_index[i] = c->layer_types[i] == LAYER_FULL_ATTN ? k++ : -1;
    const int n_tables = l->n_slots * l->max_blocks + 1; /* each slot at most once per step, and the spare block */
    SvArena a = {NULL, 0};
    sv_layout(ctx, sv, &a, n_tables);
    const size_t act_bytes = a.off;
    sv->pool_bytes =
        (size_t)(l->n_blocks + 1) * c->num_key_value_heads * (size_t)l->block * c->head_dim * (l->kv_fp8 ? 1 : 2);
    cudaError_t e = cudaMalloc(&sv->buf, act_bytes);
    if (e == cudaSuccess && sv->slot_bytes) e = cudaMalloc(&sv->slots, (size_t)(l->n_slots + 1) * sv->slot_bytes);
    if (e == cudaSuccess && sv->slot_bytes && l->n_snaps > 0)
        e = cudaMalloc(&sv->snaps, (size_t)l->n_snaps * sv->slot_bytes);
    if (e == cudaSuccess && c->n_full_layers) e = cudaMalloc(&sv->kv, 2 * (size_t)c->n_full_layers * sv->pool_bytes);
    if (e == cudaSuccess) e = cudaMallocHost(&sv->ints_host, sizeof(int32_t) * sv->n_ints);
    if (e == cudaSuccess) e = cudaMallocHost(&sv->smp_host, sizeof(StepParams) * (size_t)sv->lm_rows);
    if (e == cudaSuccess) e = cudaMallocHost(&sv->pen_row_host, sizeof(PenaltyRow) * (size_t)sv->lm_rows);
    if (e == cudaSuccess) e = cudaMallocHost(&sv->pen_host, sizeof(SamplePenalty) * (size_t)sv->pen_cap);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        const double mib = (act_bytes + (double)(l->n_slots + (l->n_snaps > 0 ? l->n_snaps : 0)) * sv->slot_bytes +
                            2.0 * c->n_full_layers * (double)sv->pool_bytes) /
                           1048576.0;
        cuda_serve_close(ctx);
        return err_set(err, Q35_ERR_OOM, "GPU out of memory: the serve pools (%d slots, %d blocks) need %.0f MiB",
                       l->n_slots, l->n_blocks, mib);
    }
    if (sv->slot_bytes && l->n_host_snaps > 0 &&
        cudaMallocHost(&sv->host_snaps, (size_t)l->n_host_snaps * sv->slot_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        sv->host_snaps = NULL;
        cuda_serve_close(ctx);
        return err_set(err, Q35_ERR_OOM,
                       "out of pinned host memory: the prefix cache's host tier (%d snapshots) needs "
                       "%.0f MiB",
                       l->n_host_snaps, (double)l->n_host_snaps * (double)sv->slot_bytes / 1048576.0);
    }
    a.base = (char *)sv->buf;
    a.off = 0;
    sv_layout(ctx, sv, &a, n_tables);
    e = cudaMemset(sv->smp_scratch, 0, sv->smp_scratch_bytes);
    if (e != cudaSuccess) {
        cuda_serve_close(ctx);
        return sv_fail((int)e, "sampler scratch", -1, err);
    }
    if (sv->lmr) { /* the screen's int8 head from the bf16 one, its workspace zeroed */
        const int V = c->vocab_size, D = sv->d.D;
        const CudaLaunch lq = {ctx->stream, 0, NULL, 0};
        e = cudaMemsetAsync(sv->lm_ws, 0, cuda_lm_rows_ws_bytes(V, D), ctx->stream);
        int rc = (int)e;
        if (!rc) rc = cuda_lm_quantize(ctx->lm_head, V, D, NULL, NULL, NULL, sv->lm_wt, sv->lm_meta_rows, &lq);
        if (!rc) rc = (int)cudaStreamSynchronize(ctx->stream);
        if (rc) {
            cuda_serve_close(ctx);
            return sv_fail(rc, "LM head screen tiles", -1, err);
        }
    }
    ctx_kv_e4m3(ctx, l->kv_fp8);
    return 0;
}

/* Prefix cache (backend.h): a snapshot is a whole slot (S and conv ring of every DeltaNet layer; the ring is indexed
 * by absolute position, so a slot loaded from a snapshot of length p continues at position p); a KV block is
 * [Hkv][block][hd] contiguous in each pool. Snapshot ids [0, n_snaps) are device memory (sv->snaps), ids
 * [n_snaps, n_snaps + n_host_snaps) pinned host memory (sv->host_snaps, the host tier): copies between the tiers go
 * over PCIe (cudaMemcpyDefault picks the direction). All copies in stream order with step_batch. */
static int solo_flush(CudaCtx *ctx, CudaServe *sv, Err *err);
static int solo_copy_kv(CudaCtx *ctx, CudaServe *sv, int from, int to, int scatter, Err *err);

/* Snapshot id snap's bytes (the id in range, slot_bytes > 0). */
static char *snap_at(const CudaServe *sv, int snap) {
    return snap < sv->lay.n_snaps ? sv->snaps + (size_t)snap * sv->slot_bytes
                                  : sv->host_snaps + (size_t)(snap - sv->lay.n_snaps) * sv->slot_bytes;
}

/* Appends to ps the snapshot snap (-1: none) of the state after the sequence's first `at` tokens. */
static void snaps_add(const CudaServe *sv, DnSnaps *ps, int at, int snap) {
    if (snap < 0 || !sv->slot_bytes) return;
    ps->at[ps->n] = at;
    ps->base[ps->n] = snap_at(sv, snap);
    ps->lstride = sv->lstride;
    /* slot_layout's piece: S, then the ring */
    ps->ring_off = al256((size_t)sv->d.Hv * sv->d.dk * sv->d.dv * (sv->lay.state_bf16 ? 2 : 4));
    ps->n++;
}

static int snap_copy(CudaCtx *ctx, int slot, int snap, int save, Err *err) {
    CudaServe *sv = ctx->sv;
    if (!sv) return err_set(err, Q35_ERR_ARG, "cuda snapshot: serving is not open");
    int rc = solo_flush(ctx, sv, err);
    if (rc) return rc;
    const int n_snaps = sv->lay.n_snaps + sv->lay.n_host_snaps;
    if (slot < 0 || slot >= sv->lay.n_slots || snap < 0 || snap >= n_snaps)
        return err_set(err, Q35_ERR_ARG, "cuda snapshot: slot %d / snapshot %d outside [0, %d) / [0, %d)", slot, snap,
                       sv->lay.n_slots, n_snaps);
    if (!sv->slot_bytes) return 0;
    const cudaError_t e = slot_copy(sv, slot, snap_at(sv, snap), !save, ctx->stream);
    return e == cudaSuccess ? 0 : sv_fail((int)e, "snapshot copy", -1, err);
}

/* The snapshot of the sequence the context hosts (solo), taken without handing it back: its new KV rows go to its
 * pages (the cache shares them) and its state from the context straight to the snapshot, so the next lone step
 * continues in place instead of copying the state back in. Returns 1 when it did (0: not solo or no 2-D layout). */
static int snap_save_solo(CudaCtx *ctx, CudaServe *sv, int slot, int snap, Err *err, int *rc) {
    *rc = 0;
    if (slot != sv->solo_slot || !sv->ctx_dn || snap < 0 || snap >= sv->lay.n_snaps + sv->lay.n_host_snaps) return 0;
    if ((*rc = solo_copy_kv(ctx, sv, sv->solo_start, sv->solo_len, 1, err))) return 1;
    sv->solo_start = sv->solo_len;
    if (!sv->slot_bytes) return 1;
    const cudaError_t e =
        cudaMemcpyAsync(snap_at(sv, snap), sv->ctx_dn, sv->slot_bytes, cudaMemcpyDefault, ctx->stream);
    if (e != cudaSuccess) *rc = sv_fail((int)e, "snapshot copy", -1, err);
    return 1;
}
extern "C" int cuda_snap_copy(void *p, int src, int dst, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    CudaServe *sv = ctx->sv;
    if (!sv) return err_set(err, Q35_ERR_ARG, "cuda snapshot copy: serving is not open");
    const int n_snaps = sv->lay.n_snaps + sv->lay.n_host_snaps;
    if (src < 0 || src >= n_snaps || dst < 0 || dst >= n_snaps)
        return err_set(err, Q35_ERR_ARG, "cuda snapshot copy: %d -> %d outside [0, %d)", src, dst, n_snaps);
    if (!sv->slot_bytes || src == dst) return 0;
    const cudaError_t e =
        cudaMemcpyAsync(snap_at(sv, dst), snap_at(sv, src), sv->slot_bytes, cudaMemcpyDefault, ctx->stream);
    return e == cudaSuccess ? 0 : sv_fail((int)e, "snapshot copy", -1, err);
}
extern "C" int cuda_snap_save(void *p, int slot, int snap, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    int rc = 0;
    if (ctx->sv && snap_save_solo(ctx, ctx->sv, slot, snap, err, &rc)) return rc;
    return snap_copy(ctx, slot, snap, 1, err);
}
extern "C" int cuda_snap_load(void *p, int snap, int slot, Err *err) {
    return snap_copy((CudaCtx *)p, slot, snap, 0, err);
}

extern "C" int cuda_block_copy(void *p, int src, int dst, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    CudaServe *sv = ctx->sv;
    if (!sv) return err_set(err, Q35_ERR_ARG, "cuda block copy: serving is not open");
    const int rc = solo_flush(ctx, sv, err);
    if (rc) return rc;
    if (src < 0 || src >= sv->lay.n_blocks || dst < 0 || dst >= sv->lay.n_blocks)
        return err_set(err, Q35_ERR_ARG, "cuda block copy: %d -> %d outside [0, %d)", src, dst, sv->lay.n_blocks);
    const size_t bb = sv->pool_bytes / (size_t)(sv->lay.n_blocks + 1);
    for (int i = 0; i < 2 * ctx->c->n_full_layers; i++) { /* each layer's K pool, then its V pool */
        char *pool = sv->kv + (size_t)i * sv->pool_bytes;
        const cudaError_t e = cudaMemcpyAsync(pool + (size_t)dst * bb, pool + (size_t)src * bb, bb,
                                              cudaMemcpyDeviceToDevice, ctx->stream);
        if (e != cudaSuccess) return sv_fail((int)e, "block copy", -1, err);
    }
    return 0;
}

/* The GEMM algorithm of every batched-step GEMM: one tile family whatever M (see the header). */
static int serve_algo(const CudaServe *sv, int M, int N) {
    if (sv->major != 9) return GEMM_ALGO_MMA;
    const int tiles = ((M + 127) / 128) * ((N + 127) / 128);
    return tiles <= sv->n_sm ? GEMM_ALGO_TMA_C128 : GEMM_ALGO_TMA_P128;
}

static int sv_norm(const CudaServe *sv, const CudaLaunch *lc, const float *x, const float *w, uint16_t *h, int T,
                   int layer, Err *err) {
    RmsnormRowsParams np = {x, w, h, T, sv->d.D, sv->d.norm_mode, sv->d.eps};
    const int rc = cuda_rmsnorm_rows_bf16(&np, lc);
    return rc ? sv_fail(rc, "norm", layer, err) : 0;
}

/* The rows [0, returned) of an N-column GEMM over nd per-row rows that sv_gemm gives the skinny GEMM */
static int sv_skinny_rows(const CudaServe *sv, int nd, int N) {
    return !sv->det && nd >= 128 && sv->major == 9 && 2 * ((nd + 127) / 128) * ((N + 127) / 128) >= sv->n_sm ? 0 : nd;
}

/* 1 when the DeltaNet prep computes the b / a values of layer ly's FP8 in_proj for the nr rows of the per-row kernels
 * (DnBatchParams.ba_w) instead of the skinny GEMM's second launch for its bf16 b / a rows (sv_gemm's no_tail): those
 * rows are on the skinny GEMM and the shape fits prep (cuda_dn_batch_step's conditions). */
static int sv_ba_prep(const CudaServe *sv, const CudaLayer *ly, int nr) {
    return ly->type != LAYER_FULL_ATTN && ly->w_ba && ly->in8_rows < ly->in_rows &&
           sv_skinny_rows(sv, nr, ly->in_rows) > 0 && sv->d.Hv / sv->d.Hk <= DN_BA_MAX_R && sv->d.D % 8 == 0 &&
           !((uintptr_t)ly->w_ba & 15) && !((uintptr_t)sv->h & 15);
}

/* Y = X W^T over the pass's T rows: the nd decode rows (rows 0 .. nd - 1) through the skinny GEMM, the prefill
 * rows (nd .. T - 1) through the prefill GEMM. Each family's sums for a row do not depend on the other rows, and a
 * row's family depends only on its own piece (a decode token or a prefill chunk), so batching stays invariant. Outside
 * deterministic mode, a pass of >= 128 decode rows whose 128 x 128 tiles fill half the GPU takes the prefill GEMM for
 * all its rows (tensor-core bound there; a row's bits then depend on the pass's row count, within rounding), and the
 * skinny GEMM's split plan counts the pass's 64-row blocks (GemmParams.split_m: fewer splits where several blocks
 * fill the GPU, with the same effect on a row's bits).
 * norm_w (residual GEMMs): the RMSNorm that follows, h = norm(y) for every row, fused into the skinny kernel's
 * reduction for its rows.
 * A driver that cannot encode tensor maps (cudaErrorNotSupported) moves every later prefill GEMM of the session to
 * mma.sync (one family again: the decision comes at the first GEMM, before any row is computed). */
/* ly (NULL: g.w as given, the LM head): the weight is layer ly's projection `which` (cuda_layer_gemm_w). FP8: the
 * skinny GEMM reads it as is (an FP8 DeltaNet in_proj's bf16 b / a rows as a second skinny GEMM into the columns
 * after its FP8 rows, or with no_tail not at all: the DeltaNet prep computes them, sv_ba_prep); the prefill GEMM
 * reads a bf16 copy (cuda_layer_w_bf16). */
static int sv_gemm(CudaCtx *ctx, CudaServe *sv, const CudaLaunch *lc, GemmParams g, const CudaLayer *ly, int which,
                   int nd, int no_tail, const float *norm_w, int layer, const char *what, Err *err) {
    const size_t ysz = g.epi == GEMM_EPI_F32 || g.epi == GEMM_EPI_ADD_F32 ? 4 : 2;
    int rc = 0;
    if (ly) cuda_layer_gemm_w(ly, which, g.K, &g);
    const int sk = sv_skinny_rows(sv, nd, g.N);
    if (sk > 0) {
        GemmParams s = g, t;
        s.M = sk;
        s.split_m = !sv->det;
        const int tail = ly ? cuda_layer_gemm_tail(ly, which, &s, &t) : 0;
        rc = norm_w ? cuda_gemm_skinny_norm(&s, norm_w, sv->d.norm_mode, sv->d.eps, sv->h, sv->skw, sv->skw_floats,
                                            sv->n_sm, lc)
                    : cuda_gemm_skinny(&s, sv->skw, sv->skw_floats, sv->n_sm, lc);
        if (!rc && tail && !no_tail) rc = cuda_gemm_skinny(&t, sv->skw, sv->skw_floats, sv->n_sm, lc);
        if (rc) return sv_fail(rc, what, layer, err);
    }
    if (g.M <= sk) return 0;
    if (g.w8) {
        const uint16_t *w = NULL;
        if ((rc = cuda_layer_w_bf16(ctx, ly, which, lc, NULL, &w, NULL))) return sv_fail(rc, "fp8_to_bf16", layer, err);
        g.w = w;
        g.w8 = NULL;
        g.w8_scale = NULL;
    }
    const int T = g.M;
    float *y0 = (float *)g.y;
    g.x += (size_t)sk * g.ldx;
    g.y = (char *)g.y + (size_t)sk * g.ldy * ysz;
    g.M -= sk;
    g.algo = serve_algo(sv, g.M, g.N);
    rc = cuda_gemm_bf16(&g, lc);
    if (rc == (int)cudaErrorNotSupported && sv->major == 9) {
        sv->major = 0;
        g.algo = GEMM_ALGO_MMA;
        rc = cuda_gemm_bf16(&g, lc);
    }
    if (rc) return sv_fail(rc, what, layer, err);
    if (!norm_w) return 0;
    return sv_norm(sv, lc, y0 + (size_t)sk * g.ldy, norm_w, sv->h + (size_t)sk * sv->d.D, T - sk, layer, err);
}

/* Where a pass's picks go on the device: the argmax ids, then their logprobs, in the tail of sv->ints (copied back
 * by sv_pass). */
static int32_t *sv_am_dev(const CudaServe *sv) { return sv->ints + sv->n_ints - 2 * (size_t)sv->tmax; }
static float *sv_lp_dev(const CudaServe *sv) { return (float *)(sv->ints + sv->n_ints - sv->tmax); }

/* Whether a pass whose LM head runs over `rows` rows, every one greedy with its pick on the device (no sampled row,
 * no row whose logits go to the host), takes the LM head with the argmax epilogue (GEMM_EPI_ARGMAX): the logits are
 * never written and read back, only each row's partials per 128 columns. Where the prefill GEMM takes the LM head
 * (outside deterministic mode, >= 128 rows on sm_90: sv_gemm): the TMA kernels of 128-column tiles have the
 * epilogue. The picks are those of the logits rows (the argmax of the same values, the smallest id among equals); the
 * logprob sums the same terms in another order. */
static int sv_lm_argmax(const CudaServe *sv, int rows, int V) {
    return !sv->det && sv->major == 9 && rows <= sv->lm_rows && sv_skinny_rows(sv, rows, V) == 0;
}

/* Whether a pass whose LM head runs over `rows` rows, every one greedy with its pick on the device and no logprob
 * asked, takes the screen (cuda_lm_rows: the int8 head bounds every logit, the skinny GEMM computes the candidates'):
 * the picks are those of the logits rows, bit for bit, at half the head's bytes. The rows must be the skinny GEMM's
 * (the candidates' sums are its sums). */
static int sv_lm_screen(const CudaServe *sv, int rows, int V) {
    return sv->lmr && rows <= 64 && sv_skinny_rows(sv, rows, V) == rows;
}

/* The picks of logits rows lm [rows][V] (device): their argmax ids and log-softmax there into the tail of sv->ints,
 * then with smp the draws of the rows sv->smp samples in place of their argmax (and the drawn ids' log-softmax); smp 2:
 * the rows' logit changes (sv->pen_row) first, and the log-softmax of the raw row at the pick. */
static int sv_picks(CudaCtx *ctx, CudaServe *sv, const CudaLaunch *lc, const float *lm, int rows, int smp, Err *err) {
    const int V = ctx->c->vocab_size;
    int32_t *am_dev = sv_am_dev(sv);
    float *lp_dev = sv_lp_dev(sv);
    RowsArgmaxParams ap = {lm, rows, V, ctx->n_valid, am_dev, sv->am_work, sv->am_work_bytes, lp_dev};
    int rc = cuda_rows_argmax(&ap, lc);
    if (rc) return sv_fail(rc, "argmax", -1, err);
    if (!smp) return 0;
    PenaltyParams pp = {(float *)lm, rows, ctx->n_valid, (size_t)V, sv->pen_row, sv->pen, sv->pen_raw, am_dev, lp_dev};
    if (smp == 2 && (rc = cuda_penalty_apply(&pp, lc))) return sv_fail(rc, "penalties", -1, err);
    SampleParams sp;
    memset(&sp, 0, sizeof sp);
    sp.logits = lm;
    sp.n_valid = ctx->n_valid;
    sp.rows = rows;
    sp.ld = (size_t)V;
    sp.step = sv->smp;
    sp.scratch = sv->smp_scratch;
    sp.out_id = am_dev;
    sp.lp = lp_dev;
    if ((rc = cuda_sample(&sp, lc))) return sv_fail(rc, "sample", -1, err);
    if (smp == 2 && (rc = cuda_penalty_finish(&pp, lc))) return sv_fail(rc, "penalties", -1, err);
    return 0;
}

/* sv->smp_host[k] and sv->pen_row_host[k] from a row's BatchItem.sample (NULL or temperature 0: the argmax), its
 * entries appended to sv->pen_host; returns 2 when the row has logit changes, else 1 when it samples, else 0, and -1
 * when its entries do not fit in the pass's (the row goes to the host, which applies them). */
static int sv_smp_fill(CudaServe *sv, int k, const DeviceSampling *ds) {
    StepParams *sp = &sv->smp_host[k];
    memset(sp, 0, sizeof *sp);
    sp->top_p = 1.0f;
    PenaltyRow *pr = &sv->pen_row_host[k];
    memset(pr, 0, sizeof *pr);
    if (ds && ds->n_pen > 0) {
        if (ds->n_pen > sv->pen_cap - sv->pen_used) return -1;
        *pr = (PenaltyRow){sv->pen_used, ds->n_pen, ds->repetition, ds->presence, ds->frequency, 0.0f};
        memcpy(sv->pen_host + sv->pen_used, ds->pen, sizeof(SamplePenalty) * (size_t)ds->n_pen);
        sv->pen_used += ds->n_pen;
    }
    const int pen = pr->n > 0 ? 2 : 0;
    if (!ds || !(ds->temperature > 0.0f)) return pen;
    sp->temperature = ds->temperature;
    sp->top_k = ds->top_k;
    sp->top_p = ds->top_p;
    sp->min_p = ds->min_p;
    sp->seed = ds->seed;
    sp->step = ds->step;
    return pen ? pen : 1;
}

/* Uploads the first `rows` rows' sampling settings (smp >= 1) and logit changes (smp 2) filled by sv_smp_fill. */
static cudaError_t sv_smp_upload(CudaServe *sv, int rows, int smp, cudaStream_t st) {
    cudaError_t e = cudaSuccess;
    if (smp >= 1)
        e = cudaMemcpyAsync(sv->smp, sv->smp_host, sizeof(StepParams) * (size_t)rows, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess && smp == 2)
        e = cudaMemcpyAsync(sv->pen_row, sv->pen_row_host, sizeof(PenaltyRow) * (size_t)rows, cudaMemcpyHostToDevice,
                            st);
    if (e == cudaSuccess && smp == 2 && sv->pen_used)
        e = cudaMemcpyAsync(sv->pen, sv->pen_host, sizeof(SamplePenalty) * (size_t)sv->pen_used, cudaMemcpyHostToDevice,
                            st);
    return e;
}

/* A piece of an item: the whole item, or (items longer than tmax) tmax of its tokens. */
typedef struct SvPiece {
    const BatchItem *it;
    int off, n, pos, logits; /* tokens it->tokens[off .. off+n) at positions pos .. pos+n-1 */
    int *pick;               /* with logits: BatchItem.pick (the row's pick instead of the row), else NULL */
    DnSnaps snaps;           /* the item's snapshots inside the piece: at in (pos, pos + n) */
} SvPiece;

/* The DeltaNet ordinal of layer l (its piece in a slot or a snapshot). */
static int dn_ordinal(const CudaServe *sv, int l) {
    return (int)(sv->S_off[l] / ((size_t)(sv->lay.n_slots + 1) * sv->lstride));
}

/* Entries of a piece's block table the step uses: positions 0 .. pos + n - 1. */
static int tab_len(const SvPiece *q, int block) { return (q->pos + q->n - 1) / block + 1; }

/* One pass over the pieces pc[0 .. np) (at most tmax rows): fills and uploads the per-row ints, runs every layer,
 * and copies the logits rows of this pass to out[0 ..) ([n_out][V]); returns after the stream is done. */
/* The device work of a pass over T rows (rows 0 .. nd - 1 the decode rows; pieces pc[0 .. np) for the prefill
 * chunks, np = 0 in a captured decode pass; n_out logits rows listed in the out_row ints), after the ints are on the
 * device: embedding, every layer, the final norm and LM head of the logits rows into sv->lm [n_out][V], and their
 * argmax ids and logprobs when any_am, then with any_smp the draws of the rows sv->smp samples (in place of their
 * argmax); any_smp SV_LM_ARGMAX (sv_pass's kind: every row greedy, sv_lm_argmax): the LM head's epilogue gives the
 * picks and sv->lm is not written; SV_LM_SCREEN (every row greedy, no logprob, sv_lm_screen): the screen gives the
 * picks (no logprobs), sv->lm holds only its candidates' logits. No copies to or from the host: a decode pass replays
 * it as a graph. */
static int sv_layers(CudaCtx *ctx, CudaServe *sv, const SvPiece *pc, int np, const int *prow, const int *ptab, int T,
                     int nd, int n_out, int any_am, int any_smp, Err *err) {
    const Config *c = ctx->c;
    const PrefillDims *d = &sv->d;
    const int D = d->D, V = c->vocab_size, tmax = sv->tmax, block = sv->lay.block;
    const CudaLaunch lc = {ctx->stream, ctx->pdl, NULL, 0};
    const int32_t *tok = sv->ints, *pos = sv->ints + tmax, *tab = sv->ints + 2 * tmax, *dnr = sv->ints + 3 * tmax,
                  *dns = sv->ints + 4 * tmax, *orow = sv->ints + 5 * tmax, *tables = sv->ints + 6 * tmax;
    EmbedRowsParams ep = {tok, ctx->embed, sv->x, T, D, V};
    int rc = cuda_embed_rows(&ep, &lc);
    if (rc) return sv_fail(rc, "embed", -1, err);
    const int vd = d->Hv * d->dv, cd = 2 * d->Hk * d->dk + vd;
    /* rows on the per-row kernels (skinny GEMMs, paged attention, the DeltaNet step): the decode rows; in
     * deterministic mode every row, the prefill chunks' tokens stepping the DeltaNet one by one, so that a token's
     * bits never depend on how its sequence was cut into chunks (a prefix-cache hit resumes anywhere) */
    const int nr = sv->det ? T : nd;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CudaLayer *ly = &ctx->layers[l];
        const int n = ly->in_rows, no = ly->out_cols;
        if (l == 0 && (rc = sv_norm(sv, &lc, sv->x, ly->ln1, sv->h, T, l, err))) return rc; /* later: fused below */
        GemmParams in = {sv->h, NULL, sv->proj, T, n, D, D, D, n, GEMM_EPI_BF16, 0, 0};
        const int ba = sv_ba_prep(sv, ly, nr);
        const int attn = ly->type == LAYER_FULL_ATTN;
        if (!sv_ablated(sv, attn ? "sv.qkv" : "sv.in_proj") &&
            (rc = sv_gemm(ctx, sv, &lc, in, ly, CW_IN, nr, ba, NULL, l, "gemm_in", err)))
            return rc;
        if (attn) {
            const int hd = d->hd, nq = d->Hq * hd * (d->attn_gate ? 2 : 1);
            char *kp = sv->kv + 2 * (size_t)sv->kv_index[l] * sv->pool_bytes, *vp = kp + sv->pool_bytes;
            PagedPrepParams pp = {sv->proj,
                                  n,
                                  d->attn_gate ? 2 * hd : hd,
                                  nq,
                                  nq + d->Hkv * hd,
                                  ly->q_norm,
                                  ly->k_norm,
                                  ctx->inv_freq,
                                  sv->q,
                                  kp,
                                  vp,
                                  pos,
                                  tab,
                                  tables,
                                  T,
                                  d->Hq,
                                  d->Hkv,
                                  hd,
                                  d->R,
                                  block,
                                  d->norm_mode,
                                  d->eps,
                                  sv->lay.kv_fp8};
            if (!sv_ablated(sv, "sv.paged_prep") && (rc = cuda_paged_prep(&pp, &lc)))
                return sv_fail(rc, "paged_prep", l, err);
            if (nr && !sv_ablated(sv, "sv.attn")) { /* decode rows: each over its own pages */
                PagedAttnParams ap = {sv->q,
                                      kp,
                                      vp,
                                      d->attn_gate ? sv->proj + hd : NULL,
                                      n,
                                      2 * hd,
                                      sv->act,
                                      pos,
                                      tab,
                                      tables,
                                      dnr,
                                      nr,
                                      d->Hq,
                                      d->Hkv,
                                      hd,
                                      block,
                                      1.0f / sqrtf((float)hd),
                                      sv->pa_work,
                                      sv->pa_work_n};
                ap.early = !sv->det; /* else the rows of a prefill chunk read positions appended in this pass */
                ap.kv_fp8 = sv->lay.kv_fp8;
                ap.n_sm = sv->det ? 0 : sv->n_sm; /* deterministic: every row's splits by its length alone */
                if ((rc = cuda_paged_attn(&ap, &lc))) return sv_fail(rc, "paged_attn", l, err);
            }
            /* prefill chunks: the sequence gathered into the single-sequence layout, then the prefill flash kernel
             * (forward()'s numerics) */
            for (int i = 0; i < np && !sv->det; i++) {
                if (pc[i].n == 1) continue;
                const int r0 = prow[i], t0 = ptab[i];
                const int len = pc[i].pos + pc[i].n;
                PagedGatherParams gp = {kp,     vp, tables + t0, sv->kc, sv->vc, len,           ctx->max_seq,
                                        d->Hkv, hd, block,       0,      0,      sv->lay.kv_fp8};
                if ((rc = cuda_paged_gather(&gp, &lc))) return sv_fail(rc, "paged_gather", l, err);
                AttnPrefillParams ap = {sv->q + (size_t)r0 * d->Hq * hd,
                                        sv->kc,
                                        sv->vc,
                                        d->attn_gate ? sv->proj + (size_t)r0 * n + hd : NULL,
                                        n,
                                        2 * hd,
                                        sv->act + (size_t)r0 * d->Hq * hd,
                                        pc[i].n,
                                        pc[i].pos,
                                        d->Hq,
                                        d->Hkv,
                                        hd,
                                        ctx->max_seq,
                                        1.0f / sqrtf((float)hd)};
                if ((rc = cuda_attn_prefill(&ap, &lc))) return sv_fail(rc, "attn_prefill", l, err);
            }
        } else {
            float *S0 = (float *)(sv->slots + sv->S_off[l]);
            uint16_t *ring0 = (uint16_t *)(sv->slots + sv->ring_off[l]);
            if (nd) {
                DnBatchParams bp = {
                    sv->proj, n,     ly->conv_w, ly->A_log, ly->dt_bias,          S0,      ring0, sv->lstride,
                    dnr,      dns,   pos,        sv->o,     (float *)sv->scratch, nd,      d->Hk, d->Hv,
                    d->dk,    d->dv, d->K,       ctx->n_sm, ly->lin_norm,         sv->act, cd,    d->eps};
                if (ba) bp.ba_w = ly->w_ba, bp.ba_x = sv->h, bp.ba_k = D;
                bp.state_bf16 = sv->lay.state_bf16;
                bp.early = !sv->det; /* else a chunk's tokens, stepped below in this pass, write their ring rows */
                bp.skip = sv_ablated(sv, "sv.dn_prep") | sv_ablated(sv, "sv.dn_state") << 1;
                if ((rc = cuda_dn_batch_step(&bp, &lc))) return sv_fail(rc, "deltanet step", l, err);
            }
            for (int i = 0; i < np && sv->det; i++) /* a chunk's tokens in order, each on its slot */
                for (int t = 0; t < pc[i].n && pc[i].n > 1; t++) {
                    const int r = prow[i] + t;
                    DnBatchParams bp = {
                        sv->proj, n,       ly->conv_w, ly->A_log, ly->dt_bias,          S0,      ring0, sv->lstride,
                        dnr + r,  dns + r, pos,        sv->o,     (float *)sv->scratch, 1,       d->Hk, d->Hv,
                        d->dk,    d->dv,   d->K,       ctx->n_sm, ly->lin_norm,         sv->act, cd,    d->eps};
                    if (ba) bp.ba_w = ly->w_ba, bp.ba_x = sv->h, bp.ba_k = D;
                    bp.state_bf16 = sv->lay.state_bf16;
                    if ((rc = cuda_dn_batch_step(&bp, &lc))) return sv_fail(rc, "deltanet step", l, err);
                    const DnSnaps *ps = &pc[i].snaps; /* a snapshot after this token: the slot's piece of the layer */
                    for (int k = 0; k < ps->n; k++) {
                        if (ps->at[k] != pc[i].pos + t + 1) continue;
                        const cudaError_t e =
                            cudaMemcpyAsync(ps->base[k] + (size_t)dn_ordinal(sv, l) * sv->lstride,
                                            sv->slots + sv->S_off[l] + (size_t)pc[i].it->slot * sv->lstride,
                                            sv->lstride, cudaMemcpyDeviceToDevice, ctx->stream);
                        if (e != cudaSuccess) return sv_fail((int)e, "snapshot copy", l, err);
                    }
                }
            for (int i = 0; i < np && !sv->det; i++) {
                if (pc[i].n == 1) continue;
                const int r0 = prow[i];
                const size_t so = (size_t)pc[i].it->slot * sv->lstride;
                DeltaNetPrefillParams dp;
                memset(&dp, 0, sizeof dp);
                dp.proj = sv->proj + (size_t)r0 * n;
                dp.ld_proj = n;
                dp.z_off = cd;
                dp.b_off = cd + vd;
                dp.a_off = cd + vd + d->Hv;
                dp.conv_w = ly->conv_w;
                dp.A_log = ly->A_log;
                dp.dt_bias = ly->dt_bias;
                dp.norm_w = ly->lin_norm;
                dp.conv_ring = (uint16_t *)(sv->slots + so + sv->ring_off[l]);
                dp.state = (float *)(sv->slots + so + sv->S_off[l]); /* bf16 entries with state_bf16 */
                dp.state_bf16 = sv->lay.state_bf16;
                dp.y = sv->act + (size_t)r0 * vd;
                dp.scratch = sv->scratch;
                dp.T = pc[i].n;
                dp.pos = pc[i].pos;
                dp.Hk = d->Hk;
                dp.Hv = d->Hv;
                dp.dk = d->dk;
                dp.dv = d->dv;
                dp.K = d->K;
                dp.eps = d->eps;
                cuda_dn_snap_points(&dp, &pc[i].snaps, dn_ordinal(sv, l));
                if ((rc = cuda_deltanet_prefill(&dp, &lc))) return sv_fail(rc, "deltanet prefill", l, err);
            }
        }
        GemmParams o = {sv->act, NULL, sv->x, T, D, no, no, no, D, GEMM_EPI_ADD_F32, 0, 0};
        o.narrow = !attn && sv->lay.state_bf16; /* its CTAs beside the state pass's */
        if (!sv_ablated(sv, attn ? "sv.o_proj" : "sv.out_proj") &&
            (rc = sv_gemm(ctx, sv, &lc, o, ly, CW_OUT, nr, 0, ly->ln2, l, "gemm_out", err)))
            return rc;
        const int F = d->F;
        GemmParams gu = {sv->h, NULL, sv->act, T, 2 * F, D, D, D, F, GEMM_EPI_SWIGLU_BF16, 1, 0};
        if (!sv_ablated(sv, "sv.gate_up") &&
            (rc = sv_gemm(ctx, sv, &lc, gu, ly, CW_GU, nr, 0, NULL, l, "gemm_gate_up", err)))
            return rc;
        GemmParams dn = {sv->act, NULL, sv->x, T, D, F, F, F, D, GEMM_EPI_ADD_F32, 0, 0};
        const float *next_ln = l + 1 < c->num_hidden_layers ? ctx->layers[l + 1].ln1 : NULL;
        if (!sv_ablated(sv, "sv.down") &&
            (rc = sv_gemm(ctx, sv, &lc, dn, ly, CW_DOWN, nr, 0, next_ln, l, "gemm_down", err)))
            return rc;
    }
    if (n_out > 0) {
        GatherRowsParams gp = {sv->x, orow, sv->xg, n_out, D};
        if ((rc = cuda_gather_rows(&gp, &lc))) return sv_fail(rc, "gather", -1, err);
        if ((rc = sv_norm(sv, &lc, sv->xg, ctx->final_norm, sv->h, n_out, -1, err))) return rc;
        if (any_smp == SV_LM_SCREEN) {
            LmRowsParams lp = {sv->h, n_out,        D,         ctx->lm_head, sv->lm_wt,     sv->lm_meta_rows, V,
                               D,     ctx->n_valid, sv->lm_ws, sv->lm,       sv_am_dev(sv), sv->n_sm};
            if ((rc = cuda_lm_rows(&lp, &lc))) return sv_fail(rc, "lm_head screen", -1, err);
            return 0;
        }
        if (any_smp == SV_LM_ARGMAX && sv->major == 9) {
            GemmParams g = {sv->h, ctx->lm_head, sv->am_work, n_out, V, D, D, D, 0, GEMM_EPI_ARGMAX, 0, 0};
            g.algo = serve_algo(sv, n_out, V);
            g.am_cols = ctx->n_valid;
            rc = cuda_gemm_bf16(&g, &lc);
            if (rc == (int)cudaErrorNotSupported) { /* no tensor maps: mma.sync from now on (sv_gemm), logits rows */
                sv->major = 0;
            } else if (rc) {
                return sv_fail(rc, "gemm_lm_head", -1, err);
            } else {
                RowsArgmaxParams ap = {
                    NULL, n_out, V, ctx->n_valid, sv_am_dev(sv), sv->am_work, sv->am_work_bytes, sv_lp_dev(sv)};
                if ((rc = cuda_rows_argmax_final(&ap, &lc))) return sv_fail(rc, "argmax", -1, err);
                return 0;
            }
        }
        GemmParams g = {sv->h, ctx->lm_head, sv->lm, n_out, V, D, D, D, V, GEMM_EPI_F32, 0, 0};
        if ((rc = sv_gemm(ctx, sv, &lc, g, NULL, 0, n_out, 0, NULL, -1, "gemm_lm_head", err))) return rc;
        if (any_smp == SV_LM_ARGMAX) any_smp = 0;
        if (any_am) return sv_picks(ctx, sv, &lc, sv->lm, n_out, any_smp, err);
    }
    return 0;
}

/* Decode passes run as CUDA graphs, one per bucket of rows (padded up to the bucket): no prefill chunk and no new
 * sequence (a pass with a position-0 row clears that slot first, eagerly). */
static const int sv_buckets[SV_N_BUCKETS] = {1,  2,  4,  8,   16,  24,  32,  40,  48, 56,
                                             64, 80, 96, 112, 128, 160, 192, 224, 256};

static int sv_bucket(int n) {
    for (int i = 0; i < SV_N_BUCKETS; i++)
        if (sv_buckets[i] >= n) return i;
    return -1;
}

/* Captures the decode pass of bucket bi (rows 0 .. sv_buckets[bi] - 1, every one a decode row with logits), with
 * the sampler when smp is 1 or 2, the picks in the LM head when it is SV_LM_ARGMAX. */
static int sv_capture(CudaCtx *ctx, CudaServe *sv, int bi, int smp, Err *err) {
    const int Bb = sv_buckets[bi];
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return sv_fail((int)e, "begin graph capture", -1, err);
    const int rc = sv_layers(ctx, sv, NULL, 0, NULL, NULL, Bb, Bb, Bb, 1, smp, err);
    e = cudaStreamEndCapture(ctx->stream, &g);
    if (rc) {
        if (g) cudaGraphDestroy(g);
        return rc;
    }
    if (e != cudaSuccess) return sv_fail((int)e, "end graph capture", -1, err);
    e = cudaGraphInstantiate(&sv->graph[smp][bi], g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        sv->graph[smp][bi] = NULL;
        return sv_fail((int)e, "graph instantiate", -1, err);
    }
    return 0;
}

/* One pass over the pieces pc[0 .. np) (at most tmax rows): fills and uploads the per-row ints, runs every layer
 * (a graph for decode passes), and copies the logits rows of this pass to out[0 ..) ([n_out][V]) or, for greedy
 * rows, their argmax ids; returns after the stream is done. */
static int sv_pass(CudaCtx *ctx, CudaServe *sv, const SvPiece *pc, int np, float *out, Err *err) {
    const int V = ctx->c->vocab_size, tmax = sv->tmax, block = sv->lay.block;
    int32_t *hi = sv->ints_host;
    int32_t *h_tok = hi, *h_pos = hi + tmax, *h_tab = hi + 2 * tmax, *h_dnr = hi + 3 * tmax, *h_dns = hi + 4 * tmax,
            *h_out = hi + 5 * tmax, *h_tables = hi + 6 * tmax;
    int T = 0, nd = 0, n_out = 0, nt = 0, any_smp = 0; /* any_smp: sv_smp_fill's largest */
    sv->pen_used = 0;
    int *am_dst[SV_TMAX];   /* out row k: where its argmax goes, or NULL (the row goes to out) */
    float *lp_dst[SV_TMAX]; /* and where its logprob goes, or NULL */
    int32_t *am_host = hi + sv->n_ints - 2 * (size_t)tmax;
    const float *lp_host = (const float *)(hi + sv->n_ints - tmax);
    int prow[SV_MAX_PIECES], ptab[SV_MAX_PIECES]; /* piece i: its first row, its block table's offset */
    /* rows: the decode pieces (one token each) first, rows 0 .. nd - 1 (the skinny GEMMs' rows), then the prefill
     * chunks; logits rows and tables in piece order */
    for (int i = 0; i < np; i++) nd += pc[i].n == 1;
    for (int i = 0, rd = 0, rp = nd; i < np; i++) {
        const SvPiece *q = &pc[i];
        const int nb = tab_len(q, block), r0 = q->n == 1 ? rd++ : rp;
        if (q->n > 1) rp += q->n;
        for (int b = 0; b < nb; b++) h_tables[nt + b] = q->it->blocks[b];
        for (int r = 0; r < q->n; r++) {
            h_tok[r0 + r] = q->it->tokens[q->off + r];
            h_pos[r0 + r] = q->pos + r;
            h_tab[r0 + r] = nt;
        }
        for (int r = 0; r < q->n && (q->n == 1 || sv->det); r++) {
            h_dnr[r0 + r] = r0 + r;
            h_dns[r0 + r] = q->it->slot;
        }
        if (q->logits) {
            am_dst[n_out] = q->pick;
            lp_dst[n_out] = q->pick ? q->it->logprob : NULL;
            int smp = sv_smp_fill(sv, n_out, q->pick ? q->it->sample : NULL);
            if (smp < 0) { /* its logit changes do not fit: its row goes to the host, which picks */
                am_dst[n_out] = NULL;
                lp_dst[n_out] = NULL;
                smp = 0;
            }
            any_smp = smp > any_smp ? smp : any_smp;
            h_out[n_out++] = r0 + q->n - 1;
        }
        prow[i] = r0;
        ptab[i] = nt;
        nt += nb;
        T += q->n;
    }
    /* a decode pass (no chunk, no new sequence) of a bucket's size: padded rows run on the spare slot and the
     * spare block, which no sequence owns, at position 0 */
    int bi = -1;
    if (!ctx->no_graph && !sv->no_graph && nd == np && n_out == np) {
        bi = sv_bucket(np);
        if (bi >= 0 && sv_buckets[bi] > sv->lm_rows) bi = -1; /* lm_rows <= tmax: the buffers' rows */
        for (int i = 0; i < np && bi >= 0; i++)
            if (pc[i].pos == 0) bi = -1;
    }
    int any_am = 0, all_am = n_out > 0, any_lp = 0;
    for (int k = 0; k < n_out; k++)
        any_am |= am_dst[k] != NULL, all_am &= am_dst[k] != NULL, any_lp |= lp_dst[k] != NULL;
    /* the pass's LM head kind: sv_smp_fill's, or every row picked in the LM head or through the screen */
    const int lm_n = bi >= 0 ? sv_buckets[bi] : n_out;
    const int kind = any_smp || !all_am                     ? any_smp
                     : !any_lp && sv_lm_screen(sv, lm_n, V) ? SV_LM_SCREEN
                     : sv_lm_argmax(sv, lm_n, V)            ? SV_LM_ARGMAX
                                                            : 0;
    if (bi >= 0) {
        const int Bb = sv_buckets[bi];
        h_tables[nt] = sv->lay.n_blocks; /* the spare block */
        for (int r = np; r < Bb; r++) {
            h_tok[r] = 0;
            h_pos[r] = 0;
            h_tab[r] = nt;
            h_dnr[r] = r;
            h_dns[r] = sv->lay.n_slots; /* the spare slot */
            h_out[r] = r;
            sv_smp_fill(sv, r, NULL);
        }
        nt++;
    }
    cudaError_t e =
        cudaMemcpyAsync(sv->ints, hi, sizeof(int32_t) * (6 * (size_t)tmax + nt), cudaMemcpyHostToDevice, ctx->stream);
    if (e == cudaSuccess) e = sv_smp_upload(sv, bi >= 0 ? sv_buckets[bi] : n_out, any_smp, ctx->stream);
    if (e != cudaSuccess) return sv_fail((int)e, "upload", -1, err);
    int rc = 0;
    if (bi >= 0 && !sv->graph[kind][bi] && sv_capture(ctx, sv, bi, kind, err)) {
        /* a capture that fails leaves the session on eager passes: a slower path, not an error, said once */
        (void)cudaGetLastError();
        sv->no_graph = 1;
        fprintf(stderr,
                "warning: cuda step: the decode graph of %d rows could not be captured (%s); decode passes run "
                "eager from now on\n",
                sv_buckets[bi], err->msg);
        err->msg[0] = 0;
        bi = -1;
    }
    if (bi >= 0) {
        e = cudaGraphLaunch(sv->graph[kind][bi], ctx->stream);
        if (e != cudaSuccess) return sv_fail((int)e, "graph launch", -1, err);
    } else {
        /* a new sequence starts from zero DeltaNet state */
        for (int i = 0; i < np && sv->slot_bytes; i++)
            if (pc[i].pos == 0) {
                e = cudaMemset2DAsync(sv->slots + (size_t)pc[i].it->slot * sv->lstride,
                                      (size_t)(sv->lay.n_slots + 1) * sv->lstride, 0, sv->lstride, (size_t)sv->n_dn,
                                      ctx->stream);
                if (e != cudaSuccess) return sv_fail((int)e, "slot clear", -1, err);
            }
        if ((rc = sv_layers(ctx, sv, pc, np, prow, ptab, T, nd, n_out, any_am, kind, err))) return rc;
    }
    /* greedy rows: only their argmax comes back (the pinned tail of ints); the other rows whole, in runs. A pageable
     * destination returns once the copy is done. */
    if (any_am) {
        e = cudaMemcpyAsync(am_host, sv->ints + sv->n_ints - 2 * (size_t)tmax, sizeof(int32_t) * (size_t)n_out,
                            cudaMemcpyDeviceToHost, ctx->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync((void *)lp_host, sv->ints + sv->n_ints - tmax, sizeof(float) * (size_t)n_out,
                                cudaMemcpyDeviceToHost, ctx->stream);
        if (e != cudaSuccess) return sv_fail((int)e, "argmax readback", -1, err);
    }
    for (int k = 0; k < n_out;) {
        if (am_dst[k]) {
            k++;
            continue;
        }
        int k1 = k + 1;
        while (k1 < n_out && !am_dst[k1]) k1++;
        e = cudaMemcpyAsync(out + (size_t)k * V, sv->lm + (size_t)k * V, sizeof(float) * (size_t)(k1 - k) * V,
                            cudaMemcpyDeviceToHost, ctx->stream);
        if (e != cudaSuccess) return sv_fail((int)e, "logits readback", -1, err);
        k = k1;
    }
    e = cudaStreamSynchronize(ctx->stream); /* the pinned ints are refilled by the next pass */
    if (e != cudaSuccess) return sv_fail((int)e, "step", -1, err);
    for (int k = 0; k < n_out; k++)
        if (am_dst[k]) {
            *am_dst[k] = am_host[k];
            if (lp_dst[k]) *lp_dst[k] = lp_host[k];
        }
    return 0;
}

/* ---- solo: one running sequence on the single-sequence decode step ------------------------------------------------
 * Outside deterministic mode, a step of one item runs forward() on the context's own state (a decode row: its fused
 * kernels and sampler, one graph replay; a prompt chunk: its prefill path; a pick with a logprob from the row on the
 * device, solo_pick), which then hosts that sequence: entering copies the slot's DeltaNet state (S, conv ring) into
 * the context's layers and gathers positions 0 .. pos - 1 of its KV pages into the contiguous caches (a new sequence
 * starts from the reset state instead); later lone steps of the same slot at the next position continue there. A
 * snapshot of that sequence (snap_save of its slot) is taken from the context in place: its new KV rows go to its
 * pages and its state straight to the snapshot, and it stays hosted. Anything else (another step, another prefix-cache
 * hook, serve_close) first flushes: the state goes back to the slot and the KV rows the solo steps wrote go back to
 * the sequence's pages (its table as of the last solo step). A sequence that ended (closed or preempted: cuda_seq_end)
 * is dropped instead: its blocks are given back, and the prefix cache holds only rows up to a snapshot, and taking one
 * writes the rows before it to the pages. So the next request on an idle server does not first write back the last
 * one's state (20 MB of a 0.8B). Every way a slot gets a new sequence passes through one of those (a step at position
 * 0, or snap_load), so a continuation is recognised by (slot, position) alone. Deterministic mode never enters: its
 * rows must be the batched step's bits. With bf16 slots (ServeLayout.state_bf16) the state is widened to the
 * context's fp32 entering and rounded to bf16 leaving, so a hosted sequence steps in fp32 until it leaves; a snapshot
 * of it hands it back first (ctx_dn is NULL: the layouts differ). */
static int solo_copy_state(CudaCtx *ctx, CudaServe *sv, int slot, int to_slot, Err *err) {
    const Config *c = ctx->c;
    int rc = to_slot ? cuda_state_clean(ctx, err) : 0;
    if (rc) return rc;
    if (!to_slot) ctx->state_dirty &= ~CUDA_DIRTY_STATE; /* overwritten whole */
    if (sv->ctx_dn) { /* one 2-D copy: the context's pieces one after the other, the slot's one region apart */
        const cudaError_t e = slot_copy(sv, slot, sv->ctx_dn, to_slot, ctx->stream);
        return e == cudaSuccess ? 0 : sv_fail((int)e, "solo state copy", -1, err);
    }
    const int64_t S_n = (int64_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    const size_t ring_bytes = (size_t)c->linear_conv_kernel_dim * c->conv_dim * 2;
    const CudaLaunch lc = {ctx->stream, 0, NULL, 0};
    char *base = sv->slots + (size_t)slot * sv->lstride;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CudaLayer *ly = &ctx->layers[l];
        if (ly->type == LAYER_FULL_ATTN) continue;
        char *s = base + sv->S_off[l], *r = base + sv->ring_off[l];
        cudaError_t e = cudaSuccess;
        if (sv->lay.state_bf16) { /* bf16 slot <-> the context's fp32 state: widened entering, rounded leaving */
            const CastParams cp = {to_slot ? (const void *)ly->S : (const void *)s, to_slot ? (void *)s : (void *)ly->S,
                                   S_n, to_slot};
            const int crc = cuda_cast_f32_bf16(&cp, &lc);
            if (crc) return sv_fail(crc, "solo state copy", l, err);
        } else {
            e = cudaMemcpyAsync(to_slot ? (void *)s : (void *)ly->S, to_slot ? (void *)ly->S : (void *)s,
                                (size_t)S_n * 4, cudaMemcpyDeviceToDevice, ctx->stream);
        }
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(to_slot ? (void *)r : (void *)ly->conv_ring,
                                to_slot ? (void *)ly->conv_ring : (void *)r, ring_bytes, cudaMemcpyDeviceToDevice,
                                ctx->stream);
        if (e != cudaSuccess) return sv_fail((int)e, "solo state copy", l, err);
    }
    return 0;
}

/* KV positions [from, to) of the solo sequence between its pages (table sv->solo_tab) and the contiguous caches:
 * scatter = 1 caches -> pages. The table goes through the pinned ints (the stream is idle between passes). */
static int solo_copy_kv(CudaCtx *ctx, CudaServe *sv, int from, int to, int scatter, Err *err) {
    const Config *c = ctx->c;
    if (to <= from || !c->n_full_layers) return 0;
    const int block = sv->lay.block, nb = (to - 1) / block + 1;
    int32_t *tab_host = sv->ints_host + 6 * (size_t)sv->tmax;
    memcpy(tab_host, sv->solo_tab, sizeof(int32_t) * (size_t)nb);
    cudaError_t e = cudaMemcpyAsync(sv->ints + 6 * (size_t)sv->tmax, tab_host, sizeof(int32_t) * (size_t)nb,
                                    cudaMemcpyHostToDevice, ctx->stream);
    if (e != cudaSuccess) return sv_fail((int)e, "solo table upload", -1, err);
    const CudaLaunch lc = {ctx->stream, ctx->pdl, NULL, 0};
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const CudaLayer *ly = &ctx->layers[l];
        if (ly->type != LAYER_FULL_ATTN) continue;
        char *kp = sv->kv + 2 * (size_t)sv->kv_index[l] * sv->pool_bytes, *vp = kp + sv->pool_bytes;
        PagedGatherParams gp = {kp,
                                vp,
                                sv->ints + 6 * (size_t)sv->tmax,
                                ly->Kc,
                                ly->Vc,
                                to,
                                ctx->max_seq,
                                sv->d.Hkv,
                                sv->d.hd,
                                block,
                                from,
                                scatter,
                                sv->lay.kv_fp8};
        const int rc = cuda_paged_gather(&gp, &lc);
        if (rc) return sv_fail(rc, scatter ? "solo kv scatter" : "solo kv gather", l, err);
    }
    e = cudaStreamSynchronize(ctx->stream); /* the pinned table is reused by the next pass */
    return e != cudaSuccess ? sv_fail((int)e, "solo kv copy", -1, err) : 0;
}

/* Hands a hosted sequence back to its slot and pages (no-op when none is hosted). */
static int solo_flush(CudaCtx *ctx, CudaServe *sv, Err *err) {
    if (sv->solo_slot < 0) return 0;
    const int slot = sv->solo_slot;
    sv->solo_slot = -1;
    int rc = solo_copy_state(ctx, sv, slot, 1, err);
    if (!rc) rc = solo_copy_kv(ctx, sv, sv->solo_start, sv->solo_len, 1, err);
    return rc;
}

/* The sequence in `slot` ended (Backend.seq_end): a solo state it left is dropped, not written back, but for the KV
 * rows the prefix cache shares (below solo_keep). */
extern "C" void cuda_seq_end(void *p, int slot) {
    CudaServe *sv = ((CudaCtx *)p)->sv;
    if (!sv || sv->solo_slot != slot) return;
    if (sv->solo_keep > sv->solo_start) { /* the steps' own arguments: only a broken context fails, and its next call
                                           * reports that */
        Err err = {0};
        solo_copy_kv((CudaCtx *)p, sv, sv->solo_start, sv->solo_keep, 1, &err);
    }
    sv->solo_slot = -1;
}

/* A lone item's pick and logprob (BatchItem.pick, .logprob, .sample) from its logits row on the device. */
static int solo_pick(CudaCtx *ctx, CudaServe *sv, const float *row, const BatchItem *it, Err *err) {
    const CudaLaunch lc = {ctx->stream, ctx->pdl, NULL, 0};
    sv->pen_used = 0;
    const int smp = sv_smp_fill(sv, 0, it->sample); /* a lone row's entries always fit (pen_cap >= the vocabulary) */
    if (smp < 0) return err_set(err, Q35_ERR_ARG, "cuda step: %d logit changes for one row", it->sample->n_pen);
    const cudaError_t e0 = sv_smp_upload(sv, 1, smp, ctx->stream);
    if (e0 != cudaSuccess) return sv_fail((int)e0, "upload", -1, err);
    int rc = sv_picks(ctx, sv, &lc, row, 1, smp, err);
    if (rc) return rc;
    int32_t *am_host = sv->ints_host + sv->n_ints - 2 * (size_t)sv->tmax;
    float *lp_host = (float *)(sv->ints_host + sv->n_ints - sv->tmax);
    cudaError_t e = cudaMemcpyAsync(am_host, sv->ints + sv->n_ints - 2 * (size_t)sv->tmax, sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, ctx->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(lp_host, sv->ints + sv->n_ints - sv->tmax, sizeof(float), cudaMemcpyDeviceToHost,
                            ctx->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) return sv_fail((int)e, "pick readback", -1, err);
    *it->pick = am_host[0];
    if (it->logprob) *it->logprob = lp_host[0];
    return 0;
}

/* One lone item on the single-sequence step; returns 0 or an error (the slot's state is then undefined). */
static int solo_step(CudaCtx *ctx, CudaServe *sv, const BatchItem *it, float *logits, Err *err) {
    const int block = sv->lay.block, nb = (it->pos + it->n - 1) / block + 1;
    int rc = 0;
    if (sv->solo_slot != it->slot || sv->solo_len != it->pos) {
        if ((rc = solo_flush(ctx, sv, err))) return rc;
        memcpy(sv->solo_tab, it->blocks, sizeof(int32_t) * (size_t)nb);
        if (it->pos == 0) { /* a new sequence: from zero state */
            if ((rc = cuda_backend.reset(ctx, err))) return rc;
        } else {
            if ((rc = solo_copy_state(ctx, sv, it->slot, 0, err))) return rc;
            if ((rc = solo_copy_kv(ctx, sv, 0, it->pos, 0, err))) return rc;
        }
        sv->solo_slot = it->slot;
        sv->solo_start = sv->solo_len = sv->solo_keep = it->pos;
        ctx->n_past = it->pos;
    }
    memcpy(sv->solo_tab, it->blocks, sizeof(int32_t) * (size_t)nb);
    DnSnaps ps; /* snapshots inside the prompt chunk: its prefill takes them (n > 1 there) */
    ps.n = 0;
    ps.state_bf16 = sv->lay.state_bf16;
    for (int k = 0; k < it->n_snaps; k++) snaps_add(sv, &ps, it->pos + it->snap_off[k], it->snap_id[k]);
    ctx->pf_snaps = ps.n ? &ps : NULL;
    const int pen = it->sample && it->sample->n_pen > 0; /* logit changes: the row's pick goes through solo_pick */
    if (it->n == 1 && it->logits && it->pick && !it->logprob && !pen) { /* the screen or the sampler gives the id */
        DeviceSampling ds;
        memset(&ds, 0, sizeof ds);
        ds.top_p = 1.0f;
        if (it->sample) ds = *it->sample;
        rc = cuda_backend.decode_sample(ctx, it->tokens[0], it->pos, &ds, it->pick, err);
    } else if (it->logits && it->pick && !it->logprob && (!it->sample || !(it->sample->temperature > 0)) && !pen &&
               ctx->lm_screen) { /* a prompt's greedy id: the LM head through the screen, as a greedy decode step */
        rc = cuda_prefill_forward_greedy(ctx, it->tokens, it->n, it->pos, it->pick, err);
    } else if (it->logits && it->pick) { /* the row stays on the device for its pick and logprob */
        const float *row = NULL;
        if (it->n > 1) {
            rc = cuda_prefill_forward_dev(ctx, it->tokens, it->n, it->pos, &row, err);
        } else { /* forward()'s decode step, the logits left on the device */
            StepParams *sp = ctx->step_host;
            memset(sp, 0, sizeof *sp);
            sp->token = it->tokens[0];
            sp->pos = it->pos;
            sp->write_logits = 1;
            sp->top_p = 1.0f;
            if (!(rc = cuda_run_step(ctx, 0, err))) ctx->n_past++;
            row = ctx->logits;
        }
        if (!rc) rc = solo_pick(ctx, sv, row, it, err);
    } else { /* the host picks from the logits row */
        rc = cuda_backend.forward(ctx, it->tokens, it->n, it->pos, 0, it->logits ? logits : NULL, err);
    }
    ctx->pf_snaps = NULL;
    sv->solo_len = it->pos + it->n;
    if (it->n_snaps) sv->solo_keep = it->pos + it->snap_off[it->n_snaps - 1]; /* written back later, not now */
    if (rc) {
        sv->solo_slot = -1;
        return rc;
    }
    return 0;
}

extern "C" int cuda_step_batch(void *p, const BatchItem *items, int n, float *logits, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    CudaServe *sv = ctx->sv;
    if (!sv) return err_set(err, Q35_ERR_ARG, "cuda step: serving is not open");
    const int V = ctx->c->vocab_size, block = sv->lay.block;
    if (n < 0 || n > sv->lay.n_slots) return err_set(err, Q35_ERR_ARG, "cuda step: %d items", n);
    for (int i = 0; i < n; i++) {
        const BatchItem *it = &items[i];
        if (it->slot < 0 || it->slot >= sv->lay.n_slots || it->n <= 0 || !it->tokens || it->pos < 0 ||
            (int64_t)it->pos + it->n > ctx->max_seq || !it->blocks)
            return err_set(err, Q35_ERR_ARG, "cuda step: item %d (slot %d, %d tokens at %d) is outside the layout", i,
                           it->slot, it->n, it->pos);
        for (int j = 0; j <= (it->pos + it->n - 1) / block; j++)
            if (it->blocks[j] < 0 || it->blocks[j] >= sv->lay.n_blocks)
                return err_set(err, Q35_ERR_ARG, "cuda step: item %d: block %d outside [0, %d)", i, it->blocks[j],
                               sv->lay.n_blocks);
        for (int j = 0; j < it->n; j++)
            if (it->tokens[j] < 0 || it->tokens[j] >= V)
                return err_set(err, Q35_ERR_ARG, "cuda step: item %d: token id %d outside [0, %d)", i, it->tokens[j],
                               V);
        for (int k = 0; k < i; k++)
            if (items[k].slot == it->slot)
                return err_set(err, Q35_ERR_ARG, "cuda step: slot %d twice in one step", it->slot);
        if (it->n_snaps < 0 || it->n_snaps > DN_MAX_PTS || (it->n_snaps && (!it->snap_off || !it->snap_id)))
            return err_set(err, Q35_ERR_ARG, "cuda step: item %d: %d snapshots", i, it->n_snaps);
        for (int k = 0; k < it->n_snaps; k++)
            if (it->snap_off[k] <= (k ? it->snap_off[k - 1] : 0) || it->snap_off[k] >= it->n || it->snap_id[k] < -1 ||
                it->snap_id[k] >= sv->lay.n_snaps)
                return err_set(err, Q35_ERR_ARG, "cuda step: item %d: snapshot %d after %d tokens is not in the step",
                               i, it->snap_id[k], it->snap_off[k]);
    }
    /* a lone item on the context's own prefill (which takes its snapshots inside), or its decode step (with fp8 KV
     * pools its caches hold the e4m3 values: ctx->kv_e4m3) */
    if (!sv->det && n == 1 && (ctx->pf || !items[0].n_snaps)) return solo_step(ctx, sv, &items[0], logits, err);
    int rc = solo_flush(ctx, sv, err);
    if (rc) return rc;
    /* passes of at most tmax rows; an item longer than tmax in pieces of tmax, each its own pass */
    SvPiece pc[SV_MAX_PIECES]; /* up to 256 decode rows in one pass: one read of the weights */
    int np = 0, rows = 0;
    float *out = logits;
    const int max_pc = (int)(sizeof pc / sizeof pc[0]);
    for (int i = 0; i < n && !rc; i++) {
        const BatchItem *it = &items[i];
        for (int off = 0; off < it->n && !rc; off += sv->tmax) {
            const int m = it->n - off < sv->tmax ? it->n - off : sv->tmax;
            if (np && (rows + m > sv->tmax || np == max_pc)) {
                int n_out = 0;
                for (int k = 0; k < np; k++) n_out += pc[k].logits;
                rc = sv_pass(ctx, sv, pc, np, out, err);
                if (out) out += (size_t)n_out * V;
                np = rows = 0;
                if (rc) break;
            }
            pc[np].it = it;
            pc[np].off = off;
            pc[np].n = m;
            pc[np].pos = it->pos + off;
            pc[np].logits = it->logits && off + m == it->n && logits;
            pc[np].pick = pc[np].logits ? it->pick : NULL;
            pc[np].snaps.n = 0;
            pc[np].snaps.state_bf16 = sv->lay.state_bf16;
            for (int k = 0; k < it->n_snaps && !rc; k++) {
                if (it->snap_off[k] == off && it->snap_id[k] >= 0) { /* at the piece's start: the slot as it is now
                                                                      * (after the item's earlier pieces' passes) */
                    const cudaError_t e = slot_copy(sv, it->slot, snap_at(sv, it->snap_id[k]), 0, ctx->stream);
                    if (e != cudaSuccess) rc = sv_fail((int)e, "snapshot copy", -1, err);
                } else if (it->snap_off[k] > off && it->snap_off[k] < off + m) {
                    snaps_add(sv, &pc[np].snaps, it->pos + it->snap_off[k], it->snap_id[k]);
                }
            }
            if (rc) break;
            np++;
            rows += m;
        }
    }
    if (!rc && np) rc = sv_pass(ctx, sv, pc, np, out, err);
    return rc;
}
