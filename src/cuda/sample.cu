/* sample.cu — on-device sampling of one id per row from bf16-valued logits (rules in ops.h, the same as the host
 * sampler in sampler.c). Row r is grid row blockIdx.y, with its own scratch. Because logits are bf16 values, the
 * 16-bit order key of a logit identifies its value exactly, so a 65536-bin histogram of counts is an exact sort.
 * Per row:
 *   kernel 0 (sample_count_bf16), rows with top-k: counts the candidates within windows of SM_WIN0 4^j value bins
 *     below the max's (j < SM_NWIN). The smallest window holding top_k candidates holds the top-k cut, and with it
 *     every bin the cuts and the draw below read, so kernel 1 counts only that window's ids: the same bins, the same
 *     sums, the same draw as the full histogram, for a fraction of its atomics, flushes and bins to search;
 *   kernel 1 (sample_hist_bf16): candidates (logit >= max - 40 T) -> hist[key16] (integer atomics, deterministic):
 *     each block counts its ids in shared memory first, for the SM_WINDOW keys below the max's, and adds its nonzero
 *     counts to the row's histogram: one global atomic per block and value, where one per id queues up at L2 on a
 *     row's popular values; the few keys further down go to the row's histogram directly. The last block goes over
 *     the bins from the top (weight of a bin w = exp((value - max) / T), mass = count w) and finds, as (bin, rank
 *     within the bin): the top-k cut, the top-p cut (mass >= top_p * kept mass), the min-p cut (w >= min_p), and the
 *     draw r = u * kept mass; then zeroes the bins it used. Two levels: its 16 warps sum the bins per page of 256
 *     (count, mass, last bin passing min-p); one warp then finds each cut among the pages and inside the page where
 *     it falls (a round of loads per page), not one thread walking bins one L2 load at a time (docs/PERF.md). Sums
 *     in a fixed order. A window of at most SM_LIST candidates is also listed (id, key) for kernel 2;
 *   kernel 2 (sample_pick_bf16): finds the id holding the chosen rank among the ids of that value, in index order:
 *     from the list where there is one (one block), else from the row (per-block counts, the last block locates it).
 * Every kernel reads the row with 16-byte loads, four in flight per thread (kernel 1, one block per SM: eight).
 * Ties inside a value bin are ordered by id, as in the host sort. temperature <= 0: no-op (the LM head's argmax
 * stays in out_id). */
#include <math.h>

#include "cuda/common.cuh"

#define SM_THREADS    512
#define SM_MAX_BLOCKS 512 /* kernel 2's last block scans one block count per thread */
#define SM_BINS       65536
#define SM_PAGE       256 /* value bins per page of the cut search: 8 per lane */
#define SM_PAGES      (SM_BINS / SM_PAGE)
#define SM_WINDOW     32768 /* kernel 1's shared counts: keys key16(max) - d, d < SM_WINDOW (128 KiB) */
#define SM_PER_THREAD 16    /* the launcher's blocks per row: about this many ids per thread */
#define SM_WIN0       16    /* kernel 0's windows: SM_WIN0 4^j value bins below the max's, j < SM_NWIN */
#define SM_NWIN       6     /* the largest, 16384 bins, fits kernel 1's shared counts */
#define SM_LIST       2048  /* a window of at most this many candidates lists them for kernel 2 */

typedef struct SampleScratch {
    int hist[SM_BINS];     /* zero between calls */
    unsigned done1, done2; /* last-block counters, zero between calls */
    int key, rank;         /* kernel 1 -> kernel 2: chosen value key and rank among its ids */
    int win[SM_NWIN];      /* kernel 0 -> kernel 1: candidates within each window; zero between calls */
    int n_list;            /* kernel 1 -> kernel 2: entries in list (0: kernel 2 scans the row); kernel 0 zeroes it */
    int pad[5];
    int blk[SM_MAX_BLOCKS];
    int2 list[SM_LIST]; /* (id, key16) of every candidate of a listed window, in no order */
} SampleScratch;

