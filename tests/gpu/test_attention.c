/* test_attention.c — cuda_attn_decode (src/cuda/attention.cu) against two CPU references on fresh random
 * inputs and a randomly pre-filled KV cache:
 *   ref32: src/cpu/ops.h (cpu_rmsnorm, cpu_rope, cpu_attention, cpu_sigmoid_mul; no bf16 rounding) -> loose
 *   refbf: the same with HF's bf16 roundings (head norm, cos/sin, each RoPE op, K in the cache, output,
 *          sigmoid gate and product) -> tight
 * Checked per step: out and q_out (NaN-poisoned, workspace too), K/V[pos] and every other cache row
 * (must be untouched, bit-exact). Shapes: Qwen3.5 (gated, zero-centred norms, hd 256, R 64), Qwen3 (plain
 * norms, hd 128, full RoPE, no gate), the golden fixtures (hd 32, R 8/16/32), hd 64, G = 1, 3, 6, 8, 16;
 * kv_len = 1, chunk edges, kv_len not a multiple of the chunk, consecutive positions, the last position of
 * max_seq, one cluster (no cross-cluster merge) and many (the last-arriver merge), 16k context. The
 * workspace is 0xff-poisoned before every call (the merge's ticket counters must cope). Prints timings of the Qwen3.5
 * and Qwen3 shapes at several contexts (graphs over enough caches that L2 cannot hold them). Usage:
 * test_attention [seed] [--no-timing]. Without a GPU only the two CPU references are cross-checked.
 * Where cuda_attn_short serves the step (hd 64/128/256, kv_len <= 256): attention + o_proj in one kernel at the
 * same step, y against W_o times cuda_attn_decode's output and times refbf (check_short). Every step again with
 * kv_e4m3 (a lone served sequence over fp8 KV pools): K/V[pos] must be the e4m3 values of the bf16 step's rows, bit
 * for bit, and out must match refbf over those rows (check_e4m3). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/ops.h"
#include "cuda/ops.h"
#include "test.h"
#include "util.h"
#include "gpu_common.h"

static Rng rng;
static int have_gpu;
static cudaStream_t stream; /* a blocking stream: cudaMemcpy on the legacy stream orders after it */

static float *falloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static float rbf(float x) { return round_bf16(x); }

static double rel_max(const float *a, const float *ref, int64_t n) {
    double m = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - ref[i]);
        if (d != d) return NAN;
        m = d > m ? d : m;
        r = fabs(ref[i]) > r ? fabs(ref[i]) : r;
    }
    return m / (r > 0 ? r : 1e-300);
}

typedef struct AtCase {
    const char *name;
    int Hq, Hkv, hd, R, max_seq, gated, norm_mode;
    float theta;
    int n_pos, pos[10];
} AtCase;

/* refbf head norm + RoPE of one head x[hd] -> y[hd] (MODEL.md §3.1, §3.2 steps 2-3, §5). */
static void norm_rope_bf(float *y, const float *x, const float *w, const AtCase *c, int pos, const float *inv_freq,
                         float eps) {
    double ss = 0;
    for (int d = 0; d < c->hd; d++) ss += (double)x[d] * x[d];
    const float r = 1.0f / sqrtf((float)(ss / c->hd) + eps);
    for (int d = 0; d < c->hd; d++)
        y[d] = c->norm_mode == NORM_ZC ? rbf(x[d] * r * (1.0f + w[d])) : rbf(w[d] * rbf(x[d] * r));
    const int half = c->R / 2;
    for (int i = 0; i < half; i++) {
        const float phi = (float)pos * inv_freq[i];
        const float cs = rbf((float)cos((double)phi)), sn = rbf((float)sin((double)phi));
        const float a = y[i], b = y[i + half];
        y[i] = rbf(rbf(a * cs) - rbf(b * sn));
        y[i + half] = rbf(rbf(b * cs) + rbf(a * sn));
    }
}

/* cuda_attn_short (attention + o_proj in one kernel) at this step, after cuda_attn_decode ran it: y (zeroed,
 * += W_o o) against W_o times cuda_attn_decode's output (tight: the two differ only where a bf16 rounding of o
 * flips) and times refbf (CPU); q_out, the zeroed range, and the cache (K/V[pos] bitwise as cuda_attn_decode
 * wrote them, every other row untouched). W_o: fresh N(0, 1/sqrt(Hq hd)) bf16, D = SH_D rows. */
