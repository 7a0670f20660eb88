/* sampler.c — host sampling; see sampler.h for the order of operations. */
#include "sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int check_cfg(const Q35Sampling *cfg, Err *err) {
    if (cfg->temperature < 0 || cfg->top_k < 0 || cfg->top_p <= 0 || cfg->top_p > 1 || cfg->min_p < 0 ||
        cfg->min_p > 1 || cfg->repetition_penalty <= 0 || !isfinite(cfg->presence_penalty) ||
        !isfinite(cfg->frequency_penalty))
        return err_set(err, Q35_ERR_ARG,
                       "bad sampling settings: temperature %g top_k %d top_p %g min_p %g repetition_penalty %g "
                       "presence_penalty %g frequency_penalty %g",
                       cfg->temperature, cfg->top_k, cfg->top_p, cfg->min_p, cfg->repetition_penalty,
                       cfg->presence_penalty, cfg->frequency_penalty);
    return 0;
}

/* The entry of id in the list of logit changes, made (no changes yet) when it has none; NULL when the list cannot grow
 * (pen_oom, which sampler_penalties reports). */
static SamplePenalty *pen_get(Sampler *s, int id) {
    if (s->pen_at[id]) return &s->pen[s->pen_at[id] - 1];
    if (s->n_pen == s->pen_cap) {
        const int cap = s->pen_cap ? 2 * s->pen_cap : 64;
        SamplePenalty *p = realloc(s->pen, sizeof *p * (size_t)cap);
        if (!p) {
            s->pen_oom = 1;
            return NULL;
        }
        s->pen = p;
        s->pen_cap = cap;
    }
    s->pen[s->n_pen] = (SamplePenalty){id, 0, 0.0f, 0};
    s->pen_at[id] = ++s->n_pen;
    return &s->pen[s->n_pen - 1];
}

/* Which observed ids the list holds: every one under a repetition penalty, the generated ones under a presence or
 * frequency penalty (an id the rules would not change is left out). */
static int lists_seen(const Sampler *s) { return s->cfg.repetition_penalty != 1.0f; }
static int lists_generated(const Sampler *s) {
    return s->cfg.presence_penalty != 0.0f || s->cfg.frequency_penalty != 0.0f;
}

/* One observed id into the list (with pen_at): its flags, and its count when generated. */
static void pen_observe(Sampler *s, int id, int generated) {
    if (!lists_seen(s) && !(generated && lists_generated(s))) return;
    SamplePenalty *e = pen_get(s, id);
    if (!e) return;
    e->flags |= PEN_SEEN | (generated ? PEN_GEN : 0);
    e->count += generated != 0;
}

/* Turns the list on (when a setting changes logits); ids observed before are listed from `seen` (their counts are not
 * kept: the frequency penalty comes with the settings, before any id). */
static int pen_track(Sampler *s, Err *err) {
    if (s->tracking) return 0;
    if (!s->pen_at && !(s->pen_at = calloc((size_t)s->n_vocab, sizeof(int))))
        return err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
    s->tracking = 1;
    for (int i = 0; s->observed && i < s->n_vocab; i++)
        if (s->seen[i]) pen_observe(s, i, s->seen[i] & 2);
    return 0;
}

/* Sets or clears `flag` on the entries of ids[0 .. n) (with pen_at), bias values from `bias` when given. */
static void pen_flag(Sampler *s, const int *ids, const float *bias, int n, uint32_t flag, int on) {
    for (int k = 0; k < n; k++) {
        SamplePenalty *e = on ? pen_get(s, ids[k]) : s->pen_at[ids[k]] ? &s->pen[s->pen_at[ids[k]] - 1] : NULL;
        if (!e) continue;
        e->flags = on ? e->flags | flag : e->flags & ~flag;
        if (on && bias) e->bias = bias[k];
    }
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
    return sampler_needs_history(cfg) ? pen_track(s, err) : 0;
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
    int *cand = s->cand, *pen_at = s->pen_at, pen_cap = s->pen_cap;
    float *prob = s->prob;
    SamplePenalty *pen = s->pen;
    for (int k = 0; pen_at && k < s->n_pen; k++) pen_at[pen[k].id] = 0;
    s->seen = NULL, s->cand = NULL, s->prob = NULL, s->pen_at = NULL, s->pen = NULL;
    sampler_free(s); /* the small parts (bias, ban); the vocabulary-sized buffers stay */
    memset(seen, 0, (size_t)n_vocab);
    s->seen = seen, s->cand = cand, s->prob = prob, s->pen = pen, s->pen_cap = pen_cap;
    s->pen_at = pen_at; /* all zero again */
    return setup(s, cfg, n_vocab, n_valid, err);
}