/* Order-preserving 16-bit key of a bf16 value (larger value -> larger key); -0 counts as +0. */
__device__ __forceinline__ int key16(float v) {
    if (v == 0.0f) v = 0.0f;
    unsigned b = __float_as_uint(v) >> 16;
    return (int)((b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u));
}
__device__ __forceinline__ float key_value(int key) {
    unsigned b = (key & 0x8000) ? ((unsigned)key & 0x7fffu) : (~(unsigned)key & 0xffffu);
    return __uint_as_float(b << 16);
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* q35_uniform: u in [0, 1) with 24 random bits, u = (mix64(mix64(seed) ^ step) >> 40) / 2^24. */
__device__ __forceinline__ float q35_uniform(uint64_t seed, uint64_t step) {
    return (float)(mix64(mix64(seed) ^ step) >> 40) * (1.0f / 16777216.0f);
}

/* Inclusive scan over the block in thread order (fixed order: deterministic). sm: [32]. */
__device__ int block_incl_scan_i(int v, int *sm, int *total) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    __syncthreads();
    if (lane == 31) sm[w] = v;
    __syncthreads();
    int base = 0, tot = 0;
    for (int i = 0; i < nw; i++) {
        if (i < w) base += sm[i];
        tot += sm[i];
    }
    *total = tot;
    return base + v;
}

/* The last block's view of the value bins, from the top: position d = 0, 1, ... is key key_hi - d (nbins
 * positions). Page P holds positions [256 P, 256 P + 256); in a warp, lane l holds 256 P + 8 l + e (e < 8). A cut
 * (dc, jc) keeps every id of the positions before dc and the first jc ids of position dc. */
struct Bins {
    const int *hist;
    int key_hi, nbins;
    float mx, inv_t;
    __device__ float weight(int d) const { return __expf((key_value(key_hi - d) - mx) * inv_t); }
    /* this lane's 8 counts of page P: one round of L2 loads */
    __device__ void load(int P, int (&c)[8]) const {
        const int d0 = P * SM_PAGE + 8 * (threadIdx.x & 31);
#pragma unroll
        for (int e = 0; e < 8; e++) c[e] = d0 + e < nbins ? __ldcg(hist + key_hi - d0 - e) : 0;
    }
    /* this lane's kept masses of page P under the cut (dc, jc); kept counts in k */
    __device__ void masses(int P, const int (&c)[8], int dc, int jc, float (&m)[8], int (&k)[8]) const {
        const int d0 = P * SM_PAGE + 8 * (threadIdx.x & 31);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int d = d0 + e;
            k[e] = d < dc ? c[e] : d == dc ? jc : 0;
            m[e] = k[e] ? (float)k[e] * weight(d) : 0.0f;
        }
    }
};

/* Warp sum in a fixed order, the same value on every lane. */
__device__ __forceinline__ float warp_sum_fixed(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

/* Over 256 items held 8 per lane in item order (v >= 0): the first item i with v_i > 0 and
 * acc0 + v_0 + ... + v_i >= target, and in *before acc0 + v_0 + ... + v_(i-1) as the lane holding i sums it.
 * Where rounding puts the crossing just past the lane the scan chose, that lane's last nonzero item.
 * -1 when no prefix reaches target. Warp-uniform; all lanes call it. */
__device__ int warp_cross(const float (&v)[8], float acc0, float target, float *before) {
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) s += v[e];
    float incl = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    float excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.0f;
    const unsigned hit = __ballot_sync(0xffffffffu, s > 0.0f && acc0 + incl >= target);
    if (!hit) return -1;
    const int L = __ffs(hit) - 1;
    int idx = 0;
    float acc = acc0 + excl, bef = acc;
    if (lane == L) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (v[e] > 0.0f) {
                idx = e;
                bef = acc;
                if (acc + v[e] >= target) break;
            }
            acc += v[e];
        }
    }
    *before = __shfl_sync(0xffffffffu, bef, L);
    return 8 * L + __shfl_sync(0xffffffffu, idx, L);
}

/* item i of 8-per-lane registers, on every lane */
__device__ __forceinline__ int warp_item(const int (&k)[8], int i) {
    int mine = 0;
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (8 * (threadIdx.x & 31) + e == i) mine = k[e];
    return __shfl_sync(0xffffffffu, mine, i >> 3);
}

