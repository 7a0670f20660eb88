/* gemm_skinny.cu — Y[M][N] = X[M][K] W[N][K]^T for few rows (M <= a few hundred: the batched decode step's
 * projections), bf16 in, fp32 accumulation, the epilogues of GemmParams (ops.h).
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
 *   (99 KB, two CTAs per SM: the LM head, M > 64), as does a one-wave grid with GemmParams.narrow (its CTAs then fit
 *   on an SM beside a kernel that holds ~115 KB, and load their weights while it runs). The accumulator
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
 * FP8 weights (w8, w8_scale; GemmParams in ops.h): W[n][k] = e4m3(w8[n ldw + k]) * w8_scale[k / 128][n], which the
 * MMAs take as bf16(e4m3 * scale), the values of the tiled GEMM's bf16 copies (fp8_to_bf16_k): a stage holds the
 * 64 x 64 e4m3 chunk (4 KiB, cp.async, rows of 4 16-byte pieces) and the X chunk; once the chunk has landed, each
 * thread dequantizes two 16-byte pieces with their rows' scales into a bf16 W tile (swizzled as above) that the MMAs
 * read (one tile for mma.sync; two on sm_90a, alternating, so a chunk is converted while the previous one is in the
 * tensor cores), and the bf16 loop runs on it. Same splits, order of splits and epilogues as bf16, so batch
 * invariance holds the same way. */
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
 * past N and k past K are zero-filled. GATHER: output column n reads W row g.gather[n]. */
template <bool F8, bool GATHER = false>
__device__ __forceinline__ void sk_load_w(const GemmParams &g, uint32_t sw, int n0, int c, int tid) {
    auto wrow = [&](int n) { return GATHER ? (size_t)g.gather[n] : (size_t)n; };
    if constexpr (F8) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int p = tid + 128 * i, n = n0 + (p >> 2), k = c * SK_BK + (p & 3) * 16;
            const bool ok = n < g.N && k < g.K;
            cp_async16(sw + p * 16, ok ? g.w8 + wrow(n) * g.ldw + k : g.w8, ok);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int p = tid + 128 * i, r = p >> 3, ch = p & 7, k = c * SK_BK + ch * 8, n = n0 + r;
            const bool ok = n < g.N && k < g.K;
            cp_async16(sw + swz<8>(r, ch) * 16, ok ? g.w + wrow(n) * g.ldw + k : g.w, ok);
        }
    }
}

/* The landed e4m3 piece at w8s (sk_load_w<true>'s layout) as the bf16 tile [64][64] at tile (swz<8>), each weight
 * dequantized with its row's scale, bf16(e4m3 * scale) (fp8_to_bf16_k's values, elementwise.cu): thread tid converts
 * the pieces it loaded, tid and tid + 128, of rows r = tid / 4 and r + 32, whose scales are sc[0] and sc[1]. */
