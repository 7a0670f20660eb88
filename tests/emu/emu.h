/* Host emulation of the CUDA features deltanet_prefill.cu uses: CTAs of fibers (ucontext),
 * __syncthreads, warp shuffles, ldmatrix (plain/trans), mma.m16n8k16 bf16, cp.async (immediate),
 * cluster barriers and DSMEM loads, mbarriers with transaction counts, 2-D and 3-D TMA loads with the
 * 128-byte swizzle (immediate, multicast included), int atomics. One cluster of CTAs runs at a time. A scheduler
 * sweep in which no thread gets past a wait is a deadlock: reported, exit 3. Warpgroup pieces (wgmma,
 * setmaxnreg, bar.arrive, mbarrier.arrive): emu_wgmma.h. */
#pragma once
#include <cuda_runtime_api.h>
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) {
    uint3 r;
    r.x = x, r.y = y, r.z = z;
    return r;
}
static inline uint2 make_uint2(unsigned x, unsigned y) {
    uint2 v;
    v.x = x, v.y = y;
    return v;
}
static inline int2 make_int2(int x, int y) {
    int2 v;
    v.x = x, v.y = y;
    return v;
}
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    uint4 r;
    r.x = x, r.y = y, r.z = z, r.w = w;
    return r;
}
static inline float2 make_float2(float x, float y) {
    float2 r;
    r.x = x, r.y = y;
    return r;
}
static inline float4 make_float4(float x, float y, float z, float w) {
    float4 r;
    r.x = x, r.y = y, r.z = z, r.w = w;
    return r;
}
#include <functional>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <vector>

#define Q35_CUDA_COMMON_CUH
#define Q35_CUDA_MMA_CUH
#define Q35_CUDA_CLUSTER_CUH
#define Q35_CUDA_TMA_CUH
#undef __global__
#undef __device__
#undef __forceinline__
#undef __grid_constant__
#undef __launch_bounds__
#undef __align__
#define __global__
#define __device__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n)

struct EmuThread {
    ucontext_t ctx;
    int tid, cta; /* cta index within the running cluster */
    bool done;
};
struct EmuState {
    std::vector<EmuThread> th;
    std::vector<std::vector<uint8_t>> smem; /* per CTA of the cluster */
    std::vector<uint3> bidx;
    int nthreads, ncta, cur;
    ucontext_t sched;
    /* barriers */
    std::vector<int> cta_cnt, cta_gen;
    std::vector<int> warp_cnt, warp_gen; /* [cta*32 + warp] */
    int cl_cnt, cl_gen;
    std::vector<int> cl_my;
    std::vector<int> nb_cnt, nb_gen; /* named barriers [cta*16 + id] */
    /* warp exchange slots [cta*8+warp][lane][8 u32] */
    std::vector<uint32_t> slot;
    dim3 grid, block;
};
static EmuState E;
static inline EmuThread &me() { return E.th[E.cur]; }
static inline void emu_yield() { swapcontext(&E.th[E.cur].ctx, &E.sched); }
/* every wait: a scheduler sweep in which no thread gets past one (nor starts or ends) is a deadlock */
static long emu_progress;
#define EMU_WAIT(cond)                                                                                                 \
    do {                                                                                                               \
        while (cond) emu_yield();                                                                                      \
        emu_progress++;                                                                                                \
    } while (0)

struct EmuIdx {
    unsigned int x, y, z;
};
static inline uint3 emu_tidx() { return make_uint3(me().tid, 0, 0); }
#define threadIdx (emu_tidx())
#define blockIdx  (E.bidx[me().cta])
#define gridDim   (E.grid)
#define blockDim  (E.block)

static inline void __syncthreads() {
    const int c = me().cta, g = E.cta_gen[c];
    if (++E.cta_cnt[c] == E.nthreads) E.cta_cnt[c] = 0, E.cta_gen[c]++;
    EMU_WAIT(E.cta_gen[c] == g);
}
static inline void emu_warp_bar() {
    const int w = me().cta * 32 + me().tid / 32, g = E.warp_gen[w];
    if (++E.warp_cnt[w] == 32) E.warp_cnt[w] = 0, E.warp_gen[w]++;
    EMU_WAIT(E.warp_gen[w] == g);
}
static inline uint32_t *emu_slot(int lane) {
    return &E.slot[((size_t)(me().cta * 32 + me().tid / 32) * 32 + lane) * 8];
}

