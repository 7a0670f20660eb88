/* gemm_skinny.cu — Y[M][N] = X[M][K] W[N][K]^T for few rows (M <= a few hundred: the batched decode step's
 * projections), bf16 in, fp32 accumulation, the epilogues of GemmParams (ops.h); and the layer tail (the same
 * products of a layer's GEMMs and norms as phases of one persistent launch, further down).
 *
 * Why not the prefill GEMM: its 128 x 128 tiles give N / 128 CTAs at M <= 128 (8 for N = 1024), each streaming a
 * 128-row slice of W alone, so the weights are read at a fraction of the bandwidth. Here the weight rows are the
 * tensor-core M side (m16n8k16: a 16-row W strip is the A operand, 8 X rows the B operand), a CTA owns 64 W rows and
 * a range of K (split-K), and the grid (m-blocks of 64 X rows, N / 64, splits) fills the machine whatever M is.
 *   CTA: 4 warps; warp w computes W rows n0 + 16 w .. + 15 against X rows m0 .. m0 + 63 (8 n8 tiles), k in chunks
 *   through a ring of stages (mma.sync: 64 columns, SK_STAGES; sm_90a: 64 or 128 columns, SK_WG_STAGES(KW); a stage
 *   holds the W and X chunks as 64-column pieces [64][64] bf16, swizzled as mma.cuh's swz<8>, stages 1024-byte
 *   aligned). Out-of-range W rows, X rows and k columns are zero-filled, so they add exact zeros.
 *   On sm_90a a chunk is four wgmma m64n64k16 of the warpgroup (A = the W tile, B = the X tile, both K-major with
 *   the 128-byte swizzle that swz<8> is): the tensor cores read each tile from shared memory once per chunk, where
 *   mma.sync has every warp load the whole X tile through ldmatrix (40 KB of shared-memory reads per 16 KB chunk,
 *   near the shared-memory bandwidth at the rate the weights stream). A chunk's wgmmas run while the warps wait for
 *   the next chunk and refill the ring (sk_main_wg): at one CTA per SM (the layer shapes at M <= 64) the per-chunk
 *   chain of wait, barrier, load issue and MMA is what bounds the rate, not the bytes in flight, so a grid of one
 *   wave takes 128-column chunks (half the chains; 129 KB of ring, one CTA per SM) and larger grids 64-column ones
 *   (99 KB, two CTAs per SM: the LM head, M > 64). The accumulator
 *   layout is the mma.sync one, so the epilogues are shared. Other devices (the compute_80 PTX) run mma.sync
 *   m16n8k16 on ldmatrix fragments.
 * The grid's x is the m-block: CTAs that share a W slice run side by side and read it once from HBM.
 *
 * Split-K and batch invariance: splits = sk_plan(N, K, 1, n_sm) depends on the shape only, never on M, and its
 * boundaries are whole 128-column units (with GemmParams.split_m, outside deterministic mode, the plan also counts
 * the m-blocks: a pass of many rows takes fewer, longer splits, and a row's sums then depend on M). With one split
 * the epilogue runs from the accumulators; with several, each split writes its fp32 partial sums to work
 * [split][M][N] and gemm_skinny_reduce adds them in split order 0, 1, ... and applies the same epilogue. Either chunk
 * width issues the same k16 steps into the same sums in the same order. So (without split_m) every y[m][n] is the
 * same sum in the same order whatever M and the other rows are: a row's result depends on that row alone.
 *
 * FP8 weights (w8, w8_scale; GemmParams in ops.h): W[n][k] = e4m3(w8[n ldw + k]) * w8_scale[k / 128][n]. Every e4m3
 * value is a bf16 value, so the same bf16 mma.sync path runs on bf16(e4m3): a stage holds the 64 x 64 e4m3 chunk
 * (4 KiB, cp.async, rows of 4 16-byte pieces) and the X chunk; once the chunk has landed, each thread converts two
 * 16-byte pieces into a bf16 W tile (swizzled as above) that the MMAs read (one tile for mma.sync; two on sm_90a,
 * alternating, so a chunk is converted while the previous one is in the tensor cores). The sums of each 128-column
 * scale block start from zero and fold into the accumulator as acc = fma(scale_n, block_acc, acc) with the scale of
 * the accumulator's W row n for that block (whatever the chunk width: one 128-column chunk or two 64-column ones).
 * Same splits, order of splits and epilogues as bf16, so batch invariance holds the same way. */
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops.h"

#define SK_BN     64  /* W rows per CTA */
#define SK_BM     64  /* X rows per CTA */
#define SK_BK     64  /* k per 64-column piece of a tile (a chunk of the mma.sync loop) */
#define SK_KU     128 /* k per unit of the split plan (split boundaries are multiples of it: one FP8 scale block) */
#define SK_STAGES 4   /* the mma.sync ring */
/* The sm_90a ring for chunks of KW = 64 or 128 columns: SK_WG_STAGES(KW) - 2 chunks in flight behind the one in the
 * tensor cores. 64-column chunks: 6 stages, 99 KB, two CTAs per SM; 128-column chunks: 4 stages, 129 KB, one. */
#define SK_WG_STAGES(KW) ((KW) == 64 ? 6 : 4)
/* a stage: the W chunk [64][KW] then the X chunk [64][KW] (64-column pieces one after the other; FP8: W e4m3) */
#define SK_STAGE_BYTES(KW, F8) ((F8) ? (SK_BN * (KW) + SK_BM * (KW)*2) : (SK_BN + SK_BM) * (KW)*2)
/* the dynamic shared memory of a ring of S stages, + slack to align it to 1024 B; FP8 adds bf16 W tiles [64][KW]
 * after the stages (two on sm_90a: a chunk is converted while the previous one is in the tensor cores) */
#define SK_RING_SMEM(S, KW, F8, TILES) ((S)*SK_STAGE_BYTES(KW, F8) + ((F8) ? (TILES)*SK_BN * (KW)*2 : 0) + 1024)
#define SK_MMA_SMEM(F8)                SK_RING_SMEM(SK_STAGES, SK_BK, F8, 1)
#define SK_WG_SMEM(KW, F8)             SK_RING_SMEM(SK_WG_STAGES(KW), KW, F8, 2)

/* The fused norm of gemm_skinny_reduce_norm: h bf16 [M][N] = norm(y) with weight w [N], mode, eps. */
typedef struct SkNorm {
    const float *w;
    uint16_t *h;
    int mode;
    float eps;
} SkNorm;

typedef struct SkArgs {
    GemmParams g;
    float *work; /* [splits][M][N] fp32 partial sums (splits > 1) */
    int kc;      /* 64-column pieces per split (a multiple of SK_KU / SK_BK) */
    int nchunks; /* ceil(K / SK_BK) */
} SkArgs;

/* Splits for an N x K weight on n_sm multiprocessors, for mb blocks of 64 X rows (1 unless GemmParams.split_m):
 * enough CTAs for one on every multiprocessor, but one split when the tiles alone fill half of them (on 0.8B the
 * DeltaNet in_proj, gate_up and the attention qkv: 129, 112 and 80 tiles on 132 SMs), since a second split costs a
 * reduction launch and a write and a read of the partial sums (docs/SERVE_ENGINE.md has the measurement,
 * docs/EXPERIMENTS.md the other targets). With mb > 1 the count rounds down instead, so that the grid stays one wave
 * (128-column chunks, sk_launch_k): the residual GEMMs at 256 rows take 2 splits of 64 CTAs where the shape alone
 * asks for 8 splits of 16 tiles. Split boundaries are whole SK_KU units, so that either chunk width (sk_main_wg)
 * sums the same pieces. Returns the split count s and 64-column pieces per split *kc (s * *kc covers K); s never
 * grows with mb, so the workspace of mb = 1 covers any M. */
