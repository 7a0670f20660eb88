/* config.c — config.json -> Config (MODEL.md §1) and generation_config.json -> GenConfig.
 * Three layouts: the VL wrapper (text fields in `text_config`, falling back to the top level for
 * keys it lacks), the flat qwen3_5_text save, and dense qwen3. RoPE keys come from
 * `rope_parameters` first, then the top level. config_finish derives the sizes of §1.4 and checks
 * every relation the engine relies on; every error names the file and the key. */
#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "json.h"

/* Lookup context: top-level object and the optional text_config object. */
typedef struct Ctx {
    JsonSrc s;
    const cJSON *root, *tc;
    char path[160];
} Ctx;

/* Path of key as seen from root: "text_config.<key>" when text_config holds it (non-null),
 * else "<key>". */
static const char *kp(Ctx *x, const char *key) {
    if (x->tc && json_has(x->tc, key)) snprintf(x->path, sizeof x->path, "text_config.%s", key);
    else snprintf(x->path, sizeof x->path, "%s", key);
    return x->path;
}

static int has(Ctx *x, const char *key) { return json_has(x->root, kp(x, key)); }

static int missing(Ctx *x, const char *key, Err *err) {
    return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' missing%s", x->s.file, key,
                   x->tc ? " (looked in text_config and the top level)" : "");
}

static int get_int(Ctx *x, const char *key, int *out, Err *err) {
    if (!has(x, key)) return missing(x, key, err);
    return json_int(&x->s, x->root, kp(x, key), out, err);
}
static int get_int_opt(Ctx *x, const char *key, int def, int *out, Err *err) {
    return json_int_opt(&x->s, x->root, kp(x, key), def, out, err);
}
static int get_float(Ctx *x, const char *key, float *out, Err *err) {
    if (!has(x, key)) return missing(x, key, err);
    return json_float(&x->s, x->root, kp(x, key), out, err);
}
static int get_float_opt(Ctx *x, const char *key, float def, float *out, Err *err) {
    return json_float_opt(&x->s, x->root, kp(x, key), def, out, err);
}
static int get_bool_opt(Ctx *x, const char *key, int def, int *out, Err *err) {
    return json_bool_opt(&x->s, x->root, kp(x, key), def, out, err);
}
static int get_string_opt(Ctx *x, const char *key, const char *def, const char **out, Err *err) {
    return json_string_opt(&x->s, x->root, kp(x, key), def, out, err);
}

/* rope_type must be "default" ("mrope" is accepted: HF maps it to default RoPE with sections,
 * identical for text). Checks both spellings, "rope_type" and the older "type", in obj_path. */
static int check_rope_type(Ctx *x, const char *obj_path, Err *err) {
    static const char *keys[] = {"rope_type", "type"};
    for (int i = 0; i < 2; i++) {
        char p[200];
        const char *t;
        snprintf(p, sizeof p, "%s.%s", obj_path, keys[i]);
        int rc = json_string_opt(&x->s, x->root, p, "default", &t, err);
        if (rc) return rc;
        if (strcmp(t, "default") != 0 && strcmp(t, "mrope") != 0)
            return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = '%s' is not supported (only default RoPE)",
                           x->s.file, p, t);
    }
    return 0;
}

/* RoPE: rope_parameters.{rope_theta, partial_rotary_factor} first, then the top-level keys. */
static int parse_rope(Config *c, Ctx *x, Err *err) {
    int rc;
    char rp[64] = "", key[200];
    if (has(x, "rope_parameters")) {
        const cJSON *o;
        snprintf(rp, sizeof rp, "%s", kp(x, "rope_parameters"));
        if ((rc = json_object(&x->s, x->root, rp, &o, err))) return rc;
        if ((rc = check_rope_type(x, rp, err))) return rc;
    }
    if (has(x, "rope_scaling")) {
        const cJSON *o;
        char sp[64];
        snprintf(sp, sizeof sp, "%s", kp(x, "rope_scaling"));
        if ((rc = json_object(&x->s, x->root, sp, &o, err))) return rc;
        if ((rc = check_rope_type(x, sp, err))) return rc;
    }
    snprintf(key, sizeof key, "%s.rope_theta", rp);
    if (rp[0] && json_has(x->root, key)) rc = json_float(&x->s, x->root, key, &c->rope_theta, err);
    else rc = get_float(x, "rope_theta", &c->rope_theta, err);
    if (rc) return rc;
    snprintf(key, sizeof key, "%s.partial_rotary_factor", rp);
    if (rp[0] && json_has(x->root, key)) return json_float(&x->s, x->root, key, &c->partial_rotary_factor, err);
    return get_float_opt(x, "partial_rotary_factor", 1.0f, &c->partial_rotary_factor, err);
}

