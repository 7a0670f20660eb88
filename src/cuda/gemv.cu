/* gemv.cu — the GEMV family for one token: y = W x, W bf16 [rows][cols] or fp8 e4m3 with 128 x 128 block scales
 * (docs/FP8.md), fp32 accumulation, with the fused prologues (embedding / residual add + RMSNorm) and epilogues (bf16
 * store, SwiGLU, split-K atomic or partials, LM-head argmax) described in ops.h.
 *
 * Layout: a warp owns a group of 4 consecutive rows; lane l reads 8 columns (one 16-byte load
 * per row) at k0 + u*256 + 8l for u < U, i.e. 4U loads (64U B per lane) are issued before the
 * first FMA. The first group's loads are issued before pdl_wait(), so they overlap the previous
 * kernel's tail. Blocks of T/32 warps stride over row groups; grid.y slices the columns
 * (split-K). x sits in shared memory as fp32 (bf16-valued).
 * Two shapes of the kernel (bench/kernels/gemv_lab.cu measured them on the H200, PDL graph of
 * back-to-back launches on fresh weights):
 *   U 4, 512 threads, 1 block per SM (grid <= n_sm): many-row GEMVs (8224 x 1024: 6.57 us vs
 *     7.30 for the former 256-thread kernel at 2 blocks/SM; gate/up 6.17 vs 6.97; LM head 117 us)
 *     and split-K with > 256 columns per split (down 1024 x 3584 / 8: 3.26 vs 3.39 us);
 *   U 2, 256 threads: split-K with <= 256 columns per split (out_proj 1024 x 2048 / 8: 2.20 vs
 *     2.52 us; U 4 would predicate off three of its four loads).
 * FP8 weights: the same kernel (template argument WF = MV_FP8) with 16 columns per lane and load, so a load step
 * covers 512 columns and the bytes in flight per lane are those of the bf16 kernel; the shapes and split plans are
 * chosen by bytes (a 512-column FP8 split is a 256-column bf16 one). Lane l's 16 columns k .. k+15 (k % 16 == 0) lie
 * in one 128-column scale block, and the device keeps one scale per row and block (ops.h FP8_SCALES_DOC), so each
 * lane loads its group's 4 row scales per step u as one 16-byte load. */
#include <limits.h>
#include <math.h>

#include "cuda/common.cuh"

#define MV_R           4 /* rows per warp group */
#define MV_SPLIT_WARPS 8 /* warps per block assumed when choosing split-K (cuda_matvec_splits) */
#define MV_DYN_SHARDS  8 /* MatvecParams.work: ticket counters, 128 bytes apart */
static_assert(32 * MV_DYN_SHARDS <= CUDA_MV_WORK_WORDS, "MatvecParams.work holds the shards");
#define MV_SPLIT_BPS 2 /* ... and blocks per SM: splits ~ 2 * n_sm / blocks, at most cols / 256 */

/* Weight formats (the kernel's template argument WF) and their columns per 16-byte load (cpl). */
enum { MV_BF16 = 0, MV_FP8 = 1 };
#define MV_CPL(wf) ((wf) == MV_FP8 ? 16 : 8)

/* Columns per split: ceil(cols / splits) rounded up to cpl (16-byte alignment). */
static __host__ __device__ inline int mv_kchunk(int cols, int splits, int cpl = 8) {
    return ((cols + splits - 1) / splits + cpl - 1) & ~(cpl - 1);
}

/* The kernel shape for a GEMV: MV_U steps of 32 cpl columns per load batch, MV_THREADS per block. */
typedef struct MvShape {
    int u, threads;
} MvShape;
static __host__ inline MvShape mv_shape(int cols, int splits, int cpl = 8) {
    MvShape sh = {4, 512};
    if (splits > 1 && mv_kchunk(cols, splits, cpl) <= 32 * cpl) {
        sh.u = 2;
        sh.threads = 256;
    }
    return sh;
}

/* y = W x with in/out modes of ops.h; one template instance per (weight format, out_mode, U, threads, gated).
 * grid (blocks, splits), block MV_THREADS; dynamic smem: x slice (VEC) or the whole row
 * (EMBED/RESIDUAL). */
