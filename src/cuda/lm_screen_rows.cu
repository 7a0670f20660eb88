/* lm_screen_rows.cu — the LM head's argmax of up to 64 rows through a quantized screen (ops.h cuda_lm_rows; the
 * batched step's passes whose rows are all greedy and ask for no logprob).
 *
 * Why: a greedy row needs only the index of its largest logit, and the LM head is the largest weight the batched step
 * reads (248320 x 1024 bf16, 509 MB: ~190 us of a 1.9 ms step at B = 64 on an H100, then ~35 us more to find the
 * picks in the logits). An int8 copy of the head (cuda_lm_quantize: per-row scale sc_r, q = rint(w / sc_r)) read on
 * the int8 tensor cores bounds every logit of every row for half the bytes; only the head rows whose bound reaches
 * a row's best lower bound can be its argmax, and those are recomputed from the bf16 head by the skinny GEMM itself
 * (GemmParams.gather), so the picks are those of the full head's logits bit for bit.
 *
 * The bound (lm_screen.cu's header, with the tensor cores' sums). Row m's exact logit of head row r is
 * E = bf16(s), s the skinny GEMM's fp32 sum of the exact products h_i w_ri; |s - h.w_r| <= 8 D u ||h||_2 ||w_r||_2
 * (u = 2^-24: four times the sequential rounding bound, for the tensor cores' accumulation order). h becomes integers
 * hq_i = rint(h_i / sh), sh = max |h| / (hq_max - 1), |hq_i| < hq_max <= 32640 with D 127 hq_max < 2^31, split as
 * hq = 256 hi + lo (hi in [-127, 127], lo in [-128, 127]: both int8), so T = 256 sum hi q + sum lo q = sum hq q is
 * exact (the two int32 sums from the tensor cores, combined mod 2^32: T itself fits). With a = fl(fl(T) fl(sc sh)),
 * c_r = e_r + 8 D u (||w_r|| + ||sc q_r||) and l1_r = ||sc q_r||_1 (meta_rows, rounded up):
 *   B = fl(1.001 n) c_r + fl(0.5105 sh) l1_r + 4u |a|,  n = 1.001 ||h||_2,  L = a - B <= s <= U = a + B
 * (the factors 1.001 cover the rounding of B's own few operations many times over).
 * M = any max of L's is at most the winner's s, so every row that can win (ties included) has bf16(U) >= bf16(M):
 * those are the candidates. ~0.6 of the logits' standard deviation wide on random weights.
 *
 * Four launches (NR = 16, 32 or 64: the smallest that holds the rows):
 *   lsr_prep    grid NR: row m's hq as hi (operand row m) and lo (row NR + m) in the 2 NR-row int8 operand X of the
 *               screen (swz128_tile_off), its sh and ||h||_2 (rounded up; infinite where h is not finite: every head
 *               row is then its candidate); resets the running maxima and the candidate count.
 *   lsr_screen  persistent, one CTA per SM: the head in tiles of 64 rows (tile b + G i for CTA b of G); consumer
 *               warpgroups 0 and 1 take the even and odd i, each fed by a producer warp of its own that streams its
 *               tiles' 8 KB pieces (64 rows x 128 k) by bulk copies into its own ring. X stays in shared memory
 *               (D / 128 pieces of 2 NR x 128 bytes, loaded once). Per piece four wgmma m64n(2 NR)k32 s8 (A = the
 *               piece, B = X: hi and lo side by side), then per tile the bounds of its 64 x NR (head row, row) pairs
 *               while the other warpgroup runs its MMAs. Each row's running max of L (the CTA's, in shared memory,
 *               and the grid's, published by atomic max when it grows and read a tile ahead) sets the bar; a pair
 *               whose U reaches lsr_thr(bar) goes into the CTA's list (row, head row, U). After its last tile the CTA
 *               filters its list by the grid's maxima as they then stand (bf16(U) >= bf16(bar)) and adds the
 *               surviving head rows to the union of candidates (a bit per head row dedupes them; a list full before
 *               that adds its pushes to the union at once: a superset).
 *   the rescoring  cuda_gemm_skinny over the union's head rows (GemmParams.gather): y[m][j] = E of row m at head
 *               row list[j], every row against every candidate.
 *   lsr_pick    grid rows: row m's argmax over the union (argmax_better: the smaller id among equals); clears the
 *               union's bits for the next call.
 * A stale maximum only lowers the bar, so the union is a superset of what the final maxima would keep. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda/async.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"

#define LSR_ROWS 64   /* rows per call at most */
#define LSR_CAP  1024 /* a CTA's list of pairs */
/* warps 0-3 and 4-7: consumer warpgroups 0 and 1 (alternate tiles); warps 8, 9: their producers */
#define LSR_THREADS 320
#define LSR_PIECE   8192 /* a ring slot: one piece of a head tile, 64 rows x 128 k */

