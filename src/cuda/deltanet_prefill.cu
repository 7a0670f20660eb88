/* deltanet_prefill.cu — the Gated DeltaNet mixer for T > 1 tokens (MODEL.md §3.3, §3.4), as four
 * kernels over chunks of C = 64 tokens (dk = dv = 128; head j of Hv reads k-head n = j/(Hv/Hk)):
 *   1. dn_conv_bf16_tok  (16-token groups x head units): causal conv + SiLU, l2norm of q/k (fp32), gates.
 *   2. dn_local_chunk    (chunks x Hv, all chunks in parallel), with gamma = cumsum(g):
 *        A[r][s] = beta_r (k_r . k_s) e^(gamma_r - gamma_s) (s < r), T = (I + A)^-1 (fp32, 16x16
 *        blocks) -> T2 = T diag(beta);  P = (Q K^T) o Gamma dk^-1/2 (s <= r).
 *   3. dn_scan           (Hv x dv/16 = 128 CTAs at 16 heads; sequential over chunks), per chunk:
 *        R = V - diag(e^gamma) K S, V' = T2 R (= U - W S with U = T2 V, W = T2 diag(e^gamma) K),
 *        O = diag(e^gamma) Q S dk^-1/2 + P V' -> bf16, S <- e^gamma_L S + K^T diag(e^(gamma_L - gamma)) V'.
 *   4. dn_norm_out       (rows): the gated RMSNorm of bf16(O) with z.
 * Matrix products run on mma.sync (bf16 in, fp32 out). v is a bf16 value (HF's conv output); every
 * fp32 operand is "split bf16" (x = hi + lo, hi = bf16(x), lo = bf16(x - hi), ~16 mantissa bits):
 * q^, k^, S, T2, R, V', P; a product of two split operands takes 3 mma (hi hi + hi lo + lo hi), one
 * with v 2. Why: with plain bf16 operands single prefill rows of test_prefill_model were 4.8-6.6 %
 * from the fp32 CPU where the fp32 decode step is at 1.8 %. A scalar model of the chunk algebra
 * (one head, T = 130, beta 0.98, repeating keys) against an fp64 recurrence: bf16 T2/W/U/V'/P gives
 * rel L2 1e-2 on o, worst row 2e-2; split products with bf16 q^/k^ 2.6e-3 / 1.5e-2 (rows whose
 * output is small are sensitive to q^ k^ rounding); split q^/k^ too 1e-5 / 2e-5.
 * Applying T2 to the residual R inside the scan (instead of storing U and W from the chunk-local
 * kernel) also keeps the scan's per-chunk loads small (T2 is 64x64, W 64x128).
 * Rows past T (the zero padding up to a multiple of 64) have k = v = beta = g = 0.
 * The conv ring: kernel 1 reads the rows before the call; kernel 3 writes the call's last K rows.
 * Snapshots inside the call (n_pts, the prefix cache's points): kernel 1 copies each point's K pre-conv rows (its conv
 * window), kernel 3 the state at each point from the chunk that holds it (dn_scan_point). */
#include <stdlib.h>
#include <string.h>

#include "cuda/cluster.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops.h"
#include "cuda/async.cuh"

#define DN_C      64                   /* chunk length */
#define DN_D      128                  /* dk = dv */
#define DN_DVS    16                   /* value columns per CTA in the state scan */
#define DN_NSL    (DN_D / DN_DVS)      /* the scan blocks of a head (its column slices) */
#define DN_LD     (DN_C + 4)           /* fp32 row stride of dn_local's A and T tiles (16-byte aligned rows) */
#define DN_QSCALE 0.08838834764831845f /* dk^-1/2 in fp32, applied to Q K^T and Q S in fp32 */

static size_t dn_align(size_t x) { return (x + 255) & ~(size_t)255; }

