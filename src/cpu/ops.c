/* ops.c — fp32 reference ops (contracts and math in ops.h). Straight loops; OpenMP only on
 * the outer loop of each op; inner loops are written so gcc vectorises them (`omp simd`
 * reductions, contiguous fp32 rows). No bf16 rounding anywhere: this is the fp32 reference. */
#include "cpu/ops.h"

#include <math.h>

#include "util.h"

/* ---- helpers --------------------------------------------------------------------------- */

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* sum_i a[i] b[i] */
static inline float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[i] += a x[i] */
static inline void axpy(float *y, float a, const float *x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static inline float dot_bf16(const uint16_t *w, const float *x, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += bf16_to_f32(w[i]) * x[i];
    return s;
}

static int64_t dtype_bytes(DType dt) { return dt == DT_F32 ? 4 : 2; }

/* ---- weights --------------------------------------------------------------------------- */

void cpu_to_f32(float *y, const void *x, DType dt, int64_t n) {
    if (dt == DT_BF16) {
        const uint16_t *h = x;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) y[i] = bf16_to_f32(h[i]);
    } else if (dt == DT_F16) {
        const uint16_t *h = x;
        for (int64_t i = 0; i < n; i++) y[i] = f16_to_f32(h[i]);
    } else {
        memcpy(y, x, (size_t)n * sizeof(float));
    }
}

void cpu_embed(float *x, const void *E, DType dt, int token, int D) {
    cpu_to_f32(x, (const char *)E + (int64_t)token * D * dtype_bytes(dt), dt, D);
}

/* Threads only where a loop has this many multiply-adds: below it the fork and join cost more than the work, and on a
 * machine whose cores are busy the waiting threads make a small model several times slower than one thread. Results
 * do not depend on it (every output is computed by one thread in the same order either way). */
#define CPU_PAR_MIN (1 << 16)

void cpu_matvec(float *y, const float *x, const void *W, DType wt, int rows, int cols) {
    const int par = (int64_t)rows * cols >= CPU_PAR_MIN;
    if (wt == DT_BF16) {
        const uint16_t *w = W;
#pragma omp parallel for schedule(static) if (par)
        for (int r = 0; r < rows; r++) y[r] = dot_bf16(w + (int64_t)r * cols, x, cols);
        return;
    }
    if (wt == DT_F32) {
        const float *w = W;
#pragma omp parallel for schedule(static) if (par)
        for (int r = 0; r < rows; r++) y[r] = dot(w + (int64_t)r * cols, x, cols);
        return;
    }
    cpu_matmul(y, x, W, wt, 1, rows, cols); /* F16: convert rows through a buffer */
}

/* Blocking of cpu_matmul: MM_RB weight rows x MM_CB columns are converted to fp32 (16 KiB,
 * stays in L1), then dotted with every input row, so each input row is read once per
 * MM_RB weight rows and each weight element is converted once per call. */
#define MM_RB 8
#define MM_CB 512

void cpu_matmul(float *Y, const float *X, const void *W, DType wt, int T, int rows, int cols) {
    const int64_t esz = dtype_bytes(wt);
    const int nrb = (rows + MM_RB - 1) / MM_RB;
#pragma omp parallel for schedule(static) if ((int64_t)T * rows * cols >= CPU_PAR_MIN)
    for (int rb = 0; rb < nrb; rb++) {
        float wr[MM_RB][MM_CB];
        const int r0 = rb * MM_RB, nr = rows - r0 < MM_RB ? rows - r0 : MM_RB;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < nr; r++) Y[(int64_t)t * rows + r0 + r] = 0.0f;
        for (int c0 = 0; c0 < cols; c0 += MM_CB) {
            const int nc = cols - c0 < MM_CB ? cols - c0 : MM_CB;
            for (int r = 0; r < nr; r++)
                cpu_to_f32(wr[r], (const char *)W + ((int64_t)(r0 + r) * cols + c0) * esz, wt, nc);
            for (int t = 0; t < T; t++) {
                const float *x = X + (int64_t)t * cols + c0;
                float *y = Y + (int64_t)t * rows + r0;
                for (int r = 0; r < nr; r++) y[r] += dot(wr[r], x, nc);
            }
        }
    }
}

/* ---- norms ----------------------------------------------------------------------------- */

