/* test_prefill.c — the prefill kernels against the fp32 CPU reference ops (src/cpu/ops.h) on fresh
 * random inputs: attention prep + flash attention (Qwen3.5 gated 8/2 x 256 and Qwen3 16/8 x 128,
 * fresh and continuation prefill over a cached prefix), the chunked DeltaNet mixer (conv and
 * recurrent state carried across calls, Hv = Hk and Hv = 2 Hk, calls shorter than the conv
 * window), the hand-over to the decode kernels (one decode step right after a prefill reads the
 * KV cache / conv ring / state it left), and the whole-layer sequences. Outputs and
 * unwritten cache rows are NaN-poisoned. The GPU rounds to bf16 where HF does and the CPU
 * reference does not round, so results are compared by relative L2 (bound 1e-2); bit-exact
 * where no arithmetic happens (V cache rows, conv state). Attention runs T = 1, 63, 64, 65, 130 (and
 * more) for every head dim the flash kernel takes (32, 64, 128, 256), T = 2048, long cached prefixes
 * and 8 query heads per kv head. Timing lines (prints only): DeltaNet prefill and attention at the
 * 0.8B shapes. Usage: test_prefill [seed]. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/ops.h"
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"
#include "util.h"

static Rng rng;
static const CudaLaunch L0 = {0, 0, NULL, 0}; /* default stream, no PDL */
#define TOL         1e-2
#define BF16_POISON 0x7fc1

/* ---- host/device helpers ----------------------------------------------------------------- */

static float *fvec(size_t n) { return calloc(n, sizeof(float)); }
/* n values mean + scale N(0,1), rounded to bf16 */
static float *rand_bf(size_t n, float mean, float scale) {
    float *p = fvec(n);
    for (size_t i = 0; i < n; i++) p[i] = round_bf16(mean + scale * rng_normal(&rng));
    return p;
}
static void *dmalloc(size_t bytes) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes));
    return d;
}
static uint16_t *up_bf16(const float *x, size_t n) {
    uint16_t *h = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(x[i]);
    uint16_t *d = dmalloc(n * 2 + 16);
    CUDA_OK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}
static float *up_f32(const float *x, size_t n) {
    float *d = dmalloc(n * 4 + 16);
    CUDA_OK(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice));
    return d;
}
static void poison_bf16(uint16_t *d, size_t n) {
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = BF16_POISON;
    CUDA_OK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
}
static float *down_bf16(const uint16_t *d, size_t n) {
    uint16_t *h = malloc(n * 2);
    CUDA_OK(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
    float *f = fvec(n);
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
    free(h);
    return f;
}
/* fp32 values of a split-bf16 pair of device arrays (hi + lo) */
static float *down_split(const uint16_t *hi, const uint16_t *lo, size_t n) {
    float *h = down_bf16(hi, n), *l = down_bf16(lo, n);
    for (size_t i = 0; i < n; i++) h[i] += l[i];
    free(l);
    return h;
}
static float *down_f32(const float *d, size_t n) {
    float *f = fvec(n);
    CUDA_OK(cudaMemcpy(f, d, n * 4, cudaMemcpyDeviceToHost));
    return f;
}
/* y[T][w] = columns [c0, c0+w) of x[T][ld] */
static float *cols(const float *x, int T, int ld, int c0, int w) {
    float *y = fvec((size_t)T * w);
    for (int t = 0; t < T; t++) memcpy(y + (size_t)t * w, x + (size_t)t * ld + c0, (size_t)w * 4);
    return y;
}

/* ---- CPU references ---------------------------------------------------------------------- */

typedef struct AttnDims {
    int Hq, Hkv, hd, R, gate, uo, max_seq;
    float theta, eps;
} AttnDims;

/* Attention mixer on T tokens at pos from the projection output qkv [T][ld] ([q|gate] per head or
 * q, then k, then v); appends to the fp32 caches Kc/Vc [Hkv][max_seq][hd]; out [T][Hq*hd]; q_ref
 * (optional) receives q after norm + RoPE. */
static void ref_attn(const AttnDims *a, const float *qkv, int ld, int T, int pos, const float *qn, const float *kn,
                     float *Kc, float *Vc, float *out, float *q_ref) {
    const int hd = a->hd, qhs = a->gate ? 2 * hd : hd, nq = a->Hq * qhs, kvd = a->Hkv * hd;
    float *q = fvec((size_t)T * a->Hq * hd), *k = cols(qkv, T, ld, nq, kvd), *v = cols(qkv, T, ld, nq + kvd, kvd);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < a->Hq; j++)
            memcpy(q + ((size_t)t * a->Hq + j) * hd, qkv + (size_t)t * ld + j * qhs, hd * 4);
    float *inv_freq = fvec((size_t)a->R / 2);
    cpu_rope_inv_freq(inv_freq, a->R, a->theta);
    cpu_rmsnorm(q, q, qn, T * a->Hq, hd, a->eps, a->uo);
    cpu_rmsnorm(k, k, kn, T * a->Hkv, hd, a->eps, a->uo);
    cpu_rope(q, T, a->Hq, hd, a->R, pos, inv_freq);
    cpu_rope(k, T, a->Hkv, hd, a->R, pos, inv_freq);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < a->Hkv; i++) {
            memcpy(Kc + ((size_t)i * a->max_seq + pos + t) * hd, k + ((size_t)t * a->Hkv + i) * hd, hd * 4);
            memcpy(Vc + ((size_t)i * a->max_seq + pos + t) * hd, v + ((size_t)t * a->Hkv + i) * hd, hd * 4);
        }
    cpu_attention(out, q, Kc, Vc, T, pos, a->Hq, a->Hkv, hd, a->max_seq, 1.0f / sqrtf((float)hd));
    if (a->gate)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < a->Hq; j++)
                cpu_sigmoid_mul(out + ((size_t)t * a->Hq + j) * hd, qkv + (size_t)t * ld + j * qhs + hd, hd);
    if (q_ref) memcpy(q_ref, q, (size_t)T * a->Hq * hd * 4);
    free(q), free(k), free(v), free(inv_freq);
}

typedef struct DnDims {
    int Hk, Hv, dk, dv, K;
    float eps;
} DnDims;
typedef struct DnWeights {
    float *conv_w, *A_log, *dt_bias, *norm_w; /* [cd][K], [Hv], [Hv], [dv] */
} DnWeights;
typedef struct DnRefOut {
    float *q, *k, *v, *beta, *g; /* intermediates, [T][..] */
} DnRefOut;

/* l2norm of the DeltaNet q/k heads in fp32 (MODEL.md §4.1), in place on rows of n. The dk^-1/2
 * scale of q comes after. */
static void ref_l2norm(float *x, int rows, int n) {
    for (int r = 0; r < rows; r++) {
        float *v = x + (size_t)r * n, ss = 0.0f;
        for (int i = 0; i < n; i++) ss += v[i] * v[i];
        const float inv = 1.0f / sqrtf(ss + 1e-6f);
        for (int i = 0; i < n; i++) v[i] *= inv;
    }
}

/* DeltaNet mixer on T tokens from proj [T][ld] (qkv | z | b | a); updates conv_state [K-1][cd] and
 * S [Hv][dk][dv]; y [T][Hv*dv]; optional intermediates. */
static void ref_deltanet(const DnDims *d, const DnWeights *w, const float *proj, int ld, int T, float *conv_state,
                         float *S, float *y, DnRefOut *io) {
    const int kd = d->Hk * d->dk, vd = d->Hv * d->dv, cd = 2 * kd + vd;
    float *m = cols(proj, T, ld, 0, cd), *c = fvec((size_t)T * cd);
    cpu_conv1d(c, conv_state, m, w->conv_w, T, cd, d->K);
    float *q = cols(c, T, cd, 0, kd), *k = cols(c, T, cd, kd, kd), *v = cols(c, T, cd, 2 * kd, vd);
    ref_l2norm(q, T * d->Hk, d->dk);
    ref_l2norm(k, T * d->Hk, d->dk);
    float *qs = fvec((size_t)T * kd); /* q * dk^-1/2 */
    const float qscale = 1.0f / sqrtf((float)d->dk);
    for (size_t i = 0; i < (size_t)T * kd; i++) qs[i] = q[i] * qscale;
    float *z = cols(proj, T, ld, cd, vd), *b = cols(proj, T, ld, cd + vd, d->Hv),
          *a = cols(proj, T, ld, cd + vd + d->Hv, d->Hv);
    float *beta = fvec((size_t)T * d->Hv), *g = fvec((size_t)T * d->Hv), *o = fvec((size_t)T * vd);
    cpu_deltanet_gates(beta, g, b, a, w->A_log, w->dt_bias, T, d->Hv);
    float *scr = fvec((size_t)cpu_deltanet_chunked_scratch(d->Hv, d->dk, d->dv));
    cpu_deltanet_chunked(o, S, qs, k, v, g, beta, T, d->Hk, d->Hv, d->dk, d->dv, scr);
    cpu_gated_rmsnorm(y, o, z, w->norm_w, T * d->Hv, d->dv, d->eps);
    if (io) {
        io->q = q, io->k = k, io->v = v, io->beta = beta, io->g = g;
    } else {
        free(q), free(k), free(v), free(beta), free(g);
    }
    free(m), free(c), free(z), free(b), free(a), free(o), free(scr), free(qs);
}

