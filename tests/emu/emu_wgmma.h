/* emu_wgmma.h — host emulation of the Hopper warpgroup pieces on top of emu.h (include emu.h first):
 *   wgmma.mma_async m64nNk16 f32 (+)= bf16 x bf16, A and B in shared memory through 64-bit matrix
 *     descriptors (start address, leading / stride byte offsets, swizzle none / 32 / 64 / 128 B,
 *     K-major or MN-major) or A in registers; the warpgroup's fragment layouts (warp w of the group
 *     owns rows 16 w .. 16 w + 15: the accumulators as the mma.m16n8k16 C layout per n8 block, a
 *     register A as the mma.m16n8k16 A layout). Checked against hardware: K-major 128 B swizzle with
 *     A and B in shared memory (what gemm_tma.cu uses); the rest is the PTX ISA's tables;
 *   wgmma.fence / commit_group / wait_group N, setmaxnreg (a warpgroup-wide convergence check),
 *   mbarrier.arrive, bar.arrive, fence.proxy.async, prefetch.tensormap and the tensormap fence
 *   (no-ops), __syncwarp.
 * Semantics: a wgmma is collective over the 128 threads of its warpgroup (all must reach it, with the
 * same descriptors); it is queued, not executed. commit_group closes the open group and wait_group N
 * executes the oldest committed groups until N remain, reading shared memory and the accumulators
 * then and writing the accumulators back. So every wgmma runs at the latest moment the PTX memory
 * model allows: a kernel that refills a shared-memory slot before the wait_group retiring its reader,
 * or touches the accumulators between issue and wait, computes wrong numbers here. Checked and
 * reported (exit 2): a wgmma without a wgmma.fence since the thread's last wait_group (or the start),
 * descriptors that differ between the threads of a warpgroup, threads of one warpgroup at different
 * collective operations, operand addresses outside shared memory, wgmmas still queued when the
 * cluster ends, descriptor features not emulated (base offset != 0).
 * Not emulated: timing and overlap (the TMA lands at once, a wgmma takes no time; fibers run one
 * at a time, so a race shows only if this schedule happens to expose it), register budgets (setmaxnreg
 * only checks that the warpgroup is converged), the descriptor base offset, the summation order inside
 * a k16 step (fp32 sums in k order here: compare with a tolerance), tf32, u8 and the integer forms other than
 * s8 x s8, the memory-proxy rules (fence.proxy.async is a no-op: a missing one goes unnoticed).
 * e4m3 (emu_wgmma with e4m3 set, the m64nNk32 .e4m3.e4m3 form): A and B K-major in shared memory, one byte an
 * element, every e4m3 code its exact value (NaN codes as NaN); the products summed in fp32 in k order, where the
 * tensor core keeps fewer bits (compare with a tolerance).
 * s8 (emu_wgmma with int accumulators di, the m64nNk32 .s32.s8.s8 form): A and B K-major in shared memory, one signed
 * byte an element, read with the e4m3 form's addressing; the sums exact, accumulated into the int32 accumulators
 * (the float forms' fragment layout) modulo 2^32, as the instruction without .satfinite does.
 * Using it for a new wgmma kernel (run_gemm.sh / gemm_emu.cpp are the worked example):
 *   1. extract the kernel with sed as run_gemm.sh does: drop the "cuda/" includes and <cuda.h>,
 *      turn `extern __shared__ ... smem[]` into `uint8_t *smem = emu_smem();`, replace inline asm
 *      that is not behind a helper by an emu_* call (regs_dec / regs_inc are defined here), cut
 *      the host code that calls the driver; define __CUDA_ARCH_FEAT_SM90_ALL; take the device
 *      helpers you want tested (wgmma_desc, swz...) from mma.cuh by sed rather than re-writing them;
 *   2. include emu.h, emu_wgmma.h, then the extracted code; call emu_wg_install() once in main;
 *   3. wrappers mma.cuh does not have yet (other N, A in registers, transposed B): add one line each
 *      at the end of this file with the wrapper's name, calling emu_wgmma();
 *   4. launch with emu_launch(grid, threads, smem bytes, cluster, lambda), tensor maps through emu.h's
 *      cuda_tma_map_bf16 / _3d (bf16, 64-column boxes, 128 B swizzle only), compare with a double reference;
 *   5. prove the test can fail: break the kernel in a scratch copy (GEMM_EMU_SRC of run_gemm.sh).
 * Second example: run_attn.sh / attn_emu.cpp (3-D TMA, A from registers, B MN-major, the launcher kept). */
