/* gemm_skinny_emu.cpp — cuda_gemm_skinny and cuda_gemm_skinny_norm (src/cuda/gemm_skinny.cu, pulled in as
 * sk_kernels.inc by run_gemm_skinny.sh) under the host emulation of emu.h (one CTA at a time, shared memory starting
 * as garbage), against a double-precision product of the same inputs: bf16 weights, and FP8 weights (random e4m3
 * bytes, NaN codes left out, with random positive scales per row and 128-column block spread over 2^10, so a scale of
 * the wrong row or block shows) taken as bf16(e4m3 value times scale) (src/util.c's decoder). Built twice by
 * run_gemm_skinny.sh: the mma.sync path, and with __CUDA_ARCH_FEAT_SM90_ALL the wgmma path (emu_wgmma.h).
 * Cases: ragged M, N, K (zero-filled tails; FP8: N and K not multiples of 128, K down to 16, row stride ldw > K with
 * NaN codes in the gap), one split and many (n_sm chosen small and large), every epilogue, SwiGLU with glu_group 1
 * (the direct epilogue through lane pairs, and through the split reduction) and 8; the fused residual + norm;
 * NaN-poisoned outputs, guard columns and rows that must stay untouched; batch invariance: the first M2 rows alone
 * give bitwise the same rows as the full product; the refused arguments of the FP8 form. Exit 1 on a failed bound.
 * Usage: gemm_skinny_emu [seed]. */
// clang-format off
#define EMU_NO_SILU
#include "emu.h"
#undef __host__
#define __host__
#include "cuda/ops.h"
extern "C" {
#include "util.h"
}
// clang-format on

#include "emu_common.h"
static inline float silu_f(float x) { return x / (1.0f + expf(-x)); }
// clang-format off
#define __ldg(p) (*(p))
#include "sk_mma.inc"     /* swz, ldsm_addr_* from src/cuda/mma.cuh */
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#include "emu_wgmma.h"    /* the sm_90a path: wgmma m64n64k16 on the shared-memory tiles */
#include "sk_desc.inc"    /* wgmma_desc from src/cuda/mma.cuh */
#endif
#include "sk_common.inc"  /* warp_sum, norm_apply from src/cuda/common.cuh */
#include "sk_kernels.inc" /* src/cuda/gemm_skinny.cu */
// clang-format on

static int fails;
static double bfd(uint16_t h) { return (double)__uint_as_float((uint32_t)h << 16); }

/* The weights of a case: bf16 w [N][ldw], or FP8 e4m3 bytes q [N][ldw] with scales s [ceil(K/128)][N]; wd [N][K] the
 * values the kernel must multiply by (bf16 values, or bf16(e4m3(q) * s) with the product in fp32), in double. */
struct Weights {
    bool f8;
    int ldw;
    std::vector<uint16_t> w;
    std::vector<uint8_t> q;
    std::vector<float> s;
    std::vector<double> wd;
};
static Weights make_weights(int N, int K, bool f8, int ldw) {
    Weights W;
    W.f8 = f8, W.ldw = ldw;
    W.wd.resize((size_t)N * K);
    if (!f8) {
        W.w.assign((size_t)N * ldw, 0x7fc1); /* NaN in the row gap: must never be read */
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                const uint16_t v = emu_bf(nrm() / sqrtf((float)K));
                W.w[(size_t)n * ldw + k] = v, W.wd[(size_t)n * K + k] = bfd(v);
            }
        return W;
    }
    const int nb = (K + 127) / 128;
    W.q.assign((size_t)N * ldw, 0x7f); /* NaN code in the row gap: must never be read */
    W.s.resize((size_t)nb * N);
    for (auto &v : W.s) v = (float)((0.5 + urand()) * ldexp(1.0, -(int)(urand() * 10)) / (64.0 * sqrt((double)K)));
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            uint8_t b;
            do b = (uint8_t)(urand() * 256);
            while ((b & 0x7f) == 0x7f);
            W.q[(size_t)n * ldw + k] = b;
            W.wd[(size_t)n * K + k] = bfd(emu_bf(fp8_e4m3_to_f32(b) * W.s[(size_t)(k / 128) * N + n]));
        }
    return W;
}
static void set_weights(GemmParams &g, const Weights &W) {
    g.ldw = W.ldw;
    if (W.f8)
        g.w = NULL, g.w8 = W.q.data(), g.w8_scale = W.s.data();
    else
        g.w = W.w.data(), g.w8 = NULL, g.w8_scale = NULL;
}
/* ref[n] = sum_k x[m][k] wd[n][k], sabs[n] = sum_k |x w| for row m */
static void ref_row(const std::vector<uint16_t> &x, const Weights &W, int m, int N, int K, std::vector<double> &ref,
                    std::vector<double> &sabs) {
    ref.assign(N, 0), sabs.assign(N, 0);
    for (int n = 0; n < N; n++) {
        double s = 0, a = 0;
        for (int k = 0; k < K; k++) {
            const double p = bfd(x[(size_t)m * K + k]) * W.wd[(size_t)n * K + k];
            s += p, a += fabs(p);
        }
        ref[n] = s, sabs[n] = a;
    }
}
/* the bound for y = bf16(y0 + bf16(sum)) (EPI_ADD_F32) */
static double add_tol(double f0, double ref, double want, double sabs) {
    return ldexp(fabs(f0) + fabs(ref), -7) + ldexp(fabs(want), -7) + 1e-5 * sabs + 1e-30;
}

