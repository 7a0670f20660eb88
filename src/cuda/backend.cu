/* backend.cu — the CUDA Backend table: open (device, checks, one arena for weights + state +
 * activations sized for max_seq, weight upload with stacking/interleaving), the decode step as
 * a CUDA graph captured once per mode (greedy / sampling) and replayed per token, forward() as
 * n decode steps, reset, close, and the bench hook. decode.cu holds the step's launches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/backend.cuh"

#define STAGE_ELEMS (8 << 20) /* bf16 elements in the pinned upload staging buffer (16 MiB) */

static int cfail(cudaError_t e, const char *what, Err *err) {
    return err_set(err, Q35_ERR_CUDA, "cuda: %s: %s", what, cudaGetErrorString(e));
}
#define CK(call, what)                                                                                                 \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) return cfail(e_, what, err);                                                            \
    } while (0)

/* ---- config and weight checks --------------------------------------------------------------------------- */

static int is8(const Tensor *t) { return t->dtype == DT_F8_E4M3; }

static int check_model(const Model *m, Err *err) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    const int D = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
    if (c->num_hidden_layers <= 0 || c->num_hidden_layers > Q35_MAX_LAYERS || !w->layers)
        return err_set(err, Q35_ERR_CONFIG, "cuda backend: model has %d layers", c->num_hidden_layers);
    if (D % 8 || F % 8 || c->attn_dim % 8 || (c->n_linear_layers && c->value_dim % 8))
        return err_set(err, Q35_ERR_CONFIG,
                       "cuda backend: hidden_size %d, intermediate_size %d, attention and value widths must be "
                       "multiples of 8",
                       D, F);
    if (c->n_full_layers) {
        const int G = c->num_key_value_heads > 0 ? c->num_attention_heads / c->num_key_value_heads : 0;
        if ((hd != 32 && hd != 64 && hd != 128 && hd != 256) || G < 1 ||
            G * c->num_key_value_heads != c->num_attention_heads || c->rotary_dim < 2 || c->rotary_dim % 2 ||
            c->rotary_dim > hd)
            return err_set(err, Q35_ERR_CONFIG,
                           "cuda backend: attention needs head_dim 32, 64, 128 or 256, Hq a multiple of Hkv and an "
                           "even rotary_dim <= head_dim (got head_dim %d, %d/%d heads, rotary_dim %d)",
                           hd, c->num_attention_heads, c->num_key_value_heads, c->rotary_dim);
    }
    if (c->n_linear_layers &&
        (c->linear_num_key_heads < 1 || c->linear_num_value_heads % c->linear_num_key_heads ||
         c->linear_key_head_dim < 1 || c->linear_key_head_dim > 1024 || c->linear_value_head_dim < 1 ||
         c->linear_value_head_dim > 1024 || c->linear_conv_kernel_dim < 1))
        return err_set(err, Q35_ERR_CONFIG,
                       "cuda backend: DeltaNet needs Hv %% Hk == 0 and head dims <= 1024 (Hk %d, Hv %d, dk %d, dv %d, "
                       "K %d)",
                       c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                       c->linear_value_head_dim, c->linear_conv_kernel_dim);
    int rc = model_check_weights(m, "cuda backend", 1, err);
    if (rc) return rc;
    /* FP8: the parts of one stacked device matrix share a format; every FP8 matrix has cols % 16 == 0 */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const LayerWeights *L = &w->layers[l];
        const int full = c->layer_types[l] == LAYER_FULL_ATTN;
        const Tensor *a0 = full ? &L->q_proj : &L->in_proj_qkv, *a1 = full ? &L->k_proj : &L->in_proj_z;
        const int mixed = is8(a0) != is8(a1) || (full && is8(a0) != is8(&L->v_proj)) ||
                          (!full && (is8(&L->in_proj_b) != is8(&L->in_proj_a) || (is8(&L->in_proj_b) && !is8(a0)))) ||
                          is8(&L->gate_proj) != is8(&L->up_proj);
        if (mixed)
            return err_set(err, Q35_ERR_FORMAT,
                           "cuda backend: layer %d mixes FP8 and bf16 among the matrices it stacks (%s; gate/up): "
                           "not supported",
                           l, full ? "q/k/v" : "in_proj qkv/z, b/a");
        const int d8 = (is8(a0) && D % 16) || (is8(&L->gate_proj) && D % 16) ||
                       (is8(full ? &L->o_proj : &L->out_proj) && (full ? c->attn_dim : c->value_dim) % 16) ||
                       (is8(&L->down_proj) && F % 16);
        if (d8)
            return err_set(err, Q35_ERR_CONFIG,
                           "cuda backend: FP8 matrices need input widths that are multiples of 16 (layer %d)", l);
    }
    return 0;
}

/* ---- arena layout ------------------------------------------------------------------------------ */

typedef struct Arena {
    char *base; /* NULL: sizing pass */
    size_t off;
} Arena;

static void *carve(Arena *a, size_t bytes) {
    size_t o = (a->off + 255) & ~(size_t)255;
    a->off = o + bytes;
    return a->base ? a->base + o : NULL;
}
#define CARVE(a, ptr, n) ((ptr) = (__typeof__(ptr))carve((a), sizeof(*(ptr)) * (size_t)(n)))

static int imax(int a, int b) { return a > b ? a : b; }

