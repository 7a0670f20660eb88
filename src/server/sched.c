/* sched.c — the scheduler thread: continuous batching over q35_step.
 *
 * A running request holds an engine sequence and the ids toks[0, n_toks) (prompt, then generated); the engine
 * has fed n_fed of them, and the last sampled id is never fed yet, so every running request has
 * pending = n_toks - n_fed >= 1 ids to feed. pending == 1 is a decode (one id, sample); more is a prompt (or,
 * after preemption, a recompute) fed in chunks, sampling when the chunk reaches n_toks. One step:
 *   1. every decode (one token each), 2. the prompt chunks of running requests in admission order, 3. new
 *   requests in arrival order while a slot, the step's token budget and free KV blocks allow (no overtaking);
 *   then the KV blocks the step needs are summed (q35_seq_blocks_needed); while they pass the free blocks, the
 *   prompt chunks wait (newest first), then the newest running request is preempted (q35_seq_preempt: blocks back,
 *   n_fed = 0, recomputed later, first in line).
 * Generated text goes through the streaming detokenizer and, for chat, the chat parser (q35_chat_parser_*: reasoning,
 * content and tool calls); stop strings apply to the content (completions: all text): text that could still be the
 * start of a stop string is held back, a matched stop string and what follows are never released. A request with a
 * guide (tool_choice required / named, response_format) gets raw logits from the step and its token is sampled by
 * guided.c. */
#include "server/sched.h"

#include "server/guided.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The clients' wake-ups, off the scheduler thread. A pthread_cond_broadcast that wakes a waiting client thread costs
 * its caller a futex syscall, most of the scheduler's own work per token (docs/SERVE.md, "Scheduling"), and it would
 * sit between two engine steps once per stream. The scheduler queues each step's wake-ups here (one signal) and goes
 * on with the next step. An entry holds a reference to its request (taken under Sched.mu), dropped after the
 * wake-up. */
typedef struct Notifier {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    Req **q; /* queued wake-ups (mu) */
    int n, cap, stop;
} Notifier;

/* A step with at most this many tokens wakes their clients itself, as each token comes: for a lone stream or two the
 * notifier's hop (one more thread wake-up) would only delay the token, and save the scheduler little. */
#define SCHED_WAKE_INLINE 4

struct Sched {
    Q35Engine *e;
    const Q35Tokenizer *tok;
    SchedConfig cfg;
    Metrics *metrics;
    Q35ServeInfo info;
    int max_ctx;
    const int *stop_ids;
    int n_stop_ids;
    GuideVocab *gv;     /* token texts for guided requests (made at the first one) */
    Q35ChatMarks marks; /* the template's turn marks, for the prefix cache's snapshot points */

    pthread_t thread;
    int joined; /* sched_stop ran: the threads are gone */
    pthread_mutex_t mu;
    pthread_cond_t work; /* new request, cancellation or shutdown */
    atomic_uint kick;    /* bumped with every signal of `work`: what the idle scheduler polls (idle_wait) */
    int stopping;
    Req **incoming; /* submitted, not yet seen by the thread (mu) */
    int n_incoming, cap_incoming;
    int n_waiting_total; /* incoming + waiting, for the queue limit (mu) */
    int n_admitted;      /* requests holding a sequence (mu) */

    /* scheduler thread only */
    Req **waiting; /* FIFO */
    int n_waiting, cap_waiting;
    Req **running; /* admission order */
    int n_running;
    Q35StepItem *items;
    Q35StepOut *outs;
    Req **item_req;
    double step_ms; /* the last engine step's duration */
    Req **wl;       /* the step's wake-ups, for the notifier: [max_seqs + 1] */
    int n_wl;
    int wake_now; /* this step's clients are woken as their tokens come (few of them), not by the notifier */
    Notifier nt;
};

/* Wakes the scheduler thread (mu held). */
static void signal_work(Sched *s) {
    atomic_fetch_add_explicit(&s->kick, 1u, memory_order_release);
    pthread_cond_signal(&s->work);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int push(Req ***a, int *n, int *cap, Req *r) {
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 16;
        Req **p = realloc(*a, sizeof *p * (size_t)c);
        if (!p) return -1;
        *a = p;
        *cap = c;
    }
    (*a)[(*n)++] = r;
    return 0;
}

Req *sched_req_new(void) {
    Req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->seq = -1;
    r->refs = 1;
    r->t_first = -1;
    pthread_cond_init(&r->cv, NULL);
    return r;
}

static void unref(Req *r);

static void req_free(Req *r) {
    oai_request_free(&r->rq);
    free(r->toks);
    for (int c = 0; c < 2; c++) {
        sb_free(&r->pend[c]);
        sb_free(&r->out[c]);
    }
    for (int i = 0; i < r->n_lps; i++) {
        free((char *)r->lps[i].token);
        for (int j = 0; j < r->lps[i].n_top; j++) free((char *)r->lps[i].top[j].token);
    }
    free(r->lps);
    for (int i = 0; r->plps && i < r->n_prompt; i++) {
        free((char *)r->plps[i].token);
        for (int j = 0; j < r->plps[i].n_top; j++) free((char *)r->plps[i].top[j].token);
    }
    free(r->plps);
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        sb_free(&r->calls[i].args);
    }
    free(r->calls);
    q35_chat_parser_close(r->parser);
    q35_guide_close(r->guide);
    free(r->logits);
    if (r->detok) q35_detok_close(r->detok);
    pthread_cond_destroy(&r->cv);
    Req *g = r->group;
    free(r);
    if (g) unref(g);
}

