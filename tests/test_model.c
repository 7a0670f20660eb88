/* test_model.c — model_load on tiny checkpoints written here (VL prefix + skipped vision/MTP
 * tensors, flat `model.` prefix, tied/untied head, shards, dense qwen3, mixed dtypes, F32 params
 * rounded or kept, misaligned data), every bad input (code + names in the message), and
 * model_dummy: the MODEL.md §6.1 parameter counts, value ranges and determinism.
 * Tensor contents are random; the seed is printed and can be given as argv[1]. */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <time.h>

#include "model.h"
#include "st_write.h"
#include "test.h"

static char dir[64];
static int verbose;

/* ---- tiny checkpoints ---- */

/* Tiny dims: D 8, F 12, V 20, Hq 2, Hkv 1, hd 4, R 2, Hk 1, Hv 2, dk 4, dv 4, K 4.
 * Hybrid layers: linear, full, linear, full. Derived: conv_dim 16, value_dim 8, q rows 16. */
enum { D = 8, F = 12, V = 20, HQ = 2, HKV = 1, HD = 4, HK = 1, HV = 2, DK = 4, DV = 4, K = 4 };
enum { CONV = 2 * HK * DK + HV * DV, VD = HV * DV };

typedef struct TList {
    StSpec t[160];
    char names[160][96];
    void *buf[160];
    int n;
} TList;

static void tl_free(TList *l) {
    for (int i = 0; i < l->n; i++) free(l->buf[i]);
    l->n = 0;
}

/* Adds a tensor with random contents of the given dtype. */
static StSpec *add(TList *l, Rng *r, const char *name, const char *dt, int ndim, int64_t a, int64_t b, int64_t c) {
    StSpec *s = &l->t[l->n];
    snprintf(l->names[l->n], sizeof l->names[0], "%s", name);
    *s = (StSpec){l->names[l->n], dt, ndim, {a, b, c}, NULL, 0};
    size_t nb = st_nbytes(s), numel = nb / (size_t)st_dsize(dt);
    uint8_t *p = malloc(nb ? nb : 1);
    for (size_t i = 0; i < numel; i++) {
        float v = rng_normal(r);
        if (!strcmp(dt, "BF16")) ((uint16_t *)p)[i] = f32_to_bf16(v);
        else if (!strcmp(dt, "F16")) ((uint16_t *)p)[i] = f32_to_f16(v);
        else if (!strcmp(dt, "F32")) ((float *)p)[i] = v + 1e-5f; /* not bf16-representable */
        else for (int k = 0; k < st_dsize(dt); k++) p[i * (size_t)st_dsize(dt) + (size_t)k] = (uint8_t)rng_u64(r);
    }
    l->buf[l->n] = p;
    s->data = p;
    l->n++;
    return s;
}

static const StSpec *spec(const TList *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}

static void drop(TList *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) l->t[i].name = "dropped.unused"; /* renamed: an unknown name */
}

/* Builds the text tensors. pre: "model.language_model." or "model."; qwen3: dense layout; head:
 * add lm_head.weight. Layer 0 stores gate_proj as F16 and down_proj as F32 (mixed dtypes). */
static void build(TList *l, Rng *r, const char *pre, int qwen3, int head) {
    char n[96];
    int L = qwen3 ? 2 : 4;
    int hq = qwen3 ? 4 : HQ, hkv = qwen3 ? 2 : HKV, qrows = qwen3 ? hq * HD : 2 * hq * HD;
#define NM(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    add(l, r, NM("%sembed_tokens.weight", pre), "BF16", 2, V, D, 0);
    add(l, r, NM("%snorm.weight", pre), "BF16", 1, D, 0, 0);
    if (head) add(l, r, "lm_head.weight", "BF16", 2, V, D, 0);
    for (int i = 0; i < L; i++) {
        int full = qwen3 || i % 2 == 1;
        add(l, r, NM("%slayers.%d.input_layernorm.weight", pre, i), "BF16", 1, D, 0, 0);
        add(l, r, NM("%slayers.%d.post_attention_layernorm.weight", pre, i), "BF16", 1, D, 0, 0);
        add(l, r, NM("%slayers.%d.mlp.gate_proj.weight", pre, i), i == 0 ? "F16" : "BF16", 2, F, D, 0);
        add(l, r, NM("%slayers.%d.mlp.up_proj.weight", pre, i), "BF16", 2, F, D, 0);
        add(l, r, NM("%slayers.%d.mlp.down_proj.weight", pre, i), i == 0 ? "F32" : "BF16", 2, D, F, 0);
        if (full) {
            add(l, r, NM("%slayers.%d.self_attn.q_proj.weight", pre, i), "BF16", 2, qrows, D, 0);
            add(l, r, NM("%slayers.%d.self_attn.k_proj.weight", pre, i), "BF16", 2, hkv * HD, D, 0);
            add(l, r, NM("%slayers.%d.self_attn.v_proj.weight", pre, i), "BF16", 2, hkv * HD, D, 0);
            add(l, r, NM("%slayers.%d.self_attn.o_proj.weight", pre, i), "BF16", 2, D, hq * HD, 0);
            add(l, r, NM("%slayers.%d.self_attn.q_norm.weight", pre, i), "BF16", 1, HD, 0, 0);
            add(l, r, NM("%slayers.%d.self_attn.k_norm.weight", pre, i), "BF16", 1, HD, 0, 0);
        } else {
            add(l, r, NM("%slayers.%d.linear_attn.in_proj_qkv.weight", pre, i), "BF16", 2, CONV, D, 0);
            add(l, r, NM("%slayers.%d.linear_attn.in_proj_z.weight", pre, i), "BF16", 2, VD, D, 0);
            add(l, r, NM("%slayers.%d.linear_attn.in_proj_b.weight", pre, i), "BF16", 2, HV, D, 0);
            add(l, r, NM("%slayers.%d.linear_attn.in_proj_a.weight", pre, i), "BF16", 2, HV, D, 0);
            add(l, r, NM("%slayers.%d.linear_attn.conv1d.weight", pre, i), "BF16", 3, CONV, 1, K);
            add(l, r, NM("%slayers.%d.linear_attn.dt_bias", pre, i), "BF16", 1, HV, 0, 0);
            add(l, r, NM("%slayers.%d.linear_attn.A_log", pre, i), "F32", 1, HV, 0, 0);
            add(l, r, NM("%slayers.%d.linear_attn.norm.weight", pre, i), "F32", 1, DV, 0, 0);
            add(l, r, NM("%slayers.%d.linear_attn.out_proj.weight", pre, i), "BF16", 2, D, VD, 0);
        }
    }
#undef NM
}

