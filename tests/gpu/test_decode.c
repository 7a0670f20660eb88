/* test_decode.c — the whole CUDA backend (src/cuda/backend.cu + decode.cu) against the CPU
 * backend (the fp32 reference) on small random models built here: a Qwen3.5-like hybrid
 * (DeltaNet layers with Hv = 2 Hk and dk != dv, gated attention with partial RoPE, zero-centred
 * norms, one F16 and F32 weights) and a Qwen3-like dense model (plain norms, no gate, full RoPE).
 * Weights are bf16 values in every stored dtype, so the upload is lossless and the only
 * difference from the CPU is HF's bf16 rounding of activations. Checked:
 *   - logits of every position (forward with all_logits) within a relative L2 bound of the CPU's,
 *     argmax agreement where the CPU's top-2 margin is clear;
 *   - deterministic mode: graph vs no graph vs PDL off, 3 runs with reset: bitwise identical;
 *     atomic split-K close to deterministic;
 *   - the default atomic-mode step (the fused MLP, and with 128 x 128 DeltaNet heads the fused mixer): logits vs the CPU and the
 *     default path, greedy ids = the default path's where its margin is clear, one launch less per layer
 *     in the bench (and 100 steps vs the CPU in test_long);
 *   - decode_sample: greedy ids = argmax of the logits; sampling ids inside the top-k, reproducible; with logit
 *     changes (penalties, a bias), greedy and sampled ids = the host sampler's on the same logits;
 *   - probe dumps: the names both backends write agree within 0.1 (one mixer output within 0.3: an
 *     ill-conditioned layer of the tiny model, compare_probes);
 *   - the bench hook runs and reports; bad positions / ids / overflow give clear errors.
 * Usage: test_decode [seed]. Skips (exit 0, "no GPU") without a GPU. */
#include <dirent.h>
#include <sys/stat.h>

#include "backend.h"
#include "test.h"
#include "tiny_weights.h"
#include "gpu_common.h"
#include "test_tensors.h"

static Rng rng;
static int g_dn_fused; /* 1: the small hybrid model's DeltaNet heads are 128 x 128 (Hv = Hk), the shape the fused mixer
                        * (deltanet_layer.cu) takes; 0: Hv = 2 Hk and dk != dv, so the step runs as in_proj + step + out_proj */

/* tiny_fill_weights' tensor maker: tt_tensor on this test's generator */
static Tensor mk(int64_t rows, int64_t cols, DType dt, float offset, float scale) {
    return tt_tensor(&rng, rows, cols, dt, offset, scale);
}