/* layer_types (list of strings, length num_hidden_layers) or full_attention_interval. */
static int parse_layer_types(Config *c, Ctx *x, Err *err) {
    int rc, L = c->num_hidden_layers;
    if (L < 1 || L > Q35_MAX_LAYERS)
        return err_set(err, Q35_ERR_CONFIG, "%s: key 'num_hidden_layers' = %d out of range [1, %d]", x->s.file, L,
                       Q35_MAX_LAYERS);
    if (has(x, "layer_types")) {
        const cJSON *arr;
        int n;
        char path[64];
        snprintf(path, sizeof path, "%s", kp(x, "layer_types"));
        if ((rc = json_array(&x->s, x->root, path, &arr, &n, err))) return rc;
        if (n != L)
            return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' has %d entries but num_hidden_layers is %d", x->s.file,
                           path, n, L);
        for (int i = 0; i < n; i++) {
            const cJSON *e = cJSON_GetArrayItem(arr, i);
            const char *t = cJSON_IsString(e) ? e->valuestring : NULL;
            if (t && strcmp(t, "full_attention") == 0) c->layer_types[i] = LAYER_FULL_ATTN;
            else if (t && strcmp(t, "linear_attention") == 0 && c->family == FAMILY_QWEN35)
                c->layer_types[i] = LAYER_LINEAR_ATTN;
            else
                return err_set(err, Q35_ERR_CONFIG, "%s: key '%s[%d]' = '%s' is not a supported layer type", x->s.file,
                               path, i, t ? t : "(not a string)");
        }
        return get_int_opt(x, "full_attention_interval", c->family == FAMILY_QWEN35 ? 4 : 1,
                           &c->full_attention_interval, err);
    }
    if (c->family == FAMILY_QWEN3) {
        c->full_attention_interval = 1;
        for (int i = 0; i < L; i++) c->layer_types[i] = LAYER_FULL_ATTN;
        return 0;
    }
    if ((rc = get_int_opt(x, "full_attention_interval", 4, &c->full_attention_interval, err))) return rc;
    if (c->full_attention_interval < 1)
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = %d must be >= 1", x->s.file,
                       kp(x, "full_attention_interval"), c->full_attention_interval);
    for (int i = 0; i < L; i++)
        c->layer_types[i] = (i + 1) % c->full_attention_interval == 0 ? LAYER_FULL_ATTN : LAYER_LINEAR_ATTN;
    return 0;
}

