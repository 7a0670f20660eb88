/* test_cpu_ops.c — the fp32 CPU reference ops and forward pass on fresh random inputs.
 * Ops are checked against direct double-precision formulas; chunked DeltaNet against the
 * recurrence; the forward pass of tiny hand-built models (Qwen3.5 hybrid and Qwen3 dense)
 * against a naive double-precision forward written from MODEL.md §7, and prefill against
 * decode, split prefill and passes longer than CPU_TB. Usage: test_cpu_ops [seed]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend.h"
#include "cpu/forward.h"
#include "cpu/ops.h"
#include "test.h"
#include "tiny_weights.h"

static Rng rng;

static float *randv(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = scale * rng_normal(&rng);
    return p;
}
static float *nanv(int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static float *copyv(const float *x, int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}
/* ||a - ref|| / ||ref||, NaN-propagating (a NaN gives NaN, which fails every <= check). */
static double rel_l2(const float *a, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}
static double rel_l2f(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}
static double *dalloc(int64_t n) { return calloc((size_t)n, sizeof(double)); }

/* ---- weights of any dtype ---------------------------------------------------------------- */

static void *weights_of(const float *w, int64_t n, DType dt) {
    if (dt == DT_F32) return copyv(w, n);
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = dt == DT_BF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
    return h;
}
static double wval(const void *w, DType dt, int64_t i) {
    if (dt == DT_F32) return ((const float *)w)[i];
    uint16_t h = ((const uint16_t *)w)[i];
    return dt == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static void test_matmul(void) {
    const DType dts[3] = {DT_BF16, DT_F16, DT_F32};
    const int shapes[][3] = {{1, 37, 700}, {5, 37, 700}, {3, 9, 1030}, {1, 1, 1}, {7, 16, 512}};
    for (int d = 0; d < 3; d++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int T = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
            float *wf = randv((int64_t)rows * cols, 0.5f), *x = randv((int64_t)T * cols, 1.0f);
            void *w = weights_of(wf, (int64_t)rows * cols, dts[d]);
            double *ref = dalloc((int64_t)T * rows);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < rows; r++) {
                    double acc = 0;
                    for (int c = 0; c < cols; c++) acc += wval(w, dts[d], (int64_t)r * cols + c) * x[t * cols + c];
                    ref[t * rows + r] = acc;
                }
            float *y = nanv((int64_t)T * rows);
            cpu_matmul(y, x, w, dts[d], T, rows, cols);
            double e = rel_l2(y, ref, (int64_t)T * rows);
            /* fp32 sums of `cols` random-sign terms vs double: error grows ~ sqrt(cols) ulps (1.3e-6 seen at
             * 1030 under ASan's different contraction); a wrong index or rounding gives >= 1e-3 */
            const double tol = 1e-7 * sqrt((double)cols);
            CHECK(e <= tol, "matmul dtype %d T %d %dx%d: rel err %.3g", (int)dts[d], T, rows, cols, e);
            float *y1 = nanv(rows);
            cpu_matvec(y1, x, w, dts[d], rows, cols);
            e = rel_l2(y1, ref, rows);
            CHECK(e <= tol, "matvec dtype %d %dx%d: rel err %.3g", (int)dts[d], rows, cols, e);
            free(wf), free(x), free(w), free(ref), free(y), free(y1);
        }
    }
    /* embedding row lookup */
    float *ef = randv(10 * 33, 1.0f);
    void *e16 = weights_of(ef, 10 * 33, DT_BF16);
    float *row = nanv(33);
    cpu_embed(row, e16, DT_BF16, 7, 33);
    int ok = 1;
    for (int i = 0; i < 33; i++) ok &= row[i] == (float)wval(e16, DT_BF16, 7 * 33 + i);
    CHECK(ok, "embed row 7 differs from the table");
    free(ef), free(e16), free(row);
}