/* qwen35 = 1: layers D D A D A (D = DeltaNet, A = gated attention); 0: Qwen3-like, 3 A layers. */
static void small_model(Model *m, int qwen35) {
    memset(m, 0, sizeof *m);
    Config *c = &m->config;
    c->family = qwen35 ? FAMILY_QWEN35 : FAMILY_QWEN3;
    snprintf(c->model_type, sizeof c->model_type, "%s", qwen35 ? "qwen3_5_text" : "qwen3");
    c->hidden_size = 256;
    c->num_hidden_layers = qwen35 ? 5 : 3;
    c->intermediate_size = qwen35 ? 384 : 320;
    c->rms_norm_eps = 1e-6f;
    c->vocab_size = qwen35 ? 1000 : 800;
    c->tie_word_embeddings = qwen35;
    c->num_attention_heads = 4;
    c->num_key_value_heads = qwen35 ? 2 : 4;
    c->head_dim = 128;
    c->attn_output_gate = qwen35;
    c->rope_theta = qwen35 ? 1e7f : 1e6f;
    c->partial_rotary_factor = qwen35 ? 0.25f : 1.0f;
    /* by default DeltaNet heads the fused mixer kernel takes (deltanet_layer.cu: Hk = Hv, dk = dv = 128); with
     * QWEN35_DN_FUSED=0 heads it does not (Hv = 2 Hk, dk != dv) for the three-kernel path */
    const int dnf = g_dn_fused;
    c->linear_num_key_heads = qwen35 ? 2 : 0;
    c->linear_num_value_heads = qwen35 ? (dnf ? 2 : 4) : 0;
    c->linear_key_head_dim = qwen35 ? (dnf ? 128 : 32) : 0;
    c->linear_value_head_dim = qwen35 ? (dnf ? 128 : 48) : 0;
    c->linear_conv_kernel_dim = qwen35 ? 4 : 0;
    c->max_position_embeddings = 4096;
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_types[l] = !qwen35 || l == 2 || l == 4 ? LAYER_FULL_ATTN : LAYER_LINEAR_ATTN;
    Err cerr = {0};
    const int crc = config_finish(c, "tiny model", &cerr); /* the derived sizes, as the loader computes them */
    CHECK(crc == 0, "tiny config: %s", cerr.msg);

    tiny_fill_weights(m, mk, tt_keep, !qwen35);
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* Reset, then n single-token forward calls (the decode step, graph or eager): logits [n][V].
 * forward(n > 1) takes the prefill path for the shapes it covers, whose sums run in another
 * order, so the bitwise comparisons of decode modes use single-token calls only. */
static int cuda_run(void *ctx, const int *ids, int n, int V, float *logits, Err *err) {
    int rc = cuda_backend.reset(ctx, err);
    for (int t = 0; t < n && !rc; t++) rc = cuda_backend.forward(ctx, ids + t, 1, t, 0, logits + (size_t)t * V, err);
    return rc;
}

/* Reset, then one forward(n) call (the prefill path where it applies): logits [n][V]. */
static int cuda_run_batch(void *ctx, const int *ids, int n, float *logits, Err *err) {
    int rc = cuda_backend.reset(ctx, err);
    return rc ? rc : cuda_backend.forward(ctx, ids, n, 0, 1, logits, err);
}

static int open_cuda(void **ctx, const Model *m, int det, int no_graph, int no_pdl, int n_valid,
                     const char *probe_dir) {
    BackendOptions o;
    memset(&o, 0, sizeof o);
    o.max_seq = 64, o.deterministic = det, o.no_graph = no_graph, o.no_pdl = no_pdl, o.n_valid = n_valid;
    o.probe.dir = probe_dir;
    Err err = {0};
    int rc = cuda_backend.open(ctx, m, &o, &err);
    CHECK(rc == 0, "cuda open (det %d graph %d pdl %d): %s", det, !no_graph, !no_pdl, err.msg);
    return rc;
}

/* Compares every CPU probe file that the CUDA run also wrote (last token's values). */
static void compare_probes(const char *cpu_dir, const char *cuda_dir, const char *model) {
    DIR *d = opendir(cuda_dir);
    if (!d) {
        CHECK(0, "no probe dir %s", cuda_dir);
        return;
    }
    struct dirent *e;
    int n = 0, n_loose = 0;
    char loose[300] = "";
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/%s", cuda_dir, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", cpu_dir, e->d_name);
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        Err err = {0};
        if (read_file(pa, &a, &na, &err) || read_file(pb, &b, &nb, &err)) {
            free(a);
            continue; /* a CUDA-only name */
        }
        CHECK(na == nb, "%s probe %s: %zu vs %zu bytes", model, e->d_name, na, nb);
        if (na == nb && na) {
            double r = rel_l2((const float *)a, (const float *)b, (int64_t)(na / 4));
            /* bf16 activations vs fp32: up to 0.056 at a DeltaNet output over most seeds; a wrong op gives ~1.
             * One mixer output (a layer's delta.out / attn.out, last token) may be ill-conditioned in the
             * tiny random model: seed 598584421 gives 0.2376 at L03.delta.out on every GPU path alike (gated
             * norm in the step or in out_proj), with the logits at 0.054 and every other probe below 0.1. */
            const int mixer_out = strstr(e->d_name, "delta.out") || strstr(e->d_name, "attn.out");
            if (r >= 0.1 && r < 0.3 && mixer_out && n_loose++ == 0)
                snprintf(loose, sizeof loose, "%s at %.4f", e->d_name, r);
            else
                CHECK(r < 0.1, "%s probe %s: rel L2 %.4f vs the CPU", model, e->d_name, r);
            n++;
        }
        free(a), free(b);
    }
    closedir(d);
    CHECK(n >= 5, "%s: only %d probe names shared with the CPU", model, n);
    printf("  %s: %d probe names compared with the CPU%s%s\n", model, n, n_loose ? "; one mixer output loose: " : "",
           loose);
}

