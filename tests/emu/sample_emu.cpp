/* sample_emu.cpp — the on-device sampler (src/cuda/sample.cu: histogram + two-level cut search, then the pick) on
 * the CPU through tests/emu/emu.h, against the sampling rules done in double precision over a full sort (the same
 * check as tests/gpu/test_sample.c: the id must be one the rules allow for u, with 1e-4 relative slack on the cuts
 * and the draw). Cases: smooth and heavily tied logits, padding, temperatures 0.3-2.5 and 1e30 (every bin of the
 * key range), top-k / top-p / min-p on and off, one value bin holding 70000 ids, non-finite max, temperature 0,
 * repeat determinism. Built and run by tests/emu/run_sample.sh. */
#define EMU_OWN_INT_SHFL
#include "emu.h"

#include <algorithm>
#include <time.h>
#include <unistd.h>
#include <vector>

/* the warp intrinsics sample.cu uses beyond emu.h's float shuffles: every lane posts its value in the warp's
 * exchange slots, one warp barrier, each lane reads what it needs, one more barrier */
template <typename F>
static inline uint32_t emu_warp_all(uint32_t mine, F f) {
    const int lane = me().tid & 31;
    emu_slot(lane)[0] = mine;
    emu_warp_bar();
    uint32_t v[32];
    for (int l = 0; l < 32; l++) v[l] = emu_slot(l)[0];
    emu_warp_bar();
    return f(v, lane);
}
static inline unsigned __ballot_sync(unsigned, int pred) {
    return emu_warp_all(pred != 0, [](const uint32_t *v, int) {
        unsigned m = 0;
        for (int l = 0; l < 32; l++) m |= (v[l] ? 1u : 0u) << l;
        return m;
    });
}
static inline unsigned __match_any_sync(unsigned, int key) {
    return emu_warp_all((uint32_t)key, [](const uint32_t *v, int lane) {
        unsigned m = 0;
        for (int l = 0; l < 32; l++) m |= (v[l] == v[lane] ? 1u : 0u) << l;
        return m;
    });
}
static inline int __reduce_add_sync(unsigned, int x) {
    return (int)emu_warp_all((uint32_t)x, [](const uint32_t *v, int) {
        uint32_t s = 0;
        for (int l = 0; l < 32; l++) s += v[l];
        return s;
    });
}
static inline int __reduce_max_sync(unsigned, int x) {
    return (int)emu_warp_all((uint32_t)x, [](const uint32_t *v, int) {
        int m = (int)v[0];
        for (int l = 1; l < 32; l++) m = std::max(m, (int)v[l]);
        return (uint32_t)m;
    });
}
static inline int __shfl_sync(unsigned, int x, int src) {
    return (int)emu_warp_all((uint32_t)x, [src](const uint32_t *v, int) { return v[src & 31]; });
}
static inline float __shfl_down_sync(unsigned, float x, int d) {
    const int lane = me().tid & 31;
    return emu_shfl(x, lane + d < 32 ? lane + d : lane);
}
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
template <typename T>
static inline T __ldcg(const T *p) {
    return *p;
}
#undef __shared__
#define __shared__ static /* one CTA runs at a time: a function's statics are its shared memory */

#include "cuda/ops.h"
#include "sample.inc"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}
static float round_bf16(float x) { return rbf(x); }

struct Dev {
    std::vector<float> logits;
    std::vector<uint8_t> scratch;
    StepParams sp;
    float mx;
    int id;
};

/* count: run kernel 0 first (as the launcher does); without it every row takes the full histogram */
static int draw(Dev &d, int n_valid, int blocks, bool count = true) {
    SampleParams p;
    memset(&p, 0, sizeof p);
    d.mx = -INFINITY;
    for (int i = 0; i < n_valid; i++) d.mx = d.logits[i] > d.mx || i == 0 ? d.logits[i] : d.mx;
    p.logits = d.logits.data(), p.n_valid = n_valid, p.step = &d.sp, p.max_logit = &d.mx;
    p.scratch = d.scratch.data(), p.out_id = &d.id;
    if (blocks <= 0)
        blocks = std::min(SM_MAX_BLOCKS, (n_valid + SM_THREADS * SM_PER_THREAD - 1) / (SM_THREADS * SM_PER_THREAD));
    if (count)
        emu_launch(dim3(blocks), SM_THREADS, 0, 1, [&] { sample_count_bf16(p); });
    else /* what kernel 0 does for a row without top-k */
        ((SampleScratch *)d.scratch.data())->n_list = 0;
    emu_launch(dim3(blocks), SM_THREADS, SM_WINDOW * 4, 1, [&] { sample_hist_bf16(p); });
    emu_launch(dim3(blocks), SM_THREADS, 0, 1, [&] { sample_pick_bf16(p); });
    return d.id;
}

