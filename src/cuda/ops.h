/* ops.h — extern "C" launchers of the CUDA kernels, one params struct per op. Included by the
 * .cu files, by backend.cu/decode.cu and by the C tests in tests/gpu (plain C11 + the CUDA
 * runtime API). Conventions (CUDA_DESIGN.md):
 *   - weights bf16 row-major [out, in] (uint16_t bits); small vectors fp32;
 *   - activations fp32 holding bf16-rounded values where HF rounds (MODEL.md §4.1);
 *   - every launcher is `int cuda_<op>(const <Op>Params *p, const CudaLaunch *l)` and returns
 *     0 or a cudaError_t value (cudaErrorInvalidValue for shapes it does not support);
 *   - per-token values (token id, position, sampling) live in a device StepParams that kernels
 *     read, so a captured graph replays unchanged. StepParams is written only by the graph's
 *     first node (a copy from pinned host memory): kernels may read it before pdl_wait();
 *   - PDL: see the contract at the top of common.cuh. */
#ifndef Q35_CUDA_OPS_H
#define Q35_CUDA_OPS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How to launch: the stream, and whether to use programmatic dependent launch. */
typedef struct CudaLaunch {
    cudaStream_t stream;
    int pdl;
    const void *l2_base; /* with l2_bytes > 0: this launch's accesses to [l2_base, +l2_bytes) persist in L2 */
    size_t l2_bytes;     /* (the set-aside is made at open: ctx->l2_persist) */
} CudaLaunch;

/* Per-token values, in device memory. */
typedef struct StepParams {
    int token;                       /* input token id, 0 <= token < vocab_size */
    int pos;                         /* its position; the KV cache holds positions 0 .. pos after the step */
    int write_logits;                /* 1: the LM head stores fp32 logits [V] (forward(), sampling) */
    int top_k;                       /* sampling: 0 = off */
    float temperature, top_p, min_p; /* temperature <= 0: argmax */
    int pad_;
    uint64_t seed, step;       /* sampling RNG: u = q35 counter hash of (seed, step), see sample.cu */
    unsigned long long lm_key; /* the LM head screen's result and running max (LmScreenParams key, gmax): 0 from */
    unsigned lm_gmax, pad2_;   /* the host, so the step's params copy resets them */
} StepParams;

/* FP8_SCALES_DOC. An FP8 weight on the device (docs/FP8.md): e4m3 bytes W8 [rows][cols] and fp32 scales
 * w8_scale [ceil(cols/128)][fp8_scale_ld(rows)]: W[r][c] = e4m3(W8[r][c]) * w8_scale[(c / 128) ld + r]. One scale per
 * row and 128-column block, column-block-major, rows padded to a multiple of 4: the checkpoint's 128 x 128 block
 * scales expanded per row at upload (a 4-row group's scales are one 16-byte load; stacked and interleaved matrices,
 * whose 128-row blocks mix source matrices, keep each row's own scale). 1/32 of the FP8 bytes. */
static inline int fp8_scale_ld(int rows) { return (rows + 3) & ~3; }
static inline size_t fp8_scale_count(int rows, int cols) { return (size_t)((cols + 127) / 128) * fp8_scale_ld(rows); }

/* ---- GEMV family (gemv.cu) ----------------------------------------------------------------
 * y = W x for one token, W bf16 [rows][cols] (cols % 8 == 0, rows 16-byte aligned), fp32
 * accumulation. A warp owns groups of 4 consecutive rows, lanes stride the columns 8 at a time
 * (16-byte loads); grid.y = splits cuts the columns into slices (split-K).
 * FP8 weights (W8 and w8_scale set, W NULL; docs/FP8.md): W[r][c] = e4m3(W8[r][c]) * w8_scale[c/128][r], the
 * device layout of FP8 scales (FP8_SCALES_DOC below), cols % 16 == 0; lanes stride the columns 16
 * at a time, each lane's 16 products (one 128-column block) summed, then times the row's scale for that block (one
 * 16-byte load brings a row group's 4). Every mode below, same outputs.
 *
 * Input prologue (in_mode), computed by every block into shared memory:
 *   MV_IN_VEC       x[cols] as given (bf16-valued).
 *   MV_IN_EMBED     x = E[step->token] (bf16 table [V][cols]).
 *   MV_IN_GATED     (MV_OUT_SPLITK only; the DeltaNet out_proj when the step leaves its gated norm
 *                   to it, the default where the shapes allow) x = o [cols] in groups of `group` (the heads),
 *                   gate = z [cols]:
 *                   x_i = bf16( bf16( norm_w[i % group] bf16(o_i r_g) ) silu(z_i) ), r_g = rsqrt(mean_g o^2
 *                   + eps) over i's group; every split holds whole groups (at most 32).
 *   MV_IN_RESIDUAL  x = bf16( res[i] + bf16( sum_{s < n_parts} parts[s*cols + i] ) )   (residual add;
 *                   parts are split-K partials, summed in fixed order; n_parts = 1 for an atomic
 *                   accumulator).
 *   then EMBED/RESIDUAL: block (0,0) writes x to x_out (the new residual stream; x_out must not
 *   alias res), and, when norm_w is set, x <- RMSNorm(x):
 *     NORM_ZC    (Qwen3.5, zero-centred)  h = bf16( x r (1 + w) ),  r = rsqrt(mean x^2 + eps)
 *     NORM_PLAIN (Qwen3)                  h = bf16( w bf16(x r) )
 *   h_out (optional, probes): block (0,0) writes the normed input.
 *   zero (optional): after pdl_wait the grid zeroes zero[0 .. n_zero) (an atomic split-K
 *   accumulator that a LATER kernel adds into; it must not be read by this kernel).
 *
 * early_trigger    1: launch_dependents at kernel start instead of after the prologue.
 *
 * Output epilogue (out_mode):
 *   MV_OUT_STORE    y[r] = bf16( sum )
 *   MV_OUT_SILU_MUL rows interleaved (gate_0, up_0, gate_1, up_1, ...):
 *                   y[i] = bf16( bf16(silu(bf16 g_i)) * bf16 u_i ),  y has rows/2 entries
 *   MV_OUT_SPLITK   atomic = 1: atomicAdd(y[r], partial) into a zeroed y (not rounded);
 *                   atomic = 0: y[s*rows + r] = partial of split s (deterministic; the consumer sums
 *                   the splits in order, e.g. MV_IN_RESIDUAL with n_parts = splits)
 *   MV_OUT_ARGMAX   the LM head: logit[r] = bf16(sum); when step->write_logits, logits[r] = logit
 *                   for all rows; argmax over r < n_valid (ties -> smallest index) -> *out_id and
 *                   its value -> *out_max. Needs am_val/am_idx [gridDim.x] scratch and *am_count
 *                   (zero at first use, left zero). splits must be 1. */
enum { MV_IN_VEC = 0, MV_IN_EMBED = 1, MV_IN_RESIDUAL = 2, MV_IN_GATED = 3 };
enum { MV_OUT_STORE = 0, MV_OUT_SILU_MUL = 1, MV_OUT_SPLITK = 2, MV_OUT_ARGMAX = 3 };
enum { NORM_NONE = 0, NORM_ZC = 1, NORM_PLAIN = 2 };

