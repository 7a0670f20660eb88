/* lm_screen_rows_emu.cpp — the LM head's argmax of up to 64 rows through the int8 screen (src/cuda/lm_screen_rows.cu,
 * pulled in as lsr_kernels.inc by run_lm_screen_rows.sh: lsr_prep, lsr_screen, lsr_pick and the launcher cuda_lm_rows)
 * under the host emulation of emu.h + emu_wgmma.h (one CTA at a time, shared memory starting as garbage), on int8 tiles
 * made by cuda_lm_quantize's kernel (lm_quantize_bf16, lsr_quant.inc). The rescoring GEMM the launcher calls
 * (cuda_gemm_skinny, gather mode) is this file's stand-in: it checks its arguments against ops.h's contract and writes
 * y[m][j] = bf16 of the double sum of row m and head row list[j] (the real GEMM's fp32 sum is the GPU test's business;
 * what matters here is the screen's guarantee). Checked for every call:
 *   - the tiles: q = rint(w / sc) at swz128_tile_off, the last tile's rows past V zero, meta_rows' sc and bounds;
 *   - lsr_prep: X (hi 256 + lo) decodes to rint(h (1 / sh)) for each live row (within T's exact range), zero elsewhere;
 *     sh and ||h||_2 (rounded up; inf where h is not finite; 0 for the dead rows);
 *   - the union: no duplicates, ids < n_valid, count <= V, the bits set exactly for its ids when the GEMM runs and all
 *     clear after lsr_pick; against a host model of the bounds (T exact from X's values and the tiles, then the
 *     kernel's own float expressions for a, B, L, U): every head row whose bf16(U) reaches bf16(the final max of L)
 *     for some row is in it (the grid's running maxima only lower the bar), and every head row in it reached, for
 *     some row, the max of L over its own tile and the first tile of its warpgroup (the smallest bar a push can have
 *     seen: the two consumer warpgroups take alternate tiles, each warpgroup's maxima in shared memory); and,
 *     as the emulation runs the CTAs one after another, a CTA's share of it is exactly what the maxima of the CTAs
 *     so far keep (where its list cannot have overflowed); the bytes past the workspace untouched;
 *   - the answer: for every row the exact argmax over [0, n_valid) of the head's bf16 logits (ties: the smallest id,
 *     NaN never wins, none: 0) and every head row equal to that max are in the union; lsr_pick's out[m] is the argmax
 *     over the union of the y values it was given, and equals the exact argmax;
 *   - the reset: a second call on other rows (stale maxima, count or bits would drop candidates), then the first
 *     rows again: the same picks and the same union as the first time.
 * Cases: V = 64 k and ragged (the last tile padded), n_valid < V, D = 128 .. 1024, rows 1 .. 64 (X of 16, 32 and 64
 * rows: the kernel's three forms), grids of 1-4 CTAs (each warpgroup's ring wrapping in each form), and the hard ones: an outlier in every row of h (a coarse sh: most hq are their lo part alone),
 * exact ties (two identical head rows aligned with a row, in different CTAs), a row of h with a NaN (every head row a
 * candidate), a zero row, a head row with an infinite weight (+inf logits), all head rows equal (every pair a
 * candidate: a CTA's list overflows and emits directly). Exit 1 on a failed check, 2 / 3
 * on an emulation error or a deadlock. Usage: lm_screen_rows_emu [seed]. */
// clang-format off
#include "emu.h" /* first: its macros replace CUDA's qualifiers */
#include "emu_wgmma.h"
#undef __host__
#define __host__
#include <float.h>
#include <limits.h>
#include <time.h>
#include "cuda/ops.h"
#include "emu_common.h"
// clang-format on