extern "C" size_t cuda_deltanet_prefill_scratch(DeltaNetScratch *sc, void *base, int T, int Hk, int Hv, int dk,
                                                int dv) {
    const size_t Tp = (size_t)(T + DN_C - 1) / DN_C * DN_C, nc = Tp / DN_C;
    const size_t qk = Tp * Hk * dk * 2, vv = Tp * Hv * dv * 2, gate = Tp * Hv * 4, cc = nc * Hv * 2 * DN_C * DN_C * 2;
    const size_t part = nc * Hv * 2 * DN_NSL * DN_C * 4, cnt = nc * Hv * 4;
    const size_t sz[12] = {qk, qk, qk, qk, vv, gate, gate, cc, cc, vv, part, cnt};
    size_t off[12], total = 0;
    for (int i = 0; i < 12; i++) off[i] = total, total += dn_align(sz[i]);
    if (sc && base) {
        char *b = (char *)base;
        sc->q = (uint16_t *)(b + off[0]);
        sc->q_lo = (uint16_t *)(b + off[1]);
        sc->k = (uint16_t *)(b + off[2]);
        sc->k_lo = (uint16_t *)(b + off[3]);
        sc->v = (uint16_t *)(b + off[4]);
        sc->beta = (float *)(b + off[5]);
        sc->g = (float *)(b + off[6]);
        sc->t = (uint16_t *)(b + off[7]);
        sc->p = (uint16_t *)(b + off[8]);
        sc->o = (uint16_t *)(b + off[9]);
        sc->part = (float *)(b + off[10]);
        sc->cnt = (int *)(b + off[11]);
    }
    return total;
}

/* Inclusive prefix sum of the chunk's 64 log-decays: lane l holds g[2l], g[2l+1] and returns
 * gamma[2l], gamma[2l+1]. */
__device__ __forceinline__ void dn_gamma_scan(float g0, float g1, int lane, float &y0, float &y1) {
    float s = g0 + g1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float v = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s += v;
    }
    y1 = s;
    y0 = s - g1;
}
/* gamma[r] from the scan registers of the warp (all lanes must call). */
__device__ __forceinline__ float dn_gamma_at(float y0, float y1, int r) {
    const float a = __shfl_sync(0xffffffffu, y0, r >> 1), b = __shfl_sync(0xffffffffu, y1, r >> 1);
    return (r & 1) ? b : a;
}

/* gamma_L = gamma[63] and gamma[r0], gamma[r0 + 8] of chunk c from the log-decays gn0, gn1 (lane l: rows
 * 2l, 2l+1) the warp loaded one chunk ahead; loads chunk c+1's into gn0, gn1 (all lanes must call). y0, y1: the
 * scan registers (dn_gamma_at). */
__device__ __forceinline__ void dn_chunk_gamma(const DeltaNetPrefillParams &p, const DeltaNetScratch &sc, int c, int nc,
                                               int j, int lane, int r0, float &gn0, float &gn1, float &gL, float gr[2],
                                               float &y0, float &y1) {
    dn_gamma_scan(gn0, gn1, lane, y0, y1);
    gL = __shfl_sync(0xffffffffu, y1, 31);
    if (c + 1 < nc) {
        gn0 = sc.g[(size_t)((c + 1) * DN_C + 2 * lane) * p.Hv + j];
        gn1 = sc.g[(size_t)((c + 1) * DN_C + 2 * lane + 1) * p.Hv + j];
    }
#pragma unroll
    for (int h = 0; h < 2; h++) gr[h] = dn_gamma_at(y0, y1, r0 + 8 * h);
}

/* The call's snapshot points: p.pt_* or, where set, the device table p.pts (DnPtsDev) */
__device__ __forceinline__ int dn_n_pts(const DeltaNetPrefillParams &p) { return p.pts ? p.pts->n : p.n_pts; }
__device__ __forceinline__ int dn_pt_off(const DeltaNetPrefillParams &p, int i) {
    return p.pts ? p.pts->off[i] : p.pt_off[i];
}
__device__ __forceinline__ float *dn_pt_state(const DeltaNetPrefillParams &p, int i) {
    return p.pts ? (float *)(p.pts->base[i] + (unsigned long long)p.pts_q * p.pts->lstride) : p.pt_state[i];
}
__device__ __forceinline__ uint16_t *dn_pt_ring(const DeltaNetPrefillParams &p, int i) {
    return p.pts ? (uint16_t *)(p.pts->base[i] + (unsigned long long)p.pts_q * p.pts->lstride + p.pts->ring_off)
                 : p.pt_ring[i];
}

__device__ __forceinline__ bool dn_pt_bf16(const DeltaNetPrefillParams &p) { return p.pts ? p.pts->bf16 : p.pt_bf16; }

