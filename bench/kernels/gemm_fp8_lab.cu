/* gemm_fp8_lab.cu — FP8 (W8A8) prefill GEMM lab, sm_90a: is an e4m3 wgmma GEMM with per-row, per-128-column-block
 * scales on both operands (the official FP8 checkpoints' weights, activations quantized per token and 128-column
 * group on the fly, DeepSeek-V3's scheme) faster than the bf16 TMA GEMM of src/cuda/gemm_tma.cu on the Qwen3.5-0.8B
 * prefill shapes? Measured: no (docs/EXPERIMENTS.md, docs/FP8.md §8), so it is a lab and the prefill keeps reading
 * bf16 copies of FP8 weights.
 *
 * What is here:
 *   - quant_rows: bf16 [M][K] -> e4m3 codes + one fp32 scale per row and 128-column group, s = amax / 448,
 *     q = e4m3(x * (448 / amax)) (an all-zero group: s = 1); one half-warp per (row, group), 16-byte loads;
 *   - gemm_fp8_tma: Y = X W^T, X [M][K] and W [N][K] e4m3, scales [ceil(K/128)][(rows + 3) & ~3] for each (the
 *     engine's FP8_SCALES_DOC layout), gemm_tma.cu's cooperative structure (a producer thread filling a 6-slot TMA
 *     ring, two consumer warpgroups of 64 rows on a 128 x 128 tile); a k-step is 128 K values (one scale block, one
 *     128-byte swizzle row) whose scales come into the slot by two bulk copies; each consumer runs four m64n128k32
 *     e4m3 wgmmas into a fresh partial, waits, and adds partial * sx[row] * sw[col] into fp32 (the FP8 tensor core
 *     accumulates with fewer bits than fp32: promoted every 128 K); gemm.cuh's staged epilogues;
 *   - timing bounds of that kernel (gemm_fp8_tma MODE 2-4): without the promotion (scales ignored), without the
 *     stores as well, and with the stores overlapped with the next tile by the producer warpgroup's idle warps
 *     (checked bit for bit against the bound's output);
 *   - the scaled kernel with those overlapped stores (MODE 5), and that with the scales in a ring of their own so that
 *     a k-step's X / W slot is freed before its promotion (MODE 6), both checked like modes 0 and 1 (and on the CPU:
 *     tests/emu/run_gemm_fp8.sh);
 *   - peak: back-to-back wgmmas on shared-memory operands, no loads, 2 warpgroups per SM: m64n128k32 / m64n256k32
 *     e4m3 against m64n128k16 / m64n256k16 bf16, the tensor rate each shape can reach.
 *
 *   build: make build/bench/gemm_fp8_lab
 *   run:   build/bench/gemm_fp8_lab [--seed N]
 * Checks (exit 1 on a failure): quantization bit for bit against the host reference (magnitudes over 2^-30..2^30,
 * all-zero groups, e4m3 rounding ties, a narrower last group, the row gap untouched); the GEMM against a double
 * product of the dequantized operands, every epilogue, ragged M, N, K, NaN-poisoned outputs and guard rows
 * (tolerance 2^-10 of the sum of |products| for the tensor core's FP8 accumulation, measured up to ~5e-4). Then the
 * timing table (median of 20 event-timed launches) and the peak rates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "lab.cuh"
#include "cuda/async.cuh"
#include "cuda/gemm.cuh"

/* ---- e4m3 ------------------------------------------------------------------------------------------ */

/* fp32 -> e4m3 code: nearest even, finite values past 448 saturate, NaN -> 0x7f (util.c f32_to_fp8_e4m3). */
__host__ __device__ inline uint32_t e4m3_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;
    if (a >= 0x43e00000u) return sign | 0x7eu;
    const int e = (int)(a >> 23) - 127 + 7;
    if (e < -10) return sign;
    const uint32_t man = (a & 0x7fffffu) | 0x800000u, shift = e >= 1 ? 20u : (uint32_t)(21 - e);
    const uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
    uint32_t r = e >= 1 ? ((uint32_t)e << 3 | ((man >> 20) & 7u)) : man >> shift;
    if (rest > half || (rest == half && (r & 1u))) r++;
    return sign | r;
}
static double e4m3_val(uint8_t v) {
    const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    const double x = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -x : x;
}
/* Two fp32 values as e4m3 codes (a in the low byte): one cvt.rn.satfinite.e4m3x2.f32, e4m3_of's rounding. */
__device__ __forceinline__ uint32_t f32x2_e4m3x2(float a, float b) {
    unsigned short h;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(b), "f"(a)); /* first source -> high byte */
    return h;
}

/* d (+)= A (64 x 32 e4m3) B (32 x N e4m3), both K-major smem descriptors (the only layout wgmma takes for 8-bit
 * types), 128-byte swizzle: the kk-th 32-wide K slice starts 32 kk bytes into a row. acc = 0: d = A B. */
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (*d)[4], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1;\n}\n"
                 : WGMMA_D_N128
                 : "l"(da), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wgmma_m64n256k32_e4m3(float (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1;\n}\n"
                 : WGMMA_D_N256
                 : "l"(da), "l"(db), "r"(1));
}

struct QuantArgs {
    const uint16_t *x; /* bf16 [M][ldx] */
    uint8_t *q;        /* [M][ldq] */
    float *scale;      /* [ceil(K/128)][(M + 3) & ~3] */
    int M, K, ldx, ldq;
};

/* ---- activation quantization -------------------------------------------------------------------- */

__global__ void __launch_bounds__(256) fp8_quant_rows_k(const __grid_constant__ QuantArgs p) {
    pdl_begin();
    const int groups = (p.K + 127) / 128, l16 = threadIdx.x & 15;
    const int64_t hw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 4; /* half-warp: one (row, group) */
    const bool live = hw < (int64_t)p.M * groups;
    const int m = live ? (int)(hw / groups) : 0, g = live ? (int)(hw % groups) : 0, c = g * 128 + 8 * l16;
    const bool on = live && c < p.K; /* K % 8 == 0: a lane's 8 columns are all in or all out */
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (on) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(p.x + (size_t)m * p.ldx + c);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 4; j++) v[2 * j] = bf_lo(w[j]), v[2 * j + 1] = bf_hi(w[j]);
    }
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const bool z = !(amax > 0.0f);
    const float s = z ? 1.0f : __fdiv_rn(amax, 448.0f), inv = z ? 1.0f : __fdiv_rn(448.0f, amax);
    if (on) {
        uint32_t q[2];
#pragma unroll
        for (int j = 0; j < 2; j++)
            q[j] = f32x2_e4m3x2(v[4 * j] * inv, v[4 * j + 1] * inv) |
                   f32x2_e4m3x2(v[4 * j + 2] * inv, v[4 * j + 3] * inv) << 16;
        *reinterpret_cast<uint2 *>(p.q + (size_t)m * p.ldq + c) = make_uint2(q[0], q[1]);
    }
    if (live && l16 == 0) p.scale[(size_t)g * ((p.M + 3) & ~3) + m] = s;
}

