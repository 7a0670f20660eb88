/* backend.c — the CPU Backend table: open dequantizes FP8 weights to fp32 (w = fp8 * scale_inv, the
 * reference the FP8 kernels are tested against), checks every weight the forward pass reads
 * against Config, converts the small vectors (norms, conv taps, gates) to fp32 once, and
 * allocates the sequence state and activations for max_seq tokens; reset clears the state.
 * Serving: fp32 KV pools (n_blocks, Hkv, block, hd) per full-attention layer and state slots
 * per DeltaNet layer, sized by core from serve_sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu/forward.h"
#include "cpu/ops.h"

static float *falloc(int64_t n, int *failed) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) *failed = 1;
    return p;
}

/* fp32 copy of a small vector weight (checked to hold n elements). */
static float *f32_copy(const Tensor *t, int64_t n, int *failed) {
    float *p = falloc(n, failed);
    if (p) cpu_to_f32(p, t->data, t->dtype, n);
    return p;
}

static int imax(int a, int b) { return a > b ? a : b; }

int cpu_ctx_open(CpuCtx *ctx, const Model *m, const BackendOptions *o, Err *err) {
    memset(ctx, 0, sizeof *ctx);
    const Config *c = &m->config;
    if (c->num_hidden_layers <= 0 || c->num_hidden_layers > Q35_MAX_LAYERS || !m->w.layers)
        return err_set(err, Q35_ERR_CONFIG, "cpu backend: model has %d layers", c->num_hidden_layers);
    if (c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads ||
        c->rotary_dim % 2 || c->rotary_dim > c->head_dim)
        return err_set(err, Q35_ERR_CONFIG, "cpu backend: bad attention shape (Hq %d, Hkv %d, hd %d, R %d)",
                       c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->rotary_dim);
    if (c->n_linear_layers > 0 &&
        (c->linear_num_key_heads <= 0 || c->linear_num_value_heads % c->linear_num_key_heads ||
         c->linear_conv_kernel_dim < 1))
        return err_set(err, Q35_ERR_CONFIG, "cpu backend: bad DeltaNet shape (Hk %d, Hv %d, K %d)",
                       c->linear_num_key_heads, c->linear_num_value_heads, c->linear_conv_kernel_dim);
    int rc;
    if (model_fp8_count(m, NULL) > 0) {
        if (!(ctx->deq = malloc(sizeof *ctx->deq))) return err_set(err, Q35_ERR_OOM, "cpu backend: out of memory");
        if ((rc = model_dequantize_fp8(ctx->deq, m, err))) {
            free(ctx->deq);
            ctx->deq = NULL;
            return rc;
        }
        m = ctx->deq;
    }
    if ((rc = model_check_weights(m, "cpu backend", 0, err))) {
        cpu_ctx_close(ctx);
        return rc;
    }
    int max_seq = o ? o->max_seq : 0;
    if (max_seq <= 0) max_seq = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    if (max_seq <= 0) {
        cpu_ctx_close(ctx);
        return err_set(err, Q35_ERR_ARG, "cpu backend: max_seq %d", max_seq);
    }

    ctx->m = m;
    ctx->c = c;
    ctx->max_seq = max_seq;
    ctx->threads = o ? o->threads : 0;
    ctx->exact = o ? o->deterministic : 0;
    if (o) ctx->probe = o->probe;

    const int D = c->hidden_size, F = c->intermediate_size, hd = c->head_dim, L = c->num_hidden_layers;
    const int Hv = c->linear_num_value_heads, K = c->linear_conv_kernel_dim;
    const int Wd = imax(imax(c->key_dim, c->value_dim), imax(c->attn_dim, c->kv_dim));
    const int64_t TB = CPU_TB;
    int failed = 0;
    ctx->layers = calloc((size_t)L, sizeof(CpuLayer));
    if (!ctx->layers) {
        cpu_ctx_close(ctx);
        return err_set(err, Q35_ERR_OOM, "cpu backend: out of memory");
    }
    for (int l = 0; l < L && !failed; l++) {
        const LayerWeights *lw = &m->w.layers[l];
        CpuLayer *cl = &ctx->layers[l];
        cl->ln1 = f32_copy(&lw->input_layernorm, D, &failed);
        cl->ln2 = f32_copy(&lw->post_attention_layernorm, D, &failed);
        if (c->layer_types[l] == LAYER_FULL_ATTN) {
            cl->q_norm = f32_copy(&lw->q_norm, hd, &failed);
            cl->k_norm = f32_copy(&lw->k_norm, hd, &failed);
            cl->Kc = falloc((int64_t)c->num_key_value_heads * max_seq * hd, &failed);
            cl->Vc = falloc((int64_t)c->num_key_value_heads * max_seq * hd, &failed);
        } else {
            cl->conv_w = f32_copy(&lw->conv1d, (int64_t)c->conv_dim * K, &failed);
            cl->dt_bias = f32_copy(&lw->dt_bias, Hv, &failed);
            cl->A_log = f32_copy(&lw->A_log, Hv, &failed);
            cl->lin_norm = f32_copy(&lw->linear_norm, c->linear_value_head_dim, &failed);
            cl->conv_state = falloc((int64_t)(K - 1) * c->conv_dim, &failed);
            cl->S = falloc((int64_t)Hv * c->linear_key_head_dim * c->linear_value_head_dim, &failed);
        }
    }
    /* CpuSeq pointer arrays: solo K V conv S, then slot K V conv S, L each */
    ctx->seq_ptrs = calloc((size_t)8 * L, sizeof(float *));
    if (!ctx->seq_ptrs) failed = 1;
    for (int l = 0; l < L && !failed; l++) {
        CpuLayer *cl = &ctx->layers[l];
        ctx->seq_ptrs[0 * L + l] = cl->Kc;
        ctx->seq_ptrs[1 * L + l] = cl->Vc;
        ctx->seq_ptrs[2 * L + l] = cl->conv_state;
        ctx->seq_ptrs[3 * L + l] = cl->S;
    }
    if (!failed) {
        float **p = ctx->seq_ptrs;
        ctx->solo = (CpuSeq){max_seq, &ctx->solo_block, p, p + L, p + 2 * L, p + 3 * L, 0, 0};
        ctx->slot = (CpuSeq){0, NULL, p + 4 * L, p + 5 * L, p + 6 * L, p + 7 * L, 0, 0};
    }
    ctx->final_norm = f32_copy(&m->w.norm, D, &failed);
    ctx->inv_freq = falloc(c->rotary_dim / 2, &failed);
    if (ctx->inv_freq) cpu_rope_inv_freq(ctx->inv_freq, c->rotary_dim, c->rope_theta);
    ctx->x = falloc(TB * D, &failed);
    ctx->h = falloc(TB * D, &failed);
    ctx->out = falloc(TB * D, &failed);
    ctx->proj = falloc(TB * imax(c->conv_dim, c->q_proj_rows), &failed);
    ctx->conv = falloc(TB * c->conv_dim, &failed);
    ctx->q = falloc(TB * Wd, &failed);
    ctx->k = falloc(TB * Wd, &failed);
    ctx->v = falloc(TB * Wd, &failed);
    ctx->gate = falloc(TB * Wd, &failed);
    ctx->o = falloc(TB * Wd, &failed);
    ctx->b = falloc(TB * Hv, &failed);
    ctx->a = falloc(TB * Hv, &failed);
    ctx->beta = falloc(TB * Hv, &failed);
    ctx->g = falloc(TB * Hv, &failed);
    ctx->mlp_g = falloc(TB * F, &failed);
    ctx->mlp_u = falloc(TB * F, &failed);
    ctx->dn_scratch =
        falloc(cpu_deltanet_chunked_scratch(Hv, c->linear_key_head_dim, c->linear_value_head_dim), &failed);
    if (failed) {
        cpu_ctx_close(ctx);
        return err_set(err, Q35_ERR_OOM, "cpu backend: out of memory allocating state for max_seq %d", max_seq);
    }
    return 0;
}

