/* lm_screen.cu — the greedy step's LM head argmax through a quantized screen (ops.h cuda_lm_screen; the engine's
 * default for greedy steps that write no logits).
 *
 * Why: the LM head is a third of the step's bytes (248320 x 1024 bf16, 509 MB: ~120 us at the card's streaming rate),
 * and a greedy step needs only the index of its largest logit. An int8 copy of the head (per-row scale, made once at
 * load by cuda_lm_quantize) bounds every logit; only the rows whose bound reaches the best lower bound can be the
 * argmax, and those (a few per block at the 0.8B shape) are recomputed from the bf16 rows by the full head's own
 * code. The id and its value are the full head's, bit for bit: the screen only decides which rows need the exact sum.
 * H200, 0.8B: ~-60 us per greedy token against the full head.
 *
 * The bound. Row r's exact logit is E_r = bf16(s_r), s_r the fp32 sum of the full head (gemv.cu MV_OUT_ARGMAX:
 * every product h_i w_ri exact in fp32, D - 1 roundings: |s_r - h.w_r| <= (D - 1) u ||h||_2 ||w_r||_2, u = 2^-24).
 * The screen takes h as integers, hq_i = rint(h_i / sh) (sh = max |h| / (hq_max - 1), hq_max such that D 127 hq_max
 * < 2^31: every sum is an exact int32), and the int8 rows q_r (cuda_lm_quantize: sc_r = max |w_r| / 127,
 * q = rint(w / sc_r)), so T_r = sum_i hq_i q_ri is exact and a_r = fl(fl(T_r) fl(sc_r sh)) is within 3u |a_r| of
 * sc_r sh T_r. With e_r = ||w_r - sc_r q_r||_2, l1_r = ||sc_r q_r||_1 and |h_i - sh hq_i| <= 0.51 sh:
 *   |sc_r sh T_r - h.w_r| <= 0.51 sh l1_r + ||h||_2 e_r,
 * so with c_r = e_r + 2 D u (||w_r||_2 + ||sc_r q_r||_2) (stored rounded up, as l1_r) the kernel takes
 *   B_r = 1.001 (1.001 ||h||_2 c_r + 0.51 sh l1_r) + 4u |a_r|,  L_r = a_r - B_r <= s_r <= U_r = a_r + B_r
 * (the slack covers the roundings of B, L and U). bf16 rounding is monotone: bf16(L_r) <= E_r <= bf16(U_r). With
 * M any L_r (or their max), the winner r* has E_r* >= bf16(M), so every row that can win (ties included) has
 * bf16(U_r) >= bf16(M): those are the candidates. At the 0.8B shape with random weights B_r is about a quarter of the
 * logits' standard deviation (e_r ~ 0.75 % of ||w_r||_2).
 *
 * The ring kernel (cols 1024 or 2048 on sm_90, the default there) reads only 6 of q's 8 bits: u = q + 128 = 4 hi + lo
 * (hi < 64, lo < 4; cuda_lm_quantize stores hi as 4 + 2 bit planes, Wp, and only the bound of lo). With
 * t = sum hq hi (exact), T = 4 t + sum hq lo - 128 sum hq, and |sum hq (lo - 1.5)| <= ||hq||_2 ||lo - 1.5||_2, so
 *   a6 = (4 t + 1.5 S - 128 S) sc sh (S = sum hq),  B6 = B + sh ||hq||_2 c6,  c6 = sc ||lo - 1.5||_2 (rounded up)
 * bound s_r likewise with ~4.7x the width: ~195 MB read (meta included) instead of ~258. The rows whose U6 reaches
 * the best L are few once the blocks share their running max (gmax: ~14 per block), and their exact sums follow
 * directly (2 KB each: one DRAM round trip; a pass over their 2 low bits first, which cut them to ~1 per block, cost
 * an L2 round trip more and was 4.4 us slower).
 *
 * Register kernel layout (512 threads, one block per SM, grid = the full head's am_val capacity): groups of 8 int8
 * rows (8 KiB at D = 1024) go to warps round-robin across the blocks (group b + G (w + 16 i) to warp w of block b),
 * so at any moment the chip reads one contiguous front of the matrix. Lane l reads 16 bytes of each row at columns
 * 512 c + 16 l (c < 2 per batch: 16 loads, 256 B per lane in flight; the first batch before pdl_wait) and multiplies
 * them with its 16 hq (shared memory, packed in pairs) in 8 dp2a; the 8 row sums meet in 9 shuffles. Each warp keeps
 * its running max of L and pushes (row, U) into the block's list when bf16(U) >= bf16(its max): a superset of the
 * candidates, since the max only grows. At the end the block takes M_b = max over its warps, compacts the listed
 * rows with bf16(U) >= bf16(M_b) and recomputes them, two rows per warp at a time, exactly as the full head does
 * (gemv's U = 4 layout, dot8 in the same order, warp_sum_rows4 with the row at its place in its 4-row group: a row's
 * sum never mixes with its group's others, so only the row itself is read): its best is the block's best of the
 * exact logits over all its rows. The blocks' bests meet in one 64-bit atomic max (*key: the value's bits in a
 * monotone order, then the complement of the id), so no block waits for another and no last block reduces them: the
 * host reads the key (cuda_lm_key_id). A block whose list overflows (LS_CAP), that keeps no row (register kernel: NaN input) or whose
 * ||h|| is not finite computes all its rows exactly instead: slower, the same answer.
 *
 * The ring kernel streams Wp by one producer thread (warp 15) in pieces of RP whole rows (24 KiB: RP 32 at 1024
 * columns) plus their meta into S slots of shared memory, at most LS_P = 4 pieces in flight after the first S, which
 * go out before the PDL wait; consumer warp c takes slot c's pieces (one consumer per slot: an mbarrier's parity then
 * never aliases two generations); the block's pieces are b + G i (interleaved across SMs). Lane l
 * sums columns 1024 c + 32 l + [0, 32) of each row (its hq in registers). Its list push also compares with gmax (the
 * blocks' running max of L, published by atomic max, read once per piece), and a block may keep no row. The stream
 * is read with an L2 evict-first policy (LmScreenParams.l2ef). */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/async.cuh"
