/* model.c — binds checkpoint tensors to Weights by HF name (MODEL.md §2), and builds dummy weights
 * at the real shapes. One slot table per layer kind gives, for each tensor, its canonical name,
 * its field in LayerWeights, its exact shape from Config and how dummy values are drawn; loading,
 * the missing-tensor check, the parameter count and model_dummy all walk the same table.
 * Names: `model.language_model.` / `model.` are stripped, `lm_head.weight` has no prefix,
 * `model.visual.*`, `mtp.*` and `model.mtp.*` are skipped. */
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "json.h"

/* How model_dummy draws a tensor's values (n = N(0,1), u = U(0,1)). */
enum {
    INIT_MATRIX, /* n / sqrt(in_features) */
    INIT_EMBED,  /* 0.15 n: with the tied head, logits rms ~ 0.15 sqrt(D) ~ 5 as in a trained model */
    INIT_NORM,   /* zero-centred (Qwen3.5): 0.1 n; plain (Qwen3): 1 + 0.1 n */
    INIT_GNORM,  /* gated norm, plain weight: 1 + 0.1 n (F32) */
    INIT_ALOG,   /* log(1 + 15 u) (F32) */
    INIT_DTBIAS, /* 0.5 n */
    INIT_CONV,   /* n / sqrt(K) */
};

typedef struct Slot {
    const char *name; /* canonical name, after "layers.{i}." for layer slots */
    size_t off;       /* offset of the Tensor in LayerWeights (layer slots) or Weights */
    int ndim;
    int64_t shape[3];
    int init;
    int f32; /* stored F32 in the checkpoint; rounded to bf16 values unless keep_f32_params */
    int fp8; /* quantized by model_quantize_fp8: the matrices Qwen's FP8 checkpoints store as F8_E4M3 */
} Slot;

#define LW(field) offsetof(LayerWeights, field)
#define MAX_SLOTS 16

/* Slots of one layer of the given type, in MODEL.md §2.3 / §2.4 order. Returns the count. */
static int layer_slots(const Config *c, int type, Slot *s) {
    int64_t D = c->hidden_size, F = c->intermediate_size;
    int n = 0;
    s[n++] = (Slot){"input_layernorm.weight", LW(input_layernorm), 1, {D}, INIT_NORM, 0, 0};
    if (type == LAYER_LINEAR_ATTN) {
        int64_t Hv = c->linear_num_value_heads, dv = c->linear_value_head_dim;
        s[n++] = (Slot){"linear_attn.in_proj_qkv.weight", LW(in_proj_qkv), 2, {c->conv_dim, D}, INIT_MATRIX, 0, 1};
        s[n++] = (Slot){"linear_attn.in_proj_z.weight", LW(in_proj_z), 2, {c->value_dim, D}, INIT_MATRIX, 0, 1};
        s[n++] = (Slot){"linear_attn.in_proj_b.weight", LW(in_proj_b), 2, {Hv, D}, INIT_MATRIX, 0, 0};
        s[n++] = (Slot){"linear_attn.in_proj_a.weight", LW(in_proj_a), 2, {Hv, D}, INIT_MATRIX, 0, 0};
        s[n++] = (Slot){"linear_attn.conv1d.weight", LW(conv1d), 3, {c->conv_dim, 1, c->linear_conv_kernel_dim},
                        INIT_CONV, 0, 0};
        s[n++] = (Slot){"linear_attn.dt_bias", LW(dt_bias), 1, {Hv}, INIT_DTBIAS, 0, 0};
        s[n++] = (Slot){"linear_attn.A_log", LW(A_log), 1, {Hv}, INIT_ALOG, 1, 0};
        s[n++] = (Slot){"linear_attn.norm.weight", LW(linear_norm), 1, {dv}, INIT_GNORM, 1, 0};
        s[n++] = (Slot){"linear_attn.out_proj.weight", LW(out_proj), 2, {D, c->value_dim}, INIT_MATRIX, 0, 1};
    } else {
        int64_t hd = c->head_dim;
        s[n++] = (Slot){"self_attn.q_proj.weight", LW(q_proj), 2, {c->q_proj_rows, D}, INIT_MATRIX, 0, 1};
        s[n++] = (Slot){"self_attn.k_proj.weight", LW(k_proj), 2, {c->kv_dim, D}, INIT_MATRIX, 0, 1};
        s[n++] = (Slot){"self_attn.v_proj.weight", LW(v_proj), 2, {c->kv_dim, D}, INIT_MATRIX, 0, 1};
        s[n++] = (Slot){"self_attn.o_proj.weight", LW(o_proj), 2, {D, c->attn_dim}, INIT_MATRIX, 0, 1};
        s[n++] = (Slot){"self_attn.q_norm.weight", LW(q_norm), 1, {hd}, INIT_NORM, 0, 0};
        s[n++] = (Slot){"self_attn.k_norm.weight", LW(k_norm), 1, {hd}, INIT_NORM, 0, 0};
    }
    s[n++] = (Slot){"post_attention_layernorm.weight", LW(post_attention_layernorm), 1, {D}, INIT_NORM, 0, 0};
    s[n++] = (Slot){"mlp.gate_proj.weight", LW(gate_proj), 2, {F, D}, INIT_MATRIX, 0, 1};
    s[n++] = (Slot){"mlp.up_proj.weight", LW(up_proj), 2, {F, D}, INIT_MATRIX, 0, 1};
    s[n++] = (Slot){"mlp.down_proj.weight", LW(down_proj), 2, {D, F}, INIT_MATRIX, 0, 1};
    return n;
}

