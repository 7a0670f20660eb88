/* attention_prefill.cu — full-attention layers for T > 1 tokens (MODEL.md §3.2, §5):
 *   attn_prep_bf16_rows:   per (token, head): RMSNorm over hd, partial NeoX RoPE, K/V cache append.
 *   attn_prefill_bf16_flash: causal GQA flash attention (FA2 scheme on mma.sync): a CTA of 8 warps
 *     owns 64 query rows of one head: 4 row groups of 16 rows x 2 key groups. Key/value stages of
 *     2 BKV keys stream through a 3-deep cp.async ring; key group 0 takes the first BKV keys of each
 *     stage, group 1 the second, each with its own S = Q K^T, running max / sum and O in registers
 *     (P goes from the S accumulators straight into P V as bf16); the two are merged through shared
 *     memory at the end, and the sigmoid output gate is applied on the way out. Scores are in log2
 *     units (scale * log2 e folded into one multiply, exp2). Masked scores are set to a finite -1e30
 *     (key 0 is visible to every query, so no row is ever fully masked); a warp skips sub-tiles
 *     whose keys are all past its rows. When there are more (head, q-tile) pairs than resident
 *     CTAs, a CTA takes q-tile i and then tile n-1-i, so every CTA does the same causal work.
 *     (8 warps instead of 4: the 4-warp form ran 1 CTA = 4 warps per SM at T = 2048, latency-bound
 *     at 111 TFLOP/s on the H200.) */
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/attention_softmax.cuh"
#include "cuda/attn_prep.cuh"
#include "cuda/ops.h"

#define ATTN_BQ      64
#define ATTN_THREADS 256 /* 8 warps: 4 row groups of 16 x 2 key groups */
#define ATTN_STAGES  3   /* K/V ring depth (stages of 2 BKV keys) */

/* ---- prep: norm + RoPE + cache append --------------------------------------------------- */

/* grid (T, ceil((Hq + 2 Hkv) / 4)), 128 threads: warp w handles head unit blockIdx.y*4 + w
 * (q heads, then k heads, then v heads) of token blockIdx.x (attn_prep.cuh). */
__global__ void __launch_bounds__(128) attn_prep_bf16_rows(const __grid_constant__ AttnPrepParams p) {
    pdl_begin();
    __shared__ float buf[4][256];
    const int warp = threadIdx.x >> 5, unit = blockIdx.y * 4 + warp, t = blockIdx.x, hd = p.hd, pos = p.pos + t;
    if (unit >= p.Hq + 2 * p.Hkv) return;
    const uint16_t *row = p.qkv + (size_t)t * p.ld;
    if (unit >= p.Hq + p.Hkv) { /* v */
        const int i = unit - p.Hq - p.Hkv;
        uint16_t *dst = p.v_cache + ((size_t)i * p.max_seq + pos) * hd;
        if (p.kv_e4m3)
            head_copy(row + p.v_off + i * hd, (KvE4m3Bf16 *)dst, hd);
        else
            head_copy(row + p.v_off + i * hd, dst, hd);
        return;
    }
    if (unit < p.Hq) {
        head_norm_rope(row + unit * p.q_hs, p.q_norm, hd, p.eps, p.norm_mode, p.inv_freq, p.R, pos, buf[warp],
                       p.q_out + ((size_t)t * p.Hq + unit) * hd);
        return;
    }
    const uint16_t *k = row + p.k_off + (unit - p.Hq) * hd;
    uint16_t *dst = p.k_cache + ((size_t)(unit - p.Hq) * p.max_seq + pos) * hd;
    if (p.kv_e4m3)
        head_norm_rope(k, p.k_norm, hd, p.eps, p.norm_mode, p.inv_freq, p.R, pos, buf[warp], (KvE4m3Bf16 *)dst);
    else
        head_norm_rope(k, p.k_norm, hd, p.eps, p.norm_mode, p.inv_freq, p.R, pos, buf[warp], dst);
}

extern "C" int cuda_attn_prep(const AttnPrepParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->hd % 32 || p->hd > 256 || p->hd < 32 || p->R < 2 || p->R % 2 || p->R > p->hd || p->Hq < 1 ||
        (p->norm_mode != NORM_ZC && p->norm_mode != NORM_PLAIN) || p->Hkv < 1 || p->pos < 0 ||
        p->pos + p->T > p->max_seq)
        return (int)cudaErrorInvalidValue;
    dim3 grid(p->T, (p->Hq + 2 * p->Hkv + 3) / 4);
    return launch_ex(attn_prep_bf16_rows, grid, dim3(128), 0, 0, l, *p);
}