/* The rows' operand X has 2 NR rows (hi: 0 .. NR - 1, lo: NR .. 2 NR - 1), NR = 16, 32 or 64, the smallest that holds
 * the call's rows: the wgmma is m64n(2 NR)k32 and the epilogue handles NR rows, so a pass of 8 rows pays for 16, not
 * 64. Each consumer warpgroup has a ring of its own of lsr_ns(NR) slots (the shared memory X leaves). */
static __host__ __device__ constexpr int lsr_ns(int NR) { return NR == 64 ? 5 : 8; }
static __host__ __device__ constexpr int lsr_nr(int rows) { return rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }

/* The workspace: the candidate count, the rows' running maxima (ord_f32), sh and ||h||_2, X, the union's bits and
 * its list. */
struct LsrWs {
    unsigned *count, *gmax, *mask;
    float *sh, *hn;
    int8_t *x;
    int *list;
};
static __host__ __device__ size_t lsr_al(size_t b) { return (b + 1023) & ~(size_t)1023; }
static __host__ __device__ LsrWs lsr_ws(void *ws, int V, int D, size_t *bytes) {
    char *b = (char *)ws;
    size_t o = 0;
    LsrWs w;
    w.count = (unsigned *)(b + o), o += lsr_al(sizeof(unsigned));
    w.gmax = (unsigned *)(b + o), o += lsr_al(sizeof(unsigned) * LSR_ROWS);
    w.sh = (float *)(b + o), o += lsr_al(sizeof(float) * LSR_ROWS);
    w.hn = (float *)(b + o), o += lsr_al(sizeof(float) * LSR_ROWS);
    w.x = (int8_t *)(b + o), o += lsr_al((size_t)2 * LSR_ROWS * D);
    w.mask = (unsigned *)(b + o), o += lsr_al(sizeof(unsigned) * (size_t)((V + 31) / 32));
    w.list = (int *)(b + o), o += lsr_al(sizeof(int) * (size_t)V);
    if (bytes) *bytes = o;
    return w;
}

/* grid NR, 128 threads: row m of X (hi at operand row m, lo at NR + m) and its scalars (the header); rows m >= rows
 * zero. */
__global__ void __launch_bounds__(128) lsr_prep(const __grid_constant__ LmRowsParams p) {
    Q35_TRACE_T0;
    pdl_begin();
    Q35_TRACE_T1;
    __shared__ float red[32];
    const int m = blockIdx.x, NR = gridDim.x, tid = threadIdx.x, D = p.D;
    const LsrWs w = lsr_ws(p.ws, p.V, D, NULL);
    const bool live = m < p.rows;
    const uint16_t *h = p.h + (size_t)(live ? m : 0) * p.ldh;
    float ss = 0.0f, am = 0.0f;
    for (int k = tid; k < D; k += 128) {
        const float v = live ? bf16u(h[k]) : 0.0f;
        ss = fmaf(v, v, ss);
        am = fmaxf(am, fabsf(v));
    }
    const float hn = sqrtf(block_sum(ss, red)) * 1.001f;
    am = warp_max(am);
    __syncthreads(); /* block_sum's last reads of red */
    if ((tid & 31) == 0) red[tid >> 5] = am;
    __syncthreads();
    am = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    const int hq_max = min(32640, (int)(2147483647ll / (127ll * D))); /* hi = (hq + 128) >> 8 <= 127 */
    const float sh = am > 0.0f && am <= FLT_MAX ? am / (float)(hq_max - 1) : 1.0f, ish = 1.0f / sh;
    for (int k = tid; k < D; k += 128) {
        const int hq = live ? __float2int_rn(bf16u(h[k]) * ish) : 0, hi = (hq + 128) >> 8;
        w.x[swz128_tile_off(m, k, D, 2 * NR)] = (int8_t)hi;
        w.x[swz128_tile_off(NR + m, k, D, 2 * NR)] = (int8_t)(hq - 256 * hi);
    }
    if (tid == 0) {
        w.sh[m] = live ? sh : 0.0f;
        w.hn[m] = !live ? 0.0f : isfinite(hn) ? hn : INFINITY;
        w.gmax[m] = 0u;
        if (m == 0) *w.count = 0u;
    }
    Q35_TRACE_END(86); /* step trace ids (tools/step_trace.py) */
}

