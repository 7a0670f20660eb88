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
    int algo;          /* GEMM_ALGO_*: AUTO picks wgmma on sm_90, mma.sync elsewhere */
} GemmParams;
enum { GEMM_ALGO_AUTO = 0, GEMM_ALGO_MMA = 1, GEMM_ALGO_WGMMA = 2 };
/* Tensor-core GEMM: Hopper wgmma (sm_90a) or mma.sync m16n8k16 (sm_80+), both fed by a cp.async
 * multi-stage shared-memory pipeline, tiles walked in L2-friendly groups. x, w 16-byte aligned.
 * Returns cudaErrorInvalidValue for shapes outside the contract (and cudaErrorInvalidDeviceFunction
 * for GEMM_ALGO_WGMMA on a device other than sm_90). */
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

/* ---- Gated DeltaNet, prefill (deltanet_prefill.cu) ---- */
/* The mixer of one DeltaNet layer for T tokens, from the fused projection output to the input of
 * out_proj (MODEL.md §3.3, chunked form §3.4 with C = 64):
 *   conv + SiLU over [stored K-1 pre-conv rows; qkv] (conv state updated), l2norm of q, k (q also
 *   * dk^-1/2), beta = bf16(sigmoid(b)), g = -exp(A_log) softplus(a + dt_bias), the chunked delta
 *   rule starting from `state` (left holding the state after the last token), o -> bf16, and
 *   y = bf16(bf16(w * bf16(o rsqrt(mean o^2 + eps))) silu(z)) per v-head.
 * Tensor-core inputs are bf16 (q^, k^, v, the per-chunk W, U, V' and the chunk-entry states);
 * the state scan, gates, norms and softmax-free sums accumulate in fp32. */
typedef struct DeltaNetScratch {
    uint16_t *q, *k; /* bf16 [Tp][Hk][dk]  q^ (scaled), k^   (Tp = T rounded up to 64; rows >= T zero) */
    uint16_t *v;     /* bf16 [Tp][Hv][dv]  v after conv + SiLU */
    float *beta, *g; /* fp32 [Tp][Hv] */
    uint16_t *w;     /* bf16 [Tp][Hv][dk]  W = L^-1 diag(beta e^gamma) K^ per chunk */
    uint16_t *u;     /* bf16 [Tp][Hv][dv]  U = L^-1 diag(beta) V, overwritten by V' = U - W S */
    uint16_t *s;     /* bf16 [Tp/64][Hv][dk][dv]  state entering each chunk */
} DeltaNetScratch;
/* Bytes of scratch for T tokens; with base != NULL also fills *sc with the regions carved from base
 * (256-byte aligned). */
size_t cuda_deltanet_prefill_scratch(DeltaNetScratch *sc, void *base, int T, int Hk, int Hv, int dk, int dv);

typedef struct DeltaNetPrefillParams {
    const uint16_t *proj;  /* bf16 [T][ld_proj]: q k v at columns [0, conv_dim), z at z_off, b at b_off, a at a_off */
    int ld_proj, z_off, b_off, a_off;
    const float *conv_w;   /* fp32 [conv_dim][K] (conv1d.weight; tap K-1 multiplies the current token) */
    const float *A_log, *dt_bias; /* fp32 [Hv] */
    const float *norm_w;   /* fp32 [dv] linear_attn.norm.weight (plain weight) */
    float *conv_state;     /* fp32 pre-conv row i (0 = oldest) of channel c at conv_state[i*cs_row + c*cs_ch] */
    int cs_row, cs_ch;
    float *state;          /* fp32 [Hv][dk][dv] recurrent state, in/out */
    uint16_t *y;           /* bf16 [T][Hv*dv] */
    void *scratch;         /* cuda_deltanet_prefill_scratch(NULL, NULL, T, ...) bytes, 256-byte aligned */
    int T, Hk, Hv, dk, dv, K;
    float eps;             /* rms_norm_eps of the gated norm */
} DeltaNetPrefillParams;
/* dk = dv = 128, Hv a multiple of Hk, 2 <= K <= 4. Launches 4 kernels on s. */
int cuda_deltanet_prefill(const DeltaNetPrefillParams *p, cudaStream_t s);

/* ---- row ops and whole layers (prefill.cu) ---- */
/* y[t] = bf16 RMSNorm of x[t] over D:  unit_offset 1: bf16(x r (1 + w));  0: bf16(w bf16(x r)),
 * r = rsqrt(mean(x^2) + eps). x fp32 [T][D], w fp32 [D], y bf16 [T][D]; D a multiple of 4. */