/* GemmParams.split_m of every launch (the split plan counts the m-blocks; cases then pass M2 = 0) */
static int g_split_m;

/* One product: returns after checking; M2 > 0 also runs the first M2 rows alone and compares bitwise. */
static void run_case(int M, int N, int K, int epi, int G, int n_sm, int M2, bool f8 = false, int ldw_extra = 0) {
    const int ycols = epi == GEMM_EPI_SWIGLU_BF16 ? N / 2 : N, ldy = ycols + 4, guard = 2;
    const int esz = (epi == GEMM_EPI_F32 || epi == GEMM_EPI_ADD_F32) ? 4 : 2;
    std::vector<uint16_t> x((size_t)M * K);
    for (auto &v : x) v = emu_bf(nrm());
    const Weights W = make_weights(N, K, f8, K + ldw_extra);
    const size_t ny = (size_t)(M + guard) * ldy;
    std::vector<uint8_t> y0(ny * esz);
    for (size_t i = 0; i < ny; i++) {
        if (esz == 4) {
            float v = NAN;
            if (epi == GEMM_EPI_ADD_F32 && i < (size_t)M * ldy && (int)(i % ldy) < ycols) v = rbf(nrm());
            memcpy(&y0[i * 4], &v, 4);
        } else {
            const uint16_t v = 0x7fc1;
            memcpy(&y0[i * 2], &v, 2);
        }
    }
    auto run = [&](int m, std::vector<uint8_t> &y) {
        y = y0;
        GemmParams g = {x.data(), NULL, y.data(), m, N, K, K, K, ldy, epi, G, 0};
        set_weights(g, W);
        g.split_m = g_split_m;
        const size_t wf = cuda_gemm_skinny_work(m, N, K, n_sm, epi, G);
        std::vector<float> work(wf ? wf : 1, NAN);
        CudaLaunch l = {0, 0, NULL, 0};
        return cuda_gemm_skinny(&g, wf ? work.data() : NULL, wf, n_sm, &l);
    };
    std::vector<uint8_t> y;
    if (run(M, y)) {
        fprintf(stderr, "FAIL: launch M=%d N=%d K=%d epi=%d %s\n", M, N, K, epi, f8 ? "fp8" : "bf16");
        fails++;
        return;
    }
    long bad = 0, touched = 0;
    double worst = 0;
    std::vector<double> ref, sabs;
    for (int m = 0; m < M; m++) {
        ref_row(x, W, m, N, K, ref, sabs);
        for (int c = 0; c < ycols; c++) {
            const size_t i = (size_t)m * ldy + c;
            double got, want, tol;
            if (epi == GEMM_EPI_SWIGLU_BF16) {
                const int gr = (c / G) * 2 * G + c % G, ur = gr + G;
                const double gt = rbf((float)ref[gr]), up = rbf((float)ref[ur]), act = rbf(silu_f((float)gt));
                want = act * up;
                /* test_gemm.c's bound: a whole-ulp flip of bf16(gate), bf16(up) and then bf16(silu) */
                tol = (1.1 * (ldexp(fabs(gt), -7) + 1e-5 * sabs[gr]) + ldexp(fabs(act), -7)) * fabs(up) +
                      fabs(act) * (ldexp(fabs(up), -7) + 1e-5 * sabs[ur]) + ldexp(fabs(want), -7) + 1e-30;
                uint16_t h;
                memcpy(&h, &y[i * 2], 2);
                got = bfd(h);
            } else if (epi == GEMM_EPI_BF16) {
                want = ref[c], tol = ldexp(fabs(want), -8) + 1e-5 * sabs[c] + 1e-30;
                uint16_t h;
                memcpy(&h, &y[i * 2], 2);
                got = bfd(h);
            } else if (epi == GEMM_EPI_F32) {
                want = ref[c], tol = ldexp(fabs(want), -8) + 1e-5 * sabs[c] + 1e-30;
                float f;
                memcpy(&f, &y[i * 4], 4);
                got = rbf(f) == f ? f : NAN;
            } else {
                float f0, f;
                memcpy(&f0, &y0[i * 4], 4);
                memcpy(&f, &y[i * 4], 4);
                want = f0 + rbf((float)ref[c]);
                tol = add_tol(f0, ref[c], want, sabs[c]);
                got = rbf(f) == f ? f : NAN;
            }
            const double err = fabs(got - want);
            if (!(err <= tol)) {
                if (bad < 3) fprintf(stderr, "  y[%d][%d] = %g, want %g (tol %g)\n", m, c, got, want, tol);
                bad++;
            } else if (err / tol > worst) {
                worst = err / tol;
            }
        }
    }
    for (int r = 0; r < M + guard; r++)
        for (int c = 0; c < ldy; c++)
            if (!(r < M && c < ycols))
                touched += memcmp(&y0[((size_t)r * ldy + c) * esz], &y[((size_t)r * ldy + c) * esz], esz) != 0;
    long diff = 0;
    if (M2 > 0) {
        std::vector<uint8_t> y2;
        if (run(M2, y2)) diff = M2;
        for (int r = 0; r < M2; r++)
            diff += memcmp(&y[(size_t)r * ldy * esz], &y2[(size_t)r * ldy * esz], (size_t)ycols * esz) != 0;
    }
    int kc = 0;
    const int splits = sk_plan(N, K, g_split_m ? (M + SK_BM - 1) / SK_BM : 1, n_sm, &kc);
    printf("  %s M=%3d N=%4d K=%4d ldw=%4d epi=%d G=%d splits=%2d: worst err/tol %.3f, %ld bad, %ld guard written, "
           "%ld of %d rows differ alone\n",
           f8 ? "fp8 " : "bf16", M, N, K, W.ldw, epi, G, splits, worst, bad, touched, diff, M2);
    if (bad || touched || diff) fails++;
}