typedef struct MatvecParams {
    const uint16_t *W; /* bf16 [rows][cols] (NULL with W8) */
    int rows, cols;
    int splits; /* >= 1; MV_OUT_SPLITK only (others use 1) */
    int blocks; /* grid.x; 0 = launcher's choice (cuda_matvec_blocks) */
    /* input */
    int in_mode;
    const float *x;     /* VEC: the input [cols]; RESIDUAL: the residual stream before the add */
    const float *parts; /* RESIDUAL: [n_parts][cols] */
    int n_parts;
    const uint16_t *embed;  /* EMBED: bf16 [V][cols] */
    const StepParams *step; /* EMBED, ARGMAX */
    float *x_out;           /* EMBED/RESIDUAL: new residual stream [cols] (may be NULL) */
    const float *norm_w;    /* [cols] or NULL */
    int norm_mode;
    float eps;
    float *h_out; /* optional: the normed input [cols] */
    float *zero;  /* optional: zeroed [n_zero] */
    int n_zero;
    /* output */
    int out_mode;
    int atomic; /* MV_OUT_SPLITK */
    float *y;
    /* MV_OUT_ARGMAX */
    float *logits; /* [rows] */
    int n_valid;
    float *am_val;      /* [blocks] */
    int *am_idx;        /* [blocks] */
    unsigned *am_count; /* [1] */
    int *out_id;
    float *out_max;
    int early_trigger;
    /* MV_IN_GATED */
    const float *gate; /* z [cols] */
    int group;         /* elements per norm group (dv) */
    /* MV_OUT_ARGMAX, optional: [CUDA_MV_WORK_WORDS] ticket counters (zero at first use, left zero). NULL: warp w of
     * block b takes row groups b W + w + i G W (G blocks of W warps, every round i); else the last work_tail (>= 1)
     * rounds' groups go to warps by tickets as they finish: the SMs' DRAM service differs by +-5 %, so a fixed
     * share ends up to ~15 us apart on the LM head. Same row sums and argmax either way
     * (ties -> smallest index). */
    unsigned *work;
    int work_tail;
    /* FP8 weights (instead of W; at the end so that the bf16 kernels' parameter offsets stay as they were) */
    const uint8_t *W8;     /* fp8 e4m3 [rows][cols] */
    const float *w8_scale; /* fp32 [ceil(cols/128)][fp8_scale_ld(rows)] (FP8_SCALES_DOC), 16-byte aligned */
} MatvecParams;

#define CUDA_MV_WORK_WORDS 256 /* MatvecParams.work */
int cuda_matvec(const MatvecParams *p, const CudaLaunch *l);
/* 1 when MV_IN_GATED takes cols split `splits` ways in norm groups of `group` (every split whole groups,
 * at most 32 per split). Also the test for FP8 weights when group % 16 == 0 (dv 128): their slices round to 16
 * columns instead of 8, and a slice of whole such groups is a multiple of 16 either way, so the same slice. */
int cuda_matvec_gated_ok(int cols, int splits, int group);
/* Split-K factor that fills n_sm SMs for a rows x cols GEMV (1 when rows suffice). Every split
 * is non-empty. */
int cuda_matvec_splits(int rows, int cols, int n_sm);
/* grid.x the launcher uses when p->blocks == 0 (callers size am_val/am_idx with it). */
int cuda_matvec_blocks(int rows, int cols, int splits, int n_sm);
/* The same two for FP8 weights (W8): the plan by bytes (an FP8 row reads like a bf16 row of half the columns),
 * slices rounded to 16 columns. */
int cuda_matvec_splits_fp8(int rows, int cols, int n_sm);
int cuda_matvec_blocks_fp8(int rows, int cols, int splits, int n_sm);

/* ---- the LM head's argmax through a quantized screen (lm_screen.cu; the greedy step without logits) -----------
 * The same id and value as cuda_matvec(&head) in MV_OUT_ARGMAX (bit for bit), reading quantized copies of head.W
 * (cuda_lm_quantize) plus the bf16 rows of the few candidates a rigorous bound leaves (lm_screen.cu's header), as one
 * key in *key (cuda_lm_key_id; head.out_id, out_max, logits, am_* and work unused): every block folds its best in
 * with a 64-bit atomic max. head: MV_IN_VEC or MV_IN_RESIDUAL, splits 1, blocks >= 1 (the grid), cols % 16 == 0. */
typedef struct LmScreenParams {
    MatvecParams head;
    unsigned long long *key; /* [1], zero before each launch: the best (value, id) as a key */
    unsigned *gmax;          /* ring kernel, optional [1], zero before each launch: the blocks' running max of L */
    const int8_t *Wq;        /* register kernel: [rows][cols]: q = rint(w / sc_r) in [-127, 127] */
    const uint8_t *Wp;       /* ring kernel: the 6 high bits of u = q + 128 [rows][3 cols / 4] */
    const float *meta;       /* [rows][4]: sc_r, c_r, l1_r, c6_r (the bounds' coefficients) */
    unsigned *stats;         /* optional [3], added to: rows recomputed exactly, blocks computing all rows, blocks */
    int reg;                 /* 1: the register kernel where the TMA ring runs (cols 1024 / 2048) */
} LmScreenParams;
int cuda_lm_screen_ok(int rows, int cols);
/* *key -> the argmax id (0 if none won, as MV_OUT_ARGMAX), its value in v: larger keys win, ties the smaller id */
int cuda_lm_key_id(unsigned long long key, float *v);
int cuda_lm_screen(const LmScreenParams *p, const CudaLaunch *l);
/* Wq (or NULL), Wp (or NULL; cols % 1024 == 0) and meta from the bf16 head W [rows][cols] (once, at load); Wt (or
 * NULL) and meta_rows: the rows screen's int8 tiles and coefficients (lm_screen_rows.cu; cols % 128 == 0), with
 * meta then NULL or not. */
int cuda_lm_quantize(const uint16_t *W, int rows, int cols, int8_t *Wq, uint8_t *Wp, float *meta, int8_t *Wt,
                     float *meta_rows, const CudaLaunch *l);
int cuda_lm_screen_ring(int rows, int cols); /* 1: cuda_lm_screen runs the ring kernel (reg = 0; Wp needed) */

/* ---- the LM head's argmax of up to 64 rows through a quantized screen (lm_screen_rows.cu; the batched step's
 * greedy rows) ----------------------------------------------------------------------------------------------------
 * out[m] = the argmax over [0, n_valid) of row m's logits y[m][r] = bf16(h_m . W_r) as the skinny GEMM computes them
 * (cuda_gemm_skinny, GEMM_EPI_F32; ties: the smaller id; NaN never wins; none: 0), bit for bit, for m < rows <= 64:
 * an int8 copy of W in tiles (cuda_lm_quantize's Wt, meta_rows) bounds every logit of every row, and only the rows
 * whose bound reaches a row's best lower bound are computed exactly, by the skinny GEMM over those rows alone
 * (GemmParams.gather). Needs sm_90a, D % 128 == 0, D <= 1024, and the skinny GEMM's plan of V x D in one split
 * (cuda_gemm_skinny_work 0, as for the 0.8B head); invalid otherwise. Four launches. */
typedef struct LmRowsParams {
    const uint16_t *h; /* bf16 [rows][ldh]: the rows' final-normed hidden states */
    int rows, ldh;
    const uint16_t *W; /* bf16 [V][D]: the head */
    const int8_t *Wt;  /* cuda_lm_quantize's tiles of W */
    const float *meta; /* cuda_lm_quantize's meta_rows [V][4] */
    int V, D, n_valid; /* n_valid <= V: the ids that take part */
    void *ws;          /* cuda_lm_rows_ws_bytes(V, D) bytes, 16-byte aligned, zeroed once before the first call */
    float *y;          /* fp32 [rows][V]: the candidates' exact logits (scratch) */
    int32_t *out;      /* [rows] */
    int n_sm;
} LmRowsParams;
int cuda_lm_rows_ok(int V, int D);             /* 1: this device and shape take cuda_lm_rows */
size_t cuda_lm_rows_ws_bytes(int V, int D);    /* the workspace */
size_t cuda_lm_rows_tiles_bytes(int V, int D); /* cuda_lm_quantize's Wt */
int cuda_lm_rows(const LmRowsParams *p, const CudaLaunch *l);
/* after a call: the rows computed exactly (the screen's candidates of all rows), read back synchronously; -1 on an
 * error */