/* The smallest bf16 value below rbf(b), as a float (-inf for -inf): U >= it for every U with rbf(U) >= rbf(b), so a
 * push test U >= lsr_thr(bar) keeps every pair the exact test rbf(U) >= rbf(bar) keeps (and a few more). */
__device__ __forceinline__ float lsr_thr(float b) {
    const float r = rbf(b);
    if (r == -INFINITY || r != r) return r;
    if (r == 0.0f) return -0x1p-133f; /* the smallest bf16 subnormal, negated */
    const unsigned u = __float_as_uint(r);
    return __uint_as_float(r > 0.0f ? u - 0x10000u : u + 0x10000u);
}

/* head row R into the union of candidates (once: its bit) */
__device__ __forceinline__ void lsr_emit(const LsrWs &w, int R) {
    const unsigned bit = 1u << (R & 31);
    if (!(atomicOr(&w.mask[R >> 5], bit) & bit)) w.list[atomicAdd(w.count, 1u)] = R;
}

/* grid min(n_sm, tiles), LSR_THREADS threads, lsr_smem bytes (the header). Shared memory: X (D / 128 pieces of
 * 2 NR x 128 bytes), the two rings, their barriers. */
static size_t lsr_smem(int D, int NR) {
    return (size_t)(D / 128) * (256 * NR) + 2 * lsr_ns(NR) * LSR_PIECE + 8 * (4 * lsr_ns(NR) + 1) + 1024;
}
template <int NR>
__global__ void __launch_bounds__(LSR_THREADS, 1) lsr_screen(const __grid_constant__ LmRowsParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NS = lsr_ns(NR), J = NR / 8, XP = 256 * NR; /* J: 8-column groups of hi (and of lo) */
    Q35_TRACE_T0;
    extern __shared__ __align__(1024) uint8_t smem[];
    __shared__ unsigned le[LSR_CAP], s_max[NR], s_g[NR], s_pub[NR], s_n;
    __shared__ float lu[LSR_CAP], s_thr[2][NR];
    __shared__ float4 s_row[NR]; /* row m's {sh, fl(1.001 n), fl(0.5105 sh)}; NaN for m >= rows: its L and U NaN */
    const uint32_t sX = (smem_addr(smem) + 1023u) & ~1023u;
    const int P = p.D >> 7, T = (p.V + 63) >> 6, G = gridDim.x, b = blockIdx.x;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t sR = sX + (uint32_t)(P * XP), sB = sR + 2 * NS * LSR_PIECE;
    /* ring c's slot s, its full and empty barriers */
    auto slot = [&](int c, int s) { return sR + (uint32_t)(c * NS + s) * LSR_PIECE; };
    auto full = [&](int c, int s) { return sB + 8u * (uint32_t)(c * NS + s); };
    auto empty = [&](int c, int s) { return sB + 8u * (uint32_t)(2 * NS + c * NS + s); };
    const uint32_t xbar = sB + 32u * NS;
    const int ntiles = b < T ? (T - 1 - b) / G + 1 : 0; /* the CTA's tiles b + G it; warpgroup c takes it = c mod 2 */
    const LsrWs w = lsr_ws(p.ws, p.V, p.D, NULL);
    if (tid == 0) {
        for (int s = 0; s < 2 * NS; s++) mbar_init(sB + 8u * s, 1), mbar_init(sB + 8u * (2 * NS + s), 4);
        mbar_init(xbar, 1);
        mbar_init_fence();
        s_n = 0u;
    }
    if (tid < NR) s_max[tid] = 0u, s_pub[tid] = 0u;
    __syncthreads();

    Q35_TRACE_T1_DECL;
    if (warp >= 8) { /* producer c: its warpgroup's piece q = tile 2 (q / P) + c of the CTA, piece q % P, slot q % NS */
        const int c = warp - 8, nq = (ntiles - c + 1) / 2 * P;
        if (lane == 0) {
            auto issue = [&](int q) {
                const int s = q % NS, t = b + (2 * (q / P) + c) * G;
                mbar_arrive_expect_tx(full(c, s), LSR_PIECE);
                bulk_g2s(slot(c, s), p.Wt + ((size_t)t * P + q % P) * LSR_PIECE, LSR_PIECE, full(c, s));
            };
            int q = 0;
            for (; q < NS && q < nq; q++) issue(q); /* the head is immutable: before the wait */
            pdl_wait();
            if (c == 0) {
                mbar_arrive_expect_tx(xbar, (uint32_t)(P * XP));
                for (int pc = 0; pc < P; pc++)
                    bulk_g2s(sX + (uint32_t)(pc * XP), w.x + (size_t)pc * XP, (uint32_t)XP, xbar);
            }
            for (; q < nq; q++) {
                mbar_wait(empty(c, q % NS), (uint32_t)(q / NS - 1) & 1u);
                issue(q);
            }
        } else {
            pdl_wait();
        }
    } else { /* consumer warpgroup c */
        const int c = warp >> 2, wt = tid & 127, wq = warp & 3;
        pdl_begin();
        Q35_TRACE_T1_SET;
        if (tid < NR) {
            const float sh = w.sh[tid];
            s_row[tid] = tid < p.rows ? make_float4(sh, 1.001f * w.hn[tid], 0.5105f * sh, 0.0f)
                                      : make_float4(NAN, NAN, NAN, NAN);
            s_g[tid] = *(volatile unsigned *)&w.gmax[tid];
        }
        bar_sync(1, 256);
        mbar_wait(xbar, 0u);
        volatile unsigned *vmax = s_max, *vg = s_g;
        const int g = lane >> 2, tq = lane & 3;
        auto push = [&](int R, int m, float U) {
            const unsigned i = atomicAdd(&s_n, 1u);
            if (i < LSR_CAP)
                le[i] = (unsigned)R << 6 | (unsigned)m, lu[i] = U;
            else
                lsr_emit(w, R);
        };
        int q = 0;
        for (int it = c; it < ntiles; it += 2) {
            const int t = b + it * G, RA = t * 64 + 16 * wq + g, RB = RA + 8;
            /* the grid's maxima, read now and taken after this tile's sums: the L2 round trip under the MMAs */
            const unsigned gnow = wt < NR ? *(volatile unsigned *)&w.gmax[wt] : 0u;
            /* the head rows' {sc, c, l1}; NaN past n_valid: their L and U NaN */
            const float4 n4 = make_float4(NAN, NAN, NAN, NAN);
            const float4 mA = RA < p.n_valid ? __ldg((const float4 *)p.meta + RA) : n4,
                         mB = RB < p.n_valid ? __ldg((const float4 *)p.meta + RB) : n4;
            int acc[2 * J][4];
#pragma unroll
            for (int j = 0; j < 2 * J; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[j][e] = 0, reg_fence(acc[j][e]);
            for (int pc = 0; pc < P; pc++, q++) {
                const int s = q % NS;
                mbar_wait(full(c, s), (uint32_t)(q / NS) & 1u);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wgmma_s8<2 * NR>(acc, wgmma_desc(slot(c, s) + kk * 32),
                                     wgmma_desc(sX + (uint32_t)(pc * XP) + kk * 32));
                wgmma_commit();
                if (pc > 0) {
                    wgmma_wait<1>(); /* piece q - 1 is done: its slot goes back */
                    if (lane == 0) mbar_arrive(empty(c, (q - 1) % NS));
                }
            }
            wgmma_wait<0>();
#pragma unroll
            for (int j = 0; j < 2 * J; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) reg_fence(acc[j][e]);
            if (lane == 0) mbar_arrive(empty(c, (q - 1) % NS));

            /* the bounds of the thread's pairs: head rows RA (e < 2) and RB, rows m = 8 j + 2 tq + (e & 1); a pair past
             * the rows or n_valid has L = -inf and U = NaN (never pushed) */
            float Ls[J][4], Us[J][4];
#pragma unroll
            for (int j = 0; j < J; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float4 rm = s_row[8 * j + 2 * tq + (e & 1)], mt = e < 2 ? mA : mB;
                    const int Ti = (int)((unsigned)acc[j][e] * 256u + (unsigned)acc[j + J][e]);
                    const float a = (float)Ti * (mt.x * rm.x);
                    const float B = fmaf(rm.y, mt.y, rm.z * mt.z) + 0x1p-22f * fabsf(a);
                    const float L = a - B;
                    Ls[j][e] = L == L ? L : -INFINITY;
                    Us[j][e] = a + B;
                }
                /* the tile's max of L per row over the warp's 16 head rows -> the CTA's */
#pragma unroll
            for (int j = 0; j < J; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float l = fmaxf(Ls[j][e], Ls[j][e + 2]);
                    l = fmaxf(l, __shfl_xor_sync(0xffffffffu, l, 4));
                    l = fmaxf(l, __shfl_xor_sync(0xffffffffu, l, 8));
                    l = fmaxf(l, __shfl_xor_sync(0xffffffffu, l, 16));
                    if (g == 0) atomicMax(&s_max[8 * j + 2 * tq + e], ord_f32(l));
                }
            bar_sync(2 + c, 128);
            /* publish the CTA's max where it grew (no reply awaited); take the grid's read above; the push threshold */
            if (wt < NR) {
                const unsigned cur = vmax[wt];
                if (cur > s_pub[wt]) {
                    atomicMax(&w.gmax[wt], cur);
                    atomicMax(&s_pub[wt], cur);
                }
                const unsigned gm = max(atomicMax(&s_g[wt], gnow), gnow);
                s_thr[c][wt] = lsr_thr(unord_f32(max(cur, gm)));
            }
            bar_sync(2 + c, 128);
#pragma unroll
            for (int j = 0; j < J; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (Us[j][e] >= s_thr[c][8 * j + 2 * tq + (e & 1)])
                        push(e < 2 ? RA : RB, 8 * j + 2 * tq + (e & 1), Us[j][e]);
        }
        /* the list by the grid's maxima as they stand now -> the union */
        bar_sync(1, 256);
        if (tid < NR) {
            const unsigned cur = vmax[tid], old = atomicMax(&w.gmax[tid], cur);
            vg[tid] = old > cur ? old : cur;
        }
        bar_sync(1, 256);
        const unsigned n = s_n < LSR_CAP ? s_n : LSR_CAP;
        for (unsigned i = tid; i < n; i += 256)
            if (rbf(lu[i]) >= rbf(unord_f32(vg[le[i] & 63u]))) lsr_emit(w, (int)(le[i] >> 6));
    }
    Q35_TRACE_END(87); /* the producer warps too: every thread reaches it */
#else
    (void)p;
    __trap(); /* built without sm_90a: cuda_lm_rows_ok is 0 there */
#endif
}

/* grid rows, 256 threads: row m's argmax over the union; this CTA's share of the union's bits cleared. */
__global__ void __launch_bounds__(256) lsr_pick(const __grid_constant__ LmRowsParams p) {
    Q35_TRACE_T0;
    pdl_begin();
    Q35_TRACE_T1;
    __shared__ ArgMax am[8];
    const LsrWs w = lsr_ws(p.ws, p.V, p.D, NULL);
    const int m = blockIdx.x, tid = threadIdx.x, n = (int)*w.count;
    const float *y = p.y + (size_t)m * p.V;
    ArgMax best = {-INFINITY, INT_MAX};
    for (int j = tid; j < n; j += 256) {
        const int id = w.list[j];
        if (id < p.n_valid) best = argmax_better(best, ArgMax{y[j], id});
    }
    best = warp_argmax(best);
    if ((tid & 31) == 0) am[tid >> 5] = best;
    __syncthreads();
    if (tid == 0) {
        ArgMax b = am[0];
        for (int i = 1; i < 8; i++) b = argmax_better(b, am[i]);
        p.out[m] = b.i == INT_MAX ? 0 : b.i;
    }
    for (int j = m * 256 + tid; j < n; j += (int)gridDim.x * 256) w.mask[w.list[j] >> 5] = 0u;
    Q35_TRACE_END(88);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_lm_rows)

/* whether lsr_screen runs its sm_90a code on this device; asked once */
static int lsr_wg(void) {
    static int wg = -1;
    if (wg >= 0) return wg;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, lsr_screen<64>) != cudaSuccess) return 0;
    wg = fa.binaryVersion == 90;
    return wg;
}