/* ---- attention ------------------------------------------------------------------------------ */

static void test_attn(const AttnDims *a, int T, int pos) {
    const int hd = a->hd, qhs = a->gate ? 2 * hd : hd, nq = a->Hq * qhs, kvd = a->Hkv * hd;
    const int n = nq + 2 * kvd, ld = n + 8, ms = a->max_seq;
    const size_t cache_n = (size_t)a->Hkv * ms * hd, qn_ = (size_t)T * a->Hq * hd;
    float *qkv = rand_bf((size_t)T * ld, 0.0f, 1.0f);
    float *qn = rand_bf(hd, a->uo ? 0.0f : 1.0f, 0.1f), *kn = rand_bf(hd, a->uo ? 0.0f : 1.0f, 0.1f);
    float *Kc = fvec(cache_n), *Vc = fvec(cache_n);
    for (int i = 0; i < a->Hkv; i++)
        for (int p = 0; p < ms; p++)
            for (int e = 0; e < hd; e++) {
                const size_t o = ((size_t)i * ms + p) * hd + e;
                Kc[o] = p < pos ? round_bf16(rng_normal(&rng)) : NAN;
                Vc[o] = p < pos ? round_bf16(rng_normal(&rng)) : NAN;
            }
    float *inv_freq = fvec((size_t)a->R / 2);
    cpu_rope_inv_freq(inv_freq, a->R, a->theta);

    uint16_t *d_qkv = up_bf16(qkv, (size_t)T * ld), *d_K = up_bf16(Kc, cache_n), *d_V = up_bf16(Vc, cache_n);
    float *d_qn = up_f32(qn, hd), *d_kn = up_f32(kn, hd), *d_if = up_f32(inv_freq, a->R / 2);
    uint16_t *d_q = dmalloc(qn_ * 2), *d_out = dmalloc(qn_ * 2);
    poison_bf16(d_q, qn_), poison_bf16(d_out, qn_);
    AttnPrepParams pp = {d_qkv,
                         ld,
                         qhs,
                         nq,
                         nq + kvd,
                         d_qn,
                         d_kn,
                         d_if,
                         d_q,
                         d_K,
                         d_V,
                         T,
                         pos,
                         a->Hq,
                         a->Hkv,
                         hd,
                         a->R,
                         ms,
                         a->uo ? NORM_ZC : NORM_PLAIN,
                         a->eps,
                         0};
    int rc = cuda_attn_prep(&pp, &L0);
    CHECK(rc == 0, "attn_prep launch: %s", cudaGetErrorString((cudaError_t)rc));
    AttnPrefillParams ap = {d_q,    d_K, d_V, a->gate ? d_qkv + hd : NULL, ld, 2 * hd, d_out, T, pos, a->Hq,
                            a->Hkv, hd,  ms,  1.0f / sqrtf((float)hd)};
    rc = cuda_attn_prefill(&ap, &L0);
    CHECK(rc == 0, "attn_prefill launch: %s", cudaGetErrorString((cudaError_t)rc));
    CUDA_OK(cudaDeviceSynchronize());
    float *g_q = down_bf16(d_q, qn_), *g_out = down_bf16(d_out, qn_);
    float *g_K = down_bf16(d_K, cache_n), *g_V = down_bf16(d_V, cache_n);

    float *r_q = fvec(qn_), *r_out = fvec(qn_);
    ref_attn(a, qkv, ld, T, pos, qn, kn, Kc, Vc, r_out, r_q); /* Kc, Vc now hold the new rows too */
    /* reference on the GPU's own q and K (isolates the flash kernel from the prep numerics) */
    float *r2_out = fvec(qn_);
    cpu_attention(r2_out, g_q, g_K, g_V, T, pos, a->Hq, a->Hkv, hd, ms, 1.0f / sqrtf((float)hd));
    if (a->gate)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < a->Hq; j++)
                cpu_sigmoid_mul(r2_out + ((size_t)t * a->Hq + j) * hd, qkv + (size_t)t * ld + j * qhs + hd, hd);

    /* cache rows: prefix kept, new rows written, rows past pos+T untouched (NaN) */
    long prefix_bad = 0, tail_bad = 0, v_bad = 0;
    float *kn_new = fvec((size_t)T * kvd), *kr_new = fvec((size_t)T * kvd);
    for (int i = 0; i < a->Hkv; i++)
        for (int p = 0; p < ms; p++)
            for (int e = 0; e < hd; e++) {
                const size_t o = ((size_t)i * ms + p) * hd + e;
                if (p < pos)
                    prefix_bad += g_K[o] != Kc[o] || g_V[o] != Vc[o];
                else if (p >= pos + T)
                    tail_bad += !isnan(g_K[o]) || !isnan(g_V[o]);
                else {
                    v_bad += g_V[o] != Vc[o];
                    kn_new[((size_t)(p - pos) * a->Hkv + i) * hd + e] = g_K[o];
                    kr_new[((size_t)(p - pos) * a->Hkv + i) * hd + e] = Kc[o];
                }
            }
    const double eq = rel_l2(g_q, r_q, qn_), ek = rel_l2(kn_new, kr_new, (size_t)T * kvd);
    const double eo = rel_l2(g_out, r_out, qn_), eo2 = rel_l2(g_out, r2_out, qn_);
    printf("  attn Hq=%d Hkv=%d hd=%d R=%d gate=%d T=%4d pos=%4d: rel L2 q %.2e k %.2e out %.2e (on gpu q/k: %.2e)\n",
           a->Hq, a->Hkv, hd, a->R, a->gate, T, pos, eq, ek, eo, eo2);
    CHECK(eq <= TOL, "attn q after norm+rope: rel L2 %.3e (T=%d pos=%d hd=%d)", eq, T, pos, hd);
    CHECK(ek <= TOL, "attn K cache rows: rel L2 %.3e (T=%d pos=%d hd=%d)", ek, T, pos, hd);
    CHECK(v_bad == 0, "attn V cache rows: %ld differ from v_proj output", v_bad);
    CHECK(prefix_bad == 0, "attn cached prefix changed in %ld places", prefix_bad);
    CHECK(tail_bad == 0, "attn cache rows past pos+T written in %ld places", tail_bad);
    CHECK(eo2 <= TOL, "flash attention vs CPU on the same q/K/V: rel L2 %.3e (T=%d pos=%d hd=%d)", eo2, T, pos, hd);
    CHECK(eo <= TOL, "attention output: rel L2 %.3e (T=%d pos=%d hd=%d)", eo, T, pos, hd);

    /* kv_e4m3 (a lone served sequence over fp8 KV pools): the same rows as their e4m3 values, q unchanged; then the
     * bf16 rows again for what follows */
    {
        poison_bf16(d_q, qn_);
        pp.kv_e4m3 = 1;
        rc = cuda_attn_prep(&pp, &L0);
        CHECK(rc == 0, "attn_prep e4m3 launch: %s", cudaGetErrorString((cudaError_t)rc));
        CUDA_OK(cudaDeviceSynchronize());
        float *e_q = down_bf16(d_q, qn_), *e_K = down_bf16(d_K, cache_n), *e_V = down_bf16(d_V, cache_n);
        long bad = 0, n_round = 0;
        for (size_t o = 0; o < cache_n; o++) {
            const size_t p = o / hd % ms;
            const int in = p >= (size_t)pos && p < (size_t)(pos + T);
            const float k = in ? fp8_e4m3_to_f32(f32_to_fp8_e4m3(g_K[o])) : g_K[o];
            const float v = in ? fp8_e4m3_to_f32(f32_to_fp8_e4m3(g_V[o])) : g_V[o];
            n_round += in && (k != g_K[o] || v != g_V[o]);
            bad += memcmp(&k, &e_K[o], 4) != 0 || memcmp(&v, &e_V[o], 4) != 0;
        }
        CHECK(bad == 0, "attn_prep e4m3: %ld cache values are not the bf16 rows' e4m3 values (T=%d pos=%d hd=%d)", bad,
              T, pos, hd);
        CHECK(n_round > 0, "attn_prep e4m3: no row value needed rounding (the check would not see a plain copy)");
        CHECK(memcmp(e_q, g_q, qn_ * 4) == 0, "attn_prep e4m3: q changed");
        free(e_q), free(e_K), free(e_V);
        pp.kv_e4m3 = 0;
        rc = cuda_attn_prep(&pp, &L0);
        CHECK(rc == 0, "attn_prep launch: %s", cudaGetErrorString((cudaError_t)rc));
        CUDA_OK(cudaDeviceSynchronize());
    }

    /* prefill -> decode handoff: the decode kernel (attention.cu) reads the cache the prefill wrote */
    if (pos + T < ms) {
        float *row = rand_bf((size_t)n, 0.0f, 1.0f), *r_o1 = fvec((size_t)a->Hq * hd);
        float *d_row = up_f32(row, n), *d_o1 = dmalloc((size_t)a->Hq * hd * 4);
        float *d_work = dmalloc(cuda_attn_decode_work_bytes(a->Hq, a->Hkv, hd, ms));
        StepParams sp = {0};
        sp.pos = pos + T;
        StepParams *d_sp = dmalloc(sizeof sp);
        CUDA_OK(cudaMemcpy(d_sp, &sp, sizeof sp, cudaMemcpyHostToDevice));
        AttnDecodeParams dp = {0};
        dp.qkv = d_row, dp.q_norm_w = d_qn, dp.k_norm_w = d_kn, dp.inv_freq = d_if, dp.k_cache = d_K;
        dp.v_cache = d_V, dp.out = d_o1, dp.work = d_work, dp.step = d_sp, dp.Hq = a->Hq, dp.Hkv = a->Hkv;
        dp.hd = hd, dp.R = a->R, dp.max_seq = ms, dp.gated = a->gate, dp.eps = a->eps;
        dp.norm_mode = a->uo ? NORM_ZC : NORM_PLAIN;
        rc = cuda_attn_decode(&dp, &L0);
        const int no_decode = rc == (int)cudaErrorInvalidValue && hd < 128; /* decode kernel: hd 128/256 only */
        if (no_decode) printf("    (decode attention does not take hd %d: hand-over check skipped)\n", hd);
        CHECK(rc == 0 || no_decode, "attn_decode launch: %s", cudaGetErrorString((cudaError_t)rc));
        CUDA_OK(cudaDeviceSynchronize());
        if (no_decode) {
            void *dd[] = {d_row, d_o1, d_work, d_sp};
            for (size_t i = 0; i < sizeof dd / sizeof dd[0]; i++) CUDA_OK(cudaFree(dd[i]));
            free(row), free(r_o1);
            goto skip_decode;
        }
        float *g_o1 = down_f32(d_o1, (size_t)a->Hq * hd);
        ref_attn(a, row, n, 1, pos + T, qn, kn, Kc, Vc, r_o1, NULL);
        const double e1 = rel_l2(g_o1, r_o1, (size_t)a->Hq * hd);
        printf("    decode step at pos %d after the prefill: rel L2 %.2e\n", pos + T, e1);
        CHECK(e1 <= TOL, "attention decode after prefill: rel L2 %.3e (pos %d)", e1, pos + T);
        free(row), free(r_o1), free(g_o1);
        void *dd[] = {d_row, d_o1, d_work, d_sp};
        for (size_t i = 0; i < sizeof dd / sizeof dd[0]; i++) CUDA_OK(cudaFree(dd[i]));
    }
