/* sched.h — the scheduler: one thread owns the engine and runs continuous batching over q35_step. Requests
 * join at any step; prompts are fed in chunks under a per-step token budget next to the running decodes;
 * admission takes free slots and KV blocks; a sequence that cannot get a block preempts the newest one
 * (q35_seq_preempt: recomputed later from its history). HTTP threads submit a Req and read its output as it
 * grows (text per channel, logprobs, finish reason) under the scheduler's lock. */
#ifndef Q35_SERVER_SCHED_H
#define Q35_SERVER_SCHED_H
#include <pthread.h>

#include "qwen35.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "strbuf.h"

typedef struct Sched Sched;

#define SCHED_MAX_SNAPS 8 /* prefix-cache snapshot points per prompt at most (the last ones are kept) */

typedef struct SchedConfig {
    int max_queue;    /* requests waiting for a slot before submit answers 429 */
    int step_tokens;  /* tokens fed per step (prompt chunks + one per decode); at least max_seqs */
    int quiet;        /* no per-request log line */
    int idle_spin_us; /* with nothing to run, poll for new work this long before sleeping (0: sleep at once) */
} SchedConfig;

/* A tool call the chat parser emitted: complete, its arguments JSON text (streamed out in pieces). */
typedef struct ReqCall {
    char *id, *name;
    StrBuf args; /* grows at the end; the HTTP side reads it from what it sent */
} ReqCall;

/* One request. The HTTP side fills the fields above `seq` before sched_submit and reads the output
 * fields under sched_lock; the scheduler owns the rest. Freed by the last of the two sides to let go
 * (sched_release). */
typedef struct Req {
    char id[48];
    OaiRequest rq; /* the parsed request (stop strings, kind, ...) */
    int *toks;     /* prompt ids, then generated ids: [n_prompt + max_tokens] */
    int n_prompt;
    int max_tokens; /* completion tokens at most */
    Q35SeqParams params;
    int min_ids[OAI_MAX_STOP + 16]; /* params.min_ids: the model's stop ids and the request's stop_token_ids */
    int reasoning;                  /* the output starts inside <think>: text before </think> is reasoning_content */
    double t_arrival;               /* monotonic seconds */
    Q35ChatParser *parser;          /* chat: splits the text into reasoning / content / tool calls; NULL: all content */
    Q35Guide *guide; /* tool_choice required / named, response_format: tokens sampled on the host (guided.h) */
    float *logits;   /* guide, plps: [q35_vocab_size] the step's raw logits */
    /* completions with echo and logprobs: the prompt's entries, plps[i] for prompt position i (1 <= i < n_prompt;
     * plps[0].logprob NAN: a first token has none), known up to plp_done. The prompt is fed a token a step from
     * plp_done on (the logits of its last token give the next position's entry), without the prefix cache. */
    OaiTokenLogprob *plps;
    int plp_done;
    uint64_t rng; /* guide: the host sampler's state (from the request's seed) */

    /* scheduler */
    int seq;          /* engine sequence, -1 when not open */
    int n_toks;       /* ids in toks: n_prompt + generated */
    int n_fed;        /* ids of toks the engine holds */
    int stop_matched; /* a stop string matched: nothing more is released */
    int stop_which;   /* ... which one (rq.stop[stop_which]) */
    int calls_done;   /* parallel_tool_calls false and the first call complete: nothing more is parsed */
    int preempted;    /* was preempted at least once */
    int admitted;     /* holds (or held) a slot: counted in the queue limit's free slots */
    int n_cached;     /* prompt ids taken from the prefix cache at admission (usage.prompt_tokens_details) */
    int snap_at[SCHED_MAX_SNAPS], n_snap_at, i_snap; /* prefix-cache snapshot points of the prompt; next one */
    int snap_due;   /* a snapshot point was reached in this step: taken once the step's token is out */
    int lost;       /* a token's text, a call or a logprob entry could not be stored (out of memory) */
    StrBuf pend[2]; /* decoded content not yet released (a stop string may start in it); [1] unused */
    Q35Detok *detok;
    double t_first, t_last;
    double t_admit;  /* admitted (given a sequence) */
    double step1_ms; /* the engine step that produced the first token, its duration */

    /* shared (sched_lock) */
    pthread_cond_t cv;
    struct Req *group; /* n > 1: the request's first choice, whose cv wakes the client of every choice (a reference) */
    StrBuf out[2];     /* released text per channel: 0 content, 1 reasoning */
    ReqCall *calls;    /* tool calls parsed so far */
    int n_calls, cap_calls;
    OaiTokenLogprob *lps; /* one per generated token when rq.top_logprobs >= 0; strings owned */
    int n_lps, cap_lps;
    int n_generated;
    int n_reasoning;           /* generated tokens whose text went (at least in part) to the reasoning */
    int done;                  /* finished: finish_reason set (or error.status != 0) */
    const char *finish_reason; /* "stop" | "length" | "tool_calls" | "abort" */
    OaiError error;            /* status != 0: the request failed in the engine */
    int cancelled;             /* the client went away */
    int refs;
} Req;

int sched_open(Sched **out, Q35Engine *e, const SchedConfig *cfg, Metrics *m, Q35Err *err);
/* Cancels what runs and waits, then stops the threads; the requests stay readable and releasable (the HTTP side
 * can still write their ends and let go of them). The engine stays open. */
void sched_stop(Sched *s);
/* sched_stop (if not done), then frees the scheduler: after every request was released. */
void sched_close(Sched *s);

/* Makes a request with refs = 1 (the caller's); fill it, then sched_submit. NULL when out of memory. */
Req *sched_req_new(void);
/* Queues r (refs += 1). 0, or -1 with e filled: 429 when max_queue requests wait, 503 when shutting down. */
int sched_submit(Sched *s, Req *r, OaiError *e);
/* Drops the caller's reference; if the request still runs it is cancelled (client gone). */
void sched_release(Sched *s, Req *r);
void sched_cancel(Sched *s, Req *r);

void sched_lock(Sched *s);
void sched_unlock(Sched *s);
/* Choice r of a request with n > 1 choices joins the first one's group (before either is submitted): the client
 * waits on first's cv for all of them, and r holds a reference to first. */
void sched_req_group(Req *r, Req *first);
/* Waits on r->cv (sched_lock held) for at most ms milliseconds. */
void sched_wait(Sched *s, Req *r, int ms);

/* Longest prompt + completion a request may ask for: the context, capped by the KV pool. */
int sched_max_context(const Sched *s);
/* Refreshes the gauges (running, waiting, KV usage) in the metrics. */
void sched_gauges(Sched *s);

#endif