/* Entries i, i + 1 of a state (fp32, or bf16 entries) whose first entry is at S */
__device__ __forceinline__ float2 dn_state_ld2(bool bf16, const float *S, size_t i) {
    if (!bf16) return *(const float2 *)(S + i);
    const uint32_t u = *(const uint32_t *)((const uint16_t *)S + i);
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
__device__ __forceinline__ void dn_state_st2(bool bf16, float *S, size_t i, float2 v) {
    if (bf16)
        *(uint32_t *)((uint16_t *)S + i) = (uint32_t)bf16_bits(v.x) | (uint32_t)bf16_bits(v.y) << 16;
    else
        *(float2 *)(S + i) = v;
}

/* ---- 1. conv + SiLU + l2norm + gates --------------------------------------------------- */

/* l2norm of one 128-channel q/k head in fp32 (MODEL.md §4.1; emulating a bf16 l2norm moved our
 * logits further from HF's on the golden fixtures, see docs/MODEL_NOTES.md). v[4] are the lane's 4
 * channels; the result is stored split (hi + lo bf16) for the tensor cores. */
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

/* grid (Tp/DN_TPW, ceil((2Hk + Hv)/4)), 128 threads. Warp = DN_TPW = 8 consecutive tokens of one
 * head unit (q heads, k heads, v heads of 128 channels; lane holds channels 2 lane, 2 lane + 1,
 * 64 + 2 lane, 65 + 2 lane): it loads the K-1 + DN_TPW pre-conv rows it needs at once (11 rows for
 * 8 tokens; from proj, or from the conv ring for rows before the call: row q % K holds position q,
 * positions < 0 are 0) and then works from registers; tokens are independent, so all warps run in
 * parallel. Rows t in [T, Tp) write zeros. The ring itself is rewritten later by dn_scan (it runs
 * after this kernel has read the old rows). q and k are stored l2-normalised (split hi + lo)
 * WITHOUT the dk^-1/2 scale (applied in fp32 to Q K^T in dn_local and to Q S in dn_scan). */
#define DN_TPW 8 /* tokens per warp */
template <int KC>
__global__ void __launch_bounds__(128)
    dn_conv_bf16_tok(const __grid_constant__ DeltaNetPrefillParams p, const __grid_constant__ DeltaNetScratch sc) {
    pdl_begin();
    constexpr int NR = KC - 1 + DN_TPW; /* rows t0 - (KC-1) .. t0 + DN_TPW - 1 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int unit = blockIdx.y * 4 + warp, t0 = blockIdx.x * DN_TPW;
    if (unit >= 2 * p.Hk + p.Hv) return;
    const int kind = unit < p.Hk ? 0 : unit < 2 * p.Hk ? 1 : 2; /* q, k, v */
    const int head = kind == 0 ? unit : kind == 1 ? unit - p.Hk : unit - 2 * p.Hk;
    const int ch0 = kind == 2 ? 2 * p.Hk * DN_D + head * DN_D : (kind * p.Hk + head) * DN_D;
    const int cd = (2 * p.Hk + p.Hv) * DN_D;   /* conv_dim */
    const int Tr = p.t_real ? *p.t_real : p.T; /* rows from Tr on are padding: zeros */

    float x[NR][4];
#pragma unroll
    for (int j = 0; j < NR; j++) {
        const int u = t0 - (KC - 1) + j, q = p.pos + u;
        uint32_t r0 = 0, r1 = 0;
        if (u >= 0 && u < p.T) {
            const uint16_t *row = p.proj + (size_t)u * p.ld_proj + ch0 + 2 * lane;
            r0 = *(const uint32_t *)row;
            r1 = *(const uint32_t *)(row + 64);
        } else if (u < 0 && q >= 0) {
            const uint16_t *row = p.conv_ring + (size_t)(q % KC) * cd + ch0 + 2 * lane;
            r0 = *(const uint32_t *)row;
            r1 = *(const uint32_t *)(row + 64);
        }
        x[j][0] = __uint_as_float(r0 << 16);
        x[j][1] = __uint_as_float(r0 & 0xffff0000u);
        x[j][2] = __uint_as_float(r1 << 16);
        x[j][3] = __uint_as_float(r1 & 0xffff0000u);
    }
    float w[4][KC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int ch = ch0 + 2 * lane + (i & 1) + 64 * (i >> 1);
#pragma unroll
        for (int j = 0; j < KC; j++) w[i][j] = p.conv_w[(size_t)ch * KC + j];
    }
#pragma unroll
    for (int tt = 0; tt < DN_TPW; tt++) {
        const int t = t0 + tt;
        const bool real = t < Tr;
        float c[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float acc = w[i][KC - 1] * x[tt + KC - 1][i];
#pragma unroll
            for (int j = 0; j < KC - 1; j++) acc += w[i][j] * x[tt + j][i];
            const float a = rbf(acc);
            c[i] = real ? rbf(silu_f(a)) : 0.0f; /* fast form: the exact one was half the kernel's instructions */
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
    if (blockIdx.x == 0) /* the snapshots' conv windows: the K pre-conv rows before each point, this unit's channels */
        for (int i = 0, n_pts = dn_n_pts(p); i < n_pts; i++)
            for (int j = 0; j < KC; j++) {
                const int u = dn_pt_off(p, i) - KC + j, q = p.pos + u; /* u < pt_off[i] < T */
                uint32_t r0 = 0, r1 = 0;
                if (u >= 0) {
                    const uint16_t *row = p.proj + (size_t)u * p.ld_proj + ch0 + 2 * lane;
                    r0 = *(const uint32_t *)row;
                    r1 = *(const uint32_t *)(row + 64);
                } else if (q >= 0) { /* the ring is rewritten only by dn_scan, after this kernel */
                    const uint16_t *row = p.conv_ring + (size_t)(q % KC) * cd + ch0 + 2 * lane;
                    r0 = *(const uint32_t *)row;
                    r1 = *(const uint32_t *)(row + 64);
                }
                uint16_t *dst = dn_pt_ring(p, i) + (size_t)((q % KC + KC) % KC) * cd + ch0 + 2 * lane;
                *(uint32_t *)dst = r0;
                *(uint32_t *)(dst + 64) = r1;
            }
    if (kind == 2 && lane < DN_TPW) { /* gates of the warp's tokens, one lane per token */
        const int t = t0 + lane;
        float beta = 0.0f, g = 0.0f;
        if (t < Tr) {
            const float b = __uint_as_float((uint32_t)p.proj[(size_t)t * p.ld_proj + p.b_off + head] << 16);
            const float a = __uint_as_float((uint32_t)p.proj[(size_t)t * p.ld_proj + p.a_off + head] << 16);
            beta = rbf(sigmoid_acc(b));
            const float xx = a + p.dt_bias[head];
            g = -expf(p.A_log[head]) * (xx > 20.0f ? xx : log1pf(expf(xx)));
        }
        sc.beta[(size_t)t * p.Hv + head] = beta;
        sc.g[(size_t)t * p.Hv + head] = g;
    }
}

/* ---- 2. chunk-local transform ---------------------------------------------------------- */

struct DnLocalSmem {
    static constexpr int K = 0;                       /* bf16 [128][128]: k^ hi rows 0..63, lo rows 64..127 */
    static constexpr int Q = K + 2 * DN_C * DN_D * 2; /* bf16 [128][128]: q^ hi, lo */
    static constexpr int A = Q + 2 * DN_C * DN_D * 2; /* fp32 [64][68] */
    static constexpr int TI = A + DN_C * DN_LD * 4;   /* fp32 [64][68] */
    static constexpr int X = TI + DN_C * DN_LD * 4;   /* fp32 [3][16][16] */
    static constexpr int VEC = X + 3 * 256 * 4;       /* fp32 beta[64], gamma[64] */
    static constexpr int BYTES = VEC + 2 * DN_C * 4;
};

/* grid (Tp/64, Hv), 256 threads, ~100 KB of shared memory (2 blocks per SM). Writes, for chunk c
 * and head j, T2 = (I + A)^-1 diag(beta) and P = (Q^ K^T) o Gamma * dk^-1/2 (s <= r) as split bf16
 * planes (hi [64][64] row-major, then lo). */
__global__ void __launch_bounds__(256, 2)
    dn_local_chunk(const __grid_constant__ DeltaNetPrefillParams p, const __grid_constant__ DeltaNetScratch sc) {
    pdl_begin();
    using L = DnLocalSmem;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sb = smem_addr(smem);
    float *sA = (float *)(smem + L::A), *sTi = (float *)(smem + L::TI), *sX = (float *)(smem + L::X);
    float *sbeta = (float *)(smem + L::VEC), *sgam = sbeta + DN_C;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int c = blockIdx.x, j = blockIdx.y, n = j / (p.Hv / p.Hk), t0 = c * DN_C;

#pragma unroll
    for (int jj = 0; jj < 2 * DN_C * 16 / 256; jj++) { /* rows 0..63 hi, 64..127 lo */
        const int i = tid + jj * 256, r = i >> 4, ch = i & 15;
        const size_t o = ((size_t)(t0 + (r & 63)) * p.Hk + n) * DN_D + ch * 8;
        cp_async16(sb + L::K + swz<16>(r, ch) * 16, (r < DN_C ? sc.k : sc.k_lo) + o, true);
        cp_async16(sb + L::Q + swz<16>(r, ch) * 16, (r < DN_C ? sc.q : sc.q_lo) + o, true);
    }
    cp_async_commit();
    if (tid == 0) sc.cnt[c * p.Hv + j] = 0; /* dn_scan's count of this chunk and head starts here */
    for (int i = tid; i < DN_C * DN_LD; i += 256) sTi[i] = 0.0f;
    if (warp == 0) {
        const float g0 = sc.g[(size_t)(t0 + 2 * lane) * p.Hv + j], g1 = sc.g[(size_t)(t0 + 2 * lane + 1) * p.Hv + j];
        float y0, y1;
        dn_gamma_scan(g0, g1, lane, y0, y1);
        sgam[2 * lane] = y0, sgam[2 * lane + 1] = y1;
        sbeta[2 * lane] = sc.beta[(size_t)(t0 + 2 * lane) * p.Hv + j];
        sbeta[2 * lane + 1] = sc.beta[(size_t)(t0 + 2 * lane + 1) * p.Hv + j];
    }
    cp_async_wait<0>();
    __syncthreads();

    /* A = (diag(beta) K K^T) o Gamma (strictly lower) and P = (Q K^T) o Gamma * dk^-1/2 (s <= r, split
     * -> global): warp -> rows 16 (w%4), cols 32 (w/4); q^, k^ split: 3 mma per product */
    {
        const int wm = warp & 3, wn = warp >> 2;
        float acc[4][4] = {}, accp[4][4] = {};
#pragma unroll
        for (int kk = 0; kk < DN_D / 16; kk++) {
            uint32_t a[4], al[4], q[4], ql[4];
            ldsm_x4(ldsm_addr_a<16>(sb + L::K, wm * 16, kk * 16, lane), a);
            ldsm_x4(ldsm_addr_a<16>(sb + L::K, DN_C + wm * 16, kk * 16, lane), al);
            ldsm_x4(ldsm_addr_a<16>(sb + L::Q, wm * 16, kk * 16, lane), q);
            ldsm_x4(ldsm_addr_a<16>(sb + L::Q, DN_C + wm * 16, kk * 16, lane), ql);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t b[4], bl[4];
                ldsm_x4(ldsm_addr_bt<16>(sb + L::K, wn * 32 + np * 16, kk * 16, lane), b);
                ldsm_x4(ldsm_addr_bt<16>(sb + L::K, DN_C + wn * 32 + np * 16, kk * 16, lane), bl);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mma_bf16(acc[2 * np + h], a, bl[2 * h], bl[2 * h + 1]);
                    mma_bf16(acc[2 * np + h], al, b[2 * h], b[2 * h + 1]);
                    mma_bf16(acc[2 * np + h], a, b[2 * h], b[2 * h + 1]);
                    mma_bf16(accp[2 * np + h], q, bl[2 * h], bl[2 * h + 1]);
                    mma_bf16(accp[2 * np + h], ql, b[2 * h], b[2 * h + 1]);
                    mma_bf16(accp[2 * np + h], q, b[2 * h], b[2 * h + 1]);
                }
            }
        }
        uint16_t *pg = sc.p + ((size_t)c * p.Hv + j) * 2 * DN_C * DN_C;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = wm * 16 + g + 8 * h, s = wn * 32 + nt * 8 + 2 * t;
                float pv[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float dec = __expf(sgam[r] - sgam[s + e]); /* exponent <= 0: ex2.approx, ~2 ulp */
                    sA[r * DN_LD + s + e] = s + e < r ? sbeta[r] * acc[nt][2 * h + e] * dec : 0.0f;
                    pv[e] = s + e <= r ? accp[nt][2 * h + e] * DN_QSCALE * dec : 0.0f;
                }
                *(uint32_t *)(pg + r * DN_C + s) = pack_bf16(pv[0], pv[1]);
                *(uint32_t *)(pg + DN_C * DN_C + r * DN_C + s) = pack_bf16(pv[0] - rbf(pv[0]), pv[1] - rbf(pv[1]));
            }
    }
    __syncthreads();

    /* T = (I + A)^-1. Diagonal 16x16 blocks by forward substitution (warp b, lane = column) */
    if (warp < 4 && lane < 16) {
        const int b0 = warp * 16;
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float v = i == lane ? 1.0f : 0.0f;
#pragma unroll
            for (int s = 0; s < i; s++) v -= sA[(b0 + i) * DN_LD + b0 + s] * x[s];
            x[i] = v;
        }
#pragma unroll
        for (int i = 0; i < 16; i++) sTi[(b0 + i) * DN_LD + b0 + lane] = x[i];
    }
    __syncthreads();
    /* block row bi: X_bj = sum_{bj <= bk < bi} A[bi][bk] T[bk][bj];  T[bi][bj] = -T[bi][bi] X_bj.
     * Thread -> (bj, row i, 4 columns): per 4 k-values one float4 of the A (T) row and four float4
     * rows of T (X), 16 FMA per 5 shared loads (the rows are 68 floats: 16-byte aligned; the T loads
     * are broadcasts across i, the A loads hit 8 distinct 4-bank groups). */
    for (int bi = 1; bi < 4; bi++) {
        if (tid < bi * 64) {
            const int bj = tid >> 6, i = (tid >> 2) & 15, c4 = (tid & 3) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int bk = bj; bk < bi; bk++) {
#pragma unroll
                for (int s4 = 0; s4 < 16; s4 += 4) {
                    const float4 a = *(const float4 *)(sA + (bi * 16 + i) * DN_LD + bk * 16 + s4);
                    const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const float4 tr = *(const float4 *)(sTi + (bk * 16 + s4 + q) * DN_LD + bj * 16 + c4);
                        v.x = fmaf(av[q], tr.x, v.x);
                        v.y = fmaf(av[q], tr.y, v.y);
                        v.z = fmaf(av[q], tr.z, v.z);
                        v.w = fmaf(av[q], tr.w, v.w);
                    }
                }
            }
            *(float4 *)(sX + bj * 256 + i * 16 + c4) = v;
        }
        __syncthreads();
        if (tid < bi * 64) {
            const int bj = tid >> 6, i = (tid >> 2) & 15, c4 = (tid & 3) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int s4 = 0; s4 < 16; s4 += 4) {
                const float4 a = *(const float4 *)(sTi + (bi * 16 + i) * DN_LD + bi * 16 + s4);
                const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float4 xr = *(const float4 *)(sX + bj * 256 + (s4 + q) * 16 + c4);
                    v.x = fmaf(av[q], xr.x, v.x);
                    v.y = fmaf(av[q], xr.y, v.y);
                    v.z = fmaf(av[q], xr.z, v.z);
                    v.w = fmaf(av[q], xr.w, v.w);
                }
            }
            *(float4 *)(sTi + (bi * 16 + i) * DN_LD + bj * 16 + c4) = make_float4(-v.x, -v.y, -v.z, -v.w);
        }
        __syncthreads();
    }

    /* T2 = T diag(beta) -> split bf16 planes in global: thread -> row tid/4, 16 columns */
    {
        const int r = tid >> 2, c0 = (tid & 3) * 16;
        uint16_t *dst = sc.t + ((size_t)c * p.Hv + j) * 2 * DN_C * DN_C + r * DN_C + c0;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t hi[4], lo[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int s = c0 + h * 8 + 2 * q;
                const float x0 = sTi[r * DN_LD + s] * sbeta[s], x1 = sTi[r * DN_LD + s + 1] * sbeta[s + 1];
                hi[q] = pack_bf16(x0, x1);
                lo[q] = pack_bf16(x0 - rbf(x0), x1 - rbf(x1));
            }
            *(uint4 *)(dst + h * 8) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            *(uint4 *)(dst + DN_C * DN_C + h * 8) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
    }
}