void cpu_ctx_close(CpuCtx *ctx) {
    if (ctx->layers) cpu_serve_close(ctx);
    free(ctx->seq_ptrs);
    if (ctx->layers) {
        for (int l = 0; l < ctx->c->num_hidden_layers; l++) {
            CpuLayer *cl = &ctx->layers[l];
            float *p[] = {cl->ln1,    cl->ln2,     cl->q_norm, cl->k_norm,   cl->Kc,         cl->Vc,
                          cl->conv_w, cl->dt_bias, cl->A_log,  cl->lin_norm, cl->conv_state, cl->S};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
        }
        free(ctx->layers);
    }
    float *p[] = {ctx->final_norm, ctx->inv_freq, ctx->x,     ctx->h,     ctx->out,       ctx->proj, ctx->conv,
                  ctx->q,          ctx->k,        ctx->v,     ctx->gate,  ctx->o,         ctx->b,    ctx->a,
                  ctx->beta,       ctx->g,        ctx->mlp_g, ctx->mlp_u, ctx->dn_scratch};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    model_free(ctx->deq);
    free(ctx->deq);
    memset(ctx, 0, sizeof *ctx);
}

/* The KV cache is not cleared: attention reads only positions < pos + n, which the current
 * sequence has written. The conv rows and the recurrent state start from zero. */
