/* mlp.cu — the fused MLP of one token (ops.h cuda_mlp_fused): residual add + RMSNorm,
 * gate/up GEMV with the SwiGLU epilogue and the down projection in ONE kernel, so the decode step
 * has one kernel boundary less per layer (the decode step's default MLP; deterministic mode keeps the two GEMVs).
 *
 * Block b of G owns the intermediate units [i0, i1) = [b F / G, (b+1) F / G) (27-28 for the 0.8B,
 * F = 3584 on 132 SMs). Weight bytes per block (0.8B): gate/up 2 x 28 x 1024 x 2 = 112 KiB streamed
 * through registers, W_dT 28 x 1024 x 2 = 56 KiB by TMA bulk copies into shared memory.
 *   1. before pdl_wait (weights are immutable, PDL contract in common.cuh): every warp loads the
 *      first 4 gate/up rows it owns (rows 2 i0 + 4 pi .. +3, i.e. units i0 + 2 pi, +1; lane l reads
 *      columns u*256 + 8l, u < 4: the GEMV's U = 4 layout), and thread 0 has the TMA copy its W_dT rows
 *      (contiguous: rows i0 .. i1-1 of the [F][D] matrix) into shared memory (mlp_bulk_load);
 *   2. pdl_wait, the GEMV's RESIDUAL prologue into xs[D] (stage_norm_row; block 0 writes x_out);
 *   3. each warp reduces its 4 row sums exactly as gemv.cu's emit() and writes
 *      a = bf16(bf16(silu(bf16 g)) bf16 u) for its 2 units into shared memory (same per-lane
 *      summation order as the GEMV for D <= 1024, so a is bitwise the gate_up GEMV's output);
 *   4. after the barrier and the bulk copy's wait, thread t sums columns d = 2t, 2t+1 of
 *      sum_i a_i W_dT[i][d] over the block's units in ascending order (fp32 fmaf, 4-byte shared
 *      loads: conflict-free; the a_i 4 at a time, one broadcast load), and even lanes add their own and
 *      their odd neighbour's 2 columns with
 *      one red.global.add.v4.f32: G x D / 4 vector atomics per layer (33792 for the 0.8B).
 *
 * FP8 weights (ops.h MlpFusedParams w8_gu / s_gu / w8_dT / s_dT; template argument F8): e4m3 bytes with one fp32 scale
 * per row and 128-column block (ops.h FP8_SCALES_DOC), half the weight bytes of bf16 (0.8B: 56 KiB gate/up, 28 KiB
 * W_dT per block).
 *   gate/up: the FP8 GEMV's layout (gemv.cu, WF = MV_FP8, U 4 x 512 threads, splits 1): lane l reads columns
 *     k = u*512 + 16l, u < 2 (D <= 1024: the GEMV's steps u >= 2 lie beyond D and add nothing), one 16-byte load per
 *     row, and per step acc_r = fmaf(dot16_e4m3(w, x[k .. k+15]), s_gu[k/128][row r], acc_r) (the 16-product chain
 *     from 0 in column order, then times the row's block scale); the same warp_sum_rows4 tree. A warp group's rows
 *     2 i0 + 4 pi .. +3 start at an even row, not always at a multiple of 4, so the scales come as two 8-byte loads
 *     (one per unit: its gate and up row) where the GEMV makes one 16-byte load; the values are the same, so g_i, u_i
 *     and a_i are bitwise the FP8 gate_up GEMV's.
 *   down: the block's W_dT rows (nu x D bytes) and the scale rows of the 128-unit blocks they touch (s_dT rows
 *     i0/128 .. (i1-1)/128, D fp32 each: fp8_scale_ld(D) = D) by the same bulk copies. Thread t owns columns d = 2t,
 *     2t+1 (2-byte shared loads, e4m3x2_f32) and, in fp32, for column d:
 *       for each 128-unit block m touched, in ascending order:  c = 0;  c = fmaf(a_i, e4m3(w8_dT[i][d]), c) for the
 *         block's units i of block m, ascending;  y_d = fmaf(c, s_dT[m D + d], y_d)     (y_d from 0)
 *     then the same red.global.add.v4.f32 of y_d into y. a_i (bf16) times an e4m3 value (4 significant bits) is exact
 *     in fp32 (above its subnormal range), so the chain's adds and one multiply-add per scale block carry the
 *     roundings, as in the GEMV; one multiply per scale block and column instead of one per weight. */