static int sk_plan(int N, int K, int mb, int n_sm, int *kc) {
    const int tiles = (N + SK_BN - 1) / SK_BN * mb, units = (K + SK_KU - 1) / SK_KU;
    int s = 2 * tiles >= n_sm ? 1 : mb > 1 ? n_sm / tiles : (n_sm + tiles - 1) / tiles;
    if (s > units) s = units;
    if (s < 1) s = 1;
    const int ku = (units + s - 1) / s;
    *kc = ku * (SK_KU / SK_BK);
    return (units + ku - 1) / ku;
}

/* sk_plan's mb for g: its 64-row blocks where split_m allows, else 1 */
static int sk_mb(const GemmParams *g) { return g->split_m ? (g->M + SK_BM - 1) / SK_BM : 1; }

/* y[m][n] of the non-SwiGLU epilogues from its finished sum v (rounded where gemm_store rounds) */
template <int EPI>
__device__ __forceinline__ void sk_store1(const GemmParams &g, int m, int n, float v) {
    const size_t o = (size_t)m * g.ldy + n;
    if constexpr (EPI == GEMM_EPI_BF16) {
        ((uint16_t *)g.y)[o] = bf16_bits(v);
    } else if constexpr (EPI == GEMM_EPI_F32) {
        ((float *)g.y)[o] = rbf(v);
    } else { /* GEMM_EPI_ADD_F32 */
        float *yp = (float *)g.y + o;
        *yp = rbf(*yp + rbf(v));
    }
}

/* SwiGLU output column i from its gate and up sums: bf16(bf16(silu(bf16(gate))) bf16(up)) (gemm_store_swiglu's) */
__device__ __forceinline__ void sk_store_glu(const GemmParams &g, int m, int i, float gate, float up) {
    ((uint16_t *)g.y)[(size_t)m * g.ldy + i] = bf16_bits(rbf(silu_f(rbf(gate))) * rbf(up));
}

/* The W row of SwiGLU output column i and its partner: gate row (i / G) 2G + i % G, up row that + G. */
__device__ __forceinline__ int sk_gate_row(int i, int G) { return (i / G) * 2 * G + i % G; }

/* Before the barrier that publishes a stage: this thread's shared-memory writes (cp.async, st.shared) made visible to
 * the async proxy that wgmma reads through (sm_90a; nothing to do for mma.sync). */
__device__ __forceinline__ void sk_stage_fence(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    fence_proxy_async();
#endif
}

/* Chunk c of the X rows m0 .. m0 + 63 (k in [64 c, 64 c + 64)) into the stage's X tile at shared address sx: 512
 * 16-byte pieces, thread tid takes pieces tid + 128 i, swizzled as mma.cuh's swz<8>; rows past M and k past K are
 * zero-filled. */
__device__ __forceinline__ void sk_load_x(const GemmParams &g, uint32_t sx, int m0, int c, int tid) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int p = tid + 128 * i, r = p >> 3, ch = p & 7, k = c * SK_BK + ch * 8, m = m0 + r;
        const bool ok = m < g.M && k < g.K;
        cp_async16(sx + swz<8>(r, ch) * 16, ok ? g.x + (size_t)m * g.ldx + k : g.x, ok);
    }
}

/* Chunk c of the W rows n0 .. n0 + 63 into the stage's W part at shared address sw. bf16: the tile [64][64], 512
 * 16-byte pieces swizzled as swz<8>; FP8: the e4m3 chunk [64][64] row by row, 256 pieces (row p / 4, columns
 * 16 (p % 4) ..; K % 16 == 0, so a piece is all inside K or all past it). Thread tid takes pieces tid + 128 i; rows
 * past N and k past K are zero-filled. */
template <bool F8>
__device__ __forceinline__ void sk_load_w(const GemmParams &g, uint32_t sw, int n0, int c, int tid) {
    if constexpr (F8) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int p = tid + 128 * i, n = n0 + (p >> 2), k = c * SK_BK + (p & 3) * 16;
            const bool ok = n < g.N && k < g.K;
            cp_async16(sw + p * 16, ok ? g.w8 + (size_t)n * g.ldw + k : g.w8, ok);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int p = tid + 128 * i, r = p >> 3, ch = p & 7, k = c * SK_BK + ch * 8, n = n0 + r;
            const bool ok = n < g.N && k < g.K;
            cp_async16(sw + swz<8>(r, ch) * 16, ok ? g.w + (size_t)n * g.ldw + k : g.w, ok);
        }
    }
}

/* 16 e4m3 codes (byte j = column j) as 16 bf16, exact: columns 0-7 in lo, 8-15 in hi (two bf16 a word, the lower
 * column in the low half). e4m3x2_f32 gives exact fp32 values whose low 16 bits are zero, so the bf16 is the high
 * half of each: one byte_perm packs two. */
__device__ __forceinline__ void e4m3x16_bf16(uint4 v, uint4 &lo, uint4 &hi) {
    const uint32_t q[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 a = e4m3x2_f32(q[i]), b = e4m3x2_f32(q[i] >> 16);
        o[2 * i] = __byte_perm(__float_as_uint(a.x), __float_as_uint(a.y), 0x7632);
        o[2 * i + 1] = __byte_perm(__float_as_uint(b.x), __float_as_uint(b.y), 0x7632);
    }
    lo = make_uint4(o[0], o[1], o[2], o[3]);
    hi = make_uint4(o[4], o[5], o[6], o[7]);
}

/* The landed e4m3 chunk at w8s (sk_load_w<true>'s layout) as the bf16 tile [64][64] at tile (swz<8>): thread tid
 * converts the pieces it loaded, tid and tid + 128. */
__device__ __forceinline__ void sk_convert_w8(const uint8_t *w8s, uint8_t *tile, int tid) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int p = tid + 128 * i, r = p >> 2, q = p & 3;
        uint4 lo, hi;
        e4m3x16_bf16(*(const uint4 *)(w8s + p * 16), lo, hi);
        *(uint4 *)(tile + swz<8>(r, 2 * q) * 16) = lo;
        *(uint4 *)(tile + swz<8>(r, 2 * q + 1) * 16) = hi;
    }
}

/* acc += scale_lo / scale_hi * cacc: the fold of one FP8 chunk's sums (rows n, n + 8 of the accumulator layout) */
__device__ __forceinline__ void sk_fold(float (&acc)[8][4], const float (&cacc)[8][4], float s_lo, float s_hi,
                                        int mvalid) {
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if ((t >> 1) * 16 >= mvalid) break;
#pragma unroll
        for (int e = 0; e < 4; e++) acc[t][e] = fmaf(e < 2 ? s_lo : s_hi, cacc[t][e], acc[t][e]);
    }
}

/* The scales of accumulator rows n and n + 8 for chunk c (its 128-column block); rows past N get 0 (never stored) */
__device__ __forceinline__ void sk_scales(const GemmParams &g, int c, int n, float &s_lo, float &s_hi) {
    const float *sc = g.w8_scale + (size_t)(c * SK_BK / 128) * g.N;
    s_lo = n < g.N ? __ldg(sc + n) : 0.0f;
    s_hi = n + 8 < g.N ? __ldg(sc + n + 8) : 0.0f;
}

__device__ __forceinline__ void sk_zero(float (&a)[8][4]) {
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[t][e] = 0.0f;
}

/* FP8, at a chunk that starts a 128-column scale block (its first 64-column piece p): the previous block's sums
 * folded into acc and cleared (fold: there is one), then this block's scales */
__device__ __forceinline__ void sk_block_start(const GemmParams &g, float (&acc)[8][4], float (&cacc)[8][4], bool fold,
                                               int p, int n, int mvalid, float &s_lo, float &s_hi) {
    if (fold) {
        sk_fold(acc, cacc, s_lo, s_hi, mvalid);
        sk_zero(cacc);
    }
    sk_scales(g, p, n, s_lo, s_hi);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Keeps the compiler from moving accumulator reads and writes across the asynchronous wgmmas. */
__device__ __forceinline__ void sk_acc_fence(float (&acc)[8][4]) {
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) reg_fence(acc[t][e]);
}