void sched_lock(Sched *s) { pthread_mutex_lock(&s->mu); }
void sched_unlock(Sched *s) { pthread_mutex_unlock(&s->mu); }

void sched_wait(Sched *s, Req *r, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&r->cv, &s->mu, &ts);
}

int sched_max_context(const Sched *s) { return s->max_ctx; }

/* Drops one reference (mu held); frees on the last. */
static void unref(Req *r) {
    if (--r->refs == 0) req_free(r);
}

/* The condition variable the client of r waits on: its own, or its group's first choice's (n > 1). */
static void wake(Req *r) { pthread_cond_broadcast(&(r->group ? r->group : r)->cv); }

void sched_req_group(Req *r, Req *first) {
    r->group = first;
    first->refs++;
}

void sched_cancel(Sched *s, Req *r) {
    pthread_mutex_lock(&s->mu);
    if (!r->done && !r->cancelled) {
        r->cancelled = 1;
        signal_work(s);
    }
    pthread_mutex_unlock(&s->mu);
}

void sched_release(Sched *s, Req *r) {
    pthread_mutex_lock(&s->mu);
    if (!r->done) {
        r->cancelled = 1;
        signal_work(s);
    }
    unref(r);
    pthread_mutex_unlock(&s->mu);
}

int sched_submit(Sched *s, Req *r, OaiError *e) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->stopping)
        rc = oai_fail(e, 503, "server_error", NULL, NULL, "the server is shutting down");
    else if (s->n_waiting_total >= s->cfg.max_queue + (s->info.max_seqs - s->n_admitted)) /* beyond free slots */
        rc = oai_fail(e, 429, "rate_limit_error", NULL, NULL, "the server is busy: %d requests are waiting",
                      s->n_waiting_total);
    else if (push(&s->incoming, &s->n_incoming, &s->cap_incoming, r))
        rc = oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (!rc) {
        r->refs++;
        s->n_waiting_total++;
        signal_work(s);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void sched_gauges(Sched *s) {
    Q35ServeInfo in;
    q35_serve_info(s->e, &in);
    pthread_mutex_lock(&s->mu);
    int waiting = s->n_waiting_total;
    pthread_mutex_unlock(&s->mu);
    double kv = in.n_blocks ? (double)(in.n_blocks - in.free_blocks) / in.n_blocks : 0;
    metrics_gauges(s->metrics, in.open_seqs, waiting, kv);
}

/* ---- output: detokenizer, reasoning split, stop strings ---- */

/* Length of the longest suffix of t[0, n) that is a proper prefix of some stop string. */
static size_t stop_hold(const Req *r, const char *t, size_t n) {
    size_t best = 0;
    for (int i = 0; i < r->rq.n_stop; i++) {
        const char *st = r->rq.stop[i];
        size_t ls = strlen(st);
        for (size_t k = ls - 1 < n ? ls - 1 : n; k > best; k--)
            if (!memcmp(t + n - k, st, k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Moves released text of channel c to the shared output (mu held by the caller). */
static void release(Sched *s, Req *r, int c, size_t n) {
    (void)s;
    if (!n) return;
    StrBuf *p = &r->pend[c];
    sb_put(&r->out[c], p->p, n);
    sb_drop(p, n);
}

/* Appends piece to channel c and releases what no stop string can claim; returns 1 when a stop string matched
 * (the text before it is released, the rest dropped). mu held. */
static int channel_put(Sched *s, Req *r, int c, const char *piece, size_t n) {
    StrBuf *p = &r->pend[c];
    if (sb_put(p, piece, n)) return 0;
    size_t first = p->n;
    int which = 0;
    for (int i = 0; i < r->rq.n_stop; i++) {
        const char *hit = memmem(p->p, p->n, r->rq.stop[i], strlen(r->rq.stop[i]));
        if (hit && (size_t)(hit - p->p) < first) first = (size_t)(hit - p->p), which = i;
    }
    if (first < p->n) {
        release(s, r, c, first);
        p->n = 0;
        r->stop_matched = 1;
        r->stop_which = which;
        return 1;
    }
    release(s, r, c, p->n - stop_hold(r, p->p, p->n));
    return 0;
}

/* A chat parser event (mu held): reasoning is released as it comes, content goes through the stop strings, calls
 * are recorded whole. Returns 1 (the parser stops) once a stop string matched. */
static int on_event(void *user, const Q35ChatEvent *ev) {
    Req *r = user;
    switch (ev->type) {
    case Q35_CHAT_EV_REASONING: sb_put(&r->out[1], ev->text, ev->len); return 0;
    case Q35_CHAT_EV_CONTENT: return channel_put(NULL, r, 0, ev->text, ev->len);
    case Q35_CHAT_EV_TOOL_START:
        if (r->n_calls == r->cap_calls) {
            int c = r->cap_calls ? 2 * r->cap_calls : 4;
            ReqCall *p = realloc(r->calls, sizeof *p * (size_t)c);
            if (!p) {
                r->lost = 1;
                return 0;
            }
            r->calls = p;
            r->cap_calls = c;
        }
        r->calls[r->n_calls] = (ReqCall){.id = strdup(ev->id), .name = strdup(ev->name)};
        if (r->calls[r->n_calls].id && r->calls[r->n_calls].name) {
            r->n_calls++;
        } else {
            free(r->calls[r->n_calls].id);
            free(r->calls[r->n_calls].name);
            r->lost = 1;
        }
        return 0;
    case Q35_CHAT_EV_TOOL_ARGS:
        if (r->n_calls > 0 && ev->index == r->n_calls - 1) sb_put(&r->calls[r->n_calls - 1].args, ev->text, ev->len);
        return 0;
    }
    return 0;
}

/* Generated text of r (mu held): through the parser (chat) or straight to the content; 1 when a stop string
 * matched, or (parallel_tool_calls false) the first call is complete: the reply ends there, nothing after it. */
static int emit(Req *r, const char *text, size_t len) {
    if (r->stop_matched || r->calls_done) return 1;
    if (!r->parser) return channel_put(NULL, r, 0, text, len);
    Q35Err err;
    if (q35_chat_parser_push(r->parser, text, len, on_event, r, &err) == Q35_ERR_OOM) r->lost = 1;
    r->calls_done = r->rq.one_call && r->n_calls > 0;
    return r->stop_matched || r->calls_done;
}

/* 1 when part of r's output could not be stored (an append or an allocation failed, mu held): the reply would miss
 * text, a call or logprobs without saying so, so the request ends with an error instead. */
static int output_lost(const Req *r) {
    int lost = r->lost || r->pend[0].oom || r->out[0].oom || r->out[1].oom;
    for (int i = 0; i < r->n_calls; i++) lost |= r->calls[i].args.oom;
    return lost;
}

static void fail_lost(Req *r) {
    oai_fail(&r->error, 500, "server_error", NULL, NULL, "out of memory: the reply could not be stored whole");
}

static char *token_text(Sched *s, int id) {
    char *t = NULL;
    Q35Err err;
    if (!s->tok || q35_detokenize(s->tok, &id, 1, 0, &t, &err)) return strdup("");
    return t;
}

/* o's id and alternatives as *t (token texts owned by it), at most the request's top_logprobs of them; -1 (nothing
 * kept, r->lost set) when a text could not be had. */
static int logprob_entry(Sched *s, Req *r, const Q35StepOut *o, OaiTokenLogprob *t) {
    *t = (OaiTokenLogprob){.token = token_text(s, o->id), .logprob = o->logprob, .part = OAI_PART_OTHER};
    int k = o->n_top < r->rq.top_logprobs ? o->n_top : r->rq.top_logprobs, ok = t->token != NULL;
    for (int j = 0; j < k; j++) {
        t->top[j] = (OaiTopLogprob){token_text(s, o->top_id[j]), o->top_logprob[j]};
        ok &= t->top[j].token != NULL;
    }
    t->n_top = k;
    if (ok) return 0;
    free((char *)t->token);
    for (int j = 0; j < k; j++) free((char *)t->top[j].token);
    r->lost = 1;
    return -1;
}

static void add_logprobs(Sched *s, Req *r, const Q35StepOut *o) {
    if (r->n_lps == r->cap_lps) {
        int c = r->cap_lps ? 2 * r->cap_lps : 64;
        OaiTokenLogprob *p = realloc(r->lps, sizeof *p * (size_t)c);
        if (!p) {
            r->lost = 1;
            return;
        }
        r->lps = p;
        r->cap_lps = c;
    }
    if (!logprob_entry(s, r, o, &r->lps[r->n_lps])) r->n_lps++;
}

static void log_request(const Sched *s, const Req *r, double t_end) {
    if (s->cfg.quiet) return;
    double gen_s = r->t_first >= 0 ? t_end - r->t_first : 0;
    fprintf(stderr,
            "qwen35 serve: %s prompt %d completion %d ttft %.2f ms %.1f tok/s finish %s cached %d queue %.2f ms "
            "step %.2f ms\n",
            r->id, r->n_prompt, r->n_generated, r->t_first >= 0 ? 1e3 * (r->t_first - r->t_arrival) : 0.0,
            gen_s > 0 && r->n_generated > 1 ? (r->n_generated - 1) / gen_s : 0.0,
            r->error.status ? "error" : r->finish_reason, r->n_cached,
            r->admitted ? 1e3 * (r->t_admit - r->t_arrival) : 0.0, r->step1_ms);
}

/* The prefix-cache snapshot of r's sequence at its current length (scheduler thread). */
static void take_snapshot(Sched *s, Req *r) {
    Q35Err err = {0};
    r->snap_due = 0;
    if (r->seq >= 0 && q35_seq_snapshot(s->e, r->seq, &err) && !s->cfg.quiet)
        fprintf(stderr, "qwen35 serve: %s: prefix cache snapshot failed: %s\n", r->id, err.msg);
}

/* Ends r (scheduler thread): flushes held text and wakes the client, then takes a snapshot still due and closes its
 * sequence. */
static void finish(Sched *s, Req *r, const char *reason) {
    double t = now_s();
    pthread_mutex_lock(&s->mu);
    if (strcmp(reason, "abort") && !r->error.status && !r->stop_matched) { /* no stop string can match now */
        const char *text;
        size_t len;
        q35_detok_flush(r->detok, &text, &len);
        if (len) emit(r, text, len);
        int n_calls = 0;
        Q35Err err;
        if (r->parser && !r->stop_matched && !r->calls_done &&
            q35_chat_parser_finish(r->parser, on_event, r, &n_calls, &err) == Q35_ERR_OOM)
            r->lost = 1;
        if (!r->stop_matched) release(s, r, 0, r->pend[0].n);
    }
    if (strcmp(reason, "abort") && !r->error.status && output_lost(r)) fail_lost(r);
    r->finish_reason = r->n_calls > 0 && !strcmp(reason, "stop") ? "tool_calls" : reason; /* metrics: "stop" */
    r->done = 1;
    if (r->admitted) s->n_admitted--;
    pthread_mutex_unlock(&s->mu);
    wake(r); /* after the unlock, as in on_token; r lives until the unref below */
    if (r->snap_due) take_snapshot(s, r);
    if (r->seq >= 0) q35_seq_close(s->e, r->seq);
    r->seq = -1;
    metrics_request(s->metrics, r->n_prompt, r->n_generated, r->t_first >= 0 ? r->t_first - r->t_arrival : -1,
                    t - r->t_arrival, r->error.status ? NULL : reason);
    log_request(s, r, t);
    pthread_mutex_lock(&s->mu);
    unref(r);
    pthread_mutex_unlock(&s->mu);
}

static void fail(Sched *s, Req *r, const char *msg) {
    pthread_mutex_lock(&s->mu);
    oai_fail(&r->error, 500, "server_error", NULL, NULL, "engine error: %s", msg);
    pthread_mutex_unlock(&s->mu);
    finish(s, r, "abort");
}

static void notify(Sched *s);

/* A sampled id for r: record, detokenize, split, stop. Returns 1 when r is finished. */
static int on_token(Sched *s, Req *r, const Q35StepOut *o) {
    double t = now_s();
    int id = o->id;
    r->toks[r->n_toks++] = id;
    if (r->t_first < 0) {
        r->t_first = t;
        r->step1_ms = s->step_ms;
    } else {
        metrics_itl(s->metrics, t - r->t_last);
    }
    r->t_last = t;
    int is_stop_id = 0;
    for (int i = 0; i < s->n_stop_ids && !r->rq.ignore_eos; i++) is_stop_id |= id == s->stop_ids[i];
    for (int i = 0; i < r->rq.n_stop_ids; i++) is_stop_id |= id == r->rq.stop_ids[i]; /* even with ignore_eos */
    pthread_mutex_lock(&s->mu);
    r->n_generated++;
    if (r->rq.top_logprobs >= 0) add_logprobs(s, r, o);
    int stopped = 0;
    const char *text;
    size_t len;
    Q35Err err;
    const size_t reasoned = r->out[1].n, said = r->out[0].n + r->pend[0].n;
    if (!is_stop_id && s->tok) {
        const int drc = q35_detok_push(r->detok, id, &text, &len, &err);
        if (!drc)
            stopped = emit(r, text, len);
        else if (drc == Q35_ERR_OOM) /* the token's text would be left out */
            r->lost = 1;
    }
    r->n_reasoning += r->out[1].n > reasoned;
    if (r->rq.top_logprobs >= 0 && r->n_lps > 0 && r->n_lps == r->n_generated) /* this token's entry */
        r->lps[r->n_lps - 1].part = r->out[1].n > reasoned               ? OAI_PART_REASONING
                                    : r->out[0].n + r->pend[0].n != said ? OAI_PART_CONTENT
                                                                         : OAI_PART_OTHER;
    const int lost = !r->error.status && output_lost(r);
    if (lost) fail_lost(r);
    Req *w = r->group ? r->group : r; /* the client's wake-up: now, or by the notifier after the step (notify) */
    if (!s->wake_now) w->refs++;
    pthread_mutex_unlock(&s->mu);
    if (s->wake_now) {
        wake(w); /* after the unlock: the woken client thread takes mu at once (the scheduler's reference keeps r) */
    } else {
        if (s->n_wl == s->info.max_seqs + 1) notify(s); /* not reached: one token per item and step */
        s->wl[s->n_wl++] = w;
    }
    if (lost) {
        finish(s, r, "abort");
        return 1;
    }
    if (is_stop_id || stopped) {
        finish(s, r, "stop");
        return 1;
    }
    if (r->n_generated >= r->max_tokens || r->n_toks >= s->max_ctx) {
        finish(s, r, "length");
        return 1;
    }
    return 0;
}

/* Hands the step's wake-ups (s->wl) to the notifier thread, or (its queue cannot grow) wakes them here. */
static void notify(Sched *s) {
    if (!s->n_wl) return;
    Notifier *nt = &s->nt;
    pthread_mutex_lock(&nt->mu);
    if (nt->n + s->n_wl > nt->cap) {
        const int cap = 2 * (nt->n + s->n_wl);
        Req **q = realloc(nt->q, sizeof *q * (size_t)cap);
        if (q) nt->q = q, nt->cap = cap;
    }
    const int queued = nt->n + s->n_wl <= nt->cap;
    if (queued) {
        memcpy(nt->q + nt->n, s->wl, sizeof *s->wl * (size_t)s->n_wl);
        nt->n += s->n_wl;
        pthread_cond_signal(&nt->cv);
    }
    pthread_mutex_unlock(&nt->mu);
    if (!queued) {
        for (int i = 0; i < s->n_wl; i++) wake(s->wl[i]);
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->n_wl; i++) unref(s->wl[i]);
        pthread_mutex_unlock(&s->mu);
    }
    s->n_wl = 0;
}

/* The notifier thread: wakes the queued clients (no lock held), then drops the queue's references under Sched.mu.
 * Ends once stopped and drained. */
static void *notifier_main(void *arg) {
    Sched *s = arg;
    Notifier *nt = &s->nt;
    Req **b = NULL; /* the batch being woken: the queue's buffer, swapped with the idle one */
    int bcap = 0;
    pthread_mutex_lock(&nt->mu);
    for (;;) {
        while (!nt->n && !nt->stop) pthread_cond_wait(&nt->cv, &nt->mu);
        if (!nt->n) break;
        Req **q = nt->q;
        const int n = nt->n, qcap = nt->cap;
        nt->q = b, nt->cap = bcap, nt->n = 0;
        b = q, bcap = qcap;
        pthread_mutex_unlock(&nt->mu);
        for (int i = 0; i < n; i++) wake(b[i]);
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < n; i++) unref(b[i]);
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&nt->mu);
    }
    pthread_mutex_unlock(&nt->mu);
    free(b);
    return NULL;
}

/* ---- the step ---- */

/* The next token of a guided request from its logits (into *o); NULL when r was finished instead (nothing allowed:
 * "stop"; no guide vocabulary: an error). */
static const Q35StepOut *guided_token(Sched *s, Req *r, Q35StepOut *o) {
    Q35Err err = {0};
    if (!s->gv && guide_vocab_open(&s->gv, s->tok, q35_vocab_size(s->e), &err)) {
        fail(s, r, err.msg);
        return NULL;
    }
    const GuideHistory h = {r->toks, r->n_toks, r->n_prompt};
    const int past_min = r->n_generated >= r->rq.min_tokens;
    const GuideStops st[2] = {{s->stop_ids, s->n_stop_ids, past_min && !r->rq.ignore_eos},
                              {r->rq.stop_ids, r->rq.n_stop_ids, past_min}};
    if (guide_sample(s->gv, r->guide, r->logits, &h, &r->params, &r->rng, st, 2, o)) {
        finish(s, r, "stop");
        return NULL;
    }
    if (r->rq.top_logprobs >= 0) q35_logprobs(s->e, r->logits, r->rq.top_logprobs, o); /* of the raw row */
    return o;
}

static void remove_running(Sched *s, int i) {
    memmove(&s->running[i], &s->running[i + 1], sizeof(Req *) * (size_t)(s->n_running - i - 1));
    s->n_running--;
}

/* Takes new requests in and ends cancelled ones (their slots are free for this step). */
static void intake(Sched *s) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_incoming; i++) push(&s->waiting, &s->n_waiting, &s->cap_waiting, s->incoming[i]);
    s->n_incoming = 0;
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->n_running; i++) {
        Req *r = s->running[i];
        pthread_mutex_lock(&s->mu);
        int gone = r->cancelled || stopping;
        pthread_mutex_unlock(&s->mu);
        if (gone) {
            remove_running(s, i--);
            finish(s, r, "abort");
        }
    }
    for (int i = 0; i < s->n_waiting; i++) {
        Req *r = s->waiting[i];
        pthread_mutex_lock(&s->mu);
        int gone = r->cancelled || stopping;
        pthread_mutex_unlock(&s->mu);
        if (gone) {
            memmove(&s->waiting[i], &s->waiting[i + 1], sizeof(Req *) * (size_t)(s->n_waiting - i - 1));
            s->n_waiting--;
            i--;
            pthread_mutex_lock(&s->mu);
            s->n_waiting_total--;
            pthread_mutex_unlock(&s->mu);
            finish(s, r, "abort");
        }
    }
}

