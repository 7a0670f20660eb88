/* burst_lab.cu — how fast does a chain of one-shot weight reads stream on this GPU, by block footprint?
 *
 * The decode step is a chain of kernels that each read 4-22 MB of weights once ("one-shot": every block
 * issues its loads at entry, before griddepcontrol.wait, then waits for the previous kernel). This lab
 * strips the GEMV down to that read and times chains of such kernels, to separate what the hardware
 * does with the bursts from what our kernels do around them:
 *   full:    132 blocks x 512 threads, L 16-byte loads per thread per round (up to 80 registers of data),
 *            120 KiB of (unused) shared memory reserved: the next kernel's blocks become resident only
 *            when this one's leave (as the engine's in_proj GEMV and fused MLP today, by registers);
 *   half:    132 blocks x 256 threads, __launch_bounds__(256, 2): two kernels fit side by side, so the
 *            next kernel's first round of loads is in flight while this one drains;
 *   quarter: 132 x 128 threads, (128, 4).
 * A kernel of `rounds` > 1 reads round r + 1 after consuming round r (registers only, as a GEMV would).
 * Chains: 24 launches of one size (per-launch us and TB/s), and 18 "layers" of [in 17 MB, mixer that
 * waits then spins 3 us, out 4 MB, mlp 22 MB] (the DeltaNet layer's bytes and its latency-bound step),
 * with every launch on fresh bytes (> L2). Graph + PDL (trigger at entry), median of 15 replays. Last, the
 * latency of the fused DeltaNet mixer's exchange between the 8 blocks of a head, alone (xchg), and while
 * bulk reads are in flight on the same or on other SMs (hol).
 *
 *   build:  make build/bench/burst_lab   (sm_90a)
 *   run:    build/bench/burst_lab [xchg: the exchange sections only | il: block layouts only | issue: the per-SM
 *           issue limit only | groups: two alternating SM groups and co-resident
 *           launches with a late trigger only | pf: each launch prefetches the next one's bytes into L2 during
 *           its chain | pair: a DeltaNet layer's two kernels alternating, today's footprints vs co-resident |
 *           paced: exchange round trips beside a stream that keeps 1-8 pieces of 16 KB in flight] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/async.cuh"
#include "lab.cuh"

#define REPS 15
#define FULL_SMEM (120 << 10) /* "full" kernels reserve it (unused) so that no other block fits beside them */

struct BP {
    const uint4 *w;
    int rounds;
    unsigned *sink;
    float *io;
    long long spin_ns;
};

/* The end of a lab kernel: fold each block's checksum into the sink. d_sink_one = 1: every warp adds to one
 * word (what the lab did through session 12: 16 same-address atomics per block, ~2100 per 132-block launch,
 * that a launch's completion waits for); 0: one atomic per block, each block on its own 128-byte line (as the
 * engine's kernels, whose reductions spread over >= 1024 addresses). */
__device__ int d_sink_one;
__device__ __forceinline__ void sink_block(unsigned *sink, unsigned acc) {
    __shared__ unsigned sred[32];
#pragma unroll
    for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if (d_sink_one) {
        if ((threadIdx.x & 31) == 0) atomicXor(sink, acc);
        return;
    }
    if ((threadIdx.x & 31) == 0) sred[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned w = 1; w < blockDim.x >> 5; w++) acc ^= sred[w];
        atomicXor(sink + 64 + 32 * (size_t)(blockIdx.x + gridDim.x * blockIdx.y), acc);
    }
}

/* IL = 0: block b reads one contiguous range (NT L 16 bytes per round; the engine's weight layouts); IL = 1:
 * its load i reads 8 KB chunk i G + b, so that load i of all G blocks covers one contiguous G x 8 KB window. */
template <int NT, int L, int MINB, int IL = 0>
__global__ void __launch_bounds__(NT, MINB) burst(const __grid_constant__ BP p) {
    pdl_trigger();
    const size_t per_round = (size_t)gridDim.x * NT * L;
    const uint4 *b = p.w + (size_t)blockIdx.x * NT * (IL ? 1 : L) + threadIdx.x;
    const size_t step = IL ? (size_t)gridDim.x * NT : NT;
    uint4 v[L];
#pragma unroll
    for (int i = 0; i < L; i++) v[i] = ld_stream(b + i * step);
    pdl_wait();
    const float dep = __ldcg(p.io);
    unsigned acc = __float_as_uint(dep);
    for (int r = 0; r < p.rounds; r++) {
        if (r) {
#pragma unroll
            for (int i = 0; i < L; i++) v[i] = ld_stream(b + r * per_round + i * step);
        }
#pragma unroll
        for (int i = 0; i < L; i++) acc = acc * 3u + (v[i].x ^ v[i].y) + (v[i].z ^ v[i].w);
    }
    sink_block(p.sink, acc);
    if (blockIdx.x == 0 && threadIdx.x == 0) p.io[1] = dep + 1.0f;
}

__global__ void __launch_bounds__(128) mixer(const __grid_constant__ BP p) {
    pdl_trigger();
    pdl_wait();
    const unsigned long long t0 = gtimer();
    while ((long long)(gtimer() - t0) < p.spin_ns) {
    }
    if (threadIdx.x == 0) atomicAdd(p.sink + 1, 1u);
}

/* ---- issue: how many bytes can one SM have in flight before its load instructions stall? ----------------
 * One block of 512 threads per SM; each thread issues L 16-byte loads over fresh bytes, into registers
 * (ld_stream, CPA = 0) or as cp.async copies into shared memory (CPA = 1), with no use in between; every
 * thread stamps the global timer right after its last load instruction and again once its data has landed.
 * Out per block: [slowest thread's issue end, slowest thread's data landed] relative to the block's entry, ns.
 * If the issue end grows with L past some footprint, the warps stall at the load instructions while earlier
 * loads are outstanding, and a kernel that issues that much before griddepcontrol.wait reaches its wait late
 * (the suspect for attn_qs's 6 us release, docs/PERF_NOTES.md §20). */
template <int L, bool CPA>
__global__ void __launch_bounds__(512, 1) issue(const uint4 *w, unsigned long long *out, unsigned *sink) {
    extern __shared__ __align__(16) unsigned char ism[];
    __shared__ unsigned long long t_iss, t_land;
    const int tid = threadIdx.x;
    if (tid == 0) t_iss = 0, t_land = 0;
    __syncthreads();
    const unsigned long long t0 = gtimer();
    const uint4 *b = w + (size_t)blockIdx.x * 512 * L + tid;
    uint4 v[CPA ? 1 : L];
#pragma unroll
    for (int i = 0; i < L; i++) {
        if constexpr (CPA) {
            const unsigned sa = (unsigned)__cvta_generic_to_shared(ism + ((size_t)i * 512 + tid) * 16);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(b + i * 512) : "memory");
        } else {
            v[i] = ld_stream(b + i * 512);
        }
    }
    if constexpr (CPA) asm volatile("cp.async.commit_group;" ::: "memory");
    const unsigned long long t1 = gtimer();
    unsigned acc = 0;
    if constexpr (CPA) {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
        for (int i = 0; i < L; i++) {
            const uint4 x = *reinterpret_cast<const uint4 *>(ism + ((size_t)i * 512 + tid) * 16);
            acc = acc * 3u + (x.x ^ x.y) + (x.z ^ x.w);
        }
    } else {
#pragma unroll
        for (int i = 0; i < L; i++) acc = acc * 3u + (v[i].x ^ v[i].y) + (v[i].z ^ v[i].w);
    }
    const unsigned long long t2 = gtimer();
    atomicMax(&t_iss, t1 - t0);
    atomicMax(&t_land, t2 - t0);
    __syncthreads();
    if (tid == 0) out[2 * blockIdx.x] = t_iss, out[2 * blockIdx.x + 1] = t_land;
    if ((tid & 31) == 0) atomicXor(sink, acc);
}

/* The lab kernels' common steps (grp, pk): fold the block's shared-memory bytes into acc; RT dependent L2 round trips
 * (a chain's exchange: thread 0 adds to its block's line and the next add waits for the value, shared with the block
 * through a barrier); every thread polls the global timer for ns; thread 0 stamps [entry, wait returned, data
 * landed, end, smid]. */
