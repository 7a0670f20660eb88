/* mlp_emu.cpp — the fused MLP kernel (src/cuda/mlp.cu, pulled in as mlp.inc by run_mlp.sh, launchers included) run
 * under the host emulation of emu.h (one CTA of 512 fibers at a time, shared memory starting as garbage), for both
 * weight formats: bf16, and FP8 (random e4m3 codes, NaN codes left out, with one fp32 scale per row and 128-column
 * block in the device layout of ops.h FP8_SCALES_DOC, each scale 2^e times a base, e uniform in [-4, 4] per entry,
 * so a scale read from the wrong row or block shows; the padding rows of the scale tables NaN). Reference: double
 * precision with HF's bf16 rounding points, on the dequantized weights (e4m3 value * scale in fp32, as
 * fp8_dequantize_blocks). For machines without a GPU: checks the unit split, row/column indexing, the scale blocks, the
 * warp reductions, the shared-memory layout and the bulk-copy coverage, not speed or the real atomics (here plain adds,
 * one CTA after another, in block order).
 * Per shape: x_out bit-exact, h_out within one bf16 step, act (from the kernel's h) within the GEMV + SwiGLU bound,
 * y - y0 = W_down act within 1e-5 sum |w a|. x_out / h_out / act start as NaN. FP8 also bit for bit: act against a
 * host model of cuda_matvec's FP8 SILU_MUL order (gemv.cu: lane l's 16-product chains at k = u*512 + 16l, each times
 * its row scale into the lane's sum by fmaf, then warp_sum_rows4's tree), and y against a host model of the kernel's
 * documented down order (mlp.cu header: per 128-unit block a chain from 0, then fmaf by the scale; the blocks' partials
 * added into y in block order, as the emulated atomics run). Cases run through the launcher cuda_mlp_fused where the
 * shared memory fits the device's 227 KiB, else the kernel directly. Also: the launcher's refusals (mixed or missing
 * weight pointers, FP8 with D % 16 != 0, misaligned FP8 pointers), the shared-memory sizes and the supported queries.
 * Exit 1 on a failed bound. */
// clang-format off
#define EMU_NO_SILU
#include "emu.h"      /* first: its macros replace CUDA's qualifiers */
#undef __host__
#define __host__
#include "cuda/ops.h"
// clang-format on

#include "emu_common.h"   /* common.cuh's helpers and trace stamps, as on the GPU */
static float emu_red[32]; /* the kernel's __shared__ red[32] (one CTA at a time) */
// clang-format off
#include "mlp_common.inc" /* bf_lo .. stage_norm_row from src/cuda/common.cuh (e4m3x2_f32, dot16_e4m3 with them) */
// clang-format on
#define MLP_TMA true /* the sm_90 path: W_dT (and its FP8 scale rows) by thread 0's bulk copies */
static inline void mlp_bulk_load(void *d, const void *s, unsigned n, void *d2 = nullptr, const void *s2 = nullptr,
                                 unsigned n2 = 0) { /* TMA: thread 0 */
    memcpy(d, s, n);
    if (n2) memcpy(d2, s2, n2);
}
static inline void mlp_bulk_wait() {}
/* the launchers' device queries: an H200 (132 SMs, 227 KiB of opt-in shared memory per block) */
static int emu_n_sm = 132;
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int) {
    *v = a == cudaDevAttrMaxSharedMemoryPerBlockOptin ? 227 * 1024 : emu_n_sm;
    return cudaSuccess;
}
// clang-format off
#include "mlp.inc" /* the kernel and its launchers */
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