/* the intrinsics the kernels use beyond emu.h's */
static inline int __float2int_rn(float x) { /* the GPU's cvt.rni.s32.f32: NaN -> 0, saturated */
    if (x != x) return 0;
    if (x >= 2147483648.0f) return INT_MAX;
    if (x <= -2147483648.0f) return INT_MIN;
    return (int)rintf(x);
}
static inline unsigned atomicOr(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old | v;
    return old;
}
static inline unsigned atomicMax(unsigned *p, unsigned v) {
    const unsigned old = *p;
    if (v > old) *p = v;
    return old;
}
static inline int __any_sync(unsigned, int pred) {
    const int lane = me().tid & 31;
    emu_slot(lane)[0] = pred != 0;
    emu_warp_bar();
    int any = 0;
    for (int l = 0; l < 32; l++) any |= emu_slot(l)[0] != 0;
    emu_warp_bar();
    return any;
}
static inline double __shfl_xor_sync(unsigned, double x, int o) { /* the bits, in one exchange of the warp's slots */
    const int lane = me().tid & 31;
    memcpy(emu_slot(lane), &x, 8);
    emu_warp_bar();
    memcpy(&x, emu_slot((lane ^ o) & 31), 8);
    emu_warp_bar();
    return x;
}
static inline float __double2float_ru(double d) { /* the smallest float >= d */
    float f = (float)d;
    if ((double)f < d) f = nextafterf(f, INFINITY);
    return f;
}
/* cuda_lm_rows_count's read back */
extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind) {
    memcpy(dst, src, n);
    return cudaSuccess;
}

// clang-format off
#include "lsr_common.inc"  /* bf16u, warp_sum .. warp_argmax (block_sum, ord_f32, ArgMax) from src/cuda/common.cuh */
#include "lsr_mma.inc"     /* swz128_tile_off, wgmma_desc from src/cuda/mma.cuh */
#include "lsr_quant.inc"   /* lm_quantize_bf16 from src/cuda/lm_screen.cu */
#include "lsr_kernels.inc" /* src/cuda/lm_screen_rows.cu */
// clang-format on

static int fails, checks;
static const char *g_case = "";
static void check(bool ok, const char *what) {
    checks++;
    if (!ok) {
        fprintf(stderr, "FAIL: %s: %s\n", g_case, what);
        fails++;
    }
}

/* the exact logit of bf16 rows a and b as the engine rounds it: bf16 of the sum (here in double) */
static float logit(const uint16_t *a, const uint16_t *b, int D) {
    double s = 0.0;
    for (int k = 0; k < D; k++) s += (double)bff(a[k]) * (double)bff(b[k]);
    return rbf((float)s);
}
/* argmax_better's order: the larger value, then the smaller id; NaN never wins */
static bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

/* ---- the rescoring GEMM: ops.h's gather contract, on the host ---- */
static struct {
    const LmRowsParams *p;
    int calls;
    std::vector<int> list; /* the union as the GEMM saw it */
    bool mask_ok;          /* its bits set exactly for the union's ids then */
} g_gemm;
extern "C" int cuda_gemm_skinny(const GemmParams *g, float *work, size_t work_floats, int n_sm, const CudaLaunch *) {
    const LmRowsParams *p = g_gemm.p;
    const LsrWs w = lsr_ws(p->ws, p->V, p->D, NULL);
    g_gemm.calls++;
    check(g->x == p->h && g->w == p->W && !g->w8 && g->y == p->y && g->M == p->rows && g->N == p->V && g->K == p->D &&
              g->ldx == p->ldh && g->ldw == p->D && g->ldy == p->V && g->epi == GEMM_EPI_F32 && g->gather == w.list &&
              g->n_dyn == w.count && !g->split_m && n_sm == p->n_sm && !work && !work_floats,
          "the rescoring GEMM's arguments (ops.h GemmParams.gather)");
    const unsigned n = *g->n_dyn;
    check(n <= (unsigned)p->V, "the union's count <= V");
    const int nn = (int)std::min(n, (unsigned)p->V);
    g_gemm.list.assign(g->gather, g->gather + nn);
    std::vector<unsigned> want((size_t)(p->V + 31) / 32, 0u);
    bool ids_ok = true;
    for (int j = 0; j < nn; j++) {
        const int r = g->gather[j];
        if (r < 0 || r >= p->V) {
            ids_ok = false;
            continue;
        }
        want[(size_t)r >> 5] |= 1u << (r & 31);
        for (int m = 0; m < g->M; m++)
            ((float *)g->y)[(size_t)m * g->ldy + j] = logit(g->x + (size_t)m * g->ldx, g->w + (size_t)r * g->ldw, g->K);
    }
    check(ids_ok, "the union's ids within [0, V)");
    g_gemm.mask_ok = memcmp(want.data(), w.mask, want.size() * 4) == 0;
    return 0;
}