/* Assigns every device pointer of ctx from the arena (run once to size, once to assign). */
static void layout(CudaCtx *ctx, Arena *a) {
    const Config *c = ctx->c;
    const int D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, L = c->num_hidden_layers;
    const int Hv = c->linear_num_value_heads, K = c->linear_conv_kernel_dim, hd = c->head_dim;
    const int tied = ctx->m->w.lm_head.data == ctx->m->w.embed_tokens.data;
    int max_in = 1;
    CARVE(a, ctx->embed, (size_t)V * D);
    if (tied)
        ctx->lm_head = ctx->embed;
    else
        CARVE(a, ctx->lm_head, (size_t)V * D);
    CARVE(a, ctx->final_norm, D);
    CARVE(a, ctx->inv_freq, c->rotary_dim / 2 > 0 ? c->rotary_dim / 2 : 1);
    if (c->n_full_layers)
        ctx->attn_work = (float *)carve(
            a, cuda_attn_decode_work_bytes(c->num_attention_heads, c->num_key_value_heads, hd, ctx->max_seq));
    for (int l = 0; l < L; l++) {
        CudaLayer *ly = &ctx->layers[l];
        ly->type = c->layer_types[l];
        CARVE(a, ly->ln1, D);
        CARVE(a, ly->ln2, D);
        if (ly->type == LAYER_FULL_ATTN) {
            ly->in_rows = c->q_proj_rows + 2 * c->kv_dim;
            ly->out_cols = c->attn_dim;
            CARVE(a, ly->q_norm, hd);
            CARVE(a, ly->k_norm, hd);
        } else {
            ly->in_rows = c->conv_dim + c->value_dim + 2 * Hv;
            ly->out_cols = c->value_dim;
            CARVE(a, ly->conv_w, (size_t)c->conv_dim * K);
            CARVE(a, ly->A_log, Hv);
            CARVE(a, ly->dt_bias, Hv);
            CARVE(a, ly->lin_norm, c->linear_value_head_dim);
        }
        max_in = imax(max_in, ly->in_rows);
        const LayerWeights *L = &ctx->m->w.layers[l];
        const int full = ly->type == LAYER_FULL_ATTN;
        ly->w_in = ly->w_out = ly->w_gu = ly->w_down = ly->w_ba = NULL;
        ly->w8_in = ly->w8_out = ly->w8_gu = ly->w8_down = NULL;
        ly->s_in = ly->s_out = ly->s_gu = ly->s_down = NULL;
        ly->in8_rows = 0;
        if (is8(full ? &L->q_proj : &L->in_proj_qkv)) {
            ly->in8_rows = full || is8(&L->in_proj_b) ? ly->in_rows : ly->in_rows - 2 * Hv;
            CARVE(a, ly->w8_in, (size_t)ly->in8_rows * D);
            CARVE(a, ly->s_in, fp8_scale_count(ly->in8_rows, D));
            if (ly->in8_rows < ly->in_rows) CARVE(a, ly->w_ba, (size_t)2 * Hv * D);
        } else {
            CARVE(a, ly->w_in, (size_t)ly->in_rows * D);
        }
        if (is8(full ? &L->o_proj : &L->out_proj)) {
            CARVE(a, ly->w8_out, (size_t)D * ly->out_cols);
            CARVE(a, ly->s_out, fp8_scale_count(D, ly->out_cols));
        } else {
            CARVE(a, ly->w_out, (size_t)D * ly->out_cols);
        }
        if (is8(&L->gate_proj)) {
            CARVE(a, ly->w8_gu, (size_t)2 * F * D);
            CARVE(a, ly->s_gu, fp8_scale_count(2 * F, D));
        } else {
            CARVE(a, ly->w_gu, (size_t)2 * F * D);
        }
        if (is8(&L->down_proj)) {
            CARVE(a, ly->w8_down, (size_t)D * F);
            CARVE(a, ly->s_down, fp8_scale_count(D, F));
        } else {
            CARVE(a, ly->w_down, (size_t)D * F);
        }
    }
    /* FP8: the bf16 scratch of the prefill GEMMs' dequantized weight (cuda_layer_w_bf16) */
    ctx->w_tmp = NULL;
    ctx->w_tmp_elems = 0;
    if (ctx->fp8) {
        ctx->w_tmp_elems = (size_t)imax(imax(max_in, 2 * F), D) * imax(imax(D, F), imax(c->attn_dim, c->value_dim));
        CARVE(a, ctx->w_tmp, ctx->w_tmp_elems);
    }
    /* the fused MLP: W_down transposed per layer (bytes for an FP8 W_down) */
    for (int l = 0; l < L; l++) {
        ctx->layers[l].w_dT = NULL;
        ctx->layers[l].w8_dT = NULL;
        if (ctx->mlp_fused && ctx->layers[l].w8_down)
            CARVE(a, ctx->layers[l].w8_dT, (size_t)F * D);
        else if (ctx->mlp_fused)
            CARVE(a, ctx->layers[l].w_dT, (size_t)F * D);
    }
    /* the KV caches, zeroed once at open: no kernel reads a row at or past n_past unmasked (a masked row's weight is
     * exactly 0 and its old values are finite), so a new sequence needs no clear of max_seq rows */
    a->off = (a->off + 255) & ~(size_t)255;
    ctx->kv_off = a->off;
    for (int l = 0; l < L; l++) {
        CudaLayer *ly = &ctx->layers[l];
        if (ly->type != LAYER_FULL_ATTN) continue;
        CARVE(a, ly->Kc, (size_t)c->num_key_value_heads * ctx->max_seq * hd);
        CARVE(a, ly->Vc, (size_t)c->num_key_value_heads * ctx->max_seq * hd);
    }
    /* sequence state: one contiguous range, cleared by reset */
    a->off = (a->off + 255) & ~(size_t)255;
    ctx->state_off = a->off;
    for (int l = 0; l < L; l++) {
        CudaLayer *ly = &ctx->layers[l];
        if (ly->type != LAYER_FULL_ATTN) {
            CARVE(a, ly->S, (size_t)Hv * c->linear_key_head_dim * c->linear_value_head_dim);
            ly->conv_ring =
                (uint16_t *)carve(a, cuda_deltanet_conv_ring_bytes(c->linear_num_key_heads, Hv, c->linear_key_head_dim,
                                                                   c->linear_value_head_dim, K));
        }
    }
    ctx->scratch_off = a->off;
    /* split-K partials and the argmax/sampling scratch: zero at first use, kept so by the kernels */
    CARVE(a, ctx->pa, (size_t)ctx->max_splits * D);
    CARVE(a, ctx->pb, (size_t)ctx->max_splits * D);
    CARVE(a, ctx->am_count, 1);
    CARVE(a, ctx->lm_work, CUDA_MV_WORK_WORDS);
    if (c->n_linear_layers) { /* the fused DeltaNet mixer's exchange (deltanet_layer.cu): counters zeroed with the state */
        CARVE(a, ctx->dn_xcnt, cuda_dn_layer_xcnt_count(c->linear_num_value_heads, 32));
        CARVE(a, ctx->dn_xbuf, cuda_dn_layer_xbuf_floats(c->linear_num_value_heads));
    }
    ctx->sample_scratch = carve(a, cuda_sample_scratch_bytes(ctx->n_sm));
    ctx->state_bytes = a->off - ctx->state_off;
    CARVE(a, ctx->x[0], D);
    CARVE(a, ctx->x[1], D);
    CARVE(a, ctx->proj, max_in);
    CARVE(a, ctx->mix, imax(c->value_dim, c->attn_dim));
    CARVE(a, ctx->mlp, F);
    CARVE(a, ctx->logits, V);
    CARVE(a, ctx->am_val, ctx->lm_blocks);
    CARVE(a, ctx->am_idx, ctx->lm_blocks);
    CARVE(a, ctx->out_id, 1);
    CARVE(a, ctx->out_max, 1);
    ctx->lm_q = NULL;
    ctx->lm_p = NULL;
    ctx->lm_meta = NULL;
    ctx->lm_stats = NULL;
    ctx->lm_key = NULL;
    if (ctx->lm_screen) { /* the ring kernel's 6-bit rows, or the register kernel's int8 rows */
        if (ctx->lm_screen == 1 && cuda_lm_screen_ring(V, D)) {
            CARVE(a, ctx->lm_p, (size_t)V * D / 4 * 3);
        } else {
            CARVE(a, ctx->lm_q, (size_t)V * D);
        }
        CARVE(a, ctx->lm_meta, 4 * (size_t)V);
        CARVE(a, ctx->lm_stats, 3);
    }
    CARVE(a, ctx->step_dev, 1);
    if (ctx->lm_screen) ctx->lm_key = &ctx->step_dev->lm_key; /* reset by each step's params copy */
    CARVE(a, ctx->probe_dev, imax(imax(c->value_dim, c->attn_dim), imax(D, c->q_proj_rows)));
}