/* e4m3fn (OCP): sign | 4 exponent bits (bias 7) | 3 mantissa bits; exponent 0: subnormal m/8 2^-6; no NaN codes */
static float e4m3_host(uint8_t v) {
    const int e = (v >> 3) & 15, m = v & 7;
    const float a = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return v & 0x80 ? -a : a;
}
/* rows of a scale table: rows padded to a multiple of 4 (ops.h FP8_SCALES_DOC, fp8_scale_ld) */
static int scale_ld(int rows) { return (rows + 3) & ~3; }
/* random e4m3 codes, the NaN codes 0x7f / 0xff left out */
static uint8_t *e4m3v(size_t n) {
    uint8_t *p = (uint8_t *)aligned_alloc(64, ((n + 63) / 64) * 64);
    for (size_t i = 0; i < n; i++) {
        uint8_t c;
        do c = (uint8_t)(urand() * 256);
        while ((c & 0x7f) == 0x7f);
        p[i] = c;
    }
    return p;
}
/* a scale table [nb][ld] for `rows` rows: base 2^e, e uniform in [-4, 4] per entry; padding rows NaN */
static float *scalev(int nb, int ld, int rows, float base) {
    float *p = (float *)aligned_alloc(64, (((size_t)nb * ld * 4 + 63) / 64) * 64);
    for (int b = 0; b < nb; b++)
        for (int r = 0; r < ld; r++) p[(size_t)b * ld + r] = r < rows ? ldexpf(base, (int)(urand() * 9) - 4) : NAN;
    return p;
}

static int fails, checks;
static void check(bool ok, const char *what, int D, int F, int G) {
    checks++;
    if (!ok) {
        fprintf(stderr, "FAIL: D %d F %d G %d: %s\n", D, F, G, what);
        fails++;
    }
}

/* cuda_matvec's FP8 row sum (gemv.cu, U 4 x 512 threads, splits 1, D <= 2048): lane l's sum over its steps
 * k = u*512 + 16l < D of fmaf(chain, scale, sum), the chain over the 16 columns from 0; then warp_sum_rows4's tree */
static float gemv_fp8_row(const uint8_t *W8, const float *sc, int ld, int r, const float *h, int D) {
    float acc[32];
    for (int l = 0; l < 32; l++) {
        float a = 0.0f;
        for (int u = 0; u < 4; u++) {
            const int k = u * 512 + 16 * l;
            if (k >= D) continue;
            float c = 0.0f;
            for (int j = 0; j < 16; j++) c = fmaf(e4m3_host(W8[(size_t)r * D + k + j]), h[k + j], c);
            a = fmaf(c, sc[(size_t)(k / 128) * ld + r], a);
        }
        acc[l] = a;
    }
    float t[8], v[4];
    for (int l = 0; l < 8; l++) t[l] = (acc[l] + acc[l + 16]) + (acc[l + 8] + acc[l + 24]);
    for (int l = 0; l < 4; l++) v[l] = t[l] + t[l + 4];
    return (v[0] + v[2]) + (v[1] + v[3]);
}

