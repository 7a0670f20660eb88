/* deltanet_conv.cuh — the first step of the DeltaNet prefill mixer (MODEL.md §3.3), written once for its two
 * callers: the conv kernel of deltanet_prefill.cu (dn_conv_bf16_tok, rows read from proj and the conv ring) and
 * the epilogue of the in_proj GEMM for calls of at most one 128-row tile (gemm_tma.cu, GEMM_EPI_DN_CONV: rows
 * read from the tile it just computed). Both hand the same bf16 pre-conv values to the same code, so their
 * outputs are the same bits.
 *
 * A head unit is 128 channels of the conv: q head h (columns h dk), k head h (Hk dk + h dk) or v head h
 * (2 Hk dk + h dv); a warp works on DN_TPW consecutive tokens of one unit, lane holding channels 2 lane,
 * 2 lane + 1, 64 + 2 lane, 65 + 2 lane. */
#ifndef Q35_CUDA_DELTANET_CONV_CUH
#define Q35_CUDA_DELTANET_CONV_CUH

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops.h"

#define DN_D   128 /* dk = dv */
#define DN_TPW 8   /* tokens per warp */

/* The lane's two bf16 pairs of a pre-conv row as 4 floats. */
__device__ __forceinline__ void dn_unpack4(uint32_t r0, uint32_t r1, float x[4]) {
    x[0] = __uint_as_float(r0 << 16);
    x[1] = __uint_as_float(r0 & 0xffff0000u);
    x[2] = __uint_as_float(r1 << 16);
    x[3] = __uint_as_float(r1 & 0xffff0000u);
}

/* The lane's pair words of pre-conv row u (relative to the call) of the unit at column ch0 when u < 0: the conv
 * ring's row of position pos + u, 0 before position 0. */
template <int KC>
__device__ __forceinline__ void dn_ring_row(const DeltaNetPrefillParams &p, int ch0, int u, int lane, uint32_t &r0,
                                            uint32_t &r1) {
    const int q = p.pos + u, cd = (2 * p.Hk + p.Hv) * DN_D;
    r0 = r1 = 0;
    if (q >= 0) {
        const uint16_t *row = p.conv_ring + (size_t)(q % KC) * cd + ch0 + 2 * lane;
        r0 = *(const uint32_t *)row;
        r1 = *(const uint32_t *)(row + 64);
    }
}

/* The lane's conv taps: w[i][j] for its channel i (0..3 as above), tap j (tap KC - 1 is the current token). */
template <int KC>
__device__ __forceinline__ void dn_conv_taps(const DeltaNetPrefillParams &p, int ch0, int lane, float w[4][KC]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int ch = ch0 + 2 * lane + (i & 1) + 64 * (i >> 1);
#pragma unroll
        for (int j = 0; j < KC; j++) w[i][j] = p.conv_w[(size_t)ch * KC + j];
    }
}

/* l2norm of one 128-channel q/k head in fp32 (MODEL.md §4.1; emulating a bf16 l2norm moved our logits further
 * from HF's on the golden fixtures, see docs/MODEL_NOTES.md). v[4]: the lane's 4 channels. */
__device__ __forceinline__ void dn_l2norm_f32(float v[4]) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) ss = fmaf(v[i], v[i], ss);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss + 1e-6f);
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] *= inv;
}

/* Tokens t0 .. t0 + DN_TPW - 1 of head unit `unit` (0 .. 2 Hk + Hv - 1) from x[j] = the lane's channels of pre-conv
 * row t0 - (KC - 1) + j (rows before the call from the ring, rows >= T anything: their outputs are zeros): causal
 * conv + SiLU, then q and k l2-normalised in fp32 and stored split (hi + lo bf16) WITHOUT the dk^-1/2 scale
 * (applied in fp32 to Q K^T in dn_local and to Q S in dn_scan), v stored bf16. The whole warp calls. */