/* thread 0: bytes from src into shared memory at gsm by TMA bulk copies of <= 16 KB, completing on the mbarrier bar */
__device__ __forceinline__ void lab_bulk_issue(unsigned char *gsm, const unsigned char *src, unsigned bytes,
                                               unsigned bar) {
    mbar_init(bar, 1);
    mbar_init_fence();
    mbar_arrive_expect_tx(bar, bytes);
    const unsigned da = (unsigned)__cvta_generic_to_shared(gsm);
    for (unsigned o = 0; o < bytes; o += 16384) bulk_g2s(da + o, src + o, bytes - o < 16384 ? bytes - o : 16384u, bar);
}
__device__ __forceinline__ unsigned lab_fold_smem(const unsigned char *gsm, unsigned bytes, unsigned acc) {
    for (unsigned o = threadIdx.x * 16; o < bytes; o += blockDim.x * 16) {
        const uint4 x = *reinterpret_cast<const uint4 *>(gsm + o);
        acc = acc * 3u + (x.x ^ x.y) + (x.z ^ x.w);
    }
    return acc;
}
template <int RT>
__device__ __forceinline__ unsigned lab_round_trips(unsigned *sink, unsigned acc) {
    __shared__ unsigned rt_v;
    unsigned v = acc & 1u;
    for (int r = 0; r < RT; r++) {
        if (threadIdx.x == 0) rt_v = atomicAdd(sink + 64 + 32 * (size_t)(gridDim.x + blockIdx.x), v + 1u);
        __syncthreads();
        v = rt_v;
        __syncthreads();
    }
    return acc + (v & 1u);
}
__device__ __forceinline__ void lab_spin(long long ns) {
    if (ns <= 0) return;
    const unsigned long long t0 = gtimer();
    while ((long long)(gtimer() - t0) < ns) {
    }
}
__device__ __forceinline__ void lab_stamp(unsigned long long *stamp, unsigned long long t_in, unsigned long long t_rel,
                                          unsigned long long t_data) {
    if (!stamp || threadIdx.x != 0) return;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    unsigned long long *o = stamp + (size_t)blockIdx.x * 5;
    o[0] = t_in, o[1] = t_rel, o[2] = t_data, o[3] = gtimer(), o[4] = smid;
}

/* ---- groups: two SM groups that alternate (docs/PERF_NOTES.md §17 (3), §21) --------------------------------
 * grp<L>: G blocks x 512 threads. Before griddepcontrol.wait each block issues its share of the launch's bytes:
 * smem_b bytes by TMA bulk copies into shared memory (thread 0) and L 16-byte register loads per thread; then it
 * waits, reads the value the previous launch wrote, folds its data once it has landed, spins spin_ns (the
 * chain's work after the data, as a real kernel's exchange / step / reductions), writes, exits. With G = n_sm / 2
 * and one block per SM (reserve bytes of shared memory), launch i + 1's blocks become resident on the SMs that
 * launch i leaves free and stream their bytes during launch i's chain; with G = n_sm each SM loads half as much,
 * and the next launch starts only as this one leaves (or beside it, on the same SM, if two blocks fit).
 * TRIG 1: griddepcontrol.launch_dependents once the block's data has landed instead of at entry, so that a next
 * launch that fits beside it loads during this one's chain (the spin) but not during its loads. SPK 1: thread 0
 * spins (with __nanosleep) while the others wait at a barrier, instead of 512 threads polling the timer. RT: that
 * many dependent L2 round trips after the data, before the spin (an exchange in the chain; with TRIG 1 they queue
 * behind the next launch's loads). */
struct GP {
    const unsigned char *w;
    unsigned smem_b;
    unsigned *sink;
    float *io;
    long long spin_ns;
    unsigned long long *stamp; /* optional: per block [entry, wait returned, data landed, end, smid] (global ns) */
    const unsigned char *pf;   /* PF > 0: the next launch's bytes, prefetched into L2 (this block's share) */
    long long pf_bytes;
};
/* the first half of this block's share of l2_prefetch_share's slice */
__device__ __forceinline__ void l2_prefetch_half(const void *base, long long bytes) {
    if (!base || bytes <= 0) return;
    const long long nb = gridDim.x, b = blockIdx.x;
    const long long chunk = ((bytes + nb - 1) / nb + 255) & ~255ll, piece = 16384;
    const long long end = min(bytes, b * chunk + chunk / 2);
    for (long long o = b * chunk + (long long)threadIdx.x * piece; o < end; o += (long long)blockDim.x * piece) {
        const unsigned sz = (unsigned)min(piece, end - o);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *)base + o), "r"(sz) : "memory");
    }
}
/* per-line prefetch.global.L2 (EL: ::evict_last) of this block's share of [base, base + bytes) */
template <bool EL>
__device__ __forceinline__ void l2_prefetch_lines(const void *base, long long bytes) {
    if (!base || bytes <= 0) return;
    const long long chunk = bytes / gridDim.x;
    const char *q = (const char *)base + (long long)blockIdx.x * chunk;
    for (long long o = (long long)threadIdx.x * 128; o < chunk; o += (long long)blockDim.x * 128) {
        if (EL)
            asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(q + o));
        else
            asm volatile("prefetch.global.L2 [%0];" ::"l"(q + o));
    }
}
/* PF 1: once the block's data has landed (DRAM idle during the chain), the block issues
 * cp.async.bulk.prefetch.L2 of its share of the next launch's bytes; PF 2: the same at entry, before its own
 * loads; PF 3: after the data, the first half of its share only; PF 4 / 5: after the data, per-line
 * prefetch.global.L2 (/ ::evict_last) instead of the bulk prefetch. */
template <int L, int TRIG = 0, int SPK = 0, int RT = 0, int PF = 0>
__global__ void __launch_bounds__(512, 1) grp(const __grid_constant__ GP p) {
    extern __shared__ __align__(128) unsigned char gsm[];
    __shared__ __align__(8) unsigned long long gbar_s;
    const unsigned long long t_in = gtimer();
    if (TRIG == 0) pdl_trigger();
    const unsigned bar = (unsigned)__cvta_generic_to_shared(&gbar_s);
    const unsigned char *base = p.w + (size_t)blockIdx.x * (p.smem_b + (size_t)512 * L * 16);
    if (PF == 2) l2_prefetch_share(p.pf, p.pf_bytes);
    if (threadIdx.x == 0) lab_bulk_issue(gsm, base, p.smem_b, bar);
    const uint4 *b = reinterpret_cast<const uint4 *>(base + p.smem_b) + threadIdx.x;
    uint4 v[L];
#pragma unroll
    for (int i = 0; i < L; i++) v[i] = ld_stream(b + i * 512);
    pdl_wait();
    const unsigned long long t_rel = gtimer();
    const float dep = __ldcg(p.io);
    unsigned acc = __float_as_uint(dep);
#pragma unroll
    for (int i = 0; i < L; i++) acc = acc * 3u + (v[i].x ^ v[i].y) + (v[i].z ^ v[i].w);
    __syncthreads(); /* the barrier's init, for every thread */
    mbar_wait(bar, 0);
    __syncthreads();
    const unsigned long long t_data = gtimer();
    if (TRIG == 1) pdl_trigger(); /* the next launch may load during this one's chain (spin), not before */
    if (PF == 1) l2_prefetch_share(p.pf, p.pf_bytes);
    if (PF == 3) l2_prefetch_half(p.pf, p.pf_bytes);
    if (PF == 4) l2_prefetch_lines<false>(p.pf, p.pf_bytes);
    if (PF == 5) l2_prefetch_lines<true>(p.pf, p.pf_bytes);
    acc = lab_fold_smem(gsm, p.smem_b, acc);
    if constexpr (RT > 0) acc = lab_round_trips<RT>(p.sink, acc);
    if (SPK == 0) lab_spin(p.spin_ns); /* every thread polls the global timer */
    if (p.spin_ns > 0 && SPK == 1) { /* thread 0 polls, slowly; the others wait at the barrier */
        if (threadIdx.x == 0) {
            const unsigned long long t0 = gtimer();
            while ((long long)(gtimer() - t0) < p.spin_ns) __nanosleep(64);
        }
        __syncthreads();
    }
    sink_block(p.sink, acc);
    if (blockIdx.x == 0 && threadIdx.x == 0) p.io[1] = dep + 1.0f;
    lab_stamp(p.stamp, t_in, t_rel, t_data);
}

/* ---- pair: a DeltaNet layer's two kernels, alternating (docs/PERF_NOTES.md §23) ----------------------------
 * pk<L, NT, RT, TRIG, WR, CPA>: NT threads; before griddepcontrol.wait L 16-byte register loads per thread and smem_b bytes by
 * TMA into shared memory; then the previous launch's value (an L2 round trip, as a kernel's input row), the data,
 * RT dependent L2 round trips (an exchange), spin_ns of chain, exit. TRIG 0: launch_dependents at entry (the engine
 * today); 1: after the data and the RT round trips, so that a next launch that fits beside it loads during the spin
 * only; 2: once the data has landed, before its shared-memory reads (the engine's staged MLP under QWEN35_CO: do
 * those reads stall behind the co-resident successor's register loads?). WR: that many fp32 reds per block at the end (the kernel's output); CPA 1: the shared-memory part by per-thread
 * cp.async issued behind the register loads instead of TMA (as dn_layer). The dn_layer stand-in: 512 threads, 128 KB
 * in registers + 45 KB, RT 1, spin 3 us; the MLP stand-in: 168 KB (today 112 KB in registers + 56 KB TMA at 512
 * threads; co-resident: all TMA at 256 threads), spin 1.5 us. */