/* The sm_90a main loop of gemm_skinny_k (its names): the 64-column pieces p0 .. p0 + np - 1 of this CTA into acc, in
 * chunks of KW = 64 or 128 columns (one or two pieces of each tile; the launcher takes 128 where the grid is one wave,
 * since half the chunks halve the per-chunk chain, and 64 elsewhere, where the smaller ring lets two CTAs share an
 * SM). A chunk is KW / 16 wgmma m64n64k16 of the warpgroup (A = the W tile, B = the X tile, both K-major with the
 * 128-byte swizzle that swz<8> is, piece after piece), left running while the warps wait for the next chunk, refill
 * the ring and (FP8) convert it. Ring of S = SK_WG_STAGES(KW) stages; iteration c:
 *   wait for chunk c's loads, barrier; refill the stage of chunk c - 2 with chunk c + S - 2;
 *   bf16: issue chunk c's wgmmas into acc (one chain, k in order); wait until only they are in flight;
 *   FP8: convert chunk c into bf16 tile c % 2, barrier; wait for chunk c - 1's wgmmas; where chunk c starts a
 *        128-column scale block, fold the previous block's sums as acc = fma(scale_n, block_acc, acc) and start
 *        fresh ones; issue chunk c's into the block sums.
 * Either width issues the same wgmmas into the same sums in the same order (splits are whole 128-column blocks), so
 * a row's result does not depend on which width ran. Chunk c - 2 is complete in every warp before iteration c's
 * barrier, so the stage and the bf16 tile it read are free when they are refilled. */
template <bool F8, int KW>
__device__ __forceinline__ void sk_main_wg(const GemmParams &g, float (&acc)[8][4], uint8_t *sm, int m0, int n0, int p0,
                                           int np) {
    constexpr int S = SK_WG_STAGES(KW), P = KW / SK_BK;
    constexpr int WP = F8 ? SK_BN * SK_BK : SK_BN * SK_BK * 2; /* a 64-column W piece in a stage */
    constexpr int XP = SK_BM * SK_BK * 2;                      /* a 64-column X piece */
    constexpr int SB = SK_STAGE_BYTES(KW, F8);
    constexpr int TP = SK_BN * SK_BK * 2; /* a 64-column piece of a bf16 W tile */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nch = (np + P - 1) / P;
    const uint32_t sbase = smem_addr(sm);
    auto load_w = [&](int c) {
#pragma unroll
        for (int q = 0; q < P; q++) sk_load_w<F8>(g, sbase + (c % S) * SB + q * WP, n0, p0 + c * P + q, tid);
    };
    auto load_x = [&](int c) {
#pragma unroll
        for (int q = 0; q < P; q++) sk_load_x(g, sbase + (c % S) * SB + P * WP + q * XP, m0, p0 + c * P + q, tid);
    };

    /* the weights are immutable: the first chunks' W go out before the wait for the previous kernel */
#pragma unroll
    for (int c = 0; c < S - 2; c++)
        if (c < nch) load_w(c);
    pdl_begin();
#pragma unroll
    for (int c = 0; c < S - 2; c++) {
        if (c < nch) load_x(c);
        cp_async_commit();
    }

    const int n = n0 + warp * 16 + (lane >> 2); /* this thread's accumulator rows n (e < 2) and n + 8 (e >= 2) */
    float cacc[8][4];                           /* FP8: the sums of the current 128-column block */
    float s_lo = 0.0f, s_hi = 0.0f;             /* FP8: its scales */
    sk_zero(cacc);
    for (int c = 0; c < nch; c++) {
        cp_async_wait<S - 3>();
        if constexpr (!F8) sk_stage_fence();
        __syncthreads();
        if (c + S - 2 < nch) {
            load_w(c + S - 2);
            load_x(c + S - 2);
        }
        cp_async_commit();

        const uint32_t sst = sbase + (c % S) * SB;
        uint32_t sw = sst;
        if constexpr (F8) {
            uint8_t *tile = sm + S * SB + (c % 2) * P * TP;
#pragma unroll
            for (int q = 0; q < P; q++) sk_convert_w8(sm + (c % S) * SB + q * WP, tile + q * TP, tid);
            sk_stage_fence(); /* the converted tile and this thread's landed cp.async, for wgmma */
            __syncthreads();
            sw = smem_addr(tile);
            wgmma_wait<0>(); /* chunk c - 1 */
            sk_acc_fence(cacc);
            if (P == 2 || ((p0 + c) & 1) == 0) sk_block_start(g, acc, cacc, c > 0, p0 + c * P, n, SK_BM, s_lo, s_hi);
        }
        float(&d)[8][4] = F8 ? cacc : acc;
        sk_acc_fence(d);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KW / 16; kk++)
            wgmma_m64n64k16(d, wgmma_desc(sw + (kk >> 2) * TP + (kk & 3) * 32),
                            wgmma_desc(sst + P * WP + (kk >> 2) * XP + (kk & 3) * 32));
        wgmma_commit();
        if constexpr (!F8) wgmma_wait<1>(); /* chunk c - 1 */
    }
    wgmma_wait<0>();
    sk_acc_fence(acc);
    if constexpr (F8) {
        sk_acc_fence(cacc);
        if (nch > 0) sk_fold(acc, cacc, s_lo, s_hi, SK_BM);
    }
    cp_async_wait<0>();
}
#else
/* One 64-column chunk on mma.sync m16n8k16: acc += W tile (bf16 [64][64] at shared address sw, swz<8>) rows
 * 16 warp .. + 15 times the X tile (bf16 [64][64] at sx) rows 0 .. 63, every warp loading the X tile through ldmatrix;
 * the n8 tiles past mvalid (their X rows are zero) are skipped. */
__device__ __forceinline__ void sk_chunk_mma(uint32_t sw, uint32_t sx, int warp, int lane, int mvalid,
                                             float (&acc)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < SK_BK / 16; kk++) {
        uint32_t af[4];
        ldsm_x4(ldsm_addr_a<8>(sw, warp * 16, kk * 16, lane), af);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            if (np * 16 >= mvalid) break;
            uint32_t b[4];
            ldsm_x4(ldsm_addr_bt<8>(sx, np * 16, kk * 16, lane), b);
            mma_bf16(acc[2 * np], af, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], af, b[2], b[3]);
        }
    }
}

/* The mma.sync main loop of gemm_skinny_k (its names): 64-column chunks c0 .. c0 + nch - 1 of this CTA into acc
 * (c0 even: splits are whole 128-column blocks). Ring of SK_STAGES stages; iteration c: wait for chunk c, barrier,
 * [FP8: convert it into the bf16 tile, barrier,] the MMAs [FP8: into the sums of the chunk's 128-column scale block,
 * folded as acc = fma(scale_n, block_acc, acc) when the next block starts], barrier, refill the stage with chunk
 * c + SK_STAGES. The W of the first SK_STAGES chunks goes out before the wait for the previous kernel. */