/* One shape. fp8: e4m3 weights + scales, else bf16. */
static void run_case(bool fp8, int D, int F, int G, int norm_mode, int n_parts) {
    const size_t ngu = (size_t)2 * F * D, nd = (size_t)D * F;
    const int ldgu = scale_ld(2 * F), nbd = (F + 127) / 128; /* s_gu [D/128][ldgu], s_dT [nbd][D] */
    uint16_t *Wgu = NULL, *Wd = NULL, *WdT = NULL;
    uint8_t *W8gu = NULL, *W8d = NULL, *W8dT = NULL;
    float *sgu = NULL, *sdT = NULL;
    float *Wgu_f = (float *)malloc(ngu * 4), *Wd_f = (float *)malloc(nd * 4); /* the dequantized values */
    if (fp8) {
        double ms = 0; /* mean square of an e4m3 code: the base scales give rows of rms ~2^e / sqrt(cols) */
        for (int c = 0; c < 256; c++)
            if ((c & 0x7f) != 0x7f) ms += (double)e4m3_host((uint8_t)c) * e4m3_host((uint8_t)c) / 254;
        W8gu = e4m3v(ngu), W8d = e4m3v(nd);
        sgu = scalev((D + 127) / 128, ldgu, 2 * F, (float)(1 / sqrt(ms * D)));
        sdT = scalev(nbd, scale_ld(D), D, (float)(1 / sqrt(ms * F)));
        W8dT = (uint8_t *)aligned_alloc(64, ((nd + 63) / 64) * 64);
        for (int r = 0; r < 2 * F; r++)
            for (int k = 0; k < D; k++)
                Wgu_f[(size_t)r * D + k] = e4m3_host(W8gu[(size_t)r * D + k]) * sgu[(size_t)(k / 128) * ldgu + r];
        for (int d = 0; d < D; d++)
            for (int i = 0; i < F; i++) {
                W8dT[(size_t)i * D + d] = W8d[(size_t)d * F + i];
                Wd_f[(size_t)d * F + i] = e4m3_host(W8d[(size_t)d * F + i]) * sdT[(size_t)(i / 128) * D + d];
            }
    } else {
        Wgu = bfv(ngu, 1.0f / sqrtf((float)D)), Wd = bfv(nd, 1.0f / sqrtf((float)F));
        WdT = (uint16_t *)aligned_alloc(64, ((nd * 2 + 63) / 64) * 64);
        for (int r = 0; r < D; r++)
            for (int i = 0; i < F; i++) WdT[(size_t)i * D + r] = Wd[(size_t)r * F + i];
        for (size_t i = 0; i < ngu; i++) Wgu_f[i] = bff(Wgu[i]);
        for (size_t i = 0; i < nd; i++) Wd_f[i] = bff(Wd[i]);
    }
    float *res = rbfv(D, 0, 1), *parts = rbfv((size_t)n_parts * D, 0, 0.5f);
    float *w = rbfv(D, norm_mode == NORM_PLAIN ? 1.0f : 0.0f, 0.2f), *y0 = rbfv(D, 0, 0.3f);
    float *y = nanv(D), *xo = nanv(D), *ho = nanv(D), *act = nanv(F);
    memcpy(y, y0, (size_t)D * 4);
    MlpFusedParams p;
    memset(&p, 0, sizeof p);
    if (fp8)
        p.w8_gu = W8gu, p.s_gu = sgu, p.w8_dT = W8dT, p.s_dT = sdT;
    else
        p.w_gu = Wgu, p.w_dT = WdT;
    p.D = D, p.F = F, p.blocks = G;
    p.x = res, p.parts = parts, p.n_parts = n_parts, p.x_out = xo;
    p.norm_w = w, p.norm_mode = norm_mode, p.eps = 1e-6f;
    p.y = y, p.h_out = ho, p.act_out = act, p.early_trigger = 1;
    const int nu_max = mlp_nu_max(F, G);
    const size_t smem = fp8 ? cuda_mlp_fused_smem_bytes_fp8(D, F, G) : cuda_mlp_fused_smem_bytes(D, F, G);
    const bool via_launcher = smem + 1024 <= 227 * 1024;
    if (via_launcher) {
        emu_max_smem.clear(); /* the default limit, raised by the launcher's cudaFuncSetAttribute above 40 KiB */
        const CudaLaunch l = {0, 1, NULL, 0};
        const long ctas0 = emu_ctas;
        const int rc = cuda_mlp_fused(&p, &l);
        check(rc == 0 && emu_ctas - ctas0 == G, "launcher refused or ran another grid", D, F, G);
    } else {
        const MlpFusedParams P = p;
        emu_launch(dim3(G), MLP_THREADS, smem, 1, [&] { fp8 ? mlp_fused<true>(P) : mlp_fused<false>(P); });
    }

    /* x, h on the host */
    int bad_x = 0, bad_h = 0, bad_a = 0, bad_y = 0, bad_ab = 0, bad_yb = 0;
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
    /* act from the kernel's h: the double bound, and (FP8) bit for bit the FP8 GEMV's order */
    for (int i = 0; i < F; i++) {
        double g = 0, u = 0, ag = 0, au = 0;
        for (int k = 0; k < D; k++) {
            const double vg = (double)Wgu_f[(size_t)(2 * i) * D + k] * ho[k];
            const double vu = (double)Wgu_f[(size_t)(2 * i + 1) * D + k] * ho[k];
            g += vg, u += vu, ag += fabs(vg), au += fabs(vu);
        }
        const float gb = rbf((float)g), ub = rbf((float)u);
        const float ref = rbf(rbf(gb / (1.0f + expf(-gb))) * ub);
        const double tol = 3 * (1e-5 * (ag + au) + 2e-6) * (1 + fabs(gb) + fabs(ub)) + 3.0 / 256 * fabs(ref);
        if (!(fabs((double)act[i] - ref) <= tol)) {
            if (bad_a < 4) fprintf(stderr, "  act[%d]: got %.8g ref %.8g\n", i, act[i], ref);
            bad_a++;
        }
        if (fp8) {
            const float gm = rbf(gemv_fp8_row(W8gu, sgu, ldgu, 2 * i, ho, D));
            const float um = rbf(gemv_fp8_row(W8gu, sgu, ldgu, 2 * i + 1, ho, D));
            const float am = rbf(rbf(gm / (1.0f + expf(-gm))) * um);
            if (memcmp(&am, &act[i], 4) != 0) {
                if (bad_ab < 4) fprintf(stderr, "  act[%d]: got %.9g, the FP8 GEMV's order %.9g\n", i, act[i], am);
                bad_ab++;
            }
        }
    }
    /* y - y0 = W_down act (double, dequantized weights) */
    for (int d = 0; d < D; d++) {
        double s = 0, a = 0;
        for (int i = 0; i < F; i++) {
            const double v = (double)Wd_f[(size_t)d * F + i] * act[i];
            s += v, a += fabs(v);
        }
        const double got = (double)y[d] - y0[d];
        if (!(fabs(got - s) <= 1e-5 * a + 1e-6 + 2e-7 * G * fabs(y0[d]))) {
            if (bad_y < 4) fprintf(stderr, "  y[%d] - y0: got %.8g ref %.8g\n", d, got, s);
            bad_y++;
        }
    }
    /* FP8: y bit for bit the documented order (block partials added in block order: the emulated atomics) */
    if (fp8) {
        float *ym = (float *)malloc((size_t)D * 4);
        memcpy(ym, y0, (size_t)D * 4);
        for (int b = 0; b < G; b++) {
            const int i0 = (int)((long long)b * F / G), i1 = (int)((long long)(b + 1) * F / G);
            for (int d = 0; d < D; d++) {
                float yb = 0.0f;
                for (int m = i0 / 128; m <= (i1 - 1) / 128; m++) {
                    float c = 0.0f;
                    for (int i = i0 > m * 128 ? i0 : m * 128; i < i1 && i < (m + 1) * 128; i++)
                        c = fmaf(act[i], e4m3_host(W8dT[(size_t)i * D + d]), c);
                    yb = fmaf(c, sdT[(size_t)m * D + d], yb);
                }
                ym[d] += yb;
            }
        }
        for (int d = 0; d < D; d++)
            if (memcmp(&ym[d], &y[d], 4) != 0) {
                if (bad_yb < 4) fprintf(stderr, "  y[%d]: got %.9g, the documented order %.9g\n", d, y[d], ym[d]);
                bad_yb++;
            }
        free(ym);
    }
    check(bad_x == 0, "x_out not bit-exact", D, F, G);
    check(bad_h == 0, "h_out", D, F, G);
    check(bad_a == 0, "act", D, F, G);
    check(bad_y == 0, "y", D, F, G);
    if (fp8) {
        check(bad_ab == 0, "act differs from the FP8 GEMV's order", D, F, G);
        check(bad_yb == 0, "y differs from the documented fp32 order", D, F, G);
    }
    printf(
        "  %s D %4d F %4d G %3d (%d-%d units per block, %s, smem %zu) norm %d parts %d: x_out %d, h %d, act %d, y %d "
        "bad",
        fp8 ? "fp8 " : "bf16", D, F, G, F / G, nu_max, via_launcher ? "launcher" : "kernel", smem, norm_mode, n_parts,
        bad_x, bad_h, bad_a, bad_y);
    if (fp8) printf("; bitwise: act %d, y %d differ", bad_ab, bad_yb);
    printf("\n");
    free(x), free(Wgu), free(Wd), free(WdT), free(W8gu), free(W8d), free(W8dT), free(sgu), free(sdT), free(Wgu_f);
    free(Wd_f), free(res), free(parts), free(w), free(y0), free(y), free(xo), free(ho), free(act);
}

