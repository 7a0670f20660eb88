/* mlp_emu.cpp — the fused MLP kernel (src/cuda/mlp.cu, pulled in as mlp.inc by run_mlp.sh) run under
 * the host emulation of emu.h (one CTA of 512 fibers at a time, shared memory starting as garbage),
 * against a double-precision CPU reference with HF's bf16 rounding points. For machines without a
 * GPU: checks the unit split, row/column indexing, the warp reductions, the shared-memory layout and
 * the cp.async coverage, not speed or the real atomics (here plain adds, one CTA after another).
 * Per shape: x_out bit-exact, h_out within one bf16 step, act (from the kernel's h) within the GEMV +
 * SwiGLU bound, y - y0 = W_down act within 1e-5 sum |w a|. x_out / h_out / act start as NaN.
 * Exit 1 on a failed bound. */
// clang-format off
#define EMU_NO_SILU
#include "emu.h"      /* first: its macros replace CUDA's qualifiers */
#undef __host__
#define __host__
#include "cuda/ops.h"
// clang-format on

#include "emu_common.h" /* common.cuh's helpers and trace stamps, as on the GPU */
static float emu_red[32]; /* the kernel's __shared__ red[32] (one CTA at a time) */
// clang-format off
#include "mlp_common.inc" /* bf_lo .. stage_norm_row from src/cuda/common.cuh */
// clang-format on
#define MLP_TMA true /* the sm_90 path: W_dT by thread 0's bulk copy */
static inline void mlp_bulk_load(void *d, const void *s, unsigned n) { memcpy(d, s, n); } /* TMA: thread 0 */
static inline void mlp_bulk_wait() {}
// clang-format off
#include "mlp.inc" /* the kernel */
// clang-format on

static float *rbfv(size_t n, float mean, float sc) {
    float *p = (float *)aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
    for (size_t i = 0; i < n; i++) p[i] = rbf(mean + sc * nrm());
    return p;
}
static uint16_t *bfv(size_t n, float sc) {
    uint16_t *p = (uint16_t *)aligned_alloc(64, ((n * 2 + 63) / 64) * 64);
    for (size_t i = 0; i < n; i++) p[i] = emu_bf(sc * nrm());
    return p;
}
static float *nanv(size_t n) {
    float *p = (float *)aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
    memset(p, 0xff, n * 4);
    return p;
}

static int fails;
static void check(bool ok, const char *what, int D, int F, int G) {
    if (!ok) {
        fprintf(stderr, "FAIL: D %d F %d G %d: %s\n", D, F, G, what);
        fails++;
    }
}

