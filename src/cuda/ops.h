/* ops.h — extern "C" launchers of the CUDA kernels, one params struct per op. Included by the
 * .cu files, by backend.cu/forward.cu and by the C tests in tests/gpu (plain C11 + the CUDA
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
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How to launch: the stream, and whether to use programmatic dependent launch. */
typedef struct CudaLaunch {
    cudaStream_t stream;
    int pdl;
} CudaLaunch;

/* Per-token values, in device memory. */
typedef struct StepParams {
    int token;        /* input token id, 0 <= token < vocab_size */
    int pos;          /* its position; the KV cache holds positions 0 .. pos after the step */
    int write_logits; /* 1: the LM head stores fp32 logits [V] (forward(), sampling) */
    int top_k;        /* sampling: 0 = off */
    float temperature, top_p, min_p; /* temperature <= 0: argmax */
    int pad_;
    uint64_t seed, step; /* sampling RNG: u = q35 counter hash of (seed, step), see sample.cu */
} StepParams;

/* ---- GEMV family (matvec.cu) ----------------------------------------------------------------
 * y = W x for one token, W bf16 [rows][cols] (cols % 8 == 0, rows 16-byte aligned), fp32
 * accumulation. A warp owns groups of 4 consecutive rows, lanes stride the columns 8 at a time
 * (16-byte loads); grid.y = splits cuts the columns into slices (split-K).
 *
 * Input prologue (in_mode), computed by every block into shared memory:
 *   MV_IN_VEC       x[cols] as given (bf16-valued).
 *   MV_IN_EMBED     x = E[step->token] (bf16 table [V][cols]).
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
enum { MV_IN_VEC = 0, MV_IN_EMBED = 1, MV_IN_RESIDUAL = 2 };
enum { MV_OUT_STORE = 0, MV_OUT_SILU_MUL = 1, MV_OUT_SPLITK = 2, MV_OUT_ARGMAX = 3 };
enum { NORM_NONE = 0, NORM_ZC = 1, NORM_PLAIN = 2 };

typedef struct MatvecParams {
    const uint16_t *W; /* bf16 [rows][cols] */
    int rows, cols;
    int splits;        /* >= 1; MV_OUT_SPLITK only (others use 1) */
    int blocks;        /* grid.x; 0 = launcher's choice (cuda_matvec_blocks) */
    /* input */
    int in_mode;
    const float *x;          /* VEC: the input [cols]; RESIDUAL: the residual stream before the add */
    const float *parts;      /* RESIDUAL: [n_parts][cols] */
    int n_parts;
    const uint16_t *embed;   /* EMBED: bf16 [V][cols] */
    const StepParams *step;  /* EMBED, ARGMAX */
    float *x_out;            /* EMBED/RESIDUAL: new residual stream [cols] (may be NULL) */
    const float *norm_w;     /* [cols] or NULL */
    int norm_mode;
    float eps;
    float *h_out;            /* optional: the normed input [cols] */
    float *zero;             /* optional: zeroed [n_zero] */
    int n_zero;
    /* output */
    int out_mode;
    int atomic;              /* MV_OUT_SPLITK */
    float *y;
    /* MV_OUT_ARGMAX */
    float *logits;           /* [rows] */
    int n_valid;
    float *am_val;           /* [blocks] */
    int *am_idx;             /* [blocks] */
    unsigned *am_count;      /* [1] */
    int *out_id;
    float *out_max;
} MatvecParams;

int cuda_matvec(const MatvecParams *p, const CudaLaunch *l);
/* Split-K factor that fills n_sm SMs for a rows x cols GEMV (1 when rows suffice). Every split
 * is non-empty. */
int cuda_matvec_splits(int rows, int cols, int n_sm);
/* grid.x the launcher uses when p->blocks == 0 (callers size am_val/am_idx with it). */
int cuda_matvec_blocks(int rows, int splits, int n_sm);

/* ---- norms (norm.cu) --------------------------------------------------------------------------
 * Standalone RMSNorm of `rows` rows of n (w shared by the rows), same formulas as the GEMV
 * prologue: y = NORM_ZC / NORM_PLAIN of x. When parts is set (rows must be 1), first
 * x = bf16(res + bf16(sum of n_parts partials)) and x_out <- x, as MV_IN_RESIDUAL. */
typedef struct RmsnormParams {
    const float *x; /* [rows][n] (or res when parts is set) */
    const float *parts;
    int n_parts;
    float *x_out;
    const float *w; /* [n] */
    float *y;       /* [rows][n]; may equal x when parts is NULL */
    int rows, n, mode;
    float eps;
} RmsnormParams;
int cuda_rmsnorm(const RmsnormParams *p, const CudaLaunch *l);

/* ---- elementwise and utility (elementwise.cu) ------------------------------------------------ */

/* y[i] = bf16(E[token][i]) as fp32, i < n; token read from step->token. */
typedef struct EmbedParams {
    const uint16_t *E;
    const StepParams *step;
    float *y;
    int n;
} EmbedParams;
int cuda_embed(const EmbedParams *p, const CudaLaunch *l);

/* Fills bf16 buf[n] with uniform values in [-scale, scale) from a counter hash of (seed, i)
 * (bench: random KV cache contents). */
typedef struct FillParams {
    uint16_t *buf;
    int64_t n;
    uint64_t seed;
    float scale;
} FillParams;
int cuda_fill_bf16(const FillParams *p, const CudaLaunch *l);

/* Bandwidth probe: reads src[n_u4] (16-byte words) once, writes one word per block to sink. */
typedef struct ReadBwParams {
    const void *src;
    int64_t n_u4;
    unsigned *sink; /* [gridDim.x] */
    int blocks;
} ReadBwParams;
int cuda_read_bw(const ReadBwParams *p, const CudaLaunch *l);

/* ---- sampling (sample.cu) ----------------------------------------------------------------------
 * One draw from bf16-valued logits[0 .. n_valid) with step->temperature > 0, the same rules as
 * the host sampler (sampler.c): candidates are ids with logit >= max - 40 T; sort by value
 * descending, ties by smaller id; top_k keeps the first k; top_p keeps the shortest prefix whose
 * mass reaches top_p times the kept mass; min_p keeps ids with p >= min_p p_max (at least one);
 * then r = u * kept mass, and the first id in that order whose running mass exceeds r.
 * u = uniform from the counter hash of (step->seed, step->step) (q35_uniform in sample.cu).
 * Two kernels, each multi-block with the last block finishing; scratch from cuda_sample_scratch.
 * max_logit: the maximum over [0, n_valid) (MV_OUT_ARGMAX's out_max). */
typedef struct SampleParams {
    const float *logits;
    int n_valid;
    const StepParams *step;
    const float *max_logit;
    void *scratch;  /* cuda_sample_scratch_bytes(), zeroed once before first use, left reusable */
    int blocks;     /* 0 = launcher's choice */
    int *out_id;
} SampleParams;
int cuda_sample(const SampleParams *p, const CudaLaunch *l);
size_t cuda_sample_scratch_bytes(int n_sm);

/* ---- mixer ops (cudab) ---- */

#ifdef __cplusplus
}
#endif
#endif
