/* serve_emu.cpp — the batched step's kernels (src/cuda/serve_kernels.cu, pulled in as sv_kernels.inc by run_serve.sh)
 * under the host emulation of emu.h (one CTA at a time, shared memory starting as garbage), against CPU references.
 * For machines without a GPU: checks the paging (block tables, per-row positions), the per-row / per-slot indexing
 * and the math, not speed. Checked, with rows of a 3-token prefill chunk, two decode rows and a new sequence:
 *   paged_prep: q out and the K/V rows written within 2 bf16 steps of a float reference with HF's rounding points;
 *     every other pool entry unchanged (bitwise);
 *   paged_attn: each row over its own positions 0 .. pos through its block table, within 2e-4 max |o| + 1.5 bf16
 *     steps of a double reference, gated and not, with 1, 2, 4 and 8 query heads per kv head (a 1 % score scale
 *     error fails, and so do probabilities rounded to bf16 without their lo term); and over several splits (rows of
 *     1 .. 1100 positions, block sizes 7 and 16, hd 96 / 128 / 256), each row also bit for bit equal to the same row
 *     computed alone (batch invariance); a too small workspace is refused;
 *   dn_batch_step (prep + either state pass; the whole-head pass with 1, 2 and 64 CTAs streaming the heads through
 *     its ring of bulk copies) + gated norm: o, S and y of four decode rows on their slots (one new at
 *     position 0, three with history) within bounds of a double reference; the ring row written bitwise; the
 *     fifth slot and the other rows untouched; the same with bf16 states (the whole-head pass; refused on others);
 *   gather: bitwise;
 *   rows_argmax: over 3 chunks, ties within and across chunks (the smallest index), past n_valid ignored, all NaN: 0.
 * Exit 1 on a failed bound. Usage: serve_emu [seed]. */
// clang-format off
#define EMU_NO_SILU
#include "emu.h"
#undef __host__
#define __host__
#include "cuda/serve_ops.h"
// clang-format on

#include "emu_common.h"
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_bar(); }
// clang-format off
#include "sv_common.inc"   /* bf_lo .. ceil_div from src/cuda/common.cuh */
#include "sv_deltanet.inc" /* src/cuda/deltanet.cuh */
#include "sv_attn_prep.inc" /* src/cuda/attn_prep.cuh */
#include "sv_kernels.inc"  /* src/cuda/serve_kernels.cu */
// clang-format on

static int fails;
static void check(bool ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        fails++;
    }
}
static uint16_t *bfv(size_t n, float sc) {
    uint16_t *p = (uint16_t *)aligned_alloc(64, ((n * 2 + 63) / 64) * 64);
    for (size_t i = 0; i < n; i++) p[i] = emu_bf(sc * nrm());
    return p;
}
static float *fv(size_t n, float mean, float sc) {
    float *p = (float *)aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
    for (size_t i = 0; i < n; i++) p[i] = rbf(mean + sc * nrm());
    return p;
}
static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* e4m3 (fp8 KV pools), independently of the kernels' bit manipulation: the value of a code, and the code nearest to x
 * by a search over every finite code (ties: the even code, i.e. even mantissa), |x| beyond 448 saturated */
static float e4m3_val(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const float v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    return (c & 0x80) ? -v : v;
}
static uint8_t e4m3_nearest(float x) {
    const float a = fabsf(x);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const float d = fabsf(e4m3_val((uint8_t)c) - a), db = fabsf(e4m3_val((uint8_t)best) - a);
        if (d < db || (d == db && !(c & 1))) best = c;
    }
    return (uint8_t)((x < 0 ? 0x80 : 0) | best);
}
/* n random finite e4m3 codes of values within +-sc (roughly) */
static uint8_t *e4v(size_t n, float sc) {
    uint8_t *p = (uint8_t *)aligned_alloc(64, ((n + 63) / 64) * 64);
    for (size_t i = 0; i < n; i++) p[i] = e4m3_nearest(sc * nrm());
    return p;
}

/* ---- attention ------------------------------------------------------------------------------------------------- */