extern "C" int cuda_lm_rows_ok(int V, int D) {
    return V >= 8 && V % 8 == 0 && V < (1 << 25) && D >= 128 && D <= 1024 && D % 128 == 0 && lsr_wg();
}

extern "C" size_t cuda_lm_rows_ws_bytes(int V, int D) {
    size_t b = 0;
    lsr_ws(NULL, V, D, &b);
    return b;
}

extern "C" size_t cuda_lm_rows_tiles_bytes(int V, int D) { return (size_t)(V + 63) / 64 * 64 * (size_t)D; }

/* lsr_screen<NR> on grid with smem bytes of dynamic shared memory */
template <int NR>
static int lsr_launch(const LmRowsParams *p, dim3 grid, int smem, const CudaLaunch *l) {
    const cudaError_t e = smem_attr<lsr_screen<NR>>(smem);
    return e != cudaSuccess ? (int)e : launch_kernel(lsr_screen<NR>, grid, dim3(LSR_THREADS), smem, l, *p);
}

extern "C" int cuda_lm_rows(const LmRowsParams *p, const CudaLaunch *l) {
    if (!p || !l || !p->h || !p->W || !p->Wt || !p->meta || !p->ws || !p->y || !p->out || p->rows < 1 ||
        p->rows > LSR_ROWS || p->ldh < p->D || p->ldh % 8 || p->n_valid < 1 || p->n_valid > p->V || p->n_sm < 1 ||
        !cuda_lm_rows_ok(p->V, p->D) || ((uintptr_t)p->Wt & 15) || ((uintptr_t)p->ws & 15) || ((uintptr_t)p->meta & 15))
        return (int)cudaErrorInvalidValue;
    const int NR = lsr_nr(p->rows), T = (p->V + 63) / 64, smem = (int)lsr_smem(p->D, NR);
    int rc = launch_kernel(lsr_prep, dim3((unsigned)NR), dim3(128), 0, l, *p);
    if (rc) return rc;
    const dim3 grid((unsigned)(T < p->n_sm ? T : p->n_sm));
    rc = NR == 16   ? lsr_launch<16>(p, grid, smem, l)
         : NR == 32 ? lsr_launch<32>(p, grid, smem, l)
                    : lsr_launch<64>(p, grid, smem, l);
    if (rc) return rc;
    const LsrWs w = lsr_ws(p->ws, p->V, p->D, NULL);
    GemmParams g;
    memset(&g, 0, sizeof g);
    g.x = p->h;
    g.w = p->W;
    g.y = p->y;
    g.M = p->rows;
    g.N = p->V;
    g.K = p->D;
    g.ldx = p->ldh;
    g.ldw = p->D;
    g.ldy = p->V;
    g.epi = GEMM_EPI_F32;
    g.narrow = 1; /* the full head's 64-column chunks (its grid is many waves) */
    g.gather = w.list;
    g.n_dyn = w.count;
    if ((rc = cuda_gemm_skinny(&g, NULL, 0, p->n_sm, l))) return rc;
    return launch_kernel(lsr_pick, dim3((unsigned)p->rows), dim3(256), 0, l, *p);
}

extern "C" long cuda_lm_rows_count(const LmRowsParams *p) {
    unsigned n = 0;
    const LsrWs w = lsr_ws(p->ws, p->V, p->D, NULL);
    return cudaMemcpy(&n, w.count, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess ? (long)n : -1;
}
