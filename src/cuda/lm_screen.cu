/* lm_screen.cu — the greedy step's LM head argmax through an int8 screen (ops.h cuda_lm_screen; the engine's default
 * for greedy steps that write no logits, QWEN35_LM_SCREEN=0: off).
 *
 * Why: the LM head is a third of the step's bytes (248320 x 1024 bf16, 509 MB: ~120 us at the card's streaming rate),
 * and a greedy step needs only the index of its largest logit. An int8 copy of the head (per-row scale; 254 MB, made
 * once at load by cuda_lm_quantize) bounds every logit; only the rows whose bound reaches the best lower bound can
 * be the argmax, and those (~4 per block at the 0.8B shape) are recomputed from the bf16 rows by the full head's own
 * code. The id and its value are the full head's, bit for bit: the screen only decides which rows need the exact sum.
 * H200, 0.8B: ~69 us per step instead of ~122 (eager), -48 us per greedy token (docs/PERF_NOTES.md §27).
 *
 * The bound. Row r's exact logit is E_r = bf16(s_r), s_r the fp32 sum of the full head (matvec.cu MV_OUT_ARGMAX:
 * every product h_i w_ri exact in fp32, D - 1 roundings: |s_r - h.w_r| <= (D - 1) u ||h||_2 ||w_r||_2, u = 2^-24).
 * The screen takes h as integers, hq_i = rint(h_i / sh) (sh = max |h| / (hq_max - 1), hq_max such that D 127 hq_max
 * < 2^31: every sum is an exact int32), and the int8 rows q_r (cuda_lm_quantize: sc_r = max |w_r| / 127,
 * q = rint(w / sc_r)), so T_r = sum_i hq_i q_ri is exact and a_r = fl(fl(T_r) fl(sc_r sh)) is within 3u |a_r| of
 * sc_r sh T_r. With e_r = ||w_r - sc_r q_r||_2, l1_r = ||sc_r q_r||_1 and |h_i - sh hq_i| <= 0.51 sh:
 *   |sc_r sh T_r - h.w_r| <= 0.51 sh l1_r + ||h||_2 e_r,
 * so with c_r = e_r + 2 D u (||w_r||_2 + ||sc_r q_r||_2) (stored rounded up, as l1_r) the kernel takes
 *   B_r = 1.001 (1.001 ||h||_2 c_r + 0.51 sh l1_r) + 4u |a_r|,  L_r = a_r - B_r <= s_r <= U_r = a_r + B_r
 * (the slack covers the roundings of B, L and U). bf16 rounding is monotone: bf16(L_r) <= E_r <= bf16(U_r). With
 * M = max_r L_r, the winner r* has E_r* >= bf16(M), so every row that can win (ties included) has
 * bf16(U_r) >= bf16(M): those are the candidates. At the 0.8B shape with random weights B_r is about a quarter of the
 * logits' standard deviation (e_r ~ 0.75 % of ||w_r||_2).
 *
 * Layout (512 threads, one block per SM, grid = the full head's am_val capacity): the screen's groups of 8 rows
 * (8 KiB of int8 at D = 1024) go to warps round-robin across the blocks (group b + G (w + 16 i) to warp w of block
 * b), so at any moment the chip reads one contiguous front of the matrix. Lane l reads 16 bytes of each row at
 * columns 512 c + 16 l (c < 2 per batch: 16 loads, 256 B per lane in flight; the first batch before pdl_wait) and
 * multiplies them with its 16 hq (shared memory, packed in pairs) in 8 dp2a; the 8 row sums meet in 9 shuffles.
 * Each warp keeps its running max of L and pushes (row, U) into the block's list when bf16(U) >= bf16(its max): a
 * superset of the candidates, since the max only grows. At the end the block takes M_b = max over its warps and
 * recomputes, one warp per candidate, the 4-row group of every listed row with bf16(U) >= bf16(M_b) exactly as
 * the full head does (gemv's U = 4 layout, dot8 in the same order, warp_sum_rows4): its best is the block's best of
 * the exact logits over all its rows. The blocks' bests meet in one 64-bit atomic max (*key: the value's bits in
 * a monotone order, then the complement of the id), so no block waits for another and no last block reduces them:
 * the host reads the key (cuda_lm_key_id). A block whose list overflows (LS_CAP), that keeps no row (NaN input) or
 * whose ||h|| is not finite computes all its rows exactly instead: slower, the same answer.
 *
 * The TMA ring kernel (cols 1024 or 2048 on sm_90, the default there): the same screen with the int8 rows streamed by
 * one producer thread (warp 15) in pieces of 16 KiB (RP = 16384 / cols whole rows, plus their meta) into LS_S = 12
 * slots of shared memory, at most LS_P = 4 pieces in flight after the first LS_S, which go out before the PDL wait;
 * consumer warp c takes slot c's pieces (one consumer per slot: an mbarrier's parity then never aliases two
 * generations); the block's pieces are b + G i. The bench/kernels/step_lab.cu measurements (PERF_NOTES §26) chose
 * 16 KiB pieces interleaved across SMs: 4.35 TB/s. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/tma.cuh"

#define LS_THREADS 512
#define LS_WARPS (LS_THREADS / 32)
#define LS_R 8     /* rows per screen group */
#define LS_CH 2    /* 512-column chunks per load batch */
#define LS_CAP 512 /* the block's candidate list */
#define LS_PIECE 16384 /* ring kernel: bytes per piece (RP rows of cols int8), slots, pieces in flight */
#define LS_S 12
#define LS_P 4