/* ---- weight upload ------------------------------------------------------------------------------ */

/* Rows [0, rows) of t (any float dtype) -> bf16 rows row0 + r*step of the device matrix dst
 * (cols wide), through the pinned staging buffer. */
static int upload_rows(CudaCtx *ctx, uint16_t *stage, uint16_t *dst, const Tensor *t, int64_t rows, int64_t cols,
                       int64_t row0, int step, Err *err) {
    (void)ctx;
    const int64_t chunk = STAGE_ELEMS / cols > 0 ? STAGE_ELEMS / cols : 1;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t nr = rows - r0 < chunk ? rows - r0 : chunk, n = nr * cols, base = r0 * cols;
        if (t->dtype == DT_BF16) {
            memcpy(stage, (const uint16_t *)t->data + base, (size_t)n * 2);
        } else if (t->dtype == DT_F16) {
            const uint16_t *s = (const uint16_t *)t->data + base;
            for (int64_t i = 0; i < n; i++) stage[i] = f32_to_bf16(f16_to_f32(s[i]));
        } else {
            const float *s = (const float *)t->data + base;
            for (int64_t i = 0; i < n; i++) stage[i] = f32_to_bf16(s[i]);
        }
        uint16_t *d = dst + (row0 + r0 * step) * cols;
        cudaError_t e = step == 1 ? cudaMemcpy(d, stage, (size_t)n * 2, cudaMemcpyHostToDevice)
                                  : cudaMemcpy2D(d, (size_t)step * cols * 2, stage, (size_t)cols * 2, (size_t)cols * 2,
                                                 (size_t)nr, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) return cfail(e, "weight upload", err);
    }
    return 0;
}

/* Rows [0, rows) of the F8_E4M3 tensor t -> rows row0 + r * step of the device matrix dst8 (cols wide), and their
 * scales into the host copy hs of the matrix's per-row scale table (ld rows; ops.h FP8_SCALES_DOC). */
static int upload_fp8_rows(uint8_t *dst8, float *hs, int64_t ld, const Tensor *t, int64_t rows, int64_t cols,
                           int64_t row0, int step, Err *err) {
    uint8_t *d = dst8 + row0 * cols;
    cudaError_t e = step == 1 ? cudaMemcpy(d, t->data, (size_t)(rows * cols), cudaMemcpyHostToDevice)
                              : cudaMemcpy2D(d, (size_t)(step * cols), t->data, (size_t)cols, (size_t)cols,
                                             (size_t)rows, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return cfail(e, "fp8 weight upload", err);
    fp8_scales_per_row(hs, ld, row0, step, t->scale_inv, rows, cols);
    return 0;
}

/* One FP8 device matrix of `rows` rows from up to 3 source tensors ts[i], each of rows nr[i] landing at rows
 * row0[i] + r * step (stacked: step 1, consecutive row0; interleaved gate/up: step 2, row0 0 and 1). */
static int upload_fp8(uint8_t *dst8, float *dsc, int64_t rows, int64_t cols, int n, const Tensor *const *ts,
                      const int64_t *nr, const int64_t *row0, int step, Err *err) {
    const size_t ns = fp8_scale_count((int)rows, (int)cols);
    float *hs = (float *)calloc(ns, sizeof(float));
    if (!hs) return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = upload_fp8_rows(dst8, hs, fp8_scale_ld((int)rows), ts[i], nr[i], cols, row0[i], step, err);
    if (!rc) {
        cudaError_t e = cudaMemcpy(dsc, hs, ns * sizeof(float), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cfail(e, "fp8 scale upload", err);
    }
    free(hs);
    return rc;
}

/* Element i of t (any float dtype) as bf16 bits (upload_rows' conversion). */
static uint16_t elem_bf16(const Tensor *t, int64_t i) {
    if (t->dtype == DT_BF16) return ((const uint16_t *)t->data)[i];
    if (t->dtype == DT_F16) return f32_to_bf16(f16_to_f32(((const uint16_t *)t->data)[i]));
    return f32_to_bf16(((const float *)t->data)[i]);
}

/* t [rows][cols] (any float dtype) -> bf16 dst [cols][rows] on the device (the transpose, on the host). */
static int upload_transposed(uint16_t *dst, const Tensor *t, int64_t rows, int64_t cols, Err *err) {
    uint16_t *h = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(rows * cols));
    if (!h) return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    for (int64_t r0 = 0; r0 < rows; r0 += 64) /* 64-row tiles: each source row read once per tile */
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = r0; r < rows && r < r0 + 64; r++) h[c * rows + r] = elem_bf16(t, r * cols + c);
    cudaError_t e = cudaMemcpy(dst, h, sizeof(uint16_t) * (size_t)(rows * cols), cudaMemcpyHostToDevice);
    free(h);
    return e == cudaSuccess ? 0 : cfail(e, "transposed weight upload", err);
}

/* The F8_E4M3 matrix t [rows][cols] -> e4m3 dst [cols][rows] on the device (the transpose, on the host). */
static int upload_transposed_fp8(uint8_t *dst, const Tensor *t, int64_t rows, int64_t cols, Err *err) {
    uint8_t *h = (uint8_t *)malloc((size_t)(rows * cols));
    if (!h) return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    const uint8_t *src = (const uint8_t *)t->data;
    for (int64_t r0 = 0; r0 < rows; r0 += 64)
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = r0; r < rows && r < r0 + 64; r++) h[c * rows + r] = src[r * cols + c];
    cudaError_t e = cudaMemcpy(dst, h, (size_t)(rows * cols), cudaMemcpyHostToDevice);
    free(h);
    return e == cudaSuccess ? 0 : cfail(e, "transposed fp8 weight upload", err);
}

/* A small vector (n elements of any float dtype) -> fp32 on the device. */
static int upload_vec(float *dst, const Tensor *t, int64_t n, Err *err) {
    float *h = (float *)malloc(sizeof(float) * (size_t)n);
    if (!h) return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == DT_F32)
            h[i] = ((const float *)t->data)[i];
        else if (t->dtype == DT_F16)
            h[i] = f16_to_f32(((const uint16_t *)t->data)[i]);
        else
            h[i] = bf16_to_f32(((const uint16_t *)t->data)[i]);
    }
    cudaError_t e = cudaMemcpy(dst, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice);
    free(h);
    return e == cudaSuccess ? 0 : cfail(e, "vector upload", err);
}