static void test_norms(void) {
    const int rows = 5, n = 67;
    const float eps = 1e-6f;
    float *x = randv(rows * n, 2.0f), *w = randv(n, 0.3f), *z = randv(rows * n, 1.5f);
    double *ref = dalloc(rows * n);
    for (int unit = 0; unit <= 1; unit++) {
        for (int r = 0; r < rows; r++) {
            double ss = 0;
            for (int j = 0; j < n; j++) ss += (double)x[r * n + j] * x[r * n + j];
            double inv = 1.0 / sqrt(ss / n + eps);
            for (int j = 0; j < n; j++) ref[r * n + j] = x[r * n + j] * inv * (unit ? 1.0 + w[j] : w[j]);
        }
        float *y = nanv(rows * n);
        cpu_rmsnorm(y, x, w, rows, n, eps, unit);
        double e = rel_l2(y, ref, rows * n);
        CHECK(e <= 1e-6, "rmsnorm unit_offset %d: rel err %.3g", unit, e);
        float *xi = copyv(x, rows * n); /* in place */
        cpu_rmsnorm(xi, xi, w, rows, n, eps, unit);
        CHECK(rel_l2f(xi, y, rows * n) == 0.0, "rmsnorm in place differs");
        free(y), free(xi);
    }
    /* gated: w (o / rms(o)) silu(z) */
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int j = 0; j < n; j++) ss += (double)x[r * n + j] * x[r * n + j];
        double inv = 1.0 / sqrt(ss / n + eps);
        for (int j = 0; j < n; j++) {
            double zz = z[r * n + j];
            ref[r * n + j] = w[j] * x[r * n + j] * inv * (zz / (1.0 + exp(-zz)));
        }
    }
    float *y = nanv(rows * n);
    cpu_gated_rmsnorm(y, x, z, w, rows, n, eps);
    double e = rel_l2(y, ref, rows * n);
    CHECK(e <= 1e-6, "gated rmsnorm: rel err %.3g", e);
    /* l2norm with scale */
    float *xl = copyv(x, rows * n);
    cpu_l2norm(xl, rows, n, 0.25f);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int j = 0; j < n; j++) ss += (double)x[r * n + j] * x[r * n + j];
        for (int j = 0; j < n; j++) ref[r * n + j] = x[r * n + j] / sqrt(ss + 1e-6) * 0.25;
    }
    e = rel_l2(xl, ref, rows * n);
    CHECK(e <= 1e-6, "l2norm: rel err %.3g", e);
    free(x), free(w), free(z), free(ref), free(y), free(xl);
}

static void test_rope(void) {
    const int T = 3, H = 3, hd = 20, R = 12, pos0 = 1000;
    const float theta = 1e7f;
    float inv[6];
    cpu_rope_inv_freq(inv, R, theta);
    int ok = 1;
    for (int i = 0; i < R / 2; i++) ok &= fabs(inv[i] - pow(1e7, -(2.0 * i) / R)) <= 1e-6 * inv[i];
    CHECK(ok, "rope inv_freq differs from theta^(-2i/R)");
    CHECK(inv[0] == 1.0f, "inv_freq[0] = %g", inv[0]);
    float *x = randv(T * H * hd, 1.0f), *y = copyv(x, T * H * hd);
    cpu_rope(y, T, H, hd, R, pos0, inv);
    double *ref = dalloc(T * H * hd);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *xh = x + (t * H + h) * hd;
            double *rh = ref + (t * H + h) * hd;
            for (int d = R; d < hd; d++) rh[d] = xh[d];
            for (int i = 0; i < R / 2; i++) {
                double phi = (double)(float)((float)(pos0 + t) * inv[i]);
                rh[i] = xh[i] * cos(phi) - xh[i + R / 2] * sin(phi);
                rh[i + R / 2] = xh[i + R / 2] * cos(phi) + xh[i] * sin(phi);
            }
        }
    double e = rel_l2(y, ref, T * H * hd);
    CHECK(e <= 1e-6, "rope: rel err %.3g", e);
    ok = 1;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = R; d < hd; d++) ok &= y[(t * H + h) * hd + d] == x[(t * H + h) * hd + d];
    CHECK(ok, "rope changed dims >= R");
    free(x), free(y), free(ref);
}

static void test_attention(void) {
    const int T = 4, pos0 = 6, Hq = 6, Hkv = 2, hd = 24, max_seq = 13, P = pos0 + T;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = randv(T * Hq * hd, 1.0f), *Kc = randv(Hkv * max_seq * hd, 1.0f), *Vc = randv(Hkv * max_seq * hd, 1.0f);
    for (int i = 0; i < Hkv; i++) /* positions >= P must not be read: poison them */
        for (int u = P; u < max_seq; u++)
            for (int d = 0; d < hd; d++) Kc[(i * max_seq + u) * hd + d] = Vc[(i * max_seq + u) * hd + d] = NAN;
    double *ref = dalloc(T * Hq * hd);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < Hq; j++) {
            const int kv = j / (Hq / Hkv), p = pos0 + t;
            double s[64], mx = -1e300, sum = 0;
            for (int u = 0; u <= p; u++) {
                double acc = 0;
                for (int d = 0; d < hd; d++) acc += (double)q[(t * Hq + j) * hd + d] * Kc[(kv * max_seq + u) * hd + d];
                s[u] = acc * scale;
                if (s[u] > mx) mx = s[u];
            }
            for (int u = 0; u <= p; u++) sum += (s[u] = exp(s[u] - mx));
            for (int d = 0; d < hd; d++) {
                double acc = 0;
                for (int u = 0; u <= p; u++) acc += s[u] / sum * Vc[(kv * max_seq + u) * hd + d];
                ref[(t * Hq + j) * hd + d] = acc;
            }
        }
    float *out = nanv(T * Hq * hd);
    cpu_attention(out, q, Kc, Vc, T, pos0, Hq, Hkv, hd, max_seq, scale);
    double e = rel_l2(out, ref, T * Hq * hd);
    CHECK(e <= 1e-6, "attention: rel err %.3g", e);
    free(q), free(Kc), free(Vc), free(ref), free(out);
}