__device__ __forceinline__ void sk_convert_w8(const uint8_t *w8s, uint8_t *tile, int tid, const float (&sc)[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int p = tid + 128 * i, r = p >> 2, q = p & 3;
        const uint4 w = *(const uint4 *)(w8s + p * 16);
        const uint32_t v[4] = {w.x, w.y, w.z, w.w};
        uint32_t o[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 a = e4m3x2_f32(v[j]), b = e4m3x2_f32(v[j] >> 16);
            o[2 * j] = pack_bf16(a.x * sc[i], a.y * sc[i]);
            o[2 * j + 1] = pack_bf16(b.x * sc[i], b.y * sc[i]);
        }
        *(uint4 *)(tile + swz<8>(r, 2 * q) * 16) = make_uint4(o[0], o[1], o[2], o[3]);
        *(uint4 *)(tile + swz<8>(r, 2 * q + 1) * 16) = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

/* The scales of the W rows n0 + tid / 4 and n0 + tid / 4 + 32 (sk_convert_w8's) for 64-column piece p (its 128-column
 * block p / 2); rows past N get 0 (their weights are zero-filled) */
__device__ __forceinline__ void sk_scales(const GemmParams &g, int p, int n0, int tid, float (&sc)[2]) {
    const float *b = g.w8_scale + (size_t)(p >> 1) * g.N;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int n = n0 + (tid >> 2) + 32 * i;
        sc[i] = n < g.N ? __ldg(b + n) : 0.0f;
    }
}

__device__ __forceinline__ void sk_zero(float (&a)[8][4]) {
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[t][e] = 0.0f;
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
 *   FP8: dequantize chunk c into bf16 tile c % 2 (sk_convert_w8, the scales loaded a chunk ahead), barrier;
 *   issue chunk c's wgmmas into acc (one chain, k in order); wait until only they are in flight.
 * Either width issues the same wgmmas into the same sums in the same order, so a row's result does not depend on
 * which width ran. Chunk c - 2 is complete in every warp before iteration c's
 * barrier, so the stage and the bf16 tile it read are free when they are refilled. */
template <bool F8, int KW, bool GATHER = false>
__device__ __forceinline__ void sk_main_wg(const GemmParams &g, float (&acc)[8][4], uint8_t *sm, int m0, int n0, int p0,
                                           int np Q35_TRACE_ARG) {
    constexpr int S = SK_WG_STAGES(KW), P = KW / SK_BK;
    constexpr int WP = F8 ? SK_BN * SK_BK : SK_BN * SK_BK * 2; /* a 64-column W piece in a stage */
    constexpr int XP = SK_BM * SK_BK * 2;                      /* a 64-column X piece */
    constexpr int SB = SK_STAGE_BYTES(KW, F8);
    constexpr int TP = SK_BN * SK_BK * 2; /* a 64-column piece of a bf16 W tile */
    const int tid = threadIdx.x, nch = (np + P - 1) / P;
    const uint32_t sbase = smem_addr(sm);
    auto load_w = [&](int c) {
#pragma unroll
        for (int q = 0; q < P; q++) sk_load_w<F8, GATHER>(g, sbase + (c % S) * SB + q * WP, n0, p0 + c * P + q, tid);
    };
    auto load_x = [&](int c) {
#pragma unroll
        for (int q = 0; q < P; q++) sk_load_x(g, sbase + (c % S) * SB + P * WP + q * XP, m0, p0 + c * P + q, tid);
    };

    sk_acc_fence(acc); /* its zeroing stays before every wgmma stage (without it ptxas 13.0 serialized the FP8
                        * instantiations' wgmmas: C7515) */
    /* the weights are immutable: the first chunks' W go out before the wait for the previous kernel */
#pragma unroll
    for (int c = 0; c < S - 2; c++)
        if (c < nch) load_w(c);
    pdl_begin();
    Q35_TRACE_T1_SET;
#pragma unroll
    for (int c = 0; c < S - 2; c++) {
        if (c < nch) load_x(c);
        cp_async_commit();
    }

    /* FP8: the scales of this thread's two converted rows, for chunk c (sc) and chunk c + 1 (sn), loaded a chunk ahead
     * (a 128-column chunk is one scale block, a 64-column one half of one) */
    float sc[2] = {0.0f, 0.0f}, sn[2] = {0.0f, 0.0f};
    if constexpr (F8)
        if (nch > 0) sk_scales(g, p0, n0, tid, sn);
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
            sc[0] = sn[0], sc[1] = sn[1];
            if (c + 1 < nch) sk_scales(g, p0 + (c + 1) * P, n0, tid, sn);
            uint8_t *tile = sm + S * SB + (c % 2) * P * TP;
#pragma unroll
            for (int q = 0; q < P; q++) sk_convert_w8(sm + (c % S) * SB + q * WP, tile + q * TP, tid, sc);
            sk_stage_fence(); /* the converted tile and this thread's landed cp.async, for wgmma */
            __syncthreads();
            sw = smem_addr(tile);
        }
        sk_acc_fence(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KW / 16; kk++)
            wgmma_m64n64k16(acc, wgmma_desc(sw + (kk >> 2) * TP + (kk & 3) * 32),
                            wgmma_desc(sst + P * WP + (kk >> 2) * XP + (kk & 3) * 32));
        wgmma_commit();
        wgmma_wait<1>(); /* chunk c - 1 */
    }
    wgmma_wait<0>();
    sk_acc_fence(acc);
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
template <bool F8, bool GATHER = false>
__device__ __forceinline__ void sk_main_mma(const GemmParams &g, float (&acc)[8][4], uint8_t *sm, int m0, int n0,
                                            int c0, int nch Q35_TRACE_ARG) {
    constexpr int WB = F8 ? SK_BN * SK_BK : SK_BN * SK_BK * 2, SB = SK_STAGE_BYTES(SK_BK, F8);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int mvalid = min(SK_BM, g.M - m0); /* n8 tiles past it hold zeros: skipped */
    const uint32_t sbase = smem_addr(sm), stile = sbase + SK_STAGES * SB;
#pragma unroll
    for (int st = 0; st < SK_STAGES; st++)
        if (st < nch) sk_load_w<F8, GATHER>(g, sbase + st * SB, n0, c0 + st, tid);
    pdl_begin();
    Q35_TRACE_T1_SET;
#pragma unroll
    for (int st = 0; st < SK_STAGES; st++) {
        if (st < nch) sk_load_x(g, sbase + st * SB + WB, m0, c0 + st, tid);
        cp_async_commit();
    }
    for (int c = 0; c < nch; c++) {
        cp_async_wait<SK_STAGES - 1>();
        __syncthreads();
        const int st = c % SK_STAGES;
        const uint32_t sx = sbase + st * SB + WB;
        if constexpr (F8) {
            float sc[2];
            sk_scales(g, c0 + c, n0, tid, sc);
            sk_convert_w8(sm + st * SB, sm + SK_STAGES * SB, tid, sc);
            __syncthreads();
            sk_chunk_mma(stile, sx, warp, lane, mvalid, acc);
        } else {
            sk_chunk_mma(sbase + st * SB, sx, warp, lane, mvalid, acc);
        }
        __syncthreads(); /* stage st (and the bf16 tile) is refilled next */
        if (c + SK_STAGES < nch) {
            sk_load_w<F8, GATHER>(g, sbase + st * SB, n0, c0 + c + SK_STAGES, tid);
            sk_load_x(g, sbase + st * SB + WB, m0, c0 + c + SK_STAGES, tid);
        }
        cp_async_commit();
    }
    cp_async_wait<0>();
}
#endif

/* GemmParams.gather (GEMM_EPI_F32, bf16 weights, one split): the CTA's W tiles blockIdx.y, + gridDim.y, ... below
 * *n_dyn, each as the plain kernel computes its tile (the same loads of the same W rows, the same chunks) */
template <int KW>
__device__ __forceinline__ void sk_gather_tiles(const SkArgs &a, uint8_t *sm, int m0 Q35_TRACE_ARG) {
    pdl_begin(); /* the rows and their count come from the previous kernel */
    GemmParams g = a.g;
    g.N = (int)min(*g.n_dyn, (unsigned)g.N);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int n0 = blockIdx.y * SK_BN; n0 < g.N; n0 += gridDim.y * SK_BN) {
        float acc[8][4];
        sk_zero(acc);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        sk_main_wg<false, KW, true>(g, acc, sm, m0, n0, 0, a.nchunks Q35_TRACE_PASS);
#else
        sk_main_mma<false, true>(g, acc, sm, m0, n0, 0, a.nchunks Q35_TRACE_PASS);
#endif
        const int nr = n0 + warp * 16 + (lane >> 2), mc = m0 + 2 * (lane & 3);
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = nr + (e >> 1) * 8, m = mc + 8 * t + (e & 1);
                if (n < g.N && m < g.M) sk_store1<GEMM_EPI_F32>(g, m, n, acc[t][e]);
            }
        __syncthreads(); /* every warp is done with the ring before the next tile refills it */
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
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    Q35_TRACE_T0;
    Q35_TRACE_T1_DECL;
    if constexpr (EPI == GEMM_EPI_F32 && !F8)
        if (g.gather) {
            sk_gather_tiles<KW>(a, sm, m0 Q35_TRACE_PASS);
            Q35_TRACE_END(72);
            return;
        }
    float acc[8][4];
    sk_zero(acc);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    sk_main_wg<F8, KW>(g, acc, sm, m0, n0, c0, nch Q35_TRACE_PASS);
#else
    sk_main_mma<F8>(g, acc, sm, m0, n0, c0, nch Q35_TRACE_PASS);
#endif

    /* accumulator (t, e): W row n0 + 16 warp + lane / 4 (+ 8 for e >= 2), X row m0 + 8 t + 2 (lane % 4) + e % 2 */
    const int nr = n0 + warp * 16 + (lane >> 2), mc = m0 + 2 * (lane & 3);
#pragma unroll
    for (int t = 0; t < 8; t++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = nr + (e >> 1) * 8, m = mc + 8 * t + (e & 1);
            if (n >= g.N || m >= g.M) continue;
            if constexpr (EPI < 0)
                a.work[((size_t)split * g.M + m) * g.N + n] = acc[t][e];
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
    Q35_TRACE_END(71 + EPI); /* step trace ids: 70 partial sums, 71 + the epilogue */
}

/* grid (ceil(cols / 256), M), 256 threads: y[m][col] for col < cols (N, or N / 2 for SwiGLU) from the splits in
 * order. */
template <int EPI>
__global__ void __launch_bounds__(256) gemm_skinny_reduce(const __grid_constant__ SkArgs a, int splits) {
    Q35_TRACE_T0;
    pdl_begin();
    Q35_TRACE_T1;
    const GemmParams &g = a.g;
    const int m = blockIdx.y, col = blockIdx.x * 256 + threadIdx.x;
    const size_t plane = (size_t)g.M * g.N;
    const float *w = a.work + (size_t)m * g.N;
    if constexpr (EPI == GEMM_EPI_SWIGLU_BF16) {
        if (col < g.N / 2) {
            const int gr = sk_gate_row(col, g.glu_group), ur = gr + g.glu_group;
            float gate = 0.0f, up = 0.0f;
            for (int s = 0; s < splits; s++) {
                gate += w[s * plane + gr];
                up += w[s * plane + ur];
            }
            sk_store_glu(g, m, col, gate, up);
        }
    } else if (col < g.N) {
        float v = 0.0f;
        for (int s = 0; s < splits; s++) v += w[s * plane + col];
        sk_store1<EPI>(g, m, col, v);
    }
    Q35_TRACE_END(79);
}

/* partials a thread of gemm_skinny_reduce_norm loads at once (the decode shapes take 2-9 splits) */
#define SKR_LOADS 12

/* The residual GEMMs of the decode rows (EPI_ADD_F32, N = D) with the next RMSNorm fused. One CTA per row of
 * 64 NC threads: thread (k, l) = (tid / 32, tid % 32) owns float4 slot k of lane l in rmsnorm_f32_rows_bf16_v8's
 * layout (columns 8 (l + 32 (k / 2)) + 4 (k % 2) .. + 3): it adds the splits in order, y = bf16(x + bf16(sum)) goes
 * back to x and to shared memory. Warp 0 then forms lane l's sum of squares over its slots k = 0 .. 2 NC - 1 in that
 * kernel's order and the same warp_sum, so h = norm(y) is bitwise the separate reduction followed by that norm, with
 * every partial load of the row in flight at once. grid M. */
template <int NC>
__global__ void __launch_bounds__(64 * NC)
    gemm_skinny_reduce_norm(const __grid_constant__ SkArgs a, int splits, const __grid_constant__ SkNorm nm) {
    __shared__ float4 sv[2 * NC][32];
    __shared__ float sr;
    const GemmParams &g = a.g;
    const int row = blockIdx.x, l = threadIdx.x & 31, k = threadIdx.x >> 5, n8 = g.N / 8;
    const int i = l + 32 * (k >> 1), c4 = 2 * i + (k & 1);
    Q35_TRACE_T0;
    float4 gw = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < n8) gw = __ldg((const float4 *)nm.w + c4);
    pdl_begin(); /* the next kernel may start now and stream its weights while the rows are reduced */
    Q35_TRACE_T1;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < n8) {
        float4 *x = (float4 *)((float *)g.y + (size_t)row * g.ldy);
        const size_t plane4 = (size_t)g.M * g.N / 4;
        const float4 *part = (const float4 *)(a.work + (size_t)row * g.N);
        /* the row's slot and its first SKR_LOADS partials loaded at once (one round trip), then summed in order */
        const float4 old = __ldcg(x + c4);
        float4 q[SKR_LOADS];
#pragma unroll
        for (int sp = 0; sp < SKR_LOADS; sp++)
            if (sp < splits) q[sp] = part[sp * plane4 + c4];
        float4 acc = q[0];
#pragma unroll
        for (int sp = 1; sp < SKR_LOADS; sp++)
            if (sp < splits) acc.x += q[sp].x, acc.y += q[sp].y, acc.z += q[sp].z, acc.w += q[sp].w;
        for (int sp = SKR_LOADS; sp < splits; sp++) {
            const float4 r = part[sp * plane4 + c4];
            acc.x += r.x, acc.y += r.y, acc.z += r.z, acc.w += r.w;
        }
        v = make_float4(rbf(old.x + rbf(acc.x)), rbf(old.y + rbf(acc.y)), rbf(old.z + rbf(acc.z)),
                        rbf(old.w + rbf(acc.w)));
        x[c4] = v;
    }
    sv[k][l] = v;
    __syncthreads();
    if (k == 0) {
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < 2 * NC; j++) {
            const float4 q = sv[j][l];
            ss += q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
        }
        ss = warp_sum(ss);
        if (l == 0) sr = rsqrtf(ss / (float)g.N + nm.eps);
    }
    __syncthreads();
    if (i < n8) {
        const float r = sr;
        uint2 o;
        o.x = pack_bf16(norm_apply(v.x, r, gw.x, nm.mode), norm_apply(v.y, r, gw.y, nm.mode));
        o.y = pack_bf16(norm_apply(v.z, r, gw.z, nm.mode), norm_apply(v.w, r, gw.w, nm.mode));
        ((uint2 *)(nm.h + (size_t)row * g.N))[c4] = o;
    }
    Q35_TRACE_END(78);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_skinny)

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
    cudaError_t e = cudaFuncSetAttribute(gemm_skinny_k<EPI, F8, KW>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_skinny_k<EPI, F8, KW>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return -(int)e;
    bytes = b;
    return bytes;
}