/* quantization_config: HF fine-grained FP8 (DeepSeek / Qwen FP8 checkpoints) with 128 x 128 blocks only. */
static int parse_quant(Config *c, Ctx *x, Err *err) {
    if (!has(x, "quantization_config")) return 0;
    char qp[64], key[200];
    const cJSON *q;
    const char *method, *fmt, *act;
    int rc;
    snprintf(qp, sizeof qp, "%s", kp(x, "quantization_config"));
    if ((rc = json_object(&x->s, x->root, qp, &q, err))) return rc;
    snprintf(key, sizeof key, "%s.quant_method", qp);
    if ((rc = json_string(&x->s, x->root, key, &method, err))) return rc;
    if (strcmp(method, "fp8") != 0)
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = '%s' is not supported (only fp8 with 128 x 128 blocks)",
                       x->s.file, key, method);
    snprintf(key, sizeof key, "%s.fmt", qp);
    if ((rc = json_string_opt(&x->s, x->root, key, "e4m3", &fmt, err))) return rc;
    if (strcmp(fmt, "e4m3") != 0)
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = '%s' is not supported (only e4m3)", x->s.file, key, fmt);
    snprintf(key, sizeof key, "%s.activation_scheme", qp);
    if ((rc = json_string_opt(&x->s, x->root, key, "dynamic", &act, err))) return rc;
    if (strcmp(act, "dynamic") != 0)
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = '%s' is not supported (only dynamic)", x->s.file, key, act);
    const cJSON *arr;
    int n;
    snprintf(key, sizeof key, "%s.weight_block_size", qp);
    if (!json_has(x->root, key))
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' missing (only 128 x 128 block scales are supported)",
                       x->s.file, key);
    if ((rc = json_array(&x->s, x->root, key, &arr, &n, err))) return rc;
    for (int i = 0; i < n && i < 2; i++) {
        int64_t v;
        if (json_node_int64(&x->s, cJSON_GetArrayItem(arr, i), key, 0, 1 << 20, &v, err)) v = -1;
        c->weight_block_size[i] = (int)v;
    }
    if (n != 2 || c->weight_block_size[0] != 128 || c->weight_block_size[1] != 128)
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' must be [128, 128] (the only block shape supported)",
                       x->s.file, key);
    static const char *lists[] = {"modules_to_not_convert", "ignored_layers"};
    for (int i = 0; i < 2; i++) {
        snprintf(key, sizeof key, "%s.%s", qp, lists[i]);
        const cJSON *l = json_at(x->root, key);
        if (!l || cJSON_IsNull(l)) continue;
        int ok = cJSON_IsArray(l);
        for (const cJSON *e = ok ? l->child : NULL; e; e = e->next) ok &= cJSON_IsString(e);
        if (!ok) return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' must be a list of strings", x->s.file, key);
    }
    c->quant_fp8 = 1;
    return 0;
}

/* Reads every field from the already parsed tree. */
static int parse_tree(Config *c, Ctx *x, Err *err) {
    int rc;
    const char *mt, *act;
    if ((rc = json_string(&x->s, x->root, "model_type", &mt, err))) return rc;
    if (strcmp(mt, "qwen3_5") == 0 || strcmp(mt, "qwen3_5_text") == 0) c->family = FAMILY_QWEN35;
    else if (strcmp(mt, "qwen3") == 0) c->family = FAMILY_QWEN3;
    else
        return err_set(err, Q35_ERR_CONFIG, "%s: model_type '%s' is not supported (expected qwen3_5, qwen3_5_text "
                       "or qwen3)", x->s.file, mt);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    if (x->tc && json_has(x->tc, "model_type")) {
        const char *tm;
        if ((rc = json_string(&x->s, x->root, "text_config.model_type", &tm, err))) return rc;
        if (c->family != FAMILY_QWEN35 || (strcmp(tm, "qwen3_5_text") != 0 && strcmp(tm, "qwen3_5") != 0))
            return err_set(err, Q35_ERR_CONFIG, "%s: text_config.model_type '%s' does not fit model_type '%s'",
                           x->s.file, tm, mt);
    }

    if ((rc = get_int(x, "hidden_size", &c->hidden_size, err))) return rc;
    if ((rc = get_int(x, "num_hidden_layers", &c->num_hidden_layers, err))) return rc;
    if ((rc = get_int(x, "intermediate_size", &c->intermediate_size, err))) return rc;
    if ((rc = get_float_opt(x, "rms_norm_eps", 1e-6f, &c->rms_norm_eps, err))) return rc;
    if ((rc = get_int(x, "vocab_size", &c->vocab_size, err))) return rc;
    if ((rc = get_int(x, "num_attention_heads", &c->num_attention_heads, err))) return rc;
    if ((rc = get_int_opt(x, "num_key_value_heads", c->num_attention_heads, &c->num_key_value_heads, err)))
        return rc;
    /* head_dim: dense qwen3 defaults to hidden / heads; the hybrid family must state it. */
    if (c->family == FAMILY_QWEN35) {
        if ((rc = get_int(x, "head_dim", &c->head_dim, err))) return rc;
    } else {
        int hd_def = c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0;
        if ((rc = get_int_opt(x, "head_dim", hd_def, &c->head_dim, err))) return rc;
    }
    if ((rc = get_int_opt(x, "max_position_embeddings", 32768, &c->max_position_embeddings, err))) return rc;

    /* tie_word_embeddings: text_config, then the top level (kp does exactly that). */
    if ((rc = get_bool_opt(x, "tie_word_embeddings", 0, &c->tie_word_embeddings, err))) return rc;

    if ((rc = get_string_opt(x, "hidden_act", "silu", &act, err))) return rc;
    if (strcmp(act, "silu") != 0)
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = '%s' is not supported (only silu)", x->s.file,
                       kp(x, "hidden_act"), act);
    int flag;
    if ((rc = get_bool_opt(x, "attention_bias", 0, &flag, err))) return rc;
    if (flag)
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = true is not supported (no attention biases)",
                       x->s.file, kp(x, "attention_bias"));
    if ((rc = get_bool_opt(x, "use_sliding_window", 0, &flag, err))) return rc;
    if (flag)
        return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = true is not supported", x->s.file,
                       kp(x, "use_sliding_window"));

    if ((rc = parse_rope(c, x, err))) return rc;
    if ((rc = parse_quant(c, x, err))) return rc;

    if (c->family == FAMILY_QWEN35) {
        c->attn_output_gate = 1; /* Qwen3.5 always applies the gate (MODEL.md §1.2) */
        if ((rc = get_int(x, "linear_num_key_heads", &c->linear_num_key_heads, err))) return rc;
        if ((rc = get_int(x, "linear_num_value_heads", &c->linear_num_value_heads, err))) return rc;
        if ((rc = get_int(x, "linear_key_head_dim", &c->linear_key_head_dim, err))) return rc;
        if ((rc = get_int(x, "linear_value_head_dim", &c->linear_value_head_dim, err))) return rc;
        if ((rc = get_int(x, "linear_conv_kernel_dim", &c->linear_conv_kernel_dim, err))) return rc;
    } else {
        c->attn_output_gate = 0;
    }
    return parse_layer_types(c, x, err);
}