static void test_conv_gates(void) {
    const int T = 9, ch = 70, K = 4;
    float *m = randv(T * ch, 1.0f), *w = randv(ch * K, 0.5f), *st0 = randv((K - 1) * ch, 1.0f);
    double *ref = dalloc(T * ch);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < ch; c++) {
            double s = 0;
            for (int j = 0; j < K; j++) {
                int u = t - (K - 1) + j;
                s += (double)w[c * K + j] * (u >= 0 ? m[u * ch + c] : st0[(K - 1 + u) * ch + c]);
            }
            ref[t * ch + c] = s / (1.0 + exp(-s));
        }
    float *st = copyv(st0, (K - 1) * ch), *out = nanv(T * ch);
    cpu_conv1d(out, st, m, w, T, ch, K);
    double e = rel_l2(out, ref, T * ch);
    CHECK(e <= 1e-6, "conv1d: rel err %.3g", e);
    int ok = 1;
    for (int i = 0; i < K - 1; i++)
        for (int c = 0; c < ch; c++) ok &= st[i * ch + c] == m[(T - (K - 1) + i) * ch + c];
    CHECK(ok, "conv1d: state is not the last K-1 input rows");
    /* T step calls (and a 2-token call, shorter than K-1) give the same output and state */
    float *st2 = copyv(st0, (K - 1) * ch), *out2 = nanv(T * ch);
    cpu_conv1d(out2, st2, m, w, 2, ch, K);
    for (int t = 2; t < T; t++) cpu_conv1d_step(out2 + t * ch, st2, m + t * ch, w, ch, K);
    CHECK(rel_l2f(out2, out, T * ch) <= 1e-7, "conv1d steps vs one call: %.3g", rel_l2f(out2, out, T * ch));
    CHECK(rel_l2f(st2, st, (K - 1) * ch) == 0.0, "conv1d state after steps differs");
    /* gates, including the softplus x > 20 branch */
    const int Hv = 5;
    float b[10], a[10], A_log[5], dtb[5], beta[10], g[10];
    for (int i = 0; i < 10; i++) b[i] = 3 * rng_normal(&rng), a[i] = 3 * rng_normal(&rng);
    for (int j = 0; j < Hv; j++) A_log[j] = rng_normal(&rng), dtb[j] = rng_normal(&rng);
    a[3] = 25.0f;
    cpu_deltanet_gates(beta, g, b, a, A_log, dtb, 2, Hv);
    ok = 1;
    for (int i = 0; i < 10; i++) {
        double x = (double)a[i] + dtb[i % Hv], sp = x > 20 ? x : log1p(exp(x));
        double rb = 1 / (1 + exp(-(double)b[i])), rg = -exp((double)A_log[i % Hv]) * sp;
        ok &= fabs(beta[i] - rb) <= 1e-6 && fabs(g[i] - rg) <= 1e-5 * fabs(rg) + 1e-7;
    }
    CHECK(ok, "deltanet gates differ from sigmoid / -exp(A_log) softplus");
    free(m), free(w), free(st0), free(ref), free(st), free(out), free(st2), free(out2);
}

/* ---- DeltaNet: chunked vs recurrence vs the closed form in double ---------------------- */

static void l2rows(float *x, int rows, int d, float scale) { cpu_l2norm(x, rows, d, scale); }