static void add_vision_mtp(TList *l, Rng *r) {
    add(l, r, "model.visual.blocks.0.attn.qkv.weight", "BF16", 2, 6, 4, 0);
    add(l, r, "model.visual.patch_embed.proj.weight", "F32", 2, 3, 2, 0);
    add(l, r, "mtp.fc.weight", "BF16", 2, D, 2 * D, 0);
    add(l, r, "mtp.layers.0.mlp.up_proj.weight", "BF16", 2, F, D, 0);
    add(l, r, "mtp.norm.weight", "BF16", 1, D, 0, 0);
    add(l, r, "model.mtp.pre_fc_norm_hidden.weight", "BF16", 1, D, 0, 0);
}

static const char *cfg_hybrid(char *buf, size_t n, const char *tie, int hk, int hv) {
    snprintf(buf, n,
             "{\"architectures\":[\"Qwen3_5ForConditionalGeneration\"],\"model_type\":\"qwen3_5\",%s"
             "\"vision_config\":{\"depth\":1},\"text_config\":{\"model_type\":\"qwen3_5_text\",\"hidden_size\":%d,"
             "\"num_hidden_layers\":4,\"intermediate_size\":%d,\"vocab_size\":%d,\"num_attention_heads\":%d,"
             "\"num_key_value_heads\":%d,\"head_dim\":%d,\"linear_num_key_heads\":%d,\"linear_num_value_heads\":%d,"
             "\"linear_key_head_dim\":%d,\"linear_value_head_dim\":%d,\"linear_conv_kernel_dim\":%d,"
             "\"layer_types\":[\"linear_attention\",\"full_attention\",\"linear_attention\",\"full_attention\"],"
             "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000000,\"partial_rotary_factor\":0.5}}}",
             tie, D, F, V, HQ, HKV, HD, hk, hv, DK, DV, K);
    return buf;
}

static const char *CFG_QWEN3 =
    "{\"model_type\":\"qwen3\",\"hidden_size\":8,\"num_hidden_layers\":2,\"intermediate_size\":12,"
    "\"vocab_size\":20,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,\"rope_theta\":1e6,"
    "\"rope_scaling\":null,\"tie_word_embeddings\":true,\"use_sliding_window\":false}";

/* Fresh model dir: config.json + the tensors as model.safetensors (or nothing when l is NULL). */
static char mdir[128];
static void write_model(const char *config, const TList *l) {
    char p[256];
    snprintf(mdir, sizeof mdir, "%s/m_XXXXXX", dir);
    if (!mkdtemp(mdir)) perror("mkdtemp");
    write_text(pj(p, sizeof p, mdir, "config.json"), config);
    if (l) st_write(pj(p, sizeof p, mdir, "model.safetensors"), l->t, l->n, "{\"format\":\"pt\"}");
}