int config_parse(Config *c, const char *json_text, const char *path, Err *err) {
    memset(c, 0, sizeof *c);
    cJSON *root;
    int rc = json_parse(&root, json_text, strlen(json_text), path, err);
    if (rc) return rc;
    Ctx x = {{path, Q35_ERR_CONFIG}, root, NULL, ""};
    if (!cJSON_IsObject(root)) {
        rc = err_set(err, Q35_ERR_CONFIG, "%s: top level is not a JSON object", path);
    } else if (json_has(root, "text_config") && !cJSON_IsObject(json_at(root, "text_config"))) {
        rc = err_set(err, Q35_ERR_CONFIG, "%s: key 'text_config' must be an object", path);
    } else {
        x.tc = json_has(root, "text_config") ? json_at(root, "text_config") : NULL;
        rc = parse_tree(c, &x, err);
    }
    cJSON_Delete(root);
    if (rc) return rc;
    return config_finish(c, path, err);
}

int config_load(Config *c, const char *dir, Err *err) {
    char path[4096];
    if (path_join(path, sizeof path, dir, "config.json"))
        return err_set(err, Q35_ERR_ARG, "model directory path too long: %s", dir);
    char *text;
    int rc = read_file(path, &text, NULL, err);
    if (rc) return rc;
    rc = config_parse(c, text, path, err);
    free(text);
    return rc;
}

