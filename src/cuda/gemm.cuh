/* gemm.cuh — pieces shared by the prefill GEMM kernels (gemm.cu: mma.sync and cp.async wgmma;
 * gemm_tma.cu: TMA + mbarrier warp-specialised wgmma): the k-step, the grouped tile order and the
 * epilogues that turn fp32 accumulators in the mma C layout into y (every kernel stores through
 * gemm_store, so all algorithms round identically). */
#ifndef Q35_CUDA_GEMM_CUH
#define Q35_CUDA_GEMM_CUH

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops.h"

#define GEMM_BK      64
#define GEMM_GROUP_M 8

/* Shared-memory ring of a BM x BN tile loop: per stage A [BM][64] then B [BN][64] bf16, swizzled. */
template <int BM, int BN, int STAGES, int THREADS>
struct GemmShape {
    static constexpr int NCH = GEMM_BK / 8; /* 16-byte chunks per smem row */
    static constexpr int A_BYTES = BM * GEMM_BK * 2, B_BYTES = BN * GEMM_BK * 2;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int SMEM = STAGES * STAGE_BYTES;
};

/* Grouped tile order: GROUP_M tile rows at a time, column-major inside the group. */
template <int BM, int BN>
__device__ __forceinline__ void gemm_tile_coords_at(const GemmParams &p, int bid, int &m0, int &n0) {
    const int tiles_m = (p.M + BM - 1) / BM, tiles_n = (p.N + BN - 1) / BN;
    const int per_group = GEMM_GROUP_M * tiles_n;
    const int first_m = (bid / per_group) * GEMM_GROUP_M;
    const int gm = min(tiles_m - first_m, GEMM_GROUP_M);
    m0 = (first_m + (bid % per_group) % gm) * BM;
    n0 = ((bid % per_group) / gm) * BN;
}
/* SwiGLU epilogue for gate group size G over MT x NT accumulator tiles (rows row0 + 16 mt + .., columns
 * col0 + 8 nt + ..): fragment nt is a gate fragment when (8 nt / G) is even; its up fragment is
 * nt + G/8 (col0 is a multiple of 2G, and NT*8 of 2G). */
template <int G, int MT, int NT>
__device__ __forceinline__ void gemm_store_swiglu(const GemmParams &p, float (*acc)[NT][4], int row0, int col0, int g,
                                                  int t) {
    static_assert((NT * 8) % (2 * G) == 0, "gate/up pairs must stay inside the thread's columns");
    uint16_t *y = (uint16_t *)p.y;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        if (((nt * 8 / G) & 1) != 0) continue;
        const int c = col0 + nt * 8 + 2 * t; /* gate column (even) */
        if (c >= p.N) continue;
        const int oc = (c / (2 * G)) * G + c % (2 * G);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = row0 + mt * 16 + g + h * 8;
                if (r >= p.M) continue;
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float gt = rbf(acc[mt][nt][2 * h + e]);
                    const float up = rbf(acc[mt][nt + G / 8][2 * h + e]);
                    const float act = rbf(silu_f(gt));
                    v[e] = act * up;
                }
                *(uint32_t *)(y + (size_t)r * p.ldy + oc) = pack_bf16(v[0], v[1]);
            }
        }
    }
}

/* SwiGLU epilogue for rows interleaved one by one (gate_0, up_0, gate_1, ...): the thread's column
 * pair (2t, 2t+1) of fragment nt is (gate, up) of output column (col0 + 8 nt)/2 + t. Lanes t and
 * t^1 swap one value so each stores a bf16 pair: even t row g, odd t row g + 8. */
template <int MT, int NT>
__device__ __forceinline__ void gemm_store_swiglu1(const GemmParams &p, float (*acc)[NT][4], int row0, int col0, int g,
                                                   int t) {
    uint16_t *y = (uint16_t *)p.y;
    const int odd = t & 1;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float v[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float gt = rbf(acc[mt][nt][2 * h]), up = rbf(acc[mt][nt][2 * h + 1]);
                v[h] = rbf(silu_f(gt)) * up;
            }
            const float recv = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 1);
            const int r = row0 + mt * 16 + g + 8 * odd, oc = (col0 + nt * 8) / 2 + (t & ~1);
            if (r < p.M && col0 + nt * 8 < p.N)
                *(uint32_t *)(y + (size_t)r * p.ldy + oc) = odd ? pack_bf16(recv, v[1]) : pack_bf16(v[0], recv);
        }
    }
}