#include "cuda/common.cuh"
#include "cuda/async.cuh"

#define MLP_THREADS 512
#define MLP_U       4 /* bf16: 256-column steps per lane: D <= 1024 */
#define MLP_U8      2 /* FP8: 512-column steps per lane (16 e4m3 per 16-byte load): D <= 1024 */
#define MLP_R       4 /* gate/up rows per warp group (2 units) */

/* sm_90+: the W_dT rows by TMA bulk copies; the compute_80 PTX (other GPUs) keeps per-thread cp.async. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MLP_TMA false
#else
#define MLP_TMA true
#endif
#if MLP_TMA
/* The block's mbarrier for mlp_bulk_load. */
static __device__ __forceinline__ unsigned mlp_bar() {
    __shared__ __align__(8) unsigned long long bar;
    return (unsigned)__cvta_generic_to_shared(&bar);
}
#endif
/* Thread 0 only: `bytes` (a multiple of 16, both ends 16-byte aligned) from src into shared memory at dst, and as many
 * from src2 to dst2 (FP8: the W_dT rows' scales; bytes2 = 0: none), by TMA bulk copies of <= 16 KiB, completing as
 * transaction bytes on mlp_bar(). One instruction per piece, where cp.async takes one per 16 bytes and thread and its
 * issue stalls once the SM has loads outstanding: with the 56 KiB in front of them by cp.async, the gate/up register
 * loads went out ~0.6 us late. */
static __device__ __forceinline__ void mlp_bulk_load(void *dst, const void *src, unsigned bytes, void *dst2 = nullptr,
                                                     const void *src2 = nullptr, unsigned bytes2 = 0) {
#if MLP_TMA
    const unsigned bar = mlp_bar(), da = (unsigned)__cvta_generic_to_shared(dst);
    const unsigned char *s = reinterpret_cast<const unsigned char *>(src);
    mbar_init(bar, 1);
    mbar_init_fence();
    mbar_arrive_expect_tx(bar, bytes + bytes2);
    for (unsigned o = 0; o < bytes; o += 16384) bulk_g2s(da + o, s + o, bytes - o < 16384 ? bytes - o : 16384u, bar);
    if (bytes2) {
        const unsigned da2 = (unsigned)__cvta_generic_to_shared(dst2);
        const unsigned char *s2 = reinterpret_cast<const unsigned char *>(src2);
        for (unsigned o = 0; o < bytes2; o += 16384)
            bulk_g2s(da2 + o, s2 + o, bytes2 - o < 16384 ? bytes2 - o : 16384u, bar);
    }
#else
    (void)dst, (void)src, (void)bytes, (void)dst2, (void)src2, (void)bytes2;
#endif
}
/* Every thread: waits until mlp_bulk_load's bytes have landed (a __syncthreads lies between the two). */
static __device__ __forceinline__ void mlp_bulk_wait() {
#if MLP_TMA
    mbar_wait(mlp_bar(), 0);
#endif
}

/* Shared memory: xs [D] fp32 | act [round4(nu_max)] fp32 | wd [nu_max][D] bf16, or e4m3 bytes (16-byte aligned) |
 * FP8 only: sd [mlp_nsb_max(nu_max)][D] fp32, the scale rows of the 128-unit blocks the block's units touch. */
static __host__ __device__ inline int mlp_nu_max(int F, int G) { return (F + G - 1) / G; }
static __host__ __device__ inline size_t mlp_act_off(int D) { return (size_t)D * 4; }
static __host__ __device__ inline size_t mlp_wd_off(int D, int nu_max) {
    return mlp_act_off(D) + (size_t)((nu_max + 3) & ~3) * 4;
}
/* 128-unit blocks that n consecutive units touch at most: ceil((n - 1) / 128) + 1 */
static __host__ __device__ inline int mlp_nsb_max(int n) { return (n + 126) / 128 + 1; }
static __host__ __device__ inline size_t mlp_sd_off(int D, int nu_max) { /* D % 16 == 0: 16-byte aligned */
    return mlp_wd_off(D, nu_max) + (size_t)nu_max * D;
}
static __host__ __device__ inline size_t mlp_end(int D, int nu_max, bool f8) {
    return f8 ? mlp_sd_off(D, nu_max) + (size_t)mlp_nsb_max(nu_max) * D * 4
              : mlp_wd_off(D, nu_max) + (size_t)nu_max * D * 2;
}