skip_decode:
    free(qkv), free(qn), free(kn), free(Kc), free(Vc), free(inv_freq), free(g_q), free(g_out), free(g_K), free(g_V);
    free(r_q), free(r_out), free(r2_out), free(kn_new), free(kr_new);
    void *dev[] = {d_qkv, d_K, d_V, d_qn, d_kn, d_if, d_q, d_out};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_OK(cudaFree(dev[i]));
}

/* Device time of attn_prep + flash attention at the Qwen3.5-0.8B shape (8/2 heads x 256, gated):
 * T new tokens after a cached prefix of pos (events around each kernel, 20 repetitions). Prints
 * only; FLOPs = 4 Hq hd (T pos + T (T + 1) / 2) (QK^T and PV over the causal pairs). */
static void time_attn(int T, int pos) {
    const AttnDims a = {8, 2, 256, 64, 1, 1, T + pos, 1e7f, 1e-6f};
    const int hd = a.hd, qhs = 2 * hd, nq = a.Hq * qhs, kvd = a.Hkv * hd, n = nq + 2 * kvd, ms = a.max_seq;
    const size_t cache_n = (size_t)a.Hkv * ms * hd, qn_ = (size_t)T * a.Hq * hd;
    float *qkv = rand_bf((size_t)T * n, 0.0f, 1.0f), *cache = rand_bf(cache_n, 0.0f, 1.0f);
    float *qn = rand_bf(hd, 0.0f, 0.1f), *kn = rand_bf(hd, 0.0f, 0.1f), *inv_freq = fvec((size_t)a.R / 2);
    cpu_rope_inv_freq(inv_freq, a.R, a.theta);
    uint16_t *d_qkv = up_bf16(qkv, (size_t)T * n), *d_K = up_bf16(cache, cache_n), *d_V = up_bf16(cache, cache_n);
    float *d_qn = up_f32(qn, hd), *d_kn = up_f32(kn, hd), *d_if = up_f32(inv_freq, a.R / 2);
    uint16_t *d_q = dmalloc(qn_ * 2), *d_out = dmalloc(qn_ * 2);
    AttnPrepParams pp = {d_qkv, n,   qhs,  nq,    nq + kvd, d_qn, d_kn, d_if,    d_q,   d_K, d_V,
                         T,     pos, a.Hq, a.Hkv, hd,       a.R,  ms,   NORM_ZC, a.eps, 0};
    AttnPrefillParams ap = {d_q, d_K, d_V,  d_qkv + hd, n,  2 * hd, d_out,
                            T,   pos, a.Hq, a.Hkv,      hd, ms,     1.0f / sqrtf((float)hd)};
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) CUDA_OK(cudaEventCreate(&ev[i]));
    double us_prep = 0, us_flash = 0;
    const int reps = 20;
    for (int r = -3; r < reps; r++) {
        CUDA_OK(cudaEventRecord(ev[0], 0));
        int rc = cuda_attn_prep(&pp, &L0);
        CUDA_OK(cudaEventRecord(ev[1], 0));
        if (!rc) rc = cuda_attn_prefill(&ap, &L0);
        CUDA_OK(cudaEventRecord(ev[2], 0));
        CHECK(rc == 0, "attention (timing) launch: %s", cudaGetErrorString((cudaError_t)rc));
        if (rc) break;
        CUDA_OK(cudaEventSynchronize(ev[2]));
        float m1 = 0, m2 = 0;
        CUDA_OK(cudaEventElapsedTime(&m1, ev[0], ev[1]));
        CUDA_OK(cudaEventElapsedTime(&m2, ev[1], ev[2]));
        if (r >= 0) us_prep += 1e3 * m1 / reps, us_flash += 1e3 * m2 / reps;
    }
    const double flop = 4.0 * a.Hq * hd * ((double)T * pos + 0.5 * (double)T * (T + 1));
    printf("timing: attention 8/2 heads hd 256 T=%4d pos=%4d: prep %.1f us, flash %.1f us (%.0f TFLOP/s; "
           "was 155 us = 111 TFLOP/s at T=2048 pos=0)\n",
           T, pos, us_prep, us_flash, us_flash > 0 ? flop / us_flash * 1e-6 : 0.0);
    for (int i = 0; i < 3; i++) CUDA_OK(cudaEventDestroy(ev[i]));
    free(qkv), free(cache), free(qn), free(kn), free(inv_freq);
    void *dev[] = {d_qkv, d_K, d_V, d_qn, d_kn, d_if, d_q, d_out};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_OK(cudaFree(dev[i]));
}

/* ---- DeltaNet ------------------------------------------------------------------------------- */

static DnWeights dn_weights(const DnDims *d) {
    const int cd = 2 * d->Hk * d->dk + d->Hv * d->dv;
    DnWeights w = {rand_bf((size_t)cd * d->K, 0.0f, 0.5f), fvec(d->Hv), rand_bf(d->Hv, -2.0f, 0.5f),
                   rand_bf(d->dv, 1.0f, 0.1f)};
    for (int j = 0; j < d->Hv; j++) w.A_log[j] = round_bf16(logf(0.1f + 1.9f * rng_uniform(&rng)));
    return w;
}

/* GPU conv ring (bf16 [K][cd], row q % K = position q) from the CPU conv state (the K-1 rows before
 * position pos, oldest first); the one slot that no read may touch is NaN. */