static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define __expf(x)        expf(x)     /* glibc declares an __expf of its own */
#define __fdividef(a, b) ((a) / (b)) /* the fast CUDA forms, exact here (the same to ~2 ulp) */
#ifndef EMU_NO_SILU                  /* mlp_emu.cpp takes silu_f from common.cuh itself */
static inline float silu_f(float x) { return __fdividef(x, 1.0f + __expf(-x)); }
#endif
static inline uint16_t emu_bf(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static inline float rbf(float x) { return __uint_as_float((uint32_t)emu_bf(x) << 16); }
static inline uint32_t pack_bf16(float lo, float hi) { return (uint32_t)emu_bf(lo) | ((uint32_t)emu_bf(hi) << 16); }
/* f16 bits <-> fp32: the value of a code (exact), and fp32 to the nearest f16 (ties to even; subnormals; inf past
 * the range) */
static inline float emu_h2f(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexpf((float)(1024 + m), e - 25) : ldexpf((float)m, -24);
    return h & 0x8000u ? -v : v;
}
static inline uint16_t emu_f16(float x) {
    const uint16_t s = signbit(x) ? 0x8000u : 0u;
    const float a = fabsf(x);
    if (isnan(a)) return 0x7e00u;
    if (a >= 65520.0f) return s | 0x7c00u;
    if (a == 0.0f) return s;
    int e;
    frexpf(a, &e);                             /* a = f 2^e, f in [0.5, 1) */
    const int q = e - 1 < -14 ? -24 : e - 11;  /* the unit in the last place */
    const float n = nearbyintf(ldexpf(a, -q)); /* round to nearest even (the default mode) */
    const uint32_t k = (uint32_t)n;            /* k 2^q */
    if (q == -24) return s | (uint16_t)k;      /* subnormal (k = 1024 is the smallest normal's bits) */
    return k >= 2048 ? s | (uint16_t)((q + 1 + 25) << 10 | 0) : s | (uint16_t)((q + 25) << 10 | (k - 1024));
}
static inline uint32_t pack_f16(float lo, float hi) { return (uint32_t)emu_f16(lo) | ((uint32_t)emu_f16(hi) << 16); }
static inline float f16_lo(uint32_t u) { return emu_h2f((uint16_t)u); }
static inline float f16_hi(uint32_t u) { return emu_h2f((uint16_t)(u >> 16)); }
/* common.cuh's accurate SiLU / sigmoid and bf16 bits (written once there; the seds take other ranges) */
static inline float silu_acc(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid_acc(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline uint16_t bf16_bits(float x) { return emu_bf(x); }

/* Test data for the emulator programs: xorshift64 uniform in [0, 1) (state emu_rs, seeded by each main),
 * Box-Muller normal, and the value of bf16 bits. */
static uint64_t emu_rs = 88172645463325252ull;
static inline double urand() {
    emu_rs ^= emu_rs << 13;
    emu_rs ^= emu_rs >> 7;
    emu_rs ^= emu_rs << 17;
    return (emu_rs >> 11) * (1.0 / 9007199254740992.0);
}
static inline float nrm() {
    double u1 = urand() + 1e-12, u2 = urand();
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}
static inline float bff(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

static inline float emu_shfl(float v, int src) {
    const int lane = me().tid & 31;
    emu_slot(lane)[0] = __float_as_uint(v);
    emu_warp_bar();
    const float r = __uint_as_float(emu_slot(src)[0]);
    emu_warp_bar();
    return r;
}
static inline float __shfl_sync(unsigned, float v, int src) { return emu_shfl(v, src & 31); }
static inline float __shfl_xor_sync(unsigned, float v, int m) { return emu_shfl(v, (me().tid & 31) ^ m); }
#ifndef EMU_OWN_INT_SHFL /* sample_emu.cpp and lm_screen_emu.cpp bring their own */
/* int shuffles move the bits (through float they would lose any int past 2^24, INT_MAX included) */
static inline int __shfl_sync(unsigned, int v, int src) {
    return (int)__float_as_uint(emu_shfl(__uint_as_float((uint32_t)v), src & 31));
}
static inline int __shfl_xor_sync(unsigned, int v, int m) {
    return (int)__float_as_uint(emu_shfl(__uint_as_float((uint32_t)v), (me().tid & 31) ^ m));
}
#endif
static inline float __shfl_up_sync(unsigned, float v, int d) {
    const int lane = me().tid & 31;
    return emu_shfl(v, lane >= d ? lane - d : lane);
}

/* shared memory: addresses are byte offsets into the CTA's buffer */
static inline uint8_t *emu_smem() { return E.smem[me().cta].data(); }
static inline uint32_t smem_addr(const void *p) { return (uint32_t)((const uint8_t *)p - emu_smem()); }
static inline void cp_async16(uint32_t dst, const void *src, bool pred) {
    if (pred)
        memcpy(emu_smem() + dst, src, 16);
    else
        memset(emu_smem() + dst, 0, 16);
}
/* async.cuh's generic-pointer form: global -> shared at once (one fiber runs at a time) */
static inline void cp_async16(void *dst, const void *src) { memcpy(dst, src, 16); }
static inline void cp_async_commit(void) {}
template <int N>
static inline void cp_async_wait(void) {}
/* atomics: one fiber runs at a time, so plain read-modify-writes (shared or global memory alike); any element type */
template <typename T, typename U>
static inline T atomicAdd(T *p, U v) {
    const T old = *p;
    *p = old + (T)v;
    return old;
}
static inline int atomicExch(int *p, int v) {
    const int old = *p;
    *p = v;
    return old;
}
/* the memory-order and integer intrinsics the kernels use; fences are no-ops (one fiber runs at a time) */
static inline void __threadfence(void) {}
/* common.cuh's wait_count_geq: the adders are CTAs of the running cluster */
static inline void wait_count_geq(const int *cnt, int n) { EMU_WAIT(*(volatile const int *)cnt < n); }
template <typename T>
static inline T __ldg(const T *p) {
    return *p;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
/* byte n of the result = byte s[4n + 2 .. 4n] of the 8 bytes {y (bytes 4-7), x (bytes 0-3)} */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xffu) << (8 * n);
    return r;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

static inline void emu_ldsm(uint32_t addr, uint32_t r[4], bool trans, int nmat = 4) {
    const int lane = me().tid & 31;
    emu_slot(lane)[0] = addr;
    emu_warp_bar();
    const uint8_t *s = emu_smem();
    const int g = lane >> 2, t = lane & 3;
    for (int m = 0; m < nmat; m++) {
        uint16_t e[2];
        for (int i = 0; i < 2; i++) {
            if (!trans)
                memcpy(&e[i], s + emu_slot(m * 8 + g)[0] + (2 * t + i) * 2, 2);
            else
                memcpy(&e[i], s + emu_slot(m * 8 + 2 * t + i)[0] + g * 2, 2);
        }
        r[m] = (uint32_t)e[0] | ((uint32_t)e[1] << 16);
    }
    emu_warp_bar();
}
static inline void ldsm_x4(uint32_t addr, uint32_t r[4]) { emu_ldsm(addr, r, false); }
static inline void ldsm_x4_t(uint32_t addr, uint32_t r[4]) { emu_ldsm(addr, r, true); }
static inline void ldsm_x2(uint32_t addr, uint32_t r[2]) {
    uint32_t q[4];
    emu_ldsm(addr, q, false, 2);
    r[0] = q[0], r[1] = q[1];
}
static inline void ldsm_x2_t(uint32_t addr, uint32_t r[2]) {
    uint32_t q[4];
    emu_ldsm(addr, q, true, 2);
    r[0] = q[0], r[1] = q[1];
}

static inline float emu_lo(uint32_t u) { return __uint_as_float(u << 16); }
static inline float emu_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
/* mma.m16n8k16 with fp32 sums over operands of two 16-bit values a word, lo / hi giving the low / high half's
 * value (bf16 or f16) */
static inline void emu_mma16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, float (*lo)(uint32_t),
                             float (*hi)(uint32_t)) {
    const int lane = me().tid & 31;
    uint32_t *sl = emu_slot(lane);
    for (int i = 0; i < 4; i++) sl[i] = a[i];
    sl[4] = b0, sl[5] = b1;
    emu_warp_bar();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const uint32_t *q = emu_slot(l);
        const int g = l >> 2, t = l & 3;
        A[g][2 * t] = lo(q[0]), A[g][2 * t + 1] = hi(q[0]);
        A[g + 8][2 * t] = lo(q[1]), A[g + 8][2 * t + 1] = hi(q[1]);
        A[g][2 * t + 8] = lo(q[2]), A[g][2 * t + 9] = hi(q[2]);
        A[g + 8][2 * t + 8] = lo(q[3]), A[g + 8][2 * t + 9] = hi(q[3]);
        B[2 * t][g] = lo(q[4]), B[2 * t + 1][g] = hi(q[4]);
        B[2 * t + 8][g] = lo(q[5]), B[2 * t + 9][g] = hi(q[5]);
    }
    emu_warp_bar();
    const int g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) {
        const int r = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = c[e];
        for (int k = 0; k < 16; k++) s += A[r][k] * B[k][col];
        c[e] = s;
    }
}
static inline void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    emu_mma16(c, a, b0, b1, emu_lo, emu_hi);
}
static inline void mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    emu_mma16(c, a, b0, b1, f16_lo, f16_hi);
}