/* ---- the gated RMSNorm (MODEL.md: the norm of bf16(O) over a head's dv columns, gated by silu(z)) -------------- */

/* rsqrt(mean(o^2) + eps) of row r of a chunk from dn_scan<true>'s sums of squares part [2 DN_NSL][64] (slot
 * 2 x + wn: columns 16 x + 8 wn .. + 7 of the head), added in slot order. */
__device__ __forceinline__ float dn_norm_inv(const float *part, int r, float eps) {
    float tot = 0.0f;
#pragma unroll
    for (int s = 0; s < 2 * DN_NSL; s++) tot += __ldcg(part + s * DN_C + r);
    return rsqrtf(tot / (float)DN_D + eps);
}
/* y = bf16(w bf16(o inv)) silu(z), rounded to bf16 by its store */
__device__ __forceinline__ float dn_gate_out(float o, float inv, float w, float z) {
    return rbf(w * rbf(o * inv)) * silu_f(z);
}

/* ---- 3. sequential state scan with the output ------------------------------------------ */

#include "cuda/deltanet_prefill_scan.cuh"

/* ---- 4. the gated RMSNorm where dn_scan does not apply it ----------------------------------- */

/* grid (ceil(T Hv / (8 DN_NR))), 256 threads, after dn_scan<false>: warp = DN_NR (token, head) rows of bf16(O)
 * (sc.o) and z; lane holds columns 2 lane, 2 lane + 1, 64 + 2 lane, 65 + 2 lane. All the warp's loads are issued
 * before the first reduction. */
