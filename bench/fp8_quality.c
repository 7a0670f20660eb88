/* fp8_quality.c — the numerical error of --weights fp8 (issue 31): a bf16 model and the same model quantized at load
 * (128 x 128 block scales, docs/FP8.md) run the same ids, and their logits are compared per position.
 *   1. The bf16 engine decodes `steps` greedy ids after a pseudo-random 16-id prompt (one id per call).
 *   2. The FP8 engine is teacher-forced on the same ids: per position, the rel L2 of its logits against the bf16
 *      ones, and whether its argmax is the bf16 argmax (greedy agreement).
 *   3. With --cpu N (N > 0): a CPU engine on the same FP8 weights (dequantized to fp32, the FP8 kernels' reference)
 *      runs the first N positions, and the FP8 engine's logits are compared with it (the kernels' own error); beside
 *      it, the bf16 engine against a CPU engine on the bf16 weights (the bf16 kernels' error on the same ids: random
 *      full-size weights amplify bf16 activation rounding, so this is the scale to read the FP8 figure against).
 * Random weights say little about language quality: these are numerical distances. A benchmark, nothing asserted.
 * Usage: fp8_quality [--dummy qwen3.5-0.8b] [--backend cuda] [--steps 256] [--cpu N] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwen35.h"

static double rel_l2(const float *a, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static int open_engine(Q35Engine **e, const char *dummy, const char *backend, const char *weights, int ctx) {
    Q35Options o;
    q35_options_init(&o);
    o.dummy = dummy;
    o.backend = backend;
    o.weights = weights;
    o.max_seq = ctx;
    Q35Err err = {0};
    if (q35_engine_open(e, &o, &err)) {
        fprintf(stderr, "fp8_quality: open (%s, %s): %s\n", backend, weights, err.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *dummy = "qwen3.5-0.8b", *backend = "cuda";
    int steps = 256, n_cpu = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dummy") && i + 1 < argc)
            dummy = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            backend = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu") && i + 1 < argc)
            n_cpu = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: fp8_quality [--dummy NAME] [--backend cpu|cuda] [--steps N] [--cpu N]\n");
            return 2;
        }
    }
    const int n_prompt = 16, n = n_prompt + (steps > 0 ? steps : 0);
    if (n_cpu > n) n_cpu = n;
    Q35Engine *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    if (open_engine(&a, dummy, backend, "auto", n + 8) || open_engine(&b, dummy, backend, "fp8", n + 8)) return 1;
    if (n_cpu > 0 && (open_engine(&c, dummy, "cpu", "fp8", n + 8) || open_engine(&d, dummy, "cpu", "auto", n + 8)))
        return 1;
    const int V = q35_vocab_size(a);
    int *ids = malloc(sizeof(int) * (size_t)n);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V),
          *lc = malloc(sizeof(float) * (size_t)V), *ld = malloc(sizeof(float) * (size_t)V);
    uint64_t z = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_prompt; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int)((z >> 33) % (uint64_t)(V < 50000 ? V : 50000));
    }
    Q35Err err = {0};
    double sum = 0, worst = 0, sum_c = 0, worst_c = 0, sum_d = 0, worst_d = 0;
    int agree = 0, first_diff = -1, cnt = 0, agree_c = 0;
    for (int t = 0; t < n; t++) {
        if (q35_forward(a, ids + t, 1, 0, la, &err) || q35_forward(b, ids + t, 1, 0, lb, &err) ||
            (t < n_cpu && (q35_forward(c, ids + t, 1, 0, lc, &err) || q35_forward(d, ids + t, 1, 0, ld, &err)))) {
            fprintf(stderr, "fp8_quality: position %d: %s\n", t, err.msg);
            return 1;
        }
        const int ga = argmax(la, V), gb = argmax(lb, V);
        if (t + 1 < n && t + 1 >= n_prompt) ids[t + 1] = ga; /* the bf16 engine's greedy continuation */
        if (t >= n_prompt - 1) {                             /* positions whose next id is generated */
            const double e = rel_l2(lb, la, V);
            sum += e, cnt++;
            if (e > worst) worst = e;
            agree += ga == gb;
            if (ga != gb && first_diff < 0) first_diff = t - (n_prompt - 1);
        }
        if (t < n_cpu) {
            const double e = rel_l2(lb, lc, V);
            sum_c += e;
            if (e > worst_c) worst_c = e;
            agree_c += gb == argmax(lc, V);
            const double e2 = rel_l2(la, ld, V);
            sum_d += e2;
            if (e2 > worst_d) worst_d = e2;
        }
    }
    printf("fp8_quality %s on %s: %d generated positions after a %d-id prompt\n", dummy, backend, cnt, n_prompt);
    printf("  fp8 vs bf16 weights (teacher-forced on the bf16 greedy ids): logits rel L2 mean %.4f, worst %.4f; "
           "greedy agreement %d / %d (first difference at generated position %d)\n",
           sum / (cnt ? cnt : 1), worst, agree, cnt, first_diff);
    if (n_cpu > 0)
        printf("  %s fp8 vs the CPU on the same fp8 weights (dequantized fp32), first %d positions: rel L2 mean %.2e, "
               "worst %.2e; argmax agreement %d / %d\n",
               backend, n_cpu, sum_c / n_cpu, worst_c, agree_c, n_cpu);
    if (n_cpu > 0)
        printf("  %s bf16 vs the CPU on the bf16 weights (the same positions): rel L2 mean %.2e, worst %.2e\n", backend,
               sum_d / n_cpu, worst_d);
    free(ids), free(la), free(lb), free(lc), free(ld);
    q35_engine_close(a);
    q35_engine_close(b);
    if (c) q35_engine_close(c);
    if (d) q35_engine_close(d);
    return 0;
}