/* Test-side map from a canonical layer suffix to the LayerWeights field (independent of model.c). */
static const struct {
    const char *suffix;
    size_t off;
} FIELDS[] = {
    {"input_layernorm.weight", offsetof(LayerWeights, input_layernorm)},
    {"post_attention_layernorm.weight", offsetof(LayerWeights, post_attention_layernorm)},
    {"linear_attn.in_proj_qkv.weight", offsetof(LayerWeights, in_proj_qkv)},
    {"linear_attn.in_proj_z.weight", offsetof(LayerWeights, in_proj_z)},
    {"linear_attn.in_proj_b.weight", offsetof(LayerWeights, in_proj_b)},
    {"linear_attn.in_proj_a.weight", offsetof(LayerWeights, in_proj_a)},
    {"linear_attn.conv1d.weight", offsetof(LayerWeights, conv1d)},
    {"linear_attn.dt_bias", offsetof(LayerWeights, dt_bias)},
    {"linear_attn.A_log", offsetof(LayerWeights, A_log)},
    {"linear_attn.norm.weight", offsetof(LayerWeights, linear_norm)},
    {"linear_attn.out_proj.weight", offsetof(LayerWeights, out_proj)},
    {"self_attn.q_proj.weight", offsetof(LayerWeights, q_proj)},
    {"self_attn.k_proj.weight", offsetof(LayerWeights, k_proj)},
    {"self_attn.v_proj.weight", offsetof(LayerWeights, v_proj)},
    {"self_attn.o_proj.weight", offsetof(LayerWeights, o_proj)},
    {"self_attn.q_norm.weight", offsetof(LayerWeights, q_norm)},
    {"self_attn.k_norm.weight", offsetof(LayerWeights, k_norm)},
    {"mlp.gate_proj.weight", offsetof(LayerWeights, gate_proj)},
    {"mlp.up_proj.weight", offsetof(LayerWeights, up_proj)},
    {"mlp.down_proj.weight", offsetof(LayerWeights, down_proj)},
};

/* Every text tensor in l must be bound with its stored dtype, shape and bytes (F32 params rounded
 * to bf16 values unless keep); returns the number of mismatches. Sums numel into *params. */
static int check_bound(const Model *m, const TList *l, const char *pre, int keep, int64_t *params) {
    int bad = 0;
    size_t np = strlen(pre);
    *params = 0;
    for (int i = 0; i < l->n; i++) {
        const StSpec *s = &l->t[i];
        const Tensor *t = NULL;
        int f32param = 0;
        if (strncmp(s->name, pre, np) != 0) continue; /* lm_head, visual, mtp, dropped */
        const char *c = s->name + np;
        if (!strcmp(c, "embed_tokens.weight")) t = &m->w.embed_tokens;
        else if (!strcmp(c, "norm.weight")) t = &m->w.norm;
        else if (!strncmp(c, "layers.", 7)) {
            int li = atoi(c + 7);
            if (li >= m->config.num_hidden_layers) continue; /* deliberately unknown */
            const char *suf = strchr(c + 7, '.') + 1;
            for (size_t k = 0; k < sizeof FIELDS / sizeof FIELDS[0]; k++)
                if (!strcmp(suf, FIELDS[k].suffix))
                    t = (const Tensor *)((const char *)&m->w.layers[li] + FIELDS[k].off);
            f32param = strstr(suf, "A_log") || strstr(suf, "linear_attn.norm");
        }
        if (!t && strstr(c, ".foo.")) continue; /* deliberately unknown */
        if (!t || !t->data) {
            if (verbose) printf("  not bound: %s\n", s->name);
            bad++;
            continue;
        }
        *params += t->numel;
        size_t nb = st_nbytes(s);
        int ok = t->nbytes == nb && !strcmp(dtype_name(t->dtype), s->dtype) && t->ndim == s->ndim;
        for (int d = 0; ok && d < s->ndim; d++) ok = t->shape[d] == s->shape[d];
        if (ok && f32param && !keep) {
            const float *a = s->data, *b = t->data;
            for (size_t e = 0; e < nb / 4; e++) ok &= b[e] == round_bf16(a[e]) && b[e] != a[e];
        } else if (ok) {
            ok = memcmp(t->data, s->data, nb) == 0;
        }
        if (!ok && verbose) printf("  mismatch: %s\n", s->name);
        bad += !ok;
    }
    return bad;
}

static int load(Model *m, int strict, int keep, Err *err) {
    ModelLoadOptions o = {keep, strict};
    int rc = model_load(m, mdir, &o, err);
    if (verbose && rc) printf("  load: %s\n", err->msg);
    return rc;
}

