/* lm_screen_emu.cpp — the LM head's int8 screen (src/cuda/lm_screen.cu, pulled in as lm_screen.inc by
 * run_lm_screen.sh: cuda_lm_quantize's kernel and the screen's register kernel) run under the host emulation of
 * emu.h, one CTA of 512 fibers at a time, against the full head's argmax computed here in the full head's own fp32
 * order (gemv.cu: per lane dot8 over u = 0..3 of each 1024 columns, then warp_sum_rows4's tree), so the screen's
 * id and value must match bit for bit. Cases (MV_IN_VEC): random, exact ties, near-ties one bf16 step apart, the
 * largest valid row last, a larger row in the padding, all rows equal (over 512 rows in a CTA: its list overflows,
 * all rows exactly), x = 0, NaN in x, a row with an infinite weight; the quantized rows are checked against their
 * bound coefficients, and (1024 and 2048 columns) the ring kernel's 6-bit rows and its per-lane sums of them
 * (dot32_u6) against the int8 rows (check_planes; the ring kernel itself needs TMA: GPU test only). Shapes: 16 to 2048
 * columns (not multiples of 512 included), 1-2 CTAs (small: the emulation
 * is slow; the GPU test covers the 0.8B head). Exit 1 on a mismatch. For machines without a GPU: the bound, the candidate lists, the
 * fallback and the key, not speed (the atomics are plain read-modify-writes, one CTA after another). */
// clang-format off
#define EMU_NO_SILU /* silu_f comes from common.cuh with the other helpers */
#define EMU_OWN_INT_SHFL
#include "emu.h" /* first: its macros replace CUDA's qualifiers */
#undef __host__
#define __host__
#include <float.h>
#include <limits.h>
#include <time.h>
#include "cuda/ops.h"
#include "emu_common.h"
// clang-format on

/* the warp intrinsics lm_screen.cu uses beyond emu.h's float shuffles (sample_emu.cpp's exchange): every lane posts
 * its words in the warp's slots, one warp barrier, each lane reads what it needs, one more barrier */
