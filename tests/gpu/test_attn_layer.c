/* test_attn_layer.c — cuda_attn_layer (src/cuda/attn_layer.cu: a full-attention layer's qkv GEMV, attention and
 * o_proj in one kernel) against the three kernels it replaces, on fresh random weights, inputs and a randomly
 * pre-filled KV cache, over consecutive steps with both caches carried:
 *   qkv GEMV (cuda_matvec, MV_IN_RESIDUAL or MV_IN_EMBED) -> cuda_attn_decode (gated) -> o_proj GEMV (split-K
 *   atomic).
 * Bitwise: the new residual x and, when the GEMV runs with 512 threads as the fused kernel's does, the qkv rows
 * and the K/V cache rows at pos; within bounds: the gated attention output (rel L2 <= 3e-3: the splits merge in
 * another order, then bf16 rounding) and o_proj's y (max diff <= 3e-3 of max |y|). Every other cache row must
 * stay as it was. The zero buffers must be zeroed; bad shapes are refused without a launch. The attention
 * kernel is checked against the CPU in test_attention, the GEMVs in test_matvec.
 * Usage: test_attn_layer [seed]. Skips without a GPU. */
#include <math.h>

#include "cpu/ops.h"
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"

typedef struct Case {
    const char *name;
    int D, Hq, Hkv, R, max_seq, steps, pos0, embed;
} Case;

static Rng rng;

