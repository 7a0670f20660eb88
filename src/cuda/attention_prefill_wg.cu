/* attention_prefill_wg.cu — the prefill flash attention of attention_prefill.cu (same contract: ops.h
 * AttnPrefillParams, same rounding: P rounded to bf16 for P V, fp32 online softmax, ATTN mask value)
 * on Hopper wgmma for head_dim 256 (Qwen3.5): cuda_attn_prefill's default there since session 5
 * (the mma.sync kernel serves other head dims and devices). H200, 8/2 heads, T = 2048: 88.4 us
 * (194 TFLOP/s) vs 118.9 us for the mma.sync kernel; prefill of 2048 tokens 7.92 -> 7.70 ms.
 *
 * Why: the mma.sync kernel (143 TFLOP/s at T = 2048) gives every warp 16 query rows, so each of the
 * 4 row warps reads every K and V fragment from shared memory itself (ldmatrix), and at 255 registers
 * Q cannot stay in registers either. A warpgroup's wgmma reads a K/V tile once for 64 rows.
 *
 * CTA: 256 threads = 2 warpgroups, 128 query rows of one query head j (warpgroup c: rows 64c ..
 * 64c+63 of the tile). No producer warp: a consumer needs ~230 registers (O is 64 x 256 fp32 = 128 per
 * thread, S 32) and ptxas gives every thread of the launch the same budget, 168 with a 9th warp or a
 * producer warpgroup (3 warps on one SM sub-partition), where it spilled. Instead the last warp to
 * finish with a stage (a shared counter per stage) issues the TMA loads of the tile two ahead into
 * it; tiles 0 and 1 are issued by thread 0 at the start. Shared memory (1024-aligned): Q [2][4 boxes]
 * (consumers load their 64 rows themselves with cp.async: q is [T][Hq][hd], one head's rows are not a
 * TMA box), then a 2-stage ring of K and V
 * tiles of 64 keys, each 4 boxes of [64 keys][64 dims] (TMA, 128-byte swizzle: 16-byte chunk c of row
 * r at chunk c ^ (r & 7)), then the full/empty mbarriers. Keys >= pos + T are zero (the tensor maps
 * end there) and masked.
 * Per key tile (consumer warpgroup; skipped when the whole tile is after the warpgroup's last row):
 *   S = Q K^T        16 x wgmma m64n64k16, A = Q box (k/4) + 32 (k%4) bytes, B = K likewise (K-major)
 *   mask, online softmax in registers (the mma C layout: each thread holds rows g, g+8 of its warp's
 *   16 rows, 2 columns per n8 block), O *= e^(m_old - m_new)
 *   O += P V         4 x wgmma m64n256k16 with A = P from registers (bf16: the S accumulators of keys
 *                    16kk .. 16kk+15 ARE the m16n8k16 A fragment) and B = V MN-major (rows = keys, the
 *                    4 boxes of 64 dims 8 KiB apart: wgmma_desc_mn, leading byte offset 8 KiB)
 * Epilogue as attention_prefill.cu: o / l, the sigmoid gate, bf16 stores. */
#include <stdlib.h>
#include <string.h>

#include "cuda/attention_softmax.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/async.cuh"

#define AW_HD 256
#define AW_BQ 128 /* query rows per CTA */
#define AW_BK 64  /* keys per stage */

struct AwSmem {
    static constexpr int BOX = 64 * 128; /* [64 rows][64 bf16], 128-byte swizzled */
    static constexpr int Q = 0;          /* [2 consumers][4 boxes] */
    static constexpr int RING = Q + 8 * BOX;
    static constexpr int STAGE = 8 * BOX;        /* K [4 boxes] then V [4 boxes] */
    static constexpr int BAR = RING + 2 * STAGE; /* full[2] mbarriers, then done[2] warp counters */
    static constexpr int BYTES = 1024 + BAR + 2 * 8 + 2 * 4;
};

struct AwArgs {
    CUtensorMap k, v; /* [Hkv][kv_total][256] views of the caches, boxes 64 x 64 */
    AttnPrefillParams p;
    int n_qt;
};

/* reg_fence (mma.cuh) on every element of an accumulator [N][4]. */
template <int N>
__device__ __forceinline__ void aw_fence(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) reg_fence(acc[n][e]);
}

/* TMA loads of key tile kt (K then V, 4 boxes of 64 dims each) into the stage at st, on barrier full. */
__device__ __forceinline__ void aw_issue(const AwArgs &a, uint32_t st, uint32_t full, int kt, int kvh) {
    mbar_arrive_expect_tx(full, AwSmem::STAGE);
#pragma unroll
    for (int bx = 0; bx < 4; bx++) {
        tma_load_3d(st + bx * AwSmem::BOX, &a.k, 64 * bx, kt * AW_BK, kvh, full);
        tma_load_3d(st + (4 + bx) * AwSmem::BOX, &a.v, 64 * bx, kt * AW_BK, kvh, full);
    }
}

