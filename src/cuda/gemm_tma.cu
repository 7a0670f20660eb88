/* gemm_tma.cu — the Hopper (sm_90a) prefill GEMM Y[M][N] = X[M][K] W[N][K]^T fed by TMA
 * (GEMM_ALGO_TMA*): bf16 inputs, fp32 accumulation in wgmma, the epilogues of gemm.cuh.
 *
 * Persistent CTAs of 3 warpgroups (384 threads), grid = min(tiles, SMs); CTA b takes tiles
 * b, b + grid, ... in the grouped order of gemm_tile_coords_at.
 *   warpgroup 0, the producer (setmaxnreg 40): one thread walks the CTA's tiles and k-steps
 *     (64 wide) and, for each, waits for ring slot s to be empty, arms full[s] with the stage's
 *     byte count and issues two cp.async.bulk.tensor loads (X box 64 x TM, W box 64 x BN; the
 *     tensor maps' 128-byte swizzle is the layout wgmma_desc describes; boxes reaching past M, N
 *     or K are zero-filled by the TMA unit, so ragged shapes need no special path). The W boxes
 *     of the first STAGES k-steps go out before the PDL wait (weights are immutable), so they
 *     stream while the previous kernel drains.
 *   warpgroups 1, 2, the consumers (setmaxnreg 232): wait full[s], issue the wgmmas of the
 *     k-step, keep one wgmma group in flight and release the previous slot (one arrive per warp
 *     on empty[s]), then run the epilogue from the accumulators through each warp's shared-memory
 *     staging tile (gemm_store_staged: whole sectors, batched += x loads).
 * Two ways to share the work between the consumers:
 *   cooperative (PP = false): both take every tile, 64 rows each (tile 128 x BN);
 *   ping-pong (PP = true): consumer c takes the CTA's tiles j with j % 2 == c whole (TM x BN), so
 *     while one runs its epilogue the other's main loop keeps the tensor cores busy (the producer
 *     fills the ring in tile order; named barriers 1 and 2 hand the main loop from one consumer to
 *     the other, so a consumer never waits on a slot more than one phase ahead of the producer).
 * Slot s of the ring serves k-step `it` = (local tile j) * ktiles + kt when it % STAGES == s; its
 * n-th use waits for phase parity n & 1 of full[s] (consumer) and (n & 1) ^ 1 of empty[s]
 * (producer; a fresh barrier passes parity 1 at once). */
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "cuda/gemm.cuh"
#include "cuda/async.cuh"

/* ---- kernel --------------------------------------------------------------------------------- */

/* Kernel arguments: the tensor maps of X (box 64 x TM) and W (box 64 x BN), and the problem; gmaps:
 * the same two maps copied to global memory (read instead of ta, tb under GEMM_TMA_DBG_GMAP). */
struct GemmTmaArgs {
    CUtensorMap ta, tb;
    GemmParams p;
    const CUtensorMap *gmaps;
};

/* Tile TM x BN, STAGES-deep ring, cooperative or ping-pong (PP). */
template <int TM, int BN, int STAGES, bool PP>
struct TmaCfg {
    static constexpr int WG_ROWS = PP ? TM : TM / 2; /* rows of the tile one consumer computes */
    static constexpr int MW = WG_ROWS / 64;          /* m64 wgmma blocks per consumer */
    static constexpr int A_BYTES = TM * GEMM_BK * 2, B_BYTES = BN * GEMM_BK * 2;
    static constexpr int STAGE = A_BYTES + B_BYTES;
    static constexpr int EMPTY_ARRIVALS = PP ? 4 : 8;                 /* consumer warps that read each stage */
    static constexpr int STAGE_OFF = STAGES * STAGE + 2 * STAGES * 8; /* epilogue staging, after ring + barriers */
    static constexpr int SMEM = 1024 + STAGE_OFF + 8 * GEMM_STAGE_FLOATS * 4; /* + align slack; 8 consumer warps */
    static_assert(WG_ROWS % 64 == 0 && MW >= 1 && (BN == 64 || BN == 128 || BN == 256), "tile shape");
    static_assert(TM <= 256 && BN <= 256, "TMA box rows <= 256");
    static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0, "stages keep 1024-byte alignment");
    static_assert(SMEM <= 227 * 1024, "shared memory");
};

