/* ops.h — fp32 reference ops of the CPU backend: the contract sheet the CUDA kernels are
 * tested against. Every activation is fp32 and nothing is rounded to bf16; weights keep
 * their stored dtype (BF16/F16/F32) and are converted on the fly. Shapes are row-major,
 * the last index fastest; "[T][n]" means T rows of n floats. Weights are [out, in]
 * (PyTorch Linear): y[o] = sum_i W[o,i] x[i]. Unless noted, y may not alias an input.
 * Ops parallelise their outer loop with OpenMP (rows, heads, tokens) and use however many
 * threads the calling thread's OpenMP setting allows (omp_set_num_threads). Equations are
 * those of MODEL.md §3 (Qwen3.5) and §5 (Qwen3). */
#ifndef Q35_CPU_OPS_H
#define Q35_CPU_OPS_H

#include <stdint.h>

#include "safetensors.h"

/* ---- weights --------------------------------------------------------------------------- */

/* y[i] = float(x[i]) for i < n; x has dtype dt (DT_BF16, DT_F16 or DT_F32). */
void cpu_to_f32(float *y, const void *x, DType dt, int64_t n);

/* x[D] = E[token, :] as fp32; E is (V, D) of any float dtype (embedding lookup). */
void cpu_embed(float *x, const void *E, DType dt, int token, int D);

/* y[rows] = W (rows, cols) · x[cols]. W row-major of dtype wt. */
void cpu_matvec(float *y, const float *x, const void *W, DType wt, int rows, int cols);

/* Y[T][rows] = X[T][cols] · Wᵀ, i.e. Y[t][o] = sum_i W[o,i] X[t][i]. Each weight row is
 * converted to fp32 once per call and used for all T inputs (prefill). For T == 1 the
 * result equals cpu_matvec up to summation order. */
void cpu_matmul(float *Y, const float *X, const void *W, DType wt, int T, int rows, int cols);

/* ---- norms ----------------------------------------------------------------------------- */

/* RMSNorm of each of `rows` rows of n: r = 1/sqrt(mean_j x[j]^2 + eps), then
 *   unit_offset = 1 (Qwen3.5 zero-centred):  y[j] = (x[j] r) (1 + w[j])
 *   unit_offset = 0 (Qwen3 plain weight):    y[j] = w[j] (x[j] r)
 * w[n] is shared by all rows (q_norm/k_norm: rows = heads, n = head_dim). y may equal x. */
void cpu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps, int unit_offset);

/* Gated RMSNorm (linear_attn.norm), per row of n = dv (rows = T*Hv), plain weight w[n]:
 *   y[j] = w[j] (o[j] / sqrt(mean(o^2) + eps)) silu(z[j]),   silu(z) = z / (1 + exp(-z)).
 * o, z, y are [rows][n]; y may equal o. */
void cpu_gated_rmsnorm(float *y, const float *o, const float *z, const float *w, int rows, int n, float eps);

/* L2 norm per row of d (DeltaNet q/k per k-head): x[j] <- x[j] / sqrt(sum x^2 + 1e-6) * scale.
 * scale = dk^-1/2 for q, 1 for k. In place over [rows][d]. */
void cpu_l2norm(float *x, int rows, int d, float scale);

/* ---- rotary embedding ------------------------------------------------------------------ */

/* inv_freq[i] = 1 / theta^(2i/R) for i < R/2, the exponent formed in fp32 as HF does
 * ((float)(2i) / (float)R); the power is evaluated in double and rounded once to fp32. */
void cpu_rope_inv_freq(float *inv_freq, int R, float theta);

/* Partial NeoX ("rotate half") RoPE, in place, for T tokens at positions pos0 .. pos0+T-1.
 * x is [T][n_heads][hd]; only dims [0, R) of each head rotate, pairs (i, i + R/2):
 *   phi = (float)p * inv_freq[i] (fp32 product), c = cos(phi), s = sin(phi)
 *   x'[i] = x[i] c - x[i+R/2] s,   x'[i+R/2] = x[i+R/2] c + x[i] s.
 * Dims [R, hd) pass through unchanged. */
void cpu_rope(float *x, int T, int n_heads, int hd, int R, int pos0, const float *inv_freq);

/* ---- attention ------------------------------------------------------------------------- */

/* Causal GQA attention for T queries at positions pos0 .. pos0+T-1 over a cache that already
 * holds keys/values for positions 0 .. pos0+T-1.
 *   q   [T][Hq][hd]              (after q_norm and RoPE)
 *   Kc  [Hkv][max_seq][hd], Vc [Hkv][max_seq][hd]   (one layer's cache; K after norm + RoPE)
 *   out [T][Hq][hd]
 * Query head j reads kv head j / (Hq/Hkv). For query t at p = pos0+t:
 *   s[u] = (q[t][j] · Kc[kv][u]) * scale   for u = 0..p,   scale = 1/sqrt(hd)
 *   out[t][j] = sum_u softmax(s)[u] Vc[kv][u]      (fp32, max-subtracted softmax) */