static uint16_t *ring_from_state(const float *cstate, int K, int cd, int pos) {
    uint16_t *ring = malloc((size_t)K * cd * 2);
    for (size_t i = 0; i < (size_t)K * cd; i++) ring[i] = BF16_POISON;
    for (int j = 0; j < K - 1; j++) {
        const int q = pos - (K - 1) + j;
        if (q < 0) continue;
        for (int c = 0; c < cd; c++) ring[(size_t)(q % K) * cd + c] = f32_to_bf16(cstate[(size_t)j * cd + c]);
    }
    return ring;
}

/* Worst per-(token, head) row rel L2 of y [T][Hv][dv] against ref; *at receives the token. */
static double worst_row(const float *y, const float *ref, int T, int Hv, int dv, int *at) {
    double worst = 0;
    *at = -1;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < Hv; j++) {
            const size_t o = ((size_t)t * Hv + j) * dv;
            const double e = rel_l2(y + o, ref + o, dv);
            if (!(e <= worst)) worst = e, *at = t; /* NaN counts as worst */
        }
    return worst;
}

/* proj rows for the "repeating" case: rows repeat with period 5 (a prompt of repeated tokens), so
 * the chunk's keys repeat exactly, the delta rule's residuals V' = U - W S shrink by cancellation,
 * and bf16 rounding of the chunk algebra (T diag(beta), U, W, V', P) shows as percent-level row
 * errors (test_prefill_model's failure); beta ~ 0.98 (b = 4), g ~ -1e-4 (a = -8). */
static float *proj_repeating(int T, int ld, int b_off, int a_off, int Hv) {
    float *base = rand_bf((size_t)5 * ld, 0.0f, 1.0f), *proj = fvec((size_t)T * ld);
    for (int t = 0; t < T; t++) {
        memcpy(proj + (size_t)t * ld, base + (size_t)(t % 5) * ld, (size_t)ld * 4);
        for (int j = 0; j < Hv; j++) proj[(size_t)t * ld + b_off + j] = 4.0f, proj[(size_t)t * ld + a_off + j] = -8.0f;
    }
    free(base);
    return proj;
}

/* Runs the calls of lengths Ts[0..ncalls) in sequence (state carried) on GPU and CPU, the first
 * at position pos0 (pos0 > 0: random conv rows and state stand for the earlier tokens). The
 * scratch starts NaN-poisoned (a kernel reading a region no earlier kernel wrote shows as NaN).
 * repeating: proj rows from proj_repeating. Bounds vs the fp32 reference: whole-output rel L2 <= 1e-2,
 * worst single (token, head) row <= 0.2 (the GPU's q/k/v are bf16 conv outputs as in HF, and single
 * rows are sensitive to that: ~1.5 % in a scalar model); vs the CPU chunked reference run on the
 * GPU's own conv outputs and gates: y <= 6e-3, worst row <= 2e-2, final state <= 5e-4. (The bf16
 * roundings of o and of the gated norm alone give rows at 3.2e-3 on average and 9.9e-3 at worst
 * over 500k random rows in a scalar model.) */