static void test_model_vl_tied(Rng *r) {
    TList l = {0};
    char cfg[2048], p[256];
    build(&l, r, "model.language_model.", 0, 0);
    add_vision_mtp(&l, r);
    write_model(cfg_hybrid(cfg, sizeof cfg, "\"tie_word_embeddings\":true,", HK, HV), &l);
    write_text(pj(p, sizeof p, mdir, "generation_config.json"), "{\"eos_token_id\":[7,3],\"do_sample\":false}");
    Model m;
    Err err;
    int rc = load(&m, 1, 0, &err); /* strict: visual/mtp must be skipped, not unknown */
    CHECK(rc == 0, "VL tied: %s", err.msg);
    if (rc) goto out;
    int64_t params;
    CHECK(check_bound(&m, &l, "model.language_model.", 0, &params) == 0, "VL tensors bound");
    CHECK(m.w.lm_head.data == m.w.embed_tokens.data && m.w.lm_head.dtype == DT_BF16, "tied head = embedding");
    CHECK(m.n_params == params && m.n_params == model_param_count(&m.config), "n_params %lld vs %lld vs %lld",
          (long long)m.n_params, (long long)params, (long long)model_param_count(&m.config));
    CHECK(m.w.layers[0].type == LAYER_LINEAR_ATTN && m.w.layers[1].type == LAYER_FULL_ATTN, "layer types");
    CHECK(m.w.layers[1].in_proj_qkv.data == NULL && m.w.layers[0].q_proj.data == NULL, "no cross-kind tensors");
    CHECK(m.w.layers[0].A_log.dtype == DT_F32, "A_log stays F32 (values rounded)");
    CHECK(m.gen.n_eos == 2 && m.gen.eos_ids[0] == 7 && m.gen.eos_ids[1] == 3, "generation_config loaded");
    CHECK(m.n_files == 1 && m.w.layers[2].linear_norm.shape[0] == DV, "files");
    model_free(&m);
    CHECK(m.files == NULL && m.w.layers == NULL && m.owned == NULL, "model_free clears");
    model_free(&m);

    rc = load(&m, 0, 1, &err); /* keep_f32_params: exact F32 bytes from the file */
    CHECK(rc == 0 && check_bound(&m, &l, "model.language_model.", 1, &params) == 0, "keep_f32: %s", err.msg);
    if (!rc) {
        const float *a = spec(&l, "model.language_model.layers.2.linear_attn.A_log")->data;
        CHECK(((const float *)m.w.layers[2].A_log.data)[1] == a[1], "kept F32 value");
    }
    model_free(&m);
out:
    tl_free(&l);
}

static void test_model_flat_untied(Rng *r) {
    TList l = {0};
    char cfg[2048];
    build(&l, r, "model.", 0, 1);
    /* flat qwen3_5_text layout with tie false */
    write_model("{\"model_type\":\"qwen3_5_text\",\"hidden_size\":8,\"num_hidden_layers\":4,\"intermediate_size\":12,"
                "\"vocab_size\":20,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":4,"
                "\"linear_num_key_heads\":1,\"linear_num_value_heads\":2,\"linear_key_head_dim\":4,"
                "\"linear_value_head_dim\":4,\"linear_conv_kernel_dim\":4,\"full_attention_interval\":2,"
                "\"rope_theta\":1e7,\"partial_rotary_factor\":0.5,\"tie_word_embeddings\":false}", &l);
    Model m;
    Err err;
    int rc = load(&m, 1, 0, &err);
    CHECK(rc == 0, "flat untied: %s", err.msg);
    if (!rc) {
        int64_t params;
        const StSpec *h = spec(&l, "lm_head.weight");
        CHECK(check_bound(&m, &l, "model.", 0, &params) == 0, "flat tensors bound");
        CHECK(m.w.lm_head.data != m.w.embed_tokens.data && memcmp(m.w.lm_head.data, h->data, st_nbytes(h)) == 0,
              "untied head is lm_head.weight");
        CHECK(m.n_params == params + V * D && m.n_params == model_param_count(&m.config), "untied count");
        CHECK(m.w.layers[0].gate_proj.dtype == DT_F16 && m.w.layers[0].down_proj.dtype == DT_F32, "mixed dtypes");
        CHECK(m.gen.n_eos == 0 && !m.gen.do_sample, "no generation_config: greedy, no stop ids");
    }
    model_free(&m);

    /* Same tensors, config says tied: the stored head is ignored in favour of the embedding. */
    write_model(cfg_hybrid(cfg, sizeof cfg, "\"tie_word_embeddings\":true,", HK, HV), &l);
    rc = load(&m, 1, 0, &err);
    CHECK(rc == 0 && m.w.lm_head.data == m.w.embed_tokens.data && m.n_params == model_param_count(&m.config),
          "tied with a stored head: %s", err.msg);
    model_free(&m);
    tl_free(&l);
}

