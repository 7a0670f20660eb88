/* test_gemm.c — the prefill GEMM (cuda_gemm_bf16) and the batched decode step's GEMM for few rows
 * (cuda_gemm_skinny: also checked for batch invariance, the first M2 rows alone bitwise equal to the
 * same rows of the full product) against a double-precision CPU product of the same bf16 inputs, on fresh random shapes (ragged M = 1, 63, 64, 65, 2048 and random M, N, K),
 * all four epilogues, NaN-poisoned outputs and guard rows/columns that must stay untouched. The skinny GEMM also
 * with FP8 weights (GemmParams.w8 / w8_scale: random e4m3 bytes without the NaN codes, random positive scales per
 * row and 128-column block spread over 2^10, rows of ldw >= K with NaN codes in the gap) against the double product
 * on the dequantized weights, at M = 1, 7, 64, 65, 130 on ragged and decode shapes, every epilogue, the fused
 * residual + norm (bitwise its two-step form), and its refused arguments.
 * Large shapes are checked on a random subset of rows. Ends with a timing table (TFLOP/s) for
 * the Qwen3.5-0.8B prefill shapes at M = 2048 (and the decode-step shapes at M = 1, 64, 256 for the
 * skinny kernel and the TMA kernel side by side, with the weight bytes per second). Every algorithm (mma.sync; on
 * sm_90 also the cp.async wgmma kernels and every TMA variant) runs every case on the same inputs; shapes with
 * many tiles per CTA exercise the persistent kernels' ring phases. Each algorithm runs in its own
 * forked child process, so one that faults fails alone and the others still run. Usage:
 * test_gemm [seed]. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda/ops.h"
#include "cuda/serve_ops.h"
#include "test.h"
#include "gpu_common.h"
#include "util.h"

/* One bf16 ulp at |x| (8 significant bits): 2^(e-8) for |x| = m 2^e, m in [0.5, 1). */
static double bf16_ulp(double x) {
    int e = 0;
    frexp(x, &e);
    return x == 0 ? 0.0 : ldexp(1.0, e - 8);
}

static Rng rng;
static const CudaLaunch L0 = {0, 0, NULL, 0}; /* default stream, no PDL */
static int algo_lo = 0, algo_hi = 1;          /* this process tests algo_of[algo_lo .. algo_hi - 1] */
/* ALGO_SKINNY: cuda_gemm_skinny (the batched decode step's GEMM for few rows), tested on every GPU */
#define ALGO_SKINNY GEMM_ALGO_COUNT
static const int algo_of[] = {GEMM_ALGO_MMA,      ALGO_SKINNY,        GEMM_ALGO_WGMMA,    GEMM_ALGO_TMA,
                              GEMM_ALGO_TMA_C128, GEMM_ALGO_TMA_P128, GEMM_ALGO_TMA_P256, GEMM_ALGO_TMA_C64};
#define N_ALGOS_SM90 ((int)(sizeof algo_of / sizeof algo_of[0]))
#define N_ALGOS_ANY  2 /* algo_of[0 .. 1] run on any GPU, the rest on sm_90 */
static const char *const algo_name[GEMM_ALGO_COUNT + 1] = {"auto",    "mma",     "wgmma",  "tma",   "tmaC128",
                                                           "tmaP128", "tmaP256", "tmaC64", "skinny"};
static int n_sm = 1;

/* cuda_gemm_bf16, or for ALGO_SKINNY cuda_gemm_skinny with a workspace of the size it asks for */
static int gemm_run(GemmParams *p, int algo) {
    if (algo != ALGO_SKINNY) {
        p->algo = algo;
        return cuda_gemm_bf16(p, &L0);
    }
    const size_t wf = cuda_gemm_skinny_work(p->M, p->N, p->K, n_sm, p->epi, p->glu_group);
    float *work = NULL;
    if (wf) CUDA_OK(cudaMalloc((void **)&work, wf * sizeof(float)));
    const int rc = cuda_gemm_skinny(p, work, wf, n_sm, &L0);
    CUDA_OK(cudaDeviceSynchronize());
    if (work) CUDA_OK(cudaFree(work));
    return rc;
}

static uint16_t *rand_bf16(size_t n, float scale) {
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(scale * rng_normal(&rng));
    return h;
}
static void *dcopy(const void *h, size_t bytes) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static float silu(float x) { return x / (1.0f + expf(-x)); }

/* FP8 weights [N][K] in rows of ldw (ops.h FP8_SCALES_DOC): random e4m3 codes without the NaN codes 0x7f / 0xff (the
 * row gap holds 0x7f: never read), scales [ceil(K/128)][N] random positive over 2^10 (a scale of the wrong row or
 * block shows), wd [N][K] the values the skinny GEMM multiplies by, bf16(e4m3 * scale) (the product in fp32, as the
 * tiled GEMM's bf16 copies). */
static void rand_fp8(int N, int K, int ldw, uint8_t **q, float **sc, double **wd) {
    const int nb = (K + 127) / 128;
    *q = malloc((size_t)N * ldw), *sc = malloc((size_t)nb * N * sizeof(float)), *wd = malloc((size_t)N * K * 8);
    memset(*q, 0x7f, (size_t)N * ldw);
    for (size_t i = 0; i < (size_t)nb * N; i++)
        (*sc)[i] = (float)((0.5 + rng_uniform(&rng)) * ldexp(1.0, -(int)(rng_uniform(&rng) * 10)) / (64.0 * sqrt(K)));
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            uint8_t b;
            do b = (uint8_t)(rng_u64(&rng) & 0xff);
            while ((b & 0x7f) == 0x7f);
            (*q)[(size_t)n * ldw + k] = b;
            (*wd)[(size_t)n * K + k] = round_bf16(fp8_e4m3_to_f32(b) * (*sc)[(size_t)(k / 128) * N + n]);
        }
}

/* ref[n] = sum_k x[m][k] w[n][k] and sabs[n] = sum_k |x w| for one row m (double); wd (FP8): w's values in double
 * [N][K] instead of w. */
static void ref_row(const uint16_t *x, const uint16_t *w, const double *wd, int m, int N, int K, double *ref,
                    double *sabs) {
    const uint16_t *xr = x + (size_t)m * K;
    for (int n = 0; n < N; n++) {
        double s = 0, a = 0;
        for (int k = 0; k < K; k++) {
            const double wv = wd ? wd[(size_t)n * K + k] : (double)bf16_to_f32(w[(size_t)n * K + k]);
            const double p = (double)bf16_to_f32(xr[k]) * wv;
            s += p, a += fabs(p);
        }
        ref[n] = s, sabs[n] = a;
    }
}