/* DBG: GEMM_TMA_DBG_* bits (0 in production), to tell apart the ingredients when a variant faults. */
template <int TM, int BN, int STAGES, bool PP, int EPI, int DBG>
__global__ void __launch_bounds__(384, 1) gemm_bf16_tma(const __grid_constant__ GemmTmaArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = TmaCfg<TM, BN, STAGES, PP>;
    const GemmParams &p = a.p;
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t sbase = (smem_addr(smem) + 1023u) & ~1023u;
    const uint32_t full0 = sbase + STAGES * C::STAGE, empty0 = full0 + STAGES * 8;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int tiles = ((p.M + TM - 1) / TM) * ((p.N + BN - 1) / BN), ktiles = (p.K + GEMM_BK - 1) / GEMM_BK;
    const CUtensorMap *map_a = (DBG & GEMM_TMA_DBG_GMAP) ? a.gmaps : &a.ta;
    const CUtensorMap *map_b = (DBG & GEMM_TMA_DBG_GMAP) ? a.gmaps + 1 : &a.tb;

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, C::EMPTY_ARRIVALS);
        }
        mbar_init_fence();
        if constexpr ((DBG & GEMM_TMA_DBG_GMAP) != 0) tma_map_acquire(map_a), tma_map_acquire(map_b);
        if constexpr ((DBG & GEMM_TMA_DBG_NOPREFETCH) == 0) tma_prefetch_map(map_a), tma_prefetch_map(map_b);
    }
    __syncthreads();

    if (wg == 0) { /* producer */
        if constexpr ((DBG & GEMM_TMA_DBG_NOREG) == 0) regs_dec<40>();
        if (tid != 0) return;
        /* the weights are immutable: the W boxes of the first tile's first STAGES k-steps go out before the wait
         * for the previous kernel, the X boxes (its output) after */
        const int pre = (int)blockIdx.x < tiles ? min(STAGES, ktiles) : 0;
        if (pre) {
            int m0, n0;
            gemm_tile_coords_at<TM, BN>(p, blockIdx.x, m0, n0);
            for (int kt = 0; kt < pre; kt++) {
                mbar_arrive_expect_tx(full0 + 8 * kt, C::STAGE);
                tma_load_2d(sbase + kt * C::STAGE + C::A_BYTES, map_b, kt * GEMM_BK, n0, full0 + 8 * kt);
            }
        }
        pdl_wait();
        pdl_trigger();
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int m0, n0;
            gemm_tile_coords_at<TM, BN>(p, tile, m0, n0);
            for (int kt = 0; kt < ktiles; kt++, it++) {
                const int s = it % STAGES;
                const uint32_t ph = (uint32_t)(it / STAGES) & 1u, full = full0 + 8 * s;
                const uint32_t sA = sbase + s * C::STAGE;
                if (it < pre) { /* armed, its W in flight */
                    tma_load_2d(sA, map_a, kt * GEMM_BK, m0, full);
                    continue;
                }
                mbar_wait(empty0 + 8 * s, ph ^ 1u);
                mbar_arrive_expect_tx(full, C::STAGE);
                tma_load_2d(sA, map_a, kt * GEMM_BK, m0, full);
                tma_load_2d(sA + C::A_BYTES, map_b, kt * GEMM_BK, n0, full);
            }
        }
        return;
    }

    /* consumers */
    if constexpr ((DBG & GEMM_TMA_DBG_NOREG) == 0) regs_inc<232>();
    pdl_wait(); /* before the epilogue's reads and writes of the previous kernels' buffers */
    pdl_trigger();
    const int cw = wg - 1, wq = (tid >> 5) & 3, lane = tid & 31;
    const uint32_t a_off = PP ? 0u : (uint32_t)cw * 64u * 128u; /* cooperative: this consumer's 64 rows */
    int j = 0;                                                  /* the CTA's local tile index */
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, j++) {
        if (PP && (j & 1) != cw) continue;
        int m0, n0;
        gemm_tile_coords_at<TM, BN>(p, tile, m0, n0);
        float acc[C::MW][BN / 8][4];
#pragma unroll
        for (int mw = 0; mw < C::MW; mw++)
#pragma unroll
            for (int n8 = 0; n8 < BN / 8; n8++)
                acc[mw][n8][0] = acc[mw][n8][1] = acc[mw][n8][2] = acc[mw][n8][3] = 0.0f;

        /* ping-pong: start only once the other consumer has passed every full-wait of local tile j - 1.
         * Without this a consumer could wait on a slot two phases ahead of the producer, and a parity
         * wait cannot tell phase n from phase n - 2: it would read the slot's older contents and release
         * the slot early (the ordering named barriers 1 and 2 alternate between the two consumers). */
        if (PP && j > 0) bar_sync(1 + ((j - 1) & 1), 256);
        const int it0 = j * ktiles;
        for (int kt = 0; kt < ktiles; kt++) {
            const int it = it0 + kt, s = it % STAGES;
            mbar_wait(full0 + 8 * s, (uint32_t)(it / STAGES) & 1u);
            __syncwarp(); /* wgmma.*.sync.aligned below need the warp converged after the per-thread spin */
            const uint32_t sA = sbase + s * C::STAGE + a_off, sB = sbase + s * C::STAGE + C::A_BYTES;
            reg_fence_acc(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < GEMM_BK / 16; kk++) {
                const uint64_t db = wgmma_desc(sB + kk * 32);
#pragma unroll
                for (int mw = 0; mw < C::MW; mw++) {
                    const uint64_t da = wgmma_desc(sA + mw * 64 * 128 + kk * 32);
                    if constexpr (BN == 256)
                        wgmma_m64n256k16(acc[mw], da, db);
                    else if constexpr (BN == 128)
                        wgmma_m64n128k16(acc[mw], da, db);
                    else
                        wgmma_m64n64k16(acc[mw], da, db);
                }
            }
            wgmma_commit();
            wgmma_wait<1>(); /* the wgmmas of k-step it - 1 are done: its slot may be refilled */
            reg_fence_acc(acc);
            if (kt > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
        }
        if (PP && tile + (int)gridDim.x < tiles) bar_arrive(1 + (j & 1), 256); /* the other consumer may start */
        wgmma_wait<0>();
        reg_fence_acc(acc);
        if (lane == 0) mbar_arrive(empty0 + 8 * ((it0 + ktiles - 1) % STAGES));

        const int row0 = m0 + (PP ? 0 : cw * 64) + wq * 16;
        float *st = (float *)(smem + (sbase - smem_addr(smem)) + C::STAGE_OFF) + (cw * 4 + wq) * GEMM_STAGE_FLOATS;
#pragma unroll
        for (int mw = 0; mw < C::MW; mw++) {
            if constexpr (EPI != GEMM_EPI_SWIGLU_BF16)
                gemm_store_staged<EPI, BN / 8, !PP>(p, acc[mw], row0 + mw * 64, n0, lane, st);
            else if (p.glu_group == 1)
                gemm_store_staged<EPI, BN / 8, !PP>(p, acc[mw], row0 + mw * 64, n0, lane, st);
            else
                gemm_store<EPI, 1, BN / 8>(p, acc + mw, row0 + mw * 64, n0, lane >> 2, lane & 3);
        }
    }
#else
    (void)a;
    pdl_begin();
    __trap(); /* built without sm_90a: the launcher never selects this kernel then */
#endif
}