static void test_model_sharded(Rng *r) {
    TList l = {0}, a = {0}, b = {0}, v = {0};
    char cfg[2048], p[256], idx[16384];
    build(&l, r, "model.language_model.", 0, 0);
    add_vision_mtp(&v, r);
    /* Split alternately into two shards; the vision tensors go into a third. */
    for (int i = 0; i < l.n; i++) (i % 2 ? &b : &a)->t[(i % 2 ? &b : &a)->n++] = l.t[i];
    write_model(cfg_hybrid(cfg, sizeof cfg, "", HK, HV), NULL);
    st_write(pj(p, sizeof p, mdir, "model-00001-of-00003.safetensors"), a.t, a.n, NULL);
    st_write(pj(p, sizeof p, mdir, "model-00002-of-00003.safetensors"), b.t, b.n, NULL);
    st_write(pj(p, sizeof p, mdir, "model-00003-of-00003.safetensors"), v.t, v.n, NULL);
    size_t k = (size_t)snprintf(idx, sizeof idx, "{\"metadata\":{\"total_size\":1},\"weight_map\":{");
    for (int i = 0; i < l.n; i++)
        k += (size_t)snprintf(idx + k, sizeof idx - k, "%s\"%s\":\"model-0000%d-of-00003.safetensors\"", i ? "," : "",
                              l.t[i].name, 1 + i % 2);
    for (int i = 0; i < v.n; i++)
        k += (size_t)snprintf(idx + k, sizeof idx - k, ",\"%s\":\"model-00003-of-00003.safetensors\"", v.t[i].name);
    snprintf(idx + k, sizeof idx - k, "}}");
    pj(p, sizeof p, mdir, "model.safetensors.index.json");
    write_text(p, idx);
    Model m;
    Err err;
    int rc = load(&m, 1, 0, &err);
    CHECK(rc == 0, "sharded: %s", err.msg);
    if (!rc) {
        int64_t params;
        CHECK(m.n_files == 3, "each shard opened once: %d", m.n_files);
        CHECK(check_bound(&m, &l, "model.language_model.", 0, &params) == 0, "sharded tensors bound");
        CHECK(m.w.lm_head.data == m.w.embed_tokens.data, "head absent -> embedding (config has no tie key)");
    }
    model_free(&m);

    /* A shard missing on disk. */
    char shard[256];
    pj(shard, sizeof shard, mdir, "model-00002-of-00003.safetensors");
    rename(shard, pj(p, sizeof p, mdir, "moved"));
    rc = load(&m, 0, 0, &err);
    CHECK(rc == Q35_ERR_IO && strstr(err.msg, "model-00002-of-00003.safetensors"), "missing shard: %s", err.msg);
    CHECK(m.files == NULL && m.w.layers == NULL, "cleaned up after a failed load");
    rename(p, shard);

    /* The index maps a tensor to a shard that does not hold it. */
    char *bad = strdup(idx), *q = strstr(bad, "model-00001-of-00003");
    q[10] = '2'; /* model-00001 -> model-00002 for the first tensor */
    write_text(pj(p, sizeof p, mdir, "model.safetensors.index.json"), bad);
    rc = load(&m, 0, 0, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, "index.json") && strstr(err.msg, l.t[0].name),
          "index mismatch: %s", err.msg);
    free(bad);
    write_text(p, "{\"weight_map\":{\"x\":\"../model.safetensors\"}}");
    rc = load(&m, 0, 0, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, "weight_map['x']"), "path in shard name: %s", err.msg);
    write_text(p, "{\"metadata\":{}}");
    rc = load(&m, 0, 0, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, "weight_map") && strstr(err.msg, "index.json"), "no weight_map: %s",
          err.msg);
    write_text(p, "{\"weight_map\":{");
    rc = load(&m, 0, 0, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, "index.json"), "malformed index: %s", err.msg);
    remove(p);
    rc = load(&m, 0, 0, &err);
    CHECK(rc == Q35_ERR_IO && strstr(err.msg, mdir), "no checkpoint: %s", err.msg);
    tl_free(&l);
    tl_free(&v);
}

static void test_model_qwen3(Rng *r) {
    TList l = {0};
    build(&l, r, "model.", 1, 0);
    write_model(CFG_QWEN3, &l);
    Model m;
    Err err;
    int rc = load(&m, 1, 0, &err);
    CHECK(rc == 0, "qwen3: %s", err.msg);
    if (!rc) {
        int64_t params;
        CHECK(check_bound(&m, &l, "model.", 0, &params) == 0, "qwen3 tensors bound");
        CHECK(m.config.family == FAMILY_QWEN3 && m.w.layers[0].q_proj.shape[0] == 16, "q_proj rows Hq*hd");
        CHECK(m.w.layers[0].in_proj_qkv.data == NULL && m.w.layers[1].A_log.data == NULL, "no linear tensors");
        CHECK(m.n_params == params && m.n_params == model_param_count(&m.config), "qwen3 count");
    }
    model_free(&m);
    tl_free(&l);
}

/* Unknown names warn (or fail when strict); a 1-byte tensor in front misaligns the F32 params,
 * which the loader then copies to aligned memory. */
static void test_model_unknown_and_alignment(Rng *r) {
    TList l = {0};
    char cfg[2048];
    add(&l, r, "extra.byte", "U8", 1, 1, 0, 0);
    build(&l, r, "model.language_model.", 0, 0);
    add(&l, r, "model.language_model.layers.0.foo.weight", "BF16", 1, 3, 0, 0);
    add(&l, r, "model.language_model.layers.9.mlp.up_proj.weight", "BF16", 2, F, D, 0);
    add(&l, r, "model.lm_head.weight", "BF16", 2, V, D, 0);
    write_model(cfg_hybrid(cfg, sizeof cfg, "", HK, HV), &l);
    Model m;
    Err err;
    fprintf(stderr, "(expect warnings about unknown tensors below)\n");
    int rc = load(&m, 0, 1, &err);
    CHECK(rc == 0, "unknown names are warnings: %s", err.msg);
    if (!rc) {
        int64_t params;
        CHECK(check_bound(&m, &l, "model.language_model.", 1, &params) == 0, "bound despite misalignment");
        CHECK((uintptr_t)m.w.layers[0].A_log.data % 4 == 0 && (uintptr_t)m.w.layers[0].down_proj.data % 4 == 0,
              "F32 data aligned");
    }
    model_free(&m);
    rc = load(&m, 1, 1, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, "strict") && strstr(err.msg, "model.safetensors"),
          "strict: %s", err.msg);
    tl_free(&l);
}