#pragma once
#include <algorithm>
#include <vector>
using std::max;
using std::min;

static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_bar(); }
static inline void mbar_arrive(uint32_t bar) {
    EmuBar *b = emu_bar(me().cta, bar);
    if (b->pend == 0) {
        fprintf(stderr, "emu: mbarrier at %u: more arrivals than its count\n", bar);
        exit(2);
    }
    b->pend--;
    emu_bar_check(b);
}
/* bar.arrive: counts toward the barrier's n without waiting */
static inline void bar_arrive(int id, int n) {
    const int b = me().cta * 16 + id;
    if (++E.nb_cnt[b] == n) E.nb_cnt[b] = 0, E.nb_gen[b]++;
}
static inline void fence_proxy_async(void) {}
static inline void tma_prefetch_map(const CUtensorMap *) {}
static inline void tma_map_acquire(const CUtensorMap *) {}
template <int M, int N>
static inline void reg_fence_acc(float (&)[M][N][4]) {}
static inline void reg_fence(float &) {}
static inline void reg_fence(int &) {}

/* ---- warpgroup state ---- */
struct EmuWgOp {
    int n; /* N of m64nNk16 */
    uint64_t da, db;
    int scale_d;        /* 0: d = A B, 1: d += A B */
    int tnsp_a, tnsp_b; /* 1: the operand is MN-major */
    bool e4m3;          /* k32 of e4m3 bytes (A and B K-major) instead of k16 of bf16 */
    bool s8;            /* k32 of int8 bytes (A and B K-major) into the int accumulators di */
    bool a_regs;        /* A from registers (a[]) instead of shared memory (da) */
    float (*d[128])[4]; /* each thread's accumulator fragments d[N/8][4] */
    int (*di[128])[4];  /* the same, int32 (s8) */
    uint32_t a[128][4]; /* A fragments as issued: warp w rows 16 w.., the mma.m16n8k16 A layout */
};
struct EmuWg {
    int cnt, gen, kind;            /* collective in progress: arrivals, generation, operation */
    std::vector<EmuWgOp> ops;      /* queued, oldest first */
    std::vector<size_t> group_end; /* committed groups: ops[0 .. group_end[0]) is the oldest */
    EmuWgOp cur;                   /* being collected */
    int arg;                       /* wait_group N / setmaxnreg count of the collective */
};
static std::vector<EmuWg> emu_wg;       /* [cta * 8 + warpgroup] */
static std::vector<char> emu_wg_fenced; /* per thread of the cluster: wgmma.fence since the last wait_group */
static long emu_wgmma_count;            /* wgmmas executed (all launches) */
static void emu_wg_begin(int ncta) {
    emu_wg.assign((size_t)ncta * 8, EmuWg());
    emu_wg_fenced.assign((size_t)ncta * E.nthreads, 0);
}
static void emu_wg_end(void) {
    for (size_t i = 0; i < emu_wg.size(); i++)
        if (!emu_wg[i].ops.empty()) {
            fprintf(stderr, "emu: warpgroup %zu of CTA %zu ended with %zu wgmmas not retired by wait_group\n", i % 8,
                    i / 8, emu_wg[i].ops.size());
            exit(2);
        }
}
static inline void emu_wg_install(void) { emu_hook_begin = emu_wg_begin, emu_hook_end = emu_wg_end; }

enum { EMU_WG_MMA = 1, EMU_WG_COMMIT, EMU_WG_WAIT, EMU_WG_SETMAXNREG };
static const char *emu_wg_kind_name(int k) {
    return k == EMU_WG_MMA      ? "wgmma.mma_async"
           : k == EMU_WG_COMMIT ? "wgmma.commit_group"
           : k == EMU_WG_WAIT   ? "wgmma.wait_group"
                                : "setmaxnreg";
}
/* The 128 threads of this thread's warpgroup meet; `arrive` runs in each thread on arrival, `last` in
 * the last one to arrive (before anyone leaves). */