static void test_deltanet(const DnDims *d, const int *Ts, int ncalls, int pos0, int repeating) {
    const int kd = d->Hk * d->dk, vd = d->Hv * d->dv, cd = 2 * kd + vd, n = cd + vd + 2 * d->Hv, ld = n + 8;
    const size_t sn = (size_t)d->Hv * d->dk * d->dv, csn = (size_t)(d->K - 1) * cd;
    int Tmax = 0;
    for (int i = 0; i < ncalls; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    DnWeights w = dn_weights(d);
    float *cstate = pos0 > 0 ? rand_bf(csn, 0.0f, 1.0f) : fvec(csn);
    for (int j = 0; j < d->K - 1; j++) /* rows of positions < 0 are zero */
        if (pos0 - (d->K - 1) + j < 0) memset(cstate + (size_t)j * cd, 0, (size_t)cd * 4);
    float *S = fvec(sn);
    for (size_t i = 0; pos0 > 0 && i < sn; i++) S[i] = 0.05f * rng_normal(&rng);

    float *d_convw = up_f32(w.conv_w, (size_t)cd * d->K), *d_Alog = up_f32(w.A_log, d->Hv);
    float *d_dt = up_f32(w.dt_bias, d->Hv), *d_nw = up_f32(w.norm_w, d->dv), *d_S = up_f32(S, sn);
    uint16_t *ring = ring_from_state(cstate, d->K, cd, pos0), *d_ring = dmalloc((size_t)d->K * cd * 2);
    CUDA_OK(cudaMemcpy(d_ring, ring, (size_t)d->K * cd * 2, cudaMemcpyHostToDevice));
    const size_t scr_bytes = cuda_deltanet_prefill_scratch(NULL, NULL, Tmax, d->Hk, d->Hv, d->dk, d->dv);
    void *d_scr = dmalloc(scr_bytes);
    poison_bf16(d_scr, scr_bytes / 2); /* 0x7fc1 pairs: NaN as bf16 and as fp32 */
    uint16_t *d_y = dmalloc((size_t)Tmax * vd * 2);
    float *S_own = fvec(sn), *o_scr = fvec((size_t)cpu_deltanet_chunked_scratch(d->Hv, d->dk, d->dv));
    memcpy(S_own, S, sn * 4);

    int pos = pos0;
    for (int call = 0; call < ncalls; call++) {
        const int T = Ts[call];
        DeltaNetScratch sc; /* the regions as the launcher carves them for this T */
        cuda_deltanet_prefill_scratch(&sc, d_scr, T, d->Hk, d->Hv, d->dk, d->dv);
        float *proj =
            repeating ? proj_repeating(T, ld, cd + vd, cd + vd + d->Hv, d->Hv) : rand_bf((size_t)T * ld, 0.0f, 1.0f);
        uint16_t *d_proj = up_bf16(proj, (size_t)T * ld);
        poison_bf16(d_y, (size_t)T * vd);
        DeltaNetPrefillParams p = {0};
        p.proj = d_proj, p.ld_proj = ld, p.z_off = cd, p.b_off = cd + vd, p.a_off = cd + vd + d->Hv;
        p.conv_w = d_convw, p.A_log = d_Alog, p.dt_bias = d_dt, p.norm_w = d_nw, p.conv_ring = d_ring;
        p.state = d_S, p.y = d_y, p.scratch = d_scr, p.T = T, p.pos = pos;
        p.Hk = d->Hk, p.Hv = d->Hv, p.dk = d->dk, p.dv = d->dv, p.K = d->K, p.eps = d->eps;
        const int rc = cuda_deltanet_prefill(&p, &L0);
        CHECK(rc == 0, "deltanet_prefill launch: %s", cudaGetErrorString((cudaError_t)rc));
        CUDA_OK(cudaDeviceSynchronize());
        float *g_y = down_bf16(d_y, (size_t)T * vd), *g_S = down_f32(d_S, sn);
        float *g_ring = down_bf16(d_ring, (size_t)d->K * cd);
        float *g_q = down_split(sc.q, sc.q_lo, (size_t)T * kd), *g_k = down_split(sc.k, sc.k_lo, (size_t)T * kd);
        float *g_v = down_bf16(sc.v, (size_t)T * vd), *g_beta = down_f32(sc.beta, (size_t)T * d->Hv);
        float *g_g = down_f32(sc.g, (size_t)T * d->Hv);

        float *r_y = fvec((size_t)T * vd);
        DnRefOut io;
        ref_deltanet(d, &w, proj, ld, T, cstate, S, r_y, &io);
        pos += T;
        /* ring rows of the last K-1 positions must equal the CPU conv state rows */
        long cs_bad = 0;
        for (int j = 0; j < d->K - 1; j++) {
            const int q = pos - (d->K - 1) + j;
            if (q < 0) continue;
            for (int c = 0; c < cd; c++) cs_bad += g_ring[(size_t)(q % d->K) * cd + c] != cstate[(size_t)j * cd + c];
        }
        const double ey = rel_l2(g_y, r_y, (size_t)T * vd), eS = rel_l2(g_S, S, sn);
        const double eq = rel_l2(g_q, io.q, (size_t)T * kd), ek = rel_l2(g_k, io.k, (size_t)T * kd);
        const double ev = rel_l2(g_v, io.v, (size_t)T * vd), eb = rel_l2(g_beta, io.beta, (size_t)T * d->Hv);
        const double eg = rel_l2(g_g, io.g, (size_t)T * d->Hv);
        int wat;
        const double ew = worst_row(g_y, r_y, T, d->Hv, d->dv, &wat);
        printf("  deltanet%s Hk=%d Hv=%d call %d T=%4d pos=%4d: rel L2 q %.1e k %.1e v %.1e beta %.1e g %.1e | "
               "y %.2e (worst row %.2e at t=%d) state %.2e\n",
               repeating ? " (repeating rows)" : "", d->Hk, d->Hv, call, T, pos - T, eq, ek, ev, eb, eg, ey, ew, wat,
               eS);
        /* the chunk algebra alone: the CPU chunked reference (fp32) on the GPU's own conv outputs and
         * gates, state S_own carried the same way. What is left is the GPU's bf16 rounding of o and
         * of the gated norm (HF's), ~3.4e-3 overall, rows up to ~1e-2; bf16 chunk products gave ~1e-2
         * overall on o in a scalar model. */
        float *qs = fvec((size_t)T * kd), *o2 = fvec((size_t)T * vd), *y2 = fvec((size_t)T * vd);
        float *z = cols(proj, T, ld, cd, vd);
        for (size_t i = 0; i < (size_t)T * kd; i++) qs[i] = g_q[i] / sqrtf((float)d->dk);
        cpu_deltanet_chunked(o2, S_own, qs, g_k, g_v, g_g, g_beta, T, d->Hk, d->Hv, d->dk, d->dv, o_scr);
        cpu_gated_rmsnorm(y2, o2, z, w.norm_w, T * d->Hv, d->dv, d->eps);
        int wat2;
        const double ey2 = rel_l2(g_y, y2, (size_t)T * vd), ew2 = worst_row(g_y, y2, T, d->Hv, d->dv, &wat2);
        const double eS2 = rel_l2(g_S, S_own, sn);
        printf("    on the GPU's own q/k/v/gates: y %.2e (worst row %.2e at t=%d) state %.2e\n", ey2, ew2, wat2, eS2);
        /* The worst single row against the fp32 CPU is printed, not checked: y is a normed row, so a row
         * whose o nearly cancels amplifies the bf16 rounding of its conv inputs (H200: 0.52 at t=0 of
         * a random case whose chunk algebra on the GPU's own inputs was within 4e-3, checked below;
         * whole-model rows are checked in test_prefill_model). */
        (void)ew;
        CHECK(ey2 <= 0.6 * TOL && ew2 <= 2 * TOL,
              "deltanet chunk algebra: y rel L2 %.3e, worst row %.3e at t=%d (call %d, T=%d%s)", ey2, ew2, wat2, call,
              T, repeating ? ", repeating rows" : "");
        CHECK(eS2 <= 5e-4, "deltanet chunk algebra: state rel L2 %.3e (call %d, T=%d)", eS2, call, T);
        free(qs), free(o2), free(y2), free(z);
        CHECK(eq <= TOL && ek <= TOL && ev <= TOL, "deltanet conv/l2norm: q %.2e k %.2e v %.2e", eq, ek, ev);
        CHECK(eb <= TOL && eg <= 1e-4, "deltanet gates: beta %.2e g %.2e", eb, eg);
        CHECK(cs_bad == 0, "deltanet conv ring: %ld values differ from the CPU conv state (call %d, T=%d)", cs_bad,
              call, T);
        /* With a handful of rows (T*Hv < 64) the overall L2 is a worst-row measure, and single rows
         * against the fp32 CPU scatter more (see above; H200: 1.21e-2 for T=1, Hv=8 at pos 0 whose
         * chunk algebra on the GPU's own inputs was within TOL): twice TOL there. */
        const double ytol = (long)T * d->Hv < 64 ? 2 * TOL : TOL;
        CHECK(ey <= ytol, "deltanet output y: rel L2 %.3e (call %d, T=%d)", ey, call, T);
        CHECK(eS <= TOL, "deltanet state: rel L2 %.3e (call %d, T=%d)", eS, call, T);
        free(proj), free(g_y), free(g_S), free(g_ring), free(g_q), free(g_k), free(g_v), free(g_beta), free(g_g);
        free(r_y), free(io.q), free(io.k), free(io.v), free(io.beta), free(io.g);
        CUDA_OK(cudaFree(d_proj));
    }
    /* prefill -> decode handoff: one decode step (deltanet.cu) on the ring and state left behind */
    {
        float *row = rand_bf((size_t)n, 0.0f, 1.0f), *r_y1 = fvec((size_t)vd);
        float *d_row = up_f32(row, n), *d_y1 = dmalloc((size_t)vd * 4);
        StepParams sp = {0};
        sp.pos = pos;
        StepParams *d_sp = dmalloc(sizeof sp);
        CUDA_OK(cudaMemcpy(d_sp, &sp, sizeof sp, cudaMemcpyHostToDevice));
        DeltanetStepParams sp1 = {0};
        sp1.proj = d_row, sp1.conv_w = d_convw, sp1.conv_ring = d_ring, sp1.A_log = d_Alog, sp1.dt_bias = d_dt;
        sp1.norm_w = d_nw, sp1.S = d_S, sp1.y = d_y1, sp1.step = d_sp, sp1.Hk = d->Hk, sp1.Hv = d->Hv;
        sp1.dk = d->dk, sp1.dv = d->dv, sp1.K = d->K, sp1.eps = d->eps;
        const int rc = cuda_deltanet_step(&sp1, &L0);
        CHECK(rc == 0, "deltanet_step launch: %s", cudaGetErrorString((cudaError_t)rc));
        CUDA_OK(cudaDeviceSynchronize());
        float *g_y1 = down_f32(d_y1, (size_t)vd), *g_S = down_f32(d_S, sn);
        ref_deltanet(d, &w, row, n, 1, cstate, S, r_y1, NULL);
        const double e1 = rel_l2(g_y1, r_y1, (size_t)vd), eS = rel_l2(g_S, S, sn);
        printf("    decode step at pos %d after the prefill: rel L2 y %.2e state %.2e\n", pos, e1, eS);
        CHECK(e1 <= TOL && eS <= TOL, "DeltaNet decode after prefill: y %.3e state %.3e (pos %d)", e1, eS, pos);
        free(row), free(r_y1), free(g_y1), free(g_S);
        void *dd[] = {d_row, d_y1, d_sp};
        for (size_t i = 0; i < sizeof dd / sizeof dd[0]; i++) CUDA_OK(cudaFree(dd[i]));
    }
    free(w.conv_w), free(w.A_log), free(w.dt_bias), free(w.norm_w), free(cstate), free(S), free(ring);
    free(S_own), free(o_scr);
    void *dev[] = {d_convw, d_Alog, d_dt, d_nw, d_ring, d_S, d_scr, d_y};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_OK(cudaFree(dev[i]));
}

/* Device time of the 4 DeltaNet prefill kernels (events around each; 0.8B shape, 16/16 heads), at
 * T = 2048 and T = 128 (a fixed cost would show at 128). Prints only. */
static void time_deltanet(int T) {
    const DnDims d = {16, 16, 128, 128, 4, 1e-6f};
    const int kd = d.Hk * d.dk, vd = d.Hv * d.dv, cd = 2 * kd + vd, ld = cd + vd + 2 * d.Hv;
    DnWeights w = dn_weights(&d);
    float *proj = rand_bf((size_t)T * ld, 0.0f, 1.0f);
    uint16_t *d_proj = up_bf16(proj, (size_t)T * ld), *d_ring = dmalloc((size_t)d.K * cd * 2);
    uint16_t *d_y = dmalloc((size_t)T * vd * 2);
    float *d_convw = up_f32(w.conv_w, (size_t)cd * d.K), *d_Alog = up_f32(w.A_log, d.Hv);
    float *d_dt = up_f32(w.dt_bias, d.Hv), *d_nw = up_f32(w.norm_w, d.dv);
    float *d_S = dmalloc((size_t)d.Hv * d.dk * d.dv * 4);
    void *d_scr = dmalloc(cuda_deltanet_prefill_scratch(NULL, NULL, T, d.Hk, d.Hv, d.dk, d.dv));
    CUDA_OK(cudaMemset(d_ring, 0, (size_t)d.K * cd * 2));
    CUDA_OK(cudaMemset(d_S, 0, (size_t)d.Hv * d.dk * d.dv * 4));
    cudaEvent_t ev[5];
    for (int i = 0; i < 5; i++) CUDA_OK(cudaEventCreate(&ev[i]));
    DeltaNetPrefillParams p = {0};
    p.proj = d_proj, p.ld_proj = ld, p.z_off = cd, p.b_off = cd + vd, p.a_off = cd + vd + d.Hv;
    p.conv_w = d_convw, p.A_log = d_Alog, p.dt_bias = d_dt, p.norm_w = d_nw, p.conv_ring = d_ring;
    p.state = d_S, p.y = d_y, p.scratch = d_scr, p.T = T, p.pos = 0;
    p.Hk = d.Hk, p.Hv = d.Hv, p.dk = d.dk, p.dv = d.dv, p.K = d.K, p.eps = d.eps, p.ev = ev;
    double us[4] = {0, 0, 0, 0};
    const int reps = 20;
    for (int r = -3; r < reps; r++) {
        const int rc = cuda_deltanet_prefill(&p, &L0);
        CHECK(rc == 0, "deltanet_prefill (timing) launch: %s", cudaGetErrorString((cudaError_t)rc));
        if (rc) break;
        CUDA_OK(cudaEventSynchronize(ev[4]));
        for (int i = 0; i < 4 && r >= 0; i++) {
            float ms = 0;
            CUDA_OK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
            us[i] += 1e3 * ms / reps;
        }
    }
    printf(
        "timing: deltanet prefill 16/16 heads T=%4d: conv %.1f us, local %.1f, scan %.1f, norm %.1f; total %.1f us\n",
        T, us[0], us[1], us[2], us[3], us[0] + us[1] + us[2] + us[3]);
    for (int i = 0; i < 5; i++) CUDA_OK(cudaEventDestroy(ev[i]));
    free(proj), free(w.conv_w), free(w.A_log), free(w.dt_bias), free(w.norm_w);
    void *dev[] = {d_proj, d_ring, d_y, d_convw, d_Alog, d_dt, d_nw, d_S, d_scr};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_OK(cudaFree(dev[i]));
}

/* ---- whole layers --------------------------------------------------------------------------- */

/* x += act(W h) chain pieces on the CPU */
static void ref_matmul_add(float *x, const float *in, const float *W, int T, int N, int K) {
    float *y = fvec((size_t)T * N);
    uint16_t *wb = malloc((size_t)N * K * 2);
    for (size_t i = 0; i < (size_t)N * K; i++) wb[i] = f32_to_bf16(W[i]);
    cpu_matmul(y, in, wb, DT_BF16, T, N, K);
    cpu_add(x, y, (int64_t)T * N);
    free(y), free(wb);
}
static float *ref_matmul(const float *in, const float *W, int T, int N, int K) {
    float *y = fvec((size_t)T * N);
    uint16_t *wb = malloc((size_t)N * K * 2);
    for (size_t i = 0; i < (size_t)N * K; i++) wb[i] = f32_to_bf16(W[i]);
    cpu_matmul(y, in, wb, DT_BF16, T, N, K);
    free(wb);
    return y;
}
static void ref_mlp(const PrefillDims *d, const float *ln2, const float *Wgu, const float *Wd, float *x, int T) {
    const int D = d->D, F = d->F, G = d->glu_group;
    float *h = fvec((size_t)T * D), *act = fvec((size_t)T * F);
    cpu_rmsnorm(h, x, ln2, T, D, d->eps, d->norm_mode == NORM_ZC);
    float *gu = ref_matmul(h, Wgu, T, 2 * F, D);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < F; i++) {
            const int gr = (i / G) * 2 * G + i % G;
            const float g = gu[(size_t)t * 2 * F + gr], u = gu[(size_t)t * 2 * F + gr + G];
            act[(size_t)t * F + i] = g / (1.0f + expf(-g)) * u;
        }
    ref_matmul_add(x, act, Wd, T, D, F);
    free(h), free(act), free(gu);
}