/* All epilogues of MT x NT accumulator tiles in the mma C layout. */
template <int EPI, int MT, int NT>
__device__ __forceinline__ void gemm_store(const GemmParams &p, float (*acc)[NT][4], int row0, int col0, int g, int t) {
    if constexpr (EPI == GEMM_EPI_SWIGLU_BF16) {
        if (p.glu_group == 1)
            gemm_store_swiglu1<MT, NT>(p, acc, row0, col0, g, t);
        else if (p.glu_group == 8)
            gemm_store_swiglu<8, MT, NT>(p, acc, row0, col0, g, t);
        else if (p.glu_group == 16)
            gemm_store_swiglu<16, MT, NT>(p, acc, row0, col0, g, t);
        else
            gemm_store_swiglu<32, MT, NT>(p, acc, row0, col0, g, t);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
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
                        *(float2 *)((float *)p.y + o) = make_float2(rbf(v0), rbf(v1));
                    } else { /* GEMM_EPI_ADD_F32 */
                        float2 *yp = (float2 *)((float *)p.y + o);
                        const float2 old = *yp;
                        *yp = make_float2(rbf(old.x + rbf(v0)), rbf(old.y + rbf(v1)));
                    }
                }
            }
        }
    }
}

/* Staged epilogue (the TMA kernels): one warp's 16-row strip (rows row0 + .., columns col0 + 8 nt + ..,
 * NT n8 fragments in the mma C layout) goes out through the warp's own shared-memory tile st
 * (GEMM_STAGE_FLOATS floats), 32 accumulator columns at a time. gemm_store writes 4-8 bytes per
 * thread and row, half sectors scattered over 8 rows, and its += x epilogue waits for each load
 * before the next (a store may alias the next load): here each lane owns a 64-byte (16-column)
 * row piece, loads all of it at once and writes whole sectors. With AHEAD, += x loads the next piece's old x
 * before it stores this one (the pieces are disjoint), so a strip waits for one round trip, not one per piece
 * (16 more registers: the cooperative tiles, whose epilogue nothing overlaps; the ping-pong consumers, holding
 * 128 accumulators, would spill). Values and rounding are gemm_store's (SwiGLU: rows interleaved one by one,
 * glu_group 1, only). */
/* GEMM_EPI_ARGMAX: (v, i, s) and (v2, i2, s2), each a best value, its column (ties: the smaller) and the sum of
 * exp(y - best) over a set of columns, as one for their union. A set with no column is (-inf, INT_MAX, 0); a NaN y
 * makes the sum NaN and never wins (cuda_rows_argmax's rules). */
__device__ __forceinline__ void gemm_argmax_merge(float &v, int &i, float &s, float v2, int i2, float s2) {
    if (i2 == INT_MAX && s2 == 0.0f) return; /* the second set is empty */
    if (i == INT_MAX && s == 0.0f) {
        v = v2, i = i2, s = s2;
    } else if (v2 > v) {
        s = s * expf(v - v2) + s2;
        v = v2, i = i2;
    } else {
        s += s2 * expf(v2 - v);
        if (v2 == v && i2 < i) i = i2;
    }
}

/* GEMM_EPI_ARGMAX: a lane's 16 values y[c .. c + 15] (bf16(acc)) of its row folded into (v, i, s); columns >= cols
 * take no part */
__device__ __forceinline__ void gemm_argmax_piece(const float (&y)[16], int c, int cols, float &v, int &i, float &s) {
    float pv = -INFINITY;
    int pi = INT_MAX;
#pragma unroll
    for (int e = 0; e < 16; e++)
        if (c + e < cols && rbf(y[e]) > pv) pv = rbf(y[e]), pi = c + e;
    float ps = 0.0f;
    int n = 0;
#pragma unroll
    for (int e = 0; e < 16; e++)
        if (c + e < cols) ps += expf(rbf(y[e]) - pv), n++;
    if (n) gemm_argmax_merge(v, i, s, pv, pi, ps);
}

/* GEMM_EPI_ARGMAX: lanes 2 j and 2 j + 1 hold the halves of row r's columns of the 128-column chunk at col0 (a warp's
 * whole strip: BN = 128); the even lane stores the chunk's partials (GEMM_EPI_ARGMAX's layout) */