#define DN_NR 4
__global__ void __launch_bounds__(256)
    dn_norm_out(const __grid_constant__ DeltaNetPrefillParams p, const __grid_constant__ DeltaNetScratch sc) {
    pdl_begin();
    const int row0 = (blockIdx.x * 8 + (threadIdx.x >> 5)) * DN_NR, lane = threadIdx.x & 31, rows = p.T * p.Hv;
    uint32_t ou[DN_NR][2], zu[DN_NR][2];
#pragma unroll
    for (int k = 0; k < DN_NR; k++) {
        const int row = row0 + k;
        if (row >= rows) break;
        const int tok = row / p.Hv, j = row - tok * p.Hv;
        const uint16_t *o = sc.o + (size_t)row * DN_D, *z = p.proj + (size_t)tok * p.ld_proj + p.z_off + j * DN_D;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            ou[k][h] = *(const uint32_t *)(o + 64 * h + 2 * lane);
            zu[k][h] = *(const uint32_t *)(z + 64 * h + 2 * lane);
        }
    }
#pragma unroll
    for (int k = 0; k < DN_NR; k++) {
        const int row = row0 + k;
        if (row >= rows) break;
        float ss = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float a = __uint_as_float(ou[k][h] << 16), b = __uint_as_float(ou[k][h] & 0xffff0000u);
            ss += a * a + b * b;
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
        const float inv = rsqrtf(ss / (float)DN_D + p.eps);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = 64 * h + 2 * lane + e;
                const float x = __uint_as_float(e ? (ou[k][h] & 0xffff0000u) : (ou[k][h] << 16));
                const float zz = __uint_as_float(e ? (zu[k][h] & 0xffff0000u) : (zu[k][h] << 16));
                v[e] = dn_gate_out(x, inv, p.norm_w[col], zz);
            }
            *(uint32_t *)(p.y + (size_t)row * DN_D + 64 * h + 2 * lane) = pack_bf16(v[0], v[1]);
        }
    }
}