static void attn_case(int hd, int gated, int norm_mode, int sub, int Hq, int Hkv) {
    const int R = gated ? hd / 4 : hd, block = 4, n_blocks = 12, T = 5;
    const int q_hs = gated ? 2 * hd : hd, nq = Hq * q_hs, ld = nq + 2 * Hkv * hd + 8;
    /* rows: sequence A (cached 0..4) positions 5, 6, 7; B (cached 0..8) position 9; C new, position 0 */
    const int pos[T] = {5, 6, 7, 9, 0}, tab[T] = {0, 0, 0, 2, 5};
    const int tables[6] = {7, 2, 0, 9, 4, 11};
    const size_t pool_n = (size_t)n_blocks * Hkv * block * hd;
    uint16_t *qkv = bfv((size_t)T * ld, 1.0f), *kp = bfv(pool_n, 1.0f), *vp = bfv(pool_n, 1.0f);
    uint16_t *k0 = (uint16_t *)malloc(pool_n * 2), *v0 = (uint16_t *)malloc(pool_n * 2);
    memcpy(k0, kp, pool_n * 2), memcpy(v0, vp, pool_n * 2);
    float *qn = fv(hd, norm_mode == NORM_ZC ? 0.0f : 1.0f, 0.2f),
          *kn = fv(hd, norm_mode == NORM_ZC ? 0.0f : 1.0f, 0.2f);
    float *inv = (float *)malloc(sizeof(float) * (R / 2));
    for (int i = 0; i < R / 2; i++) inv[i] = (float)(1.0 / pow(1e7, 2.0 * i / R));
    uint16_t *qo = (uint16_t *)malloc((size_t)T * Hq * hd * 2), *out = (uint16_t *)malloc((size_t)T * Hq * hd * 2);
    memset(qo, 0xff, (size_t)T * Hq * hd * 2);
    memset(out, 0xff, (size_t)T * Hq * hd * 2);
    const CudaLaunch lc = {0, 0, NULL, 0};
    PagedPrepParams pp = {qkv, ld,     q_hs, nq, nq + Hkv * hd, qn, kn, inv,   qo,        kp,   vp, pos,
                          tab, tables, T,    Hq, Hkv,           hd, R,  block, norm_mode, 1e-6f};
    check(cuda_paged_prep(&pp, &lc) == 0, "paged_prep launch");

    /* prep reference: norm + rope of q heads and k heads; V copied */
    int bad_q = 0, bad_k = 0, bad_v = 0, bad_pool = 0;
    std::vector<char> written(pool_n, 0);
    for (int t = 0; t < T; t++) {
        for (int u = 0; u < Hq + Hkv; u++) {
            const bool is_q = u < Hq;
            const uint16_t *src = qkv + (size_t)t * ld + (is_q ? u * q_hs : nq + (u - Hq) * hd);
            const float *w = is_q ? qn : kn;
            double ss = 0;
            for (int e = 0; e < hd; e++) ss += (double)bff(src[e]) * bff(src[e]);
            const float r = 1.0f / sqrtf((float)(ss / hd) + 1e-6f);
            std::vector<float> x(hd), y(hd);
            for (int e = 0; e < hd; e++) {
                const float xv = bff(src[e]);
                x[e] = norm_mode == NORM_ZC ? rbf(xv * r * (1.0f + w[e])) : rbf(w[e] * rbf(xv * r));
            }
            for (int e = 0; e < hd; e++) {
                y[e] = x[e];
                if (e < R) {
                    const int h2 = R / 2, f = e < h2 ? e : e - h2;
                    float sn, cs;
                    sincosf((float)pos[t] * inv[f], &sn, &cs);
                    const float c = rbf(cs), s = rbf(sn);
                    y[e] = e < h2 ? rbf(rbf(x[e] * c) - rbf(x[e + h2] * s)) : rbf(rbf(x[e] * c) + rbf(x[e - h2] * s));
                }
            }
            for (int e = 0; e < hd; e++) {
                float got;
                if (is_q) {
                    got = bff(qo[((size_t)t * Hq + u) * hd + e]);
                } else {
                    const int i = u - Hq, b = tables[tab[t] + pos[t] / block];
                    const size_t off = (((size_t)b * Hkv + i) * block + pos[t] % block) * hd + e;
                    got = bff(kp[off]);
                    written[off] = 1;
                    const uint16_t *vs = qkv + (size_t)t * ld + nq + Hkv * hd + i * hd;
                    bad_v += vp[off] != vs[e];
                }
                const bool ok = fabsf(got - y[e]) <= 2.0f / 128 * fabsf(y[e]) + 1e-6f;
                if (!ok && bad_q + bad_k < 4)
                    fprintf(stderr, "  prep row %d unit %d e %d: got %g ref %g\n", t, u, e, got, y[e]);
                (is_q ? bad_q : bad_k) += !ok;
            }
        }
    }
    for (size_t i = 0; i < pool_n; i++)
        if (!written[i]) bad_pool += kp[i] != k0[i] || vp[i] != v0[i];
    check(bad_q == 0 && bad_k == 0 && bad_v == 0, "paged_prep values");
    check(bad_pool == 0, "paged_prep wrote outside its rows");

    /* gather: sequence A (8 positions, table at 0) and B (10 positions, table at 2) into contiguous caches */
    int bad_g = 0;
    for (int sq = 0; sq < 2; sq++) {
        const int len = sq ? 10 : 8, stride = 12;
        uint16_t *kc = (uint16_t *)aligned_alloc(64, (size_t)Hkv * stride * hd * 2);
        uint16_t *vc = (uint16_t *)aligned_alloc(64, (size_t)Hkv * stride * hd * 2);
        PagedGatherParams gp = {kp, vp, tables + (sq ? 2 : 0), kc, vc, len, stride, Hkv, hd, block};
        check(cuda_paged_gather(&gp, &lc) == 0, "paged_gather launch");
        for (int i = 0; i < Hkv; i++)
            for (int s = 0; s < len; s++) {
                const size_t off = (((size_t)tables[(sq ? 2 : 0) + s / block] * Hkv + i) * block + s % block) * hd;
                bad_g += memcmp(kc + ((size_t)i * stride + s) * hd, kp + off, (size_t)hd * 2) != 0;
                bad_g += memcmp(vc + ((size_t)i * stride + s) * hd, vp + off, (size_t)hd * 2) != 0;
            }
        free(kc), free(vc);
    }
    check(bad_g == 0, "paged_gather rows");

    /* fp8 pools (PagedPrepParams.kv_fp8): the same prep into e4m3 pools stores e4m3(the bf16 path's K / V) and q as
     * before; gather widens them exactly into bf16 caches; scatter rounds a cache's bf16 values to nearest even */
    int bad8 = 0;
    {
        uint8_t *kp8 = (uint8_t *)aligned_alloc(64, (pool_n + 63) / 64 * 64),
                *vp8 = (uint8_t *)aligned_alloc(64, (pool_n + 63) / 64 * 64);
        memset(kp8, 0x5a, pool_n), memset(vp8, 0x5a, pool_n);
        std::vector<uint16_t> qo1(qo, qo + (size_t)T * Hq * hd);
        PagedPrepParams p8 = pp;
        p8.k_pool = kp8, p8.v_pool = vp8, p8.kv_fp8 = 1;
        check(cuda_paged_prep(&p8, &lc) == 0, "paged_prep (fp8) launch");
        bad8 += memcmp(qo1.data(), qo, qo1.size() * 2) != 0;
        for (size_t i = 0; i < pool_n; i++) {
            if (!written[i]) {
                bad8 += kp8[i] != 0x5a || vp8[i] != 0x5a;
                continue;
            }
            bad8 += kp8[i] != e4m3_nearest(bff(kp[i])) || vp8[i] != e4m3_nearest(bff(vp[i]));
        }
        check(bad8 == 0, "paged_prep (fp8) codes");
        const int len = 8, stride = 12;
        uint16_t *kc = (uint16_t *)aligned_alloc(64, (size_t)Hkv * stride * hd * 2);
        uint16_t *vc = (uint16_t *)aligned_alloc(64, (size_t)Hkv * stride * hd * 2);
        for (size_t i = 0; i < pool_n; i++) /* every code finite: the rows gathered are all in the pools */
            if (!written[i]) kp8[i] = e4m3_nearest(nrm()), vp8[i] = e4m3_nearest(nrm());
        PagedGatherParams g8 = {kp8, vp8, tables, kc, vc, len, stride, Hkv, hd, block, 0, 0, 1};
        check(cuda_paged_gather(&g8, &lc) == 0, "paged_gather (fp8) launch");
        int bad_g8 = 0;
        for (int i = 0; i < Hkv; i++)
            for (int s2 = 0; s2 < len; s2++)
                for (int e = 0; e < hd; e++) {
                    const size_t off = (((size_t)tables[s2 / block] * Hkv + i) * block + s2 % block) * hd + e;
                    const size_t co = ((size_t)i * stride + s2) * hd + e;
                    bad_g8 += bff(kc[co]) != e4m3_val(kp8[off]) || bff(vc[co]) != e4m3_val(vp8[off]);
                }
        /* scatter: positions 3 .. len-1 of caches holding arbitrary bf16 values (some past 448: saturated) */
        for (size_t i = 0; i < (size_t)Hkv * stride * hd; i++) kc[i] = emu_bf(300.0f * nrm()), vc[i] = emu_bf(nrm());
        g8.start = 3, g8.scatter = 1;
        check(cuda_paged_gather(&g8, &lc) == 0, "paged_gather (fp8 scatter) launch");
        for (int i = 0; i < Hkv; i++)
            for (int s2 = 3; s2 < len; s2++)
                for (int e = 0; e < hd; e++) {
                    const size_t off = (((size_t)tables[s2 / block] * Hkv + i) * block + s2 % block) * hd + e;
                    const size_t co = ((size_t)i * stride + s2) * hd + e;
                    bad_g8 += kp8[off] != e4m3_nearest(bff(kc[co])) || vp8[off] != e4m3_nearest(bff(vc[co]));
                }
        check(bad_g8 == 0, "paged_gather (fp8) rows");
        bad8 += bad_g8;
        free(kp8), free(vp8), free(kc), free(vc);
    }

    /* sub: only rows 4, 1, 3 (a row list); the others must stay untouched */
    const int sub_rows[3] = {4, 1, 3};
    PagedAttnParams ap = {qo,
                          kp,
                          vp,
                          gated ? qkv + hd : NULL,
                          ld,
                          2 * hd,
                          out,
                          pos,
                          tab,
                          tables,
                          sub ? sub_rows : NULL,
                          sub ? 3 : T,
                          Hq,
                          Hkv,
                          hd,
                          block,
                          1.0f / sqrtf((float)hd),
                          NULL,
                          0};
    std::vector<float> work(paged_attn_work_floats(ap.T, Hq, hd));
    check(cuda_paged_attn(&ap, &lc) == (int)cudaErrorInvalidValue, "paged_attn without work refused");
    ap.work = work.data(), ap.work_floats = work.size() - 1;
    check(cuda_paged_attn(&ap, &lc) == (int)cudaErrorInvalidValue, "paged_attn with too little work refused");
    ap.work_floats = work.size();
    check(cuda_paged_attn(&ap, &lc) == 0, "paged_attn launch");
    int bad_o = 0;
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < Hq; j++) {
            if (sub && t != 4 && t != 1 && t != 3) {
                for (int e = 0; e < hd; e++) bad_o += out[(size_t)t * Hq * hd + (size_t)j * hd + e] != 0xffff;
                continue;
            }
            const int kvh = j / (Hq / Hkv), n = pos[t] + 1;
            std::vector<double> sc(n), o(hd, 0.0);
            double mx = -1e300, l = 0;
            for (int s = 0; s < n; s++) {
                const int b = tables[tab[t] + s / block];
                const size_t off = (((size_t)b * Hkv + kvh) * block + s % block) * hd;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)bff(qo[((size_t)t * Hq + j) * hd + e]) * bff(kp[off + e]);
                sc[s] = d / sqrt((double)hd);
                mx = fmax(mx, sc[s]);
            }
            for (int s = 0; s < n; s++) l += exp(sc[s] - mx);
            double omax = 0;
            for (int s = 0; s < n; s++) {
                const int b = tables[tab[t] + s / block];
                const size_t off = (((size_t)b * Hkv + kvh) * block + s % block) * hd;
                for (int e = 0; e < hd; e++) o[e] += exp(sc[s] - mx) / l * bff(vp[off + e]);
            }
            for (int e = 0; e < hd; e++) omax = fmax(omax, fabs(o[e]));
            for (int e = 0; e < hd; e++) {
                double ref = o[e];
                if (gated)
                    ref = rbf(rbf((float)ref) * rbf((float)sigm(bff(qkv[(size_t)t * ld + j * 2 * hd + hd + e]))));
                const double got = bff(out[(size_t)t * Hq * hd + (size_t)j * hd + e]);
                const double err = fabs(got - ref);
                worst = fmax(worst, err / (omax + 1e-30));
                if (!(err <= 2e-4 * omax + 1.5 / 256 * fabs(ref))) {
                    if (bad_o < 4) fprintf(stderr, "  attn row %d head %d e %d: got %g ref %g\n", t, j, e, got, ref);
                    bad_o++;
                }
            }
        }
    check(bad_o == 0, "paged_attn values");
    printf("  attention hd %3d Hq %2d Hkv %d gate %d norm %d rows %s: prep q %d k %d v %d pool %d gather %d bad; attn "
           "%d bad (worst "
           "%.2e of max |o|); fp8 pools %d bad\n",
           hd, Hq, Hkv, gated, norm_mode, sub ? "4,1,3" : "all", bad_q, bad_k, bad_v, bad_pool, bad_g, bad_o, worst,
           bad8);
    free(qkv), free(kp), free(vp), free(k0), free(v0), free(qn), free(kn), free(inv), free(qo), free(out);
}

