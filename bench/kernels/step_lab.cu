/* step_lab.cu — the skeleton of a persistent decode step: can one kernel keep DRAM streaming across the step's
 * ~100 dependent GEMV phases, if each SM streams its pieces of every phase, in order, through a paced shared-memory
 * ring while the phases wait on each other? (docs/PERF_NOTES.md §24-26: the one design left with the gain that
 * 0.60 ms/token needs.)
 *
 * One launch = one step of Qwen3.5-0.8B's GEMV bytes: 24 layers (3 DeltaNet + 1 attention, x6) of
 *   in (8224 or 5120 rows x 1024), [mixer], out (1024 x 2048), gate/up (7168 x 1024), down (1024 x 3584)
 * and the LM head (248320 x 1024), 1.50 GB, on 132 blocks x 512 threads (one per SM). A phase's rows are cut into
 * pieces of whole rows (<= `piece` bytes: 16 KB = 8 rows of K = 1024); block b owns either a row range of every
 * phase ("rows") or its pieces b, b + G, b + 2 G, ... ("interleaved"); no split-K. Warp 15, lane 0 is the
 * producer: it streams the block's pieces of all phases, in order, into a ring of S slots (TMA bulk copies, a
 * "full" mbarrier per slot), at most P in flight, and reuses a slot once its consumer released it (an "empty"
 * mbarrier). Warps 0..14 consume: per phase they read the phase's input vector (K floats) into shared memory, then
 * piece q of the step goes into slot q % S and is warp (q % S)'s (one consumer per slot: S <= 15; with 15 warps on
 * fewer slots a warp could wait on a slot two generations ahead, which an mbarrier's parity cannot tell apart), which
 * sums its rows in registers (each lane 16 B per row per 512-byte chunk), releases the slot and stores the rows.
 *
 * How a phase waits for the previous one (mode):
 *   0 step:    a grid barrier (one counter, atom.add.release.gpu, spin on ld.acquire), then a plain input read;
 *   7 tagged:  no barrier: the previous phase's outputs are (epoch << 32 | float) words and each thread polls its
 *              share of them until their epoch is this launch's (one L2 round trip when they are there);
 *   1 stream:  no inter-SM wait at all (the ring and the consumers' own rate); 3: the same, pieces released unread;
 *   2 chain:   barriers and input reads, no weights; 6: the producer alone (no consumers, burst_lab paced's loop);
 *   4 / 5:     no ring: each warp loads its own 8 KB piece into registers, the next one issued before the barrier
 *              (`direct`), with a barrier (4) or none (5); pf: + L2 prefetch of the phase(s) ahead.
 * lw: 1 lane 0 alone polls a full slot; 2 consumers do no sums; 3 teams of 4 warps per piece; 4 sums unrolled per
 * shape (ring_sum); 7 all 12 warps on every piece, each a row (K 1024) or a third / sixth of one (2048, 3584: partial
 * sums meet in shared memory, stored at the phase's end), its x chunks in registers for the phase. A mixer phase (the DeltaNet recurrence or the attention) is `mixer_ns` of spinning.
 * Prints ms per step (median of REPS launches; the same 1.50 GB each time, > L2), and for some rows block 0's mean
 * time per kind of phase. PERF_NOTES §26 has the tables and what they say.
 *
 *   build: make build/bench/step_lab (sm_90a)      run: build/bench/step_lab */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/async.cuh"
#include "lab.cuh"

#define REPS 9
#define RING_MAX (192u << 10)
#define S_MAX 24 /* the consumers: S <= 15 (one warp per slot); the producer alone: up to 24 */
#define XMAX 4096        /* floats of the input vector in shared memory (K <= XMAX) */
#define XB 8             /* input words per consumer thread (K <= 480 XB) */
#define RPP_MAX 8        /* rows per piece (K = 1024, 16 KB: 8 rows of 2 KB) */
#define YS_MAX 128       /* lw 7: partial sums of a phase's rows when a row is split over warps (K > 1024) */
#define MAX_PH 160

struct Phase {
    const unsigned char *w; /* [N][K] bf16 */
    int N, K;
    int mixer;              /* 1: no weights; a barrier then mixer_ns of spinning */
    int prev;               /* tagged mode: the GEMV phase whose output is this phase's input (-1: p.x) */
    int prevm;              /* tagged mode with mixer outputs (p.mixrt): the mixer phase this phase reads instead (-1: none) */
    long long yo;           /* tagged mode: this phase's outputs at yt + yo (-1: the LM head, plain floats in y) */
};
__constant__ Phase c_ph[MAX_PH];