void cpu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps, int unit_offset) {
#pragma omp parallel for schedule(static) if (rows > 1 && (int64_t)rows * n >= CPU_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * n;
        float *yr = y + (int64_t)r * n;
        const float inv = 1.0f / sqrtf(dot(xr, xr, n) / (float)n + eps);
        if (unit_offset) {
            for (int j = 0; j < n; j++) yr[j] = (xr[j] * inv) * (1.0f + w[j]);
        } else {
            for (int j = 0; j < n; j++) yr[j] = w[j] * (xr[j] * inv);
        }
    }
}

void cpu_gated_rmsnorm(float *y, const float *o, const float *z, const float *w, int rows, int n, float eps) {
#pragma omp parallel for schedule(static) if (rows > 1 && (int64_t)rows * n >= CPU_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const float *orow = o + (int64_t)r * n, *zr = z + (int64_t)r * n;
        float *yr = y + (int64_t)r * n;
        const float inv = 1.0f / sqrtf(dot(orow, orow, n) / (float)n + eps);
        for (int j = 0; j < n; j++) yr[j] = (w[j] * (orow[j] * inv)) * silu(zr[j]);
    }
}

void cpu_l2norm(float *x, int rows, int d, float scale) {
    for (int r = 0; r < rows; r++) {
        float *xr = x + (int64_t)r * d;
        const float inv = 1.0f / sqrtf(dot(xr, xr, d) + 1e-6f);
        for (int j = 0; j < d; j++) xr[j] = (xr[j] * inv) * scale;
    }
}

/* ---- rotary embedding ------------------------------------------------------------------ */

void cpu_rope_inv_freq(float *inv_freq, int R, float theta) {
    for (int i = 0; i < R / 2; i++) {
        const float e = (float)(2 * i) / (float)R;
        inv_freq[i] = (float)(1.0 / pow((double)theta, (double)e));
    }
}

void cpu_rope(float *x, int T, int n_heads, int hd, int R, int pos0, const float *inv_freq) {
    const int half = R / 2;
    for (int t = 0; t < T; t++) {
        const float p = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            const float phi = p * inv_freq[i];
            const float c = (float)cos((double)phi), s = (float)sin((double)phi);
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + ((int64_t)t * n_heads + h) * hd;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = b * c + a * s;
            }
        }
    }
}

/* ---- attention ------------------------------------------------------------------------- */

void cpu_attention(float *out, const float *q, const float *Kc, const float *Vc, int T, int pos0, int Hq, int Hkv,
                   int hd, int max_seq, float scale) {
    const int one_block = 0;
    cpu_attention_paged(out, q, Kc, Vc, &one_block, max_seq, T, pos0, Hq, Hkv, hd, scale);
}

void cpu_attention_paged(float *out, const float *q, const float *Kp, const float *Vp, const int *blocks, int block,
                         int T, int pos0, int Hq, int Hkv, int hd, float scale) {
    const int group = Hq / Hkv;
    /* row u of kv head kv: block blocks[u / block], row u % block */
#define KVROW(P, u) ((P) + (((int64_t)blocks[(u) / block] * Hkv + kv) * block + (u) % block) * hd)
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if ((int64_t)T * Hq * (pos0 + T) * hd >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < Hq; j++) {
            const int p = pos0 + t, kv = j / group;
            const float *qv = q + ((int64_t)t * Hq + j) * hd;
            float *o = out + ((int64_t)t * Hq + j) * hd;
            /* pass 1: the max score; pass 2: exp-weights and the weighted sum of V */
            float mx = -INFINITY;
            for (int u = 0; u <= p; u++) {
                const float s = dot(qv, KVROW(Kp, u), hd) * scale;
                if (s > mx) mx = s;
            }
            float sum = 0.0f;
            for (int e = 0; e < hd; e++) o[e] = 0.0f;
            for (int u = 0; u <= p; u++) {
                const float wgt = expf(dot(qv, KVROW(Kp, u), hd) * scale - mx);
                sum += wgt;
                axpy(o, wgt, KVROW(Vp, u), hd);
            }
            const float inv = 1.0f / sum;
            for (int e = 0; e < hd; e++) o[e] *= inv;
        }
    }
#undef KVROW
}

/* ---- DeltaNet -------------------------------------------------------------------------- */

#define CONV_CB 64 /* channels per parallel block */