/* cuda_gemm_skinny_norm: x bitwise the plain residual GEMM's and within the bound of a double product, h = norm(x)
 * within a bf16 step of a double norm; M2 > 0: the first M2 rows alone give bitwise the same x and h. */
static void norm_case(int M, int N, int K, int mode, int n_sm, bool f8 = false, int M2 = 0) {
    std::vector<uint16_t> x((size_t)M * K), h((size_t)M * N, 0x7fc1);
    for (auto &v : x) v = emu_bf(nrm());
    const Weights W = make_weights(N, K, f8, K);
    std::vector<float> y0((size_t)M * N), nw(N);
    for (auto &v : y0) v = rbf(nrm());
    for (auto &v : nw) v = mode == NORM_ZC ? 0.1f * nrm() : 1.0f + 0.1f * nrm();
    std::vector<float> y1 = y0, y2 = y0;
    const size_t wf = cuda_gemm_skinny_work(M, N, K, n_sm, GEMM_EPI_ADD_F32_NORM, 1);
    std::vector<float> work(wf, NAN);
    CudaLaunch l = {0, 0, NULL, 0};
    GemmParams g1 = {x.data(), NULL, y1.data(), M, N, K, K, K, N, GEMM_EPI_ADD_F32, 1, 0};
    set_weights(g1, W);
    g1.split_m = g_split_m;
    GemmParams g2 = g1;
    g2.y = y2.data();
    const int rc1 = cuda_gemm_skinny(&g1, work.data(), wf, n_sm, &l);
    const int rc2 = cuda_gemm_skinny_norm(&g2, nw.data(), mode, 1e-6f, h.data(), work.data(), wf, n_sm, &l);
    long xdiff = memcmp(y1.data(), y2.data(), y1.size() * 4) != 0, bad = 0, xbad = 0;
    double worst = 0, xworst = 0;
    std::vector<double> ref, sabs;
    for (int m = 0; m < M; m++) {
        ref_row(x, W, m, N, K, ref, sabs);
        double ss = 0;
        for (int n = 0; n < N; n++) {
            const double f0 = y0[(size_t)m * N + n], got = y2[(size_t)m * N + n], want = f0 + rbf((float)ref[n]);
            const double tol = add_tol(f0, ref[n], want, sabs[n]), e = fabs(got - want);
            if (!(e <= tol && rbf((float)got) == (float)got))
                xbad++;
            else if (e / tol > xworst)
                xworst = e / tol;
            ss += got * got;
        }
        const double r = 1.0 / sqrt(ss / N + 1e-6);
        for (int n = 0; n < N; n++) {
            const double xv = y2[(size_t)m * N + n], want = mode == NORM_ZC ? xv * r * (1.0 + nw[n]) : nw[n] * xv * r;
            const double got = bfd(h[(size_t)m * N + n]), tol = ldexp(fabs(want), -7) + 1e-6;
            const double e = fabs(got - want);
            if (!(e <= tol))
                bad++;
            else if (e / tol > worst)
                worst = e / tol;
        }
    }
    long diff = 0;
    if (M2 > 0) {
        std::vector<float> y3 = y0;
        std::vector<uint16_t> h3((size_t)M * N, 0x7fc1);
        GemmParams g3 = g2;
        g3.y = y3.data(), g3.M = M2;
        if (cuda_gemm_skinny_norm(&g3, nw.data(), mode, 1e-6f, h3.data(), work.data(), wf, n_sm, &l)) diff = M2;
        for (int r = 0; r < M2; r++)
            diff += memcmp(&y2[(size_t)r * N], &y3[(size_t)r * N], (size_t)N * 4) != 0 ||
                    memcmp(&h[(size_t)r * N], &h3[(size_t)r * N], (size_t)N * 2) != 0;
        diff += memcmp(&y0[(size_t)M2 * N], &y3[(size_t)M2 * N], (size_t)(M - M2) * N * 4) != 0; /* rows past M2 */
    }
    printf("  %s norm M=%3d N=%4d K=%4d mode=%d: x %s the residual GEMM's (worst err/tol %.3f, %ld bad), h worst "
           "err/tol %.3f, %ld bad, %ld of %d rows differ alone\n",
           f8 ? "fp8 " : "bf16", M, N, K, mode, xdiff ? "DIFFERS from" : "bitwise", xworst, xbad, worst, bad, diff, M2);
    if (rc1 || rc2 || xdiff || xbad || bad || diff) fails++;
}

