/* model.h — Weights bound by HF tensor name, for both layouts (model.language_model.* and
 * model.*), shards, tied/untied head, BF16/F16/F32 storage; and dummy weights at real shapes.
 * Every Tensor points into an mmap (or into memory the Model owns for --dummy) and keeps its
 * stored dtype; backends convert as they need. Shapes are [out, in] (PyTorch Linear). */
#ifndef Q35_MODEL_H
#define Q35_MODEL_H

#include "config.h"
#include "safetensors.h"

typedef struct LayerWeights {
    int type;                       /* LAYER_LINEAR_ATTN / LAYER_FULL_ATTN */
    Tensor input_layernorm;         /* (D) zero-centred for Qwen3.5, plain for Qwen3 */
    Tensor post_attention_layernorm;/* (D) */
    /* Gated DeltaNet (linear_attn.*) */
    Tensor in_proj_qkv;             /* (conv_dim, D): rows q | k | v, head-major */
    Tensor in_proj_z;               /* (value_dim, D) */
    Tensor in_proj_b;               /* (Hv, D) */
    Tensor in_proj_a;               /* (Hv, D) */
    Tensor conv1d;                  /* (conv_dim, 1, K); tap K-1 multiplies the current token */
    Tensor dt_bias;                 /* (Hv) */
    Tensor A_log;                   /* (Hv) usually F32 */
    Tensor linear_norm;             /* linear_attn.norm.weight (dv), plain weight, usually F32 */
    Tensor out_proj;                /* (D, value_dim) */
    /* full attention (self_attn.*) */
    Tensor q_proj;                  /* (q_proj_rows, D): [q_h | gate_h] per head when gated */
    Tensor k_proj, v_proj;          /* (kv_dim, D) */
    Tensor o_proj;                  /* (D, attn_dim) */
    Tensor q_norm, k_norm;          /* (hd) */
    /* MLP */
    Tensor gate_proj, up_proj;      /* (F, D) */
    Tensor down_proj;               /* (D, F) */
} LayerWeights;

typedef struct Weights {
    Tensor embed_tokens; /* (V, D) */
    Tensor norm;         /* (D) final norm */
    Tensor lm_head;      /* (V, D); equals embed_tokens when tied */
    LayerWeights *layers;
} Weights;

typedef struct Model {
    Config config;
    GenConfig gen;
    Weights w;
    SafeTensors *files;
    int n_files;
    void **owned;        /* allocations owned by the model (dummy weights, rounded F32 params) */
    int n_owned, cap_owned;
    int64_t n_params;    /* parameters bound (tied head counted once) */
    int64_t n_bytes;     /* bytes of bound tensors as stored */
} Model;

typedef struct ModelLoadOptions {
    int keep_f32_params; /* 0: round F32 A_log / linear_attn.norm.weight to bf16 (HF bf16 parity) */
    int strict;          /* unknown tensor names are errors */
} ModelLoadOptions;

/* Loads <dir>/config.json, model.safetensors (or the shards of model.safetensors.index.json) and
 * generation_config.json. Every tensor is checked against the exact shape from Config; BF16, F16
 * and F32 storage are all accepted, and F8_E4M3 matrices with their "<name>_scale_inv" block scales when
 * config.json has an fp8 quantization_config. Tensor.name is the name as stored in the file. o may be NULL
 * (defaults). On error m is left zeroed. Unknown names warn on stderr (strict: error). */
int model_load(Model *m, const char *dir, const ModelLoadOptions *o, Err *err);
/* Random weights at the shapes of a built-in config ("qwen3.5-0.8b", "qwen3-0.6b"), bf16 except
 * A_log / linear_attn.norm.weight (F32 holding bf16 values, like a default load). Tensor.name is
 * the canonical name ("layers.3.self_attn.q_proj.weight"). Matrices ~ N(0,1)/sqrt(in), embedding
 * ~ 0.15 N(0,1) (tied logits rms ~5), zero-centred norms ~ 0.1 N(0,1) (plain Qwen3 norms and the gated norm 1 + that),
 * A_log = log U(1,16), dt_bias ~ 0.5 N(0,1), conv1d ~ N(0,1)/sqrt(K). Activations
 * stay O(1). Deterministic for a seed (independent of the thread count). Stop ids per TOKENIZER.md §6. */
int model_dummy(Model *m, const char *name, uint64_t seed, Err *err);
/* The same for any config (e.g. a tiny one for tests); c is checked with config_finish first.
 * Untied configs get a separate random lm_head. Gen config: greedy, no stop ids. */
int model_dummy_config(Model *m, const Config *c, uint64_t seed, Err *err);
/* model_load / model_dummy with progress reports (fn NULL: none): checkpoint layers bound, dummy chunks filled. */
typedef struct ModelProgress {
    Q35ProgressFn fn;
    void *user;
} ModelProgress;
int model_load_progress(Model *m, const char *dir, const ModelLoadOptions *o, const ModelProgress *p, Err *err);
int model_dummy_progress(Model *m, const char *name, uint64_t seed, const ModelProgress *p, Err *err);
/* FP8 (docs/FP8.md). An F8_E4M3 Tensor carries scale_inv, fp32 per 128 x 128 block: w = fp8 * scale_inv.
 * model_quantize_fp8: every BF16/F16/F32 matrix that Qwen's FP8 checkpoints store as F8_E4M3 (attention
 * q/k/v/o, DeltaNet in_proj_qkv / in_proj_z / out_proj, MLP gate/up/down) becomes F8_E4M3 with block
 * scales amax / 448 (model-owned); embedding, head, norms, conv1d, in_proj_a/b, A_log, dt_bias stay. FP8
 * tensors already there are kept as stored, so a quantized bf16 checkpoint and an FP8 one look the same.
 * n_bytes is updated. */
int model_quantize_fp8(Model *m, Err *err);
/* dst = a view of src in which every F8_E4M3 tensor is an fp32 tensor fp8 * scale_inv owned by dst; all
 * other tensors alias src's (src must outlive dst). model_free(dst) frees only what dst owns. */
int model_dequantize_fp8(Model *dst, const Model *src, Err *err);
/* Number of F8_E4M3 weight tensors (a tied head counted once); *bytes (may be NULL): their bytes with scales. */
int model_fp8_count(const Model *m, int64_t *bytes);
/* Releases the mmaps and owned memory; safe on a zeroed or partially loaded Model. */
void model_free(Model *m);
/* Checks that every weight the forward pass reads is present, float (BF16/F16/F32) and has the
 * element count (and rows) the config implies. who prefixes the message ("cpu backend"). fp8_ok: the layers'
 * projection matrices may also be F8_E4M3 (a backend that reads them; embeddings, head and vectors never). */
int model_check_weights(const Model *m, const char *who, int fp8_ok, Err *err);
/* Parameters a checkpoint for config c holds (tied head counted once): the count model_load and
 * model_dummy report in n_params. */
int64_t model_param_count(const Config *c);

#endif