template <bool F8>
__device__ __forceinline__ void sk_main_mma(const GemmParams &g, float (&acc)[8][4], uint8_t *sm, int m0, int n0,
                                            int c0, int nch) {
    constexpr int WB = F8 ? SK_BN * SK_BK : SK_BN * SK_BK * 2, SB = SK_STAGE_BYTES(SK_BK, F8);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int mvalid = min(SK_BM, g.M - m0); /* n8 tiles past it hold zeros: skipped */
    const uint32_t sbase = smem_addr(sm), stile = sbase + SK_STAGES * SB;
#pragma unroll
    for (int st = 0; st < SK_STAGES; st++)
        if (st < nch) sk_load_w<F8>(g, sbase + st * SB, n0, c0 + st, tid);
    pdl_begin();
#pragma unroll
    for (int st = 0; st < SK_STAGES; st++) {
        if (st < nch) sk_load_x(g, sbase + st * SB + WB, m0, c0 + st, tid);
        cp_async_commit();
    }
    const int n = n0 + warp * 16 + (lane >> 2);
    float cacc[8][4]; /* FP8: the sums of the current 128-column block, and its scales */
    float s_lo = 0.0f, s_hi = 0.0f;
    sk_zero(cacc);
    for (int c = 0; c < nch; c++) {
        cp_async_wait<SK_STAGES - 1>();
        __syncthreads();
        const int st = c % SK_STAGES;
        const uint32_t sx = sbase + st * SB + WB;
        if constexpr (F8) {
            if (((c0 + c) & 1) == 0) sk_block_start(g, acc, cacc, c > 0, c0 + c, n, mvalid, s_lo, s_hi);
            sk_convert_w8(sm + st * SB, sm + SK_STAGES * SB, tid);
            __syncthreads();
            sk_chunk_mma(stile, sx, warp, lane, mvalid, cacc);
        } else {
            sk_chunk_mma(sbase + st * SB, sx, warp, lane, mvalid, acc);
        }
        __syncthreads(); /* stage st (and the bf16 tile) is refilled next */
        if (c + SK_STAGES < nch) {
            sk_load_w<F8>(g, sbase + st * SB, n0, c0 + c + SK_STAGES, tid);
            sk_load_x(g, sbase + st * SB + WB, m0, c0 + c + SK_STAGES, tid);
        }
        cp_async_commit();
    }
    if (F8 && nch > 0) sk_fold(acc, cacc, s_lo, s_hi, mvalid);
    cp_async_wait<0>();
}
#endif

/* The epilogue of a 64 x 64 accumulator tile (W rows n0 .., X rows m0 ..): EPI < 0 writes the partial sums of split
 * `split` to work [split][M][N], the others store through sk_store1 / sk_store_glu. */
template <int EPI>
__device__ __forceinline__ void sk_epilogue(const GemmParams &g, float *work, int split, const float (&acc)[8][4],
                                            int m0, int n0) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* accumulator (t, e): W row n0 + 16 warp + lane / 4 (+ 8 for e >= 2), X row m0 + 8 t + 2 (lane % 4) + e % 2 */
    const int nr = n0 + warp * 16 + (lane >> 2), mc = m0 + 2 * (lane & 3);
#pragma unroll
    for (int t = 0; t < 8; t++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = nr + (e >> 1) * 8, m = mc + 8 * t + (e & 1);
            if (n >= g.N || m >= g.M) continue;
            if constexpr (EPI < 0)
                work[((size_t)split * g.M + m) * g.N + n] = acc[t][e];
            else if constexpr (EPI != GEMM_EPI_SWIGLU_BF16)
                sk_store1<EPI>(g, m, n, acc[t][e]);
        }
    }
    if constexpr (EPI == GEMM_EPI_SWIGLU_BF16) {
        /* glu_group 1 (gate_i, up_i in W rows 2i, 2i + 1): lanes l and l ^ 4 hold neighbouring W rows of the same
         * X rows; the even row's lane stores output column n / 2 */
        const bool gate_lane = ((lane >> 2) & 1) == 0;
#pragma unroll
        for (int t = 0; t < 8; t++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float other = __shfl_xor_sync(0xffffffffu, acc[t][e], 4);
                const int n = nr + (e >> 1) * 8, m = mc + 8 * t + (e & 1);
                if (gate_lane && n < g.N && m < g.M) sk_store_glu(g, m, n >> 1, acc[t][e], other);
            }
        }
    }
}

/* EPI < 0: write partial sums to work + split * M * N. F8: FP8 weights. KW: the chunk width of the sm_90a loop (the
 * mma.sync loop always takes 64). */
template <int EPI, bool F8, int KW>
__global__ void __launch_bounds__(128) gemm_skinny_k(const __grid_constant__ SkArgs a) {
    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t *sm = smem + (((smem_addr(smem) + 1023u) & ~1023u) - smem_addr(smem)); /* the ring, 1024-byte aligned */
    const GemmParams &g = a.g;
    const int m0 = blockIdx.x * SK_BM, n0 = blockIdx.y * SK_BN, split = blockIdx.z;
    const int c0 = split * a.kc, c1 = min(a.nchunks, c0 + a.kc), nch = c1 - c0;
    float acc[8][4];
    sk_zero(acc);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sk_main_wg<F8, KW>(g, acc, sm, m0, n0, c0, nch);
#else
    sk_main_mma<F8>(g, acc, sm, m0, n0, c0, nch);
#endif
    sk_epilogue<EPI>(g, a.work, split, acc, m0, n0);
}

/* grid (ceil(cols / 256), M), 256 threads: y[m][col] for col < cols (N, or N / 2 for SwiGLU) from the splits in
 * order. */
template <int EPI>
__global__ void __launch_bounds__(256) gemm_skinny_reduce(const __grid_constant__ SkArgs a, int splits) {
    pdl_begin();
    const GemmParams &g = a.g;
    const int m = blockIdx.y, col = blockIdx.x * 256 + threadIdx.x;
    const size_t plane = (size_t)g.M * g.N;
    const float *w = a.work + (size_t)m * g.N;
    if constexpr (EPI == GEMM_EPI_SWIGLU_BF16) {
        if (col >= g.N / 2) return;
        const int gr = sk_gate_row(col, g.glu_group), ur = gr + g.glu_group;
        float gate = 0.0f, up = 0.0f;
        for (int s = 0; s < splits; s++) {
            gate += w[s * plane + gr];
            up += w[s * plane + ur];
        }
        sk_store_glu(g, m, col, gate, up);
    } else {
        if (col >= g.N) return;
        float v = 0.0f;
        for (int s = 0; s < splits; s++) v += w[s * plane + col];
        sk_store1<EPI>(g, m, col, v);
    }
}

/* One row of the residual GEMMs' split reduction with the next RMSNorm fused (EPI_ADD_F32, N = D <= 2048). The row
 * is 2 NC float4 slots of 32 lanes: slot k of lane l holds columns 8 (l + 32 (k / 2)) + 4 (k % 2) .. + 3, the layout of
 * rmsnorm_f32_rows_bf16_v8. The 2 NC / SPW warps that call it (warp = 0 ..) take SPW slots each, k = warp + s (2 NC /
 * SPW): each adds the splits in order, y = bf16(x + bf16(sum)) goes back to x and to shared memory (sv [2 NC][32]);
 * warp 0 then forms lane l's sum of squares over k = 0 .. 2 NC - 1 in that kernel's order and the same warp_sum, so
 * h = norm(y) is bitwise the separate reduction followed by that norm, whatever SPW. gw: the norm weights of the
 * thread's slots (sk_norm_w, loaded before the caller's wait: they are immutable). sync(): a barrier of the calling
 * warps. */
