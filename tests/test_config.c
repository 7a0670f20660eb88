/* test_config.c — config.json in its three layouts (VL wrapper with text_config, flat
 * qwen3_5_text, dense qwen3), RoPE key precedence, layer_types vs full_attention_interval,
 * derived sizes, the built-in configs and their parameter counts (MODEL.md §6.1), every
 * rejection (code + file + key in the message), and generation_config.json. */
#include <stdarg.h>

#include "config.h"
#include "model.h"
#include "st_write.h"
#include "test.h"

static char dir[64];
static int verbose;

/* The official Qwen3.5-0.8B layout (VL wrapper), trimmed of vision details. */
static const char *VL_08B =
    "{\"architectures\":[\"Qwen3_5ForConditionalGeneration\"],\"model_type\":\"qwen3_5\","
    "\"image_token_id\":248056,\"video_token_id\":248057,\"vision_start_token_id\":248053,"
    "\"vision_end_token_id\":248054,\"tie_word_embeddings\":true,"
    "\"vision_config\":{\"depth\":12,\"hidden_size\":768,\"model_type\":\"qwen3_5\"},"
    "\"text_config\":{\"model_type\":\"qwen3_5_text\",\"hidden_size\":1024,\"num_hidden_layers\":24,"
    "\"intermediate_size\":3584,\"hidden_act\":\"silu\",\"rms_norm_eps\":1e-06,\"vocab_size\":248320,"
    "\"num_attention_heads\":8,\"num_key_value_heads\":2,\"head_dim\":256,\"attention_bias\":false,"
    "\"attn_output_gate\":true,\"linear_num_key_heads\":16,\"linear_num_value_heads\":16,"
    "\"linear_key_head_dim\":128,\"linear_value_head_dim\":128,\"linear_conv_kernel_dim\":4,"
    "\"full_attention_interval\":4,\"max_position_embeddings\":262144,\"mtp_num_hidden_layers\":1,"
    "\"mtp_use_dedicated_embeddings\":false,\"mlp_only_layers\":[],\"mamba_ssm_dtype\":\"float32\","
    "\"dtype\":\"bfloat16\",\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\","
    "\"full_attention\",\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\","
    "\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\",\"linear_attention\","
    "\"linear_attention\",\"linear_attention\",\"full_attention\",\"linear_attention\",\"linear_attention\","
    "\"linear_attention\",\"full_attention\",\"linear_attention\",\"linear_attention\",\"linear_attention\","
    "\"full_attention\"],\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000000,"
    "\"partial_rotary_factor\":0.25,\"mrope_section\":[11,11,10],\"mrope_interleaved\":true}}}";

/* Dense Qwen3-0.6B as published (no head_dim removed: see the default test below). */
static const char *QWEN3_06B =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
    "\"hidden_size\":1024,\"initializer_range\":0.02,\"intermediate_size\":3072,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":28,\"model_type\":\"qwen3\","
    "\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-06,"
    "\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,\"tie_word_embeddings\":true,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.51.0\",\"use_cache\":true,"
    "\"use_sliding_window\":false,\"vocab_size\":151936}";

/* Small flat hybrid config; %s slots let a test splice keys in. */
static const char *FLAT_FMT =
    "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":64,\"num_hidden_layers\":%d,\"intermediate_size\":96,"
    "\"vocab_size\":300,\"num_attention_heads\":4,\"num_key_value_heads\":%d,\"head_dim\":16,"
    "\"linear_num_key_heads\":%d,\"linear_num_value_heads\":%d,\"linear_key_head_dim\":8,"
    "\"linear_value_head_dim\":12,\"linear_conv_kernel_dim\":4%s}";

static char *fmt(char *buf, size_t n, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, n, f, ap);
    va_end(ap);
    return buf;
}

static void expect_err(const char *what, const char *json, int code, const char *n1, const char *n2) {
    Config c;
    Err err = {0, ""};
    int rc = config_parse(&c, json, "cfg/config.json", &err);
    if (verbose) printf("  %-36s -> %s\n", what, err.msg);
    CHECK(rc == code && err.code == code, "%s: rc %d (want %d): %s", what, rc, code, err.msg);
    CHECK(strstr(err.msg, "cfg/config.json") != NULL, "%s: message lacks the file: %s", what, err.msg);
    if (n1) CHECK(strstr(err.msg, n1) != NULL, "%s: message lacks '%s': %s", what, n1, err.msg);
    if (n2) CHECK(strstr(err.msg, n2) != NULL, "%s: message lacks '%s': %s", what, n2, err.msg);
}