/* F8: e4m3 weights with per-row block scales (the header's FP8 part), else bf16. */
template <bool F8>
__global__ void __launch_bounds__(MLP_THREADS, 1) mlp_fused(const __grid_constant__ MlpFusedParams p) {
    constexpr int NT = MLP_THREADS;
    constexpr int NW = NT / 32;
    constexpr int U = F8 ? MLP_U8 : MLP_U; /* load steps per lane */
    constexpr int CPL = F8 ? 16 : 8;       /* columns per lane and 16-byte load */
    constexpr int KSTEP = 32 * CPL;        /* columns per warp and step */
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float red[32];
    const int D = p.D, F = p.F, G = gridDim.x, b = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int i0 = (int)((long long)b * F / G), i1 = (int)((long long)(b + 1) * F / G), nu = i1 - i0;
    const int nu_max = mlp_nu_max(F, G);
    float *xs = reinterpret_cast<float *>(smem);
    float *act = reinterpret_cast<float *>(smem + mlp_act_off(D));
    uint16_t *wd = reinterpret_cast<uint16_t *>(smem + mlp_wd_off(D, nu_max));
    /* FP8: the 128-unit scale blocks sb0 .. sb0 + nsb - 1 of units i0 .. i1-1 (nu >= 1: G <= F) */
    const int sb0 = i0 / 128, nsb = (i1 - 1) / 128 - sb0 + 1;
    float *sd = reinterpret_cast<float *>(smem + mlp_sd_off(D, nu_max));
    Q35_TRACE_T0;
    if (p.early_trigger) pdl_trigger();
    /* the norm weights (immutable) into registers before everything else (NT = 512: D <= 2 NT): loaded after the
     * wait they would cost the chain an L2 round trip behind the SM's weight stream */
    float nwr[2];
#pragma unroll
    for (int e = 0; e < 2; e++) nwr[e] = threadIdx.x + e * NT < D ? p.norm_w[threadIdx.x + e * NT] : 0.0f;

    /* the block's W_dT rows: one contiguous range of nu * D weights -> shared memory; FP8: and their scale rows
     * sb0 .. sb0 + nsb - 1 of s_dT (contiguous, D each) */
    if constexpr (F8) {
        if (MLP_TMA && threadIdx.x == 0)
            mlp_bulk_load(wd, p.w8_dT + (size_t)i0 * D, (unsigned)(nu * D), sd, p.s_dT + (size_t)sb0 * D,
                          (unsigned)(nsb * D * 4));
        if (!MLP_TMA) {
            const uint4 *src = reinterpret_cast<const uint4 *>(p.w8_dT + (size_t)i0 * D);
            const uint4 *ssrc = reinterpret_cast<const uint4 *>(p.s_dT + (size_t)sb0 * D);
            uint4 *dst = reinterpret_cast<uint4 *>(wd), *sdst = reinterpret_cast<uint4 *>(sd);
            const int n16 = nu * (D / 16), s16 = nsb * (D / 4);
            for (int c = threadIdx.x; c < n16; c += NT) cp_async16(dst + c, src + c);
            for (int c = threadIdx.x; c < s16; c += NT) cp_async16(sdst + c, ssrc + c);
            cp_async_commit();
        }
    } else {
        if (MLP_TMA && threadIdx.x == 0) mlp_bulk_load(wd, p.w_dT + (size_t)i0 * D, (unsigned)(nu * D * 2));
        if (!MLP_TMA) {
            const uint4 *src = reinterpret_cast<const uint4 *>(p.w_dT + (size_t)i0 * D);
            uint4 *dst = reinterpret_cast<uint4 *>(wd);
            const int n16 = nu * (D / 8);
            for (int c = threadIdx.x; c < n16; c += NT) cp_async16(dst + c, src + c);
            cp_async_commit();
        }
    }
    /* gate/up rows of pair pi (units i0 + 2 pi, +1): rows 2 i0 + 4 pi + r; rows of units >= i1 and
     * columns >= D read as zero */
    const int npairs = (nu + 1) / 2;
    const int sld = (2 * F + 3) & ~3; /* FP8: s_gu's row count, fp8_scale_ld(2F) */
    uint4 w[U][MLP_R];
    float2 sc[U][2]; /* FP8: (gate, up) scales of the pair's 2 units at the 128-column block of the lane's step u */
    auto load = [&](int pi) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = u * KSTEP + lane * CPL;
            if constexpr (F8) {
#pragma unroll
                for (int h = 0; h < 2; h++) { /* rows 2 unit, 2 unit + 1: 8-byte aligned (sld even) */
                    const int unit = i0 + 2 * pi + h;
                    sc[u][h] = unit < i1 && k < D ? __ldg(reinterpret_cast<const float2 *>(
                                                        p.s_gu + (size_t)(k / 128) * sld + 2 * (size_t)unit))
                                                  : make_float2(0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int r = 0; r < MLP_R; r++) {
                const int unit = i0 + 2 * pi + (r >> 1);
                const size_t row = 2 * (size_t)i0 + 4 * (size_t)pi + r;
                if (unit < i1 && k < D) {
                    if constexpr (F8)
                        w[u][r] = ld_stream(reinterpret_cast<const uint4 *>(p.w8_gu + row * D + k));
                    else
                        w[u][r] = ld_stream(reinterpret_cast<const uint4 *>(p.w_gu + row * D + k));
                } else {
                    w[u][r] = make_uint4(0u, 0u, 0u, 0u);
                }
            }
        }
    };
    int pi = warp;
    if (pi < npairs) load(pi);

    pdl_wait();
    Q35_TRACE_T1_AT(0);
    /* the x loads of both elements before the first store */
    stage_norm_row_wr<2, true>(xs, red, D, NULL, p.x, p.parts, p.n_parts, b == 0 ? p.x_out : NULL, nwr, p.norm_mode,
                               p.eps);
    __syncthreads();
    Q35_TRACE_PROBE(1);
    if (b == 0 && p.h_out)
        for (int i = threadIdx.x; i < D; i += NT) p.h_out[i] = xs[i];
    if (!p.early_trigger) pdl_trigger();
    Q35_TRACE_PROBE(2);

    /* gate/up: 4 row sums per warp group -> act of 2 units (gemv.cu emit(), MV_OUT_SILU_MUL) */
    for (bool first = true; pi < npairs; pi += NW, first = false) {
        if (!first) load(pi);
        float acc[MLP_R];
#pragma unroll
        for (int r = 0; r < MLP_R; r++) acc[r] = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = u * KSTEP + lane * CPL;
            if (k < D) {
                const float4 *xp = reinterpret_cast<const float4 *>(xs + k);
                if constexpr (F8) { /* gemv.cu's FP8 step: 16-product chain, times the row's block scale */
                    const float4 a4 = xp[0], b4 = xp[1], c4 = xp[2], d4 = xp[3];
                    const float xv[16] = {a4.x, a4.y, a4.z, a4.w, b4.x, b4.y, b4.z, b4.w,
                                          c4.x, c4.y, c4.z, c4.w, d4.x, d4.y, d4.z, d4.w};
                    const float s4[MLP_R] = {sc[u][0].x, sc[u][0].y, sc[u][1].x, sc[u][1].y};
#pragma unroll
                    for (int r = 0; r < MLP_R; r++) acc[r] = fmaf(dot16_e4m3(w[u][r], xv), s4[r], acc[r]);
                } else {
                    const float4 a4 = xp[0], b4 = xp[1];
                    const float xv[8] = {a4.x, a4.y, a4.z, a4.w, b4.x, b4.y, b4.z, b4.w};
#pragma unroll
                    for (int r = 0; r < MLP_R; r++) {
                        acc[r] = dot8(w[u][r], xv, acc[r]);
                    }
                }
            }
        }
        const float s = warp_sum_rows4(acc, lane); /* lanes 8j..8j+7 hold the sum of row j */
        const float up = __shfl_down_sync(0xffffffffu, s, 8);
        const int j = 2 * pi + (lane >> 4); /* lanes 0 and 16: (gate, up) of local unit j */
        if ((lane & 15) == 0 && j < nu) act[j] = rbf(rbf(silu_f(rbf(s))) * rbf(up));
    }
    cp_async_wait<0>();
    if (MLP_TMA) mlp_bulk_wait();
    __syncthreads();
    Q35_TRACE_PROBE(3);
    if (p.act_out)
        for (int j = threadIdx.x; j < nu; j += NT) p.act_out[i0 + j] = act[j];

            /* down: columns d, d+1 of sum_j act[j] W_dT[i0 + j][.] (ascending j) */
