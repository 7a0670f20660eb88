/* tiny_weights.h — fills the Weights of a hand-built test model whose Config is set, with random
 * tensors from the test's own generator mk(rows, cols, dtype, offset, scale) (values offset + scale
 * N(0,1)); keep() records allocations the test frees. Norm weights are zero-centred for Qwen3.5
 * (offset 0) and plain for Qwen3 (offset 1); layer 0's down_proj is F16 and A_log / the gated-norm
 * weight are F32, like the official checkpoint, so every stored dtype is exercised. */
#ifndef Q35_TINY_WEIGHTS_H
#define Q35_TINY_WEIGHTS_H
#include <math.h>
#include <stdlib.h>

#include "model.h"

typedef Tensor (*TinyMk)(int64_t rows, int64_t cols, DType dt, float offset, float scale);

static void tiny_fill_weights(Model *m, TinyMk mk, void *(*keep)(void *), int untied) {
    const Config *c = &m->config;
    const int qwen35 = c->family == FAMILY_QWEN35;
    const int D = c->hidden_size, F = c->intermediate_size, hd = c->head_dim, Hv = c->linear_num_value_heads;
    const float nofs = qwen35 ? 0.0f : 1.0f, ws = 1.0f / sqrtf((float)D); /* norm offset; matrix scale */
    Weights *w = &m->w;
    w->embed_tokens = mk(c->vocab_size, D, DT_BF16, 0.0f, 1.0f);
    w->norm = mk(D, 1, DT_BF16, nofs, 0.2f);
    w->lm_head = untied ? mk(c->vocab_size, D, DT_BF16, 0.0f, ws) : w->embed_tokens;
    w->layers = keep(calloc((size_t)c->num_hidden_layers, sizeof(LayerWeights)));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        LayerWeights *L = &w->layers[l];
        L->type = c->layer_types[l];
        L->input_layernorm = mk(D, 1, DT_BF16, nofs, 0.2f);
        L->post_attention_layernorm = mk(D, 1, DT_BF16, nofs, 0.2f);
        L->gate_proj = mk(F, D, DT_BF16, 0.0f, ws);
        L->up_proj = mk(F, D, DT_BF16, 0.0f, ws);
        L->down_proj = mk(D, F, l == 0 ? DT_F16 : DT_BF16, 0.0f, 1.0f / sqrtf((float)F));
        if (L->type == LAYER_FULL_ATTN) {
            L->q_proj = mk(c->q_proj_rows, D, DT_BF16, 0.0f, ws);
            L->k_proj = mk(c->kv_dim, D, DT_BF16, 0.0f, ws);
            L->v_proj = mk(c->kv_dim, D, DT_BF16, 0.0f, ws);
            L->o_proj = mk(D, c->attn_dim, DT_BF16, 0.0f, 1.0f / sqrtf((float)c->attn_dim));
            L->q_norm = mk(hd, 1, DT_BF16, nofs, 0.2f);
            L->k_norm = mk(hd, 1, DT_BF16, nofs, 0.2f);
        } else {
            L->in_proj_qkv = mk(c->conv_dim, D, DT_BF16, 0.0f, ws);
            L->in_proj_z = mk(c->value_dim, D, DT_BF16, 0.0f, ws);
            L->in_proj_b = mk(Hv, D, DT_BF16, 0.0f, ws);
            L->in_proj_a = mk(Hv, D, DT_BF16, 0.0f, ws);
            L->conv1d = mk(c->conv_dim, c->linear_conv_kernel_dim, DT_BF16, 0.0f, 0.5f);
            L->dt_bias = mk(Hv, 1, DT_BF16, 0.0f, 1.0f);
            L->A_log = mk(Hv, 1, DT_F32, 0.0f, 1.0f);
            L->linear_norm = mk(c->linear_value_head_dim, 1, DT_F32, 1.0f, 0.2f);
            L->out_proj = mk(D, c->value_dim, DT_BF16, 0.0f, 1.0f / sqrtf((float)c->value_dim));
        }
    }
}
#endif