template <int WF, int OUT, int MV_U, int MV_THREADS, bool GN = false>
__global__ void __launch_bounds__(MV_THREADS) matvec_rows4(const __grid_constant__ MatvecParams p) {
    constexpr int MV_WARPS = MV_THREADS / 32;
    constexpr bool F8 = WF == MV_FP8;
    constexpr int CPL = MV_CPL(WF), KSTEP = 32 * CPL; /* columns per lane and load; per warp and load */
    extern __shared__ float xs[];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = p.rows, cols = p.cols;
    Q35_TRACE_T0;
    if (p.early_trigger) pdl_trigger();
    const int kc = mv_kchunk(cols, gridDim.y, CPL);
    const int kbeg = min(cols, (int)blockIdx.y * kc), kend = min(cols, kbeg + kc);
    const int xoff = GN || p.in_mode == MV_IN_VEC ? kbeg : 0; /* xs[k - xoff] holds x[k] */
    const int ngroups = (rows + MV_R - 1) / MV_R;
    const int gstride = gridDim.x * MV_WARPS;
    int g = blockIdx.x * MV_WARPS + warp;

    const int xfl = ((GN || p.in_mode == MV_IN_VEC ? kc : cols) + 3) & ~3;
    uint4 w[MV_U][MV_R];
    float4 sc[MV_U]; /* FP8: the scales of the group's 4 rows at this lane's columns of step u (fp8_scale_ld pads) */
    auto load = [&](int grp, int k0) {
#pragma unroll
        for (int u = 0; u < MV_U; u++) {
            int k = k0 + u * KSTEP + lane * CPL;
            /* FP8: w8_scale [cols/128][rows] (ops.h): the group's 4 row scales of this lane's block in one load; the
             * 8 lanes of a block read the same 16 bytes (cached loads) */
            if constexpr (F8)
                sc[u] = k < kend && grp * MV_R < rows
                            ? __ldg(reinterpret_cast<const float4 *>(
                                  p.w8_scale + (size_t)(k / 128) * ((rows + 3) & ~3) + grp * MV_R))
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int r = 0; r < MV_R; r++) {
                int row = grp * MV_R + r;
                if (row < rows && k < kend) {
                    if constexpr (F8)
                        w[u][r] = ld_stream(reinterpret_cast<const uint4 *>(p.W8 + (size_t)row * cols + k));
                    else
                        w[u][r] = ld_stream(reinterpret_cast<const uint4 *>(p.W + (size_t)row * cols + k));
                } else {
                    w[u][r] = make_uint4(0u, 0u, 0u, 0u);
                }
            }
        }
    };
    /* weights never depend on the previous kernel: the first batches go out before the wait */
    if (g < ngroups) load(g, kbeg);
    int write_logits = 0;
    if (OUT == MV_OUT_ARGMAX) write_logits = p.logits && p.step->write_logits;
    /* the input norm's weights (immutable) into registers before the wait (2 per thread: cols <= 2 blockDim);
     * loaded after it they cost the prologue an L2 round trip behind the SM's weight stream */
    const bool nw_pre = !GN && p.in_mode != MV_IN_VEC && p.norm_w && cols <= 2 * (int)blockDim.x;
    float nwr[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int i = threadIdx.x + e * blockDim.x;
        nwr[e] = nw_pre && i < cols ? p.norm_w[i] : 0.0f;
    }

    pdl_wait();
    Q35_TRACE_T1;
    const bool writer = blockIdx.x == 0 && blockIdx.y == 0;
    if constexpr (GN) { /* MV_IN_GATED (ops.h): o and z of this slice, then per group the gated norm */
        const int G = p.group, nk = kend - kbeg;
        float *zs = xs + xfl;
        for (int i = threadIdx.x; i < nk; i += blockDim.x) {
            xs[i] = __ldcg(p.x + kbeg + i);
            zs[i] = __ldcg(p.gate + kbeg + i);
        }
        __syncthreads();
        for (int gi = warp; gi < nk / G; gi += MV_WARPS) {
            float ss = 0.0f;
            for (int c = lane; c < G; c += 32) ss = fmaf(xs[gi * G + c], xs[gi * G + c], ss);
            ss = warp_sum(ss);
            if (lane == 0) red[gi] = rsqrtf(ss / (float)G + p.eps);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nk; i += blockDim.x) {
            const float z = zs[i], u = rbf(xs[i] * red[i / G]), wu = rbf(p.norm_w[(kbeg + i) % G] * u);
            xs[i] = rbf(wu * silu_acc(z)); /* deltanet.cu's formula, accurate expf */
        }
    } else {
        gemv_stage_input(p, xs, red, kbeg, kend, nwr, nw_pre, writer);
    }
    if (p.zero) {
        int nthr = gridDim.x * gridDim.y * blockDim.x;
        for (int i = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; i < p.n_zero; i += nthr)
            p.zero[i] = 0.0f;
    }
    __syncthreads();
    if (!p.early_trigger) pdl_trigger();

    ArgMax best = {-INFINITY, INT_MAX};
    /* the 4 row sums of group grp (acc per lane) -> outputs */
    auto emit = [&](int grp, float(&acc)[MV_R]) {
        const int g = grp;
        /* lanes 8j..8j+7 hold the sum of row j of the group */
        const float s = warp_sum_rows4(acc, lane);
        const int row = g * MV_R + (lane >> 3);
        if (OUT == MV_OUT_SILU_MUL) {
            /* rows (2i, 2i+1) = (gate_i, up_i): lanes 0 and 16 own pairs i = 2g and 2g + 1 */
            float up = __shfl_down_sync(0xffffffffu, s, 8);
            if ((lane & 15) == 0 && row + 1 < rows) {
                float gt = rbf(s);
                p.y[row >> 1] = rbf(rbf(silu_f(gt)) * rbf(up));
            }
        } else if ((lane & 7) == 0 && row < rows) {
            if (OUT == MV_OUT_STORE) {
                p.y[row] = rbf(s);
            } else if (OUT == MV_OUT_SPLITK) {
                if (p.atomic)
                    atomicAdd(p.y + row, s);
                else
                    p.y[(size_t)blockIdx.y * rows + row] = s;
            } else { /* MV_OUT_ARGMAX */
                float v = rbf(s);
                if (write_logits) p.logits[row] = v;
                if (row < p.n_valid) best = argmax_better(best, ArgMax{v, row});
            }
        }
    };
    {
        /* p.work (ARGMAX only): rounds [0, R) of the fixed stride, then the last ~work_tail rounds' groups by tickets
         * from MV_DYN_SHARDS counters (warp w takes counter w % MV_DYN_SHARDS, groups R G W + shard + MV_DYN_SHARDS t:
         * one counter serves ~400 M atomics/s, measured, and a ticket per group from one counter made the LM head
         * 40 us slower). The ticket is fetched at the top of the group before it (before its loads) and used
         * after its sums, so its round trip hides behind them; every ticket fetched is used, so none is in flight
         * when the last block resets the counters. */
        const bool dyn = OUT == MV_OUT_ARGMAX && p.work != nullptr;
        const int shard = (blockIdx.x * MV_WARPS + warp) % MV_DYN_SHARDS;
        const int R = max(1, ngroups / gstride - max(1, p.work_tail));
        bool first = true;
        for (int i = 0; g < ngroups; i++) {
            const bool fetch = dyn && i + 1 >= R;
            unsigned tk = 0;
            if (fetch && lane == 0) tk = atomicAdd(p.work + 32 * shard, 1u);
            float acc[MV_R];
#pragma unroll
            for (int r = 0; r < MV_R; r++) acc[r] = 0.0f;
            for (int k0 = kbeg; k0 < kend; k0 += KSTEP * MV_U) {
                if (!first) load(g, k0);
                first = false;
#pragma unroll
                for (int u = 0; u < MV_U; u++) {
                    int k = k0 + u * KSTEP + lane * CPL;
                    if (k < kend) {
                        const float4 *xp = reinterpret_cast<const float4 *>(xs + (k - xoff));
                        if constexpr (F8) {
                            /* the lane's 16 products of one scale block summed, then times the block's scale: the
                             * scale is common to the block, so it factors out (one multiply per 16 weights), and
                             * each product e4m3 * x (4 + 8 significant bits for bf16-valued x) is exact in fp32, so
                             * the sums carry the only roundings, as in the bf16 kernel; scaling each weight first
                             * would round every weight and cost a multiply per weight */
                            float4 a = xp[0], b = xp[1], c = xp[2], d = xp[3];
                            float xv[16] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w,
                                            c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
                            const float s4[MV_R] = {sc[u].x, sc[u].y, sc[u].z, sc[u].w};
#pragma unroll
                            for (int r = 0; r < MV_R; r++) acc[r] = fmaf(dot16_e4m3(w[u][r], xv), s4[r], acc[r]);
                        } else {
                            float4 a = xp[0], b = xp[1];
                            float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                            for (int r = 0; r < MV_R; r++) acc[r] = dot8(w[u][r], xv, acc[r]);
                        }
                    }
                }
            }
            emit(g, acc);
            g = fetch ? R * gstride + shard + MV_DYN_SHARDS * (int)__shfl_sync(0xffffffffu, tk, 0) : g + gstride;
        }
    }
    Q35_TRACE_END(10 + OUT); /* step trace ids: 10 + out mode */
    if (OUT != MV_OUT_ARGMAX) return;

    /* block argmax -> am_val/am_idx[block]; the last block to finish reduces them in block order */
    if (argmax_publish<MV_WARPS>(best, p.am_val, p.am_idx, p.am_count, p.out_id, p.out_max) && p.work)
        for (int c = 0; c < MV_DYN_SHARDS; c++)
            p.work[32 * c] = 0u; /* every block has left its group loop: all
                                                                        tickets were taken and used */
}