static int upload_weights(CudaCtx *ctx, Err *err) {
    const Config *c = ctx->c;
    const Weights *w = &ctx->m->w;
    const int D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, Hv = c->linear_num_value_heads;
    uint16_t *stage = NULL;
    CK(cudaMallocHost((void **)&stage, (size_t)STAGE_ELEMS * 2), "pinned staging buffer");
    int rc = upload_rows(ctx, stage, ctx->embed, &w->embed_tokens, V, D, 0, 1, err);
    if (!rc && ctx->lm_head != ctx->embed) rc = upload_rows(ctx, stage, ctx->lm_head, &w->lm_head, V, D, 0, 1, err);
    if (!rc) rc = upload_vec(ctx->final_norm, &w->norm, D, err);
    if (!rc && c->rotary_dim >= 2) { /* inv_freq[i] = 1 / theta^(2i/R), exponent in fp32, power in double (as HF) */
        float inv[1024];
        const int half = c->rotary_dim / 2 < 1024 ? c->rotary_dim / 2 : 1024;
        for (int i = 0; i < half; i++)
            inv[i] = (float)(1.0 / pow((double)c->rope_theta, (double)((float)(2 * i) / (float)c->rotary_dim)));
        cudaError_t e = cudaMemcpy(ctx->inv_freq, inv, sizeof(float) * (size_t)half, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cfail(e, "inv_freq upload", err);
    }
    for (int l = 0; l < c->num_hidden_layers && !rc; l++) {
        const LayerWeights *L = &w->layers[l];
        CudaLayer *ly = &ctx->layers[l];
        rc = upload_vec(ly->ln1, &L->input_layernorm, D, err);
        if (!rc) rc = upload_vec(ly->ln2, &L->post_attention_layernorm, D, err);
        if (ly->w8_gu) {
            const Tensor *ts[2] = {&L->gate_proj, &L->up_proj};
            const int64_t nr[2] = {F, F}, r0[2] = {0, 1};
            if (!rc) rc = upload_fp8(ly->w8_gu, ly->s_gu, 2 * F, D, 2, ts, nr, r0, 2, err);
        } else {
            if (!rc) rc = upload_rows(ctx, stage, ly->w_gu, &L->gate_proj, F, D, 0, 2, err);
            if (!rc) rc = upload_rows(ctx, stage, ly->w_gu, &L->up_proj, F, D, 1, 2, err);
        }
        if (ly->w8_down) {
            const Tensor *ts[1] = {&L->down_proj};
            const int64_t nr[1] = {D}, r0[1] = {0};
            if (!rc) rc = upload_fp8(ly->w8_down, ly->s_down, D, F, 1, ts, nr, r0, 1, err);
        } else if (!rc) {
            rc = upload_rows(ctx, stage, ly->w_down, &L->down_proj, D, F, 0, 1, err);
        }
        if (!rc && ly->w_dT) rc = upload_transposed(ly->w_dT, &L->down_proj, D, F, err);
        if (!rc && ly->w8_dT) rc = upload_transposed_fp8(ly->w8_dT, &L->down_proj, D, F, err);
        if (rc) break;
        const int full = ly->type == LAYER_FULL_ATTN;
        const Tensor *o_w = full ? &L->o_proj : &L->out_proj;
        if (ly->w8_out) {
            const Tensor *ts[1] = {o_w};
            const int64_t nr[1] = {D}, r0[1] = {0};
            rc = upload_fp8(ly->w8_out, ly->s_out, D, ly->out_cols, 1, ts, nr, r0, 1, err);
        } else {
            rc = upload_rows(ctx, stage, ly->w_out, o_w, D, ly->out_cols, 0, 1, err);
        }
        if (rc) break;
        if (full) {
            if (ly->w8_in) {
                const Tensor *ts[3] = {&L->q_proj, &L->k_proj, &L->v_proj};
                const int64_t nr[3] = {c->q_proj_rows, c->kv_dim, c->kv_dim},
                              r0[3] = {0, c->q_proj_rows, c->q_proj_rows + c->kv_dim};
                rc = upload_fp8(ly->w8_in, ly->s_in, ly->in_rows, D, 3, ts, nr, r0, 1, err);
            } else {
                rc = upload_rows(ctx, stage, ly->w_in, &L->q_proj, c->q_proj_rows, D, 0, 1, err);
                if (!rc) rc = upload_rows(ctx, stage, ly->w_in, &L->k_proj, c->kv_dim, D, c->q_proj_rows, 1, err);
                if (!rc)
                    rc =
                        upload_rows(ctx, stage, ly->w_in, &L->v_proj, c->kv_dim, D, c->q_proj_rows + c->kv_dim, 1, err);
            }
            if (!rc) rc = upload_vec(ly->q_norm, &L->q_norm, c->head_dim, err);
            if (!rc) rc = upload_vec(ly->k_norm, &L->k_norm, c->head_dim, err);
        } else {
            const int64_t o1 = c->conv_dim, o2 = o1 + c->value_dim, o3 = o2 + Hv;
            if (ly->w8_in) {
                const Tensor *ts[4] = {&L->in_proj_qkv, &L->in_proj_z, &L->in_proj_b, &L->in_proj_a};
                const int64_t nr[4] = {c->conv_dim, c->value_dim, Hv, Hv}, r0[4] = {0, o1, o2, o3};
                rc = upload_fp8(ly->w8_in, ly->s_in, ly->in8_rows, D, ly->w_ba ? 2 : 4, ts, nr, r0, 1, err);
                if (!rc && ly->w_ba) rc = upload_rows(ctx, stage, ly->w_ba, &L->in_proj_b, Hv, D, 0, 1, err);
                if (!rc && ly->w_ba) rc = upload_rows(ctx, stage, ly->w_ba, &L->in_proj_a, Hv, D, Hv, 1, err);
            } else {
                rc = upload_rows(ctx, stage, ly->w_in, &L->in_proj_qkv, c->conv_dim, D, 0, 1, err);
                if (!rc) rc = upload_rows(ctx, stage, ly->w_in, &L->in_proj_z, c->value_dim, D, o1, 1, err);
                if (!rc) rc = upload_rows(ctx, stage, ly->w_in, &L->in_proj_b, Hv, D, o2, 1, err);
                if (!rc) rc = upload_rows(ctx, stage, ly->w_in, &L->in_proj_a, Hv, D, o3, 1, err);
            }
            if (!rc) rc = upload_vec(ly->conv_w, &L->conv1d, (int64_t)c->conv_dim * c->linear_conv_kernel_dim, err);
            if (!rc) rc = upload_vec(ly->A_log, &L->A_log, Hv, err);
            if (!rc) rc = upload_vec(ly->dt_bias, &L->dt_bias, Hv, err);
            if (!rc) rc = upload_vec(ly->lin_norm, &L->linear_norm, c->linear_value_head_dim, err);
        }
    }
    cudaFreeHost(stage);
    return rc;
}

/* ---- the decode schedule ---------------------------------------------------------------------------------- */

/* Which fused kernels the decode step takes, decided once at open from the model's shapes and the device (the
 * splits and lm_blocks are set before): every choice is the fastest measured path where its kernel supports the
 * shapes, else the general one. Deterministic mode and probes take the unfused path per step (decode.cu). */
static void schedule_choose(CudaCtx *ctx) {
    const Config *c = ctx->c;
    const int D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    /* the MLP as one kernel (mlp.cu), else gate_up + down GEMVs: every layer's gate/up and down bf16, or every one
     * FP8 (the kernel's two weight formats) */
    int n_mlp8 = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        n_mlp8 += is8(&ctx->m->w.layers[l].gate_proj) + is8(&ctx->m->w.layers[l].down_proj);
    ctx->mlp_fused = n_mlp8 == 0                          ? cuda_mlp_fused_supported(D, F, ctx->n_sm)
                     : n_mlp8 == 2 * c->num_hidden_layers ? cuda_mlp_fused_supported_fp8(D, F, ctx->n_sm)
                                                          : 0;
    /* the DeltaNet step leaves its gated norm to out_proj wherever out_proj's split-K keeps whole heads per split;
     * else the step's cluster kernel computes it */
    ctx->dn_gn = c->n_linear_layers > 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (ctx->layers[l].type != LAYER_FULL_ATTN &&
            !cuda_matvec_gated_ok(c->value_dim, ctx->layers[l].splits_out, c->linear_value_head_dim))
            ctx->dn_gn = 0;
    /* the DeltaNet mixer as one kernel per layer (deltanet_layer.cu) wherever it runs: the fused MLP (atomic mode), two
     * accumulators' room in pa/pb, its shape, and every block of its grid resident at once */
    int dn_formats = 1; /* the fused mixer takes bf16 in_proj + out_proj, or FP8 ones with in_proj_b / a bf16 */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const LayerWeights *L = &ctx->m->w.layers[l];
        if (c->layer_types[l] != LAYER_FULL_ATTN &&
            (is8(&L->in_proj_qkv) != is8(&L->out_proj) || (is8(&L->in_proj_qkv) && is8(&L->in_proj_b))))
            dn_formats = 0;
    }
    ctx->dn_fused =
        c->n_linear_layers > 0 && ctx->mlp_fused && ctx->max_splits >= 2 && dn_formats
            ? cuda_dn_layer_supported(D, c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                                      c->linear_value_head_dim, c->linear_conv_kernel_dim)
            : 0;
    /* short contexts: attention + o_proj as one kernel (attention.cu attn_short_oproj) */
    ctx->attn_short = c->n_full_layers ? cuda_attn_short_cap(c->head_dim, D) : 0;
    /* the LM head's last 3 rounds of row groups by tickets */
    ctx->lm_dyn = 3;
    /* greedy steps: the LM head's argmax through its quantized screen, the TMA ring kernel where its shapes allow */
    ctx->lm_screen = cuda_lm_screen_ok(V, D) ? (cuda_lm_screen_ring(V, D) ? 1 : 2) : 0;
}