/* ---- the cases ---- */
enum { H_RAND, H_SPIKE, H_TIES, H_NAN, H_ZERO, H_INF, H_ALLEQ, H_N };
static const char *hard_name[H_N] = {
    "random",          "an outlier in each row of h", "exact ties",         "NaN in a row of h",
    "a zero row of h", "an infinite weight",          "all head rows equal"};
struct Shape {
    int V, n_valid, D, rows, n_sm, hard;
    bool again; /* the reset: calls 2 and 3 */
};

/* cuda_lm_quantize's rule on the host (lm_screen.cu lm_quantize_bf16): sc = max |w| / 127, q = rint(w / sc) */
static void host_quant(const uint16_t *wr, int D, int8_t *q, float *sc_out) {
    float amax = 0.0f;
    bool bad = false;
    for (int k = 0; k < D; k++) bad |= !std::isfinite(bff(wr[k])), amax = fmaxf(amax, fabsf(bff(wr[k])));
    const float sc = bad ? 0.0f : amax / 127.0f;
    for (int k = 0; k < D; k++) {
        const int qi = sc > 0.0f ? (int)rintf(bff(wr[k]) / sc) : 0;
        q[k] = (int8_t)(qi > 127 ? 127 : qi < -127 ? -127 : qi);
    }
    *sc_out = sc;
}

/* What one call left: the picks and the union (sorted). */
struct CallResult {
    std::vector<int> out, uni;
    unsigned count;
};

