/* test_guided.c — the server's guided sampler (src/server/guided.c) with Qwen3's tokenizer: under a json_object
 * guide, over crafted logits (two allowed ids A and B near the top, every other id far below), the request's logit
 * bias and its repetition / presence / frequency penalties move the pick as sampler.h's rule says, from the ids of
 * the request's history (the prompt's counting for the repetition penalty only); the sampled path (temperature 1,
 * top_k 1) sees the changed logits too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwen35.h"
#include "server/guided.h"
#include "test.h"

static int one_id(const Q35Tokenizer *t, const char *text) {
    int *ids = NULL, n = 0, id = -1;
    Q35Err err;
    if (q35_tokenize(t, text, strlen(text), &ids, &n, &err) == 0 && n == 1) id = ids[0];
    CHECK(id >= 0, "[%s] is one id (%d ids)", text, n);
    free(ids);
    return id;
}

typedef struct Case {
    const char *what;
    Q35SeqParams sp;
    int hist[4], n_hist, n_prompt;
    int want_b; /* 1: B is picked, 0: A */
} Case;

/* The pick of a fresh json_object guide over logits, for case c. */
static int pick(GuideVocab *v, const float *logits, const Case *c, Q35StepOut *o) {
    Q35ChatRequest rq = {.response_schema = "{\"type\": \"object\"}", .family = Q35_TOK_QWEN3};
    Q35Guide *g;
    Q35Err err;
    if (q35_guide_open(&g, NULL, &rq, &err)) {
        CHECK(0, "guide open: %s", err.msg);
        return -1;
    }
    const GuideHistory h = {c->hist, c->n_hist, c->n_prompt};
    uint64_t rng = 7;
    const int rc = guide_sample(v, g, logits, &h, &c->sp, &rng, NULL, 0, o);
    q35_guide_close(g);
    return rc ? -1 : o->id;
}

int main(void) {
    Q35Tokenizer *t;
    Q35Err err;
    int rc = q35_tokenizer_load(&t, ".cache/qwen3-tokenizer", &err);
    CHECK(rc == 0, "Qwen3 tokenizer (run scripts/fetch_tokenizer.sh): %s", err.msg);
    if (rc) return TEST_SUMMARY("guided");
    const int vocab = q35_tokenizer_size(t), A = one_id(t, "{"), B = one_id(t, "{\""), X = one_id(t, "hello");
    GuideVocab *v;
    rc = A < 0 || B < 0 || X < 0 ? -1 : guide_vocab_open(&v, t, vocab, &err);
    CHECK(rc == 0, "guide vocabulary: %s", err.msg);
    if (rc) {
        q35_tokenizer_free(t);
        return TEST_SUMMARY("guided");
    }
    float *logits = malloc(sizeof *logits * (size_t)vocab);
    for (int i = 0; i < vocab; i++) logits[i] = -20.0f;
    logits[A] = 5.0f, logits[B] = 4.5f, logits[X] = 6.0f; /* X: above both, refused by the guide */
    const Q35Sampling greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    Q35Sampling presence = greedy, repetition = greedy, frequency = greedy;
    presence.presence_penalty = 2.0f;  /* A generated: 5 - 2 = 3 < 4.5 */
    frequency.frequency_penalty = 0.3f;
    repetition.repetition_penalty = 2; /* A seen: 5 / 2 = 2.5 < 4.5 */
    const int bias_a[1] = {A};
    const float minus_one[1] = {-1.0f}, plus_one[1] = {1.0f};
    const Case cases[] = {
        {"no change", {.sampling = greedy}, {X, A}, 2, 1, 0},
        {"presence, A generated", {.sampling = presence}, {X, A}, 2, 1, 1},
        {"presence, A in the prompt only", {.sampling = presence}, {A, X}, 2, 2, 0},
        {"repetition, A in the prompt", {.sampling = repetition}, {A, X}, 2, 2, 1},
        {"repetition, A generated", {.sampling = repetition}, {X, A}, 2, 1, 1},
        {"frequency 0.3, A generated once: 4.7", {.sampling = frequency}, {X, A}, 2, 1, 0},
        {"frequency 0.3, A generated twice: 4.4", {.sampling = frequency}, {A, A}, 2, 0, 1},
        {"frequency, A in the prompt twice", {.sampling = frequency}, {A, A}, 2, 2, 0},
        {"bias -1 on A", {.sampling = greedy, .bias_ids = bias_a, .bias = minus_one, .n_bias = 1}, {X}, 1, 1, 1},
        {"bias +1 on A, presence 2: 4",
         {.sampling = presence, .bias_ids = bias_a, .bias = plus_one, .n_bias = 1},
         {X, A},
         2,
         1,
         1},
        {"an id out of range in the history is skipped", {.sampling = presence}, {X, -3, vocab + 5}, 3, 1, 0},
        {"no change again (the scratch cleared)", {.sampling = greedy}, {X, A}, 2, 1, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Q35StepOut o;
        const int id = pick(v, logits, &cases[k], &o);
        CHECK(id == (cases[k].want_b ? B : A), "%s: picked %d (A %d, B %d)", cases[k].what, id, A, B);
    }

    /* sampled: top_k 1 keeps the largest changed logit */
    Q35Sampling drawn = presence;
    drawn.temperature = 1.0f, drawn.top_k = 1;
    Case c = {"drawn", {.sampling = drawn, .top_logprobs = 0}, {X, A}, 2, 1, 1};
    Q35StepOut o;
    CHECK(pick(v, logits, &c, &o) == B, "drawn, top_k 1, presence on A: picked %d (B %d)", o.id, B);
    c.sp.sampling.presence_penalty = 0;
    CHECK(pick(v, logits, &c, &o) == A, "drawn, top_k 1, no penalty: picked %d (A %d)", o.id, A);

    free(logits);
    guide_vocab_close(v);
    q35_tokenizer_free(t);
    return TEST_SUMMARY("guided");
}
