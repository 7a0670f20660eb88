/* backend.cu — the CUDA Backend table: open (device, checks, one arena for weights + state +
 * activations sized for max_seq, weight upload with stacking/interleaving), the decode step as
 * a CUDA graph captured once per mode (greedy / sampling) and replayed per token, forward() as
 * n decode steps, reset, close, and the bench hook. forward.cu holds the step's launches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/forward.cuh"

#define STAGE_ELEMS (8 << 20) /* bf16 elements in the pinned upload staging buffer (16 MiB) */

static int cfail(cudaError_t e, const char *what, Err *err) {
    return err_set(err, Q35_ERR_CUDA, "cuda: %s: %s", what, cudaGetErrorString(e));
}
#define CK(call, what)                                              \
    do {                                                            \
        cudaError_t e_ = (call);                                    \
        if (e_ != cudaSuccess) return cfail(e_, what, err);         \
    } while (0)

/* ---- config and weight checks --------------------------------------------------------------------------- */

static int check_model(const Model *m, Err *err) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    const int D = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
    if (c->num_hidden_layers <= 0 || c->num_hidden_layers > Q35_MAX_LAYERS || !w->layers)
        return err_set(err, Q35_ERR_CONFIG, "cuda backend: model has %d layers", c->num_hidden_layers);
    if (D % 8 || F % 8 || c->attn_dim % 8 || (c->n_linear_layers && c->value_dim % 8))
        return err_set(err, Q35_ERR_CONFIG,
                       "cuda backend: hidden_size %d, intermediate_size %d, attention and value widths must be "
                       "multiples of 8", D, F);
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
                       "K %d)", c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                       c->linear_value_head_dim, c->linear_conv_kernel_dim);
    return model_check_weights(m, "cuda backend", err);
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
        ctx->attn_work = (float *)carve(a, cuda_attn_decode_work_bytes(c->num_attention_heads, c->num_key_value_heads,
                                                                       hd, ctx->max_seq));
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
        CARVE(a, ly->w_in, (size_t)ly->in_rows * D);
        CARVE(a, ly->w_out, (size_t)D * ly->out_cols);
        CARVE(a, ly->w_gu, (size_t)2 * F * D);
        CARVE(a, ly->w_down, (size_t)D * F);
    }
    if (L > 0 && a->base) {
        const CudaLayer *last = &ctx->layers[L - 1];
        ctx->ws_beg = (const char *)ctx->layers[0].ln1;
        ctx->ws_layers = (long long)((const char *)(last->w_down + (size_t)D * F) - ctx->ws_beg);
    }
    /* fused MLP (experimental): W_down transposed per layer, only when the option is on */
    for (int l = 0; l < L; l++) {
        ctx->layers[l].w_dT = NULL;
        if (ctx->mlp_fused) CARVE(a, ctx->layers[l].w_dT, (size_t)F * D);
    }
    /* sequence state: one contiguous range, cleared by reset */
    a->off = (a->off + 255) & ~(size_t)255;
    ctx->state_off = a->off;
    for (int l = 0; l < L; l++) {
        CudaLayer *ly = &ctx->layers[l];
        if (ly->type == LAYER_FULL_ATTN) {
            CARVE(a, ly->Kc, (size_t)c->num_key_value_heads * ctx->max_seq * hd);
            CARVE(a, ly->Vc, (size_t)c->num_key_value_heads * ctx->max_seq * hd);
        } else {
            CARVE(a, ly->S, (size_t)Hv * c->linear_key_head_dim * c->linear_value_head_dim);
            ly->conv_ring = (uint16_t *)carve(
                a, cuda_deltanet_conv_ring_bytes(c->linear_num_key_heads, Hv, c->linear_key_head_dim,
                                                 c->linear_value_head_dim, K));
        }
    }
    /* split-K partials and the argmax/sampling scratch: zero at first use, kept so by the kernels */
    CARVE(a, ctx->pa, (size_t)ctx->max_splits * D);
    CARVE(a, ctx->pb, (size_t)ctx->max_splits * D);
    CARVE(a, ctx->am_count, 1);
    CARVE(a, ctx->lm_work, CUDA_MV_WORK_WORDS);
    CARVE(a, ctx->mega_bar, 64);
    if (c->n_linear_layers) { /* the fused DeltaNet mixer's exchange (dn_layer.cu): counters zeroed with the state */
        CARVE(a, ctx->dn_xcnt, cuda_dn_layer_xcnt_count(c->linear_num_value_heads, 32));
        CARVE(a, ctx->dn_xbuf, cuda_dn_layer_xbuf_floats(c->linear_num_value_heads));
        CARVE(a, ctx->dn_gcnt, 1);
    }
    if (c->n_full_layers) { /* the fused attention layer's exchange (attn_layer.cu): counters zeroed with the state */
        CARVE(a, ctx->al_xcnt, cuda_attn_layer_xcnt_count(c->num_key_value_heads));
        CARVE(a, ctx->al_xbuf, cuda_attn_layer_xbuf_floats(D, c->num_attention_heads, c->num_key_value_heads));
        CARVE(a, ctx->qs_tag, cuda_attn_qs_tag_words(c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                                                     c->attn_output_gate));
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
    ctx->lm_q = NULL, ctx->lm_p = NULL, ctx->lm_meta = NULL, ctx->lm_stats = NULL, ctx->lm_key = NULL;
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
    CARVE(a, ctx->mega_layers, L);
    if (c->n_full_layers)
        ctx->mega_work = (float *)carve(a, cuda_mega_work_bytes(c->num_attention_heads, hd, ctx->n_sm,
                                                                c->num_key_value_heads));
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
                                  : cudaMemcpy2D(d, (size_t)step * cols * 2, stage, (size_t)cols * 2,
                                                 (size_t)cols * 2, (size_t)nr, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) return cfail(e, "weight upload", err);
    }
    return 0;
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

