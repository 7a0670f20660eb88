/* attn_short_emu.cpp — the short-context attention + o_proj kernel (src/cuda/attention.cu attn_short_oproj,
 * through its launcher cuda_attn_short; pulled in by run_attn_short.sh) run under the host emulation of emu.h
 * (one CTA of 512 fibers at a time, shared memory starting as garbage, the reds as plain adds one CTA after
 * another), against a double-precision reference of the ops.h AttnShortParams contract:
 *   q_out, K[pos]: the head norm + partial NeoX RoPE with HF's bf16 roundings, within one bf16 step (the
 *                  kernel's fp32 sum of squares may round a tie the other way);
 *   V[pos] = bf16(v) exactly; every other cache row bit-identical (rows past pos start as NaN);
 *   y - y0 = W_o o, o = bf16(softmax(q K^T / sqrt(hd)) V) [* bf16(sigmoid(gate))] from the kernel's own
 *                  q_out and K rows, per row within sum_i |w_ri| (2^-8 |o_i| + 1e-6) (one bf16 step of o_i
 *                  either way) + 1e-5 sum_i |w_ri o_i|;
 *   the zero range all 0 (it starts as NaN).
 * Shapes: hd 64 / 128 / 256, G 1-4, gated or not, zero-centred or plain norms, kv_len 1 .. 256 (the cap),
 * D not a multiple of 32 (the o_proj rows of the last threads), one layer's cache shared by positions run in
 * order; and the launcher's refusals. Exit 1 on a failed bound, 2/3 on an emulation error or a deadlock.
 * Usage: attn_short_emu [seed]. */
// clang-format off
#define EMU_NO_SILU
#include "emu.h"      /* first: its macros replace CUDA's qualifiers */
#undef __host__
#define __host__
#include "cuda/ops.h"
extern "C" {
#include "util.h"
}
#include <time.h>
// clang-format on

#include "emu_common.h" /* common.cuh's helpers, launch_kernel, the launcher's runtime calls */
/* what the CUDA headers and the kernel's asm provide on the GPU */
#define __trap() abort()
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_bar(); }
/* attn_qs (compiled, never launched here: its blocks exchange rows, which one CTA at a time cannot) */
static inline unsigned long long tag_ld(const unsigned long long *a) { return *a; }
static inline void tag_st(unsigned long long *a, unsigned e, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    *a = (unsigned long long)e << 32 | u;
}
static inline void tag_read2(const unsigned long long *, int, int, unsigned, float &, float &) {
    fprintf(stderr, "attn_short_emu: attn_qs cannot run under the emulation\n");
    exit(2);
}
cudaError_t cudaGetDevice(int *dev) { return *dev = 0, cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) { return *v = 0, cudaSuccess; }
template <class F>
static cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F *, int, size_t) {
    return *n = 0, cudaSuccess;
}
// clang-format off
#include "as_common.inc"  /* bf_lo .. bf16u, dot8 .. the reductions from src/cuda/common.cuh */
#include "as_helpers.inc" /* ld_bf16_row, wbf, head_norm_rope, attn_final from src/cuda/attention.cu */
#include "as_kernel.inc"  /* attn_short_oproj, cuda_attn_short_cap, cuda_attn_short */
// clang-format on

static int fails;
#define EXPECT(ok, ...)                                                                                        \
    do {                                                                                                       \
        if (!(ok)) {                                                                                           \
            fprintf(stderr, "FAIL: " __VA_ARGS__);                                                             \
            fprintf(stderr, "\n");                                                                             \
            fails++;                                                                                           \
        }                                                                                                      \
    } while (0)

static float *fvec(size_t n) { return (float *)aligned_alloc(64, ((n * 4 + 63) / 64) * 64); }
static uint16_t *hvec(size_t n) { return (uint16_t *)aligned_alloc(64, ((n * 2 + 63) / 64) * 64); }
static bool within_step(float got, double ref) { return fabs(got - ref) <= fabs(ref) / 128 + 1e-30; }

/* head norm + RoPE with HF's bf16 roundings (MODEL.md §3.2), double sum of squares */
static void norm_rope_ref(double *y, const float *x, const float *w, int hd, int R, int mode, double c_eps, int pos,
                          const float *inv_freq) {
    double ss = 0;
    for (int d = 0; d < hd; d++) ss += (double)x[d] * x[d];
    const float r = (float)(1.0 / sqrt(ss / hd + c_eps));
    float t[256];
    for (int d = 0; d < hd; d++) t[d] = mode == NORM_ZC ? rbf(x[d] * r * (1.0f + w[d])) : rbf(w[d] * rbf(x[d] * r));
    const int half = R / 2;
    for (int i = 0; i < half; i++) {
        float sv, cv;
        sincosf((float)pos * inv_freq[i], &sv, &cv);
        const float c = rbf(cv), s = rbf(sv), a = t[i], b = t[i + half];
        t[i] = rbf(rbf(a * c) - rbf(b * s));
        t[i + half] = rbf(rbf(b * c) + rbf(a * s));
    }
    for (int d = 0; d < hd; d++) y[d] = t[d];
}