void cpu_ctx_reset(CpuCtx *ctx) {
    const Config *c = ctx->c;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        CpuLayer *cl = &ctx->layers[l];
        if (c->layer_types[l] == LAYER_FULL_ATTN) continue;
        memset(cl->conv_state, 0, (size_t)(c->linear_conv_kernel_dim - 1) * c->conv_dim * sizeof(float));
        memset(cl->S, 0,
               (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim * sizeof(float));
    }
    ctx->n_past = 0;
}

/* ---- serving: pools and slots ---------------------------------------------------------- */

static void serve_sizes_of(const Config *c, int block, size_t *block_bytes, size_t *slot_bytes) {
    const size_t kv = (size_t)2 * c->num_key_value_heads * (size_t)block * c->head_dim * sizeof(float);
    const size_t st = ((size_t)(c->linear_conv_kernel_dim - 1) * c->conv_dim +
                       (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim) *
                      sizeof(float);
    *block_bytes = kv * (size_t)c->n_full_layers;
    *slot_bytes = c->n_linear_layers > 0 ? st * (size_t)c->n_linear_layers : 0;
}

void cpu_serve_close(CpuCtx *ctx) {
    for (int l = 0; l < ctx->c->num_hidden_layers; l++) {
        CpuLayer *cl = &ctx->layers[l];
        free(cl->Kp);
        free(cl->Vp);
        free(cl->conv_slots);
        free(cl->S_slots);
        free(cl->conv_snaps);
        free(cl->S_snaps);
        cl->Kp = cl->Vp = cl->conv_slots = cl->S_slots = cl->conv_snaps = cl->S_snaps = NULL;
    }
    ctx->n_slots = ctx->n_blocks = ctx->block = ctx->n_snaps = 0;
    ctx->slot.state_bf16 = ctx->slot.kv_fp8 = 0;
}

int cpu_serve_open(CpuCtx *ctx, const ServeLayout *lay, Err *err) {
    const Config *c = ctx->c;
    cpu_serve_close(ctx);
    if (lay->ablate && *lay->ablate)
        return err_set(err, Q35_ERR_UNSUPPORTED, "cpu backend: no --ablate (a measurement aid of the CUDA step)");
    if (lay->n_slots <= 0 || lay->n_blocks <= 0 || lay->block <= 0)
        return err_set(err, Q35_ERR_ARG, "cpu backend: serve layout of %d slots, %d blocks of %d", lay->n_slots,
                       lay->n_blocks, lay->block);
    const int64_t kv = (int64_t)lay->n_blocks * c->num_key_value_heads * lay->block * c->head_dim;
    const int64_t conv = (int64_t)lay->n_slots * (c->linear_conv_kernel_dim - 1) * c->conv_dim;
    const int64_t S =
        (int64_t)lay->n_slots * c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    /* both snapshot tiers in one array: the host tier is host memory like the device one here */
    const int n_snaps = lay->n_snaps > 0 ? lay->n_snaps + (lay->n_host_snaps > 0 ? lay->n_host_snaps : 0) : 0;
    int failed = 0;
    for (int l = 0; l < c->num_hidden_layers && !failed; l++) {
        CpuLayer *cl = &ctx->layers[l];
        if (c->layer_types[l] == LAYER_FULL_ATTN) {
            cl->Kp = falloc(kv, &failed);
            cl->Vp = falloc(kv, &failed);
            ctx->slot.K[l] = cl->Kp;
            ctx->slot.V[l] = cl->Vp;
        } else {
            cl->conv_slots = falloc(conv, &failed);
            cl->S_slots = falloc(S, &failed);
            if (n_snaps > 0) {
                cl->conv_snaps = falloc(conv / lay->n_slots * n_snaps, &failed);
                cl->S_snaps = falloc(S / lay->n_slots * n_snaps, &failed);
            }
        }
    }
    if (failed) {
        cpu_serve_close(ctx);
        return err_set(err, Q35_ERR_OOM, "cpu backend: out of memory for %d state slots and %d KV blocks", lay->n_slots,
                       lay->n_blocks);
    }
    ctx->n_slots = lay->n_slots;
    ctx->slot.state_bf16 = !!lay->state_bf16;
    ctx->slot.kv_fp8 = !!lay->kv_fp8;
    ctx->n_snaps = n_snaps;
    ctx->n_blocks = lay->n_blocks;
    ctx->block = ctx->slot.block = lay->block;
    return 0;
}

/* ---- the Backend table ----------------------------------------------------------------- */

static int be_open(void **out, const Model *m, const BackendOptions *o, Err *err) {
    CpuCtx *ctx = malloc(sizeof *ctx);
    if (!ctx) return err_set(err, Q35_ERR_OOM, "cpu backend: out of memory");
    int rc = cpu_ctx_open(ctx, m, o, err);
    if (rc) {
        free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

static int be_forward(void *ctx, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err) {
    return cpu_forward(ctx, tokens, n, pos, all_logits, logits, err);
}

static int be_reset(void *ctx, Err *err) {
    (void)err;
    cpu_ctx_reset(ctx);
    return 0;
}

static void be_close(void *ctx) {
    if (!ctx) return;
    cpu_ctx_close(ctx);
    free(ctx);
}

/* state_bf16, kv_fp8: the slots keep bf16-rounded states and the pools e4m3-rounded K / V in fp32 memory
 * (CpuSeq.state_bf16, kv_fp8), so the sizes are the same */
static int be_serve_sizes(void *ctx, int block, int state_bf16, int kv_fp8, ServeSizes *s, Err *err) {
    (void)err;
    (void)state_bf16;
    (void)kv_fp8;
    const CpuCtx *cx = ctx;
    serve_sizes_of(cx->c, block, &s->block_bytes, &s->slot_bytes);
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    s->mem_bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)1 << 30;
    s->mem_fraction = 0.25;
    return 0;
}

static int be_serve_open(void *ctx, const ServeLayout *l, Err *err) { return cpu_serve_open(ctx, l, err); }
static void be_serve_close(void *ctx) { cpu_serve_close(ctx); }
static int be_step_batch(void *ctx, const BatchItem *items, int n, float *logits, Err *err) {
    return cpu_step_batch(ctx, items, n, logits, err);
}

static int be_snap_save(void *ctx, int slot, int snap, Err *err) { return cpu_snap_copy(ctx, slot, snap, 1, err); }
static int be_snap_load(void *ctx, int snap, int slot, Err *err) { return cpu_snap_copy(ctx, slot, snap, 0, err); }
static int be_block_copy(void *ctx, int src, int dst, Err *err) { return cpu_block_copy(ctx, src, dst, err); }
static int be_snap_copy(void *ctx, int src, int dst, Err *err) { return cpu_snap_to_snap(ctx, src, dst, err); }

const Backend cpu_backend = {.name = "cpu",
                             .open = be_open,
                             .forward = be_forward,
                             .reset = be_reset,
                             .close = be_close,
                             .serve_sizes = be_serve_sizes,
                             .serve_open = be_serve_open,
                             .serve_close = be_serve_close,
                             .step_batch = be_step_batch,
                             .snap_save = be_snap_save,
                             .snap_load = be_snap_load,
                             .block_copy = be_block_copy,
                             .snap_copy = be_snap_copy};
