/* guided.c — host sampling under a guide (guided.h: tool_choice required / named, response_format). Per guided
 * token: one q35_guide_allows per id with text whose first byte the guide takes here (over the OpenMP threads), then
 * over the allowed ids
 *   p_i = softmax(l_i / T), cut to the top_k largest, to p_i >= min_p * max p, to the smallest prefix (largest
 *   first) whose sum reaches top_p, renormalized, one uniform draw;
 * where l is the raw logits row with the request's logit changes (bias, repetition / presence / frequency penalties:
 * sampler.h's rule, from the request's ids). (The token's logprobs are the caller's: q35_logprobs of the raw row.) */
#include "server/guided.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

typedef struct Cand {
    float x; /* logit / T */
    int id;
} Cand;

struct GuideVocab {
    int vocab;
    size_t *off; /* [vocab + 1]: text of id i is text[off[i], off[i+1]); empty: never offered */
    char *text;
    /* guide_sample's scratch, reused token after token (one scheduler thread samples): */
    Cand *cand;         /* [vocab] the allowed candidates */
    unsigned char *ok;  /* [vocab] the ids the guide allows */
    float *changed;     /* [vocab] the logits with a request's logit changes */
    SamplePenalty *pen; /* [vocab] those changes, one entry per id: pen[0, n_pen) */
    int *pen_at;        /* [vocab] 1 + the entry of an id in pen, 0: none (all 0 between calls) */
};

int guide_vocab_open(GuideVocab **out, const Q35Tokenizer *t, int vocab, Q35Err *err) {
    GuideVocab *v = calloc(1, sizeof *v);
    size_t cap = (size_t)vocab * 8, n = 0;
    if (v) {
        v->off = malloc(sizeof *v->off * ((size_t)vocab + 1));
        v->text = malloc(cap);
        v->cand = malloc(sizeof *v->cand * (size_t)vocab);
        v->ok = malloc((size_t)vocab);
        v->changed = malloc(sizeof *v->changed * (size_t)vocab);
        v->pen = malloc(sizeof *v->pen * (size_t)vocab);
        v->pen_at = calloc((size_t)vocab, sizeof *v->pen_at);
    }
    if (!v || !v->off || !v->text || !v->cand || !v->ok || !v->changed || !v->pen || !v->pen_at) goto oom;
    v->vocab = vocab;
    int n_tok = q35_tokenizer_size(t);
    for (int id = 0; id < vocab; id++) {
        v->off[id] = n;
        char *s = NULL;
        Q35Err e;
        if (id >= n_tok || q35_detokenize(t, &id, 1, 1, &s, &e)) continue;
        size_t k = strlen(s);
        if (strstr(s, "\xEF\xBF\xBD")) k = 0; /* a piece of a character: not offered */
        if (n + k > cap) {
            while (n + k > cap) cap *= 2;
            char *p = realloc(v->text, cap);
            if (!p) {
                free(s);
                goto oom;
            }
            v->text = p;
        }
        memcpy(v->text + n, s, k);
        n += k;
        free(s);
    }
    v->off[vocab] = n;
    *out = v;
    return 0;
oom:
    guide_vocab_close(v);
    err->code = Q35_ERR_OOM;
    snprintf(err->msg, sizeof err->msg, "out of memory (guide vocabulary)");
    return Q35_ERR_OOM;
}

void guide_vocab_close(GuideVocab *v) {
    if (!v) return;
    free(v->off);
    free(v->text);
    free(v->cand);
    free(v->ok);
    free(v->changed);
    free(v->pen);
    free(v->pen_at);
    free(v);
}