/* The FP8 form's argument checks: a valid call runs (and gives the exact product), each bad one is refused and
 * writes nothing. */
static void bad_args(void) {
    const int M = 4, N = 16, K = 32;
    std::vector<uint16_t> x((size_t)M * 64, 0x3f80), w((size_t)N * 64, 0x3f80), h((size_t)M * N, 0x7fc1); /* 1.0 */
    std::vector<uint8_t> q((size_t)N * 64 + 16, 0x38);                                                    /* e4m3 1.0 */
    std::vector<float> s((size_t)N, 0.5f), nw(N, 0.0f), y((size_t)M * N, NAN), work(1 << 16, NAN);
    CudaLaunch l = {0, 0, NULL, 0};
    GemmParams ok = {x.data(), NULL, y.data(), M, N, K, K, K, N, GEMM_EPI_F32, 1, 0};
    ok.w8 = q.data(), ok.w8_scale = s.data();
    int n_ok = 0, n_all = 0;
    /* valid: y = sum of K products 1 * 1 * 0.5 */
    n_all++;
    if (cuda_gemm_skinny(&ok, work.data(), work.size(), 132, &l) == 0) {
        bool exact = true;
        for (float v : y) exact &= v == 0.5f * K;
        n_ok += exact;
        if (!exact) fprintf(stderr, "FAIL: the valid fp8 call: y[0] = %g, want %g\n", y[0], 0.5 * K);
    } else {
        fprintf(stderr, "FAIL: the valid fp8 call was refused\n");
    }
    GemmParams okn = ok;
    okn.epi = GEMM_EPI_ADD_F32;
    for (auto &v : y) v = 1.0f;
    n_all++;
    if (cuda_gemm_skinny_norm(&okn, nw.data(), NORM_ZC, 1e-6f, h.data(), work.data(), work.size(), 132, &l) == 0) {
        bool exact = true;
        for (float v : y) exact &= v == 1.0f + 0.5f * K;
        n_ok += exact;
        if (!exact) fprintf(stderr, "FAIL: the valid fp8 norm call: y[0] = %g, want %g\n", y[0], 1.0 + 0.5 * K);
    } else {
        fprintf(stderr, "FAIL: the valid fp8 norm call was refused\n");
    }
    struct Bad {
        const char *what;
        GemmParams g;
    };
    std::vector<Bad> bad;
    GemmParams g = ok;
    g.w = w.data(), bad.push_back({"w and w8 both set", g});
    g = ok, g.w8 = NULL, g.w8_scale = NULL, bad.push_back({"neither w nor w8", g});
    g = ok, g.w8 = NULL, bad.push_back({"w8_scale without w8", g});
    g = ok, g.w8_scale = NULL, bad.push_back({"w8 without w8_scale", g});
    g = ok, g.K = 40, g.ldx = 40, g.ldw = 48, bad.push_back({"fp8 K % 16 != 0", g});
    g = ok, g.ldw = 40, bad.push_back({"fp8 ldw % 16 != 0", g});
    g = ok, g.w8 = q.data() + 8, bad.push_back({"w8 not 16-byte aligned", g});
    for (int v = 0; v < 2; v++)
        for (const Bad &b : bad) {
            GemmParams gb = b.g;
            std::vector<float> y0 = y;
            std::vector<uint16_t> h0 = h;
            int rc;
            if (v == 0) {
                rc = cuda_gemm_skinny(&gb, work.data(), work.size(), 132, &l);
            } else {
                gb.epi = GEMM_EPI_ADD_F32;
                rc = cuda_gemm_skinny_norm(&gb, nw.data(), NORM_ZC, 1e-6f, h.data(), work.data(), work.size(), 132, &l);
            }
            const bool untouched = !memcmp(y0.data(), y.data(), y.size() * 4) && h0 == h;
            n_all++;
            if (rc == (int)cudaErrorInvalidValue && untouched)
                n_ok++;
            else
                fprintf(stderr, "FAIL: %s: %s (rc %d, output %s)\n", v ? "cuda_gemm_skinny_norm" : "cuda_gemm_skinny",
                        b.what, rc, untouched ? "untouched" : "written");
        }
    printf("  fp8 arguments: %d of %d calls as they must be (2 valid ones exact, %d bad ones refused)\n", n_ok, n_all,
           (int)bad.size() * 2);
    if (n_ok != n_all) fails++;
}