static void test_config_vl_08b(void) {
    Config c;
    Err err;
    int rc = config_parse(&c, VL_08B, "config.json", &err);
    CHECK(rc == 0, "VL 0.8B: %s", err.msg);
    if (rc) return;
    CHECK(c.family == FAMILY_QWEN35 && strcmp(c.model_type, "qwen3_5") == 0, "family");
    CHECK(c.hidden_size == 1024 && c.num_hidden_layers == 24 && c.intermediate_size == 3584, "sizes");
    CHECK(c.vocab_size == 248320 && c.tie_word_embeddings == 1, "vocab/tie (tie from the top level)");
    CHECK(c.num_attention_heads == 8 && c.num_key_value_heads == 2 && c.head_dim == 256, "heads");
    CHECK(c.attn_output_gate == 1 && c.rope_theta == 1e7f && c.partial_rotary_factor == 0.25f, "rope");
    CHECK(c.rms_norm_eps == 1e-6f, "eps");
    CHECK(c.linear_num_key_heads == 16 && c.linear_num_value_heads == 16 && c.linear_key_head_dim == 128 &&
              c.linear_value_head_dim == 128 && c.linear_conv_kernel_dim == 4, "linear");
    CHECK(c.max_position_embeddings == 262144, "max pos");
    CHECK(c.rotary_dim == 64 && c.q_proj_rows == 4096 && c.kv_dim == 512 && c.attn_dim == 2048, "derived attn");
    CHECK(c.key_dim == 2048 && c.value_dim == 2048 && c.conv_dim == 6144, "derived delta");
    CHECK(c.n_linear_layers == 18 && c.n_full_layers == 6, "layer counts");
    int ok = 1;
    for (int i = 0; i < 24; i++) ok &= c.layer_types[i] == ((i % 4 == 3) ? LAYER_FULL_ATTN : LAYER_LINEAR_ATTN);
    CHECK(ok, "full attention exactly at 3, 7, ..., 23");

    Config b;
    CHECK(config_builtin(&b, "qwen3.5-0.8b", &err) == 0, "builtin: %s", err.msg);
    CHECK(memcmp(&b, &c, sizeof c) == 0, "builtin qwen3.5-0.8b equals the parsed official config");
    CHECK(model_param_count(&c) == 752393024LL, "0.8B params %lld", (long long)model_param_count(&c));
}

