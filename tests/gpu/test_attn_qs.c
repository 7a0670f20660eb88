/* test_attn_qs.c — cuda_attn_qs (src/cuda/attention.cu attn_qs: a full-attention layer's qkv GEMV, attention and
 * o_proj in ONE kernel at short contexts, the blocks sharing the qkv rows as tagged 64-bit words) against the two
 * kernels it replaces: the qkv GEMV (cuda_matvec, MV_IN_RESIDUAL or MV_IN_EMBED) and cuda_attn_short on its rows,
 * on fresh random weights and inputs, over consecutive steps with the KV caches carried. Two "layers" per step
 * (two weight sets and caches) share one tag buffer, as the engine's layers do; it starts poisoned (0xff bytes:
 * the first epoch wraps to 0 and every stale word carries another tag).
 * Bitwise: the qkv rows (p.proj vs the GEMV's y), x_out, the whole K and V caches. y within 1e-5 of max |y|: both
 * add the same per-block o_proj partials with fp32 atomics, in another order. Both zero ranges zeroed. The GEMV
 * and the short kernel are checked against the CPU in test_matvec and test_attention; the engine with attn_qs in
 * test_decode. Bad parameters are refused without a launch.
 * Usage: test_attn_qs [seed]. Skips without a GPU. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/ops.h"
#include "test.h"
#include "util.h"
#include "gpu_common.h"

typedef struct Case {
    const char *name;
    int D, Hq, Hkv, hd, gated, steps, pos0, embed, max_len;
} Case;

static Rng rng;

static int same_bits(const char *what, const void *a, const void *b, size_t bytes, int step, int layer) {
    if (memcmp(a, b, bytes) == 0) return 1;
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (i < bytes && x[i] == y[i]) i++;
    fprintf(stderr, "  step %d layer %d: %s: first differing byte %zu of %zu\n", step, layer, what, i, bytes);
    return 0;
}

enum { NL = 2, V = 8 };

static void run_case(const Case *c, int n_sm) {
    const int D = c->D, hd = c->hd, qs = c->gated ? 2 * hd : hd, rows = c->Hq * qs + 2 * c->Hkv * hd;
    const int n_in = c->Hq * hd, R = hd / 4, max_seq = c->max_len + 8, nz = D;
    const size_t n_cache = (size_t)c->Hkv * max_seq * hd, n_tag = cuda_attn_qs_tag_words(c->Hq, c->Hkv, hd, c->gated);
    const int sup = cuda_attn_qs_supported(c->Hq, c->Hkv, hd, c->gated, D, c->max_len);
    printf("-- %s: D %d, Hq %d Hkv %d hd %d %s, %d qkv rows, max_len %d, %d steps from pos %d%s (supported: %d)\n",
           c->name, D, c->Hq, c->Hkv, hd, c->gated ? "gated" : "ungated", rows, c->max_len, c->steps, c->pos0,
           c->embed ? ", embedding input" : "", sup);
    if (!sup) {
        CHECK(n_sm < (hd / 16) * c->Hq, "%s: not supported with %d SMs", c->name, n_sm);
        printf("   skipped: the grid does not fit on this device\n");
        return;
    }
    uint16_t *w_in[NL], *w_o[NL], *d_win[NL] = {0}, *d_wo[NL] = {0}, *d_K[NL][2] = {{0}}, *d_V[NL][2] = {{0}};
    float *ln1[NL], *qn[NL], *kn[NL], *d_ln1[NL] = {0}, *d_qn[NL] = {0}, *d_kn[NL] = {0};
    uint16_t *Kc = malloc(n_cache * 2), *Vc = malloc(n_cache * 2), *h1 = malloc(n_cache * 2), *h2 = malloc(n_cache * 2);
    for (int l = 0; l < NL; l++) {
        w_in[l] = bf16_random(&rng, (int64_t)rows * D, 0.04f), w_o[l] = bf16_random(&rng, (int64_t)D * n_in, 0.03f);
        ln1[l] = f32_bf16_random(&rng, D, 0.1f, 0.0f);
        qn[l] = f32_bf16_random(&rng, hd, 0.2f, 0.0f), kn[l] = f32_bf16_random(&rng, hd, 0.2f, 0.0f);
    }
    uint16_t *emb = bf16_random(&rng, (int64_t)V * D, 1.0f);
    float *inv_freq = malloc(sizeof(float) * (size_t)R / 2), *x = malloc(sizeof(float) * D);
    float *part = malloc(sizeof(float) * D), *f1 = malloc(sizeof(float) * (size_t)rows);
    float *f2 = malloc(sizeof(float) * (size_t)rows), *z = malloc(sizeof(float) * nz);
    cpu_rope_inv_freq(inv_freq, R, 1e7f);
    uint16_t *d_emb = dev_copy(emb, (size_t)V * D * 2);
    float *d_if = dev_copy(inv_freq, (size_t)R / 2 * 4), *d_x = dev_poison(D * 4), *d_part = dev_poison(D * 4);
    float *d_proj[2] = {dev_poison((size_t)rows * 4), dev_poison((size_t)rows * 4)};
    float *d_xo[2] = {dev_poison(D * 4), dev_poison(D * 4)}, *d_y[2] = {dev_poison(D * 4), dev_poison(D * 4)};
    float *d_z[3] = {dev_poison(nz * 4), dev_poison(nz * 4), dev_poison(nz * 4)};
    unsigned long long *d_tag = dev_poison(n_tag * 8);
    StepParams *d_step = dev_copy(NULL, sizeof(StepParams));
    int ok = d_emb && d_if && d_x && d_part && d_proj[0] && d_proj[1] && d_xo[0] && d_xo[1] && d_y[0] && d_y[1] &&
             d_z[0] && d_z[1] && d_z[2] && d_tag && d_step;
    for (int l = 0; l < NL; l++) {
        d_win[l] = dev_copy(w_in[l], (size_t)rows * D * 2), d_wo[l] = dev_copy(w_o[l], (size_t)D * n_in * 2);
        d_ln1[l] = dev_copy(ln1[l], D * 4), d_qn[l] = dev_copy(qn[l], hd * 4), d_kn[l] = dev_copy(kn[l], hd * 4);
        for (size_t i = 0; i < n_cache; i++) Kc[i] = f32_to_bf16(rng_normal(&rng)), Vc[i] = f32_to_bf16(rng_normal(&rng));
        for (int k = 0; k < 2; k++) d_K[l][k] = dev_copy(Kc, n_cache * 2), d_V[l][k] = dev_copy(Vc, n_cache * 2);
        ok = ok && d_win[l] && d_wo[l] && d_ln1[l] && d_qn[l] && d_kn[l] && d_K[l][0] && d_K[l][1] && d_V[l][0] &&
             d_V[l][1];
    }
    if (!ok) {
        CHECK(0, "%s: device allocation", c->name);
        goto done;
    }
    CudaLaunch lc = {0, 0, NULL, 0};
    int ok_bits = 1, ok_y = 1, ok_zero = 1;
    double worst = 0;
    for (int t = 0; t < c->steps; t++) {
        StepParams sp;
        memset(&sp, 0, sizeof sp);
        sp.token = (t * 3 + 1) % V, sp.pos = c->pos0 + t;
        CU(cudaMemcpy(d_step, &sp, sizeof sp, cudaMemcpyHostToDevice));
        for (int l = 0; l < NL; l++) {
            for (int i = 0; i < D; i++) x[i] = round_bf16(rng_normal(&rng)), part[i] = 0.5f * rng_normal(&rng);
            CU(cudaMemcpy(d_x, x, D * 4, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(d_part, part, D * 4, cudaMemcpyHostToDevice));
            for (int k = 0; k < 2; k++) {
                CU(cudaMemset(d_proj[k], 0xff, (size_t)rows * 4));
                CU(cudaMemset(d_xo[k], 0xff, D * 4));
                CU(cudaMemset(d_y[k], 0, D * 4));
            }
            for (int k = 0; k < 3; k++) CU(cudaMemset(d_z[k], 0xff, nz * 4));
            AttnDecodeParams a;
            memset(&a, 0, sizeof a);
            a.q_norm_w = d_qn[l], a.k_norm_w = d_kn[l], a.inv_freq = d_if, a.step = d_step;
            a.Hq = c->Hq, a.Hkv = c->Hkv, a.hd = hd, a.R = R, a.max_seq = max_seq, a.gated = c->gated;
            a.norm_mode = NORM_ZC, a.eps = 1e-6f;
            /* the two kernels: the qkv GEMV, then attention + o_proj on its rows */
            MatvecParams mv;
            memset(&mv, 0, sizeof mv);
            mv.W = d_win[l], mv.rows = rows, mv.cols = D, mv.splits = 1, mv.blocks = cuda_matvec_blocks(rows, D, 1, n_sm);
            if (c->embed && l == 0)
                mv.in_mode = MV_IN_EMBED, mv.embed = d_emb, mv.step = d_step;
            else
                mv.in_mode = MV_IN_RESIDUAL, mv.x = d_x, mv.parts = d_part, mv.n_parts = 1;
            mv.x_out = d_xo[0], mv.norm_w = d_ln1[l], mv.norm_mode = NORM_ZC, mv.eps = 1e-6f;
            mv.out_mode = MV_OUT_STORE, mv.y = d_proj[0];
            LAUNCH(cuda_matvec(&mv, &lc));
            AttnShortParams sp2;
            memset(&sp2, 0, sizeof sp2);
            sp2.a = a, sp2.a.qkv = d_proj[0], sp2.a.k_cache = d_K[l][0], sp2.a.v_cache = d_V[l][0];
            sp2.w_o = d_wo[l], sp2.y = d_y[0], sp2.zero = d_z[0], sp2.n_zero = nz, sp2.D = D, sp2.max_len = c->max_len;
            LAUNCH(cuda_attn_short(&sp2, &lc));
            /* the one kernel (with PDL on odd steps: the engine's launch) */
            AttnQsParams q;
            memset(&q, 0, sizeof q);
            q.s = sp2, q.s.a.qkv = NULL, q.s.a.k_cache = d_K[l][1], q.s.a.v_cache = d_V[l][1];
            q.s.y = d_y[1], q.s.zero = d_z[1], q.zero1 = d_z[2];
            q.w_in = d_win[l], q.ln1 = d_ln1[l], q.x_out = d_xo[1], q.tag = d_tag, q.proj = d_proj[1];
            if (c->embed && l == 0)
                q.embed = d_emb;
            else
                q.x = d_x, q.parts = d_part, q.n_parts = 1;
            CudaLaunch lq = {0, t & 1, NULL, 0};
            LAUNCH(cuda_attn_qs(&q, &lq));
            CU(cudaDeviceSynchronize());
            CU(cudaMemcpy(f1, d_proj[0], (size_t)rows * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(f2, d_proj[1], (size_t)rows * 4, cudaMemcpyDeviceToHost));
            ok_bits &= same_bits("qkv rows", f1, f2, (size_t)rows * 4, t, l);
            CU(cudaMemcpy(f1, d_xo[0], D * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(f2, d_xo[1], D * 4, cudaMemcpyDeviceToHost));
            ok_bits &= same_bits("x_out", f1, f2, (size_t)D * 4, t, l);
            CU(cudaMemcpy(h1, d_K[l][0], n_cache * 2, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(h2, d_K[l][1], n_cache * 2, cudaMemcpyDeviceToHost));
            ok_bits &= same_bits("K cache", h1, h2, n_cache * 2, t, l);
            CU(cudaMemcpy(h1, d_V[l][0], n_cache * 2, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(h2, d_V[l][1], n_cache * 2, cudaMemcpyDeviceToHost));
            ok_bits &= same_bits("V cache", h1, h2, n_cache * 2, t, l);
            CU(cudaMemcpy(f1, d_y[0], D * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(f2, d_y[1], D * 4, cudaMemcpyDeviceToHost));
            double amax = 0, dmax = 0;
            for (int i = 0; i < D; i++) amax = fmax(amax, fabs(f1[i])), dmax = fmax(dmax, fabs((double)f2[i] - f1[i]));
            if (!(dmax <= 1e-5 * amax) || !(amax > 0)) {
                fprintf(stderr, "  step %d layer %d: y max diff %.3g of max %.3g\n", t, l, dmax, amax);
                ok_y = 0;
            }
            worst = fmax(worst, amax > 0 ? dmax / amax : 1);
            for (int k = 1; k < 3; k++) {
                CU(cudaMemcpy(z, d_z[k], nz * 4, cudaMemcpyDeviceToHost));
                for (int i = 0; i < nz; i++) ok_zero &= z[i] == 0.0f;
            }
        }
    }
    CHECK(ok_bits, "%s: qkv rows, x_out or the KV cache differ from the GEMV + cuda_attn_short", c->name);
    CHECK(ok_y, "%s: y differs from the GEMV + cuda_attn_short beyond 1e-5 of its max", c->name);
    CHECK(ok_zero, "%s: zero / zero1 not zeroed", c->name);
    printf("   bitwise: qkv rows, x_out, K and V caches; y worst max-diff / max %.2g\n", worst);
done:
    for (int l = 0; l < NL; l++) {
        cudaFree(d_win[l]), cudaFree(d_wo[l]), cudaFree(d_ln1[l]), cudaFree(d_qn[l]), cudaFree(d_kn[l]);
        for (int k = 0; k < 2; k++) cudaFree(d_K[l][k]), cudaFree(d_V[l][k]);
        free(w_in[l]), free(w_o[l]), free(ln1[l]), free(qn[l]), free(kn[l]);
    }
    cudaFree(d_emb), cudaFree(d_if), cudaFree(d_x), cudaFree(d_part), cudaFree(d_proj[0]), cudaFree(d_proj[1]);
    cudaFree(d_xo[0]), cudaFree(d_xo[1]), cudaFree(d_y[0]), cudaFree(d_y[1]), cudaFree(d_z[0]), cudaFree(d_z[1]);
    cudaFree(d_z[2]), cudaFree(d_tag), cudaFree(d_step);
    free(Kc), free(Vc), free(h1), free(h2), free(emb), free(inv_freq), free(x), free(part), free(f1), free(f2), free(z);
}

static void test_refusals(void) {
    CHECK(!cuda_attn_qs_supported(8, 2, 96, 1, 1024, 256), "hd 96 accepted");
    CHECK(!cuda_attn_qs_supported(8, 2, 256, 1, 2048, 256), "D 2048 accepted");
    CHECK(!cuda_attn_qs_supported(8, 3, 256, 1, 1024, 256), "Hq not a multiple of Hkv accepted");
    CHECK(!cuda_attn_qs_supported(8, 2, 256, 1, 1024, 257), "max_len past the cap accepted");
    AttnQsParams q;
    memset(&q, 0, sizeof q);
    CudaLaunch l = {0, 0, NULL, 0};
    CHECK(cuda_attn_qs(&q, &l) == (int)cudaErrorInvalidValue, "empty params accepted");
    CHECK(cuda_attn_qs(NULL, &l) == (int)cudaErrorInvalidValue, "NULL params accepted");
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("attn_qs");
    rng_seed(&rng, test_seed(argc, argv, "test_attn_qs"));
    int n_sm = 0;
    CUDA_OK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const Case cases[] = {
        {"qwen3.5-0.8b", 1024, 8, 2, 256, 1, 4, 0, 0, 256},
        {"0.8b, layer 0 (embedding), up to the cap", 1024, 8, 2, 256, 1, 4, 252, 1, 256},
        {"hd 128, 4 / 2 heads, ungated, D 512", 512, 4, 2, 128, 0, 3, 7, 0, 64},
        {"hd 64, 8 / 8 heads, gated, D 256", 256, 8, 8, 64, 1, 3, 30, 0, 40},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], n_sm);
    test_refusals();
    return TEST_SUMMARY("attn_qs");
}