/* ---- launcher -------------------------------------------------------------------------- */

template <int KC>
static int dn_launch_conv(const DeltaNetPrefillParams *p, const DeltaNetScratch &sc, int nc, const CudaLaunch *l) {
    dim3 grid(nc * DN_C / DN_TPW, (2 * p->Hk + p->Hv + 3) / 4);
    return launch_ex(dn_conv_bf16_tok<KC>, grid, dim3(128), 0, 0, l, *p, sc);
}

/* Shared memory of dn_scan: the layout, its two mbarriers and slack for the 1024-byte alignment. */
#define DN_SCAN_SMEM (DnScanSmem::BYTES + 16 + 1024)

/* Whether dn_scan applies the gated norm itself (dn_scan<true>) for nc chunks: where it replaces a launch at the end
 * of a short call (nc <= DN_SCAN_NORM_CHUNKS; over more chunks its per-chunk wait for the head's other blocks
 * lengthens the chain), and when every block of the grid is resident at once (its blocks wait for each other);
 * else dn_scan<false> and dn_norm_out. Sets both instances' shared-memory limit; 0 on a CUDA error too (the launch
 * then reports it). */
#define DN_SCAN_NORM_CHUNKS 2
static int dn_scan_norms(int Hv, int nc) {
    static int blocks = -1; /* resident dn_scan<true> blocks on the device */
    if (blocks < 0) {
        int dev = 0, n_sm = 0, per_sm = 0;
        if (smem_attr<dn_scan<true>>(DN_SCAN_SMEM) != cudaSuccess ||
            smem_attr<dn_scan<false>>(DN_SCAN_SMEM) != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dn_scan<true>, 512, DN_SCAN_SMEM) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        blocks = n_sm * per_sm;
    }
    return nc <= DN_SCAN_NORM_CHUNKS && blocks >= DN_NSL * Hv;
}