template <class A, class L>
static inline void emu_wg_collective(int kind, A arrive, L last) {
    EmuWg &w = emu_wg[me().cta * 8 + me().tid / 128];
    if (w.cnt == 0)
        w.kind = kind;
    else if (w.kind != kind) {
        fprintf(stderr, "emu: warpgroup %d of CTA %d diverged: thread %d at %s while others are at %s\n",
                me().tid / 128, me().cta, me().tid, emu_wg_kind_name(kind), emu_wg_kind_name(w.kind));
        exit(2);
    }
    arrive(w, me().tid & 127);
    const int g = w.gen;
    if (++w.cnt == 128) {
        w.cnt = 0;
        last(w);
        w.gen++;
    }
    EMU_WAIT(w.gen == g);
}

/* ---- shared-memory matrix descriptors ---- */
struct EmuDesc {
    uint32_t start, lbo, sbo, base_off, swz; /* bytes; swz: 0 none, 1 128 B, 2 64 B, 3 32 B */
};
static inline EmuDesc emu_desc(uint64_t d) {
    EmuDesc r;
    r.start = (uint32_t)(d & 0x3fff) << 4;
    r.lbo = (uint32_t)((d >> 16) & 0x3fff) << 4;
    r.sbo = (uint32_t)((d >> 32) & 0x3fff) << 4;
    r.base_off = (uint32_t)((d >> 49) & 7);
    r.swz = (uint32_t)(d >> 62);
    if (r.base_off != 0) {
        fprintf(stderr, "emu: wgmma descriptor %#llx: base offset %u not emulated\n", (unsigned long long)d,
                r.base_off);
        exit(2);
    }
    return r;
}
/* Byte address of element (mn, k) (mn: M or N index, k: 0..15) of a bf16 operand, following the
 * canonical layouts of the PTX ISA ("Shared memory matrix layout"), with T = 8 bf16 (16 bytes) and W
 * the swizzle width (32, 64 or 128 bytes):
 *   K-major,  no swizzle: ((8,m),(T,2k)):((1T,SBO),(1,LBO))  core matrix 8 rows x 16 B, rows 16 B
 *             apart, 8-row groups SBO apart, the two k8 halves LBO apart;
 *   K-major,  swizzled:   ((8,m),(T,2k)):((W/16 T,SBO),(1,T)) rows W bytes apart, k contiguous along
 *             the row (k16 = 32 B fits every width, LBO unused), 8-row groups SBO apart;
 *   MN-major, no swizzle: ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) 8 mn contiguous, k rows 16 B apart,
 *             8-mn groups SBO apart, k8 groups LBO apart;
 *   MN-major, swizzled:   ((T,W/16,m),(8,k)):((1,T,LBO),(W/16 T,SBO)) W/2 mn contiguous in a W-byte
 *             k row, k rows W bytes apart, k8 groups SBO apart, W/2-mn blocks LBO apart.
 * Swizzled modes then XOR the 16-byte chunk bits [4, 4 + log2(W/16)) of the address with the bits
 * from 7 up (Swizzle<1|2|3, 4, 3>); absolute address bits, so a tile sits at a W*8-aligned base (the
 * descriptor's base offset, for other bases, is not emulated). esz: bytes an element (2, or 1 for e4m3 and s8,
 * whose k32 slice is 32 bytes as bf16's k16 is; K-major only). Only the K-major 128 B form is checked
 * against hardware (gemm_tma.cu passes on the H200); the others follow the table alone. */