/* Qwen3.5-0.8B (MODEL.md §1.2, layer_types 3 linear + 1 full, x6) and Qwen3-0.6B (§5). */
int config_builtin(Config *c, const char *name, Err *err) {
    memset(c, 0, sizeof *c);
    char path[64];
    snprintf(path, sizeof path, "builtin:%s", name ? name : "(null)");
    if (name && strcmp(name, "qwen3.5-0.8b") == 0) {
        *c = (Config){.family = FAMILY_QWEN35, .model_type = "qwen3_5", .hidden_size = 1024,
                      .num_hidden_layers = 24, .intermediate_size = 3584, .rms_norm_eps = 1e-6f,
                      .vocab_size = 248320, .tie_word_embeddings = 1, .num_attention_heads = 8,
                      .num_key_value_heads = 2, .head_dim = 256, .attn_output_gate = 1, .rope_theta = 1e7f,
                      .partial_rotary_factor = 0.25f, .linear_num_key_heads = 16, .linear_num_value_heads = 16,
                      .linear_key_head_dim = 128, .linear_value_head_dim = 128, .linear_conv_kernel_dim = 4,
                      .full_attention_interval = 4, .max_position_embeddings = 262144};
        for (int i = 0; i < 24; i++) c->layer_types[i] = (i % 4 == 3) ? LAYER_FULL_ATTN : LAYER_LINEAR_ATTN;
    } else if (name && strcmp(name, "qwen3-0.6b") == 0) {
        *c = (Config){.family = FAMILY_QWEN3, .model_type = "qwen3", .hidden_size = 1024, .num_hidden_layers = 28,
                      .intermediate_size = 3072, .rms_norm_eps = 1e-6f, .vocab_size = 151936,
                      .tie_word_embeddings = 1, .num_attention_heads = 16, .num_key_value_heads = 8,
                      .head_dim = 128, .attn_output_gate = 0, .rope_theta = 1e6f, .partial_rotary_factor = 1.0f,
                      .full_attention_interval = 1, .max_position_embeddings = 40960};
        for (int i = 0; i < 28; i++) c->layer_types[i] = LAYER_FULL_ATTN;
    } else {
        return err_set(err, Q35_ERR_ARG, "unknown built-in model '%s' (expected qwen3.5-0.8b or qwen3-0.6b)",
                       name ? name : "(null)");
    }
    return config_finish(c, path, err);
}

/* Checks a positive size and returns 0, or fills err naming the key. */
static int positive(const char *path, const char *key, int64_t v, Err *err) {
    if (v > 0 && v <= INT_MAX) return 0;
    return err_set(err, Q35_ERR_CONFIG, "%s: key '%s' = %lld must be a positive size", path, key, (long long)v);
}

/* Derived size that must fit an int (it is used as a row count or a buffer length). */
static int derived(const char *path, const char *what, int64_t v, int *out, Err *err) {
    if (v <= 0 || v > INT_MAX)
        return err_set(err, Q35_ERR_CONFIG, "%s: derived size %s = %lld is out of range", path, what, (long long)v);
    *out = (int)v;
    return 0;
}

