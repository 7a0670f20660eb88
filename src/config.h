/* config.h — config.json -> Config. Field names are the HF config keys (nested keys keep
 * their leaf name). Values in comments are Qwen3.5-0.8B's. config_parse checks every field
 * the engine relies on and fills the derived sizes at the bottom. */
#ifndef Q35_CONFIG_H
#define Q35_CONFIG_H

#include "util.h"

enum { FAMILY_QWEN35 = 1, FAMILY_QWEN3 = 2 };
enum { LAYER_LINEAR_ATTN = 0, LAYER_FULL_ATTN = 1 };
#define Q35_MAX_LAYERS 256

typedef struct Config {
    int family;                   /* FAMILY_QWEN35 (qwen3_5 / qwen3_5_text) or FAMILY_QWEN3 */
    char model_type[32];          /* as in the file: "qwen3_5", "qwen3_5_text", "qwen3" */
    int hidden_size;              /* 1024 (D) */
    int num_hidden_layers;        /* 24 (L) */
    int intermediate_size;        /* 3584 (F) */
    float rms_norm_eps;           /* 1e-6 */
    int vocab_size;               /* 248320 (padded embedding rows) */
    int tie_word_embeddings;      /* 1 */
    int num_attention_heads;      /* 8 (Hq) */
    int num_key_value_heads;      /* 2 (Hkv) */
    int head_dim;                 /* 256 (hd) */
    int attn_output_gate;         /* 1 for Qwen3.5, 0 for Qwen3 */
    float rope_theta;             /* 1e7 */
    float partial_rotary_factor;  /* 0.25 */
    int linear_num_key_heads;     /* 16 (Hk) */
    int linear_num_value_heads;   /* 16 (Hv) */
    int linear_key_head_dim;      /* 128 (dk) */
    int linear_value_head_dim;    /* 128 (dv) */
    int linear_conv_kernel_dim;   /* 4 (K) */
    int full_attention_interval;  /* 4 (used only when layer_types is absent) */
    int max_position_embeddings;  /* 262144 */
    int layer_types[Q35_MAX_LAYERS]; /* LAYER_LINEAR_ATTN / LAYER_FULL_ATTN per layer */
    /* quantization_config (HF fine-grained FP8): quant_method "fp8", fmt e4m3, weight_block_size [128, 128];
     * the matrices stored F8_E4M3 carry "<name>_scale_inv" block scales (docs/FP8.md). */
    int quant_fp8;                /* 1: the checkpoint may hold F8_E4M3 weights */
    int weight_block_size[2];     /* [128, 128] when quant_fp8 */

    /* derived */
    int rotary_dim;   /* R = int(head_dim * partial_rotary_factor): 64 */
    int q_proj_rows;  /* (1 + attn_output_gate) * Hq * hd: 4096 */
    int kv_dim;       /* Hkv * hd: 512 */
    int attn_dim;     /* Hq * hd: 2048 */
    int key_dim;      /* Hk * dk: 2048 */
    int value_dim;    /* Hv * dv: 2048 */
    int conv_dim;     /* 2 * key_dim + value_dim: 6144 */
    int n_linear_layers, n_full_layers;
} Config;

/* Parses config.json text (path is used in messages only), then config_finish.
 * Layouts: text fields from `text_config` when present, else (per key) the top level.
 * Defaults when absent: num_key_value_heads = heads, rms_norm_eps 1e-6, partial_rotary_factor 1,
 * tie_word_embeddings false, max_position_embeddings 32768, full_attention_interval 4 (hybrid);
 * head_dim = hidden/heads for dense qwen3 only (the hybrid family must state it).
 * rope_type "default" (or "mrope", which is default RoPE for text) only; hidden_act silu only;
 * attention_bias / use_sliding_window true are refused. Qwen3.5 always uses the output gate.
 * quantization_config (top level or text_config): quant_method "fp8" with weight_block_size [128, 128] only
 * (fmt "e4m3", activation_scheme "dynamic" when given; modules_to_not_convert / ignored_layers must be lists
 * of strings and are otherwise informational: a weight's stored dtype says whether it is FP8).
 * Errors: malformed JSON -> Q35_ERR_FORMAT; anything else -> Q35_ERR_CONFIG naming file + key. */
int config_parse(Config *c, const char *json_text, const char *path, Err *err);
/* Reads <dir>/config.json. */
int config_load(Config *c, const char *dir, Err *err);
/* Built-in configs for --dummy: "qwen3.5-0.8b", "qwen3-0.6b". */
int config_builtin(Config *c, const char *name, Err *err);
/* Fills the derived fields and checks consistency (Hq % Hkv, Hv % Hk, R even, ...). */
int config_finish(Config *c, const char *path, Err *err);

/* generation_config.json: stop ids (eos_token_id, int or list, each < vocab_size) and sampling
 * defaults. Absent file: n_eos = 0 (the engine must add the tokenizer's stop ids), do_sample 0
 * (greedy), temperature 1, top_k 0 (off), top_p 1, min_p 0, repetition_penalty 1, presence 0. */
typedef struct GenConfig {
    int eos_ids[8];
    int n_eos;
    int do_sample;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty;
    int top_k;
} GenConfig;
int genconfig_load(GenConfig *g, const char *dir, const Config *c, Err *err);

#endif