template <int L, int NT, int RT, int TRIG, int WR = 0, int CPA = 0>
__global__ void __launch_bounds__(NT, 1) pk(const __grid_constant__ GP p) {
    extern __shared__ __align__(128) unsigned char gsm[];
    __shared__ __align__(8) unsigned long long gbar_s;
    const unsigned long long t_in = gtimer();
    if (TRIG == 0) pdl_trigger();
    const unsigned bar = (unsigned)__cvta_generic_to_shared(&gbar_s);
    const unsigned char *base = p.w + (size_t)blockIdx.x * (p.smem_b + (size_t)NT * L * 16);
    if (!CPA && threadIdx.x == 0) lab_bulk_issue(gsm, base, p.smem_b, bar);
    unsigned acc = 0;
    if constexpr (L > 0) {
        const uint4 *b = reinterpret_cast<const uint4 *>(base + p.smem_b) + threadIdx.x;
        uint4 v[L > 0 ? L : 1];
#pragma unroll
        for (int i = 0; i < L; i++) v[i] = ld_stream(b + i * NT);
        if (CPA) { /* the smem part by per-thread cp.async behind the register loads, as dn_layer's 45 KB */
            for (unsigned o = threadIdx.x * 16; o < p.smem_b; o += NT * 16) {
                const unsigned sa = (unsigned)__cvta_generic_to_shared(gsm + o);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(base + o) : "memory");
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        pdl_wait();
        acc = __float_as_uint(__ldcg(p.io));
#pragma unroll
        for (int i = 0; i < L; i++) acc = acc * 3u + (v[i].x ^ v[i].y) + (v[i].z ^ v[i].w);
    } else {
        pdl_wait();
        acc = __float_as_uint(__ldcg(p.io));
    }
    const unsigned long long t_rel = gtimer();
    __syncthreads();
    if (CPA)
        asm volatile("cp.async.wait_group 0;" ::: "memory");
    else
        mbar_wait(bar, 0);
    __syncthreads();
    const unsigned long long t_data = gtimer();
    if (TRIG == 2) pdl_trigger();
    acc = lab_fold_smem(gsm, p.smem_b, acc);
    if constexpr (RT > 0) acc = lab_round_trips<RT>(p.sink, acc);
    if (TRIG == 1) pdl_trigger();
    lab_spin(p.spin_ns);
    if (WR > 0 && (int)threadIdx.x < WR) /* the kernel's output: WR fp32 reds per block over 1024 words (the MLP: 256) */
        atomicAdd(reinterpret_cast<float *>(p.sink) + 8192 + ((threadIdx.x * 4 + blockIdx.x * 4) & 1023),
                  (float)(acc & 1u));
    sink_block(p.sink, acc);
    if (blockIdx.x == 0 && threadIdx.x == 0) p.io[1] = __uint_as_float(acc & 0x3fffffu);
    lab_stamp(p.stamp, t_in, t_rel, t_data);
}

/* One exchange round of deltanet_layer.cu's counter protocol over a group of G blocks (hol, paced): threads < 32 store
 * 32 floats into slot s of xb, sync(), thread 0 adds 1 to the group's counter (release) and polls it (acquire)
 * until the round's G arrivals, sync(); returns threads < 256's read-back of the group's first 256 floats. */
template <class Sync>
__device__ __forceinline__ float lab_xchg_round(float *xb, int s, unsigned *ctr, int G, int r, Sync sync) {
    const int tid = threadIdx.x;
    if (tid < 32) __stcg(xb + s * 32 + tid, (float)(r + tid));
    sync();
    if (tid == 0) {
        unsigned old, v;
        asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(ctr) : "memory");
        const unsigned target = old - old % G + G;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
        } while ((int)(v - target) < 0);
    }
    sync();
    return tid < 256 ? __ldcg(xb + tid) : 0.0f;
}

/* ---- head-of-line: do bulk reads in flight delay an SM's L2 round trips? ---------------------------------
 * 128 blocks x 512 threads, one per SM (HOL_SMEM of shared memory). Blocks 0..63 are 8 "heads" of 8 blocks
 * doing HOL_NX exchange rounds in a row with deltanet_layer.cu's protocol (32 floats st.cg, barrier, one
 * atom.add.release.gpu on the head's counter, ld.acquire spin, ldcg of the head's 256 floats); thread 0
 * stamps the global timer after each round. MODE bit 0: these blocks first issue a TMA bulk read of `bulk`
 * bytes into their own shared memory (what the MLP tail of dn_layer did, docs/PERF_NOTES.md §17); bit 1:
 * blocks 64..127 do (the same traffic, on other SMs only). Out per block: [round 1 .. NX end, bulk done]
 * relative to the block's start, ns. */
#define HOL_NX 8
#define HOL_SMEM (176 << 10)
template <int MODE>
__global__ void __launch_bounds__(512, 1)
    hol(const unsigned char *src, unsigned bulk, float *xbuf, unsigned *cnt, unsigned long long *out, unsigned *sink) {
    extern __shared__ __align__(128) unsigned char hs[];
    __shared__ __align__(8) unsigned long long bar;
    const int b = blockIdx.x, tid = threadIdx.x;
    const bool xch = b < 64, load = xch ? (MODE & 1) != 0 : (MODE & 2) != 0;
    const unsigned mb = (unsigned)__cvta_generic_to_shared(&bar);
    unsigned long long t0 = 0, tr[HOL_NX];
    if (tid == 0) {
        mbar_init(mb, 1);
        mbar_init_fence();
        t0 = gtimer();
        if (load) {
            mbar_arrive_expect_tx(mb, bulk);
            const unsigned char *g = src + (size_t)b * bulk;
            for (unsigned o = 0; o < bulk; o += 16384) {
                const unsigned n = bulk - o < 16384 ? bulk - o : 16384;
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                                 (unsigned)__cvta_generic_to_shared(hs + o)),
                             "l"(g + o), "r"(n), "r"(mb)
                             : "memory");
            }
        }
    }
    __syncthreads();
    float acc = 0.0f;
    if (xch) {
        const int j = b / 8, s = b % 8;
        for (int r = 0; r < HOL_NX; r++) {
            acc += lab_xchg_round(xbuf + ((size_t)j * 2 + (r & 1)) * 256, s, cnt + j * 32, 8, r, [] { __syncthreads(); });
            if (tid == 0) tr[r] = gtimer();
        }
    }
    if (load) {
        mbar_wait(mb, 0);
        if (tid < 64) acc += (float)hs[tid * 16];
    }
    if (tid == 0) {
        unsigned long long *o = out + (size_t)b * (HOL_NX + 1);
        for (int r = 0; r < HOL_NX; r++) o[r] = xch ? tr[r] - t0 : 0;
        o[HOL_NX] = load ? gtimer() - t0 : 0;
    }
    if (acc == 12345.0f) atomicAdd(sink, 1u);
}

/* ---- paced: L2 round trips while a shared-memory ring streams at a paced depth (docs/PERF_NOTES.md §24) ------
 * The premise of a persistent layer kernel with the next phase's weights streamed in during the current phase's
 * chain: are the chain's L2 round trips still ~1 us when the SM (or the chip) streams, if the stream keeps only
 * P pieces in flight? And a grid barrier's (G = 64: the 64 exchanging blocks as one group)? 128 blocks x 512
 * threads, one per SM. Warp 15 is the producer: lane 0 streams `bytes` per
 * block through a ring of P slots of PACE_PIECE bytes (TMA bulk copies, an mbarrier per slot; piece i goes into
 * slot i % P once piece i - P has landed). Warps 0..14 of blocks 0..63 (groups of G: 8 as a DeltaNet head, or 64)
 * do PACE_NX exchange rounds in a row (lab_xchg_round over a named barrier of 480 threads); thread 0 stamps
 * each round. MODE bit 0: the exchanging blocks stream; bit 1: blocks 64..127 do. Out per block: [round 1 .. NX end,
 * stream end] relative to the block's start, ns (0: not done). */
#define PACE_NX 16
#define PACE_PIECE (16u << 10)
template <int MODE>
__global__ void __launch_bounds__(512, 1) paced(const unsigned char *src, unsigned bytes, int P, int G, float *xbuf,
                                                  unsigned *cnt, unsigned long long *out, unsigned *sink) {
    extern __shared__ __align__(128) unsigned char ps[];
    __shared__ __align__(8) unsigned long long bars[8];
    __shared__ unsigned long long t0_s;
    const int b = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bool xch = b < 64, stream = xch ? (MODE & 1) != 0 : (MODE & 2) != 0;
    if (tid == 0) {
        for (int i = 0; i < P; i++) mbar_init((unsigned)__cvta_generic_to_shared(&bars[i]), 1);
        mbar_init_fence();
        t0_s = gtimer();
    }
    __syncthreads();
    const unsigned long long t0 = t0_s;
    float acc = 0.0f;
    if (warp == 15) { /* the producer */
        if (stream && lane == 0) {
            const unsigned char *g = src + (size_t)b * bytes;
            const unsigned n = bytes / PACE_PIECE;
            for (unsigned i = 0; i < n; i++) {
                const unsigned slot = i % P, bar = (unsigned)__cvta_generic_to_shared(&bars[slot]);
                if (i >= (unsigned)P) mbar_wait(bar, ((i / P) - 1) & 1); /* piece i - P has landed */
                mbar_arrive_expect_tx(bar, PACE_PIECE);
                bulk_g2s((unsigned)__cvta_generic_to_shared(ps + (size_t)slot * PACE_PIECE), g + (size_t)i * PACE_PIECE,
                         PACE_PIECE, bar);
            }
            for (unsigned i = n > (unsigned)P ? n - P : 0; i < n; i++)
                mbar_wait((unsigned)__cvta_generic_to_shared(&bars[i % P]), (i / P) & 1);
            acc += (float)ps[lane * 16];
            out[(size_t)b * (PACE_NX + 1) + PACE_NX] = gtimer() - t0;
        }
    } else if (xch) {
        const int j = b / G, s = b % G; /* xbuf: 2 slots of 32 G floats per group (8 x 2 x 256 floats in all) */
        for (int r = 0; r < PACE_NX; r++) { /* warps 0..14 only: a named barrier of 480 threads */
            acc += lab_xchg_round(xbuf + ((size_t)j * 2 + (r & 1)) * 32 * G, s, cnt + j * 32, G, r,
                                  [] { bar_sync(1, 480); });
            if (tid == 0) out[(size_t)b * (PACE_NX + 1) + r] = gtimer() - t0;
        }
    }
    if (acc == 12345.0f) atomicAdd(sink, 1u);
}