/* the launcher's refusals and the size queries */
static void test_rejects(void) {
    float *buf = (float *)aligned_alloc(64, 1 << 16);
    memset(buf, 0, 1 << 16);
    const uint8_t *b8 = (const uint8_t *)buf;
    const CudaLaunch l = {0, 0, NULL, 0};
    emu_max_smem.clear();
    MlpFusedParams p, q;
    memset(&p, 0, sizeof p);
    p.D = 32, p.F = 8, p.blocks = 1, p.x = buf, p.norm_w = buf, p.norm_mode = NORM_ZC, p.eps = 1e-6f, p.y = buf + 1024;
    const long ctas0 = emu_ctas;
    q = p, q.w_gu = (const uint16_t *)buf;
    check(cuda_mlp_fused(&q, &l) == cudaErrorInvalidValue, "bf16 without w_dT accepted", 32, 8, 1);
    q.w_dT = (const uint16_t *)buf, q.w8_dT = b8, q.s_dT = buf;
    check(cuda_mlp_fused(&q, &l) == cudaErrorInvalidValue, "bf16 w_gu with FP8 w8_dT accepted", 32, 8, 1);
    q = p, q.w8_gu = b8, q.s_gu = buf, q.w8_dT = b8, q.s_dT = buf; /* complete FP8: the base of the variants below */
    MlpFusedParams f = q;
    f.w_gu = (const uint16_t *)buf;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 with w_gu set too accepted", 32, 8, 1);
    f = q, f.w_dT = (const uint16_t *)buf;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 with w_dT set too accepted", 32, 8, 1);
    f = q, f.w8_dT = NULL;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 without w8_dT accepted", 32, 8, 1);
    f = q, f.s_dT = NULL;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 without s_dT accepted", 32, 8, 1);
    f = q, f.s_gu = NULL;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 without s_gu accepted", 32, 8, 1);
    f = q, f.w8_gu = NULL, f.w_gu = (const uint16_t *)buf;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "bf16 w_gu with FP8 down accepted", 32, 8, 1);
    f = q, f.D = 24; /* D % 8 == 0 (bf16 takes it), D % 16 != 0 */
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 with D % 16 != 0 accepted", 24, 8, 1);
    f = q, f.w8_gu = b8 + 8;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "misaligned w8_gu accepted", 32, 8, 1);
    f = q, f.w8_dT = b8 + 8;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "misaligned w8_dT accepted", 32, 8, 1);
    f = q, f.s_gu = buf + 2;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "misaligned s_gu accepted", 32, 8, 1);
    f = q, f.s_dT = buf + 1;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "misaligned s_dT accepted", 32, 8, 1);
    f = q, f.D = 1040;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 with D > 1024 accepted", 1040, 8, 1);
    f = q, f.blocks = 9;
    check(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 with blocks > F accepted", 32, 8, 9);
    check(emu_ctas == ctas0, "a refused launch ran CTAs", 0, 0, 0);
    /* the complete sets themselves are taken (zero weights: one CTA runs) */
    check(cuda_mlp_fused(&q, &l) == 0 && emu_ctas == ctas0 + 1, "complete FP8 set refused", 32, 8, 1);
    q = p, q.w_gu = (const uint16_t *)buf, q.w_dT = (const uint16_t *)buf, q.D = 24;
    check(cuda_mlp_fused(&q, &l) == 0 && emu_ctas == ctas0 + 2, "bf16 D 24 refused", 24, 8, 1);
    /* sizes: xs 4096 + act 28 x 4 + W_dT 28 x 1024 x (2 bf16 | 1 fp8) + (fp8) 2 scale rows x 4096 */
    check(cuda_mlp_fused_smem_bytes(1024, 3584, 132) == 4096 + 112 + 57344, "bf16 smem of the 0.8B", 1024, 3584, 132);
    check(cuda_mlp_fused_smem_bytes_fp8(1024, 3584, 132) == 4096 + 112 + 28672 + 8192, "fp8 smem of the 0.8B", 1024,
          3584, 132);
    check(cuda_mlp_fused_supported_fp8(1024, 3584, 132) == 1, "FP8 0.8B shape not supported", 1024, 3584, 132);
    check(cuda_mlp_fused_supported(1000, 3584, 132) == 1 && cuda_mlp_fused_supported_fp8(1000, 3584, 132) == 0,
          "D 1000: bf16 supported, FP8 (D % 16 != 0) not", 1000, 3584, 132);
    check(cuda_mlp_fused_supported_fp8(2048, 6144, 132) == 0, "FP8 D 2048 reported as supported", 2048, 6144, 132);
    check(cuda_mlp_fused_supported_fp8(1024, 1 << 20, 132) == 0, "FP8 W_dT slice beyond shared memory supported", 1024,
          1 << 20, 132);
    /* a W_dT slice that fits as FP8 bytes but not as bf16: 150 units of 1024 columns (150 KiB vs 300 KiB) */
    check(cuda_mlp_fused_supported(1024, 150 * 132, 132) == 0 &&
              cuda_mlp_fused_supported_fp8(1024, 150 * 132, 132) == 1,
          "150 units per block: FP8 fits, bf16 not", 1024, 150 * 132, 132);
    printf("  launcher refusals and size queries checked\n");
    free(buf);
}