/* Flash-decoding splits: rows of len 1, 64 (one full split), 65 and 200 (a partial last split), 1100 (> 16 splits of
 * 64: chunk 128, 9 splits) on their own shuffled block tables, computed through a row list that skips row 4; each row
 * checked against a double reference (bound as attn_case) and, for batch invariance, bit for bit against the same row
 * computed alone (T = 1, rows = {r}). n_sm > 0: the launch's splits per row from the row count (pa_max_split: with
 * n_sm 1 one split a row, every tile of a row in one CTA), checked against the reference only (a row alone then
 * takes other splits). */
static void split_case(int hd, int Hq, int Hkv, int gated, int block, int long_len, bool kv8 = false, int n_sm = 0) {
    const int T = 6, lens[T] = {1, 64, 65, 200, 30, long_len}, list[5] = {5, 0, 3, 1, 2}, nl = 5;
    int pos[T], tab[T], nt = 0;
    for (int t = 0; t < T; t++) pos[t] = lens[t] - 1, tab[t] = nt, nt += (lens[t] + block - 1) / block;
    const int n_blocks = nt + 3;
    std::vector<int32_t> tables(nt);
    for (int i = 0; i < nt; i++) tables[i] = i;
    for (int i = nt - 1; i > 0; i--) std::swap(tables[i], tables[(int)(urand() * (i + 1)) % (i + 1)]);
    const size_t pool_n = (size_t)n_blocks * Hkv * block * hd;
    const int gate_ld = Hq * 2 * hd;
    uint16_t *kp = bfv(pool_n, 1.0f), *vp = bfv(pool_n, 1.0f), *q = bfv((size_t)T * Hq * hd, 2.0f);
    /* kv8: the pools as e4m3 codes (PagedAttnParams.kv_fp8); the reference reads their values */
    uint8_t *kp8 = kv8 ? e4v(pool_n, 1.0f) : NULL, *vp8 = kv8 ? e4v(pool_n, 1.0f) : NULL;
    auto kval = [&](size_t i) { return kv8 ? (double)e4m3_val(kp8[i]) : (double)bff(kp[i]); };
    auto vval = [&](size_t i) { return kv8 ? (double)e4m3_val(vp8[i]) : (double)bff(vp[i]); };
    uint16_t *gate = bfv((size_t)T * gate_ld, 1.0f);
    const size_t on = (size_t)T * Hq * hd;
    std::vector<uint16_t> out(on, 0xffff), out1(on, 0xffff);
    const CudaLaunch lc = {0, 0, NULL, 0};
    std::vector<float> work(paged_attn_work_floats(nl, Hq, hd));
    PagedAttnParams ap = {q,
                          kp,
                          vp,
                          gated ? gate + hd : NULL,
                          gate_ld,
                          2 * hd,
                          out.data(),
                          pos,
                          tab,
                          tables.data(),
                          list,
                          nl,
                          Hq,
                          Hkv,
                          hd,
                          block,
                          1.0f / sqrtf((float)hd),
                          work.data(),
                          work.size(),
                          1}; /* early: one row per sequence, its earlier positions written before */
    if (kv8) ap.k_pool = kp8, ap.v_pool = vp8, ap.kv_fp8 = 1;
    ap.n_sm = n_sm;
    check(cuda_paged_attn(&ap, &lc) == 0, "paged_attn (splits) launch");
    int bad_o = 0, bad_inv = 0, bad_other = 0;
    double worst = 0;
    for (int k = 0; k < nl && !n_sm; k++) { /* the same row alone */
        PagedAttnParams a1 = ap;
        a1.rows = list + k, a1.T = 1, a1.out = out1.data();
        check(cuda_paged_attn(&a1, &lc) == 0, "paged_attn (one row) launch");
        const size_t o0 = (size_t)list[k] * Hq * hd;
        bad_inv += memcmp(out.data() + o0, out1.data() + o0, (size_t)Hq * hd * 2) != 0;
    }
    for (int e = 0; e < Hq * hd; e++) bad_other += out[(size_t)4 * Hq * hd + e] != 0xffff;
    int gb = 8; /* the launcher's heads per CTA: the largest divisor of Hq / Hkv up to PA_GB */
    while ((Hq / Hkv) % gb) gb--;
    for (int k = 0; k < nl; k++) {
        const int t = list[k], n = lens[t];
        for (int j = 0; j < Hq; j++) {
            const int kvh = j / (Hq / Hkv);
            std::vector<double> sc(n), o(hd, 0.0);
            double mx = -1e300, l = 0, omax = 0;
            for (int s = 0; s < n; s++) {
                const size_t off = (((size_t)tables[tab[t] + s / block] * Hkv + kvh) * block + s % block) * hd;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)bff(q[((size_t)t * Hq + j) * hd + e]) * kval(off + e);
                sc[s] = d / sqrt((double)hd);
                mx = fmax(mx, sc[s]);
            }
            for (int s = 0; s < n; s++) l += exp(sc[s] - mx);
            for (int s = 0; s < n; s++) {
                const size_t off = (((size_t)tables[tab[t] + s / block] * Hkv + kvh) * block + s % block) * hd;
                for (int e = 0; e < hd; e++) o[e] += exp(sc[s] - mx) / l * vval(off + e);
            }
            for (int e = 0; e < hd; e++) omax = fmax(omax, fabs(o[e]));
            for (int e = 0; e < hd; e++) {
                double ref = o[e];
                if (gated)
                    ref = rbf(rbf((float)ref) * rbf((float)sigm(bff(gate[(size_t)t * gate_ld + j * 2 * hd + hd + e]))));
                const double got = bff(out[(size_t)t * Hq * hd + (size_t)j * hd + e]), err = fabs(got - ref);
                worst = fmax(worst, err / (omax + 1e-30));
                if (!(err <= 2e-4 * omax + 1.5 / 256 * fabs(ref))) {
                    if (bad_o < 4)
                        fprintf(stderr, "  split attn row %d head %d e %d: got %g ref %g\n", t, j, e, got, ref);
                    bad_o++;
                }
            }
        }
    }
    check(bad_o == 0, "paged_attn (splits) values");
    check(bad_inv == 0, "paged_attn row alone != row in the batch");
    check(bad_other == 0, "paged_attn (splits) wrote a row outside its list");
    printf("  attention splits%s hd %3d Hq %2d Hkv %d gate %d block %2d lens 1,64,65,200,%d, %d splits a row at most: "
           "%d bad (worst %.2e of max |o|), %d rows differ alone%s, %d other\n",
           kv8 ? " (fp8 pools)" : "", hd, Hq, Hkv, gated, block, long_len,
           n_sm ? pa_max_split(nl, Hq / gb, n_sm) : PA_MAX_SPLIT, bad_o, worst, bad_inv,
           n_sm ? " (not compared: alone, a row takes other splits)" : "", bad_other);
    free(kp), free(vp), free(q), free(gate), free(kp8), free(vp8);
}

