/* gemm_fp8_emu.cpp — the FP8 (W8A8) prefill GEMM of bench/kernels/gemm_fp8_lab.cu (pulled in by run_gemm_fp8.sh) run
 * under the host emulation of emu.h + emu_wgmma.h (one CTA of 384 fibers at a time, shared memory starting as
 * garbage): Y = X W^T with X [M][K] and W [N][K] e4m3 codes and one fp32 scale per row and 128-column block for each
 * (scale[(k / 128) * ((rows + 3) & ~3) + row]), against a double-precision reference passed through the epilogue's
 * rounding, for
 *   mode 0 (each k-step waited for and promoted), mode 1 (the next k-step issued before the promotion), mode 5
 *   (mode 1 with the tile's stores overlapped by the producer warpgroup's other warps) and mode 6 (mode 5 with the
 *   scales in a ring of their own) with every epilogue (bf16, fp32, += fp32 residual, SwiGLU of interleaved gate /
 *   up rows);
 *   the timing bounds mode 2 (no scales: one fp32 sum over all of K) against the unscaled product, and mode 4 (mode 2
 *   with the overlapped stores), which must equal mode 2 bit for bit.
 * Shapes: ragged M, N, K (TMA boxes past them zero-filled by the emulated TMA; an N that is not a multiple of 8, so
 * that the storers' last chunk of a row and the rows of y that are not 16-byte aligned take the per-element path), odd
 * k-step counts (modes 1 and 5 pad them to an even count) and grids smaller than the tile count (the ring wrapping, the
 * storers' staging handed from tile to tile). X rows carry NaN codes past K, Y starts as NaN (random values for += Y)
 * and its columns past the output are guards that must stay untouched. Bounds per element (e: fp32 accumulation, (K +
 * 64) 6e-8 sum |products| scaled): bf16 / fp32: |y - bf16(S)| <= e + 2^-7 |S|; += fp32: <= e + 2^-7 (|S| + |y|);
 * SwiGLU: the same propagated through bf16(bf16(silu(bf16 g)) bf16(u)).
 * Prints each case's largest error / bound; exit 1 on a failed bound, 2/3 on an emulation error or a deadlock.
 * Usage: gemm_fp8_emu [seed]. Not emulated: the tensor core's FP8 accumulation keeps fewer bits than the fp32 sums here
 * (the lab's GPU check bounds that). */
// clang-format off
#include "emu.h"        /* first: its macros replace CUDA's qualifiers */
#include "emu_wgmma.h"
#undef __host__
#define __host__
#include "cuda/ops.h"
#define __CUDA_ARCH_FEAT_SM90_ALL 1 /* the kernel's sm_90a branch */
#include "f8_desc.inc"      /* wgmma_desc from src/cuda/mma.cuh */
#include "f8_gemm_cuh.inc"  /* src/cuda/gemm.cuh: tile order, epilogues */
static inline float bf_lo(uint32_t u) { return __uint_as_float(u << 16); } /* common.cuh's */
static inline float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
#include "f8_kern.inc"      /* the lab's GEMM section */
#include "emu_gemm_ref.h"
#include <time.h>
// clang-format on

static void *alloc(size_t bytes) { return aligned_alloc(64, ((bytes + 63) / 64) * 64); }
static const char *epi_name(int e) {
    return e == GEMM_EPI_BF16 ? "bf16" : e == GEMM_EPI_F32 ? "f32" : e == GEMM_EPI_ADD_F32 ? "add_f32" : "swiglu1";
}
/* a random e4m3 code: exponent field 0 .. 14 (subnormals included, |v| <= 240), never a NaN code */
static uint8_t rand_e4m3(void) {
    const int e = (int)(urand() * 15), m = (int)(urand() * 8), s = urand() < 0.5;
    return (uint8_t)(s << 7 | e << 3 | m);
}