static void test_deltanet(void) {
    const int Hk = 2, Hv = 4, dk = 16, dv = 24;
    const int Ts[] = {1, 63, 64, 65, 130};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        for (int init = 0; init <= 1; init++) {
            const int T = Ts[ti];
            float *q = randv(T * Hk * dk, 1.0f), *k = randv(T * Hk * dk, 1.0f), *v = randv(T * Hv * dv, 1.0f);
            l2rows(q, T * Hk, dk, 1.0f / sqrtf((float)dk));
            l2rows(k, T * Hk, dk, 1.0f);
            float *g = malloc(T * Hv * sizeof(float)), *beta = malloc(T * Hv * sizeof(float));
            for (int i = 0; i < T * Hv; i++) {
                g[i] = -0.3f * rng_uniform(&rng) * (i % 7 == 0 ? 10.0f : 1.0f);
                beta[i] = rng_uniform(&rng);
            }
            const int64_t ns = (int64_t)Hv * dk * dv;
            float *S0 = init ? randv(ns, 0.5f) : calloc(ns, sizeof(float));
            /* recurrence */
            float *Sr = copyv(S0, ns), *orr = nanv(T * Hv * dv);
            for (int t = 0; t < T; t++)
                cpu_deltanet_step(orr + t * Hv * dv, Sr, q + t * Hk * dk, k + t * Hk * dk, v + t * Hv * dv,
                                  g + t * Hv, beta + t * Hv, Hk, Hv, dk, dv);
            /* chunked */
            float *Sc = copyv(S0, ns), *oc = nanv(T * Hv * dv);
            float *scr = malloc(cpu_deltanet_chunked_scratch(Hv, dk, dv) * sizeof(float));
            cpu_deltanet_chunked(oc, Sc, q, k, v, g, beta, T, Hk, Hv, dk, dv, scr);
            double eo = rel_l2f(oc, orr, T * Hv * dv), es = rel_l2f(Sc, Sr, ns);
            CHECK(eo <= 1e-5 && es <= 1e-5, "deltanet chunked vs recurrence T %d init %d: out %.3g state %.3g", T,
                  init, eo, es);
            /* closed form in double: S = e^g (I - beta k kᵀ) S + beta k vᵀ; o = Sᵀ q */
            double *S = dalloc(ns), *od = dalloc(T * Hv * dv);
            for (int64_t i = 0; i < ns; i++) S[i] = S0[i];
            for (int t = 0; t < T; t++)
                for (int j = 0; j < Hv; j++) {
                    const int n = j / (Hv / Hk);
                    const float *kt = k + (t * Hk + n) * dk, *qt = q + (t * Hk + n) * dk, *vt = v + (t * Hv + j) * dv;
                    const double b = beta[t * Hv + j], eg = exp((double)g[t * Hv + j]);
                    double *Sj = S + (int64_t)j * dk * dv;
                    for (int e = 0; e < dv; e++) {
                        double kS = 0;
                        for (int d = 0; d < dk; d++) kS += kt[d] * Sj[d * dv + e];
                        for (int d = 0; d < dk; d++) Sj[d * dv + e] = eg * (Sj[d * dv + e] - b * kt[d] * kS) + b * kt[d] * vt[e];
                        double o = 0;
                        for (int d = 0; d < dk; d++) o += Sj[d * dv + e] * qt[d];
                        od[(t * Hv + j) * dv + e] = o;
                    }
                }
            double ed = rel_l2(orr, od, T * Hv * dv), esd = rel_l2(Sr, S, ns);
            CHECK(ed <= 1e-5 && esd <= 1e-5, "deltanet recurrence vs closed form T %d init %d: out %.3g state %.3g",
                  T, init, ed, esd);
            if (T == 130 && init) printf("deltanet T 130: chunked vs recurrence out %.2e state %.2e; "
                                         "recurrence vs double %.2e\n", eo, es, ed);
            free(q), free(k), free(v), free(g), free(beta), free(S0), free(Sr), free(orr), free(Sc), free(oc);
            free(scr), free(S), free(od);
        }
    }
}

static void test_elementwise(void) {
    const int n = 77;
    float *a = randv(n, 2.0f), *b = randv(n, 2.0f), *y = nanv(n);
    cpu_silu_mul(y, a, b, n);
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= fabs(y[i] - a[i] / (1 + exp(-(double)a[i])) * b[i]) <= 1e-6 * (1 + fabs(y[i]));
    CHECK(ok, "silu_mul");
    float *c = copyv(a, n);
    cpu_sigmoid_mul(c, b, n);
    ok = 1;
    for (int i = 0; i < n; i++) ok &= fabs(c[i] - a[i] / (1 + exp(-(double)b[i]))) <= 1e-6 * (1 + fabs(c[i]));
    CHECK(ok, "sigmoid_mul");
    memcpy(c, a, n * sizeof(float));
    cpu_add(c, b, n);
    ok = 1;
    for (int i = 0; i < n; i++) ok &= c[i] == a[i] + b[i];
    CHECK(ok, "add");
    free(a), free(b), free(y), free(c);
}

/* ---- tiny hand-built models ---------------------------------------------------------- */

#define MAX_OWN 512
static void *own[MAX_OWN];
static int n_own;
static void *keep(void *p) {
    if (n_own < MAX_OWN) own[n_own++] = p;
    return p;
}

/* Tensor of rows x cols with values offset + scale * N(0,1), stored as dt. */
static Tensor mk(int64_t rows, int64_t cols, DType dt, float offset, float scale) {
    Tensor t;
    memset(&t, 0, sizeof t);
    float *f = randv(rows * cols, scale);
    for (int64_t i = 0; i < rows * cols; i++) f[i] += offset;
    t.name = "tiny";
    t.dtype = dt;
    t.ndim = cols > 1 ? 2 : 1;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.numel = rows * cols;
    t.data = keep(weights_of(f, rows * cols, dt));
    t.nbytes = (size_t)(rows * cols * (dt == DT_F32 ? 4 : 2));
    free(f);
    return t;
}

/* Qwen3.5-like (qwen35 = 1: layers lin, full, lin, lin, full; gated attention, partial RoPE,
 * Hv = 2 Hk, dk != dv) or Qwen3-like (qwen35 = 0: 3 full layers, plain norms, no gate). */