/* ---- a layer's projection as a GEMM weight ---------------------------------------------------------------- */

/* rows and input width of projection `which`; *rows8: its FP8 rows (0 when bf16) */
static void w_shape(const CudaCtx *ctx, const CudaLayer *ly, int which, int *rows, int *rows8, int *cols) {
    const int D = ctx->c->hidden_size, F = ctx->c->intermediate_size;
    const int r[4] = {ly->in_rows, D, 2 * F, D}, k[4] = {D, ly->out_cols, D, F};
    const uint8_t *w8[4] = {ly->w8_in, ly->w8_out, ly->w8_gu, ly->w8_down};
    *rows = r[which];
    *cols = k[which];
    *rows8 = !w8[which] ? 0 : which == CW_IN ? ly->in8_rows : r[which];
}

void cuda_layer_gemm_w(const CudaLayer *ly, int which, int cols, GemmParams *g) {
    const uint16_t *w[4] = {ly->w_in, ly->w_out, ly->w_gu, ly->w_down};
    const uint8_t *w8[4] = {ly->w8_in, ly->w8_out, ly->w8_gu, ly->w8_down};
    const float *sc[4] = {ly->s_in, ly->s_out, ly->s_gu, ly->s_down};
    g->w = w[which];
    g->w8 = w8[which];
    g->w8_scale = sc[which];
    g->ldw = cols;
}

int cuda_layer_gemm_tail(const CudaLayer *ly, int which, GemmParams *g, GemmParams *t) {
    const int tail = which == CW_IN && ly->w_ba && g->w8 ? ly->in_rows - ly->in8_rows : 0;
    if (!tail) return 0;
    g->N -= tail;
    *t = *g;
    t->w = ly->w_ba;
    t->w8 = NULL;
    t->w8_scale = NULL;
    t->N = tail;
    t->y = (uint16_t *)g->y + g->N; /* in_proj: bf16 output */
    return tail;
}

int cuda_layer_w_bf16(CudaCtx *ctx, const CudaLayer *ly, int which, const CudaLaunch *l, uint16_t *dst,
                      const uint16_t **w, size_t *elems) {
    GemmParams g;
    memset(&g, 0, sizeof g);
    int rows, rows8, cols;
    w_shape(ctx, ly, which, &rows, &rows8, &cols);
    if (elems) *elems = (size_t)rows * cols;
    cuda_layer_gemm_w(ly, which, cols, &g);
    *w = g.w;
    if (!g.w8) return 0;
    if (!dst) dst = ctx->w_tmp;
    if (!dst || (size_t)rows * cols > ctx->w_tmp_elems) return (int)cudaErrorInvalidValue;
    const Fp8ToBf16Params p = {g.w8, g.w8_scale, dst, rows8, cols, cols};
    int rc = cuda_fp8_to_bf16(&p, l);
    if (!rc && rows8 < rows) /* the FP8 DeltaNet in_proj's bf16 b / a rows */
        rc = (int)cudaMemcpyAsync(dst + (size_t)rows8 * cols, ly->w_ba, sizeof(uint16_t) * (rows - rows8) * cols,
                                  cudaMemcpyDeviceToDevice, l->stream);
    *w = dst;
    return rc;
}

int cuda_describe(void *p, char *buf, size_t n) {
    const CudaCtx *ctx = (const CudaCtx *)p;
    return snprintf(
        buf, n,
        "decode schedule: %sMLP %s; DeltaNet mixer %s, gated norm in %s; attention + o_proj in one kernel "
        "up to %d positions; LM head argmax %s; DeltaNet state in L2 for %d layers\n",
        ctx->fp8
            ? "FP8 weights (e4m3, per-row scales; prefill: as e4m3 on the skinny GEMM, bf16 copies on the tiled one); "
            : "",
        ctx->mlp_fused ? "fused (one kernel)" : "gate_up + down GEMVs",
        ctx->dn_fused == 2   ? "one kernel (cluster exchange)"
        : ctx->dn_fused == 1 ? "one kernel (tagged global exchange)"
                             : "in_proj + step + out_proj",
        ctx->dn_gn ? "out_proj" : "the step", ctx->attn_short,
        ctx->lm_screen == 1   ? "through the 6-bit screen (ring kernel)"
        : ctx->lm_screen == 2 ? "through the int8 screen (register kernel)"
                              : "over the full bf16 head",
        ctx->l2_state_layers);
}

/* ---- open / close ------------------------------------------------------------------------------ */