/* Row blockIdx.y's logits, step params and scratch. */
struct SampleRow {
    const float *logits;
    const StepParams *step;
    SampleScratch *sc;
    __device__ explicit SampleRow(const SampleParams &p)
        : logits(p.logits + blockIdx.y * p.ld), step(p.step + blockIdx.y),
          sc(reinterpret_cast<SampleScratch *>(p.scratch) + blockIdx.y) {}
};

/* f(i, x[i]) for every i in [beg, end), spread over the block's threads in no particular order: 16-byte loads, U
 * of them in flight per thread before any f (a row is one pass over 1 MB at the 0.8B's vocabulary), where x and beg
 * allow (x 16-byte aligned, beg a multiple of 4); single loads for the rest. */
template <int U = 4, typename F>
__device__ __forceinline__ void for_ids(const float *x, int beg, int end, F &&f) {
    const int nt = blockDim.x;
    int i = beg + 4 * (int)threadIdx.x; /* this thread's first group of 4 */
    if (!((uintptr_t)x & 15) && !(beg & 3)) {
        const int end4 = beg + (end - beg) / 4 * 4;
        for (; i + 4 * (U - 1) * nt < end4; i += 4 * U * nt) {
            float4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = __ldcg(reinterpret_cast<const float4 *>(x + i + 4 * u * nt));
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = i + 4 * u * nt;
                f(j, v[u].x), f(j + 1, v[u].y), f(j + 2, v[u].z), f(j + 3, v[u].w);
            }
        }
        for (; i < end4; i += 4 * nt) {
            const float4 v = __ldcg(reinterpret_cast<const float4 *>(x + i));
            f(i, v.x), f(i + 1, v.y), f(i + 2, v.z), f(i + 3, v.w);
        }
        for (i = end4 + threadIdx.x; i < end; i += nt) f(i, __ldcg(x + i));
    } else {
        for (i = beg + threadIdx.x; i < end; i += nt) f(i, __ldcg(x + i));
    }
}

/* This block's share of the row's ids for a grid of gridDim.x blocks per row: slices of a multiple of 4 ids. */
__device__ __forceinline__ int slice_ids(int n) { return (n + 4 * (int)gridDim.x - 1) / (4 * (int)gridDim.x) * 4; }

/* Row blockIdx.y's max logit (given, or the logit at its argmax out_id); candidates are the ids >= max - 40 T. */
__device__ __forceinline__ float row_max(const SampleParams &p, const SampleRow &row) {
    return p.max_logit ? __ldcg(p.max_logit + blockIdx.y) : __ldcg(row.logits + __ldcg(p.out_id + blockIdx.y));
}

/* Kernel 0: rows with temperature > 0 zero n_list; with top_k > 0 too, they add to win[j] their candidates at
 * positions d = key16(max) - key16(logit) < SM_WIN0 4^j (integer atomics: deterministic). grid (blocks, rows), block
 * 512. */
__global__ void __launch_bounds__(SM_THREADS) sample_count_bf16(const __grid_constant__ SampleParams p) {
    const SampleRow row(p);
    __shared__ int s_c[SM_THREADS / 32][SM_NWIN];
    pdl_wait();
    pdl_trigger();
    const float T = row.step->temperature;
    if (!(T > 0.0f)) return;
    if (blockIdx.x == 0 && threadIdx.x == 0) row.sc->n_list = 0; /* kernel 1 appends to it after this grid */
    if (row.step->top_k <= 0) return;
    const float mx = row_max(p, row), cut = mx - 40.0f * T;
    const int key_top = key16(mx), slice = slice_ids(p.n_valid);
    const int beg = min(p.n_valid, (int)blockIdx.x * slice), end = min(p.n_valid, beg + slice);
    int c[SM_NWIN];
#pragma unroll
    for (int j = 0; j < SM_NWIN; j++) c[j] = 0;
    for_ids(row.logits, beg, end, [&](int, float v) {
        if (!(v >= cut)) return;
        const int d = key_top - key16(v);
#pragma unroll
        for (int j = 0; j < SM_NWIN; j++) c[j] += d >= 0 && d < (SM_WIN0 << 2 * j);
    });
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < SM_NWIN; j++) {
        const int n = __reduce_add_sync(0xffffffffu, c[j]);
        if (lane == 0) s_c[warp][j] = n;
    }
    __syncthreads();
    if (threadIdx.x < SM_NWIN) {
        int n = 0;
        for (int w = 0; w < SM_THREADS / 32; w++) n += s_c[w][threadIdx.x];
        if (n) atomicAdd(row.sc->win + threadIdx.x, n);
    }
}