static double q35_u(uint64_t seed, uint64_t step) { return (double)q35_uniform(seed, step); }

/* tests/gpu/test_sample.c's check_draw */
static bool check_draw(const std::vector<float> &lg, int n_valid, const StepParams &sp, int id, const char *what) {
    float mx = lg[0];
    for (int i = 1; i < n_valid; i++) mx = lg[i] > mx ? lg[i] : mx;
    const float T = sp.temperature, cut = mx - 40.0f * T;
    std::vector<int> order;
    for (int i = 0; i < n_valid; i++)
        if (lg[i] >= cut) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lg[a] != lg[b] ? lg[a] > lg[b] : a < b; });
    int m = (int)order.size();
    if (sp.top_k > 0 && sp.top_k < m) m = sp.top_k;
    std::vector<double> cum(m + 1, 0.0);
    for (int j = 0; j < m; j++) cum[j + 1] = cum[j] + exp(((double)lg[order[j]] - mx) / T);
    int m_lo = m, m_hi = m;
    if (sp.top_p < 1.0f) {
        const double tgt = sp.top_p * cum[m];
        int lo = 1, hi = 1;
        while (lo < m && cum[lo] < tgt * (1 - 1e-4)) lo++;
        while (hi < m && cum[hi] < tgt * (1 + 1e-4)) hi++;
        m_lo = lo, m_hi = hi;
    }
    if (sp.min_p > 0.0f) {
        int lo = 1, hi = 1;
        while (lo < m && exp(((double)lg[order[lo]] - mx) / T) >= sp.min_p * (1 + 1e-4)) lo++;
        while (hi < m && exp(((double)lg[order[hi]] - mx) / T) >= sp.min_p * (1 - 1e-4)) hi++;
        m_lo = std::min(lo, m_lo), m_hi = std::min(hi, m_hi);
    }
    int j = -1;
    for (int t = 0; t < m_hi; t++)
        if (order[t] == id) j = t;
    bool ok = false;
    const double u = q35_u(sp.seed, sp.step);
    if (j >= 0)
        for (int mf = std::max(m_lo, j + 1); mf <= m_hi && !ok; mf++) {
            const double r = u * cum[mf], slack = 1e-4 * cum[mf];
            ok = cum[j] <= r + slack && r <= cum[j + 1] + slack;
        }
    if (!ok)
        fprintf(stderr, "  %s: id %d at sorted position %d, kept %d..%d of %d, u %.6f (T %g k %d p %g minp %g)\n", what,
                id, j, m_lo, m_hi, m, u, T, sp.top_k, sp.top_p, sp.min_p);
    return ok;
}

static int n_pass, n_fail;
#define CHECK(c, ...)                                                                                                  \
    do {                                                                                                               \
        if (c)                                                                                                         \
            n_pass++;                                                                                                  \
        else {                                                                                                         \
            n_fail++;                                                                                                  \
            fprintf(stderr, "FAIL %d: ", __LINE__);                                                                    \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
        }                                                                                                              \
    } while (0)

static void fill(Dev &d, int V, int kind) {
    d.logits.assign(V, 0.0f);
    for (int i = 0; i < V; i++) {
        if (kind == 0) { /* smooth: ~N(0, 3) */
            double a = ((rnd() >> 11) + 0.5) * 0x1.0p-53, b = ((rnd() >> 11) + 0.5) * 0x1.0p-53;
            d.logits[i] = round_bf16((float)(3.0 * sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b)));
        } else { /* 9 values, many ties */
            d.logits[i] = 0.5f * (float)(rnd() % 9);
        }
    }
}