/* decode_sample's logit change buffers (pen_upload) */
static void pen_free(CudaCtx *ctx) {
    cudaFree(ctx->pen);
    cudaFree(ctx->pen_row);
    cudaFree(ctx->pen_raw);
    cudaFree(ctx->pen_lp);
    cudaFreeHost(ctx->pen_host);
    cudaFreeHost(ctx->pen_row_host);
    ctx->pen = ctx->pen_host = NULL;
    ctx->pen_row = ctx->pen_row_host = NULL;
    ctx->pen_raw = ctx->pen_lp = NULL;
    ctx->pen_cap = 0;
}

static void be_close(void *p) {
    CudaCtx *ctx = (CudaCtx *)p;
    if (!ctx) return;
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    if (ctx->l2_persist) {
        cudaCtxResetPersistingL2Cache();
        cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
    }
    cuda_serve_close(ctx);   /* serve pools */
    cuda_prefill_close(ctx); /* prefill */
    for (int i = 0; i < (int)(sizeof ctx->graph / sizeof ctx->graph[0]); i++)
        if (ctx->graph[i]) cudaGraphExecDestroy(ctx->graph[i]);
    for (int i = 0; i <= CUDA_MAX_OPS && ctx->ev_ready; i++)
        if (ctx->ev[i]) cudaEventDestroy(ctx->ev[i]);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    if (ctx->arena) cudaFree(ctx->arena);
    if (ctx->step_host) cudaFreeHost(ctx->step_host);
    if (ctx->id_host) cudaFreeHost(ctx->id_host);
    if (ctx->key_host) cudaFreeHost(ctx->key_host);
    if (ctx->logits_host) cudaFreeHost(ctx->logits_host);
    pen_free(ctx);
    free(ctx->probe_buf);
    free(ctx->layers);
    free(ctx);
}

int cuda_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static int open_device(CudaCtx *ctx, int dev, Err *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return err_set(err, Q35_ERR_CUDA, "cuda backend: no CUDA device available (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    if (dev < 0 || dev >= n)
        return err_set(err, Q35_ERR_ARG, "cuda backend: device %d does not exist (%d device%s: 0 .. %d)", dev, n,
                       n == 1 ? "" : "s", n - 1);
    CK(cudaSetDevice(dev), "cudaSetDevice");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    if (prop.major != 9)
        return err_set(err, Q35_ERR_CUDA,
                       "cuda backend: %s has compute capability %d.%d; this build has kernels for sm_90 (H100/H200)",
                       prop.name, prop.major, prop.minor);
    ctx->n_sm = prop.multiProcessorCount;
    return 0;
}

/* Each DeltaNet layer's state S (read and written by every step: 1 MiB per layer for the 0.8B) stays in L2 across
 * steps: dn_layer's launches carry an access policy window over their layer's S, and open sets aside the L2 for
 * as many layers as the device allows (H200: 37.5 MiB). Only a cache hint: results are the same. */
static void l2_persist_setup(CudaCtx *ctx) {
    const Config *c = ctx->c;
    if (!c->n_linear_layers || !ctx->dn_fused) return;
    int max_persist = 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, dev) != cudaSuccess)
        max_persist = 0;
    const size_t per = (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim * 4;
    size_t n = per ? (size_t)max_persist / per : 0;
    if (n > (size_t)c->n_linear_layers) n = (size_t)c->n_linear_layers;
    if (!n || cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, n * per) != cudaSuccess) {
        (void)cudaGetLastError(); /* no set-aside on this device: run without */
        return;
    }
    ctx->l2_persist = n * per;
    ctx->l2_state = per;
    ctx->l2_state_layers = (int)n;
}

static int be_open(void **out, const Model *m, const BackendOptions *o, Err *err) {
    *out = NULL;
    int rc = check_model(m, err);
    if (rc) return rc;
    const Config *c = &m->config;
    CudaCtx *ctx = (CudaCtx *)calloc(1, sizeof *ctx);
    if (!ctx) return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    ctx->m = m;
    ctx->c = c;
    ctx->max_seq =
        o && o->max_seq > 0 ? o->max_seq : (c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096);
    ctx->deterministic = o ? o->deterministic : 0;
    ctx->no_graph = o ? o->no_graph : 0;
    ctx->pdl = o ? !o->no_pdl : 1;
    if (o) ctx->probe = o->probe;
    ctx->n_valid = o && o->n_valid > 0 && o->n_valid < c->vocab_size ? o->n_valid : c->vocab_size;
    ctx->layers = (CudaLayer *)calloc((size_t)c->num_hidden_layers, sizeof(CudaLayer));
    if (!ctx->layers) {
        free(ctx);
        return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    }
    if ((rc = open_device(ctx, o ? o->device : 0, err))) goto fail;
    {
        const int D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
        ctx->fp8 = model_fp8_count(m, NULL) > 0;
        ctx->max_splits = 1;
        for (int l = 0; l < c->num_hidden_layers; l++) { /* split-K of the out and down GEMVs, by format */
            const LayerWeights *L = &m->w.layers[l];
            const int full = c->layer_types[l] == LAYER_FULL_ATTN, oc = full ? c->attn_dim : c->value_dim;
            CudaLayer *ly = &ctx->layers[l];
            ly->type = c->layer_types[l];
            ly->splits_out = is8(full ? &L->o_proj : &L->out_proj) ? cuda_matvec_splits_fp8(D, oc, ctx->n_sm)
                                                                   : cuda_matvec_splits(D, oc, ctx->n_sm);
            ly->splits_down =
                is8(&L->down_proj) ? cuda_matvec_splits_fp8(D, F, ctx->n_sm) : cuda_matvec_splits(D, F, ctx->n_sm);
            ctx->max_splits = imax(ctx->max_splits, imax(ly->splits_out, ly->splits_down));
        }
        ctx->lm_blocks = cuda_matvec_blocks(V, D, 1, ctx->n_sm);
        ctx->attn_splits = c->n_full_layers ? cuda_attn_decode_splits(c->num_key_value_heads, ctx->max_seq) : 0;
        schedule_choose(ctx);
        Arena a = {NULL, 0};
        layout(ctx, &a);
        ctx->arena_bytes = a.off;
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cudaError_t e = cudaMalloc(&ctx->arena, ctx->arena_bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            ctx->arena = NULL;
            rc = err_set(err, Q35_ERR_OOM, "GPU out of memory: needed %.0f MiB, %.0f MiB free (context %d)",
                         ctx->arena_bytes / 1048576.0, free_b / 1048576.0, ctx->max_seq);
            goto fail;
        }
        a.base = (char *)ctx->arena;
        a.off = 0;
        layout(ctx, &a);
        if ((e = cudaMemset((char *)ctx->arena + ctx->kv_off, 0, ctx->state_off + ctx->state_bytes - ctx->kv_off)) !=
            cudaSuccess) {
            rc = cfail(e, "state clear", err);
            goto fail;
        }
        if ((rc = upload_weights(ctx, err))) goto fail;
        if (ctx->lm_screen) { /* the screen's quantized head from the uploaded bf16 one */
            CudaLaunch lq = {0, 0, NULL, 0};
            int qe = cuda_lm_quantize(ctx->lm_head, V, D, ctx->lm_q, ctx->lm_p, ctx->lm_meta, NULL, NULL, &lq);
            if (!qe) qe = (int)cudaMemset(ctx->lm_stats, 0, 3 * sizeof(unsigned));
            if (!qe) qe = (int)cudaDeviceSynchronize();
            if (qe) {
                rc = cfail((cudaError_t)qe, "LM head screen", err);
                goto fail;
            }
        }
        l2_persist_setup(ctx);
        if ((e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) != cudaSuccess ||
            (e = cudaMallocHost((void **)&ctx->step_host, sizeof(StepParams))) != cudaSuccess ||
            (e = cudaMallocHost((void **)&ctx->id_host, sizeof(int))) != cudaSuccess ||
            (e = cudaMallocHost((void **)&ctx->key_host, sizeof(unsigned long long))) != cudaSuccess ||
            (e = cudaMallocHost((void **)&ctx->logits_host, sizeof(float) * (size_t)V)) != cudaSuccess ||
            (e = cudaHostGetDevicePointer((void **)&ctx->step_host_dev, ctx->step_host, 0)) != cudaSuccess) {
            rc = e == cudaErrorMemoryAllocation ? err_set(err, Q35_ERR_OOM, "cuda backend: out of pinned host memory")
                                                : cfail(e, "stream / pinned buffers", err);
            goto fail;
        }
        memset(ctx->step_host, 0, sizeof(StepParams));
        if ((rc = cuda_prefill_open(ctx, o ? o->prefill_piece : 0, err))) goto fail; /* prefill buffers */
        if (ctx->probe.dir) {
            size_t n = (size_t)imax(V, imax(c->q_proj_rows, imax(c->value_dim, F))) + (size_t)(ctx->max_splits + 2) * D;
            if (!(ctx->probe_buf = (float *)malloc(sizeof(float) * n))) {
                rc = err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
                goto fail;
            }
        }
    }
    *out = ctx;
    return 0;
fail:
    be_close(ctx);
    return rc;
}

