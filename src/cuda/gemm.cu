/* gemm.cu — prefill projections: Y[M][N] = X[M][K] W[N][K]^T with bf16 inputs and fp32
 * accumulation on the tensor cores (mma.sync m16n8k16), for M = prompt length (any M >= 1).
 *
 * One CTA computes a BM x BN tile; each warp a 64 x 64 sub-tile (4 x 8 mma tiles, 128 fp32
 * accumulators per thread). K advances in steps of 64 through a STAGES-deep ring of shared
 * memory filled by cp.async (16-byte chunks, zero-filled outside [M] x [K] and [N] x [K], so
 * ragged M and K tails need no special path). Shared tiles are XOR-swizzled (mma.cuh) so
 * ldmatrix is conflict-free. CTAs walk the tiles in groups of GROUP_M tile rows (column-major
 * inside a group) so the X rows and W rows that concurrent CTAs share stay in L2.
 * Epilogues (GemmParams.epi) round like HF bf16 Linear layers: bf16(acc), the residual add
 * bf16(y + bf16(acc)), and SwiGLU bf16(bf16(silu(bf16 gate)) * bf16 up) on interleaved rows. */
#include "cuda/mma.cuh"
#include "cuda/ops.h"

#define GEMM_BK 64
#define GEMM_GROUP_M 8

template <int BM, int BN, int STAGES>
struct GemmShape {
    static constexpr int WARPS_M = BM / 64, WARPS_N = BN / 64;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int NCH = GEMM_BK / 8; /* 16-byte chunks per smem row */
    static constexpr int A_BYTES = BM * GEMM_BK * 2, B_BYTES = BN * GEMM_BK * 2;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int SMEM = STAGES * STAGE_BYTES;
};

/* Issues the cp.async copies of k-tile kt into ring slot `slot` (A: BM x 64, B: BN x 64). */
template <int BM, int BN, int STAGES>
__device__ __forceinline__ void gemm_load_tile(const GemmParams &p, uint32_t sbase, int slot, int kt, int m0,
                                               int n0, int tid) {
    using S = GemmShape<BM, BN, STAGES>;
    const uint32_t sA = sbase + slot * S::STAGE_BYTES, sB = sA + S::A_BYTES;
    const int k0 = kt * GEMM_BK;
    static_assert((BM * S::NCH) % S::THREADS == 0 && (BN * S::NCH) % S::THREADS == 0, "load split");
#pragma unroll
    for (int j = 0; j < BM * S::NCH / S::THREADS; j++) {
        const int i = tid + j * S::THREADS, r = i / S::NCH, c = i % S::NCH, gr = m0 + r, gk = k0 + c * 8;
        const bool ok = gr < p.M && gk < p.K;
        cp_async16(sA + swz<S::NCH>(r, c) * 16, p.x + (ok ? (size_t)gr * p.ldx + gk : 0), ok);
    }
#pragma unroll
    for (int j = 0; j < BN * S::NCH / S::THREADS; j++) {
        const int i = tid + j * S::THREADS, r = i / S::NCH, c = i % S::NCH, gr = n0 + r, gk = k0 + c * 8;
        const bool ok = gr < p.N && gk < p.K;
        cp_async16(sB + swz<S::NCH>(r, c) * 16, p.w + (ok ? (size_t)gr * p.ldw + gk : 0), ok);
    }
}

/* SwiGLU epilogue for gate group size G: fragment nt is a gate fragment when (8 nt / G) is even;
 * its up fragment is nt + G/8 (the warp's 64 columns start at a multiple of 64 >= 2G). */
template <int G>
__device__ __forceinline__ void gemm_store_swiglu(const GemmParams &p, float (*acc)[8][4], int row0, int col0,
                                                  int g, int t) {
    uint16_t *y = (uint16_t *)p.y;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        if (((nt * 8 / G) & 1) != 0) continue;
        const int c = col0 + nt * 8 + 2 * t; /* gate column (even) */
        if (c >= p.N) continue;
        const int oc = (c / (2 * G)) * G + c % (2 * G);
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = row0 + mt * 16 + g + h * 8;
                if (r >= p.M) continue;
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float gt = round_bf16(acc[mt][nt][2 * h + e]);
                    const float up = round_bf16(acc[mt][nt + G / 8][2 * h + e]);
                    const float act = round_bf16(gt / (1.0f + expf(-gt)));
                    v[e] = act * up;
                }
                *(uint32_t *)(y + (size_t)r * p.ldy + oc) = pack_bf16(v[0], v[1]);
            }
        }
    }
}

/* Plain epilogues (BF16, F32, ADD_F32) of one warp's 64 x 64 accumulators. */
template <int EPI>
__device__ __forceinline__ void gemm_store(const GemmParams &p, float (*acc)[8][4], int row0, int col0, int g,
                                           int t) {
#pragma unroll
    for (int mt = 0; mt < 4; mt++) {
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const int c = col0 + nt * 8 + 2 * t;
            if (c >= p.N) continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = row0 + mt * 16 + g + h * 8;
                if (r >= p.M) continue;
                const float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
                const size_t o = (size_t)r * p.ldy + c;
                if constexpr (EPI == GEMM_EPI_BF16) {
                    *(uint32_t *)((uint16_t *)p.y + o) = pack_bf16(v0, v1);
                } else if constexpr (EPI == GEMM_EPI_F32) {
                    *(float2 *)((float *)p.y + o) = make_float2(round_bf16(v0), round_bf16(v1));
                } else { /* GEMM_EPI_ADD_F32 */
                    float2 *yp = (float2 *)((float *)p.y + o);
                    const float2 old = *yp;
                    *yp = make_float2(round_bf16(old.x + round_bf16(v0)), round_bf16(old.y + round_bf16(v1)));
                }
            }
        }
    }
}