int config_finish(Config *c, const char *path, Err *err) {
    int rc;
    if (c->family != FAMILY_QWEN35 && c->family != FAMILY_QWEN3)
        return err_set(err, Q35_ERR_CONFIG, "%s: unknown model family %d", path, c->family);
    if ((rc = positive(path, "hidden_size", c->hidden_size, err))) return rc;
    if ((rc = positive(path, "num_hidden_layers", c->num_hidden_layers, err))) return rc;
    if (c->num_hidden_layers > Q35_MAX_LAYERS)
        return err_set(err, Q35_ERR_CONFIG, "%s: key 'num_hidden_layers' = %d exceeds the limit of %d", path,
                       c->num_hidden_layers, Q35_MAX_LAYERS);
    if ((rc = positive(path, "intermediate_size", c->intermediate_size, err))) return rc;
    if ((rc = positive(path, "vocab_size", c->vocab_size, err))) return rc;
    if ((rc = positive(path, "num_attention_heads", c->num_attention_heads, err))) return rc;
    if ((rc = positive(path, "num_key_value_heads", c->num_key_value_heads, err))) return rc;
    if ((rc = positive(path, "head_dim", c->head_dim, err))) return rc;
    if ((rc = positive(path, "max_position_embeddings", c->max_position_embeddings, err))) return rc;
    if (!(c->rms_norm_eps > 0.0f && c->rms_norm_eps < 1.0f))
        return err_set(err, Q35_ERR_CONFIG, "%s: key 'rms_norm_eps' = %g must be in (0, 1)", path, c->rms_norm_eps);
    if (!(c->rope_theta > 0.0f && isfinite(c->rope_theta)))
        return err_set(err, Q35_ERR_CONFIG, "%s: key 'rope_theta' = %g must be positive", path, c->rope_theta);
    if (!(c->partial_rotary_factor > 0.0f && c->partial_rotary_factor <= 1.0f))
        return err_set(err, Q35_ERR_CONFIG, "%s: key 'partial_rotary_factor' = %g must be in (0, 1]", path,
                       c->partial_rotary_factor);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return err_set(err, Q35_ERR_CONFIG, "%s: num_attention_heads (%d) must be a multiple of "
                       "num_key_value_heads (%d)", path, c->num_attention_heads, c->num_key_value_heads);
    if (c->attn_output_gate != 0 && c->attn_output_gate != 1)
        return err_set(err, Q35_ERR_CONFIG, "%s: attn_output_gate must be 0 or 1", path);
    if (c->family == FAMILY_QWEN3 && c->attn_output_gate)
        return err_set(err, Q35_ERR_CONFIG, "%s: attn_output_gate is not used by dense qwen3", path);
    c->tie_word_embeddings = c->tie_word_embeddings ? 1 : 0;

    /* R = int(hd * factor), as HF computes it (double arithmetic). */
    c->rotary_dim = (int)((double)c->head_dim * (double)c->partial_rotary_factor);
    if (c->rotary_dim < 2 || c->rotary_dim % 2 != 0 || c->rotary_dim > c->head_dim)
        return err_set(err, Q35_ERR_CONFIG, "%s: rotary dim int(head_dim %d * partial_rotary_factor %g) = %d must "
                       "be even, >= 2 and <= head_dim", path, c->head_dim, c->partial_rotary_factor, c->rotary_dim);

    int64_t D = c->hidden_size, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, hd = c->head_dim;
    if ((rc = derived(path, "q_proj rows", (1 + c->attn_output_gate) * Hq * hd, &c->q_proj_rows, err))) return rc;
    if ((rc = derived(path, "kv_dim", Hkv * hd, &c->kv_dim, err))) return rc;
    if ((rc = derived(path, "attn_dim", Hq * hd, &c->attn_dim, err))) return rc;
    if (D * c->vocab_size > ((int64_t)1 << 40))
        return err_set(err, Q35_ERR_CONFIG, "%s: vocab_size x hidden_size is absurdly large", path);

    c->n_linear_layers = c->n_full_layers = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        int t = c->layer_types[i];
        if (t == LAYER_FULL_ATTN) c->n_full_layers++;
        else if (t == LAYER_LINEAR_ATTN && c->family == FAMILY_QWEN35) c->n_linear_layers++;
        else
            return err_set(err, Q35_ERR_CONFIG, "%s: layer_types[%d] = %d is not valid for model_type '%s'", path, i,
                           t, c->model_type);
    }

    if (c->family == FAMILY_QWEN35) {
        if ((rc = positive(path, "linear_num_key_heads", c->linear_num_key_heads, err))) return rc;
        if ((rc = positive(path, "linear_num_value_heads", c->linear_num_value_heads, err))) return rc;
        if ((rc = positive(path, "linear_key_head_dim", c->linear_key_head_dim, err))) return rc;
        if ((rc = positive(path, "linear_value_head_dim", c->linear_value_head_dim, err))) return rc;
        if ((rc = positive(path, "linear_conv_kernel_dim", c->linear_conv_kernel_dim, err))) return rc;
        if (c->linear_conv_kernel_dim > 64)
            return err_set(err, Q35_ERR_CONFIG, "%s: key 'linear_conv_kernel_dim' = %d is too large (max 64)", path,
                           c->linear_conv_kernel_dim);
        if (c->linear_num_value_heads % c->linear_num_key_heads != 0)
            return err_set(err, Q35_ERR_CONFIG, "%s: linear_num_value_heads (%d) must be a multiple of "
                           "linear_num_key_heads (%d)", path, c->linear_num_value_heads, c->linear_num_key_heads);
        int64_t kd = (int64_t)c->linear_num_key_heads * c->linear_key_head_dim;
        int64_t vd = (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
        if ((rc = derived(path, "key_dim", kd, &c->key_dim, err))) return rc;
        if ((rc = derived(path, "value_dim", vd, &c->value_dim, err))) return rc;
        if ((rc = derived(path, "conv_dim", 2 * kd + vd, &c->conv_dim, err))) return rc;
    } else {
        c->linear_num_key_heads = c->linear_num_value_heads = 0;
        c->linear_key_head_dim = c->linear_value_head_dim = c->linear_conv_kernel_dim = 0;
        c->key_dim = c->value_dim = c->conv_dim = 0;
    }
    return 0;
}

