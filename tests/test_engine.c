/* test_engine.c — the public generation API on a golden fixture (CPU backend): greedy output is
 * reproducible; a generation continued by a second q35_generate call (its prompt starting with the
 * last, unfed id) equals one longer generation; the callback stops early; a full context stops with
 * stop_reason 3; a prompt past the context is Q35_ERR_CONTEXT; q35_forward's logits agree between one
 * call and token-by-token calls; ids out of range are refused; the frequency penalty moves greedy ids as its rule
 * says. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwen35.h"
#include "test.h"

typedef struct Collect {
    int ids[256];
    int n, stop_after;
} Collect;

static int collect(void *user, int id) {
    Collect *c = user;
    if (c->n < 256) c->ids[c->n++] = id;
    return c->stop_after > 0 && c->n >= c->stop_after;
}

static Q35Engine *open_fixture(int ctx) {
    Q35Options o;
    q35_options_init(&o);
    o.model_dir = "tests/fixtures/qwen35_text";
    o.backend = "cpu";
    o.max_seq = ctx;
    o.threads = 1;
    Q35Engine *e = NULL;
    Q35Err err = {0};
    if (q35_engine_open(&e, &o, &err)) fprintf(stderr, "open: %s\n", err.msg);
    return e;
}

int main(void) {
    Q35Err err = {0};
    Q35Engine *e = open_fixture(64);
    CHECK(e != NULL, "engine opens on the qwen35_text fixture");
    if (!e) return TEST_SUMMARY("engine");
    Q35Sampling s;
    q35_sampling_defaults(e, &s);
    s.temperature = 0;
    const int prompt[5] = {11, 400, 27, 3, 150};

    /* one generation of 12 tokens */
    Collect a = {.n = 0};
    Q35GenStats st;
    CHECK(q35_generate(e, prompt, 5, 12, &s, collect, &a, &st, &err) == 0, "%s", err.msg);
    CHECK(a.n == 12 && st.n_generated == 12 && st.stop_reason == 0, "12 tokens, length stop (got %d, reason %d)", a.n,
          st.stop_reason);
    CHECK(q35_position(e) == 5 + 11, "the last id is sampled, not fed: position %d", q35_position(e));

    /* the same in two calls: 5 tokens, then continue with the unfed last id as the prompt */
    CHECK(q35_reset(e, &err) == 0 && q35_position(e) == 0, "reset");
    Collect b = {.n = 0};
    CHECK(q35_generate(e, prompt, 5, 5, &s, collect, &b, &st, &err) == 0, "%s", err.msg);
    Collect c = {.n = 0};
    CHECK(q35_generate(e, &b.ids[4], 1, 7, &s, collect, &c, &st, &err) == 0, "%s", err.msg);
    int same = b.n == 5 && c.n == 7 && !memcmp(a.ids, b.ids, 5 * sizeof(int)) && !memcmp(a.ids + 5, c.ids, 7 * sizeof(int));
    CHECK(same, "a continued generation equals one longer generation");

    /* callback stop */
    q35_reset(e, &err);
    Collect d = {.n = 0, .stop_after = 3};
    CHECK(q35_generate(e, prompt, 5, 12, &s, collect, &d, &st, &err) == 0 && d.n == 3 && st.stop_reason == 2,
          "callback stops after 3 (got %d, reason %d)", d.n, st.stop_reason);

    /* context full: 64 positions, prompt 5 -> at most 60 generated tokens fed + 1 sampled */
    q35_reset(e, &err);
    Collect f = {.n = 0};
    CHECK(q35_generate(e, prompt, 5, 200, &s, collect, &f, &st, &err) == 0, "%s", err.msg);
    CHECK(st.stop_reason == 3 && q35_position(e) == 64 && f.n == 60, "context full: reason %d, position %d, %d ids",
          st.stop_reason, q35_position(e), f.n);
    CHECK(q35_generate(e, prompt, 5, 1, &s, collect, &f, &st, &err) == Q35_ERR_CONTEXT && strstr(err.msg, "context"),
          "a prompt past the context: %s", err.msg);

    /* forward: one call vs token by token */
    const int V = q35_vocab_size(e);
    float *l1 = malloc(sizeof(float) * 5 * V), *l2 = malloc(sizeof(float) * 5 * V);
    q35_reset(e, &err);
    CHECK(q35_forward(e, prompt, 5, 1, l1, &err) == 0, "%s", err.msg);
    q35_reset(e, &err);
    for (int t = 0; t < 5; t++) CHECK(q35_forward(e, prompt + t, 1, 1, l2 + (size_t)t * V, &err) == 0, "%s", err.msg);
    double num = 0, den = 0;
    for (int i = 0; i < 5 * V; i++) num += (l1[i] - l2[i]) * (double)(l1[i] - l2[i]), den += (double)l1[i] * l1[i];
    CHECK(sqrt(num / den) < 1e-5, "prefill vs token-by-token logits: rel L2 %g", sqrt(num / den));
    int bad[2] = {3, V};
    CHECK(q35_forward(e, bad, 2, 0, l1, &err) == Q35_ERR_ARG && strstr(err.msg, "out of range"), "id %d refused: %s",
          V, err.msg);
    free(l1), free(l2);

    /* the frequency penalty reaches the draw: greedy ids under it are, replayed with q35_forward, the argmax of the
     * logits minus f times each id's count in the ids generated so far (within bf16 rounding: the sampler rounds a
     * changed logit), and they differ from plain greedy ids, which repeat on this model */
    {
        Q35Sampling g = s, f = s;
        g.top_p = 1.0f, f.top_p = 1.0f, f.frequency_penalty = 2.0f;
        Collect plain = {.n = 0}, pen = {.n = 0};
        q35_reset(e, &err);
        CHECK(q35_generate(e, prompt, 5, 24, &g, collect, &plain, NULL, &err) == 0 && plain.n == 24, "%s", err.msg);
        q35_reset(e, &err);
        CHECK(q35_generate(e, prompt, 5, 24, &f, collect, &pen, NULL, &err) == 0 && pen.n == 24, "%s", err.msg);
        int repeats = 0, differ = 0, bad = 0;
        for (int t = 0; t < 24; t++) {
            differ += plain.ids[t] != pen.ids[t];
            for (int u = 0; u < t; u++) repeats += plain.ids[u] == plain.ids[t];
        }
        int *count = calloc((size_t)V, sizeof(int));
        float *l = malloc(sizeof(float) * V);
        q35_reset(e, &err);
        int rc = q35_forward(e, prompt, 5, 0, l, &err);
        for (int t = 0; t < 24 && !rc; t++) {
            int best = 0;
            for (int i = 0; i < V; i++) {
                l[i] -= 2.0f * (float)count[i];
                best = l[i] > l[best] ? i : best;
            }
            bad += pen.ids[t] < 0 || pen.ids[t] >= V || l[pen.ids[t]] < l[best] - 0.02f * (1.0f + fabsf(l[best]));
            count[pen.ids[t]]++;
            rc = q35_forward(e, &pen.ids[t], 1, 0, l, &err);
        }
        CHECK(rc == 0 && bad == 0, "frequency 2: %d of 24 greedy ids are not the penalised argmax %s", bad,
              rc ? err.msg : "");
        CHECK(repeats > 0 && differ > 0, "plain greedy repeats ids (%d pairs) and the penalty changes them (%d differ)",
              repeats, differ);
        free(count), free(l);
    }

    /* bad sampling settings are refused, not clamped */
    q35_reset(e, &err);
    s.top_p = 1.5f;
    CHECK(q35_generate(e, prompt, 5, 2, &s, NULL, NULL, NULL, &err) == Q35_ERR_ARG, "top_p 1.5 refused");
    q35_engine_close(e);
    return TEST_SUMMARY("engine");
}