__device__ __forceinline__ void gemm_argmax_store(const GemmParams &p, int r, int col0, float v, int i, float s,
                                                  int half) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, 1), s2 = __shfl_xor_sync(0xffffffffu, s, 1);
    const int i2 = __shfl_xor_sync(0xffffffffu, i, 1);
    if (half || r >= p.M || col0 >= p.am_cols) return;
    gemm_argmax_merge(v, i, s, v2, i2, s2);
    const int nch = (p.am_cols + GEMM_AM_CHUNK - 1) / GEMM_AM_CHUNK, ch = col0 / GEMM_AM_CHUNK;
    float *val = (float *)p.y;
    int *idx = (int *)(val + (size_t)p.M * nch);
    float *sum = (float *)(idx + (size_t)p.M * nch);
    const size_t o = (size_t)r * nch + ch;
    val[o] = v, idx[o] = i, sum[o] = s;
}

#define GEMM_STAGE_LD     40 /* floats per staged row: 32 + 8 (conflict-free float2 writes per half-warp) */
#define GEMM_STAGE_FLOATS (16 * GEMM_STAGE_LD)
template <int EPI, int NT, bool AHEAD>
__device__ __forceinline__ void gemm_store_staged(const GemmParams &p, const float (*acc)[4], int row0, int col0,
                                                  int lane, float *st) {
    constexpr bool GLU = EPI == GEMM_EPI_SWIGLU_BF16, F32 = EPI == GEMM_EPI_F32 || EPI == GEMM_EPI_ADD_F32;
    constexpr int LD = GLU ? 20 : GEMM_STAGE_LD; /* GLU: 16 values per row; 20 keeps the scalar writes conflict-free */
    static_assert(NT % 4 == 0, "32-column pieces");
    const int g = lane >> 2, t = lane & 3, r = row0 + (lane >> 1), half = lane & 1;
    const bool vec = ((uintptr_t)p.y & 15) == 0 && p.ldy % (F32 ? 4 : 8) == 0;
    float am_v = -INFINITY, am_s = 0.0f; /* GEMM_EPI_ARGMAX: this lane's best value and sum of exp(y - it) so far, */
    int am_i = INT_MAX;                  /* and the best's column */
    /* GEMM_EPI_ADD_F32: old x of this lane's 16 columns of piece c0 (a vector piece only), loaded a piece ahead
     * (AHEAD) or at the piece */
    constexpr bool ADD = EPI == GEMM_EPI_ADD_F32;
    const auto old_vec = [&](int c0) { return vec && r < p.M && col0 + c0 + 32 <= p.N; };
    const auto old_load = [&](int c0, float4(&o)[4]) {
        const float4 *y = (const float4 *)((const float *)p.y + (size_t)r * p.ldy + col0 + c0 + 16 * half);
#pragma unroll
        for (int q = 0; q < 4; q++) o[q] = y[q];
    };
    float4 old_next[4] = {};
    if constexpr (ADD && AHEAD)
        if (old_vec(0)) old_load(0, old_next);
#pragma unroll
    for (int c0 = 0; c0 < NT * 8; c0 += 32) {
        float4 old[4];
#pragma unroll
        for (int q = 0; q < 4; q++) old[q] = old_next[q];
        if constexpr (ADD && AHEAD)
            if (c0 + 32 < NT * 8 && old_vec(c0 + 32)) old_load(c0 + 32, old_next);
        if constexpr (ADD && !AHEAD)
            if (old_vec(c0)) old_load(c0, old); /* all four loads in flight at once */
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float *a = acc[c0 / 8 + j];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if constexpr (GLU) {
                    const float gt = rbf(a[2 * h]), up = rbf(a[2 * h + 1]);
                    st[(g + 8 * h) * LD + 4 * j + t] = rbf(silu_f(gt)) * up;
                } else {
                    *(float2 *)(st + (g + 8 * h) * LD + 8 * j + 2 * t) = make_float2(a[2 * h], a[2 * h + 1]);
                }
            }
        }
        __syncwarp();
        if (r < p.M) {
            const int cc = col0 + c0; /* first accumulator column of the piece */
            if constexpr (GLU) {
                const float4 v0 = *(const float4 *)(st + (lane >> 1) * LD + 8 * half);
                const float4 v1 = *(const float4 *)(st + (lane >> 1) * LD + 8 * half + 4);
                const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
                uint16_t *y = (uint16_t *)p.y + (size_t)r * p.ldy + cc / 2 + 8 * half;
                if (vec && cc + 32 <= p.N) {
                    *(uint4 *)y = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                                             pack_bf16(v[6], v[7]));
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        if (cc + 2 * (8 * half + e) < p.N) y[e] = (uint16_t)(pack_bf16(v[e], 0.0f) & 0xffffu);
                }
            } else {
                float v[16];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float4 f = *(const float4 *)(st + (lane >> 1) * LD + 16 * half + 4 * q);
                    v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
                }
                const int c = cc + 16 * half;
                const size_t o = (size_t)r * p.ldy + c;
                if constexpr (EPI == GEMM_EPI_ARGMAX) {
                    gemm_argmax_piece(v, c, p.am_cols, am_v, am_i, am_s);
                } else if (vec && cc + 32 <= p.N) {
                    if constexpr (EPI == GEMM_EPI_BF16) {
                        uint4 *y = (uint4 *)((uint16_t *)p.y + o);
                        y[0] = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                                          pack_bf16(v[6], v[7]));
                        y[1] = make_uint4(pack_bf16(v[8], v[9]), pack_bf16(v[10], v[11]), pack_bf16(v[12], v[13]),
                                          pack_bf16(v[14], v[15]));
                    } else {
                        float4 *y = (float4 *)((float *)p.y + o);
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            const float *u = v + 4 * q;
                            if constexpr (EPI == GEMM_EPI_ADD_F32)
                                y[q] = make_float4(rbf(old[q].x + rbf(u[0])), rbf(old[q].y + rbf(u[1])),
                                                   rbf(old[q].z + rbf(u[2])), rbf(old[q].w + rbf(u[3])));
                            else
                                y[q] = make_float4(rbf(u[0]), rbf(u[1]), rbf(u[2]), rbf(u[3]));
                        }
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < 16; e++) {
                        if (c + e >= p.N) continue;
                        if constexpr (EPI == GEMM_EPI_BF16) {
                            ((uint16_t *)p.y)[o + e] = (uint16_t)(pack_bf16(v[e], 0.0f) & 0xffffu);
                        } else {
                            float *y = (float *)p.y + o + e;
                            *y = EPI == GEMM_EPI_ADD_F32 ? rbf(*y + rbf(v[e])) : rbf(v[e]);
                        }
                    }
                }
            }
        }
        __syncwarp();
    }
    if constexpr (EPI == GEMM_EPI_ARGMAX) /* the row's two halves, lower columns first; then its chunk's partials */
        gemm_argmax_store(p, r, col0, am_v, am_i, am_s, half);
}