static void test_config_qwen3(void) {
    Config c, b;
    Err err;
    int rc = config_parse(&c, QWEN3_06B, "config.json", &err);
    CHECK(rc == 0, "qwen3: %s", err.msg);
    if (rc) return;
    CHECK(c.family == FAMILY_QWEN3 && c.attn_output_gate == 0 && c.num_hidden_layers == 28, "family");
    CHECK(c.rotary_dim == 128 && c.partial_rotary_factor == 1.0f && c.rope_theta == 1e6f, "full-width rope");
    CHECK(c.q_proj_rows == 2048 && c.kv_dim == 1024 && c.attn_dim == 2048, "derived");
    CHECK(c.n_full_layers == 28 && c.n_linear_layers == 0 && c.conv_dim == 0, "all full attention");
    CHECK(c.tie_word_embeddings == 1 && c.vocab_size == 151936 && c.intermediate_size == 3072, "misc");
    CHECK(config_builtin(&b, "qwen3-0.6b", &err) == 0, "builtin: %s", err.msg);
    CHECK(memcmp(&b, &c, sizeof c) == 0, "builtin qwen3-0.6b equals the parsed official config");
    CHECK(model_param_count(&c) == 596049920LL, "0.6B params %lld", (long long)model_param_count(&c));
    CHECK(config_builtin(&b, "llama-7b", &err) == Q35_ERR_ARG && strstr(err.msg, "llama-7b"), "unknown builtin");

    /* head_dim absent -> hidden / heads; newer exports list layer_types for qwen3 too. */
    char j[2048];
    rc = config_parse(&c,
                      "{\"model_type\":\"qwen3\",\"hidden_size\":256,\"num_hidden_layers\":2,\"intermediate_size\":"
                      "512,\"vocab_size\":1000,\"num_attention_heads\":8,\"num_key_value_heads\":2,\"rope_theta\":"
                      "10000,\"layer_types\":[\"full_attention\",\"full_attention\"]}",
                      "config.json", &err);
    CHECK(rc == 0 && c.head_dim == 32 && c.rotary_dim == 32 && c.n_full_layers == 2 && !c.tie_word_embeddings,
          "qwen3 defaults: %s", err.msg);
    expect_err("qwen3 sliding layer", fmt(j, sizeof j,
               "{\"model_type\":\"qwen3\",\"hidden_size\":256,\"num_hidden_layers\":2,\"intermediate_size\":512,"
               "\"vocab_size\":1000,\"num_attention_heads\":8,\"rope_theta\":1e4,"
               "\"layer_types\":[\"full_attention\",\"sliding_attention\"]}"),
               Q35_ERR_CONFIG, "layer_types[1]", "sliding_attention");
    expect_err("qwen3 linear layer", fmt(j, sizeof j,
               "{\"model_type\":\"qwen3\",\"hidden_size\":256,\"num_hidden_layers\":1,\"intermediate_size\":512,"
               "\"vocab_size\":1000,\"num_attention_heads\":8,\"rope_theta\":1e4,"
               "\"layer_types\":[\"linear_attention\"]}"),
               Q35_ERR_CONFIG, "layer_types[0]", NULL);
    expect_err("qwen3 sliding window", fmt(j, sizeof j,
               "{\"model_type\":\"qwen3\",\"hidden_size\":256,\"num_hidden_layers\":1,\"intermediate_size\":512,"
               "\"vocab_size\":1000,\"num_attention_heads\":8,\"rope_theta\":1e4,\"use_sliding_window\":true}"),
               Q35_ERR_CONFIG, "use_sliding_window", NULL);
}

