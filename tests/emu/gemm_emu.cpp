/* gemm_emu.cpp — the TMA + wgmma GEMM (src/cuda/gemm_tma.cu, pulled in by run_gemm.sh) run under the
 * host emulation of emu.h + emu_wgmma.h (one CTA of 384 fibers at a time, shared memory starting as
 * garbage), through the kernel's own variant table (gemm_tma_run) with GEMM_ALGO_TMA_C256 / C128 /
 * P128 / P256 and every epilogue (SwiGLU: glu_group 1), against a double-precision reference passed
 * through the epilogue's rounding. Shapes: ragged M, N, K (box tails zero-filled by the emulated TMA),
 * a full tile, and several tiles per CTA (grid capped by `sms`: the persistent loop, the ring wrapping
 * over several phases, the ping-pong hand-off). X rows carry NaN padding past K (a read outside the
 * tensor map's K poisons the result), Y starts as NaN (or random values for += Y) and its columns past
 * N are guards that must stay untouched. Bounds per element (e: fp32 accumulation, K * 6e-8 sum|x w|):
 *   BF16 / F32: |y - bf16(S)| <= e + 2^-7 |S|;  ADD_F32: <= e + 2^-7 (|S| + |y|);
 *   SWIGLU: the same propagated through bf16(bf16(silu(bf16 g)) bf16(u)).
 * A result one bf16 step off (fp32 and double sums on two sides of a rounding midpoint) is within
 * these bounds, so "of bound" reaches ~0.98 on some seeds; anything larger fails.
 * Prints the largest |error| and error/bound per case; exit 1 on a failed bound, 2/3 on an emulation
 * error (emu_wgmma.h) or a deadlock. Usage: gemm_emu [seed]. Not emulated: see emu_wgmma.h. */
// clang-format off
#include "emu.h"        /* first: its macros replace CUDA's qualifiers */
#include "emu_wgmma.h"
#undef __host__
#define __host__
#include "cuda/ops.h"
#define __CUDA_ARCH_FEAT_SM90_ALL 1 /* the kernel's sm_90a branch */
#include "gemm_desc.inc"     /* wgmma_desc from src/cuda/mma.cuh */
#include "gemm_cuh.inc"      /* src/cuda/gemm.cuh: tile order, epilogues */
#include "gemm_tma_kern.inc" /* src/cuda/gemm_tma.cu: TmaCfg, the kernel */
#include <time.h>
// clang-format on

/* tma_launch of gemm_tma.cu on the emulated tensor maps */
static int launched_tm, launched_bn, launched_pp, launched_grid;
template <int TM, int BN, int STAGES, bool PP, int EPI, int DBG = 0>
static int tma_launch(const GemmParams *p, int sms, const CudaLaunch *) {
    using C = TmaCfg<TM, BN, STAGES, PP>;
    GemmTmaArgs a;
    memset(&a, 0, sizeof a);
    a.p = *p;
    cuda_tma_map_bf16(&a.ta, p->x, p->M, p->K, p->ldx, TM);
    cuda_tma_map_bf16(&a.tb, p->w, p->N, p->K, p->ldw, BN);
    const int tiles = ((p->M + TM - 1) / TM) * ((p->N + BN - 1) / BN), grid = tiles < sms ? tiles : sms;
    launched_tm = TM, launched_bn = BN, launched_pp = PP, launched_grid = grid;
    emu_launch(dim3(grid), 384, C::SMEM, 1, [&] { gemm_bf16_tma<TM, BN, STAGES, PP, EPI, DBG>(a); });
    return 0;
}
// clang-format off
#include "gemm_tma_host.inc" /* tma_pick, tma_variant, gemm_tma_run */
// clang-format on

static uint64_t rs;
static double urand() {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (rs >> 11) * (1.0 / 9007199254740992.0);
}
static float nrm() {
    double u1 = urand() + 1e-12, u2 = urand();
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}
static double bff(uint16_t h) { return (double)__uint_as_float((uint32_t)h << 16); }
static void *alloc(size_t bytes) { return aligned_alloc(64, ((bytes + 63) / 64) * 64); }

static int fails;
static const char *algo_name(int a) {
    return a == GEMM_ALGO_TMA_C256 ? "C256" : a == GEMM_ALGO_TMA_C128 ? "C128" : a == GEMM_ALGO_TMA_P128 ? "P128" : a == GEMM_ALGO_TMA_P256 ? "P256" : "TMA(auto)";
}
static const char *epi_name(int e) {
    return e == GEMM_EPI_BF16 ? "bf16" : e == GEMM_EPI_F32 ? "f32" : e == GEMM_EPI_ADD_F32 ? "add_f32" : "swiglu1";
}