/* ---- flash attention ------------------------------------------------------------------- */

/* Shared memory: Q [64][HD], then a ring of ATTN_STAGES stages, each K [KB][HD] then V [KB][HD]
 * with KB = 2 BKV keys (key group 0 takes the first BKV, group 1 the rest); all swizzled with
 * swz<NCH>. After the key loop the ring holds key group 1's O, m and l for the merge. */
template <int HD, int BKV>
struct AttnShape {
    static constexpr int NCH = HD / 8, KB = 2 * BKV;
    static constexpr int Q_BYTES = ATTN_BQ * HD * 2, KV_BYTES = KB * HD * 2, STAGE_BYTES = 2 * KV_BYTES;
    static constexpr int SMEM = Q_BYTES + ATTN_STAGES * STAGE_BYTES;
    static constexpr int XCH_BYTES =
        128 * (HD / 8 + 1) * 16; /* group 1's o (DT float4) + (m0, m1, l0, l1) per thread */
    static_assert(ATTN_STAGES * STAGE_BYTES >= XCH_BYTES, "merge buffer fits the ring");
    static_assert((KB * NCH) % ATTN_THREADS == 0 && (ATTN_BQ * NCH) % ATTN_THREADS == 0, "load split");
};

/* cp.async of key/value stage kt (keys kt*KB ..) into the stage at sK (V follows K); keys >= kv_len
 * are zero-filled. */
template <int HD, int BKV>
__device__ __forceinline__ void attn_load_kv(uint32_t sK, const uint16_t *Kh, const uint16_t *Vh, int kt, int kv_len,
                                             int tid) {
    using S = AttnShape<HD, BKV>;
#pragma unroll
    for (int j = 0; j < S::KB * S::NCH / ATTN_THREADS; j++) {
        const int i = tid + j * ATTN_THREADS, r = i / S::NCH, c = i % S::NCH, key = kt * S::KB + r;
        const bool ok = key < kv_len;
        const size_t off = ok ? (size_t)key * HD + c * 8 : 0;
        const uint32_t dst = swz<S::NCH>(r, c) * 16;
        cp_async16(sK + dst, Kh + off, ok);
        cp_async16(sK + S::KV_BYTES + dst, Vh + off, ok);
    }
}

/* One 64-row query tile qt of head j: rows q0 = 64 qt .. of the T new tokens. Warp w owns rows
 * 16 (w & 3) .. + 15 and key group kg = w >> 2: of every stage of KB keys, group kg processes
 * keys kg*BKV .. + BKV - 1, with its own running max / sum / O; the two groups are merged at the
 * end (group 1 hands its state to group 0 through the ring, group 0 stores). A warp skips a
 * sub-tile whose keys are all beyond its last row (causal) or beyond kv_len. */