/* Adds r's part of the step (pending ids, at most budget); returns the tokens it takes. */
static int plan_item(Sched *s, Req *r, int *n_items, int budget) {
    int pending = r->n_toks - r->n_fed;
    int n = pending < budget ? pending : budget;
    if (n <= 0) return 0;
    /* prompt logprobs: up to the positions known (after a preemption) in a chunk, then a token a step */
    const int plp = r->plps && r->n_fed + 1 < r->n_prompt && r->n_fed >= r->plp_done;
    if (r->plps && r->n_fed < r->plp_done && n > r->plp_done - r->n_fed) n = r->plp_done - r->n_fed;
    if (plp) n = 1;
    int k0 = r->i_snap; /* the snapshot points inside the chunk [k0, k1): taken by the step itself */
    while (k0 < r->n_snap_at && r->snap_at[k0] <= r->n_fed) k0++;
    int k1 = k0;
    while (k1 < r->n_snap_at && r->snap_at[k1] < r->n_fed + n && k1 - k0 < Q35_MAX_STEP_SNAPS) k1++;
    s->items[*n_items] = (Q35StepItem){.seq = r->seq,
                                       .ids = r->toks + r->n_fed,
                                       .n = n,
                                       .sample = n == pending,
                                       .snap_at = r->snap_at + k0,
                                       .n_snap_at = k1 - k0};
    if (r->guide && n == pending) s->items[*n_items].sample = 0;                  /* guided: sampled in guided_token */
    if ((r->guide && n == pending) || plp) s->items[*n_items].logits = r->logits; /* guided, prompt logprobs */
    s->item_req[(*n_items)++] = r;
    return n;
}