/* A small vector (n elements of any float dtype) -> fp32 on the device. */
static int upload_vec(float *dst, const Tensor *t, int64_t n, Err *err) {
    float *h = (float *)malloc(sizeof(float) * (size_t)n);
    if (!h) return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == DT_F32) h[i] = ((const float *)t->data)[i];
        else if (t->dtype == DT_F16) h[i] = f16_to_f32(((const uint16_t *)t->data)[i]);
        else h[i] = bf16_to_f32(((const uint16_t *)t->data)[i]);
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
        if (!rc) rc = upload_rows(ctx, stage, ly->w_gu, &L->gate_proj, F, D, 0, 2, err);
        if (!rc) rc = upload_rows(ctx, stage, ly->w_gu, &L->up_proj, F, D, 1, 2, err);
        if (!rc) rc = upload_rows(ctx, stage, ly->w_down, &L->down_proj, D, F, 0, 1, err);
        if (!rc && ly->w_dT) rc = upload_transposed(ly->w_dT, &L->down_proj, D, F, err);
        if (rc) break;
        if (ly->type == LAYER_FULL_ATTN) {
            rc = upload_rows(ctx, stage, ly->w_in, &L->q_proj, c->q_proj_rows, D, 0, 1, err);
            if (!rc) rc = upload_rows(ctx, stage, ly->w_in, &L->k_proj, c->kv_dim, D, c->q_proj_rows, 1, err);
            if (!rc)
                rc = upload_rows(ctx, stage, ly->w_in, &L->v_proj, c->kv_dim, D, c->q_proj_rows + c->kv_dim, 1, err);
            if (!rc) rc = upload_rows(ctx, stage, ly->w_out, &L->o_proj, D, c->attn_dim, 0, 1, err);
            if (!rc) rc = upload_vec(ly->q_norm, &L->q_norm, c->head_dim, err);
            if (!rc) rc = upload_vec(ly->k_norm, &L->k_norm, c->head_dim, err);
        } else {
            const int64_t o1 = c->conv_dim, o2 = o1 + c->value_dim, o3 = o2 + Hv;
            rc = upload_rows(ctx, stage, ly->w_in, &L->in_proj_qkv, c->conv_dim, D, 0, 1, err);
            if (!rc) rc = upload_rows(ctx, stage, ly->w_in, &L->in_proj_z, c->value_dim, D, o1, 1, err);
            if (!rc) rc = upload_rows(ctx, stage, ly->w_in, &L->in_proj_b, Hv, D, o2, 1, err);
            if (!rc) rc = upload_rows(ctx, stage, ly->w_in, &L->in_proj_a, Hv, D, o3, 1, err);
            if (!rc) rc = upload_rows(ctx, stage, ly->w_out, &L->out_proj, D, c->value_dim, 0, 1, err);
            if (!rc) rc = upload_vec(ly->conv_w, &L->conv1d, (int64_t)c->conv_dim * c->linear_conv_kernel_dim, err);
            if (!rc) rc = upload_vec(ly->A_log, &L->A_log, Hv, err);
            if (!rc) rc = upload_vec(ly->dt_bias, &L->dt_bias, Hv, err);
            if (!rc) rc = upload_vec(ly->lin_norm, &L->linear_norm, c->linear_value_head_dim, err);
        }
    }
    cudaFreeHost(stage);
    return rc;
}