/* One case: inputs, the initial y and the double-precision reference rows are made once, then every
 * algorithm runs on a fresh copy of y and is checked element by element (failures through CHECK). */
typedef struct Case {
    int M, N, K, epi, G, ycols, ldy, guard, esz, nrows;
    uint16_t *x, *w;    /* host inputs */
    unsigned char *y0;  /* initial y (NaN poison; ADD: the residual in the live part) */
    int *rows;          /* [nrows] rows checked */
    double *ref, *sabs; /* [nrows][N] reference sums and sums of |products| */
    uint16_t *dx, *dw;  /* device inputs */
    /* FP8 weights (skinny only; w, dw NULL): host q [N][ldw], sc [ceil(K/128)][N], wd [N][K]; device dq, dsc */
    int ldw;
    uint8_t *q, *dq;
    float *sc, *dsc;
    double *wd;
} Case;

/* GemmParams.split_m of the skinny launches (test_skinny_split_m) */
static int g_split_m;

/* the weight arguments of a case */
static void set_weights(GemmParams *p, const Case *cs) {
    p->ldw = cs->ldw;
    if (cs->q) p->w = NULL, p->w8 = cs->dq, p->w8_scale = cs->dsc;
}

static void check_algo(const Case *cs, int algo) {
    const int M = cs->M, N = cs->N, K = cs->K, epi = cs->epi, G = cs->G, ycols = cs->ycols, ldy = cs->ldy;
    const int esz = cs->esz;
    const size_t ybytes = (size_t)(M + cs->guard) * ldy * esz;
    unsigned char *y1 = malloc(ybytes);
    void *dy = dcopy(cs->y0, ybytes);
    GemmParams p = {cs->dx, cs->dw, dy, M, N, K, K, K, ldy, epi, G, algo, NULL, NULL, g_split_m, 0, 0, NULL, NULL};
    set_weights(&p, cs);
    const char *fmt = cs->q ? "fp8" : "bf16";
    const int rc = gemm_run(&p, algo);
    CHECK(rc == 0, "launch %s M=%d N=%d K=%d epi=%d algo=%s: %s", fmt, M, N, K, epi, algo_name[algo],
          cudaGetErrorString((cudaError_t)rc));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(y1, dy, ybytes, cudaMemcpyDeviceToHost));

    long bad = 0, checked = 0;
    double worst = 0;
    for (int ri = 0; ri < cs->nrows; ri++) {
        const int m = cs->rows[ri];
        const double *ref = cs->ref + (size_t)ri * N, *sabs = cs->sabs + (size_t)ri * N;
        for (int c = 0; c < ycols; c++) {
            double got, want, tol;
            const size_t i = (size_t)m * ldy + c;
            if (epi == GEMM_EPI_SWIGLU_BF16) {
                const int gr = (c / G) * 2 * G + c % G, ur = gr + G;
                const double g = round_bf16((float)ref[gr]), u = round_bf16((float)ref[ur]);
                const double act = round_bf16(silu((float)g));
                want = act * u;
                /* where the fp32 sum and the exact one straddle a bf16 rounding boundary, bf16(gate) and bf16(up)
                 * each land a whole ulp (<= 2^-7 of the value) away, and then bf16(silu) can cross one of its own
                 * boundaries (another ulp of act); silu' <= 1.1; last the output's own rounding */
                const double dg = ldexp(fabs(g), -7) + 1e-5 * sabs[gr], du = ldexp(fabs(u), -7) + 1e-5 * sabs[ur];
                tol = (1.1 * dg + ldexp(fabs(act), -7)) * fabs(u) + fabs(act) * du + ldexp(fabs(want), -7) + 1e-30;
                uint16_t h;
                memcpy(&h, y1 + i * 2, 2);
                got = bf16_to_f32(h);
            } else if (epi == GEMM_EPI_BF16 || epi == GEMM_EPI_F32) {
                want = ref[c];
                tol = ldexp(fabs(want), -8) + 1e-5 * sabs[c] + 1e-30;
                if (esz == 2) {
                    uint16_t h;
                    memcpy(&h, y1 + i * 2, 2);
                    got = bf16_to_f32(h);
                } else {
                    float f;
                    memcpy(&f, y1 + i * 4, 4);
                    got = f;
                    if (round_bf16(f) != f) got = NAN; /* F32 output must hold bf16 values */
                }
            } else {
                float f0, f;
                memcpy(&f0, cs->y0 + i * 4, 4);
                memcpy(&f, y1 + i * 4, 4);
                want = f0 + round_bf16((float)ref[c]);
                /* accumulation error (sabs term) and a flip of bf16(acc) (2^-7 |acc|), then the output's own
                 * rounding: bf16(y + bf16(acc)) can land one bf16 ulp of the output away from the nearest value
                 * to the exact sum when the fp32 accumulation sits on a rounding boundary. */
                tol = ldexp(fabs(f0) + fabs(ref[c]), -7) + bf16_ulp(want) + 1e-5 * sabs[c] + 1e-30;
                got = round_bf16(f) == f ? f : NAN;
            }
            const double err = fabs(got - want);
            checked++;
            if (!(err <= tol)) {
                if (bad < 3)
                    fprintf(stderr, "  %s M=%d N=%d K=%d epi=%d G=%d algo=%s: y[%d][%d] = %g, want %g (tol %g)\n", fmt,
                            M, N, K, epi, G, algo_name[algo], m, c, got, want, tol);
                bad++;
            } else if (err / (tol > 0 ? tol : 1) > worst) {
                worst = err / tol;
            }
        }
    }
    /* guard columns and rows must keep their initial bytes */
    long touched = 0;
    for (int r = 0; r < M + cs->guard; r++)
        for (int c = 0; c < ldy; c++) {
            if (r < M && c < ycols) continue;
            const size_t i = ((size_t)r * ldy + c) * esz;
            if (memcmp(cs->y0 + i, y1 + i, esz)) touched++;
        }
    CHECK(bad == 0, "%s M=%d N=%d K=%d epi=%d G=%d algo=%s: %ld of %ld elements out of tolerance", fmt, M, N, K, epi, G,
          algo_name[algo], bad, checked);
    CHECK(touched == 0, "%s M=%d N=%d K=%d epi=%d algo=%s: %ld guard elements written", fmt, M, N, K, epi,
          algo_name[algo], touched);
    if (algo == ALGO_SKINNY && M > 1 && !g_split_m) {
        /* batch invariance: the first M2 rows alone give bitwise the rows of the full product; for odd M2 on the
         * 64-column ring (GemmParams.narrow), which must not change a bit either */
        const int M2 = 1 + (int)(rng_u64(&rng) % (uint64_t)(M - 1));
        unsigned char *y2 = malloc(ybytes);
        void *dy2 = dcopy(cs->y0, ybytes);
        GemmParams p2 = {cs->dx, cs->dw, dy2, M2, N, K, K, K, ldy, epi, G, algo, NULL, NULL, 0, 0, M2 & 1, NULL, NULL};
        set_weights(&p2, cs);
        CHECK(gemm_run(&p2, algo) == 0, "skinny launch %s M=%d", fmt, M2);
        CUDA_OK(cudaMemcpy(y2, dy2, ybytes, cudaMemcpyDeviceToHost));
        long diff = 0;
        for (int r = 0; r < M2; r++)
            diff += memcmp(y1 + (size_t)r * ldy * esz, y2 + (size_t)r * ldy * esz, (size_t)ycols * esz) != 0;
        CHECK(diff == 0, "skinny %s M=%d N=%d K=%d epi=%d: %ld of the first %d rows differ from the M=%d run", fmt, M2,
              N, K, epi, diff, M2, M);
        free(y2);
        CUDA_OK(cudaFree(dy2));
    }
    printf("  %-8s %-4s M=%4d N=%5d K=%5d ldw=%5d epi=%d G=%2d ldy=%5d: %ld checked, worst err/tol %.3f\n",
           algo_name[algo], fmt, M, N, K, cs->ldw, epi, G, ldy, checked, worst);
    free(y1);
    CUDA_OK(cudaFree(dy));
}

