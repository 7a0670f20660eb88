/* guided.h — tool_choice "required" / named function and response_format in the server: the next token of a
 * guided request is sampled on the host from the step's raw logits (Q35StepItem.logits, no engine sample),
 * restricted to the ids whose text q35_guide_allows, with the stop ids allowed only where the guide may end. */
#ifndef Q35_SERVER_GUIDED_H
#define Q35_SERVER_GUIDED_H
#include <stdint.h>

#include "qwen35.h"

/* Every id's text (detokenized alone, specials skipped). Ids with no text (special tokens), with an incomplete
 * UTF-8 piece (a byte of a longer character: U+FFFD alone) or past the tokenizer are never offered to the guide. */
typedef struct GuideVocab GuideVocab;
int guide_vocab_open(GuideVocab **out, const Q35Tokenizer *t, int vocab, Q35Err *err);
void guide_vocab_close(GuideVocab *v);

/* The request's ids so far: ids[0, n_prompt) the prompt, ids[n_prompt, n) generated. */
typedef struct GuideHistory {
    const int *ids;
    int n, n_prompt;
} GuideHistory;

/* Chooses the token after logits[vocab] for guide g and pushes its text into g. After a whitespace-only token (the
 * last of h's generated ids), whitespace-only ids are offered only when nothing else is allowed (the JSON and XML
 * shapes allow unbounded whitespace, where a random or weak model can stay forever). Sampling over the allowed ids:
 * the logits with sp's logit bias and penalties over h (sampler.h's rule: the repetition penalty on every id of h,
 * presence and frequency on the generated ones); temperature 0 = argmax; else softmax(logit / T) cut by top_k,
 * min_p, top_p, drawn with *rng. o: the id (its logprobs are the caller's: q35_logprobs of the raw row).
 * stops[0, n_stops): sets of ids that end the completion (the model's,
 * the request's stop_token_ids); an id of a set is chosen only where the guide may end and the set is ok (the model's
 * not under ignore_eos, neither before min_tokens), never as text. Returns 0, or -1 when no id is allowed
 * (o->id = -1). v holds the scratch: one thread samples with it at a time. */
typedef struct GuideStops {
    const int *ids;
    int n;
    int ok;
} GuideStops;
int guide_sample(GuideVocab *v, Q35Guide *g, const float *logits, const GuideHistory *h, const Q35SeqParams *sp,
                 uint64_t *rng, const GuideStops *stops, int n_stops, Q35StepOut *o);

#endif