static inline uint32_t emu_desc_addr(const EmuDesc &d, int mn, int k, bool mn_major, uint32_t esz = 2) {
    uint32_t a;
    const uint32_t W = d.swz == 1 ? 128 : d.swz == 2 ? 64 : 32;
    if (!mn_major) {
        if (d.swz == 0)
            return d.start + (uint32_t)(mn >> 3) * d.sbo + (uint32_t)(mn & 7) * 16 + (uint32_t)k * esz / 16 * d.lbo +
                   (uint32_t)k * esz % 16;
        a = d.start + (uint32_t)(mn >> 3) * d.sbo + (uint32_t)(mn & 7) * W + (uint32_t)k * esz;
    } else {
        if (d.swz == 0)
            return d.start + (uint32_t)(mn >> 3) * d.sbo + (uint32_t)(mn & 7) * 2 + (uint32_t)(k & 7) * 16 +
                   (uint32_t)(k >> 3) * d.lbo;
        const int E = (int)W / 2; /* mn elements per swizzled row */
        a = d.start + (uint32_t)(mn / E) * d.lbo + (uint32_t)(mn % E) * 2 + (uint32_t)(k & 7) * W +
            (uint32_t)(k >> 3) * d.sbo;
    }
    const uint32_t mask = W / 16 - 1; /* chunk bits swizzled: 3 (128 B), 2 (64 B), 1 (32 B) */
    return a ^ (((a >> 7) & mask) << 4);
}
static inline float emu_smem_bf16(int cta, uint32_t addr) {
    if (addr + 2 > E.smem[cta].size() - 16) {
        fprintf(stderr, "emu: wgmma operand address %u outside shared memory (%zu bytes)\n", addr,
                E.smem[cta].size() - 16);
        exit(2);
    }
    uint16_t h;
    memcpy(&h, E.smem[cta].data() + addr, 2);
    return __uint_as_float((uint32_t)h << 16);
}
/* e4m3 code -> its exact value (bias 7, subnormals below 2^-6, 0x7f / 0xff NaN) */
static inline float emu_e4m3(uint8_t v) {
    const int e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return NAN;
    const float x = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return v & 0x80 ? -x : x;
}
static inline float emu_smem_e4m3(int cta, uint32_t addr) {
    if (addr + 1 > E.smem[cta].size() - 16) {
        fprintf(stderr, "emu: wgmma operand address %u outside shared memory (%zu bytes)\n", addr,
                E.smem[cta].size() - 16);
        exit(2);
    }
    return emu_e4m3(E.smem[cta][addr]);
}
/* d (+)= A B^T of a queued wgmma into the threads' accumulator fragments: A [64][KK], B [op.n][KK] (KK = 16 bf16 or 32
 * e4m3 values; their products are exact in fp32, summed in k order). The owner of (m, n): warp m/16, lane 4 g + t with
 * g = m % 8, t = (n % 8) / 2; element 2 ((m % 16) / 8) + n % 2. */
template <int KK>
static void emu_wgmma_acc(const EmuWgOp &op, const float (*A)[KK], const float (*B)[KK]) {
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < op.n; n++) {
            float s = 0.0f;
            for (int k = 0; k < KK; k++) s += A[m][k] * B[n][k];
            const int th = (m >> 4) * 32 + (m & 7) * 4 + ((n & 7) >> 1), e = 2 * ((m >> 3) & 1) + (n & 1);
            float *dst = &op.d[th][n >> 3][e];
            *dst = op.scale_d ? *dst + s : s;
        }
    emu_wgmma_count++;
}
static inline int emu_smem_s8(int cta, uint32_t addr) {
    if (addr + 1 > E.smem[cta].size() - 16) {
        fprintf(stderr, "emu: wgmma operand address %u outside shared memory (%zu bytes)\n", addr,
                E.smem[cta].size() - 16);
        exit(2);
    }
    return (int8_t)E.smem[cta][addr];
}
/* d (+)= A B^T of a queued s8 wgmma: A [64][32], B [op.n][32] bytes, every sum exact (|sum| <= 32 128^2), added to the
 * int32 accumulator modulo 2^32 (the owners as in emu_wgmma_acc). */
static void emu_wgmma_acc_s8(const EmuWgOp &op, const int (*A)[32], const int (*B)[32]) {
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < op.n; n++) {
            int s = 0;
            for (int k = 0; k < 32; k++) s += A[m][k] * B[n][k];
            const int th = (m >> 4) * 32 + (m & 7) * 4 + ((n & 7) >> 1), e = 2 * ((m >> 3) & 1) + (n & 1);
            int *dst = &op.di[th][n >> 3][e];
            *dst = op.scale_d ? (int)((uint32_t)*dst + (uint32_t)s) : s;
        }
    emu_wgmma_count++;
}
/* Executes one queued wgmma of the warpgroup of CTA cta: m64nNk16 bf16, or m64nNk32 e4m3 or s8 (both operands K-major
 * in shared memory). */