typedef struct RmsnormRowsParams {
    const float *x;
    const float *w;
    uint16_t *y;
    int T, D, unit_offset;
    float eps;
} RmsnormRowsParams;
int cuda_rmsnorm_rows_bf16(const RmsnormRowsParams *p, cudaStream_t s);

/* x[t][:] = E[tokens[t]][:] as fp32 (tokens on the device, each in [0, V); out-of-range rows are
 * written as zeros). E bf16 [V][D]. */
typedef struct EmbedRowsParams {
    const int32_t *tokens;
    const uint16_t *E;
    float *x;
    int T, D, V;
} EmbedRowsParams;
int cuda_embed_rows(const EmbedRowsParams *p, cudaStream_t s);

/* Dimensions of one model for the layer helpers below (Config values). */
typedef struct PrefillDims {
    int D, F;                       /* hidden_size, intermediate_size */
    int Hq, Hkv, hd, R;             /* attention heads, head_dim, rotary dims */
    int attn_gate;                  /* 1: Qwen3.5 q_proj rows [q_j | gate_j] per head; 0: Qwen3 */
    int unit_offset;                /* 1: zero-centred norms (Qwen3.5); 0: plain weights (Qwen3) */
    int Hk, Hv, dk, dv, K;          /* DeltaNet heads, head dims, conv taps */
    int glu_group;                  /* gate/up row interleave of the stacked MLP weight (8, 16, 32) */
    int max_seq;
    float eps;                      /* rms_norm_eps */
} PrefillDims;

/* Weights of one layer on the device (bf16 matrices row-major [out][in], small vectors fp32). */
typedef struct PrefillLayerWeights {
    const float *ln1, *ln2;          /* [D] input_layernorm, post_attention_layernorm */
    const uint16_t *gate_up;         /* [2F][D]: groups of glu_group gate rows, then glu_group up rows */
    const uint16_t *down;            /* [D][F] */
    /* full attention */
    const uint16_t *qkv;             /* [Hq*hd*(attn_gate ? 2 : 1) + 2*Hkv*hd][D]: q_proj; k_proj; v_proj */
    const float *q_norm, *k_norm;    /* [hd] */
    const uint16_t *o;               /* [D][Hq*hd] */
    const float *inv_freq;           /* [R/2] */
    uint16_t *k_cache, *v_cache;     /* [Hkv][max_seq][hd] of this layer */
    /* DeltaNet */
    const uint16_t *qkvzba;          /* [2*Hk*dk + 2*Hv*dv + 2*Hv][D]: in_proj_qkv; in_proj_z; in_proj_b; in_proj_a */
    const float *conv_w;             /* [conv_dim][K] */
    const float *A_log, *dt_bias;    /* [Hv] */
    const float *norm_w;             /* [dv] */
    const uint16_t *out;             /* [D][Hv*dv] */
    float *conv_state;               /* [K-1][conv_dim] of this layer (row i = i-th oldest) */
    float *state;                    /* [Hv][dk][dv] of this layer */
} PrefillLayerWeights;

/* Activation buffers for T tokens (sizes in elements; see cuda_prefill_buffer_sizes). */
typedef struct PrefillBuffers {
    float *x;       /* fp32 [T][D] residual stream, in/out */
    uint16_t *h;    /* bf16 [T][D] normed input of a projection */
    uint16_t *proj; /* bf16 [T][n_proj]: fused q/k/v or q/k/v/z/b/a projection output */
    uint16_t *q;    /* bf16 [T][Hq*hd] attention queries after norm + RoPE */
    uint16_t *act;  /* bf16 [T][max(F, Hq*hd, Hv*dv)]: mixer output, then the SwiGLU product */
    void *scratch;  /* cuda_deltanet_prefill_scratch(NULL, NULL, T, ...) bytes, 256-byte aligned */
} PrefillBuffers;
/* Element counts per token of h, proj, q, act, and the DeltaNet scratch bytes for T tokens. */
void cuda_prefill_buffer_sizes(const PrefillDims *d, int T, size_t *h, size_t *proj, size_t *q, size_t *act,
                               size_t *scratch_bytes);

/* One whole layer on T tokens at positions pos .. pos+T-1, updating x in place:
 *   x = bf16(x + mixer(norm(x, ln1)));  x = bf16(x + down(bf16(silu(gate) up)(norm(x, ln2)))).
 * attn: K/V of the new tokens are appended to the layer's cache; DeltaNet: conv state and state
 * are read and left after the last token. */
int cuda_prefill_layer_attn(const PrefillDims *d, const PrefillLayerWeights *w, const PrefillBuffers *b, int T,
                            int pos, cudaStream_t s);
int cuda_prefill_layer_deltanet(const PrefillDims *d, const PrefillLayerWeights *w, const PrefillBuffers *b, int T,
                                cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
