/* test_sample.c — cuda_sample (src/cuda/sample.cu) against a CPU reference of the same rules
 * (the host sampler's: candidates >= max - 40 T, sort by value desc / id asc, top-k, top-p prefix,
 * min-p, draw u * mass in that order; u from the (seed, step) counter hash):
 *   - the drawn id lies inside the reference's kept set (top-p / min-p cut taken with a 1e-4 slack
 *     for fp32-vs-double masses) and its CDF interval holds u (same slack);
 *   - top_k = 1 is the argmax (smallest id among tied maxima); temperature 0 leaves out_id alone;
 *   - tie-heavy logits (few distinct values), padding ids >= n_valid never drawn, several grid sizes;
 *   - the empirical distribution of 20000 draws over a small vocabulary matches softmax(l / T);
 *   - repeated calls (scratch reuse) stay consistent; the same (seed, step) gives the same id.
 * Usage: test_sample [seed]. Skips (exit 0, "no GPU") without a GPU. */
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"

static Rng rng;

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float q35_uniform(uint64_t seed, uint64_t step) {
    return (float)(mix64(mix64(seed) ^ step) >> 40) * (1.0f / 16777216.0f);
}

typedef struct Dev {
    float *logits, *max;
    StepParams *step;
    void *scratch;
    int *id;
} Dev;

static const float *g_logits;
static int cmp_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_logits[i] != g_logits[j]) return g_logits[i] > g_logits[j] ? -1 : 1;
    return i - j;
}

/* One device draw; returns the id (or -99 on a CUDA failure, already recorded). */
static int draw(Dev *d, const float *logits, int n_valid, const StepParams *sp, int blocks, int sentinel) {
    float mx = logits[0];
    for (int i = 1; i < n_valid; i++) mx = logits[i] > mx ? logits[i] : mx;
    int id = -99;
    CudaLaunch l = {0, 1, NULL, 0};
    SampleParams p;
    memset(&p, 0, sizeof p);
    p.logits = d->logits, p.n_valid = n_valid, p.step = d->step, p.max_logit = d->max, p.scratch = d->scratch;
    p.blocks = blocks, p.out_id = d->id;
    CU(cudaMemcpy(d->step, sp, sizeof *sp, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d->max, &mx, 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d->id, &sentinel, 4, cudaMemcpyHostToDevice));
    LAUNCH(cuda_sample(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(&id, d->id, 4, cudaMemcpyDeviceToHost));
done:
    return id;
}

/* Checks a device draw against the reference rules with slack; returns 1 if consistent. */
static int check_draw(const float *logits, int n_valid, const StepParams *sp, int id, int *order, const char *what) {
    float mx = logits[0];
    for (int i = 1; i < n_valid; i++) mx = logits[i] > mx ? logits[i] : mx;
    const float T = sp->temperature, cut = mx - 40.0f * T;
    int m = 0;
    for (int i = 0; i < n_valid; i++)
        if (logits[i] >= cut) order[m++] = i;
    g_logits = logits;
    qsort(order, (size_t)m, sizeof(int), cmp_desc);
    if (sp->top_k > 0 && sp->top_k < m) m = sp->top_k;
    double *cum = malloc(sizeof(double) * (size_t)(m + 1));
    cum[0] = 0;
    for (int j = 0; j < m; j++) cum[j + 1] = cum[j] + exp(((double)logits[order[j]] - mx) / T);
    int m_lo = m, m_hi = m;
    if (sp->top_p < 1.0f) {
        const double tgt = sp->top_p * cum[m];
        int lo = 1, hi = 1;
        while (lo < m && cum[lo] < tgt * (1 - 1e-4)) lo++;
        while (hi < m && cum[hi] < tgt * (1 + 1e-4)) hi++;
        m_lo = lo, m_hi = hi;
    }
    if (sp->min_p > 0.0f) {
        int lo = 1, hi = 1;
        while (lo < m && exp(((double)logits[order[lo]] - mx) / T) >= sp->min_p * (1 + 1e-4)) lo++;
        while (hi < m && exp(((double)logits[order[hi]] - mx) / T) >= sp->min_p * (1 - 1e-4)) hi++;
        m_lo = lo < m_lo ? lo : m_lo, m_hi = hi < m_hi ? hi : m_hi;
    }
    int j = -1;
    for (int t = 0; t < m_hi; t++)
        if (order[t] == id) j = t;
    int ok = 0;
    const double u = q35_uniform(sp->seed, sp->step);
    if (j >= 0)
        for (int mf = m_lo > j + 1 ? m_lo : j + 1; mf <= m_hi && !ok; mf++) {
            const double r = u * cum[mf], slack = 1e-4 * cum[mf];
            ok = cum[j] <= r + slack && r <= cum[j + 1] + slack;
        }
    if (!ok)
        fprintf(stderr, "  %s: id %d at sorted position %d, kept %d..%d of %d, u %.6f (T %g k %d p %g minp %g)\n", what,
                id, j, m_lo, m_hi, m, u, T, sp->top_k, sp->top_p, sp->min_p);
    free(cum);
    return ok;
}

static void fill_logits(float *l, int n, int kind) {
    for (int i = 0; i < n; i++) {
        if (kind == 0)
            l[i] = round_bf16(3.0f * rng_normal(&rng)); /* smooth */
        else
            l[i] = 0.5f * (float)(rng_u64(&rng) % 9); /* 9 values, many ties */
    }
}

static void test_rules(Dev *d, float *host, int *order, int V, int n_valid, int kind, int blocks) {
    static const float temps[] = {0.3f, 1.0f, 2.5f};
    static const int ks[] = {0, 1, 5, 50};
    static const float ps[] = {1.0f, 0.9f, 0.5f};
    static const float mps[] = {0.0f, 0.05f, 0.3f};
    fill_logits(host, V, kind);
    for (int i = n_valid; i < V; i++) host[i] = 100.0f; /* padding: must never be drawn */
    CU(cudaMemcpy(d->logits, host, sizeof(float) * V, cudaMemcpyHostToDevice));
    int n = 0, bad = 0, pad = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 3; c++)
                for (int e = 0; e < 3; e++, n++) {
                    StepParams sp;
                    memset(&sp, 0, sizeof sp);
                    sp.temperature = temps[a], sp.top_k = ks[b], sp.top_p = ps[c], sp.min_p = mps[e];
                    sp.seed = rng_u64(&rng), sp.step = (uint64_t)n;
                    int id = draw(d, host, n_valid, &sp, blocks, -7);
                    if (id == -99) return;
                    pad += id >= n_valid;
                    char what[64];
                    snprintf(what, sizeof what, "V %d kind %d blocks %d", V, kind, blocks);
                    bad += !check_draw(host, n_valid, &sp, id, order, what);
                    if (ks[b] == 1) { /* top-1 = argmax, smallest id among ties */
                        int best = 0;
                        for (int i = 1; i < n_valid; i++)
                            if (host[i] > host[best]) best = i;
                        CHECK(id == best, "top_k 1: id %d, argmax %d", id, best);
                    }
                }
    CHECK(bad == 0, "V %d kind %d blocks %d: %d of %d draws break the rules", V, kind, blocks, bad, n);
    CHECK(pad == 0, "V %d: %d draws in the padding", V, pad);
done:;
}