int main(int argc, char **argv) {
    const int full = argc > 1 && atoi(argv[1]) != 0; /* 1: also the 0.8B shape on 132 CTAs (~1 min) */
    printf("fused MLP kernel (src/cuda/mlp.cu) under the CUDA emulation:\n");
    {
        int bad = 0; /* the kernel's decode (the software path the emulation compiles) against the host's */
        for (int c = 0; c < 256; c++)
            if ((c & 0x7f) != 0x7f) {
                const float v = e4m3x2_f32((uint32_t)c << 8 | 0x38u).y, h = e4m3_host((uint8_t)c);
                bad += memcmp(&v, &h, 4) != 0;
            }
        check(bad == 0, "e4m3x2_f32 differs from the host decode", 0, 0, 0);
    }
    run_case(false, 256, 200, 100, NORM_ZC, 1);    /* ragged: 2 units per block */
    run_case(false, 256, 200, 7, NORM_PLAIN, 2);   /* 28-29 units: odd counts, a half pair */
    run_case(false, 512, 1000, 13, NORM_ZC, 1);    /* 76-77 units: warps loop over pairs */
    run_case(false, 1024, 3584, 5, NORM_ZC, 3);    /* the 0.8B rows on few CTAs: 716-717 units, all 4 column steps */
    run_case(false, 8, 2, 1, NORM_ZC, 1);          /* smallest */
    run_case(true, 256, 200, 100, NORM_ZC, 1);     /* FP8, ragged: 2 units per block, 2 scale blocks over F */
    run_case(true, 256, 201, 7, NORM_PLAIN, 2);    /* 28-29 units, odd F (s_gu padded to 404 rows), unit 128 inside */
    run_case(true, 1024, 1000, 13, NORM_ZC, 1);    /* 76-77 units: warps loop over pairs; both 512-column steps */
    run_case(true, 1024, 3000, 37, NORM_PLAIN, 1); /* 81-82 units per block, ragged F */
    run_case(true, 512, 1000, 3, NORM_ZC, 2);      /* 333-334 units: 3-4 scale blocks per CTA */
    run_case(true, 1024, 3584, 5, NORM_ZC, 3);     /* the 0.8B rows on few CTAs: 716-717 units, 6-7 scale blocks */
    run_case(true, 16, 2, 1, NORM_ZC, 1);          /* smallest FP8 */
    if (full) {
        run_case(false, 1024, 3584, 132, NORM_ZC, 1);
        run_case(true, 1024, 3584, 132, NORM_ZC, 1);
    }
    test_rejects();
    printf("mlp_emu: %d checks, %s\n", checks, fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