#pragma unroll
    for (int ps = 0; ps < 256 * MLP_U / (2 * NT); ps++) { /* one pass when NT = 512 (D <= 1024) */
        const int d = ps * 2 * NT + 2 * threadIdx.x;
        float y0 = 0.0f, y1 = 0.0f;
        if constexpr (F8) {
            if (d < D) { /* per 128-unit scale block m: a chain over its units, then times the columns' scales */
                const unsigned char *wp = reinterpret_cast<const unsigned char *>(wd) + d;
                for (int m = 0; m < nsb; m++) {
                    const int jb = max(i0, (sb0 + m) * 128) - i0, je = min(i1, (sb0 + m + 1) * 128) - i0;
                    float c0 = 0.0f, c1 = 0.0f;
                    /* columns d, d+1 of unit jj: one 2-byte load */
                    auto step = [&](float a, int jj) {
                        const float2 wv = e4m3x2_f32(*reinterpret_cast<const uint16_t *>(wp + (size_t)jj * D));
                        c0 = fmaf(a, wv.x, c0);
                        c1 = fmaf(a, wv.y, c1);
                    };
                    int j = jb;
                    for (; j < je && (j & 3); j++) step(act[j], j);
                    for (; j + 4 <= je; j += 4) { /* 4 units' act in one 16-byte broadcast load */
                        const float4 a4 = *reinterpret_cast<const float4 *>(act + j);
                        step(a4.x, j);
                        step(a4.y, j + 1);
                        step(a4.z, j + 2);
                        step(a4.w, j + 3);
                    }
                    for (; j < je; j++) step(act[j], j);
                    const float2 s2 = *reinterpret_cast<const float2 *>(sd + (size_t)m * D + d);
                    y0 = fmaf(c0, s2.x, y0);
                    y1 = fmaf(c1, s2.y, y1);
                }
            }
        } else if (d < D) {
            const uint32_t *wp = reinterpret_cast<const uint32_t *>(wd + d);
            const int ws = D / 2; /* words per W_dT row */
            int j = 0;
            for (; j + 4 <= nu; j += 4) { /* 4 units' act in one 16-byte broadcast load (act is 16-byte aligned) */
                const float4 a4 = *reinterpret_cast<const float4 *>(act + j);
                const uint32_t w0 = wp[j * ws], w1 = wp[(j + 1) * ws], w2 = wp[(j + 2) * ws], w3 = wp[(j + 3) * ws];
                y0 = fmaf(a4.x, bf_lo(w0), y0);
                y1 = fmaf(a4.x, bf_hi(w0), y1);
                y0 = fmaf(a4.y, bf_lo(w1), y0);
                y1 = fmaf(a4.y, bf_hi(w1), y1);
                y0 = fmaf(a4.z, bf_lo(w2), y0);
                y1 = fmaf(a4.z, bf_hi(w2), y1);
                y0 = fmaf(a4.w, bf_lo(w3), y0);
                y1 = fmaf(a4.w, bf_hi(w3), y1);
            }
            for (; j < nu; j++) {
                const float a = act[j];
                const uint32_t wv = wp[j * ws];
                y0 = fmaf(a, bf_lo(wv), y0);
                y1 = fmaf(a, bf_hi(wv), y1);
            }
        }
        const float z0 = __shfl_down_sync(0xffffffffu, y0, 1), z1 = __shfl_down_sync(0xffffffffu, y1, 1);
        if (d < D && !(lane & 1)) red_add4(p.y + d, y0, y1, z0, z1); /* D % 4 == 0: d + 3 < D */
    }
    Q35_TRACE_END(40);
}