/* Global slots: embedding, final norm, LM head (the head is optional when tied). */
enum { G_EMBED, G_NORM, G_HEAD, N_GLOBAL };
static void global_slots(const Config *c, Slot *s) {
    int64_t V = c->vocab_size, D = c->hidden_size;
    s[G_EMBED] = (Slot){"embed_tokens.weight", offsetof(Weights, embed_tokens), 2, {V, D}, INIT_EMBED, 0, 0};
    s[G_NORM] = (Slot){"norm.weight", offsetof(Weights, norm), 1, {D}, INIT_NORM, 0, 0};
    s[G_HEAD] = (Slot){"lm_head.weight", offsetof(Weights, lm_head), 2, {V, D}, INIT_MATRIX, 0, 0};
}

static Tensor *slot_tensor(void *base, const Slot *s) { return (Tensor *)((char *)base + s->off); }

static int64_t slot_numel(const Slot *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
    return n;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

int64_t model_param_count(const Config *c) {
    Slot s[MAX_SLOTS], g[N_GLOBAL];
    global_slots(c, g);
    int64_t total = slot_numel(&g[G_EMBED]) + slot_numel(&g[G_NORM]);
    if (!c->tie_word_embeddings) total += slot_numel(&g[G_HEAD]);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int n = layer_slots(c, c->layer_types[l], s);
        for (int i = 0; i < n; i++) total += slot_numel(&s[i]);
    }
    return total;
}

/* ---- ownership ---- */

/* malloc that the Model frees in model_free. Large blocks are 2 MiB aligned and marked for
 * transparent huge pages: first-touch page faults dominate filling 1.5 GB of dummy weights. */
static void *own(Model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **p = realloc(m->owned, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        m->owned = p;
        m->cap_owned = cap;
    }
    void *q = NULL;
    if (bytes >= (4u << 20)) {
        if (posix_memalign(&q, 2u << 20, bytes) != 0) q = NULL;
        else madvise(q, bytes, MADV_HUGEPAGE); /* a hint; failure is harmless */
    } else {
        q = malloc(bytes ? bytes : 1);
    }
    if (q) m->owned[m->n_owned++] = q;
    return q;
}

static char *own_str(Model *m, const char *s) {
    char *p = own(m, strlen(s) + 1);
    if (p) memcpy(p, s, strlen(s) + 1);
    return p;
}

void model_free(Model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_files; i++) safetensors_close(&m->files[i]);
    free(m->files);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->w.layers);
    memset(m, 0, sizeof *m);
}

/* ---- loading ---- */

typedef struct Binder {
    Model *m;
    const ModelLoadOptions *o;
    int n_unknown;
} Binder;

/* Canonical name of a stored name; NULL when it is to be skipped (vision tower, MTP head). */
static const char *canonical(const char *name, int *skip) {
    static const char *skips[] = {"model.visual.", "model.mtp.", "mtp."};
    *skip = 0;
    for (size_t i = 0; i < sizeof skips / sizeof skips[0]; i++)
        if (strncmp(name, skips[i], strlen(skips[i])) == 0) {
            *skip = 1;
            return NULL;
        }
    if (strncmp(name, "model.language_model.", 21) == 0) return name + 21;
    if (strncmp(name, "model.", 6) == 0) {
        if (strcmp(name + 6, "lm_head.weight") == 0) return NULL; /* the head has no prefix */
        return name + 6;
    }
    if (strcmp(name, "lm_head.weight") == 0) return name;
    return NULL;
}

/* Finds the slot for a canonical name: *base is Weights or a LayerWeights. NULL if unknown. */
static const Slot *find_slot(Model *m, const char *canon, Slot *tab, void **base) {
    const Config *c = &m->config;
    if (strncmp(canon, "layers.", 7) == 0) {
        const char *p = canon + 7;
        long l = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 6) l = l * 10 + (*p++ - '0'), digits++;
        if (!digits || *p != '.' || (digits > 1 && canon[7] == '0') || l >= c->num_hidden_layers) return NULL;
        int n = layer_slots(c, c->layer_types[l], tab);
        for (int i = 0; i < n; i++)
            if (strcmp(p + 1, tab[i].name) == 0) {
                *base = &m->w.layers[l];
                return &tab[i];
            }
        return NULL;
    }
    global_slots(c, tab);
    for (int i = 0; i < N_GLOBAL; i++)
        if (strcmp(canon, tab[i].name) == 0) {
            *base = &m->w;
            return &tab[i];
        }
    return NULL;
}

#define SCALE_SUFFIX "_scale_inv"

/* Binds "<weight>_scale_inv" (F32, or BF16 as in Qwen's own FP8 checkpoints) to the slot's
 * Tensor.scale_inv: shape (ceil(rows/128), ceil(cols/128)) of the slot's matrix; kept as fp32. */