/* ---- DeltaNet step over slots ---------------------------------------------------------------------------------- */

/* Four decode rows (of six) on four of five slots: a new sequence at position 0 on a zeroed slot, one at position 2
 * (the ring's oldest row is from position -1: the kernel reads it as it is, so does the reference), two with long
 * histories; slot 1 and rows 0, 2 must stay untouched. ba_k > 0: prep computes b and a from rows h [T][ba_k] and
 * weights [2 Hv][ba_k] (DnBatchParams.ba_w), proj's b / a columns NaN; h and w are multiples of 1/4 and 1/8 up to 2
 * and 1/4, so every sum is exact in any order and the reference's b / a are the kernel's bit for bit (a wrong row,
 * head or weight row moves beta and decay by far more than o's bound). bf16: the slots' states are bf16
 * (DnBatchParams.state_bf16; the whole-head pass only, other shapes refused): read exactly, the new state within
 * one rounding to nearest of the reference (|err| <= |ref| / 256 plus fp32 slack, where truncation may be off by
 * |ref| / 128). early: prep sums the conv history before its PDL wait (DnBatchParams.early), into shared memory. */
static void dn_case(int Hk, int Hv, int dk, int dv, int n_sm = 2, int ba_k = 0, bool bf16 = false, bool early = false,
                    int nd = 4, bool alone = false) {
    const int K = 4, T = nd + 2, n_slots = nd + 1;
    const int key_dim = Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;
    const int ld = conv_dim + value_dim + 2 * Hv + 8;
    const size_t es = bf16 ? 2 : 4; /* bytes per state entry */
    const size_t S_n = (size_t)Hv * dk * dv, S_b = ((S_n * es + 255) / 256) * 256, ring_n = (size_t)K * conv_dim;
    const size_t stride = S_b + ((ring_n * 2 + 255) / 256) * 256;
    /* rows 1, 3, 4, 5 on slots 2, 0, 4, 3 as above; rows 6 .. on slots 5 .. at positions 3 .. */
    std::vector<int> rows(nd), slot(nd), pos(T);
    const int rows4[4] = {1, 3, 4, 5}, slot4[4] = {2, 0, 4, 3}, pos6[6] = {-1, 5, -1, 0, 2, 9};
    for (int i = 0; i < nd; i++) rows[i] = i < 4 ? rows4[i] : i + 2, slot[i] = i < 4 ? slot4[i] : i + 1;
    for (int r = 0; r < T; r++) pos[r] = r < 6 ? pos6[r] : r - 3;
    uint16_t *proj = bfv((size_t)T * ld, 1.0f), *projr = (uint16_t *)malloc((size_t)T * ld * 2); /* the reference's */
    memcpy(projr, proj, (size_t)T * ld * 2);
    uint16_t *hx = NULL, *wba = NULL;
    if (ba_k > 0) {
        hx = (uint16_t *)aligned_alloc(64, ((size_t)T * ba_k * 2 + 63) / 64 * 64);
        wba = (uint16_t *)aligned_alloc(64, ((size_t)2 * Hv * ba_k * 2 + 63) / 64 * 64);
        for (size_t i = 0; i < (size_t)T * ba_k; i++) hx[i] = emu_bf((float)(rand() % 17 - 8) / 4.0f);
        for (size_t i = 0; i < (size_t)2 * Hv * ba_k; i++) wba[i] = emu_bf((float)(rand() % 5 - 2) / 8.0f);
        for (int r = 0; r < T; r++)
            for (int j = 0; j < 2 * Hv; j++) {
                double d = 0;
                for (int c = 0; c < ba_k; c++)
                    d += (double)bff(hx[(size_t)r * ba_k + c]) * bff(wba[(size_t)j * ba_k + c]);
                projr[(size_t)r * ld + conv_dim + value_dim + j] = emu_bf((float)d);
                proj[(size_t)r * ld + conv_dim + value_dim + j] = 0x7fc0; /* NaN: prep must not read them */
            }
    }
    float *conv_w = fv((size_t)conv_dim * K, 0.0f, 0.5f), *A_log = fv(Hv, 0.0f, 0.5f), *dt_bias = fv(Hv, 0.0f, 0.5f);
    float *nw = fv(dv, 1.0f, 0.2f);
    char *slots = (char *)aligned_alloc(256, stride * n_slots);
    for (int s = 0; s < n_slots; s++) {
        float *S = (float *)(slots + s * stride);
        uint16_t *ring = (uint16_t *)(slots + s * stride + S_b);
        for (size_t i = 0; i < S_n; i++) {
            const float v = s == 0 ? 0.0f : 0.1f * nrm();
            if (bf16)
                ((uint16_t *)S)[i] = emu_bf(v);
            else
                S[i] = v;
        }
        for (size_t i = 0; i < ring_n; i++) ring[i] = s == 0 ? 0 : emu_bf(nrm());
    }
    char *slots0 = (char *)malloc(stride * n_slots);
    memcpy(slots0, slots, stride * n_slots);
    uint16_t *o = (uint16_t *)malloc((size_t)T * value_dim * 2), *y = (uint16_t *)malloc((size_t)T * value_dim * 2);
    memset(o, 0xff, (size_t)T * value_dim * 2);
    memset(y, 0xff, (size_t)T * value_dim * 2);
    const size_t ws_b = cuda_dn_batch_ws_bytes(nd, Hk, Hv, dk, dv);
    float *ws = (float *)aligned_alloc(64, (ws_b + 63) / 64 * 64);
    memset(ws, 0xff, ws_b); /* NaN: every value the state pass reads must have been written by the prep pass */
    const CudaLaunch lc = {0, 0, NULL, 0};
    DnBatchParams bp = {proj,
                        ld,
                        conv_w,
                        A_log,
                        dt_bias,
                        (float *)slots,
                        (uint16_t *)(slots + S_b),
                        stride,
                        rows.data(),
                        slot.data(),
                        pos.data(),
                        o,
                        ws,
                        nd,
                        Hk,
                        Hv,
                        dk,
                        dv,
                        K};
    bp.n_sm = n_sm;
    bp.norm_w = nw, bp.y = y, bp.z_off = conv_dim, bp.eps = 1e-6f; /* the gated norm too (in the pass, or after it) */
    if (ba_k > 0) bp.ba_w = wba, bp.ba_x = hx, bp.ba_k = ba_k;
    bp.state_bf16 = bf16;
    bp.early = early;
    if (bf16 && !(dv == 128 && dk <= 128 && dk % 2 == 0)) { /* the column-slice pass keeps fp32 states only */
        check(cuda_dn_batch_step(&bp, &lc) != 0, "dn_batch_step with bf16 states on a column-slice shape refused");
        printf("  deltanet Hk %d Hv %d dk %3d dv %3d, bf16 states: refused\n", Hk, Hv, dk, dv);
        free(projr), free(hx), free(wba);
        free(proj), free(conv_w), free(A_log), free(dt_bias), free(nw), free(slots), free(slots0), free(o), free(y);
        free(ws);
        return;
    }
    check(cuda_dn_batch_step(&bp, &lc) == 0, "dn_batch_step launch");
    /* entry k of the state at base (fp32, or bf16 with bf16) */
    auto sv = [&](const char *base, size_t k) -> double {
        return bf16 ? (double)bff(((const uint16_t *)base)[k]) : (double)((const float *)base)[k];
    };

    int bad_o = 0, bad_S = 0, bad_y = 0, bad_ring = 0, bad_other = 0;
    double err_o = 0, err_S = 0, err_y = 0; /* max |got - ref| / max |ref| of the head */
    for (int i = 0; i < nd; i++) {
        const int r = rows[i], p = pos[r], rc = p % K;
        const uint16_t *m = projr + (size_t)r * ld;
        const char *S0 = slots0 + slot[i] * stride;
        const uint16_t *ring0 = (const uint16_t *)(slots0 + slot[i] * stride + S_b);
        const char *S1 = slots + slot[i] * stride;
        const uint16_t *ring1 = (const uint16_t *)(slots + slot[i] * stride + S_b);
        std::vector<double> c(conv_dim);
        for (int ch = 0; ch < conv_dim; ch++) {
            double h = 0;
            for (int j = 0; j < K - 1; j++)
                h += (double)conv_w[ch * K + j] * bff(ring0[((rc + 1 + j) % K) * conv_dim + ch]);
            const float cv = rbf((float)(h + (double)conv_w[ch * K + K - 1] * bff(m[ch])));
            c[ch] = rbf((float)(cv * sigm(cv)));
        }
        for (int ch = 0; ch < conv_dim; ch++) bad_ring += ring1[rc * conv_dim + ch] != m[ch];
        for (int rr = 0; rr < K; rr++)
            if (rr != rc)
                for (int ch = 0; ch < conv_dim; ch++)
                    bad_ring += ring1[rr * conv_dim + ch] != ring0[rr * conv_dim + ch];
        for (int j = 0; j < Hv; j++) {
            const int n = j / (Hv / Hk);
            double sq = 0, sk = 0;
            for (int d = 0; d < dk; d++)
                sq += c[n * dk + d] * c[n * dk + d], sk += c[key_dim + n * dk + d] * c[key_dim + n * dk + d];
            const double rq = 1.0 / sqrt(sq + 1e-6) / sqrt((double)dk), rk = 1.0 / sqrt(sk + 1e-6);
            const double beta = rbf((float)sigm(bff(m[conv_dim + value_dim + j])));
            const double xa = bff(m[conv_dim + value_dim + Hv + j]) + dt_bias[j];
            const double decay = exp(-exp((double)A_log[j]) * (xa > 20 ? xa : log1p(exp(xa))));
            std::vector<double> ov(dv), Sn((size_t)dk * dv);
            double omax = 0, smax = 0, ss = 0, eo = 0, es = 0;
            for (int e = 0; e < dv; e++) {
                double mem = 0, qs = 0;
                for (int d = 0; d < dk; d++) {
                    const double s = sv(S0, ((size_t)j * dk + d) * dv + e);
                    mem += s * c[key_dim + n * dk + d] * rk;
                    qs += s * c[n * dk + d] * rq;
                }
                const double v = c[2 * key_dim + j * dv + e];
                const double delta = beta * (v - decay * mem);
                double kq = 0;
                for (int d = 0; d < dk; d++) kq += c[n * dk + d] * rq * c[key_dim + n * dk + d] * rk;
                ov[e] = decay * qs + delta * kq;
                omax = fmax(omax, fabs(ov[e]));
                for (int d = 0; d < dk; d++) {
                    Sn[(size_t)d * dv + e] =
                        decay * sv(S0, ((size_t)j * dk + d) * dv + e) + c[key_dim + n * dk + d] * rk * delta;
                    smax = fmax(smax, fabs(Sn[(size_t)d * dv + e]));
                }
            }
            for (int e = 0; e < dv; e++) {
                const double got = bff(o[(size_t)r * value_dim + j * dv + e]);
                eo = fmax(eo, fabs(got - ov[e]));
                if (!(fabs(got - ov[e]) <= 1e-3 * omax + 1.0 / 256 * fabs(ov[e]))) {
                    if (bad_o < 4) fprintf(stderr, "  o row %d head %d e %d: got %g ref %g\n", r, j, e, got, ov[e]);
                    bad_o++;
                }
                ss += got * got;
                for (int d = 0; d < dk; d++) {
                    const double ref = Sn[(size_t)d * dv + e], ds = fabs(sv(S1, ((size_t)j * dk + d) * dv + e) - ref);
                    es = fmax(es, ds);
                    bad_S += !(ds <= 1e-5 * smax + 1e-7 + (bf16 ? fabs(ref) / 250 : 0.0));
                }
            }
            err_o = fmax(err_o, eo / omax), err_S = fmax(err_S, es / smax);
            const double rstd = 1.0 / sqrt(ss / dv + 1e-6);
            double ymax = 0, ey = 0;
            std::vector<double> yr(dv);
            for (int e = 0; e < dv; e++) {
                const double u = rbf((float)(bff(o[(size_t)r * value_dim + j * dv + e]) * rstd));
                const double z = bff(m[conv_dim + j * dv + e]);
                yr[e] = rbf((float)(rbf((float)(nw[e] * u)) * z * sigm(z)));
                ymax = fmax(ymax, fabs(yr[e]));
            }
            for (int e = 0; e < dv; e++) {
                const double got = bff(y[(size_t)r * value_dim + j * dv + e]);
                ey = fmax(ey, fabs(got - yr[e]));
                if (!(fabs(got - yr[e]) <= 1e-3 * ymax + 2.0 / 256 * fabs(yr[e]))) {
                    if (bad_y < 4) fprintf(stderr, "  y row %d head %d e %d: got %g ref %g\n", r, j, e, got, yr[e]);
                    bad_y++;
                }
            }
            err_y = fmax(err_y, ey / ymax);
        }
    }
    bad_other += memcmp(slots + 1 * stride, slots0 + 1 * stride, stride) != 0; /* slot 1: in no row */
    for (int r = 0; r < T; r++) {
        bool used = false;
        for (int i = 0; i < nd; i++) used |= rows[i] == r;
        if (!used)
            for (int e = 0; e < value_dim; e++)
                bad_other += o[(size_t)r * value_dim + e] != 0xffff || y[(size_t)r * value_dim + e] != 0xffff;
    }
    /* each row alone (from the same slots): its o, y, state and ring bitwise the batch's (batch invariance: a row's
     * sums must not depend on the rows beside it, nor on which CTA of the state pass takes its heads) */
    int bad_alone = 0;
    if (alone) {
        char *slots_b = (char *)malloc(stride * n_slots);
        uint16_t *o1 = (uint16_t *)malloc((size_t)T * value_dim * 2),
                 *y1 = (uint16_t *)malloc((size_t)T * value_dim * 2);
        memcpy(slots_b, slots, stride * n_slots);
        memcpy(slots, slots0, stride * n_slots);
        memcpy(o1, o, (size_t)T * value_dim * 2);
        memcpy(y1, y, (size_t)T * value_dim * 2);
        for (int i = 0; i < nd; i++) {
            DnBatchParams b1 = bp;
            b1.rows = &rows[i], b1.slot = &slot[i], b1.nd = 1;
            memset(o + (size_t)rows[i] * value_dim, 0xff, (size_t)value_dim * 2);
            memset(y + (size_t)rows[i] * value_dim, 0xff, (size_t)value_dim * 2);
            check(cuda_dn_batch_step(&b1, &lc) == 0, "dn_batch_step launch (a row alone)");
        }
        bad_alone = memcmp(slots, slots_b, stride * n_slots) != 0;
        bad_alone += memcmp(o, o1, (size_t)T * value_dim * 2) != 0;
        bad_alone += memcmp(y, y1, (size_t)T * value_dim * 2) != 0;
        free(slots_b), free(o1), free(y1);
    }
    check(bad_alone == 0, "dn step: a row alone != the row in the batch");
    check(bad_o == 0, "dn step o");
    check(bad_S == 0, "dn step S");
    check(bad_y == 0, "dn gated norm y");
    check(bad_ring == 0, "dn step conv ring");
    check(bad_other == 0, "dn step touched another slot or row");
    printf("  deltanet Hk %d Hv %d dk %3d dv %3d, %d rows%s%s%s: o %d, S %d, y %d, ring %d, other %d bad (max err / "
           "max |ref| o %.2e, S %.2e, y %.2e)%s\n",
           Hk, Hv, dk, dv, nd, ba_k > 0 ? ", b / a in prep" : "", bf16 ? ", bf16 states" : "",
           early ? ", history before the wait" : "", bad_o, bad_S, bad_y, bad_ring, bad_other, err_o, err_S, err_y,
           alone ? (bad_alone ? ", rows alone DIFFER" : ", each row alone bitwise the same") : "");
    free(projr), free(hx), free(wba);
    free(proj), free(conv_w), free(A_log), free(dt_bias), free(nw), free(slots), free(slots0), free(o), free(y);
    free(ws);
}