/* Logits [n][V] vs the CPU's fp32 logits, per position: bf16 activations vs fp32 on random weights
 * measured 0.020-0.044 over seeds, and one position can be ill-conditioned (seed 1394436473: 0.1040 at
 * position 2 on every GPU path alike, decode, fused and prefill, with 0.0099-0.0439 at the other 11);
 * a wrong op gives > 0.3 at every position. So: worst < 0.06, or one outlier < 0.15 with the
 * second worst < 0.06. *worst gets the worst. */
static int logits_near_cpu(const float *got, const float *ref, int n, int V, double *worst) {
    double w1 = 0, w2 = 0;
    for (int t = 0; t < n; t++) {
        const double e = rel_l2(got + (size_t)t * V, ref + (size_t)t * V, V);
        if (e > w1)
            w2 = w1, w1 = e;
        else if (e > w2)
            w2 = e;
    }
    *worst = w1;
    return w1 < 0.06 || (w1 < 0.15 && w2 < 0.06);
}

/* The fused MLP context gf after cuda_run: logits fz [n][V] vs the CPU (the deterministic run's bound),
 * vs the deterministic and the atomic default runs (the atomic bound); greedy ids of decode_sample
 * equal to the deterministic default path where its top-2 margin is clear; the bench hook reports the
 * fused kernel with one launch less per layer than the default step. Returns 1 on a hard failure. */
static int check_fused(void *gf, const int *ids, int n, int V, int n_valid, const float *ref, const float *det1,
                       const float *atomic, const float *fz, const char *name) {
    Err err = {0};
    double worst;
    const int near = logits_near_cpu(fz, ref, n, V, &worst);
    const double ed = rel_l2(fz, det1, (int64_t)n * V), ea = rel_l2(fz, atomic, (int64_t)n * V);
    printf("  %s: fused MLP: logits rel L2 vs CPU worst %.4f, vs deterministic %.4g, vs atomic %.4g\n", name, worst, ed,
           ea);
    CHECK(near, "%s: fused MLP logits rel L2 %.4f vs CPU", name, worst);
    CHECK(ed < 1e-2, "%s: fused MLP vs deterministic rel L2 %.4g", name, ed);
    CHECK(ea < 1e-2, "%s: fused MLP vs atomic rel L2 %.4g", name, ea);
    if (cuda_backend.reset(gf, &err)) {
        CHECK(0, "%s fused reset: %s", name, err.msg);
        return 1;
    }
    int compared = 0;
    for (int t = 0; t < n; t++) {
        DeviceSampling s = {
            .temperature = 0.0f, .top_p = 1.0f, .min_p = 0.0f, .top_k = 0, .seed = 1, .step = (uint64_t)t};
        int id = -1;
        if (cuda_backend.decode_sample(gf, ids[t], t, &s, &id, &err)) {
            CHECK(0, "%s fused decode_sample: %s", name, err.msg);
            return 1;
        }
        const float *l = det1 + (size_t)t * V;
        const int a = argmax(l, n_valid);
        float second = -INFINITY, sd = 0;
        for (int i = 0; i < n_valid; i++) {
            if (i != a && l[i] > second) second = l[i];
            sd += l[i] * l[i];
        }
        if (l[a] - second <= 0.05f * sqrtf(sd / n_valid)) continue; /* a near tie: either id is right */
        compared++;
        CHECK(id == a, "%s: fused MLP greedy id %d at %d, default path %d", name, id, t, a);
    }
    CHECK(compared >= n / 3, "%s: only %d of %d greedy steps had a clear margin", name, compared, n);
    BenchRequest rq = {0};
    rq.ctx_len = 5, rq.iters = 3, rq.ops = 1;
    BenchResult *br = calloc(1, sizeof *br);
    int rc = br ? cuda_backend.bench(gf, &rq, br, &err) : Q35_ERR_OOM;
    CHECK(rc == 0, "%s fused bench: %s", name, err.msg);
    if (!rc) {
        int mlp_ops = 0, gemv_ops = 0, dn_ops = 0, ao_ops = 0;
        for (int i = 0; i < br->n_ops; i++) {
            const char *dot = strchr(br->ops[i].name, '.');
            mlp_ops += dot && !strcmp(dot, ".mlp");
            dn_ops += dot && !strcmp(dot, ".dnlayer");
            ao_ops += dot && !strcmp(dot, ".attn_o");
            gemv_ops += dot && (!strcmp(dot, ".gate_up") || !strcmp(dot, ".down"));
        }
        /* the fused DeltaNet mixer needs the fused MLP: without it, in_proj, the step and out_proj again */
        if (g_dn_fused && strstr(name, "qwen3.5")) {
            printf("  %s: %d fused DeltaNet mixer launches per step\n", name, dn_ops);
            CHECK(dn_ops > 0, "%s: the fused mixer is on but no dnlayer launch", name);
        }
        const int saved = br->launches_mlp_unfused - br->launches;
        printf("  %s fused bench: %.3f ms/token (%d launches) vs %.3f with the two MLP GEMVs (%d launches)\n", name,
               br->ms_atomic, br->launches, br->ms_mlp_unfused, br->launches_mlp_unfused);
        CHECK(br->mlp_fused == 1 && br->ms_mlp_unfused > 0, "%s fused bench: mlp_fused %d, unfused %.3f ms", name,
              br->mlp_fused, br->ms_mlp_unfused);
        CHECK(mlp_ops > 0 && gemv_ops == 0, "%s fused bench ops: %d mlp, %d gate_up/down", name, mlp_ops, gemv_ops);
        /* a DeltaNet layer's 5 launches become dn_layer + the fused MLP (one saved by the .mlp op, two by the
         * .dnlayer op); at short contexts an attention layer's attention and o_proj are one launch, .attn_o */
        if (strstr(name, "qwen3.5")) CHECK(ao_ops > 0, "%s: context 5 but no attn_o launch", name);
        CHECK(saved == mlp_ops + 2 * dn_ops + ao_ops,
              "%s fused bench: %d launches vs %d unfused, %d fused MLP ops, %d dnlayer, %d attn_o", name, br->launches,
              br->launches_mlp_unfused, mlp_ops, dn_ops, ao_ops);
    }
    free(br);
    return 0;
}