void cpu_conv1d(float *out, float *state, const float *m, const float *w, int T, int ch, int K) {
    const int nb = (ch + CONV_CB - 1) / CONV_CB;
#pragma omp parallel for schedule(static) if (T > 1 && (int64_t)T * ch * K >= CPU_PAR_MIN)
    for (int cb = 0; cb < nb; cb++) {
        const int c0 = cb * CONV_CB, c1 = ch - c0 < CONV_CB ? ch : c0 + CONV_CB;
        for (int t = 0; t < T; t++) {
            for (int c = c0; c < c1; c++) {
                float s = 0.0f;
                for (int j = 0; j < K; j++) {
                    const int u = t - (K - 1) + j; /* input row index; < 0 reads the state */
                    const float xv = u >= 0 ? m[(int64_t)u * ch + c] : state[(int64_t)(K - 1 + u) * ch + c];
                    s += w[(int64_t)c * K + j] * xv;
                }
                out[(int64_t)t * ch + c] = silu(s);
            }
        }
        /* new state row i = row T-(K-1)+i of [state; m]; reading index >= writing index */
        for (int i = 0; i < K - 1; i++) {
            const int u = T - (K - 1) + i;
            for (int c = c0; c < c1; c++)
                state[(int64_t)i * ch + c] = u >= 0 ? m[(int64_t)u * ch + c] : state[(int64_t)(K - 1 + u) * ch + c];
        }
    }
}

void cpu_conv1d_step(float *out, float *state, const float *m, const float *w, int ch, int K) {
    cpu_conv1d(out, state, m, w, 1, ch, K);
}

void cpu_deltanet_gates(float *beta, float *g, const float *b, const float *a, const float *A_log, const float *dt_bias,
                        int T, int Hv) {
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < Hv; j++) {
            const int64_t i = (int64_t)t * Hv + j;
            const float x = a[i] + dt_bias[j];
            const float sp = x > 20.0f ? x : log1pf(expf(x));
            beta[i] = sigmoid(b[i]);
            g[i] = -expf(A_log[j]) * sp;
        }
    }
}

void cpu_deltanet_step(float *o, float *S, const float *q, const float *k, const float *v, const float *g,
                       const float *beta, int Hk, int Hv, int dk, int dv) {
    const int r = Hv / Hk;
#pragma omp parallel for schedule(static) if ((int64_t)Hv * dk * dv >= CPU_PAR_MIN)
    for (int j = 0; j < Hv; j++) {
        const int n = j / r;
        const float *kj = k + (int64_t)n * dk, *qj = q + (int64_t)n * dk, *vj = v + (int64_t)j * dv;
        float *Sj = S + (int64_t)j * dk * dv, *oj = o + (int64_t)j * dv;
        const float decay = expf(g[j]), b = beta[j];
        float delta[dv];
        /* 1. decay; mem = Sᵀ k accumulated in delta */
        for (int e = 0; e < dv; e++) delta[e] = 0.0f;
        for (int d = 0; d < dk; d++) {
            float *Sd = Sj + (int64_t)d * dv;
            for (int e = 0; e < dv; e++) Sd[e] *= decay;
            axpy(delta, kj[d], Sd, dv);
        }
        /* 2. delta = beta (v - mem); S += k deltaᵀ; o = Sᵀ q after the update */
        for (int e = 0; e < dv; e++) delta[e] = b * (vj[e] - delta[e]);
        for (int e = 0; e < dv; e++) oj[e] = 0.0f;
        for (int d = 0; d < dk; d++) {
            float *Sd = Sj + (int64_t)d * dv;
            axpy(Sd, kj[d], delta, dv);
            axpy(oj, qj[d], Sd, dv);
        }
    }
}

#define DN_C 64 /* chunk length */

int64_t cpu_deltanet_chunked_scratch(int Hv, int dk, int dv) {
    /* per head: gamma[C], W[C][dk], U[C][dv] */
    return (int64_t)Hv * (DN_C + (int64_t)DN_C * dk + (int64_t)DN_C * dv);
}