static void tiny_model(Model *m, int qwen35) {
    memset(m, 0, sizeof *m);
    Config *c = &m->config;
    c->family = qwen35 ? FAMILY_QWEN35 : FAMILY_QWEN3;
    c->hidden_size = 48;
    c->num_hidden_layers = qwen35 ? 5 : 3;
    c->intermediate_size = 40;
    c->rms_norm_eps = 1e-6f;
    c->vocab_size = 97;
    c->tie_word_embeddings = 1;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 2;
    c->head_dim = 16;
    c->attn_output_gate = qwen35;
    c->rope_theta = qwen35 ? 1e7f : 1e6f;
    c->partial_rotary_factor = qwen35 ? 0.5f : 1.0f;
    c->linear_num_key_heads = qwen35 ? 2 : 0;
    c->linear_num_value_heads = qwen35 ? 4 : 0;
    c->linear_key_head_dim = qwen35 ? 8 : 0;
    c->linear_value_head_dim = qwen35 ? 12 : 0;
    c->linear_conv_kernel_dim = qwen35 ? 4 : 0;
    c->max_position_embeddings = 4096;
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_types[l] = !qwen35 || l == 1 || l == 4 ? LAYER_FULL_ATTN : LAYER_LINEAR_ATTN;
    Err cerr = {0};
    const int crc = config_finish(c, "tiny model", &cerr); /* the derived sizes, as the loader computes them */
    CHECK(crc == 0, "tiny config: %s", cerr.msg);

    tiny_fill_weights(m, mk, keep, 0);
}

/* ---- naive double-precision decode, straight from MODEL.md §7 ---------------------------- */

typedef struct Ref {
    const Model *m;
    int max_seq;
    double *K[8], *V[8], *conv[8], *S[8];
} Ref;

static void dlinear(double *y, const Tensor *W, const double *x) {
    const int64_t rows = W->shape[0], cols = W->numel / rows;
    for (int64_t r = 0; r < rows; r++) {
        double acc = 0;
        for (int64_t i = 0; i < cols; i++) acc += wval(W->data, W->dtype, r * cols + i) * x[i];
        y[r] = acc;
    }
}
static void dnorm(double *y, const double *x, const Tensor *w, int n, double eps, int unit) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) {
        const double wi = wval(w->data, w->dtype, i);
        y[i] = x[i] * inv * (unit ? 1.0 + wi : wi);
    }
}
static double dsilu(double x) { return x / (1.0 + exp(-x)); }