template <int HD, int BKV>
__device__ __forceinline__ void attn_tile(const AttnPrefillParams &p, int j, int qt, uint8_t *smem) {
    using S = AttnShape<HD, BKV>;
    constexpr int NCH = S::NCH, NT = BKV / 8, DT = HD / 8, KB = S::KB;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wr = warp & 3, kg = warp >> 2, et = tid & 127;
    const int kvh = j / (p.Hq / p.Hkv);
    const uint16_t *Kh = p.k_cache + (size_t)kvh * p.max_seq * HD;
    const uint16_t *Vh = p.v_cache + (size_t)kvh * p.max_seq * HD;
    const int q0 = qt * ATTN_BQ;
    const int kv_len = min(p.pos + q0 + ATTN_BQ, p.pos + p.T);
    const int n_kv = (kv_len + KB - 1) / KB;
    const uint32_t sQ = smem_addr(smem), sR = sQ + S::Q_BYTES;

    __syncthreads(); /* the previous tile of this CTA is done with shared memory */
#pragma unroll
    for (int jj = 0; jj < ATTN_BQ * NCH / ATTN_THREADS; jj++) {
        const int i = tid + jj * ATTN_THREADS, r = i / NCH, c = i % NCH, tok = q0 + r;
        const bool ok = tok < p.T;
        cp_async16(sQ + swz<NCH>(r, c) * 16, p.q + (ok ? ((size_t)tok * p.Hq + j) * HD + c * 8 : 0), ok);
    }
#pragma unroll
    for (int s = 0; s < ATTN_STAGES - 1; s++) { /* stages 0 .. STAGES-2 (group s; Q rides with stage 0) */
        if (s < n_kv) attn_load_kv<HD, BKV>(sR + s * S::STAGE_BYTES, Kh, Vh, s, kv_len, tid);
        cp_async_commit();
    }

    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = ATTN_MASK, m1 = ATTN_MASK, l0 = 0.0f, l1 = 0.0f;
    const int row_lo = p.pos + q0 + wr * 16;         /* absolute position of this warp's first row */
    const int qp0 = row_lo + g, qp1 = qp0 + 8;       /* ... and of this thread's two rows */
    const float sl2 = p.scale * 1.4426950408889634f; /* scores in log2 units */

    for (int kt = 0; kt < n_kv; kt++) {
        cp_async_wait<ATTN_STAGES - 2>();
        __syncthreads(); /* stage kt landed; the slot of stage kt-1 is free */
        if (kt + ATTN_STAGES - 1 < n_kv)
            attn_load_kv<HD, BKV>(sR + ((kt + ATTN_STAGES - 1) % ATTN_STAGES) * S::STAGE_BYTES, Kh, Vh,
                                  kt + ATTN_STAGES - 1, kv_len, tid);
        cp_async_commit();
        const int key0 = kt * KB + kg * BKV;
        if (key0 >= kv_len || key0 > row_lo + 15) continue; /* warp-uniform: nothing visible */
        /* this group's rows kg*BKV .. of the stage: BKV is a multiple of 8, so the swizzle of local
         * row r equals that of stage row kg*BKV + r */
        const uint32_t sK = sR + (kt % ATTN_STAGES) * S::STAGE_BYTES + kg * BKV * NCH * 16;
        const uint32_t sV = sK + S::KV_BYTES;

        float sc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(ldsm_addr_a<NCH>(sQ, wr * 16, kk * 16, lane), a);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                ldsm_x4(ldsm_addr_bt<NCH>(sK, np * 16, kk * 16, lane), b);
                mma_bf16(sc[2 * np], a, b[0], b[1]);
                mma_bf16(sc[2 * np + 1], a, b[2], b[3]);
            }
        }
        /* scale, causal mask, online softmax, O rescale (attention_softmax.cuh) */
        const bool need_mask = key0 + BKV - 1 > row_lo;
        attn_softmax_tile<NT, DT>(sc, o, key0, need_mask, qp0, qp1, t, sl2, m0, m1, l0, l1);
        /* O += P V: the S accumulators of n-tiles 2kk, 2kk+1 are the A fragment of keys 16kk .. */
#pragma unroll
        for (int kk = 0; kk < BKV / 16; kk++) {
            uint32_t a[4];
            a[0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
            a[1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
            a[2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            a[3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_t(ldsm_addr_bk<NCH>(sV, kk * 16, dp * 16, lane), b);
                mma_bf16(o[2 * dp], a, b[0], b[1]);
                mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
            }
        }
    }

    /* merge the key groups: o = (e^(m_0 - m) o_0 + e^(m_1 - m) o_1), l likewise, m = max(m_0, m_1).
     * Group 0 always saw key 0 (visible to every row), so m is finite and a group 1 that saw
     * nothing (m_1 = -1e30, l_1 = 0, o_1 = 0) gets the factor exp2(-1e30 - m) = 0. */
    cp_async_wait<0>();
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    __syncthreads();                                             /* every warp is done with the ring */
    float4 *xch = reinterpret_cast<float4 *>(smem + S::Q_BYTES); /* [DT + 1][128]: thread et's values at [i][et] */
    if (kg == 1) {
#pragma unroll
        for (int d = 0; d < DT; d++) xch[d * 128 + et] = make_float4(o[d][0], o[d][1], o[d][2], o[d][3]);
        xch[DT * 128 + et] = make_float4(m0, m1, l0, l1);
    }
    __syncthreads();
    if (kg == 1) return;
    const float4 ml = xch[DT * 128 + et];
    const float mA = fmaxf(m0, ml.x), mB = fmaxf(m1, ml.y);
    const float a0 = exp2f(m0 - mA), b0 = exp2f(ml.x - mA), a1 = exp2f(m1 - mB), b1 = exp2f(ml.y - mB);
    const float inv[2] = {1.0f / (l0 * a0 + ml.z * b0), 1.0f / (l1 * a1 + ml.w * b1)};
#pragma unroll
    for (int d = 0; d < DT; d++) {
        const float4 u = xch[d * 128 + et];
        o[d][0] = o[d][0] * a0 + u.x * b0;
        o[d][1] = o[d][1] * a0 + u.y * b0;
        o[d][2] = o[d][2] * a1 + u.z * b1;
        o[d][3] = o[d][3] * a1 + u.w * b1;
    }

    /* normalise, gate, store */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int tok = q0 + wr * 16 + g + 8 * h;
        if (tok >= p.T) continue;
        uint16_t *dst = p.out + ((size_t)tok * p.Hq + j) * HD;
        const uint16_t *gt = p.gate ? p.gate + (size_t)tok * p.gate_ld + (size_t)j * p.gate_hs : nullptr;
#pragma unroll
        for (int d = 0; d < DT; d++) {
            const int col = d * 8 + 2 * t;
            float v0 = rbf(o[d][2 * h] * inv[h]), v1 = rbf(o[d][2 * h + 1] * inv[h]);
            if (gt) {
                /* read-only load: the compiler may issue it ahead of the stores before it (a plain load stays
                 * behind a store that may alias it, so each column pair would wait one L2 round trip) */
                const uint32_t gg = __ldg((const unsigned int *)(gt + col));
                const float g0 = __uint_as_float(gg << 16), g1 = __uint_as_float(gg & 0xffff0000u);
                v0 *= rbf(sigmoid_f(g0));
                v1 *= rbf(sigmoid_f(g1));
            }
            *(uint32_t *)(dst + col) = pack_bf16(v0, v1);
        }
    }
}