/* ---- requests that share a prompt start, running at the same time ----
 * Two requests that arrive together with the same long system prompt would both compute it: neither finds it in the
 * prefix cache. So the running request that is still prefilling a start it shares with a waiting one (at least
 * SCHED_SHARE_MIN ids) records a snapshot where they diverge, and the waiting one is admitted once that is cached. */
#define SCHED_SHARE_MIN  128
#define SCHED_SHARE_SCAN 8 /* waiting requests looked at per step */

/* Ids a[0 ..) and b[0 ..) share at their start, at most n. */
static int common_start(const int *a, const int *b, int n) {
    int i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The ids r and q share, as a snapshot point of both (one id of each prompt left to feed), or 0. */
static int shared_point(const Req *r, const Req *q) {
    const int n = (r->n_prompt < q->n_prompt ? r->n_prompt : q->n_prompt) - 1;
    const int c = n > 0 ? common_start(r->toks, q->toks, n) : 0;
    return c >= SCHED_SHARE_MIN ? c : 0;
}

/* Adds snapshot point p to q's remaining ones (kept in order; when all SCHED_MAX_SNAPS are taken, it replaces the
 * nearest remaining one). */
static void snap_add(Req *q, int p) {
    if (p <= q->n_fed) return;
    for (int i = q->i_snap; i < q->n_snap_at; i++)
        if (q->snap_at[i] == p) return;
    if (q->i_snap > 0) { /* the points before i_snap are behind */
        memmove(q->snap_at, q->snap_at + q->i_snap, sizeof(int) * (size_t)(q->n_snap_at - q->i_snap));
        q->n_snap_at -= q->i_snap;
        q->i_snap = 0;
    }
    if (q->n_snap_at == SCHED_MAX_SNAPS)
        q->n_snap_at--, memmove(q->snap_at, q->snap_at + 1, sizeof(int) * (size_t)q->n_snap_at);
    int i = q->n_snap_at;
    while (i > 0 && q->snap_at[i - 1] > p) {
        q->snap_at[i] = q->snap_at[i - 1];
        i--;
    }
    q->snap_at[i] = p;
    q->n_snap_at++;
}

/* 1 when a running request has yet to compute ids that r shares with it: r waits for them to be cached. */
static int share_hold(const Sched *s, const Req *r) {
    for (int i = 0; i < s->n_running; i++) {
        const Req *q = s->running[i];
        if (q->n_fed >= q->n_prompt) continue; /* decoding: its prompt is cached or past caching */
        if (shared_point(r, q) > q->n_fed) return 1;
    }
    return 0;
}

/* Running requests still prefilling: a snapshot where each diverges from the first waiting requests. */
static void share_points(Sched *s) {
    const int nw = s->n_waiting < SCHED_SHARE_SCAN ? s->n_waiting : SCHED_SHARE_SCAN;
    for (int i = 0; i < s->n_running; i++) {
        Req *q = s->running[i];
        if (q->n_fed >= q->n_prompt) continue;
        for (int j = 0; j < nw; j++) {
            const int c = shared_point(s->waiting[j], q);
            if (c) snap_add(q, c);
        }
    }
}

/* Prefix-cache snapshot points of r's prompt after `from` (q35_chat_prefix_points, the last SCHED_MAX_SNAPS); none
 * without the cache. The step whose chunk holds a point takes its snapshot (Q35StepItem.snap_at); a point at a
 * chunk's end is taken after that step. */
static void snap_points(const Sched *s, Req *r, int from, int matched) {
    r->n_snap_at = s->info.prefix_bytes > 0 ? q35_chat_prefix_points(&s->marks, r->toks, r->n_prompt, from, matched,
                                                                     r->snap_at, SCHED_MAX_SNAPS)
                                            : 0;
    r->i_snap = 0;
}

/* Opens a sequence for the waiting request r, resumed from the prefix cache where it can; 0 or a Q35_ERR_*. */
static int admit(Sched *s, Req *r, Q35Err *err) {
    Q35PrefixHit hit = {0};
    int rc = r->plps ? q35_seq_open(s->e, &r->params, &r->seq, err) /* every position's logits are needed */
                     : q35_seq_open_cached(s->e, &r->params, r->toks, r->n_prompt, &r->seq, &hit, err);
    if (rc) return rc;
    r->n_fed = r->n_cached = hit.cached;
    snap_points(s, r, hit.cached, hit.matched);
    if (!r->detok && (rc = q35_detok_open(&r->detok, s->tok, 1, err))) {
        q35_seq_close(s->e, r->seq);
        r->seq = -1;
    }
    return rc;
}

/* KV blocks the planned items need beyond what their sequences hold. */
static int blocks_needed(Sched *s, int n_items) {
    int need = 0;
    for (int i = 0; i < n_items; i++) need += q35_seq_blocks_needed(s->e, s->items[i].seq, s->items[i].n);
    return need;
}

/* Preempts the newest running request: its blocks go back, it is recomputed from its ids (first in line). */
static Req *preempt_newest(Sched *s) {
    Req *victim = s->running[s->n_running - 1];
    remove_running(s, s->n_running - 1);
    Q35Err err = {0};
    if (q35_seq_preempt(s->e, victim->seq, &err)) {
        fail(s, victim, err.msg);
        return victim;
    }
    victim->n_fed = 0;
    victim->preempted = 1;
    memmove(&s->running[1], &s->running[0], sizeof(Req *) * (size_t)s->n_running);
    s->running[0] = victim;
    s->n_running++;
    if (!s->cfg.quiet) fprintf(stderr, "qwen35 serve: %s preempted (KV blocks full), recomputed later\n", victim->id);
    return victim;
}

/* Drops r's planned item; returns the items left. */
static int drop_item(Sched *s, int n_items, const Req *r) {
    int k = 0;
    for (int i = 0; i < n_items; i++)
        if (s->item_req[i] != r) {
            s->items[k] = s->items[i];
            s->item_req[k++] = s->item_req[i];
        }
    return k;
}

/* plps[at] from r->logits, the raw logits after prompt position at - 1: the logprob of the prompt's token there and
 * the request's top_logprobs alternatives, as generation reports them. */
static void prompt_logprob(Sched *s, Req *r, int at) {
    if (at <= r->plp_done || r->lost) return; /* lost: the request fails at its first token (on_token) */
    Q35StepOut o = {.id = r->toks[at]};
    q35_logprobs(s->e, r->logits, r->rq.top_logprobs, &o);
    OaiTokenLogprob t;
    if (logprob_entry(s, r, &o, &t)) return;
    pthread_mutex_lock(&s->mu);
    r->plps[at] = t;
    r->plp_done = at;
    pthread_mutex_unlock(&s->mu);
}

static void step(Sched *s) {
    int n_items = 0, budget = s->cfg.step_tokens;
    Q35ServeInfo in;
    q35_serve_info(s->e, &in);
    const int sharing = in.prefix_bytes > 0; /* the prefix cache is on */
    if (sharing) share_points(s);            /* before the chunks are planned: they end at the snapshot points */
    for (int i = 0; i < s->n_running; i++)   /* decodes first: one token each */
        if (s->running[i]->n_toks - s->running[i]->n_fed == 1) budget -= plan_item(s, s->running[i], &n_items, 1);
    for (int i = 0; i < s->n_running && budget > 0; i++)
        if (s->running[i]->n_toks - s->running[i]->n_fed > 1) budget -= plan_item(s, s->running[i], &n_items, budget);
    int need = blocks_needed(s, n_items);
    while (budget > 0 && s->n_waiting > 0 && s->n_running < in.max_seqs) {
        Req *r = s->waiting[0];
        if (sharing && share_hold(s, r)) break; /* the queue waits one step or a few for the shared start */
        Q35Err err = {0};
        int rc = admit(s, r, &err);
        if (rc == Q35_ERR_OOM) break;
        memmove(&s->waiting[0], &s->waiting[1], sizeof(Req *) * (size_t)(s->n_waiting - 1));
        s->n_waiting--;
        pthread_mutex_lock(&s->mu);
        s->n_waiting_total--;
        pthread_mutex_unlock(&s->mu);
        if (rc) {
            fail(s, r, err.msg);
            continue;
        }
        int first = r->n_toks - r->n_fed < budget ? r->n_toks - r->n_fed : budget;
        int more = q35_seq_blocks_needed(s->e, r->seq, first);
        if (need + more > in.free_blocks && n_items > 0) { /* wait for blocks; keep its place in the queue */
            q35_seq_close(s->e, r->seq);
            r->seq = -1;
            memmove(&s->waiting[1], &s->waiting[0], sizeof(Req *) * (size_t)s->n_waiting);
            s->waiting[0] = r;
            s->n_waiting++;
            pthread_mutex_lock(&s->mu);
            s->n_waiting_total++;
            pthread_mutex_unlock(&s->mu);
            break;
        }
        s->running[s->n_running++] = r;
        if (sharing) /* the requests behind it that share its start: a snapshot where they diverge, before its chunk */
            for (int j = 0; j < s->n_waiting && j < SCHED_SHARE_SCAN; j++) {
                const int c = shared_point(s->waiting[j], r);
                if (c) snap_add(r, c);
            }
        metrics_prefix(s->metrics, r->n_prompt, r->n_cached);
        r->t_admit = now_s();
        pthread_mutex_lock(&s->mu);
        r->admitted = 1;
        s->n_admitted++;
        pthread_mutex_unlock(&s->mu);
        need += more;
        budget -= plan_item(s, r, &n_items, budget);
    }
    /* Not enough blocks. First the prompt chunks wait, the newest first (the decodes and one item at least stay): a
     * chunk only adds blocks, and preempting a running request to make room for one throws work away. A preempted
     * request is first in line, so its recompute's chunk would preempt the next newest, whose recompute then
     * preempts the one after: under a full pool the requests took turns throwing each other out (docs/SERVE.md,
     * "Scheduling"). */
    for (int i = n_items - 1; i >= 0 && need > in.free_blocks && n_items > 1; i--) {
        const Req *r = s->item_req[i];
        if (r->n_toks - r->n_fed > 1) {
            n_items = drop_item(s, n_items, r);
            need = blocks_needed(s, n_items);
        }
    }
    /* Still not enough (the decodes' next blocks, or the one chunk left): preempt the newest running requests (they
     * give back their blocks; recomputed later). */
    for (int tries = s->n_running - 1; need > in.free_blocks && tries > 0; tries--) {
        n_items = drop_item(s, n_items, preempt_newest(s));
        need = blocks_needed(s, n_items);
        q35_serve_info(s->e, &in);
    }
    if (n_items == 0) return;
    Q35Err err = {0};
    const double t0 = now_s();
    int rc = q35_step(s->e, s->items, n_items, s->outs, &err);
    s->step_ms = 1e3 * (now_s() - t0);
    if (rc == Q35_ERR_OOM && s->n_running > 1) { /* nothing changed: make room and plan again */
        preempt_newest(s);
        return;
    }
    if (rc) {
        for (int i = 0; i < n_items; i++) { /* these sequences are unusable now */
            Req *r = s->item_req[i];
            for (int j = 0; j < s->n_running; j++)
                if (s->running[j] == r) remove_running(s, j);
            fail(s, r, err.msg);
        }
        return;
    }
    /* a snapshot due where an item sampled is taken after its token is out (in finish() when it was the last): the
     * client does not wait for the copies */
    int n_tokens = 0; /* items that give a token: at most SCHED_WAKE_INLINE, their clients are woken at once */
    for (int i = 0; i < n_items; i++) n_tokens += s->items[i].sample || (s->item_req[i]->guide && s->items[i].logits);
    s->wake_now = n_tokens <= SCHED_WAKE_INLINE;
    for (int i = 0; i < n_items; i++) {
        Req *r = s->item_req[i];
        r->n_fed += s->items[i].n;
        for (; r->i_snap < r->n_snap_at && r->snap_at[r->i_snap] <= r->n_fed; r->i_snap++)
            if (r->snap_at[r->i_snap] == r->n_fed) r->snap_due = 1;
        if (r->snap_due && !s->items[i].sample) take_snapshot(s, r);
        const Q35StepOut *o = &s->outs[i];
        if (r->plps && s->items[i].logits && r->n_fed < r->n_prompt) { /* the entry of prompt position n_fed */
            prompt_logprob(s, r, r->n_fed);
            continue;
        }
        if (r->guide && s->items[i].logits) {
            o = guided_token(s, r, &s->outs[i]);
            if (!o) {
                for (int j = 0; j < s->n_running; j++)
                    if (s->running[j] == r) remove_running(s, j);
                continue;
            }
        } else if (!s->items[i].sample)
            continue;
        if (on_token(s, r, o)) {
            for (int j = 0; j < s->n_running; j++)
                if (s->running[j] == r) remove_running(s, j);
        } else if (r->snap_due) {
            take_snapshot(s, r);
        }
    }
    notify(s);
}

/* With nothing to run, polls for new work for cfg.idle_spin_us before the thread sleeps on `work`: a request that
 * arrives meanwhile starts without the wake-up of a sleeping thread (tens of microseconds of its TTFT). */
static void idle_wait(Sched *s) {
    if (s->cfg.idle_spin_us <= 0 || s->n_running > 0 || s->n_waiting > 0) return;
    const unsigned k0 = atomic_load_explicit(&s->kick, memory_order_acquire);
    const double t_end = now_s() + 1e-6 * s->cfg.idle_spin_us;
    for (int i = 0; atomic_load_explicit(&s->kick, memory_order_acquire) == k0; i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if ((i & 63) == 63 && now_s() >= t_end) break;
    }
}

static void *sched_main(void *arg) {
    Sched *s = arg;
    for (;;) {
        idle_wait(s);
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->n_incoming == 0 && s->n_running == 0 && s->n_waiting == 0)
            pthread_cond_wait(&s->work, &s->mu);
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        intake(s);
        sched_gauges(s);
        if (stopping) break;
        step(s);
    }
    return NULL;
}