static void ref_step(Ref *r, int tok, int p, double *logits) {
    const Model *m = r->m;
    const Config *c = &m->config;
    const int D = c->hidden_size, F = c->intermediate_size, unit = c->family == FAMILY_QWEN35;
    const int Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, hd = c->head_dim, R = c->rotary_dim;
    const int Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads, dk = c->linear_key_head_dim;
    const int dv = c->linear_value_head_dim, K = c->linear_conv_kernel_dim, cd = c->conv_dim;
    double x[64], h[64], a[64], big[256], q[128], k[64], v[64], gt[128], o[128], z[64], bb[8], aa[8];
    double gg[64], uu[64];
    for (int i = 0; i < D; i++) x[i] = wval(m->w.embed_tokens.data, m->w.embed_tokens.dtype, (int64_t)tok * D + i);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const LayerWeights *L = &m->w.layers[l];
        dnorm(h, x, &L->input_layernorm, D, c->rms_norm_eps, unit);
        if (L->type == LAYER_FULL_ATTN) {
            dlinear(big, &L->q_proj, h);
            for (int j = 0; j < Hq; j++)
                for (int e = 0; e < hd; e++) {
                    q[j * hd + e] = c->attn_output_gate ? big[j * 2 * hd + e] : big[j * hd + e];
                    gt[j * hd + e] = c->attn_output_gate ? big[j * 2 * hd + hd + e] : 0;
                }
            dlinear(k, &L->k_proj, h);
            dlinear(v, &L->v_proj, h);
            for (int j = 0; j < Hq; j++) dnorm(q + j * hd, q + j * hd, &L->q_norm, hd, c->rms_norm_eps, unit);
            for (int i = 0; i < Hkv; i++) dnorm(k + i * hd, k + i * hd, &L->k_norm, hd, c->rms_norm_eps, unit);
            for (int i = 0; i < R / 2; i++) {
                const double phi = (double)p * pow((double)c->rope_theta, -(2.0 * i) / R);
                for (int hh = 0; hh < Hq + Hkv; hh++) {
                    double *xh = hh < Hq ? q + hh * hd : k + (hh - Hq) * hd;
                    const double x0 = xh[i], x1 = xh[i + R / 2];
                    xh[i] = x0 * cos(phi) - x1 * sin(phi);
                    xh[i + R / 2] = x1 * cos(phi) + x0 * sin(phi);
                }
            }
            for (int i = 0; i < Hkv; i++)
                for (int e = 0; e < hd; e++) {
                    r->K[l][((int64_t)i * r->max_seq + p) * hd + e] = k[i * hd + e];
                    r->V[l][((int64_t)i * r->max_seq + p) * hd + e] = v[i * hd + e];
                }
            for (int j = 0; j < Hq; j++) {
                const int i = j / (Hq / Hkv);
                double *s = malloc((size_t)(p + 1) * sizeof(double)), mx = -1e300, sum = 0;
                for (int t = 0; t <= p; t++) {
                    double acc = 0;
                    for (int e = 0; e < hd; e++) acc += q[j * hd + e] * r->K[l][((int64_t)i * r->max_seq + t) * hd + e];
                    s[t] = acc / sqrt((double)hd);
                    mx = s[t] > mx ? s[t] : mx;
                }
                for (int t = 0; t <= p; t++) sum += (s[t] = exp(s[t] - mx));
                for (int e = 0; e < hd; e++) {
                    double acc = 0;
                    for (int t = 0; t <= p; t++) acc += s[t] / sum * r->V[l][((int64_t)i * r->max_seq + t) * hd + e];
                    o[j * hd + e] = c->attn_output_gate ? acc / (1.0 + exp(-gt[j * hd + e])) : acc;
                }
                free(s);
            }
            dlinear(a, &L->o_proj, o);
        } else {
            double cv[256];
            dlinear(big, &L->in_proj_qkv, h);
            dlinear(z, &L->in_proj_z, h);
            dlinear(bb, &L->in_proj_b, h);
            dlinear(aa, &L->in_proj_a, h);
            double *X = r->conv[l]; /* [K-1][cd], oldest first */
            for (int ch = 0; ch < cd; ch++) {
                double s = wval(L->conv1d.data, L->conv1d.dtype, (int64_t)ch * K + K - 1) * big[ch];
                for (int j = 0; j < K - 1; j++) s += wval(L->conv1d.data, L->conv1d.dtype, (int64_t)ch * K + j) * X[j * cd + ch];
                cv[ch] = dsilu(s);
                for (int j = 0; j < K - 2; j++) X[j * cd + ch] = X[(j + 1) * cd + ch];
                X[(K - 2) * cd + ch] = big[ch];
            }
            double *qq = cv, *kk = cv + c->key_dim, *vv = cv + 2 * c->key_dim;
            for (int n = 0; n < Hk; n++) {
                double sq = 0, sk = 0;
                for (int d = 0; d < dk; d++) sq += qq[n * dk + d] * qq[n * dk + d], sk += kk[n * dk + d] * kk[n * dk + d];
                for (int d = 0; d < dk; d++) {
                    qq[n * dk + d] /= sqrt(sq + 1e-6) * sqrt((double)dk);
                    kk[n * dk + d] /= sqrt(sk + 1e-6);
                }
            }
            for (int j = 0; j < Hv; j++) {
                const int n = j / (Hv / Hk);
                double *S = r->S[l] + (int64_t)j * dk * dv;
                const double beta = 1.0 / (1.0 + exp(-bb[j]));
                const double xa = aa[j] + wval(L->dt_bias.data, L->dt_bias.dtype, j);
                const double gj = -exp(wval(L->A_log.data, L->A_log.dtype, j)) * (xa > 20 ? xa : log1p(exp(xa)));
                for (int e = 0; e < dk * dv; e++) S[e] *= exp(gj);
                for (int e = 0; e < dv; e++) {
                    double mem = 0;
                    for (int d = 0; d < dk; d++) mem += S[d * dv + e] * kk[n * dk + d];
                    const double dl = beta * (vv[j * dv + e] - mem);
                    for (int d = 0; d < dk; d++) S[d * dv + e] += kk[n * dk + d] * dl;
                    double oo = 0;
                    for (int d = 0; d < dk; d++) oo += S[d * dv + e] * qq[n * dk + d];
                    o[j * dv + e] = oo;
                }
                double ss = 0;
                for (int e = 0; e < dv; e++) ss += o[j * dv + e] * o[j * dv + e];
                for (int e = 0; e < dv; e++)
                    o[j * dv + e] = wval(L->linear_norm.data, L->linear_norm.dtype, e) * o[j * dv + e] /
                                    sqrt(ss / dv + c->rms_norm_eps) * dsilu(z[j * dv + e]);
            }
            dlinear(a, &L->out_proj, o);
        }
        for (int i = 0; i < D; i++) x[i] += a[i];
        dnorm(h, x, &L->post_attention_layernorm, D, c->rms_norm_eps, unit);
        dlinear(gg, &L->gate_proj, h);
        dlinear(uu, &L->up_proj, h);
        for (int i = 0; i < F; i++) gg[i] = dsilu(gg[i]) * uu[i];
        dlinear(a, &L->down_proj, gg);
        for (int i = 0; i < D; i++) x[i] += a[i];
    }
    dnorm(h, x, &m->w.norm, D, c->rms_norm_eps, unit);
    dlinear(logits, &m->w.lm_head, h);
}