struct LP {
    int n_ph, P, S, mode; /* mode: see the top of the file */
    unsigned piece;       /* bytes per piece at most (consumers: <= 16 KB, RPP_MAX rows; S x piece <= RING_MAX) */
    int il;               /* 1: block b owns pieces b, b + G, b + 2 G, ... of each phase (interleaved), 0: a row range */
    int lw;               /* consumers: 1 lane 0 alone polls, 2 no sums, 3 teams of 4 warps, 4 sums unrolled per shape,
                           * 7 all 12 warps on every piece (a row or a part of one each), x in registers */
    int pf;               /* direct: at a phase's start, L2-prefetch the block's pieces of the pf-th GEMV phase ahead */
    long long mixer_ns;
    const float *x;       /* XMAX floats: every phase's input */
    float *y;             /* outputs: [phase][N] (LM head included) */
    unsigned *bar;        /* grid barrier counter (zeroed before each launch) */
    unsigned long long *stamp; /* block 0: [phase] start, relative to the kernel's start; [MAX_PH]: end;
                                * [MAX_PH + 1]: ns the producer waited for a free slot */
    unsigned *sink;
    unsigned long long *yt; /* tagged mode: every GEMV phase's outputs as (epoch << 32 | float) words */
    unsigned epoch;         /* tagged mode: this launch's epoch base (phase f's outputs carry epoch + f) */
    int mixrt;              /* tagged mode: a mixer reads its block's share of the previous GEMV's outputs (62 of
                             * 8224) and writes its share of 2048 tagged outputs, which the next GEMV reads */
    int norm;               /* an RMS norm of the input (block reduction) before the K = 1024 phases */
};

__device__ __forceinline__ void grid_barrier(unsigned *ctr, unsigned target) {
    unsigned v;
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(v) : "l"(ctr) : "memory");
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
    } while ((int)(v - target) < 0);
}
/* block b's pieces of an N-row phase: rows per piece so that a piece is <= p.piece; np pieces */
__device__ __forceinline__ void pieces(const LP &p, const Phase &ph, int b, int G, int *np, int *rpp) {
    *rpp = max(1, (int)(p.piece / (2u * (unsigned)ph.K)));
    if (p.il) {
        const int NP = (ph.N + *rpp - 1) / *rpp;
        *np = b < NP ? (NP - b + G - 1) / G : 0;
    } else {
        const int nr = (int)((long long)ph.N * (b + 1) / G) - (int)((long long)ph.N * b / G);
        *np = (nr + *rpp - 1) / *rpp;
    }
}
/* piece j of block b: its first row and its row count */
__device__ __forceinline__ void piece_rows(const LP &p, const Phase &ph, int b, int G, int j, int rpp, int *row0,
                                           int *rows) {
    if (p.il) {
        *row0 = (b + j * G) * rpp;
        *rows = min(rpp, ph.N - *row0);
    } else {
        const int r0 = (int)((long long)ph.N * b / G), r1 = (int)((long long)ph.N * (b + 1) / G);
        *row0 = r0 + j * rpp;
        *rows = min(rpp, r1 - *row0);
    }
}

/* words src[lo + k], k = tid + 480 u < n, once all carry epoch e: all in flight at once, then the missing polled
 * again; each value to out(lo + k, value) */
template <typename F>
__device__ __forceinline__ void tag_poll(const unsigned long long *src, int lo, int n, unsigned e, int tid, F out) {
    unsigned long long v[XB];
    unsigned need = 0;
#pragma unroll
    for (int u = 0; u < XB; u++)
        if (tid + u * 480 < n) v[u] = tag_ld(src + lo + tid + u * 480), need |= 1u << u;
    const unsigned long long ts = gtimer();
    while (need) {
#pragma unroll
        for (int u = 0; u < XB; u++)
            if ((need >> u & 1) && (unsigned)(v[u] >> 32) == e)
                out(lo + tid + u * 480, __uint_as_float((unsigned)v[u])), need &= ~(1u << u);
#pragma unroll
        for (int u = 0; u < XB; u++)
            if (need >> u & 1) v[u] = tag_ld(src + lo + tid + u * 480);
        if (need && gtimer() - ts > 2000000000ull) __trap();
    }
}

/* lw 4: one warp sums a whole piece, unrolled for its shape (CPR chunks of 512 bytes per row, RPP rows): every
 * chunk's ring load and the input's loads are independent of the sums, 2 x CPR input loads per piece */
template <int CPR, int RPP>
__device__ __forceinline__ void ring_sum(const uint4 *pc, const float *xs, int lane, int rows, float (&a)[RPP_MAX]) {
#pragma unroll
    for (int c = 0; c < CPR; c++) {
        const float4 *xp = reinterpret_cast<const float4 *>(xs + c * 256 + lane * 8);
        const float4 u = xp[0], v = xp[1];
        const float xv[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
        uint4 w[RPP];
#pragma unroll
        for (int t = 0; t < RPP; t++) w[t] = t < rows ? pc[(t * CPR + c) * 32 + lane] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int t = 0; t < RPP; t++) a[t] = dot8(w[t], xv, a[t]);
    }
}