long cuda_lm_rows_count(const LmRowsParams *p);

/* ---- fused MLP of one token (mlp.cu; the decode step's MLP in atomic mode) ----------------------------
 * The two MLP GEMVs of the decode step in one kernel (one kernel boundary less per layer):
 *   x   = bf16( res[i] + bf16( sum_{s < n_parts} parts[s*D + i] ) )      (as MV_IN_RESIDUAL; block 0
 *         writes x_out, which must not alias res)
 *   h   = RMSNorm(x, norm_w)  (NORM_ZC / NORM_PLAIN, as the GEMV prologue)
 *   g_i = W_gu[2i] h,  u_i = W_gu[2i+1] h      (W_gu bf16 [2F][D], interleaved gate/up rows)
 *   a_i = bf16( bf16(silu(bf16 g_i)) * bf16 u_i )                 (bitwise MV_OUT_SILU_MUL's output)
 *   y[d] += sum_i a_i W_dT[i][d]                (W_dT bf16 [F][D] = W_down transposed; fp32 atomics)
 * Grid: `blocks` blocks of 512 threads (0 = cuda_mlp_fused_blocks), 1 per SM. Block b owns the units
 * [b F / G, (b+1) F / G): before pdl_wait it loads the first gate/up rows of every warp (4 rows = 2
 * units per warp, 16-byte loads as the GEMV's) and cp.asyncs its W_dT rows (units x D x 2 bytes)
 * into shared memory; after the prologue each warp reduces its rows into a_i (shared memory), then
 * each thread sums 2 columns of y over the block's units (ascending) and lane pairs add 4 columns
 * with one red.global.add.v4.f32 (sm_90) into y, which an EARLIER kernel zeroed (not
 * deterministic: atomics in arrival order). Needs D % 8 == 0, D <= 1024, y 16-byte aligned, and
 * the block's W_dT rows in shared memory (cuda_mlp_fused_smem_bytes <= the device's opt-in limit).
 * FP8 weights (w8_gu, s_gu, w8_dT, s_dT all set, w_gu = w_dT = NULL; FP8_SCALES_DOC; a mix is refused):
 *   W_gu[r][k] = e4m3(w8_gu[r][k]) * s_gu[(k / 128) fp8_scale_ld(2F) + r],
 *   W_dT[i][d] = e4m3(w8_dT[i][d]) * s_dT[(i / 128) fp8_scale_ld(D) + d]   (w8_dT[i][d] = W8_down[d][i]; s_dT is
 *                W_down's own per-row table: row d, 128-column block i / 128);
 *   g_i, u_i bitwise those of cuda_matvec's FP8 GEMV (splits 1), so a_i is bitwise its MV_OUT_SILU_MUL output;
 *   y[d] += sum over the 128-unit blocks m that the CTA's units touch (ascending) of
 *           s_dT[m][d] * sum_{i in m} a_i e4m3(w8_dT[i][d])           (the fp32 order: mlp.cu's header).
 *   Needs D % 16 == 0, all four pointers 16-byte aligned, and the block's W_dT rows (bytes) plus their scale rows in
 *   shared memory (cuda_mlp_fused_smem_bytes_fp8). */
typedef struct MlpFusedParams {
    const uint16_t *w_gu; /* bf16 [2F][D] */
    const uint16_t *w_dT; /* bf16 [F][D] */
    int D, F;
    int blocks;         /* grid; 0 = cuda_mlp_fused_blocks(F, n_sm) */
    const float *x;     /* residual stream before the add [D] */
    const float *parts; /* [n_parts][D] or NULL (then x is used as is) */
    int n_parts;
    float *x_out;        /* optional: the new residual stream [D] (block 0) */
    const float *norm_w; /* [D] (ln2) */
    int norm_mode;       /* NORM_ZC or NORM_PLAIN */
    float eps;
    float *y;          /* [D] fp32 accumulator, zeroed before this kernel */
    float *h_out;      /* optional (tests, probes): the normed input [D] (block 0) */
    float *act_out;    /* optional (tests, probes): a [F] */
    int early_trigger; /* 1: launch_dependents at kernel start (ops.h GEMV early_trigger) */
    /* FP8 weights (instead of w_gu / w_dT; at the end so that existing initialisers stay valid) */
    const uint8_t *w8_gu; /* e4m3 [2F][D], interleaved gate/up rows */
    const float *s_gu;    /* fp32 [ceil(D/128)][fp8_scale_ld(2F)] */
    const uint8_t *w8_dT; /* e4m3 [F][D], W_down transposed */
    const float *s_dT;    /* fp32 [ceil(F/128)][fp8_scale_ld(D)]: W_down's scales */
} MlpFusedParams;
int cuda_mlp_fused(const MlpFusedParams *p, const CudaLaunch *l);
/* min(n_sm, F / 2), at least 1. */
int cuda_mlp_fused_blocks(int F, int n_sm);
/* Dynamic shared memory of the kernel for this shape and grid (bf16 weights; _fp8: FP8 weights). */
size_t cuda_mlp_fused_smem_bytes(int D, int F, int blocks);
size_t cuda_mlp_fused_smem_bytes_fp8(int D, int F, int blocks);
/* 1 when cuda_mlp_fused supports D x F on the current device with the default grid, else 0 (_fp8: FP8 weights). */
int cuda_mlp_fused_supported(int D, int F, int n_sm);
int cuda_mlp_fused_supported_fp8(int D, int F, int n_sm);

/* ---- elementwise and utility (elementwise.cu) ------------------------------------------------ */

/* Fills bf16 buf[n] with uniform values in [-scale, scale) from a counter hash of (seed, i)
 * (bench: random KV cache contents). */
typedef struct FillParams {
    uint16_t *buf;
    int64_t n;
    uint64_t seed;
    float scale;
} FillParams;
int cuda_fill_bf16(const FillParams *p, const CudaLaunch *l);

/* An FP8 weight (FP8_SCALES_DOC) as bf16, for the prefill GEMMs: out[r ldo + c] = bf16(e4m3(w8[r cols + c]) *
 * scale[(c / 128) fp8_scale_ld(rows) + r]) for r < rows, c < cols (cols % 16 == 0). One rounding per weight (e4m3
 * has 4 significant bits, so the product rounds to bf16 within 2^-9 relative). Grid-stride over 16-column pieces. */
typedef struct Fp8ToBf16Params {
    const uint8_t *w8;
    const float *scale;
    uint16_t *out;
    int rows, cols, ldo; /* ldo % 8 == 0 */
} Fp8ToBf16Params;
int cuda_fp8_to_bf16(const Fp8ToBf16Params *p, const CudaLaunch *l);

/* dst[i] = src[i], i < n, between fp32 and bf16 storage: to_bf16 = 1 rounds fp32 src to nearest even into bf16 dst,
 * 0 widens bf16 src into fp32 dst (exact). A lone sequence's DeltaNet states between a bf16 serve slot and the
 * context's fp32 layers. Grid-stride. */
typedef struct CastParams {
    const void *src;
    void *dst;
    int64_t n;
    int to_bf16;
} CastParams;
int cuda_cast_f32_bf16(const CastParams *p, const CudaLaunch *l);