#define SH_D 516
static void check_short(const AtCase *c, int pos, int max_len, float *d_qkv, float *d_qw, float *d_kw, float *d_if,
                        uint16_t *d_K, uint16_t *d_V, StepParams *d_step, const float *out_gpu, const float *obf,
                        const float *qout_gpu, const uint16_t *Kh, const uint16_t *Vh, int e4m3) {
    const int hd = c->hd, n_in = c->Hq * hd, D = SH_D, n_zero = 700;
    const int64_t n_cache = (int64_t)c->Hkv * c->max_seq * hd;
    uint16_t *w = malloc((size_t)D * n_in * 2), *Kg = malloc((size_t)n_cache * 2), *Vg = malloc((size_t)n_cache * 2);
    float *wf = falloc((int64_t)D * n_in), *y = falloc(D), *yr = falloc(D), *yb = falloc(D), *zg = falloc(n_zero);
    float *q = falloc(n_in);
    float *d_y = NULL, *d_z = NULL, *d_q = NULL;
    uint16_t *d_w = NULL;
    for (int64_t i = 0; i < (int64_t)D * n_in; i++) {
        wf[i] = bf_normal(&rng, 1.0f / sqrtf((float)n_in));
        w[i] = f32_to_bf16(wf[i]);
    }
    for (int r = 0; r < D; r++) {
        double a = 0, b = 0;
        for (int i = 0; i < n_in; i++) a += (double)wf[(int64_t)r * n_in + i] * out_gpu[i];
        for (int i = 0; i < n_in; i++) b += (double)wf[(int64_t)r * n_in + i] * obf[i];
        yr[r] = (float)a, yb[r] = (float)b;
    }
    CU(cudaMalloc((void **)&d_w, (size_t)D * n_in * 2));
    CU(cudaMalloc((void **)&d_y, (size_t)D * 4));
    CU(cudaMalloc((void **)&d_z, (size_t)n_zero * 4));
    CU(cudaMalloc((void **)&d_q, (size_t)n_in * 4));
    CU(cudaMemcpy(d_w, w, (size_t)D * n_in * 2, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_y, 0, (size_t)D * 4));
    CU(cudaMemset(d_z, 0xff, (size_t)n_zero * 4));
    CU(cudaMemset(d_q, 0xff, (size_t)n_in * 4));
    AttnShortParams p;
    memset(&p, 0, sizeof p);
    AttnDecodeParams a = {d_qkv, d_qw,   d_kw, d_if, d_K,        d_V,      NULL,         NULL,  d_q, d_step,
                          c->Hq, c->Hkv, hd,   c->R, c->max_seq, c->gated, c->norm_mode, 1e-6f, e4m3};
    p.a = a, p.w_o = d_w, p.y = d_y, p.zero = d_z, p.n_zero = n_zero, p.D = D, p.max_len = max_len;
    CudaLaunch l = {stream, pos & 1, NULL, 0};
    int rc = cuda_attn_short(&p, &l);
    CHECK(rc == 0, "%s pos %d short: launch -> %d (%s)", c->name, pos, rc, cudaGetErrorString((cudaError_t)rc));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(y, d_y, (size_t)D * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(zg, d_z, (size_t)n_zero * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(q, d_q, (size_t)n_in * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(Kg, d_K, (size_t)n_cache * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(Vg, d_V, (size_t)n_cache * 2, cudaMemcpyDeviceToHost));
    {
        const double ty = rel_l2(y, yr, D), my = rel_max(y, yr, D), by = rel_l2(y, yb, D);
        int nz = 0;
        for (int i = 0; i < n_zero; i++) nz += zg[i] != 0.0f;
        CHECK(ty <= 2e-3 && my <= 1e-2, "%s pos %d short: y vs W_o out (cluster kernel) rel_l2 %.2e rel_max %.2e",
              c->name, pos, ty, my);
        CHECK(by <= 5e-3, "%s pos %d short: y vs W_o refbf rel_l2 %.2e", c->name, pos, by);
        CHECK(nz == 0, "%s pos %d short: %d of %d floats not zeroed", c->name, pos, nz, n_zero);
        CHECK(memcmp(Kg, Kh, (size_t)n_cache * 2) == 0, "%s pos %d short: K cache differs from cuda_attn_decode's",
              c->name, pos);
        CHECK(memcmp(Vg, Vh, (size_t)n_cache * 2) == 0, "%s pos %d short: V cache differs from cuda_attn_decode's",
              c->name, pos);
        CHECK(memcmp(q, qout_gpu, (size_t)n_in * 4) == 0, "%s pos %d short: q_out differs from cuda_attn_decode's",
              c->name, pos);
        printf("   pos %5d short%s (attention + o_proj, D %d, max_len %d): y vs W_o out %.1e (max %.1e), vs W_o "
               "refbf %.1e\n",
               pos, e4m3 ? " e4m3" : "", D, max_len, ty, my, by);
    }
done:
    cudaFree(d_w), cudaFree(d_y), cudaFree(d_z), cudaFree(d_q);
    free(w), free(Kg), free(Vg), free(wf), free(y), free(yr), free(yb), free(zg), free(q);
}

/* refbf's output from q, K and V (bf16 values) and the gate: out = bf16(attention), then the gated product. */
static void ref_out(const AtCase *c, int pos, const float *qbf, const float *Kbf, const float *V, const float *gate,
                    float *obf) {
    const int n_out = c->Hq * c->hd;
    cpu_attention(obf, qbf, Kbf, V, 1, pos, c->Hq, c->Hkv, c->hd, c->max_seq, 1.0f / sqrtf((float)c->hd));
    for (int i = 0; i < n_out; i++) {
        obf[i] = rbf(obf[i]);
        if (c->gated) obf[i] = rbf(obf[i] * rbf(1.0f / (1.0f + expf(-gate[i]))));
    }
}

static uint16_t e4m3_bits(uint16_t b) { return f32_to_bf16(fp8_e4m3_to_f32(f32_to_fp8_e4m3(bf16_to_f32(b)))); }

/* A case's device buffers (run_case) */
typedef struct AtDev {
    float *qkv, *qw, *kw, *inv_freq, *out, *work, *qout;
    uint16_t *K, *V;
    StepParams *step;
} AtDev;

/* cuda_attn_decode at the uploaded step, out / q_out / work poisoned first (kv_e4m3 as given); out, q_out and both
 * caches copied back into out, qout, Kg, Vg. Returns 0, or -1 after a failed check. */
static int decode_at(const AtCase *c, int pos, int pdl, float eps, int e4m3, const AtDev *d, float *out, float *qout,
                     uint16_t *Kg, uint16_t *Vg) {
    const int n_out = c->Hq * c->hd;
    const size_t cache_b = (size_t)c->Hkv * c->max_seq * c->hd * 2;
    CU(cudaMemset(d->out, 0xff, (size_t)n_out * 4));
    CU(cudaMemset(d->qout, 0xff, (size_t)n_out * 4));
    CU(cudaMemset(d->work, 0xff, cuda_attn_decode_work_bytes(c->Hq, c->Hkv, c->hd, c->max_seq)));
    AttnDecodeParams p = {d->qkv,     d->qw,    d->kw,        d->inv_freq, d->K,   d->V,  d->out,
                          d->work,    d->qout,  d->step,      c->Hq,       c->Hkv, c->hd, c->R,
                          c->max_seq, c->gated, c->norm_mode, eps,         e4m3};
    CudaLaunch l = {stream, pdl, NULL, 0};
    const int rc = cuda_attn_decode(&p, &l);
    CHECK(rc == 0, "%s pos %d%s: launch -> %d (%s)", c->name, pos, e4m3 ? " e4m3" : "", rc,
          cudaGetErrorString((cudaError_t)rc));
    if (rc) return -1;
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(out, d->out, (size_t)n_out * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(qout, d->qout, (size_t)n_out * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(Kg, d->K, cache_b, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(Vg, d->V, cache_b, cudaMemcpyDeviceToHost));
    return 0;
done:
    return -1;
}

/* The step at pos again with kv_e4m3, on the caches Kh / Vh as the bf16 step left them (its rows at pos included):
 * every cache row bitwise Kh / Vh but the rows at pos, which must be the e4m3 values of theirs; out against refbf
 * over those rows (Kbf / V with the rows at pos rounded); then the short kernel the same way. The device caches are
 * given back as Kh / Vh. */
static void check_e4m3(const AtCase *c, int pos, int max_len, const AtDev *d, const float *qbf, float *Kbf, float *V,
                       const float *gate, const uint16_t *Kh, const uint16_t *Vh) {
    const int hd = c->hd, n_out = c->Hq * hd;
    const int64_t n_cache = (int64_t)c->Hkv * c->max_seq * hd;
    uint16_t *Ke = malloc((size_t)n_cache * 2), *Ve = malloc((size_t)n_cache * 2);
    uint16_t *Kg = malloc((size_t)n_cache * 2), *Vg = malloc((size_t)n_cache * 2);
    float *out = falloc(n_out), *qout = falloc(n_out), *obf = falloc(n_out), *keep = falloc(2 * (int64_t)hd * c->Hkv);
    memcpy(Ke, Kh, (size_t)n_cache * 2), memcpy(Ve, Vh, (size_t)n_cache * 2);
    int n_round = 0; /* values the rounding changed: without any, a plain bf16 store would pass the checks below */
    for (int h = 0; h < c->Hkv; h++) { /* the rounded rows, into the reference too (kept, given back below) */
        const int64_t at = ((int64_t)h * c->max_seq + pos) * hd;
        for (int e = 0; e < hd; e++) {
            Ke[at + e] = e4m3_bits(Kh[at + e]), Ve[at + e] = e4m3_bits(Vh[at + e]);
            n_round += Ke[at + e] != Kh[at + e] || Ve[at + e] != Vh[at + e];
            keep[2 * h * hd + e] = Kbf[at + e], keep[(2 * h + 1) * hd + e] = V[at + e];
            Kbf[at + e] = bf16_to_f32(Ke[at + e]), V[at + e] = bf16_to_f32(Ve[at + e]);
        }
    }
    CHECK(n_round > 0, "%s pos %d e4m3: no K/V value at pos needs rounding", c->name, pos);
    ref_out(c, pos, qbf, Kbf, V, gate, obf);
    if (decode_at(c, pos, pos & 1, 1e-6f, 1, d, out, qout, Kg, Vg)) goto done;
    {
        const double to = rel_l2(out, obf, n_out), mo = rel_max(out, obf, n_out);
        CHECK(to <= 5e-3 && mo <= 3e-2, "%s pos %d e4m3: out vs refbf rel_l2 %.2e rel_max %.2e", c->name, pos, to, mo);
        CHECK(memcmp(Kg, Ke, (size_t)n_cache * 2) == 0, "%s pos %d e4m3: K cache is not the bf16 step's, rounded",
              c->name, pos);
        CHECK(memcmp(Vg, Ve, (size_t)n_cache * 2) == 0, "%s pos %d e4m3: V cache is not the bf16 step's, rounded",
              c->name, pos);
        printf("   pos %5d e4m3: out rel_l2 vs refbf %.1e (max %.1e), K/V[pos] the e4m3 values of the bf16 step's\n",
               pos, to, mo);
    }
    if (pos < max_len)
        check_short(c, pos, max_len, d->qkv, d->qw, d->kw, d->inv_freq, d->K, d->V, d->step, out, obf, qout, Ke, Ve, 1);
done:
    for (int h = 0; h < c->Hkv; h++) {
        const int64_t at = ((int64_t)h * c->max_seq + pos) * hd;
        for (int e = 0; e < hd; e++) Kbf[at + e] = keep[2 * h * hd + e], V[at + e] = keep[(2 * h + 1) * hd + e];
    }
    if (have_gpu) {
        cudaMemcpy(d->K, Kh, (size_t)n_cache * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(d->V, Vh, (size_t)n_cache * 2, cudaMemcpyHostToDevice);
    }
    free(Ke), free(Ve), free(Kg), free(Vg), free(out), free(qout), free(obf), free(keep);
}

static void run_case(const AtCase *c) {
    const int hd = c->hd, G = c->Hq / c->Hkv, qs = c->gated ? 2 * hd : hd, q_rows = c->Hq * qs;
    const int n_qkv = q_rows + 2 * c->Hkv * hd, n_out = c->Hq * hd;
    const int64_t n_cache = (int64_t)c->Hkv * c->max_seq * hd;
    const float eps = 1e-6f, scale = 1.0f / sqrtf((float)hd);
    const size_t work_b = cuda_attn_decode_work_bytes(c->Hq, c->Hkv, hd, c->max_seq);
    printf("-- %s: Hq %d Hkv %d hd %d R %d max_seq %d %s %s, n_split %d\n", c->name, c->Hq, c->Hkv, hd, c->R,
           c->max_seq, c->gated ? "gated" : "no gate", c->norm_mode == NORM_ZC ? "zc-norm" : "plain-norm",
           cuda_attn_decode_splits(c->Hkv, c->max_seq));
    (void)G;
    const int cap = cuda_attn_short_cap(hd, SH_D), max_len = cap < c->max_seq ? cap : c->max_seq;

    float *qw = falloc(hd), *kw = falloc(hd), *inv_freq = falloc(c->R / 2), *qkv = falloc(n_qkv);
    float *Kbf = falloc(n_cache), *K32 = falloc(n_cache), *V = falloc(n_cache);
    float *qbf = falloc(n_out), *q32 = falloc(n_out), *obf = falloc(n_out), *o32 = falloc(n_out), *gate = falloc(n_out);
    float *out_gpu = falloc(n_out), *qout_gpu = falloc(n_out), *row = falloc(hd);
    uint16_t *Kh = malloc((size_t)n_cache * 2), *Vh = malloc((size_t)n_cache * 2);
    uint16_t *Kg = malloc((size_t)n_cache * 2), *Vg = malloc((size_t)n_cache * 2);
    float *d_qkv = NULL, *d_qw = NULL, *d_kw = NULL, *d_if = NULL, *d_out = NULL, *d_work = NULL, *d_qout = NULL;
    uint16_t *d_K = NULL, *d_V = NULL;
    StepParams *d_step = NULL;

    for (int d = 0; d < hd; d++) {
        qw[d] = c->norm_mode == NORM_ZC ? bf_normal(&rng, 0.2f) : rbf(1.0f + 0.2f * rng_normal(&rng));
        kw[d] = c->norm_mode == NORM_ZC ? bf_normal(&rng, 0.2f) : rbf(1.0f + 0.2f * rng_normal(&rng));
    }
    cpu_rope_inv_freq(inv_freq, c->R, c->theta);
    /* Cache rows of "earlier tokens": keys look like normed heads (rms ~1), values ~N(0,1). */
    for (int64_t i = 0; i < n_cache; i++) {
        Kbf[i] = K32[i] = bf_normal(&rng, 1.0f), V[i] = bf_normal(&rng, 1.0f);
        Kh[i] = f32_to_bf16(Kbf[i]), Vh[i] = f32_to_bf16(V[i]);
    }
    if (!have_gpu) goto cpu_only;
    CU(cudaMalloc((void **)&d_qkv, (size_t)n_qkv * 4));
    CU(cudaMalloc((void **)&d_qw, (size_t)hd * 4));
    CU(cudaMalloc((void **)&d_kw, (size_t)hd * 4));
    CU(cudaMalloc((void **)&d_if, (size_t)c->R / 2 * 4));
    CU(cudaMalloc((void **)&d_out, (size_t)n_out * 4));
    CU(cudaMalloc((void **)&d_qout, (size_t)n_out * 4));
    CU(cudaMalloc((void **)&d_work, work_b));
    CU(cudaMalloc((void **)&d_K, (size_t)n_cache * 2));
    CU(cudaMalloc((void **)&d_V, (size_t)n_cache * 2));
    CU(cudaMalloc((void **)&d_step, sizeof(StepParams)));
    CU(cudaMemcpy(d_qw, qw, (size_t)hd * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_kw, kw, (size_t)hd * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_if, inv_freq, (size_t)c->R / 2 * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_K, Kh, (size_t)n_cache * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_V, Vh, (size_t)n_cache * 2, cudaMemcpyHostToDevice));

cpu_only:
    for (int t = 0; t < c->n_pos; t++) {
        const int pos = c->pos[t];
        for (int i = 0; i < n_qkv; i++) qkv[i] = bf_normal(&rng, 1.0f);
        /* refbf */
        for (int j = 0; j < c->Hq; j++) {
            norm_rope_bf(qbf + (int64_t)j * hd, qkv + (int64_t)j * qs, qw, c, pos, inv_freq, eps);
            memcpy(q32 + (int64_t)j * hd, qkv + (int64_t)j * qs, (size_t)hd * 4);
            if (c->gated) memcpy(gate + (int64_t)j * hd, qkv + (int64_t)j * qs + hd, (size_t)hd * 4);
        }
        for (int h = 0; h < c->Hkv; h++) {
            const int64_t at = ((int64_t)h * c->max_seq + pos) * hd;
            norm_rope_bf(Kbf + at, qkv + q_rows + (int64_t)h * hd, kw, c, pos, inv_freq, eps);
            memcpy(K32 + at, qkv + q_rows + (int64_t)h * hd, (size_t)hd * 4);
            cpu_rmsnorm(K32 + at, K32 + at, kw, 1, hd, eps, c->norm_mode == NORM_ZC);
            cpu_rope(K32 + at, 1, 1, hd, c->R, pos, inv_freq);
            memcpy(V + at, qkv + q_rows + (int64_t)(c->Hkv + h) * hd, (size_t)hd * 4);
        }
        ref_out(c, pos, qbf, Kbf, V, gate, obf);
        /* ref32 */
        cpu_rmsnorm(q32, q32, qw, c->Hq, hd, eps, c->norm_mode == NORM_ZC);
        cpu_rope(q32, 1, c->Hq, hd, c->R, pos, inv_freq);
        cpu_attention(o32, q32, K32, V, 1, pos, c->Hq, c->Hkv, hd, c->max_seq, scale);
        if (c->gated) cpu_sigmoid_mul(o32, gate, n_out);
        const double rr = rel_l2(obf, o32, n_out);
        CHECK(rr <= 3e-2, "%s pos %d: refbf vs ref32 %.2e", c->name, pos, rr);
        if (!have_gpu) {
            if (t == c->n_pos - 1) printf("   refbf vs ref32 at pos %d: out rel_l2 %.1e\n", pos, rr);
            continue;
        }

        StepParams sp;
        memset(&sp, 0, sizeof sp);
        sp.pos = pos;
        CU(cudaMemcpy(d_step, &sp, sizeof sp, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(d_qkv, qkv, (size_t)n_qkv * 4, cudaMemcpyHostToDevice));
        const AtDev dv = {d_qkv, d_qw, d_kw, d_if, d_out, d_work, d_qout, d_K, d_V, d_step};
        if (decode_at(c, pos, t & 1, eps, 0, &dv, out_gpu, qout_gpu, Kg, Vg)) goto done;

        const double to = rel_l2(out_gpu, obf, n_out), mo = rel_max(out_gpu, obf, n_out);
        const double lo = rel_l2(out_gpu, o32, n_out), tq = rel_l2(qout_gpu, qbf, n_out);
        const double mq = rel_max(qout_gpu, qbf, n_out);
        CHECK(to <= 5e-3 && mo <= 3e-2, "%s pos %d: out vs refbf rel_l2 %.2e rel_max %.2e", c->name, pos, to, mo);
        CHECK(lo <= 3e-2, "%s pos %d: out vs ref32 rel_l2 %.2e", c->name, pos, lo);
        CHECK(tq <= 2e-3 && mq <= 1e-2, "%s pos %d: q_out vs refbf rel_l2 %.2e rel_max %.2e", c->name, pos, tq, mq);
        /* The new rows: K close to refbf (it is the same bf16 computation), V exactly bf16(v). Then every
         * other row must be untouched; adopt the GPU's K row so later steps compare rows bit-exactly. */
        for (int h = 0; h < c->Hkv; h++) {
            const int64_t at = ((int64_t)h * c->max_seq + pos) * hd;
            for (int d = 0; d < hd; d++) row[d] = bf16_to_f32(Kg[at + d]);
            const double tk = rel_l2(row, Kbf + at, hd);
            CHECK(tk <= 2e-3, "%s pos %d: K[%d][pos] vs refbf rel_l2 %.2e", c->name, pos, h, tk);
            for (int d = 0; d < hd; d++) Vh[at + d] = f32_to_bf16(V[at + d]);
            memcpy(Kh + at, Kg + at, (size_t)hd * 2);
        }
        CHECK(memcmp(Kh, Kg, (size_t)n_cache * 2) == 0, "%s pos %d: K cache rows other than pos changed", c->name, pos);
        CHECK(memcmp(Vh, Vg, (size_t)n_cache * 2) == 0, "%s pos %d: V cache wrong (row pos or others)", c->name, pos);
        printf("   pos %5d: out rel_l2 vs refbf %.1e (max %.1e), vs ref32 %.1e; q_out vs refbf %.1e\n", pos, to, mo, lo,
               tq);
        if (pos < max_len)
            check_short(c, pos, max_len, d_qkv, d_qw, d_kw, d_if, d_K, d_V, d_step, out_gpu, obf, qout_gpu, Kh, Vh, 0);
        check_e4m3(c, pos, max_len, &dv, qbf, Kbf, V, gate, Kh, Vh);
    }
done:
    cudaFree(d_qkv), cudaFree(d_qw), cudaFree(d_kw), cudaFree(d_if), cudaFree(d_out), cudaFree(d_qout);
    cudaFree(d_work), cudaFree(d_K), cudaFree(d_V), cudaFree(d_step);
    free(qw), free(kw), free(inv_freq), free(qkv), free(Kbf), free(K32), free(V), free(qbf), free(q32), free(obf);
    free(o32), free(gate), free(out_gpu), free(qout_gpu), free(row), free(Kh), free(Vh), free(Kg), free(Vg);
}

/* Bad shapes are refused without launching; the same step twice gives bitwise-identical output. */
static void test_misc(void) {
    const int Hq = 8, Hkv = 2, hd = 256, R = 64, max_seq = 4096, n_qkv = 2 * Hq * hd + 2 * Hkv * hd;
    const size_t work_b = cuda_attn_decode_work_bytes(Hq, Hkv, hd, max_seq), cache_b = (size_t)Hkv * max_seq * hd * 2;
    float *h = falloc(n_qkv), *o1 = falloc(Hq * hd), *o2 = falloc(Hq * hd);
    float *d_qkv = NULL, *d_w = NULL, *d_out = NULL, *d_work = NULL;
    uint16_t *d_K = NULL, *d_V = NULL;
    StepParams *d_step = NULL;
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    sp.pos = 3000;
    for (int i = 0; i < n_qkv; i++) h[i] = bf_normal(&rng, 1.0f);
    CU(cudaMalloc((void **)&d_qkv, (size_t)n_qkv * 4));
    CU(cudaMemcpy(d_qkv, h, (size_t)n_qkv * 4, cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&d_w, (size_t)2 * hd * 4));
    CU(cudaMemset(d_w, 0, (size_t)2 * hd * 4));
    CU(cudaMalloc((void **)&d_out, (size_t)Hq * hd * 4));
    CU(cudaMalloc((void **)&d_work, work_b));
    CU(cudaMalloc((void **)&d_K, cache_b));
    CU(cudaMalloc((void **)&d_V, cache_b));
    CU(cudaMemset(d_K, 0x3f, cache_b));
    CU(cudaMemset(d_V, 0x3f, cache_b));
    CU(cudaMalloc((void **)&d_step, sizeof sp));
    CU(cudaMemcpy(d_step, &sp, sizeof sp, cudaMemcpyHostToDevice));
    AttnDecodeParams p = {d_qkv, d_w, d_w, d_w + hd, d_K,     d_V, d_out,   d_work, NULL, d_step,
                          Hq,    Hkv, hd,  R,        max_seq, 1,   NORM_ZC, 1e-6f,  0};
    CudaLaunch l = {stream, 1, NULL, 0};
    for (int rep = 0; rep < 2; rep++) {
        CU(cudaMemset(d_out, 0xff, (size_t)Hq * hd * 4));
        CHECK(cuda_attn_decode(&p, &l) == 0, "misc: launch");
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(rep ? o2 : o1, d_out, (size_t)Hq * hd * 4, cudaMemcpyDeviceToHost));
    }
    CHECK(memcmp(o1, o2, (size_t)Hq * hd * 4) == 0 && !isnan(o1[0]), "misc: two identical steps differ");
    /* pos outside [0, max_seq): nothing is written */
    sp.pos = max_seq;
    CU(cudaMemcpy(d_step, &sp, sizeof sp, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_out, 0xff, (size_t)Hq * hd * 4));
    CHECK(cuda_attn_decode(&p, &l) == 0, "misc: launch with pos = max_seq");
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(o1, d_out, (size_t)Hq * hd * 4, cudaMemcpyDeviceToHost));
    CHECK(isnan(o1[0]) && isnan(o1[Hq * hd - 1]), "misc: pos = max_seq wrote the output");
    p.hd = 96;
    CHECK(cuda_attn_decode(&p, &l) == (int)cudaErrorInvalidValue, "hd 96 accepted");
    p.hd = hd, p.Hq = 7;
    CHECK(cuda_attn_decode(&p, &l) == (int)cudaErrorInvalidValue, "Hq %% Hkv != 0 accepted");
    p.Hq = Hq, p.hd = 48;
    CHECK(cuda_attn_decode(&p, &l) == (int)cudaErrorInvalidValue, "hd 48 accepted");
    p.hd = hd, p.R = 63;
    CHECK(cuda_attn_decode(&p, &l) == (int)cudaErrorInvalidValue, "odd R accepted");
    p.R = R;
    {
        AttnShortParams sp2;
        memset(&sp2, 0, sizeof sp2);
        sp2.a = p, sp2.w_o = (const uint16_t *)d_K, sp2.y = d_out, sp2.D = 1024, sp2.max_len = 256;
        CHECK(cuda_attn_short_cap(hd, 1024) == 256 && cuda_attn_short_cap(32, 1024) == 0 &&
                  cuda_attn_short_cap(hd, 1026) == 0 && cuda_attn_short_cap(hd, 2048) == 0,
              "short: cap");
        sp2.max_len = 0;
        CHECK(cuda_attn_short(&sp2, &l) == (int)cudaErrorInvalidValue, "short: max_len 0 accepted");
        sp2.max_len = 257;
        CHECK(cuda_attn_short(&sp2, &l) == (int)cudaErrorInvalidValue, "short: max_len 257 accepted");
        sp2.max_len = 256, sp2.D = 1022;
        CHECK(cuda_attn_short(&sp2, &l) == (int)cudaErrorInvalidValue, "short: D 1022 accepted");
        sp2.D = 1024, sp2.a.hd = 32;
        CHECK(cuda_attn_short(&sp2, &l) == (int)cudaErrorInvalidValue, "short: hd 32 accepted");
    }
done:
    cudaFree(d_qkv), cudaFree(d_w), cudaFree(d_out), cudaFree(d_work), cudaFree(d_K), cudaFree(d_V), cudaFree(d_step);
    free(h), free(o1), free(o2);
}

/* Informational: the Qwen3.5 shape at kv_len = ctx, as a graph of NL launches over NL distinct caches
 * (NL * KV bytes >= 256 MB, so L2 cannot hold them), PDL on; us per call and KV read bandwidth. */
static void time_ctx(int Hq, int Hkv, int hd, int R, int gated, int ctx) {
    const size_t kv_b = (size_t)2 * Hkv * ctx * hd * 2;
    int NL = (int)((256u << 20) / kv_b) + 1;
    NL = NL < 8 ? 8 : NL > 1024 ? 1024 : NL;
    const int n_qkv = (gated ? 2 : 1) * Hq * hd + 2 * Hkv * hd, REPS = 10;
    const size_t work_b = cuda_attn_decode_work_bytes(Hq, Hkv, hd, ctx);
    float *d_qkv = NULL, *d_w = NULL, *d_out = NULL, *d_work = NULL, ms = 0;
    uint16_t *d_kv = NULL;
    StepParams *d_step = NULL;
    cudaStream_t st = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    sp.pos = ctx - 1;
    CU(cudaStreamCreate(&st));
    CU(cudaMalloc((void **)&d_qkv, (size_t)n_qkv * 4));
    CU(cudaMemset(d_qkv, 0, (size_t)n_qkv * 4));
    CU(cudaMalloc((void **)&d_w, (size_t)2 * hd * 4));
    CU(cudaMemset(d_w, 0, (size_t)2 * hd * 4));
    CU(cudaMalloc((void **)&d_out, (size_t)Hq * hd * 4));
    CU(cudaMalloc((void **)&d_work, work_b));
    CU(cudaMalloc((void **)&d_kv, kv_b * NL));
    CU(cudaMemset(d_kv, 0x3c, kv_b * NL));
    CU(cudaMalloc((void **)&d_step, sizeof sp));
    CU(cudaMemcpy(d_step, &sp, sizeof sp, cudaMemcpyHostToDevice));
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < NL; i++) {
        uint16_t *K = d_kv + kv_b / 2 * i, *V = K + kv_b / 4;
        AttnDecodeParams p = {d_qkv,
                              d_w,
                              d_w,
                              d_w + hd,
                              K,
                              V,
                              d_out,
                              d_work,
                              NULL,
                              d_step,
                              Hq,
                              Hkv,
                              hd,
                              R,
                              ctx,
                              gated,
                              gated ? NORM_ZC : NORM_PLAIN,
                              1e-6f,
                              0};
        CudaLaunch l = {st, 1, NULL, 0};
        if (cuda_attn_decode(&p, &l)) break;
    }
    CU(cudaStreamEndCapture(st, &graph));
    CU(cudaGraphInstantiate(&exec, graph, 0));
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaGraphLaunch(exec, st));
    CU(cudaEventRecord(e0, st));
    for (int r = 0; r < REPS; r++) CU(cudaGraphLaunch(exec, st));
    CU(cudaEventRecord(e1, st));
    CU(cudaEventSynchronize(e1));
    CU(cudaEventElapsedTime(&ms, e0, e1));
    {
        const double us = 1e3 * ms / (REPS * NL);
        printf("timing: attn decode Hq %d Hkv %d hd %d, kv_len %5d: %7.2f us/call (1 kernel, graph, PDL), "
               "KV %.2f TB/s\n",
               Hq, Hkv, hd, ctx, us, kv_b / (us * 1e-6) / 1e12);
    }
done:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (st) cudaStreamDestroy(st);
    cudaFree(d_qkv), cudaFree(d_w), cudaFree(d_out), cudaFree(d_work), cudaFree(d_kv), cudaFree(d_step);
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL);
    int timing = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-timing") == 0)
            timing = 0;
        else
            seed = strtoull(argv[i], NULL, 0);
    }
    printf("test_attention: seed %llu (replay: %s %llu)\n", (unsigned long long)seed, argv[0],
           (unsigned long long)seed);
    rng_seed(&rng, seed);
    const int gp = gpu_present();
    CHECK(gp >= 0, "CUDA runtime present but failing");
    have_gpu = gp > 0;
    if (have_gpu && cudaStreamCreate(&stream) != cudaSuccess) {
        CHECK(0, "cudaStreamCreate failed");
        have_gpu = 0;
    }
    if (!have_gpu) printf("no CUDA device: GPU checks skipped (CPU references still cross-checked)\n");
    const AtCase cases[] = {
        {"qwen35", 8, 2, 256, 64, 2048, 1, NORM_ZC, 1e7f, 9, {0, 1, 2, 3, 31, 32, 33, 1000, 2047}},
        {"qwen35 short", 8, 2, 256, 64, 300, 1, NORM_ZC, 1e7f, 5, {64, 127, 128, 200, 255}},
        {"qwen3", 16, 8, 128, 128, 600, 0, NORM_PLAIN, 1e6f, 5, {0, 1, 100, 101, 599}},
        {"G=1 R=32", 4, 4, 128, 32, 300, 1, NORM_ZC, 1e4f, 3, {0, 150, 299}},
        {"G=8", 16, 2, 256, 64, 5000, 1, NORM_ZC, 1e7f, 3, {2500, 2501, 4999}},
        {"qwen35 16k", 8, 2, 256, 64, 16384, 1, NORM_ZC, 1e7f, 3, {4095, 12345, 16383}},
        /* the golden fixtures' shapes (head_dim 32) and head_dim 64 */
        {"fixture hd32 G=2 R=8", 4, 2, 32, 8, 40, 1, NORM_ZC, 1e7f, 5, {0, 1, 2, 31, 39}},
        {"fixture hd32 G=4 R=16", 4, 1, 32, 16, 72, 1, NORM_ZC, 1e7f, 4, {0, 5, 33, 71}},
        {"fixture hd32 plain R=32", 4, 2, 32, 32, 24, 0, NORM_PLAIN, 1e6f, 3, {0, 7, 23}},
        {"hd32 G=8 multi-cluster", 16, 2, 32, 32, 3000, 0, NORM_PLAIN, 1e6f, 3, {300, 2000, 2999}},
        {"hd64 G=2", 8, 4, 64, 64, 1500, 1, NORM_ZC, 1e7f, 5, {0, 63, 64, 700, 1499}},
        {"hd64 G=8 R=32 plain", 16, 2, 64, 32, 130, 0, NORM_PLAIN, 1e6f, 3, {0, 100, 129}},
        /* uncommon groups: several blocks per kv head (G = 3: 3 x 1 head, G = 16: 2 x 8, G = 6 at hd 256: 3 x 2) */
        {"hd128 G=3", 6, 2, 128, 128, 700, 0, NORM_PLAIN, 1e6f, 3, {0, 350, 699}},
        {"hd128 G=16", 16, 1, 128, 64, 5000, 1, NORM_ZC, 1e7f, 3, {10, 2600, 4999}},
        {"hd256 G=6", 12, 2, 256, 64, 600, 1, NORM_ZC, 1e7f, 3, {1, 255, 599}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    if (have_gpu) {
        test_misc();
        const int ctxs[] = {128, 1024, 4096, 16384};
        for (int i = 0; i < 4 && timing; i++) time_ctx(8, 2, 256, 64, 1, ctxs[i]);
        for (int i = 0; i < 4 && timing; i++) time_ctx(16, 8, 128, 128, 0, ctxs[i]);
    }
    if (stream) cudaStreamDestroy(stream);
    return TEST_SUMMARY("attention");
}