/* Writes config + tensors to a fresh dir and loads; expects code and both needles in the message. */
static void expect_load_fail(const char *what, const TList *l, const char *config, int code, const char *n1,
                             const char *n2) {
    write_model(config, l);
    Model m;
    Err err = {0, ""};
    int rc = load(&m, 0, 0, &err);
    if (verbose) printf("  %-28s -> %s\n", what, err.msg);
    CHECK(rc == code && err.code == code, "%s: rc %d (want %d): %s", what, rc, code, err.msg);
    if (n1) CHECK(strstr(err.msg, n1) != NULL, "%s: message lacks '%s': %s", what, n1, err.msg);
    if (n2) CHECK(strstr(err.msg, n2) != NULL, "%s: message lacks '%s': %s", what, n2, err.msg);
    CHECK(m.files == NULL && m.w.layers == NULL && m.owned == NULL && m.n_files == 0, "%s: not cleaned up", what);
}

static void test_model_bad(Rng *r) {
    char cfg[2048], c2[2048], p[256];
    cfg_hybrid(cfg, sizeof cfg, "", HK, HV);
    TList l = {0};
    build(&l, r, "model.language_model.", 0, 0);

    TList t = l;
    drop(&t, "model.language_model.layers.3.self_attn.k_norm.weight");
    expect_load_fail("missing tensor", &t, cfg, Q35_ERR_FORMAT, "layers.3.self_attn.k_norm.weight", "[4]");
    t = l;
    drop(&t, "model.language_model.embed_tokens.weight");
    expect_load_fail("missing embedding", &t, cfg, Q35_ERR_FORMAT, "embed_tokens.weight", "[20, 8]");
    t = l;
    for (int i = 0; i < t.n; i++)
        if (strstr(t.t[i].name, "layers.2.linear_attn.in_proj_z")) t.t[i].shape[1] = 9, t.t[i].data = NULL;
    expect_load_fail("wrong shape", &t, cfg, Q35_ERR_FORMAT, "layers.2.linear_attn.in_proj_z.weight", "[8, 9]");
    t = l;
    for (int i = 0; i < t.n; i++)
        if (strstr(t.t[i].name, "layers.0.linear_attn.conv1d")) t.t[i].ndim = 2, t.t[i].shape[1] = 4;
    expect_load_fail("conv1d rank", &t, cfg, Q35_ERR_FORMAT, "conv1d", "[16, 1, 4]");
    t = l;
    for (int i = 0; i < t.n; i++)
        if (strstr(t.t[i].name, "layers.1.input_layernorm")) t.t[i].dtype = "I32", t.t[i].data = NULL;
    expect_load_fail("integer dtype", &t, cfg, Q35_ERR_FORMAT, "layers.1.input_layernorm.weight", "I32");
    t = l;
    add(&t, r, "model.norm.weight", "BF16", 1, D, 0, 0); /* a second name for the final norm */
    expect_load_fail("bound twice", &t, cfg, Q35_ERR_FORMAT, "model.norm.weight", "already bound");
    free(t.buf[t.n - 1]); /* the one buffer t owns beyond l's */

    expect_load_fail("unsupported model_type", &l, "{\"model_type\":\"mistral\",\"hidden_size\":8}", Q35_ERR_CONFIG,
                     "mistral", "config.json");
    expect_load_fail("Hv not multiple of Hk", &l, cfg_hybrid(c2, sizeof c2, "", 2, 3), Q35_ERR_CONFIG,
                     "linear_num_value_heads", "config.json");
    expect_load_fail("malformed config.json", &l, "{\"model_type\":\"qwen3_5\" \"x\":1}", Q35_ERR_FORMAT,
                     "config.json", "malformed JSON");
    expect_load_fail("config/tensor mismatch", &l, CFG_QWEN3, Q35_ERR_FORMAT, "model.language_model.", NULL);

    /* Malformed safetensors header, and a truncated file. */
    write_model(cfg, NULL);
    const char *hdr = "{\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]},}";
    st_write_raw(pj(p, sizeof p, mdir, "model.safetensors"), strlen(hdr), hdr, strlen(hdr), "0123456789abcdef", 16);
    Model m;
    Err err;
    CHECK(load(&m, 0, 0, &err) == Q35_ERR_FORMAT && strstr(err.msg, "model.safetensors") &&
              strstr(err.msg, "malformed JSON"), "malformed header: %s", err.msg);
    st_write(p, l.t, l.n, NULL);
    if (truncate(p, 500) != 0) perror("truncate");
    CHECK(load(&m, 0, 0, &err) == Q35_ERR_FORMAT && strstr(err.msg, "model.safetensors"), "truncated: %s", err.msg);
    CHECK(model_load(&m, "/nonexistent/q35model", NULL, &err) == Q35_ERR_IO && strstr(err.msg, "/nonexistent/q35model"),
          "missing dir: %s", err.msg);
    tl_free(&l);
}

