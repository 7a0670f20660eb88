/* sampler.c — host sampling; see sampler.h for the order of operations. */
#include "sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int check_cfg(const Q35Sampling *cfg, Err *err) {
    if (cfg->temperature < 0 || cfg->top_k < 0 || cfg->top_p <= 0 || cfg->top_p > 1 || cfg->min_p < 0 ||
        cfg->min_p > 1 || cfg->repetition_penalty <= 0 || !isfinite(cfg->presence_penalty))
        return err_set(err, Q35_ERR_ARG,
                       "bad sampling settings: temperature %g top_k %d top_p %g min_p %g repetition_penalty %g",
                       cfg->temperature, cfg->top_k, cfg->top_p, cfg->min_p, cfg->repetition_penalty);
    return 0;
}

/* The settings and the vocabulary-sized buffers of a sampler whose other fields are zero; buffers already there (kept
 * by sampler_reset) are used as they are. */
static int setup(Sampler *s, const Q35Sampling *cfg, int n_vocab, int n_valid, Err *err) {
    s->cfg = *cfg;
    s->n_vocab = n_vocab;
    s->n_valid = n_valid < n_vocab ? n_valid : n_vocab;
    rng_seed(&s->rng, cfg->seed);
    if (!s->seen) s->seen = calloc((size_t)n_vocab, 1);
    if (!s->cand) s->cand = malloc(sizeof(int) * (size_t)n_vocab);
    if (!s->prob) s->prob = malloc(sizeof(float) * (size_t)n_vocab);
    if (!s->seen || !s->cand || !s->prob) {
        sampler_free(s);
        return err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
    }
    return 0;
}

int sampler_init(Sampler *s, const Q35Sampling *cfg, int n_vocab, int n_valid, Err *err) {
    memset(s, 0, sizeof *s);
    const int rc = check_cfg(cfg, err);
    return rc ? rc : setup(s, cfg, n_vocab, n_valid, err);
}

int sampler_reset(Sampler *s, const Q35Sampling *cfg, int n_vocab, int n_valid, Err *err) {
    if (!s->seen || !s->cand || !s->prob || s->n_vocab != n_vocab) {
        sampler_free(s);
        return sampler_init(s, cfg, n_vocab, n_valid, err);
    }
    const int rc = check_cfg(cfg, err);
    if (rc) return rc;
    unsigned char *seen = s->seen;
    int *cand = s->cand;
    float *prob = s->prob;
    s->seen = NULL, s->cand = NULL, s->prob = NULL;
    sampler_free(s); /* the small parts (bias, ban, counts); the three buffers stay */
    memset(seen, 0, (size_t)n_vocab);
    s->seen = seen, s->cand = cand, s->prob = prob;
    return setup(s, cfg, n_vocab, n_valid, err);
}

int sampler_set_frequency(Sampler *s, float f, Err *err) {
    if (!isfinite(f)) return err_set(err, Q35_ERR_ARG, "bad frequency penalty %g", f);
    s->frequency = f;
    if (f != 0.0f && !s->count) {
        s->count = calloc((size_t)s->n_vocab, sizeof(int));
        if (!s->count) return err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
    }
    return 0;
}

int sampler_set_bias(Sampler *s, const int *ids, const float *bias, int n, Err *err) {
    if (n < 0 || (n > 0 && (!ids || !bias))) return err_set(err, Q35_ERR_ARG, "logit bias: %d entries", n);
    for (int k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= s->n_vocab || !isfinite(bias[k]))
            return err_set(err, Q35_ERR_ARG, "logit bias: id %d (vocabulary %d) bias %g", ids[k], s->n_vocab,
                           (double)bias[k]);
    free(s->bias_id);
    free(s->bias);
    s->bias_id = NULL;
    s->bias = NULL;
    s->n_bias = 0;
    if (!n) return 0;
    s->bias_id = malloc(sizeof(int) * (size_t)n);
    s->bias = malloc(sizeof(float) * (size_t)n);
    if (!s->bias_id || !s->bias) return err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
    memcpy(s->bias_id, ids, sizeof(int) * (size_t)n);
    memcpy(s->bias, bias, sizeof(float) * (size_t)n);
    s->n_bias = n;
    return 0;
}

int sampler_set_ban(Sampler *s, const int *ids, int n, int min_tokens, Err *err) {
    if (n < 0 || min_tokens < 0 || (n > 0 && !ids))
        return err_set(err, Q35_ERR_ARG, "min_tokens %d with %d ids", min_tokens, n);
    for (int k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= s->n_vocab)
            return err_set(err, Q35_ERR_ARG, "min_tokens: id %d (vocabulary %d)", ids[k], s->n_vocab);
    free(s->ban_id);
    s->ban_id = NULL;
    s->n_ban = 0;
    s->ban_left = 0;
    if (!n || !min_tokens) return 0;
    if (!(s->ban_id = malloc(sizeof(int) * (size_t)n)))
        return err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
    memcpy(s->ban_id, ids, sizeof(int) * (size_t)n);
    s->n_ban = n;
    s->ban_left = min_tokens;
    return 0;
}

void sampler_free(Sampler *s) {
    free(s->ban_id);
    free(s->bias_id);
    free(s->bias);
    free(s->count);
    free(s->seen);
    free(s->cand);
    free(s->prob);
    memset(s, 0, sizeof *s);
}