__global__ void __launch_bounds__(256, 1) attn_prefill_wg(const __grid_constant__ AwArgs a) {
    pdl_begin();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = AwSmem;
    const AttnPrefillParams &p = a.p;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t sb = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t full0 = sb + S::BAR;
    int *done = (int *)(smem_raw + (sb - smem_addr(smem_raw)) + S::BAR + 16); /* warps finished with stage s */
    const int tid = threadIdx.x, wg = tid >> 7;
    const int b = blockIdx.x, qt = a.n_qt - 1 - b / p.Hq, j = b % p.Hq; /* heaviest tiles first */
    const int q0 = qt * AW_BQ, kvh = j / (p.Hq / p.Hkv);
    const int kv_len = min(p.pos + q0 + AW_BQ, p.pos + p.T), n_kv = (kv_len + AW_BK - 1) / AW_BK;

    if (tid == 0) {
        mbar_init(full0, 1), mbar_init(full0 + 8, 1);
        done[0] = done[1] = 0;
        mbar_init_fence();
        tma_prefetch_map(&a.k), tma_prefetch_map(&a.v);
    }
    __syncthreads();
    if (tid == 0)
        for (int kt = 0; kt < 2 && kt < n_kv; kt++) aw_issue(a, sb + S::RING + kt * S::STAGE, full0 + 8 * kt, kt, kvh);

    const int cw = wg, ct = tid & 127, wq = ct >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const uint32_t sQ = sb + S::Q + cw * 4 * S::BOX;
    const int r_first = q0 + 64 * cw; /* this warpgroup's first row (token index) */
#pragma unroll
    for (int i = 0; i < 16; i++) { /* Q rows r_first .. + 63: 32 chunks of 16 B each */
        const int idx = ct + 128 * i, r = idx >> 5, ch = idx & 31, tok = r_first + r;
        const bool ok = tok < p.T;
        const uint32_t dst = sQ + (ch >> 3) * S::BOX + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
        cp_async16(dst, p.q + (ok ? ((size_t)tok * p.Hq + j) * AW_HD + ch * 8 : 0), ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();   /* the cp.async writes, visible to wgmma (async proxy) */
    bar_sync(1 + cw, 128); /* ... from every thread of the warpgroup */

    float o[32][4];
#pragma unroll
    for (int d = 0; d < 32; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = ATTN_MASK, m1 = ATTN_MASK, l0 = 0.0f, l1 = 0.0f;
    const int row_lo = p.pos + r_first + 16 * wq; /* absolute position of this warp's first row */
    const int qp0 = row_lo + g, qp1 = qp0 + 8;
    const int wg_last = p.pos + r_first + 63; /* the warpgroup's last row position (keys <= it visible) */
    const float sl2 = p.scale * 1.4426950408889634f;

    /* key tiles this warpgroup sees: the first n_kv_wg of the CTA's n_kv (consumer 0 may stop one tile
     * early: the last tile, which is never refilled) */
    const int n_kv_wg = min(n_kv, wg_last / AW_BK + 1);
    for (int kt = 0; kt < n_kv_wg; kt++) {
        const int s = kt & 1, key0 = kt * AW_BK;
        const uint32_t st = sb + S::RING + s * S::STAGE, sK = st, sV = st + 4 * S::BOX;
        mbar_wait(full0 + 8 * s, (uint32_t)(kt >> 1) & 1u);
        __syncwarp(); /* converged for the .sync.aligned wgmmas after the per-thread spin */
        {
            float sc[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
            aw_fence(sc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < AW_HD / 16; kk++) {
                const uint32_t off = (kk >> 2) * S::BOX + (kk & 3) * 32;
                wgmma_m64n64k16(sc, wgmma_desc(sQ + off), wgmma_desc(sK + off));
            }
            wgmma_commit();
            wgmma_wait<0>();
            aw_fence(sc);

            /* scale, causal mask, online softmax, O rescale (attention_softmax.cuh; this thread's rows: qp0, qp1) */
            const bool need_mask = key0 + AW_BK - 1 > row_lo;
            attn_softmax_tile<8, 32>(sc, o, key0, need_mask, qp0, qp1, t, sl2, m0, m1, l0, l1);

            /* O += P V (every A register is written before the fence: a register the wgmma reads but
             * the compiler sees defined after wgmma_fence makes it insert its own fence per wgmma) */
            uint32_t pa[AW_BK / 16][4];
#pragma unroll
            for (int kk = 0; kk < AW_BK / 16; kk++) {
                pa[kk][0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
                pa[kk][1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
                pa[kk][2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                pa[kk][3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            }
            aw_fence(o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < AW_BK / 16; kk++)
                wgmma_m64n256k16_rt(o, pa[kk], wgmma_desc_mn(sV + kk * 16 * 128, S::BOX));
            wgmma_commit();
            wgmma_wait<0>();
            aw_fence(o);
        }
        __syncwarp();
        /* the 8th warp done with tile kt (its wgmmas have completed: wait_group 0) refills the stage with
         * tile kt + 2; a tile that consumer 0 skips (the last one) is never refilled */
        if (lane == 0 && atomicAdd(&done[s], 1) == 7) {
            atomicExch(&done[s], 0); /* before the refill that lets the next users of the stage in */
            if (kt + 2 < n_kv) {
                fence_proxy_async();
                aw_issue(a, st, full0 + 8 * s, kt + 2, kvh);
            }
        }
    }

    /* normalise, gate, store (as attention_prefill.cu) */
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv[2] = {1.0f / l0, 1.0f / l1};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int tok = r_first + 16 * wq + g + 8 * h;
        if (tok >= p.T) continue;
        uint16_t *dst = p.out + ((size_t)tok * p.Hq + j) * AW_HD;
        const uint16_t *gt = p.gate ? p.gate + (size_t)tok * p.gate_ld + (size_t)j * p.gate_hs : nullptr;
        /* the row's gate values all loaded before the first store: a load stays behind a store that may alias it,
         * so loaded in the loop each column pair would wait one L2 round trip */
        uint32_t gg[32];
        if (gt)
#pragma unroll
            for (int d = 0; d < 32; d++) gg[d] = *(const uint32_t *)(gt + d * 8 + 2 * t);
#pragma unroll
        for (int d = 0; d < 32; d++) {
            const int col = d * 8 + 2 * t;
            float v0 = rbf(o[d][2 * h] * inv[h]), v1 = rbf(o[d][2 * h + 1] * inv[h]);
            if (gt) {
                v0 *= rbf(sigmoid_f(__uint_as_float(gg[d] << 16)));
                v1 *= rbf(sigmoid_f(__uint_as_float(gg[d] & 0xffff0000u)));
            }
            *(uint32_t *)(dst + col) = pack_bf16(v0, v1);
        }
    }
#else
    (void)a;
    __trap(); /* built without sm_90a: the launcher never selects this kernel then */
#endif
}

/* 1 when the current device has compute capability 9.x (the sm_90a build of the kernel). */
static int aw_sm90(void) {
    int dev = 0, major = 0;
    const int v = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major == 9;
    (void)cudaGetLastError();
    return v;
}

extern "C" int cuda_attn_prefill_wg(const AttnPrefillParams *p, const CudaLaunch *l) {
    if (p->hd != AW_HD || !aw_sm90()) return (int)cudaErrorNotSupported;
    if (p->T < 1 || p->Hq < 1 || p->Hkv < 1 || p->Hq % p->Hkv || p->pos < 0 || p->pos + p->T > p->max_seq ||
        ((uintptr_t)p->q & 15) || ((uintptr_t)p->k_cache & 15) || ((uintptr_t)p->v_cache & 15) ||
        ((uintptr_t)p->out & 3) || (p->gate && (p->gate_ld % 2 || p->gate_hs % 2 || ((uintptr_t)p->gate & 3))))
        return (int)cudaErrorInvalidValue;
    AwArgs a;
    memset(&a, 0, sizeof a);
    a.p = *p;
    a.n_qt = (p->T + AW_BQ - 1) / AW_BQ;
    const int kv_total = p->pos + p->T;
    const long long ld2 = (long long)p->max_seq * AW_HD;
    int rc = cuda_tma_map_bf16_3d(&a.k, p->k_cache, AW_HD, kv_total, p->Hkv, AW_HD, ld2, AW_BK);
    if (rc == 0) rc = cuda_tma_map_bf16_3d(&a.v, p->v_cache, AW_HD, kv_total, p->Hkv, AW_HD, ld2, AW_BK);
    if (rc != 0) return rc;
    const cudaError_t e = smem_attr<attn_prefill_wg>(AwSmem::BYTES);
    if (e != cudaSuccess) return (int)e;
    return launch_ex(attn_prefill_wg, dim3((unsigned)(a.n_qt * p->Hq)), dim3(256), AwSmem::BYTES, 0, l, a);
}