/* ---- the persistent layer kernel ------------------------------------------------------------------ */

/* Fills ctx->mega_p and the device layer table; ctx->mega_ok = 1 when the kernel supports the model. */
static int mega_setup(CudaCtx *ctx, Err *err) {
    const Config *c = ctx->c;
    const int L = c->num_hidden_layers;
    MegaLayer *h = (MegaLayer *)calloc((size_t)L, sizeof *h);
    if (!h) return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    for (int l = 0; l < L; l++) {
        const CudaLayer *ly = &ctx->layers[l];
        MegaLayer *m = &h[l];
        m->w_in = ly->w_in, m->w_out = ly->w_out, m->w_gu = ly->w_gu, m->w_down = ly->w_down;
        m->ln1 = ly->ln1, m->ln2 = ly->ln2;
        m->type = ly->type == LAYER_FULL_ATTN ? 1 : 0, m->in_rows = ly->in_rows, m->out_cols = ly->out_cols;
        m->conv_w = ly->conv_w, m->A_log = ly->A_log, m->dt_bias = ly->dt_bias, m->lin_norm = ly->lin_norm;
        m->S = ly->S, m->conv_ring = ly->conv_ring;
        m->q_norm = ly->q_norm, m->k_norm = ly->k_norm, m->Kc = ly->Kc, m->Vc = ly->Vc;
    }
    cudaError_t e = cudaMemcpy(ctx->mega_layers, h, sizeof *h * (size_t)L, cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess) return cfail(e, "layer table upload", err);
    MegaParams *p = &ctx->mega_p;
    memset(p, 0, sizeof *p);
    p->layers = ctx->mega_layers, p->L = L, p->D = c->hidden_size, p->F = c->intermediate_size;
    if (c->n_linear_layers) {
        p->Hk = c->linear_num_key_heads, p->Hv = c->linear_num_value_heads, p->dk = c->linear_key_head_dim;
        p->dv = c->linear_value_head_dim, p->K = c->linear_conv_kernel_dim, p->conv_dim = c->conv_dim;
        p->value_dim = c->value_dim;
    }
    if (c->n_full_layers) {
        p->Hq = c->num_attention_heads, p->Hkv = c->num_key_value_heads, p->hd = c->head_dim, p->R = c->rotary_dim;
        p->gated = c->attn_output_gate, p->max_seq = ctx->max_seq, p->attn_dim = c->attn_dim;
        p->nsplit = p->Hkv > 0 && ctx->n_sm / p->Hkv > 1 ? ctx->n_sm / p->Hkv : 1;
        p->work = ctx->mega_work;
    }
    p->norm_mode = c->family == FAMILY_QWEN35 ? NORM_ZC : NORM_PLAIN;
    p->eps = c->rms_norm_eps;
    p->embed = ctx->embed, p->inv_freq = ctx->inv_freq, p->step = ctx->step_dev;
    p->x0 = ctx->x[0], p->x1 = ctx->x[1], p->proj = ctx->proj, p->mix = ctx->mix, p->aout = ctx->pa;
    p->mlp = ctx->mlp, p->dout = ctx->pb, p->bar = ctx->mega_bar;
    ctx->mega_blocks = ctx->n_sm;
    ctx->mega_ok = cuda_mega_prepare(p, ctx->n_sm, ctx->mega_why, sizeof ctx->mega_why) == 0;
    return 0;
}

/* ---- open / close ------------------------------------------------------------------------------ */

static void be_close(void *p) {
    CudaCtx *ctx = (CudaCtx *)p;
    if (!ctx) return;
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    if (ctx->l2_persist) {
        cudaCtxResetPersistingL2Cache();
        cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
    }
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
    free(ctx->probe_buf);
    free(ctx->layers);
    free(ctx);
}

int cuda_decode_path(void *p, char *why, size_t n) {
    const CudaCtx *ctx = (const CudaCtx *)p;
    if (why && n) snprintf(why, n, "%s", ctx->mega ? "" : ctx->mega_ok ? "disabled" : ctx->mega_why);
    return ctx->mega;
}