static void emu_wgmma_exec(int cta, const EmuWgOp &op) {
    const EmuDesc b = emu_desc(op.db);
    if (op.s8) {
        static int A8[64][32], B8[256][32];
        const EmuDesc a = emu_desc(op.da);
        for (int r = 0; r < 64; r++)
            for (int k = 0; k < 32; k++) A8[r][k] = emu_smem_s8(cta, emu_desc_addr(a, r, k, false, 1));
        for (int r = 0; r < op.n; r++)
            for (int k = 0; k < 32; k++) B8[r][k] = emu_smem_s8(cta, emu_desc_addr(b, r, k, false, 1));
        return emu_wgmma_acc_s8(op, A8, B8);
    }
    if (op.e4m3) {
        static float A8[64][32], B8[256][32];
        const EmuDesc a = emu_desc(op.da);
        for (int r = 0; r < 64; r++)
            for (int k = 0; k < 32; k++) A8[r][k] = emu_smem_e4m3(cta, emu_desc_addr(a, r, k, false, 1));
        for (int r = 0; r < op.n; r++)
            for (int k = 0; k < 32; k++) B8[r][k] = emu_smem_e4m3(cta, emu_desc_addr(b, r, k, false, 1));
        return emu_wgmma_acc<32>(op, A8, B8);
    }
    float A[64][16], B[256][16];
    if (op.a_regs) {
        for (int th = 0; th < 128; th++) {
            const int r = (th >> 5) * 16 + ((th & 31) >> 2), c = 2 * (th & 3);
            const uint32_t *q = op.a[th];
            A[r][c] = emu_lo(q[0]), A[r][c + 1] = emu_hi(q[0]);
            A[r + 8][c] = emu_lo(q[1]), A[r + 8][c + 1] = emu_hi(q[1]);
            A[r][c + 8] = emu_lo(q[2]), A[r][c + 9] = emu_hi(q[2]);
            A[r + 8][c + 8] = emu_lo(q[3]), A[r + 8][c + 9] = emu_hi(q[3]);
        }
    } else {
        const EmuDesc a = emu_desc(op.da);
        for (int r = 0; r < 64; r++)
            for (int k = 0; k < 16; k++) A[r][k] = emu_smem_bf16(cta, emu_desc_addr(a, r, k, op.tnsp_a));
    }
    for (int r = 0; r < op.n; r++)
        for (int k = 0; k < 16; k++) B[r][k] = emu_smem_bf16(cta, emu_desc_addr(b, r, k, op.tnsp_b));
    emu_wgmma_acc<16>(op, A, B);
}

/* ---- the instructions ---- */
static inline void wgmma_fence(void) { emu_wg_fenced[(size_t)me().cta * E.nthreads + me().tid] = 1; }
/* One wgmma.mma_async m64nNk16 (N a multiple of 8 up to 256): A from shared memory (da) or, when a is
 * not null, from the thread's 4 registers a[] (the mma.m16n8k16 A layout, rows 16 (warp % 4) + ..;
 * their values are taken at issue); B from shared memory (db). tnsp_a / tnsp_b: MN-major operands.
 * di not null: the s8 form into the int accumulators di (d unused). */