/* One GEMM: x [M][ldx] (NaN past K), w [N][ldw]; y [M][ldy] (ycols = N or N/2 used, the rest guards). */
static void run_case(int M, int N, int K, int ldy_pad, int sms, int algo, int epi) {
    const int ldx = K + 8, ldw = K + 16 * (N % 16 == 8), ycols = epi == GEMM_EPI_SWIGLU_BF16 ? N / 2 : N;
    const int ldy = ycols + ldy_pad;
    const bool f32 = epi == GEMM_EPI_F32 || epi == GEMM_EPI_ADD_F32;
    uint16_t *x = (uint16_t *)alloc((size_t)M * ldx * 2), *w = (uint16_t *)alloc((size_t)N * ldw * 2);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < ldx; k++) x[(size_t)m * ldx + k] = k < K ? emu_bf(nrm()) : 0xffc0; /* NaN padding */
    for (int n = 0; n < N; n++)
        for (int k = 0; k < ldw; k++) w[(size_t)n * ldw + k] = k < K ? emu_bf(nrm() / sqrtf((float)K)) : 0xffc0;
    const size_t ny = (size_t)M * ldy;
    void *y = alloc(ny * (f32 ? 4 : 2));
    float *y0 = (float *)alloc(ny * 4);
    for (size_t i = 0; i < ny; i++) {
        y0[i] = epi == GEMM_EPI_ADD_F32 || (int)(i % ldy) >= ycols ? rbf(nrm()) : NAN;
        if (f32) ((float *)y)[i] = y0[i];
        else ((uint16_t *)y)[i] = emu_bf(y0[i]);
    }
    GemmParams p;
    memset(&p, 0, sizeof p);
    p.x = x, p.w = w, p.y = y, p.M = M, p.N = N, p.K = K, p.ldx = ldx, p.ldw = ldw, p.ldy = ldy;
    p.epi = epi, p.glu_group = 1, p.algo = algo;
    CudaLaunch l;
    memset(&l, 0, sizeof l);
    const long wg0 = emu_wgmma_count;
    printf("  %-4s %-7s M %3d N %3d K %3d ldy %3d: ", algo_name(algo), epi_name(epi), M, N, K, ldy);
    fflush(stdout); /* names the case if the emulator stops on a deadlock or an emulation error */
    const int rc = gemm_tma_run(&p, sms, &l);

    double max_err = 0, max_ratio = 0;
    int bad = 0, bad_guard = 0;
    auto dot = [&](int m, int n, double &s, double &a) {
        s = 0, a = 0;
        for (int k = 0; k < K; k++) {
            const double v = bff(x[(size_t)m * ldx + k]) * bff(w[(size_t)n * ldw + k]);
            s += v, a += fabs(v);
        }
    };
    const double u = 1.0 / 128;
    for (int m = 0; m < M; m++)
        for (int c = 0; c < ldy; c++) {
            const size_t o = (size_t)m * ldy + c;
            const double got = f32 ? (double)((float *)y)[o] : bff(((uint16_t *)y)[o]);
            if (c >= ycols) { /* guard */
                const bool same = f32 ? memcmp(&((float *)y)[o], &y0[o], 4) == 0 : ((uint16_t *)y)[o] == emu_bf(y0[o]);
                bad_guard += !same;
                continue;
            }
            double ref, tol;
            if (epi == GEMM_EPI_SWIGLU_BF16) {
                double g, ag, up, au;
                dot(m, 2 * c, g, ag), dot(m, 2 * c + 1, up, au);
                const double eg = (K + 16) * 6e-8 * ag + u * fabs(g), eu = (K + 16) * 6e-8 * au + u * fabs(up);
                const float act = rbf(silu_f(rbf((float)g)));
                ref = rbf(act * rbf((float)up));
                const double dact = 1.1 * eg + u * fabs(act);
                tol = fabs(up) * dact + fabs(act) * eu + dact * eu + u * fabs(ref) + 1e-30;
            } else {
                double s, a;
                dot(m, c, s, a);
                const double e = (K + 16) * 6e-8 * a;
                if (epi == GEMM_EPI_ADD_F32) {
                    ref = rbf(y0[o] + rbf((float)s));
                    tol = e + u * (fabs(s) + fabs(ref)) + 1e-30;
                } else {
                    ref = rbf((float)s);
                    tol = e + u * fabs(s) + 1e-30;
                }
            }
            const double err = fabs(got - ref);
            if (!(err <= tol)) {
                if (bad < 4) fprintf(stderr, "    y[%d][%d]: got %.8g ref %.8g (bound %.3g)\n", m, c, got, ref, tol);
                bad++;
                if (!(err == err)) max_err = INFINITY, max_ratio = INFINITY;
            }
            if (err > max_err) max_err = err;
            if (err / tol > max_ratio) max_ratio = err / tol;
        }
    const bool ok = rc == 0 && bad == 0 && bad_guard == 0;
    printf("tile %3dx%3d %s, %d CTAs, %4ld wgmmas: max |err| %.3g (%.2f of bound)\n", launched_tm, launched_bn,
           launched_pp ? "ping-pong" : "coop     ", launched_grid, emu_wgmma_count - wg0, max_err, max_ratio);
    if (!ok) {
        printf("  FAIL: rc %d, %d elements over the bound, %d guards overwritten\n", rc, bad, bad_guard);
        fails++;
    }
    free(x), free(w), free(y), free(y0);
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : (uint64_t)time(nullptr);
    rs = seed * 2654435761u + 88172645463325252ull;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    emu_wg_install();
    printf("TMA + wgmma GEMM (src/cuda/gemm_tma.cu) under the CUDA emulation, seed %llu:\n", (unsigned long long)seed);
    const int algos[4] = {GEMM_ALGO_TMA_C256, GEMM_ALGO_TMA_C128, GEMM_ALGO_TMA_P128, GEMM_ALGO_TMA_P256};
    for (int epi = 0; epi < 4; epi++)
        for (int a = 0; a < 4; a++) {
            run_case(70, 200, 104, 2, 132, algos[a], epi);  /* ragged M, N, K; scalar stores (ldy % 8 != 0) */
            run_case(128, 256, 192, 8, 132, algos[a], epi); /* whole tiles, 3 k-steps */
            run_case(200, 512, 320, 0, 2, algos[a], epi);   /* 2 CTAs, 2-4 tiles each, the ring wraps */
        }
    run_case(136, 384, 64, 0, 3, GEMM_ALGO_TMA, GEMM_EPI_BF16); /* the launcher's own pick */
    printf("gemm_emu: %s\n", fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