static int quant_rows(const QuantArgs *p, const CudaLaunch *l) {
    if (!p->x || !p->q || !p->scale || p->M < 1 || p->K < 8 || p->K % 8 || p->ldx < p->K || p->ldx % 8 ||
        p->ldq < p->K || p->ldq % 16 || ((uintptr_t)p->x & 15) || ((uintptr_t)p->q & 15))
        return (int)cudaErrorInvalidValue;
    const int64_t halves = (int64_t)p->M * ((p->K + 127) / 128);
    return launch_kernel(fp8_quant_rows_k, dim3((unsigned)((halves + 15) / 16)), dim3(256), 0, l, *p);
}

/* ---- GEMM ------------------------------------------------------------------------------------------- */

#define F8_TM     128 /* tile rows (X) */
#define F8_BN     128 /* tile columns (W rows) */
#define F8_BK     128 /* K values per k-step: one scale block, one 128-byte swizzle row */
#define F8_STAGES 6

struct F8Cfg {
    static constexpr int A_BYTES = F8_TM * F8_BK, B_BYTES = F8_BN * F8_BK;
    static constexpr int SX_OFF = A_BYTES + B_BYTES, SW_OFF = SX_OFF + 4 * F8_TM; /* the k-step's scales */
    static constexpr int STAGE = SW_OFF + 4 * F8_BN;
    static constexpr int STAGE_OFF = F8_STAGES * STAGE + 2 * F8_STAGES * 8; /* epilogue staging after ring + bars */
    static constexpr int SMEM = 1024 + STAGE_OFF + 8 * GEMM_STAGE_FLOATS * 4;
    static_assert(STAGE % 1024 == 0 && A_BYTES % 1024 == 0, "stages keep 1024-byte alignment");
    static_assert(SMEM <= 227 * 1024, "shared memory");
};

struct F8Args {
    CUtensorMap ta, tb;   /* X8 (box 128 x F8_TM), W8 (box 128 x F8_BN) */
    GemmParams p;         /* shape, output, epilogue (x, w unused) */
    const float *sx, *sw; /* scales [ceil(K/128)][(M + 3) & ~3], [ceil(K/128)][(N + 3) & ~3] */
};

/* Consumer side of ring use `it` (NS slots): waits for its slot, then issues the k-step's four m64n128k32 wgmmas of
 * this warpgroup's 64 rows into p as one commit group: p = A B (the first with scale-d = 0), or p += A B with
 * accumulate (the timing bounds, MODE >= 2 below). */
template <int NS = F8_STAGES, int STG = F8Cfg::STAGE>
__device__ __forceinline__ void f8_issue(float (&p)[1][F8_BN / 8][4], uint32_t sbase, int it, int cw, uint32_t full0,
                                         int accumulate = 0) {
    const int s = it % NS;
    mbar_wait(full0 + 8 * s, (uint32_t)(it / NS) & 1u);
    __syncwarp(); /* wgmma.*.sync.aligned need the warp converged after the per-thread spin */
    const uint32_t sA = sbase + s * STG + (uint32_t)cw * 64u * 128u, sB = sbase + s * STG + F8Cfg::A_BYTES;
    reg_fence_acc(p);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < F8_BK / 32; kk++)
        wgmma_m64n128k32_e4m3(p[0], wgmma_desc(sA + kk * 32), wgmma_desc(sB + kk * 32), kk | accumulate);
    wgmma_commit();
}

/* acc += p * sx[row] * sw[col] with a k-step's scales sx [F8_TM], sw [F8_BN] in shared memory (this thread's rows
 * rr, rr + 8 of the tile, columns 8 n8 + 2t, + 1), then the scales' slot goes back to the producer (one arrival per
 * warp on bar). p's wgmmas must be complete. */
__device__ __forceinline__ void f8_promote(float (&acc)[F8_BN / 8][4], const float (&p)[1][F8_BN / 8][4],
                                           const float *sx, const float *sw, int rr, int t, int lane, uint32_t bar,
                                           bool live = true) {
    const float x0 = sx[rr], x1 = sx[rr + 8];
#pragma unroll
    for (int n8 = 0; n8 < F8_BN / 8 && live; n8++) {
        const float2 w = *reinterpret_cast<const float2 *>(sw + 8 * n8 + 2 * t);
        acc[n8][0] = fmaf(p[0][n8][0], x0 * w.x, acc[n8][0]);
        acc[n8][1] = fmaf(p[0][n8][1], x0 * w.y, acc[n8][1]);
        acc[n8][2] = fmaf(p[0][n8][2], x1 * w.x, acc[n8][2]);
        acc[n8][3] = fmaf(p[0][n8][3], x1 * w.y, acc[n8][3]);
    }
    __syncwarp(); /* every lane has read the slot's scales */
    if (lane == 0) mbar_arrive(bar);
}

#define F8_SLD                                                                                                         \
    272 /* bytes per staged bf16 row (modes 4, 5): 256 + 16, so the 8 rows of a quad group hit 8 bank groups */
#define F8_S4    5 /* ring slots of modes 4, 5, 6 */
#define F8_SMEM4 (1024 + F8_S4 * F8Cfg::STAGE + 2 * F8_S4 * 8 + F8_TM * F8_SLD)
/* mode 6: stages of X and W alone, F8_S4 + 2 scale slots of their own (sx [F8_TM], sw [F8_BN]), the barriers (full,
 * empty, scale empty; padded to 16 bytes), the staging buffer */
#define F8_SC6   (F8_S4 + 2)
#define F8_SCB   (4 * (F8_TM + F8_BN))
#define F8_BAR6  ((8 * (2 * F8_S4 + F8_SC6) + 15) / 16 * 16)
#define F8_SMEM6 (1024 + F8_S4 * (F8Cfg::A_BYTES + F8Cfg::B_BYTES) + F8_SC6 * F8_SCB + F8_BAR6 + F8_TM * F8_SLD)

/* The storers' epilogue for staged row r, columns c .. c + 7 of the tile at (m0, n0): from the bf16 sums (every
 * epilogue rounds the sum to bf16 first, so the staging buffer holds all it needs) the stores of gemm_store_staged:
 * bf16 y, fp32 y = bf16(sum), y = bf16(y + bf16(sum)), or SwiGLU of the (gate, up) column pairs (glu_group 1). One
 * vector store (16 bytes; SwiGLU's 4 outputs 8) where the 8 columns are inside N and y is aligned, else per element.
 * res: with the += residual epilogue, y's 8 values loaded already (f8_store_tile), or NULL (loaded here). */
