/* step_lab.cu — the skeleton of a persistent decode step: could one kernel keep DRAM streaming across the step's
 * ~100 dependent GEMV phases, if each SM streams its rows of every phase, in order, through a paced shared-memory
 * ring while the phases wait on grid barriers? (docs/PERF_NOTES.md §24-25: the one design left with the gain that
 * 0.60 ms/token needs; burst_lab paced measured its premise: 2-3 pieces of 16 KB in flight per SM stream 4.0-4.2 TB/s
 * and an exchange round then costs ~1.55 us.)
 *
 * One launch = one step of Qwen3.5-0.8B's GEMV bytes: 24 layers (3 DeltaNet + 1 attention, x6) of
 *   in (8224 or 5120 rows x 1024), [mixer], out (1024 x 2048), gate/up (7168 x 1024), down (1024 x 3584)
 * and the LM head (248320 x 1024), 1.53 GB, on 132 blocks x 512 threads (one per SM). Block b owns rows
 * [N b / G, N (b + 1) / G) of every phase (row split: no split-K). Warp 15, lane 0 is the producer: it streams the
 * block's slices of all phases, in order, as pieces of whole rows (<= 16 KB) into a ring of S slots (TMA bulk
 * copies, a "full" mbarrier per slot), keeping at most P pieces in flight, and reuses a slot once the consumers have
 * released it (an "empty" mbarrier, 15 warp arrivals). Warps 0..14 consume: per phase, they wait for the grid
 * barrier that ends the previous phase, load the phase's input vector (K floats, one L2 round trip, as a real phase
 * reads its predecessor's output), then per piece take 512-byte chunks (32 lanes x 16 B), dot them with x in shared
 * memory, reduce per warp and add the sum to the row's shared accumulator; at the phase's end they store the rows'
 * sums and arrive on the grid barrier (one counter, atom.add.release.gpu, spin on ld.acquire). A mixer phase
 * (the DeltaNet recurrence or the attention) is a barrier plus `mixer_ns` of spinning.
 *
 * Variants (ms per step, median of REPS launches; the same 1.53 GB each time, > L2):
 *   stream: consumers never wait on the grid (the ring's own rate, consumption included);
 *   step:   the phases with their barriers, P = 1..6 pieces in flight, S slots, mixer 0 / 2 us;
 *   chain:  barriers and x loads only, no weights (what the dependent chain costs alone).
 * Block 0 stamps each phase's start (after its barrier) and the producer's stalls, to see where a step waits.
 *
 *   build: make build/bench/step_lab (sm_90a)      run: build/bench/step_lab */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/tma.cuh"
#include "lab.cuh"

#define REPS 9
#define PIECE_MAX (16u << 10)
#define S_MAX 12
#define XMAX 4096        /* floats of the input vector in shared memory (K <= XMAX) */
#define YMAX 2048        /* rows of one block in one phase (the LM head: 1882) */
#define MAX_PH 160

struct Phase {
    const unsigned char *w; /* [N][K] bf16 */
    int N, K;
    int mixer;              /* 1: no weights; a barrier then mixer_ns of spinning */
};
__constant__ Phase c_ph[MAX_PH];

struct LP {
    int n_ph, P, S, mode; /* mode 0 step, 1 stream (no grid waits), 2 chain (no weights) */
    long long mixer_ns;
    const float *x;       /* XMAX floats: every phase's input */
    float *y;             /* outputs: [phase][N] (LM head included) */
    unsigned *bar;        /* grid barrier counter (zeroed before each launch) */
    unsigned long long *stamp; /* block 0: [phase] start, relative to the kernel's start; [MAX_PH]: end;
                                * [MAX_PH + 1]: ns the producer waited for a free slot */
    unsigned *sink;
};

__device__ __forceinline__ void grid_barrier(unsigned *ctr, unsigned target) {
    unsigned v;
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(v) : "l"(ctr) : "memory");
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
    } while ((int)(v - target) < 0);
}
/* block b's rows of an N-row phase, and its pieces: rows per piece so that a piece is <= PIECE_MAX */
__device__ __forceinline__ void slice(const Phase &ph, int b, int G, int *r0, int *nr, int *rpp) {
    *r0 = (int)((long long)ph.N * b / G);
    *nr = (int)((long long)ph.N * (b + 1) / G) - *r0;
    *rpp = max(1, (int)(PIECE_MAX / (2u * (unsigned)ph.K)));
}