/* clusters */
static inline void cluster_arrive_release(void) {
    E.cl_my[E.cur] = E.cl_gen;
    if (++E.cl_cnt == E.nthreads * E.ncta) E.cl_cnt = 0, E.cl_gen++;
}
static inline void cluster_arrive_relaxed(void) { cluster_arrive_release(); }
static inline void cluster_wait(void) { EMU_WAIT(E.cl_gen == E.cl_my[E.cur]); }
static inline float ld_dsmem(const float *local, unsigned rank) {
    const size_t off = (const uint8_t *)local - emu_smem();
    float v;
    memcpy(&v, E.smem[rank].data() + off, 4);
    return v;
}

static inline uint32_t cluster_rank(void) { return (uint32_t)me().cta; }
static inline void pdl_begin(void) {} /* one kernel at a time: the PDL wait and trigger have nothing to do */
static inline void pdl_wait(void) {}
static inline void pdl_trigger(void) {}
/* named barriers (async.cuh): bar_sync(id, n) waits until n threads of the CTA have arrived at id */
static inline void bar_sync(int id, int n) {
    const int b = me().cta * 16 + id, g = E.nb_gen[b];
    if (++E.nb_cnt[b] == n) E.nb_cnt[b] = 0, E.nb_gen[b]++;
    EMU_WAIT(E.nb_gen[b] == g);
}