/* Bandwidth probe: reads src[n_u4] (16-byte words) once, writes one word per block to sink. */
typedef struct ReadBwParams {
    const void *src;
    int64_t n_u4;
    unsigned *sink; /* [gridDim.x] */
    int blocks;
} ReadBwParams;
int cuda_read_bw(const ReadBwParams *p, const CudaLaunch *l);

/* ---- sampling (sample.cu) ----------------------------------------------------------------------
 * One draw per row r < rows from bf16-valued logits[r ld .. r ld + n_valid) with step[r].temperature > 0, the same
 * rules as the host sampler (sampler.c): candidates are ids with logit >= max - 40 T; sort by value descending, ties
 * by smaller id; top_k keeps the first k; top_p keeps the shortest prefix whose mass reaches top_p times the kept mass;
 * min_p keeps ids with p >= min_p p_max (at least one); then r = u * kept mass, and the first id in that order whose
 * running mass exceeds r. u = uniform from the counter hash of (step[r].seed, step[r].step) (q35_uniform in
 * sample.cu, counter_uniform in util.h). Rows with temperature <= 0 are left alone (out_id keeps the argmax).
 * Two kernels, grid (blocks, rows), each row's last block finishing; scratch: rows x cuda_sample_scratch_bytes().
 * The result does not depend on blocks or on the other rows.
 * max_logit: [rows] maxima over each row's [0, n_valid) (MV_OUT_ARGMAX's out_max), or NULL: out_id[r] holds the
 * row's argmax on entry (cuda_rows_argmax's), whose logit is the maximum.
 * lp (optional, with max_logit NULL): [rows] the argmax's log-softmax on entry (cuda_rows_argmax's lp); a sampled row
 * gets its drawn id's there, l[id] - (l[argmax] - lp). */
typedef struct SampleParams {
    const float *logits;
    int n_valid;
    int rows;               /* 0 counts as 1 */
    size_t ld;              /* floats between rows' logits */
    const StepParams *step; /* [rows] */
    const float *max_logit;
    void *scratch; /* rows x cuda_sample_scratch_bytes(), zeroed once before first use, left reusable */
    int blocks;    /* per row; 0 = launcher's choice */
    int *out_id;   /* [rows] */
    float *lp;
} SampleParams;
int cuda_sample(const SampleParams *p, const CudaLaunch *l);
size_t cuda_sample_scratch_bytes(int n_sm);

/* ---- mixer ops (cudab) ---- */

/* ---- Gated DeltaNet decode step (deltanet.cu) ------------------------------------------------
 * One token through the DeltaNet mixer between the stacked in_proj GEMV and out_proj (MODEL.md
 * §3.3, numerics §4.1). key_dim = Hk*dk, value_dim = Hv*dv, conv_dim = 2*key_dim + value_dim.
 *   proj [conv_dim + value_dim + 2*Hv] = [m | z | b | a], the GEMV output (bf16-valued)
 *   c   = bf16(silu(bf16( sum_{j<K-1} w[ch][j] m_{pos-(K-1)+j}[ch] + w[ch][K-1] m[ch] )))   (conv)
 *   q,k = c[0:key_dim], c[key_dim:2 key_dim] as [Hk][dk];  v = c[2 key_dim:] as [Hv][dv]
 *   k^ = k rsqrt(sum k^2 + 1e-6),  q^ = q rsqrt(sum q^2 + 1e-6) dk^-1/2   (fp32, per k-head)
 *   beta = bf16(sigmoid(b)),  g = -exp(A_log) softplus(a + dt_bias)       (v-head j -> k-head j/(Hv/Hk))
 *   S *= exp(g);  delta = beta (v - S^T k^);  S += k^ delta^T;  o = bf16(S^T q^)
 *   y = bf16( bf16(w * bf16(o rsqrt(mean_dv o^2 + eps))) * silu(z) )      (gated RMSNorm per v-head)
 * Conv state: a ring of K rows, conv_ring bf16 [K][conv_dim]; row p % K holds the pre-conv m of
 * position p (K*conv_dim*2 bytes per layer, 48 KiB for 0.8B). The step reads rows (pos-K+1 .. pos-1)
 * mod K and writes row pos % K, so no block ever reads a row another block writes. Zero the ring
 * at sequence start (positions < 0 read as 0); a prefill that fills it must use the same indexing.
 * Grid: (splits, Hv) blocks in clusters of `splits` (sm_90): each block owns a slice of one head's
 * dv columns (docs/PERF.md); the gated norm's sum of squares is exchanged through
 * distributed shared memory. Needs Hv % Hk == 0, dv <= 1024, dk <= 1024 and at most 512 threads per block
 * (tpr * ceil(dk / 4), tpr = threads per state row: 4 for dv 128, 8 for dv 256). Deterministic. */
typedef struct DeltanetStepParams {
    const float *proj;      /* [conv_dim + value_dim + 2*Hv] in_proj output: [m | z | b | a] */
    const float *conv_w;    /* [conv_dim][K] conv1d taps (bf16-valued); tap K-1 = current token */
    uint16_t *conv_ring;    /* bf16 [K][conv_dim], in/out (see above) */
    const float *A_log;     /* [Hv] */
    const float *dt_bias;   /* [Hv] */
    const float *norm_w;    /* [dv] linear_attn.norm.weight (plain weight, bf16-valued by default) */
    float *S;               /* [Hv][dk][dv] fp32 recurrent state, in/out */
    float *y;               /* [Hv*dv] gated-norm output (bf16-valued), the out_proj input */
    float *o;               /* optional (NULL): [Hv*dv] bf16(o) before the norm (probes, tests) */
    const StepParams *step; /* step->pos */
    int Hk, Hv, dk, dv, K;
    float eps;     /* rms_norm_eps (gated norm) */
    int gated_out; /* 1 = write o only (o required, y unused) and leave the gated norm to out_proj
                             * (MV_IN_GATED); no thread-block cluster (the engine's default where the shapes allow) */
} DeltanetStepParams;
int cuda_deltanet_step(const DeltanetStepParams *p, const CudaLaunch *l);
/* Bytes of conv_ring per layer: K * conv_dim * 2. */
size_t cuda_deltanet_conv_ring_bytes(int Hk, int Hv, int dk, int dv, int K);

/* ---- the DeltaNet layer's mixer in one kernel (deltanet_layer.cu) -------------------------------------------------
 * in_proj GEMV (prologue: residual add + RMSNorm, or the embedding row) -> conv + SiLU -> the delta-rule
 * step -> gated RMSNorm -> out_proj, for one token, as ONE kernel: the step of v-head j needs only head
 * j's rows of in_proj, and out_proj's columns of head j only head j's output, so nothing waits for the
 * whole grid. Grid (8, Hv), 512 threads: block (s, j) computes rows [16 s, 16 s + 16) of head j's q, k, v
 * and z (the GEMV's 4-row groups, bitwise its values) and head j's b and a; the 8 blocks of a head exchange
 * the conv'd q/k so every block runs the step on its 16 value columns exactly as cuda_deltanet_step with
 * gated_out (bitwise the same o and S); a second exchange gives every block the head's o and z, it applies
 * MV_IN_GATED's formula (bitwise) and adds rows [s D / 8, (s+1) D / 8) of W_out[:, head j] g into y with
 * atomics (fp32, arrival order). These two exchanges go through the head's cluster (xbuf NULL; needs every
 * head's cluster of 8 resident at once). With xbuf (global memory; needs every block resident) there is ONE
 * exchange per layer: the block holds 16 rows of the head's state (deltanet_layer.cu DL_X1_SLOT) and publishes its
 * partials as tagged words; o and S are then within fp32 rounding of the two-exchange kernel's, not bitwise.
 * Every weight, the state slice and the conv history are loaded before the PDL wait. Needs Hk == Hv,
 * dk == dv == 128, D % 32 == 0, cuda_dn_layer_supported. Not deterministic (the atomics). */