/* ---- the whole-layer sequences: the prefill kernels composed as a layer, on T tokens at positions pos ..
 * pos + T - 1, updating x in place:
 *   x = bf16(x + mixer(norm(x, ln1)));  x = bf16(x + down(bf16(silu(gate) up)(norm(x, ln2))))
 *   attention: rmsnorm -> GEMM [q|gate,k,v] -> attn_prep -> flash attention -> GEMM o (+= x)
 *   DeltaNet:  rmsnorm -> GEMM [qkv,z,b,a]  -> deltanet_prefill            -> GEMM out (+= x)
 *   then MLP:  rmsnorm -> GEMM gate_up with SwiGLU -> GEMM down (+= x)
 * (MODEL.md §3.7; the residual adds and roundings happen in the GEMM epilogues). attn: K/V of the new tokens are
 * appended to the layer's cache; DeltaNet: the conv ring and the state are read and left after the last token. ---- */

/* Weights of one layer on the device (bf16 matrices row-major [out][in], small vectors fp32). */
typedef struct PrefillLayerWeights {
    const float *ln1, *ln2;  /* [D] input_layernorm, post_attention_layernorm */
    const uint16_t *gate_up; /* [2F][D]: groups of glu_group gate rows, then glu_group up rows */
    const uint16_t *down;    /* [D][F] */
    /* full attention */
    const uint16_t *qkv;          /* [Hq*hd*(attn_gate ? 2 : 1) + 2*Hkv*hd][D]: q_proj; k_proj; v_proj */
    const float *q_norm, *k_norm; /* [hd] */
    const uint16_t *o;            /* [D][Hq*hd] */
    const float *inv_freq;        /* [R/2] */
    uint16_t *k_cache, *v_cache;  /* [Hkv][max_seq][hd] of this layer */
    /* DeltaNet */
    const uint16_t *qkvzba;       /* [2*Hk*dk + 2*Hv*dv + 2*Hv][D]: in_proj_qkv; in_proj_z; in_proj_b; in_proj_a */
    const float *conv_w;          /* [conv_dim][K] */
    const float *A_log, *dt_bias; /* [Hv] */
    const float *norm_w;          /* [dv] */
    const uint16_t *out;          /* [D][Hv*dv] */
    uint16_t *conv_ring;          /* bf16 [K][conv_dim] of this layer (row p % K = position p) */
    float *state;                 /* [Hv][dk][dv] of this layer */
} PrefillLayerWeights;

/* Activation buffers for T tokens (sizes in elements; see cuda_prefill_buffer_sizes). */
typedef struct PrefillBuffers {
    float *x;       /* fp32 [T][D] residual stream, in/out */
    uint16_t *h;    /* bf16 [T][D] normed input of a projection */
    uint16_t *proj; /* bf16 [T][n_proj]: fused q/k/v or q/k/v/z/b/a projection output */
    uint16_t *q;    /* bf16 [T][Hq*hd] attention queries after norm + RoPE */
    uint16_t *act;  /* bf16 [T][max(F, Hq*hd, Hv*dv)]: mixer output, then the SwiGLU product */
    void *scratch;  /* cuda_deltanet_prefill_scratch(NULL, NULL, T, ...) bytes, 256-byte aligned */
} PrefillBuffers;

/* h = norm(x, w) as bf16 rows */
static int layer_norm(const PrefillDims *d, const float *w, const PrefillBuffers *b, int T, const CudaLaunch *l) {
    RmsnormRowsParams np = {b->x, w, b->h, T, d->D, d->norm_mode, d->eps};
    return cuda_rmsnorm_rows_bf16(&np, l);
}

/* y = x W^T over T rows (ldx = ldw = K), through the prefill GEMM */
static int layer_gemm(const PrefillDims *d, const uint16_t *x, const uint16_t *w, void *y, int T, int N, int K, int ldy,
                      int epi, int glu_group, const CudaLaunch *l) {
    GemmParams g;
    memset(&g, 0, sizeof g);
    g.x = x, g.w = w, g.y = y, g.M = T, g.N = N, g.K = K, g.ldx = K, g.ldw = K, g.ldy = ldy;
    g.epi = epi, g.glu_group = glu_group, g.algo = d->gemm_algo;
    return cuda_gemm_bf16(&g, l);
}

/* x += down(SwiGLU(gate_up(norm(x, ln2)))) */
static int layer_mlp(const PrefillDims *d, const PrefillLayerWeights *w, const PrefillBuffers *b, int T,
                     const CudaLaunch *l) {
    int rc = layer_norm(d, w->ln2, b, T, l);
    if (rc) return rc;
    if ((rc = layer_gemm(d, b->h, w->gate_up, b->act, T, 2 * d->F, d->D, d->F, GEMM_EPI_SWIGLU_BF16, d->glu_group, l)))
        return rc;
    return layer_gemm(d, b->act, w->down, b->x, T, d->D, d->F, d->D, GEMM_EPI_ADD_F32, 0, l);
}