static void run_case(int D, int F, int G, int norm_mode, int n_parts) {
    uint16_t *Wgu = bfv((size_t)2 * F * D, 1.0f / sqrtf((float)D)), *Wd = bfv((size_t)D * F, 1.0f / sqrtf((float)F));
    uint16_t *WdT = (uint16_t *)aligned_alloc(64, (((size_t)F * D * 2 + 63) / 64) * 64);
    for (int r = 0; r < D; r++)
        for (int i = 0; i < F; i++) WdT[(size_t)i * D + r] = Wd[(size_t)r * F + i];
    float *res = rbfv(D, 0, 1), *parts = rbfv((size_t)n_parts * D, 0, 0.5f);
    float *w = rbfv(D, norm_mode == NORM_PLAIN ? 1.0f : 0.0f, 0.2f), *y0 = rbfv(D, 0, 0.3f);
    float *y = nanv(D), *xo = nanv(D), *ho = nanv(D), *act = nanv(F);
    memcpy(y, y0, (size_t)D * 4);
    MlpFusedParams p;
    memset(&p, 0, sizeof p);
    p.w_gu = Wgu, p.w_dT = WdT, p.D = D, p.F = F, p.blocks = G;
    p.x = res, p.parts = parts, p.n_parts = n_parts, p.x_out = xo;
    p.norm_w = w, p.norm_mode = norm_mode, p.eps = 1e-6f;
    p.y = y, p.h_out = ho, p.act_out = act, p.early_trigger = 1;
    const int nu_max = mlp_nu_max(F, G);
    const size_t smem = mlp_end(D, nu_max);
    const MlpFusedParams P = p;
    emu_launch(dim3(G), MLP_THREADS, smem, 1, [&] { mlp_fused_bf16(P); });

    /* x, h on the host */
    int bad_x = 0, bad_h = 0, bad_a = 0, bad_y = 0;
    double ss = 0;
    float *x = (float *)malloc((size_t)D * 4);
    for (int i = 0; i < D; i++) {
        float a = 0;
        for (int s = 0; s < n_parts; s++) a += parts[(size_t)s * D + i];
        x[i] = rbf(res[i] + rbf(a));
        bad_x += memcmp(&x[i], &xo[i], 4) != 0;
        ss += (double)x[i] * x[i];
    }
    const float r = 1.0f / sqrtf((float)(ss / D) + 1e-6f);
    for (int i = 0; i < D; i++) {
        const float h = norm_mode == NORM_ZC ? rbf(x[i] * r * (1.0f + w[i])) : rbf(w[i] * rbf(x[i] * r));
        bad_h += !(fabsf(ho[i] - h) <= 2.0f / 256 * fabsf(h) + 1e-6f);
    }
    /* act from the kernel's h */
    for (int i = 0; i < F; i++) {
        double g = 0, u = 0, ag = 0, au = 0;
        for (int k = 0; k < D; k++) {
            const double vg = bff(Wgu[(size_t)(2 * i) * D + k]) * ho[k], vu = bff(Wgu[(size_t)(2 * i + 1) * D + k]) * ho[k];
            g += vg, u += vu, ag += fabs(vg), au += fabs(vu);
        }
        const float gb = rbf((float)g), ub = rbf((float)u);
        const float ref = rbf(rbf(gb / (1.0f + expf(-gb))) * ub);
        const double tol = 3 * (1e-5 * (ag + au) + 2e-6) * (1 + fabs(gb) + fabs(ub)) + 3.0 / 256 * fabs(ref);
        if (!(fabs((double)act[i] - ref) <= tol)) {
            if (bad_a < 4) fprintf(stderr, "  act[%d]: got %.8g ref %.8g\n", i, act[i], ref);
            bad_a++;
        }
    }
    /* y - y0 = W_down act */
    for (int d = 0; d < D; d++) {
        double s = 0, a = 0;
        for (int i = 0; i < F; i++) {
            const double v = bff(Wd[(size_t)d * F + i]) * act[i];
            s += v, a += fabs(v);
        }
        const double got = (double)y[d] - y0[d];
        if (!(fabs(got - s) <= 1e-5 * a + 1e-6 + 2e-7 * G * fabs(y0[d]))) {
            if (bad_y < 4) fprintf(stderr, "  y[%d] - y0: got %.8g ref %.8g\n", d, got, s);
            bad_y++;
        }
    }
    check(bad_x == 0, "x_out not bit-exact", D, F, G);
    check(bad_h == 0, "h_out", D, F, G);
    check(bad_a == 0, "act", D, F, G);
    check(bad_y == 0, "y", D, F, G);
    printf("  D %4d F %4d G %3d (%d-%d units per block) norm %d parts %d: x_out %d, h %d, act %d, y %d bad\n", D, F,
           G, F / G, nu_max, norm_mode, n_parts, bad_x, bad_h, bad_a, bad_y);
    free(x), free(Wgu), free(Wd), free(WdT), free(res), free(parts), free(w), free(y0), free(y), free(xo), free(ho);
    free(act);
}

int main(int argc, char **argv) {
    const int full = argc > 1 && atoi(argv[1]) != 0; /* 1: also the 0.8B shape on 132 CTAs (~1 min) */
    printf("fused MLP kernel (src/cuda/mlp.cu) under the CUDA emulation:\n");
    run_case(256, 200, 100, NORM_ZC, 1);   /* ragged: 2 units per block */
    run_case(256, 200, 7, NORM_PLAIN, 2);  /* 28-29 units: odd counts, a half pair */
    run_case(512, 1000, 13, NORM_ZC, 1);   /* 76-77 units: warps loop over pairs */
    run_case(1024, 3584, 5, NORM_ZC, 3);   /* the 0.8B rows on few CTAs: 716-717 units, all 4 column steps */
    run_case(8, 2, 1, NORM_ZC, 1);         /* smallest */
    if (full) run_case(1024, 3584, 132, NORM_ZC, 1);
    printf("mlp_emu: %s\n", fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