static int bind_scale(Model *m, const SafeTensors *f, const Tensor *t, const Slot *s, Tensor *dst, Err *err) {
    if (s->ndim != 2)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': a block scale for '%s', which is not a matrix", f->path,
                       t->name, s->name);
    if (dst->scale_inv)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': a second block scale for the same weight", f->path,
                       t->name);
    if (t->dtype != DT_F32 && t->dtype != DT_BF16)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': block scale of dtype %s, expected F32 (or BF16)", f->path,
                       t->name, dtype_name(t->dtype));
    const int64_t want[2] = {(s->shape[0] + FP8_BLOCK - 1) / FP8_BLOCK, (s->shape[1] + FP8_BLOCK - 1) / FP8_BLOCK};
    if (t->ndim != 2 || t->shape[0] != want[0] || t->shape[1] != want[1]) {
        char w[96], got[96], mat[96];
        shape_str(w, sizeof w, 2, want);
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(mat, sizeof mat, 2, s->shape);
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': shape %s, expected %s (128 x 128 blocks of %s)", f->path,
                       t->name, got, w, mat);
    }
    if (t->dtype == DT_F32 && (uintptr_t)t->data % sizeof(float) == 0) {
        dst->scale_inv = t->data;
        return 0;
    }
    float *p = own(m, (size_t)t->numel * sizeof(float));
    if (!p) return err_set(err, Q35_ERR_OOM, "out of memory copying tensor '%s'", t->name);
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == DT_BF16) {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            p[i] = bf16_to_f32(h);
        } else {
            memcpy(&p[i], (const char *)t->data + 4 * i, 4);
        }
    }
    dst->scale_inv = p;
    return 0;
}

/* Binds one stored tensor: checks dtype and exact shape, refuses a second binding. "<weight>_scale_inv"
 * goes to the weight's Tensor.scale_inv. */
static int bind_one(Binder *b, const SafeTensors *f, const Tensor *t, Err *err) {
    int skip;
    char stripped[512];
    const size_t nl = strlen(t->name), sl = strlen(SCALE_SUFFIX);
    const int is_scale = nl > sl && nl < sizeof stripped && strcmp(t->name + nl - sl, SCALE_SUFFIX) == 0;
    if (is_scale) memcpy(stripped, t->name, nl - sl), stripped[nl - sl] = 0;
    const char *canon = canonical(is_scale ? stripped : t->name, &skip);
    if (skip) return 0;
    Slot tab[MAX_SLOTS];
    void *base = NULL;
    const Slot *s = canon ? find_slot(b->m, canon, tab, &base) : NULL;
    if (s && is_scale) return bind_scale(b->m, f, t, s, slot_tensor(base, s), err);
    if (!s) {
        if (b->o->strict)
            return err_set(err, Q35_ERR_FORMAT, "%s: unknown tensor '%s' (strict mode)", f->path, t->name);
        if (b->n_unknown++ < 8) fprintf(stderr, "warning: %s: unknown tensor '%s' ignored\n", f->path, t->name);
        return 0;
    }
    Tensor *dst = slot_tensor(base, s);
    if (dst->data || dst->name)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s' binds '%s', which '%s' already bound", f->path, t->name,
                       canon, dst->name);
    if (t->dtype == DT_F8_E4M3 && s->ndim != 2)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': dtype F8_E4M3 is supported for matrices only", f->path,
                       t->name);
    if (t->dtype == DT_F8_E4M3 && !b->m->config.quant_fp8)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s' is F8_E4M3 but config.json has no fp8 quantization_config",
                       f->path, t->name);
    if (t->dtype != DT_BF16 && t->dtype != DT_F16 && t->dtype != DT_F32 && t->dtype != DT_F8_E4M3)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': dtype %s not supported (BF16, F16, F32 or F8_E4M3)",
                       f->path, t->name, dtype_name(t->dtype));
    int same = t->ndim == s->ndim;
    for (int i = 0; same && i < s->ndim; i++) same = t->shape[i] == s->shape[i];
    if (!same) {
        char want[96], got[96];
        shape_str(want, sizeof want, s->ndim, s->shape);
        shape_str(got, sizeof got, t->ndim, t->shape);
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': shape %s, expected %s from config.json", f->path,
                       t->name, got, want);
    }
    const float *scale = dst->scale_inv; /* a scale bound before its weight */
    *dst = *t;
    dst->scale_inv = scale;
    return 0;
}

/* Opens <dir>/model.safetensors or the shards of <dir>/model.safetensors.index.json. */
static int open_files(Model *m, const char *dir, char *ckpt, size_t ckpt_n, Err *err) {
    char path[4096];
    if (path_join(path, sizeof path, dir, "model.safetensors"))
        return err_set(err, Q35_ERR_ARG, "model directory path too long: %s", dir);
    if (file_exists(path)) {
        snprintf(ckpt, ckpt_n, "%s", path);
        if (!(m->files = calloc(1, sizeof(SafeTensors)))) return err_set(err, Q35_ERR_OOM, "out of memory");
        int rc = safetensors_open(&m->files[0], path, err);
        if (!rc) m->n_files = 1;
        return rc;
    }
    char index[4096];
    if (path_join(index, sizeof index, dir, "model.safetensors.index.json"))
        return err_set(err, Q35_ERR_ARG, "model directory path too long: %s", dir);
    if (!file_exists(index))
        return err_set(err, Q35_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json found", dir);
    snprintf(ckpt, ckpt_n, "%s", index);

    cJSON *root;
    int rc = json_load(&root, index, err);
    if (rc) return rc;
    JsonSrc js = {index, Q35_ERR_FORMAT};
    const cJSON *wm;
    if ((rc = json_object(&js, root, "weight_map", &wm, err))) goto done;
    int n_map = cJSON_GetArraySize(wm);
    if (!(m->files = calloc(n_map ? (size_t)n_map : 1, sizeof(SafeTensors)))) {
        rc = err_set(err, Q35_ERR_OOM, "out of memory");
        goto done;
    }
    /* Open each distinct shard once. */
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        const char *shard = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!shard || !shard[0] || strchr(shard, '/') || strcmp(shard, "..") == 0 || strcmp(shard, ".") == 0) {
            rc = err_set(err, Q35_ERR_FORMAT, "%s: weight_map['%s'] is not a plain file name", index, e->string);
            break;
        }
        if (path_join(path, sizeof path, dir, shard)) {
            rc = err_set(err, Q35_ERR_ARG, "shard path too long: %s/%s", dir, shard);
            break;
        }
        int seen = 0;
        for (int i = 0; i < m->n_files && !seen; i++) seen = strcmp(m->files[i].path, path) == 0;
        if (!seen && !(rc = safetensors_open(&m->files[m->n_files], path, err))) m->n_files++;
    }
    /* Every tensor the index lists must be in the shard it names. */
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        path_join(path, sizeof path, dir, e->valuestring);
        for (int i = 0; i < m->n_files; i++)
            if (strcmp(m->files[i].path, path) == 0 && !safetensors_find(&m->files[i], e->string))
                rc = err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s' is mapped to %s, which does not contain it", index,
                             e->string, e->valuestring);
    }
