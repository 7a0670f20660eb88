/* test_mlp.c — the EXPERIMENTAL fused MLP kernel (src/cuda/mlp.cu, cuda_mlp_fused) against CPU
 * references on fresh random bf16-valued inputs; x_out, h_out and act_out NaN-poisoned first, y
 * starting from random values (the kernel adds into it):
 *   x_out bit-exact (x = bf16(res + bf16(sum of parts)));
 *   h_out within one bf16 step (2^-7 relative) of the CPU RMSNorm with HF's rounding (zero-centred / plain);
 *   act (SwiGLU of the gate/up GEMV, from the kernel's own h) within the GEMV + SwiGLU bound, and
 *     BITWISE equal to cuda_matvec's gate_up GEMV (MV_IN_RESIDUAL + MV_OUT_SILU_MUL) on the same inputs;
 *   y - y0 against sum_i W_down[d][i] act[i] (double) within the split-K atomic bound of test_matvec;
 *   y against the whole fp32 CPU chain (cpu_rmsnorm, cpu_matvec, cpu_silu_mul, cpu_matvec) in rel L2;
 *   a second run close to the first (atomics: not bitwise), x_out / h_out / act bitwise the same.
 * Shapes: the 0.8B (D 1024, F 3584) on the default grid and on 37 blocks; Qwen3-0.6B's F 3072 with
 * the plain norm; ragged D 256, F 200 (default grid, and 7 blocks: 28-29 units, odd counts); D 512,
 * F 1000 on 13 blocks (76-77 units: warps loop over unit pairs); PDL on/off, early trigger on/off.
 * FP8 weights (w8_gu / s_gu / w8_dT / s_dT: random e4m3 codes without the NaN codes, one fp32 scale per row and
 * 128-column block in the device layout of ops.h FP8_SCALES_DOC, each 2^e times a base with e uniform in [-4, 4] per
 * entry, so a scale from the wrong row or block shows; scale padding NaN): the same checks on the dequantized weights
 * (e4m3 value * scale in fp32), act bitwise equal to cuda_matvec's FP8 gate_up GEMV (W8 + w8_scale, SILU_MUL), on the
 * 0.8B (default grid, 37 blocks), Qwen3-0.6B's F 3072, ragged D 256 F 201 (odd F: s_gu padded), D 1024 F 1000 on 13
 * blocks, and the smallest D 16.
 * Rejected shapes and pointers (FP8: mixed or missing weight pointers, D % 16 != 0, misaligned), the supported and
 * shared-memory queries. Usage: test_mlp [seed]. Skips (exit 0, "no GPU") without a GPU. */
#include "cpu/ops.h"
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"

static Rng rng;
static int n_sm = 132;

static float silu_ref(float x) { return x / (1.0f + expf(-x)); }

/* y[r] = sum_k W[r][k] x[k] in double, and the GEMV bound 1e-5 sum |W x| + 1e-6 per row. */
static void matvec_d(float *y, float *tol, const uint16_t *W, const float *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = 0, a = 0;
        for (int k = 0; k < cols; k++) {
            const double v = (double)bf16_to_f32(W[(size_t)r * cols + k]) * x[k];
            s += v, a += fabs(v);
        }
        y[r] = (float)s;
        if (tol) tol[r] = (float)(1e-5 * a + 1e-6);
    }
}