/* mbarriers (async.cuh): the 8 bytes at the barrier's offset hold the emulated state */
struct EmuBar {
    int32_t tx;                    /* transaction bytes still expected (may go negative) */
    uint8_t pend, cnt, phase, pad; /* arrivals still expected, arrival count, phase parity */
};
static inline EmuBar *emu_bar(int cta, uint32_t bar) { return (EmuBar *)(E.smem[cta].data() + bar); }
static inline void emu_bar_check(EmuBar *b) {
    if (b->pend == 0 && b->tx == 0) b->phase ^= 1, b->pend = b->cnt;
}
static inline void mbar_init(uint32_t bar, uint32_t count) {
    EmuBar *b = emu_bar(me().cta, bar);
    b->tx = 0, b->pend = b->cnt = (uint8_t)count, b->phase = 0;
}
static inline void mbar_init_fence(void) {}
static inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    EmuBar *b = emu_bar(me().cta, bar);
    b->tx += (int32_t)bytes, b->pend--;
    emu_bar_check(b);
}
static inline void mbar_wait(uint32_t bar, uint32_t parity) { EMU_WAIT(emu_bar(me().cta, bar)->phase == parity); }
/* tensor maps (cuda_tma_map_bf16, cuda_tma_map_bf16_3d): a bf16 [n3][rows][cols] tensor, element
 * (c, r, h) at base[h * ld2 + r * ld + c], read in boxes of 64 columns x box_rows rows x 1 (2-D: n3 1) */
struct EmuTensorMap {
    const uint16_t *base;
    int rows, cols, n3, box_rows;
    long long ld, ld2;
    const uint8_t *base8; /* emu_tma_map_u8_sw128: a byte matrix, 128-byte swizzle (base unused) */
};
typedef EmuTensorMap CUtensorMap;
static inline int cuda_tma_map_bf16(CUtensorMap *m, const uint16_t *base, int rows, int cols, int ld, int box_rows) {
    m->base = base, m->rows = rows, m->cols = cols, m->n3 = 1, m->ld = ld, m->ld2 = 0, m->box_rows = box_rows;
    m->base8 = nullptr;
    return 0;
}
/* bench/kernels/gemm_fp8_lab.cu's map_u8 (the lab's host code is not emulated): a byte [rows][ld] matrix in boxes of
 * 128 columns x box_rows rows with the 128-byte swizzle: box row r at dst + 128 r, 16-byte chunk ch at ch ^ (r & 7) */