done:
    cJSON_Delete(root);
    return rc;
}

/* Replaces an F32 tensor's data by a model-owned copy; rounds to bf16 values when asked.
 * Also used for any bound tensor whose data is not aligned to its element size. */
static int own_copy(Model *m, Tensor *t, int round, Err *err) {
    void *p = own(m, t->nbytes);
    if (!p) return err_set(err, Q35_ERR_OOM, "out of memory copying tensor '%s'", t->name);
    memcpy(p, t->data, t->nbytes);
    if (round && t->dtype == DT_F32) {
        float *f = p;
        for (int64_t i = 0; i < t->numel; i++) f[i] = round_bf16(f[i]);
    }
    t->data = p;
    return 0;
}

/* An F8_E4M3 weight has its block scale and a scale has its FP8 weight. */
static int check_fp8(const Tensor *t, const char *ckpt, Err *err) {
    if (t->dtype == DT_F8_E4M3 && !t->scale_inv)
        return err_set(err, Q35_ERR_FORMAT, "%s: F8_E4M3 tensor '%s' has no '%s" SCALE_SUFFIX "' block scale", ckpt,
                       t->name, t->name);
    if (t->dtype != DT_F8_E4M3 && t->scale_inv)
        return err_set(err, Q35_ERR_FORMAT, "%s: '%s" SCALE_SUFFIX "' is a block scale for a %s tensor (F8_E4M3 only)",
                       ckpt, t->name, dtype_name(t->dtype));
    return 0;
}

/* Bytes a bound tensor occupies: its data plus an FP8 matrix's fp32 block scales. */
static int64_t tensor_bytes(const Tensor *t) {
    int64_t n = (int64_t)t->nbytes;
    if (t->scale_inv) n += (t->shape[0] + FP8_BLOCK - 1) / FP8_BLOCK * ((t->shape[1] + FP8_BLOCK - 1) / FP8_BLOCK) * 4;
    return n;
}

/* Checks that every slot is bound, sets up the head, post-processes and counts. */
static void report(const ModelProgress *p, const char *what, double done, double total) {
    if (p && p->fn) p->fn(p->user, what, done, total);
}

static int finish_binding(Model *m, const ModelLoadOptions *o, const ModelProgress *p, const char *ckpt, Err *err) {
    const Config *c = &m->config;
    Slot g[N_GLOBAL], s[MAX_SLOTS];
    char want[96];
    global_slots(c, g);
    for (int l = -1; l < c->num_hidden_layers; l++) {
        int n = l < 0 ? 2 : layer_slots(c, c->layer_types[l], s);
        const Slot *tab = l < 0 ? g : s;
        void *base = l < 0 ? (void *)&m->w : (void *)&m->w.layers[l];
        for (int i = 0; i < n; i++) {
            Tensor *t = slot_tensor(base, &tab[i]);
            if (!t->data) {
                shape_str(want, sizeof want, tab[i].ndim, tab[i].shape);
                if (l < 0)
                    return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s' missing (expected shape %s)", ckpt,
                                   tab[i].name, want);
                return err_set(err, Q35_ERR_FORMAT, "%s: tensor 'layers.%d.%s' missing (expected shape %s)", ckpt, l,
                               tab[i].name, want);
            }
            int rc = check_fp8(t, ckpt, err);
            if (rc) return rc;
            if (tab[i].f32 && t->dtype == DT_F32 && !o->keep_f32_params) rc = own_copy(m, t, 1, err);
            else if ((uintptr_t)t->data % (uintptr_t)dtype_size(t->dtype)) rc = own_copy(m, t, 0, err);
            if (rc) return rc;
            m->n_params += t->numel;
            m->n_bytes += tensor_bytes(t);
        }
        report(p, "binding weights", l + 2, c->num_hidden_layers + 1);
    }
    /* Tied head, or no head stored: the head is the embedding (a stored tied copy holds the same values). */
    if (!m->w.lm_head.data || c->tie_word_embeddings) {
        if (m->w.lm_head.scale_inv && !m->w.lm_head.data)
            return err_set(err, Q35_ERR_FORMAT, "%s: 'lm_head.weight_scale_inv' without 'lm_head.weight'", ckpt);
        m->w.lm_head = m->w.embed_tokens;
    } else {
        Tensor *t = &m->w.lm_head;
        int rc = check_fp8(t, ckpt, err);
        if (rc) return rc;
        if ((uintptr_t)t->data % (uintptr_t)dtype_size(t->dtype)) {
            if ((rc = own_copy(m, t, 0, err))) return rc;
        }
        m->n_params += t->numel;
        m->n_bytes += tensor_bytes(t);
    }
    return 0;
}