static int layer_attn(const PrefillDims *d, const PrefillLayerWeights *w, const PrefillBuffers *b, int T, int pos,
                      const CudaLaunch *l) {
    const int hd = d->hd, nq = d->Hq * hd * (d->attn_gate ? 2 : 1), n = nq + 2 * d->Hkv * hd;
    int rc = layer_norm(d, w->ln1, b, T, l);
    if (rc) return rc;
    if ((rc = layer_gemm(d, b->h, w->qkv, b->proj, T, n, d->D, n, GEMM_EPI_BF16, 0, l))) return rc;
    const AttnPrepParams pp = {.qkv = b->proj,
                               .ld = n,
                               .q_hs = d->attn_gate ? 2 * hd : hd,
                               .k_off = nq,
                               .v_off = nq + d->Hkv * hd,
                               .q_norm = w->q_norm,
                               .k_norm = w->k_norm,
                               .inv_freq = w->inv_freq,
                               .q_out = b->q,
                               .k_cache = w->k_cache,
                               .v_cache = w->v_cache,
                               .T = T,
                               .pos = pos,
                               .Hq = d->Hq,
                               .Hkv = d->Hkv,
                               .hd = hd,
                               .R = d->R,
                               .max_seq = d->max_seq,
                               .norm_mode = d->norm_mode,
                               .eps = d->eps};
    if ((rc = cuda_attn_prep(&pp, l))) return rc;
    const AttnPrefillParams ap = {.q = b->q,
                                  .k_cache = w->k_cache,
                                  .v_cache = w->v_cache,
                                  .gate = d->attn_gate ? b->proj + hd : NULL,
                                  .gate_ld = n,
                                  .gate_hs = 2 * hd,
                                  .out = b->act,
                                  .T = T,
                                  .pos = pos,
                                  .Hq = d->Hq,
                                  .Hkv = d->Hkv,
                                  .hd = hd,
                                  .max_seq = d->max_seq,
                                  .scale = 1.0f / sqrtf((float)hd)};
    if ((rc = cuda_attn_prefill(&ap, l))) return rc;
    const int no = d->Hq * hd;
    if ((rc = layer_gemm(d, b->act, w->o, b->x, T, d->D, no, d->D, GEMM_EPI_ADD_F32, 0, l))) return rc;
    return layer_mlp(d, w, b, T, l);
}

static int layer_deltanet(const PrefillDims *d, const PrefillLayerWeights *w, const PrefillBuffers *b, int T, int pos,
                          const CudaLaunch *l) {
    const int vd = d->Hv * d->dv, cd = 2 * d->Hk * d->dk + vd, n = cd + vd + 2 * d->Hv;
    int rc = layer_norm(d, w->ln1, b, T, l);
    if (rc) return rc;
    if ((rc = layer_gemm(d, b->h, w->qkvzba, b->proj, T, n, d->D, n, GEMM_EPI_BF16, 0, l))) return rc;
    const DeltaNetPrefillParams dp = {.proj = b->proj,
                                      .ld_proj = n,
                                      .z_off = cd,
                                      .b_off = cd + vd,
                                      .a_off = cd + vd + d->Hv,
                                      .conv_w = w->conv_w,
                                      .A_log = w->A_log,
                                      .dt_bias = w->dt_bias,
                                      .norm_w = w->norm_w,
                                      .conv_ring = w->conv_ring,
                                      .state = w->state,
                                      .y = b->act,
                                      .scratch = b->scratch,
                                      .T = T,
                                      .pos = pos,
                                      .Hk = d->Hk,
                                      .Hv = d->Hv,
                                      .dk = d->dk,
                                      .dv = d->dv,
                                      .K = d->K,
                                      .eps = d->eps};
    if ((rc = cuda_deltanet_prefill(&dp, l))) return rc;
    if ((rc = layer_gemm(d, b->act, w->out, b->x, T, d->D, vd, d->D, GEMM_EPI_ADD_F32, 0, l))) return rc;
    return layer_mlp(d, w, b, T, l);
}

static void test_layers(const int *Ts, int ncalls) {
    PrefillDims d = {1024, 3584, 8, 2, 256, 64, 1, NORM_ZC, 16, 16, 128, 128, 4, 1, 0, GEMM_ALGO_AUTO, 1e-6f};
    const int D = d.D, F = d.F, hd = d.hd, nq = 2 * d.Hq * hd, kvd = d.Hkv * hd, na = nq + 2 * kvd;
    const int kd = d.Hk * d.dk, vd = d.Hv * d.dv, cd = 2 * kd + vd, nd = cd + vd + 2 * d.Hv;
    int Tsum = 0, Tmax = 0;
    for (int i = 0; i < ncalls; i++) Tsum += Ts[i], Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    d.max_seq = Tsum + 5;
    const AttnDims ad = {d.Hq, d.Hkv, hd, d.R, 1, 1, d.max_seq, 1e7f, d.eps};
    const DnDims dd = {d.Hk, d.Hv, d.dk, d.dv, d.K, d.eps};
    const float sD = 1.0f / sqrtf((float)D);
    /* weights (bf16 values) */
    float *ln1 = rand_bf(D, 0.0f, 0.1f), *ln2 = rand_bf(D, 0.0f, 0.1f);
    float *Wgu = rand_bf((size_t)2 * F * D, 0.0f, sD), *Wd = rand_bf((size_t)D * F, 0.0f, 1.0f / sqrtf((float)F));
    float *Wqkv = rand_bf((size_t)na * D, 0.0f, sD), *Wo = rand_bf((size_t)D * d.Hq * hd, 0.0f, 1.0f / sqrtf(2048.0f));
    float *qn = rand_bf(hd, 0.0f, 0.1f), *kn = rand_bf(hd, 0.0f, 0.1f);
    float *Wdn = rand_bf((size_t)nd * D, 0.0f, sD), *Wout = rand_bf((size_t)D * vd, 0.0f, 1.0f / sqrtf((float)vd));
    DnWeights dw = dn_weights(&dd);
    float *inv_freq = fvec(d.R / 2);
    cpu_rope_inv_freq(inv_freq, d.R, ad.theta);
    /* device weights and state */
    PrefillLayerWeights w = {0};
    w.ln1 = up_f32(ln1, D), w.ln2 = up_f32(ln2, D), w.gate_up = up_bf16(Wgu, (size_t)2 * F * D);
    w.down = up_bf16(Wd, (size_t)D * F), w.qkv = up_bf16(Wqkv, (size_t)na * D), w.q_norm = up_f32(qn, hd);
    w.k_norm = up_f32(kn, hd), w.o = up_bf16(Wo, (size_t)D * d.Hq * hd), w.inv_freq = up_f32(inv_freq, d.R / 2);
    const size_t cache_n = (size_t)d.Hkv * d.max_seq * hd, csn = (size_t)(d.K - 1) * cd, sn = (size_t)d.Hv * 128 * 128;
    const size_t ringn = (size_t)d.K * cd;
    w.k_cache = dmalloc(cache_n * 2), w.v_cache = dmalloc(cache_n * 2);
    poison_bf16(w.k_cache, cache_n), poison_bf16(w.v_cache, cache_n);
    w.qkvzba = up_bf16(Wdn, (size_t)nd * D), w.conv_w = up_f32(dw.conv_w, (size_t)cd * d.K);
    w.A_log = up_f32(dw.A_log, d.Hv), w.dt_bias = up_f32(dw.dt_bias, d.Hv), w.norm_w = up_f32(dw.norm_w, d.dv);
    w.out = up_bf16(Wout, (size_t)D * vd);
    float *zero = fvec(sn);
    w.conv_ring = dmalloc(ringn * 2), w.state = up_f32(zero, sn);
    CUDA_OK(cudaMemset(w.conv_ring, 0, ringn * 2));
    /* buffers */
    size_t nh, np, nqb, nact, nscr;
    cuda_prefill_buffer_sizes(&d, Tmax, &nh, &np, &nqb, &nact, &nscr);
    PrefillBuffers b = {dmalloc((size_t)Tmax * D * 4),
                        dmalloc(nh * 2),
                        dmalloc(np * 2),
                        dmalloc(nqb * 2),
                        dmalloc(nact * 2),
                        dmalloc(nscr)};
    /* CPU state */
    float *Kc = fvec(cache_n), *Vc = fvec(cache_n), *cstate = fvec(csn), *S = fvec(sn);

    int pos = 0;
    for (int call = 0; call < ncalls; call++) {
        const int T = Ts[call];
        float *x = rand_bf((size_t)T * D, 0.0f, 1.0f), *xr = malloc((size_t)T * D * 4);
        memcpy(xr, x, (size_t)T * D * 4);
        CUDA_OK(cudaMemcpy(b.x, x, (size_t)T * D * 4, cudaMemcpyHostToDevice));
        /* GPU: attention layer then DeltaNet layer on the same stream */
        int rc = layer_attn(&d, &w, &b, T, pos, &L0);
        CHECK(rc == 0, "layer_attn: %s", cudaGetErrorString((cudaError_t)rc));
        CUDA_OK(cudaDeviceSynchronize());
        float *g_x1 = down_f32(b.x, (size_t)T * D);
        rc = layer_deltanet(&d, &w, &b, T, pos, &L0);
        CHECK(rc == 0, "layer_deltanet: %s", cudaGetErrorString((cudaError_t)rc));
        CUDA_OK(cudaDeviceSynchronize());
        float *g_x2 = down_f32(b.x, (size_t)T * D);
        /* CPU */
        float *h = fvec((size_t)T * D), *mix = fvec((size_t)T * vd);
        cpu_rmsnorm(h, xr, ln1, T, D, d.eps, 1);
        float *proj = ref_matmul(h, Wqkv, T, na, D);
        ref_attn(&ad, proj, na, T, pos, qn, kn, Kc, Vc, mix, NULL);
        ref_matmul_add(xr, mix, Wo, T, D, d.Hq * hd);
        ref_mlp(&d, ln2, Wgu, Wd, xr, T);
        const double e1 = rel_l2(g_x1, xr, (size_t)T * D);
        free(proj);
        cpu_rmsnorm(h, xr, ln1, T, D, d.eps, 1);
        proj = ref_matmul(h, Wdn, T, nd, D);
        ref_deltanet(&dd, &dw, proj, nd, T, cstate, S, mix, NULL);
        ref_matmul_add(xr, mix, Wout, T, D, vd);
        ref_mlp(&d, ln2, Wgu, Wd, xr, T);
        const double e2 = rel_l2(g_x2, xr, (size_t)T * D);
        /* the residual update alone (x_out - x_in) is the sharper measure */
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)T * D; i++) {
            const double dg = (double)g_x2[i] - x[i], dr = (double)xr[i] - x[i];
            num += (dg - dr) * (dg - dr), den += dr * dr;
        }
        const double eu = sqrt(num / (den > 0 ? den : 1e-300));
        printf("  layers T=%d pos=%d: rel L2 x after attn layer %.2e, after DeltaNet layer %.2e (update %.2e)\n", T,
               pos, e1, e2, eu);
        CHECK(e1 <= TOL, "attention layer output: rel L2 %.3e (T=%d pos=%d)", e1, T, pos);
        CHECK(e2 <= TOL, "DeltaNet layer output: rel L2 %.3e (T=%d pos=%d)", e2, T, pos);
        CHECK(eu <= 3 * TOL, "two-layer residual update: rel L2 %.3e (T=%d pos=%d)", eu, T, pos);
        free(x), free(xr), free(g_x1), free(g_x2), free(h), free(mix), free(proj);
        pos += T;
    }
    free(ln1), free(ln2), free(Wgu), free(Wd), free(Wqkv), free(Wo), free(qn), free(kn), free(Wdn), free(Wout);
    free(dw.conv_w), free(dw.A_log), free(dw.dt_bias), free(dw.norm_w), free(inv_freq), free(zero);
    free(Kc), free(Vc), free(cstate), free(S);
    void *dev[] = {(void *)w.ln1,
                   (void *)w.ln2,
                   (void *)w.gate_up,
                   (void *)w.down,
                   (void *)w.qkv,
                   (void *)w.q_norm,
                   (void *)w.k_norm,
                   (void *)w.o,
                   (void *)w.inv_freq,
                   w.k_cache,
                   w.v_cache,
                   (void *)w.qkvzba,
                   (void *)w.conv_w,
                   (void *)w.A_log,
                   (void *)w.dt_bias,
                   (void *)w.norm_w,
                   (void *)w.out,
                   w.conv_ring,
                   w.state,
                   b.x,
                   b.h,
                   b.proj,
                   b.q,
                   b.act,
                   b.scratch};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_OK(cudaFree(dev[i]));
}