void cpu_attention(float *out, const float *q, const float *Kc, const float *Vc, int T, int pos0, int Hq, int Hkv,
                   int hd, int max_seq, float scale);
/* The same over a paged cache: Kp, Vp [n_blocks][Hkv][block][hd] (one layer's pool); position u's key of kv head i
 * is Kp[blocks[u / block]][i][u % block]. The math and the summation order are cpu_attention's, which is this with
 * blocks = {0} and block = max_seq (one block holds the whole sequence), so both give the same bits. */
void cpu_attention_paged(float *out, const float *q, const float *Kp, const float *Vp, const int *blocks, int block,
                         int T, int pos0, int Hq, int Hkv, int hd, float scale);

/* ---- DeltaNet -------------------------------------------------------------------------- */

/* Causal depthwise conv over T tokens + SiLU, for ch channels and K taps.
 *   m     [T][ch]     pre-conv input rows (projection output)
 *   w     [ch][K]     conv1d.weight as fp32; tap K-1 multiplies the current token
 *   state [K-1][ch]   the K-1 pre-conv rows before this call, oldest first (zeros at start);
 *                     updated to the last K-1 rows of [state; m]
 *   out   [T][ch]:    out[t][c] = silu( sum_{j<K} w[c][j] * row_{t-(K-1)+j}[c] )
 * where row_u is m[u] for u >= 0 and state[K-1+u] for u < 0. out may not alias m. */
void cpu_conv1d(float *out, float *state, const float *m, const float *w, int T, int ch, int K);
/* The same for one token (T = 1): the decode step. */
void cpu_conv1d_step(float *out, float *state, const float *m, const float *w, int ch, int K);

/* DeltaNet gates for T tokens and Hv v-heads, [T][Hv] each:
 *   beta = sigmoid(b),   g = -exp(A_log) * softplus(a + dt_bias),
 *   softplus(x) = log(1 + exp(x)), taken as x when x > 20.   (exp(g) is the decay in (0,1]) */
void cpu_deltanet_gates(float *beta, float *g, const float *b, const float *a, const float *A_log, const float *dt_bias,
                        int T, int Hv);

/* One recurrent step of the gated delta rule (MODEL.md §3.3 step 7), all v-heads.
 *   q, k [Hk][dk]   already l2-normalised (q also scaled by dk^-1/2)
 *   v    [Hv][dv],  g, beta [Hv]
 *   S    [Hv][dk][dv] state, updated in place;  o [Hv][dv]
 * v-head j uses k-head j / (Hv/Hk). Per head, in this order:
 *   S *= exp(g);  mem[e] = sum_d S[d][e] k[d];  delta = beta (v - mem);
 *   S[d][e] += k[d] delta[e];  o[e] = sum_d S[d][e] q[d]   (read after the update) */
void cpu_deltanet_step(float *o, float *S, const float *q, const float *k, const float *v, const float *g,
                       const float *beta, int Hk, int Hv, int dk, int dv);

/* Chunked form of the same recurrence over T tokens (MODEL.md §3.4, chunk C = 64), starting
 * from S and leaving in S the state after the last token. Mathematically identical to T calls
 * of cpu_deltanet_step (agrees to ~1e-6 relative in fp32).
 *   q, k [T][Hk][dk] (normalised as above), v [T][Hv][dv], g, beta [T][Hv]
 *   S [Hv][dk][dv] in/out,  o [T][Hv][dv]
 *   scratch: cpu_deltanet_chunked_scratch(Hv, dk, dv) floats (no allocation inside).
 * A last partial chunk is computed with its real length, which equals zero padding: padded
 * rows have k = 0, beta = 0, g = 0 and cannot reach real rows or the state. */
void cpu_deltanet_chunked(float *o, float *S, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, int T, int Hk, int Hv, int dk, int dv, float *scratch);
int64_t cpu_deltanet_chunked_scratch(int Hv, int dk, int dv);

/* ---- elementwise ----------------------------------------------------------------------- */

/* y[i] += x[i] (residual add). */
void cpu_add(float *y, const float *x, int64_t n);
/* y[i] = silu(gate[i]) * up[i] (SwiGLU). y may equal gate or up. */
void cpu_silu_mul(float *y, const float *gate, const float *up, int64_t n);
/* y[i] *= sigmoid(gate[i]) (Qwen3.5 attention output gate). */
void cpu_sigmoid_mul(float *y, const float *gate, int64_t n);

#endif
