/* gen_model.c — writes the serve tests' model: the Qwen3.5 architecture of tests/fixtures/qwen35_text
 * (hidden 64, 4 layers: 3 Gated DeltaNet + 1 gated attention) with Qwen3's vocabulary size (151936), so that
 * the official Qwen3 tokenizer (copied next to it by tests/serve/run.sh) drives it. Weights are random bf16
 * from a fixed seed: matrices N(0, 1/fan_in), the embedding N(0, 1), the zero-centred norms N(0, 0.1^2).
 * usage: gen_model FIXTURE_CONFIG_JSON OUT_DIR */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../st_write.h"

enum { V = 151936, D = 64, F = 128, L = 4, FULL = 2 };

static uint64_t rng = 0x5EEDC0FFEEull;
static float gauss(void) { /* Box-Muller over xorshift64* */
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        u[i] = ((rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
    }
    return (float)(sqrt(-2.0 * log(u[0] + 1e-300)) * cos(6.283185307179586 * u[1]));
}

static uint16_t *randn(size_t n, float scale) {
    uint16_t *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        float f = gauss() * scale;
        uint32_t b;
        memcpy(&b, &f, 4);
        p[i] = (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16); /* round to nearest even */
    }
    return p;
}

static StSpec specs[128];
static int n_specs;
static char names[128][96];

static void add(const char *name, int ndim, int64_t a, int64_t b, int64_t c, float scale) {
    StSpec *t = &specs[n_specs];
    snprintf(names[n_specs], sizeof names[0], "%s", name);
    t->name = names[n_specs++];
    t->dtype = "BF16";
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    size_t n = (size_t)a * (size_t)(ndim > 1 ? b : 1) * (size_t)(ndim > 2 ? c : 1);
    t->data = randn(n, scale);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gen_model FIXTURE_CONFIG_JSON OUT_DIR\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        fprintf(stderr, "gen_model: cannot read %s\n", argv[1]);
        return 1;
    }
    static char cfg[65536];
    size_t n = fread(cfg, 1, sizeof cfg - 1, f);
    fclose(f);
    cfg[n] = 0;
    char *v = strstr(cfg, "\"vocab_size\": 512");
    if (!v) {
        fprintf(stderr, "gen_model: %s has no \"vocab_size\": 512\n", argv[1]);
        return 1;
    }
    char out[65536 + 64], path[4096];
    snprintf(out, sizeof out, "%.*s\"vocab_size\": %d%s", (int)(v - cfg), cfg, V, v + strlen("\"vocab_size\": 512"));
    mkdir(argv[2], 0755);
    snprintf(path, sizeof path, "%s/config.json", argv[2]);
    if (write_text(path, out)) return 1;
    snprintf(path, sizeof path, "%s/generation_config.json", argv[2]);
    if (write_text(path, "{\"do_sample\": false, \"eos_token_id\": [151645, 151643]}\n")) return 1;

    const float ws = 1.0f / sqrtf((float)D);
    char nm[96];
    add("model.embed_tokens.weight", 2, V, D, 0, 1.0f);
    for (int l = 0; l < L; l++) {
#define NAME(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        add(NAME("input_layernorm.weight"), 1, D, 0, 0, 0.1f);
        add(NAME("post_attention_layernorm.weight"), 1, D, 0, 0, 0.1f);
        add(NAME("mlp.gate_proj.weight"), 2, F, D, 0, ws);
        add(NAME("mlp.up_proj.weight"), 2, F, D, 0, ws);
        add(NAME("mlp.down_proj.weight"), 2, D, F, 0, 1.0f / sqrtf((float)F));
        if (l == FULL) { /* 4 heads of 32 (q and gate), 2 kv heads */
            add(NAME("self_attn.q_proj.weight"), 2, 256, D, 0, ws);
            add(NAME("self_attn.k_proj.weight"), 2, 64, D, 0, ws);
            add(NAME("self_attn.v_proj.weight"), 2, 64, D, 0, ws);
            add(NAME("self_attn.o_proj.weight"), 2, D, 128, 0, 1.0f / sqrtf(128.0f));
            add(NAME("self_attn.q_norm.weight"), 1, 32, 0, 0, 0.1f);
            add(NAME("self_attn.k_norm.weight"), 1, 32, 0, 0, 0.1f);
        } else { /* 4 key / value heads of 16: conv_dim 192 */
            add(NAME("linear_attn.in_proj_qkv.weight"), 2, 192, D, 0, ws);
            add(NAME("linear_attn.in_proj_z.weight"), 2, 64, D, 0, ws);
            add(NAME("linear_attn.in_proj_b.weight"), 2, 4, D, 0, ws);
            add(NAME("linear_attn.in_proj_a.weight"), 2, 4, D, 0, ws);
            add(NAME("linear_attn.conv1d.weight"), 3, 192, 1, 4, 0.5f);
            add(NAME("linear_attn.dt_bias"), 1, 4, 0, 0, 1.0f);
            add(NAME("linear_attn.A_log"), 1, 4, 0, 0, 1.0f);
            add(NAME("linear_attn.norm.weight"), 1, 16, 0, 0, 0.1f);
            add(NAME("linear_attn.out_proj.weight"), 2, D, 64, 0, 1.0f / 8.0f);
        }
#undef NAME
    }
    add("model.norm.weight", 1, D, 0, 0, 0.1f);
    snprintf(path, sizeof path, "%s/model.safetensors", argv[2]);
    int rc = st_write(path, specs, n_specs, "{\"format\":\"pt\"}");
    for (int i = 0; i < n_specs; i++) free((void *)specs[i].data);
    if (rc) fprintf(stderr, "gen_model: cannot write %s\n", path);
    return rc ? 1 : 0;
}
