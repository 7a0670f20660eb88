/* test_sampler.c — host sampling: argmax ties and padding, penalties, top-k/top-p/min-p
 * support sets, and empirical frequencies vs the softmax they should follow. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "test.h"

/* The comparison sort the sampler used for every row before its radix sort for large candidate sets: the order
 * (probability descending, id ascending) and everything after it, as a reference for sampler_sample on rows with
 * many candidates. Draws from s->rng like sampler_sample. */
static int ref_cmp(const void *a, const void *b, void *p) {
    const float *prob = p;
    const float x = prob[*(const int *)a], y = prob[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}
static int ref_sample(Sampler *s, const float *logits) {
    const Q35Sampling *c = &s->cfg;
    const int n = s->n_valid;
    float mx = logits[sampler_argmax(logits, n)];
    const float cut = mx - 40.0f * c->temperature;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= cut) s->cand[m++] = i;
    double sum = 0;
    for (int j = 0; j < m; j++) sum += s->prob[s->cand[j]] = expf((logits[s->cand[j]] - mx) / c->temperature);
    for (int j = 0; j < m; j++) s->prob[s->cand[j]] = (float)(s->prob[s->cand[j]] / sum);
    qsort_r(s->cand, (size_t)m, sizeof(int), ref_cmp, s->prob);
    if (c->top_k > 0 && c->top_k < m) m = c->top_k;
    if (c->top_p < 1.0f) {
        double mass = 0, acc = 0;
        for (int j = 0; j < m; j++) mass += s->prob[s->cand[j]];
        int k = 0;
        while (k < m) {
            acc += s->prob[s->cand[k++]];
            if (acc >= c->top_p * mass) break;
        }
        m = k;
    }
    if (c->min_p > 0.0f) {
        const float thr = c->min_p * s->prob[s->cand[0]];
        int k = 1;
        while (k < m && s->prob[s->cand[k]] >= thr) k++;
        m = k;
    }
    double tot = 0, acc = 0;
    for (int j = 0; j < m; j++) tot += s->prob[s->cand[j]];
    const double r = rng_uniform(&s->rng) * tot;
    for (int j = 0; j < m; j++) {
        acc += s->prob[s->cand[j]];
        if (r < acc) return s->cand[j];
    }
    return s->cand[m - 1];
}

/* Whether samplers a and b (vocabularies of at most 8) draw the same ids for `steps` draws, each from its own copy of
 * the n logits (the sampler may change the row it is given). */
static int same_draws(Sampler *a, Sampler *b, const float *logits, int n, int steps) {
    int same = 1;
    for (int t = 0; t < steps; t++) {
        float w1[8] = {0}, w2[8] = {0};
        memcpy(w1, logits, sizeof(float) * (size_t)n);
        memcpy(w2, logits, sizeof(float) * (size_t)n);
        same &= sampler_sample(a, w1) == sampler_sample(b, w2);
    }
    return same;
}

static Q35Sampling base(void) {
    Q35Sampling s;
    memset(&s, 0, sizeof s);
    s.top_p = 1;
    s.repetition_penalty = 1;
    s.seed = 7;
    return s;
}