/* Kernel 1: histogram + cut finding. grid (blocks, rows), block 512. */
__global__ void __launch_bounds__(SM_THREADS) sample_hist_bf16(const __grid_constant__ SampleParams p) {
    const SampleRow row(p);
    SampleScratch *sc = row.sc;
    const StepParams *step = row.step;
    __shared__ int s_last, s_key, s_rank;
    __shared__ int s_pc[SM_PAGES], s_pmin[SM_PAGES], s_pminc[SM_PAGES];
    __shared__ float s_pm[SM_PAGES];
    const float T = step->temperature;
    pdl_wait();
    pdl_trigger();
    if (!(T > 0.0f)) return;
    const float mx = row_max(p, row), cut = mx - 40.0f * T;
    /* the positions counted: the smallest of kernel 0's windows holding top_k candidates, else all; a window of at
     * most SM_LIST candidates also lists them */
    int W = SM_BINS, n_win = 0;
    if (step->top_k > 0)
        for (int j = SM_NWIN - 1; j >= 0; j--) {
            const int n = __ldcg(sc->win + j);
            if (n >= step->top_k) W = SM_WIN0 << 2 * j, n_win = n;
        }
    const bool listed = n_win > 0 && n_win <= SM_LIST;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    extern __shared__ unsigned s_cnt[]; /* [SM_WINDOW]: this block's count of key key16(mx) - d at d */
    const int key_top = key16(mx), nwin = min(min(SM_WINDOW, W), key_top + 1);
    for (int d = threadIdx.x; d < nwin; d += blockDim.x) s_cnt[d] = 0;
    __syncthreads();
    const int slice = slice_ids(p.n_valid), beg = min(p.n_valid, (int)blockIdx.x * slice);
    /* one block per SM (its shared counts): 8 loads in flight per thread */
    for_ids<8>(row.logits, beg, min(p.n_valid, beg + slice), [&](int i, float v) {
        if (!(v >= cut)) return;
        const int key = key16(v), d = key_top - key;
        /* d < 0: above the max, not a logit of this row's maximum (never, with a true max) */
        if (d < 0 || d >= W) return;
        if (listed) sc->list[atomicAdd(&sc->n_list, 1)] = make_int2(i, key);
        if (d < SM_WINDOW)
            atomicAdd(s_cnt + d, 1u);
        else
            atomicAdd(sc->hist + key, 1);
    });
    __syncthreads();
    for (int d = threadIdx.x; d < nwin; d += blockDim.x)
        if (s_cnt[d]) atomicAdd(sc->hist + key_top - d, (int)s_cnt[d]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&sc->done1, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();

    /* ---- the last block: cuts over the bins [key16(cut), key16(mx)], two levels (pages, then the bins of the
     * pages where a cut falls), so that each step is one or two rounds of L2 loads (one thread walking bins
     * one load at a time took ~85 us per token). Every sum has a fixed order: deterministic. ---- */
    Bins bn;
    bn.hist = sc->hist;
    bn.key_hi = key16(mx);
    int key_lo = isfinite(cut) ? key16(cut) : 0;
    if (key_lo > bn.key_hi) key_lo = bn.key_hi;
    bn.nbins = min(bn.key_hi - key_lo + 1, W);
    bn.mx = mx;
    bn.inv_t = 1.0f / T;
    const int npages = (bn.nbins + SM_PAGE - 1) / SM_PAGE;
    const float min_p = step->min_p;

    /* every warp: per page its count, its mass and (min-p) its last nonempty position with weight >= min_p */
    for (int P0 = warp; P0 < npages; P0 += 2 * (SM_THREADS / 32)) {
        int c[2][8];
        bn.load(P0, c[0]);
        const int P1 = P0 + SM_THREADS / 32;
        if (P1 < npages) bn.load(P1, c[1]);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int P = h ? P1 : P0;
            if (P >= npages) break;
            int n = 0, dm = -1, cm = 0;
            float m = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int d = P * SM_PAGE + 8 * lane + e;
                if (!c[h][e]) continue;
                const float w = bn.weight(d);
                n += c[h][e];
                m += (float)c[h][e] * w;
                if (min_p > 0.0f && w >= min_p) {
                    dm = d;
                    cm = c[h][e];
                }
            }
            n = __reduce_add_sync(0xffffffffu, n);
            m = warp_sum_fixed(m);
            const int dmax = __reduce_max_sync(0xffffffffu, dm);
            if (lane == 0) {
                s_pc[P] = n;
                s_pm[P] = m;
                s_pmin[P] = dmax;
            }
            if (dmax >= 0 && dm == dmax) s_pminc[P] = cm;
        }
    }
    __syncthreads();

    if (warp == 0) {
        int c[8], cP = -1; /* the page whose counts c holds */
        auto page = [&](int P) {
            if (P != cP) bn.load(P, c), cP = P;
        };
        /* page-level values: whole pages before page Pc, `part` for Pc, 0 after */
        auto page_vals = [&](const int *pc, const float *pm, int Pc, float part, float(&v)[8]) {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int P = 8 * lane + e;
                v[e] = P >= npages || P > Pc ? 0.0f : P == Pc ? part : pc ? (float)pc[P] : pm[P];
            }
        };
        float v[8], m[8], bef, bef2;
        int kk[8];
        int dc = -1, jc = 0; /* the cut: every id of positions below dc, and the first jc ids of position dc */
        /* the mass kept by the cut: v = the page-level masses (page dc / SM_PAGE's up to the cut, m its
         * positions'), summed in a fixed order */
        auto kept_mass = [&]() {
            const int Pc = dc / SM_PAGE;
            page(Pc);
            bn.masses(Pc, c, dc, jc, m, kk);
            float part = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) part += m[e];
            page_vals(NULL, s_pm, Pc, warp_sum_fixed(part), v);
            float tot = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) tot += v[e];
            return warp_sum_fixed(tot);
        };
        /* after kept_mass: the position where the kept running mass reaches t (-1: none), its kept id count n and
         * the mass still to go there (t - the kept mass before it) */
        auto cross = [&](float t, int *n, float *left) {
            const int P = warp_cross(v, 0.0f, t, &bef);
            if (P < 0) return -1;
            page(P);
            bn.masses(P, c, dc, jc, m, kk);
            const int i = warp_cross(m, bef, t, &bef2);
            if (i < 0) return -1;
            *n = warp_item(kk, i), *left = t - bef2;
            return P * SM_PAGE + i;
        };
        /* top-k: the position holding the k-th id (counts as floats: exact below 2^24) */
        page_vals(s_pc, NULL, npages, 0.0f, v);
        float nc = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) nc += v[e];
        const int n_cand = (int)warp_sum_fixed(nc);
        if (n_cand > 0) {
            const int k = (step->top_k > 0 && step->top_k < n_cand) ? step->top_k : n_cand;
            const int Pk = warp_cross(v, 0.0f, (float)k, &bef);
            page(Pk);
#pragma unroll
            for (int e = 0; e < 8; e++) m[e] = (float)c[e];
            const int i = warp_cross(m, bef, (float)k, &bef2);
            dc = Pk * SM_PAGE + i;
            jc = k - (int)bef2;
        }
        /* top-p over the top-k mass: the shortest prefix with mass >= top_p * mass */
        const float top_p = step->top_p;
        if (dc >= 0 && top_p < 1.0f) {
            const float target = top_p * kept_mass();
            int n;
            float left;
            const int d = cross(target, &n, &left);
            if (d >= 0) {
                const int j = (int)ceilf(left / bn.weight(d));
                dc = d;
                jc = j < 1 ? 1 : j > n ? n : j;
            }
        }
        /* min-p: keep the positions with weight >= min_p (the top one has weight 1) */
        if (dc >= 0 && min_p > 0.0f) {
            int dm = -1;
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (8 * lane + e < npages) dm = max(dm, s_pmin[8 * lane + e]);
            dm = __reduce_max_sync(0xffffffffu, dm);
            const int cm = dm >= 0 ? s_pminc[dm / SM_PAGE] : __ldcg(bn.hist + bn.key_hi);
            if (dm < 0) dm = 0;
            if (dm < dc) {
                dc = dm;
                jc = cm;
            }
        }
        /* the draw: r = u * kept mass; the first (position, rank) whose running mass exceeds r */
        if (dc >= 0) {
            const float kept = kept_mass();
            const float r = q35_uniform(step->seed, step->step) * kept;
            int sd = dc, sj = jc - 1;
            int n;
            float left;
            const int d = cross(r, &n, &left);
            if (d >= 0) {
                const int j = (int)floorf(left / bn.weight(d));
                sd = d;
                sj = j < 0 ? 0 : j > n - 1 ? n - 1 : j;
            }
            dc = sd;
            jc = sj;
        }
        if (lane == 0) {
            s_key = dc >= 0 ? bn.key_hi - dc : -1;
            s_rank = dc >= 0 ? jc : 0;
        }
    }
    __syncthreads(); /* warp 0 has read the bins: zero them for the next call */
    for (int d = threadIdx.x; d < bn.nbins; d += blockDim.x) sc->hist[bn.key_hi - d] = 0;
    if (threadIdx.x < SM_NWIN) sc->win[threadIdx.x] = 0; /* every block of the row read them before its done1 add */
    if (threadIdx.x == 0) {
        sc->key = s_key;
        sc->rank = s_rank;
        sc->done1 = 0u;
    }
}