int sampler_set_bias(Sampler *s, const int *ids, const float *bias, int n, Err *err) {
    if (n < 0 || (n > 0 && (!ids || !bias))) return err_set(err, Q35_ERR_ARG, "logit bias: %d entries", n);
    for (int k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= s->n_vocab || !isfinite(bias[k]))
            return err_set(err, Q35_ERR_ARG, "logit bias: id %d (vocabulary %d) bias %g", ids[k], s->n_vocab,
                           (double)bias[k]);
    if (s->tracking) pen_flag(s, s->bias_id, NULL, s->n_bias, PEN_BIAS, 0);
    free(s->bias_id);
    free(s->bias);
    s->bias_id = NULL;
    s->bias = NULL;
    s->n_bias = 0;
    if (!n) return 0;
    s->bias_id = malloc(sizeof(int) * (size_t)n);
    s->bias = malloc(sizeof(float) * (size_t)n);
    if (!s->bias_id || !s->bias) return err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
    for (int k = 0; k < n; k++) { /* each id once, with its last value */
        int j = 0;
        while (j < s->n_bias && s->bias_id[j] != ids[k]) j++;
        s->bias_id[j] = ids[k];
        s->bias[j] = bias[k];
        s->n_bias += j == s->n_bias;
    }
    const int rc = pen_track(s, err);
    if (!rc) pen_flag(s, s->bias_id, s->bias, s->n_bias, PEN_BIAS, 1);
    return rc;
}

int sampler_set_ban(Sampler *s, const int *ids, int n, int min_tokens, Err *err) {
    if (n < 0 || min_tokens < 0 || (n > 0 && !ids))
        return err_set(err, Q35_ERR_ARG, "min_tokens %d with %d ids", min_tokens, n);
    for (int k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= s->n_vocab)
            return err_set(err, Q35_ERR_ARG, "min_tokens: id %d (vocabulary %d)", ids[k], s->n_vocab);
    if (s->tracking) pen_flag(s, s->ban_id, NULL, s->n_ban, PEN_BAN, 0);
    free(s->ban_id);
    s->ban_id = NULL;
    s->n_ban = 0;
    s->ban_left = 0;
    if (!n || !min_tokens) return 0;
    if (!(s->ban_id = malloc(sizeof(int) * (size_t)n)))
        return err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
    for (int k = 0; k < n; k++) { /* each id once */
        int j = 0;
        while (j < s->n_ban && s->ban_id[j] != ids[k]) j++;
        if (j == s->n_ban) s->ban_id[s->n_ban++] = ids[k];
    }
    s->ban_left = min_tokens;
    const int rc = pen_track(s, err);
    if (!rc) pen_flag(s, s->ban_id, NULL, s->n_ban, PEN_BAN, 1);
    return rc;
}

void sampler_free(Sampler *s) {
    free(s->ban_id);
    free(s->bias_id);
    free(s->bias);
    free(s->pen);
    free(s->pen_at);
    free(s->seen);
    free(s->cand);
    free(s->prob);
    memset(s, 0, sizeof *s);
}

void sampler_observe(Sampler *s, int id, int generated) {
    if (id < 0 || id >= s->n_vocab) return;
    s->observed = 1;
    s->seen[id] |= (unsigned char)(1 | (generated ? 2 : 0));
    if (s->tracking) pen_observe(s, id, generated);
    if (generated && s->ban_left > 0 && --s->ban_left == 0 && s->tracking)
        pen_flag(s, s->ban_id, NULL, s->n_ban, PEN_BAN, 0);
}

int sampler_needs_history(const Q35Sampling *cfg) {
    return cfg->repetition_penalty != 1.0f || cfg->presence_penalty != 0.0f || cfg->frequency_penalty != 0.0f;
}

int sampler_adjusts(const Sampler *s) { return s->n_pen > 0 || s->pen_oom; }

int sampler_penalties(Sampler *s, const SamplePenalty **out) {
    *out = s->pen;
    return s->pen_oom ? -1 : s->n_pen;
}

float sampler_penalize(float l, const SamplePenalty *e, float repetition, float presence, float frequency) {
    if (!e->flags) return l;
    if (e->flags & PEN_BIAS) l += e->bias;
    if (e->flags & PEN_BAN) l = -INFINITY;
    if (e->flags & PEN_SEEN) {
        if (repetition != 1.0f) l = l > 0 ? l / repetition : l * repetition;
        if ((e->flags & PEN_GEN) && presence != 0.0f) l -= presence;
        if (frequency != 0.0f) l -= frequency * (float)e->count;
    }
    return round_bf16(l);
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
    if (sampler_adjusts(s)) {
        const SamplePenalty *pe;
        const int np = sampler_penalties(s, &pe);
        if (np < 0) return -1;
        for (int k = 0; k < np; k++)
            logits[pe[k].id] = sampler_penalize(logits[pe[k].id], &pe[k], c->repetition_penalty, c->presence_penalty,
                                                c->frequency_penalty);
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