static void test_model(int qwen35) {
    Model m;
    small_model(&m, qwen35);
    const Config *c = &m.config;
    const char *name = qwen35 ? "small qwen3.5" : "small qwen3";
    const int V = c->vocab_size, n_valid = V - 10, n = 12;
    int ids[12];
    for (int i = 0; i < n; i++) ids[i] = (int)(rng_u64(&rng) % (uint64_t)n_valid);
    float *ref = malloc(sizeof(float) * n * V), *got = malloc(sizeof(float) * n * V);
    float *det1 = malloc(sizeof(float) * n * V), *tmp = malloc(sizeof(float) * n * V);
    void *cpu = NULL, *gd = NULL, *ga = NULL, *gn = NULL, *gp = NULL;
    Err err = {0};
    char cpu_probe[] = "/tmp/q35_probe_cpu_XXXXXX", cuda_probe[] = "/tmp/q35_probe_cuda_XXXXXX";
    BackendOptions co;
    memset(&co, 0, sizeof co);
    co.max_seq = 64;
    if (cpu_backend.open(&cpu, &m, &co, &err)) {
        CHECK(0, "cpu open: %s", err.msg);
        goto done;
    }
    if (cpu_backend.forward(cpu, ids, n, 0, 1, ref, &err)) {
        CHECK(0, "cpu forward: %s", err.msg);
        goto done;
    }
    /* deterministic graph: logits vs CPU */
    if (open_cuda(&gd, &m, 1, 0, 0, n_valid, NULL)) goto done;
    if (cuda_run(gd, ids, n, V, det1, &err)) {
        CHECK(0, "%s cuda forward: %s", name, err.msg);
        goto done;
    }
    double worst = 0;
    int agree = 0, clear = 0;
    for (int t = 0; t < n; t++) {
        const float *r = ref + (size_t)t * V, *g = det1 + (size_t)t * V;
        double e = rel_l2(g, r, V);
        worst = e > worst ? e : worst;
        int a = argmax(r, n_valid);
        float second = -INFINITY, sd = 0;
        for (int i = 0; i < n_valid; i++) {
            if (i != a && r[i] > second) second = r[i];
            sd += r[i] * r[i];
        }
        sd = sqrtf(sd / n_valid);
        if (r[a] - second > 0.05f * sd) {
            clear++;
            agree += argmax(g, n_valid) == a;
        }
    }
    printf("  %s: logits rel L2 vs CPU fp32: worst %.4f over %d positions; argmax %d/%d where clear\n", name, worst, n,
           agree, clear);
    if (worst >= 0.06) { /* which positions: one outlier (a sensitive row) or all (a wrong op) */
        printf("    per position:");
        for (int t = 0; t < n; t++) printf(" %.4f", rel_l2(det1 + (size_t)t * V, ref + (size_t)t * V, V));
        printf("\n");
    }
    double worst_t;
    CHECK(logits_near_cpu(det1, ref, n, V, &worst_t), "%s: logits rel L2 %.4f vs CPU", name, worst);
    CHECK(agree == clear, "%s: argmax differs at %d of %d clear positions", name, clear - agree, clear);

    /* determinism: same context again (after reset), no graph, no PDL */
    for (int run = 0; run < 2; run++) {
        if (cuda_run(gd, ids, n, V, got, &err)) {
            CHECK(0, "%s: %s", name, err.msg);
            goto done;
        }
        CHECK(memcmp(got, det1, sizeof(float) * n * V) == 0, "%s: deterministic run %d differs", name, run + 2);
    }
    if (open_cuda(&gn, &m, 1, 1, 0, n_valid, NULL) || cuda_run(gn, ids, n, V, got, &err)) {
        CHECK(0, "%s no-graph: %s", name, err.msg);
        goto done;
    }
    CHECK(memcmp(got, det1, sizeof(float) * n * V) == 0, "%s: graph vs no graph differ (deterministic)", name);
    cuda_backend.close(gn), gn = NULL;
    if (open_cuda(&gn, &m, 1, 0, 1, n_valid, NULL) || cuda_run(gn, ids, n, V, got, &err)) {
        CHECK(0, "%s no-pdl: %s", name, err.msg);
        goto done;
    }
    CHECK(memcmp(got, det1, sizeof(float) * n * V) == 0, "%s: PDL on vs off differ (deterministic)", name);

    /* atomic split-K (default) */
    if (open_cuda(&ga, &m, 0, 0, 0, n_valid, NULL) || cuda_run(ga, ids, n, V, got, &err)) {
        CHECK(0, "%s atomic: %s", name, err.msg);
        goto done;
    }
    double ea = rel_l2(got, det1, (int64_t)n * V);
    CHECK(ea < 1e-2, "%s: atomic vs deterministic rel L2 %.4g", name, ea);

    /* the default atomic-mode step (fused MLP): a second atomic context */
    cuda_backend.close(gn), gn = NULL;
    if (open_cuda(&gn, &m, 0, 0, 0, n_valid, NULL) || cuda_run(gn, ids, n, V, tmp, &err)) {
        CHECK(0, "%s fused MLP: %s", name, err.msg);
        goto done;
    }
    if (check_fused(gn, ids, n, V, n_valid, ref, det1, got, tmp, name)) goto done;

    /* forward(n > 1) (the prefill path where the shapes allow) vs the CPU, and the hand-over to
     * decode: prefill n-1 tokens, then the last one as a decode step (logits, greedy, sampled) */
    if (cuda_run_batch(gd, ids, n, tmp, &err)) {
        CHECK(0, "%s batch forward: %s", name, err.msg);
        goto done;
    }
    {
        double wb, wh;
        CHECK(logits_near_cpu(tmp, ref, n, V, &wb), "%s: forward(%d) logits rel L2 %.4f vs CPU", name, n, wb);
        float *hl = tmp; /* [V]: decode step at n-1 after a prefill of n-1 */
        if (cuda_run_batch(gd, ids, n - 1, got, &err) || cuda_backend.forward(gd, ids + n - 1, 1, n - 1, 0, hl, &err)) {
            CHECK(0, "%s prefill + decode: %s", name, err.msg);
            goto done;
        }
        wh = rel_l2(hl, ref + (size_t)(n - 1) * V, V);
        printf("  %s: forward(%d) worst rel L2 %.4f; decode after prefill %.4f (vs CPU)\n", name, n, wb, wh);
        CHECK(wh < 0.06, "%s: decode after prefill: logits rel L2 %.4f vs CPU", name, wh);
        for (int smp = 0; smp < 2; smp++) {
            DeviceSampling s = {.temperature = smp ? 1.0f : 0.0f,
                                .top_p = 1.0f,
                                .min_p = 0.0f,
                                .top_k = smp ? 5 : 0,
                                .seed = 7,
                                .step = 3};
            int id = -1;
            if (cuda_run_batch(gd, ids, n - 1, got, &err) ||
                cuda_backend.decode_sample(gd, ids[n - 1], n - 1, &s, &id, &err)) {
                CHECK(0, "%s prefill + decode_sample: %s", name, err.msg);
                goto done;
            }
            int above = 0;
            for (int i = 0; i < n_valid; i++) above += hl[i] > hl[id >= 0 && id < V ? id : 0];
            if (!smp)
                CHECK(id == argmax(hl, n_valid), "%s: greedy after prefill: id %d, argmax %d", name, id,
                      argmax(hl, n_valid));
            else
                CHECK(id >= 0 && id < n_valid && above < 5, "%s: sampled after prefill: id %d not in the top 5", name,
                      id);
        }
    }

    /* decode_sample: greedy = argmax over n_valid; sampling inside the top-k and reproducible */
    if (cuda_backend.reset(gd, &err)) {
        CHECK(0, "reset: %s", err.msg);
        goto done;
    }
    for (int t = 0; t < n; t++) {
        DeviceSampling s = {
            .temperature = 0.0f, .top_p = 1.0f, .min_p = 0.0f, .top_k = 0, .seed = 1, .step = (uint64_t)t};
        int id = -1;
        if (cuda_backend.decode_sample(gd, ids[t], t, &s, &id, &err)) {
            CHECK(0, "decode_sample: %s", err.msg);
            goto done;
        }
        CHECK(id == argmax(det1 + (size_t)t * V, n_valid), "%s: greedy id %d at %d, argmax %d", name, id, t,
              argmax(det1 + (size_t)t * V, n_valid));
    }
    int first[12];
    for (int rep = 0; rep < 2; rep++) {
        if (cuda_backend.reset(gd, &err)) break;
        for (int t = 0; t < n; t++) {
            DeviceSampling s = {
                .temperature = 1.0f, .top_p = 1.0f, .min_p = 0.0f, .top_k = 5, .seed = 99, .step = (uint64_t)t};
            int id = -1;
            if (cuda_backend.decode_sample(gd, ids[t], t, &s, &id, &err)) {
                CHECK(0, "decode_sample: %s", err.msg);
                goto done;
            }
            const float *l = det1 + (size_t)t * V;
            int above = 0;
            for (int i = 0; i < n_valid; i++) above += l[i] > l[id >= 0 && id < V ? id : 0];
            CHECK(id >= 0 && id < n_valid && above < 5, "%s: sampled id %d at %d is not in the top 5", name, id, t);
            if (rep == 0)
                first[t] = id;
            else
                CHECK(id == first[t], "%s: sampling not reproducible at %d (%d vs %d)", name, t, first[t], id);
        }
    }

    /* decode_sample with logit changes (penalty.cu inside the step) = the host sampler on the same logits: presence,
     * repetition and frequency penalties over ids[0 .. t] (the odd positions generated) and a bias on every
     * position's raw argmax that puts it below every logit of its row (one bias for all: an id may be the argmax of
     * several rows), so that the changes move every greedy pick; sampling (top-k 8) and greedy */
    for (int greedy = 0; greedy < 2; greedy++) {
        if (cuda_backend.reset(gd, &err)) break;
        const Q35Sampling q = {.temperature = greedy ? 0.0f : 1.0f,
                               .top_k = greedy ? 0 : 8,
                               .top_p = 1.0f,
                               .presence_penalty = 1.5f,
                               .repetition_penalty = 1.3f,
                               .seed = 7,
                               .frequency_penalty = 0.25f};
        int am[12];
        float bias[12];
        float spread = 0.0f; /* the largest max - min of a row */
        for (int t = 0; t < n; t++) {
            const float *l = det1 + (size_t)t * V;
            am[t] = argmax(l, n_valid);
            float lo = l[0];
            for (int i = 1; i < n_valid; i++) lo = l[i] < lo ? l[i] : lo;
            spread = l[am[t]] - lo > spread ? l[am[t]] - lo : spread;
        }
        for (int t = 0; t < n; t++) bias[t] = -spread - 1.0f;
        Sampler sm;
        memset(&sm, 0, sizeof sm);
        if (sampler_init(&sm, &q, V, n_valid, &err) || sampler_set_bias(&sm, am, bias, n, &err)) {
            CHECK(0, "%s: sampler: %s", name, err.msg);
            sampler_free(&sm);
            goto done;
        }
        int moved = 0, same = 0;
        for (int t = 0; t < n; t++) {
            sampler_observe(&sm, ids[t], t & 1);
            const SamplePenalty *pe = NULL;
            const int np = sampler_penalties(&sm, &pe);
            const DeviceSampling s = {.temperature = q.temperature,
                                      .top_p = 1.0f,
                                      .top_k = q.top_k,
                                      .seed = q.seed,
                                      .step = (uint64_t)t,
                                      .repetition = q.repetition_penalty,
                                      .presence = q.presence_penalty,
                                      .frequency = q.frequency_penalty,
                                      .n_pen = np,
                                      .pen = pe};
            int id = -1;
            const int rc = cuda_backend.decode_sample(gd, ids[t], t, &s, &id, &err);
            CHECK(rc == 0, "%s: decode_sample with %d logit changes: %s", name, np, err.msg);
            if (rc) break;
            memcpy(tmp, det1 + (size_t)t * V, sizeof(float) * V);
            const int want = sampler_sample_at(&sm, tmp, (uint64_t)t);
            same += id == want;
            moved += want != am[t];
            CHECK(id == want, "%s: %s with %d logit changes at %d: device id %d, host %d", name,
                  greedy ? "greedy" : "sampling", np, t, id, want);
        }
        CHECK(!greedy || moved == n, "%s: the changes moved %d of %d greedy picks", name, moved, n);
        printf("  %s: decode_sample with logit changes (%s): %d / %d ids = the host sampler's\n", name,
               greedy ? "greedy" : "sampling", same, n);
        sampler_free(&sm);
    }

    /* probes: last token's activations vs the CPU's (token-by-token CPU run) */
    if (mkdtemp(cpu_probe) && mkdtemp(cuda_probe)) {
        cpu_backend.close(cpu), cpu = NULL;
        co.probe.dir = cpu_probe;
        if (cpu_backend.open(&cpu, &m, &co, &err)) {
            CHECK(0, "cpu open: %s", err.msg);
            goto done;
        }
        for (int t = 0; t < n && !err.code; t++) cpu_backend.forward(cpu, ids + t, 1, t, 0, tmp, &err);
        if (open_cuda(&gp, &m, 1, 0, 0, n_valid, cuda_probe) || cuda_run(gp, ids, n, V, got, &err)) {
            CHECK(0, "%s probe run: %s", name, err.msg);
            goto done;
        }
        /* probing runs one kernel per phase: the same as that path's deterministic graph */
        CHECK(memcmp(got, det1, sizeof(float) * n * V) == 0, "%s: probe (eager) run differs from graph", name);
        compare_probes(cpu_probe, cuda_probe, name);
    }

    /* bench hook */
    if (cuda_backend.bench) {
        BenchRequest rq = {0};
        rq.ctx_len = 5, rq.iters = 3, rq.ops = 1;
        BenchResult *br = calloc(1, sizeof *br);
        int rc = cuda_backend.bench(ga, &rq, br, &err);
        CHECK(rc == 0, "%s bench: %s", name, err.msg);
        if (!rc) {
            CHECK(br->ms_token > 0 && br->ms_det > 0 && br->ms_eager > 0 && br->ms_sample > 0 && br->ms_sync > 0,
                  "%s bench: a time is zero", name);
            CHECK(br->launches > 0 && br->n_ops > 0 && br->step_bytes > 0, "%s bench: launches %d ops %d bytes %g",
                  name, br->launches, br->n_ops, br->step_bytes);
            printf("  %s bench: %.3f ms/token graph, %.3f eager, %d launches, %d ops, copy %.0f GB/s\n", name,
                   br->ms_token, br->ms_eager, br->launches, br->n_ops, br->copy_gbs);
        }
        free(br);
        if (cuda_run(ga, ids, n, V, got, &err) == 0) /* usable after the bench */
            CHECK(rel_l2(got, det1, (int64_t)n * V) < 1e-2, "%s: results changed after the bench", name);
    }

    /* errors */
    {
        int bad = V + 3;
        cuda_backend.reset(gd, &err);
        CHECK(cuda_backend.forward(gd, ids, 1, 5, 0, NULL, &err) == Q35_ERR_ARG, "%s: wrong pos accepted", name);
        CHECK(cuda_backend.forward(gd, &bad, 1, 0, 0, NULL, &err) == Q35_ERR_ARG, "%s: bad id accepted", name);
        CHECK(strstr(err.msg, "token id") != NULL, "%s: message '%s'", name, err.msg);
        int *many = calloc(65, sizeof(int));
        CHECK(cuda_backend.forward(gd, many, 65, 0, 0, NULL, &err) == Q35_ERR_CONTEXT, "%s: overflow accepted", name);
        free(many);
    }
done:
    if (cpu) cpu_backend.close(cpu);
    if (gd) cuda_backend.close(gd);
    if (ga) cuda_backend.close(ga);
    if (gn) cuda_backend.close(gn);
    if (gp) cuda_backend.close(gp);
    free(ref), free(got), free(det1), free(tmp);
    tt_free_all();
}

