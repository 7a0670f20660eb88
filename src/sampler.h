/* sampler.h — host-side sampling over one row of logits: logit bias, penalties, temperature, top-k, top-p, min-p,
 * then a draw from the Sampler's own RNG (seeded per request).
 * Order (as HF's logits processors): the logit bias (OpenAI logit_bias), repetition penalty (ids seen in prompt +
 * output), presence penalty (ids generated so far, vLLM-style), frequency penalty (OpenAI: f times the count of the
 * id among the generated ids), temperature, top-k, top-p, min-p.
 * Ids >= n_valid (embedding padding past the tokenizer) are never sampled. */
#ifndef Q35_SAMPLER_H
#define Q35_SAMPLER_H

#include "util.h"

typedef struct Sampler {
    Q35Sampling cfg;
    Rng rng;
    int n_vocab;         /* logits row length */
    int n_valid;         /* ids [0, n_valid) are real tokens */
    unsigned char *seen; /* [n_vocab] bit 0: in prompt or output; bit 1: generated */
    float frequency;     /* frequency penalty; 0 = off */
    int *count;          /* [n_vocab] times each id was generated (only when frequency != 0) */
    int *bias_id;        /* logit_bias: logit[bias_id[k]] += bias[k], k < n_bias */
    float *bias;
    int n_bias;
    int *ban_id; /* min_tokens: these ids (the stop ids) are never drawn while ban_left > 0 */
    int n_ban;
    int ban_left; /* generated ids still to observe before they may be drawn */
    int *cand;    /* [n_vocab] scratch: candidate ids */
    float *prob;  /* [n_vocab] scratch: candidate probabilities */
} Sampler;

int sampler_init(Sampler *s, const Q35Sampling *cfg, int n_vocab, int n_valid, Err *err);
/* sampler_init for a sampler that was initialised before (or zeroed): its vocabulary-sized buffers are kept (`seen`
 * cleared) when n_vocab is the same, so that a new sequence costs no allocation and no first-touch page faults. */
int sampler_reset(Sampler *s, const Q35Sampling *cfg, int n_vocab, int n_valid, Err *err);
void sampler_free(Sampler *s);
/* Turns on the frequency penalty: logit[id] -= f * (times id was generated). Call before observing. */
int sampler_set_frequency(Sampler *s, float f, Err *err);
/* Sets the logit bias (copied): n ids in [0, n_vocab) with finite values; Q35_ERR_ARG otherwise. */
int sampler_set_bias(Sampler *s, const int *ids, const float *bias, int n, Err *err);
/* min_tokens: the n ids (copied) are not drawn until min_tokens ids were observed as generated. Q35_ERR_ARG for an
 * id outside the vocabulary or min_tokens < 0. */
int sampler_set_ban(Sampler *s, const int *ids, int n, int min_tokens, Err *err);
/* Records an id of the context: generated = 0 for prompt ids, 1 for sampled ones. */
void sampler_observe(Sampler *s, int id, int generated);
/* Picks the next id from logits [n_vocab] (modified in place), u from the Sampler's RNG. */
int sampler_sample(Sampler *s, float *logits);
/* The same with u = counter_uniform(seed, step) (util.h): the draw of the devices' sampler (src/cuda/sample.cu),
 * which depends on (seed, step) alone, not on the draws before. */
int sampler_sample_at(Sampler *s, float *logits, uint64_t step);
/* argmax over [0, n_valid); ties -> smallest id. */
int sampler_argmax(const float *logits, int n_valid);
/* 1 if the config needs host logits (penalties), i.e. device sampling cannot serve it. */
int sampler_needs_history(const Q35Sampling *cfg);

#endif