static void test_config_flat_and_fallback(void) {
    Config c;
    Err err;
    char j[4096];
    /* Flat qwen3_5_text, no layer_types: interval 3 -> full at 2, 5; old top-level rope keys. */
    int rc = config_parse(&c, fmt(j, sizeof j, FLAT_FMT, 6, 2, 2, 4,
                                  ",\"full_attention_interval\":3,\"rope_theta\":5e5,\"partial_rotary_factor\":0.5"),
                          "config.json", &err);
    CHECK(rc == 0, "flat: %s", err.msg);
    if (!rc) {
        CHECK(c.n_full_layers == 2 && c.layer_types[2] == LAYER_FULL_ATTN && c.layer_types[5] == LAYER_FULL_ATTN &&
                  c.layer_types[0] == LAYER_LINEAR_ATTN, "interval layers");
        CHECK(c.rope_theta == 5e5f && c.rotary_dim == 8, "top-level rope");
        CHECK(c.key_dim == 16 && c.value_dim == 48 && c.conv_dim == 80, "dv != dk, Hv = 2 Hk");
        CHECK(c.tie_word_embeddings == 0 && c.attn_output_gate == 1 && c.num_key_value_heads == 2, "defaults");
        CHECK(c.max_position_embeddings > 0, "max pos default");
    }
    /* Default interval 4; rope_parameters win over top-level keys; factor defaults to 1. */
    rc = config_parse(&c, fmt(j, sizeof j, FLAT_FMT, 8, 2, 2, 2,
                              ",\"rope_theta\":1,\"partial_rotary_factor\":0.5,"
                              "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":2e6}"),
                      "config.json", &err);
    CHECK(rc == 0 && c.rope_theta == 2e6f && c.partial_rotary_factor == 0.5f && c.n_full_layers == 2 &&
              c.layer_types[3] == LAYER_FULL_ATTN && c.layer_types[7] == LAYER_FULL_ATTN,
          "rope_parameters precedence: %s", err.msg);
    rc = config_parse(&c, fmt(j, sizeof j, FLAT_FMT, 4, 2, 2, 2,
                              ",\"rope_parameters\":{\"rope_theta\":3e6,\"partial_rotary_factor\":0.25}"),
                      "config.json", &err);
    CHECK(rc == 0 && c.rotary_dim == 4 && c.rope_theta == 3e6f, "rope_parameters factor: %s", err.msg);
    rc = config_parse(&c, fmt(j, sizeof j, FLAT_FMT, 4, 2, 2, 2, ",\"rope_theta\":1e4"), "config.json", &err);
    CHECK(rc == 0 && c.partial_rotary_factor == 1.0f && c.rotary_dim == 16, "factor default 1: %s", err.msg);
    rc = config_parse(&c, fmt(j, sizeof j, FLAT_FMT, 4, 2, 2, 2,
                              ",\"rope_theta\":1e4,\"rope_scaling\":{\"rope_type\":\"default\","
                              "\"mrope_section\":[2,2,4]}"), "config.json", &err);
    CHECK(rc == 0, "rope_scaling default accepted: %s", err.msg);

    /* VL wrapper: keys missing in text_config fall back to the top level; tie in text_config only. */
    rc = config_parse(&c,
                      "{\"model_type\":\"qwen3_5\",\"vocab_size\":500,\"rope_theta\":7e6,\"head_dim\":16,"
                      "\"text_config\":{\"hidden_size\":64,\"num_hidden_layers\":4,\"intermediate_size\":96,"
                      "\"num_attention_heads\":4,\"num_key_value_heads\":1,\"tie_word_embeddings\":true,"
                      "\"linear_num_key_heads\":2,\"linear_num_value_heads\":6,\"linear_key_head_dim\":8,"
                      "\"linear_value_head_dim\":8,\"linear_conv_kernel_dim\":3,\"head_dim\":32}}",
                      "config.json", &err);
    CHECK(rc == 0 && c.vocab_size == 500 && c.rope_theta == 7e6f && c.tie_word_embeddings == 1 &&
              c.head_dim == 32 && c.linear_num_value_heads == 6,
          "fallback to the top level, text_config first: %s", err.msg);
    /* tie only at the top level; text_config says nothing. */
    rc = config_parse(&c,
                      "{\"model_type\":\"qwen3_5\",\"tie_word_embeddings\":true,\"head_dim\":16,"
                      "\"text_config\":{\"hidden_size\":64,"
                      "\"num_hidden_layers\":4,\"intermediate_size\":96,\"vocab_size\":50,\"num_attention_heads\":4,"
                      "\"rope_parameters\":{\"rope_theta\":1e6},\"linear_num_key_heads\":2,"
                      "\"linear_num_value_heads\":2,\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
                      "\"linear_conv_kernel_dim\":4}}",
                      "config.json", &err);
    CHECK(rc == 0 && c.tie_word_embeddings == 1 && c.rope_theta == 1e6f && c.num_key_value_heads == 4,
          "tie at top level: %s", err.msg);
    /* text_config false overrides a top-level true. */
    rc = config_parse(&c,
                      "{\"model_type\":\"qwen3_5\",\"tie_word_embeddings\":true,\"head_dim\":16,"
                      "\"text_config\":{\"hidden_size\":64,"
                      "\"num_hidden_layers\":4,\"intermediate_size\":96,\"vocab_size\":50,\"num_attention_heads\":4,"
                      "\"rope_theta\":1e6,\"linear_num_key_heads\":2,\"tie_word_embeddings\":false,"
                      "\"linear_num_value_heads\":2,\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
                      "\"linear_conv_kernel_dim\":4}}",
                      "config.json", &err);
    CHECK(rc == 0 && c.tie_word_embeddings == 0, "text_config tie wins: %s", err.msg);
}