extern "C" int cuda_mlp_fused_blocks(int F, int n_sm) {
    int g = F / 2 < n_sm ? F / 2 : n_sm;
    return g > 0 ? g : 1;
}

static size_t mlp_smem(int D, int F, int blocks, bool f8) {
    if (D <= 0 || F <= 0 || blocks <= 0) return 0;
    return mlp_end(D, mlp_nu_max(F, blocks), f8);
}

extern "C" size_t cuda_mlp_fused_smem_bytes(int D, int F, int blocks) { return mlp_smem(D, F, blocks, false); }
extern "C" size_t cuda_mlp_fused_smem_bytes_fp8(int D, int F, int blocks) { return mlp_smem(D, F, blocks, true); }

static int smem_optin(size_t *bytes) {
    int dev = 0, v = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return (int)e;
    *bytes = (size_t)v;
    return 0;
}

/* FP8: 16 e4m3 columns per lane and load */
static int shape_ok(int D, int F, bool f8) { return D >= 8 && D <= 256 * MLP_U && D % (f8 ? 16 : 8) == 0 && F >= 1; }

static int mlp_supported(int D, int F, int n_sm, bool f8) {
    size_t lim = 0;
    if (!shape_ok(D, F, f8) || smem_optin(&lim)) return 0;
    /* + the static red[32] and a margin for what the runtime reserves */
    return mlp_smem(D, F, cuda_mlp_fused_blocks(F, n_sm), f8) + 1024 <= lim;
}
extern "C" int cuda_mlp_fused_supported(int D, int F, int n_sm) { return mlp_supported(D, F, n_sm, false); }
extern "C" int cuda_mlp_fused_supported_fp8(int D, int F, int n_sm) { return mlp_supported(D, F, n_sm, true); }