/* One cuda_lm_rows call on rows h and every check of it (the header). q: the host's int8 rows [V][D]. */
static CallResult run_call(const Shape &s, LmRowsParams &p, const uint16_t *h, const std::vector<int8_t> &q,
                           const char *tag) {
    const int V = s.V, D = s.D, rows = s.rows, nv = s.n_valid, T = (V + 63) / 64, G = T < s.n_sm ? T : s.n_sm;
    const LsrWs w = lsr_ws(p.ws, V, D, NULL);
    char what[256];
    p.h = h;
    for (int m = 0; m < rows; m++) p.out[m] = -7;
    for (size_t i = 0; i < (size_t)rows * V; i++) p.y[i] = NAN;
    g_gemm.p = &p, g_gemm.calls = 0, g_gemm.list.clear(), g_gemm.mask_ok = false;
    CudaLaunch l = {0, 1, NULL, 0};
    const int rc = cuda_lm_rows(&p, &l);
    snprintf(what, sizeof what, "%s: cuda_lm_rows returned %d, the GEMM ran %d times", tag, rc, g_gemm.calls);
    check(rc == 0 && g_gemm.calls == 1, what);
    CallResult res;
    res.count = *w.count;
    const int n = (int)std::min(res.count, (unsigned)V);
    res.uni.assign(w.list, w.list + n);
    res.out.assign(p.out, p.out + rows);
    check(g_gemm.list == res.uni, "the union after lsr_pick = the one the GEMM rescored");
    check(g_gemm.mask_ok, "the union's bits set exactly for its ids when the GEMM runs");
    check(cuda_lm_rows_count(&p) == (long)res.count, "cuda_lm_rows_count = the union's count");
    bool mask_clear = true;
    for (int i = 0; i < (V + 31) / 32; i++) mask_clear &= w.mask[i] == 0u;
    check(mask_clear, "the union's bits all clear after lsr_pick");
    std::vector<char> in(V, 0);
    bool dup = false, range = true;
    for (int r : res.uni) {
        if (r < 0 || r >= nv) {
            range = false;
            continue;
        }
        dup |= in[r] != 0, in[r] = 1;
    }
    check(!dup, "no duplicates in the union");
    check(range, "the union's ids within [0, n_valid)");

    /* lsr_prep: X, sh, ||h|| per row (the dead rows m >= rows: zero) */
    const int hq_lim = (int)(2147483647ll / (127ll * D)); /* |hq| below it: T = sum hq q exact in int32 */
    const int NR = lsr_nr(rows);                          /* X's rows: hi 0 .. NR - 1, lo NR .. 2 NR - 1 */
    std::vector<int> hq((size_t)NR * D, 0);
    int bad_x = 0, bad_s = 0;
    for (int m = 0; m < NR; m++) {
        const bool live = m < rows;
        const uint16_t *hr = h + (size_t)m * p.ldh;
        const float sh = w.sh[m], ish = 1.0f / sh;
        double ss = 0.0;
        bool fin = true;
        if (live) {
            for (int k = 0; k < D; k++) fin &= std::isfinite(bff(hr[k])), ss += (double)bff(hr[k]) * bff(hr[k]);
            bad_s += !(sh > 0.0f && sh <= FLT_MAX);
            bad_s += fin ? !(w.hn[m] >= sqrt(ss) && w.hn[m] <= 1.002 * sqrt(ss) + 1e-30) : !(w.hn[m] == INFINITY);
        } else {
            bad_s += !(sh == 0.0f && w.hn[m] == 0.0f);
        }
        for (int k = 0; k < D; k++) {
            const int hi = w.x[swz128_tile_off(m, k, D, 2 * NR)], lo = w.x[swz128_tile_off(NR + m, k, D, 2 * NR)];
            const int v = 256 * hi + lo, want = live ? __float2int_rn(bff(hr[k]) * ish) : 0;
            bad_x += v != want || (v < 0 ? -v : v) >= hq_lim;
            hq[(size_t)m * D + k] = v;
        }
    }
    snprintf(what, sizeof what, "%s: X = hi 256 + lo = rint(h / sh) within the exact range (%d of %d wrong)", tag,
             bad_x, NR * D);
    check(bad_x == 0, what);
    snprintf(what, sizeof what, "%s: sh and ||h||_2 of the rows (%d wrong)", tag, bad_s);
    check(bad_s == 0, what);

    /* the host model of the bounds: T exact, then the kernel's own expressions; Lt[t][m]: the max of L over tile t */
    const float *meta = p.meta;
    std::vector<float> U((size_t)nv * rows), Lt((size_t)T * rows, -INFINITY), M(rows, -INFINITY);
    bool t_range = true;
    for (int r = 0; r < nv; r++)
        for (int m = 0; m < rows; m++) {
            long long t64 = 0;
            for (int k = 0; k < D; k++) t64 += (long long)hq[(size_t)m * D + k] * q[(size_t)r * D + k];
            t_range &= t64 >= INT_MIN && t64 <= INT_MAX;
            const float sh = w.sh[m], a = (float)(int)t64 * (meta[4 * r] * sh);
            const float B =
                fmaf(1.001f * w.hn[m], meta[4 * r + 1], (0.5105f * sh) * meta[4 * r + 2]) + 0x1p-22f * fabsf(a);
            const float L = a - B;
            U[(size_t)r * rows + m] = a + B;
            if (L == L)
                Lt[(size_t)(r / 64) * rows + m] = fmaxf(Lt[(size_t)(r / 64) * rows + m], L), M[m] = fmaxf(M[m], L);
        }
    check(t_range, "the model's T within int32");
    /* Mb[b][m]: the max of L over CTAs 0 .. b, the grid's max as CTA b's last step finds it when the CTAs run one
     * after another (the emulation's order) */
    std::vector<float> Mb((size_t)G * rows, -INFINITY);
    for (int b = 0; b < G; b++)
        for (int m = 0; m < rows; m++) {
            float v = b ? Mb[(size_t)(b - 1) * rows + m] : -INFINITY;
            for (int t = b; t < T; t += G) v = fmaxf(v, Lt[(size_t)t * rows + m]);
            Mb[(size_t)b * rows + m] = v;
        }
    /* per CTA: the pairs every schedule pushes (bf16(U) >= bf16(the final max)), and those some schedule may push */
    std::vector<int> pushed(G, 0), can_pairs(G, 0);
    std::vector<char> exact(nv, 0);
    int must = 0, miss = 0, unjust = 0;
    for (int r = 0; r < nv; r++) {
        const int t = r / 64, b = t % G, t1 = b + (t / G & 1) * G; /* t1: the first tile of t's warpgroup */
        bool need = false, can = false;
        for (int m = 0; m < rows; m++) {
            const float u = U[(size_t)r * rows + m];
            const float bar = fmaxf(Lt[(size_t)t * rows + m], Lt[(size_t)t1 * rows + m]);
            if (rbf(u) >= rbf(M[m])) need = true, pushed[b]++;
            if (u >= lsr_thr(bar)) can = true, can_pairs[b]++; /* the kernel's push test */
            if (rbf(u) >= rbf(Mb[(size_t)b * rows + m])) exact[r] = 1;
        }
        must += need;
        miss += need && !in[r];
        unjust += in[r] && !can;
    }
    int over = 0, n_exact = 0, bad_exact_set = 0;
    for (int b = 0; b < G; b++) {
        over += pushed[b] > LSR_CAP;
        if (can_pairs[b] > LSR_CAP) continue; /* its list may have overflowed: its pushes went to the union directly */
        n_exact++;
        for (int t = b; t < T; t += G)
            for (int r = 64 * t; r < 64 * t + 64 && r < nv; r++) bad_exact_set += in[r] != exact[r];
    }
    snprintf(what, sizeof what, "%s: %d head rows the bounds keep are missing from the union", tag, miss);
    check(miss == 0, what);
    snprintf(what, sizeof what, "%s: %d head rows in the union whose bound reaches no bar a push can have seen", tag,
             unjust);
    check(unjust == 0, what);
    /* Where a CTA's list cannot overflow, its share of the union is exactly its head rows whose bf16(U) reaches
     * bf16(Mb) for some row: every such pair was pushed (its bars were at most Mb) and the last filter keeps exactly
     * those. On a GPU the CTAs overlap (only the two bounds above hold); here they do not. */
    snprintf(what, sizeof what, "%s: %d head rows differ from the union the emulation's order gives", tag,
             bad_exact_set);
    check(bad_exact_set == 0, what);

    /* the answer */
    int bad_top = 0, bad_pick = 0, bad_exact = 0, all_nan = 0;
    for (int m = 0; m < rows; m++) {
        const uint16_t *hr = h + (size_t)m * p.ldh;
        std::vector<float> z(nv);
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int r = 0; r < nv; r++) {
            z[r] = logit(hr, p.W + (size_t)r * D, D);
            if (better(z[r], r, bv, bi)) bv = z[r], bi = r;
        }
        const int ref = bi == INT_MAX ? 0 : bi;
        if (bi != INT_MAX)
            for (int r = 0; r < nv; r++) bad_top += z[r] == bv && !in[r];
        float uv = -INFINITY;
        int ui = INT_MAX;
        for (int j = 0; j < n; j++)
            if (res.uni[j] < nv && better(p.y[(size_t)m * V + j], res.uni[j], uv, ui))
                uv = p.y[(size_t)m * V + j], ui = res.uni[j];
        bad_pick += res.out[m] != (ui == INT_MAX ? 0 : ui);
        bad_exact += res.out[m] != ref;
        bool fin = true;
        for (int k = 0; k < D; k++) fin &= std::isfinite(bff(hr[k]));
        if (!fin) { /* the bound is infinite: every head row is a candidate */
            all_nan++;
            for (int r = 0; r < nv; r++) bad_top += !in[r];
        }
    }
    snprintf(what, sizeof what, "%s: %d maxima (or head rows of a non-finite row) missing from the union", tag,
             bad_top);
    check(bad_top == 0, what);
    snprintf(what, sizeof what, "%s: %d picks not the argmax over the union of y", tag, bad_pick);
    check(bad_pick == 0, what);
    snprintf(what, sizeof what, "%s: %d picks not the exact argmax", tag, bad_exact);
    check(bad_exact == 0, what);
    if (s.hard == H_ALLEQ) {
        snprintf(what, sizeof what, "%s: a CTA's list overflows (pairs pushed per CTA > LSR_CAP %d)", tag, LSR_CAP);
        check(over > 0, what);
    }
    printf("    %s: union %u of %d head rows (the final bounds keep %d; exact for %d of %d CTAs), %d CTA lists "
           "overflowed%s\n",
           tag, res.count, nv, must, n_exact, G, over, all_nan ? ", rows with NaN: all kept" : "");
    std::sort(res.uni.begin(), res.uni.end());
    return res;
}