static void test_case(int D, int F, int blocks, int norm_mode, int n_parts, int pdl, int early) {
    const int G = blocks > 0 ? blocks : cuda_mlp_fused_blocks(F, n_sm);
    uint16_t *Wgu = bf16_random(&rng, (int64_t)2 * F * D, 1.0f / sqrtf((float)D));
    uint16_t *Wd = bf16_random(&rng, (int64_t)D * F, 1.0f / sqrtf((float)F));
    uint16_t *WdT = malloc(sizeof(uint16_t) * (size_t)F * D);
    float *res = f32_bf16_random(&rng, D, 1.0f, 0.0f), *parts = f32_bf16_random(&rng, (int64_t)n_parts * D, 0.5f, 0.0f);
    float *w = f32_bf16_random(&rng, D, 0.2f, norm_mode == NORM_PLAIN ? 1.0f : 0.0f);
    float *y0 = f32_bf16_random(&rng, D, 0.3f, 0.0f);
    float *x = malloc(sizeof(float) * D), *h = malloc(sizeof(float) * D), *gx = malloc(sizeof(float) * D);
    float *gh = malloc(sizeof(float) * D), *gy = malloc(sizeof(float) * D), *gy2 = malloc(sizeof(float) * D);
    float *gact = malloc(sizeof(float) * F), *gact2 = malloc(sizeof(float) * F), *mvact = malloc(sizeof(float) * F);
    float *gu = malloc(sizeof(float) * 2 * F), *gu_tol = malloc(sizeof(float) * 2 * F);
    float *aref = malloc(sizeof(float) * F), *atol = malloc(sizeof(float) * F);
    float *yref = malloc(sizeof(float) * D), *ytol = malloc(sizeof(float) * D), *gdiff = malloc(sizeof(float) * D);
    float *hf = malloc(sizeof(float) * D), *gf = malloc(sizeof(float) * 2 * F), *af = malloc(sizeof(float) * F);
    float *g_ = malloc(sizeof(float) * F), *u_ = malloc(sizeof(float) * F), *yf = malloc(sizeof(float) * D);
    for (int r = 0; r < D; r++)
        for (int i = 0; i < F; i++) WdT[(size_t)i * D + r] = Wd[(size_t)r * F + i];
    uint16_t *dWgu = dev_copy(Wgu, (size_t)2 * F * D * 2), *dWdT = dev_copy(WdT, (size_t)F * D * 2);
    float *dres = dev_copy(res, sizeof(float) * D), *dparts = dev_copy(parts, sizeof(float) * n_parts * D);
    float *dw = dev_copy(w, sizeof(float) * D), *dy = dev_copy(y0, sizeof(float) * D);
    float *dxo = dev_poison(sizeof(float) * D), *dho = dev_poison(sizeof(float) * D);
    float *dact = dev_poison(sizeof(float) * F), *dmv = dev_poison(sizeof(float) * F),
          *dxo2 = dev_poison(sizeof(float) * D);
    CudaLaunch l = {0, pdl, NULL, 0};
    char what[128];
    snprintf(what, sizeof what, "mlp D %d F %d blocks %d norm %d parts %d pdl %d early %d", D, F, G, norm_mode, n_parts,
             pdl, early);
    if (!dWgu || !dWdT || !dres || !dparts || !dw || !dy || !dxo || !dho || !dact || !dmv || !dxo2) {
        CHECK(0, "%s: device alloc", what);
        goto done;
    }
    /* host x exactly as the kernel forms it; h with the GEMV prologue's bf16 rounding */
    for (int i = 0; i < D; i++) {
        float a = 0;
        for (int s = 0; s < n_parts; s++) a += parts[(size_t)s * D + i];
        x[i] = round_bf16(res[i] + round_bf16(a));
    }
    {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
        const float r = 1.0f / sqrtf((float)(ss / D) + 1e-6f);
        for (int i = 0; i < D; i++)
            h[i] =
                norm_mode == NORM_ZC ? round_bf16(x[i] * r * (1.0f + w[i])) : round_bf16(w[i] * round_bf16(x[i] * r));
    }

    MlpFusedParams p;
    memset(&p, 0, sizeof p);
    p.w_gu = dWgu, p.w_dT = dWdT, p.D = D, p.F = F, p.blocks = blocks;
    p.x = dres, p.parts = dparts, p.n_parts = n_parts, p.x_out = dxo;
    p.norm_w = dw, p.norm_mode = norm_mode, p.eps = 1e-6f;
    p.y = dy, p.h_out = dho, p.act_out = dact, p.early_trigger = early;
    LAUNCH(cuda_mlp_fused(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(gx, dxo, sizeof(float) * D, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gh, dho, sizeof(float) * D, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gact, dact, sizeof(float) * F, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gy, dy, sizeof(float) * D, cudaMemcpyDeviceToHost));

    CHECK(memcmp(gx, x, sizeof(float) * D) == 0, "%s: x_out not bit-exact", what);
    CHECK(count_bad("h_out", gh, h, D, 2.0 / 256, 1e-6) == 0, "%s: h_out", what);
    /* act from the kernel's own h: g, u rounded to bf16, then HF's SwiGLU rounding */
    matvec_d(gu, gu_tol, Wgu, gh, 2 * F, D);
    for (int i = 0; i < F; i++) {
        const float g = round_bf16(gu[2 * i]), u = round_bf16(gu[2 * i + 1]);
        aref[i] = round_bf16(round_bf16(silu_ref(g)) * u);
        atol[i] = 3 * (gu_tol[2 * i] + gu_tol[2 * i + 1]) * (1 + fabsf(g) + fabsf(u));
    }
    CHECK(count_bad_tol("act", gact, aref, atol, F, 3.0 / 256) == 0, "%s: act", what);
    int64_t nonbf = 0;
    for (int i = 0; i < F; i++) nonbf += gact[i] != round_bf16(gact[i]);
    CHECK(nonbf == 0, "%s: %lld act values not bf16", what, (long long)nonbf);
    /* act bitwise = the gate_up GEMV of the default path */
    {
        MatvecParams mv;
        memset(&mv, 0, sizeof mv);
        mv.W = dWgu, mv.rows = 2 * F, mv.cols = D, mv.splits = 1, mv.in_mode = MV_IN_RESIDUAL;
        mv.x = dres, mv.parts = dparts, mv.n_parts = n_parts, mv.x_out = dxo2;
        mv.norm_w = dw, mv.norm_mode = norm_mode, mv.eps = 1e-6f, mv.out_mode = MV_OUT_SILU_MUL, mv.y = dmv;
        LAUNCH(cuda_matvec(&mv, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(mvact, dmv, sizeof(float) * F, cudaMemcpyDeviceToHost));
        int64_t diff = 0;
        for (int i = 0; i < F; i++) diff += memcmp(&mvact[i], &gact[i], sizeof(float)) != 0;
        CHECK(diff == 0, "%s: act differs from the gate_up GEMV at %lld of %d units", what, (long long)diff, F);
    }
    /* y - y0 = W_down act (from the kernel's act); the y0 add is one more fp32 rounding per block */
    matvec_d(yref, ytol, Wd, gact, D, F);
    for (int d = 0; d < D; d++) {
        gdiff[d] = gy[d] - y0[d];
        ytol[d] += (float)(2e-7 * G * fabs(y0[d]) + 1e-6 * fabs(y0[d]));
    }
    CHECK(count_bad_tol("y - y0", gdiff, yref, ytol, D, 0) == 0, "%s: y", what);
    /* the whole chain in fp32 on the CPU (no bf16 rounding of h, g, u, act): only those roundings apart */
    {
        cpu_rmsnorm(hf, x, w, 1, D, 1e-6f, norm_mode == NORM_ZC);
        cpu_matvec(gf, hf, Wgu, DT_BF16, 2 * F, D);
        for (int i = 0; i < F; i++) g_[i] = gf[2 * i], u_[i] = gf[2 * i + 1];
        cpu_silu_mul(af, g_, u_, F);
        cpu_matvec(yf, af, Wd, DT_BF16, D, F);
        for (int d = 0; d < D; d++) gdiff[d] = gy[d] - y0[d];
        const double e = rel_l2(gdiff, yf, D);
        CHECK(e < 2e-2, "%s: rel L2 %.4g vs the fp32 CPU chain", what, e);
        if (D == 1024 && F == 3584 && blocks == 0) printf("  %s: rel L2 vs fp32 CPU %.4g\n", what, e);
    }
    /* second run from y0 again: act, x_out, h_out bitwise the same; y within the atomic bound */
    CU(cudaMemcpy(dy, y0, sizeof(float) * D, cudaMemcpyHostToDevice));
    CU(cudaMemset(dact, 0xff, sizeof(float) * F));
    CU(cudaMemset(dxo, 0xff, sizeof(float) * D));
    LAUNCH(cuda_mlp_fused(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(gact2, dact, sizeof(float) * F, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gy2, dy, sizeof(float) * D, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gx, dxo, sizeof(float) * D, cudaMemcpyDeviceToHost));
    CHECK(memcmp(gact, gact2, sizeof(float) * F) == 0, "%s: act differs between runs", what);
    CHECK(memcmp(gx, x, sizeof(float) * D) == 0, "%s: x_out differs in run 2", what);
    for (int d = 0; d < D; d++) gdiff[d] = gy2[d] - y0[d];
    CHECK(count_bad_tol("y run 2", gdiff, yref, ytol, D, 0) == 0, "%s: y run 2", what);
done:
    cudaFree(dWgu), cudaFree(dWdT), cudaFree(dres), cudaFree(dparts), cudaFree(dw), cudaFree(dy), cudaFree(dxo);
    cudaFree(dho), cudaFree(dact), cudaFree(dmv), cudaFree(dxo2);
    free(Wgu), free(Wd), free(WdT), free(res), free(parts), free(w), free(y0), free(x), free(h), free(gx), free(gh);
    free(gy), free(gy2), free(gact), free(gact2), free(mvact), free(gu), free(gu_tol), free(aref), free(atol);
    free(yref), free(ytol), free(gdiff), free(hf), free(gf), free(af), free(g_), free(u_), free(yf);
}

/* y[r] = sum_k W[r][k] x[k] in double for fp32 W (the dequantized FP8 values), and the GEMV bound as matvec_d. */
static void matvec_df(float *y, float *tol, const float *W, const float *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = 0, a = 0;
        for (int k = 0; k < cols; k++) {
            const double v = (double)W[(size_t)r * cols + k] * x[k];
            s += v, a += fabs(v);
        }
        y[r] = (float)s;
        if (tol) tol[r] = (float)(1e-5 * a + 1e-6);
    }
}
/* n random e4m3 codes, the NaN codes 0x7f / 0xff left out */
static uint8_t *e4m3_random(size_t n) {
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t c;
        do c = (uint8_t)rng_u64(&rng);
        while ((c & 0x7f) == 0x7f);
        p[i] = c;
    }
    return p;
}
/* a scale table [nb][ld] for `rows` rows (FP8_SCALES_DOC): base 2^e, e uniform in [-4, 4] per entry; padding NaN */
static float *scales_random(int nb, int ld, int rows, float base) {
    float *p = malloc(sizeof(float) * (size_t)nb * ld);
    for (int b = 0; b < nb; b++)
        for (int r = 0; r < ld; r++)
            p[(size_t)b * ld + r] = r < rows ? ldexpf(base, (int)(rng_u64(&rng) % 9) - 4) : NAN;
    return p;
}

/* The FP8 weights (ops.h MlpFusedParams w8_gu .. s_dT): test_case's checks on the dequantized weights, act bitwise
 * cuda_matvec's FP8 gate_up GEMV. */
static void test_case_fp8(int D, int F, int blocks, int norm_mode, int n_parts, int pdl, int early) {
    const int G = blocks > 0 ? blocks : cuda_mlp_fused_blocks(F, n_sm);
    const int ldgu = fp8_scale_ld(2 * F), nbk = (D + 127) / 128, nbf = (F + 127) / 128, ldd = fp8_scale_ld(D);
    const size_t ngu = (size_t)2 * F * D, nd = (size_t)D * F;
    double ms = 0; /* mean square of an e4m3 code: the base scales give rows of rms ~2^e / sqrt(cols) */
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f) ms += (double)fp8_e4m3_to_f32((uint8_t)c) * fp8_e4m3_to_f32((uint8_t)c) / 254;
    uint8_t *W8gu = e4m3_random(ngu), *W8d = e4m3_random(nd), *W8dT = malloc(nd);
    float *sgu = scales_random(nbk, ldgu, 2 * F, (float)(1 / sqrt(ms * D)));
    float *sdT = scales_random(nbf, ldd, D, (float)(1 / sqrt(ms * F)));
    float *Wgu_f = malloc(sizeof(float) * ngu), *Wd_f = malloc(sizeof(float) * nd);
    float *res = f32_bf16_random(&rng, D, 1.0f, 0.0f), *parts = f32_bf16_random(&rng, (int64_t)n_parts * D, 0.5f, 0.0f);
    float *w = f32_bf16_random(&rng, D, 0.2f, norm_mode == NORM_PLAIN ? 1.0f : 0.0f);
    float *y0 = f32_bf16_random(&rng, D, 0.3f, 0.0f);
    float *x = malloc(sizeof(float) * D), *h = malloc(sizeof(float) * D), *gx = malloc(sizeof(float) * D);
    float *gh = malloc(sizeof(float) * D), *gy = malloc(sizeof(float) * D), *gy2 = malloc(sizeof(float) * D);
    float *gact = malloc(sizeof(float) * F), *gact2 = malloc(sizeof(float) * F), *mvact = malloc(sizeof(float) * F);
    float *gu = malloc(sizeof(float) * 2 * F), *gu_tol = malloc(sizeof(float) * 2 * F);
    float *aref = malloc(sizeof(float) * F), *atol = malloc(sizeof(float) * F);
    float *yref = malloc(sizeof(float) * D), *ytol = malloc(sizeof(float) * D), *gdiff = malloc(sizeof(float) * D);
    float *hf = malloc(sizeof(float) * D), *gf = malloc(sizeof(float) * 2 * F), *af = malloc(sizeof(float) * F);
    float *g_ = malloc(sizeof(float) * F), *u_ = malloc(sizeof(float) * F), *yf = malloc(sizeof(float) * D);
    for (int r = 0; r < 2 * F; r++)
        for (int k = 0; k < D; k++)
            Wgu_f[(size_t)r * D + k] = fp8_e4m3_to_f32(W8gu[(size_t)r * D + k]) * sgu[(size_t)(k / 128) * ldgu + r];
    for (int d = 0; d < D; d++)
        for (int i = 0; i < F; i++) {
            W8dT[(size_t)i * D + d] = W8d[(size_t)d * F + i];
            Wd_f[(size_t)d * F + i] = fp8_e4m3_to_f32(W8d[(size_t)d * F + i]) * sdT[(size_t)(i / 128) * ldd + d];
        }
    uint8_t *dW8gu = dev_copy(W8gu, ngu), *dW8dT = dev_copy(W8dT, nd);
    float *dsgu = dev_copy(sgu, sizeof(float) * (size_t)nbk * ldgu), *dsdT = dev_copy(sdT, sizeof(float) * nbf * ldd);
    float *dres = dev_copy(res, sizeof(float) * D), *dparts = dev_copy(parts, sizeof(float) * n_parts * D);
    float *dw = dev_copy(w, sizeof(float) * D), *dy = dev_copy(y0, sizeof(float) * D);
    float *dxo = dev_poison(sizeof(float) * D), *dho = dev_poison(sizeof(float) * D);
    float *dact = dev_poison(sizeof(float) * F), *dmv = dev_poison(sizeof(float) * F),
          *dxo2 = dev_poison(sizeof(float) * D);
    CudaLaunch l = {0, pdl, NULL, 0};
    char what[128];
    snprintf(what, sizeof what, "mlp fp8 D %d F %d blocks %d norm %d parts %d pdl %d early %d", D, F, G, norm_mode,
             n_parts, pdl, early);
    if (!dW8gu || !dW8dT || !dsgu || !dsdT || !dres || !dparts || !dw || !dy || !dxo || !dho || !dact || !dmv ||
        !dxo2) {
        CHECK(0, "%s: device alloc", what);
        goto done;
    }
    for (int i = 0; i < D; i++) {
        float a = 0;
        for (int s = 0; s < n_parts; s++) a += parts[(size_t)s * D + i];
        x[i] = round_bf16(res[i] + round_bf16(a));
    }
    {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
        const float r = 1.0f / sqrtf((float)(ss / D) + 1e-6f);
        for (int i = 0; i < D; i++)
            h[i] =
                norm_mode == NORM_ZC ? round_bf16(x[i] * r * (1.0f + w[i])) : round_bf16(w[i] * round_bf16(x[i] * r));
    }

    MlpFusedParams p;
    memset(&p, 0, sizeof p);
    p.w8_gu = dW8gu, p.s_gu = dsgu, p.w8_dT = dW8dT, p.s_dT = dsdT, p.D = D, p.F = F, p.blocks = blocks;
    p.x = dres, p.parts = dparts, p.n_parts = n_parts, p.x_out = dxo;
    p.norm_w = dw, p.norm_mode = norm_mode, p.eps = 1e-6f;
    p.y = dy, p.h_out = dho, p.act_out = dact, p.early_trigger = early;
    LAUNCH(cuda_mlp_fused(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(gx, dxo, sizeof(float) * D, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gh, dho, sizeof(float) * D, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gact, dact, sizeof(float) * F, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gy, dy, sizeof(float) * D, cudaMemcpyDeviceToHost));

    CHECK(memcmp(gx, x, sizeof(float) * D) == 0, "%s: x_out not bit-exact", what);
    CHECK(count_bad("h_out", gh, h, D, 2.0 / 256, 1e-6) == 0, "%s: h_out", what);
    matvec_df(gu, gu_tol, Wgu_f, gh, 2 * F, D);
    for (int i = 0; i < F; i++) {
        const float g = round_bf16(gu[2 * i]), u = round_bf16(gu[2 * i + 1]);
        aref[i] = round_bf16(round_bf16(silu_ref(g)) * u);
        atol[i] = 3 * (gu_tol[2 * i] + gu_tol[2 * i + 1]) * (1 + fabsf(g) + fabsf(u));
    }
    CHECK(count_bad_tol("act", gact, aref, atol, F, 3.0 / 256) == 0, "%s: act", what);
    int64_t nonbf = 0;
    for (int i = 0; i < F; i++) nonbf += gact[i] != round_bf16(gact[i]);
    CHECK(nonbf == 0, "%s: %lld act values not bf16", what, (long long)nonbf);
    /* act bitwise = the FP8 gate_up GEMV (splits 1) */
    {
        MatvecParams mv;
        memset(&mv, 0, sizeof mv);
        mv.W8 = dW8gu, mv.w8_scale = dsgu, mv.rows = 2 * F, mv.cols = D, mv.splits = 1, mv.in_mode = MV_IN_RESIDUAL;
        mv.x = dres, mv.parts = dparts, mv.n_parts = n_parts, mv.x_out = dxo2;
        mv.norm_w = dw, mv.norm_mode = norm_mode, mv.eps = 1e-6f, mv.out_mode = MV_OUT_SILU_MUL, mv.y = dmv;
        LAUNCH(cuda_matvec(&mv, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(mvact, dmv, sizeof(float) * F, cudaMemcpyDeviceToHost));
        int64_t diff = 0;
        for (int i = 0; i < F; i++) diff += memcmp(&mvact[i], &gact[i], sizeof(float)) != 0;
        CHECK(diff == 0, "%s: act differs from the FP8 gate_up GEMV at %lld of %d units", what, (long long)diff, F);
    }
    /* y - y0 = W_down act (dequantized, from the kernel's act) */
    matvec_df(yref, ytol, Wd_f, gact, D, F);
    for (int d = 0; d < D; d++) {
        gdiff[d] = gy[d] - y0[d];
        ytol[d] += (float)(2e-7 * G * fabs(y0[d]) + 1e-6 * fabs(y0[d]));
    }
    CHECK(count_bad_tol("y - y0", gdiff, yref, ytol, D, 0) == 0, "%s: y", what);
    /* the whole chain in fp32 on the CPU on the dequantized weights: only the bf16 roundings apart */
    {
        cpu_rmsnorm(hf, x, w, 1, D, 1e-6f, norm_mode == NORM_ZC);
        cpu_matvec(gf, hf, Wgu_f, DT_F32, 2 * F, D);
        for (int i = 0; i < F; i++) g_[i] = gf[2 * i], u_[i] = gf[2 * i + 1];
        cpu_silu_mul(af, g_, u_, F);
        cpu_matvec(yf, af, Wd_f, DT_F32, D, F);
        for (int d = 0; d < D; d++) gdiff[d] = gy[d] - y0[d];
        const double e = rel_l2(gdiff, yf, D);
        CHECK(e < 2e-2, "%s: rel L2 %.4g vs the fp32 CPU chain", what, e);
        if (D == 1024 && F == 3584 && blocks == 0) printf("  %s: rel L2 vs fp32 CPU %.4g\n", what, e);
    }
    /* second run from y0 again: act, x_out bitwise the same; y within the atomic bound */
    CU(cudaMemcpy(dy, y0, sizeof(float) * D, cudaMemcpyHostToDevice));
    CU(cudaMemset(dact, 0xff, sizeof(float) * F));
    CU(cudaMemset(dxo, 0xff, sizeof(float) * D));
    LAUNCH(cuda_mlp_fused(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(gact2, dact, sizeof(float) * F, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gy2, dy, sizeof(float) * D, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gx, dxo, sizeof(float) * D, cudaMemcpyDeviceToHost));
    CHECK(memcmp(gact, gact2, sizeof(float) * F) == 0, "%s: act differs between runs", what);
    CHECK(memcmp(gx, x, sizeof(float) * D) == 0, "%s: x_out differs in run 2", what);
    for (int d = 0; d < D; d++) gdiff[d] = gy2[d] - y0[d];
    CHECK(count_bad_tol("y run 2", gdiff, yref, ytol, D, 0) == 0, "%s: y run 2", what);
done:
    cudaFree(dW8gu), cudaFree(dW8dT), cudaFree(dsgu), cudaFree(dsdT), cudaFree(dres), cudaFree(dparts), cudaFree(dw);
    cudaFree(dy), cudaFree(dxo), cudaFree(dho), cudaFree(dact), cudaFree(dmv), cudaFree(dxo2);
    free(W8gu), free(W8d), free(W8dT), free(sgu), free(sdT), free(Wgu_f), free(Wd_f), free(res), free(parts), free(w);
    free(y0), free(x), free(h), free(gx), free(gh), free(gy), free(gy2), free(gact), free(gact2), free(mvact), free(gu);
    free(gu_tol), free(aref), free(atol), free(yref), free(ytol), free(gdiff), free(hf), free(gf), free(af), free(g_);
    free(u_), free(yf);
}

static void test_rejects(void) {
    float *d = dev_copy(NULL, 1 << 16);
    CudaLaunch l = {0, 0, NULL, 0};
    MlpFusedParams p;
    memset(&p, 0, sizeof p);
    p.w_gu = (const uint16_t *)d, p.w_dT = (const uint16_t *)d, p.D = 16, p.F = 8, p.x = d, p.norm_w = d;
    p.norm_mode = NORM_ZC, p.eps = 1e-6f, p.y = d + 1024;
    p.D = 12;
    CHECK(cuda_mlp_fused(&p, &l) == cudaErrorInvalidValue, "D %% 8 != 0 accepted");
    p.D = 1032;
    CHECK(cuda_mlp_fused(&p, &l) == cudaErrorInvalidValue, "D > 1024 accepted");
    p.D = 16, p.y = d + 1025;
    CHECK(cuda_mlp_fused(&p, &l) == cudaErrorInvalidValue, "misaligned y accepted");
    p.y = d + 1024, p.blocks = 9;
    CHECK(cuda_mlp_fused(&p, &l) == cudaErrorInvalidValue, "blocks > F accepted");
    p.blocks = 0, p.x_out = d;
    CHECK(cuda_mlp_fused(&p, &l) == cudaErrorInvalidValue, "x_out == x accepted");
    p.x_out = NULL, p.norm_mode = NORM_NONE;
    CHECK(cuda_mlp_fused(&p, &l) == cudaErrorInvalidValue, "no norm accepted");
    p.norm_mode = NORM_ZC, p.w_dT = NULL;
    CHECK(cuda_mlp_fused(&p, &l) == cudaErrorInvalidValue, "missing W_dT accepted");
    CHECK(cuda_mlp_fused_supported(1024, 3584, n_sm) == 1, "the 0.8B shape is not supported");
    CHECK(cuda_mlp_fused_supported(2048, 6144, n_sm) == 0, "D 2048 reported as supported");
    CHECK(cuda_mlp_fused_supported(1024, 1 << 20, n_sm) == 0, "a W_dT slice beyond shared memory reported supported");
    /* FP8: all four pointers or none, no bf16 weight with them, D % 16 == 0, 16-byte aligned */
    {
        const uint8_t *b8 = (const uint8_t *)d;
        MlpFusedParams q = p, f;
        q.w_gu = NULL, q.w_dT = NULL, q.w8_gu = b8, q.s_gu = d, q.w8_dT = b8, q.s_dT = d, q.D = 32;
        f = q, f.w_gu = (const uint16_t *)d;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 with w_gu set too accepted");
        f = q, f.w_dT = (const uint16_t *)d;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 with w_dT set too accepted");
        f = q, f.w8_dT = NULL;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 without w8_dT accepted");
        f = q, f.s_dT = NULL;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 without s_dT accepted");
        f = q, f.s_gu = NULL;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 without s_gu accepted");
        f = q, f.w8_gu = NULL, f.w_gu = (const uint16_t *)d;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "bf16 w_gu with FP8 down accepted");
        f = q, f.D = 24;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "FP8 with D %% 16 != 0 accepted");
        f = q, f.w8_dT = b8 + 8;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "misaligned w8_dT accepted");
        f = q, f.s_dT = d + 1;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "misaligned s_dT accepted");
        f = q, f.s_gu = d + 2;
        CHECK(cuda_mlp_fused(&f, &l) == cudaErrorInvalidValue, "misaligned s_gu accepted");
    }
    CHECK(cuda_mlp_fused_supported_fp8(1024, 3584, n_sm) == 1, "the 0.8B shape is not supported with FP8");
    CHECK(cuda_mlp_fused_supported_fp8(1000, 3584, n_sm) == 0, "FP8 D 1000 (%% 16 != 0) reported as supported");
    CHECK(cuda_mlp_fused_supported_fp8(2048, 6144, n_sm) == 0, "FP8 D 2048 reported as supported");
    CHECK(cuda_mlp_fused_supported_fp8(1024, 1 << 20, n_sm) == 0,
          "FP8: a slice beyond shared memory reported supported");
    CHECK(cuda_mlp_fused_smem_bytes_fp8(1024, 3584, 132) < cuda_mlp_fused_smem_bytes(1024, 3584, 132),
          "FP8 shared memory not below bf16's");
    cudaDeviceSynchronize();
    cudaFree(d);
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("mlp");
    rng_seed(&rng, test_seed(argc, argv, "test_mlp"));
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    test_case(1024, 3584, 0, NORM_ZC, 1, 1, 1); /* Qwen3.5-0.8B, the engine's launch */
    test_case(1024, 3584, 0, NORM_ZC, 1, 1, 0);
    test_case(1024, 3584, 37, NORM_ZC, 3, 0, 0);   /* 96-97 units per block: warps loop */
    test_case(1024, 3072, 0, NORM_PLAIN, 1, 1, 1); /* Qwen3-0.6B */
    test_case(256, 200, 0, NORM_ZC, 1, 1, 1);      /* ragged: 2 units per block */
    test_case(256, 200, 7, NORM_PLAIN, 2, 1, 0);   /* 28-29 units: odd counts */
    test_case(512, 1000, 13, NORM_ZC, 1, 0, 1);    /* 76-77 units */
    test_case(8, 2, 0, NORM_ZC, 1, 1, 1);          /* smallest: one block, one pair */
    test_case_fp8(1024, 3584, 0, NORM_ZC, 1, 1, 1);    /* Qwen3.5-0.8B with FP8 weights */
    test_case_fp8(1024, 3584, 37, NORM_ZC, 3, 0, 0);   /* 96-97 units per block: warps loop */
    test_case_fp8(1024, 3072, 0, NORM_PLAIN, 1, 1, 1); /* Qwen3-0.6B */
    test_case_fp8(256, 201, 0, NORM_ZC, 1, 1, 1);      /* ragged, odd F (s_gu padded): 2 units per block */
    test_case_fp8(256, 201, 7, NORM_PLAIN, 2, 1, 0);   /* 28-29 units: odd counts, unit 128 inside a block */
    test_case_fp8(1024, 1000, 13, NORM_ZC, 1, 0, 1);   /* 76-77 units */
    test_case_fp8(16, 2, 0, NORM_ZC, 1, 1, 1);         /* smallest FP8 */
    test_rejects();
    return TEST_SUMMARY("mlp");
}
