/* gemv_emu.cpp — the GEMV family (src/cuda/gemv.cu, pulled in as gemv.inc by run_gemv.sh) run through its launcher
 * cuda_matvec under the host emulation of emu.h (one CTA of 256 / 512 fibers at a time, shared memory starting as
 * garbage), for both weight formats: bf16 W and fp8 e4m3 W8 with 128 x 128 block scales (src/util.c's
 * fp8_quantize_blocks of weights whose magnitude changes by up to 2^8 from block to block, so a scale read from the
 * wrong block shows). Reference: double precision on the dequantized weights (bf16 values, or fp8_dequantize_blocks),
 * times the kernel's own input row (h_out) where a prologue normed it, the host's where none is written (MV_IN_GATED).
 * Shapes are ragged: rows and cols not multiples of 128 (nor of 4 / 512), cols a multiple of 16 (FP8) or of 8 (bf16
 * only). Every mode decode uses: MV_IN_VEC / EMBED / RESIDUAL (NORM_ZC, NORM_PLAIN, none; the norm weights in
 * registers and not) / GATED, and MV_OUT_STORE / SILU_MUL / SPLITK (atomic, and the deterministic per-split partials,
 * each checked against its own column slice) / ARGMAX (fixed stride and tickets), both kernel shapes (U 4 x 512 and
 * U 2 x 256 threads). Outputs start as NaN (an atomic accumulator as 0). Bounds: fp32 sums within 1e-5 sum |w x|,
 * bf16 outputs within one bf16 step more; x_out bit-exact, h_out within one bf16 step; the argmax's row within the
 * bound of the best. Also: e4m3x2_f32 against fp8_e4m3_to_f32 for every code, and the launcher's refusals.
 * For machines without a GPU: indexing, the scale blocks, split slices and epilogues, not speed or real atomics
 * (plain adds, one CTA after another). Exit 1 on a failed bound. */
// clang-format off
#define EMU_NO_SILU /* silu_f comes from common.cuh with the other helpers */
#include "emu.h"    /* first: its macros replace CUDA's qualifiers */
#undef __host__
#define __host__
#include <limits.h>
#include <vector>
#include "cuda/ops.h"
#include "emu_common.h"
extern "C" {
#include "util.h"
}
// clang-format on

/* what the kernel uses beyond emu.h / emu_common.h */
static inline unsigned __shfl_sync(unsigned, unsigned v, int src) { /* the ticket broadcast */
    const int lane = me().tid & 31;
    emu_slot(lane)[0] = v;
    emu_warp_bar();
    const unsigned r = emu_slot(src & 31)[0];
    emu_warp_bar();
    return r;
}
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
static int emu_n_sm = 132; /* what the launcher's device query answers */
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) {
    *v = emu_n_sm;
    return cudaSuccess;
}
#undef __shared__
#define __shared__ static /* one CTA runs at a time: a function's statics are its shared memory */
// clang-format off
#include "gv_common.inc" /* bf_lo .. bf16u, dot8 .. ceil_div (dot16_e4m3 with them), gemv_stage_input, argmax_publish */
#include "gemv.inc"      /* the kernel and its launchers */
// clang-format on

static int fails, checks;
static void check(bool ok, const char *what, const char *c) {
    checks++;
    if (!ok) {
        fprintf(stderr, "FAIL: %s: %s\n", c, what);
        fails++;
    }
}

