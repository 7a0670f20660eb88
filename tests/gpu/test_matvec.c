/* test_matvec.c — cuda_matvec (src/cuda/gemv.cu) against the CPU reference ops (cpu_matvec,
 * cpu_rmsnorm, cpu_silu_mul) on fresh random bf16-valued inputs, outputs NaN-poisoned first:
 *   prologues: VEC, EMBED (+ norm), RESIDUAL (split-K partials summed, + zero-centred / plain norm),
 *              x_out bit-exact, h_out within one bf16 step, the zero buffer zeroed;
 *   epilogues: STORE, SILU_MUL (interleaved gate/up), SPLITK atomic vs deterministic vs reference
 *              (deterministic bitwise equal over 3 runs), ARGMAX (logits, ties -> smallest id across
 *              blocks, padding rows excluded, counter left at 0 for the next call);
 *   awkward shapes: rows not multiples of 4 or 32, cols = 8, cols not multiples of 256, splits that
 *   leave a short last slice; PDL on and off, early trigger, L2 prefetch hints (results unchanged);
 *   rejected shapes and prefetch ranges.
 * Usage: test_matvec [seed]. Skips (exit 0, "no GPU") without a GPU. */
#include "cpu/ops.h"
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"

static Rng rng;
static int n_sm = 132;

/* GEMV error bound per row: bf16 output rounding (2^-8 relative) + fp32 accumulation. */
static void gemv_bounds(const uint16_t *W, const float *x, int rows, int cols, float *tol) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int k = 0; k < cols; k++) s += fabs(bf16_to_f32(W[(size_t)r * cols + k]) * x[k]);
        tol[r] = (float)(1e-5 * s + 1e-6);
    }
}

/* ---- STORE / SPLITK with the VEC prologue ------------------------------------------------------ */