static void run_case(const Case *c, int n_sm) {
    const int D = c->D, Hq = c->Hq, Hkv = c->Hkv, hd = 256, R = c->R, S = c->max_seq, V = 8;
    const int qr = Hq * 2 * hd, rows = qr + 2 * Hkv * hd, ad = Hq * hd;
    const size_t nc = (size_t)Hkv * S * hd;
    const int sup = cuda_attn_layer_supported(D, Hq, Hkv, hd, R, 1);
    printf("-- %s: D %d, %d/%d heads, R %d, %d steps from pos %d%s (supported: %d)\n", c->name, D, Hq, Hkv, R,
           c->steps, c->pos0, c->embed ? ", embedding input" : "", sup);
    if (!sup) {
        CHECK(n_sm < 128, "%s: not supported with %d SMs", c->name, n_sm);
        printf("   skipped: does not fit on this device\n");
        return;
    }
    uint16_t *w_in = bf16_random(&rng, (int64_t)rows * D, 0.04f), *w_out = bf16_random(&rng, (int64_t)D * ad, 0.03f);
    uint16_t *emb = bf16_random(&rng, (int64_t)V * D, 1.0f), *cache = bf16_random(&rng, (int64_t)nc, 1.0f);
    float *ln1 = f32_bf16_random(&rng, D, 0.1f, 0.0f), *qw = f32_bf16_random(&rng, hd, 0.2f, 0.0f);
    float *kw = f32_bf16_random(&rng, hd, 0.2f, 0.0f), *x = f32_bf16_random(&rng, D, 1.0f, 0.0f);
    float *part = malloc(sizeof(float) * D), *inv = malloc(sizeof(float) * (R / 2));
    float *h1 = malloc(sizeof(float) * rows), *h2 = malloc(sizeof(float) * rows);
    float *o1 = malloc(sizeof(float) * ad), *o2 = malloc(sizeof(float) * ad);
    float *y1 = malloc(sizeof(float) * D), *y2 = malloc(sizeof(float) * D), *z = malloc(sizeof(float) * 2 * D);
    uint16_t *c1 = malloc(nc * 2), *c2 = malloc(nc * 2);
    for (int i = 0; i < D; i++) part[i] = 0.5f * rng_normal(&rng);
    cpu_rope_inv_freq(inv, R, 1e7f);
    uint16_t *d_win = dev_copy(w_in, (size_t)rows * D * 2), *d_wout = dev_copy(w_out, (size_t)D * ad * 2);
    uint16_t *d_emb = dev_copy(emb, (size_t)V * D * 2);
    uint16_t *d_K[2] = {dev_copy(cache, nc * 2), dev_copy(cache, nc * 2)};
    uint16_t *d_V[2] = {dev_copy(cache, nc * 2), dev_copy(cache, nc * 2)};
    float *d_ln1 = dev_copy(ln1, D * 4), *d_qw = dev_copy(qw, hd * 4), *d_kw = dev_copy(kw, hd * 4);
    float *d_inv = dev_copy(inv, (size_t)(R / 2) * 4), *d_x = dev_copy(x, D * 4), *d_part = dev_copy(part, D * 4);
    float *d_proj[2] = {dev_poison(rows * 4), dev_poison(rows * 4)};
    float *d_out[2] = {dev_poison(ad * 4), dev_poison(ad * 4)};
    float *d_y[2] = {dev_poison(D * 4), dev_poison(D * 4)}, *d_xo[2] = {dev_poison(D * 4), dev_poison(D * 4)};
    float *d_zero = dev_poison(2 * D * 4), *d_work = dev_poison(cuda_attn_decode_work_bytes(Hq, Hkv, hd, S));
    StepParams *d_step = dev_copy(NULL, sizeof(StepParams));
    const size_t nx = cuda_attn_layer_xbuf_floats(D, Hq, Hkv), ncnt = cuda_attn_layer_xcnt_count(Hkv);
    float *d_xbuf = dev_poison(nx * 4);
    unsigned *d_xcnt = dev_copy(NULL, ncnt * 4);
    if (d_xcnt) cudaMemset(d_xcnt, 0, ncnt * 4);
    CudaLaunch l = {0, 0, NULL, 0};
    if (!d_win || !d_wout || !d_emb || !d_K[0] || !d_K[1] || !d_V[0] || !d_V[1] || !d_ln1 || !d_qw || !d_kw ||
        !d_inv || !d_x || !d_part || !d_proj[0] || !d_proj[1] || !d_out[0] || !d_out[1] || !d_y[0] || !d_y[1] ||
        !d_xo[0] || !d_xo[1] || !d_zero || !d_work || !d_step || !d_xbuf || !d_xcnt) {
        CHECK(0, "%s: device allocation", c->name);
        goto done;
    }
    const int so = cuda_matvec_splits(D, ad, n_sm);
    int ok_x = 1, ok_rows = 1, ok_cache = 1, ok_out = 1, ok_y = 1, ok_zero = 1, rows_bits = 1;
    double worst_o = 0, worst_y = 0;
    for (int t = 0; t < c->steps; t++) {
        StepParams sp;
        memset(&sp, 0, sizeof sp);
        sp.token = (t * 5 + 2) % V, sp.pos = c->pos0 + t;
        CU(cudaMemcpy(d_step, &sp, sizeof sp, cudaMemcpyHostToDevice));
        for (int k = 0; k < 2; k++) {
            CU(cudaMemset(d_proj[k], 0xff, rows * 4));
            CU(cudaMemset(d_out[k], 0xff, ad * 4));
            CU(cudaMemset(d_xo[k], 0xff, D * 4));
            CU(cudaMemset(d_y[k], 0, D * 4));
        }
        CU(cudaMemset(d_zero, 0xff, 2 * D * 4));
        CU(cudaMemset(d_work, 0xff, cuda_attn_decode_work_bytes(Hq, Hkv, hd, S)));
        /* the three kernels */
        MatvecParams mv;
        memset(&mv, 0, sizeof mv);
        mv.W = d_win, mv.rows = rows, mv.cols = D, mv.splits = 1, mv.blocks = cuda_matvec_blocks(rows, D, 1, n_sm);
        if (c->embed)
            mv.in_mode = MV_IN_EMBED, mv.embed = d_emb, mv.step = d_step;
        else
            mv.in_mode = MV_IN_RESIDUAL, mv.x = d_x, mv.parts = d_part, mv.n_parts = 1;
        mv.x_out = d_xo[0], mv.norm_w = d_ln1, mv.norm_mode = NORM_ZC, mv.eps = 1e-6f;
        mv.out_mode = MV_OUT_STORE, mv.y = d_proj[0];
        LAUNCH(cuda_matvec(&mv, &l));
        AttnDecodeParams ap;
        memset(&ap, 0, sizeof ap);
        ap.qkv = d_proj[0], ap.q_norm_w = d_qw, ap.k_norm_w = d_kw, ap.inv_freq = d_inv, ap.k_cache = d_K[0];
        ap.v_cache = d_V[0], ap.out = d_out[0], ap.work = d_work, ap.step = d_step, ap.Hq = Hq, ap.Hkv = Hkv;
        ap.hd = hd, ap.R = R, ap.max_seq = S, ap.gated = 1, ap.norm_mode = NORM_ZC, ap.eps = 1e-6f;
        LAUNCH(cuda_attn_decode(&ap, &l));
        memset(&mv, 0, sizeof mv);
        mv.W = d_wout, mv.rows = D, mv.cols = ad, mv.splits = so, mv.blocks = cuda_matvec_blocks(D, ad, so, n_sm);
        mv.in_mode = MV_IN_VEC, mv.x = d_out[0], mv.out_mode = MV_OUT_SPLITK, mv.atomic = 1, mv.y = d_y[0];
        LAUNCH(cuda_matvec(&mv, &l));
        /* the fused kernel */
        AttnLayerParams p;
        memset(&p, 0, sizeof p);
        p.w_in = d_win, p.w_out = d_wout;
        if (c->embed)
            p.embed = d_emb;
        else
            p.x = d_x, p.parts = d_part, p.n_parts = 1;
        p.x_out = d_xo[1], p.ln1 = d_ln1, p.norm_mode = NORM_ZC, p.proj = d_proj[1], p.q_norm_w = d_qw;
        p.k_norm_w = d_kw, p.inv_freq = d_inv, p.k_cache = d_K[1], p.v_cache = d_V[1], p.out = d_out[1];
        p.y = d_y[1], p.zero0 = d_zero, p.zero1 = d_zero + D, p.n_zero = D, p.xbuf = d_xbuf, p.xcnt = d_xcnt;
        p.step = d_step, p.D = D, p.Hq = Hq, p.Hkv = Hkv, p.hd = hd, p.R = R, p.max_seq = S, p.eps = 1e-6f;
        LAUNCH(cuda_attn_layer(&p, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(h1, d_xo[0], D * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(h2, d_xo[1], D * 4, cudaMemcpyDeviceToHost));
        ok_x &= memcmp(h1, h2, (size_t)D * 4) == 0;
        CU(cudaMemcpy(h1, d_proj[0], rows * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(h2, d_proj[1], rows * 4, cudaMemcpyDeviceToHost));
        rows_bits &= memcmp(h1, h2, (size_t)rows * 4) == 0;
        if (rel_l2(h2, h1, rows) > 1e-5) {
            fprintf(stderr, "  step %d: qkv rows rel L2 %.3g\n", t, rel_l2(h2, h1, rows));
            ok_rows = 0;
        }
        CU(cudaMemcpy(c1, d_K[0], nc * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(c2, d_K[1], nc * 2, cudaMemcpyDeviceToHost));
        size_t nd = 0;
        for (size_t i = 0; i < nc; i++) nd += c1[i] != c2[i];
        CU(cudaMemcpy(c1, d_V[0], nc * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(c2, d_V[1], nc * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nc; i++) nd += c1[i] != c2[i];
        /* only K/V[pos] may differ, and only when the qkv rows do */
        if (nd > (rows_bits ? 0 : (size_t)2 * Hkv * hd)) {
            fprintf(stderr, "  step %d: %zu cache elements differ\n", t, nd);
            ok_cache = 0;
        }
        CU(cudaMemcpy(o1, d_out[0], ad * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(o2, d_out[1], ad * 4, cudaMemcpyDeviceToHost));
        const double eo = rel_l2(o2, o1, ad);
        if (!(eo <= 3e-3)) {
            fprintf(stderr, "  step %d: attention output rel L2 %.3g\n", t, eo);
            ok_out = 0;
        }
        worst_o = fmax(worst_o, eo);
        CU(cudaMemcpy(y1, d_y[0], D * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(y2, d_y[1], D * 4, cudaMemcpyDeviceToHost));
        double amax = 0, dmax = 0;
        for (int i = 0; i < D; i++) amax = fmax(amax, fabs(y1[i])), dmax = fmax(dmax, fabs((double)y2[i] - y1[i]));
        if (!(dmax <= 3e-3 * amax) || !(amax > 0)) {
            fprintf(stderr, "  step %d: y max diff %.3g of max %.3g\n", t, dmax, amax);
            ok_y = 0;
        }
        worst_y = fmax(worst_y, amax > 0 ? dmax / amax : 1);
        CU(cudaMemcpy(z, d_zero, 2 * D * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 2 * D; i++) ok_zero &= z[i] == 0.0f;
        /* the next step: this step's residual; the fused side continues from its own caches */
        CU(cudaMemcpy(d_x, d_xo[0], D * 4, cudaMemcpyDeviceToDevice));
    }
    CHECK(ok_x, "%s: x_out differs from the GEMV's", c->name);
    CHECK(ok_rows, "%s: qkv rows differ from the GEMV's beyond 1e-5", c->name);
    CHECK(ok_cache, "%s: cache rows differ", c->name);
    CHECK(ok_out, "%s: attention output differs beyond 3e-3", c->name);
    CHECK(ok_y, "%s: y differs beyond 3e-3 of its max", c->name);
    CHECK(ok_zero, "%s: zero0 / zero1 not zeroed", c->name);
    printf("   x_out bitwise; qkv rows %s; out worst rel L2 %.2g; y worst max-diff / max %.2g\n",
           rows_bits ? "bitwise (so K/V[pos] too)" : "within 1e-5", worst_o, worst_y);
done:
    cudaFree(d_win), cudaFree(d_wout), cudaFree(d_emb), cudaFree(d_K[0]), cudaFree(d_K[1]), cudaFree(d_V[0]);
    cudaFree(d_V[1]), cudaFree(d_ln1), cudaFree(d_qw), cudaFree(d_kw), cudaFree(d_inv), cudaFree(d_x);
    cudaFree(d_part), cudaFree(d_proj[0]), cudaFree(d_proj[1]), cudaFree(d_out[0]), cudaFree(d_out[1]);
    cudaFree(d_y[0]), cudaFree(d_y[1]), cudaFree(d_xo[0]), cudaFree(d_xo[1]), cudaFree(d_zero), cudaFree(d_work);
    cudaFree(d_step), cudaFree(d_xbuf), cudaFree(d_xcnt);
    free(w_in), free(w_out), free(emb), free(cache), free(ln1), free(qw), free(kw), free(x), free(part), free(inv);
    free(h1), free(h2), free(o1), free(o2), free(y1), free(y2), free(z), free(c1), free(c2);
}

static void test_refusals(void) {
    CHECK(!cuda_attn_layer_supported(1024, 8, 2, 128, 64, 1), "hd 128 accepted");
    CHECK(!cuda_attn_layer_supported(1024, 8, 2, 256, 64, 0), "ungated accepted");
    CHECK(!cuda_attn_layer_supported(2048, 8, 2, 256, 64, 1), "D 2048 accepted");
    CHECK(!cuda_attn_layer_supported(1024, 16, 2, 256, 64, 1), "8 heads per group accepted");
    AttnLayerParams p;
    memset(&p, 0, sizeof p);
    CudaLaunch l = {0, 0, NULL, 0};
    CHECK(cuda_attn_layer(&p, &l) == (int)cudaErrorInvalidValue, "empty params accepted");
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("attn_layer");
    rng_seed(&rng, test_seed(argc, argv, "test_attn_layer"));
    int n_sm = 0;
    CUDA_OK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const Case cases[] = {
        {"qwen3.5-0.8b, from pos 0", 1024, 8, 2, 64, 2048, 4, 0, 0},
        {"0.8b, layer 0 (embedding), chunk edges", 1024, 8, 2, 64, 2048, 3, 31, 1},
        {"0.8b, 64 splits", 1024, 8, 2, 64, 4096, 2, 3000, 0},
        {"0.8b, the last position", 1024, 8, 2, 64, 300, 2, 298, 0},
        {"D 512, 4/1 heads, R 32", 512, 4, 1, 32, 512, 3, 40, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], n_sm);
    test_refusals();
    return TEST_SUMMARY("attn_layer");
}