/* TMA probe (gemm_tma_probe): one box of 64 columns x 64 rows at (k0, m0) of X, loaded by thread 0
 * into 1024-aligned shared memory, copied raw (swizzled as it landed) to out[64][64]. No wgmma, no
 * warp specialisation, no register moves: it tests the tensor map, TMA and the mbarrier alone. */
template <int DBG>
__global__ void __launch_bounds__(128)
    gemm_tma_probe_kernel(const __grid_constant__ GemmTmaArgs a, int k0, int m0, uint16_t *out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t sbase = (smem_addr(smem) + 1023u) & ~1023u, bar = sbase + 64 * 128;
    const CUtensorMap *map = (DBG & GEMM_TMA_DBG_GMAP) ? a.gmaps : &a.ta;
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
        if constexpr ((DBG & GEMM_TMA_DBG_GMAP) != 0) tma_map_acquire(map);
        if constexpr ((DBG & GEMM_TMA_DBG_NOPREFETCH) == 0) tma_prefetch_map(map);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, 64 * 128);
        tma_load_2d(sbase, map, k0, m0, bar);
    }
    mbar_wait(bar, 0);
    const uint8_t *src = smem + (sbase - smem_addr(smem));
    for (int i = threadIdx.x; i < 64 * 64 / 8; i += blockDim.x) ((uint4 *)out)[i] = ((const uint4 *)src)[i];