static void gather_case(void) {
    const int D = 40, n = 3, rows[n] = {4, 0, 4};
    float *x = fv((size_t)6 * D, 0.0f, 1.0f), *y = (float *)malloc(sizeof(float) * n * D);
    const CudaLaunch lc = {0, 0, NULL, 0};
    GatherRowsParams gp = {x, rows, y, n, D};
    check(cuda_gather_rows(&gp, &lc) == 0, "gather launch");
    int bad = 0;
    for (int i = 0; i < n; i++) bad += memcmp(y + (size_t)i * D, x + (size_t)rows[i] * D, sizeof(float) * D) != 0;
    check(bad == 0, "gather rows");
    printf("  gather: %d bad rows\n", bad);
    free(x), free(y);
}

/* cuda_rows_argmax: rows of random values over 3 chunks of AM_CHUNK (n_valid not a multiple of it) with planted ties
 * (the smallest index must win), also across chunk boundaries, and a larger value past n_valid (must not win), against
 * sampler_argmax's loop; then a row that is all NaN (0) and -inf / NaN mixes. */
static void argmax_case(void) {
    const int rows = 6, cols = 3 * AM_CHUNK + 100, n_valid = 2 * AM_CHUNK + 1000, C = AM_CHUNK;
    float *x = fv((size_t)rows * cols, 0.0f, 1.0f);
    x[0 * cols + 2500] = 9.0f, x[0 * cols + 1500] = 9.0f;                /* a tie in chunk 0: 1500 */
    x[1 * cols + n_valid + 5] = 50.0f, x[1 * cols + 7] = 8.0f;           /* past n_valid: 7 */
    x[2 * cols + 0] = 7.0f, x[2 * cols + 2048] = 7.0f;                   /* a tie at index 0 */
    x[2 * cols + C] = 7.0f, x[2 * cols + 2 * C + 3] = 7.0f;              /* ... and in chunks 1, 2 */
    x[3 * cols + C - 1] = 6.0f, x[3 * cols + C] = 6.0f;                  /* across the chunk 0 / 1 boundary: C - 1 */
    x[3 * cols + 2 * C] = 6.0f, x[3 * cols + n_valid - 1] = 6.0f;        /* and 1 / 2, the last valid column */
    x[4 * cols + 2 * C + 999] = 12.0f, x[4 * cols + 2 * C + 500] = 5.0f; /* the best in the last, partial chunk */
    for (int i = 0; i < cols; i++) x[5 * cols + i] = NAN;                /* every value NaN: 0 */
    int32_t out[rows];
    for (int r = 0; r < rows; r++) out[r] = -1;
    const CudaLaunch lc = {0, 0, NULL, 0};
    std::vector<char> work(rows_argmax_work_bytes(rows, n_valid));
    float lp[rows];
    for (int r = 0; r < rows; r++) lp[r] = -1.0f;
    RowsArgmaxParams ap = {x, rows, cols, n_valid, out, work.data(), work.size() - 1, lp};
    check(cuda_rows_argmax(&ap, &lc) == (int)cudaErrorInvalidValue, "argmax with too little work refused");
    ap.work_bytes = work.size();
    check(cuda_rows_argmax(&ap, &lc) == 0, "argmax launch");
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        int best = -1;
        for (int i = 0; i < n_valid; i++) {
            const float v = x[(size_t)r * cols + i];
            if (v == v && (best < 0 || v > x[(size_t)r * cols + best])) best = i;
        }
        if (best < 0) best = 0;
        bad += out[r] != best;
    }
    check(bad == 0 && out[0] == 1500 && out[1] == 7 && out[2] == 0 && out[3] == C - 1 && out[4] == 2 * C + 999 &&
              out[5] == 0,
          "rows argmax");
    printf("  argmax: %d %d %d %d %d %d (want 1500 7 0 %d %d 0), %d bad rows\n", out[0], out[1], out[2], out[3], out[4],
           out[5], C - 1, 2 * C + 999, bad);
    /* its logprob: -log sum exp(x - max) over the valid columns, against double; the all-NaN row gives NaN */
    double worst_lp = 0;
    int bad_lp = 0;
    for (int r = 0; r < rows - 1; r++) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < n_valid; i++) mx = fmax(mx, (double)x[(size_t)r * cols + i]);
        for (int i = 0; i < n_valid; i++) sum += exp((double)x[(size_t)r * cols + i] - mx);
        const double e = fabs(lp[r] - (-log(sum)));
        worst_lp = fmax(worst_lp, e);
        bad_lp += !(e <= 2e-5 * fabs(log(sum)) + 1e-6);
    }
    bad_lp += lp[rows - 1] == lp[rows - 1];
    check(bad_lp == 0, "rows argmax logprob");
    printf("  argmax logprob: worst |error| %.2e (rows' -log sum exp %.2f .. ), NaN row %s\n", worst_lp, (double)lp[0],
           lp[rows - 1] != lp[rows - 1] ? "NaN" : "NOT NaN");
    /* one row alone: the same id */
    int32_t one = -1;
    float lp1 = 0.0f;
    RowsArgmaxParams a1 = {x + (size_t)3 * cols, 1, cols, n_valid, &one, work.data(), work.size(), &lp1};
    check(cuda_rows_argmax(&a1, &lc) == 0 && one == out[3] && memcmp(&lp1, &lp[3], 4) == 0,
          "argmax and logprob of a row alone");
    free(x);
}