/* Logits of the naive reference for ids[0..n), [n][V]. */
static double *ref_logits(const Model *m, const int *ids, int n) {
    const Config *c = &m->config;
    Ref r = {.m = m, .max_seq = n};
    for (int l = 0; l < c->num_hidden_layers; l++) {
        r.K[l] = dalloc((int64_t)c->num_key_value_heads * n * c->head_dim);
        r.V[l] = dalloc((int64_t)c->num_key_value_heads * n * c->head_dim);
        r.conv[l] = dalloc((int64_t)(c->linear_conv_kernel_dim > 1 ? c->linear_conv_kernel_dim - 1 : 1) * c->conv_dim + 1);
        r.S[l] = dalloc((int64_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim + 1);
    }
    double *lg = dalloc((int64_t)n * c->vocab_size);
    for (int t = 0; t < n; t++) ref_step(&r, ids[t], t, lg + (int64_t)t * c->vocab_size);
    for (int l = 0; l < c->num_hidden_layers; l++) free(r.K[l]), free(r.V[l]), free(r.conv[l]), free(r.S[l]);
    return lg;
}

/* Error of logits [n][V] against a reference: the relative L2 over all positions (agg) and
 * the largest relative L2 of one position (max). Random tiny models have ill-conditioned
 * spots (a DeltaNet head output that is nearly cancelled, then rescaled by the gated norm)
 * where one position's fp32 roundoff grows to ~1e-4 (seen: 6e-5); the aggregate stays below ~5e-6. */
typedef struct LErr { double agg, max; } LErr;
static LErr logits_err(const float *a, const double *refd, const float *reff, int n, int V) {
    LErr e = {0, 0};
    double num = 0, den = 0;
    for (int t = 0; t < n; t++) {
        double rn = 0, rd = 0;
        for (int i = 0; i < V; i++) {
            const int64_t k = (int64_t)t * V + i;
            const double r = refd ? refd[k] : reff[k], d = (double)a[k] - r;
            rn += d * d, rd += r * r;
        }
        const double et = sqrt(rn / (rd > 0 ? rd : 1e-300));
        if (!(et <= e.max)) e.max = et; /* NaN sticks */
        num += rn, den += rd;
    }
    e.agg = sqrt(num / (den > 0 ? den : 1e-300));
    if (e.max != e.max) e.agg = e.max;
    return e;
}
#define LERR_OK(e) ((e).agg <= 3e-5 && (e).max <= 1e-3)

static void test_model(int qwen35, int n) {
    Model m;
    tiny_model(&m, qwen35);
    const int V = m.config.vocab_size;
    const char *name = qwen35 ? "tiny qwen3.5" : "tiny qwen3";
    int *ids = malloc((size_t)n * sizeof(int));
    for (int t = 0; t < n; t++) ids[t] = (int)(rng_u64(&rng) % (uint64_t)V);
    double *ref = ref_logits(&m, ids, n);
    BackendOptions bo = {.max_seq = n + 8, .threads = 0};
    void *ctx = NULL;
    Err err = {0};
    int rc = cpu_backend.open(&ctx, &m, &bo, &err);
    CHECK(rc == 0, "%s: open: %s", name, err.msg);
    if (rc) return;
    float *pre = nanv((int64_t)n * V), *dec = nanv((int64_t)n * V), *spl = nanv((int64_t)n * V);
    /* prefill, all logits, one call */
    rc = cpu_backend.forward(ctx, ids, n, 0, 1, pre, &err);
    CHECK(rc == 0, "%s: prefill: %s", name, err.msg);
    LErr e_pre = logits_err(pre, ref, NULL, n, V);
    /* decode, one token per call */
    cpu_backend.reset(ctx, &err);
    for (int t = 0; t < n && rc == 0; t++) rc = cpu_backend.forward(ctx, ids + t, 1, t, 1, dec + (int64_t)t * V, &err);
    CHECK(rc == 0, "%s: decode: %s", name, err.msg);
    LErr e_dec = logits_err(dec, ref, NULL, n, V), e_pd = logits_err(dec, NULL, pre, n, V);
    /* prefill split in two calls (the second continues the first's state) */
    const int h = n / 2 - 3;
    cpu_backend.reset(ctx, &err);
    rc = cpu_backend.forward(ctx, ids, h, 0, 1, spl, &err);
    if (rc == 0) rc = cpu_backend.forward(ctx, ids + h, n - h, h, 1, spl + (int64_t)h * V, &err);
    CHECK(rc == 0, "%s: split prefill: %s", name, err.msg);
    LErr e_split = logits_err(spl, NULL, pre, n, V);
    /* prefill of a prefix, then decode of the rest; the last call with last-row logits only */
    float *mix = nanv((int64_t)n * V), *last = nanv(V);
    cpu_backend.reset(ctx, &err);
    rc = cpu_backend.forward(ctx, ids, h, 0, 1, mix, &err);
    for (int t = h; t < n - 1 && rc == 0; t++) rc = cpu_backend.forward(ctx, ids + t, 1, t, 1, mix + (int64_t)t * V, &err);
    CHECK(rc == 0, "%s: prefill + decode: %s", name, err.msg);
    LErr e_mix = logits_err(mix, NULL, pre, n - 1, V);
    rc = cpu_backend.forward(ctx, ids + n - 1, 1, n - 1, 0, last, &err);
    double e_last = rel_l2f(last, pre + (int64_t)(n - 1) * V, V);
    /* last-row-only prefill equals the last row of all logits */
    float *last2 = nanv(V);
    cpu_backend.reset(ctx, &err);
    rc = cpu_backend.forward(ctx, ids, n, 0, 0, last2, &err);
    double e_last2 = rel_l2f(last2, pre + (int64_t)(n - 1) * V, V);
    printf("%s (%d tokens, %d layers): logits rel L2 all / worst position: prefill vs double %.1e / %.1e, "
           "decode vs double %.1e / %.1e, decode vs prefill %.1e / %.1e, split %.1e / %.1e, prefill+decode "
           "%.1e / %.1e\n",
           name, n, m.config.num_hidden_layers, e_pre.agg, e_pre.max, e_dec.agg, e_dec.max, e_pd.agg, e_pd.max,
           e_split.agg, e_split.max, e_mix.agg, e_mix.max);
    CHECK(LERR_OK(e_pre), "%s: prefill vs double reference %.3g / %.3g", name, e_pre.agg, e_pre.max);
    CHECK(LERR_OK(e_dec), "%s: decode vs double reference %.3g / %.3g", name, e_dec.agg, e_dec.max);
    CHECK(LERR_OK(e_pd), "%s: decode vs prefill %.3g / %.3g", name, e_pd.agg, e_pd.max);
    CHECK(LERR_OK(e_split), "%s: split prefill vs one call %.3g / %.3g", name, e_split.agg, e_split.max);
    CHECK(LERR_OK(e_mix) && e_last <= 1e-4, "%s: prefill + decode vs prefill %.3g / %.3g, last %.3g", name,
          e_mix.agg, e_mix.max, e_last);
    CHECK(e_last2 <= 1e-4, "%s: last-row prefill vs all logits %.3g", name, e_last2);
    /* bad calls: context, token ids, position; none may disturb the sequence */
    int bad = -1;
    rc = cpu_backend.forward(ctx, ids, 9, n, 0, last, &err);
    CHECK(rc == Q35_ERR_CONTEXT, "%s: pos+n > max_seq gave %d", name, rc);
    rc = cpu_backend.forward(ctx, &bad, 1, n, 0, last, &err);
    CHECK(rc == Q35_ERR_ARG, "%s: token -1 gave %d", name, rc);
    bad = V;
    rc = cpu_backend.forward(ctx, &bad, 1, n, 0, last, &err);
    CHECK(rc == Q35_ERR_ARG, "%s: token V gave %d (%s)", name, rc, err.msg);
    rc = cpu_backend.forward(ctx, ids, 1, n - 1, 0, last, &err);
    CHECK(rc == Q35_ERR_ARG, "%s: pos behind the sequence gave %d", name, rc);
    rc = cpu_backend.forward(ctx, ids, 0, n, 0, last, &err);
    CHECK(rc == Q35_ERR_ARG, "%s: n = 0 gave %d", name, rc);
    cpu_backend.close(ctx);
    /* open refuses a missing or mis-shaped weight */
    LayerWeights *L1 = &m.w.layers[1];
    const void *saved = L1->o_proj.data;
    L1->o_proj.data = NULL;
    rc = cpu_backend.open(&ctx, &m, &bo, &err);
    CHECK(rc == Q35_ERR_FORMAT, "%s: missing o_proj gave %d", name, rc);
    L1->o_proj.data = saved;
    L1->o_proj.shape[0]--, L1->o_proj.numel -= L1->o_proj.shape[1];
    rc = cpu_backend.open(&ctx, &m, &bo, &err);
    CHECK(rc == Q35_ERR_FORMAT, "%s: short o_proj gave %d (%s)", name, rc, err.msg);
    free(ids), free(ref), free(pre), free(dec), free(spl), free(mix), free(last), free(last2);
    while (n_own > 0) free(own[--n_own]);
}

static void test_models(void) {
    test_model(1, 300); /* > CPU_TB: two passes in one call */
    test_model(0, 40);
}


int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    printf("test_cpu_ops: seed %llu (replay: test_cpu_ops %llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    rng_seed(&rng, seed);
    double t0 = now_s();
    test_matmul();
    test_norms();
    test_rope();
    test_attention();
    test_conv_gates();
    test_elementwise();
    test_deltanet();
    double t1 = now_s();
    test_models();
    printf("test_cpu_ops: ops %.2f s, models %.2f s\n", t1 - t0, now_s() - t1);
    return TEST_SUMMARY("cpu_ops");
}