/* Kernel 2 of a listed window, one block: the ids of the list with key `key` into shared memory (block scan), then
 * the one with `rank` smaller ids among them (ids are distinct). */
__device__ void pick_listed(const SampleParams &p, const SampleRow &row, int key, int rank, int n) {
    __shared__ int s_ids[SM_LIST], s_i[32];
    SampleScratch *sc = row.sc;
    int nm = 0;
    for (int e0 = 0; e0 < n; e0 += blockDim.x) { /* block-uniform loop */
        const int e = e0 + threadIdx.x;
        const int2 it = e < n ? __ldcg(sc->list + e) : make_int2(0, -1);
        const int m = it.y == key;
        int tot;
        const int at = nm + block_incl_scan_i(m, s_i, &tot) - 1;
        if (m) s_ids[at] = it.x;
        nm += tot;
    }
    __syncthreads();
    float lse = 0.0f; /* as the scan below: the row's log-sum-exp from the argmax's log-softmax */
    if (p.lp && !p.max_logit) lse = __ldcg(row.logits + __ldcg(p.out_id + blockIdx.y)) - __ldcg(p.lp + blockIdx.y);
    __syncthreads();
    for (int j = threadIdx.x; j < nm; j += blockDim.x) {
        const int id = s_ids[j];
        int r = 0;
        for (int k = 0; k < nm; k++) r += s_ids[k] < id;
        if (r == rank) {
            p.out_id[blockIdx.y] = id;
            if (p.lp && !p.max_logit) p.lp[blockIdx.y] = row.logits[id] - lse;
        }
    }
}