template <int EPI, int MODE>
static void launch(const F8Args &a, int grid) {
    const int smem = MODE == 6 ? F8_SMEM6 : MODE >= 4 ? F8_SMEM4 : F8Cfg::SMEM;
    emu_launch(dim3(grid), 384, smem, 1, [&] { gemm_fp8_tma<EPI, MODE>(a); });
}
static void launch_any(int mode, int epi, const F8Args &a, int grid) {
#define EPIS(M)                                                                                                        \
    epi == GEMM_EPI_BF16      ? launch<GEMM_EPI_BF16, M>(a, grid)                                                      \
    : epi == GEMM_EPI_F32     ? launch<GEMM_EPI_F32, M>(a, grid)                                                       \
    : epi == GEMM_EPI_ADD_F32 ? launch<GEMM_EPI_ADD_F32, M>(a, grid)                                                   \
                              : launch<GEMM_EPI_SWIGLU_BF16, M>(a, grid)
    if (mode == 0)
        EPIS(0);
    else if (mode == 1)
        EPIS(1);
    else if (mode == 5)
        EPIS(5);
    else if (mode == 6)
        EPIS(6);
    else if (mode == 2)
        launch<GEMM_EPI_BF16, 2>(a, grid);
    else
        launch<GEMM_EPI_BF16, 4>(a, grid);
#undef EPIS
}

static int fails;