typedef struct DnLayerParams {
    const uint16_t *w_in;   /* bf16 [conv_dim + value_dim + 2 Hv][D]: q | k | v | z | b | a rows */
    const uint16_t *embed;  /* layer 0: x = embed[step->token] (bf16 [V][D]); else NULL */
    const float *x, *parts; /* else x = bf16(x + bf16(sum of n_parts parts [D])) (parts NULL: x) */
    int n_parts;
    float *x_out;        /* optional: x (block (0, 0)) */
    const float *ln1;    /* [D] input norm weights */
    int norm_mode;       /* NORM_ZC or NORM_PLAIN */
    float *proj;         /* optional (tests): the in_proj rows, as the GEMV's y */
    const float *conv_w; /* as DeltanetStepParams */
    uint16_t *conv_ring;
    const float *A_log, *dt_bias, *norm_w;
    float *S;
    float *o;              /* optional (tests): [Hv dv] o before the gated norm */
    const uint16_t *w_out; /* bf16 [D][Hv dv] */
    float *y;              /* [D] fp32 accumulator, zeroed by an earlier kernel */
    float *zero0, *zero1;  /* optional: [n_zero] buffers this kernel zeroes after its wait */
    int n_zero;
    float *xbuf;     /* NULL: the exchanges through the cluster's shared memory; else through global */
    unsigned *xcnt;  /* memory: xbuf [cuda_dn_layer_xbuf_floats(Hv)], xcnt [cuda_dn_layer_xcnt_count] zeroed once */
    int xcnt_stride; /* counter k at xcnt[k stride] (0: 1; 32: one 128-byte line each) */
    const StepParams *step;
    int D, Hk, Hv, dk, dv, K;
    float eps; /* rms_norm_eps: the input norm and the gated norm */
    /* FP8 weights (instead of w_in and w_out, which are then NULL; D % 16 == 0): w8_in e4m3 [conv_dim + value_dim][D]
     * (q | k | v | z rows) with scales s_in (FP8_SCALES_DOC), summed as the FP8 GEMV sums them; w_ba bf16 [2 Hv][D]
     * (in_proj_b rows, then in_proj_a rows); w8_out e4m3 [D][Hv dv] with scales s_out */
    const uint8_t *w8_in;
    const float *s_in;
    const uint16_t *w_ba;
    const uint8_t *w8_out;
    const float *s_out;
} DnLayerParams;
/* 0: shape not supported or the grid does not fit; 1: supported with xbuf / xcnt (every block resident at
 * once, the exchanges through global memory); 2: also through clusters (every head's cluster of 8 resident
 * at once: not on a 132-SM H200 for 16 heads, whose clusters of 8 span at most 120 SMs). */
int cuda_dn_layer_supported(int D, int Hk, int Hv, int dk, int dv, int K);
size_t cuda_dn_layer_xbuf_floats(int Hv);
size_t cuda_dn_layer_xcnt_count(int Hv, int stride);
int cuda_dn_layer(const DnLayerParams *p, const CudaLaunch *l);

/* ---- full-attention decode (attention.cu) ----------------------------------------------------
 * One token of GQA attention over one layer's bf16 KV cache (MODEL.md §3.2 Qwen3.5, §5 Qwen3).
 * Query head j reads kv head j / G, G = Hq/Hkv; pos = step->pos, kv_len = pos + 1.
 *   qkv = [q part | k [Hkv][hd] | v [Hkv][hd]], the stacked q|k|v GEMV output (bf16-valued);
 *         q part = [Hq][2 hd] rows [q_j | gate_j] when gated (Qwen3.5), else [Hq][hd].
 *   head norm over hd:  NORM_ZC    y = bf16( x r (1 + w) )        (Qwen3.5 q_norm/k_norm)
 *                       NORM_PLAIN y = bf16( w bf16(x r) )         (Qwen3),  r = rsqrt(mean x^2 + eps)
 *   RoPE (NeoX, dims [0,R), pairs (i, i+R/2)): c = bf16(cos(pos inv_freq[i])), s = bf16(sin(..)),
 *         x'[i] = bf16(bf16(x[i] c) - bf16(x[i+R/2] s)),  x'[i+R/2] = bf16(bf16(x[i+R/2] c) + bf16(x[i] s))
 *   K[pos] = bf16(rope(norm(k))), V[pos] = bf16(v) appended to the cache, then
 *   o_j = sum_{t<=pos} softmax_t(q_j . K_t / sqrt(hd)) V_t   (fp32 softmax and accumulation)
 *   out_j = bf16(o_j), and when gated out_j = bf16( bf16(o_j) * bf16(sigmoid(gate_j)) ).
 * One kernel (attention.cu has the details): grid (n_split, Hkv * n_qg) in clusters of up to 8 blocks
 * along the sequence; a block takes GB query heads of one kv head (G = GB * n_qg, GB <= 8, GB*hd <= 1024)
 * over positions [s*chunk, min(kv_len, (s+1)*chunk)), chunk = max(32, round_up(ceil(kv_len / n_split), 32));
 * the block holding pos writes K/V[pos]; the splits are merged through distributed shared memory inside a
 * cluster and, past one cluster's reach, through `work` by the last-arriving block. Fixed merge order:
 * deterministic. hd in {32, 64, 128, 256}; any G = Hq/Hkv; R even, 2 <= R <= hd. A step with pos outside
 * [0, max_seq) writes nothing. sm_90 (clusters). */
typedef struct AttnDecodeParams {
    const float *qkv;       /* [q part + 2*Hkv*hd] */
    const float *q_norm_w;  /* [hd] */
    const float *k_norm_w;  /* [hd] */
    const float *inv_freq;  /* [R/2] rotary inverse frequencies (cpu_rope_inv_freq) */
    uint16_t *k_cache;      /* bf16 [Hkv][max_seq][hd] of this layer, K after norm + RoPE */
    uint16_t *v_cache;      /* bf16 [Hkv][max_seq][hd] */
    float *out;             /* [Hq*hd] (bf16-valued), the o_proj input */
    float *work;            /* cuda_attn_decode_work_bytes(); no init needed (zeroed or 0xff-filled memory is
                                fine, see attn_ticket); may be shared by layers run one after another */
    float *q_out;           /* optional (NULL): [Hq*hd] q after norm + RoPE (probes, tests) */
    const StepParams *step; /* step->pos */
    int Hq, Hkv, hd, R, max_seq;
    int gated;     /* 1: Qwen3.5 interleaved q|gate rows + sigmoid output gate */
    int norm_mode; /* NORM_ZC or NORM_PLAIN */
    float eps;     /* rms_norm_eps */
    int kv_e4m3;   /* 1: K/V[pos] stored as the e4m3 values of their bf16 (common.cuh kv_bits) */
} AttnDecodeParams;
int cuda_attn_decode(const AttnDecodeParams *p, const CudaLaunch *l);
/* n_split (blocks per kv head and query group) for a cache of max_seq positions, for G <= 8 at hd <= 128
 * (byte estimates). */
int cuda_attn_decode_splits(int Hkv, int max_seq);
/* Bytes of `work`: ticket counters + per-cluster partials (about Hq * n_split / 8 * (hd + 16) floats). */
size_t cuda_attn_decode_work_bytes(int Hq, int Hkv, int hd, int max_seq);