static void test_config_errors(void) {
    char j[4096];
    const char *ok_rope = ",\"rope_theta\":1e4";
    expect_err("unsupported model_type", "{\"model_type\":\"llama\",\"hidden_size\":4}", Q35_ERR_CONFIG, "llama",
               "model_type");
    expect_err("model_type missing", "{\"hidden_size\":4}", Q35_ERR_CONFIG, "model_type", "missing");
    expect_err("malformed JSON", "{\"model_type\":\"qwen3\",", Q35_ERR_FORMAT, "malformed JSON", NULL);
    expect_err("not an object", "[1]", Q35_ERR_CONFIG, "object", NULL);
    expect_err("text_config not object", "{\"model_type\":\"qwen3_5\",\"text_config\":3}", Q35_ERR_CONFIG,
               "text_config", NULL);
    expect_err("text_config model_type", "{\"model_type\":\"qwen3_5\",\"text_config\":{\"model_type\":\"t5\"}}",
               Q35_ERR_CONFIG, "text_config.model_type", "t5");
    expect_err("Hv not multiple of Hk", fmt(j, sizeof j, FLAT_FMT, 4, 2, 4, 6, ok_rope), Q35_ERR_CONFIG,
               "linear_num_value_heads", "linear_num_key_heads");
    expect_err("Hq not multiple of Hkv", fmt(j, sizeof j, FLAT_FMT, 4, 3, 2, 2, ok_rope), Q35_ERR_CONFIG,
               "num_attention_heads", "num_key_value_heads");
    expect_err("zero layers", fmt(j, sizeof j, FLAT_FMT, 0, 2, 2, 2, ok_rope), Q35_ERR_CONFIG, "num_hidden_layers",
               NULL);
    expect_err("too many layers", fmt(j, sizeof j, FLAT_FMT, Q35_MAX_LAYERS + 1, 2, 2, 2, ok_rope), Q35_ERR_CONFIG,
               "num_hidden_layers", NULL);
    expect_err("zero kv heads", fmt(j, sizeof j, FLAT_FMT, 4, 0, 2, 2, ok_rope), Q35_ERR_CONFIG,
               "num_key_value_heads", NULL);
    expect_err("negative key heads", fmt(j, sizeof j, FLAT_FMT, 4, 2, -2, 2, ok_rope), Q35_ERR_CONFIG,
               "linear_num_key_heads", NULL);
    expect_err("rope_type yarn", fmt(j, sizeof j, FLAT_FMT, 4, 2, 2, 2,
                                     ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":1e4}"),
               Q35_ERR_CONFIG, "rope_parameters.rope_type", "yarn");
    expect_err("rope_scaling linear", fmt(j, sizeof j, FLAT_FMT, 4, 2, 2, 2,
                                          ",\"rope_theta\":1e4,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}"),
               Q35_ERR_CONFIG, "rope_scaling.type", "linear");
    expect_err("rope_theta missing", fmt(j, sizeof j, FLAT_FMT, 4, 2, 2, 2, ""), Q35_ERR_CONFIG, "rope_theta",
               "missing");
    expect_err("odd rotary dim", fmt(j, sizeof j, FLAT_FMT, 4, 2, 2, 2, ",\"rope_theta\":1e4,"
                                     "\"partial_rotary_factor\":0.1875"), Q35_ERR_CONFIG, "partial_rotary_factor",
               NULL);
    expect_err("factor > 1", fmt(j, sizeof j, FLAT_FMT, 4, 2, 2, 2, ",\"rope_theta\":1e4,"
                                 "\"partial_rotary_factor\":2"), Q35_ERR_CONFIG, "partial_rotary_factor", NULL);
    expect_err("layer_types length", fmt(j, sizeof j, FLAT_FMT, 3, 2, 2, 2, ",\"rope_theta\":1e4,\"layer_types\":"
                                         "[\"full_attention\",\"linear_attention\"]"), Q35_ERR_CONFIG, "layer_types",
               "num_hidden_layers");
    expect_err("layer_types unknown", fmt(j, sizeof j, FLAT_FMT, 2, 2, 2, 2, ",\"rope_theta\":1e4,\"layer_types\":"
                                          "[\"full_attention\",\"mamba\"]"), Q35_ERR_CONFIG, "layer_types[1]", "mamba");
    expect_err("layer_types not strings", fmt(j, sizeof j, FLAT_FMT, 2, 2, 2, 2, ",\"rope_theta\":1e4,\"layer_types\":"
                                              "[1,0]"), Q35_ERR_CONFIG, "layer_types[0]", NULL);
    expect_err("interval 0",
               fmt(j, sizeof j, FLAT_FMT, 2, 2, 2, 2, ",\"rope_theta\":1e4,\"full_attention_interval\":0"),
               Q35_ERR_CONFIG, "full_attention_interval", NULL);
    expect_err("hidden_size string", "{\"model_type\":\"qwen3\",\"hidden_size\":\"1024\"}", Q35_ERR_CONFIG,
               "'hidden_size'", "integer");
    expect_err("hidden_size fraction", "{\"model_type\":\"qwen3\",\"hidden_size\":10.5}", Q35_ERR_CONFIG,
               "'hidden_size'", "integer");
    expect_err("hidden_size missing", "{\"model_type\":\"qwen3\"}", Q35_ERR_CONFIG, "'hidden_size'", "missing");
    expect_err("text_config key missing", "{\"model_type\":\"qwen3_5\",\"text_config\":{\"hidden_size\":8}}",
               Q35_ERR_CONFIG, "num_hidden_layers", "text_config");
    expect_err("hidden_act gelu", fmt(j, sizeof j, FLAT_FMT, 2, 2, 2, 2, ",\"rope_theta\":1e4,\"hidden_act\":\"gelu\""),
               Q35_ERR_CONFIG, "hidden_act", "gelu");
    expect_err("attention_bias", fmt(j, sizeof j, FLAT_FMT, 2, 2, 2, 2, ",\"rope_theta\":1e4,\"attention_bias\":true"),
               Q35_ERR_CONFIG, "attention_bias", NULL);
    expect_err("tie not bool", fmt(j, sizeof j, FLAT_FMT, 2, 2, 2, 2, ",\"rope_theta\":1e4,\"tie_word_embeddings\":1"),
               Q35_ERR_CONFIG, "tie_word_embeddings", NULL);
    expect_err("eps zero", fmt(j, sizeof j, FLAT_FMT, 2, 2, 2, 2, ",\"rope_theta\":1e4,\"rms_norm_eps\":0"),
               Q35_ERR_CONFIG, "rms_norm_eps", NULL);
    expect_err("theta negative", fmt(j, sizeof j, FLAT_FMT, 2, 2, 2, 2, ",\"rope_theta\":-1"), Q35_ERR_CONFIG,
               "rope_theta", NULL);
    expect_err("int overflow", "{\"model_type\":\"qwen3\",\"hidden_size\":1e12}", Q35_ERR_CONFIG, "hidden_size",
               "range");
    expect_err("huge product", "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":1,"
               "\"intermediate_size\":8,\"vocab_size\":8,\"num_attention_heads\":65536,\"head_dim\":65536,"
               "\"rope_theta\":1e4}", Q35_ERR_CONFIG, "q_proj rows", NULL);
    expect_err("missing linear key", "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":64,\"num_hidden_layers\":1,"
               "\"intermediate_size\":8,\"vocab_size\":8,\"num_attention_heads\":4,\"head_dim\":16,"
               "\"rope_theta\":1e4}", Q35_ERR_CONFIG, "linear_num_key_heads", "missing");
    expect_err("hybrid head_dim missing", "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":64,"
               "\"num_hidden_layers\":1,\"intermediate_size\":8,\"vocab_size\":8,\"num_attention_heads\":4}",
               Q35_ERR_CONFIG, "head_dim", "missing");

    /* config_finish on a hand-made config. */
    Config c;
    Err err;
    config_builtin(&c, "qwen3.5-0.8b", &err);
    c.layer_types[5] = 7;
    CHECK(config_finish(&c, "x.json", &err) == Q35_ERR_CONFIG && strstr(err.msg, "layer_types[5]"), "finish: %s",
          err.msg);
    config_builtin(&c, "qwen3-0.6b", &err);
    c.layer_types[0] = LAYER_LINEAR_ATTN;
    CHECK(config_finish(&c, "x.json", &err) == Q35_ERR_CONFIG && strstr(err.msg, "qwen3"), "finish qwen3 linear: %s",
          err.msg);

    /* config_load: missing dir / malformed file names the path. */
    char p[256];
    CHECK(config_load(&c, "/nonexistent/q35", &err) == Q35_ERR_IO && strstr(err.msg, "/nonexistent/q35/config.json"),
          "load missing: %s", err.msg);
    write_text(pj(p, sizeof p, dir, "config.json"), "{\"model_type\": qwen3}");
    CHECK(config_load(&c, dir, &err) == Q35_ERR_FORMAT && strstr(err.msg, p) && strstr(err.msg, "line 1"),
          "load malformed: %s", err.msg);
    write_text(p, QWEN3_06B);
    CHECK(config_load(&c, dir, &err) == 0 && c.num_hidden_layers == 28, "load ok: %s", err.msg);
}