#else
    (void)a, (void)k0, (void)m0, (void)out;
    __trap();
#endif
}

/* ---- host ----------------------------------------------------------------------------------- */

/* cuTensorMapEncodeTiled from the driver, through the runtime (no -lcuda); NULL when the driver lacks
 * it. Looked up once: the pointer never changes afterwards. */
static PFN_cuTensorMapEncodeTiled_v12000 tma_encoder(void) {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return (PFN_cuTensorMapEncodeTiled_v12000) nullptr;
        }
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    return fn;
}

int cuda_tma_map_bf16(CUtensorMap *m, const uint16_t *base, int rows, int cols, int ld, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tma_encoder();
    if (!enc) return (int)cudaErrorNotSupported;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, estr[2] = {1, 1};
    const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, estr,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : (int)cudaErrorInvalidValue;
}

int cuda_tma_map_bf16_3d(CUtensorMap *m, const uint16_t *base, int cols, int rows, int n3, long long ld, long long ld2,
                         int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tma_encoder();
    if (!enc) return (int)cudaErrorNotSupported;
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)n3};
    const cuuint64_t strides[2] = {(cuuint64_t)ld * 2, (cuuint64_t)ld2 * 2};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, estr[3] = {1, 1, 1};
    const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, estr,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : (int)cudaErrorInvalidValue;
}

/* Under GEMM_TMA_DBG_GMAP: copies the kernel's two tensor maps to a fresh global buffer (*buf, freed by
 * the caller after the launch has finished) and points a->gmaps at it. */