/* Short contexts: the attention of one token AND its o_proj in one kernel (attention.cu attn_short_oproj):
 * y += W_o · gated attention output, for kv_len = pos + 1 <= max_len. Grid (hd / 16, Hq) x 512 threads: block
 * (s, h) owns dims [16 s, +16) of query head h. Before its PDL wait it loads the cached K rows [0, pos) of its
 * kv head and its 16 V columns into shared memory and its 16 columns of W_o into registers; after it, every
 * block norms and ropes q of head h and the new k itself, forms all kv_len scores (the same per-lane order as
 * cuda_attn_decode, so the scores match it bitwise), the softmax, o for its 16 dims, the gate, and adds its
 * rank-16 share of o_proj into y with vector atomics (atomic split-K: not deterministic in the last bits).
 * The blocks of the kv head's first query head append K/V[pos]. A launch with kv_len > max_len traps. */
typedef struct AttnShortParams {
    AttnDecodeParams a;  /* the attention (a.out and a.work unused); a.q_out optional as there */
    const uint16_t *w_o; /* bf16 [D][Hq*hd] */
    float *y;            /* [D] fp32 accumulator (+=) */
    float *zero;         /* optional [n_zero]: zeroed after the wait (decode.cu's split-K zeroing contract) */
    int n_zero;
    int D;       /* rows of W_o: a multiple of 4, <= 1024 */
    int max_len; /* 1 .. cuda_attn_short_cap(): sizes the shared-memory K/V rows */
    /* FP8 (instead of w_o, then NULL): e4m3 [D][Hq*hd] with scales (FP8_SCALES_DOC); a block's 16 columns lie in one
     * 128-column scale block: y += scale_r * (16-product chain of the row) */
    const uint8_t *w8_o;
    const float *s_o;
} AttnShortParams;
int cuda_attn_short(const AttnShortParams *p, const CudaLaunch *l);
/* The longest kv_len the kernel can serve for these shapes (0: hd not 64/128/256, or D unsupported). */
int cuda_attn_short_cap(int hd, int D);

/* ---- prefill ops ---- */
/* The compute-bound path for T > 1 tokens (src/cuda/gemm.cu, attention_prefill.cu,
 * deltanet_prefill.cu, rows.cu). Activations between kernels: the residual stream x is fp32
 * [T][D] holding bf16-rounded values (as in decode); GEMM inputs are bf16 [T][K]; projection
 * outputs are bf16. Pointers are device pointers; "bf16" buffers are uint16_t bit patterns. */

/* ---- GEMM: Y[M][N] = X[M][K] W[N][K]^T, bf16 in, fp32 accumulation (gemm.cu) ---- */
enum {
    GEMM_EPI_BF16 = 0,        /* Y bf16:  y = bf16(acc) */
    GEMM_EPI_F32 = 1,         /* Y fp32:  y = bf16(acc) kept as fp32 */
    GEMM_EPI_ADD_F32 = 2,     /* Y fp32 residual: y = bf16(y + bf16(acc)) */
    GEMM_EPI_SWIGLU_BF16 = 3, /* Y bf16 [M][N/2]: W rows come in groups of G = glu_group gate rows then
                                 G up rows; y[m][i] = bf16(bf16(silu(bf16(gate_i))) bf16(up_i)) where
                                 gate row i is W row (i/G)*2G + i%G, up row that + G. G = 1 is the
                                 backend's w_gu layout [gate_0; up_0; gate_1; up_1; ...] */
    GEMM_EPI_ARGMAX = 4,      /* no Y: each row's argmax partials over 128-column chunks of y = bf16(acc), columns
                                 [0, am_cols) (the greedy pick from the LM head without writing its logits): y is
                                 [M][nch] float maxima, then [M][nch] int32 indices (ties: the smallest), then [M][nch]
                                 float sums of exp(y - max), nch = ceil(am_cols / GEMM_AM_CHUNK), a chunk with no
                                 valid column (-inf, INT_MAX, 0); cuda_rows_argmax_final reduces them. Only the TMA
                                 kernels of 128-column tiles (GEMM_ALGO_TMA_C128 / _P128, named explicitly) */
};
#define GEMM_AM_CHUNK 128
static inline size_t gemm_argmax_work_bytes(int rows, int am_cols) {
    return (size_t)rows * ((am_cols + GEMM_AM_CHUNK - 1) / GEMM_AM_CHUNK) * 12;
}
typedef struct GemmParams {
    const uint16_t *x; /* bf16 [M][ldx] */
    const uint16_t *w; /* bf16 [N][ldw] */
    void *y;           /* [M][ldy], bf16 or fp32 by epi (columns: N, or N/2 for SWIGLU) */
    int M, N, K;       /* M >= 1 any; N, K multiples of 8 (SWIGLU: N multiple of 2*glu_group) */
    int ldx, ldw, ldy; /* row strides in elements; ldx, ldw multiples of 8, ldy even */
    int epi;           /* GEMM_EPI_* */
    int glu_group;     /* SWIGLU only: 1, 8, 16 or 32 */
    int algo;          /* GEMM_ALGO_*: AUTO picks wgmma (or TMA, see below) on sm_90, mma.sync elsewhere */
    /* FP8 weights (cuda_gemm_skinny only; w NULL): W[n][k] = e4m3(w8[n ldw + k]) * w8_scale[(k / 128) N + n]
     * (FP8_SCALES_DOC; N % 8 == 0, so the row stride is N), K % 16 == 0 */
    const uint8_t *w8;
    const float *w8_scale;
    /* cuda_gemm_skinny / _norm: 1 lets the split count follow M as well (fewer splits where several 64-row blocks
     * already fill the GPU), so a row's sums then depend on M; 0 (deterministic mode, batch invariance): the shape's
     * plan alone */
    int split_m;
    int am_cols; /* GEMM_EPI_ARGMAX: the columns that take part, 1 .. N */
    /* cuda_gemm_skinny / _norm on sm_90a: 1 takes the 64-column ring (99 KB of shared memory) even where the grid is
     * one wave, so that a CTA fits on an SM beside the whole-head state pass with bf16 states (~115 KB) and loads its
     * weights while that pass runs */
    int narrow;
    /* cuda_gemm_skinny, GEMM_EPI_F32, bf16 weights, one split (the plan of N): output column n < *n_dyn is W row
     * gather[n] (the candidates of the LM head's rows screen, lm_screen_rows.cu), each sum bitwise that of the
     * full product's column gather[n]; columns from *n_dyn on are not written. Both read after the wait on the
     * previous kernel; NULL: the plain product */
    const int *gather;
    const unsigned *n_dyn;
} GemmParams;
/* TMA*: sm_90a, persistent, TMA loads into an mbarrier ring filled by a producer warp, two consumer
 * warpgroups (gemm_tma.cu). TMA picks the variant by shape; the others force one:
 *   C128 / C64: "cooperative", both warpgroups on one 128 x 128 / 128 x 64 tile (64 rows each);
 *   P128 / P256: "ping-pong", each warpgroup owns a whole 128 x 128 / 64 x 256 tile, so one's
 *   epilogue overlaps the other's main loop.
 * AUTO is TMA on sm_90, MMA elsewhere; the others are chosen explicitly (tests, bench/kernels/gemm_lab.cu). */
enum {
    GEMM_ALGO_AUTO = 0,
    GEMM_ALGO_MMA = 1,
    GEMM_ALGO_WGMMA = 2,
    GEMM_ALGO_TMA = 3,
    GEMM_ALGO_TMA_C128 = 4,
    GEMM_ALGO_TMA_P128 = 5,
    GEMM_ALGO_TMA_P256 = 6,
    GEMM_ALGO_TMA_C64 = 7,
    GEMM_ALGO_COUNT = 8
};
/* Tensor-core GEMM: Hopper wgmma (sm_90a) or mma.sync m16n8k16 (sm_80+), both fed by a cp.async
 * multi-stage shared-memory pipeline, tiles walked in L2-friendly groups. x, w 16-byte aligned.
 * Returns cudaErrorInvalidValue for shapes outside the contract (and cudaErrorInvalidDeviceFunction
 * for the WGMMA and TMA algorithms on a device other than sm_90). */