static void rules(Dev &d, int V, int n_valid, int kind, int blocks, int n_combo) {
    static const float temps[] = {0.3f, 1.0f, 2.5f};
    static const int ks[] = {0, 1, 5, 50, 2000}; /* 2000 on smooth logits: no window holds it (the full histogram) */
    static const float ps[] = {1.0f, 0.9f, 0.5f};
    static const float mps[] = {0.0f, 0.05f, 0.3f};
    fill(d, V, kind);
    for (int i = n_valid; i < V; i++) d.logits[i] = 1e4f; /* padding: larger than any valid logit */
    int bad = 0, pad = 0, differ = 0;
    for (int c = 0; c < n_combo; c++) {
        const int t = (int)(rnd() % 3), k = (int)(rnd() % 5), pp = (int)(rnd() % 3), mp = (int)(rnd() % 3);
        memset(&d.sp, 0, sizeof d.sp);
        d.sp.temperature = temps[t], d.sp.top_k = ks[k], d.sp.top_p = ps[pp], d.sp.min_p = mps[mp];
        d.sp.seed = rnd(), d.sp.step = (uint64_t)c;
        const int id = draw(d, n_valid, blocks);
        /* top-k rows count one of kernel 0's windows only: the draw must be the full histogram's */
        differ += draw(d, n_valid, blocks, false) != id;
        if (id < 0 || id >= n_valid) {
            pad++;
            continue;
        }
        char what[96];
        snprintf(what, sizeof what, "V %d kind %d combo %d", V, kind, c);
        bad += !check_draw(d.logits, n_valid, d.sp, id, what);
    }
    CHECK(bad == 0, "V %d kind %d blocks %d: %d of %d draws break the rules", V, kind, blocks, bad, n_combo);
    CHECK(pad == 0, "V %d: %d draws outside [0, n_valid)", V, pad);
    CHECK(differ == 0, "V %d kind %d: %d of %d windowed draws differ from the full histogram's", V, kind, differ,
          n_combo);
}

/* Kernel 0's counts against the host's: the candidates of each window SM_WIN0 4^j below the max's value bin (d =
 * key16(max) - key16(logit) counts bf16 values). Then the draw's kernels zero them for the next call. */
static void window_counts(Dev &d) {
    fill(d, 5000, 0);
    memset(&d.sp, 0, sizeof d.sp);
    d.sp.temperature = 0.7f, d.sp.top_k = 20, d.sp.top_p = 1.0f, d.sp.seed = 11;
    SampleParams p;
    memset(&p, 0, sizeof p);
    d.mx = *std::max_element(d.logits.begin(), d.logits.end());
    p.logits = d.logits.data(), p.n_valid = 5000, p.step = &d.sp, p.max_logit = &d.mx;
    p.scratch = d.scratch.data(), p.out_id = &d.id;
    emu_launch(dim3(3), SM_THREADS, 0, 1, [&] { sample_count_bf16(p); });
    const SampleScratch *sc = (const SampleScratch *)d.scratch.data();
    int bad = 0, top = key16(d.mx);
    for (int j = 0; j < SM_NWIN; j++) {
        int n = 0;
        for (float v : d.logits) n += v >= d.mx - 40.0f * 0.7f && top - key16(v) < (SM_WIN0 << 2 * j);
        bad += sc->win[j] != n;
        if (sc->win[j] != n) fprintf(stderr, "  window %d: %d candidates counted, %d there\n", j, sc->win[j], n);
    }
    CHECK(bad == 0 && sc->win[0] < 20 && sc->win[SM_NWIN - 1] >= 20, "kernel 0's window counts");
    int listed = 0; /* the smallest window holding top_k: kernel 1 lists its candidates */
    for (int j = SM_NWIN - 1; j >= 0; j--)
        if (sc->win[j] >= 20) listed = sc->win[j];
    int first = -1;
    for (int rep = 0; rep < 2; rep++) { /* twice: the second call's list must not keep the first's */
        if (rep) emu_launch(dim3(3), SM_THREADS, 0, 1, [&] { sample_count_bf16(p); });
        emu_launch(dim3(3), SM_THREADS, SM_WINDOW * 4, 1, [&] { sample_hist_bf16(p); });
        CHECK(listed <= SM_LIST && sc->n_list == listed, "call %d: kernel 1 listed %d candidates, the window holds %d",
              rep, sc->n_list, listed);
        emu_launch(dim3(3), SM_THREADS, 0, 1, [&] { sample_pick_bf16(p); });
        CHECK(check_draw(d.logits, 5000, d.sp, d.id, "windowed"), "windowed draw");
        CHECK(rep == 0 || d.id == first, "the same draw twice gave %d and %d", first, d.id);
        first = d.id;
    }
    int nz = sc->done2 != 0;
    for (int j = 0; j < SM_NWIN; j++) nz += sc->win[j] != 0;
    CHECK(nz == 0, "%d window counts or counters left non-zero", nz);
}