/* One case for every algorithm of this process; f8: FP8 weights in rows of K + ldw_extra, the skinny GEMM alone. */
static void run_case_fmt(int M, int N, int K, int epi, int G, int ldy_extra, int f8, int ldw_extra) {
    if (f8 && !(algo_lo <= 1 && 1 < algo_hi)) return; /* algo_of[1] is ALGO_SKINNY */
    Case cs = {.M = M, .N = N, .K = K, .epi = epi, .G = G, .guard = 3, .ldw = K + (f8 ? ldw_extra : 0)};
    cs.ycols = epi == GEMM_EPI_SWIGLU_BF16 ? N / 2 : N, cs.ldy = cs.ycols + ldy_extra;
    cs.esz = (epi == GEMM_EPI_F32 || epi == GEMM_EPI_ADD_F32) ? 4 : 2;
    cs.x = rand_bf16((size_t)M * K, 1.0f);
    if (f8)
        rand_fp8(N, K, cs.ldw, &cs.q, &cs.sc, &cs.wd);
    else
        cs.w = rand_bf16((size_t)N * K, 1.0f / sqrtf((float)K));
    const size_t ny = (size_t)(M + cs.guard) * cs.ldy;
    cs.y0 = malloc(ny * cs.esz);
    /* initial y: NaN everywhere (poison), except ADD, whose live part holds a residual */
    for (size_t i = 0; i < ny; i++) {
        if (cs.esz == 4) {
            float v = NAN;
            if (epi == GEMM_EPI_ADD_F32 && i < (size_t)M * cs.ldy && (int)(i % cs.ldy) < cs.ycols)
                v = round_bf16(rng_normal(&rng));
            memcpy(cs.y0 + i * 4, &v, 4);
        } else {
            const uint16_t v = 0x7fc1;
            memcpy(cs.y0 + i * 2, &v, 2);
        }
    }
    /* rows to check: all for small problems, else 40 random rows plus the first and last */
    const int all = (double)M * N * K <= 3e8;
    cs.nrows = all ? M : 42;
    cs.rows = malloc((size_t)cs.nrows * sizeof(int));
    cs.ref = malloc((size_t)cs.nrows * N * sizeof(double)), cs.sabs = malloc((size_t)cs.nrows * N * sizeof(double));
    for (int ri = 0; ri < cs.nrows; ri++) {
        cs.rows[ri] = all ? ri : ri == 0 ? 0 : ri == 1 ? M - 1 : (int)(rng_u64(&rng) % (uint64_t)M);
        ref_row(cs.x, cs.w, cs.wd, cs.rows[ri], N, K, cs.ref + (size_t)ri * N, cs.sabs + (size_t)ri * N);
    }
    cs.dx = dcopy(cs.x, (size_t)M * K * 2);
    if (f8) {
        cs.dq = dcopy(cs.q, (size_t)N * cs.ldw);
        cs.dsc = dcopy(cs.sc, (size_t)((K + 127) / 128) * N * sizeof(float));
        check_algo(&cs, ALGO_SKINNY);
        CUDA_OK(cudaFree(cs.dq));
        CUDA_OK(cudaFree(cs.dsc));
        free(cs.q), free(cs.sc), free(cs.wd);
    } else {
        cs.dw = dcopy(cs.w, (size_t)N * K * 2);
        for (int a = algo_lo; a < algo_hi; a++) check_algo(&cs, algo_of[a]);
        CUDA_OK(cudaFree(cs.dw));
        free(cs.w);
    }
    free(cs.x), free(cs.y0), free(cs.rows), free(cs.ref), free(cs.sabs);
    CUDA_OK(cudaFree(cs.dx));
}
static void run_case(int M, int N, int K, int epi, int G, int ldy_extra) {
    run_case_fmt(M, N, K, epi, G, ldy_extra, 0, 0);
}

/* cuda_gemm_skinny_norm against its two-step form on the GPU: cuda_gemm_skinny (residual epilogue) then
 * cuda_rmsnorm_rows_bf16 of the new rows; x and h must be bitwise equal. f8: FP8 weights (rand_fp8, ldw = K). */