/* ---- the exchange of the fused DeltaNet mixer (src/cuda/deltanet_layer.cu), alone ----------------------------
 * grid (8, H) x 512 threads, `rounds` exchanges in a row: threads < 32 store 32 floats of the block's slot,
 * then MODE 0: barrier, thread 0 __threadfence + atomicAdd, spin (ld.acquire) until the head's 8 arrivals;
 * MODE 1: the same with one atom.add.release.gpu (deltanet_layer.cu now); MODE 2: the head's cluster of 8, a
 * DSMEM push of the 32 floats to every block and one cluster barrier. Then threads < 256 read the 256
 * floats of the head (L2 or local shared memory). us per exchange = (t(65 rounds) - t(1)) / 64. */
__device__ __forceinline__ void xc_cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
template <int MODE>
__global__ void __launch_bounds__(512, 1) xchg(float *xbuf, unsigned *cnt, int rounds, unsigned *sink) {
    __shared__ __align__(16) float recv[256];
    __shared__ __align__(16) float mine[32];
    const int s = blockIdx.x, j = blockIdx.y, tid = threadIdx.x;
    float acc = 0.0f;
    if (tid < 32) mine[tid] = (float)(s * 32 + tid);
    if (MODE == 2) xc_cluster_sync();
    __syncthreads();
    for (int r = 0; r < rounds; r++) {
        if (MODE == 2) {
            if (tid < 64) { /* rank tid / 8, float4 piece tid % 8 */
                const unsigned rank = tid >> 3;
                const float4 v = reinterpret_cast<const float4 *>(mine)[tid & 7];
                const unsigned la = (unsigned)__cvta_generic_to_shared(recv + s * 32 + 4 * (tid & 7));
                unsigned ra;
                asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(la), "r"(rank));
                asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(ra), "f"(v.x), "f"(v.y),
                             "f"(v.z), "f"(v.w)
                             : "memory");
            }
            xc_cluster_sync();
            if (tid < 256) acc += recv[tid];
            xc_cluster_sync(); /* recv is rewritten next round */
        } else {
            float *xb = xbuf + ((size_t)j * 2 + (r & 1)) * 256;
            if (tid < 32) __stcg(xb + s * 32 + tid, mine[tid] + (float)r);
            __syncthreads();
            if (tid == 0) {
                unsigned old;
                if (MODE == 0) {
                    __threadfence();
                    old = atomicAdd(cnt + j, 1u);
                } else {
                    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(cnt + j) : "memory");
                }
                const unsigned target = old - old % 8 + 8;
                unsigned v;
                do {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(cnt + j) : "memory");
                } while ((int)(v - target) < 0);
            }
            __syncthreads();
            if (tid < 256) acc += __ldcg(xb + tid);
        }
    }
    if (acc == 12345.678f) atomicAdd(sink, 1u);
}

struct Kind {
    const char *name;
    void (*fn)(BP);
    int nt, l, minb;
};
static const Kind KINDS[] = {
    {"full L4", burst<512, 4, 1>, 512, 4, 1},     {"full L8", burst<512, 8, 1>, 512, 8, 1},
    {"full L16", burst<512, 16, 1>, 512, 16, 1},  {"full L20", burst<512, 20, 1>, 512, 20, 1},
    {"half L8", burst<256, 8, 2>, 256, 8, 2},     {"half L16", burst<256, 16, 2>, 256, 16, 2},
    {"half L20", burst<256, 20, 2>, 256, 20, 2},  {"quarter L16", burst<128, 16, 4>, 128, 16, 4},
    {"quarter L8", burst<128, 8, 4>, 128, 8, 4},  {"half L24", burst<256, 24, 2>, 256, 24, 2},
    {"full L16 IL", burst<512, 16, 1, 1>, 512, 16, 1}, {"full L20 IL", burst<512, 20, 1, 1>, 512, 20, 1},
    {"full L4 IL", burst<512, 4, 1, 1>, 512, 4, 1},
};
enum { K_F4, K_F8, K_F16, K_F20, K_H8, K_H16, K_H20, K_Q16, K_Q8, K_H24, K_F16I, K_F20I, K_F4I, N_KINDS };

static cudaStream_t g_st;
static char *g_arena;
static size_t g_arena_bytes, g_off;
static unsigned *g_sink;
static float *g_io;
static int g_nsm;

static size_t kind_bytes(int k, int rounds) { return (size_t)g_nsm * KINDS[k].nt * KINDS[k].l * 16 * rounds; }

static void launch(void (*fn)(BP), int grid, int nt, BP p, int pdl, size_t smem = 0) {
    cudaLaunchConfig_t c = {};
    c.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    c.gridDim = dim3(grid), c.blockDim = dim3(nt), c.stream = g_st;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = pdl;
    c.attrs = at, c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, fn, p));
}

static void rd(int k, int rounds, int pdl) {
    const size_t bytes = kind_bytes(k, rounds);
    if (g_off + bytes > g_arena_bytes) g_off = 0;
    BP p = {(const uint4 *)(g_arena + g_off), rounds, g_sink, g_io, 0};
    g_off += (bytes + 4095) & ~(size_t)4095;
    launch(KINDS[k].fn, g_nsm, KINDS[k].nt, p, pdl, KINDS[k].minb == 1 ? FULL_SMEM : 0);
}
static void mix(long long ns, int pdl) {
    BP p = {NULL, 0, g_sink, g_io, ns};
    launch(mixer, 128, 128, p, pdl);
}

