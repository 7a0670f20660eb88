/* deltanet.cuh — device helpers of the DeltaNet decode step shared by deltanet.cu (the step kernel) and
 * deltanet_layer.cu (the whole mixer in one kernel), so both compute the same values bit for bit (deltanet_layer.cu
 * stages the conv history in shared memory and repeats conv_history's sum there, in the same order). */
#ifndef Q35_CUDA_DELTANET_CUH
#define Q35_CUDA_DELTANET_CUH

#include "cuda/common.cuh"

/* DN_MAX_SPLIT: value-column splits per head (the cluster size); 2 and 1 would give 512- and 1024-thread blocks
 * at dv 128-256, past the register file at this kernel's ~72 registers. */
enum { DN_RPT = 4, DN_MAX_SPLIT = 8 };

/* Launch shape for (dk, dv): VEC columns per thread (4 when dv % 4 == 0), tpr threads per state row
 * (a power of two <= 32), cols = tpr*VEC columns per block, splits = blocks (= cluster size) per head. */
typedef struct DnShape {
    int vec, tpr, cols, splits, threads;
} DnShape;

static inline int dn_shape(int dk, int dv, DnShape *s) {
    if (dk < 1 || dv < 1 || dk > 1024 || dv > 1024) return -1;
    s->vec = dv % 4 == 0 ? 4 : 1;
    const int want = ceil_div(ceil_div(dv, DN_MAX_SPLIT), s->vec);
    int tpr = 1;
    while (tpr < want) tpr <<= 1;
    if (tpr > 32) return -1;
    s->tpr = tpr;
    s->cols = tpr * s->vec;
    s->splits = ceil_div(dv, s->cols);
    s->threads = ceil_div(tpr * ceil_div(dk, DN_RPT), 32) * 32;
    return s->threads > 1024 ? -1 : 0;
}

/* ---- small math (accurate expf: these values are rounded to bf16 right after) ----------------- */

/* The token's gates of value head j: beta = bf16(sigmoid(b)), decay = exp(-exp(A_log) softplus(a + dt_bias)) (softplus
 * linear past 20, as torch's). */
__device__ __forceinline__ void dn_gates(float b_in, float a_in, float dt_bias, float A_log, float *beta,
                                         float *decay) {
    *beta = rbf(sigmoid_acc(b_in));
    const float xa = a_in + dt_bias;
    *decay = expf(-expf(A_log) * (xa > 20.0f ? xa : log1pf(expf(xa))));
}

/* mem[v] = sum_d S[d][c_v] k^[d], sq[v] = sum_d S[d][c_v] q^[d] over this thread's RPT rows s[i] (kd, qd: k^ and q^ at
 * those rows), then over the tpr threads of the row group by shuffles (xor 16 .. tpr): the step's per-lane order. */
template <int RPT, int VEC>
__device__ __forceinline__ void dn_state_dots(const float (&s)[RPT][VEC], const float (&kd)[RPT],
                                              const float (&qd)[RPT], int tpr, float (&mem)[VEC], float (&sq)[VEC]) {
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        float m = 0.0f, q = 0.0f;
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            m = fmaf(s[i][v], kd[i], m);
            q = fmaf(s[i][v], qd[i], q);
        }
        for (int o = 16; o >= tpr; o >>= 1) {
            m += __shfl_xor_sync(0xffffffffu, m, o);
            q += __shfl_xor_sync(0xffffffffu, q, o);
        }
        mem[v] = m;
        sq[v] = q;
    }
}

/* Sum of three values over the block, in fixed order; red: shared float[96]. */
__device__ __forceinline__ void block_sum3(float *a, float *b, float *c, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float x = warp_sum(*a), y = warp_sum(*b), z = warp_sum(*c);
    if (lane == 0) red[w] = x, red[32 + w] = y, red[64 + w] = z;
    __syncthreads();
    x = y = z = 0.0f;
    for (int i = 0; i < nw; i++) x += red[i], y += red[32 + i], z += red[64 + i];
    *a = x, *b = y, *c = z;
}

template <int VEC>
__device__ __forceinline__ void ld_vec(const float *src, float *d) {
    if (VEC == 4) {
        const float4 t = *reinterpret_cast<const float4 *>(src);
        d[0] = t.x;
        d[1] = t.y;
        d[2] = t.z;
        d[3] = t.w;
    } else {
        d[0] = *src;
    }
}
template <int VEC>
__device__ __forceinline__ void st_vec(float *dst, const float *s) {
    if (VEC == 4)
        *reinterpret_cast<float4 *>(dst) = make_float4(s[0], s[1], s[2], s[3]);
    else
        *dst = s[0];
}

/* History part of the causal conv for channel ch: sum_{j<K-1} w[ch][j] m_{pos-(K-1)+j}[ch]; row of
 * position pos-(K-1)+j in the ring is (pos+1+j) mod K. *tap = w[ch][K-1] (multiplies the current m). */
template <typename P> /* a params struct with conv_w, conv_ring, K (DeltanetStepParams) */
__device__ __forceinline__ float conv_history(const P &p, int conv_dim, int ch, int rc, float *tap) {
    const float *w = p.conv_w + (size_t)ch * p.K;
    float acc = 0.0f;
#pragma unroll 4
    for (int j = 0; j < p.K - 1; j++) {
        int row = rc + 1 + j;
        row -= row >= p.K ? p.K : 0;
        acc = fmaf(w[j], bf16u(p.conv_ring[(size_t)row * conv_dim + ch]), acc);
    }
    *tap = w[p.K - 1];
    return acc;
}
/* c = bf16(silu(bf16(conv))) with conv = history + tap*x (HF bf16 conv1d, then bf16 SiLU). */
__device__ __forceinline__ float conv_finish(float hist, float tap, float x) {
    return rbf(silu_acc(rbf(fmaf(tap, x, hist))));
}

#endif
