/* sampler.h — host-side sampling over one row of logits: logit bias, penalties, temperature, top-k, top-p, min-p,
 * then a draw from the Sampler's own RNG (seeded per request).
 * Order (as HF's logits processors): the logit bias (OpenAI logit_bias), repetition penalty (ids seen in prompt +
 * output), presence penalty (ids generated so far, vLLM-style), frequency penalty (OpenAI: f times the count of the
 * id among the generated ids), temperature, top-k, top-p, min-p.
 * A logit the bias, the ban or a penalty changes is rounded to bf16 (to nearest even) after all of them: the GPU's
 * logits are bf16 values and its sampler sorts by their 16-bit keys (src/cuda/sample.cu), so a changed logit stays
 * on that grid and the device's draws equal the host's (src/cuda/penalty.cu applies the same entries).
 * Ids >= n_valid (embedding padding past the tokenizer) are never sampled. */
#ifndef Q35_SAMPLER_H
#define Q35_SAMPLER_H

#include "util.h"

/* One id's logit changes (sampler_penalties): logit' = bf16(penalize(logit + bias)), where with PEN_BAN the logit is
 * -inf, and for a PEN_SEEN id the repetition penalty r turns l into l / r (l > 0) or l r, then a PEN_GEN id loses the
 * presence penalty and every seen id frequency * count. Each id appears at most once in a list. */
enum { PEN_SEEN = 1, PEN_GEN = 2, PEN_BIAS = 4, PEN_BAN = 8 };
typedef struct SamplePenalty {
    int32_t id;
    uint32_t flags; /* PEN_* */
    float bias;     /* with PEN_BIAS */
    int32_t count;  /* times the id was generated (with a frequency penalty; else 0) */
} SamplePenalty;

typedef struct Sampler {
    Q35Sampling cfg;
    Rng rng;
    int n_vocab;         /* logits row length */
    int n_valid;         /* ids [0, n_valid) are real tokens */
    unsigned char *seen; /* [n_vocab] bit 0: in prompt or output; bit 1: generated */
    int observed;        /* an id was observed */
    int *bias_id;        /* logit_bias: logit[bias_id[k]] += bias[k], k < n_bias */
    float *bias;
    int n_bias;
    int *ban_id; /* min_tokens: these ids (the stop ids) are never drawn while ban_left > 0 */
    int n_ban;
    int ban_left; /* generated ids still to observe before they may be drawn */
    int *cand;    /* [n_vocab] scratch: candidate ids */
    float *prob;  /* [n_vocab] scratch: candidate probabilities */
    /* the logit changes as a list kept up to date by the setters and sampler_observe (sampler_penalties): entries
     * pen[0 .. n_pen), each id once, pen_at[id] = 1 + its entry (0: none); on (tracking) once a setting changes logits.
     * It holds the ids a rule changes: the bias and ban ids, every observed id under a repetition penalty, the
     * generated ones under a presence or frequency penalty. */
    SamplePenalty *pen;
    int n_pen, pen_cap;
    int pen_oom; /* the list could not grow */
    int tracking;
    int *pen_at; /* [n_vocab] */
} Sampler;

int sampler_init(Sampler *s, const Q35Sampling *cfg, int n_vocab, int n_valid, Err *err);
/* sampler_init for a sampler that was initialised before (or zeroed): its vocabulary-sized buffers are kept (`seen`
 * cleared) when n_vocab is the same, so that a new sequence costs no allocation and no first-touch page faults. */
int sampler_reset(Sampler *s, const Q35Sampling *cfg, int n_vocab, int n_valid, Err *err);
void sampler_free(Sampler *s);
/* Sets the logit bias (copied): n ids in [0, n_vocab) with finite values; Q35_ERR_ARG otherwise. An id given twice
 * takes the later value (as openai.c reads a JSON object). */
int sampler_set_bias(Sampler *s, const int *ids, const float *bias, int n, Err *err);
/* min_tokens: the n ids (copied) are not drawn until min_tokens ids were observed as generated. Q35_ERR_ARG for an
 * id outside the vocabulary or min_tokens < 0. */
int sampler_set_ban(Sampler *s, const int *ids, int n, int min_tokens, Err *err);
/* Records an id of the context: generated = 0 for prompt ids, 1 for sampled ones. */
void sampler_observe(Sampler *s, int id, int generated);
/* Picks the next id from logits [n_vocab] (modified in place), u from the Sampler's RNG; -1 out of memory (the list of
 * logit changes could not grow). */
int sampler_sample(Sampler *s, float *logits);
/* The same with u = counter_uniform(seed, step) (util.h): the draw of the devices' sampler (src/cuda/sample.cu),
 * which depends on (seed, step) alone, not on the draws before. */
int sampler_sample_at(Sampler *s, float *logits, uint64_t step);
/* argmax over [0, n_valid); ties -> smallest id. */
int sampler_argmax(const float *logits, int n_valid);
/* 1 if the config needs host logits (penalties), i.e. device sampling cannot serve it. */
int sampler_needs_history(const Q35Sampling *cfg);
/* 1 if a draw changes logits first: a penalty, a bias, or a min_tokens ban still running. */
int sampler_adjusts(const Sampler *s);
/* The current logit changes as a list (s->pen, valid until the next setter or observe; an entry whose flags went to 0,
 * a ban that ended, changes nothing). Returns the count, or -1 when the list could not grow (out of memory). */
int sampler_penalties(Sampler *s, const SamplePenalty **out);
/* One entry's rule (see SamplePenalty) on a raw logit, under the config's and the frequency penalty's values; the
 * result is bf16-rounded. */
float sampler_penalize(float logit, const SamplePenalty *e, float repetition, float presence, float frequency);

#endif