static inline int emu_tma_map_u8_sw128(CUtensorMap *m, const uint8_t *base, int rows, int cols, int ld, int box_rows) {
    if (cols < 1 || rows < 1 || ld < cols || ld % 16 || ((uintptr_t)base & 15) || box_rows < 1 || box_rows > 256)
        return (int)cudaErrorInvalidValue;
    m->base = nullptr, m->base8 = base, m->rows = rows, m->cols = cols, m->n3 = 1, m->ld = ld, m->ld2 = 0;
    m->box_rows = box_rows;
    return 0;
}
static inline int cuda_tma_map_bf16_3d(CUtensorMap *m, const uint16_t *base, int cols, int rows, int n3, long long ld,
                                       long long ld2, int box_rows) {
    if (cols < 1 || rows < 1 || n3 < 1 || ld < cols || ld2 < ld * rows || box_rows < 1 || box_rows > 256 ||
        ((uintptr_t)base & 15) || (ld * 2) % 16 || (ld2 * 2) % 16)
        return (int)cudaErrorInvalidValue; /* what cuTensorMapEncodeTiled refuses (and ld2 overlapping rows) */
    m->base = base, m->rows = rows, m->cols = cols, m->n3 = n3, m->ld = ld, m->ld2 = ld2, m->box_rows = box_rows;
    m->base8 = nullptr;
    return 0;
}
/* The box at (c0, c1, c2) lands at dst: box row r at dst + 128 r, 16-byte chunk ch at chunk ch ^ (r & 7);
 * elements outside the tensor (any coordinate) read as 0. */
static inline void emu_tma(int cta, uint32_t dst, const CUtensorMap *m, int c0, int c1, int c2, uint32_t bar) {
    uint8_t *s = E.smem[cta].data();
    if (m->base8) { /* bytes, swizzled: byte j of chunk ch of box row r; bytes outside the matrix read 0 */
        if ((dst & 1023) || (size_t)dst + (size_t)m->box_rows * 128 > E.smem[cta].size() - 16) {
            fprintf(stderr, "emu: byte TMA destination %u not 1024-byte aligned or past the end of shared memory\n",
                    dst);
            exit(2);
        }
        for (int r = 0; r < m->box_rows; r++)
            for (int ch = 0; ch < 8; ch++)
                for (int j = 0; j < 16; j++) {
                    const int row = c1 + r, col = c0 + ch * 16 + j;
                    s[dst + r * 128 + ((ch ^ (r & 7)) * 16) + j] =
                        row >= 0 && row < m->rows && col >= 0 && col < m->cols ? m->base8[(size_t)row * m->ld + col]
                                                                               : 0;
                }
        EmuBar *b = emu_bar(cta, bar);
        b->tx -= m->box_rows * 128;
        emu_bar_check(b);
        return;
    }
    if (dst & 1023) {
        fprintf(stderr, "emu: TMA destination %u not 1024-byte aligned\n", dst);
        exit(2);
    }
    if ((size_t)dst + (size_t)m->box_rows * 128 > E.smem[cta].size() - 16) {
        fprintf(stderr, "emu: TMA box at %u (%d rows) past the end of shared memory\n", dst, m->box_rows);
        exit(2);
    }
    for (int r = 0; r < m->box_rows; r++)
        for (int ch = 0; ch < 8; ch++) {
            uint8_t *d = s + dst + r * 128 + ((ch ^ (r & 7)) * 16);
            const int row = c1 + r, col = c0 + ch * 8;
            if (row >= 0 && row < m->rows && col >= 0 && col + 8 <= m->cols && c2 >= 0 && c2 < m->n3)
                memcpy(d, m->base + (size_t)c2 * m->ld2 + (size_t)row * m->ld + col, 16);
            else
                memset(d, 0, 16);
        }
    EmuBar *b = emu_bar(cta, bar);
    b->tx -= m->box_rows * 128;
    emu_bar_check(b);
}
static inline void tma_load_2d(uint32_t dst, const CUtensorMap *m, int c0, int c1, uint32_t bar) {
    emu_tma(me().cta, dst, m, c0, c1, 0, bar);
}
static inline void tma_load_3d(uint32_t dst, const CUtensorMap *m, int c0, int c1, int c2, uint32_t bar) {
    emu_tma(me().cta, dst, m, c0, c1, c2, bar);
}
/* the bulk copy global -> shared of async.cuh (bulk_g2s): the bytes land at once, then count on the mbarrier */
static inline void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    const int cta = me().cta;
    if ((dst & 15) || (bytes & 15) || ((uintptr_t)src & 15) || (size_t)dst + bytes > E.smem[cta].size() - 16) {
        fprintf(stderr, "emu: bulk copy of %u bytes to %u: misaligned or past the end of shared memory\n", bytes, dst);
        exit(2);
    }
    memcpy(E.smem[cta].data() + dst, src, bytes);
    EmuBar *b = emu_bar(cta, bar);
    b->tx -= (int32_t)bytes;
    emu_bar_check(b);
}