/* HF-written fixtures (tools/make_fixtures.py), when present: strict load, exact count. */
static void test_model_fixtures(void) {
    static const char *dirs[] = {"tests/fixtures/qwen35_vl", "tests/fixtures/qwen35_text", "tests/fixtures/qwen35_gqa",
                                 "tests/fixtures/qwen3_dense"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char p[256];
        if (!file_exists(pj(p, sizeof p, dirs[i], "config.json"))) {
            printf("skip %s (not present)\n", dirs[i]);
            continue;
        }
        Model m;
        Err err;
        ModelLoadOptions o = {0, 1};
        int rc = model_load(&m, dirs[i], &o, &err);
        CHECK(rc == 0, "%s: %s", dirs[i], err.msg);
        if (!rc) {
            CHECK(m.n_params == model_param_count(&m.config), "%s: count", dirs[i]);
            CHECK((m.w.lm_head.data == m.w.embed_tokens.data) == m.config.tie_word_embeddings, "%s: head", dirs[i]);
            for (int l = 0; l < m.config.num_hidden_layers; l++)
                if (m.w.layers[l].type == LAYER_LINEAR_ATTN && m.w.layers[l].A_log.dtype == DT_F32) {
                    const float *a = m.w.layers[l].A_log.data;
                    CHECK(a[0] == round_bf16(a[0]), "%s: F32 A_log rounded", dirs[i]);
                }
        }
        model_free(&m);
    }
}

/* ---- dummy weights ---- */

static double stdev(const Tensor *t, double *mean) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        double v = t->dtype == DT_F32 ? ((const float *)t->data)[i] : bf16_to_f32(((const uint16_t *)t->data)[i]);
        s += v, s2 += v * v;
    }
    *mean = s / (double)t->numel;
    return sqrt(s2 / (double)t->numel - *mean * *mean);
}

static void test_model_dummy_tiny(uint64_t seed) {
    Config c;
    Err err;
    config_builtin(&c, "qwen3.5-0.8b", &err);
    c.hidden_size = 64, c.num_hidden_layers = 4, c.intermediate_size = 96, c.vocab_size = 300;
    c.tie_word_embeddings = 0;
    Model a, b, d;
    omp_set_num_threads(1);
    int rc = model_dummy_config(&a, &c, seed, &err);
    omp_set_num_threads(omp_get_num_procs() > 1 ? omp_get_num_procs() : 2);
    rc |= model_dummy_config(&b, &c, seed, &err);
    rc |= model_dummy_config(&d, &c, seed + 1, &err);
    CHECK(rc == 0, "tiny dummy: %s", err.msg);
    if (rc) return;
    const LayerWeights *la = &a.w.layers[0], *lb = &b.w.layers[0], *ld = &d.w.layers[0];
    CHECK(memcmp(la->in_proj_qkv.data, lb->in_proj_qkv.data, la->in_proj_qkv.nbytes) == 0 &&
              memcmp(a.w.lm_head.data, b.w.lm_head.data, a.w.lm_head.nbytes) == 0,
          "same seed, 1 vs N threads: identical");
    CHECK(memcmp(la->in_proj_qkv.data, ld->in_proj_qkv.data, la->in_proj_qkv.nbytes) != 0, "seed changes values");
    CHECK(memcmp(la->in_proj_qkv.data, la->in_proj_z.data, la->in_proj_z.nbytes) != 0, "tensors differ");
    CHECK(a.w.lm_head.data != a.w.embed_tokens.data && a.n_params == model_param_count(&a.config),
          "untied dummy has its own head");
    CHECK(strcmp(a.w.layers[3].q_proj.name, "layers.3.self_attn.q_proj.weight") == 0, "dummy names");
    CHECK(a.gen.n_eos == 0, "config dummy: no stop ids");
    model_free(&a);
    model_free(&b);
    model_free(&d);
    c.num_key_value_heads = 3;
    CHECK(model_dummy_config(&a, &c, seed, &err) == Q35_ERR_CONFIG, "dummy config is checked");
    CHECK(model_dummy(&a, "gpt2", seed, &err) == Q35_ERR_ARG && strstr(err.msg, "gpt2"), "unknown dummy name");
}