/* rows of h (bf16, stride ldh, NaN in the gap past D) with the case's hard features */
static void make_h(const Shape &s, int ldh, std::vector<uint16_t> &h) {
    h.assign((size_t)LSR_ROWS * ldh, 0x7fc1);
    for (int m = 0; m < s.rows; m++)
        for (int k = 0; k < s.D; k++) h[(size_t)m * ldh + k] = emu_bf(nrm());
    const int mh = s.rows / 2;
    if (s.hard == H_SPIKE) /* one element 300 times the others' scale: sh is coarse, most hq are their lo part alone */
        for (int m = 0; m < s.rows; m++)
            h[(size_t)m * ldh + (int)(urand() * s.D)] = emu_bf(urand() < 0.5 ? 300.0f : -300.0f);
    if (s.hard == H_NAN) h[(size_t)mh * ldh + s.D / 3] = 0x7fc0;
    if (s.hard == H_ZERO)
        for (int k = 0; k < s.D; k++) h[(size_t)mh * ldh + k] = 0;
}

static void run_case(const Shape &s) {
    const double t0 = (double)clock() / CLOCKS_PER_SEC;
    char c[160];
    snprintf(c, sizeof c, "V %d (valid %d) D %d, %d rows, n_sm %d, %s", s.V, s.n_valid, s.D, s.rows, s.n_sm,
             hard_name[s.hard]);
    g_case = c;
    printf("  %s\n", c);
    const int V = s.V, D = s.D, ldh = D + 8, nv = s.n_valid;
    std::vector<uint16_t> h1, h2;
    make_h(s, ldh, h1);
    h2 = h1; /* call 2: -h / 4, so that every row's max of L is below call 1's (a stale one would drop its winners) */
    for (int m = 0; m < s.rows; m++)
        for (int k = 0; k < D; k++) h2[(size_t)m * ldh + k] = emu_bf(-0.25f * bff(h1[(size_t)m * ldh + k]));
    uint16_t *W = (uint16_t *)aligned_alloc(64, ((size_t)V * D * 2 + 63) / 64 * 64);
    for (size_t i = 0; i < (size_t)V * D; i++) W[i] = emu_bf(nrm() / sqrtf((float)D));
    const int mt = s.rows / 2, a = (int)(urand() * 64), b = 64 + (int)(urand() * std::min(64, nv - 64));
    if (s.hard == H_TIES) { /* head rows a (tile 0) and b (tile 1): identical, aligned with row mt of h1 */
        for (int k = 0; k < D; k++) {
            const float v = (k % 3 ? 3.0f : 2.0f) / sqrtf((float)D);
            W[(size_t)a * D + k] = W[(size_t)b * D + k] = emu_bf(bff(h1[(size_t)mt * ldh + k]) >= 0 ? v : -v);
        }
    }
    if (s.hard == H_INF) W[(size_t)(nv / 2) * D + D / 2] = 0x7f80;
    if (s.hard == H_ALLEQ)
        for (int r = 1; r < V; r++) memcpy(&W[(size_t)r * D], W, (size_t)D * 2);

    /* the tiles and meta_rows by cuda_lm_quantize's kernel, after what its launcher does (the last tile zeroed) */
    const size_t tb = cuda_lm_rows_tiles_bytes(V, D);
    int8_t *Wt = (int8_t *)aligned_alloc(1024, (tb + 1023) / 1024 * 1024);
    float *meta = (float *)aligned_alloc(64, (size_t)V * 16 + 64);
    memset(Wt, 0x5a, tb);
    for (int i = 0; i < 4 * V; i++) meta[i] = NAN;
    if (V % 64) memset(Wt + (size_t)(V / 64) * 64 * D, 0, (size_t)64 * D);
    emu_launch(dim3((unsigned)((V + 7) / 8)), 256, 0, 1,
               [&] { lm_quantize_bf16(W, V, D, nullptr, nullptr, nullptr, Wt, meta); });
    std::vector<int8_t> q((size_t)V * D);
    int bad_q = 0, bad_m = 0;
    for (int r = 0; r < V; r++) {
        float sc;
        host_quant(W + (size_t)r * D, D, &q[(size_t)r * D], &sc);
        double e2 = 0, l1 = 0;
        bool fin = true;
        for (int k = 0; k < D; k++) {
            bad_q += Wt[swz128_tile_off(r, k, D, 64)] != q[(size_t)r * D + k];
            const double wv = bff(W[(size_t)r * D + k]), dq = (double)sc * q[(size_t)r * D + k];
            fin &= std::isfinite(wv);
            e2 += (wv - dq) * (wv - dq), l1 += fabs(dq);
        }
        bad_m += meta[4 * r] != sc ||
                 (fin ? !(meta[4 * r + 1] >= sqrt(e2) && meta[4 * r + 2] >= l1) : !(meta[4 * r + 1] == INFINITY));
    }
    for (int r = V; r < (V + 63) / 64 * 64; r++) /* the last tile's rows past V read as zeros */
        for (int k = 0; k < D; k++) bad_q += Wt[swz128_tile_off(r, k, D, 64)] != 0;
    check(bad_q == 0, "the tiles Wt: q = rint(w / sc) at swz128_tile_off, the padding zero");
    check(bad_m == 0, "meta_rows: sc and bounds covering the quantization");

    /* the workspace zeroed once; the launcher's refusals first (nothing may run) */
    check(cuda_lm_rows_ok(V, D) == 1, "cuda_lm_rows_ok");
    const size_t wsb = cuda_lm_rows_ws_bytes(V, D), guard = 65536; /* past the workspace: must stay untouched */
    uint8_t *ws = (uint8_t *)aligned_alloc(1024, (wsb + guard + 1023) / 1024 * 1024);
    memset(ws, 0, wsb);
    memset(ws + wsb, 0xa7, guard);
    std::vector<float> y((size_t)s.rows * V);
    std::vector<int32_t> out(s.rows);
    LmRowsParams p;
    memset(&p, 0, sizeof p);
    p.h = h1.data(), p.rows = s.rows, p.ldh = ldh, p.W = W, p.Wt = Wt, p.meta = meta, p.V = V, p.D = D;
    p.n_valid = nv, p.ws = ws, p.y = y.data(), p.out = out.data(), p.n_sm = s.n_sm;
    {
        CudaLaunch l = {0, 1, NULL, 0};
        const long ctas = emu_ctas;
        LmRowsParams b = p;
        int refused = 0;
        b.rows = 0, refused += cuda_lm_rows(&b, &l) == (int)cudaErrorInvalidValue, b = p;
        b.rows = LSR_ROWS + 1, refused += cuda_lm_rows(&b, &l) == (int)cudaErrorInvalidValue, b = p;
        b.n_valid = V + 1, refused += cuda_lm_rows(&b, &l) == (int)cudaErrorInvalidValue, b = p;
        b.ws = (char *)ws + 8, refused += cuda_lm_rows(&b, &l) == (int)cudaErrorInvalidValue, b = p;
        b.D = D + 64, b.ldh = ldh + 64, refused += cuda_lm_rows(&b, &l) == (int)cudaErrorInvalidValue, b = p;
        check(refused == 5 && emu_ctas == ctas, "cuda_lm_rows refuses bad arguments before launching");
    }

    const CallResult r1 = run_call(s, p, h1.data(), q, "call 1");
    /* the cases' premises: the tie is row mt's max (a wins over b by its id); +inf logits win */
    if (s.hard == H_TIES) check(r1.out[mt] == a, "the first tied head row is the tied row's pick");
    if (s.hard == H_INF) {
        int bad = 0;
        for (int m = 0; m < s.rows; m++) bad += bff(h1[(size_t)m * ldh + D / 2]) > 0.0f && r1.out[m] != nv / 2;
        check(bad == 0, "the head row with +inf logits is the pick of the rows that give them");
    }
    if (s.again) {
        run_call(s, p, h2.data(), q, "call 2 (rows -h / 4)");
        const CallResult r3 = run_call(s, p, h1.data(), q, "call 3 (call 1's rows)");
        check(r3.out == r1.out && r3.uni == r1.uni && r3.count == r1.count, "call 3 = call 1 (picks and union)");
    }
    bool guard_ok = true;
    for (size_t i = 0; i < guard; i++) guard_ok &= ws[wsb + i] == 0xa7;
    check(guard_ok, "the bytes past the workspace untouched");
    printf("    (%.1f s)\n", (double)clock() / CLOCKS_PER_SEC - t0);
    free(W), free(Wt), free(meta), free(ws);
}