static void test_vec(int rows, int cols, int splits, int pdl) {
    const int64_t nw = (int64_t)rows * cols;
    uint16_t *W = bf16_random(&rng, nw, 1.0f / sqrtf((float)cols));
    float *x = f32_bf16_random(&rng, cols, 1.0f, 0.0f);
    float *ref = malloc(sizeof(float) * rows), *tol = malloc(sizeof(float) * rows);
    float *got = malloc(sizeof(float) * (size_t)rows * splits), *sum = malloc(sizeof(float) * rows);
    float *det0 = malloc(sizeof(float) * (size_t)rows * splits);
    uint16_t *dW = dev_copy(W, nw * 2);
    float *dx = dev_copy(x, sizeof(float) * cols), *dy = dev_poison(sizeof(float) * (size_t)rows * splits);
    CudaLaunch l = {0, pdl, NULL, 0};
    char what[96];
    cpu_matvec(ref, x, W, DT_BF16, rows, cols);
    gemv_bounds(W, x, rows, cols, tol);
    if (!dW || !dx || !dy) {
        CHECK(0, "device alloc");
        goto done;
    }
    MatvecParams p;
    memset(&p, 0, sizeof p);
    p.W = dW, p.rows = rows, p.cols = cols, p.splits = splits, p.in_mode = MV_IN_VEC, p.x = dx, p.y = dy;
    /* the early trigger must not change results */
    p.early_trigger = pdl;
    if (splits == 1) {
        p.out_mode = MV_OUT_STORE;
        LAUNCH(cuda_matvec(&p, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(got, dy, sizeof(float) * rows, cudaMemcpyDeviceToHost));
        int64_t exact = 0;
        for (int r = 0; r < rows; r++) exact += got[r] == round_bf16(got[r]);
        snprintf(what, sizeof what, "store %dx%d pdl %d", rows, cols, pdl);
        CHECK(exact == rows, "%s: %lld outputs not bf16-valued", what, (long long)(rows - exact));
        CHECK(count_bad_tol(what, got, ref, tol, rows, 1.0 / 256) == 0, "%s", what);
        goto done;
    }
    /* split-K: deterministic partials, 3 runs bitwise equal, then atomic into a zeroed y */
    p.out_mode = MV_OUT_SPLITK;
    p.atomic = 0;
    for (int run = 0; run < 3; run++) {
        CU(cudaMemset(dy, 0xff, sizeof(float) * (size_t)rows * splits));
        LAUNCH(cuda_matvec(&p, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(got, dy, sizeof(float) * (size_t)rows * splits, cudaMemcpyDeviceToHost));
        if (run == 0) memcpy(det0, got, sizeof(float) * (size_t)rows * splits);
        CHECK(memcmp(det0, got, sizeof(float) * (size_t)rows * splits) == 0, "splitk det run %d differs", run);
    }
    for (int r = 0; r < rows; r++) {
        float a = 0;
        for (int s = 0; s < splits; s++) a += det0[(size_t)s * rows + r];
        sum[r] = a;
    }
    snprintf(what, sizeof what, "splitk det %dx%d/%d", rows, cols, splits);
    CHECK(count_bad_tol(what, sum, ref, tol, rows, 0) == 0, "%s", what);
    p.atomic = 1;
    CU(cudaMemset(dy, 0, sizeof(float) * rows));
    LAUNCH(cuda_matvec(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(got, dy, sizeof(float) * rows, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "splitk atomic %dx%d/%d", rows, cols, splits);
    CHECK(count_bad_tol(what, got, ref, tol, rows, 0) == 0, "%s", what);
    CHECK(count_bad_tol("atomic vs det", got, sum, tol, rows, 0) == 0, "atomic vs det %dx%d", rows, cols);
done:
    cudaFree(dW), cudaFree(dx), cudaFree(dy);
    free(W), free(x), free(ref), free(tol), free(got), free(sum), free(det0);
}

/* ---- RESIDUAL / EMBED prologue with norm; STORE or SILU_MUL ----------------------------------- */

static void test_prologue(int in_mode, int norm_mode, int out_mode, int rows, int cols, int n_parts) {
    const int64_t nw = (int64_t)rows * cols;
    const int V = 37, tok = (int)(rng_u64(&rng) % V), ny = out_mode == MV_OUT_SILU_MUL ? rows / 2 : rows;
    uint16_t *W = bf16_random(&rng, nw, 1.0f / sqrtf((float)cols)), *E = bf16_random(&rng, (int64_t)V * cols, 1.0f);
    float *res = f32_bf16_random(&rng, cols, 1.0f, 0.0f),
          *parts = f32_bf16_random(&rng, (int64_t)n_parts * cols, 0.5f, 0.0f);
    float *w = f32_bf16_random(&rng, cols, 0.2f, norm_mode == NORM_PLAIN ? 1.0f : 0.0f);
    float *x = malloc(sizeof(float) * cols), *h = malloc(sizeof(float) * cols), *gx = malloc(sizeof(float) * cols);
    float *gh = malloc(sizeof(float) * cols), *ref = malloc(sizeof(float) * rows), *tol = malloc(sizeof(float) * rows);
    float *gy = malloc(sizeof(float) * rows), *yref = malloc(sizeof(float) * rows), *gz = malloc(sizeof(float) * 100);
    uint16_t *dW = dev_copy(W, nw * 2), *dE = dev_copy(E, (size_t)V * cols * 2);
    float *dres = dev_copy(res, sizeof(float) * cols), *dparts = dev_copy(parts, sizeof(float) * n_parts * cols);
    float *dw = dev_copy(w, sizeof(float) * cols), *dxo = dev_poison(sizeof(float) * cols);
    float *dho = dev_poison(sizeof(float) * cols), *dy = dev_poison(sizeof(float) * rows), *dz = dev_poison(400);
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    sp.token = tok;
    StepParams *dsp = dev_copy(&sp, sizeof sp);
    CudaLaunch l = {0, 1, NULL, 0};
    char what[96];
    snprintf(what, sizeof what, "%s norm %d out %d %dx%d parts %d", in_mode == MV_IN_EMBED ? "embed" : "residual",
             norm_mode, out_mode, rows, cols, n_parts);
    if (!dW || !dE || !dres || !dparts || !dw || !dxo || !dho || !dy || !dz || !dsp) {
        CHECK(0, "device alloc");
        goto done;
    }
    /* host: x exactly as the kernel forms it (fp32 sum of partials in order) */
    for (int i = 0; i < cols; i++) {
        if (in_mode == MV_IN_EMBED) {
            x[i] = bf16_to_f32(E[(size_t)tok * cols + i]);
        } else {
            float a = 0;
            for (int s = 0; s < n_parts; s++) a += parts[(size_t)s * cols + i];
            x[i] = round_bf16(res[i] + round_bf16(a));
        }
    }
    cpu_rmsnorm(h, x, w, 1, cols, 1e-6f, norm_mode == NORM_ZC);

    MatvecParams p;
    memset(&p, 0, sizeof p);
    p.W = dW, p.rows = rows, p.cols = cols, p.splits = 1, p.in_mode = in_mode;
    p.x = dres, p.parts = dparts, p.n_parts = n_parts, p.embed = dE, p.step = dsp, p.x_out = dxo;
    p.norm_w = dw, p.norm_mode = norm_mode, p.eps = 1e-6f, p.h_out = dho, p.zero = dz, p.n_zero = 100;
    p.out_mode = out_mode, p.y = dy;
    p.early_trigger = rows % 2;
    LAUNCH(cuda_matvec(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(gx, dxo, sizeof(float) * cols, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gh, dho, sizeof(float) * cols, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gy, dy, sizeof(float) * ny, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gz, dz, 400, cudaMemcpyDeviceToHost));
    CHECK(memcmp(gx, x, sizeof(float) * cols) == 0, "%s: x_out not bit-exact", what);
    int zeros = 0;
    for (int i = 0; i < 100; i++) zeros += gz[i] == 0.0f;
    CHECK(zeros == 100, "%s: zero buffer has %d zeros of 100", what, zeros);
    /* h: one bf16 rounding (plus the plain norm's inner rounding) away from the fp32 reference */
    CHECK(count_bad("h_out", gh, h, cols, norm_mode == NORM_PLAIN ? 2.0 / 256 : 1.0 / 256, 1e-6) == 0, "%s: h_out",
          what);
    /* y from the kernel's own h, so a rounding flip in h does not blur the GEMV check */
    cpu_matvec(ref, gh, W, DT_BF16, rows, cols);
    gemv_bounds(W, gh, rows, cols, tol);
    if (out_mode == MV_OUT_STORE) {
        CHECK(count_bad_tol(what, gy, ref, tol, rows, 1.0 / 256) == 0, "%s: y", what);
    } else {
        float *g = malloc(sizeof(float) * ny), *u = malloc(sizeof(float) * ny), *yt = malloc(sizeof(float) * ny);
        for (int i = 0; i < ny; i++) {
            g[i] = round_bf16(ref[2 * i]), u[i] = round_bf16(ref[2 * i + 1]);
            yt[i] = 3 * (tol[2 * i] + tol[2 * i + 1]) * (1 + fabsf(g[i]) + fabsf(u[i]));
        }
        cpu_silu_mul(yref, g, u, ny);
        CHECK(count_bad_tol(what, gy, yref, yt, ny, 3.0 / 256) == 0, "%s: swiglu", what);
        free(g), free(u), free(yt);
    }
done:
    cudaFree(dW), cudaFree(dE), cudaFree(dres), cudaFree(dparts), cudaFree(dw), cudaFree(dxo), cudaFree(dho);
    cudaFree(dy), cudaFree(dz), cudaFree(dsp);
    free(W), free(E), free(res), free(parts), free(w), free(x), free(h), free(gx), free(gh), free(ref), free(tol);
    free(gy), free(yref), free(gz);
}

/* ---- ARGMAX ---------------------------------------------------------------------------------- */

/* dyn: the last dyn rounds of row groups by tickets (MatvecParams.work), three runs (the counters left at 0) */
static void test_argmax(int rows, int cols, int n_valid, int blocks, int dyn) {
    const int64_t nw = (int64_t)rows * cols;
    uint16_t *W = bf16_random(&rng, nw, 1.0f / sqrtf((float)cols));
    float *x = f32_bf16_random(&rng, cols, 1.0f, 0.0f), *gl = malloc(sizeof(float) * rows);
    float *ref = malloc(sizeof(float) * rows), *tol = malloc(sizeof(float) * rows);
    /* a tie for the maximum across distant rows, and a larger row in the padding */
    const int a = (int)(rng_u64(&rng) % (n_valid / 2)),
              b = n_valid / 2 + (int)(rng_u64(&rng) % (n_valid - n_valid / 2));
    for (int k = 0; k < cols; k++) {
        uint16_t v = f32_to_bf16(x[k] >= 0 ? 0.5f : -0.5f);
        W[(size_t)a * cols + k] = W[(size_t)b * cols + k] = v;
        if (n_valid < rows) W[(size_t)(rows - 1) * cols + k] = f32_to_bf16(x[k] >= 0 ? 1.0f : -1.0f);
    }
    uint16_t *dW = dev_copy(W, nw * 2);
    float *dx = dev_copy(x, sizeof(float) * cols), *dl = dev_poison(sizeof(float) * rows);
    float *dval = dev_poison(sizeof(float) * 4096), *dmax = dev_poison(4);
    int *didx = dev_poison(sizeof(int) * 4096), *did = dev_poison(4);
    unsigned *dcnt = dev_copy(NULL, 4), *dwork = dev_copy(NULL, 4 * CUDA_MV_WORK_WORDS);
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    sp.write_logits = 1;
    StepParams *dsp = dev_copy(&sp, sizeof sp);
    CudaLaunch l = {0, 1, NULL, 0};
    char what[96];
    snprintf(what, sizeof what, "argmax %dx%d valid %d blocks %d, %d rounds by tickets", rows, cols, n_valid, blocks,
             dyn);
    if (!dW || !dx || !dl || !dval || !dmax || !didx || !did || !dcnt || !dwork || !dsp) {
        CHECK(0, "device alloc");
        goto done;
    }
    CU(cudaMemset(dcnt, 0, 4));
    CU(cudaMemset(dwork, 0, 4 * CUDA_MV_WORK_WORDS));
    MatvecParams p;
    memset(&p, 0, sizeof p);
    p.W = dW, p.rows = rows, p.cols = cols, p.splits = 1, p.blocks = blocks, p.in_mode = MV_IN_VEC, p.x = dx;
    p.out_mode = MV_OUT_ARGMAX, p.step = dsp, p.logits = dl, p.n_valid = n_valid;
    p.am_val = dval, p.am_idx = didx, p.am_count = dcnt, p.out_id = did, p.out_max = dmax;
    p.work = dyn ? dwork : NULL, p.work_tail = dyn;
    cpu_matvec(ref, x, W, DT_BF16, rows, cols);
    gemv_bounds(W, x, rows, cols, tol);
    for (int run = 0; run < 2 + (dyn > 0); run++) { /* the later runs check the counters were left at 0 */
        int id = -1;
        float mx = 0;
        unsigned cnt = 1, wk[CUDA_MV_WORK_WORDS];
        CU(cudaMemset(dl, 0xff, sizeof(float) * rows));
        CU(cudaMemset(did, 0xff, 4));
        LAUNCH(cuda_matvec(&p, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(gl, dl, sizeof(float) * rows, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(&id, did, 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(&mx, dmax, 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(&cnt, dcnt, 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(wk, dwork, sizeof wk, cudaMemcpyDeviceToHost));
        unsigned wk_or = 0;
        for (int i = 0; i < CUDA_MV_WORK_WORDS; i++) wk_or |= wk[i];
        CHECK(count_bad_tol(what, gl, ref, tol, rows, 1.0 / 256) == 0, "%s: logits", what);
        int best = 0;
        for (int r = 1; r < n_valid; r++)
            if (gl[r] > gl[best]) best = r;
        CHECK(id == best, "%s run %d: id %d, argmax of its logits %d", what, run, id, best);
        CHECK(id == a, "%s run %d: id %d, expected the first of the tied rows %d (other %d)", what, run, id, a, b);
        CHECK(mx == gl[best], "%s: out_max %g vs %g", what, mx, gl[best]);
        CHECK(cnt == 0, "%s: counter left at %u", what, cnt);
        CHECK(wk_or == 0, "%s: ticket counters not left at 0", what);
    }
    /* write_logits = 0 leaves the logits alone */
    sp.write_logits = 0;
    CU(cudaMemcpy(dsp, &sp, sizeof sp, cudaMemcpyHostToDevice));
    CU(cudaMemset(dl, 0xff, sizeof(float) * rows));
    LAUNCH(cuda_matvec(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(gl, dl, sizeof(float) * rows, cudaMemcpyDeviceToHost));
    int untouched = 1;
    for (int r = 0; r < rows; r++) untouched &= isnan(gl[r]);
    CHECK(untouched, "%s: logits written with write_logits = 0", what);
done:
    cudaFree(dW), cudaFree(dx), cudaFree(dl), cudaFree(dval), cudaFree(dmax), cudaFree(didx), cudaFree(did);
    cudaFree(dcnt), cudaFree(dwork), cudaFree(dsp);
    free(W), free(x), free(gl), free(ref), free(tol);
}

static void test_rejects(void) {
    MatvecParams p;
    memset(&p, 0, sizeof p);
    float *d = dev_copy(NULL, 1024);
    CudaLaunch l = {0, 0, NULL, 0};
    p.W = (const uint16_t *)d, p.rows = 4, p.cols = 12, p.splits = 1, p.in_mode = MV_IN_VEC, p.x = d, p.y = d;
    CHECK(cuda_matvec(&p, &l) == cudaErrorInvalidValue, "cols %% 8 != 0 accepted");
    p.cols = 16, p.splits = 2, p.out_mode = MV_OUT_STORE;
    CHECK(cuda_matvec(&p, &l) == cudaErrorInvalidValue, "splits > 1 with STORE accepted");
    p.splits = 1, p.out_mode = MV_OUT_SILU_MUL, p.rows = 5;
    CHECK(cuda_matvec(&p, &l) == cudaErrorInvalidValue, "odd rows with SILU_MUL accepted");
    p.rows = 4, p.out_mode = MV_OUT_STORE;
    CHECK(cuda_matvec(&p, &l) == 0, "a valid GEMV rejected");
    cudaDeviceSynchronize();
    cudaFree(d);
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("matvec");
    rng_seed(&rng, test_seed(argc, argv, "test_matvec"));
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    {
        /* VEC + STORE: tiny, odd, ragged columns, large */
        test_vec(1, 8, 1, 0);
        test_vec(7, 40, 1, 1);
        test_vec(13, 296, 1, 0);
        test_vec(4099, 1024, 1, 1);
        test_vec(5120, 1024, 1, 1);
        /* split-K: the 0.8B out_proj / down shapes and a ragged one */
        test_vec(1024, 2048, cuda_matvec_splits(1024, 2048, n_sm), 1);
        test_vec(1024, 3584, cuda_matvec_splits(1024, 3584, n_sm), 1);
        test_vec(1000, 3000, 7, 0);
        test_vec(37, 600, 3, 1);
        test_vec(5, 16, 2, 0);
        CHECK(cuda_matvec_splits(8224, 1024, n_sm) == 1, "many rows should not split");
        /* prologues */
        test_prologue(MV_IN_RESIDUAL, NORM_ZC, MV_OUT_STORE, 8224, 1024, 8);
        test_prologue(MV_IN_RESIDUAL, NORM_PLAIN, MV_OUT_STORE, 333, 48, 1);
        test_prologue(MV_IN_EMBED, NORM_ZC, MV_OUT_STORE, 130, 1024, 1);
        test_prologue(MV_IN_EMBED, NORM_PLAIN, MV_OUT_SILU_MUL, 74, 40, 1);
        test_prologue(MV_IN_RESIDUAL, NORM_ZC, MV_OUT_SILU_MUL, 7168, 1024, 1);
        test_prologue(MV_IN_RESIDUAL, NORM_ZC, MV_OUT_SILU_MUL, 2 * 37, 296, 3);
    }
    /* argmax: LM-head shape, small with one block, padding rows */
    for (int dyn = 0; dyn < 6; dyn += dyn ? 2 : 1) { /* 0: static; 1, 3, 5 rounds by tickets */
        test_argmax(248320, 1024, 248077, 0, dyn);
        test_argmax(248320, 1024, 248077, 100, dyn);
        test_argmax(1000, 48, 990, 1, dyn);
        test_argmax(4097, 64, 4097, 5, dyn);
        test_argmax(100, 1024, 100, 4, dyn);   /* fewer groups than warps */
        test_argmax(1000, 1024, 1000, 2, dyn); /* ~8 rounds */
    }
    test_rejects();
    return TEST_SUMMARY("matvec");
}