/* Several rows in one launch (the batched step's use): rows with their own configs, max_logit NULL (out_id holds each
 * row's argmax on entry) and lp (the argmax's log-softmax on entry), the histogram on 3 blocks per row and the pick
 * on 2. Each row's draw must be the single-row draw of
 * the same row (the result depends on the row alone), a temperature-0 row keeps its argmax and lp, and a sampled
 * row's lp becomes its id's log-softmax. */
static void rows_check(void) {
    const int R = 4, V = 2000, ld = 2048;
    std::vector<float> lg((size_t)R * ld, 0.0f);
    std::vector<StepParams> sp(R);
    std::vector<int> id(R), want(R);
    std::vector<float> lp(R), lse(R);
    Dev d;
    d.scratch.assign(sizeof(SampleScratch), 0);
    for (int r = 0; r < R; r++) {
        fill(d, V, r & 1);
        memcpy(&lg[(size_t)r * ld], d.logits.data(), sizeof(float) * V);
        memset(&sp[r], 0, sizeof sp[r]);
        sp[r].temperature = r == 2 ? 0.0f : 0.5f + r, sp[r].top_p = r == 1 ? 0.8f : 1.0f, sp[r].top_k = r == 3 ? 7 : 0;
        sp[r].seed = rnd(), sp[r].step = (uint64_t)r;
        d.sp = sp[r];
        int am = 0;
        double sum = 0;
        for (int i = 1; i < V; i++) am = d.logits[i] > d.logits[am] ? i : am;
        for (int i = 0; i < V; i++) sum += exp((double)d.logits[i] - d.logits[am]);
        lse[r] = (float)(d.logits[am] + log(sum));
        id[r] = am, lp[r] = d.logits[am] - lse[r];
        d.id = am;
        want[r] = sp[r].temperature > 0 ? draw(d, V, 0) : am;
    }
    std::vector<uint8_t> scratch(sizeof(SampleScratch) * R, 0);
    SampleParams p;
    memset(&p, 0, sizeof p);
    p.logits = lg.data(), p.n_valid = V, p.rows = R, p.ld = ld, p.step = sp.data(), p.scratch = scratch.data();
    p.out_id = id.data(), p.lp = lp.data();
    /* the histogram on more blocks than the pick (the launcher gives them different counts for many rows) */
    emu_launch(dim3(2, R), SM_THREADS, 0, 1, [&] { sample_count_bf16(p); });
    emu_launch(dim3(3, R), SM_THREADS, SM_WINDOW * 4, 1, [&] { sample_hist_bf16(p); });
    emu_launch(dim3(2, R), SM_THREADS, 0, 1, [&] { sample_pick_bf16(p); });
    for (int r = 0; r < R; r++) {
        CHECK(id[r] == want[r], "row %d of %d: drew %d, the single-row draw %d", r, R, id[r], want[r]);
        const float l = id[r] >= 0 && id[r] < V ? lg[(size_t)r * ld + id[r]] : NAN;
        CHECK(fabsf(lp[r] - (l - lse[r])) <= 1e-5f * (1.0f + fabsf(lse[r])), "row %d: logprob %g, expected %g", r,
              lp[r], l - lse[r]);
    }
}