static void test_model_dummy_real(uint64_t seed) {
    Model m;
    Err err;
    double t0 = now_s();
    int rc = model_dummy(&m, "qwen3.5-0.8b", seed, &err);
    double dt = now_s() - t0;
    CHECK(rc == 0, "dummy 0.8b: %s", err.msg);
    if (rc) return;
    printf("model_dummy(qwen3.5-0.8b): %.2f s, %lld params, %lld bytes\n", dt, (long long)m.n_params,
           (long long)m.n_bytes);
    CHECK(m.n_params == 752393024LL, "0.8B params %lld", (long long)m.n_params);
    CHECK(m.n_bytes == 752393024LL * 2 + 18LL * (16 + 128) * 2, "0.8B bytes %lld", (long long)m.n_bytes);
    CHECK(m.w.lm_head.data == m.w.embed_tokens.data, "tied");
    CHECK(m.gen.n_eos == 2 && m.gen.eos_ids[0] == 248046 && m.gen.eos_ids[1] == 248044, "stop ids");
    double mean, sd;
    const LayerWeights *L0 = &m.w.layers[0], *L3 = &m.w.layers[3];
    sd = stdev(&L0->in_proj_qkv, &mean);
    CHECK(fabs(sd * 32.0 - 1.0) < 0.02 && fabs(mean) < 1e-3, "qkv std %g (want 1/32)", sd);
    sd = stdev(&L0->out_proj, &mean);
    CHECK(fabs(sd * sqrt(2048.0) - 1.0) < 0.02, "out_proj std %g (want 1/sqrt(2048))", sd);
    sd = stdev(&L3->down_proj, &mean);
    CHECK(fabs(sd * sqrt(3584.0) - 1.0) < 0.02, "down std %g", sd);
    sd = stdev(&m.w.layers[5].conv1d, &mean);
    CHECK(fabs(sd - 0.5) < 0.02, "conv std %g (want 1/sqrt(4))", sd);
    sd = stdev(&L3->q_norm, &mean);
    CHECK(sd > 0.07 && sd < 0.13 && fabs(mean) < 0.03, "zero-centred q_norm mean %g std %g", mean, sd);
    sd = stdev(&m.w.norm, &mean);
    CHECK(sd > 0.08 && sd < 0.12 && fabs(mean) < 0.02, "zero-centred final norm mean %g std %g", mean, sd);
    sd = stdev(&L0->linear_norm, &mean);
    /* 128 values of 1 + 0.1 n: the mean's standard deviation is 0.0088, so 0.05 is 5.7 of them (0.03 failed at 3.7) */
    CHECK(L0->linear_norm.dtype == DT_F32 && fabs(mean - 1.0) < 0.05 && sd < 0.13, "gated norm 1+small: %g", mean);
    const float *al = L0->A_log.data;
    int ok = L0->A_log.dtype == DT_F32;
    for (int i = 0; i < 16; i++) ok &= al[i] >= 0.0f && al[i] <= logf(16.0f) + 0.01f && al[i] == round_bf16(al[i]);
    CHECK(ok, "A_log in [0, log 16], bf16-representable");
    sd = stdev(&m.w.layers[6].dt_bias, &mean);
    /* 16 values of 0.5 n: the sample std stays in [0.15, 0.9] but about once in 10^5 seeds */
    CHECK(sd > 0.15 && sd < 0.9, "dt_bias std %g", sd);
    /* Embedding: a sample of rows, std ~0.15, all finite. */
    Tensor e = m.w.embed_tokens;
    e.numel = 1024 * 4096;
    sd = stdev(&e, &mean);
    CHECK(fabs(sd - 0.15) < 0.005 && isfinite(mean), "embedding std %g", sd);
    model_free(&m);

    t0 = now_s();
    rc = model_dummy(&m, "qwen3-0.6b", seed, &err);
    dt = now_s() - t0;
    CHECK(rc == 0 && m.n_params == 596049920LL && m.n_bytes == 2 * 596049920LL, "0.6B params %lld: %s",
          (long long)m.n_params, err.msg);
    printf("model_dummy(qwen3-0.6b): %.2f s\n", dt);
    if (!rc) {
        sd = stdev(&m.w.layers[27].k_norm, &mean);
        CHECK(fabs(mean - 1.0) < 0.05 && sd > 0.05 && sd < 0.15, "qwen3 plain norm ~1: %g", mean);
        CHECK(m.gen.eos_ids[0] == 151645 && m.gen.eos_ids[1] == 151643, "qwen3 stop ids");
        CHECK(m.w.layers[0].in_proj_qkv.data == NULL, "qwen3 dummy has no linear tensors");
    }
    model_free(&m);
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) verbose = 1;
        else seed = strtoull(argv[i], NULL, 0);
    }
    printf("test_model: seed %llu\n", (unsigned long long)seed);
    Rng rng;
    rng_seed(&rng, seed);
    snprintf(dir, sizeof dir, "/tmp/q35_model_XXXXXX");
    if (!make_tmpdir(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_model_vl_tied(&rng);
    test_model_flat_untied(&rng);
    test_model_sharded(&rng);
    test_model_qwen3(&rng);
    test_model_unknown_and_alignment(&rng);
    test_model_bad(&rng);
    test_model_fixtures();
    test_model_dummy_tiny(seed);
    test_model_dummy_real(seed);
    rm_rf(dir);
    return TEST_SUMMARY("model");
}
