/* test_fp8_gemv.c — cuda_matvec (src/cuda/gemv.cu) on FP8 weights (MatvecParams.W8 + w8_scale: e4m3 with 128 x 128
 * block scales, docs/FP8.md) and, on the same shapes, on bf16 weights, against two host references:
 *   the bound: double precision on the dequantized weights (fp8_dequantize_blocks, the CPU backend's reference; or the
 *     bf16 values): fp32 sums within 1e-5 sum |w x|, bf16 outputs within one bf16 step more;
 *   the kernel's own fp32 order (where the output has no atomics and the input row is known: the kernel's h_out): lane l
 *     sums its chunks k0 + j 32 cpl + l cpl (cpl = 8 bf16, 16 fp8) in ascending order (bf16: one fmaf chain; fp8: a
 *     chain from 0 over the chunk's 16 columns, then acc = fmaf(chain, scale, acc)), then warp_sum_rows4's tree. The
 *     outputs must match it bit for bit, so the bf16 path is checked unchanged (the model is that of the bf16 kernel
 *     before the FP8 template, lm_screen_emu.cpp's full_sum) and the hardware e4m3 decode exactly.
 * Cases: every e4m3 code decoded (one-hot input); fresh random shapes (seeded: rows not multiples of 4 or 128, cols
 * multiples of 16 not of 128) through every mode decode uses: VEC / EMBED / RESIDUAL (+ NORM_ZC / NORM_PLAIN) / GATED
 * in, STORE / SILU_MUL / SPLITK (atomic, per-split partials) / ARGMAX (fixed stride, tickets) out, PDL and early
 * trigger; the Qwen3.5-0.8B decode shapes with the splits of cuda_matvec_splits_fp8, the 248320 x 1024 head as FP8;
 * the launcher's refusals. Weights change magnitude by up to 2^8 between 128 x 128 blocks, so a scale read from the
 * wrong block fails the bound. Outputs NaN-poisoned before each launch (an atomic accumulator zeroed).
 * Usage: test_fp8_gemv [seed]. Skips (exit 0, "no GPU") without a GPU. */
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"

static Rng rng;
static int n_sm = 132;
static float e4m3_lut[256];

/* One weight matrix in a format: W (bf16) or W8 + sc (fp8) on host and device, and Wd, the dequantized values. */
typedef struct Mat {
    int fp8, rows, cols;
    uint16_t *W, *dW;
    uint8_t *W8, *dW8;
    float *sc, *dsc, *Wd;
} Mat;