static int load(Model *m, const char *dir, const ModelLoadOptions *o, const ModelProgress *p, Err *err) {
    int rc = config_load(&m->config, dir, err);
    if (rc) return rc;
    if (!(m->w.layers = calloc((size_t)m->config.num_hidden_layers, sizeof(LayerWeights))))
        return err_set(err, Q35_ERR_OOM, "out of memory");
    for (int l = 0; l < m->config.num_hidden_layers; l++) m->w.layers[l].type = m->config.layer_types[l];
    char ckpt[4096];
    if ((rc = open_files(m, dir, ckpt, sizeof ckpt, err))) return rc;
    Binder b = {m, o, 0};
    for (int f = 0; f < m->n_files; f++)
        for (int i = 0; i < m->files[f].n_tensors; i++)
            if ((rc = bind_one(&b, &m->files[f], &m->files[f].tensors[i], err))) return rc;
    if (b.n_unknown > 8) fprintf(stderr, "warning: %d unknown tensors ignored in total\n", b.n_unknown);
    if ((rc = finish_binding(m, o, p, ckpt, err))) return rc;
    return genconfig_load(&m->gen, dir, &m->config, err);
}

int model_load_progress(Model *m, const char *dir, const ModelLoadOptions *o, const ModelProgress *p, Err *err) {
    static const ModelLoadOptions defaults = {0, 0};
    memset(m, 0, sizeof *m);
    int rc = load(m, dir, o ? o : &defaults, p, err);
    if (rc) model_free(m);
    return rc;
}

int model_load(Model *m, const char *dir, const ModelLoadOptions *o, Err *err) {
    return model_load_progress(m, dir, o, NULL, err);
}

/* ---- FP8 weights: quantize at load (--weights fp8), dequantize for the fp32 reference ---- */

/* Calls fn on every bound weight (the head only when it is not the embedding; a tied head follows it). */
typedef int (*TensorFn)(Model *m, Tensor *t, const Slot *s, Err *err);
static int each_tensor(Model *m, TensorFn fn, Err *err) {
    const Config *c = &m->config;
    Slot g[N_GLOBAL], s[MAX_SLOTS];
    global_slots(c, g);
    const int own_head = m->w.lm_head.data && m->w.lm_head.data != m->w.embed_tokens.data;
    for (int l = -1; l < c->num_hidden_layers; l++) {
        const int n = l < 0 ? (own_head ? N_GLOBAL : G_HEAD) : layer_slots(c, c->layer_types[l], s);
        const Slot *tab = l < 0 ? g : s;
        void *base = l < 0 ? (void *)&m->w : (void *)&m->w.layers[l];
        for (int i = 0; i < n; i++) {
            Tensor *t = slot_tensor(base, &tab[i]);
            int rc = t->data ? fn(m, t, &tab[i], err) : 0;
            if (rc) return rc;
        }
    }
    if (!own_head) m->w.lm_head = m->w.embed_tokens;
    return 0;
}

/* Element i of a BF16 / F16 / F32 tensor as fp32. */
static float elem_f32(const Tensor *t, int64_t i) {
    if (t->dtype == DT_F32) return ((const float *)t->data)[i];
    const uint16_t h = ((const uint16_t *)t->data)[i];
    return t->dtype == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static int quantize_one(Model *m, Tensor *t, const Slot *s, Err *err) {
    if (!s->fp8 || t->dtype == DT_F8_E4M3) return 0;
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const int64_t nbr = (rows + FP8_BLOCK - 1) / FP8_BLOCK, nbc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    uint8_t *q = own(m, (size_t)(rows * cols));
    float *si = own(m, (size_t)(nbr * nbc) * sizeof(float));
    if (!q || !si) return err_set(err, Q35_ERR_OOM, "out of memory quantizing '%s' to FP8", t->name);
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t br = 0; br < nbr; br++) {
        const int64_t r0 = br * FP8_BLOCK, nr = rows - r0 < FP8_BLOCK ? rows - r0 : FP8_BLOCK;
        float *strip = malloc((size_t)(nr * cols) * sizeof(float));
        if (!strip) {
            failed = 1;
            continue;
        }
        for (int64_t i = 0; i < nr * cols; i++) strip[i] = elem_f32(t, r0 * cols + i);
        fp8_quantize_blocks(q + r0 * cols, si + br * nbc, strip, nr, cols);
        free(strip);
    }
    if (failed) return err_set(err, Q35_ERR_OOM, "out of memory quantizing '%s' to FP8", t->name);
    m->n_bytes -= tensor_bytes(t);
    t->dtype = DT_F8_E4M3;
    t->data = q;
    t->nbytes = (size_t)(rows * cols);
    t->scale_inv = si;
    m->n_bytes += tensor_bytes(t);
    return 0;
}