int main(int argc, char **argv) {
    if (argc > 1) srand((unsigned)atoi(argv[1]));
    emu_max_smem.clear(); /* dynamic shared memory a launch may take without the attribute */
    printf("batched-step kernels (src/cuda/serve_kernels.cu) under the CUDA emulation:\n");
    attn_case(256, 1, NORM_ZC, 0, 8, 2);   /* 4 query heads per kv head: G = 4 per CTA */
    attn_case(64, 0, NORM_PLAIN, 0, 4, 4); /* G = 1 */
    attn_case(128, 1, NORM_ZC, 1, 4, 2);   /* G = 2, a row list */
    attn_case(32, 1, NORM_ZC, 0, 16, 2);   /* G = 8, one dim per lane */
    split_case(256, 8, 2, 1, 16, 1100);    /* the 0.8B shape: G = 4, 8 dims per lane */
    split_case(128, 16, 2, 0, 7, 1030);    /* G = 8, a block of 7 */
    split_case(96, 4, 1, 1, 16, 300);      /* hd 96: 3 of 4 dims per lane */
    split_case(256, 8, 2, 1, 16, 1100, true); /* fp8 pools: the 0.8B shape */
    split_case(128, 16, 2, 0, 7, 300, true);  /* fp8 pools: a block of 7, G = 8 */
    split_case(96, 4, 1, 1, 16, 150, true);   /* fp8 pools: hd 96 (6 pieces of 16 codes a row) */
    split_case(256, 8, 2, 1, 16, 1100, false, 1); /* splits by the row count: one a row (18 tiles in one CTA) */
    split_case(256, 8, 2, 1, 16, 1100, true, 1);
    split_case(128, 16, 2, 0, 7, 1030, true, 3); /* 3 SMs: 12 CTAs wanted, 5 rows x 2 -> 2 splits a row */
    dn_case(1, 2, 128, 128);               /* the whole-head state pass (Qwen3.5's heads): 8 heads on 2 CTAs */
    dn_case(1, 2, 128, 128, 1);            /* one CTA streams all 8 heads: its 3-stage ring wraps twice */
    dn_case(1, 2, 128, 128, 64);           /* more CTAs than heads: one each */
    dn_case(1, 2, 128, 128, 2, 264);       /* b / a in prep (an FP8 in_proj): r = 2, lanes past the 256-wide round */
    dn_case(2, 2, 72, 128, 2, 40);         /* the same with r = 1 */
    dn_case(2, 2, 72, 128);                /* the whole-head pass with rows past dk */
    dn_case(1, 1, 128, 64);                /* 16 columns per split, two splits per column-slice CTA */
    dn_case(1, 1, 65, 128);                /* odd dk: the column-slice pass */
    dn_case(2, 4, 32, 48);                 /* 6 splits of 8 columns: 3 state CTAs per head */
    dn_case(1, 1, 64, 36);                 /* 5 splits of 8 columns: one per state CTA, the last one half empty */
    dn_case(1, 2, 16, 30);                 /* dv % 4 != 0: one column per thread */
    dn_case(1, 2, 128, 128, 2, 0, true);   /* bf16 states: the whole-head pass */
    dn_case(1, 2, 128, 128, 1, 0, true);   /* ... one CTA, the ring wrapping */
    dn_case(2, 2, 72, 128, 2, 40, true);   /* ... rows past dk, b / a in prep */
    dn_case(1, 1, 65, 128, 2, 0, true);    /* ... refused on the column-slice pass */
    dn_case(1, 2, 128, 128, 2, 0, true, true);  /* the conv history before prep's wait, bf16 states */
    dn_case(2, 2, 72, 128, 2, 40, false, true); /* ... dk and r dv not multiples of the CTA's threads */
    dn_case(2, 4, 32, 48, 2, 0, false, true);   /* ... on the column-slice pass */
    /* more rows than state-pass CTAs: each row alone bitwise the same as in the batch */
    dn_case(2, 2, 128, 128, 1, 0, false, true, 7, true);
    dn_case(2, 2, 128, 128, 1, 0, true, false, 7, true);
    dn_case(2, 2, 72, 128, 1, 40, false, true, 7, true);
    dn_case(2, 4, 32, 48, 1, 0, false, true, 7, true);
    dn_case(1, 2, 128, 128, 1, 0, false, true, 6, true);
    dn_case(2, 2, 128, 128, 3, 0, false, true, 5, true);
    gather_case();
    argmax_case();
    printf("serve_emu: %s\n", fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