__global__ void __launch_bounds__(512, 1) step(const __grid_constant__ LP p) {
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ __align__(8) unsigned long long full[S_MAX], empty[S_MAX];
    __shared__ __align__(16) float xs[XMAX];
    __shared__ float red[16];
    __shared__ float ys[YS_MAX];
    __shared__ unsigned long long t0_s;
    const int b = blockIdx.x, G = gridDim.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (int i = 0; i < p.S; i++) {
            mbar_init((unsigned)__cvta_generic_to_shared(&full[i]), 1);
            mbar_init((unsigned)__cvta_generic_to_shared(&empty[i]), p.lw == 3 ? 4 : p.lw == 7 ? 12 : 1);
        }
        mbar_init_fence();
        t0_s = gtimer();
    }
    __syncthreads();
    const unsigned long long t0 = t0_s;
    float acc = 0.0f;
    if (warp == 15) { /* ---- the producer ---- */
        if (lane != 0 || p.mode == 2) return;
        unsigned i = 0; /* pieces issued */
        unsigned long long waited = 0;
        for (int f = 0; f < p.n_ph; f++) {
            const Phase ph = c_ph[f];
            if (ph.mixer) continue;
            int np, rpp;
            pieces(p, ph, b, G, &np, &rpp);
            for (int j = 0; j < np; j++, i++) {
                int row0, rows;
                piece_rows(p, ph, b, G, j, rpp, &row0, &rows);
                const unsigned s = i % p.S, bytes = rows * 2u * ph.K;
                if (i >= (unsigned)p.P) /* pace: piece i - P has landed */
                    mbar_wait((unsigned)__cvta_generic_to_shared(&full[(i - p.P) % p.S]), ((i - p.P) / p.S) & 1);
                if (i >= (unsigned)p.S && p.mode != 6) { /* the slot's previous piece has been consumed */
                    const unsigned long long tw = gtimer();
                    mbar_wait((unsigned)__cvta_generic_to_shared(&empty[s]), ((i / p.S) - 1) & 1);
                    waited += gtimer() - tw;
                }
                const unsigned fb = (unsigned)__cvta_generic_to_shared(&full[s]);
                mbar_arrive_expect_tx(fb, bytes);
                bulk_g2s((unsigned)__cvta_generic_to_shared(ring + (size_t)s * p.piece),
                         ph.w + ((size_t)row0 * ph.K) * 2, bytes, fb);
            }
        }
        if (p.mode == 6) /* no consumer waits for the last pieces: land them before the block exits */
            for (unsigned k = i > (unsigned)p.P ? i - p.P : 0; k < i; k++)
                mbar_wait((unsigned)__cvta_generic_to_shared(&full[k % p.S]), (k / p.S) & 1);
        if (b == 0) p.stamp[MAX_PH + 1] = waited, p.stamp[MAX_PH] = gtimer() - t0;
        return;
    }
    if (p.mode == 6) return; /* the producer alone, paced by its own landings (burst_lab paced's loop) */
    /* ---- warps 0..14: the phases; piece q (counted over the whole step, as the producer does) goes into slot
     * q % S and is warp (q % S)'s: each slot has one consumer, so a warp waits on a slot's next generation only
     * after consuming its previous one (S <= 15; warps S..14 only load inputs and take barriers) ---- */
    unsigned i = 0, nbar = 0;
    for (int f = 0; f < p.n_ph; f++) {
        const Phase ph = c_ph[f];
        if (b == 0 && tid == 0) p.stamp[f] = gtimer() - t0;
        if (ph.mixer) {
            const bool rt = p.mode == 7 && p.mixrt;
            if (rt) { /* the block's share of the previous GEMV's outputs (its heads' q, k, v, gates) */
                const Phase pp = c_ph[ph.prev];
                const int lo = (int)((long long)pp.N * b / G), hi = (int)((long long)pp.N * (b + 1) / G);
                tag_poll(p.yt + pp.yo, lo, hi - lo, p.epoch + (unsigned)ph.prev, tid, [&](int k, float v) { xs[k - lo] = v; });
                bar_sync(1, 480);
            }
            if (p.mode != 1 && p.mode != 3 && p.mixer_ns > 0) { /* (tagged: the spin alone, no barrier) */
                const unsigned long long ts = gtimer();
                while ((long long)(gtimer() - ts) < p.mixer_ns) {
                }
            }
            if (rt) { /* and its share of the mixer's outputs, tagged */
                const int lo = (int)((long long)ph.N * b / G), hi = (int)((long long)ph.N * (b + 1) / G);
                for (int k = lo + tid; k < hi; k += 480) tag_st(p.yt + ph.yo + k, p.epoch + (unsigned)f, xs[0]);
            }
        } else {
            int np_, rpp;
            pieces(p, ph, b, G, &np_, &rpp);
            const int pv = p.mixrt && ph.prevm >= 0 ? ph.prevm : ph.prev;
            if (p.mode == 7 && pv >= 0) { /* tagged: spin on the previous phase's words, no grid barrier */
                tag_poll(p.yt + c_ph[pv].yo, 0, ph.K, p.epoch + (unsigned)pv, tid, [&](int k, float v) { xs[k] = v; });
                bar_sync(1, 480);
                if (b == 0 && tid == 0) p.stamp[MAX_PH + 2 + f] = gtimer() - t0;
            } else if (p.mode != 3) { /* "no sums" reads no input and keeps no phase order: the ring alone */
                float v[XB]; /* the input: one L2 round trip */
#pragma unroll
                for (int u = 0; u < XB; u++)
                    if (tid + u * 480 < ph.K) v[u] = __ldcg(p.x + tid + u * 480);
#pragma unroll
                for (int u = 0; u < XB; u++)
                    if (tid + u * 480 < ph.K) xs[tid + u * 480] = v[u];
                bar_sync(1, 480);
            }
            if (p.norm && ph.K == 1024 && p.mode != 3) { /* the RMS norm: every block reduces the whole input */
                float ss = 0.0f;
                for (int k = tid; k < ph.K; k += 480) ss += xs[k] * xs[k];
                ss = warp_sum(ss);
                if (lane == 0) red[warp] = ss;
                bar_sync(1, 480);
                float t = 0.0f;
#pragma unroll
                for (int w = 0; w < 15; w++) t += red[w];
                const float r = rsqrtf(t / ph.K + 1e-6f);
                for (int k = tid; k < ph.K; k += 480) xs[k] *= r;
                bar_sync(1, 480);
            }
            const int cpr = ph.K / 256; /* 512-byte chunks per row (K % 256 == 0 here) */
            const unsigned np = (unsigned)np_;
            if (p.lw == 7 && p.mode != 2 && p.mode != 3) { /* every piece by all 12 warps, x in registers */
                /* warp w: row w / nw of each piece (nw warps per row), its chunks [c0, c0 + nc) of the row */
                const int rpr = rpp, nw = 12 / rpr; /* 16 KB: K 1024 8 rows (nw 1: warps 8..11 idle), 2048 4 (3), 3584 2 (6) */
                const int myrow = warp / max(nw, 1), sl = warp % max(nw, 1);
                const int base = cpr / nw, extra = cpr % nw;
                const int c0 = sl * base + min(sl, extra), nc = base + (sl < extra ? 1 : 0);
                float xr[4][8];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (u < nc) {
                        const float4 *xp = reinterpret_cast<const float4 *>(xs + (c0 + u) * 256 + lane * 8);
                        const float4 a0 = xp[0], a1 = xp[1];
                        xr[u][0] = a0.x, xr[u][1] = a0.y, xr[u][2] = a0.z, xr[u][3] = a0.w;
                        xr[u][4] = a1.x, xr[u][5] = a1.y, xr[u][6] = a1.z, xr[u][7] = a1.w;
                    }
                const bool split = nw > 1; /* a row's chunks over nw warps: partial sums meet in ys */
                if (split)
                    for (int t = tid; t < (int)np * rpr; t += 480) ys[t] = 0.0f;
                bar_sync(1, 480);
                for (unsigned j = 0; warp < 12 && j < np; j++) {
                    const unsigned q = i + j, s = q % p.S;
                    int row0, rows;
                    piece_rows(p, ph, b, G, (int)j, rpp, &row0, &rows);
                    mbar_wait((unsigned)__cvta_generic_to_shared(&full[s]), (q / p.S) & 1);
                    const uint4 *pc = reinterpret_cast<const uint4 *>(ring + (size_t)s * p.piece);
                    float acc = 0.0f;
                    const bool mine = myrow < rows && myrow < rpr;
                    if (mine) {
#pragma unroll
                        for (int u = 0; u < 4; u++)
                            if (u < nc) acc = dot8(pc[(myrow * cpr + c0 + u) * 32 + lane], xr[u], acc);
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive((unsigned)__cvta_generic_to_shared(&empty[s]));
                    if (mine) {
                        const float d = warp_sum(acc);
                        if (lane == 0) {
                            if (split) atomicAdd(&ys[j * rpr + myrow], d);
                            else if (p.mode == 7 && ph.yo >= 0) tag_st(p.yt + ph.yo + row0 + myrow, p.epoch + (unsigned)f, d);
                            else __stcg(p.y + row0 + myrow, d);
                        }
                    }
                }
                if (split) { /* the phase's rows, once all partial sums are in */
                    bar_sync(1, 480);
                    for (int t = tid; t < (int)np * rpr; t += 480) {
                        int row0, rows;
                        piece_rows(p, ph, b, G, t / rpr, rpp, &row0, &rows);
                        if (t % rpr >= rows) continue;
                        if (p.mode == 7 && ph.yo >= 0) tag_st(p.yt + ph.yo + row0 + t % rpr, p.epoch + (unsigned)f, ys[t]);
                        else __stcg(p.y + row0 + t % rpr, ys[t]);
                    }
                }
                i += np;
            } else {
            /* lw 3 (teams): warps 0..11 as 3 teams of 4, slot s is team s % 3's (S % 3 == 0), warp tw of a team
             * sums the piece's rows tw, tw + 4, ... */
            const bool teams = p.lw == 3;
            const unsigned nstep = teams ? 3u : (unsigned)p.S, who = teams ? warp / 4 : warp;
            const int tw = teams ? warp % 4 : 0, tstep = teams ? 4 : 1;
            if (p.mode != 2)
                for (unsigned j = (who + nstep - i % nstep) % nstep; warp < (teams ? 12 : p.S) && j < np; j += nstep) {
                    const unsigned q = i + j, s = q % p.S;
                    int row0, rows;
                    piece_rows(p, ph, b, G, (int)j, rpp, &row0, &rows);
                    if (p.lw != 1 || lane == 0) mbar_wait((unsigned)__cvta_generic_to_shared(&full[s]), (q / p.S) & 1);
                    if (p.lw == 1) __syncwarp();
                    const uint4 *pc = reinterpret_cast<const uint4 *>(ring + (size_t)s * p.piece);
                    float a[RPP_MAX];
#pragma unroll
                    for (int t = 0; t < RPP_MAX; t++) a[t] = 0.0f;
                    if (p.lw == 4 && p.mode != 3) {
                        if (cpr == 4) ring_sum<4, 8>(pc, xs, lane, rows, a);
                        else if (cpr == 8) ring_sum<8, 4>(pc, xs, lane, rows, a);
                        else ring_sum<14, 2>(pc, xs, lane, rows, a);
                    }
                    for (int c = 0; c < (p.mode == 3 || p.lw == 2 || p.lw == 4 ? 0 : cpr); c++) {
                        const float4 *xp = reinterpret_cast<const float4 *>(xs + c * 256 + lane * 8);
                        const float4 u = xp[0], v = xp[1];
                        const float xv[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
#pragma unroll
                        for (int t = 0; t < RPP_MAX; t++)
                            if (t < rows && t % tstep == tw) a[t] = dot8(pc[(t * cpr + c) * 32 + lane], xv, a[t]);
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive((unsigned)__cvta_generic_to_shared(&empty[s]));
#pragma unroll
                    for (int t = 0; t < RPP_MAX; t++) {
                        if (t >= rows || t % tstep != tw) continue;
                        const float d = warp_sum(a[t]);
                        if (lane == t) {
                            if (p.mode == 7 && ph.yo >= 0) tag_st(p.yt + ph.yo + row0 + t, p.epoch + (unsigned)f, d);
                            else __stcg(p.y + row0 + t, d);
                        }
                    }
                }
            i += np;
            }
        }
        if (p.mode != 1 && p.mode != 3 && p.mode != 7 && f + 1 < p.n_ph) { /* the phase's end: everyone's outputs before anyone reads them */
            nbar++;
            bar_sync(1, 480);
            if (tid == 0) grid_barrier(p.bar, nbar * (unsigned)G);
            bar_sync(1, 480);
        } else if (p.mode != 3) {
            bar_sync(1, 480); /* xs is rewritten by the next phase */
        }
    }
    if (b == 0 && tid == 0) p.stamp[MAX_PH] = gtimer() - t0;
    acc += xs[0];
    if (acc == 12345.0f) atomicAdd(p.sink, 1u);
}

/* ---- the same step without a ring: every warp loads its own pieces (<= 8 KB) into registers with plain
 * 16-byte loads, one piece in flight per warp, and issues its next piece's loads as soon as it has summed the
 * current one -- before the grid barrier when the next piece is in a later phase. 16 warps, piece j of a phase is
 * warp j % 16's. mode 0: the step; 1: no grid waits (the loads' own rate). */
#define DU 16 /* 512-byte chunks per piece at most */
template <int CPR, int RPP>
__device__ __forceinline__ void dsum(const uint4 (&w)[DU], const float *xs, int lane, int rows, float *y) {
    float a[RPP];
#pragma unroll
    for (int t = 0; t < RPP; t++) a[t] = 0.0f;
#pragma unroll
    for (int c = 0; c < CPR; c++) {
        const float4 *xp = reinterpret_cast<const float4 *>(xs + c * 256 + lane * 8);
        const float4 u = xp[0], v = xp[1];
        const float xv[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
#pragma unroll
        for (int t = 0; t < RPP; t++)
            if (t < rows) a[t] = dot8(w[t * CPR + c], xv, a[t]);
    }
#pragma unroll
    for (int t = 0; t < RPP; t++) {
        const float d = warp_sum(a[t]);
        if (lane == t && t < rows) __stcg(y + t, d);
    }
}
__global__ void __launch_bounds__(512, 1) direct(const __grid_constant__ LP p) {
    __shared__ __align__(16) float xs[XMAX];
    __shared__ unsigned long long t0_s;
    const int b = blockIdx.x, G = gridDim.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) t0_s = gtimer();
    __syncthreads();
    const unsigned long long t0 = t0_s;
    /* the warp's next piece (lf, lj), and its registers */
    int lf = -1, lj = 0;
    auto advance = [&](int f, int j) { /* the warp's first piece at or after piece j of phase f */
        for (; f < p.n_ph; f++, j = warp) {
            const Phase ph = c_ph[f];
            if (ph.mixer) continue;
            int np, rpp;
            pieces(p, ph, b, G, &np, &rpp);
            if (j < np) {
                lf = f, lj = j;
                return;
            }
        }
        lf = -1;
    };
    uint4 w[DU];
    auto load = [&]() {
        if (lf < 0) return;
        const Phase ph = c_ph[lf];
        int np, rpp, row0, rows;
        pieces(p, ph, b, G, &np, &rpp);
        piece_rows(p, ph, b, G, lj, rpp, &row0, &rows);
        const int n = rows * ph.K / 256;
        const unsigned char *base = ph.w + (size_t)row0 * ph.K * 2 + lane * 16;
#pragma unroll
        for (int u = 0; u < DU; u++)
            if (u < n) w[u] = ld_stream(reinterpret_cast<const uint4 *>(base + u * 512)); /* common.cuh: asm volatile */
    };
    advance(0, warp);
    load();
    unsigned nbar = 0;
    float acc = 0.0f;
    for (int f = 0; f < p.n_ph; f++) {
        const Phase ph = c_ph[f];
        if (b == 0 && tid == 0) p.stamp[f] = gtimer() - t0;
        if (ph.mixer) {
            if (p.mode == 0 && p.mixer_ns > 0) {
                const unsigned long long ts = gtimer();
                while ((long long)(gtimer() - ts) < p.mixer_ns) {
                }
            }
        } else {
            if (p.pf > 0 && lane == 0) { /* warp w: the block's pieces w, w + 16, ... of the pf-th GEMV phase ahead */
                int g = f, k = 0;
                while (k < p.pf && ++g < p.n_ph)
                    if (!c_ph[g].mixer) k++;
                if (g < p.n_ph) {
                    const Phase pq = c_ph[g];
                    int np, rpp, row0, rows;
                    pieces(p, pq, b, G, &np, &rpp);
                    for (int j = warp; j < np; j += 16) {
                        piece_rows(p, pq, b, G, j, rpp, &row0, &rows);
                        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pq.w + (size_t)row0 * pq.K * 2),
                                     "r"((unsigned)(rows * pq.K * 2))
                                     : "memory");
                    }
                }
            }
            for (int k = tid; k < ph.K; k += 512) xs[k] = __ldcg(p.x + k);
            __syncthreads();
            while (lf == f) {
                int np, rpp, row0, rows;
                pieces(p, ph, b, G, &np, &rpp);
                piece_rows(p, ph, b, G, lj, rpp, &row0, &rows);
                if (ph.K == 1024) dsum<4, 4>(w, xs, lane, rows, p.y + row0);
                else if (ph.K == 2048) dsum<8, 2>(w, xs, lane, rows, p.y + row0);
                else dsum<14, 1>(w, xs, lane, rows, p.y + row0);
                advance(f, lj + 16);
                load(); /* in flight across the barrier when the piece is a later phase's */
            }
        }
        if (p.mode == 0 && f + 1 < p.n_ph) {
            nbar++;
            __syncthreads();
            if (tid == 0) grid_barrier(p.bar, nbar * (unsigned)G);
            __syncthreads();
        } else {
            __syncthreads();
        }
    }
    if (b == 0 && tid == 0) p.stamp[MAX_PH] = gtimer() - t0, p.stamp[MAX_PH + 1] = 0;
    acc += xs[0];
    if (acc == 12345.0f) atomicAdd(p.sink, 1u);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int dev = 0, nsm = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    /* the step's phases (Qwen3.5-0.8B), weights in one arena (filled with small bf16 values) */
    std::vector<Phase> ph;
    size_t total = 0;
    auto gemv = [&](int N, int K) {
        Phase q = {nullptr, N, K, 0, -1, -1, -1};
        ph.push_back(q);
        total += (size_t)N * K * 2;
    };
    for (int l = 0; l < 24; l++) {
        const bool attn = l % 4 == 3;
        gemv(attn ? 5120 : 8224, 1024);
        ph.push_back(Phase{nullptr, 2048, 0, 1, -1, -1, -1}); /* N: its outputs (out_proj's input) */
        gemv(1024, 2048), gemv(7168, 1024), gemv(1024, 3584);
    }
    gemv(248320, 1024);
    unsigned char *arena;
    CK(cudaMalloc(&arena, total));
    CK(cudaMemset(arena, 0x3c, total));
    size_t off = 0;
    int n_gemv = 0;
    for (Phase &q : ph)
        if (!q.mixer) q.w = arena + off, off += (size_t)q.N * q.K * 2, n_gemv++;
    long long nyt = 0; /* tagged mode: each GEMV phase but the LM head writes tagged words, read by the next GEMV */
    for (int f = 0, last = -1; f < (int)ph.size(); f++) {
        ph[f].prev = last;
        if (ph[f].mixer) { /* its outputs, read by the next GEMV when p.mixrt */
            ph[f].yo = nyt, nyt += ph[f].N, ph[f + 1].prevm = f;
            continue;
        }
        last = f;
        if (f + 1 < (int)ph.size()) ph[f].yo = nyt, nyt += ph[f].N;
    }
    unsigned long long *yt;
    CK(cudaMalloc(&yt, nyt * 8));
    CK(cudaMemset(yt, 0, nyt * 8));
    unsigned launches = 0;
    CK(cudaMemcpyToSymbol(c_ph, ph.data(), sizeof(Phase) * ph.size()));
    float *x, *y;
    unsigned *bar, *sink;
    unsigned long long *stamp;
    CK(cudaMalloc(&x, XMAX * 4));
    CK(cudaMemset(x, 0, XMAX * 4));
    CK(cudaMalloc(&y, 248320 * 4));
    CK(cudaMalloc(&bar, 256));
    CK(cudaMalloc(&sink, 256));
    CK(cudaMalloc(&stamp, (2 * MAX_PH + 2) * 8));
    printf("step_lab on %s (%d SMs): %zu phases (%d GEMVs, %.3f GB of weights), %d blocks x 512 threads\n", prop.name,
           nsm, ph.size(), n_gemv, total / 1e9, nsm);
    const size_t smem = RING_MAX;
    CK(cudaFuncSetAttribute(step, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<unsigned long long> hs(2 * MAX_PH + 2);
    auto run = [&](int mode, unsigned piece_kb, int il, int lw, int P, long long mixer_ns, bool show, int pf = 0,
                   int mixrt = 0, int norm = 0) {
        const int S = std::min(mode == 6 ? S_MAX : 15, (int)(RING_MAX / (piece_kb << 10)));
        LP p = {(int)ph.size(), P, S, mode, piece_kb << 10, il, lw, pf, mixer_ns, x, y, bar, stamp, sink, yt, 0, mixrt, norm};
        std::vector<float> ms;
        CK(cudaMemset(stamp, 0, (2 * MAX_PH + 2) * 8));
        for (int r = 0; r < REPS; r++) {
            CK(cudaMemset(bar, 0, 256));
            p.epoch = ++launches * 256u;
            CK(cudaEventRecord(e0));
            if (mode == 4 || mode == 5) {
                p.mode = mode - 4;
                direct<<<nsm, 512>>>(p);
            } else {
                step<<<nsm, 512, RING_MAX>>>(p);
            }
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const float med = ms[REPS / 2];
        CK(cudaMemcpy(hs.data(), stamp, hs.size() * 8, cudaMemcpyDeviceToHost));
        static const char *mn[] = {"step", "stream (no grid waits)", "chain (no weights)", "stream, no sums", "direct loads: step", "direct loads: stream (no grid waits)", "producer alone (no consumers)", "step, tagged outputs (no grid barrier)"};
        printf("| %s%s%s%s | %u | %s | %s | %d | %d | %lld | %.4f | %.0f | %.1f | %.1f |\n", mn[mode],
               pf ? (pf == 1 ? ", L2 prefetch 1 phase ahead" : pf == 2 ? ", L2 prefetch 2 phases ahead" : ", L2 prefetch 3 phases ahead") : "",
               mixrt ? ", mixers read and write tagged words" : "", norm ? ", RMS norms" : "", piece_kb,
               il ? "interleaved" : "rows", lw == 1 ? "lane 0" : lw == 2 ? "all, no sums" : lw == 3 ? "teams of 4 warps" : lw == 4 ? "all, sums unrolled per shape" : lw == 7 ? "12 warps on every piece, x in registers" : "all", P, S, mixer_ns / 1000, med,
               mode == 2 ? 0.0 : total / (med * 1e-3) / 1e9, hs[MAX_PH] / 1e3, hs[MAX_PH + 1] / 1e3);
        if (show) { /* block 0: per kind of phase, the mean time from its start to the next phase's start */
            double sum[6] = {0};
            int cnt[6] = {0};
            for (size_t f = 0; f + 1 < ph.size(); f++) {
                const int k = ph[f].mixer ? 1 : ph[f].N == 8224 || ph[f].N == 5120 ? 0 : ph[f].K == 2048 ? 2
                              : ph[f].N == 7168                                      ? 3
                                                                                     : 4;
                sum[k] += (hs[f + 1] - hs[f]) / 1e3, cnt[k]++;
            }
            sum[5] = (hs[MAX_PH] - hs[ph.size() - 1]) / 1e3, cnt[5] = 1;
            static const char *kn[] = {"in", "mixer", "out", "gate/up", "down", "LM head"};
            printf("|   block 0, us per phase:");
            for (int k = 0; k < 6; k++) printf(" %s %.2f;", kn[k], cnt[k] ? sum[k] / cnt[k] : 0.0);
            printf(" ||||||||||\n");
            if (mode == 7) { /* block 0: from a phase's start to its input in shared memory, per kind */
                double a2[6] = {0};
                int c2[6] = {0};
                for (size_t f = 1; f + 1 < ph.size(); f++) {
                    if (ph[f].mixer || !hs[MAX_PH + 2 + f]) continue;
                    const int k = ph[f].N == 8224 || ph[f].N == 5120 ? 0 : ph[f].K == 2048 ? 2 : ph[f].N == 7168 ? 3
                                  : ph[f].N == 1024                                         ? 4
                                                                                            : 5;
                    a2[k] += (hs[MAX_PH + 2 + f] - hs[f]) / 1e3, c2[k]++;
                }
                static const char *kn2[] = {"in", "mixer", "out", "gate/up", "down", "LM head"};
                printf("|   block 0, us from a phase's start to its input:");
                for (int k = 0; k < 6; k++)
                    if (c2[k]) printf(" %s %.2f;", kn2[k], a2[k] / c2[k]);
                printf(" ||||||||||\n");
            }
        }
        return med;
    };
    printf("\n| variant | piece KB | ownership | waits | P | S | mixer us | ms per step | GB/s | block 0 end us | "
           "producer waited for slots us |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (unsigned kb : {8u, 16u}) /* the ring alone */
        for (int il : {0, 1}) run(6, kb, il, 0, 3, 0, false);
    run(6, 32, 1, 0, 3, 0, false);
    run(3, 16, 1, 0, 3, 0, false);
    for (int lw : {0, 4}) run(1, 16, 1, lw, 3, 0, false);
    run(2, 16, 1, 0, 3, 0, true);
    run(2, 16, 1, 0, 3, 2000, false);
    for (int il : {0, 1}) run(5, 8, il, 0, 0, 0, false);
    for (int pf : {0, 1}) run(4, 8, 1, 0, 0, 0, false, pf);
    for (int lw : {0, 4}) run(0, 16, 1, lw, 3, 0, false);
    for (int lw : {0, 3, 2, 4}) run(7, 16, 1, lw, 3, 0, lw == 4);
    for (int P : {3, 6}) run(7, 16, 1, 4, P, 2000, P == 3);
    run(7, 12, 1, 4, 3, 0, false);
    for (long long mx : {0ll, 2000ll}) run(7, 16, 1, 7, 3, mx, mx == 0);
    run(7, 16, 1, 7, 3, 2000, true, 0, 1, 1);
    run(1, 16, 1, 7, 3, 0, false);
    run(0, 16, 1, 7, 3, 0, false);
    run(7, 16, 1, 4, 3, 2000, false, 0, 0, 1);
    run(7, 16, 1, 4, 3, 2000, true, 0, 1, 0);
    run(7, 16, 1, 4, 3, 2000, true, 0, 1, 1);
    run(7, 16, 1, 4, 3, 1000, false, 0, 1, 1);
    printf("\n(the engine today: ~0.646 ms per step at ctx 128, 0.60 required; the bytes at 4.0 TB/s: %.3f ms)\n",
           total / 4.0e12 * 1e3);
    return 0;
}
