/* gemm_emu.cpp — the TMA + wgmma GEMM (src/cuda/gemm_tma.cu, pulled in by run_gemm.sh) run under the
 * host emulation of emu.h + emu_wgmma.h (one CTA of 384 fibers at a time, shared memory starting as
 * garbage), through the kernel's own variant table (gemm_tma_run) with GEMM_ALGO_TMA_C128 / P128 /
 * P256 / C64 and every epilogue (SwiGLU: glu_group 1), against a double-precision reference passed
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
#include "emu_gemm_ref.h"
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

static void *alloc(size_t bytes) { return aligned_alloc(64, ((bytes + 63) / 64) * 64); }

static int fails;
static const char *algo_name(int a) {
    return a == GEMM_ALGO_TMA_C128   ? "C128"
           : a == GEMM_ALGO_TMA_P128 ? "P128"
           : a == GEMM_ALGO_TMA_P256 ? "P256"
           : a == GEMM_ALGO_TMA_C64  ? "C64"
                                     : "TMA(auto)";
}
static const char *epi_name(int e) {
    return e == GEMM_EPI_BF16 ? "bf16" : e == GEMM_EPI_F32 ? "f32" : e == GEMM_EPI_ADD_F32 ? "add_f32" : "swiglu1";
}

/* The problem of one launch (glu_group 1, no FP8) */
static GemmParams params(const uint16_t *x, const uint16_t *w, void *y, int M, int N, int K, int ldx, int ldw, int ldy,
                         int epi, int algo) {
    GemmParams p;
    memset(&p, 0, sizeof p);
    p.x = x, p.w = w, p.y = y, p.M = M, p.N = N, p.K = K, p.ldx = ldx, p.ldw = ldw, p.ldy = ldy;
    p.epi = epi, p.glu_group = 1, p.algo = algo;
    return p;
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
    emu_y_init(epi, y, y0, ny, ldy, ycols, f32);
    GemmParams p = params(x, w, y, M, N, K, ldx, ldw, ldy, epi, algo);
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
    for (int m = 0; m < M; m++)
        for (int c = 0; c < ldy; c++) {
            const size_t o = (size_t)m * ldy + c;
            const double got = f32 ? (double)((float *)y)[o] : bff(((uint16_t *)y)[o]);
            if (c >= ycols) { /* guard */
                const bool same = f32 ? memcmp(&((float *)y)[o], &y0[o], 4) == 0 : ((uint16_t *)y)[o] == emu_bf(y0[o]);
                bad_guard += !same;
                continue;
            }
            double ref, tol, s, a, up = 0, au = 0;
            if (epi == GEMM_EPI_SWIGLU_BF16)
                dot(m, 2 * c, s, a), dot(m, 2 * c + 1, up, au);
            else
                dot(m, c, s, a);
            emu_epi_ref(epi, K + 16, s, a, up, au, y0[o], &ref, &tol);
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

/* GEMM_EPI_ARGMAX against the same GEMM's GEMM_EPI_F32 logits (the same kernel and sums, so the same values): every
 * row's partials per 128-column chunk below am_cols (work poisoned with NaN first): the chunk's max, its smallest
 * column, the sum of exp(y - max) within 1e-5; then the row's argmax and logprob as cuda_rows_argmax_final reduces
 * them (in double here) against the F32 row's. W rows 5 and 300 are equal (tied logits: the smaller id must win),
 * and scaled up so that they win rows often. */
static void run_argmax_case(int M, int N, int K, int sms, int algo, int am_cols) {
    const int ldx = K + 8, ldw = K;
    uint16_t *x = (uint16_t *)alloc((size_t)M * ldx * 2), *w = (uint16_t *)alloc((size_t)N * ldw * 2);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < ldx; k++) x[(size_t)m * ldx + k] = k < K ? emu_bf(nrm()) : 0xffc0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < ldw; k++) w[(size_t)n * ldw + k] = emu_bf(nrm() / sqrtf((float)K) * (n == 5 ? 3.0f : 1.0f));
    if (N > 300) memcpy(w + (size_t)300 * ldw, w + (size_t)5 * ldw, (size_t)ldw * 2);
    float *y = (float *)alloc((size_t)M * N * 4);
    const int nch = (am_cols + GEMM_AM_CHUNK - 1) / GEMM_AM_CHUNK;
    const size_t wb = gemm_argmax_work_bytes(M, am_cols);
    uint8_t *work = (uint8_t *)alloc(wb);
    for (size_t i = 0; i < wb / 4; i++) ((uint32_t *)work)[i] = 0x7fc00000u; /* NaN */
    GemmParams p = params(x, w, y, M, N, K, ldx, ldw, N, GEMM_EPI_F32, algo);
    CudaLaunch l;
    memset(&l, 0, sizeof l);
    printf("  %-4s argmax  M %3d N %3d K %3d am_cols %3d: ", algo_name(algo), M, N, K, am_cols);
    fflush(stdout);
    int rc = gemm_tma_run(&p, sms, &l);
    p.epi = GEMM_EPI_ARGMAX, p.y = work, p.ldy = 0, p.am_cols = am_cols;
    if (!rc) rc = gemm_tma_run(&p, sms, &l);
    const float *val = (const float *)work;
    const int *idx = (const int *)(val + (size_t)M * nch);
    const float *sum = (const float *)(idx + (size_t)M * nch);
    int bad = 0, ties = 0;
    double max_lp = 0, max_sum = 0;
    for (int m = 0; m < M; m++) {
        const float *r = y + (size_t)m * N;
        int best = 0;
        for (int c = 1; c < am_cols; c++)
            if (r[c] > r[best]) best = c;
        ties += N > 300 && best == 5 && r[300] == r[5];
        double lse = 0;
        for (int c = 0; c < am_cols; c++) lse += exp((double)r[c] - r[best]);
        double gm = -INFINITY, gs = 0;
        int gi = INT_MAX;
        for (int ch = 0; ch < nch; ch++) {
            const size_t o = (size_t)m * nch + ch;
            const int c0 = ch * GEMM_AM_CHUNK, c1 = c0 + GEMM_AM_CHUNK < am_cols ? c0 + GEMM_AM_CHUNK : am_cols;
            int cb = c0;
            for (int c = c0 + 1; c < c1; c++)
                if (r[c] > r[cb]) cb = c;
            double cs = 0;
            for (int c = c0; c < c1; c++) cs += exp((double)r[c] - r[cb]);
            const double se = fabs(sum[o] - cs) / cs;
            if (se > max_sum) max_sum = se;
            if (!(val[o] == r[cb] && idx[o] == cb && se <= 1e-5)) {
                if (bad < 4)
                    fprintf(stderr, "    row %d chunk %d: got (%.8g, %d, %.8g) want (%.8g, %d, %.8g)\n", m, ch, val[o],
                            idx[o], sum[o], r[cb], cb, cs);
                bad++;
            }
            if (val[o] > gm || (val[o] == gm && idx[o] < gi)) gm = val[o], gi = idx[o];
        }
        for (int ch = 0; ch < nch; ch++) gs += sum[(size_t)m * nch + ch] * exp(val[(size_t)m * nch + ch] - gm);
        const double lp_err = fabs(-log(gs) + log(lse));
        if (lp_err > max_lp) max_lp = lp_err;
        if (!(gi == best && lp_err <= 1e-5)) {
            if (bad < 4) fprintf(stderr, "    row %d: argmax %d want %d, logprob off by %.3g\n", m, gi, best, lp_err);
            bad++;
        }
    }
    printf("%d rows, %d chunks each, %d won by a tie: sums within %.2g, logprobs within %.2g\n", M, nch, ties, max_sum,
           max_lp);
    if (rc || bad) {
        printf("  FAIL: rc %d, %d partials or rows wrong\n", rc, bad);
        fails++;
    }
    free(x), free(w), free(y), free(work);
}