int main(int argc, char **argv) {
    emu_rs = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL) * 2654435761ull + 1;
    printf("LM head rows screen (src/cuda/lm_screen_rows.cu: prep, s8 wgmma screen, pick) under the CUDA emulation, "
           "seed %llu\n",
           (unsigned long long)emu_rs);
    emu_wg_install();
    { /* the push test U >= lsr_thr(bar) keeps every pair rbf(U) >= rbf(bar) keeps: bars and U near bf16 values,
       * midpoints, zeros, subnormals, infinities */
        g_case = "lsr_thr";
        const float sp[] = {0.0f,  -0.0f,      0x1p-133f,   -0x1p-133f, 0x1p-126f, 1.0f,
                            -1.0f, 3.3895e38f, -3.3895e38f, INFINITY,   -INFINITY};
        int bad = 0, n = 0;
        for (int i = 0; i < 400000; i++) {
            float bar = i < 121 ? sp[i % 11] : ldexpf(nrm(), (int)(urand() * 60) - 30);
            float u = i < 121 ? sp[i / 11] : bar;
            if (i >= 121) { /* U a few float ulps or bf16 half-ulps around bar */
                const uint32_t ub = __float_as_uint(bar) + (uint32_t)((int)(urand() * 0x20000) - 0x10000);
                u = urand() < 0.5f ? __uint_as_float(ub) : nextafterf(bar, urand() < 0.5f ? INFINITY : -INFINITY);
                if (u != u) continue;
            }
            const bool keep = rbf(u) >= rbf(bar);
            n += keep;
            bad += keep && !(u >= lsr_thr(bar));
        }
        check(bad == 0 && n > 1000, "U >= lsr_thr(bar) wherever rbf(U) >= rbf(bar)");
    }
    /* small: the emulation takes ~1.5 s for a call of 64 rows (prep's 64 CTAs, pick's CTA a row) and ~0.5 s for the
     * quantization of 136 head rows */
    const Shape shapes[] = {
        {136, 133, 128, 1, 1, H_RAND, false},   /* one row, a ragged last tile */
        {328, 325, 512, 7, 1, H_RAND, true},    /* 6 tiles of 4 pieces in one CTA: each ring (8 slots) wraps */
        {456, 450, 512, 24, 1, H_RAND, false},  /* X of 32 rows, 8 tiles in one CTA: each ring wraps twice */
        {200, 197, 384, 64, 2, H_RAND, true},   /* 3 pieces a tile */
        {256, 256, 256, 40, 4, H_RAND, false},  /* n_valid = V = 64 k, a tile a CTA */
        {136, 130, 1024, 64, 2, H_RAND, false}, /* the largest D (T's exact range the tightest); rings of 5 slots wrap */
        {136, 133, 256, 16, 2, H_SPIKE, false},
        {136, 131, 256, 24, 2, H_TIES, false}, /* the tied rows in tiles 0 and 1 (CTAs 0 and 1) */
        {136, 133, 128, 7, 2, H_NAN, false},
        {136, 133, 256, 7, 1, H_ZERO, false},
        {136, 133, 256, 33, 3, H_INF, false},
        {136, 130, 128, 64, 2, H_ALLEQ, true}, /* 64 x 64 pairs a tile: every CTA's list overflows */
    };
    for (const Shape &s : shapes) run_case(s);
    printf("lm_screen_rows_emu: %d passed, %d failed\n", checks - fails, fails);
    return fails ? 1 : 0;
}