template <int EPI>
__device__ __forceinline__ void f8_store8(const GemmParams &p, const uint8_t *stg, int m0, int n0, int r, int c,
                                          const float4 *res = nullptr) {
    const int m = m0 + r, n = n0 + c;
    if (m >= p.M || n >= p.N) return;
    const uint4 v = *reinterpret_cast<const uint4 *>(stg + r * F8_SLD + 2 * c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float b[8];
#pragma unroll
    for (int e = 0; e < 4; e++) b[2 * e] = bf_lo(w[e]), b[2 * e + 1] = bf_hi(w[e]);
    const bool full = n + 8 <= p.N;
    if constexpr (EPI == GEMM_EPI_BF16) {
        uint16_t *y = (uint16_t *)p.y + (size_t)m * p.ldy + n;
        if (full && !((uintptr_t)y & 15)) {
            *reinterpret_cast<uint4 *>(y) = v;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (n + e < p.N) y[e] = bf16_bits(b[e]);
        }
    } else if constexpr (EPI == GEMM_EPI_F32 || EPI == GEMM_EPI_ADD_F32) {
        float *y = (float *)p.y + (size_t)m * p.ldy + n;
        if (full && !((uintptr_t)y & 15)) {
            float4 y0, y1;
            if constexpr (EPI == GEMM_EPI_ADD_F32) {
                y0 = res ? res[0] : *reinterpret_cast<const float4 *>(y);
                y1 = res ? res[1] : *reinterpret_cast<const float4 *>(y + 4);
                y0 = make_float4(rbf(y0.x + b[0]), rbf(y0.y + b[1]), rbf(y0.z + b[2]), rbf(y0.w + b[3]));
                y1 = make_float4(rbf(y1.x + b[4]), rbf(y1.y + b[5]), rbf(y1.z + b[6]), rbf(y1.w + b[7]));
            } else {
                y0 = make_float4(b[0], b[1], b[2], b[3]), y1 = make_float4(b[4], b[5], b[6], b[7]);
            }
            *reinterpret_cast<float4 *>(y) = y0;
            *reinterpret_cast<float4 *>(y + 4) = y1;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (n + e < p.N) y[e] = EPI == GEMM_EPI_F32 ? b[e] : rbf(y[e] + b[e]);
        }
    } else { /* SwiGLU: output column (n + 2k) / 2 from gate column n + 2k and up column n + 2k + 1 */
        uint16_t *y = (uint16_t *)p.y + (size_t)m * p.ldy + n / 2;
        float o[4];
#pragma unroll
        for (int k = 0; k < 4; k++) o[k] = rbf(silu_f(b[2 * k])) * b[2 * k + 1];
        if (full && !((uintptr_t)y & 7)) {
            *reinterpret_cast<uint2 *>(y) = make_uint2(pack_bf16(o[0], o[1]), pack_bf16(o[2], o[3]));
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (n + 2 * k + 1 < p.N) y[k] = bf16_bits(o[k]);
        }
    }
}

/* One storer thread's share of a staged tile: the 8-column chunks q = first, first + step, ... of the tile's
 * F8_TM * F8_BN / 8 (row q / (F8_BN / 8), columns 8 (q % (F8_BN / 8)) ...), F8_SU chunks a round. With the +=
 * residual epilogue a round's y loads are all issued before its stores: a store to y may alias any later load from
 * it for the compiler, so chunk by chunk each load would wait for the one before it to come back. */
#define F8_SU 4
template <int EPI>
__device__ __forceinline__ void f8_store_tile(const GemmParams &p, const uint8_t *stg, int m0, int n0, int first,
                                              int step) {
    constexpr int NQ = F8_TM * F8_BN / 8, QR = F8_BN / 8;
    for (int q0 = first; q0 < NQ; q0 += F8_SU * step) {
        float4 res[F8_SU][2];
        bool pre[F8_SU];
#pragma unroll
        for (int u = 0; u < F8_SU; u++) {
            const int q = q0 + u * step, m = m0 + q / QR, n = n0 + 8 * (q % QR);
            const float *y = (const float *)p.y + (size_t)m * p.ldy + n;
            pre[u] = EPI == GEMM_EPI_ADD_F32 && q < NQ && m < p.M && n + 8 <= p.N && !((uintptr_t)y & 15);
            if (pre[u])
                res[u][0] = *reinterpret_cast<const float4 *>(y), res[u][1] = *reinterpret_cast<const float4 *>(y + 4);
        }
#pragma unroll
        for (int u = 0; u < F8_SU; u++) {
            const int q = q0 + u * step;
            if (q < NQ) f8_store8<EPI>(p, stg, m0, n0, q / QR, 8 * (q % QR), pre[u] ? res[u] : nullptr);
        }
    }
}

/* MODE 0: each k-step waited for and promoted; 1: the next k-step issued before the promotion (pipe); 2: timing
 * bound only, results NOT scaled (one fp32 accumulator over all of K, no promotion, the scales ignored): what the
 * same loads and wgmmas cost without the per-k-step promotion; 3: mode 2 without the epilogue (nothing stored):
 * what the tile's stores cost on top; 4: mode 2 (bf16 output) with the stores overlapped: the consumers put the
 * tile's bf16 values into a staging buffer in shared memory and go on with the next tile, while the producer
 * warpgroup's three idle warps copy it out (named barriers: 1 staging full, 2 staging free; 5 ring slots to make
 * room). Mode 4's output must equal mode 2's bit for bit. 5: mode 1 (scaled, every epilogue) with mode 4's
 * overlapped stores (f8_store8), checked against the double reference like modes 0 and 1. 6: mode 5 with the scales
 * in a ring of their own (F8_SC6 slots, scale-empty barriers): a k-step's X / W slot goes back to the producer as soon
 * as its wgmmas are done, before its promotion, where modes 1 and 5 hold it until the promotion has read the scales
 * from it. */
template <int EPI, int MODE>
__global__ void __launch_bounds__(384, 1) gemm_fp8_tma(const __grid_constant__ F8Args a) {
    constexpr bool PIPE = MODE == 1 || MODE >= 5, OVL = MODE >= 4; /* OVL: the storer warps */
    constexpr bool SEP = MODE == 6;                                /* the scales' own ring */
    constexpr int NS = OVL ? F8_S4 : F8_STAGES;
    constexpr int STG = SEP ? F8Cfg::A_BYTES + F8Cfg::B_BYTES : F8Cfg::STAGE; /* bytes of a ring slot */
    pdl_begin();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = F8Cfg;
    const GemmParams &p = a.p;
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t sbase = (smem_addr(smem) + 1023u) & ~1023u;
    const uint32_t sc0 = sbase + NS * STG; /* SEP: scale slot q at sc0 + F8_SCB q */
    const uint32_t full0 = sc0 + (SEP ? F8_SC6 * F8_SCB : 0), empty0 = full0 + NS * 8;
    const uint32_t scempty0 = empty0 + NS * 8;        /* SEP: scale slot q free again */
    uint8_t *sgen = smem + (sbase - smem_addr(smem)); /* the generic pointer of sbase */
    const int tid = threadIdx.x, wg = tid >> 7;
    const int tiles = ((p.M + F8_TM - 1) / F8_TM) * ((p.N + F8_BN - 1) / F8_BN), ktiles = (p.K + F8_BK - 1) / F8_BK;
    const int ldsx = (p.M + 3) & ~3, ldsw = (p.N + 3) & ~3;
    const int kpad = PIPE ? (ktiles + 1) & ~1 : ktiles; /* k-steps through the ring per tile */

    if (tid == 0) {
        for (int s = 0; s < NS; s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 8); /* the 8 consumer warps */
        }
        for (int q = 0; SEP && q < F8_SC6; q++) mbar_init(scempty0 + 8 * q, 8);
        mbar_init_fence();
        tma_prefetch_map(&a.ta), tma_prefetch_map(&a.tb);
    }
    __syncthreads();

    /* modes 4-6: bf16 [F8_TM][F8_SLD bytes] */
    uint8_t *stg = sgen + (SEP ? (full0 - sbase) + F8_BAR6 : NS * C::STAGE + 2 * NS * 8);
    /* The consumers' branch comes first. With the producer's first, ptxas 13.0 gave the consumers of mode 5 (where
     * the producer warpgroup's other warps store) ~173 registers instead of setmaxnreg's 224 and spilled 568 bytes
     * (checked with -Xptxas -v and scripts/sass.sh); in this order no instantiation spills. */
    if (wg > 0) {
        /* consumers: warpgroup cw takes rows cw * 64 .. + 63 of every tile */
        regs_inc<OVL ? 224 : 232>();
        const int cw = wg - 1, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
        const int rr = cw * 64 + wq * 16 + g; /* this thread's first row in the tile (the second is rr + 8) */
        int it = 0;                           /* ring uses so far */
        /* ring use u's promotion: its scales from its X / W slot (which it then frees), or (SEP) the slot is freed
         * first and the scales come from their own slot */
        auto promote = [&](float(&acc)[F8_BN / 8][4], const float(&pp)[1][F8_BN / 8][4], int u, bool live) {
            const int s = u % NS;
            if constexpr (SEP) {
                __syncwarp();
                if (lane == 0) mbar_arrive(empty0 + 8 * s); /* its wgmmas are done */
                const int q = u % F8_SC6;
                const float *sc = reinterpret_cast<const float *>(sgen + (sc0 - sbase) + q * F8_SCB);
                f8_promote(acc, pp, sc, sc + F8_TM, rr, t, lane, scempty0 + 8 * q, live);
            } else {
                const float *sx = reinterpret_cast<const float *>(sgen + s * C::STAGE + C::SX_OFF);
                const float *sw = reinterpret_cast<const float *>(sgen + s * C::STAGE + C::SW_OFF);
                f8_promote(acc, pp, sx, sw, rr, t, lane, empty0 + 8 * s, live);
            }
        };
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int m0, n0;
            gemm_tile_coords_at<F8_TM, F8_BN>(p, tile, m0, n0);
            float acc[F8_BN / 8][4], p0[1][F8_BN / 8][4], p1[1][F8_BN / 8][4];
#pragma unroll
            for (int n8 = 0; n8 < F8_BN / 8; n8++) acc[n8][0] = acc[n8][1] = acc[n8][2] = acc[n8][3] = 0.0f;
            /* k-step j's wgmmas go into p0 (j even) or p1 (j odd); step j + 1's are issued before step j is waited
             * for and promoted, so the tensor core always has this warpgroup's next products queued */
            const int it0 = it;
            if constexpr (MODE >= 2 && MODE <= 4) { /* the unscaled bounds */
                for (int kt = 0; kt < ktiles; kt++) {
                    f8_issue<NS>(p0, sbase, it0 + kt, cw, full0, kt > 0);
                    wgmma_wait<1>();
                    __syncwarp();
                    if (kt > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((it0 + kt - 1) % NS));
                }
                wgmma_wait<0>();
                reg_fence_acc(p0);
#pragma unroll
                for (int n8 = 0; n8 < F8_BN / 8; n8++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[n8][e] = p0[0][n8][e];
                __syncwarp();
                if (lane == 0) mbar_arrive(empty0 + 8 * ((it0 + ktiles - 1) % NS));
            } else if constexpr (!PIPE) {
                for (int kt = 0; kt < ktiles; kt++) {
                    f8_issue(p0, sbase, it0 + kt, cw, full0);
                    wgmma_wait<0>();
                    reg_fence_acc(p0);
                    promote(acc, p0, it0 + kt, true);
                }
            } else {
                /* k-step kt + 1's wgmmas (into the other partial) run while k-step kt is promoted. No wgmma sits on
                 * a branch (ptxas serialises every wgmma of a kernel with one on a divergent path): the producer pads
                 * the k-steps to an even count with an all-zero step (a TMA box past K reads zeros), whose promotion
                 * alone is skipped. */
                f8_issue<NS, STG>(p0, sbase, it0, cw, full0);
                int kt = 0;
                for (; kt + 2 < kpad; kt += 2) {
                    f8_issue<NS, STG>(p1, sbase, it0 + kt + 1, cw, full0);
                    wgmma_wait<1>();
                    reg_fence_acc(p0);
                    promote(acc, p0, it0 + kt, true);
                    f8_issue<NS, STG>(p0, sbase, it0 + kt + 2, cw, full0);
                    wgmma_wait<1>();
                    reg_fence_acc(p1);
                    promote(acc, p1, it0 + kt + 1, true);
                }
                f8_issue<NS, STG>(p1, sbase, it0 + kt + 1, cw, full0);
                wgmma_wait<1>();
                reg_fence_acc(p0);
                promote(acc, p0, it0 + kt, true);
                wgmma_wait<0>();
                reg_fence_acc(p1);
                promote(acc, p1, it0 + kt + 1, kt + 1 < ktiles);
            }
            it += kpad;
            const int row0 = m0 + cw * 64 + wq * 16;
            float *st = reinterpret_cast<float *>(sgen + C::STAGE_OFF) + (cw * 4 + wq) * GEMM_STAGE_FLOATS;
            if constexpr (OVL) { /* the tile's bf16 values into the staging buffer for the storers */
                bar_sync(2, 352);
#pragma unroll
                for (int n8 = 0; n8 < F8_BN / 8; n8++) {
                    *reinterpret_cast<uint32_t *>(stg + rr * F8_SLD + 2 * (8 * n8 + 2 * t)) =
                        pack_bf16(acc[n8][0], acc[n8][1]);
                    *reinterpret_cast<uint32_t *>(stg + (rr + 8) * F8_SLD + 2 * (8 * n8 + 2 * t)) =
                        pack_bf16(acc[n8][2], acc[n8][3]);
                }
                bar_arrive(1, 352);
            } else if constexpr (MODE == 3) { /* no epilogue: one word per thread, so the sums stay live */
                if (acc[0][0] == 12345.0f && acc[1][1] == 54321.0f) ((float *)p.y)[0] = acc[2][2];
            } else {
                gemm_store_staged<EPI, F8_BN / 8, false>(p, acc, row0, n0, lane, st);
            }
        }
        return;
    }
    if (wg == 0) {                 /* producer */
        regs_dec<OVL ? 56 : 40>(); /* the storer warps need a few more */
        if constexpr (OVL) {
            if (tid >= 32) { /* storers: staging -> y, 16 bytes a thread at a time */
                bar_arrive(2, 352);
                bool first = true;
                for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                    int m0, n0;
                    gemm_tile_coords_at<F8_TM, F8_BN>(p, tile, m0, n0);
                    if (!first) bar_arrive(2, 352);
                    first = false;
                    bar_sync(1, 352);
                    f8_store_tile<EPI>(p, stg, m0, n0, tid - 32, 96);
                }
                return;
            }
        }
        if (tid != 0) return;
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int m0, n0;
            gemm_tile_coords_at<F8_TM, F8_BN>(p, tile, m0, n0);
            /* scale rows past the padded count are not copied: their slot words stay stale, and only feed rows or
             * columns past M or N, which are never stored */
            const int nx = min(F8_TM, ldsx - m0), nw = min(F8_BN, ldsw - n0);
            for (int kt = 0; kt < kpad; kt++, it++) {
                const int s = it % NS;
                const uint32_t ph = (uint32_t)(it / NS) & 1u, full = full0 + 8 * s;
                const uint32_t sA = sbase + s * STG;
                const bool real = kt < ktiles; /* the pad step: boxes past K (zeros), no scales */
                mbar_wait(empty0 + 8 * s, ph ^ 1u);
                mbar_arrive_expect_tx(full, C::A_BYTES + C::B_BYTES + (real ? 4u * (uint32_t)(nx + nw) : 0u));
                tma_load_2d(sA, &a.ta, kt * F8_BK, m0, full);
                tma_load_2d(sA + C::A_BYTES, &a.tb, kt * F8_BK, n0, full);
                if (real) {
                    uint32_t sx = sA + C::SX_OFF, sw = sA + C::SW_OFF;
                    if constexpr (SEP) { /* the scales' own slot, once its last promotion has read it */
                        const int q = it % F8_SC6;
                        mbar_wait(scempty0 + 8 * q, ((uint32_t)(it / F8_SC6) & 1u) ^ 1u);
                        sx = sc0 + q * F8_SCB, sw = sx + 4 * F8_TM;
                    }
                    bulk_g2s(sx, a.sx + (size_t)kt * ldsx + m0, 4u * nx, full);
                    bulk_g2s(sw, a.sw + (size_t)kt * ldsw + n0, 4u * nw, full);
                }
            }
        }
        return;
    }