/* ---- running steps -------------------------------------------------------------------------- */

void cuda_graphs_drop(CudaCtx *ctx) {
    for (int i = 0; i < (int)(sizeof ctx->graph / sizeof ctx->graph[0]); i++) {
        if (ctx->graph[i]) cudaGraphExecDestroy(ctx->graph[i]);
        ctx->graph[i] = NULL;
    }
}

int cuda_graph_index(const CudaCtx *ctx, int sample) {
    return sample + 3 * cuda_step_short(ctx) + 6 * cuda_step_screen(ctx, sample);
}

/* Captures the step (sample = 0 greedy, 1 sampling, 2 with logit changes) into ctx->graph[cuda_graph_index()]. */
int cuda_graph_capture(CudaCtx *ctx, int sample, Err *err) {
    const int gi = cuda_graph_index(ctx, sample);
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal), "begin graph capture");
    int rc = cuda_step_enqueue(ctx, sample, err);
    cudaError_t e = cudaStreamEndCapture(ctx->stream, &g);
    if (rc) {
        if (g) cudaGraphDestroy(g);
        return rc;
    }
    if (e != cudaSuccess) return cfail(e, "end graph capture", err);
    size_t n = 0;
    cudaGraphGetNodes(g, NULL, &n);
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(n ? n : 1, sizeof *nodes);
    int kernels = 0;
    if (nodes && cudaGraphGetNodes(g, nodes, &n) == cudaSuccess)
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType t;
            if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel) kernels++;
        }
    free(nodes);
    ctx->graph_kernels[gi] = kernels;
    e = cudaGraphInstantiate(&ctx->graph[gi], g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        ctx->graph[gi] = NULL;
        return cfail(e, "graph instantiate", err);
    }
    return 0;
}

/* Enqueues one step with the StepParams already in step_host (graph replay or eager). */
int cuda_run_step(CudaCtx *ctx, int sample, Err *err) {
    int rc = cuda_state_clean(ctx, err);
    if (rc) return rc;
    if (ctx->no_graph || ctx->probe.dir) return cuda_step_enqueue(ctx, sample, err);
    const int gi = cuda_graph_index(ctx, sample);
    if (!ctx->graph[gi] && (rc = cuda_graph_capture(ctx, sample, err))) return rc;
    CK(cudaGraphLaunch(ctx->graph[gi], ctx->stream), "graph launch");
    return 0;
}

static int check_step(CudaCtx *ctx, int token, int pos, Err *err) {
    if (pos != ctx->n_past)
        return err_set(err, Q35_ERR_ARG, "cuda forward: pos %d but the sequence holds %d tokens (reset to restart)",
                       pos, ctx->n_past);
    if (pos >= ctx->max_seq)
        return err_set(err, Q35_ERR_CONTEXT, "cuda forward: position %d exceeds the context of %d", pos, ctx->max_seq);
    if (token < 0 || token >= ctx->c->vocab_size)
        return err_set(err, Q35_ERR_ARG, "cuda forward: token id %d outside [0, %d)", token, ctx->c->vocab_size);
    return 0;
}

static int be_forward(void *p, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    const int V = ctx->c->vocab_size;
    if (n <= 0 || !tokens) return err_set(err, Q35_ERR_ARG, "cuda forward: %d tokens", n);
    if ((int64_t)pos + n > ctx->max_seq)
        return err_set(err, Q35_ERR_CONTEXT, "cuda forward: %d + %d tokens exceed the context of %d", pos, n,
                       ctx->max_seq);
    if (n > 1 && ctx->pf && !ctx->probe.dir) /* prefill path (prefill.cu) */
        return cuda_prefill_forward(ctx, tokens, n, pos, all_logits, logits, err);
    for (int i = 0; i < n; i++) {
        int rc = check_step(ctx, tokens[i], pos + i, err);
        if (rc) return rc;
        const int want = logits && (all_logits || i == n - 1);
        StepParams *sp = ctx->step_host;
        memset(sp, 0, sizeof *sp);
        sp->token = tokens[i];
        sp->pos = pos + i;
        sp->write_logits = want;
        sp->top_p = 1.0f;
        if ((rc = cuda_run_step(ctx, 0, err))) return rc;
        if (want)
            CK(cudaMemcpyAsync(ctx->logits_host, ctx->logits, sizeof(float) * (size_t)V, cudaMemcpyDeviceToHost,
                               ctx->stream),
               "logits readback");
        CK(cudaStreamSynchronize(ctx->stream), "decode step");
        if (want) memcpy(logits + (all_logits ? (size_t)i * V : 0), ctx->logits_host, sizeof(float) * (size_t)V);
        ctx->n_past++;
    }
    return 0;
}

/* The step's logit changes (s->pen [n_pen]) and their row to the device, on ctx->stream ahead of the step; the buffers
 * are allocated at the first call. */