int cuda_gemm_bf16(const GemmParams *p, const CudaLaunch *l);
/* The same product for few rows (the batched decode step, gemm_skinny.cu): 64 W rows x 64 X rows per CTA with a
 * split of K chosen from (N, K, n_sm) alone, partial sums added in split order, so a row's result never depends on
 * M. work: fp32 scratch of cuda_gemm_skinny_work(M, N, K, n_sm, epi, glu_group) floats (0: none needed). M <= 65535,
 * N and K multiples of 8, any algo field (ignored). */
size_t cuda_gemm_skinny_work(int M, int N, int K, int n_sm, int epi, int glu_group);
int cuda_gemm_skinny(const GemmParams *g, float *work, size_t work_floats, int n_sm, const CudaLaunch *l);
/* The residual form (epi GEMM_EPI_ADD_F32, N <= 2048, N % 8 == 0, y and h 16-byte aligned) with the RMSNorm that
 * follows it fused into the split reduction: y = bf16(y + bf16(X W^T)), then h = norm(y) (rmsnorm_rows' formula and
 * bits, RmsnormRowsParams' mode and eps, weight norm_w [N]). work: cuda_gemm_skinny_work(.., GEMM_EPI_ADD_F32_NORM,
 * ..) floats. */
#define GEMM_EPI_ADD_F32_NORM 16 /* only as cuda_gemm_skinny_work's epi: the workspace of cuda_gemm_skinny_norm */
int cuda_gemm_skinny_norm(const GemmParams *g, const float *norm_w, int norm_mode, float eps, uint16_t *h, float *work,
                          size_t work_floats, int n_sm, const CudaLaunch *l);

/* ---- full attention, prefill (attention_prefill.cu) ---- */
/* Prepares T tokens at positions pos .. pos+T-1 from the fused projection output qkv:
 *   q_j = norm(q_j, q_norm), k_i = norm(k_i, k_norm) per head over hd (MODEL.md §3.1 / §5),
 *   then partial NeoX RoPE on dims [0, R) with bf16 cos/sin (MODEL.md §3.2 step 3), every op
 *   rounded to bf16 like HF; writes q_out, K after norm + RoPE and V unchanged into the cache. */
typedef struct AttnPrepParams {
    const uint16_t *qkv;          /* bf16 [T][ld]: q head j at column j*q_hs, k head i at k_off + i*hd,
                                v head i at v_off + i*hd */
    int ld, q_hs, k_off, v_off;   /* Qwen3.5: q_hs = 2*hd ([q_j | gate_j]); Qwen3: q_hs = hd */
    const float *q_norm, *k_norm; /* fp32 [hd] (bf16 values) */
    const float *inv_freq;        /* fp32 [R/2]: 1 / theta^(2i/R) */
    uint16_t *q_out;              /* bf16 [T][Hq][hd] */
    uint16_t *k_cache, *v_cache;  /* bf16 [Hkv][max_seq][hd], this layer; rows pos .. pos+T-1 written */
    int T, pos, Hq, Hkv, hd, R, max_seq;
    int norm_mode; /* NORM_ZC: y = bf16(x r (1+w)) (Qwen3.5); NORM_PLAIN: y = bf16(w bf16(x r)) (Qwen3) */
    float eps;
    int kv_e4m3; /* 1: the cache rows stored as the e4m3 values of their bf16 (common.cuh kv_bits) */
} AttnPrepParams;
/* hd a multiple of 32 and <= 256, R even and <= hd, pos + T <= max_seq. */
int cuda_attn_prep(const AttnPrepParams *p, const CudaLaunch *l);

/* Causal GQA flash attention of T queries at positions pos .. pos+T-1 over cached keys
 * 0 .. pos+T-1 (the cached prefix included), with the Qwen3.5 output gate:
 *   o_j = softmax_fp32((q_j K^T) * scale, causal) V   (query head j reads kv head j/(Hq/Hkv))
 *   out[t][j*hd + d] = bf16( bf16(o) * bf16(sigmoid(gate)) )   (gate != NULL), else bf16(o).
 * Scores never reach memory: online softmax over key tiles, P rounded to bf16 for P V. */
typedef struct AttnPrefillParams {
    const uint16_t *q;                 /* bf16 [T][Hq][hd] (after q norm + RoPE) */
    const uint16_t *k_cache, *v_cache; /* bf16 [Hkv][max_seq][hd], rows 0 .. pos+T-1 valid */
    const uint16_t *gate; /* bf16: gate of token t, head j, dim d at gate[t*gate_ld + j*gate_hs + d]; or NULL */
    int gate_ld, gate_hs;
    uint16_t *out; /* bf16 [T][Hq*hd] */
    int T, pos, Hq, Hkv, hd, max_seq;
    float scale; /* 1/sqrt(hd) */
} AttnPrefillParams;
/* hd 32, 64, 128 or 256; Hq a multiple of Hkv. hd 256 on sm_90 takes the wgmma kernel
 * (attention_prefill_wg.cu); the rest the mma.sync one. */
int cuda_attn_prefill(const AttnPrefillParams *p, const CudaLaunch *l);
/* The wgmma kernel alone: cudaErrorNotSupported unless hd == 256 on compute capability 9.x. */
int cuda_attn_prefill_wg(const AttnPrefillParams *p, const CudaLaunch *l);

/* ---- Gated DeltaNet, prefill (deltanet_prefill.cu) ---- */
/* The mixer of one DeltaNet layer for T tokens, from the fused projection output to the input of
 * out_proj (MODEL.md §3.3, chunked form §3.4 with C = 64):
 *   conv + SiLU over [stored K-1 pre-conv rows; qkv] (conv ring updated), l2norm of q, k (q also
 *   * dk^-1/2), beta = bf16(sigmoid(b)), g = -exp(A_log) softplus(a + dt_bias), the chunked delta
 *   rule starting from `state` (left holding the state after the last token), o -> bf16, and
 *   y = bf16(bf16(w * bf16(o rsqrt(mean o^2 + eps))) silu(z)) per v-head.
 * Tensor-core inputs are v (bf16, as HF's conv output) and "split bf16" x = hi + lo (hi = bf16(x),
 * lo = bf16(x - hi), ~16 mantissa bits; products of two split operands take 3 mma: hi hi + hi lo +
 * lo hi) for every fp32 quantity (q^, k^, T diag(beta), S, V' = U - W S, P = (Q K^T) o Gamma); the
 * triangular inverse, state scan, gates, norms and sums accumulate in fp32. */
typedef struct DeltaNetScratch {
    uint16_t *q, *q_lo, *k, *k_lo; /* bf16 [Tp][Hk][dk] each: q^, k^ = fp32 l2norm, split hi + lo (q not yet
                                    * * dk^-1/2) (Tp = T rounded up to 64; rows >= T zero) */
    uint16_t *v;                   /* bf16 [Tp][Hv][dv]  v after conv + SiLU */
    float *beta, *g;               /* fp32 [Tp][Hv] */
    uint16_t *t; /* bf16 [Tp/64][Hv][2][64][64]  T2 = (I + A)^-1 diag(beta) per chunk, split: hi plane, lo plane */
    uint16_t *p; /* bf16 [Tp/64][Hv][2][64][64]  P = (Q^ K^T) o Gamma * dk^-1/2 (s <= r) per chunk, split */
    uint16_t *o; /* bf16 [Tp][Hv][dv]  the scan's output O, before the gated norm (when a separate kernel applies it) */
    float *part; /* fp32 [Tp/64][Hv][16][64]  per chunk and head: sums of squares of bf16(O) over 8 columns, by row
                  * (when the scan applies the gated norm) */
    int *cnt;    /* [Tp/64][Hv]  the scan blocks of the head that have written their sums of the chunk */
} DeltaNetScratch;
/* Bytes of scratch for T tokens; with base != NULL also fills *sc with the regions carved from base
 * (256-byte aligned). */