static void test_genconfig(void) {
    GenConfig g;
    Err err;
    Config c;
    char p[256];
    config_builtin(&c, "qwen3.5-0.8b", &err);
    pj(p, sizeof p, dir, "generation_config.json");
    remove(p);
    CHECK(genconfig_load(&g, dir, &c, &err) == 0 && g.n_eos == 0 && g.do_sample == 0 && g.temperature == 1.0f &&
              g.top_p == 1.0f && g.repetition_penalty == 1.0f, "absent file: greedy, no stop ids");
    write_text(p, "{\"bos_token_id\":248044,\"do_sample\":true,\"eos_token_id\":[248046,248044],\"pad_token_id\":"
                  "248044,\"temperature\":0.6,\"top_k\":20,\"top_p\":0.95,\"transformers_version\":\"4.57.0\"}");
    int rc = genconfig_load(&g, dir, &c, &err);
    CHECK(rc == 0 && g.n_eos == 2 && g.eos_ids[0] == 248046 && g.eos_ids[1] == 248044 && g.do_sample == 1 &&
              g.temperature == 0.6f && g.top_k == 20 && g.top_p == 0.95f && g.min_p == 0.0f &&
              g.presence_penalty == 0.0f,
          "list eos: %s", err.msg);
    write_text(p, "{\"eos_token_id\":151645,\"min_p\":0.05,\"repetition_penalty\":1.1,\"presence_penalty\":1.5,"
                  "\"top_k\":null}");
    rc = genconfig_load(&g, dir, &c, &err);
    CHECK(rc == 0 && g.n_eos == 1 && g.eos_ids[0] == 151645 && !g.do_sample && g.min_p == 0.05f &&
              g.repetition_penalty == 1.1f && g.presence_penalty == 1.5f && g.top_k == 0,
          "int eos: %s", err.msg);
    write_text(p, "{\"eos_token_id\":[5,5,7]}");
    CHECK(genconfig_load(&g, dir, &c, &err) == 0 && g.n_eos == 2, "duplicates dropped");
    write_text(p, "{\"eos_token_id\":[248320]}");
    rc = genconfig_load(&g, dir, &c, &err);
    CHECK(rc == Q35_ERR_CONFIG && strstr(err.msg, "eos_token_id[0]") && strstr(err.msg, p), "eos past vocab: %s",
          err.msg);
    write_text(p, "{\"eos_token_id\":\"</s>\"}");
    CHECK(genconfig_load(&g, dir, &c, &err) == Q35_ERR_CONFIG && strstr(err.msg, "eos_token_id"), "eos string: %s",
          err.msg);
    write_text(p, "{\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}");
    CHECK(genconfig_load(&g, dir, &c, &err) == Q35_ERR_CONFIG, "too many eos");
    write_text(p, "{\"eos_token_id\":[1],\"temperature\":\"hot\"}");
    CHECK(genconfig_load(&g, dir, &c, &err) == Q35_ERR_CONFIG && strstr(err.msg, "temperature"), "temp type: %s",
          err.msg);
    write_text(p, "{\"top_p\":0}");
    CHECK(genconfig_load(&g, dir, &c, &err) == Q35_ERR_CONFIG && strstr(err.msg, "top_p"), "top_p range");
    write_text(p, "{\"eos_token_id\":[1,");
    rc = genconfig_load(&g, dir, &c, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, p) && g.n_eos == 0, "malformed: %s", err.msg);
    CHECK(genconfig_load(&g, dir, NULL, &err) == Q35_ERR_FORMAT, "malformed without a config");
    remove(p);
}

int main(int argc, char **argv) {
    verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    snprintf(dir, sizeof dir, "/tmp/q35_cfg_XXXXXX");
    if (!make_tmpdir(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_config_vl_08b();
    test_config_qwen3();
    test_config_flat_and_fallback();
    test_config_errors();
    test_genconfig();
    rm_rf(dir);
    return TEST_SUMMARY("config");
}