__global__ void __launch_bounds__(512, 1) step(const __grid_constant__ LP p) {
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ __align__(8) unsigned long long full[S_MAX], empty[S_MAX];
    __shared__ __align__(16) float xs[XMAX];
    __shared__ float ys[YMAX];
    __shared__ unsigned long long t0_s;
    const int b = blockIdx.x, G = gridDim.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (int i = 0; i < p.S; i++) {
            mbar_init((unsigned)__cvta_generic_to_shared(&full[i]), 1);
            mbar_init((unsigned)__cvta_generic_to_shared(&empty[i]), 15);
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
            int r0, nr, rpp;
            slice(ph, b, G, &r0, &nr, &rpp);
            for (int r = 0; r < nr; r += rpp, i++) {
                const unsigned s = i % p.S, rows = min(rpp, nr - r), bytes = rows * 2u * ph.K;
                if (i >= (unsigned)p.P) /* pace: piece i - P has landed */
                    mbar_wait((unsigned)__cvta_generic_to_shared(&full[(i - p.P) % p.S]), ((i - p.P) / p.S) & 1);
                if (i >= (unsigned)p.S) { /* the slot's previous piece has been consumed */
                    const unsigned long long tw = gtimer();
                    mbar_wait((unsigned)__cvta_generic_to_shared(&empty[s]), ((i / p.S) - 1) & 1);
                    waited += gtimer() - tw;
                }
                const unsigned fb = (unsigned)__cvta_generic_to_shared(&full[s]);
                mbar_arrive_expect_tx(fb, bytes);
                bulk_g2s((unsigned)__cvta_generic_to_shared(ring + (size_t)s * PIECE_MAX),
                         ph.w + ((size_t)(r0 + r) * ph.K) * 2, bytes, fb);
            }
        }
        if (b == 0) p.stamp[MAX_PH + 1] = waited;
        return;
    }
    /* ---- warps 0..14: the phases ---- */
    unsigned i = 0, nbar = 0;
    for (int f = 0; f < p.n_ph; f++) {
        const Phase ph = c_ph[f];
        if (b == 0 && tid == 0) p.stamp[f] = gtimer() - t0;
        if (ph.mixer) {
            if (p.mode != 1 && p.mixer_ns > 0) {
                const unsigned long long ts = gtimer();
                while ((long long)(gtimer() - ts) < p.mixer_ns) {
                }
            }
        } else {
            int r0, nr, rpp;
            slice(ph, b, G, &r0, &nr, &rpp);
            for (int k = tid; k < ph.K; k += 480) xs[k] = __ldcg(p.x + k); /* the input: one L2 round trip */
            for (int r = tid; r < nr; r += 480) ys[r] = 0.0f;
            bar_sync(1, 480);
            if (p.mode != 2) {
                const int cpr = ph.K / 256; /* 512-byte chunks per row (K % 256 == 0 here) */
                for (int r = 0; r < nr; r += rpp, i++) {
                    const unsigned s = i % p.S, rows = min(rpp, nr - r);
                    mbar_wait((unsigned)__cvta_generic_to_shared(&full[s]), (i / p.S) & 1);
                    const uint4 *pc = reinterpret_cast<const uint4 *>(ring + (size_t)s * PIECE_MAX);
                    for (int c = warp; c < (int)rows * cpr; c += 15) { /* chunk c: row c / cpr, columns 256 (c % cpr) */
                        const uint4 w = pc[c * 32 + lane];
                        const float4 *xp = reinterpret_cast<const float4 *>(xs + (c % cpr) * 256 + lane * 8);
                        const float4 a = xp[0], bq = xp[1];
                        const float xv[8] = {a.x, a.y, a.z, a.w, bq.x, bq.y, bq.z, bq.w};
                        const float d = warp_sum(dot8(w, xv, 0.0f));
                        if (lane == 0) atomicAdd(&ys[r + c / cpr], d);
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive((unsigned)__cvta_generic_to_shared(&empty[s]));
                }
            }
            bar_sync(1, 480);
            for (int r = tid; r < nr; r += 480) __stcg(p.y + r0 + r, ys[r]);
        }
        if (p.mode != 1 && f + 1 < p.n_ph) { /* the phase's end: everyone's outputs before anyone reads them */
            nbar++;
            bar_sync(1, 480);
            if (tid == 0) grid_barrier(p.bar, nbar * (unsigned)G);
            bar_sync(1, 480);
        }
    }
    if (b == 0 && tid == 0) p.stamp[MAX_PH] = gtimer() - t0;
    acc += ys[0];
    if (acc == 12345.0f) atomicAdd(p.sink, 1u);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    int dev = 0, nsm = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    /* the step's phases (Qwen3.5-0.8B), weights in one arena (filled with small bf16 values) */
    std::vector<Phase> ph;
    size_t total = 0;
    auto gemv = [&](int N, int K) {
        Phase q = {nullptr, N, K, 0};
        ph.push_back(q);
        total += (size_t)N * K * 2;
    };
    for (int l = 0; l < 24; l++) {
        const bool attn = l % 4 == 3;
        gemv(attn ? 5120 : 8224, 1024);
        ph.push_back(Phase{nullptr, 0, 0, 1});
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
    CK(cudaMemcpyToSymbol(c_ph, ph.data(), sizeof(Phase) * ph.size()));
    float *x, *y;
    unsigned *bar, *sink;
    unsigned long long *stamp;
    CK(cudaMalloc(&x, XMAX * 4));
    CK(cudaMemset(x, 0, XMAX * 4));
    CK(cudaMalloc(&y, 248320 * 4));
    CK(cudaMalloc(&bar, 256));
    CK(cudaMalloc(&sink, 256));
    CK(cudaMalloc(&stamp, (MAX_PH + 2) * 8));
    printf("step_lab on %s (%d SMs): %zu phases (%d GEMVs, %.3f GB of weights), %d blocks x 512 threads\n", prop.name,
           nsm, ph.size(), n_gemv, total / 1e9, nsm);
    const size_t smem = (size_t)S_MAX * PIECE_MAX;
    CK(cudaFuncSetAttribute(step, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<unsigned long long> hs(MAX_PH + 2);
    auto run = [&](int mode, int P, int S, long long mixer_ns, bool show) {
        LP p = {(int)ph.size(), P, S, mode, mixer_ns, x, y, bar, stamp, sink};
        std::vector<float> ms;
        CK(cudaMemset(stamp, 0, (MAX_PH + 2) * 8));
        for (int r = 0; r < REPS; r++) {
            CK(cudaMemset(bar, 0, 256));
            CK(cudaEventRecord(e0));
            step<<<nsm, 512, (size_t)S * PIECE_MAX>>>(p);
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
        static const char *mn[] = {"step", "stream (no grid waits)", "chain (no weights)"};
        printf("| %s | %d | %d | %lld | %.4f | %.0f | %.1f | %.1f |\n", mn[mode], P, S, mixer_ns / 1000, med,
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
            printf(" |||||||\n");
        }
        return med;
    };
    printf("\n| variant | P | S | mixer us | ms per step | GB/s | block 0 end us | producer waited for slots us |\n"
           "|---|---|---|---|---|---|---|---|\n");
    run(1, 3, 8, 0, false);
    run(1, 6, 12, 0, false);
    run(2, 3, 8, 0, true);
    run(2, 3, 8, 2000, false);
    for (int P : {1, 2, 3, 4, 6}) run(0, P, P <= 3 ? 8 : 12, 0, P == 3);
    for (int S : {4, 12}) run(0, 3, S, 0, false);
    run(0, 3, 8, 2000, true);
    printf("\n(the engine today: ~0.646 ms per step at ctx 128, 0.60 required; the bytes at 4.0 TB/s: %.3f ms)\n",
           total / 4.0e12 * 1e3);
    return 0;
}