static void test_misc(Dev *d, float *host, int *order) {
    const int V = 3000;
    fill_logits(host, V, 0);
    CU(cudaMemcpy(d->logits, host, sizeof(float) * V, cudaMemcpyHostToDevice));
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = 0.0f, sp.top_p = 1.0f;
    CHECK(draw(d, host, V, &sp, 0, 1234) == 1234, "temperature 0 changed out_id");
    sp.temperature = 1.0f, sp.top_p = 0.95f, sp.top_k = 20, sp.seed = 42, sp.step = 7;
    int a = draw(d, host, V, &sp, 0, -7), b = draw(d, host, V, &sp, 3, -7);
    CHECK(a == b && a >= 0, "same (seed, step) gave %d and %d", a, b);
    CHECK(check_draw(host, V, &sp, a, order, "misc"), "misc draw");
done:;
}

/* Empirical distribution over a small vocabulary vs softmax(l / T). */
static void test_distribution(Dev *d, float *host) {
    const int V = 64, N = 20000;
    const float T = 0.8f;
    fill_logits(host, V, 0);
    CU(cudaMemcpy(d->logits, host, sizeof(float) * V, cudaMemcpyHostToDevice));
    int *hist = calloc(V, sizeof(int));
    double p[64], z = 0, mx = host[0];
    for (int i = 1; i < V; i++) mx = host[i] > mx ? host[i] : mx;
    for (int i = 0; i < V; i++) z += (p[i] = exp((host[i] - mx) / T));
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = T, sp.top_p = 1.0f, sp.seed = rng_u64(&rng);
    for (int s = 0; s < N; s++) {
        sp.step = (uint64_t)s;
        int id = draw(d, host, V, &sp, 1, -7);
        if (id < 0 || id >= V) {
            CHECK(0, "draw %d gave id %d", s, id);
            break;
        }
        hist[id]++;
    }
    int bad = 0;
    for (int i = 0; i < V; i++) {
        double q = p[i] / z, f = (double)hist[i] / N, sd = sqrt(q * (1 - q) / N);
        if (fabs(f - q) > 5 * sd + 1e-3) {
            if (bad < 4) fprintf(stderr, "  id %d: frequency %.4f, probability %.4f\n", i, f, q);
            bad++;
        }
    }
    CHECK(bad == 0, "distribution: %d ids off by more than 5 sigma", bad);
    free(hist);
done:;
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("sample");
    rng_seed(&rng, test_seed(argc, argv, "test_sample"));
    const int V = 248320;
    Dev d;
    memset(&d, 0, sizeof d);
    float *host = malloc(sizeof(float) * V);
    int *order = malloc(sizeof(int) * V);
    d.logits = dev_poison(sizeof(float) * V), d.max = dev_poison(4), d.step = dev_poison(sizeof(StepParams));
    d.id = dev_poison(4), d.scratch = dev_copy(NULL, cuda_sample_scratch_bytes(132));
    if (!d.logits || !d.max || !d.step || !d.id || !d.scratch) {
        CHECK(0, "device alloc");
        goto done;
    }
    CU(cudaMemset(d.scratch, 0, cuda_sample_scratch_bytes(132)));
    test_rules(&d, host, order, V, 248077, 0, 0);
    test_rules(&d, host, order, 5000, 4990, 1, 0);
    test_rules(&d, host, order, 5000, 5000, 1, 1);
    test_rules(&d, host, order, 777, 700, 0, 7);
    test_misc(&d, host, order);
    test_distribution(&d, host);
done:
    cudaFree(d.logits), cudaFree(d.max), cudaFree(d.step), cudaFree(d.id), cudaFree(d.scratch);
    free(host), free(order);
    return TEST_SUMMARY("sample");
}