static void test_skinny_norm_fmt(int M, int N, int K, int mode, int f8) {
    uint16_t *x = rand_bf16((size_t)M * K, 1.0f), *w = f8 ? NULL : rand_bf16((size_t)N * K, 1.0f / sqrtf((float)K));
    uint8_t *q = NULL, *dq = NULL;
    float *sc = NULL, *dsc = NULL;
    double *wd = NULL;
    if (f8) {
        rand_fp8(N, K, K, &q, &sc, &wd);
        dq = dcopy(q, (size_t)N * K), dsc = dcopy(sc, (size_t)((K + 127) / 128) * N * sizeof(float));
    }
    float *y0 = malloc((size_t)M * N * 4), *nw = malloc((size_t)N * 4);
    for (size_t i = 0; i < (size_t)M * N; i++) y0[i] = round_bf16(rng_normal(&rng));
    for (int i = 0; i < N; i++) nw[i] = mode == NORM_ZC ? 0.1f * rng_normal(&rng) : 1.0f + 0.1f * rng_normal(&rng);
    uint16_t *dx = dcopy(x, (size_t)M * K * 2), *dw = f8 ? NULL : dcopy(w, (size_t)N * K * 2);
    float *dy1 = dcopy(y0, (size_t)M * N * 4), *dy2 = dcopy(y0, (size_t)M * N * 4), *dn = dcopy(nw, (size_t)N * 4);
    uint16_t *dh1 = NULL, *dh2 = NULL;
    CUDA_OK(cudaMalloc((void **)&dh1, (size_t)M * N * 2));
    CUDA_OK(cudaMalloc((void **)&dh2, (size_t)M * N * 2));
    CUDA_OK(cudaMemset(dh1, 0xff, (size_t)M * N * 2));
    CUDA_OK(cudaMemset(dh2, 0xff, (size_t)M * N * 2));
    const size_t wf = cuda_gemm_skinny_work(M, N, K, n_sm, GEMM_EPI_ADD_F32_NORM, 1);
    float *work = NULL;
    CUDA_OK(cudaMalloc((void **)&work, wf * sizeof(float)));
    GemmParams p1 = {dx, dw, dy1, M, N, K, K, K, N, GEMM_EPI_ADD_F32, 1, 0, NULL, NULL, g_split_m, 0, 0, NULL, NULL};
    p1.w8 = dq, p1.w8_scale = dsc;
    GemmParams p2 = p1;
    p2.y = dy2;
    RmsnormRowsParams np = {dy1, dn, dh1, M, N, mode, 1e-6f};
    int rc = cuda_gemm_skinny(&p1, work, wf, n_sm, &L0);
    rc |= cuda_rmsnorm_rows_bf16(&np, &L0);
    rc |= cuda_gemm_skinny_norm(&p2, dn, mode, 1e-6f, dh2, work, wf, n_sm, &L0);
    CUDA_OK(cudaDeviceSynchronize());
    float *y1 = malloc((size_t)M * N * 4), *y2 = malloc((size_t)M * N * 4);
    uint16_t *h1 = malloc((size_t)M * N * 2), *h2 = malloc((size_t)M * N * 2);
    CUDA_OK(cudaMemcpy(y1, dy1, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(y2, dy2, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h1, dh1, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h2, dh2, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
    const int xs = memcmp(y1, y2, (size_t)M * N * 4) == 0, hs = memcmp(h1, h2, (size_t)M * N * 2) == 0;
    /* x against the double product (the residual epilogue's bound, as in check_algo) */
    long xbad = 0;
    double *ref = malloc((size_t)N * sizeof(double)), *sabs = malloc((size_t)N * sizeof(double));
    for (int m = 0; m < M; m++) {
        ref_row(x, w, wd, m, N, K, ref, sabs);
        for (int n = 0; n < N; n++) {
            const double f0 = y0[(size_t)m * N + n], want = f0 + round_bf16((float)ref[n]), got = y2[(size_t)m * N + n];
            const double tol = ldexp(fabs(f0) + fabs(ref[n]), -7) + bf16_ulp(want) + 1e-5 * sabs[n] + 1e-30;
            xbad += !(fabs(got - want) <= tol);
        }
    }
    free(ref), free(sabs);
    const char *fmt = f8 ? "fp8" : "bf16";
    CHECK(rc == 0, "skinny norm %s M=%d N=%d K=%d: launch", fmt, M, N, K);
    CHECK(xs && hs, "skinny norm %s M=%d N=%d K=%d mode=%d: x %s, h %s the two-step form", fmt, M, N, K, mode,
          xs ? "equals" : "differs from", hs ? "equals" : "differs from");
    CHECK(xbad == 0, "skinny norm %s M=%d N=%d K=%d: %ld of x out of tolerance", fmt, M, N, K, xbad);
    printf("  skinny+norm %-4s M=%4d N=%5d K=%5d mode=%d: x and h %s, x %ld out of tolerance\n", fmt, M, N, K, mode,
           xs && hs ? "bitwise equal to skinny + rmsnorm_rows" : "DIFFER", xbad);
    free(x), free(w), free(y0), free(nw), free(y1), free(y2), free(h1), free(h2), free(q), free(sc), free(wd);
    CUDA_OK(cudaFree(dx));
    if (dw) CUDA_OK(cudaFree(dw));
    if (dq) CUDA_OK(cudaFree(dq));
    if (dsc) CUDA_OK(cudaFree(dsc));
    CUDA_OK(cudaFree(dy1));
    CUDA_OK(cudaFree(dy2));
    CUDA_OK(cudaFree(dn));
    CUDA_OK(cudaFree(dh1));
    CUDA_OK(cudaFree(dh2));
    CUDA_OK(cudaFree(work));
}

static void test_skinny_norm(int M, int N, int K, int mode) { test_skinny_norm_fmt(M, N, K, mode, 0); }

static int rand_mult8(int lo, int hi) { return 8 * (lo / 8 + (int)(rng_u64(&rng) % (uint64_t)((hi - lo) / 8 + 1))); }

static void test_shapes(void) {
    static const int fixed[][3] = {{1, 64, 64},        {63, 136, 72},   {64, 256, 1024},
                                   {65, 264, 200},     {1, 8224, 1024}, {2048, 1024, 3584},
                                   {2048, 8224, 1024}, {130, 520, 16},  {1000, 2056, 328}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        for (int epi = 0; epi < 3; epi++) run_case(fixed[i][0], fixed[i][1], fixed[i][2], epi, 0, epi == 1 ? 6 : 0);
    for (int i = 0; i < 4; i++) {
        const int M = 1 + (int)(rng_u64(&rng) % 300), N = rand_mult8(8, 640), K = rand_mult8(8, 1200);
        run_case(M, N, K, (int)(rng_u64(&rng) % 3), 0, (int)(rng_u64(&rng) % 3) * 2);
    }
    /* SwiGLU: gate/up interleave G in {1, 8, 16, 32} (1 = the backend's w_gu) */
    static const int glu[][3] = {{2048, 7168, 1024}, {65, 256, 64}, {1, 192, 40}, {300, 1024, 520}, {777, 2112, 200}};
    for (size_t i = 0; i < sizeof glu / sizeof glu[0]; i++)
        for (int G = 1; G <= 32; G = G == 1 ? 8 : 2 * G)
            run_case(glu[i][0], glu[i][1], glu[i][2], GEMM_EPI_SWIGLU_BF16, G, 0);
}

/* GemmParams.split_m (the batched step outside deterministic mode): the residual shapes of Qwen3.5-0.8B at M = 130
 * and 256, where the split plan counts the m-blocks (fewer splits than the shape's own plan), bf16 and FP8 against
 * the reference, and the fused norm against its two-step form; batch invariance is not asked for there. */
static void test_skinny_split_m(void) {
    g_split_m = 1;
    static const int Ms[] = {130, 256};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++)
        for (int f8 = 0; f8 < 2; f8++) {
            run_case_fmt(Ms[i], 1024, 3584, GEMM_EPI_ADD_F32, 0, 0, f8, 0);
            run_case_fmt(Ms[i], 1024, 2048, GEMM_EPI_ADD_F32, 0, 0, f8, 0);
            test_skinny_norm_fmt(Ms[i], 1024, 2048, NORM_ZC, f8);
        }
    g_split_m = 0;
}

/* The skinny GEMM on FP8 weights: a ragged shape (N = 200: N % 64 = 8; K = 336: 3 scale blocks, the last 80 wide,
 * 5.25 chunks; N = 208 for SwiGLU G = 8) with every epilogue and row strides ldw > K, and the decode shapes of
 * Qwen3.5-0.8B (in_proj, MLP gate+up, MLP down, out_proj), at M = 1, 7, 64, 65, 130; random shapes; the fused
 * residual + norm. */
static void test_skinny_fp8(void) {
    static const int Ms[] = {1, 7, 64, 65, 130};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        const int M = Ms[i];
        run_case_fmt(M, 200, 336, GEMM_EPI_BF16, 0, 0, 1, 0);
        run_case_fmt(M, 200, 336, GEMM_EPI_F32, 0, 6, 1, 32);
        run_case_fmt(M, 200, 336, GEMM_EPI_ADD_F32, 0, 0, 1, 16);
        run_case_fmt(M, 200, 336, GEMM_EPI_SWIGLU_BF16, 1, 0, 1, 0);
        run_case_fmt(M, 208, 336, GEMM_EPI_SWIGLU_BF16, 8, 0, 1, 0);
        run_case_fmt(M, 8224, 1024, GEMM_EPI_BF16, 0, 0, 1, 0);        /* DeltaNet in_proj */
        run_case_fmt(M, 7168, 1024, GEMM_EPI_SWIGLU_BF16, 1, 0, 1, 0); /* MLP gate+up */
        run_case_fmt(M, 1024, 3584, GEMM_EPI_ADD_F32, 0, 0, 1, 0);     /* MLP down */
        run_case_fmt(M, 1024, 2048, GEMM_EPI_ADD_F32, 0, 0, 1, 0);     /* out_proj / o_proj */
    }
    for (int i = 0; i < 6; i++) {
        const int M = 1 + (int)(rng_u64(&rng) % 300), N = rand_mult8(8, 640), K = 16 * (1 + (int)(rng_u64(&rng) % 75));
        const int epi = (int)(rng_u64(&rng) % 4);
        run_case_fmt(M, N, K, epi, epi == GEMM_EPI_SWIGLU_BF16 ? 1 : 0, (int)(rng_u64(&rng) % 3) * 2, 1,
                     16 * (int)(rng_u64(&rng) % 3));
    }
    test_skinny_norm_fmt(64, 1024, 3584, NORM_ZC, 1);
    test_skinny_norm_fmt(7, 1024, 2048, NORM_PLAIN, 1);
    test_skinny_norm_fmt(130, 200, 336, NORM_ZC, 1);
    test_skinny_norm_fmt(1, 512, 1024, NORM_PLAIN, 1);
}

/* The FP8 form's argument checks: a valid call runs and gives the exact product (K products 1 * 1 * 0.5), each bad
 * one is refused and writes nothing. */
static void test_skinny_fp8_bad_args(void) {
    const int M = 4, N = 16, K = 32;
    uint16_t hx[4 * 64], hw[16 * 64];
    uint8_t hq[16 * 64 + 16];
    float hs[16], hy[4 * 16];
    for (int i = 0; i < 4 * 64; i++) hx[i] = 0x3f80; /* bf16 1.0 */
    for (int i = 0; i < 16 * 64; i++) hw[i] = 0x3f80;
    memset(hq, 0x38, sizeof hq); /* e4m3 1.0 */
    for (int i = 0; i < 16; i++) hs[i] = 0.5f;
    for (int i = 0; i < M * N; i++) hy[i] = NAN;
    uint16_t *dx = dcopy(hx, sizeof hx), *dw = dcopy(hw, sizeof hw), *dh = NULL;
    uint8_t *dq = dcopy(hq, sizeof hq);
    float *ds = dcopy(hs, sizeof hs), *dy = dcopy(hy, sizeof hy), *dnw = NULL, *work = NULL;
    CUDA_OK(cudaMalloc((void **)&dh, (size_t)M * N * 2));
    CUDA_OK(cudaMalloc((void **)&dnw, (size_t)N * 4));
    CUDA_OK(cudaMemset(dnw, 0, (size_t)N * 4));
    const size_t wf = (size_t)1 << 16;
    CUDA_OK(cudaMalloc((void **)&work, wf * sizeof(float)));
    GemmParams ok = {dx, NULL, dy, M, N, K, K, K, N, GEMM_EPI_F32, 1, 0, NULL, NULL, 0, 0, 0, NULL, NULL};
    ok.w8 = dq, ok.w8_scale = ds;
    CHECK(cuda_gemm_skinny(&ok, work, wf, n_sm, &L0) == 0, "skinny fp8: a valid 4 x 16 x 32 problem refused");
    CUDA_OK(cudaDeviceSynchronize());
    float y[4 * 16];
    CUDA_OK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    int exact = 1;
    for (int i = 0; i < M * N; i++) exact &= y[i] == 0.5f * K;
    CHECK(exact, "skinny fp8: the valid problem gives y[0] = %g, want %g", y[0], 0.5 * K);
    GemmParams okn = ok;
    okn.epi = GEMM_EPI_ADD_F32;
    CHECK(cuda_gemm_skinny_norm(&okn, dnw, NORM_ZC, 1e-6f, dh, work, wf, n_sm, &L0) == 0,
          "skinny fp8 norm: a valid problem refused");
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    exact = 1;
    for (int i = 0; i < M * N; i++) exact &= y[i] == 0.5f * K * 2;
    CHECK(exact, "skinny fp8 norm: the valid problem gives y[0] = %g, want %g", y[0], 0.5 * K * 2);
    GemmParams bad[7];
    const char *what[7] = {"w and w8 both set", "neither w nor w8",  "w8_scale without w8",   "w8 without w8_scale",
                           "fp8 K % 16 != 0",   "fp8 ldw % 16 != 0", "w8 not 16-byte aligned"};
    for (int i = 0; i < 7; i++) bad[i] = ok;
    bad[0].w = dw;
    bad[1].w8 = NULL, bad[1].w8_scale = NULL;
    bad[2].w8 = NULL;
    bad[3].w8_scale = NULL;
    bad[4].K = 40, bad[4].ldx = 40, bad[4].ldw = 48;
    bad[5].ldw = 40;
    bad[6].w8 = dq + 8;
    int refused = 0;
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < 7; i++) {
            GemmParams g = bad[i];
            int rc;
            if (v == 0) {
                rc = cuda_gemm_skinny(&g, work, wf, n_sm, &L0);
            } else {
                g.epi = GEMM_EPI_ADD_F32;
                rc = cuda_gemm_skinny_norm(&g, dnw, NORM_ZC, 1e-6f, dh, work, wf, n_sm, &L0);
            }
            CUDA_OK(cudaDeviceSynchronize());
            float y2[4 * 16];
            CUDA_OK(cudaMemcpy(y2, dy, sizeof y2, cudaMemcpyDeviceToHost));
            const int same = memcmp(y, y2, sizeof y) == 0;
            CHECK(rc == (int)cudaErrorInvalidValue && same, "%s: %s: rc %d, y %s",
                  v ? "cuda_gemm_skinny_norm" : "cuda_gemm_skinny", what[i], rc, same ? "untouched" : "written");
            refused += rc == (int)cudaErrorInvalidValue && same;
        }
    printf("  skinny fp8 arguments: 2 valid calls %s, %d of 14 bad ones refused\n", exact ? "exact" : "WRONG", refused);
    CUDA_OK(cudaFree(dx));
    CUDA_OK(cudaFree(dw));
    CUDA_OK(cudaFree(dq));
    CUDA_OK(cudaFree(ds));
    CUDA_OK(cudaFree(dy));
    CUDA_OK(cudaFree(dh));
    CUDA_OK(cudaFree(dnw));
    CUDA_OK(cudaFree(work));
}

static void test_bad_args(void) {
    void *buf = NULL;
    CUDA_OK(cudaMalloc(&buf, 4096));
    CUDA_OK(cudaMemset(buf, 0, 4096));
    GemmParams p = {buf, buf, buf, 4, 16, 16, 16, 16, 16, GEMM_EPI_BF16, 0, GEMM_ALGO_AUTO, NULL, NULL, 0, 0, 0, NULL, NULL};
    CHECK(cuda_gemm_bf16(&p, &L0) == 0, "a valid 4 x 16 x 16 problem must be accepted");
    CUDA_OK(cudaDeviceSynchronize());
    p.N = 12;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "N not a multiple of 8 must be refused");
    p.N = 16, p.K = 12;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "K not a multiple of 8 must be refused");
    p.K = 16, p.M = 0;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "M = 0 must be refused");
    p.M = 4, p.epi = GEMM_EPI_SWIGLU_BF16, p.glu_group = 12;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "glu_group 12 must be refused");
    p.epi = GEMM_EPI_BF16, p.x = (const uint16_t *)((char *)buf + 8);
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "x not 16-byte aligned must be refused");
    p.x = buf, p.algo = GEMM_ALGO_COUNT;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "unknown algo must be refused");
    p.algo = GEMM_ALGO_AUTO, p.epi = GEMM_EPI_ARGMAX + 1;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "unknown epilogue must be refused");
    p.epi = GEMM_EPI_ARGMAX, p.am_cols = 16;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "the argmax epilogue with an algorithm other than TMA C128 / P128 refused");
    p.algo = GEMM_ALGO_TMA_C128, p.am_cols = 0;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "the argmax epilogue with am_cols 0 must be refused");
    p.am_cols = 17;
    CHECK(cuda_gemm_bf16(&p, &L0) != 0, "the argmax epilogue with am_cols > N must be refused");
    CUDA_OK(cudaFree(buf));
}