/* Kernel 2: the id of rank sc->rank among ids whose logit has key sc->key (and with p.lp, its log-softmax).
 * grid (<= 512, rows), block 512. */
__global__ void __launch_bounds__(SM_THREADS) sample_pick_bf16(const __grid_constant__ SampleParams p) {
    const SampleRow row(p);
    SampleScratch *sc = row.sc;
    __shared__ int s_last, s_base, s_blk, s_i[32];
    const float T = row.step->temperature;
    pdl_wait();
    pdl_trigger();
    if (!(T > 0.0f)) return;
    const int key = __ldcg(&sc->key), rank = __ldcg(&sc->rank), n_list = __ldcg(&sc->n_list);
    if (n_list > 0) { /* kernel 1 listed every candidate of its window: block 0 picks from the list */
        if (blockIdx.x == 0) pick_listed(p, row, key, rank, n_list);
        return;
    }
    const int slice = slice_ids(p.n_valid);
    const int beg = min(p.n_valid, (int)blockIdx.x * slice), end = min(p.n_valid, beg + slice);
    int cnt = 0;
    for_ids(row.logits, beg, end, [&](int, float v) { cnt += key16(v) == key; });
    int tot;
    block_incl_scan_i(cnt, s_i, &tot);
    if (threadIdx.x == 0) {
        sc->blk[blockIdx.x] = tot;
        __threadfence();
        s_last = atomicAdd(&sc->done2, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (key < 0) {
        if (threadIdx.x == 0) sc->done2 = 0u;
        return;
    }
    /* which block holds the rank-th match */
    int c = threadIdx.x < gridDim.x ? __ldcg(sc->blk + threadIdx.x) : 0;
    int all, incl = block_incl_scan_i(c, s_i, &all);
    if (threadIdx.x == 0) s_blk = -1;
    __syncthreads();
    if (incl - c <= rank && rank < incl) {
        s_blk = threadIdx.x;
        s_base = incl - c;
    }
    __syncthreads();
    /* the argmax's logit and log-softmax before out_id changes: the row's log-sum-exp is l[argmax] - lp */
    float lse = 0.0f;
    if (p.lp && !p.max_logit) lse = __ldcg(row.logits + __ldcg(p.out_id + blockIdx.y)) - __ldcg(p.lp + blockIdx.y);
    __syncthreads();
    if (s_blk >= 0) {
        const int b0 = min(p.n_valid, s_blk * slice), b1 = min(p.n_valid, b0 + slice);
        int base = s_base;
        for (int i0 = b0; i0 < b1; i0 += blockDim.x) { /* block-uniform loop */
            int i = i0 + threadIdx.x;
            int m = i < b1 && key16(__ldcg(row.logits + i)) == key;
            int n_m, mi = block_incl_scan_i(m, s_i, &n_m);
            if (m && base + mi - 1 == rank) {
                p.out_id[blockIdx.y] = i;
                if (p.lp && !p.max_logit) p.lp[blockIdx.y] = row.logits[i] - lse;
            }
            base += n_m;
            if (base > rank) break;
        }
    }
    if (threadIdx.x == 0) sc->done2 = 0u;
}

extern "C" size_t cuda_sample_scratch_bytes(int n_sm) {
    (void)n_sm;
    return sizeof(SampleScratch);
}

extern "C" int cuda_sample(const SampleParams *p, const CudaLaunch *l) {
    const int rows = p->rows > 0 ? p->rows : 1;
    if (!p->logits || p->n_valid <= 0 || !p->step || !p->scratch || !p->out_id || p->blocks > SM_MAX_BLOCKS ||
        rows > 65535 || p->rows < 0 || (rows > 1 && p->ld < (size_t)p->n_valid) || (p->lp && p->max_logit))
        return (int)cudaErrorInvalidValue;
    int blocks = p->blocks;
    if (blocks <= 0) blocks = min(SM_MAX_BLOCKS, ceil_div(p->n_valid, SM_THREADS * SM_PER_THREAD));
    const dim3 grid((unsigned)blocks, (unsigned)rows);
    /* The histogram of a pass of >= 16 rows: about 256 blocks in all, at least 2 per row (at most the pick's).
     * Each block sends its nonzero shared counts to the row's histogram, one global atomic per value it saw (most ids
     * have a value of their own), so fewer, longer blocks per row send fewer; below 16 rows the grid would not fill
     * the GPU. */
    const int hist_blocks = p->blocks > 0 || rows < 16 ? blocks : min(blocks, max(2, 256 / rows));
    const int smem = SM_WINDOW * (int)sizeof(unsigned);
    const cudaError_t e = cudaFuncSetAttribute(sample_hist_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)e;
    }
    int rc = launch_kernel(sample_count_bf16, grid, dim3(SM_THREADS), 0, l, *p);
    if (rc) return rc;
    rc = launch_kernel(sample_hist_bf16, dim3((unsigned)hist_blocks, (unsigned)rows), dim3(SM_THREADS), (size_t)smem, l,
                       *p);
    if (rc) return rc;
    return launch_kernel(sample_pick_bf16, grid, dim3(SM_THREADS), 0, l, *p);
}