/* acc + the dot product of 16 int8 weights (w) with 16 int16 inputs (hp: 8 pairs), exactly, in 8 dp2a. */
__device__ __forceinline__ int dot16_i8(uint4 w, const int (&hp)[8], int acc) {
    acc = __dp2a_lo(hp[0], (int)w.x, acc);
    acc = __dp2a_hi(hp[1], (int)w.x, acc);
    acc = __dp2a_lo(hp[2], (int)w.y, acc);
    acc = __dp2a_hi(hp[3], (int)w.y, acc);
    acc = __dp2a_lo(hp[4], (int)w.z, acc);
    acc = __dp2a_hi(hp[5], (int)w.z, acc);
    acc = __dp2a_lo(hp[6], (int)w.w, acc);
    acc = __dp2a_hi(hp[7], (int)w.w, acc);
    return acc;
}

/* Eight row sums (acc[r]: this lane's partial of row r) over the warp in 9 shuffles: lanes 4j .. 4j+3 hold row j. */
__device__ __forceinline__ int warp_sum_rows8(const int (&acc)[8], int lane) {
    const bool b16 = lane & 16, b8 = lane & 8, b4 = lane & 4;
    int a[4], c[2];
#pragma unroll
    for (int r = 0; r < 4; r++)
        a[r] = (b16 ? acc[4 + r] : acc[r]) + __shfl_xor_sync(0xffffffffu, b16 ? acc[r] : acc[4 + r], 16);
#pragma unroll
    for (int r = 0; r < 2; r++) c[r] = (b8 ? a[2 + r] : a[r]) + __shfl_xor_sync(0xffffffffu, b8 ? a[r] : a[2 + r], 8);
    int s = (b4 ? c[1] : c[0]) + __shfl_xor_sync(0xffffffffu, b4 ? c[0] : c[1], 4);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    return s;
}

/* The full head's sums of the 4-row group g4 (matvec.cu, MV_U 4 at 512 threads, columns [0, cols)): lanes 8j ..
 * 8j+7 return row 4 g4 + j's fp32 sum, bitwise the full head's. */
__device__ __forceinline__ float exact_rows4(const uint16_t *W, int rows, int cols, const float *xs, int g4, int lane) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < cols; k0 += 1024) {
        uint4 w[4][4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int k = k0 + u * 256 + lane * 8;
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int row = g4 * 4 + r;
                w[u][r] = row < rows && k < cols ? ld_stream(reinterpret_cast<const uint4 *>(W + (size_t)row * cols + k))
                                                 : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        gemv_dot4(w, xs, k0, cols, lane, acc);
    }
    return warp_sum_rows4(acc, lane);
}