/* TMA path (gemm_tma.cu, sm_90a): runs p with algo GEMM_ALGO_TMA* (the variant by p->algo; GEMM_ALGO_TMA
 * picks one by shape) on sms SMs. Returns 0 or a cudaError_t value (cudaErrorNotSupported when the
 * driver has no cuTensorMapEncodeTiled). p is already validated by cuda_gemm_bf16. */
int gemm_tma_run(const GemmParams *p, int sms, const CudaLaunch *l);

/* Diagnosis of the TMA path (bench/kernels/gemm_lab.cu --small), bits of `flags`:
 *   GEMM_TMA_DBG_NOREG      no setmaxnreg (every warpgroup keeps the launch's 168 registers);
 *   GEMM_TMA_DBG_GMAP       the tensor maps are read from a global-memory copy (fence.proxy.tensormap)
 *                           instead of the __grid_constant__ kernel parameter;
 *   GEMM_TMA_DBG_NOPREFETCH no prefetch.tensormap.
 * gemm_tma_debug_run: p->algo GEMM_ALGO_TMA_C128 or _P128, p->epi GEMM_EPI_BF16 only; synchronises
 * the stream under GMAP. gemm_tma_probe: TMA-loads the 64 x 64 box at column k0, row m0 of the bf16
 * [rows][ld] matrix x (cols columns read, zero fill outside) into shared memory and copies it raw
 * (128-byte swizzled: 16-byte chunk c of row r at chunk c ^ (r & 7)) to out[64][64]; synchronises
 * the stream. Both return 0 or a cudaError_t value. */
#define GEMM_TMA_DBG_NOREG      1
#define GEMM_TMA_DBG_GMAP       2
#define GEMM_TMA_DBG_NOPREFETCH 4
int gemm_tma_debug_run(const GemmParams *p, int flags, int sms, const CudaLaunch *l);
int gemm_tma_probe(const uint16_t *x, int rows, int cols, int ld, int k0, int m0, uint16_t *out, int flags,
                   cudaStream_t st);

#endif