static inline void emu_wgmma(int n, float (*d)[4], uint64_t da, const uint32_t *a, uint64_t db, int scale_d, int tnsp_a,
                             int tnsp_b, bool e4m3 = false, int (*di)[4] = nullptr) {
    const bool s8 = di != nullptr;
    if (n < 8 || n > 256 || n % 8) {
        fprintf(stderr, "emu: wgmma N = %d\n", n);
        exit(2);
    }
    if ((e4m3 || s8) && (a || tnsp_a || tnsp_b || (e4m3 && s8))) {
        fprintf(stderr, "emu: an e4m3 or s8 wgmma takes A and B K-major from shared memory only\n");
        exit(2);
    }
    if (!emu_wg_fenced[(size_t)me().cta * E.nthreads + me().tid]) {
        fprintf(stderr, "emu: thread %d of CTA %d issues a wgmma with no wgmma.fence since its last wait_group\n",
                me().tid, me().cta);
        exit(2);
    }
    emu_wg_collective(
        EMU_WG_MMA,
        [&](EmuWg &w, int t) {
            EmuWgOp &c = w.cur;
            if (w.cnt == 0)
                c.n = n, c.da = a ? 0 : da, c.db = db, c.scale_d = scale_d, c.tnsp_a = tnsp_a, c.tnsp_b = tnsp_b,
                c.a_regs = a != nullptr, c.e4m3 = e4m3, c.s8 = s8;
            else if (c.n != n || c.da != (a ? 0 : da) || c.db != db || c.scale_d != scale_d || c.tnsp_a != tnsp_a ||
                     c.tnsp_b != tnsp_b || c.a_regs != (a != nullptr) || c.e4m3 != e4m3 || c.s8 != s8) {
                fprintf(stderr,
                        "emu: wgmma operands differ within warpgroup (thread %d: desc %#llx %#llx vs %#llx %#llx)\n",
                        me().tid, (unsigned long long)da, (unsigned long long)db, (unsigned long long)c.da,
                        (unsigned long long)c.db);
                exit(2);
            }
            c.d[t] = d, c.di[t] = di;
            if (a) memcpy(c.a[t], a, 16);
        },
        [&](EmuWg &w) { w.ops.push_back(w.cur); });
}
static inline void wgmma_commit(void) {
    emu_wg_collective(
        EMU_WG_COMMIT, [](EmuWg &, int) {},
        [](EmuWg &w) {
            const size_t prev = w.group_end.empty() ? 0 : w.group_end.back();
            if (w.ops.size() > prev) w.group_end.push_back(w.ops.size()); /* an empty group retires at once */
        });
}
template <int N>
static inline void wgmma_wait(void) {
    emu_wg_fenced[(size_t)me().cta * E.nthreads + me().tid] = 0;
    const int cta = me().cta;
    emu_wg_collective(
        EMU_WG_WAIT, [](EmuWg &, int) {},
        [cta](EmuWg &w) {
            while (w.group_end.size() > (size_t)N) {
                const size_t e = w.group_end.front();
                for (size_t i = 0; i < e; i++) emu_wgmma_exec(cta, w.ops[i]);
                w.ops.erase(w.ops.begin(), w.ops.begin() + (long)e);
                w.group_end.erase(w.group_end.begin());
                for (size_t &g : w.group_end) g -= e;
            }
        });
}
static inline void emu_setmaxnreg(int r) {
    if (r < 24 || r > 256 || r % 8) {
        fprintf(stderr, "emu: setmaxnreg %d outside 24..256 in steps of 8\n", r);
        exit(2);
    }
    emu_wg_collective(
        EMU_WG_SETMAXNREG, [](EmuWg &, int) {}, [](EmuWg &) {});
}
/* the register-budget helpers of src/cuda/async.cuh */
template <int R>
static inline void regs_dec(void) {
    emu_setmaxnreg(R);
}
template <int R>
static inline void regs_inc(void) {
    emu_setmaxnreg(R);
}
/* the wgmma wrappers of src/cuda/mma.cuh (scale-d 1, no transposes) */
static inline void wgmma_m64n256k16(float (*d)[4], uint64_t da, uint64_t db) {
    emu_wgmma(256, d, da, nullptr, db, 1, 0, 0);
}
static inline void wgmma_m64n128k16(float (*d)[4], uint64_t da, uint64_t db) {
    emu_wgmma(128, d, da, nullptr, db, 1, 0, 0);
}
/* For a new kernel: give its wgmma wrappers (other N, scale-d 0, A in registers, transposes) the
 * same names here, each one call of emu_wgmma, e.g. an RS form with B MN-major:
 *   void wgmma_m64n64k16_rs_t(float (*d)[4], const uint32_t a[4], uint64_t db) { emu_wgmma(64, d, 0, a, db, 1, 0, 1); } */
/* attention_prefill_wg.cu: S = Q K^T (both K-major in shared memory), O += P V (P from registers, V MN-major) */
static inline void wgmma_m64n64k16(float (*d)[4], uint64_t da, uint64_t db) {
    emu_wgmma(64, d, da, nullptr, db, 1, 0, 0);
}
static inline void wgmma_m64n256k16_rt(float (*d)[4], const uint32_t a[4], uint64_t db) {
    emu_wgmma(256, d, 0, a, db, 1, 0, 1);
}
/* bench/kernels/gemm_fp8_lab.cu: m64n128k32 / m64n256k32 e4m3, A and B K-major in shared memory; acc = 0: d = A B */
static inline void wgmma_m64n128k32_e4m3(float (*d)[4], uint64_t da, uint64_t db, int acc) {
    emu_wgmma(128, d, da, nullptr, db, acc != 0, 0, 0, true);
}
static inline void wgmma_m64n256k32_e4m3(float (*d)[4], uint64_t da, uint64_t db) {
    emu_wgmma(256, d, da, nullptr, db, 1, 0, 0, true);
}
/* src/cuda/lm_screen_rows.cu: m64nNk32 s8 x s8 -> s32 (N = 32, 64, 128), A and B K-major in shared memory (int
 * accumulators) */
template <int N>
static inline void wgmma_s8(int (*d)[4], uint64_t da, uint64_t db) {
    static_assert(N == 32 || N == 64 || N == 128, "the s8 forms mma.cuh has");
    emu_wgmma(N, nullptr, da, nullptr, db, 1, 0, 0, false, d);
}