/* f [rows][cols] in 128 x 128 blocks of magnitude 2^e / sqrt(cols), e uniform in [-4, 4] */
static float *weights_random(int rows, int cols) {
    const int nbc = (cols + 127) / 128, nbr = (rows + 127) / 128;
    float *mag = malloc(sizeof(float) * (size_t)nbr * nbc), *f = malloc(sizeof(float) * (size_t)rows * cols);
    for (int i = 0; i < nbr * nbc; i++) mag[i] = ldexpf(1.0f, (int)(rng_u64(&rng) % 9) - 4) / sqrtf((float)cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            f[(size_t)r * cols + c] = rng_normal(&rng) * mag[(size_t)(r / 128) * nbc + c / 128];
    free(mag);
    return f;
}

static int mat_make(Mat *m, int fp8, const float *f, int rows, int cols) {
    memset(m, 0, sizeof *m);
    m->fp8 = fp8, m->rows = rows, m->cols = cols;
    const size_t n = (size_t)rows * cols, ns = (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
    m->Wd = malloc(sizeof(float) * n);
    if (fp8) {
        m->W8 = malloc(n), m->sc = malloc(sizeof(float) * ns);
        fp8_quantize_blocks(m->W8, m->sc, f, rows, cols);
        fp8_dequantize_blocks(m->Wd, m->W8, m->sc, rows, cols);
        const size_t nd = fp8_scale_count(rows, cols); /* the device's per-row layout (ops.h FP8_SCALES_DOC) */
        float *dsc = malloc(sizeof(float) * nd);
        for (size_t i = 0; i < nd; i++) dsc[i] = NAN; /* padding rows: never read as a scale */
        fp8_scales_per_row(dsc, fp8_scale_ld(rows), 0, 1, m->sc, rows, cols);
        m->dW8 = dev_copy(m->W8, n), m->dsc = dev_copy(dsc, sizeof(float) * nd);
        free(dsc);
        return m->dW8 && m->dsc;
    }
    m->W = malloc(sizeof(uint16_t) * n);
    for (size_t i = 0; i < n; i++) m->W[i] = f32_to_bf16(f[i]), m->Wd[i] = bf16_to_f32(m->W[i]);
    m->dW = dev_copy(m->W, sizeof(uint16_t) * n);
    return m->dW != NULL;
}
static void mat_free(Mat *m) {
    cudaFree(m->dW), cudaFree(m->dW8), cudaFree(m->dsc);
    free(m->W), free(m->W8), free(m->sc), free(m->Wd);
}
static void mat_params(MatvecParams *p, const Mat *m) {
    p->W = m->fp8 ? NULL : m->dW;
    p->W8 = m->fp8 ? m->dW8 : NULL;
    p->w8_scale = m->fp8 ? m->dsc : NULL;
    p->rows = m->rows, p->cols = m->cols;
}

/* sum_{k in [k0, k1)} Wd[r][k] x[k] in double, and sum |.| */
static double ref_sum(const Mat *m, const float *x, int r, int k0, int k1, double *a) {
    double s = 0, t = 0;
    const float *w = m->Wd + (size_t)r * m->cols;
    for (int k = k0; k < k1; k++) s += (double)w[k] * x[k], t += fabs((double)w[k] * x[k]);
    *a = t;
    return s;
}

/* The kernel's fp32 sum of row r over [k0, k1) (the header's order; k0 a multiple of 16) */
static float model_sum(const Mat *m, const float *x, int r, int k0, int k1) {
    const int cpl = m->fp8 ? 16 : 8, cols = m->cols, nbc = (cols + 127) / 128;
    float acc[32], v[32], s[32], t[32];
    for (int l = 0; l < 32; l++) {
        float a = 0.0f;
        for (int k = k0 + l * cpl; k < k1; k += 32 * cpl) {
            if (m->fp8) {
                float c = 0.0f;
                for (int e = 0; e < 16; e++) c = fmaf(e4m3_lut[m->W8[(size_t)r * cols + k + e]], x[k + e], c);
                a = fmaf(c, m->sc[(size_t)(r / 128) * nbc + k / 128], a);
            } else {
                for (int e = 0; e < 8; e++) a = fmaf(bf16_to_f32(m->W[(size_t)r * cols + k + e]), x[k + e], a);
            }
        }
        acc[l] = a;
    }
    for (int l = 0; l < 32; l++) v[l] = acc[l] + acc[l ^ 16];
    for (int l = 0; l < 32; l++) s[l] = v[l] + v[l ^ 8];
    for (int d = 4; d >= 1; d >>= 1) {
        for (int l = 0; l < 32; l++) t[l] = s[l] + s[l ^ d];
        memcpy(s, t, sizeof s);
    }
    return s[8 * (r & 3)];
}

typedef struct Case {
    int in_mode, out_mode, splits, atomic, norm_mode, n_parts, dyn, pdl;
} Case;

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

/* One launch of m in mode c, every output checked (CHECKs). */
static void run(const Mat *m, Case c) {
    const int rows = m->rows, cols = m->cols, S = c.splits, G = 128, V = 7;
    const int ny = c.out_mode == MV_OUT_SILU_MUL              ? rows / 2
                   : c.out_mode == MV_OUT_SPLITK && !c.atomic ? S * rows
                                                              : rows;
    static const char *im[] = {"vec", "embed", "residual", "gated"}, *om[] = {"store", "silu_mul", "splitk", "argmax"};
    char what[160];
    snprintf(what, sizeof what, "%s %dx%d in %s norm %d parts %d out %s splits %d%s%s pdl %d", m->fp8 ? "fp8" : "bf16",
             rows, cols, im[c.in_mode], c.norm_mode, c.n_parts, om[c.out_mode], S,
             c.out_mode == MV_OUT_SPLITK ? (c.atomic ? " atomic" : " partials") : "", c.dyn ? " tickets" : "", c.pdl);
    float *x = f32_bf16_random(&rng, cols, 1.0f, 0.0f),
          *parts = f32_bf16_random(&rng, (int64_t)c.n_parts * cols, 0.5f, 0);
    float *gate = f32_bf16_random(&rng, cols, 1.5f, 0.0f);
    float *nw = f32_bf16_random(&rng, cols, 0.2f, c.norm_mode == NORM_PLAIN ? 1.0f : 0.0f);
    uint16_t *E = bf16_random(&rng, (int64_t)V * cols, 1.0f);
    float *gy = malloc(sizeof(float) * (size_t)ny), *gx = malloc(sizeof(float) * cols),
          *gh = malloc(sizeof(float) * cols);
    float *xin = malloc(sizeof(float) * cols), *gz = malloc(sizeof(float) * 64);
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    sp.token = (int)(rng_u64(&rng) % V), sp.write_logits = 1;
    float *dx = dev_copy(x, sizeof(float) * cols),
          *dparts = dev_copy(parts, sizeof(float) * (c.n_parts ? c.n_parts : 1) * cols);
    float *dgate = dev_copy(gate, sizeof(float) * cols), *dnw = dev_copy(nw, sizeof(float) * cols);
    uint16_t *dE = dev_copy(E, sizeof(uint16_t) * (size_t)V * cols);
    float *dy = dev_poison(sizeof(float) * (size_t)ny), *dxo = dev_poison(sizeof(float) * cols);
    float *dho = dev_poison(sizeof(float) * cols), *dz = dev_poison(sizeof(float) * 64);
    float *dval = dev_poison(sizeof(float) * 4096), *dmax = dev_poison(4);
    int *didx = dev_poison(sizeof(int) * 4096), *did = dev_poison(4);
    unsigned *dcnt = dev_copy(NULL, 4), *dwork = dev_copy(NULL, 4 * CUDA_MV_WORK_WORDS);
    StepParams *dsp = dev_copy(&sp, sizeof sp);
    CudaLaunch l = {0, c.pdl, NULL, 0};
    if (!dx || !dparts || !dgate || !dnw || !dE || !dy || !dxo || !dho || !dz || !dval || !dmax || !didx || !did ||
        !dcnt || !dwork || !dsp) {
        CHECK(0, "%s: device alloc", what);
        goto done;
    }
    CU(cudaMemset(dcnt, 0, 4));
    CU(cudaMemset(dwork, 0, 4 * CUDA_MV_WORK_WORDS));
    if (c.out_mode == MV_OUT_SPLITK && c.atomic) CU(cudaMemset(dy, 0, sizeof(float) * (size_t)ny));

    MatvecParams p;
    memset(&p, 0, sizeof p);
    mat_params(&p, m);
    p.splits = S, p.in_mode = c.in_mode, p.out_mode = c.out_mode, p.atomic = c.atomic, p.eps = 1e-6f;
    p.early_trigger = c.pdl && rows % 2, p.step = dsp, p.x = dx, p.zero = dz, p.n_zero = 64;
    if (c.in_mode == MV_IN_EMBED) p.embed = dE;
    if (c.in_mode == MV_IN_RESIDUAL) p.parts = dparts, p.n_parts = c.n_parts;
    if (c.in_mode == MV_IN_EMBED || c.in_mode == MV_IN_RESIDUAL) {
        p.x_out = dxo, p.h_out = dho;
        if (c.norm_mode != NORM_NONE) p.norm_w = dnw, p.norm_mode = c.norm_mode;
    }
    if (c.in_mode == MV_IN_GATED) p.gate = dgate, p.norm_w = dnw, p.group = G;
    if (c.out_mode == MV_OUT_ARGMAX) {
        p.logits = dy, p.n_valid = rows - rows / 11, p.am_val = dval, p.am_idx = didx, p.am_count = dcnt;
        p.out_id = did, p.out_max = dmax;
        if (c.dyn) p.work = dwork, p.work_tail = c.dyn;
    } else {
        p.y = dy;
    }
    LAUNCH(cuda_matvec(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(gy, dy, sizeof(float) * (size_t)ny, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gx, dxo, sizeof(float) * cols, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gh, dho, sizeof(float) * cols, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gz, dz, sizeof(float) * 64, cudaMemcpyDeviceToHost));
    int zeros = 0;
    for (int i = 0; i < 64; i++) zeros += gz[i] == 0.0f;
    CHECK(zeros == 64, "%s: zero buffer has %d zeros of 64", what, zeros);

    /* the input row: as given, the kernel's normed row (after checking it), or the host's gated row */
    int exact = c.in_mode != MV_IN_GATED;
    if (c.in_mode == MV_IN_VEC) {
        memcpy(xin, x, sizeof(float) * cols);
    } else if (c.in_mode == MV_IN_GATED) {
        for (int g0 = 0; g0 < cols; g0 += G) {
            float ss = 0;
            for (int i = 0; i < G; i++) ss += x[g0 + i] * x[g0 + i];
            const float r = 1.0f / sqrtf(ss / (float)G + p.eps);
            for (int i = 0; i < G; i++) {
                const float u = round_bf16(x[g0 + i] * r), wu = round_bf16(nw[i] * u), z = gate[g0 + i];
                xin[g0 + i] = round_bf16(wu * (z / (1.0f + expf(-z))));
            }
        }
    } else {
        double ss = 0;
        int bad_x = 0, bad_h = 0;
        for (int i = 0; i < cols; i++) {
            float xi;
            if (c.in_mode == MV_IN_EMBED) {
                xi = bf16_to_f32(E[(size_t)sp.token * cols + i]);
            } else {
                float a = 0;
                for (int s = 0; s < c.n_parts; s++) a += parts[(size_t)s * cols + i];
                xi = round_bf16(x[i] + round_bf16(a));
            }
            bad_x += !same_bits(xi, gx[i]);
            xin[i] = xi;
            ss += (double)xi * xi;
        }
        const float r = 1.0f / sqrtf((float)(ss / cols) + 1e-6f);
        for (int i = 0; i < cols; i++) {
            const float h = c.norm_mode == NORM_ZC      ? round_bf16(xin[i] * r * (1.0f + nw[i]))
                            : c.norm_mode == NORM_PLAIN ? round_bf16(nw[i] * round_bf16(xin[i] * r))
                                                        : xin[i];
            bad_h += !(fabsf(gh[i] - h) <= 2.0f / 256 * fabsf(h) + 1e-6f);
            xin[i] = gh[i]; /* the kernel's own row from here on */
        }
        CHECK(bad_x == 0, "%s: x_out: %d of %d not bit-exact", what, bad_x, cols);
        CHECK(bad_h == 0, "%s: h_out: %d of %d beyond one bf16 step", what, bad_h, cols);
    }
    const double xtol = exact ? 0.0 : 2.0 / 256; /* gated: the host's row may differ by a bf16 step */

    int bad = 0, bad_bits = 0;
    if (c.out_mode == MV_OUT_STORE || c.out_mode == MV_OUT_ARGMAX) {
        double best = -INFINITY;
        int best_id = 0;
        for (int r = 0; r < rows; r++) {
            double a, s = ref_sum(m, xin, r, 0, cols, &a);
            if (!(fabs(gy[r] - s) <= (1e-5 + xtol) * a + fabs(s) / 256 + 1e-30)) {
                if (bad < 4) fprintf(stderr, "  %s: y[%d] %.8g ref %.8g\n", what, r, gy[r], s);
                bad++;
            }
            const float mv = round_bf16(model_sum(m, xin, r, 0, cols));
            if (exact) bad_bits += !same_bits(gy[r], mv);
            if (r < p.n_valid && mv > best) best = mv, best_id = r; /* ties: the smallest row */
        }
        if (c.out_mode == MV_OUT_ARGMAX) {
            int id = -1;
            float mx = 0;
            unsigned cnt = 1, wk[CUDA_MV_WORK_WORDS], wk_or = 0;
            CU(cudaMemcpy(&id, did, 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(&mx, dmax, 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(&cnt, dcnt, 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(wk, dwork, sizeof wk, cudaMemcpyDeviceToHost));
            for (int i = 0; i < CUDA_MV_WORK_WORDS; i++) wk_or |= wk[i];
            CHECK(id == best_id, "%s: out_id %d, the model's argmax %d", what, id, best_id);
            CHECK(id >= 0 && id < rows && same_bits(mx, gy[id]), "%s: out_max is not logits[out_id]", what);
            CHECK(cnt == 0 && wk_or == 0, "%s: am_count %u / ticket counters not left at 0", what, cnt);
        }
    } else if (c.out_mode == MV_OUT_SILU_MUL) {
        for (int i = 0; i < rows / 2; i++) {
            double ag, au, g = ref_sum(m, xin, 2 * i, 0, cols, &ag), u = ref_sum(m, xin, 2 * i + 1, 0, cols, &au);
            const float gb = round_bf16((float)g), ub = round_bf16((float)u);
            const float ref = round_bf16(round_bf16(gb / (1.0f + expf(-gb))) * ub);
            const double tol = 3 * (1e-5 * (ag + au) + 2e-6) * (1 + fabs(gb) + fabs(ub)) + 3.0 / 256 * fabs(ref);
            if (!(fabs((double)gy[i] - ref) <= tol)) {
                if (bad < 4) fprintf(stderr, "  %s: act[%d] %.8g ref %.8g\n", what, i, gy[i], ref);
                bad++;
            }
            /* from the model's sums: exact up to the fast silu (__expf, __fdividef) */
            const float mg = round_bf16(model_sum(m, xin, 2 * i, 0, cols)),
                        mu = round_bf16(model_sum(m, xin, 2 * i + 1, 0, cols));
            const float mref = round_bf16(round_bf16(mg / (1.0f + expf(-mg))) * mu);
            bad_bits += !(fabsf(gy[i] - mref) <= 2.0f / 256 * fabsf(mref) + 1e-30f);
        }
    } else { /* SPLITK: the partials per slice, or the atomic total */
        const int cpl = m->fp8 ? 16 : 8, kc = ((cols + S - 1) / S + cpl - 1) & ~(cpl - 1);
        for (int s = 0; s < (c.atomic ? 1 : S); s++)
            for (int r = 0; r < rows; r++) {
                const int k0 = c.atomic ? 0 : (s * kc < cols ? s * kc : cols);
                const int k1 = c.atomic ? cols : (k0 + kc < cols ? k0 + kc : cols);
                double a, ref = ref_sum(m, xin, r, k0, k1, &a);
                const float got = gy[(size_t)s * rows + r];
                if (!(fabs(got - ref) <= (1e-5 + xtol) * a + 1e-30)) {
                    if (bad < 4) fprintf(stderr, "  %s: split %d row %d: %.8g ref %.8g\n", what, s, r, got, ref);
                    bad++;
                }
                if (exact && !c.atomic) bad_bits += !same_bits(got, model_sum(m, xin, r, k0, k1));
            }
    }
    CHECK(bad == 0, "%s: %d outputs beyond the bound of the dequantized reference", what, bad);
    CHECK(bad_bits == 0, "%s: %d outputs differ from the kernel-order model", what, bad_bits);
done:
    cudaFree(dx), cudaFree(dparts), cudaFree(dgate), cudaFree(dnw), cudaFree(dE), cudaFree(dy), cudaFree(dxo);
    cudaFree(dho), cudaFree(dz), cudaFree(dval), cudaFree(dmax), cudaFree(didx), cudaFree(did), cudaFree(dcnt);
    cudaFree(dwork), cudaFree(dsp);
    free(x), free(parts), free(gate), free(nw), free(E), free(gy), free(gx), free(gh), free(xin), free(gz);
}

/* Both formats of one random matrix in mode c */
static void run_both(int rows, int cols, Case c) {
    float *f = weights_random(rows, cols);
    for (int fp8 = 0; fp8 < 2; fp8++) {
        Mat m;
        if (mat_make(&m, fp8, f, rows, cols)) {
            Case cf = c;
            if (c.out_mode == MV_OUT_SPLITK && c.splits == 0) /* the launcher's plan for the format */
                cf.splits = (fp8 ? cuda_matvec_splits_fp8 : cuda_matvec_splits)(rows, cols, n_sm);
            run(&m, cf);
        } else {
            CHECK(0, "device alloc %dx%d", rows, cols);
        }
        mat_free(&m);
    }
    free(f);
}

/* Every e4m3 code through the hardware decode: row r holds code (r + c) & 255 at column c (the NaN codes 0x7f, 0xff
 * replaced by 0), scale 1, x one-hot at column j: the partial of row r is the code's value, exact. */
static void test_codes(void) {
    const int rows = 256, cols = 256;
    Mat m;
    memset(&m, 0, sizeof m);
    m.fp8 = 1, m.rows = rows, m.cols = cols;
    m.W8 = malloc((size_t)rows * cols), m.sc = malloc(sizeof(float) * 2 * rows); /* the device layout: 2 x rows */
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const int v = (r + c) & 255;
            m.W8[(size_t)r * cols + c] = (v & 0x7f) == 0x7f ? 0 : (uint8_t)v;
        }
    for (int i = 0; i < 2 * rows; i++) m.sc[i] = 1.0f;
    m.dW8 = dev_copy(m.W8, (size_t)rows * cols), m.dsc = dev_copy(m.sc, sizeof(float) * 2 * rows);
    float *x = calloc(cols, sizeof(float)), *gy = malloc(sizeof(float) * rows);
    float *dx = dev_copy(NULL, sizeof(float) * cols), *dy = dev_poison(sizeof(float) * rows);
    CudaLaunch l = {0, 0, NULL, 0};
    int bad = 0;
    if (!m.dW8 || !m.dsc || !dx || !dy) {
        CHECK(0, "device alloc");
        goto done;
    }
    for (int j = 0; j < cols; j += 37) {
        memset(x, 0, sizeof(float) * cols);
        x[j] = 1.0f;
        CU(cudaMemcpy(dx, x, sizeof(float) * cols, cudaMemcpyHostToDevice));
        CU(cudaMemset(dy, 0xff, sizeof(float) * rows));
        MatvecParams p;
        memset(&p, 0, sizeof p);
        mat_params(&p, &m);
        p.splits = 1, p.in_mode = MV_IN_VEC, p.x = dx, p.y = dy, p.out_mode = MV_OUT_SPLITK, p.atomic = 0;
        LAUNCH(cuda_matvec(&p, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(gy, dy, sizeof(float) * rows, cudaMemcpyDeviceToHost));
        for (int r = 0; r < rows; r++) {
            const float want = e4m3_lut[m.W8[(size_t)r * cols + j]] + 0.0f; /* -0 * 1 summed from +0: +0 */
            if (!same_bits(gy[r], want)) {
                if (bad < 4)
                    fprintf(stderr, "  code 0x%02x: %.8g, fp8_e4m3_to_f32 %.8g\n", m.W8[(size_t)r * cols + j], gy[r],
                            want);
                bad++;
            }
        }
    }
    CHECK(bad == 0, "%d e4m3 codes decoded differently from fp8_e4m3_to_f32", bad);
done:
    cudaFree(dx), cudaFree(dy);
    free(x), free(gy);
    mat_free(&m);
}

static void test_rejects(void) {
    float *d = dev_copy(NULL, 4096);
    CudaLaunch l = {0, 0, NULL, 0};
    MatvecParams p;
    memset(&p, 0, sizeof p);
    p.rows = 4, p.cols = 48, p.splits = 1, p.in_mode = MV_IN_VEC, p.x = d, p.y = d, p.out_mode = MV_OUT_STORE;
    p.W8 = (const uint8_t *)d;
    CHECK(cuda_matvec(&p, &l) == cudaErrorInvalidValue, "fp8 without w8_scale accepted");
    p.w8_scale = d, p.W = (const uint16_t *)d;
    CHECK(cuda_matvec(&p, &l) == cudaErrorInvalidValue, "W and W8 both set accepted");
    p.W8 = NULL;
    CHECK(cuda_matvec(&p, &l) == cudaErrorInvalidValue, "bf16 with w8_scale accepted");
    p.W = NULL, p.W8 = (const uint8_t *)d, p.cols = 40;
    CHECK(cuda_matvec(&p, &l) == cudaErrorInvalidValue, "fp8 with cols %% 16 != 0 accepted");
    p.cols = 48, p.splits = 4, p.out_mode = MV_OUT_SPLITK, p.atomic = 1;
    CHECK(cuda_matvec(&p, &l) == cudaErrorInvalidValue, "fp8 with splits > cols / 16 accepted");
    p.splits = 3;
    CHECK(cuda_matvec(&p, &l) == 0, "a valid fp8 GEMV rejected");
    cudaDeviceSynchronize();
    cudaFree(d);
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("fp8_gemv");
    rng_seed(&rng, test_seed(argc, argv, "test_fp8_gemv"));
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    for (int v = 0; v < 256; v++) e4m3_lut[v] = fp8_e4m3_to_f32((uint8_t)v);
    test_codes();
    test_rejects();

    /* the Qwen3.5-0.8B decode shapes (D 1024, F 3584, DeltaNet 8224 / 2048 wide, head 248320), fp8 and bf16 */
    const Case c_store = {MV_IN_RESIDUAL, MV_OUT_STORE, 1, 0, NORM_ZC, 8, 0, 1};
    run_both(8224, 1024, c_store);
    run_both(7168, 1024, (Case){MV_IN_RESIDUAL, MV_OUT_SILU_MUL, 1, 0, NORM_ZC, 1, 0, 1});
    run_both(1024, 3584, (Case){MV_IN_VEC, MV_OUT_SPLITK, 0, 0, NORM_NONE, 0, 0, 1});
    run_both(1024, 3584, (Case){MV_IN_VEC, MV_OUT_SPLITK, 0, 1, NORM_NONE, 0, 0, 1});
    run_both(1024, 2048, (Case){MV_IN_GATED, MV_OUT_SPLITK, 8, 1, NORM_NONE, 0, 0, 1});
    run_both(1024, 2048, (Case){MV_IN_GATED, MV_OUT_SPLITK, 4, 0, NORM_NONE, 0, 0, 1});
    run_both(248320, 1024, (Case){MV_IN_RESIDUAL, MV_OUT_ARGMAX, 1, 0, NORM_ZC, 1, 3, 1});

    /* fresh random shapes: rows 1 .. 3000, cols 16 .. 3200 in steps of 16, every mode */
    for (int it = 0; it < 24; it++) {
        int rows = 1 + (int)(rng_u64(&rng) % 3000), cols = 16 * (1 + (int)(rng_u64(&rng) % 200));
        const int pdl = (int)(rng_u64(&rng) & 1), sp = 2 + (int)(rng_u64(&rng) % 7);
        const int splits = sp < cols / 16 ? sp : cols / 16 > 0 ? cols / 16 : 1;
        Case c = {MV_IN_VEC, MV_OUT_STORE, 1, 0, NORM_NONE, 0, 0, pdl};
        switch (it % 8) {
        case 0: break;
        case 1: c = (Case){MV_IN_RESIDUAL, MV_OUT_SILU_MUL, 1, 0, NORM_ZC, 2, 0, pdl}, rows += rows % 2; break;
        case 2: c = (Case){MV_IN_EMBED, MV_OUT_STORE, 1, 0, NORM_PLAIN, 0, 0, pdl}; break;
        case 3: c = (Case){MV_IN_VEC, MV_OUT_SPLITK, splits, 0, NORM_NONE, 0, 0, pdl}; break;
        case 4: c = (Case){MV_IN_RESIDUAL, MV_OUT_SPLITK, 1, 1, NORM_NONE, 3, 0, pdl}; break;
        case 5: c = (Case){MV_IN_VEC, MV_OUT_ARGMAX, 1, 0, NORM_NONE, 0, (int)(rng_u64(&rng) % 3), pdl}; break;
        case 6: c = (Case){MV_IN_VEC, MV_OUT_SPLITK, splits, 1, NORM_NONE, 0, 0, pdl}; break;
        case 7: { /* gated: cols whole groups of 128, every split whole groups */
            cols = 128 * (1 + (int)(rng_u64(&rng) % 24));
            int s = 1 + (int)(rng_u64(&rng) % 8);
            while (s > 1 && !cuda_matvec_gated_ok(cols, s, 128)) s--;
            c = (Case){MV_IN_GATED, MV_OUT_SPLITK, s, (int)(rng_u64(&rng) & 1), NORM_NONE, 0, 0, pdl};
            break;
        }
        }
        run_both(rows, cols, c);
    }
    return TEST_SUMMARY("fp8_gemv");
}