/* ---- generation_config.json ---- */

int genconfig_load(GenConfig *g, const char *dir, const Config *c, Err *err) {
    memset(g, 0, sizeof *g);
    g->temperature = 1.0f;
    g->top_p = 1.0f;
    g->repetition_penalty = 1.0f;
    char path[4096];
    if (path_join(path, sizeof path, dir, "generation_config.json"))
        return err_set(err, Q35_ERR_ARG, "model directory path too long: %s", dir);
    if (!file_exists(path)) return 0; /* greedy, no stop ids: the engine adds the tokenizer's */

    cJSON *root;
    int rc = json_load(&root, path, err);
    if (rc) return rc;
    JsonSrc s = {path, Q35_ERR_CONFIG};
    int64_t vmax = (c && c->vocab_size > 0) ? c->vocab_size - 1 : INT_MAX;
    if (!cJSON_IsObject(root)) {
        rc = err_set(err, Q35_ERR_CONFIG, "%s: top level is not a JSON object", path);
        goto done;
    }
    if (json_has(root, "eos_token_id")) {
        const cJSON *e = json_at(root, "eos_token_id");
        int n = cJSON_IsArray(e) ? cJSON_GetArraySize(e) : 1;
        if (n > (int)(sizeof g->eos_ids / sizeof g->eos_ids[0])) {
            rc = err_set(err, Q35_ERR_CONFIG, "%s: key 'eos_token_id' has %d entries (max %d)", path, n,
                         (int)(sizeof g->eos_ids / sizeof g->eos_ids[0]));
            goto done;
        }
        for (int i = 0; i < n; i++) {
            const cJSON *it = cJSON_IsArray(e) ? cJSON_GetArrayItem(e, i) : e;
            char what[48];
            int64_t id;
            if (cJSON_IsArray(e)) snprintf(what, sizeof what, "eos_token_id[%d]", i);
            else snprintf(what, sizeof what, "eos_token_id");
            if ((rc = json_node_int64(&s, it, what, 0, vmax, &id, err))) goto done;
            int dup = 0;
            for (int j = 0; j < g->n_eos; j++) dup |= g->eos_ids[j] == (int)id;
            if (!dup) g->eos_ids[g->n_eos++] = (int)id;
        }
    }
    if ((rc = json_bool_opt(&s, root, "do_sample", 0, &g->do_sample, err))) goto done;
    if ((rc = json_float_opt(&s, root, "temperature", 1.0f, &g->temperature, err))) goto done;
    if ((rc = json_int_opt(&s, root, "top_k", 0, &g->top_k, err))) goto done;
    if ((rc = json_float_opt(&s, root, "top_p", 1.0f, &g->top_p, err))) goto done;
    if ((rc = json_float_opt(&s, root, "min_p", 0.0f, &g->min_p, err))) goto done;
    if ((rc = json_float_opt(&s, root, "repetition_penalty", 1.0f, &g->repetition_penalty, err))) goto done;
    if ((rc = json_float_opt(&s, root, "presence_penalty", 0.0f, &g->presence_penalty, err))) goto done;
    if (g->temperature < 0.0f) rc = err_set(err, Q35_ERR_CONFIG, "%s: key 'temperature' must be >= 0", path);
    else if (g->top_k < 0) rc = err_set(err, Q35_ERR_CONFIG, "%s: key 'top_k' must be >= 0", path);
    else if (!(g->top_p > 0.0f && g->top_p <= 1.0f))
        rc = err_set(err, Q35_ERR_CONFIG, "%s: key 'top_p' must be in (0, 1]", path);
    else if (!(g->min_p >= 0.0f && g->min_p <= 1.0f))
        rc = err_set(err, Q35_ERR_CONFIG, "%s: key 'min_p' must be in [0, 1]", path);
    else if (!(g->repetition_penalty > 0.0f))
        rc = err_set(err, Q35_ERR_CONFIG, "%s: key 'repetition_penalty' must be > 0", path);
done:
    cJSON_Delete(root);
    if (rc) memset(g, 0, sizeof *g);
    return rc;
}
