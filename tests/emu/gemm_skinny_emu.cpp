/* gemm_skinny_emu.cpp — cuda_gemm_skinny (src/cuda/gemm_skinny.cu, pulled in as sk_kernels.inc by
 * run_gemm_skinny.sh) under the host emulation of emu.h (one CTA at a time, shared memory starting as garbage),
 * against a double-precision product of the same bf16 inputs. Cases: ragged M, N, K (zero-filled tails), one split
 * and many (n_sm chosen small and large), every epilogue, SwiGLU with glu_group 1 (the direct epilogue through lane
 * pairs) and 8 (through the split reduction); NaN-poisoned outputs, guard columns and rows that must stay untouched;
 * and batch invariance: the first M2 rows alone give bitwise the same rows as the full product. Exit 1 on a failed
 * bound. Usage: gemm_skinny_emu [seed]. */
// clang-format off
#define EMU_NO_SILU
#include "emu.h"
#undef __host__
#define __host__
#include "cuda/ops.h"
// clang-format on

#include "emu_common.h"
static inline float silu_f(float x) { return x / (1.0f + expf(-x)); }
// clang-format off
#define __ldg(p) (*(p))
#include "sk_mma.inc"     /* swz, ldsm_addr_* from src/cuda/mma.cuh */
#include "sk_common.inc"  /* warp_sum, norm_apply from src/cuda/common.cuh */
#include "sk_kernels.inc" /* src/cuda/gemm_skinny.cu */
// clang-format on

static int fails;
static double bfd(uint16_t h) { return (double)__uint_as_float((uint32_t)h << 16); }

/* One product: returns after checking; M2 > 0 also runs the first M2 rows alone and compares bitwise. */
static void run_case(int M, int N, int K, int epi, int G, int n_sm, int M2) {
    const int ycols = epi == GEMM_EPI_SWIGLU_BF16 ? N / 2 : N, ldy = ycols + 4, guard = 2;
    const int esz = (epi == GEMM_EPI_F32 || epi == GEMM_EPI_ADD_F32) ? 4 : 2;
    std::vector<uint16_t> x((size_t)M * K), w((size_t)N * K);
    for (auto &v : x) v = emu_bf(nrm());
    for (auto &v : w) v = emu_bf(nrm() / sqrtf((float)K));
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
        GemmParams g = {x.data(), w.data(), y.data(), m, N, K, K, K, ldy, epi, G, 0};
        const size_t wf = cuda_gemm_skinny_work(m, N, K, n_sm, epi, G);
        std::vector<float> work(wf ? wf : 1, NAN);
        CudaLaunch l = {0, 0, NULL, 0};
        return cuda_gemm_skinny(&g, wf ? work.data() : NULL, wf, n_sm, &l);
    };
    std::vector<uint8_t> y;
    if (run(M, y)) {
        fprintf(stderr, "FAIL: launch M=%d N=%d K=%d epi=%d\n", M, N, K, epi);
        fails++;
        return;
    }
    long bad = 0, touched = 0;
    double worst = 0;
    for (int m = 0; m < M; m++) {
        std::vector<double> ref(N), sabs(N);
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                const double p = bfd(x[(size_t)m * K + k]) * bfd(w[(size_t)n * K + k]);
                s += p, a += fabs(p);
            }
            ref[n] = s, sabs[n] = a;
        }
        for (int c = 0; c < ycols; c++) {
            const size_t i = (size_t)m * ldy + c;
            double got, want, tol;
            if (epi == GEMM_EPI_SWIGLU_BF16) {
                const int gr = (c / G) * 2 * G + c % G, ur = gr + G;
                const double gt = rbf((float)ref[gr]), up = rbf((float)ref[ur]), act = rbf(silu_f((float)gt));
                want = act * up;
                tol = 1.1 * (ldexp(fabs(gt), -8) + 1e-5 * sabs[gr]) * fabs(up) +
                      fabs(act) * (ldexp(fabs(up), -8) + 1e-5 * sabs[ur]) + ldexp(fabs(want), -7) + 1e-30;
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
                tol = ldexp(fabs(f0) + fabs(ref[c]), -7) + ldexp(fabs(want), -7) + 1e-5 * sabs[c] + 1e-30;
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
        run(M2, y2);
        for (int r = 0; r < M2; r++)
            diff += memcmp(&y[(size_t)r * ldy * esz], &y2[(size_t)r * ldy * esz], (size_t)ycols * esz) != 0;
    }
    int kc = 0;
    const int splits = sk_plan(N, K, n_sm, &kc);
    printf("  M=%3d N=%4d K=%4d epi=%d G=%d splits=%2d: worst err/tol %.3f, %ld bad, %ld guard written, %ld of %d rows "
           "differ alone\n",
           M, N, K, epi, G, splits, worst, bad, touched, diff, M2);
    if (bad || touched || diff) fails++;
}