size_t cuda_deltanet_prefill_scratch(DeltaNetScratch *sc, void *base, int T, int Hk, int Hv, int dk, int dv);

#define DN_MAX_PTS 8 /* snapshots one DeltaNet prefill call may take inside it */
/* Snapshot points in device memory (a prefill graph's, written before each replay): n points at call offsets off[i]
 * (ascending, in [0, the call's real rows)); point i of DeltaNet layer q stores its state at base[i] + q lstride and
 * its conv ring ring_off bytes after that (the layouts of DeltaNetPrefillParams.pt_state / pt_ring); bf16: the
 * states are stored as bf16 (DeltaNetPrefillParams.pt_bf16). */
typedef struct DnPtsDev {
    int n, bf16;
    int off[DN_MAX_PTS];
    unsigned long long base[DN_MAX_PTS], lstride, ring_off;
} DnPtsDev;
typedef struct DeltaNetPrefillParams {
    const uint16_t *proj; /* bf16 [T][ld_proj]: q k v at columns [0, conv_dim), z at z_off, b at b_off, a at a_off */
    int ld_proj, z_off, b_off, a_off;
    const float *conv_w;          /* fp32 [conv_dim][K] (conv1d.weight; tap K-1 multiplies the current token) */
    const float *A_log, *dt_bias; /* fp32 [Hv] */
    const float *norm_w;          /* fp32 [dv] linear_attn.norm.weight (plain weight) */
    uint16_t *conv_ring;          /* bf16 [K][conv_dim], in/out: row p % K holds the pre-conv m of position p (the
                              decode step's ring, cuda_deltanet_step); positions < 0 read as 0 */
    float *state;                 /* fp32 [Hv][dk][dv] recurrent state, in/out (not read by a call at pos 0: it starts
                                   * from zero, and then also writes the conv ring's rows of positions < 0 as zero) */
    uint16_t *y;                  /* bf16 [T][Hv*dv] */
    void *scratch;                /* cuda_deltanet_prefill_scratch(NULL, NULL, T, ...) bytes, 256-byte aligned */
    int T, pos;                   /* tokens, absolute position of the first */
    int Hk, Hv, dk, dv, K;
    float eps;       /* rms_norm_eps of the gated norm */
    cudaEvent_t *ev; /* optional (timing): 5 events recorded before, between and after the 4 kernels */
    int skip;        /* measurement only (bench --ablate): bit k leaves kernel k + 1 out; the outputs are garbage */
    /* NULL, or a device int Tr <= T: rows [Tr, T) are padding (a prefill graph captured for a bucket of T rows, run on
     * Tr real ones). They enter the scan as zero q, k, v and gates, so the state and the real rows' outputs are those
     * of a call of Tr rows, and the conv ring takes the pre-conv rows before Tr. */
    const int32_t *t_real;
    /* Snapshots inside the call: the state after the first pt_off[i] tokens, pt_off ascending in
     * [0, T), into pt_state[i] (fp32 [Hv][dk][dv], the state's layout) and pt_ring[i] (bf16 [K][conv_dim], the conv
     * ring's layout: row q % K holds position q, for the K positions before pos + pt_off[i]). The prefix cache's
     * snapshot points, taken without cutting the prefill there. */
    int n_pts;
    int pt_off[DN_MAX_PTS];
    float *pt_state[DN_MAX_PTS];
    uint16_t *pt_ring[DN_MAX_PTS];
    /* or (n_pts 0) the points of pts, read on the device, this layer being DeltaNet ordinal pts_q */
    const DnPtsDev *pts;
    int pts_q;
    /* 1: state holds bf16 entries (a serve slot with bf16 states, ServeLayout.state_bf16): read exactly, the scan in
     * fp32, the final state stored rounded to nearest even. pt_bf16: the same for the point states of pt_state (with
     * pts: pts->bf16), which a context's fp32 state may write into bf16 snapshots. */
    int state_bf16, pt_bf16;
} DeltaNetPrefillParams;
/* dk = dv = 128, Hv a multiple of Hk, 2 <= K <= 4. Launches 4 kernels on s. */
int cuda_deltanet_prefill(const DeltaNetPrefillParams *p, const CudaLaunch *l);

/* ---- row ops and whole layers (rows.cu) ---- */
/* y[t] = bf16 RMSNorm of x[t] over D:  NORM_ZC: bf16(x r (1 + w));  NORM_PLAIN: bf16(w bf16(x r)),
 * r = rsqrt(mean(x^2) + eps). x fp32 [T][D], w fp32 [D], y bf16 [T][D]; D a multiple of 4. */
typedef struct RmsnormRowsParams {
    const float *x;
    const float *w;
    uint16_t *y;
    int T, D, mode;
    float eps;
} RmsnormRowsParams;
int cuda_rmsnorm_rows_bf16(const RmsnormRowsParams *p, const CudaLaunch *l);

/* x[t][:] = E[tokens[t]][:] as fp32 (tokens on the device, each in [0, V); out-of-range rows are
 * written as zeros). E bf16 [V][D]. */
typedef struct EmbedRowsParams {
    const int32_t *tokens;
    const uint16_t *E;
    float *x;
    int T, D, V;
} EmbedRowsParams;
int cuda_embed_rows(const EmbedRowsParams *p, const CudaLaunch *l);

/* x[T - 1][:] = x[*t_real - 1][:] (fp32 [T][D], D a multiple of 4, 1 <= *t_real <= T on the device): the last real
 * row of a padded prefill moved to where a graph captured for T rows reads it. */
int cuda_row_last(float *x, const int32_t *t_real, int T, int D, const CudaLaunch *l);

/* Dimensions of one model for the prefill path (Config values). */
typedef struct PrefillDims {
    int D, F;              /* hidden_size, intermediate_size */
    int Hq, Hkv, hd, R;    /* attention heads, head_dim, rotary dims */
    int attn_gate;         /* 1: Qwen3.5 q_proj rows [q_j | gate_j] per head; 0: Qwen3 */
    int norm_mode;         /* NORM_ZC (Qwen3.5) or NORM_PLAIN (Qwen3) */
    int Hk, Hv, dk, dv, K; /* DeltaNet heads, head dims, conv taps */
    int glu_group;         /* gate/up row interleave of the stacked MLP weight (1 = w_gu of backend.cuh) */
    int max_seq;
    int gemm_algo; /* GEMM_ALGO_* for every projection (AUTO: wgmma on sm_90) */
    float eps;     /* rms_norm_eps */
} PrefillDims;

/* Element counts of the prefill's activation buffers for T tokens: h bf16 [T][D] (a projection's normed input), proj
 * bf16 [T][n_proj] (the stacked q/k/v or q/k/v/z/b/a projection), q bf16 [T][Hq hd] (queries after norm and RoPE),
 * act bf16 [T][max(F, Hq hd, Hv dv)] (mixer output, then the SwiGLU product); and the DeltaNet scratch bytes. */
void cuda_prefill_buffer_sizes(const PrefillDims *d, int T, size_t *h, size_t *proj, size_t *q, size_t *act,
                               size_t *scratch_bytes);

#ifdef __cplusplus
}
#endif
#endif