void sampler_observe(Sampler *s, int id, int generated) {
    if (id < 0 || id >= s->n_vocab) return;
    s->seen[id] |= (unsigned char)(1 | (generated ? 2 : 0));
    if (generated && s->count) s->count[id]++;
    if (generated && s->ban_left > 0) s->ban_left--;
}

int sampler_needs_history(const Q35Sampling *cfg) {
    return cfg->repetition_penalty != 1.0f || cfg->presence_penalty != 0.0f;
}

int sampler_argmax(const float *logits, int n_valid) {
    int best = 0;
    for (int i = 1; i < n_valid; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static int cmp_prob_desc(const void *a, const void *b, void *p) {
    const float *prob = p;
    float x = prob[*(const int *)a], y = prob[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* cand[0 .. m) sorted as cmp_prob_desc sorts them (probability descending, id ascending), for large m: an LSD radix
 * sort on the probabilities' bits (positive floats order as their bit patterns; complemented for descending), three
 * stable passes of 11 bits. cand arrives in ascending id order, and stability keeps equal probabilities in that
 * order, so the result is the comparison sort's exactly. tmp: m ints of scratch. */
static void sort_prob_desc(int *cand, int *tmp, int m, const float *prob) {
    unsigned cnt[2048];
    int *src = cand, *dst = tmp;
    for (int shift = 0; shift < 33; shift += 11) {
        memset(cnt, 0, sizeof cnt);
        for (int j = 0; j < m; j++) {
            uint32_t k;
            memcpy(&k, &prob[src[j]], 4);
            cnt[(~k >> shift) & 2047]++;
        }
        unsigned at = 0;
        for (int b = 0; b < 2048; b++) {
            const unsigned c = cnt[b];
            cnt[b] = at;
            at += c;
        }
        for (int j = 0; j < m; j++) {
            uint32_t k;
            memcpy(&k, &prob[src[j]], 4);
            dst[cnt[(~k >> shift) & 2047]++] = src[j];
        }
        int *t = src;
        src = dst;
        dst = t;
    }
    if (src != cand) memcpy(cand, src, sizeof(int) * (size_t)m);
}

/* u: the draw's uniform, or NULL to take one from s->rng (only when the rules need one) */
static int sample_u(Sampler *s, float *logits, const float *u) {
    const Q35Sampling *c = &s->cfg;
    int n = s->n_valid;
    for (int k = 0; k < s->n_bias; k++) logits[s->bias_id[k]] += s->bias[k];
    for (int k = 0; k < s->n_ban && s->ban_left > 0; k++) logits[s->ban_id[k]] = -INFINITY;
    if (c->repetition_penalty != 1.0f || c->presence_penalty != 0.0f || s->frequency != 0.0f) {
        for (int i = 0; i < n; i++) {
            if (!s->seen[i]) continue;
            if (c->repetition_penalty != 1.0f)
                logits[i] = logits[i] > 0 ? logits[i] / c->repetition_penalty : logits[i] * c->repetition_penalty;
            if ((s->seen[i] & 2) && c->presence_penalty != 0.0f) logits[i] -= c->presence_penalty;
            if (s->count && s->frequency != 0.0f) logits[i] -= s->frequency * (float)s->count[i];
        }
    }
    if (c->temperature <= 0.0f) return sampler_argmax(logits, n);

    /* softmax over candidates; ids whose probability is below e^-40 of the max are dropped first */
    float mx = logits[sampler_argmax(logits, n)];
    float cut = mx - 40.0f * c->temperature;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= cut) s->cand[m++] = i;
    double sum = 0;
    for (int j = 0; j < m; j++) {
        int i = s->cand[j];
        s->prob[i] = expf((logits[i] - mx) / c->temperature);
        sum += s->prob[i];
    }
    for (int j = 0; j < m; j++) s->prob[s->cand[j]] = (float)(s->prob[s->cand[j]] / sum);
    if (m > 4096) /* near-flat rows (high temperature, random weights): linear in m where the comparison sort is not */
        sort_prob_desc(s->cand, (int *)logits, m, s->prob); /* logits is free scratch from here on */
    else
        qsort_r(s->cand, (size_t)m, sizeof(int), cmp_prob_desc, s->prob);
    if (c->top_k > 0 && c->top_k < m) m = c->top_k;
    if (c->top_p < 1.0f) { /* on the distribution renormalised after top-k */
        double mass = 0, acc = 0;
        for (int j = 0; j < m; j++) mass += s->prob[s->cand[j]];
        int k = 0;
        while (k < m) { /* keep the smallest prefix whose mass reaches top_p (at least one) */
            acc += s->prob[s->cand[k++]];
            if (acc >= c->top_p * mass) break;
        }
        m = k;
    }
    if (c->min_p > 0.0f) {
        float thr = c->min_p * s->prob[s->cand[0]];
        int k = 1;
        while (k < m && s->prob[s->cand[k]] >= thr) k++;
        m = k;
    }
    double tot = 0;
    for (int j = 0; j < m; j++) tot += s->prob[s->cand[j]];
    double r = (u ? *u : rng_uniform(&s->rng)) * tot, acc = 0;
    for (int j = 0; j < m; j++) {
        acc += s->prob[s->cand[j]];
        if (r < acc) return s->cand[j];
    }
    return s->cand[m - 1];
}

int sampler_sample(Sampler *s, float *logits) { return sample_u(s, logits, NULL); }

int sampler_sample_at(Sampler *s, float *logits, uint64_t step) {
    const float u = counter_uniform(s->cfg.seed, step);
    return sample_u(s, logits, &u);
}