int model_quantize_fp8(Model *m, Err *err) { return each_tensor(m, quantize_one, err); }

static int dequantize_one(Model *m, Tensor *t, const Slot *s, Err *err) {
    (void)s;
    if (t->dtype != DT_F8_E4M3) return 0;
    const int64_t rows = t->shape[0], cols = t->shape[1], nbc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    float *w = own(m, (size_t)t->numel * sizeof(float));
    if (!w) return err_set(err, Q35_ERR_OOM, "out of memory dequantizing '%s'", t->name);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t r0 = 0; r0 < rows; r0 += FP8_BLOCK) {
        const int64_t nr = rows - r0 < FP8_BLOCK ? rows - r0 : FP8_BLOCK;
        fp8_dequantize_blocks(w + r0 * cols, (const uint8_t *)t->data + r0 * cols, t->scale_inv + r0 / FP8_BLOCK * nbc,
                              nr, cols);
    }
    t->dtype = DT_F32;
    t->data = w;
    t->nbytes = (size_t)t->numel * sizeof(float);
    t->scale_inv = NULL;
    return 0;
}

int model_dequantize_fp8(Model *dst, const Model *src, Err *err) {
    memset(dst, 0, sizeof *dst);
    dst->config = src->config;
    dst->gen = src->gen;
    dst->w = src->w;
    dst->n_params = src->n_params;
    dst->n_bytes = src->n_bytes;
    const size_t L = (size_t)src->config.num_hidden_layers;
    if (!(dst->w.layers = malloc(L * sizeof(LayerWeights)))) return err_set(err, Q35_ERR_OOM, "out of memory");
    memcpy(dst->w.layers, src->w.layers, L * sizeof(LayerWeights));
    int rc = each_tensor(dst, dequantize_one, err);
    if (rc) model_free(dst);
    return rc;
}

static void add_fp8(const Tensor *t, int *n, int64_t *bytes) {
    if (t->dtype != DT_F8_E4M3) return;
    (*n)++;
    *bytes += tensor_bytes(t);
}

int model_fp8_count(const Model *m, int64_t *bytes) {
    const Config *c = &m->config;
    int n = 0;
    int64_t b = 0;
    add_fp8(&m->w.embed_tokens, &n, &b);
    if (m->w.lm_head.data && m->w.lm_head.data != m->w.embed_tokens.data) add_fp8(&m->w.lm_head, &n, &b);
    Slot s[MAX_SLOTS];
    for (int l = 0; l < c->num_hidden_layers && m->w.layers; l++) {
        const int k = layer_slots(c, c->layer_types[l], s);
        for (int i = 0; i < k; i++) add_fp8(slot_tensor(&m->w.layers[l], &s[i]), &n, &b);
    }
    if (bytes) *bytes = b;
    return n;
}

/* ---- dummy weights ---- */

/* Counter-based generator: the value of element i of tensor k depends only on (seed, k, i), so
 * chunks fill in parallel and the result does not depend on the thread count. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Approximate N(0,1): sum of four 16-bit uniforms, centred and scaled (range +-3.46). */
static inline float approx_normal(uint64_t h) {
    int32_t s = (int32_t)(h & 0xffff) + (int32_t)((h >> 16) & 0xffff) + (int32_t)((h >> 32) & 0xffff) +
                (int32_t)(h >> 48);
    return (float)(s - 131070) * (1.0f / 37837.2f);
}

typedef struct DummyJob {
    Tensor *t;
    int init;
    float off, scale; /* value = off + scale * n, except INIT_ALOG */
    uint64_t key;     /* per-tensor stream */
} DummyJob;

#define DUMMY_CHUNK (1 << 16)

/* Fills chunks [c0, c1); a chunk's values depend only on its index (any slicing, any thread count). */
static void dummy_fill(DummyJob *jobs, int n_jobs, int64_t *chunk_start, int64_t c0, int64_t c1) {
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t c = c0; c < c1; c++) {
        int k = 0; /* job owning chunk c: chunk_start is increasing */
        int lo = 0, hi = n_jobs - 1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            if (chunk_start[mid] <= c) k = mid, lo = mid + 1;
            else hi = mid - 1;
        }
        const DummyJob *j = &jobs[k];
        int64_t i0 = (c - chunk_start[k]) * DUMMY_CHUNK, i1 = i0 + DUMMY_CHUNK;
        if (i1 > j->t->numel) i1 = j->t->numel;
        const uint64_t key = j->key;
        const float off = j->off, scale = j->scale;
        if (j->t->dtype == DT_BF16) {
            uint16_t *p = (uint16_t *)j->t->data;
            for (int64_t i = i0; i < i1; i++)
                p[i] = f32_to_bf16(off + scale * approx_normal(mix64(key + (uint64_t)i * 0x9e3779b97f4a7c15ull)));
        } else { /* F32 params, stored as bf16-representable values (what the default load gives) */
            float *p = (float *)j->t->data;
            for (int64_t i = i0; i < i1; i++) {
                uint64_t h = mix64(key + (uint64_t)i * 0x9e3779b97f4a7c15ull);
                float v = j->init == INIT_ALOG ? logf(1.0f + 15.0f * (float)(h >> 40) * (1.0f / 16777216.0f))
                                               : off + scale * approx_normal(h);
                p[i] = round_bf16(v);
            }
        }
    }
}

