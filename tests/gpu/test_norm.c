/* test_norm.c — cuda_rmsnorm (src/cuda/norm.cu) against cpu_rmsnorm on fresh random inputs,
 * outputs NaN-poisoned: zero-centred and plain weights, many rows (q/k-norm shape), the residual
 * form (x = bf16(res + bf16(sum of partials)), x_out bit-exact), awkward n (1, 33, 1000, 4096,
 * 12288 > 48 KiB of shared memory), in place, PDL on and off. Also cuda_rmsnorm_rows_bf16 (prefill.cu:
 * fp32 rows -> bf16 rows) on the register path (D % 8 == 0, 16-byte aligned y, D <= 2048), the loop
 * fallback (D % 8 == 4, D > 2048, y only 8-byte aligned) and ragged T, with a timing line at the
 * Qwen3.5-0.8B prefill shape (T = 2048, D = 1024).
 * Usage: test_norm [seed]. Skips (exit 0, "no GPU") without a GPU. */
#include "cpu/ops.h"
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"

static Rng rng;

static void run(int rows, int n, int mode, int n_parts, int in_place, int pdl) {
    const int64_t N = (int64_t)rows * n;
    float *x = f32_bf16_random(&rng, N, 2.0f, 0.0f), *w = f32_bf16_random(&rng, n, 0.3f, mode == NORM_PLAIN ? 1.0f : 0.0f);
    float *parts = f32_bf16_random(&rng, (int64_t)(n_parts > 0 ? n_parts : 1) * n, 0.5f, 0.0f);
    float *xin = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    float *gx = malloc(sizeof(float) * n);
    float *dx = dev_copy(x, sizeof(float) * N), *dw = dev_copy(w, sizeof(float) * n);
    float *dp = dev_copy(parts, sizeof(float) * (n_parts > 0 ? n_parts : 1) * n);
    float *dy = in_place ? dx : dev_poison(sizeof(float) * N), *dxo = dev_poison(sizeof(float) * n);
    CudaLaunch l = {0, pdl, NULL, 0};
    char what[80];
    snprintf(what, sizeof what, "rmsnorm rows %d n %d mode %d parts %d%s", rows, n, mode, n_parts,
             in_place ? " in place" : "");
    if (!dx || !dw || !dp || !dy || !dxo) {
        CHECK(0, "device alloc");
        goto done;
    }
    memcpy(xin, x, sizeof(float) * N);
    if (n_parts > 0)
        for (int i = 0; i < n; i++) {
            float a = 0;
            for (int s = 0; s < n_parts; s++) a += parts[(size_t)s * n + i];
            xin[i] = round_bf16(x[i] + round_bf16(a));
        }
    cpu_rmsnorm(ref, xin, w, rows, n, 1e-6f, mode == NORM_ZC);
    RmsnormParams p;
    memset(&p, 0, sizeof p);
    p.x = dx, p.w = dw, p.y = dy, p.rows = rows, p.n = n, p.mode = mode, p.eps = 1e-6f;
    if (n_parts > 0) p.parts = dp, p.n_parts = n_parts, p.x_out = dxo;
    LAUNCH(cuda_rmsnorm(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(got, dy, sizeof(float) * N, cudaMemcpyDeviceToHost));
    int64_t exact = 0;
    for (int64_t i = 0; i < N; i++) exact += got[i] == round_bf16(got[i]);
    CHECK(exact == N, "%s: %lld outputs not bf16-valued", what, (long long)(N - exact));
    CHECK(count_bad(what, got, ref, N, mode == NORM_PLAIN ? 2.0 / 256 : 1.0 / 256, 1e-6) == 0, "%s", what);
    if (n_parts > 0) {
        CU(cudaMemcpy(gx, dxo, sizeof(float) * n, cudaMemcpyDeviceToHost));
        CHECK(memcmp(gx, xin, sizeof(float) * n) == 0, "%s: x_out not bit-exact", what);
    }
done:
    cudaFree(dx), cudaFree(dw), cudaFree(dp), cudaFree(dxo);
    if (!in_place) cudaFree(dy);
    free(x), free(w), free(parts), free(xin), free(ref), free(got), free(gx);
}

/* cuda_rmsnorm_rows_bf16: T rows of D (y at element offset y_off into a poisoned buffer, so rows
 * past the end and the bytes before y must stay NaN). */
static void run_rows(int T, int D, int mode, int y_off, int pdl) {
    const int64_t N = (int64_t)T * D, NY = N + y_off + 8;
    float *x = f32_bf16_random(&rng, N, 2.0f, 0.0f), *w = f32_bf16_random(&rng, D, 0.3f, mode == NORM_PLAIN ? 1.0f : 0.0f);
    float *ref = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    uint16_t *hy = malloc(sizeof(uint16_t) * NY);
    float *dx = dev_copy(x, sizeof(float) * N), *dw = dev_copy(w, sizeof(float) * D);
    uint16_t *dy = dev_poison(sizeof(uint16_t) * NY);
    CudaLaunch l = {0, pdl, NULL, 0};
    char what[96];
    snprintf(what, sizeof what, "rmsnorm_rows_bf16 T %d D %d mode %d y_off %d pdl %d", T, D, mode, y_off, pdl);
    if (!dx || !dw || !dy) {
        CHECK(0, "device alloc");
        goto done;
    }
    cpu_rmsnorm(ref, x, w, T, D, 1e-6f, mode == NORM_ZC);
    RmsnormRowsParams p = {dx, dw, dy + y_off, T, D, mode, 1e-6f};
    LAUNCH(cuda_rmsnorm_rows_bf16(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(hy, dy, sizeof(uint16_t) * NY, cudaMemcpyDeviceToHost));
    int64_t untouched = 0;
    for (int64_t i = 0; i < NY; i++)
        if (i < y_off || i >= y_off + N) untouched += hy[i] == 0xffff;
    CHECK(untouched == NY - N, "%s: %lld elements outside y written", what, (long long)(NY - N - untouched));
    for (int64_t i = 0; i < N; i++) got[i] = bf16_to_f32(hy[y_off + i]);
    CHECK(count_bad(what, got, ref, N, mode == NORM_PLAIN ? 2.0 / 256 : 1.0 / 256, 1e-6) == 0, "%s", what);
done:
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
    free(x), free(w), free(ref), free(got), free(hy);
}

/* Device time of cuda_rmsnorm_rows_bf16 at T x D: events around each single launch (as the
 * prefill bench times it) and around 100 back-to-back launches. Prints only. */
static void time_rows(int T, int D) {
    const int64_t N = (int64_t)T * D;
    float *x = f32_bf16_random(&rng, N, 2.0f, 0.0f), *w = f32_bf16_random(&rng, D, 0.3f, 0.0f);
    float *dx = dev_copy(x, sizeof(float) * N), *dw = dev_copy(w, sizeof(float) * D);
    uint16_t *dy = dev_poison(sizeof(uint16_t) * N);
    cudaEvent_t e0 = NULL, e1 = NULL;
    CudaLaunch l = {0, 0, NULL, 0};
    RmsnormRowsParams p = {dx, dw, dy, T, D, NORM_ZC, 1e-6f};
    double single = 0;
    float ms = 0;
    const int reps = 20, burst = 100;
    if (!dx || !dw || !dy) {
        CHECK(0, "device alloc");
        goto done;
    }
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    for (int r = -3; r < reps; r++) {
        CU(cudaEventRecord(e0, 0));
        LAUNCH(cuda_rmsnorm_rows_bf16(&p, &l));
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) single += 1e3 * ms / reps;
    }
    CU(cudaEventRecord(e0, 0));
    for (int r = 0; r < burst; r++) LAUNCH(cuda_rmsnorm_rows_bf16(&p, &l));
    CU(cudaEventRecord(e1, 0));
    CU(cudaEventSynchronize(e1));
    CU(cudaEventElapsedTime(&ms, e0, e1));
    printf("timing: rmsnorm_rows_bf16 T=%d D=%d: %.2f us per launch alone, %.2f us back to back (%.0f GB/s; "
           "was 8.9 us in the prefill bench)\n",
           T, D, single, 1e3 * ms / burst, 6.0 * N / (1e3 * ms / burst) * 1e-3);
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
    free(x), free(w);
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("norm");
    rng_seed(&rng, test_seed(argc, argv, "test_norm"));
    run(1, 1024, NORM_ZC, 0, 0, 1);
    run(1, 1024, NORM_PLAIN, 0, 1, 0);
    run(8, 256, NORM_ZC, 0, 1, 1);   /* q_norm shape: Hq heads of hd */
    run(16, 128, NORM_PLAIN, 0, 0, 1);
    run(1, 1, NORM_ZC, 0, 0, 0);
    run(3, 33, NORM_PLAIN, 0, 0, 1);
    run(5, 1000, NORM_ZC, 0, 0, 0);
    run(1, 4096, NORM_ZC, 9, 0, 1); /* residual form */
    run(1, 48, NORM_PLAIN, 1, 0, 0);
    run(2, 12288, NORM_ZC, 0, 0, 1); /* > 48 KiB dynamic shared memory */
    run_rows(1, 1024, NORM_ZC, 0, 0);
    run_rows(2048, 1024, NORM_ZC, 0, 1); /* the 0.8B prefill shape */
    run_rows(37, 1000, NORM_PLAIN, 0, 0); /* register path, partial last chunk */
    run_rows(5, 36, NORM_ZC, 0, 1);       /* D % 8 == 4: loop fallback */
    run_rows(3, 2048, NORM_PLAIN, 0, 1);
    run_rows(9, 8, NORM_ZC, 0, 0);
    run_rows(2, 4096, NORM_ZC, 0, 0);     /* D > 2048: loop fallback */
    run_rows(7, 1024, NORM_ZC, 4, 0);     /* y only 8-byte aligned: loop fallback */
    time_rows(2048, 1024);
    /* rejected: parts with rows > 1 */
    RmsnormParams p;
    memset(&p, 0, sizeof p);
    float *d = dev_copy(NULL, 4096);
    CudaLaunch l = {0, 0, NULL, 0};
    p.x = d, p.w = d, p.y = d, p.rows = 2, p.n = 8, p.mode = NORM_ZC, p.parts = d, p.n_parts = 1;
    CHECK(cuda_rmsnorm(&p, &l) == cudaErrorInvalidValue, "parts with rows > 1 accepted");
    cudaFree(d);
    return TEST_SUMMARY("norm");
}