template <int NC, int SPW>
__device__ __forceinline__ void sk_norm_w(const GemmParams &g, const SkNorm &nm, int warp, float4 (&gw)[SPW]) {
    const int l = threadIdx.x & 31;
#pragma unroll
    for (int s = 0; s < SPW; s++) {
        const int k = warp + s * (2 * NC / SPW), i = l + 32 * (k >> 1);
        gw[s] = i < g.N / 8 ? __ldg((const float4 *)nm.w + 2 * i + (k & 1)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}
template <int NC, int SPW, typename Sync>
__device__ __forceinline__ void sk_reduce_norm_row(const GemmParams &g, const float *work, int splits, const SkNorm &nm,
                                                   const float4 (&gw)[SPW], int row, int warp, float4 (*sv)[32],
                                                   float *sr, Sync sync) {
    constexpr int WARPS = 2 * NC / SPW;
    const int l = threadIdx.x & 31, n8 = g.N / 8;
    const size_t plane4 = (size_t)g.M * g.N / 4;
    const float4 *part = (const float4 *)(work + (size_t)row * g.N);
    float4 *x = (float4 *)((float *)g.y + (size_t)row * g.ldy);
    float4 v[SPW];
#pragma unroll
    for (int s = 0; s < SPW; s++) {
        const int k = warp + s * WARPS, i = l + 32 * (k >> 1), c4 = 2 * i + (k & 1);
        v[s] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < n8) {
            float4 acc = part[c4];
            for (int sp = 1; sp < splits; sp++) {
                const float4 q = part[sp * plane4 + c4];
                acc.x += q.x, acc.y += q.y, acc.z += q.z, acc.w += q.w;
            }
            const float4 old = __ldcg(x + c4);
            v[s] = make_float4(rbf(old.x + rbf(acc.x)), rbf(old.y + rbf(acc.y)), rbf(old.z + rbf(acc.z)),
                               rbf(old.w + rbf(acc.w)));
            x[c4] = v[s];
        }
        sv[k][l] = v[s];
    }
    sync();
    if (warp == 0) {
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < 2 * NC; j++) {
            const float4 q = sv[j][l];
            ss += q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
        }
        ss = warp_sum(ss);
        if (l == 0) *sr = rsqrtf(ss / (float)g.N + nm.eps);
    }
    sync();
    const float r = *sr;
#pragma unroll
    for (int s = 0; s < SPW; s++) {
        const int k = warp + s * WARPS, i = l + 32 * (k >> 1), c4 = 2 * i + (k & 1);
        if (i >= n8) continue;
        uint2 o;
        o.x = pack_bf16(norm_apply(v[s].x, r, gw[s].x, nm.mode), norm_apply(v[s].y, r, gw[s].y, nm.mode));
        o.y = pack_bf16(norm_apply(v[s].z, r, gw[s].z, nm.mode), norm_apply(v[s].w, r, gw[s].w, nm.mode));
        ((uint2 *)(nm.h + (size_t)row * g.N))[c4] = o;
    }
}

/* The residual GEMMs of the decode rows with the next RMSNorm fused: sk_reduce_norm_row, one CTA of 64 NC threads
 * (a warp per slot) per row. grid M. */
template <int NC>
__global__ void __launch_bounds__(64 * NC)
    gemm_skinny_reduce_norm(const __grid_constant__ SkArgs a, int splits, const __grid_constant__ SkNorm nm) {
    __shared__ float4 sv[2 * NC][32];
    __shared__ float sr;
    float4 gw[1];
    sk_norm_w<NC, 1>(a.g, nm, threadIdx.x >> 5, gw);
    pdl_begin(); /* the next kernel may start now and stream its weights while the rows are reduced */
    sk_reduce_norm_row<NC, 1>(a.g, a.work, splits, nm, gw, blockIdx.x, threadIdx.x >> 5, sv, &sr,
                              [] { __syncthreads(); });
}

/* ---- the layer tail: out_proj / o_proj, its norm, gate_up, down, the next norm [and the next in_proj] in one
 * persistent launch ----
 *
 * For a pass of at most 64 decode rows (one m-block) the launches after a layer's mixer (the residual GEMM's partial
 * sums, their reduction + residual + norm, gate_up with SwiGLU, down's partial sums, their reduction + the next
 * layer's norm, optionally the next layer's in_proj) are phases of one grid of at most n_sm CTAs, one per SM,
 * separated by grid-wide barriers. Each phase computes what its kernel computes, in the same order (same split plan,
 * same k16 steps into the same sums, sk_epilogue, sk_reduce_norm_row), so every output is bitwise the separate
 * launches'. What changes is where the weights come from: a producer warp (warp 4) streams the CTA's W chunks of all
 * the GEMMs, phase after phase, by TMA into a ring of SKT_NW stages that it refills as soon as the consumers free a
 * stage. The weights are immutable, so it never waits for an activation: when a phase's barrier opens, the first
 * chunks of the CTA's next tile are already in shared memory or on their way, where the separate kernels start each
 * launch with an empty ring. Consumers (warps 0-3, one warpgroup) load the X chunks (activations, from L2) by cp.async
 * through a ring of SKT_NX stages as sk_main_wg does, run each 128-column chunk as 8 wgmma m64n64k16, store the
 * epilogue, and do the row reductions. Co-residency (every barrier needs all CTAs running): one CTA per SM by shared
 * memory, grid <= n_sm. FP8 weights (all the GEMMs): the producer streams the e4m3 chunks (TMA boxes of 64 bytes x
 * 64 rows, no swizzle: sk_load_w<true>'s layout) through a ring of more, half-size stages; the consumers convert each
 * into one of two bf16 tiles (sk_convert_w8), give the stage back at once, and fold the block sums as sk_main_wg
 * does. */
#define SKT_NX        4                 /* X ring stages: chunks c + 1, c + 2 in flight while chunk c computes */
#define SKT_TILE      (SK_BN * 128 * 2) /* a 64 x 128 bf16 chunk, two swz<8> pieces [64][64]: X stage, bf16 tile */
#define SKT_NW(F8)    ((F8) ? 12 : 8)   /* W ring stages */
#define SKT_WST(F8)   ((F8) ? SKT_TILE / 2 : SKT_TILE) /* a W stage: the chunk's bf16 or e4m3 bytes */
#define SKT_SV        (16 * 32 * 16)                   /* sk_reduce_norm_row's slots, 2 NC <= 16 */
#define SKT_TILES(F8) (SKT_NW(F8) * SKT_WST(F8) + SKT_NX * SKT_TILE + ((F8) ? 2 * SKT_TILE : 0)) /* rings, tiles */
#define SKT_SMEM(F8)  (SKT_TILES(F8) + SKT_SV + 2 * SKT_NW(F8) * 8 + 16 + 1024)

typedef struct SkTailGemm {
    CUtensorMap wmap; /* W [N][K], boxes of 64 columns x 64 rows: bf16 swz<8>, or e4m3 bytes row after row */
    GemmParams g;
    int kc, splits, ntiles; /* sk_plan's pieces per split and splits; N / 64 tiles */
} SkTailGemm;

typedef struct SkTailArgs {
    SkTailGemm gm[4]; /* the residual GEMM (partial sums), gate_up (SwiGLU, one split), down (partial sums), and
                       * with n_gemm 4 the next layer's in_proj (EPI_BF16, one split) */
    int n_gemm;
    SkNorm nm[2]; /* the norms after the residual GEMM and after down */
    float *work;  /* partial sums [splits][M][N] of the residual GEMM, then of down */
    int *bar;     /* the grid barrier: arrivals, CTAs done */
} SkTailArgs;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Grid-wide barrier k (1, 2, ..) of a tail launch, for its consumers (all CTAs resident): after the CTA's bar.sync,
 * thread 0 adds one to bar[0] with a release and waits until all gridDim.x CTAs have added k times with acquire loads
 * (wait_count_geq, which traps after 2 s instead of hanging), as cooperative groups' grid sync does on sm_70 and later.
 * The acquire also matters for the CTA's own rereads: a later phase reads the work rows at the addresses an earlier
 * phase read with plain loads, and the acquire's L1 invalidation keeps it from seeing those lines. skt_grid_done resets
 * the count for the next launch. */
__device__ __forceinline__ void skt_grid_sync(int *bar, int k) {
    bar_sync(1, 128);
    if (threadIdx.x == 0) {
        count_add_release(bar, 1);
        wait_count_geq(bar, k * (int)gridDim.x);
    }
    bar_sync(1, 128);
}

/* After the launch's last barrier: the CTA that arrives here last (bar[1] counts them) finds every CTA past its last
 * wait on bar[0], so it zeroes both words for the next launch (which reads them only after this grid is complete). */
__device__ __forceinline__ void skt_grid_done(int *bar) {
    if (threadIdx.x == 0 && atomicAdd(bar + 1, 1) == (int)gridDim.x - 1) {
        atomicExch(bar, 0);
        atomicExch(bar + 1, 0);
    }
}

/* Item `it` of GEMM t: its n-tile and split (tiles fastest), first 64-column piece p0 and 128-column chunks nch */
__device__ __forceinline__ void skt_item(const SkTailGemm &t, int it, int &n0, int &split, int &p0, int &nch) {
    const int np_total = (t.g.K + SK_BK - 1) / SK_BK;
    n0 = (it % t.ntiles) * SK_BN;
    split = it / t.ntiles;
    p0 = split * t.kc;
    nch = (min(t.kc, np_total - p0) + 1) / 2;
}