void cpu_deltanet_chunked(float *o, float *S, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, int T, int Hk, int Hv, int dk, int dv, float *scratch) {
    const int r = Hv / Hk;
    const int64_t per_head = cpu_deltanet_chunked_scratch(1, dk, dv);
#pragma omp parallel for schedule(static) if ((int64_t)Hv * T * dk * dv >= CPU_PAR_MIN)
    for (int j = 0; j < Hv; j++) {
        const int n = j / r;
        float *Sj = S + (int64_t)j * dk * dv;
        float *gam = scratch + j * per_head; /* [C]      cumulative log-decay */
        float *W = gam + DN_C;               /* [C][dk]  L⁻¹ diag(beta e^gam) K */
        float *U = W + (int64_t)DN_C * dk;   /* [C][dv]  L⁻¹ diag(beta) V, then V' = U - W S */
#define KROW(t) (k + ((int64_t)(t)*Hk + n) * dk)
#define QROW(t) (q + ((int64_t)(t)*Hk + n) * dk)
#define VROW(t) (v + ((int64_t)(t)*Hv + j) * dv)
#define OROW(t) (o + ((int64_t)(t)*Hv + j) * dv)
        for (int c0 = 0; c0 < T; c0 += DN_C) {
            const int len = T - c0 < DN_C ? T - c0 : DN_C;
            float acc = 0.0f;
            for (int s = 0; s < len; s++) {
                acc += g[(int64_t)(c0 + s) * Hv + j];
                gam[s] = acc;
            }
            /* Forward substitution, row by row: U = L⁻¹ Vβ and W = L⁻¹ diag(β e^γ) K with
             * L = I + strict_lower(A), A[i][s] = β_i (k_i·k_s) e^(γ_i-γ_s); rows s < i are final. */
            for (int i = 0; i < len; i++) {
                const float bi = beta[(int64_t)(c0 + i) * Hv + j];
                const float *ki = KROW(c0 + i);
                float *Ui = U + (int64_t)i * dv, *Wi = W + (int64_t)i * dk;
                for (int e = 0; e < dv; e++) Ui[e] = bi * VROW(c0 + i)[e];
                const float bg = bi * expf(gam[i]);
                for (int d = 0; d < dk; d++) Wi[d] = bg * ki[d];
                for (int s = 0; s < i; s++) {
                    const float a = bi * dot(ki, KROW(c0 + s), dk) * expf(gam[i] - gam[s]);
                    axpy(Ui, -a, U + (int64_t)s * dv, dv);
                    axpy(Wi, -a, W + (int64_t)s * dk, dk);
                }
            }
            /* V' = U - W S (stored in U) */
            for (int i = 0; i < len; i++) {
                float *Ui = U + (int64_t)i * dv;
                const float *Wi = W + (int64_t)i * dk;
                for (int d = 0; d < dk; d++) axpy(Ui, -Wi[d], Sj + (int64_t)d * dv, dv);
            }
            /* O[i] = e^γ_i q_i S + sum_{s<=i} (q_i·k_s) e^(γ_i-γ_s) V'[s] (S entering the chunk) */
            for (int i = 0; i < len; i++) {
                const float *qi = QROW(c0 + i);
                float *oi = OROW(c0 + i);
                for (int e = 0; e < dv; e++) oi[e] = 0.0f;
                for (int d = 0; d < dk; d++) axpy(oi, qi[d], Sj + (int64_t)d * dv, dv);
                const float eg = expf(gam[i]);
                for (int e = 0; e < dv; e++) oi[e] *= eg;
                for (int s = 0; s <= i; s++) {
                    const float a = dot(qi, KROW(c0 + s), dk) * expf(gam[i] - gam[s]);
                    axpy(oi, a, U + (int64_t)s * dv, dv);
                }
            }
            /* S <- e^γ_last S + sum_s e^(γ_last-γ_s) k_s V'[s]ᵀ */
            const float gl = gam[len - 1], el = expf(gl);
            for (int64_t x = 0; x < (int64_t)dk * dv; x++) Sj[x] *= el;
            for (int s = 0; s < len; s++) {
                const float ws = expf(gl - gam[s]);
                const float *ks = KROW(c0 + s), *Us = U + (int64_t)s * dv;
                for (int d = 0; d < dk; d++) axpy(Sj + (int64_t)d * dv, ws * ks[d], Us, dv);
            }
        }
#undef KROW
#undef QROW
#undef VROW
#undef OROW
    }
}

/* ---- elementwise ----------------------------------------------------------------------- */

void cpu_add(float *y, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void cpu_silu_mul(float *y, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) y[i] = silu(gate[i]) * up[i];
}

void cpu_sigmoid_mul(float *y, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= sigmoid(gate[i]);
}