/* 100 decode steps (attention split over the positions: several splits from 33 positions on) in
 * both decode paths vs the CPU, logits at every 9th position. */
static void test_long(int qwen35) {
    Model m;
    small_model(&m, qwen35);
    const int V = m.config.vocab_size, n = 100;
    const char *name = qwen35 ? "small qwen3.5" : "small qwen3";
    int ids[100];
    for (int i = 0; i < n; i++) ids[i] = (int)(rng_u64(&rng) % (uint64_t)V);
    float *ref = malloc(sizeof(float) * (size_t)n * V), *got = malloc(sizeof(float) * V);
    void *cpu = NULL;
    Err err = {0};
    BackendOptions o;
    memset(&o, 0, sizeof o);
    o.max_seq = 128;
    if (cpu_backend.open(&cpu, &m, &o, &err) || cpu_backend.forward(cpu, ids, n, 0, 1, ref, &err)) {
        CHECK(0, "cpu: %s", err.msg);
        goto done;
    }
    for (int path = 0; path < 2; path++) { /* deterministic (one kernel per phase), atomic (the fused kernels) */
        void *g = NULL;
        o.deterministic = path == 0;
        if (cuda_backend.open(&g, &m, &o, &err)) {
            CHECK(0, "cuda open: %s", err.msg);
            goto done;
        }
        double worst = 0;
        for (int t = 0; t < n; t++) {
            const int want = t % 9 == 8 || t == n - 1;
            if (cuda_backend.forward(g, ids + t, 1, t, 0, want ? got : NULL, &err)) {
                CHECK(0, "cuda forward at %d: %s", t, err.msg);
                break;
            }
            if (want) {
                const double e = rel_l2(got, ref + (size_t)t * V, V);
                worst = e > worst ? e : worst;
            }
        }
        static const char *what[2] = {"deterministic", "atomic (fused kernels)"};
        printf("  %s, %d steps, %s: worst logits rel L2 vs CPU %.4f\n", name, n, what[path], worst);
        /* bf16 drift grows with the steps: 12 steps stay < 0.06 (test_model); over 100 steps the tiny
         * hybrid model measured 0.049 on both paths for one seed and 0.116 for others (the seed draws the weights);
         * a broken split gives ~1 */
        CHECK(worst < 0.25, "%s: %d-step decode (%s) rel L2 %.4f vs CPU", name, n, what[path], worst);
        cuda_backend.close(g);
    }
done:
    if (cpu) cpu_backend.close(cpu);
    free(ref);
    free(got);
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("decode");
    rng_seed(&rng, test_seed(argc, argv, "test_decode"));
    for (int dnf = 1; dnf >= 0; dnf--) {
        g_dn_fused = dnf;
        printf("small qwen3.5 with %s\n", dnf ? "2 DeltaNet heads of 128 x 128 (the fused mixer)"
                                              : "Hv = 2 Hk, dk != dv (in_proj + step + out_proj)");
        test_model(1);
        test_long(1);
    }
    test_model(0);
    test_long(0);
    /* a model the kernels cannot run is refused with a clear error */
    Model m;
    small_model(&m, 0);
    m.config.head_dim = 96;
    void *ctx = NULL;
    BackendOptions o;
    memset(&o, 0, sizeof o);
    o.max_seq = 8;
    Err err = {0};
    CHECK(cuda_backend.open(&ctx, &m, &o, &err) == Q35_ERR_CONFIG && strstr(err.msg, "head_dim"),
          "head_dim 96 not refused clearly: %s", err.msg);
    tt_free_all();
    return TEST_SUMMARY("decode");
}