/* The producer: every W chunk of this CTA's items of the tail's GEMMs, in the consumers' order, into stage j % NW
 * once the consumers have freed it (empty), completing on full. One thread. */
template <bool F8>
__device__ __forceinline__ void skt_produce(const SkTailArgs &a, uint32_t wring, uint32_t full0, uint32_t empty0) {
    constexpr int NW = SKT_NW(F8), WST = SKT_WST(F8);
    int j = 0;
    for (int p = 0; p < a.n_gemm; p++) {
        const SkTailGemm &t = a.gm[p];
        for (int it = blockIdx.x; it < t.ntiles * t.splits; it += gridDim.x) {
            int n0, split, p0, nch;
            skt_item(t, it, n0, split, p0, nch);
            for (int c = 0; c < nch; c++, j++) {
                const int s = j % NW;
                if (j >= NW) mbar_wait(empty0 + 8 * s, ((j / NW) - 1) & 1);
                mbar_arrive_expect_tx(full0 + 8 * s, WST);
                tma_load_2d(wring + s * WST, &t.wmap, (p0 + 2 * c) * SK_BK, n0, full0 + 8 * s);
                tma_load_2d(wring + s * WST + WST / 2, &t.wmap, (p0 + 2 * c + 1) * SK_BK, n0, full0 + 8 * s);
            }
        }
    }
}

/* A GEMM phase for the consumers: this CTA's items of t, each as sk_main_wg's 128-column loop with W from the
 * producer's ring (chunk counter j, shared with skt_produce's order), then sk_epilogue<EPI>. FP8: chunk c is
 * converted into bf16 tile c % 2 (tiles: their generic address; the stage goes back to the producer once every thread
 * has converted its pieces), then, as in sk_main_wg, chunk c - 1's wgmmas are waited for, the previous 128-column
 * block's sums folded with their scales, and chunk c issued into fresh block sums. */
template <int EPI, bool F8>
__device__ __forceinline__ void skt_gemm(const SkTailGemm &t, float *work, uint8_t *sm, uint32_t xring, uint32_t full0,
                                         uint32_t empty0, int &j) {
    constexpr int NW = SKT_NW(F8), WST = SKT_WST(F8);
    const GemmParams &g = t.g;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t wring = smem_addr(sm);
    for (int it = blockIdx.x; it < t.ntiles * t.splits; it += gridDim.x) {
        int n0, split, p0, nch;
        skt_item(t, it, n0, split, p0, nch);
        auto load_x = [&](int c) {
#pragma unroll
            for (int q = 0; q < 2; q++)
                sk_load_x(g, xring + (c % SKT_NX) * SKT_TILE + q * (SKT_TILE / 2), 0, p0 + 2 * c + q, tid);
        };
        const int n = n0 + warp * 16 + (lane >> 2); /* FP8: this thread's accumulator rows n, n + 8 */
        float acc[8][4], cacc[8][4];                /* FP8: cacc, the sums of the current 128-column block */
        float s_lo = 0.0f, s_hi = 0.0f;             /* FP8: its scales */
        sk_zero(acc);
        sk_zero(cacc);
#pragma unroll
        for (int c = 0; c < SKT_NX - 2; c++) {
            if (c < nch) load_x(c);
            cp_async_commit();
        }
        for (int c = 0; c < nch; c++, j++) {
            cp_async_wait<SKT_NX - 3>();
            fence_proxy_async();
            bar_sync(1, 128); /* chunk c's X landed in every thread; chunk c - 2's wgmmas are done in every warp */
            if (c + SKT_NX - 2 < nch) load_x(c + SKT_NX - 2);
            cp_async_commit();
            const int s = j % NW;
            mbar_wait(full0 + 8 * s, (j / NW) & 1);
            uint32_t sw = wring + s * WST;
            const uint32_t sx = xring + (c % SKT_NX) * SKT_TILE;
            if constexpr (F8) {
                uint8_t *tile = sm + SKT_TILES(F8) - 2 * SKT_TILE + (c % 2) * SKT_TILE;
#pragma unroll
                for (int q = 0; q < 2; q++) sk_convert_w8(sm + s * WST + q * (WST / 2), tile + q * (SKT_TILE / 2), tid);
                fence_proxy_async(); /* the converted tile, for wgmma */
                bar_sync(1, 128);
                mbar_arrive(empty0 + 8 * s); /* every thread has converted its pieces of the stage */
                sw = smem_addr(tile);
                wgmma_wait<0>(); /* chunk c - 1 */
                sk_acc_fence(cacc);
                sk_block_start(g, acc, cacc, c > 0, p0 + 2 * c, n, SK_BM, s_lo, s_hi);
            }
            float(&d)[8][4] = F8 ? cacc : acc;
            sk_acc_fence(d);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                wgmma_m64n64k16(d, wgmma_desc(sw + (kk >> 2) * (SKT_TILE / 2) + (kk & 3) * 32),
                                wgmma_desc(sx + (kk >> 2) * (SKT_TILE / 2) + (kk & 3) * 32));
            wgmma_commit();
            if constexpr (!F8) {
                wgmma_wait<1>(); /* chunk c - 1: its W stage goes back to the producer */
                if (c > 0) mbar_arrive(empty0 + 8 * ((j - 1) % NW));
            }
        }
        wgmma_wait<0>();
        sk_acc_fence(acc);
        if constexpr (F8) {
            sk_acc_fence(cacc);
            if (nch > 0) sk_fold(acc, cacc, s_lo, s_hi, SK_BM);
        } else if (nch > 0) {
            mbar_arrive(empty0 + 8 * ((j - 1) % NW));
        }
        cp_async_wait<0>();
        bar_sync(1, 128); /* every warp's wgmmas are done before the next item refills the X ring (and FP8 tiles) */
        sk_epilogue<EPI>(g, work, split, acc, 0, n0);
    }
}

/* A reduction phase: rows blockIdx.x, + gridDim.x, .. of the residual GEMM t's partial sums, residual and norm nm */
template <int NC>
__device__ __forceinline__ void skt_reduce(const SkTailGemm &t, const float *work, const SkNorm &nm, float4 (*sv)[32],
                                           float *sr) {
    float4 gw[NC / 2];
    sk_norm_w<NC, NC / 2>(t.g, nm, threadIdx.x >> 5, gw);
    for (int row = blockIdx.x; row < t.g.M; row += gridDim.x)
        sk_reduce_norm_row<NC, NC / 2>(t.g, work, t.splits, nm, gw, row, threadIdx.x >> 5, sv, sr,
                                       [] { bar_sync(1, 128); });
}
#endif

/* NC: the norms' row width class (N <= 256 NC); F8: FP8 weights. 160 threads: the consumer warpgroup, then the
 * producer warp. */