/* RP = 0: the register kernel (any cols, a multiple of 16); RP = 16384 / cols (16 or 8): the TMA ring kernel. */
template <int RP>
__global__ void __launch_bounds__(LS_THREADS, 1) lm_screen_bf16(const __grid_constant__ LmScreenParams sp) {
    const MatvecParams &p = sp.head;
    extern __shared__ __align__(128) unsigned char smem[]; /* RP: ring [LS_S][16 KiB] | meta [LS_S][RP] float4; then
                                                              xs [cols] fp32 | hq [cols] int16 */
    __shared__ float red[32];
    __shared__ int c_row[LS_CAP];
    __shared__ float c_up[LS_CAP];
    __shared__ unsigned c_n, c_kept;
    __shared__ float m_s[LS_WARPS];
    __shared__ __align__(8) unsigned long long full[RP ? LS_S : 1], empty[RP ? LS_S : 1];
    __shared__ ArgMax am_s[LS_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = p.rows, cols = p.cols, G = gridDim.x, b = blockIdx.x;
    const int ng = (rows + LS_R - 1) / LS_R, nch = (cols + 511) / 512;
    unsigned char *ring = smem;
    const float4 *mring = reinterpret_cast<const float4 *>(smem + (RP ? LS_S * LS_PIECE : 0));
    float *xs = reinterpret_cast<float *>(smem + (RP ? LS_S * (LS_PIECE + RP * 16) : 0));
    short *hq = reinterpret_cast<short *>(xs + cols);
    Q35_TRACE_T0;

    /* the weights' first bytes go out before the wait (immutable) */
    int g = b + G * warp; /* register kernel: this warp's groups g, g + 16 G, ... */
    uint4 w[RP ? 1 : LS_CH][LS_R];
    float4 mt = make_float4(0.0f, 0.0f, 0.0f, 0.0f); /* lane < 8: (sc, c, l1, -) of row 8 g + lane */
    auto load = [&](int grp, int c0) {
#pragma unroll
        for (int c = 0; c < LS_CH; c++) {
            const int k = (c0 + c) * 512 + 16 * lane;
#pragma unroll
            for (int r = 0; r < LS_R; r++) {
                const int row = grp * LS_R + r;
                w[c][r] = row < rows && k < cols
                              ? ld_stream(reinterpret_cast<const uint4 *>(sp.Wq + (size_t)row * cols + k))
                              : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        if (c0 == 0 && lane < LS_R && grp * LS_R + lane < rows)
            mt = __ldg(reinterpret_cast<const float4 *>(sp.meta) + grp * LS_R + lane);
    };
    /* ring kernel: the block's i-th piece, rows [RP (b + G i), +RP), into slot i % LS_S with its meta */
    const int np = RP ? ((rows + RP - 1) / RP - b + G - 1) / G : 0;
    auto issue = [&](int i) {
        const int row0 = RP * (b + G * i), nr = min(RP, rows - row0), s = i % LS_S;
        const unsigned fb = (unsigned)__cvta_generic_to_shared(&full[s]);
        mbar_arrive_expect_tx(fb, (unsigned)(nr * cols + nr * 16));
        bulk_g2s((unsigned)__cvta_generic_to_shared(ring + (size_t)s * LS_PIECE), sp.Wq + (size_t)row0 * cols,
                 (unsigned)(nr * cols), fb);
        bulk_g2s((unsigned)__cvta_generic_to_shared(mring + s * RP), sp.meta + 4 * (size_t)row0, (unsigned)(nr * 16), fb);
    };
    if constexpr (RP > 0) {
        if (threadIdx.x == 0) {
            for (int s = 0; s < LS_S; s++) {
                mbar_init((unsigned)__cvta_generic_to_shared(&full[s]), 1);
                mbar_init((unsigned)__cvta_generic_to_shared(&empty[s]), 1);
            }
            mbar_init_fence();
        }
        __syncthreads();
        if (threadIdx.x == LS_THREADS - 32)
            for (int i = 0; i < min(LS_S, np); i++) issue(i);
    } else if (g < ng) {
        load(g, 0);
    }
    const bool nw_pre = p.in_mode != MV_IN_VEC && p.norm_w && cols <= 2 * LS_THREADS;
    float nwr[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int i = threadIdx.x + e * LS_THREADS;
        nwr[e] = nw_pre && i < cols ? p.norm_w[i] : 0.0f;
    }

    pdl_wait();
    /* the input row: the full head's prologue, bit for bit (MV_IN_VEC or MV_IN_RESIDUAL) */
    gemv_stage_input(p, xs, red, 0, cols, nwr, nw_pre, b == 0);
    if (p.zero) {
        const int nthr = G * LS_THREADS;
        for (int i = b * LS_THREADS + threadIdx.x; i < p.n_zero; i += nthr) p.zero[i] = 0.0f;
    }
    if (threadIdx.x == 0) c_n = 0u, c_kept = 0u;
    __syncthreads();
    pdl_trigger();
    /* ||h||_2 (rounded up) and h as integers: hq_i = rint(h_i / sh), |hq_i| < hq_max, so that every sum of cols
     * products with |q| <= 127 fits in an int32 */
    float ss = 0.0f, am = 0.0f;
    for (int i = threadIdx.x; i < cols; i += LS_THREADS) ss = fmaf(xs[i], xs[i], ss), am = fmaxf(am, fabsf(xs[i]));
    const float hn = sqrtf(block_sum(ss, red)) * 1.001f;
    am = warp_max(am);
    __syncthreads();
    if (lane == 0) red[warp] = am;
    __syncthreads();
    am = red[0];
#pragma unroll
    for (int i = 1; i < LS_WARPS; i++) am = fmaxf(am, red[i]);
    const int hq_max = min(32767, (int)(2147483647ll / (127ll * cols)));
    const float sh = am > 0.0f && am <= FLT_MAX ? am / (float)(hq_max - 1) : 1.0f, ish = 1.0f / sh;
    for (int i = threadIdx.x; i < cols; i += LS_THREADS) hq[i] = (short)__float2int_rn(xs[i] * ish);
    __syncthreads();
    const float eh = 0.51f * sh; /* |h_i - sh hq_i| <= eh */

    /* the screen: sum t of 8 rows [row8, +8) (lanes 4j .. 4j+3: row j; m4: lane j < 8 holds its meta) -> L, U; the
     * warp's running max of L, and (row, U) into the block's list when bf16(U) >= bf16(that max) */
    float mw = -INFINITY;
    auto screen8 = [&](int t, float4 m4, int row8) {
        const int j = lane >> 2, row = row8 + j;
        const float sc = __shfl_sync(0xffffffffu, m4.x, j), cc = __shfl_sync(0xffffffffu, m4.y, j),
                    l1 = __shfl_sync(0xffffffffu, m4.z, j);
        const bool valid = row < rows && row < p.n_valid;
        const float a = (float)t * (sc * sh);
        const float B = fmaf(hn, cc, eh * l1) * 1.001f + 0x1p-22f * fabsf(a);
        const float L = valid ? a - B : -INFINITY, U = a + B;
        float m = fmaxf(L, __shfl_xor_sync(0xffffffffu, L, 4)); /* lanes 4j .. 4j+3 hold the same row */
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        mw = fmaxf(mw, m);
        const bool push = valid && (lane & 3) == 0 && rbf(U) >= rbf(mw);
        const unsigned bal = __ballot_sync(0xffffffffu, push);
        if (bal) {
            unsigned base = 0;
            if (lane == 0) base = atomicAdd(&c_n, (unsigned)__popc(bal));
            base = __shfl_sync(0xffffffffu, base, 0);
            const unsigned i = base + (unsigned)__popc(bal & ((1u << lane) - 1u));
            if (push && i < LS_CAP) c_row[i] = row, c_up[i] = U;
        }
    };
    if constexpr (RP == 0) {
        for (bool first = true; g < ng; g += G * LS_WARPS) {
            int acc[LS_R];
#pragma unroll
            for (int r = 0; r < LS_R; r++) acc[r] = 0;
            for (int c0 = 0; c0 < nch; c0 += LS_CH) {
                if (!first) load(g, c0);
                first = false;
#pragma unroll
                for (int c = 0; c < LS_CH; c++) {
                    const int k = (c0 + c) * 512 + 16 * lane;
                    if (k < cols) {
                        const int4 *hp4 = reinterpret_cast<const int4 *>(hq + k);
                        const int4 h0 = hp4[0], h1 = hp4[1];
                        const int hp[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
                        for (int r = 0; r < LS_R; r++) acc[r] = dot16_i8(w[c][r], hp, acc[r]);
                    }
                }
            }
            screen8(warp_sum_rows8(acc, lane), mt, g * LS_R);
        }
    } else if (warp == LS_WARPS - 1) { /* the producer: the rest of the pieces, at most LS_P in flight */
        if (lane == 0)
            for (int i = LS_S; i < np; i++) {
                mbar_wait((unsigned)__cvta_generic_to_shared(&full[(i - LS_P) % LS_S]), ((i - LS_P) / LS_S) & 1);
                mbar_wait((unsigned)__cvta_generic_to_shared(&empty[i % LS_S]), (i / LS_S - 1) & 1);
                issue(i);
            }
    } else if (warp < LS_S) { /* consumer warp: slot `warp`, the block's pieces warp, warp + LS_S, ... */
        const unsigned fb = (unsigned)__cvta_generic_to_shared(&full[warp]),
                       eb = (unsigned)__cvta_generic_to_shared(&empty[warp]);
        const unsigned char *pc = ring + (size_t)warp * LS_PIECE;
        for (int i = warp; i < np; i += LS_S) {
            mbar_wait(fb, (i / LS_S) & 1);
            int t[RP / 8];
            float4 m4[RP / 8];
#pragma unroll
            for (int r8 = 0; r8 < RP / 8; r8++) {
                int acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
                for (int ch = 0; ch < 16384 / RP / 512; ch++) {
                    const int k = ch * 512 + 16 * lane;
                    const int4 *hp4 = reinterpret_cast<const int4 *>(hq + k);
                    const int4 h0 = hp4[0], h1 = hp4[1];
                    const int hp[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
                    for (int r = 0; r < 8; r++)
                        acc[r] = dot16_i8(*reinterpret_cast<const uint4 *>(pc + (size_t)(r8 * 8 + r) * cols + k), hp,
                                          acc[r]);
                }
                t[r8] = warp_sum_rows8(acc, lane);
                m4[r8] = lane < 8 ? mring[warp * RP + r8 * 8 + lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(eb); /* the slot is free again */
#pragma unroll
            for (int r8 = 0; r8 < RP / 8; r8++) screen8(t[r8], m4[r8], RP * (b + G * i) + r8 * 8);
        }
    }
    if (lane == 0) m_s[warp] = mw;
    __syncthreads();
    Q35_TRACE_T1; /* the step trace's t1 of this kernel: the screen is done (not the PDL release) */
    float mb = m_s[0];
#pragma unroll
    for (int i = 1; i < LS_WARPS; i++) mb = fmaxf(mb, m_s[i]);
    const float mr = rbf(mb);
    const unsigned n = c_n;
    const bool fallback = n > LS_CAP || n == 0u || !(hn <= FLT_MAX);

    /* the exact sums: the candidates, or every row of the block (register kernel: its groups of 8; ring kernel: its
     * pieces) */
    ArgMax best = {-INFINITY, INT_MAX};
    if (!fallback) {
        for (unsigned i = warp; i < n; i += LS_WARPS) {
            const int row = c_row[i];
            if (!(rbf(c_up[i]) >= mr)) continue; /* warp-uniform */
            const float s = exact_rows4(p.W, rows, cols, xs, row >> 2, lane);
            const float v = rbf(__shfl_sync(0xffffffffu, s, 8 * (row & 3)));
            if (lane == 0) {
                best = argmax_better(best, ArgMax{v, row});
                if (sp.stats) atomicAdd(&c_kept, 1u);
            }
        }
    } else {
        constexpr int G4 = (RP ? RP : LS_R) / 4; /* 4-row groups per piece / group of 8 */
        const int nk = RP ? np : (ng - b + G - 1) / G; /* the block's pieces / groups of 8 */
        for (int t = warp; t < nk * G4; t += LS_WARPS) {
            const int g4 = (b + G * (t / G4)) * G4 + t % G4;
            const float s = exact_rows4(p.W, rows, cols, xs, g4, lane);
            const int row = g4 * 4 + (lane >> 3);
            if ((lane & 7) == 0 && row < rows && row < p.n_valid) best = argmax_better(best, ArgMax{rbf(s), row});
        }
    }
    /* the block's best -> one 64-bit atomic max on *key (cuda_lm_key_id): no ticket, no block waits */
    best = warp_argmax(best);
    if (lane == 0) am_s[warp] = best;
    __syncthreads();
    Q35_TRACE_END(14);
    if (threadIdx.x == 0) {
        ArgMax bb = am_s[0];
#pragma unroll
        for (int i = 1; i < LS_WARPS; i++) bb = argmax_better(bb, am_s[i]);
        unsigned u = __float_as_uint(bb.v);
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
        atomicMax(sp.key, ((unsigned long long)u << 32) | (unsigned)~bb.i);
        if (sp.stats) {
            atomicAdd(sp.stats + 0, c_kept);
            atomicAdd(sp.stats + 1, fallback ? 1u : 0u);
            atomicAdd(sp.stats + 2, 1u);
        }
    }
}

/* One warp per row: sc = max |w| / 127, q = rint(w / sc), and in double, rounded up: c = e + 2 D u (nw + nq) and
 * l1 = ||sc q||_1 (the header's bound). A row with a non-finite weight: sc = 0, q = 0, c = inf (always a candidate). */
__global__ void __launch_bounds__(256) lm_quantize_bf16(const uint16_t *W, int rows, int cols, int8_t *q, float *meta) {
    const int lane = threadIdx.x & 31, row = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row >= rows) return;
    const uint16_t *wr = W + (size_t)row * cols;
    float amax = 0.0f;
    int bad = 0;
    for (int k = lane; k < cols; k += 32) {
        const float v = bf16u(wr[k]);
        bad |= !isfinite(v);
        amax = fmaxf(amax, fabsf(v));
    }
    amax = warp_max(amax);
    bad = __any_sync(0xffffffffu, bad);
    const float sc = bad ? 0.0f : amax / 127.0f;
    double e2 = 0.0, nw2 = 0.0, nq2 = 0.0, l1 = 0.0;
    for (int k = lane; k < cols; k += 32) {
        const float v = bf16u(wr[k]);
        int qi = sc > 0.0f ? (int)rintf(v / sc) : 0;
        qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
        q[(size_t)row * cols + k] = (int8_t)qi;
        if (!bad) {
            const double dq = (double)sc * qi, d = (double)v - dq;
            e2 += d * d, nw2 += (double)v * v, nq2 += dq * dq, l1 += fabs(dq);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        e2 += __shfl_xor_sync(0xffffffffu, e2, o);
        nw2 += __shfl_xor_sync(0xffffffffu, nw2, o);
        nq2 += __shfl_xor_sync(0xffffffffu, nq2, o);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o);
    }
    if (lane == 0) {
        const double c = sqrt(e2) + 2.0 * cols * 0x1p-24 * (sqrt(nw2) + sqrt(nq2));
        float4 m;
        m.x = sc, m.y = bad ? INFINITY : __double2float_ru(c), m.z = __double2float_ru(l1), m.w = 0.0f;
        reinterpret_cast<float4 *>(meta)[row] = m;
    }
}

extern "C" int cuda_lm_key_id(unsigned long long key, float *v) {
    const uint32_t u = (uint32_t)(key >> 32), bits = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    const int id = (int)~(uint32_t)key;
    if (v) memcpy(v, &bits, sizeof *v);
    return key == 0 || id == 0x7fffffff ? 0 : id;
}

extern "C" int cuda_lm_screen_ok(int rows, int cols) {
    return rows >= 1 && cols >= 16 && cols % 16 == 0 && cols <= 1 << 20;
}

extern "C" int cuda_lm_quantize(const uint16_t *W, int rows, int cols, int8_t *q, float *meta, const CudaLaunch *l) {
    if (!W || !q || !meta || !cuda_lm_screen_ok(rows, cols)) return (int)cudaErrorInvalidValue;
    lm_quantize_bf16<<<(rows + 7) / 8, 256, 0, l->stream>>>(W, rows, cols, q, meta);
    return launch_status(l->stream);
}

extern "C" int cuda_lm_screen(const LmScreenParams *sp, const CudaLaunch *l) {
    const MatvecParams *p = &sp->head;
    if (!sp->Wq || !sp->meta || !sp->key || !p->W || !cuda_lm_screen_ok(p->rows, p->cols) ||
        p->out_mode != MV_OUT_ARGMAX || (p->in_mode != MV_IN_VEC && p->in_mode != MV_IN_RESIDUAL) || !p->x ||
        p->splits != 1 || p->blocks < 1 || (p->in_mode == MV_IN_VEC && p->norm_w) || (p->x_out && p->x_out == p->x))
        return (int)cudaErrorInvalidValue;
    /* the ring kernel where a piece is 16 or 8 whole rows (sm_90: TMA) unless asked for the register kernel */
    int dev = 0, cc = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return (int)e;
    const int rp = sp->reg || cc < 9 ? 0 : p->cols == 1024 ? 16 : p->cols == 2048 ? 8 : 0;
    void (*kern)(LmScreenParams) = rp == 16 ? lm_screen_bf16<16> : rp == 8 ? lm_screen_bf16<8> : lm_screen_bf16<0>;
    const size_t smem = (rp ? (size_t)LS_S * (LS_PIECE + 16 * rp) : 0) + (sizeof(float) + sizeof(short)) * (size_t)p->cols;
    if (smem > 40 * 1024 && (e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
        return (int)e;
    return launch_kernel(kern, dim3((unsigned)p->blocks), dim3(LS_THREADS), smem, l, *sp);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_lm_screen)
