/* test_golden.c — the CPU backend against HF transformers float32 logits. For every directory
 * <root>/<name>/ (root: argv[1], default tests/fixtures) holding golden.safetensors, the model
 * in that directory is loaded (F32 params kept, as the HF float32 model has them) and each
 * case{c}.ids is run (a) in one prefill call with all logits, (b) one token per call, (c) a
 * prefill of the first half then decode of the rest; every position's logits must match
 * case{c}.logits_f32 within relative L2 1e-4. Then greedy decoding from the ids must reproduce
 * case{c}.greedy_f32 (a flip is accepted only at a near-tie of our own top two logits).
 * No fixtures at all is a pass ("no fixtures"); a fixture that cannot be read is a failure. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "model.h"
#include "safetensors.h"
#include "test.h"

#define GOLD_TOL 1e-4

static double rel_l2(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

/* Largest per-position relative L2 error of got [n][V] against ref [n][V]; NaN sticks. */
static double worst_row(const float *got, const float *ref, int n, int V, int *at) {
    double mx = 0;
    *at = 0;
    for (int t = 0; t < n; t++) {
        const double e = rel_l2(got + (int64_t)t * V, ref + (int64_t)t * V, V);
        if (!(e <= mx)) mx = e, *at = t;
    }
    return mx;
}

static int argmax(const float *x, int n, float *gap) {
    int best = 0, second = -1;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[best]) second = best, best = i;
        else if (second < 0 || x[i] > x[second]) second = i;
    }
    *gap = second >= 0 ? x[best] - x[second] : INFINITY;
    return best;
}

static const Tensor *find_typed(const SafeTensors *st, const char *name, DType dt, int ndim) {
    const Tensor *t = safetensors_find(st, name);
    return t && t->dtype == dt && t->ndim == ndim ? t : NULL;
}

/* Runs all three modes and the greedy check for one case. */
static void run_case(const char *fx, int ci, const Backend *be, void *ctx, const int *ids, int n, const float *ref,
                     int V, const Tensor *greedy, float *buf, double *worst) {
    Err err = {0};
    const char *modes[3] = {"prefill", "decode", "prefill+decode"};
    for (int mode = 0; mode < 3; mode++) {
        for (int64_t i = 0; i < (int64_t)n * V; i++) buf[i] = NAN;
        int rc = be->reset(ctx, &err);
        const int h = mode == 0 ? n : mode == 1 ? 0 : n / 2;
        if (rc == 0 && h > 0) rc = be->forward(ctx, ids, h, 0, 1, buf, &err);
        for (int t = h; t < n && rc == 0; t++) rc = be->forward(ctx, ids + t, 1, t, 1, buf + (int64_t)t * V, &err);
        CHECK(rc == 0, "%s case %d %s: %s", fx, ci, modes[mode], err.msg);
        int at;
        const double e = worst_row(buf, ref, n, V, &at);
        printf("  case %d (%d ids) %-15s rel L2 all positions %.2e, worst position %3d: %.2e\n", ci, n, modes[mode],
               rel_l2(buf, ref, (int64_t)n * V), at, e);
        CHECK(e <= GOLD_TOL, "%s case %d %s: position %d rel L2 %.3g > %g", fx, ci, modes[mode], at, e, GOLD_TOL);
        if (!(e <= worst[mode])) worst[mode] = e;
    }
    if (!greedy) return;
    /* greedy continuation: the state now holds all ids; buf's last row is the last logits */
    const int G = (int)greedy->numel;
    const int32_t *want = greedy->data;
    float *last = buf + (int64_t)(n - 1) * V, maxabs = 0;
    for (int i = 0; i < V; i++) maxabs = fabsf(last[i]) > maxabs ? fabsf(last[i]) : maxabs;
    int g = 0;
    for (; g < G; g++) {
        float gap;
        const int id = argmax(last, V, &gap);
        if (id != want[g]) {
            const int tie = gap <= 1e-4f * maxabs;
            printf("  case %d greedy: step %d got %d, HF %d (our top-2 gap %.3g%s)\n", ci, g, id, want[g], gap,
                   tie ? ", a near-tie: accepted" : "");
            CHECK(tie, "%s case %d greedy step %d: %d vs HF %d", fx, ci, g, id, want[g]);
            return;
        }
        if (g + 1 == G) continue;
        const int rc = be->forward(ctx, &id, 1, n + g, 0, last, &err);
        CHECK(rc == 0, "%s case %d greedy step %d: %s", fx, ci, g, err.msg);
        if (rc) return;
    }
    printf("  case %d greedy: %d of %d ids match HF\n", ci, g, G);
}