/* gemm_skinny_k<EPI, F8> on `grid`: 128-column chunks where the sm_90a loop runs, the grid is one wave at one CTA per
 * SM and GemmParams.narrow is 0, else 64 (sk_main_wg). */
template <int EPI, bool F8>
static int sk_launch_k(const SkArgs &a, dim3 grid, int n_sm, const CudaLaunch *l) {
    const bool wide = sk_wg() == 1 && (long)grid.x * grid.y * grid.z <= n_sm && !a.g.narrow;
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
    if (g->gather) { /* the plan of N must be one split; a grid of at most two CTAs per SM walks the tiles */
        if (!g->n_dyn || g->epi != GEMM_EPI_F32 || g->w8 || splits != 1 || g->split_m)
            return (int)cudaErrorInvalidValue;
        const int tiles = (g->N + SK_BN - 1) / SK_BN, gy = tiles < 2 * n_sm ? tiles : 2 * n_sm;
        return sk_launch_k<GEMM_EPI_F32, false>(a, dim3((unsigned)((g->M + SK_BM - 1) / SK_BM), (unsigned)gy, 1), n_sm,
                                                l);
    }
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
    if (g->N <= 512) return launch_ex(gemm_skinny_reduce_norm<2>, rg, dim3(128), 0, 0, l, a, splits, nm);
    if (g->N <= 1024) return launch_ex(gemm_skinny_reduce_norm<4>, rg, dim3(256), 0, 0, l, a, splits, nm);
    return launch_ex(gemm_skinny_reduce_norm<8>, rg, dim3(512), 0, 0, l, a, splits, nm);
}