#else
    (void)a;
    __trap(); /* built without sm_90a: the launcher refuses other devices */
#endif
}

/* ---- host: launch ---------------------------------------------------------------------------------- */

static int map_u8(CUtensorMap *m, const uint8_t *base, int rows, int cols, int ld, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 enc = nullptr;
    if (!enc) {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
        enc = (PFN_cuTensorMapEncodeTiled_v12000)f;
    }
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld};
    const cuuint32_t box[2] = {128, (cuuint32_t)box_rows}, estr[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)base, dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : (int)cudaErrorInvalidValue;
}

static int n_sm = 132;

/* Y = X8 W8^T (p: M, N, K, y, ldy, epi; glu_group 1 for SwiGLU); x8 rows of ldx bytes, w8 packed [N][K]. */
static int gemm_fp8(const GemmParams *p, const uint8_t *x8, int ldx, const float *sx, const uint8_t *w8,
                    const float *sw, int mode) {
    F8Args a;
    memset(&a, 0, sizeof a);
    a.p = *p, a.sx = sx, a.sw = sw;
    int rc = map_u8(&a.ta, x8, p->M, p->K, ldx, F8_TM);
    if (!rc) rc = map_u8(&a.tb, w8, p->N, p->K, p->K, F8_BN);
    if (rc) return rc;
    const int tiles = ((p->M + F8_TM - 1) / F8_TM) * ((p->N + F8_BN - 1) / F8_BN), grid = std::min(tiles, n_sm);
    const CudaLaunch l = {0, 0, NULL, 0};
    auto run = [&](auto kern, int smem = F8Cfg::SMEM) {
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return launch_ex(kern, dim3(grid), dim3(384), smem, 0, &l, a);
    };
    if (mode == 2) return run(gemm_fp8_tma<GEMM_EPI_BF16, 2>); /* timing only */
    if (mode == 3) return run(gemm_fp8_tma<GEMM_EPI_BF16, 3>);
    if (mode == 4) return run(gemm_fp8_tma<GEMM_EPI_BF16, 4>, F8_SMEM4);
    if (mode == 6) switch (p->epi) {
        case GEMM_EPI_BF16: return run(gemm_fp8_tma<GEMM_EPI_BF16, 6>, F8_SMEM6);
        case GEMM_EPI_F32: return run(gemm_fp8_tma<GEMM_EPI_F32, 6>, F8_SMEM6);
        case GEMM_EPI_ADD_F32: return run(gemm_fp8_tma<GEMM_EPI_ADD_F32, 6>, F8_SMEM6);
        default: return run(gemm_fp8_tma<GEMM_EPI_SWIGLU_BF16, 6>, F8_SMEM6);
        }
    if (mode == 5) switch (p->epi) {
        case GEMM_EPI_BF16: return run(gemm_fp8_tma<GEMM_EPI_BF16, 5>, F8_SMEM4);
        case GEMM_EPI_F32: return run(gemm_fp8_tma<GEMM_EPI_F32, 5>, F8_SMEM4);
        case GEMM_EPI_ADD_F32: return run(gemm_fp8_tma<GEMM_EPI_ADD_F32, 5>, F8_SMEM4);
        default: return run(gemm_fp8_tma<GEMM_EPI_SWIGLU_BF16, 5>, F8_SMEM4);
        }
    if (mode == 1) switch (p->epi) {
        case GEMM_EPI_BF16: return run(gemm_fp8_tma<GEMM_EPI_BF16, 1>);
        case GEMM_EPI_F32: return run(gemm_fp8_tma<GEMM_EPI_F32, 1>);
        case GEMM_EPI_ADD_F32: return run(gemm_fp8_tma<GEMM_EPI_ADD_F32, 1>);
        default: return run(gemm_fp8_tma<GEMM_EPI_SWIGLU_BF16, 1>);
        }
    switch (p->epi) {
    case GEMM_EPI_BF16: return run(gemm_fp8_tma<GEMM_EPI_BF16, 0>);
    case GEMM_EPI_F32: return run(gemm_fp8_tma<GEMM_EPI_F32, 0>);
    case GEMM_EPI_ADD_F32: return run(gemm_fp8_tma<GEMM_EPI_ADD_F32, 0>);
    default: return run(gemm_fp8_tma<GEMM_EPI_SWIGLU_BF16, 0>);
    }
}