#include "cuda/mma.cuh"

#define LS_THREADS 512
#define LS_WARPS   (LS_THREADS / 32)
#define LS_R       8            /* rows per screen group */
#define LS_CH      2            /* 512-column chunks per load batch */
#define LS_CAP     512          /* the block's candidate list */
#define LS_RING    (180 * 1024) /* ring kernel: bytes of its slots (S = LS_RING / piece, at most 15: 7 at 24 KiB pieces; */
#define LS_P       4            /* 8 measured the same), pieces in flight (6: the same) */

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

/* acc + the dot product of 32 columns' 6 high bits of u = q + 128 (nb: 32 low nibbles, tp: 32 top pairs, in
 * cuda_lm_quantize's order: word j of the 8 four-column words = nibbles j & 1 of nb's word j / 2, pairs j % 4 of tp's
 * word j / 4) with 32 int16 inputs (hp: 16 pairs), exactly, in 16 dp2a. */
__device__ __forceinline__ int dot32_u6(uint4 nb, uint2 tp, const int (&hp)[16], int acc) {
    const unsigned n4[4] = {nb.x, nb.y, nb.z, nb.w}, t2[2] = {tp.x, tp.y};
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const unsigned b = (j & 1 ? n4[j >> 1] >> 4 : n4[j >> 1]) & 0x0f0f0f0fu;
        const int sh = 2 * (j & 3);
        const unsigned t = (sh <= 4 ? t2[j >> 2] << (4 - sh) : t2[j >> 2] >> (sh - 4)) & 0x30303030u;
        acc = __dp2a_lo(hp[2 * j], (int)(b | t), acc);
        acc = __dp2a_hi(hp[2 * j + 1], (int)(b | t), acc);
    }
    return acc;
}

/* Rows ra and rb's sums (rb < 0: none) as exact_rows4 gives them, bitwise (a row's sum is its own dot8 chain over
 * the lanes' columns, then warp_sum_rows4 with the row at its place r & 3), every lane; both rows' loads go out
 * before either sum. */
