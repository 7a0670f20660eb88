/* sample.cu — on-device sampling of one id from bf16-valued logits (rules in ops.h, the same
 * as the host sampler in sampler.c). Because logits are bf16 values, the 16-bit order key of
 * a logit identifies its value exactly, so a 65536-bin histogram of counts is an exact sort:
 *   kernel 1 (sample_hist_bf16): candidates (logit >= max - 40 T) -> hist[key16] (integer atomics,
 *     deterministic); the last block walks the bins from the top (weight of a bin
 *     w = exp((value - max) / T), mass = count w) and finds, as (bin, rank within the bin):
 *     the top-k cut, the top-p cut (mass >= top_p * kept mass), the min-p cut (w >= min_p), and
 *     the draw r = u * kept mass; then zeroes the bins it used;
 *   kernel 2 (sample_pick_bf16): finds the id holding the chosen rank among the ids of that value,
 *     in index order (per-block counts, the last block locates it).
 * Ties inside a value bin are ordered by id, as in the host sort. temperature <= 0: no-op (the
 * LM head's argmax stays in out_id). */
#include <math.h>

#include "cuda/common.cuh"

#define SM_THREADS 512
#define SM_MAX_BLOCKS 512 /* kernel 2's last block scans one block count per thread */
#define SM_BINS 65536

typedef struct SampleScratch {
    int hist[SM_BINS];   /* zero between calls */
    unsigned done1, done2; /* last-block counters, zero between calls */
    int key, rank;       /* kernel 1 -> kernel 2: chosen value key and rank among its ids */
    int pad[12];
    int blk[SM_MAX_BLOCKS];
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

/* Inclusive scans over the block in thread order (fixed order: deterministic). sm: [32]. */
__device__ float block_incl_scan_f(float v, float *sm, float *total) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        float t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    __syncthreads();
    if (lane == 31) sm[w] = v;
    __syncthreads();
    float base = 0.0f, tot = 0.0f;
    for (int i = 0; i < nw; i++) {
        if (i < w) base += sm[i];
        tot += sm[i];
    }
    *total = tot;
    return base + v;
}
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

/* The value bins, seen from the top: position d = 0, 1, ... is key key_hi - d. A cut (dc, jc)
 * keeps every id of the bins before dc and the first jc ids of bin dc. */
struct BinWalk {
    const int *hist;
    int key_hi, d0, d1; /* this thread's positions [d0, d1) */
    float mx, inv_t;
    __device__ int count(int d) const { return __ldcg(hist + key_hi - d); }
    __device__ float weight(int d) const { return __expf((key_value(key_hi - d) - mx) * inv_t); }
    __device__ int kept(int d, int dc, int jc) const { return d < dc ? count(d) : d == dc ? jc : 0; }
    __device__ float mass(int dc, int jc) const {
        float m = 0.0f;
        for (int d = d0; d < d1 && d <= dc; d++) {
            int c = kept(d, dc, jc);
            if (c) m += (float)c * weight(d);
        }
        return m;
    }
};