int main(int argc, char **argv) {
    if (argc > 1) emu_rs ^= 0x9e3779b97f4a7c15ull * (uint64_t)(atoi(argv[1]) + 1);
    emu_max_smem.clear();
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    emu_wg_install();
    printf("skinny GEMM (src/cuda/gemm_skinny.cu), the sm_90a path (wgmma), under the CUDA emulation:\n");
#else
    printf("skinny GEMM (src/cuda/gemm_skinny.cu), the mma.sync path, under the CUDA emulation:\n");
#endif
    run_case(5, 72, 200, GEMM_EPI_BF16, 1, 132, 2);         /* K tail inside a chunk; many splits */
    run_case(70, 136, 328, GEMM_EPI_ADD_F32, 1, 8, 9);      /* two m-blocks, N tail, few splits */
    run_case(1, 64, 64, GEMM_EPI_F32, 1, 132, 0);           /* one chunk, one split: the direct epilogue */
    run_case(17, 200, 520, GEMM_EPI_F32, 1, 1, 16);         /* n_sm 1: one split over 9 chunks (ring reuse) */
    run_case(33, 128, 456, GEMM_EPI_SWIGLU_BF16, 1, 1, 7);  /* SwiGLU G = 1, one split: lane-pair epilogue */
    run_case(9, 256, 136, GEMM_EPI_SWIGLU_BF16, 1, 132, 3); /* G = 1 through the reduction */
    run_case(12, 256, 96, GEMM_EPI_SWIGLU_BF16, 8, 132, 5); /* G = 8 */
    norm_case(10, 256, 200, NORM_ZC, 132);
    norm_case(70, 512, 328, NORM_PLAIN, 8);
    norm_case(5, 128, 2048, NORM_PLAIN, 132); /* 16 splits: past the reduction's 12 partials loaded at once */
    /* sm_90a: the rows alone make a one-wave grid (128-column chunks), all rows two m-blocks (64-column chunks) */
    run_case(70, 136, 328, GEMM_EPI_ADD_F32, 1, 9, 9);     /* 3 splits */
    run_case(70, 128, 456, GEMM_EPI_SWIGLU_BF16, 1, 2, 7); /* one split */
    norm_case(70, 512, 328, NORM_PLAIN, 8, false, 60);
    /* FP8 weights: N = 200 (N % 64 = 8: a half-empty last W tile), K = 336 (3 scale blocks, the last 80 wide; 5.25
     * chunks); M = 1, 7, 64, 65, 130 */
    run_case(1, 200, 336, GEMM_EPI_BF16, 1, 132, 0, true);          /* 6 splits of one chunk */
    run_case(7, 200, 336, GEMM_EPI_F32, 1, 1, 3, true, 32);         /* one split over 6 chunks (ring reuse), ldw > K */
    run_case(64, 200, 336, GEMM_EPI_ADD_F32, 1, 12, 33, true);      /* 3 splits of 2 chunks */
    run_case(65, 200, 336, GEMM_EPI_SWIGLU_BF16, 1, 1, 64, true);   /* SwiGLU G = 1, one split: lane pairs */
    run_case(130, 200, 336, GEMM_EPI_BF16, 1, 1, 64, true, 16);     /* three m-blocks, one split */
    run_case(130, 200, 336, GEMM_EPI_SWIGLU_BF16, 1, 132, 2, true); /* G = 1 through the reduction */
    run_case(64, 208, 336, GEMM_EPI_SWIGLU_BF16, 8, 3, 7, true);    /* G = 8 */
    run_case(7, 200, 336, GEMM_EPI_ADD_F32, 1, 132, 6, true);
    run_case(65, 200, 336, GEMM_EPI_F32, 1, 12, 1, true); /* 3 splits; the row alone on 128-column chunks */
    run_case(5, 72, 16, GEMM_EPI_BF16, 1, 132, 2, true);  /* K = 16: one chunk, 16 columns */
    run_case(1, 64, 64, GEMM_EPI_F32, 1, 132, 0, true);   /* one chunk, one split: the direct epilogue */
    run_case(7, 136, 1040, GEMM_EPI_F32, 1, 1, 2, true);  /* 17 chunks, 9 scale blocks, one split */
    norm_case(7, 200, 336, NORM_ZC, 132, true, 3);
    norm_case(65, 264, 336, NORM_PLAIN, 4, true, 64);
    norm_case(7, 1024, 3584, NORM_ZC, 132, true); /* the MLP down projection (x checked) + the next layer's norm */
    g_split_m = 1; /* three m-blocks of 3 tiles on 24 SMs: 2 splits where the shape alone takes 3 */
    run_case(130, 136, 328, GEMM_EPI_ADD_F32, 1, 24, 0);
    run_case(130, 136, 336, GEMM_EPI_BF16, 1, 24, 0, true);
    norm_case(130, 136, 336, NORM_ZC, 24, true);
    g_split_m = 0;
    bad_args();
    printf("gemm_skinny_emu: %s\n", fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