static float *nanv(size_t n) {
    float *p = (float *)malloc((n ? n : 1) * 4);
    memset(p, 0xff, (n ? n : 1) * 4);
    return p;
}
static float *rbfv(size_t n, float mean, float sc) {
    float *p = (float *)malloc((n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++) p[i] = rbf(mean + sc * nrm());
    return p;
}

/* The weights of one case in both forms: Wd (the dequantized values the kernel must reproduce), W (bf16) or
 * W8 + w8_scale (fp8). Magnitude 2^e per 128 x 128 block, e in [-4, 4], times 1/sqrt(cols). */
struct Weights {
    int fp8, rows, cols;
    std::vector<float> Wd, sc, dsc; /* sc: 128 x 128 block scales; dsc: the device's per-row layout (ops.h) */
    std::vector<uint16_t> W;
    std::vector<uint8_t> W8;
};
static void make_weights(Weights &w, int fp8, int rows, int cols) {
    w.fp8 = fp8, w.rows = rows, w.cols = cols;
    const int nbr = (rows + 127) / 128, nbc = (cols + 127) / 128;
    std::vector<float> mag((size_t)nbr * nbc), f((size_t)rows * cols);
    for (auto &m : mag) m = ldexpf(1.0f, (int)(urand() * 9) - 4) / sqrtf((float)cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) f[(size_t)r * cols + c] = nrm() * mag[(size_t)(r / 128) * nbc + c / 128];
    w.Wd.resize(f.size());
    if (fp8) {
        w.W8.resize(f.size()), w.sc.resize(mag.size());
        fp8_quantize_blocks(w.W8.data(), w.sc.data(), f.data(), rows, cols);
        fp8_dequantize_blocks(w.Wd.data(), w.W8.data(), w.sc.data(), rows, cols);
        w.dsc.assign(fp8_scale_count(rows, cols), NAN); /* padding rows poisoned: never used */
        fp8_scales_per_row(w.dsc.data(), fp8_scale_ld(rows), 0, 1, w.sc.data(), rows, cols);
    } else {
        w.W.resize(f.size());
        for (size_t i = 0; i < f.size(); i++) w.W[i] = emu_bf(f[i]), w.Wd[i] = bff(w.W[i]);
    }
}
static void set_weights(MatvecParams &p, const Weights &w) {
    p.W = w.fp8 ? NULL : w.W.data();
    p.W8 = w.fp8 ? w.W8.data() : NULL;
    p.w8_scale = w.fp8 ? w.dsc.data() : NULL;
    p.rows = w.rows, p.cols = w.cols;
}
/* sum_{k in [k0, k1)} Wd[r][k] x[k] and sum |.| */
static void ref_row(const Weights &w, const float *x, int r, int k0, int k1, double &s, double &a) {
    s = 0, a = 0;
    for (int k = k0; k < k1; k++) {
        const double v = (double)w.Wd[(size_t)r * w.cols + k] * x[k];
        s += v, a += fabs(v);
    }
}

struct Case {
    int fp8, rows, cols, in_mode, out_mode, splits, atomic, norm_mode, n_parts, n_sm, dyn, group;
};

static void run_case(const Case &cs) {
    char name[200];
    static const char *im[] = {"vec", "embed", "residual", "gated"}, *om[] = {"store", "silu_mul", "splitk", "argmax"};
    snprintf(name, sizeof name, "%s %4d x %4d in %-8s out %-8s splits %d%s norm %d parts %d sm %d%s",
             cs.fp8 ? "fp8 " : "bf16", cs.rows, cs.cols, im[cs.in_mode], om[cs.out_mode], cs.splits,
             cs.out_mode == MV_OUT_SPLITK ? (cs.atomic ? " atomic" : " partials") : "", cs.norm_mode, cs.n_parts,
             cs.n_sm, cs.dyn ? " tickets" : "");
    const int rows = cs.rows, cols = cs.cols, S = cs.splits;
    Weights w;
    make_weights(w, cs.fp8, rows, cols);
    MatvecParams p;
    memset(&p, 0, sizeof p);
    set_weights(p, w);
    p.splits = S, p.in_mode = cs.in_mode, p.out_mode = cs.out_mode, p.atomic = cs.atomic, p.eps = 1e-6f;
    p.early_trigger = cs.rows % 2;
    p.blocks = cs.n_sm > 0 ? (cs.fp8 ? cuda_matvec_blocks_fp8 : cuda_matvec_blocks)(rows, cols, S, cs.n_sm) : 0;
    emu_n_sm = 132;
    const int bx = p.blocks > 0 ? p.blocks : (cs.fp8 ? cuda_matvec_blocks_fp8 : cuda_matvec_blocks)(rows, cols, S, 132);

    /* input */
    const int V = 5, G = cs.group;
    StepParams step;
    memset(&step, 0, sizeof step);
    step.token = 3, step.write_logits = 1;
    p.step = &step;
    float *x = rbfv(cols, 0, 1), *parts = rbfv((size_t)cs.n_parts * cols, 0, 0.5f), *gate = rbfv(cols, 0, 1.5f);
    float *nw = rbfv(cs.in_mode == MV_IN_GATED ? G : cols, cs.norm_mode == NORM_PLAIN ? 1.0f : 0.0f, 0.2f);
    std::vector<uint16_t> embed((size_t)V * cols);
    for (auto &e : embed) e = emu_bf(nrm());
    float *x_out = nanv(cols), *h_out = nanv(cols);
    p.x = x;
    if (cs.in_mode == MV_IN_EMBED) p.embed = embed.data();
    if (cs.in_mode == MV_IN_RESIDUAL) p.parts = parts, p.n_parts = cs.n_parts;
    if (cs.in_mode == MV_IN_EMBED || cs.in_mode == MV_IN_RESIDUAL) {
        p.x_out = x_out, p.h_out = h_out;
        if (cs.norm_mode != NORM_NONE) p.norm_w = nw, p.norm_mode = cs.norm_mode;
    }
    if (cs.in_mode == MV_IN_GATED) p.gate = gate, p.norm_w = nw, p.group = G;

    /* output */
    const int ny = cs.out_mode == MV_OUT_SILU_MUL               ? rows / 2
                   : cs.out_mode == MV_OUT_SPLITK && !cs.atomic ? S * rows
                                                                : rows;
    float *y = nanv(ny), *logits = nanv(rows), *am_val = nanv(bx), *zero = nanv(37), out_max = NAN;
    if (cs.out_mode == MV_OUT_SPLITK && cs.atomic) memset(y, 0, (size_t)ny * 4);
    std::vector<int> am_idx(bx, -7);
    std::vector<unsigned> work(CUDA_MV_WORK_WORDS, 0u);
    unsigned am_count = 0;
    int out_id = -1;
    if (cs.out_mode == MV_OUT_ARGMAX) {
        p.logits = logits, p.n_valid = rows - rows / 9, p.am_val = am_val, p.am_idx = am_idx.data();
        p.am_count = &am_count, p.out_id = &out_id, p.out_max = &out_max;
        if (cs.dyn) p.work = work.data(), p.work_tail = 1;
    } else {
        p.y = y;
    }
    p.zero = zero, p.n_zero = 37;
    CudaLaunch l;
    memset(&l, 0, sizeof l);
    const long ctas0 = emu_ctas;
    const int rc = cuda_matvec(&p, &l);
    check(rc == 0, "launch refused", name);
    if (rc) return;

    /* the input row the weights multiply */
    std::vector<float> xin(cols);
    int bad_x = 0, bad_h = 0, bad_z = 0;
    for (int i = 0; i < 37; i++) bad_z += zero[i] != 0.0f;
    if (cs.in_mode == MV_IN_VEC) {
        for (int i = 0; i < cols; i++) xin[i] = x[i];
    } else if (cs.in_mode == MV_IN_GATED) {
        for (int g0 = 0; g0 < cols; g0 += G) {
            float ss = 0;
            for (int c = 0; c < G; c++) ss += x[g0 + c] * x[g0 + c];
            const float r = 1.0f / sqrtf(ss / (float)G + p.eps);
            for (int c = 0; c < G; c++) {
                const float u = rbf(x[g0 + c] * r), wu = rbf(nw[c] * u), z = gate[g0 + c];
                xin[g0 + c] = rbf(wu * (z / (1.0f + expf(-z))));
            }
        }
    } else {
        std::vector<float> xr(cols);
        double ss = 0;
        for (int i = 0; i < cols; i++) {
            if (cs.in_mode == MV_IN_EMBED) {
                xr[i] = bff(embed[(size_t)step.token * cols + i]);
            } else {
                float a = 0;
                for (int s = 0; s < cs.n_parts; s++) a += parts[(size_t)s * cols + i];
                xr[i] = rbf(x[i] + rbf(a));
            }
            bad_x += memcmp(&xr[i], &x_out[i], 4) != 0;
            ss += (double)xr[i] * xr[i];
        }
        const float r = 1.0f / sqrtf((float)(ss / cols) + 1e-6f);
        for (int i = 0; i < cols; i++) {
            const float h = cs.norm_mode == NORM_ZC      ? rbf(xr[i] * r * (1.0f + nw[i]))
                            : cs.norm_mode == NORM_PLAIN ? rbf(nw[i] * rbf(xr[i] * r))
                                                         : xr[i];
            bad_h += !(fabsf(h_out[i] - h) <= 2.0f / 256 * fabsf(h) + 1e-6f);
            xin[i] = h_out[i]; /* the kernel's normed row: the sums are checked against it */
        }
    }
    /* gated: the host's x may differ from the kernel's by a bf16 step where its norm sum rounds the other way */
    const double xtol = cs.in_mode == MV_IN_GATED ? 2.0 / 256 : 0.0;

    int bad = 0;
    double worst = 0; /* max |err| / (sum |w x|); bf16 outputs against the reference rounded to bf16 */
    auto near = [&](double got, double ref, double a, double rel) {
        const double err = fabs(got - ref), tol = 1e-5 * a + xtol * a + rel * fabs(ref) + 1e-30;
        const double e_sum = rel > 0 ? fabs(got - rbf((float)ref)) : err; /* bf16 outputs: against bf16(ref) */
        if (a > 0 && e_sum / a > worst) worst = e_sum / a;
        return err <= tol; /* false for NaN */
    };
    if (cs.out_mode == MV_OUT_STORE) {
        for (int r = 0; r < rows; r++) {
            double s, a;
            ref_row(w, xin.data(), r, 0, cols, s, a);
            if (!near(y[r], s, a, 1.0 / 256)) {
                if (bad < 4) fprintf(stderr, "  y[%d]: got %.8g ref %.8g\n", r, y[r], s);
                bad++;
            }
        }
    } else if (cs.out_mode == MV_OUT_SILU_MUL) {
        for (int i = 0; i < rows / 2; i++) {
            double g, ag, u, au;
            ref_row(w, xin.data(), 2 * i, 0, cols, g, ag), ref_row(w, xin.data(), 2 * i + 1, 0, cols, u, au);
            const float gb = rbf((float)g), ub = rbf((float)u), ref = rbf(rbf(gb / (1.0f + expf(-gb))) * ub);
            const double tol = 3 * (1e-5 * (ag + au) + 2e-6) * (1 + fabs(gb) + fabs(ub)) + 3.0 / 256 * fabs(ref);
            if (!(fabs((double)y[i] - ref) <= tol)) {
                if (bad < 4) fprintf(stderr, "  act[%d]: got %.8g ref %.8g\n", i, y[i], ref);
                bad++;
            }
        }
    } else if (cs.out_mode == MV_OUT_SPLITK) {
        const int cpl = cs.fp8 ? 16 : 8, kc = ((cols + S - 1) / S + cpl - 1) & ~(cpl - 1);
        for (int s = 0; s < (cs.atomic ? 1 : S); s++)
            for (int r = 0; r < rows; r++) {
                const int k0 = cs.atomic ? 0 : std::min(cols, s * kc), k1 = cs.atomic ? cols : std::min(cols, k0 + kc);
                double ref, a;
                ref_row(w, xin.data(), r, k0, k1, ref, a);
                const float got = y[(size_t)s * rows + r];
                if (!near(got, ref, a, 0)) {
                    if (bad < 4) fprintf(stderr, "  split %d row %d: got %.8g ref %.8g\n", s, r, got, ref);
                    bad++;
                }
            }
    } else { /* ARGMAX */
        double best = -INFINITY, best_tol = 0;
        std::vector<double> ref(rows), tol(rows);
        for (int r = 0; r < rows; r++) {
            double a;
            ref_row(w, xin.data(), r, 0, cols, ref[r], a);
            tol[r] = 1e-5 * a + 1.0 / 256 * fabs(ref[r]) + 1e-30;
            if (!near(logits[r], ref[r], a, 1.0 / 256)) {
                if (bad < 4) fprintf(stderr, "  logits[%d]: got %.8g ref %.8g\n", r, logits[r], ref[r]);
                bad++;
            }
            if (r < p.n_valid && ref[r] > best) best = ref[r], best_tol = tol[r];
        }
        const bool id_ok = out_id >= 0 && out_id < p.n_valid && ref[out_id] >= best - tol[out_id] - best_tol;
        check(id_ok, "argmax row not within the bound of the best", name);
        check(id_ok && memcmp(&out_max, &logits[out_id], 4) == 0, "out_max != logits[out_id]", name);
        check(am_count == 0, "am_count not reset", name);
        bool wz = true;
        for (unsigned v : work) wz &= v == 0u;
        check(wz, "ticket counters not reset", name);
    }
    check(bad_x == 0, "x_out not bit-exact", name);
    check(bad_h == 0, "h_out", name);
    check(bad_z == 0, "zero[] not zeroed", name);
    check(bad == 0, "outputs out of bound", name);
    printf("  %s: %ld CTAs, %d bad, max |err| / sum |w x| %.1e\n", name, emu_ctas - ctas0, bad + bad_x + bad_h + bad_z,
           worst);
    free(x), free(parts), free(gate), free(nw), free(x_out), free(h_out), free(y), free(logits), free(am_val);
    free(zero);
}

/* e4m3x2_f32 (common.cuh, the software path the emulation compiles) against util.c for every pair of codes' halves */
static void check_decode(void) {
    int bad = 0;
    for (int a = 0; a < 256; a++) {
        const int b = (a * 37 + 11) & 255;
        const float2 f = e4m3x2_f32((uint32_t)a | (uint32_t)b << 8 | 0xabcd0000u);
        const float ra = fp8_e4m3_to_f32((uint8_t)a), rb = fp8_e4m3_to_f32((uint8_t)b);
        if ((a & 0x7f) != 0x7f) bad += memcmp(&f.x, &ra, 4) != 0;
        if ((b & 0x7f) != 0x7f) bad += memcmp(&f.y, &rb, 4) != 0;
    }
    check(bad == 0, "e4m3x2_f32 differs from fp8_e4m3_to_f32", "decode");
    printf("  e4m3x2_f32 vs fp8_e4m3_to_f32, 254 codes x 2 halves: %d bad\n", bad);
}

/* the launcher's refusals of mixed or misaligned formats */
static void check_refusals(void) {
    Weights w;
    make_weights(w, 1, 8, 48);
    std::vector<uint16_t> wb(8 * 48);
    float x[48] = {0}, y[8];
    CudaLaunch l;
    memset(&l, 0, sizeof l);
    MatvecParams p;
    memset(&p, 0, sizeof p);
    p.rows = 8, p.cols = 48, p.splits = 1, p.blocks = 1, p.x = x, p.y = y;
    int refused = 0;
    p.W8 = w.W8.data(), p.w8_scale = NULL; /* fp8 without scales */
    refused += cuda_matvec(&p, &l) != 0;
    p.W = wb.data(), p.w8_scale = w.dsc.data(); /* both formats */
    refused += cuda_matvec(&p, &l) != 0;
    p.W8 = NULL; /* bf16 with scales */
    refused += cuda_matvec(&p, &l) != 0;
    p.W = NULL, p.W8 = w.W8.data(), p.cols = 40; /* fp8, cols % 16 != 0 */
    refused += cuda_matvec(&p, &l) != 0;
    p.cols = 48, p.splits = 4; /* fp8, more splits than 16-column slices */
    p.out_mode = MV_OUT_SPLITK, p.atomic = 1;
    refused += cuda_matvec(&p, &l) != 0;
    check(refused == 5, "a bad MatvecParams was launched", "refusals");
    printf("  launcher: %d of 5 bad parameter sets refused\n", refused);
}

int main(int argc, char **argv) {
    if (argc > 1) emu_rs ^= (uint64_t)strtoull(argv[1], NULL, 10) * 0x9e3779b97f4a7c15ull;
    emu_max_smem.clear();
    printf("GEMV kernels (src/cuda/gemv.cu, bf16 and fp8 e4m3 weights) under the CUDA emulation:\n");
    check_decode();
    check_refusals();
    for (int f = 0; f < 2; f++) {
        /* fp8 rows cols in out splits atomic norm parts n_sm tickets group */
        const Case cases[] = {
            {f, 300, 400, MV_IN_VEC, MV_OUT_STORE, 1, 0, NORM_NONE, 0, 2, 0, 0},
            {f, 3, 48, MV_IN_VEC, MV_OUT_STORE, 1, 0, NORM_NONE, 0, 0, 0, 0}, /* one partial group, 3 lanes */
            {f, 300, 272, MV_IN_RESIDUAL, MV_OUT_SILU_MUL, 1, 0, NORM_ZC, 2, 1, 0, 0},
            {f, 132, 1296, MV_IN_RESIDUAL, MV_OUT_STORE, 1, 0, NORM_PLAIN, 1, 0, 0, 0}, /* norm w not in registers */
            {f, 264, 336, MV_IN_EMBED, MV_OUT_STORE, 1, 0, NORM_ZC, 0, 3, 0, 0},
            {f, 136, 208, MV_IN_RESIDUAL, MV_OUT_STORE, 1, 0, NORM_NONE, 3, 2, 0, 0},
            {f, 200, 1040, MV_IN_VEC, MV_OUT_SPLITK, 3, 1, NORM_NONE, 0, 0, 0, 0},
            {f, 132, 784, MV_IN_VEC, MV_OUT_SPLITK, 4, 0, NORM_NONE, 0, 0, 0, 0},
            {f, 68, 2064, MV_IN_VEC, MV_OUT_SPLITK, 2, 0, NORM_NONE, 0, 0, 0, 0},
            {f, 52, 2064, MV_IN_VEC, MV_OUT_SPLITK, 7, 1, NORM_NONE, 0, 0, 0, 0},
            {f, 1000, 528, MV_IN_RESIDUAL, MV_OUT_ARGMAX, 1, 0, NORM_PLAIN, 1, 2, 0, 0},
            {f, 1000, 528, MV_IN_VEC, MV_OUT_ARGMAX, 1, 0, NORM_NONE, 0, 2, 1, 0},
            {f, 136, 512, MV_IN_GATED, MV_OUT_SPLITK, 2, 0, NORM_NONE, 0, 0, 0, 128},
            {f, 100, 2048, MV_IN_GATED, MV_OUT_SPLITK, 4, 1, NORM_NONE, 0, 0, 0, 128},
        };
        for (const Case &c : cases) run_case(c);
    }
    run_case({0, 20, 392, MV_IN_VEC, MV_OUT_STORE, 1, 0, NORM_NONE, 0, 0, 0, 0}); /* bf16: cols % 16 == 8 */
    run_case({0, 20, 392, MV_IN_VEC, MV_OUT_SPLITK, 3, 0, NORM_NONE, 0, 0, 0, 0});
    printf("gemv_emu: %d checks, %s\n", checks, fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