/* grid (Hq, units): unit u covers q-tile n-1-u (heaviest first), or with `paired` the tiles u and
 * n-1-u (the same causal work for every CTA); ATTN_THREADS threads. */
template <int HD, int BKV>
__global__ void __launch_bounds__(ATTN_THREADS)
    attn_prefill_bf16_flash(const __grid_constant__ AttnPrefillParams p, int paired) {
    pdl_begin();
    extern __shared__ __align__(128) uint8_t smem[];
    const int j = blockIdx.x, u = blockIdx.y, n_qt = (p.T + ATTN_BQ - 1) / ATTN_BQ;
    const int n_tiles = paired && u < n_qt - 1 - u ? 2 : 1;
    for (int k = 0; k < n_tiles; k++) attn_tile<HD, BKV>(p, j, k == 0 ? n_qt - 1 - u : u, smem);
}

template <int HD, int BKV>
static int attn_launch(const AttnPrefillParams *p, const CudaLaunch *l) {
    using S = AttnShape<HD, BKV>;
    void (*kern)(const AttnPrefillParams, int) = attn_prefill_bf16_flash<HD, BKV>;
    const cudaError_t e = smem_attr<attn_prefill_bf16_flash<HD, BKV>>(S::SMEM);
    if (e != cudaSuccess) return (int)e;
    int dev = 0, sms = 132, per_sm = 1;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, ATTN_THREADS, S::SMEM) != cudaSuccess ||
        per_sm < 1) {
        (void)cudaGetLastError();
        per_sm = 1;
    }
    const int n_qt = (p->T + ATTN_BQ - 1) / ATTN_BQ;
    const int paired = p->Hq * n_qt > sms * per_sm; /* more tiles than resident CTAs: balance by pairing */
    dim3 grid(p->Hq, paired ? (n_qt + 1) / 2 : n_qt);
    return launch_ex(kern, grid, dim3(ATTN_THREADS), S::SMEM, 0, l, *p, paired);
}

extern "C" int cuda_attn_prefill(const AttnPrefillParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->Hq < 1 || p->Hkv < 1 || p->Hq % p->Hkv || p->pos < 0 || p->pos + p->T > p->max_seq ||
        ((uintptr_t)p->q & 15) || ((uintptr_t)p->k_cache & 15) || ((uintptr_t)p->v_cache & 15) ||
        ((uintptr_t)p->out & 3) || (p->gate && (p->gate_ld % 2 || p->gate_hs % 2 || ((uintptr_t)p->gate & 3))))
        return (int)cudaErrorInvalidValue;
    { /* hd 256 on sm_90: the wgmma kernel (attention_prefill_wg.cu); else the mma.sync kernel below */
        const int rc = cuda_attn_prefill_wg(p, l);
        if (rc != (int)cudaErrorNotSupported) return rc;
    }
    switch (p->hd) {
    case 32: return attn_launch<32, 64>(p, l);
    case 64: return attn_launch<64, 64>(p, l);
    case 128: return attn_launch<128, 64>(p, l);
    case 256: return attn_launch<256, 32>(p, l);
    default: return (int)cudaErrorInvalidValue;
    }
}