extern "C" int cuda_mlp_fused(const MlpFusedParams *p, const CudaLaunch *l) {
    /* FP8 when any FP8 pointer is set: then all four and no bf16 weight; bf16: both weights and no FP8 pointer */
    const bool f8 = p->w8_gu || p->s_gu || p->w8_dT || p->s_dT;
    const bool w_ok = f8 ? p->w8_gu && p->s_gu && p->w8_dT && p->s_dT && !p->w_gu && !p->w_dT &&
                               !((uintptr_t)p->w8_gu % 16) && !((uintptr_t)p->s_gu % 16) &&
                               !((uintptr_t)p->w8_dT % 16) && !((uintptr_t)p->s_dT % 16)
                         : p->w_gu && p->w_dT && !((uintptr_t)p->w_gu % 16) && !((uintptr_t)p->w_dT % 16);
    if (!w_ok || !p->x || !p->norm_w || !p->y || !shape_ok(p->D, p->F, f8) || (p->parts && p->n_parts < 1) ||
        (p->x_out && p->x_out == p->x) || (p->norm_mode != NORM_ZC && p->norm_mode != NORM_PLAIN) ||
        (uintptr_t)p->y % 16 || p->blocks < 0 || p->blocks > p->F)
        return (int)cudaErrorInvalidValue;
    int G = p->blocks;
    if (G == 0) {
        int dev = 0, n_sm = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return (int)e;
        G = cuda_mlp_fused_blocks(p->F, n_sm);
    }
    size_t lim = 0;
    int rc = smem_optin(&lim);
    if (rc) return rc;
    const size_t smem = mlp_smem(p->D, p->F, G, f8);
    if (smem + sizeof(float) * 32 > lim) return (int)cudaErrorInvalidValue;
    void (*kern)(MlpFusedParams) = f8 ? mlp_fused<true> : mlp_fused<false>;
    if (smem > 40 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
    }
    return launch_kernel(kern, dim3((unsigned)G), dim3(MLP_THREADS), smem, l, *p);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_mlp)