/* cuda_gemm_skinny_norm: x bitwise the plain residual GEMM's, h = norm(x) within a bf16 step of a double norm. */
static void norm_case(int M, int N, int K, int mode, int n_sm) {
    std::vector<uint16_t> x((size_t)M * K), w((size_t)N * K), h((size_t)M * N, 0x7fc1);
    for (auto &v : x) v = emu_bf(nrm());
    for (auto &v : w) v = emu_bf(nrm() / sqrtf((float)K));
    std::vector<float> y0((size_t)M * N), nw(N);
    for (auto &v : y0) v = rbf(nrm());
    for (auto &v : nw) v = mode == NORM_ZC ? 0.1f * nrm() : 1.0f + 0.1f * nrm();
    std::vector<float> y1 = y0, y2 = y0;
    const size_t wf = cuda_gemm_skinny_work(M, N, K, n_sm, GEMM_EPI_ADD_F32_NORM, 1);
    std::vector<float> work(wf, NAN);
    CudaLaunch l = {0, 0, NULL, 0};
    GemmParams g1 = {x.data(), w.data(), y1.data(), M, N, K, K, K, N, GEMM_EPI_ADD_F32, 1, 0};
    GemmParams g2 = g1;
    g2.y = y2.data();
    const int rc1 = cuda_gemm_skinny(&g1, work.data(), wf, n_sm, &l);
    const int rc2 = cuda_gemm_skinny_norm(&g2, nw.data(), mode, 1e-6f, h.data(), work.data(), wf, n_sm, &l);
    long xdiff = memcmp(y1.data(), y2.data(), y1.size() * 4) != 0, bad = 0;
    double worst = 0;
    for (int m = 0; m < M; m++) {
        double ss = 0;
        for (int n = 0; n < N; n++) ss += (double)y2[(size_t)m * N + n] * y2[(size_t)m * N + n];
        const double r = 1.0 / sqrt(ss / N + 1e-6);
        for (int n = 0; n < N; n++) {
            const double xv = y2[(size_t)m * N + n], want = mode == NORM_ZC ? xv * r * (1.0 + nw[n]) : nw[n] * xv * r;
            const double got = bfd(h[(size_t)m * N + n]), tol = ldexp(fabs(want), -7) + 1e-6;
            const double e = fabs(got - want);
            if (!(e <= tol)) bad++;
            else if (e / tol > worst) worst = e / tol;
        }
    }
    printf("  norm M=%3d N=%4d K=%4d mode=%d: x %s the residual GEMM's, h worst err/tol %.3f, %ld bad\n", M, N, K, mode,
           xdiff ? "DIFFERS from" : "bitwise", worst, bad);
    if (rc1 || rc2 || xdiff || bad) fails++;
}

int main(int argc, char **argv) {
    if (argc > 1) srand((unsigned)atoi(argv[1]));
    emu_max_smem = 48 * 1024;
    printf("skinny GEMM (src/cuda/gemm_skinny.cu) under the CUDA emulation:\n");
    run_case(5, 72, 200, GEMM_EPI_BF16, 1, 132, 2);         /* K tail inside a chunk; many splits */
    run_case(70, 136, 328, GEMM_EPI_ADD_F32, 1, 4, 9);      /* two m-blocks, N tail, few splits */
    run_case(1, 64, 64, GEMM_EPI_F32, 1, 132, 0);           /* one chunk, one split: the direct epilogue */
    run_case(17, 200, 520, GEMM_EPI_F32, 1, 1, 16);         /* n_sm 1: one split over 9 chunks (ring reuse) */
    run_case(33, 128, 456, GEMM_EPI_SWIGLU_BF16, 1, 1, 7);  /* SwiGLU G = 1, one split: lane-pair epilogue */
    run_case(9, 256, 136, GEMM_EPI_SWIGLU_BF16, 1, 132, 3); /* G = 1 through the reduction */
    run_case(12, 256, 96, GEMM_EPI_SWIGLU_BF16, 8, 132, 5); /* G = 8 */
    norm_case(10, 256, 200, NORM_ZC, 132);
    norm_case(70, 512, 328, NORM_PLAIN, 8);
    printf("gemm_skinny_emu: %s\n", fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