static int pen_upload(CudaCtx *ctx, const DeviceSampling *s, Err *err) {
    const int cap = ctx->c->vocab_size;
    if (s->n_pen > cap || !s->pen)
        return err_set(err, Q35_ERR_ARG, "cuda decode: %d logit changes for a vocabulary of %d", s->n_pen, cap);
    if (!ctx->pen) {
        cudaError_t e = cudaMalloc((void **)&ctx->pen, sizeof(SamplePenalty) * (size_t)cap);
        if (e == cudaSuccess) e = cudaMalloc((void **)&ctx->pen_raw, sizeof(float) * (size_t)cap);
        if (e == cudaSuccess) e = cudaMalloc((void **)&ctx->pen_row, sizeof(PenaltyRow));
        if (e == cudaSuccess) e = cudaMalloc((void **)&ctx->pen_lp, sizeof(float));
        if (e == cudaSuccess) e = cudaMallocHost((void **)&ctx->pen_host, sizeof(SamplePenalty) * (size_t)cap);
        if (e == cudaSuccess) e = cudaMallocHost((void **)&ctx->pen_row_host, sizeof(PenaltyRow));
        if (e != cudaSuccess) { /* the next call tries again */
            pen_free(ctx);
            return err_set(err, Q35_ERR_OOM, "cuda decode: no memory for the logit changes: %s", cudaGetErrorString(e));
        }
        ctx->pen_cap = cap;
        CK(cudaMemset(ctx->pen_lp, 0, sizeof(float)), "logit changes");
    }
    memcpy(ctx->pen_host, s->pen, sizeof(SamplePenalty) * (size_t)s->n_pen);
    *ctx->pen_row_host = (PenaltyRow){0, s->n_pen, s->repetition, s->presence, s->frequency, 0.0f};
    CK(cudaMemcpyAsync(ctx->pen, ctx->pen_host, sizeof(SamplePenalty) * (size_t)s->n_pen, cudaMemcpyHostToDevice,
                       ctx->stream),
       "logit changes upload");
    CK(cudaMemcpyAsync(ctx->pen_row, ctx->pen_row_host, sizeof(PenaltyRow), cudaMemcpyHostToDevice, ctx->stream),
       "logit changes upload");
    return 0;
}

static int be_decode_sample(void *p, int token, int pos, const DeviceSampling *s, int *out_id, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    int rc = check_step(ctx, token, pos, err);
    if (rc) return rc;
    if (!(s->temperature >= 0) || s->top_k < 0 || !(s->top_p > 0 && s->top_p <= 1) ||
        !(s->min_p >= 0 && s->min_p <= 1) || s->n_pen < 0)
        return err_set(err, Q35_ERR_ARG,
                       "cuda decode: bad sampling settings (temperature %g, top_k %d, top_p %g, min_p %g, %d changes)",
                       s->temperature, s->top_k, s->top_p, s->min_p, s->n_pen);
    if (s->n_pen > 0 && (rc = pen_upload(ctx, s, err))) return rc;
    const int sample = s->n_pen > 0 ? 2 : s->temperature > 0;
    StepParams *sp = ctx->step_host;
    memset(sp, 0, sizeof *sp);
    sp->token = token;
    sp->pos = pos;
    sp->write_logits = sample != 0;
    sp->temperature = s->temperature;
    sp->top_k = s->top_k;
    sp->top_p = s->top_p;
    sp->min_p = s->min_p;
    sp->seed = s->seed;
    sp->step = s->step;
    const int screen = cuda_step_screen(ctx, sample); /* the id comes as the screen's key (lm_screen.cu) */
    if ((rc = cuda_run_step(ctx, sample, err))) return rc;
    if (screen)
        CK(cudaMemcpyAsync(ctx->key_host, ctx->lm_key, sizeof *ctx->key_host, cudaMemcpyDeviceToHost, ctx->stream),
           "id readback");
    else
        CK(cudaMemcpyAsync(ctx->id_host, ctx->out_id, sizeof(int), cudaMemcpyDeviceToHost, ctx->stream), "id readback");
    CK(cudaStreamSynchronize(ctx->stream), "decode step");
    *out_id = screen ? cuda_lm_key_id(*ctx->key_host, NULL) : *ctx->id_host;
    ctx->n_past++;
    return 0;
}

/* A new sequence: S, the conv rings and the scratch are marked to be zeroed (cuda_state_clean) by whatever runs next;
 * no GPU work here, so a prompt's prefill starts without a memset ahead of it. */
static int be_reset(void *p, Err *err) {
    (void)err;
    CudaCtx *ctx = (CudaCtx *)p;
    ctx->state_dirty = CUDA_DIRTY_STATE | CUDA_DIRTY_SCRATCH;
    ctx->n_past = 0;
    return 0;
}

int cuda_state_zero(CudaCtx *ctx, int parts, Err *err) {
    const size_t end = ctx->state_off + ctx->state_bytes;
    const size_t from = parts & CUDA_DIRTY_STATE ? ctx->state_off : ctx->scratch_off,
                 to = parts & CUDA_DIRTY_SCRATCH ? end : ctx->scratch_off;
    if (to > from) CK(cudaMemsetAsync((char *)ctx->arena + from, 0, to - from, ctx->stream), "reset");
    return 0;
}

int cuda_state_clean(CudaCtx *ctx, Err *err) {
    const int rc = ctx->state_dirty ? cuda_state_zero(ctx, ctx->state_dirty, err) : 0;
    if (!rc) ctx->state_dirty = 0;
    return rc;
}

static int be_bench(void *p, const BenchRequest *rq, BenchResult *res, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    if (rq->ablate && *rq->ablate) { /* measurement only: the decode step's kinds and the prefill's pf.* */
        char bad[64];
        if (!cuda_ablate_check(rq->ablate, bad, sizeof bad))
            return err_set(err, Q35_ERR_ARG, "bench --ablate: unknown kind '%s' (known: %s)", bad, cuda_ablate_kinds);
        fprintf(stderr, "qwen35 bench: --ablate %s: those kernels are left out, outputs are garbage\n", rq->ablate);
    }
    int rc = rq->n_prefill > 0 ? cuda_prefill_bench(ctx, rq, res, err) : cuda_bench_run(ctx, rq, res, err);
    cuda_graphs_drop(ctx);
    int rc2 = be_reset(ctx, rc ? NULL : err);
    return rc ? rc : rc2;
}

const Backend cuda_backend = {.name = "cuda",
                              .open = be_open,
                              .forward = be_forward,
                              .decode_sample = be_decode_sample,
                              .reset = be_reset,
                              .close = be_close,
                              .bench = be_bench,
                              .serve_sizes = cuda_serve_sizes,
                              .serve_open = cuda_serve_open,
                              .serve_close = cuda_serve_close,
                              .step_batch = cuda_step_batch,
                              .seq_end = cuda_seq_end,
                              .snap_save = cuda_snap_save,
                              .snap_load = cuda_snap_load,
                              .block_copy = cuda_block_copy,
                              .snap_copy = cuda_snap_copy};