/* Self-test of the emulated wgmma forms gemm_tma.cu does not use, one warpgroup: D[64][32] (=/+=) A B
 * with A [64][16] and B [32][16] (B as [n][k]) written into shared memory in each canonical layout by
 * the plain writer below (core matrices of 8 x 16 bytes placed by hand, then the XOR swizzle), A also
 * from registers (the mma A layout), B also MN-major. Catches decoding and fragment mistakes in
 * emu_wgmma.h itself; the layouts follow the PTX ISA table, only K-major 128 B is hardware-checked. */
static uint64_t st_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, int swz) {
    return (uint64_t)(addr >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | (uint64_t)swz << 62;
}
/* Places a [rows][16] bf16 operand at base; K-major: rows are mn, chunks hold 8 consecutive k;
 * MN-major: rows are k, chunks hold 8 consecutive mn. W: swizzle width (0: none). Returns lbo, sbo. */
static void st_place(uint8_t *s, uint32_t base, const uint16_t *v /* [mn][16] */, int nmn, bool mn_major, int W,
                     uint32_t *lbo, uint32_t *sbo) {
    for (int mn = 0; mn < nmn; mn++)
        for (int k = 0; k < 16; k++) {
            uint32_t off;
            if (!mn_major) {
                if (W == 0)
                    *lbo = 128 * (uint32_t)(nmn / 8), *sbo = 128,
                    off = (uint32_t)(k / 8) * *lbo + (mn / 8) * 128 + (mn % 8) * 16 + (k % 8) * 2;
                else
                    *lbo = 16, *sbo = 8 * W, off = (uint32_t)(mn / 8) * *sbo + (mn % 8) * W + k * 2;
            } else {
                if (W == 0)
                    *sbo = 128, *lbo = 128 * (uint32_t)(nmn / 8),
                    off = (uint32_t)(mn / 8) * 128 + (k / 8) * *lbo + (k % 8) * 16 + (mn % 8) * 2;
                else
                    *sbo = 8 * W, *lbo = 16 * W,
                    off = (uint32_t)(mn / (W / 2)) * *lbo + (k / 8) * *sbo + (k % 8) * W + (mn % (W / 2)) * 2;
            }
            uint32_t a = base + off;
            if (W) a ^= ((a >> 7) & (W / 16 - 1)) << 4;
            memcpy(s + a, &v[mn * 16 + k], 2);
        }
}
static void wgmma_selftest(void) {
    uint16_t A[64 * 16], B[32 * 16];
    for (int i = 0; i < 64 * 16; i++) A[i] = emu_bf(nrm());
    for (int i = 0; i < 32 * 16; i++) B[i] = emu_bf(nrm());
    const int widths[4] = {0, 32, 64, 128}, swz_bits[4] = {0, 3, 2, 1};
    for (int form = 0; form < 10; form++) { /* 0-3 SS K-major by width, 4-7 B MN-major by width, 8 RS, 9 RS scale-d 0 */
        const int wi = form % 4, W = form < 8 ? widths[wi] : 128, sb = form < 8 ? swz_bits[wi] : 1;
        const bool b_mn = form >= 4 && form < 8, rs = form >= 8;
        float D[64][32];
        emu_launch(dim3(1), 128, 16384, 1, [&] {
            uint8_t *s = emu_smem();
            uint32_t la, sa, lb, sbo;
            if (threadIdx.x == 0) {
                st_place(s, 0, A, 64, false, W, &la, &sa);
                st_place(s, 8192, B, 32, b_mn, W, &lb, &sbo);
            }
            __syncthreads();
            if (W == 0) /* what st_place chose (all threads need them) */
                la = 128 * 8, sa = 128, lb = 128 * 4, sbo = 128;
            else
                la = 16, sa = 8 * W, lb = b_mn ? 16 * W : 16, sbo = 8 * W;
            const int tid = threadIdx.x, r = (tid >> 5) * 16 + ((tid & 31) >> 2), c = 2 * (tid & 3);
            uint32_t a[4] = {A[r * 16 + c] | (uint32_t)A[r * 16 + c + 1] << 16,
                             A[(r + 8) * 16 + c] | (uint32_t)A[(r + 8) * 16 + c + 1] << 16,
                             A[r * 16 + c + 8] | (uint32_t)A[r * 16 + c + 9] << 16,
                             A[(r + 8) * 16 + c + 8] | (uint32_t)A[(r + 8) * 16 + c + 9] << 16};
            float d[4][4];
            for (int n8 = 0; n8 < 4; n8++)
                for (int e = 0; e < 4; e++) d[n8][e] = form == 9 ? NAN : 1.0f;
            wgmma_fence();
            emu_wgmma(32, d, st_desc(0, la, sa, sb), rs ? a : nullptr, st_desc(8192, lb, sbo, sb), form == 9 ? 0 : 1, 0,
                      b_mn);
            wgmma_commit();
            wgmma_wait<0>();
            for (int n8 = 0; n8 < 4; n8++)
                for (int e = 0; e < 4; e++) D[r + 8 * (e >> 1)][8 * n8 + c + (e & 1)] = d[n8][e];
        });
        double worst = 0;
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < 32; n++) {
                double ref = form == 9 ? 0.0 : 1.0, aa = 1;
                for (int k = 0; k < 16; k++)
                    ref += bff(A[m * 16 + k]) * bff(B[n * 16 + k]), aa += fabs(bff(A[m * 16 + k]) * bff(B[n * 16 + k]));
                const double err = fabs(D[m][n] - ref) / (1e-6 * aa);
                worst = err > worst || !(err == err) ? (err == err ? err : INFINITY) : worst;
            }
        if (!(worst <= 1.0)) {
            printf("  FAIL: wgmma self-test form %d (swizzle %d B, %s, %s): error %.3g of bound\n", form, W,
                   b_mn ? "B MN-major" : "K-major", rs ? "A in registers" : "A in smem", worst);
            fails++;
        }
    }
    printf("  wgmma self-test (SS K-major / B MN-major for each swizzle width, RS, scale-d 0): %s\n",
           fails ? "FAILED" : "ok");
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : (uint64_t)time(nullptr);
    emu_rs = seed * 2654435761u + 88172645463325252ull;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    emu_wg_install();
    printf("TMA + wgmma GEMM (src/cuda/gemm_tma.cu) under the CUDA emulation, seed %llu:\n", (unsigned long long)seed);
    wgmma_selftest();
    const int algos[4] = {GEMM_ALGO_TMA_C128, GEMM_ALGO_TMA_P128, GEMM_ALGO_TMA_P256, GEMM_ALGO_TMA_C64};
    for (int epi = 0; epi < 4; epi++)
        for (int a = 0; a < 4; a++) {
            run_case(70, 200, 104, 2, 132, algos[a], epi);  /* ragged M, N, K; scalar stores (ldy % 8 != 0) */
            run_case(128, 256, 192, 8, 132, algos[a], epi); /* whole tiles, 3 k-steps */
            run_case(200, 512, 320, 0, 2, algos[a], epi);   /* 2 CTAs, 2-4 tiles each, the ring wraps */
        }
    run_case(136, 384, 64, 0, 3, GEMM_ALGO_TMA, GEMM_EPI_BF16); /* the launcher's own pick */
    for (int a = 0; a <= 1; a++) { /* the LM head's greedy pick: ragged rows and columns, several tiles per CTA */
        run_argmax_case(200, 520, 128, 2, algos[a], 520);
        run_argmax_case(130, 520, 64, 3, algos[a], 497);
        run_argmax_case(64, 384, 64, 132, algos[a], 384);
    }
    printf("gemm_emu: %s\n", fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