__device__ __forceinline__ float2 exact_row2(const uint16_t *W, int cols, const float *xs, int ra, int rb, int lane) {
    float a = 0.0f, c = 0.0f;
    for (int k0 = 0; k0 < cols; k0 += 1024) {
        uint4 wa[4], wb[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int k = k0 + u * 256 + lane * 8;
            wa[u] = k < cols ? ld_stream(reinterpret_cast<const uint4 *>(W + (size_t)ra * cols + k))
                             : make_uint4(0u, 0u, 0u, 0u);
            wb[u] = k < cols && rb >= 0 ? ld_stream(reinterpret_cast<const uint4 *>(W + (size_t)rb * cols + k))
                                        : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int k = k0 + u * 256 + lane * 8;
            if (k < cols) {
                const float4 *xp = reinterpret_cast<const float4 *>(xs + k);
                const float4 a4 = xp[0], b4 = xp[1];
                const float xv[8] = {a4.x, a4.y, a4.z, a4.w, b4.x, b4.y, b4.z, b4.w};
                a = dot8(wa[u], xv, a);
                c = dot8(wb[u], xv, c);
            }
        }
    }
    float acc[4];
#pragma unroll
    for (int r = 0; r < 4; r++) acc[r] = r == (ra & 3) ? a : 0.0f;
    const float sa = warp_sum_rows4(acc, lane);
#pragma unroll
    for (int r = 0; r < 4; r++) acc[r] = r == (rb & 3) ? c : 0.0f;
    const float sb = warp_sum_rows4(acc, lane);
    return make_float2(__shfl_sync(0xffffffffu, sa, 8 * (ra & 3)), __shfl_sync(0xffffffffu, sb, 8 * (rb & 3)));
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

/* The full head's sums of the 4-row group g4 (gemv.cu, MV_U 4 at 512 threads, columns [0, cols)): lanes 8j ..
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
                w[u][r] = row < rows && k < cols
                              ? ld_stream(reinterpret_cast<const uint4 *>(W + (size_t)row * cols + k))
                              : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        gemv_dot4(w, xs, k0, cols, lane, acc);
    }
    return warp_sum_rows4(acc, lane);
}

/* RP = 0: the register kernel (any cols, a multiple of 16; int8 rows Wq). RP > 0: the TMA ring kernel (cols = 1024 NC;
 * the 6-bit rows Wp, then the 2 low bits Wl of the rows that survive): pieces of RP whole rows. */
template <int RP, int NC>
__global__ void __launch_bounds__(LS_THREADS, 1) lm_screen_bf16(const __grid_constant__ LmScreenParams sp) {
    constexpr int RB = 768 * NC, PB = RP * RB;                          /* ring: bytes per row and per piece */
    constexpr int S = RP ? (LS_RING / PB < 15 ? LS_RING / PB : 15) : 1; /* slots (one consumer warp each) */
    const MatvecParams &p = sp.head;
    extern __shared__ __align__(128) unsigned char smem[]; /* RP: ring [S][PB] | meta [S][RP] float4; then
                                                              xs [cols] fp32 | hq [cols] int16 */
    __shared__ float red[32];
    __shared__ int c_row[LS_CAP];
    __shared__ float c_up[LS_CAP];
    __shared__ unsigned c_n, c_m;
    __shared__ int c_sel[LS_CAP]; /* the listed rows still in reach at the end */
    __shared__ float m_s[LS_WARPS], m_g;
    __shared__ long long s0_s, sq_s;
    __shared__ __align__(8) unsigned long long full[S], empty[S];
    __shared__ ArgMax am_s[LS_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = p.rows, cols = p.cols, G = gridDim.x, b = blockIdx.x;
    const int ng = (rows + LS_R - 1) / LS_R, nch = (cols + 511) / 512;
    unsigned char *ring = smem;
    const float4 *mring = reinterpret_cast<const float4 *>(smem + (RP ? S * PB : 0));
    float *xs = reinterpret_cast<float *>(smem + (RP ? S * (PB + RP * 16) : 0));
    short *hq = reinterpret_cast<short *>(xs + cols);
    Q35_TRACE_T0;

    /* the weights' first bytes go out before the wait (immutable) */
    int g = b + G * warp; /* register kernel: this warp's groups g, g + 16 G, ... */
    uint4 w[RP ? 1 : LS_CH][LS_R];
    float4 mt = make_float4(0.0f, 0.0f, 0.0f, 0.0f); /* lane < 8: (sc, c, l1, c6) of row 8 g + lane */
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
    /* ring kernel: the block's i-th piece, rows [RP (b + G i), +RP), into slot i % S with its meta */
    const int np = RP ? ((rows + RP - 1) / RP - b + G - 1) / G : 0;
    auto issue = [&](int i) {
        const int row0 = RP * (b + G * i), nr = min(RP, rows - row0), s = i % S;
        const unsigned fb = (unsigned)__cvta_generic_to_shared(&full[s]);
        const unsigned dw = (unsigned)__cvta_generic_to_shared(ring + (size_t)s * PB),
                       dm = (unsigned)__cvta_generic_to_shared(mring + s * RP);
        mbar_arrive_expect_tx(fb, (unsigned)(nr * RB + nr * 16));
        const uint64_t pol = l2_evict_first_policy(); /* read once: evict-first */
        bulk_g2s_ef(dw, sp.Wp + (size_t)row0 * RB, (unsigned)(nr * RB), fb, pol);
        bulk_g2s_ef(dm, sp.meta + 4 * (size_t)row0, (unsigned)(nr * 16), fb, pol);
    };
    if constexpr (RP > 0) {
        if (threadIdx.x == 0) {
            for (int s = 0; s < S; s++) {
                mbar_init((unsigned)__cvta_generic_to_shared(&full[s]), 1);
                mbar_init((unsigned)__cvta_generic_to_shared(&empty[s]), 1);
            }
            mbar_init_fence();
        }
        __syncthreads();
        if (threadIdx.x == LS_THREADS - 32)
            for (int i = 0; i < min(S, np); i++) issue(i);
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
    if (threadIdx.x == 0) {
        c_n = 0u;
        c_m = 0u;
        s0_s = 0;
        sq_s = 0;
    }
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
    long long s0 = 0, sq = 0; /* ring: sum hq and sum hq^2, exactly */
    for (int i = threadIdx.x; i < cols; i += LS_THREADS) {
        const int v = __float2int_rn(xs[i] * ish);
        hq[i] = (short)v;
        s0 += v;
        sq += (long long)v * v;
    }
    if (RP) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, o);
            sq += __shfl_xor_sync(0xffffffffu, sq, o);
        }
        if (lane == 0)
            atomicAdd(reinterpret_cast<unsigned long long *>(&s0_s), (unsigned long long)s0),
                atomicAdd(reinterpret_cast<unsigned long long *>(&sq_s), (unsigned long long)sq);
    }
    __syncthreads();
    s0 = s0_s;
    const float eh = 0.51f * sh;                                   /* |h_i - sh hq_i| <= eh */
    const float shq = sh * (sqrtf((float)sq_s) * 1.001f) * 1.001f; /* >= sh ||hq||_2 */

    /* the screen: sum t of 8 rows [row8, +8) (lanes 4j .. 4j+3: row j; m4: lane j < 8 holds its meta) -> L, U; the
     * warp's running max of L, and (row, U) into the block's list when bf16(U) >= bf16(that max) (ring: of that max
     * and the blocks' running max gm). Ring: t is the sum over u's 6 high bits, the 2 low bits bounded by c6. */
    float mw = -INFINITY, gm = -INFINITY, mw_pub = -INFINITY;
    auto screen8 = [&](int t, float4 m4, int row8) {
        const int j = lane >> 2, row = row8 + j;
        const float sc = __shfl_sync(0xffffffffu, m4.x, j), cc = __shfl_sync(0xffffffffu, m4.y, j),
                    l1 = __shfl_sync(0xffffffffu, m4.z, j), c6 = __shfl_sync(0xffffffffu, m4.w, j);
        const bool valid = row < rows && row < p.n_valid;
        /* register: a = t sc sh; ring: sum hq q = 4 t + sum hq lo - 128 s0, lo in [0, 3] -> 4 t + 1.5 s0 - 128 s0 */
        const float a = RP ? (float)(8ll * t - 253ll * s0) * (0.5f * (sc * sh)) : (float)t * (sc * sh);
        const float B8 = fmaf(hn, cc, eh * l1), B = (RP ? fmaf(shq, c6, B8) : B8) * 1.001f + 0x1p-22f * fabsf(a);
        const float L = valid ? a - B : -INFINITY, U = a + B;
        float m = fmaxf(L, __shfl_xor_sync(0xffffffffu, L, 4)); /* lanes 4j .. 4j+3 hold the same row */
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        mw = fmaxf(mw, m);
        const bool push = valid && (lane & 3) == 0 && rbf(U) >= rbf(fmaxf(mw, gm));
        const unsigned bal = __ballot_sync(0xffffffffu, push);
        if (bal) {
            unsigned base = 0;
            if (lane == 0) base = atomicAdd(&c_n, (unsigned)__popc(bal));
            base = __shfl_sync(0xffffffffu, base, 0);
            const unsigned i = base + (unsigned)__popc(bal & ((1u << lane) - 1u));
            if (push && i < LS_CAP) {
                c_row[i] = row;
                c_up[i] = U;
            }
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
            for (int i = S; i < np; i++) {
                mbar_wait((unsigned)__cvta_generic_to_shared(&full[(i - LS_P) % S]), ((i - LS_P) / S) & 1);
                mbar_wait((unsigned)__cvta_generic_to_shared(&empty[i % S]), (i / S - 1) & 1);
                issue(i);
            }
    } else if (warp < S) { /* consumer warp: slot `warp`, the block's pieces warp, warp + S, ... */
        const unsigned fb = (unsigned)__cvta_generic_to_shared(&full[warp]),
                       eb = (unsigned)__cvta_generic_to_shared(&empty[warp]);
        const unsigned char *pc = ring + (size_t)warp * PB;
        int hp[NC][16]; /* this lane's columns 1024 c + 32 lane + [0, 32), as int16 pairs */
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int e = 0; e < 16; e++) hp[c][e] = reinterpret_cast<const int *>(hq + 1024 * c + 32 * lane)[e];
        for (int i = warp; i < np; i += S) {
            /* the blocks' running max, read now, used after the sums */
            const unsigned gv = sp.gmax ? *reinterpret_cast<volatile unsigned *>(sp.gmax) : 0u;
            mbar_wait(fb, (i / S) & 1);
            int t[RP / 8];
            float4 m4[RP / 8];
#pragma unroll
            for (int r8 = 0; r8 < RP / 8; r8++) {
                int acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
                for (int c = 0; c < NC; c++)
#pragma unroll
                    for (int r = 0; r < 8; r++) {
                        const unsigned char *rp = pc + (size_t)(r8 * 8 + r) * RB + 768 * c;
                        acc[r] = dot32_u6(*reinterpret_cast<const uint4 *>(rp + 16 * lane),
                                          *reinterpret_cast<const uint2 *>(rp + 512 + 8 * lane), hp[c], acc[r]);
                    }
                t[r8] = warp_sum_rows8(acc, lane);
                m4[r8] = lane < 8 ? mring[warp * RP + r8 * 8 + lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(eb); /* the slot is free again */
            gm = fmaxf(gm, unord_f32(gv));
#pragma unroll
            for (int r8 = 0; r8 < RP / 8; r8++) screen8(t[r8], m4[r8], RP * (b + G * i) + r8 * 8);
            if (sp.gmax && mw > mw_pub && lane == 0) atomicMax(sp.gmax, ord_f32(mw)); /* every L is a lower bound */
            mw_pub = fmaxf(mw_pub, mw);
        }
    }
    if (lane == 0) m_s[warp] = mw;
    if (threadIdx.x == 0) m_g = RP && sp.gmax ? unord_f32(*reinterpret_cast<volatile unsigned *>(sp.gmax)) : -INFINITY;
    __syncthreads();
    Q35_TRACE_T1; /* the step trace's t1 of this kernel: the screen is done (not the PDL release) */
    float mb = m_g;
#pragma unroll
    for (int i = 0; i < LS_WARPS; i++) mb = fmaxf(mb, m_s[i]);
    const unsigned n = c_n;
    /* the register kernel keeps at least its best row; the ring kernel's block may keep none (gm) */
    const bool fallback = n > LS_CAP || (!RP && n == 0u) || !(hn <= FLT_MAX);
    const float mr = rbf(mb);

    /* the exact sums: of the listed rows still in reach (compacted, then two per warp, both rows' loads out at once:
     * one DRAM round trip for up to 32 rows), or of every row of the block (register kernel: its groups of 8; ring
     * kernel: its pieces) */
    ArgMax best = {-INFINITY, INT_MAX};
    if (!fallback) {
        for (unsigned i = threadIdx.x; i < n; i += LS_THREADS)
            if (rbf(c_up[i]) >= mr) c_sel[atomicAdd(&c_m, 1u)] = c_row[i];
        __syncthreads();
        const unsigned m = c_m;
        for (unsigned j = warp; j < m; j += 2 * LS_WARPS) {
            const int ra = c_sel[j], rb = j + LS_WARPS < m ? c_sel[j + LS_WARPS] : -1;
            const float2 v = exact_row2(p.W, cols, xs, ra, rb, lane);
            best = argmax_better(best, ArgMax{rbf(v.x), ra});
            if (rb >= 0) best = argmax_better(best, ArgMax{rbf(v.y), rb});
        }
    } else {
        constexpr int G4 = (RP ? RP : LS_R) / 4;       /* 4-row groups per piece / group of 8 */
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
        atomicMax(sp.key, ((unsigned long long)ord_f32(bb.v) << 32) | (unsigned)~bb.i);
        if (sp.stats) {
            atomicAdd(sp.stats + 0, fallback ? 0u : c_m);
            atomicAdd(sp.stats + 1, fallback ? 1u : 0u);
            atomicAdd(sp.stats + 2, 1u);
        }
    }
}

/* One warp per row: sc = max |w| / 127, q = rint(w / sc), and in double, rounded up: c = e + 2 D u (nw + nq),
 * l1 = ||sc q||_1 and c6 = sc ||lo - 1.5||_2 (the header's bounds). A row with a non-finite weight: sc = 0, q = 0,
 * c = inf (always a candidate). Wq: q; Wp: the 6 high bits of u = q + 128, lane l's columns 1024 c + 32 l + 4 j + m
 * (j < 8, m < 4) at row chunk c (768 bytes): nibble j & 1 of byte 16 l + 4 (j / 2) + m = (u >> 2) & 15, bits 2 (j % 4)
 * of byte 512 + 8 l + 4 (j / 4) + m = u >> 6 (lm_screen_bf16's dot32_u6 reads them so). Wt: q in the rows screen's
 * tiles (swz128_tile_off, 64 rows), with meta_rows = {sc, e + 8 D u (nw + nq), l1, 0}: its exact sums come from
 * the tensor cores, whose fp32 accumulation order is not the GEMV's, so its bound takes 4 times the rounding term. */
__global__ void __launch_bounds__(256) lm_quantize_bf16(const uint16_t *W, int rows, int cols, int8_t *q, uint8_t *wp,
                                                        float *meta, int8_t *wt, float *meta_rows) {
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
    auto quant = [&](int k) {
        int qi = sc > 0.0f ? (int)rintf(bf16u(wr[k]) / sc) : 0;
        return qi > 127 ? 127 : qi < -127 ? -127 : qi;
    };
    double e2 = 0.0, nw2 = 0.0, nq2 = 0.0, l1 = 0.0, lo2 = 0.0;
    for (int k = lane; k < cols; k += 32) {
        const float v = bf16u(wr[k]);
        const int qi = quant(k);
        if (q) q[(size_t)row * cols + k] = (int8_t)qi;
        if (wt) wt[swz128_tile_off(row, k, cols, 64)] = (int8_t)qi;
        if (!bad) {
            const double dq = (double)sc * qi, d = (double)v - dq, dl = (double)((qi + 128) & 3) - 1.5;
            e2 += d * d;
            nw2 += (double)v * v;
            nq2 += dq * dq;
            l1 += fabs(dq);
            lo2 += dl * dl;
        }
    }
    if (wp)
        for (int c = 0; c < cols / 1024; c++) {
            unsigned nb[4] = {0u, 0u, 0u, 0u}, tp[2] = {0u, 0u};
            for (int j = 0; j < 8; j++)
                for (int m = 0; m < 4; m++) {
                    const unsigned u = (unsigned)(quant(1024 * c + 32 * lane + 4 * j + m) + 128);
                    nb[j >> 1] |= ((u >> 2) & 15u) << (8 * m + 4 * (j & 1));
                    tp[j >> 2] |= (u >> 6) << (8 * m + 2 * (j & 3));
                }
            uint8_t *pr = wp + (size_t)row * (cols / 4 * 3) + 768 * c;
            *reinterpret_cast<uint4 *>(pr + 16 * lane) = make_uint4(nb[0], nb[1], nb[2], nb[3]);
            *reinterpret_cast<uint2 *>(pr + 512 + 8 * lane) = make_uint2(tp[0], tp[1]);
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        e2 += __shfl_xor_sync(0xffffffffu, e2, o);
        nw2 += __shfl_xor_sync(0xffffffffu, nw2, o);
        nq2 += __shfl_xor_sync(0xffffffffu, nq2, o);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o);
        lo2 += __shfl_xor_sync(0xffffffffu, lo2, o);
    }
    if (lane == 0) {
        const double c = sqrt(e2) + 2.0 * cols * 0x1p-24 * (sqrt(nw2) + sqrt(nq2));
        float4 m;
        m.x = sc;
        m.y = bad ? INFINITY : __double2float_ru(c);
        m.z = __double2float_ru(l1);
        m.w = __double2float_ru((double)sc * sqrt(lo2));
        if (meta) reinterpret_cast<float4 *>(meta)[row] = m;
        m.y = bad ? INFINITY : __double2float_ru(sqrt(e2) + 8.0 * cols * 0x1p-24 * (sqrt(nw2) + sqrt(nq2)));
        m.w = 0.0f;
        if (meta_rows) reinterpret_cast<float4 *>(meta_rows)[row] = m;
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

/* Rows per piece of the ring kernel (0: the register kernel): 24 KiB pieces at 1024 and 2048 columns where the
 * device has TMA (sm_90). H200, 0.8B head, 1024 columns: 16 / 24 / 32 / 40 / 48 rows measured. */
static int ring_rp(int cols) {
    int dev = 0, cc = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev))
        return 0;
    return cc < 9 ? 0 : cols == 1024 ? 32 : cols == 2048 ? 16 : 0;
}

extern "C" int cuda_lm_screen_ring(int rows, int cols) { return cuda_lm_screen_ok(rows, cols) && ring_rp(cols) > 0; }

extern "C" int cuda_lm_quantize(const uint16_t *W, int rows, int cols, int8_t *q, uint8_t *wp, float *meta,
                                int8_t *wt, float *meta_rows, const CudaLaunch *l) {
    if (!W || !cuda_lm_screen_ok(rows, cols) || (!meta && (q || wp)) || (!q && !wp && !wt) || (wp && cols % 1024) ||
        (!wt != !meta_rows) || (wt && cols % 128))
        return (int)cudaErrorInvalidValue;
    if (wt && rows % 64) { /* the last tile's rows past the head read as zeros */
        const size_t tile = (size_t)64 * cols, last = (size_t)(rows / 64) * tile;
        const cudaError_t e = cudaMemsetAsync(wt + last, 0, tile, l->stream);
        if (e != cudaSuccess) return (int)e;
    }
    lm_quantize_bf16<<<(rows + 7) / 8, 256, 0, l->stream>>>(W, rows, cols, q, wp, meta, wt, meta_rows);
    return launch_status(l->stream);
}

extern "C" int cuda_lm_screen(const LmScreenParams *sp, const CudaLaunch *l) {
    const MatvecParams *p = &sp->head;
    const int rp = sp->reg ? 0 : ring_rp(p->cols);
    if (!sp->meta || !sp->key || !p->W || !cuda_lm_screen_ok(p->rows, p->cols) || (rp ? !sp->Wp : !sp->Wq) ||
        p->out_mode != MV_OUT_ARGMAX || (p->in_mode != MV_IN_VEC && p->in_mode != MV_IN_RESIDUAL) || !p->x ||
        p->splits != 1 || p->blocks < 1 || (p->in_mode == MV_IN_VEC && p->norm_w) || (p->x_out && p->x_out == p->x))
        return (int)cudaErrorInvalidValue;
    void (*kern)(LmScreenParams) = rp == 32   ? lm_screen_bf16<32, 1>
                                   : rp == 16 ? lm_screen_bf16<16, 2>
                                              : lm_screen_bf16<0, 1>;
    const int pb = rp * 768 * (p->cols / 1024), s = rp ? (LS_RING / pb < 15 ? LS_RING / pb : 15) : 0;
    const size_t smem = (size_t)s * (pb + 16 * rp) + (sizeof(float) + sizeof(short)) * (size_t)p->cols;
    cudaError_t e;
    if (smem > 40 * 1024 && (e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
        return (int)e;
    return launch_kernel(kern, dim3((unsigned)p->blocks), dim3(LS_THREADS), smem, l, *sp);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_lm_screen)