static void run_fixture(const char *root, const char *name) {
    char dir[2048], gold[2100];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(gold, sizeof gold, "%s/golden.safetensors", dir);
    SafeTensors st;
    Model m;
    Err err = {0};
    memset(&m, 0, sizeof m);
    int rc = safetensors_open(&st, gold, &err);
    CHECK(rc == 0, "%s: %s", name, err.msg);
    if (rc) return;
    printf("fixture %s: %.300s\n", name, st.metadata_json ? st.metadata_json : "(no metadata)");
    ModelLoadOptions lo = {.keep_f32_params = 1, .strict = 0};
    rc = model_load(&m, dir, &lo, &err);
    CHECK(rc == 0, "%s: model_load: %s", name, err.msg);
    if (rc) {
        safetensors_close(&st);
        return;
    }
    const int V = m.config.vocab_size;
    /* the longest case sets the context */
    int max_n = 0, n_cases = 0, max_g = 0;
    for (;; n_cases++) {
        char key[64];
        snprintf(key, sizeof key, "case%d.ids", n_cases);
        const Tensor *t = safetensors_find(&st, key);
        if (!t) break;
        if (t->numel > max_n) max_n = (int)t->numel;
        snprintf(key, sizeof key, "case%d.greedy_f32", n_cases);
        const Tensor *g = safetensors_find(&st, key);
        if (g && g->numel > max_g) max_g = (int)g->numel;
    }
    CHECK(n_cases > 0, "%s: golden.safetensors has no case0.ids", name);
    BackendOptions bo = {.max_seq = max_n + max_g + 1, .threads = 0};
    void *ctx = NULL;
    rc = n_cases > 0 ? cpu_backend.open(&ctx, &m, &bo, &err) : -1;
    CHECK(n_cases == 0 || rc == 0, "%s: cpu backend open: %s", name, err.msg);
    float *buf = rc == 0 ? malloc((size_t)max_n * V * sizeof(float)) : NULL;
    double worst[3] = {0, 0, 0}, t0 = now_s();
    for (int ci = 0; ci < n_cases && buf; ci++) {
        char key[64];
        snprintf(key, sizeof key, "case%d.ids", ci);
        const Tensor *ids = find_typed(&st, key, DT_I32, 1);
        snprintf(key, sizeof key, "case%d.logits_f32", ci);
        const Tensor *lg = find_typed(&st, key, DT_F32, 2);
        snprintf(key, sizeof key, "case%d.greedy_f32", ci);
        const Tensor *gr = find_typed(&st, key, DT_I32, 1);
        const int n = ids ? (int)ids->numel : 0;
        CHECK(ids && n > 0, "%s case %d: ids missing, not I32 [n] or empty", name, ci);
        CHECK(lg && lg->shape[0] == n && lg->shape[1] == V, "%s case %d: logits_f32 missing or not F32 [%d, %d]",
              name, ci, n, V);
        if (!ids || n <= 0 || !lg || lg->shape[0] != n || lg->shape[1] != V) continue;
        int bad_id = 0;
        for (int i = 0; i < n; i++) bad_id |= ((const int32_t *)ids->data)[i] < 0 || ((const int32_t *)ids->data)[i] >= V;
        CHECK(!bad_id, "%s case %d: ids outside [0, %d)", name, ci, V);
        if (bad_id) continue;
        run_case(name, ci, &cpu_backend, ctx, ids->data, n, lg->data, V, gr, buf, worst);
    }
    printf("fixture %s: %d cases, worst rel L2 prefill %.2e, decode %.2e, prefill+decode %.2e (%.1f s)\n", name,
           n_cases, worst[0], worst[1], worst[2], now_s() - t0);
    free(buf);
    if (ctx) cpu_backend.close(ctx);
    model_free(&m);
    safetensors_close(&st);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    DIR *d = opendir(root);
    int found = 0;
    if (d) {
        /* sorted names for a stable order */
        char *names[256];
        int nn = 0;
        struct dirent *e;
        while ((e = readdir(d)) && nn < 256) {
            if (e->d_name[0] == '.') continue;
            char p[2048];
            snprintf(p, sizeof p, "%s/%s/golden.safetensors", root, e->d_name);
            if (file_exists(p)) names[nn++] = strdup(e->d_name);
        }
        closedir(d);
        for (int i = 0; i < nn; i++)
            for (int j = i + 1; j < nn; j++)
                if (strcmp(names[j], names[i]) < 0) {
                    char *t = names[i];
                    names[i] = names[j], names[j] = t;
                }
        for (int i = 0; i < nn; i++) {
            run_fixture(root, names[i]);
            free(names[i]);
        }
        found = nn;
    }
    if (!found) printf("golden: no fixtures under %s (nothing to compare)\n", root);
    return TEST_SUMMARY("golden");
}