/* y = epilogue(X W^T) for one BM x BN tile per CTA; contract in ops.h (GemmParams). */
template <int BM, int BN, int STAGES, int EPI>
__global__ void __launch_bounds__(GemmShape<BM, BN, STAGES>::THREADS)
    gemm_bf16_mma(const __grid_constant__ GemmParams p) {
    using S = GemmShape<BM, BN, STAGES>;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sbase = smem_addr(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / S::WARPS_N, wn = warp % S::WARPS_N;

    /* grouped tile order: GROUP_M tile rows at a time, column-major inside the group */
    const int tiles_m = (p.M + BM - 1) / BM, tiles_n = (p.N + BN - 1) / BN;
    const int per_group = GEMM_GROUP_M * tiles_n, bid = blockIdx.x;
    const int first_m = (bid / per_group) * GEMM_GROUP_M;
    const int gm = min(tiles_m - first_m, GEMM_GROUP_M);
    const int tm = first_m + (bid % per_group) % gm, tn = (bid % per_group) / gm;
    const int m0 = tm * BM, n0 = tn * BN;

    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    const int ktiles = (p.K + GEMM_BK - 1) / GEMM_BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) gemm_load_tile<BM, BN, STAGES>(p, sbase, s, s, m0, n0, tid);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* k-tile kt landed; every warp is done with slot (kt-1) % STAGES */
        const int nk = kt + STAGES - 1;
        if (nk < ktiles) gemm_load_tile<BM, BN, STAGES>(p, sbase, nk % STAGES, nk, m0, n0, tid);
        cp_async_commit();

        const uint32_t sA = sbase + (kt % STAGES) * S::STAGE_BYTES, sB = sA + S::A_BYTES;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK / 16; kk++) {
            uint32_t a[4][4], b[8][2];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) ldsm_x4(ldsm_addr_a<S::NCH>(sA, wm * 64 + mt * 16, kk * 16, lane), a[mt]);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t r[4];
                ldsm_x4(ldsm_addr_bt<S::NCH>(sB, wn * 64 + np * 16, kk * 16, lane), r);
                b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 8; nt++) mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
        }
    }
    cp_async_wait<0>();

    const int g = lane >> 2, t = lane & 3;
    const int row0 = m0 + wm * 64, col0 = n0 + wn * 64;
    if constexpr (EPI == GEMM_EPI_SWIGLU_BF16) {
        if (p.glu_group == 8) gemm_store_swiglu<8>(p, acc, row0, col0, g, t);
        else if (p.glu_group == 16) gemm_store_swiglu<16>(p, acc, row0, col0, g, t);
        else gemm_store_swiglu<32>(p, acc, row0, col0, g, t);
    } else {
        gemm_store<EPI>(p, acc, row0, col0, g, t);
    }
}

template <int BM, int BN, int STAGES, int EPI>
static int gemm_launch(const GemmParams *p, cudaStream_t s) {
    using S = GemmShape<BM, BN, STAGES>;
    void (*kern)(const GemmParams) = gemm_bf16_mma<BM, BN, STAGES, EPI>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM);
    if (e != cudaSuccess) return (int)e;
    const int tiles = ((p->M + BM - 1) / BM) * ((p->N + BN - 1) / BN);
    kern<<<tiles, S::THREADS, S::SMEM, s>>>(*p);
    return prefill_launch_status(s);
}

/* Two tile shapes: 128 x 256 (8 warps, 3 stages, 144 KiB) when it yields at least one tile per
 * SM, otherwise 128 x 128 (4 warps, 4 stages, 128 KiB) for narrow N such as the 1024-wide down,
 * out and o projections. */
template <int EPI>
static int gemm_dispatch(const GemmParams *p, cudaStream_t s) {
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const long big_tiles = (long)((p->M + 127) / 128) * ((p->N + 255) / 256);
    if (big_tiles >= sms) return gemm_launch<128, 256, 3, EPI>(p, s);
    return gemm_launch<128, 128, 4, EPI>(p, s);
}

extern "C" int cuda_gemm_bf16(const GemmParams *p, cudaStream_t s) {
    const int ycols = p->epi == GEMM_EPI_SWIGLU_BF16 ? p->N / 2 : p->N;
    const int G = p->glu_group;
    if (p->M < 1 || p->N < 8 || p->K < 8 || p->N % 8 || p->K % 8 || p->ldx < p->K || p->ldw < p->K ||
        p->ldx % 8 || p->ldw % 8 || p->ldy < ycols || p->ldy % 2 || ((uintptr_t)p->x & 15) ||
        ((uintptr_t)p->w & 15) || !p->y)
        return (int)cudaErrorInvalidValue;
    switch (p->epi) {
    case GEMM_EPI_BF16: return gemm_dispatch<GEMM_EPI_BF16>(p, s);
    case GEMM_EPI_F32: return gemm_dispatch<GEMM_EPI_F32>(p, s);
    case GEMM_EPI_ADD_F32: return gemm_dispatch<GEMM_EPI_ADD_F32>(p, s);
    case GEMM_EPI_SWIGLU_BF16:
        if ((G != 8 && G != 16 && G != 32) || p->N % (2 * G)) return (int)cudaErrorInvalidValue;
        return gemm_dispatch<GEMM_EPI_SWIGLU_BF16>(p, s);
    default: return (int)cudaErrorInvalidValue;
    }
}