int main(void) {
    Err err = {0};
    float l[8] = {1, 3, 3, 0, -1, 2, 9, 9};
    CHECK(sampler_argmax(l, 6) == 1, "ties -> smallest id, padding [6,8) excluded: got %d", sampler_argmax(l, 6));

    Sampler s;
    Q35Sampling c = base();
    CHECK(sampler_init(&s, &c, 8, 6, &err) == 0, "%s", err.msg);
    float g[8];
    memcpy(g, l, sizeof g);
    CHECK(sampler_sample(&s, g) == 1, "greedy");
    sampler_free(&s);

    /* logit bias: added before the penalties; -100 bans the argmax, +100 forces an id at any temperature; ids out of
     * the vocabulary and non-finite values refused */
    c = base();
    c.repetition_penalty = 2.0f;
    sampler_init(&s, &c, 8, 6, &err);
    sampler_observe(&s, 1, 0);
    const int bid[2] = {1, 4};
    const float bv[2] = {3.0f, -100.0f};
    CHECK(sampler_set_bias(&s, bid, bv, 2, &err) == 0, "%s", err.msg);
    memcpy(g, l, sizeof g);
    const int pick = sampler_sample(&s, g);
    CHECK(fabsf(g[1] - 3.0f) < 1e-6f && fabsf(g[4] + 101.0f) < 1e-6f && pick == 1,
          "bias then repetition penalty: (3 + 3) / 2 = %g, %g, id %d", g[1], g[4], pick);
    const int ban[1] = {1};
    const float bv2[1] = {-100.0f};
    sampler_set_bias(&s, ban, bv2, 1, &err);
    memcpy(g, l, sizeof g);
    CHECK(sampler_sample(&s, g) == 2, "the banned argmax gives way to id 2");
    const int bad_id[1] = {8};
    const float nan1[1] = {NAN};
    CHECK(sampler_set_bias(&s, bad_id, bv2, 1, &err) == Q35_ERR_ARG, "id past the vocabulary refused");
    CHECK(sampler_set_bias(&s, ban, nan1, 1, &err) == Q35_ERR_ARG, "NaN bias refused");
    sampler_free(&s);
    c = base();
    c.temperature = 1.5f;
    sampler_init(&s, &c, 8, 6, &err);
    const int force[1] = {3};
    const float up[1] = {100.0f};
    sampler_set_bias(&s, force, up, 1, &err);
    int forced = 0;
    for (int t = 0; t < 200; t++) {
        memcpy(g, l, sizeof g);
        forced += sampler_sample(&s, g) == 3;
    }
    CHECK(forced == 200, "+100 forces id 3 at temperature 1.5: %d / 200", forced);
    sampler_free(&s);

    /* min_tokens: the banned ids are not drawn until that many generated ids were observed (prompt ids do not
     * count); id 6 is the best of the valid ids [0, 6) plus padding, so l[1] = 3 is the argmax after the ban */
    c = base();
    sampler_init(&s, &c, 8, 6, &err);
    const int stop1[1] = {1};
    CHECK(sampler_set_ban(&s, stop1, 1, 2, &err) == 0, "%s", err.msg);
    sampler_observe(&s, 0, 0); /* a prompt id */
    int seq[3];
    for (int t = 0; t < 3; t++) {
        memcpy(g, l, sizeof g);
        seq[t] = sampler_sample(&s, g);
        sampler_observe(&s, seq[t], 1);
    }
    CHECK(seq[0] == 2 && seq[1] == 2 && seq[2] == 1, "banned twice, then drawn: %d %d %d", seq[0], seq[1], seq[2]);
    const int bad_ban[1] = {9};
    CHECK(sampler_set_ban(&s, bad_ban, 1, 1, &err) == Q35_ERR_ARG, "a ban outside the vocabulary refused");
    sampler_free(&s);

    /* repetition penalty (HF: divide positive, multiply negative) and presence penalty */
    c = base();
    c.repetition_penalty = 2.0f;
    c.presence_penalty = 0.6f;
    sampler_init(&s, &c, 8, 6, &err);
    sampler_observe(&s, 1, 0); /* prompt id: repetition only */
    sampler_observe(&s, 2, 1); /* generated: both */
    memcpy(g, l, sizeof g);
    int id = sampler_sample(&s, g);
    CHECK(g[1] == 1.5f && g[2] == round_bf16(1.5f - 0.6f) && g[2] != 1.5f - 0.6f,
          "penalties, the changed logits bf16-rounded: %.9g %.9g", g[1], g[2]);
    CHECK(id == 5, "after penalties the best is id 5, got %d", id);
    sampler_free(&s);

    /* empirical frequencies at temperature 1 vs softmax over the valid ids */
    float z[6] = {0.5f, 1.0f, -0.5f, 2.0f, 0.0f, 1.5f};
    double p[6], sum = 0;
    for (int i = 0; i < 6; i++) sum += p[i] = exp(z[i]);
    for (int i = 0; i < 6; i++) p[i] /= sum;
    c = base();
    c.temperature = 1.0f;
    sampler_init(&s, &c, 8, 6, &err);
    int cnt[8] = {0}, N = 200000;
    for (int t = 0; t < N; t++) {
        float w[8] = {z[0], z[1], z[2], z[3], z[4], z[5], 50, 50};
        cnt[sampler_sample(&s, w)]++;
    }
    double maxdev = 0;
    for (int i = 0; i < 6; i++) maxdev = fmax(maxdev, fabs(cnt[i] / (double)N - p[i]));
    CHECK(maxdev < 0.006, "frequencies vs softmax: max deviation %g", maxdev);
    CHECK(cnt[6] == 0 && cnt[7] == 0, "padding ids never sampled");
    sampler_free(&s);

    /* top-k = 2 keeps {3, 5}; top-p 0.5 keeps the smallest prefix reaching half the mass; min-p */
    c = base();
    c.temperature = 1.0f;
    c.top_k = 2;
    sampler_init(&s, &c, 8, 6, &err);
    int bad = 0;
    for (int t = 0; t < 2000; t++) {
        float w[8] = {z[0], z[1], z[2], z[3], z[4], z[5], 0, 0};
        int k = sampler_sample(&s, w);
        bad += k != 3 && k != 5;
    }
    CHECK(bad == 0, "top-k 2 sampled %d ids outside {3,5}", bad);
    sampler_free(&s);
    c.top_k = 0;
    c.top_p = 0.3f; /* p[3] ~ 0.37 > 0.3: only id 3 */
    sampler_init(&s, &c, 8, 6, &err);
    bad = 0;
    for (int t = 0; t < 2000; t++) {
        float w[8] = {z[0], z[1], z[2], z[3], z[4], z[5], 0, 0};
        bad += sampler_sample(&s, w) != 3;
    }
    CHECK(bad == 0, "top-p 0.3 sampled %d ids other than 3", bad);
    sampler_free(&s);
    c.top_p = 1;
    c.min_p = 0.5f; /* keeps ids with p >= 0.5 p_max: 3 (1.0) and 5 (e^-0.5 = 0.61) */
    sampler_init(&s, &c, 8, 6, &err);
    bad = 0;
    for (int t = 0; t < 2000; t++) {
        float w[8] = {z[0], z[1], z[2], z[3], z[4], z[5], 0, 0};
        int k = sampler_sample(&s, w);
        bad += k != 3 && k != 5;
    }
    CHECK(bad == 0, "min-p 0.5 sampled %d ids outside {3,5}", bad);
    sampler_free(&s);

    /* same seed, same stream */
    c = base();
    c.temperature = 0.8f;
    Sampler a, b;
    sampler_init(&a, &c, 8, 6, &err);
    sampler_init(&b, &c, 8, 6, &err);
    CHECK(same_draws(&a, &b, z, 6, 100), "same seed gives the same ids");
    sampler_free(&a);
    sampler_free(&b);

    /* near-flat rows of 20000 ids (the radix-sorted path: thousands of candidates), many tying probabilities and many
     * close ones: the same ids as the comparison sort's reference, draw for draw */
    {
        const int NV = 20000;
        float *row = malloc(sizeof(float) * NV), *w = malloc(sizeof(float) * NV);
        Rng gr;
        rng_seed(&gr, 99);
        for (int i = 0; i < NV; i++) /* half on a grid (ties), half continuous (neighbours differ in the low bits) */
            row[i] = i % 2 ? 0.05f * (float)(int)(rng_uniform(&gr) * 64.0) : (float)(3.2 * rng_uniform(&gr));
        const float cfg[][4] = {{1.0f, 0, 1.0f, 0},
                                {0.7f, 0, 0.9f, 0},
                                {1.3f, 3000, 1.0f, 0},
                                {1.0f, 0, 0.95f, 0.5f},
                                {2.0f, 10000, 0.5f, 0.05f}};
        int diff = 0, draws = 0;
        for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
            c = base();
            c.temperature = cfg[k][0], c.top_k = (int)cfg[k][1], c.top_p = cfg[k][2], c.min_p = cfg[k][3];
            c.seed = 11 + (uint64_t)k;
            sampler_init(&a, &c, NV, NV - 7, &err);
            sampler_init(&b, &c, NV, NV - 7, &err);
            for (int t = 0; t < 60; t++, draws++) {
                memcpy(w, row, sizeof(float) * NV);
                const int got = sampler_sample(&a, w), want = ref_sample(&b, row);
                diff += got != want;
            }
            sampler_free(&a);
            sampler_free(&b);
        }
        CHECK(diff == 0, "flat 20000-id rows: %d of %d draws differ from the comparison-sort reference", diff, draws);
        free(row), free(w);
    }

    /* counter draws (sampler_sample_at, the devices' u): counter_uniform is the CUDA sampler's q35_uniform, written
     * out here from its definition; a draw depends on (seed, step) alone (not on the draws before); the frequencies
     * over many steps follow softmax */
    {
        const uint64_t seeds[] = {0, 1, 42, 0xfedcba9876543210ull};
        int bad = 0;
        for (int k = 0; k < 4; k++)
            for (uint64_t st = 0; st < 50; st++) {
                uint64_t z = seeds[k] + 0x9e3779b97f4a7c15ull;
                z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
                z = (z ^ (z >> 31)) ^ st;
                z += 0x9e3779b97f4a7c15ull;
                z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
                z ^= z >> 31;
                bad += counter_uniform(seeds[k], st) != (float)(z >> 40) * (1.0f / 16777216.0f);
            }
        CHECK(bad == 0, "counter_uniform differs from the definition in %d of 200 cases", bad);
        c = base();
        c.temperature = 1.0f, c.seed = 5;
        sampler_init(&a, &c, 8, 6, &err);
        sampler_init(&b, &c, 8, 6, &err);
        int ca[8] = {0}, order_free = 1;
        const int NS = 100000;
        for (int t = 0; t < NS; t++) {
            float w1[8] = {z[0], z[1], z[2], z[3], z[4], z[5], 50, 50}, w2[8];
            memcpy(w2, w1, sizeof w1);
            const int id = sampler_sample_at(&a, w1, (uint64_t)t);
            ca[id]++;
            if (t % 1000 == 0) order_free &= sampler_sample_at(&b, w2, (uint64_t)t) == id; /* b skips steps */
        }
        double dev = 0;
        for (int i = 0; i < 6; i++) dev = fmax(dev, fabs(ca[i] / (double)NS - p[i]));
        CHECK(order_free, "a counter draw depends on the draws before it");
        CHECK(dev < 0.008 && ca[6] == 0 && ca[7] == 0, "counter draws vs softmax: max deviation %g", dev);
        sampler_free(&a);
        sampler_free(&b);
    }

    c = base();
    c.top_p = 0;
    CHECK(sampler_init(&s, &c, 8, 6, &err) == Q35_ERR_ARG && strstr(err.msg, "top_p"), "bad top_p rejected: %s",
          err.msg);

    /* sampler_reset: a sampler used with penalties, bias, a ban and a frequency penalty, then reset to plain settings
     * with a seed, keeps its buffers and draws as a fresh one does (nothing seen, no bias / ban / counts); a bad
     * setting is refused; another vocabulary size allocates anew */
    {
        Sampler a, f;
        c = base();
        c.repetition_penalty = 2.0f, c.presence_penalty = 1.0f, c.frequency_penalty = 1.0f;
        sampler_init(&a, &c, 8, 6, &err);
        const int bid[1] = {2}, stop[1] = {1};
        const float bv[1] = {-50.0f};
        sampler_set_bias(&a, bid, bv, 1, &err);
        sampler_set_ban(&a, stop, 1, 3, &err);
        for (int i = 0; i < 6; i++) sampler_observe(&a, i, i & 1);
        const unsigned char *kept = a.seen;
        c = base();
        c.temperature = 0.9f, c.seed = 11;
        CHECK(sampler_reset(&a, &c, 8, 6, &err) == 0 && a.seen == kept && !a.n_pen && !a.tracking && !a.n_bias &&
                  !a.n_ban,
              "reset keeps the buffers, drops bias / ban / the list of logit changes: %s", err.msg);
        int seen_left = 0;
        for (int i = 0; i < 8; i++) seen_left += a.seen[i] != 0;
        CHECK(seen_left == 0, "reset clears what was seen (%d ids left)", seen_left);
        sampler_init(&f, &c, 8, 6, &err);
        CHECK(same_draws(&a, &f, l, 8, 50), "a reset sampler draws as a fresh one");
        c.top_p = 0;
        CHECK(sampler_reset(&a, &c, 8, 6, &err) == Q35_ERR_ARG, "reset refuses a bad setting");
        c = base();
        CHECK(sampler_reset(&a, &c, 16, 16, &err) == 0 && a.n_vocab == 16, "reset to another vocabulary: %s", err.msg);
        sampler_free(&a);
        sampler_free(&f);
    }
    /* sampler_penalties: each id once (a seen id with a bias is one entry), flags and counts as observed, the ban only
     * while it runs, bias duplicates keeping the later value; applying the list is the rule written out per id */
    {
        c = base();
        c.repetition_penalty = 1.3f, c.presence_penalty = 0.7f, c.frequency_penalty = 0.45f;
        const int V = 4000;
        sampler_init(&s, &c, V, V - 10, &err);
        const int bid[3] = {7, 3999, 7}, stop[2] = {5, 5};
        const float bv[3] = {3.0f, -2.5f, -1.25f};
        sampler_set_bias(&s, bid, bv, 3, &err);
        sampler_set_ban(&s, stop, 2, 401, &err); /* one generated id more than the 400 below */
        uint64_t rs = 99;
        int gen_count[4000] = {0}, seen[4000] = {0};
        for (int t = 0; t < 600; t++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            const int id = (int)((rs >> 33) % 300), g = t >= 200;
            sampler_observe(&s, id, g);
            seen[id] |= 1 | (g ? 2 : 0);
            gen_count[id] += g;
        }
        const SamplePenalty *pe;
        int n = sampler_penalties(&s, &pe), dup = 0, bad = 0, n_seen = 0;
        for (int i = 0; i < V; i++) n_seen += seen[i] != 0;
        unsigned char once[4000] = {0};
        for (int k = 0; k < n; k++) {
            const SamplePenalty *e = &pe[k];
            dup += once[e->id]++ != 0;
            const unsigned want = (seen[e->id] ? PEN_SEEN : 0) | (seen[e->id] & 2 ? PEN_GEN : 0) |
                                  (e->id == 7 || e->id == 3999 ? PEN_BIAS : 0) | (e->id == 5 ? PEN_BAN : 0);
            bad += e->flags != want || e->count != gen_count[e->id] || (e->id == 7 && e->bias != -1.25f) ||
                   (e->id == 3999 && e->bias != -2.5f);
        }
        CHECK(n == n_seen + (seen[3999] ? 0 : 1) + (seen[7] ? 0 : 1) + (seen[5] ? 0 : 1) && !dup && !bad,
              "penalty list: %d entries (%d ids seen), %d twice, %d wrong", n, n_seen, dup, bad);
        /* the list applied vs the rule per id (fp32 in the host's order, then bf16) on a random row */
        float *row = malloc(sizeof(float) * V), *want = malloc(sizeof(float) * V);
        for (int i = 0; i < V; i++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            row[i] = want[i] = round_bf16((float)((double)(rs >> 11) / 9007199254740992.0 * 20.0 - 10.0));
        }
        for (int i = 0; i < V; i++) {
            float v = want[i];
            if (!seen[i] && i != 7 && i != 3999 && i != 5) continue;
            if (i == 7) v += -1.25f;
            if (i == 3999) v += -2.5f;
            if (i == 5) v = -INFINITY;
            if (seen[i]) {
                v = v > 0 ? v / 1.3f : v * 1.3f;
                if (seen[i] & 2) v -= 0.7f;
                v -= 0.45f * (float)gen_count[i];
            }
            want[i] = round_bf16(v);
        }
        for (int k = 0; k < n; k++) row[pe[k].id] = sampler_penalize(row[pe[k].id], &pe[k], 1.3f, 0.7f, 0.45f);
        CHECK(!memcmp(row, want, sizeof(float) * V), "the penalty list applied is the rule per id, bitwise");
        /* the ban ends after min_tokens generated ids: its entry goes (or loses PEN_BAN) */
        sampler_observe(&s, 11, 1);
        n = sampler_penalties(&s, &pe);
        int banned = 0;
        for (int k = 0; k < n; k++) banned += (pe[k].flags & PEN_BAN) != 0;
        CHECK(banned == 0, "the ban's entries go when it ends (%d left)", banned);
        free(row), free(want);
        /* a presence penalty alone lists the generated ids only (a prompt id changes when generated, not before) */
        c = base();
        c.presence_penalty = 1.0f;
        sampler_reset(&s, &c, V, V, &err);
        for (int i = 0; i < 50; i++) sampler_observe(&s, i, 0);
        sampler_observe(&s, 10, 1), sampler_observe(&s, 60, 1), sampler_observe(&s, 10, 1);
        n = sampler_penalties(&s, &pe);
        CHECK(n == 2 && pe[0].id == 10 && pe[0].count == 2 && pe[0].flags == (PEN_SEEN | PEN_GEN) && pe[1].id == 60,
              "presence alone: %d entries (want ids 10, 60)", n);
        sampler_free(&s);
    }
    return TEST_SUMMARY("sampler");
}