static int mv_blocks(int rows, int cols, int splits, int n_sm, int cpl) {
    const MvShape sh = mv_shape(cols, splits, cpl);
    int groups = (rows + MV_R - 1) / MV_R, warps = sh.threads / 32, bx = (groups + warps - 1) / warps;
    if (splits > 1) return bx;     /* one group per warp; cuda_matvec_splits keeps bx * splits ~ 1-2 waves */
    int cap = n_sm > 0 ? n_sm : 1; /* 512 threads at ~100 registers: 1 block per SM */
    return bx < cap ? bx : cap;
}

extern "C" int cuda_matvec_blocks(int rows, int cols, int splits, int n_sm) {
    return mv_blocks(rows, cols, splits, n_sm, 8);
}
extern "C" int cuda_matvec_blocks_fp8(int rows, int cols, int splits, int n_sm) {
    return mv_blocks(rows, cols, splits, n_sm, 16);
}

/* splits by bytes: cols * 8 / cpl bf16-equivalent columns, each split at least one 32 cpl-column step */
static int mv_splits(int rows, int cols, int n_sm, int cpl) {
    int groups = (rows + MV_R - 1) / MV_R, bx = (groups + MV_SPLIT_WARPS - 1) / MV_SPLIT_WARPS;
    if (bx >= n_sm || cols < 64 * cpl) return 1;
    int s = MV_SPLIT_BPS * n_sm / bx, smax = cols / (32 * cpl);
    if (s > smax) s = smax;
    if (s < 1) s = 1;
    int kc = mv_kchunk(cols, s, cpl);
    return (cols + kc - 1) / kc;
}
extern "C" int cuda_matvec_splits(int rows, int cols, int n_sm) { return mv_splits(rows, cols, n_sm, 8); }
extern "C" int cuda_matvec_splits_fp8(int rows, int cols, int n_sm) { return mv_splits(rows, cols, n_sm, 16); }