template <typename F>
static inline uint64_t emu_warp_all64(uint64_t mine, F f) {
    const int lane = me().tid & 31;
    emu_slot(lane)[0] = (uint32_t)mine, emu_slot(lane)[1] = (uint32_t)(mine >> 32);
    emu_warp_bar();
    uint64_t v[32];
    for (int l = 0; l < 32; l++) v[l] = emu_slot(l)[0] | ((uint64_t)emu_slot(l)[1] << 32);
    emu_warp_bar();
    return f(v, lane);
}
static inline unsigned __ballot_sync(unsigned, int pred) {
    return (unsigned)emu_warp_all64(pred != 0, [](const uint64_t *v, int) {
        unsigned m = 0;
        for (int l = 0; l < 32; l++) m |= (v[l] ? 1u : 0u) << l;
        return (uint64_t)m;
    });
}
static inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
static inline int __shfl_sync(unsigned, int x, int src) {
    return (int)emu_warp_all64((uint32_t)x, [src](const uint64_t *v, int) { return v[src & 31]; });
}
static inline unsigned __shfl_sync(unsigned m, unsigned x, int src) { return (unsigned)__shfl_sync(m, (int)x, src); }
static inline int __shfl_xor_sync(unsigned, int x, int mask) {
    return (int)emu_warp_all64((uint32_t)x, [mask](const uint64_t *v, int lane) { return v[(lane ^ mask) & 31]; });
}
static inline long long __shfl_xor_sync(unsigned, long long x, int mask) {
    return (long long)emu_warp_all64((uint64_t)x, [mask](const uint64_t *v, int lane) { return v[(lane ^ mask) & 31]; });
}
static inline double __shfl_xor_sync(unsigned, double x, int mask) {
    uint64_t u;
    memcpy(&u, &x, 8);
    u = emu_warp_all64(u, [mask](const uint64_t *v, int lane) { return v[(lane ^ mask) & 31]; });
    memcpy(&x, &u, 8);
    return x;
}
static inline void l2_prefetch(const void *, unsigned) {} /* common.cuh's hint (the ring kernel's; not emulated) */
static inline unsigned atomicMax(unsigned *p, unsigned v) {
    const unsigned old = *p;
    if (v > old) *p = v;
    return old;
}
static inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) {
    const unsigned long long old = *p;
    if (v > old) *p = v;
    return old;
}
static inline int __dp2a_lo(int a, int b, int c) { /* a: two int16; b: bytes 0, 1 as int8 */
    return c + (int16_t)(a & 0xffff) * (int8_t)(b & 0xff) + (int16_t)((unsigned)a >> 16) * (int8_t)((b >> 8) & 0xff);
}
static inline int __dp2a_hi(int a, int b, int c) { /* bytes 2, 3 */
    return c + (int16_t)(a & 0xffff) * (int8_t)((b >> 16) & 0xff) + (int16_t)((unsigned)a >> 16) * (int8_t)((unsigned)b >> 24);
}
static inline int __float2int_rn(float x) { return (int)rintf(x); }
static inline float __int_as_float(int i) { return __uint_as_float((uint32_t)i); }
static inline float __double2float_ru(double d) { /* the smallest float >= d */
    float f = (float)d;
    if ((double)f < d) f = nextafterf(f, INFINITY);
    return f;
}
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
/* the ring kernel's TMA pieces (declared for its template; only the register kernel runs here) */
static inline unsigned __cvta_generic_to_shared(const void *) { abort(); }
static inline void mbar_arrive(uint32_t) { abort(); }
static inline uint64_t l2_evict_first_policy(void) { abort(); }
static inline void bulk_g2s_ef(uint32_t, const void *, uint32_t, uint32_t, uint64_t) { abort(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_bar(); }
#undef __shared__
#define __shared__ static /* one CTA runs at a time: a function's statics are its shared memory */
static float emu_red[32];
// clang-format off
#include "ls_common.inc"  /* bf_lo .. bf16u, dot8 .. ceil_div, gemv_stage_input from src/cuda/common.cuh */
#include "lm_screen.inc"  /* the kernels */
// clang-format on

static int fails, checks;
static void check(bool ok, const char *what, const char *c) {
    checks++;
    if (!ok) {
        fprintf(stderr, "FAIL: %s: %s\n", c, what);
        fails++;
    }
}

/* The full head's fp32 sum of row r (gemv.cu MV_OUT_ARGMAX at 512 threads, U 4): lane l's partial is dot8 over
 * columns k0 + 256 u + 8 l (u < 4, each 1024 columns), then warp_sum_rows4's tree for the row's lanes 8 j. */
static float full_sum(const uint16_t *W, const float *x, int cols, int r) {
    float acc[32];
    for (int l = 0; l < 32; l++) {
        float a = 0.0f;
        for (int k0 = 0; k0 < cols; k0 += 1024)
            for (int u = 0; u < 4; u++) {
                const int k = k0 + u * 256 + 8 * l;
                if (k >= cols) continue;
                for (int e = 0; e < 8; e++) a = fmaf(bff(W[(size_t)r * cols + k + e]), x[k + e], a);
            }
        acc[l] = a;
    }
    const int j = r & 3; /* the row's place in its group of 4: lanes 8j .. 8j+7 hold it */
    float v[32], s[32];
    for (int l = 0; l < 32; l++) v[l] = acc[l] + acc[l ^ 16]; /* own + the xor-16 partner's, same row */
    for (int l = 0; l < 32; l++) s[l] = v[l] + v[l ^ 8];
    for (int m = 4; m >= 1; m >>= 1) {
        float t[32];
        for (int l = 0; l < 32; l++) t[l] = s[l] + s[l ^ m];
        memcpy(s, t, sizeof s);
    }
    return s[8 * j];
}

/* cuda_lm_quantize's rule (lm_screen.cu lm_quantize_bf16) on the host, its sums in another order */
static void host_quant(const uint16_t *W, int rows, int cols, int8_t *q, float *meta) {
    for (int r = 0; r < rows; r++) {
        const uint16_t *wr = W + (size_t)r * cols;
        float amax = 0.0f;
        bool bad = false;
        for (int k = 0; k < cols; k++) bad |= !std::isfinite(bff(wr[k])), amax = fmaxf(amax, fabsf(bff(wr[k])));
        const float sc = bad ? 0.0f : amax / 127.0f;
        double e2 = 0, nw2 = 0, nq2 = 0, l1 = 0;
        for (int k = 0; k < cols; k++) {
            const float v = bff(wr[k]);
            int qi = sc > 0.0f ? (int)rintf(v / sc) : 0;
            qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
            q[(size_t)r * cols + k] = (int8_t)qi;
            if (!bad) {
                const double dq = (double)sc * qi, d = (double)v - dq;
                e2 += d * d, nw2 += (double)v * v, nq2 += dq * dq, l1 += fabs(dq);
            }
        }
        meta[4 * r] = sc;
        meta[4 * r + 1] = bad ? INFINITY : __double2float_ru(sqrt(e2) + 2.0 * cols * 0x1p-24 * (sqrt(nw2) + sqrt(nq2)));
        meta[4 * r + 2] = __double2float_ru(l1), meta[4 * r + 3] = 0.0f;
    }
}

/* The ring kernel's rows (lm_quantize_bf16's wp): every element's u >> 2 (u = q + 128) as the kernel reads it
 * (dot32_u6's nibble / pair words), c6 >= sc ||lo - 1.5||_2 (lo = u & 3, not stored), and the per-lane sum of random
 * int16 hq exact: dot32_u6 = sum hq (u >> 2), over lane l's columns 1024 c + 32 l + [0, 32). */
static void check_planes(const int8_t *q, const uint8_t *wp, const float *meta, int rows, int cols, const char *c) {
    const int hq_max = std::min(32767, (int)(2147483647ll / (127ll * cols)));
    std::vector<short> hq(cols);
    for (int k = 0; k < cols; k++) hq[k] = (short)((int)(urand() * (2 * hq_max - 1)) - (hq_max - 1));
    int bad_u = 0, bad_c6 = 0, bad_sum = 0;
    for (int r = 0; r < rows; r++) {
        double lo2 = 0;
        for (int ch = 0; ch < cols / 1024; ch++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *pr = wp + (size_t)r * (cols / 4 * 3) + 768 * ch;
                uint4 nb;
                uint2 tp;
                memcpy(&nb, pr + 16 * l, 16), memcpy(&tp, pr + 512 + 8 * l, 8);
                const int k0 = 1024 * ch + 32 * l;
                int hp[16];
                memcpy(hp, &hq[k0], 64); /* int16 pairs, as the kernel's hp */
                long long s6 = 0;
                for (int k = 0; k < 32; k++) {
                    const int j = k / 4, m = k % 4, u = q[(size_t)r * cols + k0 + k] + 128;
                    const int nib = pr[16 * l + 4 * (j / 2) + m] >> (4 * (j & 1)) & 15,
                              top = pr[512 + 8 * l + 4 * (j / 4) + m] >> (2 * (j % 4)) & 3;
                    bad_u += (top << 4 | nib) != u >> 2;
                    s6 += (long long)hq[k0 + k] * (u >> 2);
                    lo2 += ((u & 3) - 1.5) * ((u & 3) - 1.5);
                }
                bad_sum += dot32_u6(nb, tp, hp, 0) != s6;
            }
        bad_c6 += !(meta[4 * r + 3] >= meta[4 * r] * sqrt(lo2));
    }
    check(bad_u == 0 && bad_c6 == 0 && bad_sum == 0, "the ring kernel's 6-bit rows, c6 and its lane sums", c);
    if (bad_u + bad_c6 + bad_sum) printf("  %d elements, %d c6, %d lane sums wrong\n", bad_u, bad_c6, bad_sum);
}

enum { H_NONE, H_TIES, H_NEAR, H_ALLEQ, H_ZERO, H_NAN, H_INF, H_RAND, H_N };
static const char *hard_name[] = {"the largest row last", "ties", "near-ties", "all rows equal", "x = 0", "NaN in x",
                                  "inf weight", "random"};

static void run_case(int rows, int cols, int n_valid, int blocks, int hard) {
    const double t0 = (double)clock() / CLOCKS_PER_SEC;
    char c[128];
    snprintf(c, sizeof c, "%d x %d valid %d, %d CTAs, %s", rows, cols, n_valid, blocks, hard_name[hard]);
    const size_t nw = (size_t)rows * cols;
    uint16_t *W = (uint16_t *)aligned_alloc(64, (nw * 2 + 63) / 64 * 64);
    int8_t *q = (int8_t *)aligned_alloc(64, (nw + 63) / 64 * 64);
    float *meta = (float *)aligned_alloc(64, (size_t)rows * 16 + 64), *x = (float *)aligned_alloc(64, cols * 4 + 64);
    for (size_t i = 0; i < nw; i++) W[i] = emu_bf(nrm() / sqrtf((float)cols));
    for (int k = 0; k < cols; k++) x[k] = rbf(nrm());
    const int a = (int)(urand() * (n_valid / 2)), b = n_valid / 2 + (int)(urand() * (n_valid - n_valid / 2));
    if (hard == H_TIES || hard == H_NEAR) {
        for (int k = 0; k < cols; k++) {
            const float v = (k * 7 % 5 == 0 ? 0.75f : 0.5f) * 8.0f / sqrtf((float)cols);
            W[(size_t)a * cols + k] = W[(size_t)b * cols + k] = emu_bf(x[k] >= 0 ? v : -v);
        }
        if (hard == H_NEAR) W[(size_t)b * cols + cols / 3]++; /* one step away from zero */
    }
    if (hard == H_NONE)
        for (int k = 0; k < cols; k++)
            W[(size_t)(n_valid - 1) * cols + k] = emu_bf((x[k] >= 0 ? 0.9f : -0.9f) * 8.0f / sqrtf((float)cols));
    if (n_valid < rows)
        for (int k = 0; k < cols; k++) W[(size_t)(rows - 1) * cols + k] = emu_bf(x[k] >= 0 ? 2.0f : -2.0f);
    if (hard == H_ALLEQ)
        for (int r = 1; r < rows; r++) memcpy(&W[(size_t)r * cols], W, (size_t)cols * 2);
    if (hard == H_ZERO) memset(x, 0, (size_t)cols * 4);
    if (hard == H_NAN) x[cols / 2] = NAN;
    if (hard == H_INF) W[(size_t)b * cols + cols / 2] = 0x7f80;

    /* the int8 rows: here by the host's copy of cuda_lm_quantize's rule; for the first case of each shape also by its
     * kernel (slow under emulation), which must give the same scales and q and bounds as large within 1e-6 */
    host_quant(W, rows, cols, q, meta);
    if (hard == H_NONE) {
        int8_t *q2 = (int8_t *)aligned_alloc(64, (nw + 63) / 64 * 64);
        float *m2 = (float *)aligned_alloc(64, (size_t)rows * 16 + 64);
        const bool planes = cols % 1024 == 0; /* the ring kernel's 6-bit rows too */
        uint8_t *wp = planes ? (uint8_t *)aligned_alloc(64, (nw + 63) / 64 * 64) : NULL;
        emu_launch(dim3((unsigned)((rows + 7) / 8)), 256, 0, 1, [&] { lm_quantize_bf16(W, rows, cols, q2, wp, m2, nullptr, nullptr); });
        int diff = memcmp(q, q2, nw) != 0;
        for (int r = 0; r < rows; r++)
            diff += meta[4 * r] != m2[4 * r] || !(fabs(m2[4 * r + 1] - meta[4 * r + 1]) <= 1e-6 * meta[4 * r + 1]) ||
                    !(fabs(m2[4 * r + 2] - meta[4 * r + 2]) <= 1e-6 * meta[4 * r + 2]);
        check(diff == 0, "cuda_lm_quantize's kernel = the host's rule", c);
        if (planes) check_planes(q, wp, m2, rows, cols, c);
        free(q2), free(m2), free(wp);
    }
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        double e2 = 0, l1 = 0;
        bool fin = true;
        for (int k = 0; k < cols; k++) {
            const double w = bff(W[(size_t)r * cols + k]), d = w - (double)meta[4 * r] * q[(size_t)r * cols + k];
            fin &= std::isfinite(w);
            e2 += d * d, l1 += fabs((double)meta[4 * r] * q[(size_t)r * cols + k]);
        }
        bad += fin ? !(meta[4 * r + 1] >= sqrt(e2) && meta[4 * r + 2] >= l1) : !(std::isinf(meta[4 * r + 1]));
    }
    check(bad == 0, "quantized rows against their bound coefficients", c);

    /* the full head's answer: argmax over r < n_valid of bf16(sum), ties -> smallest, NaN never wins */
    int id_ref = INT_MAX;
    float v_ref = -INFINITY;
    for (int r = 0; r < n_valid; r++) {
        const float v = rbf(full_sum(W, x, cols, r));
        if (v > v_ref || (v == v_ref && r < id_ref)) v_ref = v, id_ref = r;
    }
    if (id_ref == INT_MAX) id_ref = 0;
    if (hard == H_TIES) check(id_ref == a, "the first tied row is the reference's answer", c);
    if (hard == H_NONE) check(id_ref == n_valid - 1, "the last valid row is the reference's answer", c);

    /* the screen (register kernel) */
    unsigned long long key = 0;
    unsigned stats[3] = {0, 0, 0};
    float dummy[4];
    int dummy_i[4];
    unsigned cnt = 0;
    LmScreenParams sp;
    memset(&sp, 0, sizeof sp);
    sp.head.W = W, sp.head.rows = rows, sp.head.cols = cols, sp.head.splits = 1, sp.head.blocks = blocks;
    sp.head.in_mode = MV_IN_VEC, sp.head.x = x, sp.head.out_mode = MV_OUT_ARGMAX, sp.head.n_valid = n_valid;
    sp.head.am_val = dummy, sp.head.am_idx = dummy_i, sp.head.am_count = &cnt, sp.head.out_id = dummy_i;
    sp.Wq = q, sp.meta = meta, sp.stats = stats, sp.key = &key, sp.reg = 1;
    const size_t smem = (sizeof(float) + sizeof(short)) * (size_t)cols;
    if (cudaFuncSetAttribute(lm_screen_bf16<0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        check(false, "shared memory", c);
    CudaLaunch l = {0, 1, NULL, 0};
    const int runs = hard == H_RAND ? 2 : 1; /* the same answer twice (the list's order may differ) */
    for (int run = 0; run < runs; run++) {
        key = 0;
        check(launch_kernel(lm_screen_bf16<0, 1>, dim3((unsigned)blocks), dim3(512), smem, &l, sp) == 0, "launch", c);
        float v = 0;
        const int id = cuda_lm_key_id(key, &v);
        char w[160];
        snprintf(w, sizeof w, "run %d: id %d value %.9g, reference %d %.9g", run, id, v, id_ref, v_ref);
        check(id == id_ref && (memcmp(&v, &v_ref, 4) == 0 || (id_ref == 0 && !(v_ref > -INFINITY))), w, c);
    }
    const bool all = hard == H_NAN || ((hard == H_ALLEQ || hard == H_ZERO) && n_valid / blocks > 600);
    char w[160];
    snprintf(w, sizeof w, "%u of %u CTAs computed all their rows (expected %s)", stats[1], stats[2], all ? "all" : "none");
    check(stats[2] == (unsigned)(runs * blocks) && (all ? stats[1] == stats[2] : hard == H_ALLEQ || hard == H_ZERO || stats[1] == 0), w, c);
    printf("  %s: id %d, %.1f rows recomputed and %.1f CTAs with all rows per launch (%.1f s)\n", c, id_ref,
           (double)stats[0] / runs, (double)stats[1] / runs, (double)clock() / CLOCKS_PER_SEC - t0);
    free(W), free(q), free(meta), free(x);
}

int main(int argc, char **argv) {
    emu_rs = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL) * 2654435761ull + 1;
    printf("LM head int8 screen (src/cuda/lm_screen.cu, register kernel) under the CUDA emulation, seed %llu\n",
           (unsigned long long)emu_rs);
    const int shapes[][3] = {{530, 1024, 1}, {149, 16, 2}, {260, 1040, 1}, {140, 2048, 1}};
    for (int s = 0; s < 4; s++)
        for (int hard = H_NONE; hard < H_N; hard++) /* every row a candidate: only where the list overflows (cheaper) */
            if (s == 0 || (hard != H_ALLEQ && hard != H_ZERO))
                run_case(shapes[s][0], shapes[s][1], shapes[s][0] - (hard % 2 ? 3 : 0), shapes[s][2], hard);
    printf("lm_screen_emu: %d passed, %d failed\n", checks - fails, fails);
    return fails ? 1 : 0;
}