struct Case {
    const char *name;
    int Hq, Hkv, hd, R, gated, mode, D, max_seq, max_len, n_pos, pos[6];
    int fp8; /* W_o as FP8 (w8_o + s_o): the reference on its dequantized values */
};

static void run_case(const Case &c) {
    const int hd = c.hd, G = c.Hq / c.Hkv, qs = c.gated ? 2 * hd : hd, q_rows = c.Hq * qs;
    const int n_qkv = q_rows + 2 * c.Hkv * hd, n_in = c.Hq * hd, n_zero = 300;
    const size_t n_cache = (size_t)c.Hkv * c.max_seq * hd;
    const float eps = 1e-6f;
    float *qkv = fvec(n_qkv), *qw = fvec(hd), *kw = fvec(hd), *inv_freq = fvec(hd / 2), *y = fvec(c.D);
    float *y0 = fvec(c.D), *zero = fvec(n_zero), *q_out = fvec(n_in);
    uint16_t *K = hvec(n_cache), *V = hvec(n_cache), *Kb = hvec(n_cache), *Vb = hvec(n_cache);
    uint16_t *Wo = hvec((size_t)c.D * n_in);
    for (int d = 0; d < hd; d++) {
        qw[d] = c.mode == NORM_ZC ? rbf(0.2f * nrm()) : rbf(1.0f + 0.2f * nrm());
        kw[d] = c.mode == NORM_ZC ? rbf(0.2f * nrm()) : rbf(1.0f + 0.2f * nrm());
    }
    for (int i = 0; i < c.R / 2; i++) inv_freq[i] = powf(1e6f, -2.0f * i / c.R);
    for (size_t i = 0; i < (size_t)c.D * n_in; i++) Wo[i] = emu_bf(nrm() / sqrtf((float)n_in));
    /* FP8: W_o quantized in 128 x 128 blocks (magnitudes 2^e apart by column block, so a wrong scale block fails);
     * Wd holds the dequantized values the reference uses (bf16 otherwise) */
    std::vector<float> Wd((size_t)c.D * n_in), sdev;
    std::vector<uint8_t> W8;
    if (c.fp8) {
        std::vector<float> f((size_t)c.D * n_in), bs((size_t)((c.D + 127) / 128) * ((n_in + 127) / 128));
        for (size_t i = 0; i < f.size(); i++) f[i] = bff(Wo[i]) * ldexpf(1.0f, (int)((i % n_in) / 128 % 5) - 2);
        W8.resize(f.size());
        fp8_quantize_blocks(W8.data(), bs.data(), f.data(), c.D, n_in);
        fp8_dequantize_blocks(Wd.data(), W8.data(), bs.data(), c.D, n_in);
        sdev.assign(fp8_scale_count(c.D, n_in), NAN);
        fp8_scales_per_row(sdev.data(), fp8_scale_ld(c.D), 0, 1, bs.data(), c.D, n_in);
    } else {
        for (size_t i = 0; i < Wd.size(); i++) Wd[i] = bff(Wo[i]);
    }
    /* earlier tokens' rows: N(0, 1); rows from the first position on: NaN (filled or written in order) */
    for (int h = 0; h < c.Hkv; h++)
        for (int t = 0; t < c.max_seq; t++)
            for (int d = 0; d < hd; d++) {
                const size_t at = ((size_t)h * c.max_seq + t) * hd + d;
                K[at] = t < c.pos[0] ? emu_bf(nrm()) : 0x7fa5, V[at] = t < c.pos[0] ? emu_bf(nrm()) : 0x7fa5;
            }
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    double worst = 0;
    for (int pi = 0; pi < c.n_pos; pi++) {
        const int pos = c.pos[pi], kv_len = pos + 1;
        sp.pos = pos;
        for (int h = 0; h < c.Hkv; h++) /* rows of the tokens between the positions run: N(0, 1) */
            for (int t = pi ? c.pos[pi - 1] + 1 : pos; t < pos; t++)
                for (int d = 0; d < hd; d++) {
                    const size_t at = ((size_t)h * c.max_seq + t) * hd + d;
                    K[at] = emu_bf(nrm()), V[at] = emu_bf(nrm());
                }
        for (int i = 0; i < n_qkv; i++) qkv[i] = rbf(nrm());
        for (int i = 0; i < c.D; i++) y[i] = y0[i] = rbf(0.3f * nrm());
        memset(zero, 0xff, (size_t)n_zero * 4);
        memset(q_out, 0xff, (size_t)n_in * 4);
        memcpy(Kb, K, n_cache * 2), memcpy(Vb, V, n_cache * 2);
        AttnShortParams p;
        memset(&p, 0, sizeof p);
        p.a.qkv = qkv, p.a.q_norm_w = qw, p.a.k_norm_w = kw, p.a.inv_freq = inv_freq, p.a.k_cache = K;
        p.a.v_cache = V, p.a.q_out = q_out, p.a.step = &sp, p.a.Hq = c.Hq, p.a.Hkv = c.Hkv, p.a.hd = hd;
        p.a.R = c.R, p.a.max_seq = c.max_seq, p.a.gated = c.gated, p.a.norm_mode = c.mode, p.a.eps = eps;
        p.w_o = Wo, p.y = y, p.zero = zero, p.n_zero = n_zero, p.D = c.D, p.max_len = c.max_len;
        if (c.fp8) p.w_o = NULL, p.w8_o = W8.data(), p.s_o = sdev.data();
        CudaLaunch l = {NULL, 1, NULL, 0};
        const int rc = cuda_attn_short(&p, &l);
        EXPECT(rc == 0, "%s pos %d: launch -> %d", c.name, pos, rc);
        if (rc) continue;
        /* q_out and the cache */
        int bad_q = 0, bad_k = 0, bad_v = 0, bad_rows = 0, bad_z = 0, bad_y = 0;
        double ref[256];
        for (int h = 0; h < c.Hq; h++) {
            norm_rope_ref(ref, qkv + (size_t)h * qs, qw, hd, c.R, c.mode, eps, pos, inv_freq);
            for (int d = 0; d < hd; d++) bad_q += !within_step(q_out[(size_t)h * hd + d], ref[d]);
        }
        for (int h = 0; h < c.Hkv; h++) {
            norm_rope_ref(ref, qkv + q_rows + (size_t)h * hd, kw, hd, c.R, c.mode, eps, pos, inv_freq);
            const size_t at = ((size_t)h * c.max_seq + pos) * hd;
            for (int d = 0; d < hd; d++) {
                bad_k += !within_step(bff(K[at + d]), ref[d]);
                bad_v += V[at + d] != emu_bf(qkv[q_rows + (size_t)(c.Hkv + h) * hd + d]);
                Kb[at + d] = K[at + d], Vb[at + d] = V[at + d]; /* adopt row pos, then compare every row */
            }
        }
        bad_rows = memcmp(K, Kb, n_cache * 2) != 0 || memcmp(V, Vb, n_cache * 2) != 0;
        for (int i = 0; i < n_zero; i++) bad_z += zero[i] != 0.0f;
        /* o from the kernel's q_out and K rows */
        std::vector<double> o(n_in), ob(n_in);
        for (int h = 0; h < c.Hq; h++) {
            const int kh = h / G;
            std::vector<double> s(kv_len);
            double m = -1e300, L = 0;
            for (int t = 0; t < kv_len; t++) {
                double a = 0;
                for (int d = 0; d < hd; d++)
                    a += (double)q_out[(size_t)h * hd + d] * bff(K[((size_t)kh * c.max_seq + t) * hd + d]);
                s[t] = a / sqrt((double)hd);
                m = s[t] > m ? s[t] : m;
            }
            for (int t = 0; t < kv_len; t++) L += (s[t] = exp(s[t] - m));
            for (int d = 0; d < hd; d++) {
                double a = 0;
                for (int t = 0; t < kv_len; t++) a += s[t] * bff(V[((size_t)kh * c.max_seq + t) * hd + d]);
                float v = rbf((float)(a / L));
                if (c.gated) v = rbf(v * rbf(1.0f / (1.0f + expf(-qkv[(size_t)h * qs + hd + d]))));
                o[(size_t)h * hd + d] = v;
                ob[(size_t)h * hd + d] = fabs(v) / 256 + 1e-6; /* one bf16 step of o either way */
            }
        }
        for (int r = 0; r < c.D; r++) {
            double a = 0, aw = 0, bound = 0;
            for (int i = 0; i < n_in; i++) {
                const double w = Wd[(size_t)r * n_in + i];
                a += w * o[i], aw += fabs(w * o[i]), bound += fabs(w) * ob[i];
            }
            bound += 1e-5 * aw + 1e-6 * fabs(y0[r]);
            const double err = fabs((double)y[r] - y0[r] - a);
            worst = err / bound > worst ? err / bound : worst;
            if (!(err <= bound)) {
                if (bad_y < 3) fprintf(stderr, "  %s pos %d: y[%d] - y0 %.8g, ref %.8g\n", c.name, pos, r, y[r] - y0[r], a);
                bad_y++;
            }
        }
        EXPECT(bad_q == 0, "%s pos %d: %d q_out values off by more than a bf16 step", c.name, pos, bad_q);
        EXPECT(bad_k == 0 && bad_v == 0, "%s pos %d: K[pos] %d, V[pos] %d bad", c.name, pos, bad_k, bad_v);
        EXPECT(!bad_rows, "%s pos %d: cache rows other than pos changed", c.name, pos);
        EXPECT(bad_z == 0, "%s pos %d: %d of %d floats not zeroed", c.name, pos, bad_z, n_zero);
        EXPECT(bad_y == 0, "%s pos %d: %d of %d rows of y off the bound", c.name, pos, bad_y, c.D);
    }
    printf("  %-26s Hq %2d Hkv %d hd %3d R %3d %s %s D %4d max_len %3d, %d positions up to %d: worst y error / "
           "bound %.2e\n", c.name, c.Hq, c.Hkv, hd, c.R, c.gated ? "gated" : "plain", c.mode == NORM_ZC ? "zc" : "pl",
           c.D, c.max_len, c.n_pos, c.pos[c.n_pos - 1], worst);
    free(qkv), free(qw), free(kw), free(inv_freq), free(y), free(y0), free(zero), free(q_out);
    free(K), free(V), free(Kb), free(Vb), free(Wo);
}