template <int WF, int U, int T>
static void (*mv_kernel(int out_mode))(MatvecParams) {
    switch (out_mode) {
    case MV_OUT_STORE: return matvec_rows4<WF, MV_OUT_STORE, U, T>;
    case MV_OUT_SILU_MUL: return matvec_rows4<WF, MV_OUT_SILU_MUL, U, T>;
    case MV_OUT_SPLITK: return matvec_rows4<WF, MV_OUT_SPLITK, U, T>;
    case MV_OUT_ARGMAX: return matvec_rows4<WF, MV_OUT_ARGMAX, U, T>;
    default: return NULL;
    }
}

static int mv_gated_ok(int cols, int splits, int group, int cpl) {
    const int kc = splits >= 1 ? mv_kchunk(cols, splits, cpl) : 0;
    return group >= 1 && group <= 1024 && cols % group == 0 && kc % group == 0 && kc / group <= 32;
}
extern "C" int cuda_matvec_gated_ok(int cols, int splits, int group) { return mv_gated_ok(cols, splits, group, 8); }

/* MV_IN_GATED: the split-K instances with the gated-norm prologue (ops.h) */
template <int WF>
static int mv_gated(const MatvecParams *p, const CudaLaunch *l, int bx) {
    const int cpl = MV_CPL(WF), kc = mv_kchunk(p->cols, p->splits, cpl);
    if (p->out_mode != MV_OUT_SPLITK || !p->x || !p->gate || !p->norm_w ||
        !mv_gated_ok(p->cols, p->splits, p->group, cpl) || p->x_out || p->h_out)
        return (int)cudaErrorInvalidValue;
    const MvShape sh = mv_shape(p->cols, p->splits, cpl);
    const size_t smem = sizeof(float) * 2 * (size_t)((kc + 3) & ~3);
    void (*kern)(MatvecParams) = sh.threads == 256 ? matvec_rows4<WF, MV_OUT_SPLITK, 2, 256, true>
                                                   : matvec_rows4<WF, MV_OUT_SPLITK, 4, 512, true>;
    if (smem > 40 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
    }
    return launch_kernel(kern, dim3((unsigned)bx, (unsigned)p->splits), dim3((unsigned)sh.threads), smem, l, *p);
}