static int dn_launch_scan(const DeltaNetPrefillParams *p, const DeltaNetScratch &sc, int nc, const CudaLaunch *l) {
    const int Tp = nc * DN_C, rows_tp = nc * p->Hv * 2 * DN_C;
    DnScanMaps m;
    memset(&m, 0, sizeof m);
    int rc = cuda_tma_map_bf16(&m.k, sc.k, Tp, p->Hk * DN_D, p->Hk * DN_D, DN_C);
    if (!rc) rc = cuda_tma_map_bf16(&m.kl, sc.k_lo, Tp, p->Hk * DN_D, p->Hk * DN_D, DN_C);
    if (!rc) rc = cuda_tma_map_bf16(&m.q, sc.q, Tp, p->Hk * DN_D, p->Hk * DN_D, DN_C);
    if (!rc) rc = cuda_tma_map_bf16(&m.ql, sc.q_lo, Tp, p->Hk * DN_D, p->Hk * DN_D, DN_C);
    if (!rc) rc = cuda_tma_map_bf16(&m.t, sc.t, rows_tp, DN_C, DN_C, 2 * DN_C);
    if (!rc) rc = cuda_tma_map_bf16(&m.p, sc.p, rows_tp, DN_C, DN_C, 2 * DN_C);
    if (rc) return rc;
    const dim3 grid(DN_NSL, p->Hv);
    return dn_scan_norms(p->Hv, nc) ? launch_ex(dn_scan<true>, grid, dim3(512), DN_SCAN_SMEM, 0, l, *p, sc, m)
                                    : launch_ex(dn_scan<false>, grid, dim3(512), DN_SCAN_SMEM, 0, l, *p, sc, m);
}

