/* serve_ops.h — launchers of the batched step's own kernels (serve_kernels.cu), for serve.cu, the emulator test
 * (tests/emu/serve_emu.cpp) and tests/gpu. A step holds T rows (every item's tokens, flattened); row t is position
 * pos[t] of its sequence. Conventions as ops.h: bf16 buffers are uint16_t bit patterns, small vectors fp32, every
 * launcher returns 0 or a cudaError_t value.
 *
 * Paged KV pool of one full-attention layer: bf16 [n_blocks][Hkv][block][hd] for K and the same for V, or with
 * kv_fp8 e4m3 codes in the same layout (one byte each: the value rounded to nearest even, saturated at +-448, no
 * scale: vLLM's --kv-cache-dtype fp8 with its default scales of 1). Row t's block table is tables[tab[t] ..]:
 * position p lives in row p % block of block tables[tab[t] + p / block]. */
#ifndef Q35_CUDA_SERVE_OPS_H
#define Q35_CUDA_SERVE_OPS_H

#include "cuda/ops.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* q/k head norm + partial NeoX RoPE at each row's own position (cuda_attn_prep's formulas, bit for bit), q to q_out,
 * K (normed, roped) and V appended to the paged pools at (row's block, pos % block). Grid (T, ceil((Hq+2Hkv)/4)). */
typedef struct PagedPrepParams {
    const uint16_t *qkv;        /* bf16 [T][ld]: as AttnPrepParams */
    int ld, q_hs, k_off, v_off; /* as AttnPrepParams */
    const float *q_norm, *k_norm, *inv_freq;
    uint16_t *q_out;          /* bf16 [T][Hq][hd] */
    void *k_pool, *v_pool;    /* bf16 (or kv_fp8: e4m3) [n_blocks][Hkv][block][hd] */
    const int32_t *pos, *tab; /* [T] */
    const int32_t *tables;    /* block tables (see above) */
    int T, Hq, Hkv, hd, R, block;
    int norm_mode;
    float eps;
    int kv_fp8; /* 1: the pools hold e4m3 codes: K and V are stored as e4m3(y) of the bf16 values y above */
} PagedPrepParams;
int cuda_paged_prep(const PagedPrepParams *p, const CudaLaunch *l);

/* Attention of every row over its own sequence's positions 0 .. pos[t] (causal; its K/V already in the pools):
 *   o = sum_s softmax_s(q . K_s * scale) V_s       (fp32 scores, softmax and sums)
 *   out[t][j hd + d] = bf16(o) (gate NULL) or bf16(bf16(o) bf16(sigmoid(gate))).
 * Flash-decoding in two kernels. 1: grid (Hq / GB, T, max_split): a CTA takes GB <= 8 query heads of one kv head
 * (each K / V row loaded once for them) of one row over one split of its positions, on the tensor cores, and writes
 * that split's (o unnormalised, max, sum) to work. 2: grid (Hq, T), hd threads: merges the row's splits in order
 * s = 0 .. n-1 and writes out.
 * A row of len = pos + 1 positions has n = ceil(len / chunk) splits of chunk = pa_chunk(len, max_split) positions: a
 * function of len and the launch's max_split alone, and every sum runs in a fixed order, so with a fixed max_split
 * (n_sm 0: PA_MAX_SPLIT, deterministic mode) a row's bits never depend on the other rows of the launch (batch
 * invariance). With n_sm set, max_split = pa_max_split(T, ctas_per_row, n_sm): fewer, longer splits where the rows
 * alone fill the GPU. hd % 32 == 0, hd <= 256; work holds paged_attn_work_floats(T, Hq, hd) floats (else
 * cudaErrorInvalidValue). */
#ifdef __CUDACC__
#define SV_HD __host__ __device__
#else
#define SV_HD
#endif
#define PA_MAX_SPLIT 16 /* splits per row at most */
#define PA_UNIT      64 /* a split's chunk is a multiple of this many positions */
SV_HD static inline int pa_chunk(int len, int max_split) { /* max_split 1 .. PA_MAX_SPLIT */
    const int units = (len + PA_UNIT - 1) / PA_UNIT;
    return PA_UNIT * ((units + max_split - 1) / max_split);
}
/* Splits per row at most for T rows of c CTAs per split on n_sm SMs: about PA_CTAS_PER_SM CTAs per SM in all
 * (three run at once per SM with bf16 pools, four with fp8 ones), at least one split, at most PA_MAX_SPLIT. Fewer
 * splits give each CTA more tiles for its fixed costs (q, the warps' merge, its partials, the merge kernel's reads). */
#define PA_CTAS_PER_SM 4
static inline int pa_max_split(int T, int c, int n_sm) {
    const long long want = (long long)PA_CTAS_PER_SM * n_sm, have = (long long)T * c;
    const long long s = (want + have - 1) / have;
    return s < 1 ? 1 : s > PA_MAX_SPLIT ? PA_MAX_SPLIT : (int)s;
}
/* work: [T][Hq][PA_MAX_SPLIT][hd + 2] floats (o [hd], max, sum; scores in base 2) */
static inline size_t paged_attn_work_floats(int T, int Hq, int hd) {
    return (size_t)T * Hq * PA_MAX_SPLIT * ((size_t)hd + 2);
}
typedef struct PagedAttnParams {
    const uint16_t *q;           /* bf16 [T][Hq][hd] */
    const void *k_pool, *v_pool; /* as PagedPrepParams */
    const uint16_t *gate; /* bf16, gate of row t, head j, dim d at gate[t gate_ld + j gate_hs + d]; or NULL */
    int gate_ld, gate_hs;
    uint16_t *out; /* bf16 [T][Hq hd] */
    const int32_t *pos, *tab, *tables;
    const int32_t *rows; /* [T]: the rows to compute (their indices into q, gate, out, pos, tab); NULL: rows 0 .. T-1 */
    int T, Hq, Hkv, hd, block;
    float scale;
    float *work;        /* the splits' partials (above) */
    size_t work_floats; /* its capacity */
    int early; /* 1: every row's positions before pos[t] were in the pools before this launch's predecessors ran (the
                * rows are one token each of distinct sequences), so their copies may go out before the wait on the
                * kernel before; 0: only after it */
    int kv_fp8; /* 1: the pools hold e4m3 codes, widened exactly in shared memory before the tensor cores */
    int n_sm;   /* 0: max_split = PA_MAX_SPLIT (deterministic mode); else the SM count: max_split = pa_max_split */
} PagedAttnParams;
int cuda_paged_attn(const PagedAttnParams *p, const CudaLaunch *l);

/* Copies positions start .. len-1 of one sequence from the paged pools into contiguous caches k_out, v_out bf16
 * [Hkv][stride][hd] (the single-sequence layout cuda_attn_prefill and the decode step read), or with scatter = 1 the
 * other way (the caches' rows back into the pages). table: the sequence's block table. hd % 8 == 0. With kv_fp8 the
 * pools hold e4m3 codes: widened exactly into the caches, rounded to nearest even (saturated) back into the pools.
 * Grid (len - start, Hkv, 2), hd / 8 threads. */
typedef struct PagedGatherParams {
    void *k_pool, *v_pool;
    const int32_t *table;
    uint16_t *k_out, *v_out;
    int len, stride, Hkv, hd, block;
    int start, scatter;
    int kv_fp8;
} PagedGatherParams;
int cuda_paged_gather(const PagedGatherParams *p, const CudaLaunch *l);

/* The DeltaNet decode step (cuda_deltanet_step with gated_out: the same formulas) for nd rows, each
 * on its own state slot: row rows[i] of proj (bf16 [T][ld_proj], [m | z | b | a]) at position pos[rows[i]], slot
 * slot[i] whose S is (float *)((char *)S0 + slot * stride) and conv ring (uint16_t *)((char *)ring0 + slot * stride)
 * (S0, ring0: slot 0's S and ring of this layer). Writes o[rows[i]] = bf16(o) (bf16 [T][Hv dv]). Two launches: the
 * conv / norms / gates of each (row, k-head), grid (Hk, nd), into ws; then the state pass, a persistent grid of
 * n_sm CTAs streaming whole heads for dv = 128 and an even dk <= 128 (sm_90), else (column splits, Hv, nd) with the
 * decode step's per-lane sums. ws: fp32, cuda_dn_batch_ws_bytes(nd, ...) bytes, 16-byte aligned; row i holds
 * q^ [Hk dk], k^ [Hk dk], v [Hv dv] (after conv + SiLU), beta [Hv], decay [Hv], k^.q^ [Hv] (its content is scratch
 * for the caller). */
typedef struct DnBatchParams {
    const uint16_t *proj;
    int ld_proj;
    const float *conv_w, *A_log, *dt_bias;
    float *S0;
    uint16_t *ring0;
    size_t stride; /* bytes between slots */
    const int32_t *rows, *slot, *pos;
    uint16_t *o;
    float *ws;
    int nd, Hk, Hv, dk, dv, K;
    int n_sm; /* CTAs of the whole-head state pass (one per multiprocessor: a persistent stream of heads) */
    /* y != NULL: also the gated RMSNorm of the rows' o into y (MV_IN_GATED's formula): per v-head j of row r,
     *   y[r][j dv + c] = bf16( bf16( norm_w[c] bf16(o_c rsqrt(mean_dv o^2 + eps)) ) silu(z_c) ),
     *   z = proj[r][z_off + j dv + c];
     * the whole-head pass applies it as each head's o is done, other shapes in a kernel after their state pass */
    const float *norm_w;
    uint16_t *y;
    int z_off;
    float eps;
    /* ba_w != NULL: the rows' b and a columns of proj are not written (an FP8 in_proj's bf16 b / a rows, which the
     * skinny GEMM would take as a GEMM of their own): prep computes them from the rows' normed input h,
     *   b_j = bf16(h . ba_w[j]),  a_j = bf16(h . ba_w[Hv + j]),  h = ba_x[rows[i]][0 .. ba_k)  (ld ba_k),
     * each dot by one warp (lanes over 8-element pieces in order, then the warp's tree). */
    const uint16_t *ba_w, *ba_x;
    int ba_k; /* a multiple of 8; ba_w and ba_x 16-byte aligned; Hv / Hk <= DN_BA_MAX_R */
    int state_bf16; /* 1: the slots' states are bf16 (S0 then points at bf16 entries; the whole-head pass only): each
                     * step reads them exactly, computes in fp32 and stores its new state rounded to nearest even */
    int early;      /* 1: the rows' conv history (their ring rows of earlier positions) was written by earlier passes:
                     * prep sums it before its PDL wait, while the in_proj GEMM before it still runs */
    int skip;       /* measurement only (serve_step --ablate): bit 0 leaves prep out, bit 1 the state pass (with its
                     * gated norm); the outputs are garbage */
} DnBatchParams;
enum { DN_BA_MAX_R = 8 };
size_t cuda_dn_batch_ws_bytes(int nd, int Hk, int Hv, int dk, int dv);
int cuda_dn_batch_step(const DnBatchParams *p, const CudaLaunch *l);

/* y[i][:] = x[rows[i]][:] (fp32 [.][D]), i < n. */
typedef struct GatherRowsParams {
    const float *x;
    const int32_t *rows;
    float *y;
    int n, D;
} GatherRowsParams;
int cuda_gather_rows(const GatherRowsParams *p, const CudaLaunch *l);

/* out[r] = the argmax of row r of x [rows][cols] over columns [0, n_valid) (ties: the smallest index; NaN never
 * wins; every value NaN: 0), as sampler_argmax on the host copy of the row, and lp[r] (lp optional) = its log-softmax
 * value, -log sum_i exp(x_i - max) over the valid columns (the logprob of the argmax). Two kernels: grid
 * (ceil(n_valid / AM_CHUNK), rows) CTAs each reduce AM_CHUNK logits to (max, smallest index, sum of exp(x - max)) in
 * work, then one warp per row reduces those: the argmax by a total order, the sum rescaled to the row's max in a
 * fixed lane tree, so neither depends on the other rows. work: at least rows_argmax_work_bytes(rows, n_valid) bytes
 * (else cudaErrorInvalidValue). */
#define AM_CHUNK 4096
static inline size_t rows_argmax_work_bytes(int rows, int n_valid) {
    return (size_t)rows * ((n_valid + AM_CHUNK - 1) / AM_CHUNK) * 12;
}
typedef struct RowsArgmaxParams {
    const float *x;
    int rows, cols, n_valid;
    int32_t *out;
    void *work; /* [rows][chunks] float maxima, [rows][chunks] int32 indices, [rows][chunks] float sums */
    size_t work_bytes;
    float *lp; /* [rows] or NULL */
} RowsArgmaxParams;
int cuda_rows_argmax(const RowsArgmaxParams *p, const CudaLaunch *l);
/* The second kernel alone, over the partials a GEMM_EPI_ARGMAX GEMM of rows rows and am_cols = n_valid left in work
 * (GEMM_AM_CHUNK-column chunks; work_bytes >= gemm_argmax_work_bytes(rows, n_valid)); x and cols unused. */
int cuda_rows_argmax_final(const RowsArgmaxParams *p, const CudaLaunch *l);

/* A logits row's changes before its pick (penalty.cu): entries[off .. off + n) of PenaltyParams.entries, sampler.h's
 * SamplePenalty list, under the row's three penalty values; n = 0: none. lse is penalty_apply's output. */
typedef struct PenaltyRow {
    int off, n;
    float repetition, presence, frequency;
    float lse; /* the raw row's log-sum-exp (penalty_apply writes it, penalty_finish reads it) */
} PenaltyRow;

/* rows logits rows of ld floats (ids [0, n_valid) can be picked). out_id / lp: cuda_rows_argmax's argmax ids and
 * log-softmax on entry to cuda_penalty_apply, which changes the rows' entries in place and moves out_id to the
 * changed rows' argmax; cuda_sample then draws; cuda_penalty_finish sets lp to the picked id's raw log-softmax. */
typedef struct PenaltyParams {
    float *logits;
    int rows, n_valid;
    size_t ld;
    PenaltyRow *row;              /* [rows] */
    const SamplePenalty *entries; /* the rows' entries; each id at most once per row */
    float *raw;                   /* [entries] the entries' raw logits (apply writes, finish reads) */
    int32_t *out_id;              /* [rows] */
    float *lp;                    /* [rows] */
} PenaltyParams;
int cuda_penalty_apply(const PenaltyParams *p, const CudaLaunch *l);
int cuda_penalty_finish(const PenaltyParams *p, const CudaLaunch *l);

#ifdef __cplusplus
}
#endif
#endif