extern "C" int cuda_matvec(const MatvecParams *p, const CudaLaunch *l) {
    const bool f8 = p->W8 != NULL;
    const int cpl = f8 ? 16 : 8; /* MV_CPL */
    if ((f8 ? (p->W || !p->w8_scale || ((uintptr_t)p->w8_scale & 15)) : (!p->W || p->w8_scale)) ||
        p->rows <= 0 || p->cols <= 0 || p->cols % cpl ||
        p->splits < 1 || p->splits > p->cols / cpl || (p->splits > 1 && p->out_mode != MV_OUT_SPLITK) ||
        (p->in_mode == MV_IN_VEC && !p->x) || (p->in_mode == MV_IN_EMBED && (!p->embed || !p->step)) ||
        (p->in_mode == MV_IN_RESIDUAL && !p->x) || (p->in_mode != MV_IN_VEC && p->x_out && p->x_out == p->x) ||
        (p->norm_w && p->in_mode == MV_IN_VEC))
        return (int)cudaErrorInvalidValue;
    if (p->out_mode == MV_OUT_ARGMAX ? (!p->step || !p->am_val || !p->am_idx || !p->am_count || !p->out_id) : !p->y)
        return (int)cudaErrorInvalidValue;
    if (p->out_mode == MV_OUT_SILU_MUL && p->rows % 2) return (int)cudaErrorInvalidValue;
    int bx = p->blocks;
    if (bx <= 0) {
        int dev = 0, n_sm = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return (int)e;
        bx = mv_blocks(p->rows, p->cols, p->splits, n_sm, cpl);
    }
    if (p->in_mode == MV_IN_GATED) return f8 ? mv_gated<MV_FP8>(p, l, bx) : mv_gated<MV_BF16>(p, l, bx);
    const MvShape sh = mv_shape(p->cols, p->splits, cpl);
    const int xfl = ((p->in_mode == MV_IN_VEC ? mv_kchunk(p->cols, p->splits, cpl) : p->cols) + 3) & ~3;
    size_t smem = sizeof(float) * (size_t)xfl;
    void (*kern)(MatvecParams) =
        f8 ? (sh.threads == 256 ? mv_kernel<MV_FP8, 2, 256>(p->out_mode) : mv_kernel<MV_FP8, 4, 512>(p->out_mode))
           : (sh.threads == 256 ? mv_kernel<MV_BF16, 2, 256>(p->out_mode) : mv_kernel<MV_BF16, 4, 512>(p->out_mode));
    if (!kern) return (int)cudaErrorInvalidValue;
    if (smem > 40 * 1024) { /* dynamic + static above the 48 KiB default needs the opt-in */
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
    }
    return launch_kernel(kern, dim3((unsigned)bx, (unsigned)p->splits), dim3((unsigned)sh.threads), smem, l, *p);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_matvec)