extern "C" int cuda_deltanet_prefill(const DeltaNetPrefillParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->pos < 0 || !p->conv_ring || !p->state || p->dk != DN_D || p->dv != DN_D || p->Hk < 1 ||
        p->Hv < 1 || p->Hv % p->Hk || p->K < 2 || p->K > 4 || !p->scratch || ((uintptr_t)p->scratch & 255) ||
        p->ld_proj % 2 || p->z_off % 2 || ((uintptr_t)p->proj & 3) || ((uintptr_t)p->y & 3) ||
        ((uintptr_t)p->conv_ring & 3) || ((uintptr_t)p->state & 7) || p->n_pts < 0 || p->n_pts > DN_MAX_PTS ||
        (p->pts && (p->n_pts || p->pts_q < 0)))
        return (int)cudaErrorInvalidValue;
    for (int i = 0; i < p->n_pts; i++)
        if (p->pt_off[i] < (i ? p->pt_off[i - 1] + 1 : 0) || p->pt_off[i] >= p->T || ((uintptr_t)p->pt_state[i] & 7) ||
            ((uintptr_t)p->pt_ring[i] & 3) || !p->pt_state[i] || !p->pt_ring[i])
            return (int)cudaErrorInvalidValue;
    DeltaNetScratch sc;
    cuda_deltanet_prefill_scratch(&sc, p->scratch, p->T, p->Hk, p->Hv, p->dk, p->dv);
    const int nc = (p->T + DN_C - 1) / DN_C;
    if (p->ev) cudaEventRecord(p->ev[0], l->stream);
    int rc = p->skip & 1 ? 0
             : p->K == 4 ? dn_launch_conv<4>(p, sc, nc, l)
             : p->K == 3 ? dn_launch_conv<3>(p, sc, nc, l)
                         : dn_launch_conv<2>(p, sc, nc, l);
    if (rc) return rc;
    if (p->ev) cudaEventRecord(p->ev[1], l->stream);
    cudaError_t e = smem_attr<dn_local_chunk>(DnLocalSmem::BYTES);
    if (e != cudaSuccess) return (int)e;
    if (p->skip & 2) /* measurement: the scan's counters, which dn_local zeroes, must still start at 0 */
        rc = (int)cudaMemsetAsync(sc.cnt, 0, sizeof(int) * nc * p->Hv, l->stream);
    else
        rc = launch_ex(dn_local_chunk, dim3(nc, p->Hv), dim3(256), DnLocalSmem::BYTES, 0, l, *p, sc);
    if (rc) return rc;
    if (p->ev) cudaEventRecord(p->ev[2], l->stream);
    if (!(p->skip & 4) && (rc = dn_launch_scan(p, sc, nc, l))) return rc;
    if (p->ev) cudaEventRecord(p->ev[3], l->stream);
    if (!(p->skip & 8) && !dn_scan_norms(p->Hv, nc))
        rc = launch_ex(dn_norm_out, dim3((p->T * p->Hv + 8 * DN_NR - 1) / (8 * DN_NR)), dim3(256), 0, 0, l, *p, sc);
    if (p->ev) cudaEventRecord(p->ev[4], l->stream);
    return rc;
}