int main(int argc, char **argv) {
    emu_rs = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    if (!emu_rs) emu_rs = 1;
    printf("short-context attention + o_proj (src/cuda/attention.cu attn_short_oproj) under the CUDA emulation, "
           "seed %llu:\n", (unsigned long long)emu_rs);
    const Case cases[] = {
        {"hd 64, G 2, zc, gated", 4, 2, 64, 32, 1, NORM_ZC, 68, 80, 64, 3, {0, 1, 63}},
        {"hd 128, G 4, plain, no gate", 4, 1, 128, 128, 0, NORM_PLAIN, 36, 200, 200, 1, {150}},
        {"hd 256, G 2, zc, gated (cap)", 2, 1, 256, 64, 1, NORM_ZC, 100, 300, 256, 1, {255}},
        {"hd 128, G 1", 2, 2, 128, 64, 1, NORM_ZC, 4, 40, 40, 1, {39}},
        {"fp8 W_o: hd 64, G 2, zc, gated", 4, 2, 64, 32, 1, NORM_ZC, 68, 80, 64, 3, {0, 1, 63}, 1},
        {"fp8 W_o: hd 256, G 2 (cap)", 2, 1, 256, 64, 1, NORM_ZC, 100, 300, 256, 1, {255}, 1},
    };
    for (const Case &c : cases) run_case(c);
    /* the launcher's refusals (nothing launched) */
    {
        AttnShortParams p;
        memset(&p, 0, sizeof p);
        static float f[1024];
        static uint16_t h[1024];
        StepParams sp;
        memset(&sp, 0, sizeof sp);
        p.a.qkv = f, p.a.q_norm_w = f, p.a.k_norm_w = f, p.a.inv_freq = f, p.a.k_cache = h, p.a.v_cache = h;
        p.a.step = &sp, p.a.Hq = 2, p.a.Hkv = 1, p.a.hd = 64, p.a.R = 32, p.a.max_seq = 8, p.a.norm_mode = NORM_ZC;
        p.w_o = h, p.y = f, p.D = 64, p.max_len = 8;
        CudaLaunch l = {NULL, 1, NULL, 0};
        const long n0 = emu_ctas;
        const struct {
            const char *what;
            int hd, D, max_len, n_zero;
        } bad[] = {{"hd 32", 32, 64, 8, 0}, {"hd 96", 96, 64, 8, 0}, {"D 66", 64, 66, 8, 0}, {"D 1028", 64, 1028, 8, 0},
                   {"max_len 0", 64, 64, 0, 0}, {"max_len 257", 64, 64, 257, 0}, {"n_zero without zero", 64, 64, 8, 4}};
        for (const auto &b : bad) {
            AttnShortParams q = p;
            q.a.hd = b.hd, q.D = b.D, q.max_len = b.max_len, q.n_zero = b.n_zero;
            EXPECT(cuda_attn_short(&q, &l) == (int)cudaErrorInvalidValue, "launcher accepted %s", b.what);
        }
        EXPECT(emu_ctas == n0, "a refused launch ran CTAs");
        EXPECT(cuda_attn_short_cap(256, 1024) == 256 && cuda_attn_short_cap(64, 4) == 256 &&
                   cuda_attn_short_cap(256, 1026) == 0 && cuda_attn_short_cap(48, 1024) == 0,
               "cuda_attn_short_cap");
    }
    printf("attn_short_emu: %s (%ld CTAs run)\n", fails ? "FAILED" : "all bounds met", emu_ctas);
    return fails ? 1 : 0;
}
