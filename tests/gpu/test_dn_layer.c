/* test_dn_layer.c — cuda_dn_layer (src/cuda/deltanet_layer.cu: the DeltaNet layer's in_proj, step, gated norm and
 * out_proj in one kernel) against the three kernels it replaces, on fresh random weights and inputs, over
 * consecutive steps with the state and the conv ring carried:
 *   in_proj GEMV (cuda_matvec, MV_IN_RESIDUAL or MV_IN_EMBED, 512 threads) -> cuda_deltanet_step (gated_out)
 *   -> out_proj GEMV (MV_IN_GATED, split-K atomic).
 * Bitwise equal: the in_proj rows, the new residual x, o, the state S and the whole conv ring (the fused
 * kernel computes them in the same order); within 2e-5 of max |y|: out_proj's y (16 head partials instead of
 * the GEMV's split partials, both summed by fp32 atomics). The zero buffers must be zeroed; bad shapes are
 * refused without a launch. Both exchange modes (clusters where every head's cluster of 8 fits, not for 16
 * heads on a 132-SM H200; global memory). The step kernel and the GEMVs are checked against the CPU in
 * test_deltanet and test_matvec; the whole model with the fused kernel in test_decode.
 * The global-memory mode has ONE exchange per layer (deltanet_layer.cu DL_X1_SLOT): S^T k and S^T q are
 * summed over the 8 blocks' 16-row partials, so o and S differ from the three kernels by fp32 rounding: the
 * in_proj rows, x_out and the ring bitwise; o within one bf16 step (2^-7 relative) of each value plus 2^-16 of the
 * largest (an o near 0 is a cancellation, seed 1215301113: 1.33e-8 vs 1.28e-8), S within
 * 1e-5 of max |S|, y within 1e-2 of max |y| (an o one bf16 step off moves y by ~2^-8 of a term). Its words are
 * tagged with the round's epoch (xbuf starts poisoned, 0xff bytes, so the first round's epoch wraps to 0 and
 * every stale word carries another tag).
 * Each case again with FP8 weights (ops.h DnLayerParams w8_in / w8_out, in_proj_b / a bf16 in w_ba) against the FP8
 * GEMVs (and a bf16 GEMV for the b / a rows), with the same bounds.
 * Usage: test_dn_layer [seed]. Skips without a GPU. */
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"

typedef struct Case {
    const char *name;
    int D, H, K, steps, pos0, embed, F; /* F: the MLP tail's intermediate size (0: the mixer only) */
} Case;

static Rng rng;

static int cmp_bits(const char *what, const void *a, const void *b, size_t bytes) {
    if (memcmp(a, b, bytes) == 0) return 1;
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (i < bytes && x[i] == y[i]) i++;
    fprintf(stderr, "  %s: first differing byte %zu of %zu\n", what, i, bytes);
    return 0;
}

/* gm: the heads exchange through global memory (xbuf / xcnt), else through their clusters */
/* FP8 copy of the bf16 matrix w [rows][cols] (fp8_quantize_blocks) and its scales in the device layout (ops.h
 * FP8_SCALES_DOC), on the device: *d8, *dsc. */