template <int NC, bool F8>
__global__ void __launch_bounds__(160, 1) gemm_skinny_tail_k(const __grid_constant__ SkTailArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t *sm = smem + (((smem_addr(smem) + 1023u) & ~1023u) - smem_addr(smem));
    const uint32_t wring = smem_addr(sm), xring = wring + SKT_NW(F8) * SKT_WST(F8);
    float4(*sv)[32] = (float4(*)[32])(sm + SKT_TILES(F8));
    const uint32_t full0 = smem_addr(sm + SKT_TILES(F8) + SKT_SV), empty0 = full0 + 8 * SKT_NW(F8);
    float *sr = (float *)(sm + SKT_TILES(F8) + SKT_SV + 16 * SKT_NW(F8));
    if (threadIdx.x == 0) {
        for (int s = 0; s < SKT_NW(F8); s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 128);
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x >= 128) { /* the weights are immutable: streamed from the start, before the PDL wait */
        if (threadIdx.x == 128) skt_produce<F8>(a, wring, full0, empty0);
        return;
    }
    pdl_begin();
    int j = 0;
    skt_gemm<-1, F8>(a.gm[0], a.work, sm, xring, full0, empty0, j);
    skt_grid_sync(a.bar, 1);
    skt_reduce<NC>(a.gm[0], a.work, a.nm[0], sv, sr);
    skt_grid_sync(a.bar, 2);
    skt_gemm<GEMM_EPI_SWIGLU_BF16, F8>(a.gm[1], a.work, sm, xring, full0, empty0, j);
    skt_grid_sync(a.bar, 3);
    skt_gemm<-1, F8>(a.gm[2], a.work, sm, xring, full0, empty0, j);
    skt_grid_sync(a.bar, 4);
    if (a.n_gemm == 3) skt_grid_done(a.bar);
    skt_reduce<NC>(a.gm[2], a.work, a.nm[1], sv, sr);
    if (a.n_gemm == 4) { /* the next layer's in_proj on the h just normed */
        skt_grid_sync(a.bar, 5);
        skt_grid_done(a.bar);
        skt_gemm<GEMM_EPI_BF16, F8>(a.gm[3], a.work, sm, xring, full0, empty0, j);
    }
#endif
}

extern "C" size_t cuda_gemm_skinny_work(int M, int N, int K, int n_sm, int epi, int glu_group) {
    int kc = 0;
    const int s = sk_plan(N, K, 1, n_sm, &kc);
    if (epi == GEMM_EPI_ADD_F32_NORM) return (size_t)s * M * N;
    return s > 1 || (epi == GEMM_EPI_SWIGLU_BF16 && glu_group != 1) ? (size_t)s * M * N : 0;
}

/* Whether gemm_skinny_k runs its sm_90a code on this device (the sm_90a binary, not the compute_80 PTX): -1 on a CUDA
 * error. Asked once. */
static int sk_wg(void) {
    static int wg = -1;
    if (wg >= 0) return wg;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, gemm_skinny_k<-1, false, 64>) != cudaSuccess) return -1;
    wg = fa.binaryVersion == 90 && fa.ptxVersion == 90;
    return wg;
}

/* The dynamic shared memory of gemm_skinny_k<EPI, F8, KW> on this device, its attribute set once per instantiation:
 * the bytes, or minus a CUDA error. */