/* median ms of one replay of the captured chain */
template <typename F>
static float time_graph(F record) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    g_off = 0;
    CK(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal));
    record();
    CK(cudaStreamEndCapture(g_st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float t[REPS];
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, g_st));
    for (int i = 0; i < REPS; i++) {
        CK(cudaEventRecord(a, g_st));
        CK(cudaGraphLaunch(ge, g_st));
        CK(cudaEventRecord(b, g_st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    std::sort(t, t + REPS);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return t[REPS / 2];
}

/* Launch i's per-block stamps (entry, wait returned, data landed, end; stride records per launch) relative to the end
 * of launch i - 1's last block, as table cells: first / median / last block. */
static void print_stamps(const std::vector<unsigned long long> &hs, int i, int grid, int stride) {
    unsigned long long prev_end = 0;
    for (int b = 0; b < grid; b++) prev_end = std::max(prev_end, hs[((size_t)(i - 1) * stride + b) * 5 + 3]);
    for (int k = 0; k < 4; k++) {
        std::vector<double> v;
        for (int b = 0; b < grid; b++) v.push_back(((double)hs[((size_t)i * stride + b) * 5 + k] - (double)prev_end) / 1e3);
        std::sort(v.begin(), v.end());
        printf(" %.2f / %.2f / %.2f |", v[0], v[v.size() / 2], v.back());
    }
}

int main(int argc, char **argv) {
    const bool only_x = argc > 1 && !strcmp(argv[1], "xchg"); /* the two exchange sections only */
    const bool only_il = argc > 1 && !strcmp(argv[1], "il"); /* contiguous vs interleaved block ranges only */
    const bool only_is = argc > 1 && !strcmp(argv[1], "issue"); /* the per-SM issue limit only */
    const bool only_gr = argc > 1 && !strcmp(argv[1], "groups"); /* two alternating SM groups only */
    const bool only_pf = argc > 1 && !strcmp(argv[1], "pf"); /* the next launch's bytes prefetched into L2 only */
    const bool only_pk = argc > 1 && !strcmp(argv[1], "pair"); /* a DeltaNet layer's two kernels, alternating */
    const bool only_pc = argc > 1 && !strcmp(argv[1], "paced"); /* L2 round trips beside a paced stream */
    CK(cudaSetDevice(0));
    CK(cudaDeviceGetAttribute(&g_nsm, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    g_arena_bytes = (size_t)2 << 30;
    CK(cudaMalloc(&g_arena, g_arena_bytes));
    CK(cudaMemset(g_arena, 1, g_arena_bytes));
    CK(cudaMalloc(&g_sink, 1 << 20));
    CK(cudaMalloc(&g_io, 64));
    CK(cudaMemset(g_io, 0, 64));
    {
        const char *e = getenv("LAB_SINK_ONE"); /* 1: the same-address sink of sessions 8-12, for comparison */
        const int one = e && atoi(e) == 1;
        CK(cudaMemcpyToSymbol(d_sink_one, &one, sizeof one));
        printf("sink: %s\n", one ? "every warp into one word (LAB_SINK_ONE=1)" : "one atomic per block, own line");
    }
    printf("burst_lab: %d SMs\n| kernel | threads | regs | blocks/SM | MB per round |\n|---|---|---|---|---|\n", g_nsm);
    for (int k = 0; k < N_KINDS; k++) {
        cudaFuncAttributes fa;
        int occ = 0;
        const size_t smem = KINDS[k].minb == 1 ? FULL_SMEM : 0;
        CK(cudaFuncSetAttribute(KINDS[k].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncGetAttributes(&fa, KINDS[k].fn));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, KINDS[k].fn, KINDS[k].nt, smem));
        printf("| %s | %d | %d | %d | %.2f |\n", KINDS[k].name, KINDS[k].nt, fa.numRegs, occ, kind_bytes(k, 1) / 1e6);
    }

    if (only_pc) { /* L2 round trips while a ring streams at a paced depth */
        float *xbuf;
        unsigned *cnt;
        unsigned long long *out;
        const unsigned bytes = 512u << 10; /* per streaming block: ~16 us at ~31 GB/s per SM */
        const int NO = 128 * (PACE_NX + 1);
        CK(cudaMalloc(&xbuf, 8 * 2 * 256 * 4));
        CK(cudaMalloc(&cnt, 8 * 32 * 4));
        CK(cudaMemset(cnt, 0, 8 * 32 * 4));
        CK(cudaMalloc(&out, NO * 8));
        printf("\n| stream (16 KB pieces, %u KB per streaming SM) | group | pieces in flight | exchange 1 done us | mean "
               "of rounds 2..%d us | stream done us (median / last block) | GB/s per streaming SM | chip GB/s |\n"
               "|---|---|---|---|---|---|---|---|\n", bytes >> 10, PACE_NX);
        const char *names[4] = {"none", "on the exchanging SMs", "on 64 other SMs only", "on all 128 SMs"};
        for (int G : {8, 64})
        for (int mode = 0; mode < 4; mode++)
            for (int P : {1, 2, 3, 4, 8}) {
                if (mode == 0 && P > 1) continue;
                void (*fn)(const unsigned char *, unsigned, int, int, float *, unsigned *, unsigned long long *,
                           unsigned *) =
                    mode == 0 ? paced<0> : mode == 1 ? paced<1> : mode == 2 ? paced<2> : paced<3>;
                CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 << 10));
                std::vector<double> x1, xr, sd, sl;
                for (int rep = 0; rep < 7; rep++) {
                    if (g_off + (size_t)128 * bytes > g_arena_bytes) g_off = 0;
                    const unsigned char *src = (const unsigned char *)g_arena + g_off;
                    g_off += (size_t)128 * bytes;
                    CK(cudaMemset(out, 0, NO * 8));
                    CK(cudaMemset(cnt, 0, 8 * 32 * 4)); /* the rounds' targets assume counts that start at 0 mod G */
                    /* 160 KB of shared memory whatever P: one block per SM */
                    fn<<<128, 512, 160 << 10, g_st>>>(src, bytes, P, G, xbuf, cnt, out, g_sink);
                    CK(cudaStreamSynchronize(g_st));
                    std::vector<unsigned long long> h(NO);
                    CK(cudaMemcpy(h.data(), out, NO * 8, cudaMemcpyDeviceToHost));
                    if (rep < 2) continue; /* warm-up */
                    std::vector<double> a, m, e;
                    for (int bl = 0; bl < 64; bl++) {
                        const unsigned long long *o = &h[(size_t)bl * (PACE_NX + 1)];
                        a.push_back(o[0] / 1e3);
                        m.push_back((o[PACE_NX - 1] - o[0]) / 1e3 / (PACE_NX - 1));
                    }
                    for (int bl = 0; bl < 128; bl++)
                        if (h[(size_t)bl * (PACE_NX + 1) + PACE_NX]) e.push_back(h[(size_t)bl * (PACE_NX + 1) + PACE_NX] / 1e3);
                    std::sort(a.begin(), a.end()), std::sort(m.begin(), m.end()), std::sort(e.begin(), e.end());
                    x1.push_back(a[a.size() / 2]), xr.push_back(m[m.size() / 2]);
                    if (!e.empty()) sd.push_back(e[e.size() / 2]), sl.push_back(e.back());
                }
                auto med = [](std::vector<double> v) {
                    if (v.empty()) return 0.0;
                    std::sort(v.begin(), v.end());
                    return v[v.size() / 2];
                };
                const double d = med(sd), l = med(sl);
                const int nstream = mode == 3 ? 128 : mode == 0 ? 0 : 64;
                printf("| %s | %d | %d | %.2f | %.2f | %.2f / %.2f | %.1f | %.0f |\n", names[mode], G, mode ? P : 0, med(x1),
                       med(xr), d, l, d > 0 ? bytes / d / 1e3 : 0.0, l > 0 ? (double)nstream * bytes / l / 1e3 : 0.0);
            }
        cudaFree(xbuf);
        cudaFree(cnt);
        cudaFree(out);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    if (only_pk) {
        struct K {
            const char *name;
            void (*fn)(GP);
            int nt, l;
            unsigned smem_b, reserve;
            long long spin;
        };
        /* today: both fill an SM (1 block per SM); co-resident: dn <= 96 registers x 512 and <= 54 KB of shared
         * memory, the MLP <= 64 registers x 256 and 170 KB, so an MLP block fits beside a dn block */
        const K dn0 = {"dn today", pk<16, 512, 1, 0>, 512, 16, 45u << 10, 160u << 10, 3000};
        const K mlp0 = {"mlp today", pk<14, 512, 0, 0>, 512, 14, 56u << 10, 160u << 10, 1500};
        const K dn1 = {"dn co-res, late trigger", pk<16, 512, 1, 1>, 512, 16, 45u << 10, 52u << 10, 3000};
        const K mlp1 = {"mlp co-res (TMA, 256 thr), late trigger", pk<0, 256, 0, 1>, 256, 0, 168u << 10, 170u << 10,
                        1500};
        const K dn2 = {"dn co-res, trigger at entry", pk<16, 512, 1, 0>, 512, 16, 45u << 10, 52u << 10, 3000};
        const K mlp2 = {"mlp co-res, trigger at entry", pk<0, 256, 0, 0>, 256, 0, 168u << 10, 170u << 10, 1500};
        const K mlp3 = {"mlp today, late trigger", pk<14, 512, 0, 1>, 512, 14, 56u << 10, 160u << 10, 1500};
        /* with their output writes at the end (256 fp32 reds per block, as the engine's out_proj / MLP) */
        const K dn0w = {"dn today + reds", pk<16, 512, 1, 0, 256>, 512, 16, 45u << 10, 160u << 10, 3000};
        const K mlp0w = {"mlp today + reds", pk<14, 512, 0, 0, 256>, 512, 14, 56u << 10, 160u << 10, 1500};
        const K dn1w = {"dn co-res, late trigger + reds", pk<16, 512, 1, 1, 256>, 512, 16, 45u << 10, 52u << 10, 3000};
        const K mlp1w = {"mlp co-res, late trigger + reds", pk<0, 256, 0, 1, 256>, 256, 0, 168u << 10, 170u << 10, 1500};
        /* the dn stand-in's 45 KB by per-thread cp.async behind its register loads (as dn_layer), with the reds */
        const K dn0c = {"dn today + reds, cp.async", pk<16, 512, 1, 0, 256, 1>, 512, 16, 45u << 10, 160u << 10, 3000};
        const K dn1c = {"dn co-res, late trigger + reds, cp.async", pk<16, 512, 1, 1, 256, 1>, 512, 16, 45u << 10,
                        52u << 10, 3000};
        /* the MLP stand-in triggering once its data has landed, before reading it from shared memory (the engine) */
        const K mlp4w = {"mlp co-res, trigger before its smem reads + reds", pk<0, 256, 0, 2, 256>, 256, 0, 168u << 10,
                         170u << 10, 1500};
        const K *all[] = {&dn0, &mlp0, &dn1, &mlp1, &dn2, &mlp2, &mlp3, &dn0w, &mlp0w, &dn1w, &mlp1w, &dn0c, &dn1c, &mlp4w};
        for (const K *k : all) { /* the limit (not a reservation) per function: the largest reserve of its uses */
            unsigned mx = 0;
            for (const K *k2 : all)
                if (k2->fn == k->fn) mx = std::max(mx, k2->reserve);
            cudaFuncAttributes fa;
            CK(cudaFuncSetAttribute(k->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mx));
            /* every kernel asks for the largest shared-memory carveout, so that an SM configured for one can take a
             * block of the other without draining (the split is set per kernel; without it, measured, the co-resident
             * blocks became resident only as the other kernel left); LAB_CARVEOUT=0: the driver's choice */
            if (!getenv("LAB_CARVEOUT") || atoi(getenv("LAB_CARVEOUT")) != 0)
                CK(cudaFuncSetAttribute(k->fn, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
            CK(cudaFuncGetAttributes(&fa, k->fn));
            printf("%s: %d threads x %d registers, %u KB shared (+%zu static), %.1f MB per launch\n", k->name, k->nt,
                   fa.numRegs, k->reserve >> 10, fa.sharedSizeBytes,
                   (double)(k->smem_b + (size_t)k->nt * k->l * 16) * g_nsm / 1e6);
        }
        auto record = [&](const K &a, const K &b, int layers, double spin_scale, unsigned long long *stamp) {
            for (int i = 0; i < 2 * layers; i++) {
                const K &k = i & 1 ? b : a;
                const size_t bytes = (k.smem_b + (size_t)k.nt * k.l * 16) * g_nsm, stride = (bytes + 4095) & ~(size_t)4095;
                if (g_off + stride > g_arena_bytes) g_off = 0;
                GP p = {(const unsigned char *)g_arena + g_off, k.smem_b, g_sink, g_io, (long long)(k.spin * spin_scale),
                        stamp ? stamp + (size_t)i * g_nsm * 5 : NULL, NULL, 0};
                g_off += stride;
                cudaLaunchConfig_t c = {};
                cudaLaunchAttribute at[1];
                c.gridDim = dim3(g_nsm), c.blockDim = dim3(k.nt), c.stream = g_st, c.dynamicSmemBytes = k.reserve;
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                c.attrs = at, c.numAttrs = 1;
                CK(cudaLaunchKernelEx(&c, k.fn, p));
            }
        };
        struct Pr {
            const char *name;
            const K *a, *b;
        };
        const Pr prs[] = {{"today (1 block/SM each, trigger at entry)", &dn0, &mlp0},
                          {"co-resident, late triggers", &dn1, &mlp1},
                          {"co-resident, triggers at entry", &dn2, &mlp2},
                          {"today's footprints, late triggers", &dn0, &mlp3},
                          {"today + 256 reds at the end of each launch", &dn0w, &mlp0w},
                          {"co-resident, late triggers + 256 reds at the end of each launch", &dn1w, &mlp1w},
                          {"today + reds, the dn stand-in's 45 KB by cp.async", &dn0c, &mlp0w},
                          {"co-resident, late triggers + reds, the dn stand-in's 45 KB by cp.async", &dn1c, &mlp1w},
                          {"co-resident + reds, the mlp stand-in triggering before its smem reads", &dn1w, &mlp4w},
                          {"the same, the dn stand-in's 45 KB by cp.async", &dn1c, &mlp4w}};
        printf("\n| 18 layers of (dn, mlp), graph + PDL | us per layer: chains x0 | x0.5 | x1 (dn 3 us, mlp 1.5 us) |"
               " x1.5 |\n|---|---|---|---|---|\n");
        for (int rep = 0; rep < 2; rep++)
            for (const Pr &pr : prs) {
                printf("| %s |", pr.name);
                for (double sc : {0.0, 0.5, 1.0, 1.5})
                    printf(" %.2f |", time_graph([&] { record(*pr.a, *pr.b, 18, sc, NULL); }) * 1e3 / 18);
                printf("\n");
            }
        unsigned long long *st;
        const int NL = 36;
        CK(cudaMalloc(&st, (size_t)NL * g_nsm * 5 * 8));
        std::vector<unsigned long long> hs((size_t)NL * g_nsm * 5);
        for (int pi : {5, 8, 9}) {
            for (int rep = 0; rep < 3; rep++) {
                CK(cudaMemset(st, 0, hs.size() * 8));
                g_off = 0;
                record(*prs[pi].a, *prs[pi].b, NL / 2, 1.0, st);
                CK(cudaMemcpyAsync(hs.data(), st, hs.size() * 8, cudaMemcpyDeviceToHost, g_st));
                CK(cudaStreamSynchronize(g_st));
            }
            printf("\n%s, chains x1 (us after the previous launch's last end: first / median / last block)\n"
                   "| launch | entry | wait returned | data landed | end |\n|---|---|---|---|---|\n", prs[pi].name);
            for (int i = 16; i < 22; i++) {
                printf("| %d %s |", i, i & 1 ? "mlp" : "dn");
                print_stamps(hs, i, g_nsm, g_nsm);
                printf("\n");
            }
        }
        cudaFree(st);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    if (only_pf) { /* each launch prefetches the next one's bytes into L2 during its chain (1 block per SM) */
        struct V {
            const char *name;
            void (*fn)(GP);
        };
        const V vs[] = {
            {"no prefetch", grp<8>},
            {"prefetch the next launch's share after the data landed", grp<8, 0, 0, 0, 1>},
            {"prefetch half of it after the data landed", grp<8, 0, 0, 0, 3>},
            {"prefetch the next launch's share at entry", grp<8, 0, 0, 0, 2>},
            {"2 L2 round trips after the data, no prefetch", grp<8, 0, 0, 2>},
            {"2 L2 round trips after the data, prefetch after the data", grp<8, 0, 0, 2, 1>},
            {"per-line prefetch.global.L2 after the data landed", grp<8, 0, 0, 0, 4>},
            {"per-line prefetch.global.L2::evict_last after the data landed", grp<8, 0, 0, 0, 5>},
            {"2 L2 round trips after the data, per-line prefetch after the data", grp<8, 0, 0, 2, 4>},
            {"no prefetch, every launch the same bytes (L2-resident)", grp<8>},
        };
        const unsigned smem_b = 100u << 10, reserve = 160u << 10;
        const size_t bytes = (smem_b + (size_t)512 * 8 * 16) * g_nsm, stride = (bytes + 4095) & ~(size_t)4095;
        const int hot = (int)(sizeof vs / sizeof vs[0]) - 1;
        auto record = [&](void (*fn)(GP), long long spin, unsigned long long *stamp, bool same = false) {
            for (int i = 0; i < 24; i++) {
                if (same) g_off = 0;
                if (g_off + 2 * stride > g_arena_bytes) g_off = 0;
                GP p = {(const unsigned char *)g_arena + g_off, smem_b, g_sink, g_io, spin,
                        stamp ? stamp + (size_t)i * g_nsm * 5 : NULL, (const unsigned char *)g_arena + g_off + stride,
                        (long long)bytes};
                g_off += stride;
                cudaLaunchConfig_t c = {};
                cudaLaunchAttribute at[1];
                c.gridDim = dim3(g_nsm), c.blockDim = dim3(512), c.stream = g_st, c.dynamicSmemBytes = reserve;
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                c.attrs = at, c.numAttrs = 1;
                CK(cudaLaunchKernelEx(&c, fn, p));
            }
        };
        printf("\n| chain of 24 (PDL), %.1f MB each, 1 block/SM | spin 0: us/launch | spin 1 us | spin 2 us | spin 4 us |\n"
               "|---|---|---|---|---|\n", bytes / 1e6);
        for (int rep = 0; rep < 2; rep++)
            for (const V &v : vs) {
                CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)reserve));
                const long long spins[4] = {0, 1000, 2000, 4000};
                printf("| %s |", v.name);
                for (long long sp : spins)
                    printf(" %.2f |", time_graph([&] { record(v.fn, sp, NULL, &v == &vs[hot]); }) * 1e3 / 24);
                printf("\n");
            }
        unsigned long long *st;
        CK(cudaMalloc(&st, (size_t)24 * g_nsm * 5 * 8));
        std::vector<unsigned long long> hs((size_t)24 * g_nsm * 5);
        for (int vi : {0, 1, 6, 8, hot}) {
            for (int rep = 0; rep < 3; rep++) {
                CK(cudaMemset(st, 0, hs.size() * 8));
                g_off = 0;
                record(vs[vi].fn, 2000, st, vi == hot);
                CK(cudaMemcpyAsync(hs.data(), st, hs.size() * 8, cudaMemcpyDeviceToHost, g_st));
                CK(cudaStreamSynchronize(g_st));
            }
            printf("\n%s, spin 2 us (us after the previous launch's last end: first / median / last block)\n"
                   "| launch | entry | wait returned | data landed | end |\n|---|---|---|---|---|\n", vs[vi].name);
            for (int i = 8; i < 12; i++) {
                printf("| %d |", i);
                print_stamps(hs, i, g_nsm, g_nsm);
                printf("\n");
            }
        }
        cudaFree(st);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    if (only_gr) { /* one group of n_sm blocks vs two groups of n_sm / 2 that alternate, chains of 24 launches */
        auto L_of = [](void (*fn)(GP)) { /* register loads per thread (template L) of a grp instance below */
            return fn == grp<16> ? 16 : fn == grp<4> || fn == grp<4, 1> ? 4 : 8;
        };
        struct G {
            const char *name;
            void (*fn)(GP);
            int grid;
            unsigned smem_b, reserve;
        };
        const int h = g_nsm / 2;
        const G gs[] = {
            {"one group: n_sm x (100 KB TMA + 64 KB regs), 1 block/SM", grp<8>, g_nsm, 100u << 10, 160u << 10},
            {"one group, 2 blocks/SM fit (the next launch beside it)", grp<8>, g_nsm, 100u << 10, 100u << 10},
            {"two groups: n_sm/2 x (200 KB TMA + 128 KB regs)", grp<16>, h, 200u << 10, 200u << 10},
            {"one group, half the bytes: n_sm x (50 KB TMA + 32 KB regs)", grp<4>, g_nsm, 50u << 10, 160u << 10},
            {"two groups, half the bytes: n_sm/2 x (100 KB TMA + 64 KB regs)", grp<8>, h, 100u << 10, 160u << 10},
            {"one group, 2 blocks/SM fit, trigger after the data landed", grp<8, 1>, g_nsm, 100u << 10, 100u << 10},
            {"one group, 1 block/SM, trigger after the data landed", grp<8, 1>, g_nsm, 100u << 10, 160u << 10},
            {"quiet spin: one group, 1 block/SM", grp<8, 0, 1>, g_nsm, 100u << 10, 160u << 10},
            {"quiet spin: one group, 2 blocks/SM fit", grp<8, 0, 1>, g_nsm, 100u << 10, 100u << 10},
            {"quiet spin: one group, 2 blocks/SM fit, trigger after the data landed", grp<8, 1, 1>, g_nsm, 100u << 10,
             100u << 10},
            {"half the bytes, 2 blocks/SM fit", grp<4>, g_nsm, 50u << 10, 100u << 10},
            {"half the bytes, 2 blocks/SM fit, trigger after the data landed", grp<4, 1>, g_nsm, 50u << 10, 100u << 10},
            {"2 L2 round trips after the data: one group, 1 block/SM", grp<8, 0, 0, 2>, g_nsm, 100u << 10, 160u << 10},
            {"2 L2 round trips after the data: 2 blocks/SM fit, trigger after the data (next loads in front of them)",
             grp<8, 1, 0, 2>, g_nsm, 100u << 10, 100u << 10},
        };
        for (const G &g : gs) { /* are two blocks of a launch resident per SM, as the layout assumes? */
            int occ = 0;
            CK(cudaFuncSetAttribute(g.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g.reserve));
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, g.fn, 512, g.reserve));
            printf("occupancy: %s: %d blocks/SM\n", g.name, occ);
        }
        printf("\n| chain of 24 (PDL) | MB each | spin 0: us/launch | spin 2 us | spin 4 us |\n|---|---|---|---|---|\n");
        for (int rep = 0; rep < 2; rep++) {
            const int one = rep == 0; /* first as through session 12, then one sink atomic per block */
            CK(cudaMemcpyToSymbol(d_sink_one, &one, sizeof one));
            printf("| sink: %s | | | | |\n", one ? "every warp, one word (before)" : "one atomic per block, own line");
            for (const G &g : gs) {
                const int L = L_of(g.fn);
                const size_t per = g.smem_b + (size_t)512 * L * 16, bytes = per * g.grid;
                CK(cudaFuncSetAttribute(g.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g.reserve));
                float t[3];
                for (int si = 0; si < 3; si++)
                    t[si] = time_graph([&] {
                        for (int i = 0; i < 24; i++) {
                            if (g_off + bytes > g_arena_bytes) g_off = 0;
                            GP p = {(const unsigned char *)g_arena + g_off, g.smem_b, g_sink, g_io, 2000LL * si,
                                    NULL};
                            g_off += (bytes + 4095) & ~(size_t)4095;
                            cudaLaunchConfig_t c = {};
                            cudaLaunchAttribute at[1];
                            c.gridDim = dim3(g.grid), c.blockDim = dim3(512), c.stream = g_st;
                            c.dynamicSmemBytes = g.reserve;
                            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                            at[0].val.programmaticStreamSerializationAllowed = 1;
                            c.attrs = at, c.numAttrs = 1;
                            CK(cudaLaunchKernelEx(&c, g.fn, p));
                        }
                    });
                printf("| %s | %.2f | %.2f | %.2f | %.2f |\n", g.name, bytes / 1e6, t[0] * 1e3 / 24, t[1] * 1e3 / 24,
                       t[2] * 1e3 / 24);
            }
        }
        /* where the time goes: 24 launches with spin 4 us, every block's stamps, launches 8 .. 13 (us after the
         * end of the previous launch's last block) */
        unsigned long long *st;
        CK(cudaMalloc(&st, (size_t)24 * g_nsm * 5 * 8));
        std::vector<unsigned long long> hs((size_t)24 * g_nsm * 5);
        for (int gi : {0, 1, 5, 11, 12, 13}) {
            const G &g = gs[gi];
            const int L = L_of(g.fn);
            const size_t bytes = (g.smem_b + (size_t)512 * L * 16) * g.grid;
            CK(cudaFuncSetAttribute(g.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g.reserve));
            for (int rep = 0; rep < 3; rep++) {
                CK(cudaMemset(st, 0, hs.size() * 8));
                g_off = 0;
                for (int i = 0; i < 24; i++) {
                    GP p = {(const unsigned char *)g_arena + g_off, g.smem_b, g_sink, g_io, 4000, st + (size_t)i * g_nsm * 5};
                    g_off += (bytes + 4095) & ~(size_t)4095;
                    cudaLaunchConfig_t c = {};
                    cudaLaunchAttribute at[1];
                    c.gridDim = dim3(g.grid), c.blockDim = dim3(512), c.stream = g_st, c.dynamicSmemBytes = g.reserve;
                    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    at[0].val.programmaticStreamSerializationAllowed = 1;
                    c.attrs = at, c.numAttrs = 1;
                    CK(cudaLaunchKernelEx(&c, g.fn, p));
                }
                CK(cudaMemcpyAsync(hs.data(), st, hs.size() * 8, cudaMemcpyDeviceToHost, g_st));
                CK(cudaStreamSynchronize(g_st));
                if (rep < 2) continue;
                printf("\n%s, spin 4 us (us after the previous launch's last end: first / median / last block; "
                       "SMs shared with the previous launch)\n| launch | entry | wait returned | data landed | end | shared SMs |\n"
                       "|---|---|---|---|---|---|\n", g.name);
                for (int i = 8; i < 14; i++) {
                    std::vector<bool> prev_sm(1024, false);
                    for (int b = 0; b < g.grid; b++) prev_sm[hs[((size_t)(i - 1) * g_nsm + b) * 5 + 4] & 1023] = true;
                    printf("| %d |", i);
                    print_stamps(hs, i, g.grid, g_nsm);
                    int shared = 0;
                    for (int b = 0; b < g.grid; b++) shared += prev_sm[hs[((size_t)i * g_nsm + b) * 5 + 4] & 1023];
                    printf(" %d |\n", shared);
                }
            }
        }
        cudaFree(st);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    if (only_is) { /* how much can an SM have in flight before its load instructions stall? */
        unsigned long long *out;
        CK(cudaMalloc(&out, (size_t)g_nsm * 2 * 8));
        std::vector<unsigned long long> h((size_t)g_nsm * 2);
        printf("\n| loads per thread (16 B) | KB per SM | registers: issue end us | landed us | cp.async: issue end us | "
               "landed us |\n|---|---|---|---|---|---|\n");
#define IS_ROW(L)                                                                                               \
    {                                                                                                           \
        void (*fn[2])(const uint4 *, unsigned long long *, unsigned *) = {issue<L, false>, issue<L, true>};     \
        double med[2][2];                                                                                       \
        for (int c = 0; c < 2; c++) {                                                                           \
            const int smem = c ? 512 * L * 16 : 0;                                                              \
            CK(cudaFuncSetAttribute(fn[c], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));                 \
            std::vector<double> v[2];                                                                           \
            for (int rep = 0; rep < 9; rep++) {                                                                 \
                const size_t bytes = (size_t)g_nsm * 512 * L * 16;                                              \
                if (g_off + bytes > g_arena_bytes) g_off = 0;                                                   \
                fn[c]<<<g_nsm, 512, smem, g_st>>>((const uint4 *)(g_arena + g_off), out, g_sink);               \
                g_off += (bytes + 4095) & ~(size_t)4095;                                                        \
                CK(cudaMemcpyAsync(h.data(), out, h.size() * 8, cudaMemcpyDeviceToHost, g_st));                 \
                CK(cudaStreamSynchronize(g_st));                                                                \
                if (rep < 2) continue;                                                                          \
                for (int k = 0; k < 2; k++) {                                                                   \
                    std::vector<double> b;                                                                      \
                    for (int i = 0; i < g_nsm; i++) b.push_back(h[2 * i + k] / 1e3);                            \
                    std::sort(b.begin(), b.end());                                                              \
                    v[k].push_back(b[b.size() / 2]);                                                            \
                }                                                                                               \
            }                                                                                                   \
            for (int k = 0; k < 2; k++) {                                                                       \
                std::sort(v[k].begin(), v[k].end());                                                            \
                med[c][k] = v[k][v[k].size() / 2];                                                              \
            }                                                                                                   \
        }                                                                                                       \
        printf("| %d | %d | %.2f | %.2f | %.2f | %.2f |\n", L, 8 * L, med[0][0], med[0][1], med[1][0], med[1][1]); \
    }
        IS_ROW(2) IS_ROW(4) IS_ROW(8) IS_ROW(12) IS_ROW(16) IS_ROW(20) IS_ROW(24)
#undef IS_ROW
        cudaFree(out);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    if (only_il) { /* does the layout of the blocks' ranges change a one-shot's speed? */
        printf("\n| chain of 24 (PDL) | MB each | contiguous us/launch | interleaved us/launch |\n|---|---|---|---|\n");
        const int ks[3][2] = {{K_F4, K_F4I}, {K_F16, K_F16I}, {K_F20, K_F20I}};
        for (int rep = 0; rep < 2; rep++)
            for (const auto &k : ks) {
                float t[2];
                for (int j = 0; j < 2; j++)
                    t[j] = time_graph([&] {
                        for (int i = 0; i < 24; i++) rd(k[j], 1, 1);
                    });
                printf("| %s | %.2f | %.2f | %.2f |\n", KINDS[k[0]].name, kind_bytes(k[0], 1) / 1e6, t[0] * 1e3 / 24,
                       t[1] * 1e3 / 24);
            }
        printf("\n| 18 layers (in F16, mixer 3 us, out F4, mlp F20) | us per layer |\n|---|---|\n");
        for (int rep = 0; rep < 2; rep++)
            for (int il = 0; il < 2; il++) {
                float t = time_graph([&] {
                    for (int i = 0; i < 18; i++) {
                        rd(il ? K_F16I : K_F16, 1, 1);
                        mix(3000, 1);
                        rd(il ? K_F4I : K_F4, 1, 1);
                        rd(il ? K_F20I : K_F20, 1, 1);
                    }
                });
                printf("| %s | %.2f |\n", il ? "interleaved" : "contiguous", t * 1e3 / 18);
            }
        return 0;
    }
    /* ceiling: one kernel, many rounds (~1.1 GB) */
    if (!only_x) {
        const int rounds = 64;
        float ms = time_graph([&] { rd(K_F16, rounds, 0); });
        printf("\nceiling: full L16 x %d rounds, %.1f MB: %.1f us, %.2f TB/s\n", rounds, kind_bytes(K_F16, rounds) / 1e6,
               ms * 1e3, kind_bytes(K_F16, rounds) / (ms * 1e-3) / 1e12);
    }

    /* chains of 24 launches of one kind */
    if (!only_x) {
        struct C {
            int k, rounds;
        } cs[] = {{K_F4, 1}, {K_H8, 1}, {K_Q16, 1}, {K_F8, 1}, {K_H16, 1}, {K_F16, 1}, {K_H16, 2}, {K_Q16, 4},
                  {K_H24, 1}, {K_F20, 1}, {K_H20, 2}, {K_Q8, 5}};
        printf("\n| chain of 24 | MB each | PDL us/launch | TB/s | no-PDL us/launch | TB/s |\n|---|---|---|---|---|---|\n");
        for (const C &c : cs) {
            const double mb = kind_bytes(c.k, c.rounds) / 1e6;
            float t1 = time_graph([&] {
                for (int i = 0; i < 24; i++) rd(c.k, c.rounds, 1);
            });
            float t0 = time_graph([&] {
                for (int i = 0; i < 24; i++) rd(c.k, c.rounds, 0);
            });
            printf("| %s x%d rounds | %.2f | %.2f | %.2f | %.2f | %.2f |\n", KINDS[c.k].name, c.rounds, mb, t1 * 1e3 / 24,
                   mb * 24 / (t1 * 1e3), t0 * 1e3 / 24, mb * 24 / (t0 * 1e3));
        }

        /* 18 layers: in, mixer (3 us), out, mlp */
        struct Lm {
            const char *name;
            int in_k, in_r, out_k, out_r, mlp_k, mlp_r;
            long long spin;
        } ls[] = {
            {"full (in F16, out F4, mlp F20)", K_F16, 1, K_F4, 1, K_F20, 1, 3000},
            {"half (in H16x2, out H8, mlp H20x2)", K_H16, 2, K_H8, 1, K_H20, 2, 3000},
            {"quarter (in Q16x4, out Q16, mlp Q8x5...)", K_Q16, 4, K_Q16, 1, K_Q8, 10, 3000},
            {"half, in H24 + H8, mlp H20x2", K_H24, 1, K_H8, 1, K_H20, 2, 3000},
            {"full, no mixer", K_F16, 1, K_F4, 1, K_F20, 1, -1},
            {"half, no mixer", K_H16, 2, K_H8, 1, K_H20, 2, -1},
            {"full, mixer 0 us", K_F16, 1, K_F4, 1, K_F20, 1, 0},
            {"half, mixer 0 us", K_H16, 2, K_H8, 1, K_H20, 2, 0},
        };
        printf("\n| 18 layers | MB per layer | us per layer | bytes at the ceiling | TB/s |\n|---|---|---|---|---|\n");
        for (const Lm &l : ls) {
            const double mb = (kind_bytes(l.in_k, l.in_r) + kind_bytes(l.out_k, l.out_r) + kind_bytes(l.mlp_k, l.mlp_r)) / 1e6;
            float t = time_graph([&] {
                for (int i = 0; i < 18; i++) {
                    rd(l.in_k, l.in_r, 1);
                    if (l.spin >= 0) mix(l.spin, 1);
                    rd(l.out_k, l.out_r, 1);
                    rd(l.mlp_k, l.mlp_r, 1);
                }
            });
            printf("| %s | %.1f | %.2f | %.2f us at 4.3 TB/s | %.2f |\n", l.name, mb, t * 1e3 / 18, mb / 4.3, mb * 18 / (t * 1e3));
        }
    } /* !only_x */
    /* the exchange alone */
    {
        float *xbuf;
        unsigned *cnt;
        CK(cudaMalloc(&xbuf, 16 * 2 * 256 * 4));
        CK(cudaMalloc(&cnt, 16 * 4));
        CK(cudaMemset(cnt, 0, 16 * 4));
        printf("\n| exchange of the fused DeltaNet mixer | heads | us per exchange |\n|---|---|---|\n");
        const char *names[3] = {"L2: fence + atomicAdd, spin", "L2: atom.add.release, spin", "cluster DSMEM push + barrier"};
        for (int mode = 0; mode < 3; mode++) {
            const int H = mode == 2 ? 15 : 16; /* 15 clusters of 8 fit at 1 block per SM */
            void (*fn)(float *, unsigned *, int, unsigned *) = mode == 0 ? xchg<0> : mode == 1 ? xchg<1> : xchg<2>;
            CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 120 << 10));
            float t[2];
            for (int k = 0; k < 2; k++) {
                const int rounds = k ? 65 : 1;
                t[k] = time_graph([&] {
                    cudaLaunchConfig_t c = {};
                    cudaLaunchAttribute at[1];
                    c.gridDim = dim3(8, H), c.blockDim = dim3(512), c.stream = g_st;
                    c.dynamicSmemBytes = 120 << 10; /* 1 block per SM, as dn_layer */
                    at[0].id = cudaLaunchAttributeClusterDimension;
                    at[0].val.clusterDim.x = 8, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
                    c.attrs = at, c.numAttrs = mode == 2 ? 1 : 0;
                    CK(cudaLaunchKernelEx(&c, fn, xbuf, cnt, rounds, g_sink));
                });
            }
            printf("| %s | %d | %.3f |\n", names[mode], H, (t[1] - t[0]) * 1e3 / 64);
        }
        cudaFree(xbuf);
        cudaFree(cnt);
    }
    /* head-of-line */
    {
        float *xbuf;
        unsigned *cnt;
        unsigned long long *out;
        const unsigned bulk = 172 << 10; /* the MLP tail's bytes per SM */
        CK(cudaMalloc(&xbuf, 8 * 2 * 256 * 4));
        CK(cudaMalloc(&cnt, 8 * 32 * 4));
        CK(cudaMemset(cnt, 0, 8 * 32 * 4));
        CK(cudaMalloc(&out, 128 * (HOL_NX + 1) * 8));
        printf("\n| bulk reads in flight (%u KiB per loading SM) | exchange rounds 1..%d end, us (median block) | bulk done us |\n"
               "|---|---|---|\n", bulk >> 10, HOL_NX);
        const char *names[4] = {"none", "on the exchanging SMs", "on 64 other SMs only", "on all 128 SMs"};
        for (int mode = 0; mode < 4; mode++) {
            void (*fn)(const unsigned char *, unsigned, float *, unsigned *, unsigned long long *, unsigned *) =
                mode == 0 ? hol<0> : mode == 1 ? hol<1> : mode == 2 ? hol<2> : hol<3>;
            CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, HOL_SMEM));
            std::vector<double> rt[HOL_NX + 1];
            for (int rep = 0; rep < 7; rep++) {
                if (g_off + (size_t)128 * bulk > g_arena_bytes) g_off = 0;
                const unsigned char *src = (const unsigned char *)g_arena + g_off;
                g_off += (size_t)128 * bulk;
                CK(cudaMemset(out, 0, 128 * (HOL_NX + 1) * 8));
                fn<<<128, 512, HOL_SMEM, g_st>>>(src, bulk, xbuf, cnt, out, g_sink);
                CK(cudaStreamSynchronize(g_st));
                unsigned long long h[128 * (HOL_NX + 1)];
                CK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
                if (rep < 2) continue; /* warm-up */
                for (int r = 0; r <= HOL_NX; r++) {
                    std::vector<double> v;
                    for (int bl = 0; bl < 128; bl++)
                        if (h[bl * (HOL_NX + 1) + r]) v.push_back(h[bl * (HOL_NX + 1) + r] / 1e3);
                    if (!v.empty()) {
                        std::sort(v.begin(), v.end());
                        rt[r].push_back(v[v.size() / 2]);
                    }
                }
            }
            printf("| %s |", names[mode]);
            for (int r = 0; r < HOL_NX; r++) {
                std::sort(rt[r].begin(), rt[r].end());
                printf(" %.2f", rt[r].empty() ? 0.0 : rt[r][rt[r].size() / 2]);
            }
            std::sort(rt[HOL_NX].begin(), rt[HOL_NX].end());
            printf(" | %.2f |\n", rt[HOL_NX].empty() ? 0.0 : rt[HOL_NX][rt[HOL_NX].size() / 2]);
        }
        cudaFree(xbuf);
        cudaFree(cnt);
        cudaFree(out);
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