/* Kernel 1: histogram + cut finding. grid (blocks), block 512. */
__global__ void __launch_bounds__(SM_THREADS) sample_hist_bf16(const __grid_constant__ SampleParams p) {
    SampleScratch *sc = reinterpret_cast<SampleScratch *>(p.scratch);
    __shared__ int s_last, s_d, s_j, s_dm;
    __shared__ float s_f[32], s_incl[SM_THREADS];
    __shared__ int s_i[32];
    const float T = p.step->temperature;
    pdl_wait();
    pdl_trigger();
    if (!(T > 0.0f)) return;
    const float mx = __ldcg(p.max_logit), cut = mx - 40.0f * T;
    const int lane = threadIdx.x & 31;
    for (int i0 = blockIdx.x * blockDim.x; i0 < p.n_valid; i0 += gridDim.x * blockDim.x) {
        int i = i0 + threadIdx.x, key = -1;
        if (i < p.n_valid) {
            float v = __ldcg(p.logits + i);
            if (v >= cut) key = key16(v);
        }
        unsigned peers = __match_any_sync(0xffffffffu, key);
        if (key >= 0 && lane == __ffs(peers) - 1) atomicAdd(sc->hist + key, __popc(peers));
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&sc->done1, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();

    /* ---- the last block: cuts over the bins [key16(cut), key16(mx)] ---- */
    BinWalk bw;
    bw.hist = sc->hist;
    bw.key_hi = key16(mx);
    int key_lo = isfinite(cut) ? key16(cut) : 0;
    if (key_lo > bw.key_hi) key_lo = bw.key_hi;
    const int nbins = bw.key_hi - key_lo + 1, chunk = (nbins + blockDim.x - 1) / blockDim.x;
    bw.d0 = min(nbins, (int)threadIdx.x * chunk);
    bw.d1 = min(nbins, bw.d0 + chunk);
    bw.mx = mx;
    bw.inv_t = 1.0f / T;

    /* top-k: the bin holding the k-th id */
    int cnt = 0;
    for (int d = bw.d0; d < bw.d1; d++) cnt += bw.count(d);
    int n_cand, incl = block_incl_scan_i(cnt, s_i, &n_cand), excl = incl - cnt;
    const int k = (p.step->top_k > 0 && p.step->top_k < n_cand) ? p.step->top_k : n_cand;
    if (threadIdx.x == 0) s_d = -1, s_j = 0;
    __syncthreads();
    if (excl < k && k <= incl) {
        int run = excl;
        for (int d = bw.d0; d < bw.d1; d++) {
            int c = bw.count(d);
            if (run + c >= k) {
                s_d = d, s_j = k - run;
                break;
            }
            run += c;
        }
    }
    __syncthreads();
    if (s_d < 0) { /* no candidates (non-finite max): leave the argmax */
        for (int d = bw.d0; d < bw.d1; d++) sc->hist[bw.key_hi - d] = 0;
        if (threadIdx.x == 0) sc->done1 = 0u, sc->key = -1, sc->rank = 0;
        return;
    }
    int dc = s_d, jc = s_j;

    /* top-p over the top-k mass: the shortest prefix with mass >= top_p * mass */
    const float top_p = p.step->top_p;
    if (top_p < 1.0f) {
        float tot, mi = block_incl_scan_f(bw.mass(dc, jc), s_f, &tot);
        s_incl[threadIdx.x] = mi;
        __syncthreads();
        const float target = top_p * tot;
        const float ex = threadIdx.x ? s_incl[threadIdx.x - 1] : 0.0f; /* same rounding as the neighbour */
        if (ex < target && target <= mi) {
            float acc = ex;
            int ld = -1, lc = 0;
            for (int d = bw.d0; d < bw.d1 && d <= dc; d++) {
                int c = bw.kept(d, dc, jc);
                if (!c) continue;
                float w = bw.weight(d), mm = (float)c * w;
                ld = d, lc = c;
                if (acc + mm >= target) {
                    int j = (int)ceilf((target - acc) / w);
                    lc = j < 1 ? 1 : j > c ? c : j;
                    break;
                }
                acc += mm;
            }
            if (ld >= 0) s_d = ld, s_j = lc;
        }
        __syncthreads();
        dc = s_d, jc = s_j;
    }

    /* min-p: keep bins with w >= min_p (the top bin has w = 1) */
    const float min_p = p.step->min_p;
    if (min_p > 0.0f) {
        if (threadIdx.x == 0) s_dm = 0;
        __syncthreads();
        int dm = 0;
        for (int d = bw.d0; d < bw.d1; d++)
            if (bw.count(d) && bw.weight(d) >= min_p) dm = d;
        atomicMax(&s_dm, dm);
        __syncthreads();
        if (s_dm < dc) dc = s_dm, jc = bw.count(s_dm);
    }

    /* the draw: r = u * kept mass; the first (bin, rank) whose running mass exceeds r */
    {
        float tot, mi = block_incl_scan_f(bw.mass(dc, jc), s_f, &tot);
        __syncthreads(); /* s_incl reads of the top-p step are done */
        s_incl[threadIdx.x] = mi;
        if (threadIdx.x == 0) s_d = dc, s_j = jc - 1;
        __syncthreads();
        const float r = q35_uniform(p.step->seed, p.step->step) * tot;
        const float ex = threadIdx.x ? s_incl[threadIdx.x - 1] : 0.0f;
        if (ex <= r && r < mi) {
            float acc = ex;
            int ld = -1, lj = 0;
            for (int d = bw.d0; d < bw.d1 && d <= dc; d++) {
                int c = bw.kept(d, dc, jc);
                if (!c) continue;
                float w = bw.weight(d), mm = (float)c * w;
                ld = d, lj = c - 1;
                if (r < acc + mm) {
                    int j = (int)floorf((r - acc) / w);
                    lj = j < 0 ? 0 : j > c - 1 ? c - 1 : j;
                    break;
                }
                acc += mm;
            }
            if (ld >= 0) s_d = ld, s_j = lj;
        }
        __syncthreads();
    }
    for (int d = bw.d0; d < bw.d1; d++) sc->hist[bw.key_hi - d] = 0;
    if (threadIdx.x == 0) {
        sc->key = bw.key_hi - s_d;
        sc->rank = s_j;
        sc->done1 = 0u;
    }
}

/* Kernel 2: the id of rank sc->rank among ids whose logit has key sc->key. grid (<= 512), block 512. */
__global__ void __launch_bounds__(SM_THREADS) sample_pick_bf16(const __grid_constant__ SampleParams p) {
    SampleScratch *sc = reinterpret_cast<SampleScratch *>(p.scratch);
    __shared__ int s_last, s_base, s_blk, s_i[32];
    const float T = p.step->temperature;
    pdl_wait();
    pdl_trigger();
    if (!(T > 0.0f)) return;
    const int key = __ldcg(&sc->key), rank = __ldcg(&sc->rank);
    const int slice = (p.n_valid + gridDim.x - 1) / gridDim.x;
    const int beg = min(p.n_valid, (int)blockIdx.x * slice), end = min(p.n_valid, beg + slice);
    int cnt = 0;
    for (int i = beg + threadIdx.x; i < end; i += blockDim.x) cnt += key16(__ldcg(p.logits + i)) == key;
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
    if (incl - c <= rank && rank < incl) s_blk = threadIdx.x, s_base = incl - c;
    __syncthreads();
    if (s_blk >= 0) {
        const int b0 = min(p.n_valid, s_blk * slice), b1 = min(p.n_valid, b0 + slice);
        int base = s_base;
        for (int i0 = b0; i0 < b1; i0 += blockDim.x) { /* block-uniform loop */
            int i = i0 + threadIdx.x;
            int m = i < b1 && key16(__ldcg(p.logits + i)) == key;
            int n_m, mi = block_incl_scan_i(m, s_i, &n_m);
            if (m && base + mi - 1 == rank) *p.out_id = i;
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
    if (!p->logits || p->n_valid <= 0 || !p->step || !p->max_logit || !p->scratch || !p->out_id ||
        p->blocks > SM_MAX_BLOCKS)
        return (int)cudaErrorInvalidValue;
    int blocks = p->blocks;
    if (blocks <= 0) {
        blocks = ceil_div(p->n_valid, SM_THREADS * 4);
        if (blocks > 264) blocks = 264;
    }
    int rc = launch_kernel(sample_hist_bf16, dim3((unsigned)blocks), dim3(SM_THREADS), 0, l, *p);
    if (rc) return rc;
    return launch_kernel(sample_pick_bf16, dim3((unsigned)blocks), dim3(SM_THREADS), 0, l, *p);
}