template <int EPI, bool F8, int KW>
static int sk_smem(void) {
    static int bytes = 0;
    if (bytes) return bytes;
    const int wg = sk_wg();
    if (wg < 0) return -(int)cudaErrorInvalidValue;
    const int b = wg ? SK_WG_SMEM(KW, F8) : SK_MMA_SMEM(F8);
    const cudaError_t e =
        cudaFuncSetAttribute(gemm_skinny_k<EPI, F8, KW>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
    if (e != cudaSuccess) return -(int)e;
    bytes = b;
    return bytes;
}

/* gemm_skinny_k<EPI, F8> on `grid`: 128-column chunks where the sm_90a loop runs and the grid is one wave at one CTA
 * per SM, else 64 (sk_main_wg). */
template <int EPI, bool F8>
static int sk_launch_k(const SkArgs &a, dim3 grid, int n_sm, const CudaLaunch *l) {
    const bool wide = sk_wg() == 1 && (long)grid.x * grid.y * grid.z <= n_sm;
    const int smem = wide ? sk_smem<EPI, F8, 128>() : sk_smem<EPI, F8, 64>();
    if (smem < 0) return -smem;
    return wide ? launch_kernel(gemm_skinny_k<EPI, F8, 128>, grid, dim3(128), smem, l, a)
                : launch_kernel(gemm_skinny_k<EPI, F8, 64>, grid, dim3(128), smem, l, a);
}

template <int EPI, bool F8>
static int sk_launch(const SkArgs &a, int splits, int n_sm, const CudaLaunch *l) {
    const GemmParams &g = a.g;
    const dim3 grid((unsigned)((g.M + SK_BM - 1) / SK_BM), (unsigned)((g.N + SK_BN - 1) / SK_BN), (unsigned)splits);
    const bool partial = splits > 1 || (EPI == GEMM_EPI_SWIGLU_BF16 && g.glu_group != 1);
    if (!partial) return sk_launch_k<EPI, F8>(a, grid, n_sm, l);
    const int rc = sk_launch_k<-1, F8>(a, grid, n_sm, l);
    if (rc) return rc;
    const int cols = EPI == GEMM_EPI_SWIGLU_BF16 ? g.N / 2 : g.N;
    return launch_ex(gemm_skinny_reduce<EPI>, dim3((unsigned)((cols + 255) / 256), (unsigned)g.M), dim3(256), 0, 0, l,
                     a, splits);
}

/* The weight arguments: exactly one of w (bf16) and w8 (FP8, with w8_scale, K and ldw multiples of 16, 16-byte
 * aligned) */
static bool sk_weights_ok(const GemmParams *g) {
    if (!g->w == !g->w8) return false;
    return !g->w8 || (g->w8_scale && g->K % 16 == 0 && g->ldw % 16 == 0 && !((uintptr_t)g->w8 & 15));
}

extern "C" int cuda_gemm_skinny(const GemmParams *g, float *work, size_t work_floats, int n_sm, const CudaLaunch *l) {
    if (!g || !l || !g->x || !sk_weights_ok(g) || !g->y || g->M < 1 || g->M > 65535 || g->N < 8 || g->K < 8 ||
        g->N % 8 || g->K % 8 || g->ldx % 8 || g->ldw % 8 || g->ldx < g->K || g->ldw < g->K || n_sm < 1)
        return (int)cudaErrorInvalidValue;
    if (g->epi == GEMM_EPI_SWIGLU_BF16 && (g->glu_group < 1 || g->N % (2 * g->glu_group) || g->ldy < g->N / 2))
        return (int)cudaErrorInvalidValue;
    if (g->epi != GEMM_EPI_SWIGLU_BF16 && g->ldy < g->N) return (int)cudaErrorInvalidValue;
    SkArgs a;
    a.g = *g;
    a.work = work;
    a.nchunks = (g->K + SK_BK - 1) / SK_BK;
    const int splits = sk_plan(g->N, g->K, sk_mb(g), n_sm, &a.kc);
    if (cuda_gemm_skinny_work(g->M, g->N, g->K, n_sm, g->epi, g->glu_group) > work_floats ||
        (cuda_gemm_skinny_work(g->M, g->N, g->K, n_sm, g->epi, g->glu_group) && !work))
        return (int)cudaErrorInvalidValue;
    const bool f8 = g->w8 != NULL;
    switch (g->epi) {
    case GEMM_EPI_BF16:
        return f8 ? sk_launch<GEMM_EPI_BF16, true>(a, splits, n_sm, l)
                  : sk_launch<GEMM_EPI_BF16, false>(a, splits, n_sm, l);
    case GEMM_EPI_F32:
        return f8 ? sk_launch<GEMM_EPI_F32, true>(a, splits, n_sm, l)
                  : sk_launch<GEMM_EPI_F32, false>(a, splits, n_sm, l);
    case GEMM_EPI_ADD_F32:
        return f8 ? sk_launch<GEMM_EPI_ADD_F32, true>(a, splits, n_sm, l)
                  : sk_launch<GEMM_EPI_ADD_F32, false>(a, splits, n_sm, l);
    case GEMM_EPI_SWIGLU_BF16:
        return f8 ? sk_launch<GEMM_EPI_SWIGLU_BF16, true>(a, splits, n_sm, l)
                  : sk_launch<GEMM_EPI_SWIGLU_BF16, false>(a, splits, n_sm, l);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* The row width class NC of sk_reduce_norm_row for N <= 2048 columns (2 NC float4 slots of 32 lanes), the same for
 * the separate reduction and the tail, which must agree bit for bit */
static int sk_norm_nc(int N) { return N <= 512 ? 2 : N <= 1024 ? 4 : 8; }

extern "C" int cuda_gemm_skinny_norm(const GemmParams *g, const float *norm_w, int norm_mode, float eps, uint16_t *h,
                                     float *work, size_t work_floats, int n_sm, const CudaLaunch *l) {
    if (!g || !l || !g->x || !sk_weights_ok(g) || !g->y || !norm_w || !h || !work || g->epi != GEMM_EPI_ADD_F32 ||
        g->M < 1 || g->M > 65535 || g->N % 8 || g->N > 2048 || g->K < 8 || g->K % 8 || g->ldx % 8 || g->ldw % 8 ||
        g->ldx < g->K || g->ldw < g->K || g->ldy < g->N || g->ldy % 4 || ((uintptr_t)g->y & 15) ||
        ((uintptr_t)norm_w & 15) || ((uintptr_t)h & 15) || n_sm < 1 ||
        (norm_mode != NORM_ZC && norm_mode != NORM_PLAIN))
        return (int)cudaErrorInvalidValue;
    SkArgs a;
    a.g = *g;
    a.work = work;
    a.nchunks = (g->K + SK_BK - 1) / SK_BK;
    const int splits = sk_plan(g->N, g->K, sk_mb(g), n_sm, &a.kc);
    if (cuda_gemm_skinny_work(g->M, g->N, g->K, n_sm, GEMM_EPI_ADD_F32_NORM, 1) > work_floats)
        return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)((g->M + SK_BM - 1) / SK_BM), (unsigned)((g->N + SK_BN - 1) / SK_BN), (unsigned)splits);
    const int rc = g->w8 ? sk_launch_k<-1, true>(a, grid, n_sm, l) : sk_launch_k<-1, false>(a, grid, n_sm, l);
    if (rc) return rc;
    const SkNorm nm = {norm_w, h, norm_mode, eps};
    const dim3 rg((unsigned)g->M);
    switch (sk_norm_nc(g->N)) {
    case 2: return launch_ex(gemm_skinny_reduce_norm<2>, rg, dim3(128), 0, 0, l, a, splits, nm);
    case 4: return launch_ex(gemm_skinny_reduce_norm<4>, rg, dim3(256), 0, 0, l, a, splits, nm);
    default: return launch_ex(gemm_skinny_reduce_norm<8>, rg, dim3(512), 0, 0, l, a, splits, nm);
    }
}

/* One GEMM of the tail: its tensor map and split plan, or cudaErrorNotSupported where the tail does not take it
 * (K not whole 128-column chunks, a misaligned weight) */
static int skt_gemm_args(SkTailGemm *t, const GemmParams *g, int n_sm) {
    if (!g->w == !g->w8 || g->K % 128) return (int)cudaErrorNotSupported;
    int rc;
    if (g->w8) {
        if (!g->w8_scale || g->ldw % 16 || ((uintptr_t)g->w8 & 15)) return (int)cudaErrorNotSupported;
        rc = cuda_tma_map_u8(&t->wmap, g->w8, g->N, g->K, g->ldw, SK_BN);
    } else {
        if ((uintptr_t)g->w & 15) return (int)cudaErrorNotSupported;
        rc = cuda_tma_map_bf16(&t->wmap, g->w, g->N, g->K, g->ldw, SK_BN);
    }
    if (rc) return rc;
    t->g = *g;
    t->g.split_m = 0;
    t->splits = sk_plan(g->N, g->K, 1, n_sm, &t->kc);
    t->ntiles = (g->N + SK_BN - 1) / SK_BN;
    return 0;
}

template <int NC, bool F8>
static int skt_launch(const SkTailArgs &a, int grid, const CudaLaunch *l) {
    const cudaError_t e = smem_attr<gemm_skinny_tail_k<NC, F8>>(SKT_SMEM(F8));
    if (e != cudaSuccess) return (int)e;
    return launch_ex(gemm_skinny_tail_k<NC, F8>, dim3((unsigned)grid), dim3(160), SKT_SMEM(F8), 0, l, a);
}

template <bool F8>
static int skt_launch_nc(const SkTailArgs &a, int N, int grid, const CudaLaunch *l) {
    switch (sk_norm_nc(N)) {
    case 2: return skt_launch<2, F8>(a, grid, l);
    case 4: return skt_launch<4, F8>(a, grid, l);
    default: return skt_launch<8, F8>(a, grid, l);
    }
}

extern "C" int cuda_gemm_skinny_tail(const SkTailParams *p, float *work, size_t work_floats, int n_sm,
                                     const CudaLaunch *l) {
    if (!p || !l || !work || !p->bar || !p->h || !p->norm_out || !p->norm_down || n_sm < 1)
        return (int)cudaErrorInvalidValue;
    const GemmParams *o = &p->out, *gu = &p->gu, *dn = &p->down, *in = &p->next_in;
    const int M = o->M, N = o->N, n_gemm = in->M > 0 ? 4 : 3;
    if (sk_wg() != 1 || M < 1 || M > SK_BM || gu->M != M || dn->M != M || dn->N != N || N > 2048 ||
        o->epi != GEMM_EPI_ADD_F32 || dn->epi != GEMM_EPI_ADD_F32 || gu->epi != GEMM_EPI_SWIGLU_BF16 ||
        gu->glu_group != 1 || o->y != dn->y || o->ldy != dn->ldy ||
        (n_gemm == 4 && (in->M != M || in->epi != GEMM_EPI_BF16 || in->K != N || in->x != p->h || in->ldx != N)))
        return (int)cudaErrorNotSupported;
    for (int i = 0; i < n_gemm; i++) {
        const GemmParams *g = i == 0 ? o : i == 1 ? gu : i == 2 ? dn : in;
        if (!g->x || !g->y || g->N < 8 || g->N % 8 || g->K < 8 || g->ldx % 8 || g->ldw % 8 || g->ldx < g->K ||
            g->ldw < g->K || (i == 1 ? g->ldy < g->N / 2 || g->N % 2 : g->ldy < g->N || g->ldy % 4))
            return (int)cudaErrorInvalidValue;
    }
    if (((uintptr_t)o->y & 15) || ((uintptr_t)p->norm_out & 15) || ((uintptr_t)p->norm_down & 15) ||
        ((uintptr_t)p->h & 15) || (p->norm_mode != NORM_ZC && p->norm_mode != NORM_PLAIN))
        return (int)cudaErrorInvalidValue;
    SkTailArgs a;
    memset(&a, 0, sizeof a);
    int rc = skt_gemm_args(&a.gm[0], o, n_sm);
    if (!rc) rc = skt_gemm_args(&a.gm[1], gu, n_sm);
    if (!rc) rc = skt_gemm_args(&a.gm[2], dn, n_sm);
    if (!rc && n_gemm == 4) rc = skt_gemm_args(&a.gm[3], in, n_sm);
    if (rc) return rc;
    if (a.gm[1].splits != 1 || !o->w8 != !gu->w8 || !o->w8 != !dn->w8 ||
        (n_gemm == 4 && (a.gm[3].splits != 1 || !o->w8 != !in->w8)))
        return (int)cudaErrorNotSupported;
    if (cuda_gemm_skinny_work(M, N, o->K, n_sm, GEMM_EPI_ADD_F32_NORM, 1) > work_floats ||
        cuda_gemm_skinny_work(M, N, dn->K, n_sm, GEMM_EPI_ADD_F32_NORM, 1) > work_floats)
        return (int)cudaErrorInvalidValue;
    a.nm[0] = SkNorm{p->norm_out, p->h, p->norm_mode, p->eps};
    a.nm[1] = SkNorm{p->norm_down, p->h, p->norm_mode, p->eps};
    a.work = work;
    a.bar = p->bar;
    a.n_gemm = n_gemm;
    int grid = M;
    for (int i = 0; i < n_gemm; i++) grid = max(grid, a.gm[i].ntiles * a.gm[i].splits);
    grid = min(grid, n_sm);
    return o->w8 ? skt_launch_nc<true>(a, N, grid, l) : skt_launch_nc<false>(a, N, grid, l);
}