static void fp8_dev(const uint16_t *w, int rows, int cols, uint8_t **d8, float **dsc) {
    const size_t nb = (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
    float *f = calloc((size_t)rows * cols, sizeof(float)), *bs = calloc(nb, sizeof(float));
    uint8_t *q = calloc((size_t)rows * cols, 1);
    float *sd = calloc(fp8_scale_count(rows, cols), sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++) f[i] = bf16_to_f32(w[i]);
    fp8_quantize_blocks(q, bs, f, rows, cols);
    fp8_scales_per_row(sd, fp8_scale_ld(rows), 0, 1, bs, rows, cols);
    *d8 = dev_copy(q, (size_t)rows * cols);
    *dsc = dev_copy(sd, sizeof(float) * fp8_scale_count(rows, cols));
    free(f), free(bs), free(q), free(sd);
}

/* fp8: the q/k/v/z rows of in_proj and out_proj as FP8 (in_proj_b / a bf16), against the FP8 GEMVs (and a bf16 GEMV
 * for the b / a rows) */
static void run_case(const Case *c, int n_sm, int gm, int mlp, int onex, int fp8) {
    const int D = c->D, H = c->H, dk = 128, dv = 128, K = c->K, kd = H * dk, vd = H * dv, cd = 2 * kd + vd;
    const int rows = cd + vd + 2 * H, V = 8, F = mlp ? c->F : 1;
    const size_t nS = (size_t)H * dk * dv;
    const int sup = cuda_dn_layer_supported(D, H, H, dk, dv, K);
    const int sup_mlp = 0;
    printf("-- %s%s: D %d, %d heads, K %d, %d steps from pos %d%s; exchange through %s (supported: %d)%s%s\n",
           c->name, fp8 ? " (fp8)" : "", D, H, K, c->steps, c->pos0, c->embed ? ", embedding input" : "",
           gm ? "global memory" : "clusters", sup,
           mlp ? "; with the MLP tail" : "",
           onex == 2 ? "; ONE exchange, tagged words (onex 2)"
           : onex    ? "; ONE exchange, arrival counter (onex 1)"
                     : "");
    if (sup < (gm ? 1 : 2) || (mlp && !sup_mlp)) { /* the grid (8 blocks per head, one per SM) or its clusters */
        CHECK(!gm || n_sm < 8 * H, "%s: not supported with %d SMs", c->name, n_sm);
        printf("   skipped: does not fit on this device\n");
        return;
    }
    uint16_t *w_in = bf16_random(&rng, (int64_t)rows * D, 0.04f), *w_out = bf16_random(&rng, (int64_t)D * vd, 0.03f);
    uint16_t *emb = bf16_random(&rng, (int64_t)V * D, 1.0f), *ring = calloc((size_t)K * cd, 2);
    float *ln1 = f32_bf16_random(&rng, D, 0.1f, 0.0f), *conv_w = f32_bf16_random(&rng, (int64_t)cd * K, 0.5f, 0.0f);
    float *A_log = malloc(sizeof(float) * H), *dt_bias = malloc(sizeof(float) * H);
    float *norm_w = f32_bf16_random(&rng, dv, 0.2f, 1.0f), *S = malloc(sizeof(float) * nS);
    float *x = f32_bf16_random(&rng, D, 1.0f, 0.0f), *part = malloc(sizeof(float) * D);
    float *h1 = malloc(sizeof(float) * (size_t)rows), *h2 = malloc(sizeof(float) * (size_t)rows);
    float *S1 = malloc(sizeof(float) * nS), *S2 = malloc(sizeof(float) * nS);
    float *y1 = malloc(sizeof(float) * D), *y2 = malloc(sizeof(float) * D), *z = malloc(sizeof(float) * 2 * D);
    uint16_t *w_gu = bf16_random(&rng, (int64_t)2 * F * D, 0.04f), *w_dT = bf16_random(&rng, (int64_t)F * D, 0.03f);
    float *ln2 = f32_bf16_random(&rng, D, 0.1f, 0.0f), *a1 = malloc(sizeof(float) * F), *a2 = malloc(sizeof(float) * F);
    uint16_t *r1 = malloc((size_t)K * cd * 2), *r2 = malloc((size_t)K * cd * 2);
    for (int j = 0; j < H; j++)
        A_log[j] = round_bf16(-1.0f + 2.5f * rng_uniform(&rng)), dt_bias[j] = bf_normal(&rng, 1.0f);
    for (size_t i = 0; i < nS; i++) S[i] = 0.3f * rng_normal(&rng);
    for (int i = 0; i < D; i++) part[i] = 0.5f * rng_normal(&rng);
    if (c->pos0 > 0)
        for (size_t i = 0; i < (size_t)K * cd; i++) ring[i] = f32_to_bf16(rng_normal(&rng));
    uint16_t *d_win = dev_copy(w_in, (size_t)rows * D * 2), *d_wout = dev_copy(w_out, (size_t)D * vd * 2);
    uint16_t *d_emb = dev_copy(emb, (size_t)V * D * 2);
    uint16_t *d_ring[2] = {dev_copy(ring, (size_t)K * cd * 2), dev_copy(ring, (size_t)K * cd * 2)};
    float *d_S[2] = {dev_copy(S, nS * 4), dev_copy(S, nS * 4)};
    float *d_ln1 = dev_copy(ln1, D * 4), *d_cw = dev_copy(conv_w, (size_t)cd * K * 4), *d_A = dev_copy(A_log, H * 4);
    float *d_dt = dev_copy(dt_bias, H * 4), *d_nw = dev_copy(norm_w, dv * 4), *d_x = dev_copy(x, D * 4);
    float *d_part = dev_copy(part, D * 4), *d_proj[2] = {dev_poison(rows * 4), dev_poison(rows * 4)};
    float *d_o[2] = {dev_poison(vd * 4), dev_poison(vd * 4)}, *d_y[2] = {dev_poison(D * 4), dev_poison(D * 4)};
    float *d_xo[2] = {dev_poison(D * 4), dev_poison(D * 4)}, *d_zero = dev_poison(2 * D * 4);
    StepParams *d_step = dev_copy(NULL, sizeof(StepParams));
    float *d_xbuf = dev_poison(cuda_dn_layer_xbuf_floats(H) * 4);
    const int xst = mlp ? 32 : 1; /* the counters' stride: one line each, or packed */
    const size_t ncnt = cuda_dn_layer_xcnt_count(H, xst);
    unsigned *d_xcnt = dev_copy(NULL, ncnt * 4);
    if (d_xcnt) cudaMemset(d_xcnt, 0, ncnt * 4);
    uint16_t *d_wgu = dev_copy(w_gu, (size_t)2 * F * D * 2), *d_wdT = dev_copy(w_dT, (size_t)F * D * 2);
    float *d_ln2 = dev_copy(ln2, D * 4), *d_xm[2] = {dev_poison(D * 4), dev_poison(D * 4)}, *d_y2 = dev_poison(D * 4);
    float *d_act[2] = {dev_poison(F * 4), dev_poison(F * 4)};
    unsigned long long *d_cnt = dev_copy(NULL, 8);
    if (d_cnt) cudaMemset(d_cnt, 0, 8);
    uint8_t *d_win8 = NULL, *d_wout8 = NULL;
    float *d_sin = NULL, *d_sout = NULL;
    uint16_t *d_wba = NULL;
    if (fp8) {
        fp8_dev(w_in, cd + vd, D, &d_win8, &d_sin);
        fp8_dev(w_out, D, vd, &d_wout8, &d_sout);
        d_wba = dev_copy(w_in + (size_t)(cd + vd) * D, (size_t)2 * H * D * 2);
        CHECK(d_win8 && d_sin && d_wout8 && d_sout && d_wba, "%s: fp8 device allocation", c->name);
    }
    CudaLaunch l = {0, 0, NULL, 0};
    if (!d_win || !d_wout || !d_emb || !d_ring[0] || !d_ring[1] || !d_S[0] || !d_S[1] || !d_ln1 || !d_cw || !d_A ||
        !d_dt || !d_nw || !d_x || !d_part || !d_proj[0] || !d_proj[1] || !d_o[0] || !d_o[1] || !d_y[0] || !d_y[1] ||
        !d_xo[0] || !d_xo[1] || !d_zero || !d_step || !d_xbuf || !d_xcnt || !d_wgu || !d_wdT || !d_ln2 || !d_xm[0] ||
        !d_xm[1] || !d_y2 || !d_act[0] || !d_act[1] || !d_cnt) {
        CHECK(0, "%s: device allocation", c->name);
        goto done;
    }
    const int so = fp8 ? cuda_matvec_splits_fp8(D, vd, n_sm) : cuda_matvec_splits(D, vd, n_sm);
    CHECK(cuda_matvec_gated_ok(vd, so, dv), "%s: out_proj split %d does not keep whole heads", c->name, so);
    int ok_bits = 1, ok_y = 1, ok_zero = 1, ok_mlp = 1, ok_y2 = 1, ok_os = 1;
    double worst = 0, worst2 = 0, worst_o = 0, worst_s = 0;
    for (int t = 0; t < c->steps; t++) {
        StepParams sp;
        memset(&sp, 0, sizeof sp);
        sp.token = (t * 3 + 1) % V, sp.pos = c->pos0 + t;
        CU(cudaMemcpy(d_step, &sp, sizeof sp, cudaMemcpyHostToDevice));
        for (int k = 0; k < 2; k++) {
            CU(cudaMemset(d_proj[k], 0xff, rows * 4));
            CU(cudaMemset(d_o[k], 0xff, vd * 4));
            CU(cudaMemset(d_xo[k], 0xff, D * 4));
            CU(cudaMemset(d_y[k], 0, D * 4));
            CU(cudaMemset(d_xm[k], 0xff, D * 4));
            CU(cudaMemset(d_act[k], 0xff, F * 4));
        }
        CU(cudaMemset(d_y2, 0, D * 4));
        CU(cudaMemset(d_zero, 0xff, 2 * D * 4));
        /* the three kernels */
        MatvecParams mv;
        memset(&mv, 0, sizeof mv);
        mv.W = d_win, mv.rows = rows, mv.cols = D, mv.splits = 1, mv.blocks = cuda_matvec_blocks(rows, D, 1, n_sm);
        if (c->embed)
            mv.in_mode = MV_IN_EMBED, mv.embed = d_emb, mv.step = d_step;
        else
            mv.in_mode = MV_IN_RESIDUAL, mv.x = d_x, mv.parts = d_part, mv.n_parts = 1;
        mv.x_out = d_xo[0], mv.norm_w = d_ln1, mv.norm_mode = NORM_ZC, mv.eps = 1e-6f;
        mv.out_mode = MV_OUT_STORE, mv.y = d_proj[0];
        if (fp8) { /* q/k/v/z rows FP8, then b / a bf16 from the same input */
            mv.W = NULL, mv.W8 = d_win8, mv.w8_scale = d_sin, mv.rows = cd + vd;
            mv.blocks = cuda_matvec_blocks_fp8(cd + vd, D, 1, n_sm);
            LAUNCH(cuda_matvec(&mv, &l));
            mv.W = d_wba, mv.W8 = NULL, mv.w8_scale = NULL, mv.rows = 2 * H, mv.x_out = NULL,
            mv.y = d_proj[0] + cd + vd;
            mv.blocks = cuda_matvec_blocks(2 * H, D, 1, n_sm);
        }
        LAUNCH(cuda_matvec(&mv, &l));
        DeltanetStepParams dp;
        memset(&dp, 0, sizeof dp);
        dp.proj = d_proj[0], dp.conv_w = d_cw, dp.conv_ring = d_ring[0], dp.A_log = d_A, dp.dt_bias = d_dt;
        dp.norm_w = d_nw, dp.S = d_S[0], dp.o = d_o[0], dp.gated_out = 1, dp.step = d_step;
        dp.Hk = H, dp.Hv = H, dp.dk = dk, dp.dv = dv, dp.K = K, dp.eps = 1e-6f;
        LAUNCH(cuda_deltanet_step(&dp, &l));
        memset(&mv, 0, sizeof mv);
        mv.W = d_wout, mv.rows = D, mv.cols = vd, mv.splits = so, mv.eps = 1e-6f;
        mv.blocks = cuda_matvec_blocks(D, vd, so, n_sm);
        mv.in_mode = MV_IN_GATED, mv.x = d_o[0], mv.gate = d_proj[0] + cd, mv.norm_w = d_nw, mv.group = dv;
        mv.out_mode = MV_OUT_SPLITK, mv.atomic = 1, mv.y = d_y[0];
        if (fp8)
            mv.W = NULL, mv.W8 = d_wout8, mv.w8_scale = d_sout, mv.blocks = cuda_matvec_blocks_fp8(D, vd, so, n_sm);
        LAUNCH(cuda_matvec(&mv, &l));
        /* the fused kernel */
        DnLayerParams p;
        memset(&p, 0, sizeof p);
        p.w_in = d_win, p.w_out = d_wout;
        if (fp8) p.w_in = NULL, p.w_out = NULL, p.w8_in = d_win8, p.s_in = d_sin, p.w_ba = d_wba, p.w8_out = d_wout8;
        if (fp8) p.s_out = d_sout;
        if (c->embed)
            p.embed = d_emb;
        else
            p.x = d_x, p.parts = d_part, p.n_parts = 1;
        p.x_out = d_xo[1], p.ln1 = d_ln1, p.norm_mode = NORM_ZC, p.proj = d_proj[1];
        p.conv_w = d_cw, p.conv_ring = d_ring[1], p.A_log = d_A, p.dt_bias = d_dt, p.norm_w = d_nw, p.S = d_S[1];
        p.o = d_o[1], p.y = d_y[1], p.zero0 = d_zero, p.zero1 = d_zero + D, p.n_zero = D, p.step = d_step;
        p.D = D, p.Hk = H, p.Hv = H, p.dk = dk, p.dv = dv, p.K = K, p.eps = 1e-6f;
        if (gm) p.xbuf = d_xbuf, p.xcnt = d_xcnt, p.xcnt_stride = xst;
        LAUNCH(cuda_dn_layer(&p, &l));
        if (mlp) { /* the reference MLP on the fused kernel's own x_out and y, on the same grid */
            MlpFusedParams mp;
            memset(&mp, 0, sizeof mp);
            mp.w_gu = d_wgu, mp.w_dT = d_wdT, mp.D = D, mp.F = F, mp.blocks = 8 * H, mp.x = d_xo[1], mp.parts = d_y[1];
            mp.n_parts = 1, mp.x_out = d_xm[0], mp.norm_w = d_ln2, mp.norm_mode = NORM_ZC, mp.eps = 1e-6f;
            mp.y = d_y2, mp.act_out = d_act[0];
            LAUNCH(cuda_mlp_fused(&mp, &l));
        }
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(h1, d_proj[0], rows * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(h2, d_proj[1], rows * 4, cudaMemcpyDeviceToHost));
        ok_bits &= cmp_bits("in_proj rows", h1, h2, (size_t)rows * 4);
        CU(cudaMemcpy(h1, d_xo[0], D * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(h2, d_xo[1], D * 4, cudaMemcpyDeviceToHost));
        ok_bits &= cmp_bits("x_out", h1, h2, (size_t)D * 4);
        CU(cudaMemcpy(h1, d_o[0], vd * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(h2, d_o[1], vd * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(S1, d_S[0], nS * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(S2, d_S[1], nS * 4, cudaMemcpyDeviceToHost));
        if (onex) {
            double smax = 0, sd = 0;
            double omax = 0; /* an o near 0 comes from cancellation: its fp32 noise scales with the head's o */
            for (int i = 0; i < vd; i++) omax = fmax(omax, fabs((double)h1[i]));
            for (int i = 0; i < vd; i++) {
                const double d = fabs((double)h2[i] - h1[i]), r = d / (fabs((double)h1[i]) + 1e-30);
                if (!(d <= fabs((double)h1[i]) / 128 + omax * 0x1p-16)) {
                    if (ok_os) fprintf(stderr, "  step %d: o[%d] %.9g vs %.9g\n", t, i, h2[i], h1[i]);
                    ok_os = 0;
                }
                if (d > 0) worst_o = fmax(worst_o, r);
            }
            for (size_t i = 0; i < nS; i++) smax = fmax(smax, fabs(S1[i])), sd = fmax(sd, fabs((double)S2[i] - S1[i]));
            if (!(sd <= 1e-5 * smax)) {
                fprintf(stderr, "  step %d: S max diff %.3g of max %.3g\n", t, sd, smax);
                ok_os = 0;
            }
            worst_s = fmax(worst_s, smax > 0 ? sd / smax : 1);
        } else {
            ok_bits &= cmp_bits("o", h1, h2, (size_t)vd * 4);
            ok_bits &= cmp_bits("S", S1, S2, nS * 4);
        }
        CU(cudaMemcpy(r1, d_ring[0], (size_t)K * cd * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(r2, d_ring[1], (size_t)K * cd * 2, cudaMemcpyDeviceToHost));
        ok_bits &= cmp_bits("conv ring", r1, r2, (size_t)K * cd * 2);
        CU(cudaMemcpy(y1, d_y[0], D * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(y2, d_y[1], D * 4, cudaMemcpyDeviceToHost));
        double amax = 0, dmax = 0;
        for (int i = 0; i < D; i++) amax = fmax(amax, fabs(y1[i])), dmax = fmax(dmax, fabs((double)y2[i] - y1[i]));
        if (!(dmax <= (onex ? 1e-2 : 2e-5) * amax) || !(amax > 0)) {
            fprintf(stderr, "  step %d: y max diff %.3g of max %.3g\n", t, dmax, amax);
            ok_y = 0;
        }
        worst = fmax(worst, amax > 0 ? dmax / amax : 1);
        CU(cudaMemcpy(z, d_zero, 2 * D * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < (mlp ? D : 2 * D); i++) ok_zero &= z[i] == 0.0f;
        if (mlp) {
            CU(cudaMemcpy(a1, d_act[0], F * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(a2, d_act[1], F * 4, cudaMemcpyDeviceToHost));
            ok_mlp &= cmp_bits("MLP activations", a1, a2, (size_t)F * 4);
            CU(cudaMemcpy(h1, d_xm[0], D * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(h2, d_xm[1], D * 4, cudaMemcpyDeviceToHost));
            ok_mlp &= cmp_bits("MLP x_out", h1, h2, (size_t)D * 4);
            CU(cudaMemcpy(y1, d_y2, D * 4, cudaMemcpyDeviceToHost));
            amax = 0, dmax = 0;
            for (int i = 0; i < D; i++)
                amax = fmax(amax, fabs(y1[i])), dmax = fmax(dmax, fabs((double)z[D + i] - y1[i]));
            if (!(dmax <= 2e-5 * amax) || !(amax > 0)) {
                fprintf(stderr, "  step %d: MLP y max diff %.3g of max %.3g\n", t, dmax, amax);
                ok_y2 = 0;
            }
            worst2 = fmax(worst2, amax > 0 ? dmax / amax : 1);
        }
        /* the next step's input: this step's residual */
        CU(cudaMemcpy(d_x, d_xo[0], D * 4, cudaMemcpyDeviceToDevice));
    }
    CHECK(ok_bits, "%s: in_proj rows, x_out, o, S or the ring differ from the three kernels", c->name);
    CHECK(ok_y, "%s: y differs from the three kernels beyond %g of its max", c->name, onex ? 1e-2 : 2e-5);
    CHECK(ok_zero, "%s: zero0 / zero1 not zeroed", c->name);
    if (onex) {
        CHECK(ok_os, "%s (onex): o beyond one bf16 step (+ 2^-16 of its max) or S beyond 1e-5 of its max", c->name);
        printf("   bitwise: in_proj rows, x_out, ring; o worst rel %.2g, S worst max-diff / max %.2g, y %.2g\n",
               worst_o, worst_s, worst);
    } else
        printf("   bitwise: in_proj rows, x_out, o, S, ring; y worst max-diff / max %.2g\n", worst);
    if (mlp) {
        CHECK(ok_mlp, "%s: the MLP tail's activations or residual differ from cuda_mlp_fused", c->name);
        CHECK(ok_y2, "%s: the MLP tail's y differs from cuda_mlp_fused beyond 2e-5 of its max", c->name);
        printf("   MLP tail (F %d): activations and residual bitwise; y worst max-diff / max %.2g\n", F, worst2);
    }
done:
    cudaFree(d_win), cudaFree(d_wout), cudaFree(d_emb), cudaFree(d_ring[0]), cudaFree(d_ring[1]), cudaFree(d_S[0]);
    cudaFree(d_S[1]), cudaFree(d_ln1), cudaFree(d_cw), cudaFree(d_A), cudaFree(d_dt), cudaFree(d_nw), cudaFree(d_x);
    cudaFree(d_part), cudaFree(d_proj[0]), cudaFree(d_proj[1]), cudaFree(d_o[0]), cudaFree(d_o[1]), cudaFree(d_y[0]);
    cudaFree(d_y[1]), cudaFree(d_xo[0]), cudaFree(d_xo[1]), cudaFree(d_zero), cudaFree(d_step), cudaFree(d_xbuf);
    cudaFree(d_xcnt), cudaFree(d_wgu), cudaFree(d_wdT), cudaFree(d_ln2), cudaFree(d_xm[0]), cudaFree(d_xm[1]);
    cudaFree(d_y2), cudaFree(d_act[0]), cudaFree(d_act[1]), cudaFree(d_cnt);
    cudaFree(d_win8), cudaFree(d_wout8), cudaFree(d_sin), cudaFree(d_sout), cudaFree(d_wba);
    free(w_gu), free(w_dT), free(ln2), free(a1), free(a2);
    free(w_in), free(w_out), free(emb), free(ring), free(ln1), free(conv_w), free(A_log), free(dt_bias), free(norm_w);
    free(S), free(x), free(part), free(h1), free(h2), free(S1), free(S2), free(y1), free(y2), free(z), free(r1);
    free(r2);
}

static void test_refusals(void) {
    CHECK(!cuda_dn_layer_supported(1024, 16, 32, 128, 128, 4), "Hk != Hv accepted");
    CHECK(!cuda_dn_layer_supported(1024, 16, 16, 64, 128, 4), "dk 64 accepted");
    CHECK(!cuda_dn_layer_supported(1000, 16, 16, 128, 128, 4), "D 1000 accepted");
    CHECK(!cuda_dn_layer_supported(1024, 16, 16, 128, 128, 1), "K 1 accepted");
    DnLayerParams p;
    memset(&p, 0, sizeof p);
    CudaLaunch l = {0, 0, NULL, 0};
    CHECK(cuda_dn_layer(&p, &l) == (int)cudaErrorInvalidValue, "empty params accepted");
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    CHECK(n_sm < 128 || cuda_dn_layer_supported(1024, 16, 16, 128, 128, 4) >= 1, "the 0.8B shape not supported");
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("dn_layer");
    rng_seed(&rng, test_seed(argc, argv, "test_dn_layer"));
    int n_sm = 0;
    CUDA_OK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const Case cases[] = {
        {"qwen3.5-0.8b", 1024, 16, 4, 4, 0, 0, 3584},
        {"0.8b, layer 0 (embedding), pos > 0", 1024, 16, 4, 3, 9, 1, 3584},
        {"D 2048 (two column passes), 4 heads, K 3", 2048, 4, 3, 3, 5, 0, 0},
        {"D 512, 2 heads, K 2", 512, 2, 2, 3, 1, 0, 200},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int fp8 = 0; fp8 < 2; fp8++)
            for (int gm = 1; gm >= 0; gm--)
                run_case(&cases[i], n_sm, gm, 0, gm ? 2 : 0, fp8); /* global memory: the one tagged exchange */
    test_refusals();
    return TEST_SUMMARY("dn_layer");
}