int sched_open(Sched **out, Q35Engine *e, const SchedConfig *cfg, Metrics *m, Q35Err *err) {
    Sched *s = calloc(1, sizeof *s);
    if (!s) {
        err->code = Q35_ERR_OOM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return Q35_ERR_OOM;
    }
    s->e = e;
    s->tok = q35_engine_tokenizer(e);
    s->cfg = *cfg;
    s->metrics = m;
    q35_serve_info(e, &s->info);
    s->max_ctx = s->info.max_context;
    long pool = (long)s->info.n_blocks * s->info.kv_block;
    if (s->info.n_blocks > 0 && pool < s->max_ctx) s->max_ctx = (int)pool;
    s->n_stop_ids = s->tok ? q35_tokenizer_stop_ids(s->tok, &s->stop_ids) : 0; /* --dummy: no tokenizer */
    q35_chat_marks(s->tok, &s->marks);                                         /* --dummy: no tokenizer, no marks */
    if (s->cfg.step_tokens < s->info.max_seqs) s->cfg.step_tokens = s->info.max_seqs;
    int cap = s->info.max_seqs + 1;
    s->running = calloc((size_t)cap, sizeof *s->running);
    s->items = calloc((size_t)cap, sizeof *s->items);
    s->outs = calloc((size_t)cap, sizeof *s->outs);
    s->item_req = calloc((size_t)cap, sizeof *s->item_req);
    s->wl = calloc((size_t)cap, sizeof *s->wl);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_mutex_init(&s->nt.mu, NULL);
    pthread_cond_init(&s->nt.cv, NULL);
    int started = 0; /* 1: the notifier thread runs, 2: both threads */
    if (s->running && s->items && s->outs && s->item_req && s->wl &&
        !pthread_create(&s->nt.thread, NULL, notifier_main, s))
        started = 1;
    if (started && !pthread_create(&s->thread, NULL, sched_main, s)) started = 2;
    if (started < 2) {
        if (started) {
            pthread_mutex_lock(&s->nt.mu);
            s->nt.stop = 1;
            pthread_cond_signal(&s->nt.cv);
            pthread_mutex_unlock(&s->nt.mu);
            pthread_join(s->nt.thread, NULL);
        }
        err->code = Q35_ERR_OOM;
        snprintf(err->msg, sizeof err->msg, "cannot start the scheduler thread");
        free(s->running);
        free(s->items);
        free(s->outs);
        free(s->item_req);
        free(s->wl);
        free(s);
        return Q35_ERR_OOM;
    }
    *out = s;
    return 0;
}

void sched_stop(Sched *s) {
    if (!s || s->joined) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    signal_work(s);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->nt.mu); /* the scheduler queues no more: the notifier drains its queue and ends */
    s->nt.stop = 1;
    pthread_cond_signal(&s->nt.cv);
    pthread_mutex_unlock(&s->nt.mu);
    pthread_join(s->nt.thread, NULL);
    s->joined = 1;
}

void sched_close(Sched *s) {
    if (!s) return;
    sched_stop(s);
    free(s->nt.q);
    pthread_cond_destroy(&s->nt.cv);
    pthread_mutex_destroy(&s->nt.mu);
    free(s->wl);
    free(s->incoming);
    free(s->waiting);
    free(s->running);
    free(s->items);
    free(s->outs);
    free(s->item_req);
    guide_vocab_close(s->gv);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