template <int KC>
__device__ __forceinline__ void dn_conv_store(const DeltaNetPrefillParams &p, const DeltaNetScratch &sc, int unit,
                                              int t0, const float (*x)[4], const float w[4][KC], int lane) {
    const int kind = unit < p.Hk ? 0 : unit < 2 * p.Hk ? 1 : 2; /* q, k, v */
    const int head = kind == 0 ? unit : kind == 1 ? unit - p.Hk : unit - 2 * p.Hk;
#pragma unroll
    for (int tt = 0; tt < DN_TPW; tt++) {
        const int t = t0 + tt;
        const bool real = t < p.T;
        float c[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float acc = w[i][KC - 1] * x[tt + KC - 1][i];
#pragma unroll
            for (int j = 0; j < KC - 1; j++) acc += w[i][j] * x[tt + j][i];
            const float a = rbf(acc);
            c[i] = real ? rbf(silu_f(a)) : 0.0f; /* fast form: the exact one was half the conv kernel's instructions */
        }
        if (kind < 2) {
            dn_l2norm_f32(c);
            const size_t o = ((size_t)t * p.Hk + head) * DN_D + 2 * lane;
            uint16_t *dst = (kind == 0 ? sc.q : sc.k) + o, *dlo = (kind == 0 ? sc.q_lo : sc.k_lo) + o;
            *(uint32_t *)dst = pack_bf16(c[0], c[1]);
            *(uint32_t *)(dst + 64) = pack_bf16(c[2], c[3]);
            *(uint32_t *)dlo = pack_bf16(c[0] - rbf(c[0]), c[1] - rbf(c[1]));
            *(uint32_t *)(dlo + 64) = pack_bf16(c[2] - rbf(c[2]), c[3] - rbf(c[3]));
        } else {
            uint16_t *dst = sc.v + ((size_t)t * p.Hv + head) * DN_D + 2 * lane;
            *(uint32_t *)dst = pack_bf16(c[0], c[1]);
            *(uint32_t *)(dst + 64) = pack_bf16(c[2], c[3]);
        }
    }
}

/* Gates of token t (< Tp) and value head `head` from its pre-conv b and a (bf16 values as floats; ignored for
 * t >= T, which get zeros): beta = bf16(sigmoid(b)), log-decay g = -exp(A_log) softplus(a + dt_bias). */
__device__ __forceinline__ void dn_gates_store(const DeltaNetPrefillParams &p, const DeltaNetScratch &sc, int t,
                                               int head, float b, float a) {
    float beta = 0.0f, g = 0.0f;
    if (t < p.T) {
        beta = rbf(sigmoid_acc(b));
        const float xx = a + p.dt_bias[head];
        g = -expf(p.A_log[head]) * (xx > 20.0f ? xx : log1pf(expf(xx)));
    }
    sc.beta[(size_t)t * p.Hv + head] = beta;
    sc.g[(size_t)t * p.Hv + head] = g;
}

/* The snapshots' conv windows: for each point i, the KC pre-conv rows before it, the unit's channels (ch0), into
 * pt_ring[i] (row q % KC holds position q). row(u, r0, r1) gives the lane's words of pre-conv row u (0 <= u < T);
 * rows before the call come from the ring, which must not have been rewritten yet (dn_scan does that). */
template <int KC, typename Row>
__device__ __forceinline__ void dn_conv_windows(const DeltaNetPrefillParams &p, int ch0, int lane, const Row &row) {
    const int cd = (2 * p.Hk + p.Hv) * DN_D;
    for (int i = 0; i < p.n_pts; i++)
        for (int j = 0; j < KC; j++) {
            const int u = p.pt_off[i] - KC + j, q = p.pos + u; /* u < pt_off[i] < T */
            uint32_t r0, r1;
            if (u >= 0)
                row(u, r0, r1);
            else
                dn_ring_row<KC>(p, ch0, u, lane, r0, r1);
            uint16_t *dst = p.pt_ring[i] + (size_t)((q % KC + KC) % KC) * cd + ch0 + 2 * lane;
            *(uint32_t *)dst = r0;
            *(uint32_t *)(dst + 64) = r1;
        }
}

#endif