/* One shape: every mode and epilogue on the same operands. */
static void run_shape(int M, int N, int K, int sms) {
    const int ldx = K + 16, kb = (K + 127) / 128, ldsx = (M + 3) & ~3, ldsw = (N + 3) & ~3;
    uint8_t *x = (uint8_t *)alloc((size_t)M * ldx), *w = (uint8_t *)alloc((size_t)N * K);
    float *sx = (float *)alloc((size_t)kb * ldsx * 4), *sw = (float *)alloc((size_t)kb * ldsw * 4);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < ldx; k++) x[(size_t)m * ldx + k] = k < K ? rand_e4m3() : 0x7f; /* NaN past K */
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = rand_e4m3();
    for (int i = 0; i < kb * ldsx; i++) sx[i] = ldexpf(1.0f + (float)urand(), (int)(urand() * 7) - 3 - 8);
    for (int i = 0; i < kb * ldsw; i++) sw[i] = ldexpf(1.0f + (float)urand(), (int)(urand() * 7) - 3 - 8);
    /* S[m][n] and its sum of |terms|, scaled (mode 0 / 1 / 5) and unscaled (mode 2 / 4), in double */
    std::vector<double> S((size_t)M * N), A((size_t)M * N), U((size_t)M * N), UA((size_t)M * N);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0, us = 0, ua = 0;
            for (int b = 0; b < kb; b++) {
                double ps = 0, pa = 0;
                for (int k = b * 128; k < K && k < b * 128 + 128; k++) {
                    const double v = (double)emu_e4m3(x[(size_t)m * ldx + k]) * emu_e4m3(w[(size_t)n * K + k]);
                    ps += v, pa += fabs(v);
                }
                const double f = (double)sx[(size_t)b * ldsx + m] * sw[(size_t)b * ldsw + n];
                s += f * ps, a += f * pa, us += ps, ua += pa;
            }
            const size_t o = (size_t)m * N + n;
            S[o] = s, A[o] = a, U[o] = us, UA[o] = ua;
        }

    std::vector<uint16_t> y2; /* mode 2's bf16 output, for mode 4 */
    const int modes[6] = {0, 1, 5, 6, 2, 4};
    for (int mi = 0; mi < 6; mi++)
        for (int epi = 0; epi < 4; epi++) {
            const int mode = modes[mi];
            if ((mode == 2 || mode == 4) && epi != GEMM_EPI_BF16) continue;
            const bool f32 = epi == GEMM_EPI_F32 || epi == GEMM_EPI_ADD_F32, unscaled = mode == 2 || mode == 4;
            const int ycols = epi == GEMM_EPI_SWIGLU_BF16 ? N / 2 : N, ldy = ycols + 8;
            const size_t ny = (size_t)M * ldy;
            void *y = alloc(ny * (f32 ? 4 : 2));
            std::vector<float> y0(ny);
            emu_y_init(epi, y, y0.data(), ny, ldy, ycols, f32);
            F8Args a;
            memset(&a, 0, sizeof a);
            a.p.M = M, a.p.N = N, a.p.K = K, a.p.y = y, a.p.ldy = ldy, a.p.epi = epi, a.p.glu_group = 1;
            a.sx = sx, a.sw = sw;
            if (emu_tma_map_u8_sw128(&a.ta, x, M, K, ldx, F8_TM) || emu_tma_map_u8_sw128(&a.tb, w, N, K, K, F8_BN)) {
                fprintf(stderr, "FAIL: tensor maps refused (M %d N %d K %d)\n", M, N, K);
                exit(1);
            }
            const int tiles = ((M + F8_TM - 1) / F8_TM) * ((N + F8_BN - 1) / F8_BN), grid = std::min(tiles, sms);
            printf("  mode %d %-7s M %3d N %3d K %3d grid %d: ", mode, epi_name(epi), M, N, K, grid);
            fflush(stdout); /* names the case if the emulator stops on a deadlock or an emulation error */
            launch_any(mode, epi, a, grid);

            double worst = 0;
            int bad = 0, bad_guard = 0;
            for (int m = 0; m < M; m++)
                for (int c = 0; c < ldy; c++) {
                    const size_t o = (size_t)m * ldy + c;
                    const double got = f32 ? (double)((float *)y)[o] : bff(((uint16_t *)y)[o]);
                    if (c >= ycols) {
                        bad_guard +=
                            f32 ? memcmp(&((float *)y)[o], &y0[o], 4) != 0 : ((uint16_t *)y)[o] != emu_bf(y0[o]);
                        continue;
                    }
                    const double *SS = unscaled ? U.data() : S.data(), *AA = unscaled ? UA.data() : A.data();
                    double ref, tol;
                    const size_t oo = (size_t)m * N + (epi == GEMM_EPI_SWIGLU_BF16 ? 2 * c : c);
                    const bool glu = epi == GEMM_EPI_SWIGLU_BF16;
                    const double up = glu ? SS[oo + 1] : 0, au = glu ? AA[oo + 1] : 0;
                    emu_epi_ref(epi, K + 64, SS[oo], AA[oo], up, au, y0[o], &ref, &tol);
                    const double err = fabs(got - ref);
                    if (!(err <= tol)) {
                        if (bad < 4)
                            fprintf(stderr, "    y[%d][%d]: got %.8g ref %.8g (bound %.3g)\n", m, c, got, ref, tol);
                        bad++;
                    }
                    if (err / tol > worst || err != err) worst = err != err ? INFINITY : err / tol;
                }
            bool same = true; /* mode 4 against mode 2, over the output columns (the guards start random) */
            if (mode == 2) y2.assign((uint16_t *)y, (uint16_t *)y + ny);
            for (int m = 0; mode == 4 && m < M; m++)
                same = same && y2.size() == ny &&
                       memcmp(y2.data() + (size_t)m * ldy, (uint16_t *)y + (size_t)m * ldy, (size_t)ycols * 2) == 0;
            const bool ok = bad == 0 && bad_guard == 0 && same;
            printf("worst error / bound %.3f%s%s %s\n", worst, bad_guard ? ", guards overwritten" : "",
                   mode == 4 ? (same ? ", bitwise mode 2's" : ", DIFFERS from mode 2") : "", ok ? "ok" : "FAIL");
            fails += !ok;
            free(y);
        }
    free(x), free(w), free(sx), free(sw);
}

int main(int argc, char **argv) {
    const unsigned long seed = argc > 1 ? strtoul(argv[1], NULL, 10) : (unsigned long)time(NULL);
    emu_rs ^= seed * 0x9E3779B97F4A7C15ull;
    emu_wg_install();
    printf("FP8 GEMM lab (gemm_fp8_lab.cu) under emulation, seed %lu\n", seed);
    run_shape(128, 128, 256, 1); /* one tile, two k-steps */
    run_shape(200, 264, 400, 2); /* ragged everything; 6 tiles on 2 CTAs; 4 k-steps, the last 16 wide */
    run_shape(136, 136, 272, 3); /* 4 tiles on 3 CTAs; 3 k-steps (modes 1, 5: padded to 4) */
    run_shape(64, 392, 144, 2);  /* a partial tile row; 4 tiles on 2 CTAs; 2 k-steps, the second 16 wide */
    run_shape(72, 130, 160, 1);  /* N not a multiple of 8, rows of y misaligned for vector stores; 2 tiles on 1 CTA */
    printf("%s: %d failed, %ld wgmmas emulated\n", fails ? "FAIL" : "ok", fails, emu_wgmma_count);
    return fails ? 1 : 0;
}