static int tma_gmaps(GemmTmaArgs *a, void **buf, cudaStream_t st) {
    cudaError_t e = cudaMalloc(buf, 2 * sizeof(CUtensorMap));
    if (e == cudaSuccess) e = cudaMemcpyAsync(*buf, &a->ta, sizeof(CUtensorMap), cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync((CUtensorMap *)*buf + 1, &a->tb, sizeof(CUtensorMap), cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    a->gmaps = (const CUtensorMap *)*buf;
    return (int)e;
}

template <int TM, int BN, int STAGES, bool PP, int EPI, int DBG = 0>
static int tma_launch(const GemmParams *p, int sms, const CudaLaunch *l) {
    using C = TmaCfg<TM, BN, STAGES, PP>;
    GemmTmaArgs a;
    memset(&a, 0, sizeof a);
    a.p = *p;
    int rc = cuda_tma_map_bf16(&a.ta, p->x, p->M, p->K, p->ldx, TM);
    if (rc == 0) rc = cuda_tma_map_bf16(&a.tb, p->w, p->N, p->K, p->ldw, BN);
    if (rc != 0) return rc;
    void *gbuf = nullptr;
    if constexpr ((DBG & GEMM_TMA_DBG_GMAP) != 0) {
        rc = tma_gmaps(&a, &gbuf, l->stream);
        if (rc != 0) return rc;
    }
    const int tiles = ((p->M + TM - 1) / TM) * ((p->N + BN - 1) / BN), grid = tiles < sms ? tiles : sms;
    auto kern = gemm_bf16_tma<TM, BN, STAGES, PP, EPI, DBG>;
    const cudaError_t e = smem_attr<gemm_bf16_tma<TM, BN, STAGES, PP, EPI, DBG>>(C::SMEM);
    rc = e == cudaSuccess ? launch_ex(kern, dim3(grid), dim3(384), C::SMEM, 0, l, a) : (int)e;
    if (gbuf) {
        const cudaError_t se = cudaStreamSynchronize(l->stream);
        cudaFree(gbuf);
        if (rc == 0) rc = (int)se;
    }
    return rc;
}

/* The variant GEMM_ALGO_TMA takes:
 *   half a wave of 128 x 128 tiles or less (the 1024-wide residual projections of pieces up to 1024 tokens, the wide
 *   ones up to 128) -> cooperative 128 x 64: twice the CTAs streaming the weights;
 *   one wave or less -> cooperative 128 x 128 (both warpgroups on each tile);
 *   more tiles -> ping-pong (epilogues hidden behind the other warpgroup's main loop), 64 x 256 per warpgroup when N
 *   is a multiple of 256 (no ragged column tile), else 128 x 128. gemm_lab, M = 2048: gate_up 63.7 us (P256) vs 65.3
 *   (P128), attention qkv 39.9 vs 42.9; qkvzba (N = 8224) 61.7 with P128. Edit after reading
 *   bench/kernels/gemm_lab.cu's WINNERS table. */
static int tma_pick(const GemmParams *p, int sms) {
    const int tiles128 = ((p->M + 127) / 128) * ((p->N + 127) / 128);
    if (2 * tiles128 <= sms) return GEMM_ALGO_TMA_C64;
    if (tiles128 <= sms) return GEMM_ALGO_TMA_C128;
    return p->N % 256 == 0 ? GEMM_ALGO_TMA_P256 : GEMM_ALGO_TMA_P128;
}

template <int EPI>
static int tma_variant(const GemmParams *p, int algo, int sms, const CudaLaunch *l) {
    switch (algo) {
    case GEMM_ALGO_TMA_C128: return tma_launch<128, 128, 6, false, EPI>(p, sms, l);
    case GEMM_ALGO_TMA_C64: return tma_launch<128, 64, 8, false, EPI>(p, sms, l);
    case GEMM_ALGO_TMA_P128: return tma_launch<128, 128, 6, true, EPI>(p, sms, l);
    case GEMM_ALGO_TMA_P256: return tma_launch<64, 256, 5, true, EPI>(p, sms, l);
    default: return (int)cudaErrorInvalidValue;
    }
}

int gemm_tma_run(const GemmParams *p, int sms, const CudaLaunch *l) {
    const int algo = p->algo == GEMM_ALGO_TMA ? tma_pick(p, sms) : p->algo;
    switch (p->epi) {
    case GEMM_EPI_BF16: return tma_variant<GEMM_EPI_BF16>(p, algo, sms, l);
    case GEMM_EPI_F32: return tma_variant<GEMM_EPI_F32>(p, algo, sms, l);
    case GEMM_EPI_ADD_F32: return tma_variant<GEMM_EPI_ADD_F32>(p, algo, sms, l);
    case GEMM_EPI_SWIGLU_BF16: return tma_variant<GEMM_EPI_SWIGLU_BF16>(p, algo, sms, l);
    case GEMM_EPI_ARGMAX: /* a warp's strip must be one whole GEMM_AM_CHUNK: 128-column tiles only */
        if (algo == GEMM_ALGO_TMA_C128) return tma_launch<128, 128, 6, false, GEMM_EPI_ARGMAX>(p, sms, l);
        if (algo == GEMM_ALGO_TMA_P128) return tma_launch<128, 128, 6, true, GEMM_EPI_ARGMAX>(p, sms, l);
        return (int)cudaErrorInvalidValue;
    default: return (int)cudaErrorInvalidValue;
    }
}

template <int DBG>
static int tma_debug_c128(const GemmParams *p, int sms, const CudaLaunch *l) {
    if (p->algo == GEMM_ALGO_TMA_P128) return tma_launch<128, 128, 6, true, GEMM_EPI_BF16, DBG>(p, sms, l);
    return tma_launch<128, 128, 6, false, GEMM_EPI_BF16, DBG>(p, sms, l);
}

int gemm_tma_debug_run(const GemmParams *p, int flags, int sms, const CudaLaunch *l) {
    if (p->epi != GEMM_EPI_BF16 || (p->algo != GEMM_ALGO_TMA_C128 && p->algo != GEMM_ALGO_TMA_P128))
        return (int)cudaErrorInvalidValue;
    switch (flags) {
    case 0: return tma_debug_c128<0>(p, sms, l);
    case 1: return tma_debug_c128<1>(p, sms, l);
    case 2: return tma_debug_c128<2>(p, sms, l);
    case 3: return tma_debug_c128<3>(p, sms, l);
    case 4: return tma_debug_c128<4>(p, sms, l);
    case 5: return tma_debug_c128<5>(p, sms, l);
    case 6: return tma_debug_c128<6>(p, sms, l);
    case 7: return tma_debug_c128<7>(p, sms, l);
    default: return (int)cudaErrorInvalidValue;
    }
}

template <int DBG>
static int tma_probe_launch(GemmTmaArgs *a, int k0, int m0, uint16_t *out, cudaStream_t st) {
    void *gbuf = nullptr;
    int rc = 0;
    if constexpr ((DBG & GEMM_TMA_DBG_GMAP) != 0) {
        a->tb = a->ta;
        rc = tma_gmaps(a, &gbuf, st);
    }
    if (rc == 0) {
        const int smem = 1024 + 64 * 128 + 8;
        cudaError_t e =
            cudaFuncSetAttribute(gemm_tma_probe_kernel<DBG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e == cudaSuccess) {
            gemm_tma_probe_kernel<DBG><<<1, 128, smem, st>>>(*a, k0, m0, out);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        rc = (int)e;
    }
    if (gbuf) cudaFree(gbuf);
    return rc;
}

int gemm_tma_probe(const uint16_t *x, int rows, int cols, int ld, int k0, int m0, uint16_t *out, int flags,
                   cudaStream_t st) {
    GemmTmaArgs a;
    memset(&a, 0, sizeof a);
    int rc = cuda_tma_map_bf16(&a.ta, x, rows, cols, ld, 64);
    if (rc != 0) return rc;
    switch (flags & (GEMM_TMA_DBG_GMAP | GEMM_TMA_DBG_NOPREFETCH)) {
    case 0: return tma_probe_launch<0>(&a, k0, m0, out, st);
    case GEMM_TMA_DBG_GMAP: return tma_probe_launch<GEMM_TMA_DBG_GMAP>(&a, k0, m0, out, st);
    case GEMM_TMA_DBG_NOPREFETCH: return tma_probe_launch<GEMM_TMA_DBG_NOPREFETCH>(&a, k0, m0, out, st);
    default: return tma_probe_launch<GEMM_TMA_DBG_GMAP | GEMM_TMA_DBG_NOPREFETCH>(&a, k0, m0, out, st);
    }
}