/* runs kern over grid in clusters of cl CTAs along x; emu_hook_begin(cl) / emu_hook_end() (optional,
 * emu_wgmma.h) run before and after each cluster */
static std::function<void()> emu_kern;
static void (*emu_hook_begin)(int ncta) = nullptr;
static void (*emu_hook_end)(void) = nullptr;
static void emu_entry() {
    emu_progress++;
    emu_kern();
    emu_progress++;
    me().done = true;
}
static void emu_launch(dim3 grid, int nthreads, size_t smem_bytes, int cl, std::function<void()> kern) {
    E.grid = grid, E.block = dim3(nthreads), E.nthreads = nthreads, E.ncta = cl;
    emu_kern = kern;
    static std::vector<std::vector<char>> stacks;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x0 = 0; x0 < grid.x; x0 += cl) {
                const int n = nthreads * cl;
                E.th.assign(n, EmuThread());
                E.smem.assign(cl, std::vector<uint8_t>(smem_bytes + 16));
                for (int c = 0; c < cl; c++) /* garbage in shared memory: every other byte 0xff, so bf16 / f16 pairs
                                              * read from it are often NaN or inf, as stale bytes can be on a GPU */
                    for (size_t i = 0; i < smem_bytes; i++) E.smem[c][i] = i & 1 ? 0xff : (uint8_t)(0x7f + i * 37);
                E.bidx.assign(cl, make_uint3(0, 0, 0));
                for (int c = 0; c < cl; c++) E.bidx[c] = make_uint3(x0 + c, y, z);
                E.cta_cnt.assign(cl, 0), E.cta_gen.assign(cl, 0);
                E.warp_cnt.assign(cl * 32, 0), E.warp_gen.assign(cl * 32, 0); /* up to 1024 threads */
                E.cl_cnt = 0, E.cl_gen = 0, E.cl_my.assign(n, 0);
                E.nb_cnt.assign(cl * 16, 0), E.nb_gen.assign(cl * 16, 0);
                E.slot.assign((size_t)cl * 32 * 32 * 8, 0);
                stacks.resize(n);
                for (int i = 0; i < n; i++) {
                    stacks[i].resize(256 * 1024);
                    EmuThread &t = E.th[i];
                    t.tid = i % nthreads, t.cta = i / nthreads, t.done = false;
                    getcontext(&t.ctx);
                    t.ctx.uc_stack.ss_sp = stacks[i].data();
                    t.ctx.uc_stack.ss_size = stacks[i].size();
                    t.ctx.uc_link = &E.sched;
                    makecontext(&t.ctx, emu_entry, 0);
                }
                if (emu_hook_begin) emu_hook_begin(cl);
                for (bool any = true; any;) {
                    any = false;
                    const long prog0 = emu_progress;
                    for (int i = 0; i < n; i++) {
                        if (E.th[i].done) continue;
                        any = true;
                        E.cur = i;
                        swapcontext(&E.sched, &E.th[i].ctx);
                    }
                    if (any && emu_progress == prog0) {
                        fprintf(stderr, "emu: deadlock in CTA(s) %u.. (every live thread waits on a barrier)\n", x0);
                        exit(3);
                    }
                }
                if (emu_hook_end) emu_hook_end();
            }
}