/* ---- peak wgmma rates ------------------------------------------------------------------------------ */

/* Two warpgroups per CTA, one CTA per SM, each issuing R groups of 4 wgmmas on fixed shared-memory operands
 * (zeros), one group in flight: MACs per clock per SM. KIND 0: e4m3 n128, 1: e4m3 n256, 2: bf16 n128, 3: bf16 n256. */
template <int KIND>
__global__ void __launch_bounds__(256, 1) peak_k(int R, float *sink, long long *clk) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t sb = (smem_addr(smem) + 1023u) & ~1023u;
    for (int i = threadIdx.x; i < 48 * 1024 / 4; i += blockDim.x) ((uint32_t *)(smem + (sb - smem_addr(smem))))[i] = 0;
    fence_proxy_async();
    __syncthreads();
    constexpr int N = (KIND == 1 || KIND == 3) ? 256 : 128;
    float d[N / 8][4];
    for (int i = 0; i < N / 8; i++) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;
    const uint32_t sA = sb + (threadIdx.x >> 7) * 8192, sB = sb + 16384;
    const long long t0 = clock64();
    for (int r = 0; r < R; r++) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint64_t da = wgmma_desc(sA + kk * 32), db = wgmma_desc(sB + kk * 32);
            if constexpr (KIND == 0) wgmma_m64n128k32_e4m3(d, da, db, 1);
            if constexpr (KIND == 1) wgmma_m64n256k32_e4m3(d, da, db);
            if constexpr (KIND == 2) wgmma_m64n128k16(d, da, db);
            if constexpr (KIND == 3) wgmma_m64n256k16(d, da, db);
        }
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    const long long t1 = clock64();
    float s = 0;
    for (int i = 0; i < N / 8; i++) s += d[i][0] + d[i][1] + d[i][2] + d[i][3];
    if (s != 0.0f) sink[0] = s;
    if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}