/* Allocates one slot's tensor (bf16, or F32 for the F32 slots) and queues its fill job. */
static int dummy_alloc(Model *m, void *base, const Slot *s, const char *name, uint64_t key, DummyJob *j,
                       Err *err) {
    Tensor *t = slot_tensor(base, s);
    t->dtype = s->f32 ? DT_F32 : DT_BF16;
    t->ndim = s->ndim;
    memcpy(t->shape, s->shape, sizeof s->shape);
    t->numel = slot_numel(s);
    t->nbytes = (size_t)t->numel * (size_t)dtype_size(t->dtype);
    t->name = own_str(m, name);
    t->data = own(m, t->nbytes);
    if (!t->name || !t->data) return err_set(err, Q35_ERR_OOM, "out of memory for dummy tensor '%s'", name);
    *j = (DummyJob){t, s->init, 0.0f, 0.5f, key}; /* INIT_DTBIAS: 0.5 n */
    if (s->init == INIT_EMBED) j->scale = 0.15f;
    if (s->init == INIT_MATRIX) j->scale = 1.0f / sqrtf((float)s->shape[s->ndim - 1]);
    if (s->init == INIT_CONV) j->scale = 1.0f / sqrtf((float)s->shape[2]);
    if (s->init == INIT_NORM) j->off = m->config.family == FAMILY_QWEN3 ? 1.0f : 0.0f, j->scale = 0.1f;
    if (s->init == INIT_GNORM) j->off = 1.0f, j->scale = 0.1f;
    m->n_params += t->numel;
    m->n_bytes += (int64_t)t->nbytes;
    return 0;
}

static int dummy(Model *m, const Config *cfg, uint64_t seed, const ModelProgress *p, Err *err) {
    m->config = *cfg;
    int rc = config_finish(&m->config, "dummy config", err);
    if (rc) return rc;
    const Config *c = &m->config;
    int L = c->num_hidden_layers, max_jobs = N_GLOBAL + L * MAX_SLOTS, n_jobs = 0;
    DummyJob *jobs = calloc((size_t)max_jobs, sizeof *jobs);
    int64_t *starts = calloc((size_t)max_jobs, sizeof *starts);
    m->w.layers = calloc((size_t)L, sizeof(LayerWeights));
    if (!jobs || !starts || !m->w.layers) {
        rc = err_set(err, Q35_ERR_OOM, "out of memory");
        goto done;
    }
    Slot g[N_GLOBAL], s[MAX_SLOTS];
    char full[128];
    global_slots(c, g);
    /* Stream key of job k: mix64(seed, k). */
#define JOB_KEY(k) mix64(seed * 0x632be59bd9b4e019ull + (uint64_t)(k) * 0x9e3779b97f4a7c15ull + 1)
    for (int i = 0; i < (c->tie_word_embeddings ? G_HEAD : N_GLOBAL) && !rc; i++, n_jobs++)
        rc = dummy_alloc(m, &m->w, &g[i], g[i].name, JOB_KEY(n_jobs), &jobs[n_jobs], err);
    for (int l = 0; l < L && !rc; l++) {
        m->w.layers[l].type = c->layer_types[l];
        int n = layer_slots(c, c->layer_types[l], s);
        for (int i = 0; i < n && !rc; i++, n_jobs++) {
            snprintf(full, sizeof full, "layers.%d.%s", l, s[i].name);
            rc = dummy_alloc(m, &m->w.layers[l], &s[i], full, JOB_KEY(n_jobs), &jobs[n_jobs], err);
        }
    }
#undef JOB_KEY
    if (rc) goto done;
    int64_t n_chunks = 0;
    for (int k = 0; k < n_jobs; k++) {
        starts[k] = n_chunks;
        n_chunks += (jobs[k].t->numel + DUMMY_CHUNK - 1) / DUMMY_CHUNK;
    }
    const int64_t slice = n_chunks / 50 + 1; /* ~50 progress reports */
    for (int64_t c0 = 0; c0 < n_chunks; c0 += slice) {
        const int64_t c1 = c0 + slice < n_chunks ? c0 + slice : n_chunks;
        dummy_fill(jobs, n_jobs, starts, c0, c1);
        report(p, "random weights", (double)c1, (double)n_chunks);
    }
    if (c->tie_word_embeddings) m->w.lm_head = m->w.embed_tokens;
    m->gen = (GenConfig){.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f}; /* greedy */
done:
    free(jobs);
    free(starts);
    return rc;
}

static int dummy_config(Model *m, const Config *c, uint64_t seed, const ModelProgress *p, Err *err) {
    Config copy = *c; /* c may be &m->config */
    memset(m, 0, sizeof *m);
    int rc = dummy(m, &copy, seed, p, err);
    if (rc) model_free(m);
    return rc;
}

int model_dummy_config(Model *m, const Config *c, uint64_t seed, Err *err) {
    return dummy_config(m, c, seed, NULL, err);
}

int model_dummy(Model *m, const char *name, uint64_t seed, Err *err) {
    return model_dummy_progress(m, name, seed, NULL, err);
}

int model_dummy_progress(Model *m, const char *name, uint64_t seed, const ModelProgress *p, Err *err) {
    Config c;
    memset(m, 0, sizeof *m);
    int rc = config_builtin(&c, name, err);
    if (!rc) rc = dummy_config(m, &c, seed, p, err);
    if (rc) return rc;
    /* Stop ids per TOKENIZER.md §6: <|im_end|>, <|endoftext|>. */
    m->gen.n_eos = 2;
    m->gen.eos_ids[0] = c.family == FAMILY_QWEN35 ? 248046 : 151645;
    m->gen.eos_ids[1] = c.family == FAMILY_QWEN35 ? 248044 : 151643;
    return 0;
}