int cuda_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static int open_device(CudaCtx *ctx, Err *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return err_set(err, Q35_ERR_CUDA, "cuda backend: no CUDA device available (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    CK(cudaSetDevice(0), "cudaSetDevice(0)");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    if (prop.major != 9)
        return err_set(err, Q35_ERR_CUDA,
                       "cuda backend: %s has compute capability %d.%d; this build has kernels for sm_90 (H100/H200)",
                       prop.name, prop.major, prop.minor);
    ctx->n_sm = prop.multiProcessorCount;
    return 0;
}

/* Each DeltaNet layer's state S (read and written by every step: 1 MiB per layer for the 0.8B) stays in L2 across
 * steps: dn_layer's launches carry an access policy window over their layer's S, and open sets aside the L2 for
 * as many layers as the device allows (H200: 37.5 MiB; docs/PERF_NOTES.md §21: -3 us per token at ctx 128;
 * QWEN35_L2_STATE=0 at open: off). Only a cache hint: results are the same. (The LM head's last rows kept the same
 * way measured slower: +5 us for 24 MiB.) */
static void l2_persist_setup(CudaCtx *ctx) {
    const Config *c = ctx->c;
    const char *st = getenv("QWEN35_L2_STATE");
    if (st && *st && strcmp(st, "0") && strcmp(st, "1"))
        fprintf(stderr, "qwen35: QWEN35_L2_STATE=%s ignored (0 or 1; default 1)\n", st);
    if ((st && !strcmp(st, "0")) || !c->n_linear_layers || !ctx->dn_fused) return;
    int max_persist = 0;
    if (cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, 0) != cudaSuccess) max_persist = 0;
    const size_t per = (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim * 4;
    size_t n = per ? (size_t)max_persist / per : 0;
    if (n > (size_t)c->n_linear_layers) n = (size_t)c->n_linear_layers;
    if (!n || cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, n * per) != cudaSuccess) {
        (void)cudaGetLastError(); /* no set-aside on this device: run without */
        return;
    }
    ctx->l2_persist = n * per, ctx->l2_state = per, ctx->l2_state_layers = (int)n;
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
    ctx->max_seq = o && o->max_seq > 0 ? o->max_seq : (c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096);
    ctx->deterministic = o ? o->deterministic : 0;
    ctx->no_graph = o ? o->no_graph : 0;
    ctx->pdl = o ? !o->no_pdl : 1;
    ctx->pf_ahead = CUDA_PF_AHEAD;
    ctx->pdl_early = CUDA_PDL_EARLY;
    if (o) ctx->probe = o->probe;
    ctx->n_valid = o && o->n_valid > 0 && o->n_valid < c->vocab_size ? o->n_valid : c->vocab_size;
    ctx->layers = (CudaLayer *)calloc((size_t)c->num_hidden_layers, sizeof(CudaLayer));
    if (!ctx->layers) {
        free(ctx);
        return err_set(err, Q35_ERR_OOM, "cuda backend: out of host memory");
    }
    if ((rc = open_device(ctx, err))) goto fail;
    {
        const int D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
        ctx->splits_out[0] = cuda_matvec_splits(D, c->value_dim > 0 ? c->value_dim : 8, ctx->n_sm);
        ctx->splits_out[1] = cuda_matvec_splits(D, c->attn_dim, ctx->n_sm);
        ctx->splits_down = cuda_matvec_splits(D, F, ctx->n_sm);
        ctx->max_splits = imax(imax(ctx->splits_out[0], ctx->splits_out[1]), ctx->splits_down);
        ctx->lm_blocks = cuda_matvec_blocks(V, D, 1, ctx->n_sm);
        ctx->attn_splits = c->n_full_layers ? cuda_attn_decode_splits(c->num_key_value_heads, ctx->max_seq) : 0;
        /* experimental fused MLP: only where the kernel supports the shapes (else the two GEMVs) */
        ctx->mlp_fused = o && o->mlp_fused && cuda_mlp_fused_supported(D, F, ctx->n_sm);
        /* the DeltaNet step leaves its gated norm to out_proj wherever out_proj's split-K keeps whole heads
         * per split (H200: -31 us per token, docs/PERF_NOTES.md §15); QWEN35_DN_GN=0 at open: the cluster
         * kernel with the norm in the step (the comparator in tests) */
        const char *gn = getenv("QWEN35_DN_GN");
        const int gn_off = gn && *gn && atoi(gn) == 0;
        ctx->dn_gn = !gn_off && c->n_linear_layers > 0 &&
                     cuda_matvec_gated_ok(c->value_dim, ctx->splits_out[0], c->linear_value_head_dim);
        if (gn && atoi(gn) == 1 && !ctx->dn_gn && c->n_linear_layers > 0) /* asked for explicitly: say it is off */
            fprintf(stderr, "qwen35: QWEN35_DN_GN=1 ignored: out_proj's split-K does not keep whole heads here\n");
        /* the DeltaNet mixer as one kernel per layer (dn_layer.cu, docs/PERF_NOTES.md §16-17; QWEN35_DN_FUSED=0 at
         * open: off) wherever it runs: the fused MLP (atomic mode), two accumulators' room in pa/pb, its shape, and
         * every block of its grid resident at once (the heads' exchanges spin on each other) */
        const char *df = getenv("QWEN35_DN_FUSED");
        const int df_off = df && *df && atoi(df) == 0;
        const int dl = !df_off && c->n_linear_layers > 0 && ctx->mlp_fused && ctx->max_splits >= 2
                           ? cuda_dn_layer_supported(D, c->linear_num_key_heads, c->linear_num_value_heads,
                                                     c->linear_key_head_dim, c->linear_value_head_dim,
                                                     c->linear_conv_kernel_dim)
                           : 0;
        ctx->dn_fused = dl; /* 2: the heads exchange through clusters, 1: through global memory (dn_xbuf) */
        if (df && atoi(df) == 1 && !ctx->dn_fused && c->n_linear_layers > 0)
            fprintf(stderr, "qwen35: QWEN35_DN_FUSED=1 ignored: shape, grid occupancy or the unfused MLP\n");
        /* with one exchange per layer instead of two (H200: -23 us per token, docs/PERF_NOTES.md §18; QWEN35_DN_ONEX=0
         * at open: the two-exchange kernel, whose o and S are bitwise the three kernels') */
        const char *ox = getenv("QWEN35_DN_ONEX");
        int oxv = ox && *ox ? atoi(ox) : CUDA_DN_ONEX_DEFAULT; /* 1: arrival counter, 2: tagged words */
        if (oxv < 0 || oxv > 2) {
            fprintf(stderr, "qwen35: QWEN35_DN_ONEX=%s ignored (0, 1 or 2)\n", ox);
            oxv = CUDA_DN_ONEX_DEFAULT;
        }
        ctx->dn_onex = ctx->dn_fused == 1 ? oxv : 0;
        if (oxv >= 1 && !ctx->dn_onex && c->n_linear_layers > 0 && ox && *ox)
            fprintf(stderr, "qwen35: QWEN35_DN_ONEX=%s ignored: needs the fused mixer's global-memory exchange\n", ox);
        /* its exchange counters one 128-byte line each (QWEN35_DN_XSTRIDE=1: packed, as measured in §17) */
        const char *xs = getenv("QWEN35_DN_XSTRIDE");
        ctx->dn_xstride = xs && atoi(xs) >= 1 && atoi(xs) <= 32 ? atoi(xs) : 32;
        if (xs && *xs && ctx->dn_xstride != atoi(xs))
            fprintf(stderr, "qwen35: QWEN35_DN_XSTRIDE=%s ignored (1 .. 32; default 32)\n", xs);
        /* EXPERIMENTAL, measured slower (§17): with it, the MLP as that kernel's tail (one kernel per DeltaNet layer) */
        const char *dm = getenv("QWEN35_DN_MLP"), *dma = getenv("QWEN35_DN_MLP_AT");
        ctx->dn_mlp = dm && atoi(dm) == 1 && ctx->dn_fused &&
                      cuda_dn_layer_mlp_supported(D, c->linear_num_key_heads, c->linear_num_value_heads,
                                                  c->linear_key_head_dim, c->linear_value_head_dim,
                                                  c->linear_conv_kernel_dim, F);
        const int dma_ok = dma && *dma && atoi(dma) >= 0 && atoi(dma) <= 3;
        if (dma && *dma && !dma_ok) fprintf(stderr, "qwen35: QWEN35_DN_MLP_AT=%s ignored (0 .. 3; default 1)\n", dma);
        if (ctx->dn_mlp) ctx->dn_mlp = 1 + (dma_ok ? atoi(dma) : 1);
        if (dm && atoi(dm) == 1 && !ctx->dn_mlp && c->n_linear_layers > 0)
            fprintf(stderr, "qwen35: QWEN35_DN_MLP=1 ignored: needs the fused mixer, D <= 1024 and the shared memory\n");
        /* short contexts: attention + o_proj as one kernel (attention.cu attn_short_oproj) */
        const char *as = getenv("QWEN35_ATTN_SHORT");
        const int cap = c->n_full_layers ? cuda_attn_short_cap(c->head_dim, D) : 0;
        ctx->attn_short = as && *as && atoi(as) >= 0 ? (atoi(as) < cap ? atoi(as) : cap) : cap;
        if (as && *as && atoi(as) < 0) fprintf(stderr, "qwen35: QWEN35_ATTN_SHORT=%s ignored (>= 0)\n", as);
        /* EXPERIMENTAL: a full-attention layer's qkv GEMV, attention and o_proj as one kernel (attn_layer.cu) */
        const char *af = getenv("QWEN35_ATTN_FUSED");
        ctx->attn_fused = af && atoi(af) == 1 && c->n_full_layers > 0 && ctx->mlp_fused && ctx->max_splits >= 2 &&
                          cuda_attn_layer_supported(D, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                                                    c->rotary_dim, c->attn_output_gate);
        if (af && atoi(af) == 1 && !ctx->attn_fused && c->n_full_layers > 0)
            fprintf(stderr, "qwen35: QWEN35_ATTN_FUSED=1 ignored: shape (gated hd 256, D <= 1024), grid occupancy or "
                            "the unfused MLP\n");
        /* EXPERIMENTAL, measured slower (docs/PERF_NOTES.md §20): at short contexts, with the fused DeltaNet mixer's
         * buffer parity, a full-attention layer's qkv GEMV, attention and o_proj as one kernel (attention.cu attn_qs) */
        const char *aq = getenv("QWEN35_ATTN_QS");
        ctx->attn_qs = aq && atoi(aq) == 1 && ctx->attn_short > 0 && ctx->dn_fused && !ctx->attn_fused &&
                       c->n_full_layers > 0 &&
                       cuda_attn_qs_supported(c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                                              c->attn_output_gate, D, ctx->attn_short);
        if (aq && atoi(aq) == 1 && !ctx->attn_qs && c->n_full_layers > 0)
            fprintf(stderr, "qwen35: QWEN35_ATTN_QS=1 ignored: needs the short attention kernel, the fused DeltaNet "
                            "mixer, D <= 1024 and the whole grid resident\n");
        /* the LM head's last rounds of row groups by tickets (docs/PERF_NOTES.md §24): QWEN35_LM_DYN=N rounds, 0 off */
        const char *ld = getenv("QWEN35_LM_DYN");
        ctx->lm_dyn = ld && *ld ? atoi(ld) : 3;
        if (ctx->lm_dyn < 0) ctx->lm_dyn = 0;
        /* greedy steps: the LM head's argmax through its quantized screen (lm_screen.cu): QWEN35_LM_SCREEN=0 off, 2 its
         * register kernel instead of the TMA ring */
        const char *ls = getenv("QWEN35_LM_SCREEN");
        ctx->lm_screen = 1;
        if (ls && *ls) {
            if (strcmp(ls, "0") && strcmp(ls, "1") && strcmp(ls, "2"))
                fprintf(stderr, "qwen35: QWEN35_LM_SCREEN=%s ignored (0, 1 or 2)\n", ls);
            else
                ctx->lm_screen = atoi(ls);
        }
        if (!cuda_lm_screen_ok(V, D)) ctx->lm_screen = 0;
        const char *ef = getenv("QWEN35_LM_EF"); /* the screen's stream L2 evict-first (PERF_NOTES §29): 0 off */
        ctx->lm_l2ef = !(ef && !strcmp(ef, "0"));
        const char *st = getenv("QWEN35_MLP_STAGE");
        const int stv = st ? atoi(st) : 0;
        ctx->mlp_staged = stv == 1 ? 128 : stv == 256 || stv == 512 ? stv : 0;
        if (st && *st && stv != 0 && !ctx->mlp_staged)
            fprintf(stderr, "qwen35: QWEN35_MLP_STAGE=%s ignored (1 = 128 threads, 256 or 512)\n", st);
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
        if ((e = cudaMemset((char *)ctx->arena + ctx->state_off, 0, ctx->state_bytes)) != cudaSuccess) {
            rc = cfail(e, "state clear", err);
            goto fail;
        }
        if ((rc = upload_weights(ctx, err))) goto fail;
        if (ctx->lm_screen) { /* the screen's quantized head from the uploaded bf16 one */
            CudaLaunch lq = {0, 0, NULL, 0};
            int qe = cuda_lm_quantize(ctx->lm_head, V, D, ctx->lm_q, ctx->lm_p, ctx->lm_meta, &lq);
            if (!qe) qe = (int)cudaMemset(ctx->lm_stats, 0, 3 * sizeof(unsigned));
            if (!qe) qe = (int)cudaDeviceSynchronize();
            if (qe) {
                rc = cfail((cudaError_t)qe, "LM head screen", err);
                goto fail;
            }
        }
        l2_persist_setup(ctx);
        if ((rc = mega_setup(ctx, err))) goto fail;
        ctx->mega = ctx->mega_ok && o && o->persistent; /* opt-in: slower than the per-phase graph so far */
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
            size_t n = (size_t)imax(V, imax(c->q_proj_rows, imax(c->value_dim, F))) +
                       (size_t)(ctx->max_splits + 2) * D;
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
    return sample + 2 * cuda_step_short(ctx) + 4 * cuda_step_screen(ctx, sample);
}

/* Captures the step (sample = 0 greedy, 1 sampling) into ctx->graph[cuda_graph_index()]. */
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
    if (ctx->no_graph || ctx->probe.dir) return cuda_step_enqueue(ctx, sample, err);
    const int gi = cuda_graph_index(ctx, sample);
    if (!ctx->graph[gi]) {
        int rc = cuda_graph_capture(ctx, sample, err);
        if (rc) return rc;
    }
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
    if (n > 1 && ctx->pf && !ctx->probe.dir) /* prefill path (forward_prefill.cu) */
        return cuda_prefill_forward(ctx, tokens, n, pos, all_logits, logits, err);
    for (int i = 0; i < n; i++) {
        int rc = check_step(ctx, tokens[i], pos + i, err);
        if (rc) return rc;
        const int want = logits && (all_logits || i == n - 1);
        StepParams *sp = ctx->step_host;
        memset(sp, 0, sizeof *sp);
        sp->token = tokens[i], sp->pos = pos + i, sp->write_logits = want, sp->top_p = 1.0f;
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

static int be_decode_sample(void *p, int token, int pos, const DeviceSampling *s, int *out_id, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    int rc = check_step(ctx, token, pos, err);
    if (rc) return rc;
    if (!(s->temperature >= 0) || s->top_k < 0 || !(s->top_p > 0 && s->top_p <= 1) || !(s->min_p >= 0 && s->min_p <= 1))
        return err_set(err, Q35_ERR_ARG, "cuda decode: bad sampling settings (temperature %g, top_k %d, top_p %g, min_p %g)",
                       s->temperature, s->top_k, s->top_p, s->min_p);
    const int sample = s->temperature > 0;
    StepParams *sp = ctx->step_host;
    memset(sp, 0, sizeof *sp);
    sp->token = token, sp->pos = pos, sp->write_logits = sample;
    sp->temperature = s->temperature, sp->top_k = s->top_k, sp->top_p = s->top_p, sp->min_p = s->min_p;
    sp->seed = s->seed, sp->step = s->step;
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

static int be_reset(void *p, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    CK(cudaMemsetAsync((char *)ctx->arena + ctx->state_off, 0, ctx->state_bytes, ctx->stream), "reset");
    CK(cudaStreamSynchronize(ctx->stream), "reset");
    ctx->n_past = 0;
    return 0;
}

static int be_bench(void *p, const BenchRequest *rq, BenchResult *res, Err *err) {
    CudaCtx *ctx = (CudaCtx *)p;
    int rc = rq->n_prefill > 0 ? cuda_prefill_bench(ctx, rq, res, err) : cuda_bench_run(ctx, rq, res, err);
    cuda_graphs_drop(ctx);
    int rc2 = be_reset(ctx, rc ? NULL : err);
    return rc ? rc : rc2;
}

const Backend cuda_backend = {"cuda", be_open, be_forward, be_decode_sample, be_reset, be_close, be_bench};
