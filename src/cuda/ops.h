/* ops.h — extern "C" launchers of the CUDA kernels, shared by forward.cu and tests/gpu.
 * Every launcher takes one const params struct and a stream and returns 0 or a cudaError_t
 * value (launches are asynchronous; a Q35_DEBUG_SYNC build synchronises after each). */
#ifndef Q35_CUDA_OPS_H
#define Q35_CUDA_OPS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- prefill ops ---- */
/* The compute-bound path for T > 1 tokens (src/cuda/gemm.cu, attention_prefill.cu,
 * deltanet_prefill.cu, prefill.cu). Activations between kernels: the residual stream x is fp32
 * [T][D] holding bf16-rounded values (as in decode); GEMM inputs are bf16 [T][K]; projection
 * outputs are bf16. Pointers are device pointers; "bf16" buffers are uint16_t bit patterns. */

/* ---- GEMM: Y[M][N] = X[M][K] W[N][K]^T, bf16 in, fp32 accumulation (gemm.cu) ---- */
enum {
    GEMM_EPI_BF16 = 0,        /* Y bf16:  y = bf16(acc) */
    GEMM_EPI_F32 = 1,         /* Y fp32:  y = bf16(acc) kept as fp32 */
    GEMM_EPI_ADD_F32 = 2,     /* Y fp32 residual: y = bf16(y + bf16(acc)) */
    GEMM_EPI_SWIGLU_BF16 = 3, /* Y bf16 [M][N/2]: W rows come in groups of glu_group gate rows then
                                 glu_group up rows; y[m][i] = bf16(bf16(silu(bf16(gate_i))) bf16(up_i))
                                 where gate row i is W row (i/G)*2G + i%G, up row that + G */
};
typedef struct GemmParams {
    const uint16_t *x; /* bf16 [M][ldx] */
    const uint16_t *w; /* bf16 [N][ldw] */
    void *y;           /* [M][ldy], bf16 or fp32 by epi (columns: N, or N/2 for SWIGLU) */
    int M, N, K;       /* M >= 1 any; N, K multiples of 8 (SWIGLU: N multiple of 2*glu_group) */
    int ldx, ldw, ldy; /* row strides in elements; ldx, ldw multiples of 8, ldy even */
    int epi;           /* GEMM_EPI_* */
    int glu_group;     /* SWIGLU only: 8, 16 or 32 */
} GemmParams;
/* Tensor-core GEMM (mma.sync m16n8k16, cp.async multi-stage pipeline, swizzled tile order).
 * x, w 16-byte aligned. Returns cudaErrorInvalidValue for shapes outside the contract. */
int cuda_gemm_bf16(const GemmParams *p, cudaStream_t s);

/* ---- full attention, prefill (attention_prefill.cu) ---- */
/* Prepares T tokens at positions pos .. pos+T-1 from the fused projection output qkv:
 *   q_j = norm(q_j, q_norm), k_i = norm(k_i, k_norm) per head over hd (MODEL.md §3.1 / §5),
 *   then partial NeoX RoPE on dims [0, R) with bf16 cos/sin (MODEL.md §3.2 step 3), every op
 *   rounded to bf16 like HF; writes q_out, K after norm + RoPE and V unchanged into the cache. */
typedef struct AttnPrepParams {
    const uint16_t *qkv;     /* bf16 [T][ld]: q head j at column j*q_hs, k head i at k_off + i*hd,
                                v head i at v_off + i*hd */
    int ld, q_hs, k_off, v_off; /* Qwen3.5: q_hs = 2*hd ([q_j | gate_j]); Qwen3: q_hs = hd */
    const float *q_norm, *k_norm; /* fp32 [hd] (bf16 values) */
    const float *inv_freq;   /* fp32 [R/2]: 1 / theta^(2i/R) */
    uint16_t *q_out;         /* bf16 [T][Hq][hd] */
    uint16_t *k_cache, *v_cache; /* bf16 [Hkv][max_seq][hd], this layer; rows pos .. pos+T-1 written */
    int T, pos, Hq, Hkv, hd, R, max_seq;
    int unit_offset;         /* 1: zero-centred y = bf16(x r (1+w)) (Qwen3.5); 0: y = bf16(w bf16(x r)) (Qwen3) */
    float eps;
} AttnPrepParams;
/* hd a multiple of 32 and <= 256, R even and <= hd, pos + T <= max_seq. */
int cuda_attn_prep(const AttnPrepParams *p, cudaStream_t s);

/* Causal GQA flash attention of T queries at positions pos .. pos+T-1 over cached keys
 * 0 .. pos+T-1 (the cached prefix included), with the Qwen3.5 output gate:
 *   o_j = softmax_fp32((q_j K^T) * scale, causal) V   (query head j reads kv head j/(Hq/Hkv))
 *   out[t][j*hd + d] = bf16( bf16(o) * bf16(sigmoid(gate)) )   (gate != NULL), else bf16(o).
 * Scores never reach memory: online softmax over key tiles, P rounded to bf16 for P V. */
typedef struct AttnPrefillParams {
    const uint16_t *q;       /* bf16 [T][Hq][hd] (after q norm + RoPE) */
    const uint16_t *k_cache, *v_cache; /* bf16 [Hkv][max_seq][hd], rows 0 .. pos+T-1 valid */
    const uint16_t *gate;    /* bf16: gate of token t, head j, dim d at gate[t*gate_ld + j*gate_hs + d]; or NULL */
    int gate_ld, gate_hs;
    uint16_t *out;           /* bf16 [T][Hq*hd] */
    int T, pos, Hq, Hkv, hd, max_seq;
    float scale;             /* 1/sqrt(hd) */
} AttnPrefillParams;
/* hd 128 or 256; Hq a multiple of Hkv. */
int cuda_attn_prefill(const AttnPrefillParams *p, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