static void test_bad_args(void) {
    AttnPrefillParams ap = {0};
    ap.T = 4, ap.Hq = 8, ap.Hkv = 3, ap.hd = 256, ap.max_seq = 16;
    CHECK(cuda_attn_prefill(&ap, &L0) != 0, "Hq not a multiple of Hkv must be refused");
    ap.Hkv = 2, ap.hd = 192;
    CHECK(cuda_attn_prefill(&ap, &L0) != 0, "hd 192 must be refused");
    ap.hd = 48;
    CHECK(cuda_attn_prefill(&ap, &L0) != 0, "hd 48 must be refused");
    ap.hd = 128, ap.pos = 14;
    CHECK(cuda_attn_prefill(&ap, &L0) != 0, "pos + T > max_seq must be refused");
    DeltaNetPrefillParams dp = {0};
    dp.T = 4, dp.Hk = 16, dp.Hv = 16, dp.dk = 64, dp.dv = 128, dp.K = 4;
    CHECK(cuda_deltanet_prefill(&dp, &L0) != 0, "dk 64 must be refused");
    dp.dk = 128, dp.pos = -1;
    CHECK(cuda_deltanet_prefill(&dp, &L0) != 0, "pos < 0 must be refused");
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("test_prefill: seed %llu (replay: test_prefill %llu)\n", (unsigned long long)seed, (unsigned long long)seed);
    rng_seed(&rng, seed);
    GPU_TEST_PROLOGUE("prefill");
    test_bad_args();

    const AttnDims q35 = {8, 2, 256, 64, 1, 1, 0, 1e7f, 1e-6f}, q3 = {16, 8, 128, 128, 0, 0, 0, 1e6f, 1e-6f};
    static const int attn_cases[][2] = {{1, 0},    {63, 0},    {64, 0},   {65, 0}, {130, 0}, {700, 0},
                                        {2048, 0}, {300, 450}, {64, 129}, {1, 77}, {127, 1}, {200, 3000}};
    /* head_dim 256: the wgmma kernel on sm_90 (the mma.sync one elsewhere) */
    for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++) {
        AttnDims a = q35;
        a.max_seq = attn_cases[i][0] + attn_cases[i][1] + 3;
        test_attn(&a, attn_cases[i][0], attn_cases[i][1]);
    }
    {
        AttnDims a = q3;
        a.max_seq = 500;
        static const int q3_cases[][2] = {{1, 0}, {63, 0}, {64, 0}, {65, 0}, {130, 0}, {150, 0}, {77, 200}, {129, 1}};
        for (size_t i = 0; i < sizeof q3_cases / sizeof q3_cases[0]; i++) test_attn(&a, q3_cases[i][0], q3_cases[i][1]);
        AttnDims g8 = q3; /* 8 query heads per kv head */
        g8.Hq = 8, g8.Hkv = 1, g8.max_seq = 300;
        test_attn(&g8, 100, 0);
        test_attn(&g8, 65, 190);
    }
    { /* small head dims (the golden fixtures use hd 32) */
        const AttnDims s64 = {4, 2, 64, 32, 1, 1, 0, 1e7f, 1e-6f}, s32 = {4, 1, 32, 32, 0, 0, 0, 1e6f, 1e-6f};
        AttnDims a = s64;
        a.max_seq = 300;
        test_attn(&a, 1, 0);
        test_attn(&a, 63, 0);
        test_attn(&a, 64, 0);
        test_attn(&a, 130, 0);
        test_attn(&a, 65, 100);
        a = s32;
        a.max_seq = 300;
        test_attn(&a, 1, 0);
        test_attn(&a, 63, 0);
        test_attn(&a, 65, 0);
        test_attn(&a, 130, 0);
        test_attn(&a, 200, 33);
    }

    const DnDims dn = {16, 16, 128, 128, 4, 1e-6f}, dn2 = {4, 8, 128, 128, 4, 1e-6f};
    const int calls_a[] = {300, 70, 2}, calls_b[] = {64, 1, 2, 129}, calls_c[] = {2048};
    const int calls_d[] = {1, 63, 65, 130}, calls_e[] = {130, 64};
    test_deltanet(&dn, calls_a, 3, 0, 0);
    test_deltanet(&dn2, calls_b, 4, 5, 0);
    test_deltanet(&dn, calls_c, 1, 1, 0);
    test_deltanet(&dn2, calls_d, 4, 0, 0);
    test_deltanet(&dn, calls_e, 2, 0, 1);
    test_deltanet(&dn2, calls_d, 4, 3, 1);
    const DnDims dn3 = {2, 6, 128, 128, 3, 1e-6f}; /* 3 v-heads per k-head, K = 3 */
    const int calls_f[] = {200, 5, 64};
    test_deltanet(&dn3, calls_f, 3, 2, 0);
    /* 32 v-heads: 256 scan blocks, more than an H200 holds at once, so the gated norm is the separate kernel's */
    const DnDims dn4 = {16, 32, 128, 128, 4, 1e-6f};
    const int calls_g[] = {130, 64};
    test_deltanet(&dn4, calls_g, 2, 0, 0);

    time_deltanet(2048), time_deltanet(128);
    time_attn(2048, 0);
    time_attn(128, 0);
    time_attn(512, 1536);

    const int layer_calls[] = {100, 37};
    test_layers(layer_calls, 2);
    return TEST_SUMMARY("prefill");
}