/* GEMM_EPI_ARGMAX (the batched step's greedy LM head, TMA C128 / P128) + cuda_rows_argmax_final against the same
 * GEMM's GEMM_EPI_F32 logits + cuda_rows_argmax (the logits path): the same ids, logprobs within 2e-5, every partial
 * of the NaN-poisoned work written. W row 7 is copied to rows 9000 and 248100 (past am_cols: never picked) and scaled
 * up, so that many rows tie and the smallest id must win. */
static void test_argmax_epilogue(int M, int N, int K, int am_cols, int algo) {
    uint16_t *x = rand_bf16((size_t)M * K, 1.0f), *w = rand_bf16((size_t)N * K, 1.0f / sqrtf((float)K));
    for (int k = 0; k < K; k++) w[7 * (size_t)K + k] = f32_to_bf16(3.0f * bf16_to_f32(w[7 * (size_t)K + k]));
    memcpy(w + (size_t)9000 * K, w + (size_t)7 * K, 2 * (size_t)K);
    if (N > 248100) memcpy(w + (size_t)248100 * K, w + (size_t)7 * K, 2 * (size_t)K);
    uint16_t *dx = dcopy(x, 2 * (size_t)M * K), *dw = dcopy(w, 2 * (size_t)N * K);
    float *dy = NULL, *dlp = NULL, *dlp2 = NULL;
    int32_t *did = NULL, *did2 = NULL;
    void *work = NULL, *work2 = NULL;
    const size_t wb = gemm_argmax_work_bytes(M, am_cols), wb2 = rows_argmax_work_bytes(M, am_cols);
    CUDA_OK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)M * N));
    CUDA_OK(cudaMalloc((void **)&dlp, sizeof(float) * M));
    CUDA_OK(cudaMalloc((void **)&dlp2, sizeof(float) * M));
    CUDA_OK(cudaMalloc((void **)&did, sizeof(int32_t) * M));
    CUDA_OK(cudaMalloc((void **)&did2, sizeof(int32_t) * M));
    CUDA_OK(cudaMalloc(&work, wb));
    CUDA_OK(cudaMalloc(&work2, wb2));
    CUDA_OK(cudaMemset(work, 0xff, wb)); /* NaN */
    CUDA_OK(cudaMemset(did, 0xff, sizeof(int32_t) * M));
    GemmParams p = {dx, dw, dy, M, N, K, K, K, N, GEMM_EPI_F32, 1, algo, NULL, NULL, 0, 0, 0, NULL, NULL};
    int rc = cuda_gemm_bf16(&p, &L0);
    RowsArgmaxParams ap = {dy, M, N, am_cols, did2, work2, wb2, dlp2};
    if (!rc) rc = cuda_rows_argmax(&ap, &L0);
    p.epi = GEMM_EPI_ARGMAX, p.y = work, p.ldy = 0, p.am_cols = am_cols;
    if (!rc) rc = cuda_gemm_bf16(&p, &L0);
    RowsArgmaxParams af = {NULL, M, N, am_cols, did, work, wb, dlp};
    if (!rc) rc = cuda_rows_argmax_final(&af, &L0);
    CHECK(rc == 0, "argmax epilogue %s M=%d N=%d: launch %d", algo_name[algo], M, N, rc);
    CUDA_OK(cudaDeviceSynchronize());
    int32_t *id = malloc(sizeof(int32_t) * M), *id2 = malloc(sizeof(int32_t) * M);
    float *lp = malloc(sizeof(float) * M), *lp2 = malloc(sizeof(float) * M), *part = malloc(wb);
    CUDA_OK(cudaMemcpy(id, did, sizeof(int32_t) * M, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(id2, did2, sizeof(int32_t) * M, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(lp, dlp, sizeof(float) * M, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(lp2, dlp2, sizeof(float) * M, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(part, work, wb, cudaMemcpyDeviceToHost));
    int ids_differ = 0, ties = 0, unwritten = 0;
    double lp_err = 0;
    for (int m = 0; m < M; m++) {
        ids_differ += id[m] != id2[m];
        ties += id[m] == 7;
        const double e = fabs((double)lp[m] - lp2[m]);
        if (!(e <= lp_err)) lp_err = e;
    }
    for (size_t i = 0; i < wb / 4; i++) unwritten += part[i] != part[i];
    printf("  argmax epilogue %s M=%d N=%d K=%d am_cols=%d: %d ids differ from the logits path (%d rows picked the "
           "tied id 7), logprobs within %.2g, %d partials unwritten\n",
           algo_name[algo], M, N, K, am_cols, ids_differ, ties, lp_err, unwritten);
    CHECK(ids_differ == 0 && lp_err <= 2e-5 && unwritten == 0,
          "argmax epilogue %s M=%d: %d ids differ, logprobs off by %.3g, %d partials unwritten", algo_name[algo], M,
          ids_differ, lp_err, unwritten);
    CHECK(ties > 0, "argmax epilogue %s M=%d: no row picked the tied id (the test lost its ties)", algo_name[algo], M);
    free(x), free(w), free(id), free(id2), free(lp), free(lp2), free(part);
    CUDA_OK(cudaFree(dx));
    CUDA_OK(cudaFree(dw));
    CUDA_OK(cudaFree(dy));
    CUDA_OK(cudaFree(dlp));
    CUDA_OK(cudaFree(dlp2));
    CUDA_OK(cudaFree(did));
    CUDA_OK(cudaFree(did2));
    CUDA_OK(cudaFree(work));
    CUDA_OK(cudaFree(work2));
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median time of 20 launches after 3 warm-ups, as TFLOP/s; f8 (skinny only): FP8 weights (random codes and scales,
 * no NaN codes), the weight bytes those of the e4m3 codes and the scales. */
static void bench_fmt(const char *name, int M, int N, int K, int epi, int algo, int f8) {
    uint16_t *x = rand_bf16((size_t)M * K, 1.0f), *w = f8 ? NULL : rand_bf16((size_t)N * K, 0.03f);
    const int ycols = epi == GEMM_EPI_SWIGLU_BF16 ? N / 2 : N, nb = (K + 127) / 128;
    uint16_t *dx = dcopy(x, (size_t)M * K * 2), *dw = f8 ? NULL : dcopy(w, (size_t)N * K * 2);
    uint8_t *dq = NULL;
    float *dsc = NULL;
    if (f8) {
        uint8_t *q = malloc((size_t)N * K);
        float *sc = malloc((size_t)nb * N * sizeof(float));
        for (size_t i = 0; i < (size_t)N * K; i++) {
            q[i] = (uint8_t)(rng_u64(&rng) & 0xff);
            if ((q[i] & 0x7f) == 0x7f) q[i] ^= 1;
        }
        for (size_t i = 0; i < (size_t)nb * N; i++) sc[i] = 1e-4f * (1.0f + rng_uniform(&rng));
        dq = dcopy(q, (size_t)N * K), dsc = dcopy(sc, (size_t)nb * N * sizeof(float));
        free(q), free(sc);
    }
    void *dy = NULL;
    CUDA_OK(cudaMalloc(&dy, (size_t)M * ycols * 4));
    CUDA_OK(cudaMemset(dy, 0, (size_t)M * ycols * 4));
    GemmParams p = {dx, dw, dy, M, N, K, K, K, ycols, epi, 1, algo, NULL, NULL, 0, 0, 0, NULL, NULL};
    p.w8 = dq, p.w8_scale = dsc;
    const size_t wf = algo == ALGO_SKINNY ? cuda_gemm_skinny_work(M, N, K, n_sm, epi, 1) : 0;
    float *work = NULL;
    if (wf) CUDA_OK(cudaMalloc((void **)&work, wf * sizeof(float)));
#define BENCH_LAUNCH() (algo == ALGO_SKINNY ? cuda_gemm_skinny(&p, work, wf, n_sm, &L0) : cuda_gemm_bf16(&p, &L0))
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    float ms[20];
    int rc = 0;
    for (int i = 0; i < 3; i++) rc |= BENCH_LAUNCH();
    for (int i = 0; i < 20; i++) {
        CUDA_OK(cudaEventRecord(e0, 0));
        rc |= BENCH_LAUNCH();
        CUDA_OK(cudaEventRecord(e1, 0));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    CHECK(rc == 0, "bench %s launch", name);
    qsort(ms, 20, sizeof(float), cmp_float);
    const double flop = 2.0 * M * N * K, wbytes = f8 ? (double)N * K + 4.0 * nb * N : 2.0 * N * K;
    printf("  %-6s %-4s %-34s [%d x %d] x [%d x %d]^T  %8.1f us  %6.1f TFLOP/s  weights %6.0f GB/s\n", algo_name[algo],
           f8 ? "fp8" : "bf16", name, M, K, N, K, ms[10] * 1e3, flop / (ms[10] * 1e-3) / 1e12,
           wbytes / (ms[10] * 1e-3) / 1e9);
    if (work) CUDA_OK(cudaFree(work));
#undef BENCH_LAUNCH
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    CUDA_OK(cudaFree(dx));
    if (dw) CUDA_OK(cudaFree(dw));
    if (dq) CUDA_OK(cudaFree(dq));
    if (dsc) CUDA_OK(cudaFree(dsc));
    CUDA_OK(cudaFree(dy));
    free(x), free(w);
}
static void bench(const char *name, int M, int N, int K, int epi, int algo) { bench_fmt(name, M, N, K, epi, algo, 0); }

/* Child process of algorithm index a: every case and the timing table for algo_of[a] alone. Exit code:
 * TEST_SUMMARY's, or 77 when there is nothing to test (no GPU; a >= N_ALGOS_ANY on a GPU other than sm_90). */
static int run_algo(int a, uint64_t seed) {
    rng_seed(&rng, seed); /* every child draws the same shapes and inputs */
    int g = gpu_present();
    if (g == 0) return a == 0 ? (printf("gemm: no GPU\n"), 77) : 77;
    if (g < 0) {
        t_fail++;
        return TEST_SUMMARY("gemm");
    }
    int dev = 0, major = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (a >= N_ALGOS_ANY && major != 9) return 77;
    CUDA_OK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    algo_lo = a, algo_hi = a + 1;
    printf("-- %s (compute capability major %d)\n", algo_name[algo_of[a]], major);
    if (a == 0) test_bad_args();
    test_shapes();
    if (algo_of[a] == ALGO_SKINNY) {
        test_skinny_norm(64, 1024, 3584, NORM_ZC);
        test_skinny_norm(7, 1024, 2048, NORM_PLAIN);
        test_skinny_norm(200, 2048, 1000, NORM_ZC);
        test_skinny_norm(3, 512, 72, NORM_PLAIN);
        test_skinny_fp8_bad_args();
        test_skinny_fp8();
        test_skinny_split_m();
    }
    if (algo_of[a] == GEMM_ALGO_TMA_C128 || algo_of[a] == GEMM_ALGO_TMA_P128) {
        test_argmax_epilogue(256, 248320, 1024, 248077, algo_of[a]); /* the 0.8B LM head, ids past n_valid */
        test_argmax_epilogue(131, 12296, 256, 12296, algo_of[a]);    /* ragged rows and columns */
    }
    printf("timing (median of 20):\n");
    const int algo = algo_of[a];
    /* the batched decode step's shapes at B = 1, 64, 256: skinny against the prefill GEMM's TMA kernels */
    if (algo == ALGO_SKINNY || algo == GEMM_ALGO_TMA)
        for (int Mb = 1; Mb <= 256; Mb *= Mb == 1 ? 64 : 4) {
            bench("DeltaNet in_proj qkvzba (bf16 out)", Mb, 8224, 1024, GEMM_EPI_BF16, algo);
            bench("MLP gate+up (SwiGLU out)", Mb, 7168, 1024, GEMM_EPI_SWIGLU_BF16, algo);
            bench("MLP down (+= residual)", Mb, 1024, 3584, GEMM_EPI_ADD_F32, algo);
            bench("out_proj / o_proj (+= residual)", Mb, 1024, 2048, GEMM_EPI_ADD_F32, algo);
            bench("LM head (fp32 out)", Mb, 248320, 1024, GEMM_EPI_F32, algo);
            if (algo == ALGO_SKINNY) { /* the same with FP8 weights */
                bench_fmt("DeltaNet in_proj qkvzba (bf16 out)", Mb, 8224, 1024, GEMM_EPI_BF16, algo, 1);
                bench_fmt("MLP gate+up (SwiGLU out)", Mb, 7168, 1024, GEMM_EPI_SWIGLU_BF16, algo, 1);
                bench_fmt("MLP down (+= residual)", Mb, 1024, 3584, GEMM_EPI_ADD_F32, algo, 1);
                bench_fmt("out_proj / o_proj (+= residual)", Mb, 1024, 2048, GEMM_EPI_ADD_F32, algo, 1);
                bench_fmt("LM head (fp32 out)", Mb, 248320, 1024, GEMM_EPI_F32, algo, 1);
            }
        }
    if (algo == ALGO_SKINNY) return TEST_SUMMARY("gemm/skinny");
    bench("DeltaNet in_proj qkvzba (bf16 out)", 2048, 8224, 1024, GEMM_EPI_BF16, algo);
    bench("attention q|gate,k,v (bf16 out)", 2048, 5120, 1024, GEMM_EPI_BF16, algo);
    bench("MLP gate+up (SwiGLU out)", 2048, 7168, 1024, GEMM_EPI_SWIGLU_BF16, algo);
    bench("MLP down (+= residual)", 2048, 1024, 3584, GEMM_EPI_ADD_F32, algo);
    bench("out_proj / o_proj (+= residual)", 2048, 1024, 2048, GEMM_EPI_ADD_F32, algo);
    bench("square 4096 (bf16 out)", 4096, 4096, 4096, GEMM_EPI_BF16, algo);
    char name[32];
    snprintf(name, sizeof name, "gemm/%s", algo_name[algo]);
    return TEST_SUMMARY(name);
}

/* Each algorithm runs in its own child process (the parent makes no CUDA call): a kernel fault poisons
 * the CUDA context of its process only, so it is reported as that algorithm's failure and the other
 * algorithms still run. */
int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("test_gemm: seed %llu (replay: test_gemm %llu)\n", (unsigned long long)seed, (unsigned long long)seed);
    for (int a = 0; a < N_ALGOS_SM90; a++) {
        fflush(stdout), fflush(stderr);
        const pid_t pid = fork();
        if (pid < 0) {
            CHECK(0, "fork: %s", strerror(errno));
            break;
        }
        if (pid == 0) {
            const int rc = run_algo(a, seed);
            fflush(stdout), fflush(stderr);
            _exit(rc);
        }
        int status = 0;
        if (waitpid(pid, &status, 0) != pid) status = -1;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
            if (a == 0) {
                printf("gemm: 0 passed, 0 failed\n");
                return 0;
            }
            continue;
        }
        const int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        CHECK(ok, "algorithm %s: child %s %d", algo_name[algo_of[a]],
              WIFSIGNALED(status) ? "killed by signal" : "exit code",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
    return TEST_SUMMARY("gemm");
}