int main(int argc, char **argv) {
    rs = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
    rs |= 1;
    printf("sampler (src/cuda/sample.cu) under the CUDA emulation, seed %llu (replay: tests/emu/run_sample.sh %llu)\n",
           (unsigned long long)rs, (unsigned long long)rs);
    Dev d;
    d.scratch.assign(sizeof(SampleScratch), 0);
    rules(d, 3000, 2990, 0, 0, 6);
    rules(d, 3000, 3000, 1, 1, 5);
    rules(d, 777, 700, 0, 7, 6);
    /* every bin of the key range: an enormous temperature puts the cut below the lowest finite value */
    fill(d, 3000, 0);
    memset(&d.sp, 0, sizeof d.sp);
    d.sp.temperature = 1e30f, d.sp.top_p = 0.7f, d.sp.seed = 7, d.sp.step = 1;
    CHECK(check_draw(d.logits, 3000, d.sp, draw(d, 3000, 0), "T 1e30"), "T 1e30 draw");
    /* one value bin with 70000 ids (more than 16 bits) and a few above it */
    d.logits.assign(70010, 1.0f);
    for (int i = 0; i < 10; i++) d.logits[i * 7001] = 2.0f + i;
    for (int k : {69999}) {
        memset(&d.sp, 0, sizeof d.sp);
        d.sp.temperature = 1.0f, d.sp.top_k = k, d.sp.top_p = 0.99f, d.sp.seed = 3 + k, d.sp.step = 2;
        CHECK(check_draw(d.logits, 70010, d.sp, draw(d, 70010, 0), "70000 ties"), "70000 ties, top_k %d", k);
    }
    /* cuts that leave one id whatever u is: min-p (the others weigh e^-1 < 0.5 each, but 999 of them), top-p (the
     * others' 4.5e-5 each sum to 0.045 < 10 % of the mass) */
    for (int c = 0; c < 2; c++) {
        d.logits.assign(1000, c ? 0.0f : -1.0f);
        d.logits[500] = c ? 10.0f : 0.0f;
        memset(&d.sp, 0, sizeof d.sp);
        d.sp.temperature = 1.0f, d.sp.top_p = c ? 0.9f : 1.0f, d.sp.min_p = c ? 0.0f : 0.5f;
        for (int s = 0; s < 2; s++) {
            d.sp.seed = rnd(), d.sp.step = (uint64_t)s;
            const int id = draw(d, 1000, 0);
            CHECK(id == 500, "%s leaves one id: drew %d", c ? "top-p 0.9" : "min-p 0.5", id);
        }
    }
    /* temperature 0: out_id untouched; non-finite max: no candidates, out_id untouched */
    fill(d, 1000, 0);
    memset(&d.sp, 0, sizeof d.sp);
    d.sp.top_p = 1.0f;
    d.id = 1234;
    CHECK(draw(d, 1000, 0) == 1234, "temperature 0 changed out_id");
    d.sp.temperature = 1.0f, d.logits[5] = NAN, d.logits[6] = NAN;
    std::vector<float> keep = d.logits;
    for (float &v : d.logits) v = NAN;
    d.id = 4321;
    CHECK(draw(d, 1000, 0) == 4321, "all-NaN logits changed out_id (%d)", d.id);
    d.logits = keep;
    d.logits[5] = d.logits[6] = 0.0f;
    /* repeat determinism, and the scratch left reusable (a second draw with other logits) */
    d.sp.top_k = 0, d.sp.top_p = 0.9f, d.sp.min_p = 0.01f, d.sp.seed = 99, d.sp.step = 5;
    const int a = draw(d, 1000, 0), b = draw(d, 1000, 0);
    CHECK(a == b && check_draw(d.logits, 1000, d.sp, a, "repeat"), "same (seed, step) gave %d and %d", a, b);
    const SampleScratch *sc = (const SampleScratch *)d.scratch.data();
    CHECK(sc->done1 == 0 && sc->done2 == 0, "the last-block counters are left at %u / %u", sc->done1, sc->done2);
    int nz = 0;
    for (int i = 0; i < SM_BINS; i++) nz += sc->hist[i] != 0;
    CHECK(nz == 0, "%d histogram bins left non-zero", nz);
    window_counts(d);
    rows_check();
    printf("sample_emu: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