static int cand_desc(const void *a, const void *b) {
    float x = ((const Cand *)a)->x, y = ((const Cand *)b)->x;
    return x < y ? 1 : x > y ? -1 : ((const Cand *)a)->id - ((const Cand *)b)->id;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* -1 when id is in none of the stop sets, else whether a set holding it may end the completion now (0 / 1) */
static int stop_state(int id, const GuideStops *st, int n_st) {
    int found = 0;
    for (int k = 0; k < n_st; k++)
        for (int i = 0; i < st[k].n; i++)
            if (st[k].ids[i] == id) {
                if (st[k].ok) return 1;
                found = 1;
            }
    return found ? 0 : -1;
}

/* Moves the k first candidates of cand_desc's order to c[0, k) (in no order): quickselect, O(n). */
static void select_top(Cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const Cand pivot = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_desc(&c[i], &pivot) < 0) i++;
            while (cand_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) {
                const Cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* Draws from the allowed candidates c[0, n) (n >= 1) by the request's sampling parameters: softmax(x / T) over the
 * top_k largest, then those at least min_p of the largest, then the smallest prefix (largest first) whose mass
 * reaches top_p. Only top_p needs the candidates in order: without it they are drawn from as they lie, so a near-flat
 * row over the whole vocabulary costs no sort. */
static int draw(Cand *c, int n, const Q35Sampling *sp, uint64_t *rng) {
    if (sp->temperature <= 0 || n == 1) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (c[i].x > c[best].x) best = i;
        return c[best].id;
    }
    for (int i = 0; i < n; i++) c[i].x /= sp->temperature;
    if (sp->top_k > 0 && sp->top_k < n) {
        select_top(c, n, sp->top_k);
        n = sp->top_k;
    }
    const int ordered = sp->top_p > 0 && sp->top_p < 1;
    if (ordered) qsort(c, (size_t)n, sizeof *c, cand_desc);
    float mx = c[0].x;
    for (int i = 1; i < n; i++) mx = c[i].x > mx ? c[i].x : mx;
    double sum = 0;
    int keep = 0;
    for (int i = 0; i < n; i++) {
        double p = exp((double)c[i].x - mx);
        if (p < sp->min_p) { /* p / p_max < min_p: in order, the rest are smaller too */
            if (ordered) break;
            continue;
        }
        c[keep].x = (float)p;
        c[keep++].id = c[i].id;
        sum += p;
    }
    if (ordered) {
        double acc = 0;
        for (int i = 0; i < keep; i++)
            if ((acc += c[i].x) >= sp->top_p * sum) {
                keep = i + 1;
                sum = acc;
                break;
            }
    }
    double u = (double)(splitmix(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
    for (int i = 0; i < keep; i++)
        if ((u -= c[i].x) < 0) return c[i].id;
    return c[keep - 1].id;
}

/* 1 if id has text and all of it is blanks / newlines. */
static int blank(const GuideVocab *v, int id) {
    if (id < 0 || id >= v->vocab || v->off[id] == v->off[id + 1]) return 0;
    for (size_t i = v->off[id]; i < v->off[id + 1]; i++)
        if (!strchr(" \t\r\n", v->text[i])) return 0;
    return 1;
}

/* The entry of id in v->pen, added (no change yet) when it has none. */
static SamplePenalty *pen_entry(GuideVocab *v, int *n_pen, int id) {
    if (!v->pen_at[id]) {
        v->pen[*n_pen] = (SamplePenalty){id, 0, 0.0f, 0};
        v->pen_at[id] = ++*n_pen;
    }
    return &v->pen[v->pen_at[id] - 1];
}

/* The request's logit changes into v->changed (a copy of logits): the bias ids, every id of the history under a
 * repetition penalty, the generated ones (h->ids[h->n_prompt, h->n)) under a presence or frequency penalty, each
 * changed by sampler_penalize. Returns v->changed, or logits when nothing changes. */
static const float *change_logits(GuideVocab *v, const float *logits, const Q35SeqParams *sp, const GuideHistory *h) {
    const Q35Sampling *c = &sp->sampling;
    const int seen = c->repetition_penalty != 1.0f, gen = c->presence_penalty != 0.0f || c->frequency_penalty != 0.0f;
    int n_pen = 0;
    for (int k = 0; k < sp->n_bias; k++)
        if (sp->bias_ids[k] >= 0 && sp->bias_ids[k] < v->vocab) {
            SamplePenalty *e = pen_entry(v, &n_pen, sp->bias_ids[k]);
            e->flags |= PEN_BIAS;
            e->bias = sp->bias[k]; /* an id given twice: the later value */
        }
    for (int i = 0; (seen || gen) && i < h->n; i++) {
        const int id = h->ids[i], generated = i >= h->n_prompt;
        if (id < 0 || id >= v->vocab || !(seen || (gen && generated))) continue;
        SamplePenalty *e = pen_entry(v, &n_pen, id);
        e->flags |= PEN_SEEN | (generated ? PEN_GEN : 0);
        e->count += generated;
    }
    if (!n_pen) return logits;
    memcpy(v->changed, logits, sizeof *v->changed * (size_t)v->vocab);
    for (int k = 0; k < n_pen; k++) {
        const SamplePenalty *e = &v->pen[k];
        v->changed[e->id] =
            sampler_penalize(logits[e->id], e, c->repetition_penalty, c->presence_penalty, c->frequency_penalty);
        v->pen_at[e->id] = 0;
    }
    return v->changed;
}

int guide_sample(GuideVocab *v, Q35Guide *g, const float *logits, const GuideHistory *h, const Q35SeqParams *sp,
                 uint64_t *rng, const GuideStops *stops, int n_stops, Q35StepOut *o) {
    memset(o, 0, sizeof *o);
    o->id = -1;
    Cand *c = v->cand;
    unsigned char *ok = v->ok;
    const float *xl = change_logits(v, logits, sp, h);
    const int prev = h->n > h->n_prompt ? h->ids[h->n - 1] : -1;
    /* the bytes a token may start with here: most ids are refused by their first byte without a walk */
    unsigned char first[256];
    for (int c = 0; c < 256; c++) first[c] = (unsigned char)q35_guide_allows(g, (const char[]){(char)c}, 1);
        /* the allowed ids, over the threads (the guide is only read) */
#pragma omp parallel for schedule(static, 2048)
    for (int id = 0; id < v->vocab; id++) {
        const size_t a = v->off[id], b = v->off[id + 1];
        ok[id] = (unsigned char)(b > a && first[(unsigned char)v->text[a]] && q35_guide_allows(g, v->text + a, b - a));
    }
    /* the stop ids: never as text, only where the guide may end and a set holding them is ok */
    const int can_stop = q35_guide_can_stop(g);
    for (int k = 0; k < n_stops; k++)
        for (int i = 0; i < stops[k].n; i++) {
            const int id = stops[k].ids[i];
            if (id >= 0 && id < v->vocab) ok[id] = (unsigned char)(can_stop && stop_state(id, stops, n_stops) == 1);
        }
    int n = 0, n_blank = 0, after_blank = blank(v, prev);
    for (int id = 0; id < v->vocab; id++) {
        if (!ok[id] || !isfinite(xl[id])) continue;
        if (after_blank && blank(v, id)) { /* kept at the end, used only if nothing else is allowed */
            n_blank++;
            c[v->vocab - n_blank] = (Cand){xl[id], id};
        } else
            c[n++] = (Cand){xl[id], id};
    }
    if (n == 0 && n_blank > 0) {
        memmove(c, c + v->vocab - n_blank, sizeof *c * (size_t)n_blank);
        n = n_blank;
    }
    int id = n ? draw(c, n, &sp->sampling, rng) : -1;
    if (id < 0) return -1;
    o->id = id;
    if (stop_state(id, stops, n_stops) < 0) {
        Q35Err err;
        q35_guide_push(g, v->text + v->off[id], v->off[id + 1] - v->off[id], &err);
    }
    return 0;
}