/* ---- the weights a forward pass reads (for hand-built models too) ---- */

static int is_float_dtype(DType t) { return t == DT_BF16 || t == DT_F16 || t == DT_F32; }

/* A weight the forward pass reads: present, float, and holding rows x cols elements (rows
 * checked against shape[0] for matrices). */
static int check_w(int fp8_ok, const Tensor *t, int64_t rows, int64_t cols, int layer, const char *what,
                   const char *who, Err *err) {
    char where[32] = "";
    if (layer >= 0) snprintf(where, sizeof where, "layer %d: ", layer);
    if (!t->data) return err_set(err, Q35_ERR_FORMAT, "%s: %s%s is missing", who, where, what);
    if (t->dtype == DT_F8_E4M3 && !fp8_ok)
        return err_set(err, Q35_ERR_FORMAT, "%s: %s%s (%s) is F8_E4M3, which this backend does not read (the cpu one does)",
                       who, where, what, t->name ? t->name : "?");
    if (!is_float_dtype(t->dtype) && t->dtype != DT_F8_E4M3)
        return err_set(err, Q35_ERR_FORMAT, "%s: %s%s (%s) has dtype %s, expected BF16/F16/F32", who,
                       where, what, t->name ? t->name : "?", dtype_name(t->dtype));
    if (t->numel != rows * cols || (cols > 1 && t->ndim >= 2 && t->shape[0] != rows))
        return err_set(err, Q35_ERR_FORMAT, "%s: %s%s (%s) has %lld elements, expected %lld x %lld",
                       who, where, what, t->name ? t->name : "?", (long long)t->numel, (long long)rows,
                       (long long)cols);
    return 0;
}

int model_check_weights(const Model *m, const char *who, int fp8_ok, Err *err) {
    const Config *c = &m->config;
    const Weights *w = &m->w;
    const int D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, hd = c->head_dim;
    int rc;
    if ((rc = check_w(0, &w->embed_tokens, V, D, -1, "embed_tokens", who, err)) ||
        (rc = check_w(0, &w->norm, D, 1, -1, "norm", who, err)) || (rc = check_w(0, &w->lm_head, V, D, -1, "lm_head", who, err)))
        return rc;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const LayerWeights *L = &w->layers[l];
        if ((rc = check_w(0, &L->input_layernorm, D, 1, l, "input_layernorm", who, err)) ||
            (rc = check_w(0, &L->post_attention_layernorm, D, 1, l, "post_attention_layernorm", who, err)) ||
            (rc = check_w(fp8_ok, &L->gate_proj, F, D, l, "mlp.gate_proj", who, err)) ||
            (rc = check_w(fp8_ok, &L->up_proj, F, D, l, "mlp.up_proj", who, err)) ||
            (rc = check_w(fp8_ok, &L->down_proj, D, F, l, "mlp.down_proj", who, err)))
            return rc;
        if (c->layer_types[l] == LAYER_FULL_ATTN) {
            if ((rc = check_w(fp8_ok, &L->q_proj, c->q_proj_rows, D, l, "self_attn.q_proj", who, err)) ||
                (rc = check_w(fp8_ok, &L->k_proj, c->kv_dim, D, l, "self_attn.k_proj", who, err)) ||
                (rc = check_w(fp8_ok, &L->v_proj, c->kv_dim, D, l, "self_attn.v_proj", who, err)) ||
                (rc = check_w(fp8_ok, &L->o_proj, D, c->attn_dim, l, "self_attn.o_proj", who, err)) ||
                (rc = check_w(0, &L->q_norm, hd, 1, l, "self_attn.q_norm", who, err)) ||
                (rc = check_w(0, &L->k_norm, hd, 1, l, "self_attn.k_norm", who, err)))
                return rc;
        } else {
            const int Hv = c->linear_num_value_heads;
            if ((rc = check_w(fp8_ok, &L->in_proj_qkv, c->conv_dim, D, l, "linear_attn.in_proj_qkv", who, err)) ||
                (rc = check_w(fp8_ok, &L->in_proj_z, c->value_dim, D, l, "linear_attn.in_proj_z", who, err)) ||
                (rc = check_w(fp8_ok, &L->in_proj_b, Hv, D, l, "linear_attn.in_proj_b", who, err)) ||
                (rc = check_w(fp8_ok, &L->in_proj_a, Hv, D, l, "linear_attn.in_proj_a", who, err)) ||
                (rc = check_w(0, &L->conv1d, c->conv_dim, c->linear_conv_kernel_dim, l, "linear_attn.conv1d", who, err)) ||
                (rc = check_w(0, &L->dt_bias, Hv, 1, l, "linear_attn.dt_bias", who, err)) ||
                (rc = check_w(0, &L->A_log, Hv, 1, l, "linear_attn.A_log", who, err)) ||
                (rc = check_w(0, &L->linear_norm, c->linear_value_head_dim, 1, l, "linear_attn.norm", who, err)) ||
                (rc = check_w(fp8_ok, &L->out_proj, D, c->value_dim, l, "linear_attn.out_proj", who, err)))
                return rc;
        }
    }
    return 0;
}