static void peak(void) {
    const char *name[4] = {"e4m3 m64n128k32", "e4m3 m64n256k32", "bf16 m64n128k16", "bf16 m64n256k16"};
    const double mac[4] = {64.0 * 128 * 32, 64.0 * 256 * 32, 64.0 * 128 * 16, 64.0 * 256 * 16};
    float *sink;
    long long *clk;
    CK(cudaMalloc(&sink, 4));
    CK(cudaMalloc(&clk, n_sm * sizeof(long long)));
    const int R = 4096, smem = 1024 + 48 * 1024;
    printf("peak wgmma rate, 2 warpgroups x %d SMs, operands in shared memory:\n", n_sm);
    for (int k = 0; k < 4; k++) {
        void (*kern)(int, float *, long long *) = k == 0   ? peak_k<0>
                                                  : k == 1 ? peak_k<1>
                                                  : k == 2 ? peak_k<2>
                                                           : peak_k<3>;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        kern<<<n_sm, 256, smem>>>(R, sink, clk); /* warm-up */
        CK(cudaEventRecord(e0));
        kern<<<n_sm, 256, smem>>>(R, sink, clk);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        std::vector<long long> c(n_sm);
        CK(cudaMemcpy(c.data(), clk, n_sm * sizeof(long long), cudaMemcpyDeviceToHost));
        const double macs = mac[k] * 4 * R * 2; /* per SM: 4 wgmmas x R x 2 warpgroups */
        printf("  %-16s %7.1f MAC/clk/SM  %6.0f TFLOP/s\n", name[k], macs / (double)c[0],
               2.0 * macs * n_sm / (ms * 1e-3) / 1e12);
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
    }
    CK(cudaFree(sink));
    CK(cudaFree(clk));
}

/* ---- host: checks ---------------------------------------------------------------------------------- */

static int fails = 0;
static uint64_t rs = 1;
static double urand(void) { /* xorshift64* in [0, 1) */
    rs ^= rs >> 12, rs ^= rs << 25, rs ^= rs >> 27;
    return (double)((rs * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}
static double nrand(void) { return sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand()); }
static uint16_t bf16_of(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float f_of(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float hrbf(float f) { return f_of(bf16_of(f)); }
template <class T>
static T *dput(const std::vector<T> &h) {
    T *d;
    CK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T>
static std::vector<T> dget(const T *d, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

/* bf16 activations [M][ldx]: rows of magnitude 2^[-30, 30] (spread), an all-zero group in every 5th row, e4m3
 * rounding ties (after scaling) in every 7th; the row gap NaN. */
static std::vector<uint16_t> rand_act(int M, int K, int ldx, int spread) {
    std::vector<uint16_t> x((size_t)M * ldx, 0x7fc1);
    for (int m = 0; m < M; m++) {
        const float mag = spread ? ldexpf(1.0f, (int)(urand() * 61) - 30) : 1.0f;
        for (int k = 0; k < K; k++) x[(size_t)m * ldx + k] = bf16_of(mag * (float)nrand());
        if (m % 5 == 4) {
            const int g = (int)(urand() * ((K + 127) / 128));
            for (int k = g * 128; k < K && k < g * 128 + 128; k++) x[(size_t)m * ldx + k] = 0;
        }
        if (m % 7 == 3 && K >= 4) {
            const int j = (int)(urand() * 9) - 4;
            x[(size_t)m * ldx + 0] = bf16_of(ldexpf(448.0f, j));
            x[(size_t)m * ldx + 1] = bf16_of(ldexpf(1.0625f, j));
            x[(size_t)m * ldx + 2] = bf16_of(-ldexpf(1.1875f, j));
            x[(size_t)m * ldx + 3] = bf16_of(ldexpf(0.0048828125f, j));
        }
    }
    return x;
}

/* quant_rows on the GPU against the host reference, bit for bit; returns the device codes and scales. */
static void quant_check(const std::vector<uint16_t> &x, int M, int K, int ldx, int ldq, uint8_t **dq_out,
                        float **ds_out, std::vector<uint8_t> *q_out, std::vector<float> *s_out) {
    const int nb = (K + 127) / 128, lds = (M + 3) & ~3;
    std::vector<uint8_t> qr((size_t)M * ldq, 0xaa);
    std::vector<float> sr((size_t)nb * lds, NAN);
    for (int m = 0; m < M; m++)
        for (int b = 0; b < nb; b++) {
            float amax = 0.0f;
            for (int k = b * 128; k < K && k < b * 128 + 128; k++)
                amax = std::max(amax, fabsf(f_of(x[(size_t)m * ldx + k])));
            const float s = amax > 0.0f ? amax / 448.0f : 1.0f, inv = amax > 0.0f ? 448.0f / amax : 1.0f;
            sr[(size_t)b * lds + m] = s;
            for (int k = b * 128; k < K && k < b * 128 + 128; k++)
                qr[(size_t)m * ldq + k] = (uint8_t)e4m3_of(f_of(x[(size_t)m * ldx + k]) * inv);
        }
    uint16_t *dx = dput(x);
    uint8_t *dq = dput(std::vector<uint8_t>((size_t)M * ldq, 0xaa));
    float *ds = dput(std::vector<float>((size_t)nb * lds, NAN));
    const QuantArgs a = {dx, dq, ds, M, K, ldx, ldq};
    const CudaLaunch l = {0, 0, NULL, 0};
    CK((cudaError_t)quant_rows(&a, &l));
    CK(cudaDeviceSynchronize());
    const std::vector<uint8_t> qg = dget(dq, qr.size());
    const std::vector<float> sg = dget(ds, sr.size());
    long bad = 0;
    for (size_t i = 0; i < qr.size(); i++) bad += qg[i] != qr[i];
    for (int b = 0; b < nb; b++)
        for (int m = 0; m < M; m++) bad += memcmp(&sg[(size_t)b * lds + m], &sr[(size_t)b * lds + m], 4) != 0;
    printf("  quant M=%5d K=%5d ldx=%5d ldq=%5d: %s\n", M, K, ldx, ldq,
           bad ? "DIFFERS from the host reference" : "bitwise equal");
    fails += bad != 0;
    CK(cudaFree(dx));
    *dq_out = dq, *ds_out = ds;
    if (q_out) *q_out = qr, *s_out = sr;
}

static void gemm_case(int M, int N, int K, int epi) {
    const int ldq = K, nb = (K + 127) / 128, ldsx = (M + 3) & ~3, ldsw = (N + 3) & ~3;
    const int ycols = epi == GEMM_EPI_SWIGLU_BF16 ? N / 2 : N, ldy = ycols + 8, guard = 3;
    const int esz = (epi == GEMM_EPI_F32 || epi == GEMM_EPI_ADD_F32) ? 4 : 2;
    uint8_t *dx8;
    float *dsx;
    std::vector<uint8_t> qx;
    std::vector<float> sx;
    quant_check(rand_act(M, K, K, 0), M, K, K, ldq, &dx8, &dsx, &qx, &sx);
    std::vector<uint8_t> qw((size_t)N * K);
    std::vector<float> sw((size_t)nb * ldsw);
    for (auto &v : sw) v = (float)((0.5 + urand()) * ldexp(1.0, -(int)(urand() * 10)) / sqrt(K));
    for (auto &v : qw) do
            v = (uint8_t)(urand() * 256);
        while ((v & 0x7f) == 0x7f);
    uint8_t *dw8 = dput(qw);
    float *dsw = dput(sw);
    const size_t ny = (size_t)(M + guard) * ldy;
    std::vector<unsigned char> y0(ny * esz);
    for (size_t i = 0; i < ny; i++) {
        if (esz == 4) {
            float v = NAN;
            if (epi == GEMM_EPI_ADD_F32 && i < (size_t)M * ldy && (int)(i % ldy) < ycols) v = hrbf((float)nrand());
            memcpy(&y0[i * 4], &v, 4);
        } else {
            const uint16_t v = 0x7fc1;
            memcpy(&y0[i * 2], &v, 2);
        }
    }
    const int modes[4] = {0, 1, 5, 6}; /* wait, pipe, pipe with the overlapped stores, and the scales' own ring */
    for (int mi = 0; mi < 4; mi++) {
        const int pipe = modes[mi];
        unsigned char *dy = dput(y0);
        GemmParams p;
        memset(&p, 0, sizeof p);
        p.y = dy, p.M = M, p.N = N, p.K = K, p.ldy = ldy, p.epi = epi, p.glu_group = 1;
        CK((cudaError_t)gemm_fp8(&p, dx8, ldq, dsx, dw8, dsw, pipe));
        CK(cudaDeviceSynchronize());
        const std::vector<unsigned char> y1 = dget(dy, y0.size());
        const int all = (double)M * N * K <= 3e8, nrows = all ? M : 42;
        std::vector<double> ref(N), sabs(N), xd(K);
        long bad = 0, checked = 0;
        double worst = 0;
        for (int ri = 0; ri < nrows; ri++) {
            const int m = all ? ri : ri == 0 ? 0 : ri == 1 ? M - 1 : (int)(urand() * M);
            for (int k = 0; k < K; k++) xd[k] = e4m3_val(qx[(size_t)m * ldq + k]) * sx[(size_t)(k / 128) * ldsx + m];
            for (int n = 0; n < N; n++) {
                double s = 0, a = 0;
                for (int k = 0; k < K; k++) {
                    const double pr = xd[k] * e4m3_val(qw[(size_t)n * K + k]) * sw[(size_t)(k / 128) * ldsw + n];
                    s += pr, a += fabs(pr);
                }
                ref[n] = s, sabs[n] = a;
            }
            for (int c = 0; c < ycols; c++) {
                const size_t i = (size_t)m * ldy + c;
                double got, want, tol;
                if (epi == GEMM_EPI_SWIGLU_BF16) {
                    const double gt = hrbf((float)ref[2 * c]), up = hrbf((float)ref[2 * c + 1]);
                    const double act = hrbf((float)(gt / (1.0 + exp(-gt))));
                    want = act * up;
                    const double dg = ldexp(fabs(gt), -8) + ldexp(sabs[2 * c], -10);
                    const double du = ldexp(fabs(up), -8) + ldexp(sabs[2 * c + 1], -10);
                    tol = 1.1 * dg * fabs(up) + fabs(act) * du + ldexp(fabs(want), -7) + 1e-30;
                    uint16_t h;
                    memcpy(&h, &y1[i * 2], 2);
                    got = f_of(h);
                } else if (epi == GEMM_EPI_ADD_F32) {
                    float f0, f;
                    memcpy(&f0, &y0[i * 4], 4);
                    memcpy(&f, &y1[i * 4], 4);
                    want = f0 + hrbf((float)ref[c]);
                    tol = ldexp(fabs(f0) + fabs(ref[c]), -7) + ldexp(fabs(want), -8) + ldexp(sabs[c], -10) + 1e-30;
                    got = hrbf(f) == f ? f : NAN;
                } else {
                    want = ref[c];
                    tol = ldexp(fabs(want), -8) + ldexp(sabs[c], -10) + 1e-30;
                    if (esz == 2) {
                        uint16_t h;
                        memcpy(&h, &y1[i * 2], 2);
                        got = f_of(h);
                    } else {
                        float f;
                        memcpy(&f, &y1[i * 4], 4);
                        got = hrbf(f) == f ? f : NAN;
                    }
                }
                const double err = fabs(got - want);
                checked++;
                if (!(err <= tol))
                    bad++;
                else
                    worst = std::max(worst, err / tol);
            }
        }
        long touched = 0;
        for (int r = 0; r < M + guard; r++)
            for (int c = 0; c < ldy; c++)
                if (!(r < M && c < ycols))
                    touched += memcmp(&y0[((size_t)r * ldy + c) * esz], &y1[((size_t)r * ldy + c) * esz], esz) != 0;
        printf("  gemm %s M=%5d N=%5d K=%5d epi=%d: %ld checked, %ld out of tolerance, worst err/tol %.3f, %ld guard "
               "elements written\n",
               pipe == 0   ? "wait"
               : pipe == 1 ? "pipe"
               : pipe == 5 ? "pipe+ovl"
                           : "pipe+ovl+scale ring",
               M, N, K, epi, checked, bad, worst, touched);
        fails += bad != 0 || touched != 0;
        CK(cudaFree(dy));
    }
    CK(cudaFree(dx8));
    CK(cudaFree(dsx));
    CK(cudaFree(dw8));
    CK(cudaFree(dsw));
}

/* ---- host: timing ---------------------------------------------------------------------------------- */

template <class F>
static double time_us(F f) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms(20);
    for (int i = 0; i < 3; i++) CK((cudaError_t)f());
    for (auto &v : ms) {
        CK(cudaEventRecord(e0));
        CK((cudaError_t)f());
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&v, e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms[10] * 1e3;
}

static void bench(const char *name, int M, int N, int K, int epi) {
    const int ycols = epi == GEMM_EPI_SWIGLU_BF16 ? N / 2 : N;
    const int esz = (epi == GEMM_EPI_F32 || epi == GEMM_EPI_ADD_F32) ? 4 : 2, nb = (K + 127) / 128;
    std::vector<uint16_t> x((size_t)M * K), w((size_t)N * K);
    for (auto &v : x) v = bf16_of((float)nrand());
    for (auto &v : w) v = bf16_of(0.03f * (float)nrand());
    std::vector<uint8_t> qw((size_t)N * K);
    for (auto &v : qw) do
            v = (uint8_t)(urand() * 256);
        while ((v & 0x7f) == 0x7f);
    uint16_t *dx = dput(x), *dw = dput(w);
    uint8_t *dx8 = dput(std::vector<uint8_t>((size_t)M * K)), *dw8 = dput(qw);
    float *dsx = dput(std::vector<float>((size_t)nb * ((M + 3) & ~3), 1.0f));
    float *dsw = dput(std::vector<float>((size_t)nb * ((N + 3) & ~3), 0.01f));
    unsigned char *dy = dput(std::vector<unsigned char>((size_t)M * ycols * esz));
    const CudaLaunch l = {0, 0, NULL, 0};
    GemmParams gb = {dx, dw, dy, M, N, K, K, K, ycols, epi, 1, GEMM_ALGO_AUTO, NULL, NULL};
    GemmParams g8 = gb;
    const QuantArgs qa = {dx, dx8, dsx, M, K, K, K};
    const double tb = time_us([&] { return cuda_gemm_bf16(&gb, &l); });
    const double tq = time_us([&] { return quant_rows(&qa, &l); });
    const double t8 = time_us([&] { return gemm_fp8(&g8, dx8, K, dsx, dw8, dsw, 0); });
    const double tp = time_us([&] { return gemm_fp8(&g8, dx8, K, dsx, dw8, dsw, 1); });
    const double tv = time_us([&] { return gemm_fp8(&g8, dx8, K, dsx, dw8, dsw, 5); });
    const double tr = time_us([&] { return gemm_fp8(&g8, dx8, K, dsx, dw8, dsw, 6); });
    GemmParams gu = g8; /* the unscaled bound writes bf16 rows of N columns */
    unsigned char *du = dput(std::vector<unsigned char>((size_t)M * N * 2));
    gu.y = du, gu.ldy = N, gu.epi = GEMM_EPI_BF16;
    const double tu = time_us([&] { return gemm_fp8(&gu, dx8, K, dsx, dw8, dsw, 2); });
    const double tn = time_us([&] { return gemm_fp8(&gu, dx8, K, dsx, dw8, dsw, 3); });
    const double to = time_us([&] { return gemm_fp8(&gu, dx8, K, dsx, dw8, dsw, 4); });
    /* mode 4's overlapped stores write what mode 2's epilogue writes */
    std::vector<uint16_t> y2((size_t)M * N), y4((size_t)M * N);
    CK(cudaMemset(du, 0xff, (size_t)M * N * 2));
    CK((cudaError_t)gemm_fp8(&gu, dx8, K, dsx, dw8, dsw, 2));
    CK(cudaMemcpy(y2.data(), du, y2.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemset(du, 0xff, (size_t)M * N * 2));
    CK((cudaError_t)gemm_fp8(&gu, dx8, K, dsx, dw8, dsw, 4));
    CK(cudaMemcpy(y4.data(), du, y4.size() * 2, cudaMemcpyDeviceToHost));
    const bool same = !memcmp(y2.data(), y4.data(), y2.size() * 2);
    fails += !same;
    const double tf = 2.0 * M * N * K / 1e12;
    printf("  %-32s M=%5d N=%5d K=%5d  bf16 %6.1f us (%4.0f TFLOP/s)  fp8 %6.1f us (%4.0f)  fp8 pipe %6.1f us (%4.0f)"
           "  fp8 pipe+ovl %6.1f us (%4.0f)  fp8 pipe+ovl+scale ring %6.1f us (%4.0f)"
           "  unscaled bound %6.1f us (%4.0f)  no stores %6.1f us (%4.0f)  overlapped stores %6.1f us (%4.0f, %s)"
           "  quant %5.1f us\n",
           name, M, N, K, tb, tf / (tb * 1e-6), t8, tf / (t8 * 1e-6), tp, tf / (tp * 1e-6), tv, tf / (tv * 1e-6), tr,
           tf / (tr * 1e-6), tu, tf / (tu * 1e-6), tn, tf / (tn * 1e-6), to, tf / (to * 1e-6),
           same ? "= bound's output" : "OUTPUT DIFFERS", tq);
    CK(cudaFree(du));
    CK(cudaFree(dx));
    CK(cudaFree(dw));
    CK(cudaFree(dx8));
    CK(cudaFree(dw8));
    CK(cudaFree(dsx));
    CK(cudaFree(dsw));
    CK(cudaFree(dy));
}

int main(int argc, char **argv) {
    rs = argc > 2 && !strcmp(argv[1], "--seed") ? strtoull(argv[2], NULL, 10) | 1 : 0x9e3779b97f4a7c15ull;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    printf("quantization:\n");
    const int qs[][3] = {{1, 16, 16}, {7, 1024, 1024}, {64, 3584, 3600}, {33, 200, 208}, {130, 2056, 2064}, {5, 8, 8}};
    for (const auto &s : qs) {
        uint8_t *dq;
        float *ds;
        quant_check(rand_act(s[0], s[1], s[2], 1), s[0], s[1], s[2], (s[1] + 15) / 16 * 16 + 16, &dq, &ds, NULL, NULL);
        CK(cudaFree(dq));
        CK(cudaFree(ds));
    }
    printf("GEMM:\n");
    const int epis[4] = {GEMM_EPI_BF16, GEMM_EPI_F32, GEMM_EPI_ADD_F32, GEMM_EPI_SWIGLU_BF16};
    for (int e = 0; e < 4; e++) {
        gemm_case(1, 136, 144, epis[e]);
        gemm_case(65, 264, 272, epis[e]);
        gemm_case(200, 392, 1040, epis[e]);
    }
    gemm_case(2048, 8192, 1024, GEMM_EPI_BF16);
    gemm_case(2048, 7168, 1024, GEMM_EPI_SWIGLU_BF16);
    gemm_case(2048, 1024, 3584, GEMM_EPI_ADD_F32);
    gemm_case(777, 1024, 2048, GEMM_EPI_ADD_F32);
    printf("timing (median of 20 event-timed launches; the bf16 GEMM is cuda_gemm_bf16's TMA pick):\n");
    for (int M : {512, 2048, 8192}) {
        bench("DeltaNet in_proj qkvz (bf16)", M, 8192, 1024, GEMM_EPI_BF16);
        bench("attention q|gate,k,v (bf16)", M, 5120, 1024, GEMM_EPI_BF16);
        bench("MLP gate+up (SwiGLU)", M, 7168, 1024, GEMM_EPI_SWIGLU_BF16);
        bench("MLP down (+= residual)", M, 1024, 3584, GEMM_EPI_ADD_F32);
        bench("out_proj / o_proj (+= residual)", M, 1024, 2048, GEMM_EPI_ADD_F32);
    }
    peak();
    printf("gemm_fp8_lab: %s\n", fails ? "FAILED" : "all checks passed");
    return fails ? 1 : 0;
}
