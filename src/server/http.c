/* http.c — libmicrohttpd front: one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so a handler may
 * block on its own request: a non-streamed completion waits for the scheduler in the handler; a streamed one
 * waits in the content reader between SSE events. Both poll the client's socket while they wait, so a client
 * that goes away cancels its request within one step. Request flow: body (at most max_body bytes, else 413)
 * -> route (404 / 405) -> auth (401) -> oai_parse_request / oai_parse_responses / ant_parse_messages (400) ->
 * model (404) -> prompt ids (chat template or tokenizer) -> context check (400) -> sched_submit (429 / 503).
 * /v1/responses and /v1/messages run as chat requests; only their answers differ (responses.h, anthropic.h: the
 * blocks of blk_collect, each API's events from its BlkApi). Shutdown: http_quiesce, sched_stop, http_drain,
 * http_stop, sched_close. */
#include "server/http.h"

#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/anthropic.h"
#include "server/responses.h"

struct Http {
    HttpConfig cfg;
    struct MHD_Daemon *d;
    Q35Engine *e;
    Q35Tokenizer *tok;
    Sched *s;
    Metrics *m;
    int vocab;
    long started;
    atomic_ulong next_id;
    atomic_int stopping;
    atomic_int active; /* requests (Conn) not completed yet */
};

/* One choice of a request: its scheduler request and what of it was streamed. */
typedef struct Choice {
    Req *req;
    char *echo; /* completions with echo: the prompt's text, sent before the completion */
    int role_sent, done;
    size_t sent[2];   /* bytes of out[0] (content) / out[1] (reasoning) sent */
    int calls_sent;   /* tool calls whose first delta (index, id, name) went out */
    size_t args_sent; /* bytes of calls[calls_sent - 1].args sent */
    int lps_sent;
    size_t text_offset;
} Choice;

/* The output blocks of a /v1/responses or /v1/messages stream: reasoning, text and tool calls (OAI_ITEM_*) in the
 * order they were opened; the last one is open until one of another kind (or another call) starts, or the end. */
typedef struct Blk {
    int type;    /* OAI_ITEM_* */
    int call;    /* calls: the index in Req.calls */
    char id[64]; /* the API's prefix + the response's id + its position */
    char *text;  /* reasoning / message text, or call arguments, streamed so far */
    size_t len;
    char *call_id, *name; /* calls: copies (Req.calls may move while the scheduler adds calls) */
    int done;             /* OaiRespItem.done once closed */
    OaiTokenLogprob *lps; /* text: its tokens' logprobs (copies; their strings are the request's) */
    int n_lps, cap_lps;
} Blk;
struct Conn;
/* How a stream ended: status "completed" / "incomplete" (max tokens) / "failed" (err). */
typedef struct BlkEnd {
    const char *status;
    const OaiError *err;
    const char *finish_reason; /* the chat path's */
    const char *stop_sequence; /* the stop string that matched, or NULL */
    const OaiUsage *u;
} BlkEnd;
/* An API's events around the blocks (at: the block's index). */
typedef struct BlkApi {
    const char *prefix[3]; /* block ids by type */
    void (*start)(struct Conn *c, const OaiUsage *u);
    void (*open)(struct Conn *c, int at, const OaiRespItem *it);
    /* lps[0, n_lps): the logprobs of the text tokens the delta carries */
    void (*delta)(struct Conn *c, int at, const OaiRespItem *it, const char *d, const OaiTokenLogprob *lps, int n_lps);
    void (*close)(struct Conn *c, int at, const OaiRespItem *it);
    void (*end)(struct Conn *c, const BlkEnd *e);
} BlkApi;
typedef struct BlkStream {
    const BlkApi *api;
    int seq; /* the next event's sequence_number (Responses) */
    Blk *items;
    int n, cap;
    int open;              /* items[n - 1] is open */
    int started;           /* the start events went out */
    OaiTokenLogprob *pend; /* text tokens' logprobs not sent yet with a text delta */
    int n_pend, cap_pend;
} BlkStream;

typedef struct Conn {
    Http *h;
    StrBuf body;
    int too_large;
    int fd;
    Choice ch[OAI_MAX_CHOICES]; /* n choices (rq.n) per prompt (rq.n_prompts), prompt by prompt; ch[0].req is the
                                 * request (its cv wakes this connection) */
    int n_ch;
    Req *req; /* a /tokenize request (not scheduled) */
    OaiMeta meta;
    int api; /* the route's API: OAI_CHAT, OAI_COMPLETION, OAI_RESPONSES or OAI_MESSAGES */
    BlkStream bs;
    /* streaming */
    int end_sent;
    StrBuf ev; /* SSE bytes ready to write, from ev_off on */
    size_t ev_off;
} Conn;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- replies ---- */

static enum MHD_Result reply(struct MHD_Connection *mc, int status, const char *ctype, char *body) {
    if (!body) {
        status = 500;
        ctype = "application/json";
        body = strdup(
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
        if (!body) return MHD_NO;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 405) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, POST");
    enum MHD_Result rc = MHD_queue_response(mc, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result reply_error(Conn *c, struct MHD_Connection *mc, const char *url, const OaiError *e) {
    if (!c->h->cfg.quiet)
        fprintf(stderr, "qwen35 serve: %s %d %s%s%s\n", url, e->status, e->message, e->param[0] ? " param " : "",
                e->param);
    return reply(mc, e->status, "application/json", c->api == OAI_MESSAGES ? ant_error_json(e) : oai_error_json(e));
}

/* ---- waiting on a request ---- */

/* The client closed its end (or the socket broke). Only valid while MHD is not reading this socket, which holds
 * in our handler and content reader (thread per connection). */
static int client_gone(const Conn *c) {
    if (c->fd < 0) return 0;
    struct pollfd p = {c->fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    char b;
    return recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* ---- prompt ---- */

/* The request's guide (tool_choice required / named, or response_format) for rq, and what guided sampling needs:
 * the logits row and the host sampler's state. A guide that cannot be made is a 400 naming param. */
static int open_guide(Http *h, Req *r, const Q35ChatRequest *rq, const char *param, OaiError *e) {
    Q35Err err = {0};
    if (q35_guide_open(&r->guide, h->tok, rq, &err))
        return oai_fail(e, 400, "invalid_request_error", NULL, param, "%s", err.msg);
    if (!(r->logits = malloc(sizeof(float) * (size_t)q35_vocab_size(h->e))))
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    r->rng = r->params.sampling.seed;
    return 0;
}

/* Chat: renders the conversation and tools (q35_chat_render_request) into *text (text NULL: no rendering, for a
 * choice that takes choice 0's ids) and opens the request's output parser, plus its guide for tool_choice required /
 * named or a response_format. */
static int chat_prompt(Http *h, Req *r, char **text, OaiError *e) {
    const OaiRequest *q = &r->rq;
    Q35Err err = {0};
    int n_calls = 0;
    for (int i = 0; i < q->n_messages; i++) n_calls += q->messages[i].n_tool_calls;
    const size_t nm = q->n_messages > 0 ? (size_t)q->n_messages : 0; /* a parsed chat request has at least one */
    Q35ChatMessage *m = calloc(nm + 1, sizeof *m);
    Q35ChatToolCall *tc = calloc((size_t)n_calls + 1, sizeof *tc);
    if (!m || !tc) {
        free(m);
        free(tc);
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    for (int i = 0, k = 0; i < q->n_messages; i++) {
        const OaiMessage *om = &q->messages[i];
        m[i] = (Q35ChatMessage){.role = om->role,
                                .content = om->content,
                                .reasoning = om->reasoning,
                                .tool_calls = tc + k,
                                .n_tool_calls = om->n_tool_calls,
                                .tool_call_id = om->tool_call_id};
        for (int j = 0; j < om->n_tool_calls; j++, k++)
            tc[k] = (Q35ChatToolCall){om->tool_calls[j].id, om->tool_calls[j].name, om->tool_calls[j].arguments};
    }
    int think = q->thinking != Q35_THINK_DEFAULT ? q->thinking : h->cfg.think;
    r->reasoning = think == Q35_THINK_ON;
    Q35ChatRequest cr = {.messages = m,
                         .n_messages = q->n_messages,
                         .tools = q->tools,
                         .tool_choice = q->tool_choice,
                         .tool_choice_name = q->tool_choice_name,
                         .add_generation_prompt = 1,
                         .thinking = think,
                         .response_schema = q->response_schema};
    int rc = text ? q35_chat_render_request(h->tok, &cr, text, &err) : 0;
    if (rc) oai_fail(e, 400, "invalid_request_error", NULL, "messages", "%s", err.msg);
    /* a response_format reply is content only: a "<tool_call>" inside one of its strings is text */
    Q35ChatParseOptions po = {.thinking = think,
                              .tools = q->tools,
                              .tool_choice = q->response_schema ? Q35_TOOL_CHOICE_NONE : q->tool_choice,
                              .id_seed = r->params.sampling.seed ^ 0xC0FFEE5EEDull};
    if (!rc && (rc = q35_chat_parser_open(&r->parser, h->tok, &po, &err)))
        oai_fail(e, 500, "server_error", NULL, NULL, "%s", err.msg);
    if (!rc && (q->tool_choice >= Q35_TOOL_CHOICE_REQUIRED || q->response_schema))
        rc = open_guide(h, r, &cr, q->response_schema ? "response_format" : "tool_choice", e);
    free(m);
    free(tc);
    if (rc && text && *text) {
        free(*text);
        *text = NULL;
    }
    return rc ? -1 : 0;
}

/* r's prompt ids (and, for chat, its parser and guide). same: the first draw of the same prompt (n > 1), whose ids are
 * taken instead of tokenizing the same text again; NULL otherwise. */
static int build_prompt(Http *h, Req *r, const Req *same, OaiError *e) {
    const OaiRequest *q = &r->rq;
    Q35Err err = {0};
    int *ids = NULL, n = 0;
    if (q->kind == OAI_CHAT || q->prompt) {
        if (!h->tok)
            return oai_fail(e, 400, "invalid_request_error", NULL, NULL,
                            "the model has no tokenizer.json: send token ids");
        char *text = q->prompt;
        if (q->kind == OAI_CHAT && chat_prompt(h, r, same ? NULL : &text, e)) return -1;
        int rc = 0;
        if (same) {
            n = same->n_prompt;
            if (!(ids = malloc(sizeof(int) * (size_t)n))) rc = Q35_ERR_OOM;
            if (ids) memcpy(ids, same->toks, sizeof(int) * (size_t)n);
        } else {
            rc = q35_tokenize(h->tok, text, strlen(text), &ids, &n, &err);
        }
        if (text != q->prompt) free(text);
        if (rc == Q35_ERR_OOM && same) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if (rc)
            return oai_fail(e, 400, "invalid_request_error", NULL, q->kind == OAI_CHAT ? "messages" : "prompt", "%s",
                            err.msg);
    } else {
        n = q->n_prompt_ids;
        ids = malloc(sizeof(int) * (size_t)n);
        if (!ids) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(ids, q->prompt_ids, sizeof(int) * (size_t)n);
    }
    if (q->kind == OAI_COMPLETION && q->response_schema) { /* the completion is the JSON value, no reasoning */
        const Q35ChatRequest cr = {.thinking = Q35_THINK_OFF, .response_schema = q->response_schema};
        if (!h->tok || open_guide(h, r, &cr, "response_format", e)) {
            free(ids);
            return h->tok ? -1
                          : oai_fail(e, 400, "invalid_request_error", NULL, "response_format",
                                     "the model has no tokenizer.json: no guided output");
        }
    }
    const char *pp = q->kind == OAI_CHAT ? "messages" : "prompt";
    int ctx = sched_max_context(h->s);
    if (n == 0) {
        free(ids);
        return oai_fail(e, 400, "invalid_request_error", NULL, pp, "the prompt is empty");
    }
    if (n >= ctx || (q->max_tokens > 0 && (long)n + q->max_tokens > ctx)) {
        free(ids);
        return oai_fail(
            e, 400, "invalid_request_error", "context_length_exceeded", q->max_tokens > 0 ? "max_tokens" : pp,
            "This model's maximum context length is %d tokens. However, you requested %ld tokens (%d in "
            "the %s, %d for the completion). Please reduce the length of the %s or completion.",
            ctx, (long)n + (q->max_tokens > 0 ? q->max_tokens : 0), n, pp, q->max_tokens > 0 ? q->max_tokens : 0, pp);
    }
    r->n_prompt = n;
    r->max_tokens = q->max_tokens > 0 ? q->max_tokens : ctx - n;
    r->toks = realloc(ids, sizeof(int) * ((size_t)n + (size_t)r->max_tokens));
    if (!r->toks) {
        free(ids);
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    r->n_toks = n;
    return 0;
}

/* The model's sampling defaults, overridden by the request; without a seed each request draws its own. */
static void seq_params(Http *h, Req *r, unsigned long n) {
    const OaiRequest *q = &r->rq;
    Q35SeqParams *p = &r->params;
    q35_sampling_defaults(h->e, &p->sampling);
    if (q->set & OAI_SET_TEMPERATURE) p->sampling.temperature = q->temperature;
    if (q->set & OAI_SET_TOP_P) p->sampling.top_p = q->top_p;
    if (q->set & OAI_SET_TOP_K) p->sampling.top_k = q->top_k;
    if (q->set & OAI_SET_MIN_P) p->sampling.min_p = q->min_p;
    if (q->set & OAI_SET_PRESENCE) p->sampling.presence_penalty = q->presence_penalty;
    if (q->set & OAI_SET_REPETITION) p->sampling.repetition_penalty = q->repetition_penalty;
    p->sampling.seed = q->set & OAI_SET_SEED ? q->seed : ((uint64_t)h->started << 20 ^ n) * 0x9E3779B97F4A7C15ull;
    p->sampling.frequency_penalty = q->frequency_penalty;
    p->top_logprobs = q->top_logprobs;
    p->bias_ids = q->bias_ids;
    p->bias = q->bias;
    p->n_bias = q->n_bias;
    if (q->min_tokens > 0) { /* no stop id, the model's or the request's, before min_tokens */
        const int *ids = NULL;
        int n_model = h->tok ? q35_tokenizer_stop_ids(h->tok, &ids) : 0, n = 0;
        for (int i = 0; i < n_model && n < 16; i++) r->min_ids[n++] = ids[i];
        for (int i = 0; i < q->n_stop_ids; i++) r->min_ids[n++] = q->stop_ids[i];
        p->min_tokens = q->min_tokens;
        p->min_ids = r->min_ids;
        p->n_min_ids = n;
    }
}

/* ---- streaming ---- */

/* One event. json NULL (it could not be made: out of memory) counts as an event that could not be written: the
 * stream ends broken (stream_read), not with that event left out. */
static void ev_data(Conn *c, char *json) {
    if (!json) {
        c->ev.oom = 1;
        return;
    }
    sb_put(&c->ev, "data: ", 6);
    sb_put(&c->ev, json, strlen(json));
    sb_put(&c->ev, "\n\n", 2);
    free(json);
}

/* One typed event (the Responses API's SSE form: an event line, then the data). */
static void ev_event(Conn *c, const char *type, char *json) {
    if (!json) {
        c->ev.oom = 1;
        return;
    }
    sb_put(&c->ev, "event: ", 7);
    sb_put(&c->ev, type, strlen(type));
    sb_put(&c->ev, "\n", 1);
    ev_data(c, json);
}

/* Tool-call deltas not sent yet (mu held): per new call one delta with index, id, name and "" arguments, then one
 * with the arguments (a call arrives complete from the parser, so its arguments are one fragment). Strings are
 * copies; returns the count (at most cap, the rest waits for the next collect). A copy that could not be made (out of
 * memory) sets *oom. */
static int collect_calls(Choice *k, OaiCallOut *d, int cap, int *oom) {
    const Req *r = k->req;
    int n = 0;
    while (n + 2 <= cap) {
        int i = k->calls_sent - 1;
        if (i >= 0 && r->calls[i].args.n > k->args_sent) {
            d[n++] = (OaiCallOut){i, NULL, NULL,
                                  strndup(r->calls[i].args.p + k->args_sent, r->calls[i].args.n - k->args_sent)};
            k->args_sent = r->calls[i].args.n;
            *oom |= !d[n - 1].arguments;
        } else if (k->calls_sent < r->n_calls) {
            i = k->calls_sent++;
            d[n++] = (OaiCallOut){i, strdup(r->calls[i].id), strdup(r->calls[i].name), strdup("")};
            k->args_sent = 0;
            *oom |= !d[n - 1].id || !d[n - 1].name || !d[n - 1].arguments;
        } else
            break;
    }
    return n;
}

static void cancel_all(Conn *c) {
    for (int i = 0; i < c->n_ch; i++) sched_cancel(c->h->s, c->ch[i].req);
}

/* What choice `index` produced since the last call, as SSE events (sched_lock not held). *err: its error once it
 * ended with one. Sets k->done once its end went out. */
static void choice_collect(Conn *c, Choice *k, int index, OaiError *err) {
    Http *h = c->h;
    Req *r = k->req;
    int kind = r->rq.kind, usage = r->rq.include_usage, want_lp = r->rq.top_logprobs >= 0;
    sched_lock(h->s);
    /* a copy that cannot be made (out of memory) ends the stream broken, as an event that cannot be written does
     * (stream_read), rather than retrying at once, or going on without it */
    char *text[2] = {NULL, NULL};
    for (int ch = 0; ch < 2; ch++)
        if (r->out[ch].n > k->sent[ch]) {
            if ((text[ch] = strndup(r->out[ch].p + k->sent[ch], r->out[ch].n - k->sent[ch])))
                k->sent[ch] = r->out[ch].n;
            else
                c->ev.oom = 1;
        }
    int n_lp = r->n_lps - k->lps_sent;
    OaiTokenLogprob *lps = n_lp > 0 ? malloc(sizeof *lps * (size_t)n_lp) : NULL;
    if (lps)
        memcpy(lps, r->lps + k->lps_sent, sizeof *lps * (size_t)n_lp);
    else if (n_lp > 0)
        n_lp = 0, c->ev.oom = 1;
    k->lps_sent += n_lp;
    OaiCallOut calls[16];
    int calls_oom = 0, n_calls = collect_calls(k, calls, 16, &calls_oom);
    if (calls_oom) c->ev.oom = 1;
    int done = r->done && k->sent[0] == r->out[0].n && k->sent[1] == r->out[1].n && k->lps_sent == r->n_lps &&
               k->calls_sent == r->n_calls && (!r->n_calls || k->args_sent == r->calls[r->n_calls - 1].args.n);
    const char *reason = r->finish_reason;
    if (done) *err = r->error;
    /* echo with logprobs: the prompt goes out with its entries, once they are all known (or the request ended) */
    const int echo_ready = !r->plps || r->done || r->plp_done >= r->n_prompt - 1;
    int n_plp = k->echo && !k->role_sent && r->plps && echo_ready ? r->plp_done + 1 : 0;
    OaiTokenLogprob *plps = n_plp ? malloc(sizeof *plps * (size_t)n_plp) : NULL;
    if (plps)
        memcpy(plps, r->plps, sizeof *plps * (size_t)n_plp);
    else if (n_plp > 0)
        n_plp = 0, c->ev.oom = 1;
    sched_unlock(h->s);

    if (!k->role_sent && kind == OAI_CHAT) {
        OaiOutput o = {.index = index, .content = "", .want_logprobs = 0};
        ev_data(c, oai_chunk_json(kind, &c->meta, &o, 1, NULL, usage));
        k->role_sent = 1;
    }
    if (!k->role_sent && k->echo && echo_ready) { /* completions: the prompt first */
        OaiOutput o = {
            .index = index, .content = k->echo, .logprobs = plps, .n_logprobs = n_plp, .want_logprobs = want_lp};
        ev_data(c, oai_chunk_json(kind, &c->meta, &o, 0, NULL, usage));
        k->role_sent = 1;
        k->text_offset = strlen(k->echo); /* the completion's offsets count the prompt's text */
    }
    free(plps);
    if (done && err->status) {
        ev_data(c, oai_error_json(err));
    } else {
        if (text[0] || text[1] || n_lp || (done && !n_calls)) {
            OaiOutput o = {.index = index,
                           .content = text[0],
                           .reasoning = text[1],
                           .logprobs = lps,
                           .n_logprobs = n_lp,
                           .want_logprobs = want_lp,
                           .text_offset = k->text_offset,
                           .finish_reason = done && !n_calls ? reason : NULL};
            if (kind == OAI_COMPLETION && !o.content) o.content = "";
            ev_data(c, oai_chunk_json(kind, &c->meta, &o, 0, NULL, usage));
            k->text_offset += text[0] ? strlen(text[0]) : 0;
        }
        for (int i = 0; i < n_calls; i++) { /* one tool-call delta per chunk; the last carries finish_reason */
            OaiOutput o = {.index = index,
                           .calls = &calls[i],
                           .n_calls = 1,
                           .finish_reason = done && i == n_calls - 1 ? reason : NULL};
            ev_data(c, oai_chunk_json(kind, &c->meta, &o, 0, NULL, usage));
        }
    }
    for (int i = 0; i < n_calls; i++) {
        free((char *)calls[i].id);
        free((char *)calls[i].name);
        free((char *)calls[i].arguments);
    }
    k->done = done;
    free(text[0]);
    free(text[1]);
    free(lps);
}

/* The usage of all choices: each prompt once, the completions summed. */
static OaiUsage usage_of(Conn *c) {
    OaiUsage u = {0, 0, 0, 0};
    for (int i = 0; i < c->n_ch; i += c->ch[0].req->rq.n) { /* each prompt once */
        u.prompt_tokens += c->ch[i].req->n_prompt;
        u.cached_tokens += c->ch[i].req->n_cached;
    }
    for (int i = 0; i < c->n_ch; i++) {
        u.completion_tokens += c->ch[i].req->n_generated;
        u.reasoning_tokens += c->ch[i].req->n_reasoning;
    }
    return u;
}

/* ---- /v1/responses and /v1/messages: blocks ---- */

static OaiRespItem blk_item(const Blk *x, int done) {
    return (OaiRespItem){.type = x->type,
                         .id = x->id,
                         .text = x->text ? x->text : "",
                         .call_id = x->call_id,
                         .name = x->name,
                         .done = done,
                         .lps = x->lps,
                         .n_lps = x->n_lps};
}

/* Appends x[0, k) to the array *a (*n entries, room for *cap); 0, or -1 out of memory. */
static int lps_append(OaiTokenLogprob **a, int *n, int *cap, const OaiTokenLogprob *x, int k) {
    if (*n + k > *cap) {
        const int c = 2 * (*n + k);
        OaiTokenLogprob *p = realloc(*a, sizeof *p * (size_t)c);
        if (!p) return -1;
        *a = p, *cap = c;
    }
    if (k) memcpy(*a + *n, x, sizeof *x * (size_t)k);
    *n += k;
    return 0;
}

/* Ends the open block (done: OaiRespItem.done, 1 or 2). */
static void blk_close(Conn *c, int done) {
    BlkStream *bs = &c->bs;
    if (!bs->open) return;
    Blk *x = &bs->items[bs->n - 1];
    x->done = done;
    if (x->type == OAI_ITEM_MESSAGE && !lps_append(&x->lps, &x->n_lps, &x->cap_lps, bs->pend, bs->n_pend))
        bs->n_pend = 0; /* the text's last tokens' logprobs, if no delta took them */
    const OaiRespItem it = blk_item(x, done);
    bs->api->close(c, bs->n - 1, &it);
    bs->open = 0;
}

/* Opens a block of this type (a call: Req.calls[call], its id and name) after closing the open one; 0, or -1 out
 * of memory. */
static int blk_open(Conn *c, int type, int call, const char *call_id, const char *name) {
    BlkStream *bs = &c->bs;
    blk_close(c, 1);
    if (bs->n == bs->cap) {
        const int cap = bs->cap ? 2 * bs->cap : 4;
        Blk *p = realloc(bs->items, sizeof *p * (size_t)cap);
        if (!p) return -1;
        bs->items = p, bs->cap = cap;
    }
    Blk *x = &bs->items[bs->n++];
    *x = (Blk){.type = type, .call = call};
    if (type == OAI_ITEM_CALL && (!(x->call_id = strdup(call_id)) || !(x->name = strdup(name)))) {
        free(x->call_id);
        bs->n--;
        return -1;
    }
    const char *rid = strchr(c->ch[0].req->id, '_');
    snprintf(x->id, sizeof x->id, "%s_%s_%d", bs->api->prefix[type], rid ? rid + 1 : c->ch[0].req->id, bs->n - 1);
    bs->open = 1;
    const OaiRespItem it = blk_item(x, 0);
    bs->api->open(c, bs->n - 1, &it);
    return 0;
}

/* Appends delta to the open block and sends it; 0, or -1 out of memory. */
static int blk_delta(Conn *c, const char *delta, size_t n) {
    BlkStream *bs = &c->bs;
    Blk *x = &bs->items[bs->n - 1];
    char *t = realloc(x->text, x->len + n + 1);
    if (!t) return -1;
    memcpy(t + x->len, delta, n);
    x->len += n;
    t[x->len] = 0;
    x->text = t;
    char *d = strndup(delta, n);
    const int take = x->type == OAI_ITEM_MESSAGE ? bs->n_pend : 0; /* the logprobs so far go with the text */
    if (!d || lps_append(&x->lps, &x->n_lps, &x->cap_lps, bs->pend, take)) {
        free(d);
        return -1;
    }
    const OaiRespItem it = blk_item(x, 0);
    bs->api->delta(c, bs->n - 1, &it, d, x->lps + x->n_lps - take, take);
    bs->n_pend -= take;
    free(d);
    return 0;
}

/* A /v1/responses or /v1/messages stream: what the request produced since the last call as the API's events
 * (reasoning, then text, then calls, each a block of its own); after its end the API's closing events. 1 if any
 * were made. */
static int blk_collect(Conn *c) {
    const size_t before = c->ev.n;
    Choice *k = &c->ch[0];
    Req *r = k->req;
    BlkStream *bs = &c->bs;
    sched_lock(c->h->s);
    char *text[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    int oom = 0; /* a copy or an event could not be made: the stream ends with the API's failure */
    for (int ch = 0; ch < 2; ch++)
        if (r->out[ch].n > k->sent[ch]) {
            len[ch] = r->out[ch].n - k->sent[ch];
            oom |= !(text[ch] = strndup(r->out[ch].p + k->sent[ch], len[ch]));
            k->sent[ch] = r->out[ch].n;
        }
    /* the calls' arguments as far as they are: from the open call (if any) on */
    const int first =
        bs->open && bs->items[bs->n - 1].type == OAI_ITEM_CALL ? bs->items[bs->n - 1].call : k->calls_sent;
    const int n_calls = r->n_calls;
    /* per call from `first` on: arguments so far, id, name */
    char **args = n_calls > first ? calloc(3 * (size_t)(n_calls - first), sizeof *args) : NULL;
    oom |= n_calls > first && !args;
    for (int i = first; args && i < n_calls; i++) {
        const ReqCall *q = &r->calls[i];
        char **a = args + 3 * (i - first);
        a[0] = strndup(q->args.p ? q->args.p : "", q->args.n);
        a[1] = strdup(q->id);
        a[2] = strdup(q->name);
    }
    for (; k->lps_sent < r->n_lps && !oom; k->lps_sent++) /* the text tokens' logprobs, for the text deltas */
        if (r->lps[k->lps_sent].part == OAI_PART_CONTENT)
            oom = lps_append(&bs->pend, &bs->n_pend, &bs->cap_pend, &r->lps[k->lps_sent], 1);
    const int done = r->done;
    OaiError err = r->error;
    const char *reason = r->finish_reason, *stop = r->stop_matched ? r->rq.stop[r->stop_which] : NULL;
    if (done && !err.status && reason && !strcmp(reason, "abort")) /* these APIs have no such end: an error */
        oai_fail(&err, 503, "server_error", NULL, NULL, "the request was aborted (the server is shutting down)");
    OaiUsage u = usage_of(c);
    sched_unlock(c->h->s);

    if (!bs->started) {
        bs->api->start(c, &u);
        bs->started = 1;
    }
    for (int ch = 1; ch >= 0 && !err.status; ch--) { /* reasoning comes before the text it leads to */
        if (!text[ch] || oom) continue;
        const int type = ch ? OAI_ITEM_REASONING : OAI_ITEM_MESSAGE;
        if (!(bs->open && bs->items[bs->n - 1].type == type) && blk_open(c, type, -1, NULL, NULL)) oom = 1;
        if (!oom && blk_delta(c, text[ch], len[ch])) oom = 1;
    }
    for (int i = first; args && i < n_calls && !oom && !err.status; i++) {
        char **a = args + 3 * (i - first);
        if (!a[0] || !a[1] || !a[2]) {
            oom = 1;
            break;
        }
        if (!(bs->open && bs->items[bs->n - 1].type == OAI_ITEM_CALL && bs->items[bs->n - 1].call == i)) {
            if (blk_open(c, OAI_ITEM_CALL, i, a[1], a[2])) {
                oom = 1;
                break;
            }
            k->calls_sent = i + 1;
        }
        const Blk *x = &bs->items[bs->n - 1];
        const size_t n = strlen(a[0]);
        if (n > x->len && blk_delta(c, a[0] + x->len, n - x->len)) oom = 1;
    }
    for (int i = 0; args && i < 3 * (n_calls - first); i++) free(args[i]);
    free(args);
    free(text[0]);
    free(text[1]);
    if (oom) {
        cancel_all(c);
        OaiError e;
        oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        bs->api->end(c, &(BlkEnd){"failed", &e, reason, NULL, &u});
        c->end_sent = 1;
    } else if (done) {
        /* as the non-streamed answer: an empty text block when nothing else came out (out of memory: none) */
        if (!err.status && !bs->n) blk_open(c, OAI_ITEM_MESSAGE, -1, NULL, NULL);
        const char *status = err.status ? "failed" : reason && !strcmp(reason, "length") ? "incomplete" : "completed";
        if (!err.status) blk_close(c, status[0] == 'i' ? 2 : 1);
        bs->api->end(c, &(BlkEnd){status, err.status ? &err : NULL, reason, stop, &u});
        c->end_sent = 1;
    }
    return c->ev.n > before;
}

/* The blocks of a finished request as the non-streamed answer lists them: reasoning (with thinking, when any), the
 * text (when any, or when nothing else came out), the calls. *items and *ids malloc'ed (free both); the count, or
 * -1 out of memory. */
static int final_items(Conn *c, OaiRespItem **items, char (**ids)[64]) {
    const Req *q = c->ch[0].req;
    const char *const *prefix = c->bs.api->prefix, *rid = strchr(q->id, '_');
    *items = malloc(sizeof **items * (size_t)(q->n_calls + 2));
    *ids = malloc(sizeof **ids * (size_t)(q->n_calls + 2));
    if (!*items || !*ids) return -1;
    int n = 0;
    const char *reasoning = q->out[1].p ? q->out[1].p : "", *content = q->out[0].p ? q->out[0].p : "";
    if (q->reasoning && reasoning[0])
        (*items)[n++] = (OaiRespItem){.type = OAI_ITEM_REASONING, .text = reasoning, .done = 1};
    if (content[0] || (!n && !q->n_calls))
        (*items)[n++] =
            (OaiRespItem){.type = OAI_ITEM_MESSAGE, .text = content, .done = 1, .lps = q->lps, .n_lps = q->n_lps};
    for (int i = 0; i < q->n_calls; i++) {
        const ReqCall *k = &q->calls[i];
        (*items)[n++] = (OaiRespItem){
            .type = OAI_ITEM_CALL, .text = k->args.p ? k->args.p : "{}", .call_id = k->id, .name = k->name, .done = 1};
    }
    for (int i = 0; i < n; i++) {
        snprintf((*ids)[i], sizeof(*ids)[i], "%s_%s_%d", prefix[(*items)[i].type], rid ? rid + 1 : q->id, i);
        (*items)[i].id = (*ids)[i];
    }
    if (q->finish_reason && !strcmp(q->finish_reason, "length") && n > 0) (*items)[n - 1].done = 2;
    return n;
}

/* The non-streamed answer of a finished /v1/responses or /v1/messages request. */
static char *blk_body(Conn *c) {
    const Req *q = c->ch[0].req;
    OaiRespItem *items = NULL;
    char(*ids)[64] = NULL;
    const int n = final_items(c, &items, &ids);
    const OaiUsage u = usage_of(c);
    char *body = NULL;
    if (n >= 0 && c->api == OAI_RESPONSES) {
        const char *status = q->finish_reason && !strcmp(q->finish_reason, "length") ? "incomplete" : "completed";
        body = oai_resp_json(&c->meta, &q->rq, status, items, n, &u, NULL);
    } else if (n >= 0) {
        const AntStop st = {q->finish_reason, q->stop_matched ? q->rq.stop[q->stop_which] : NULL};
        body = ant_message_json(&c->meta, items, n, &st, &u);
    }
    free(items);
    free(ids);
    return body;
}

/* The Responses API's events (typed: an event line, then the data; sequence numbers). */
static void resp_start(Conn *c, const OaiUsage *u) {
    (void)u;
    const Req *r = c->ch[0].req;
    ev_event(
        c, "response.created",
        oai_resp_event_response("response.created", c->bs.seq++, &c->meta, &r->rq, "in_progress", NULL, 0, NULL, NULL));
    ev_event(c, "response.in_progress",
             oai_resp_event_response("response.in_progress", c->bs.seq++, &c->meta, &r->rq, "in_progress", NULL, 0,
                                     NULL, NULL));
}
static void resp_open(Conn *c, int at, const OaiRespItem *it) {
    ev_event(c, "response.output_item.added", oai_resp_event_item("response.output_item.added", c->bs.seq++, at, it));
    if (it->type != OAI_ITEM_CALL)
        ev_event(c, "response.content_part.added",
                 oai_resp_event_part("response.content_part.added", c->bs.seq++, at, it));
}
static void resp_delta(Conn *c, int at, const OaiRespItem *it, const char *d, const OaiTokenLogprob *lps, int n_lps) {
    static const char *const type[3] = {"response.reasoning_text.delta", "response.output_text.delta",
                                        "response.function_call_arguments.delta"};
    ev_event(c, type[it->type], oai_resp_event_text(type[it->type], c->bs.seq++, at, it, d, lps, n_lps));
}
static void resp_close(Conn *c, int at, const OaiRespItem *it) {
    static const char *const type[3] = {"response.reasoning_text.done", "response.output_text.done",
                                        "response.function_call_arguments.done"};
    ev_event(c, type[it->type], oai_resp_event_text(type[it->type], c->bs.seq++, at, it, it->text, it->lps, it->n_lps));
    if (it->type != OAI_ITEM_CALL)
        ev_event(c, "response.content_part.done",
                 oai_resp_event_part("response.content_part.done", c->bs.seq++, at, it));
    ev_event(c, "response.output_item.done", oai_resp_event_item("response.output_item.done", c->bs.seq++, at, it));
}
static void resp_end(Conn *c, const BlkEnd *e) {
    BlkStream *bs = &c->bs;
    OaiRespItem *items = bs->n ? malloc(sizeof *items * (size_t)bs->n) : NULL;
    for (int i = 0; i < bs->n && items; i++) items[i] = blk_item(&bs->items[i], bs->items[i].done);
    char type[40];
    snprintf(type, sizeof type, "response.%s", e->status);
    ev_event(c, type,
             oai_resp_event_response(type, bs->seq++, &c->meta, &c->ch[0].req->rq, e->status, items, items ? bs->n : 0,
                                     e->u, e->err));
    free(items);
}
static const BlkApi RESP_API = {{"rs", "msg", "fc"}, resp_start, resp_open, resp_delta, resp_close, resp_end};

/* Anthropic's Messages API events. */
static void ant_start(Conn *c, const OaiUsage *u) { ev_event(c, "message_start", ant_event_start(&c->meta, u)); }
static void ant_open(Conn *c, int at, const OaiRespItem *it) {
    ev_event(c, "content_block_start", ant_event_block_start(at, it));
}
static void ant_delta(Conn *c, int at, const OaiRespItem *it, const char *d, const OaiTokenLogprob *lps, int n_lps) {
    (void)lps, (void)n_lps; /* the Messages API has no logprobs */
    ev_event(c, "content_block_delta", ant_event_block_delta(at, it, d));
}
static void ant_close(Conn *c, int at, const OaiRespItem *it) {
    (void)it;
    ev_event(c, "content_block_stop", ant_event_block_stop(at));
}
static void ant_end(Conn *c, const BlkEnd *e) {
    if (e->err) {
        ev_event(c, "error", ant_error_json(e->err));
        return;
    }
    const AntStop st = {e->finish_reason, e->stop_sequence};
    ev_event(c, "message_delta", ant_event_delta(&st, e->u));
    ev_event(c, "message_stop", ant_event_stop());
}
static const BlkApi ANT_API = {{"thk", "txt", "toolu"}, ant_start, ant_open, ant_delta, ant_close, ant_end};

/* Turns what the choices have produced since the last call into SSE events; 1 if any were made. After the last
 * choice's end: the usage chunk (include_usage, no error) and [DONE]. */
static int stream_collect(Conn *c) {
    if (c->api >= OAI_RESPONSES) return blk_collect(c);
    size_t before = c->ev.n;
    int all = 1, failed = 0;
    for (int i = 0; i < c->n_ch; i++) {
        OaiError err = {0};
        if (!c->ch[i].done) choice_collect(c, &c->ch[i], i, &err);
        all &= c->ch[i].done;
        failed |= err.status != 0;
    }
    if (failed) cancel_all(c); /* an error ends the stream: the other choices stop */
    if (all || failed) {
        const Req *r0 = c->ch[0].req;
        if (r0->rq.include_usage && !failed) {
            sched_lock(c->h->s);
            OaiUsage u = usage_of(c);
            sched_unlock(c->h->s);
            ev_data(c, oai_chunk_json(r0->rq.kind, &c->meta, NULL, 0, &u, 1));
        }
        sb_put(&c->ev, "data: [DONE]\n\n", 14);
        c->end_sent = 1;
    }
    return c->ev.n > before;
}

/* 1 when no choice has anything new to stream (sched_lock held). */
static int nothing_new(const Conn *c) {
    for (int i = 0; i < c->n_ch; i++) {
        const Choice *k = &c->ch[i];
        const Req *r = k->req;
        if (k->done) continue;
        if (r->done || r->out[0].n != k->sent[0] || r->out[1].n != k->sent[1] || r->n_lps != k->lps_sent ||
            r->n_calls != k->calls_sent)
            return 0;
    }
    return 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    Conn *c = cls;
    while (c->ev_off == c->ev.n) {
        if (c->ev.oom) { /* an event could not be written whole: end the stream as broken, not cut silently */
            cancel_all(c);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (c->end_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        c->ev.n = c->ev_off = 0;
        if (stream_collect(c)) break;
        if (client_gone(c)) {
            cancel_all(c);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        sched_lock(c->h->s);
        if (nothing_new(c)) sched_wait(c->h->s, c->ch[0].req, 20);
        sched_unlock(c->h->s);
    }
    size_t k = c->ev.n - c->ev_off < max ? c->ev.n - c->ev_off : max;
    memcpy(buf, c->ev.p + c->ev_off, k);
    c->ev_off += k;
    return (ssize_t)k;
}

/* ---- completions ---- */

/* Choice i of the request in c->body (draw i % n of prompt i / n; n: choice 0's rq.n, 1 for choice 0 itself): a
 * scheduler request of its own (the body parsed again, its own sampler seed, its own prompt ids), in choice 0's
 * group. */
static int new_choice(Conn *c, int i, int kind, unsigned long id, OaiError *e) {
    Http *h = c->h;
    Req *r = sched_req_new();
    if (!r) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    c->ch[c->n_ch++].req = r;
    if (i > 0) sched_req_group(r, c->ch[0].req);
    const int n = i > 0 ? c->ch[0].req->rq.n : 1, draw = i % n;
    const char *body = c->body.p ? c->body.p : "";
    if (kind == OAI_RESPONSES  ? oai_parse_responses(body, c->body.n, h->vocab, &r->rq, e)
        : kind == OAI_MESSAGES ? ant_parse_messages(body, c->body.n, h->vocab, 0, &r->rq, e)
                               : oai_parse_request_at(body, c->body.n, kind, h->vocab, i / n, &r->rq, e))
        return -1;
    if (r->rq.model && strcmp(r->rq.model, h->cfg.model))
        return oai_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%s' does not exist (this server serves '%s').", r->rq.model, h->cfg.model);
    seq_params(h, r, id);
    if (draw > 0) /* another draw of the same prompt: a seed of its own, derived from the request's */
        r->params.sampling.seed =
            (r->params.sampling.seed ^ (uint64_t)draw * 0xD1B54A32D192ED03ull) * 0x9E3779B97F4A7C15ull;
    if (build_prompt(h, r, draw > 0 ? c->ch[i - draw].req : NULL, e)) return -1;
    if (r->rq.echo) {
        Q35Err err = {0};
        Choice *k = &c->ch[c->n_ch - 1];
        if (r->rq.prompt)
            k->echo = strdup(r->rq.prompt);
        else if (!h->tok || q35_detokenize(h->tok, r->rq.prompt_ids, r->rq.n_prompt_ids, 0, &k->echo, &err))
            return oai_fail(e, 400, "invalid_request_error", NULL, "echo", "%s",
                            h->tok ? err.msg : "echo of token ids needs the model's tokenizer.json");
        if (!k->echo) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if (r->rq.top_logprobs >= 0) { /* with logprobs: the prompt's too (sched.h: plps), its first has none */
            char *t0 = NULL;
            r->plps = calloc((size_t)r->n_prompt, sizeof *r->plps);
            r->logits = r->logits ? r->logits : malloc(sizeof(float) * (size_t)q35_vocab_size(h->e));
            if (!r->plps || !r->logits || q35_detokenize(h->tok, r->toks, 1, 0, &t0, &err))
                return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            r->plps[0] = (OaiTokenLogprob){.token = t0, .logprob = NAN, .part = OAI_PART_OTHER};
        }
    }
    static const char *const prefix[4] = {"chatcmpl-", "cmpl-", "resp_", "msg_"};
    snprintf(r->id, sizeof r->id, "%s%lx%06lx", prefix[kind], (unsigned long)h->started, id);
    r->t_arrival = now_s();
    return 0;
}

static enum MHD_Result generate(Conn *c, struct MHD_Connection *mc, const char *url, int kind) {
    Http *h = c->h;
    OaiError e = {0};
    if (c->too_large) {
        oai_fail(&e, 413, "invalid_request_error", NULL, NULL,
                 "the request body is over the server's limit of %zu bytes", h->cfg.max_body);
        return reply_error(c, mc, url, &e);
    }
    unsigned long id = atomic_fetch_add(&h->next_id, 1);
    c->api = kind;
    c->bs.api = kind == OAI_RESPONSES ? &RESP_API : kind == OAI_MESSAGES ? &ANT_API : NULL;
    if (new_choice(c, 0, kind, id, &e)) return reply_error(c, mc, url, &e);
    for (int i = 1; i < c->ch[0].req->rq.n * c->ch[0].req->rq.n_prompts; i++)
        if (new_choice(c, i, kind, id, &e)) return reply_error(c, mc, url, &e);
    Req *r = c->ch[0].req;
    c->meta.id = r->id;
    c->meta.created = (long)time(NULL);
    c->meta.model = h->cfg.model;
    for (int i = 0; i < c->n_ch; i++)
        if (sched_submit(h->s, c->ch[i].req, &e)) {
            cancel_all(c);
            return reply_error(c, mc, url, &e);
        }

    if (r->rq.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, c, NULL);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result rc = MHD_queue_response(mc, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    int failed = -1; /* a choice that ended with an error: the reply is that error, the others stop */
    sched_lock(h->s);
    for (int i = 0; i < c->n_ch && failed < 0; i++)
        while (failed < 0 && !c->ch[i].req->done) {
            sched_unlock(h->s);
            if (client_gone(c)) {
                cancel_all(c);
                return MHD_NO;
            }
            sched_lock(h->s);
            for (int j = 0; j < c->n_ch && failed < 0; j++)
                if (c->ch[j].req->done && c->ch[j].req->error.status) failed = j;
            if (failed < 0 && !c->ch[i].req->done) sched_wait(h->s, r, 20);
        }
    for (int j = 0; j < c->n_ch && failed < 0; j++)
        if (c->ch[j].req->error.status) failed = j;
    sched_unlock(h->s); /* a finished choice is no longer written by the scheduler */
    if (failed >= 0) {
        cancel_all(c);
        return reply_error(c, mc, url, &c->ch[failed].req->error);
    }
    if (c->bs.api && r->finish_reason && !strcmp(r->finish_reason, "abort")) { /* no such end in these APIs */
        oai_fail(&e, 503, "server_error", NULL, NULL, "the request was aborted (the server is shutting down)");
        return reply_error(c, mc, url, &e);
    }
    if (c->bs.api) return reply(mc, 200, "application/json", blk_body(c));
    OaiOutput o[OAI_MAX_CHOICES];
    OaiCallOut *calls[OAI_MAX_CHOICES] = {NULL};
    char *echoed[OAI_MAX_CHOICES] = {NULL};          /* echo: the prompt's text, then the completion */
    OaiTokenLogprob *both[OAI_MAX_CHOICES] = {NULL}; /* echo with logprobs: the prompt's entries, then the rest */
    for (int i = 0; i < c->n_ch; i++) {
        const Req *q = c->ch[i].req;
        if (c->ch[i].echo && asprintf(&echoed[i], "%s%s", c->ch[i].echo, q->out[0].p ? q->out[0].p : "") < 0)
            echoed[i] = NULL;
        calls[i] = q->n_calls ? calloc((size_t)q->n_calls, sizeof *calls[i]) : NULL;
        for (int k = 0; calls[i] && k < q->n_calls; k++)
            calls[i][k] =
                (OaiCallOut){k, q->calls[k].id, q->calls[k].name, q->calls[k].args.p ? q->calls[k].args.p : "{}"};
        o[i] = (OaiOutput){.index = i,
                           .content = echoed[i]     ? echoed[i]
                                      : q->out[0].p ? q->out[0].p
                                                    : "",
                           .reasoning = q->reasoning ? (q->out[1].p ? q->out[1].p : "") : NULL,
                           .calls = calls[i],
                           .n_calls = calls[i] ? q->n_calls : 0,
                           .logprobs = q->lps,
                           .n_logprobs = q->n_lps,
                           .want_logprobs = q->rq.top_logprobs >= 0,
                           .finish_reason = q->finish_reason};
        const int n_plp = q->plps ? q->plp_done + 1 : 0;
        if (n_plp && (both[i] = malloc(sizeof *both[i] * (size_t)(n_plp + q->n_lps)))) {
            memcpy(both[i], q->plps, sizeof *both[i] * (size_t)n_plp);
            if (q->n_lps) memcpy(both[i] + n_plp, q->lps, sizeof *both[i] * (size_t)q->n_lps);
            o[i].logprobs = both[i];
            o[i].n_logprobs = n_plp + q->n_lps;
        }
    }
    OaiUsage u = usage_of(c);
    char *body = oai_response_json(kind, &c->meta, o, c->n_ch, &u);
    for (int i = 0; i < c->n_ch; i++) {
        free(calls[i]);
        free(echoed[i]);
        free(both[i]);
    }
    return reply(mc, 200, "application/json", body);
}

/* POST /tokenize and /detokenize (vLLM's): the ids of a prompt or of a rendered chat (as generation would see
 * them, generation prompt included), and the text of ids. */
static enum MHD_Result tokens(Conn *c, struct MHD_Connection *mc, const char *url, int detok, int count) {
    Http *h = c->h;
    OaiError e = {0};
    const char *body = c->body.p ? c->body.p : "";
    if (c->too_large)
        oai_fail(&e, 413, "invalid_request_error", NULL, NULL,
                 "the request body is over the server's limit of %zu bytes", h->cfg.max_body);
    else if (!h->tok)
        oai_fail(&e, 400, "invalid_request_error", NULL, NULL, "the model has no tokenizer.json");
    if (e.status) return reply_error(c, mc, url, &e);
    Q35Err err = {0};
    if (detok) {
        int *ids, n;
        char *text = NULL;
        if (oai_parse_detokenize(body, c->body.n, h->vocab, &ids, &n, &e)) return reply_error(c, mc, url, &e);
        int rc = q35_detokenize(h->tok, ids, n, 0, &text, &err);
        free(ids);
        if (rc) {
            oai_fail(&e, 400, "invalid_request_error", NULL, "tokens", "%s", err.msg);
            return reply_error(c, mc, url, &e);
        }
        char *json = oai_detokenize_json(text);
        free(text);
        return reply(mc, 200, "application/json", json);
    }
    int kind = OAI_CHAT;
    Req *r = NULL;
    if (!count && oai_tokenize_kind(body, c->body.n, &kind, &e)) return reply_error(c, mc, url, &e);
    if (!(r = sched_req_new())) {
        oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return reply_error(c, mc, url, &e);
    }
    c->req = r;
    if (count ? ant_parse_messages(body, c->body.n, h->vocab, 1, &r->rq, &e)
              : oai_parse_request(body, c->body.n, kind, h->vocab, &r->rq, &e))
        return reply_error(c, mc, url, &e);
    int *ids = NULL, n = 0;
    if (kind == OAI_COMPLETION && !r->rq.prompt) { /* ids already */
        n = r->rq.n_prompt_ids;
        ids = r->rq.prompt_ids;
    } else {
        char *text = r->rq.prompt;
        if (kind == OAI_CHAT && chat_prompt(h, r, &text, &e)) return reply_error(c, mc, url, &e);
        int rc = q35_tokenize(h->tok, text, strlen(text), &ids, &n, &err);
        if (text != r->rq.prompt) free(text);
        if (rc) {
            oai_fail(&e, 400, "invalid_request_error", NULL, kind == OAI_CHAT ? "messages" : "prompt", "%s", err.msg);
            return reply_error(c, mc, url, &e);
        }
    }
    char *json = count ? ant_count_json(n) : oai_tokenize_json(ids, n, sched_max_context(h->s));
    if (ids != r->rq.prompt_ids) free(ids);
    return reply(mc, 200, "application/json", json);
}

/* ---- routing ---- */

/* The key as OpenAI's clients send it (Authorization: Bearer KEY) or Anthropic's (x-api-key: KEY). */
static int authorized(Http *h, struct MHD_Connection *mc) {
    if (!h->cfg.api_key) return 1;
    const char *a = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *x = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "x-api-key");
    return (a && !strncmp(a, "Bearer ", 7) && !strcmp(a + 7, h->cfg.api_key)) || (x && !strcmp(x, h->cfg.api_key));
}

static enum MHD_Result route(Conn *c, struct MHD_Connection *mc, const char *url, const char *method) {
    Http *h = c->h;
    OaiError e = {0};
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    static const struct {
        const char *path;
        int post; /* 1: POST route, 0: GET route */
    } routes[] = {{"/health", 0},         {"/metrics", 0},
                  {"/v1/models", 0},      {"/v1/chat/completions", 1},
                  {"/v1/completions", 1}, {"/tokenize", 1},
                  {"/detokenize", 1},     {"/v1/responses", 1},
                  {"/v1/messages", 1},    {"/v1/messages/count_tokens", 1}};
    int k = -1;
    for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
        if (!strcmp(url, routes[i].path)) k = i;
    if (k == 8 || k == 9) c->api = OAI_MESSAGES; /* its errors are Anthropic's error objects */
    if (!strncmp(url, "/v1/models/", 11)) {      /* GET /v1/models/{model}: the name may hold '/' (org/name) */
        if (!get)
            oai_fail(&e, 405, "invalid_request_error", NULL, NULL, "%s is not allowed on %s (use GET)", method, url);
        else if (!authorized(h, mc))
            oai_fail(&e, 401, "authentication_error", "invalid_api_key", NULL,
                     "missing or wrong API key: send 'Authorization: Bearer KEY'");
        else if (strcmp(url + 11, h->cfg.model))
            oai_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                     "The model '%s' does not exist (this server serves '%s').", url + 11, h->cfg.model);
        else
            return reply(mc, 200, "application/json",
                         oai_model_json(h->cfg.model, h->started, sched_max_context(h->s)));
        return reply_error(c, mc, url, &e);
    }
    if (k < 0) {
        oai_fail(&e, 404, "not_found_error", NULL, NULL, "no route %s %s", method, url);
        return reply_error(c, mc, url, &e);
    }
    if (routes[k].post ? !post : !get) {
        oai_fail(&e, 405, "invalid_request_error", NULL, NULL, "%s is not allowed on %s (use %s)", method, url,
                 routes[k].post ? "POST" : "GET");
        return reply_error(c, mc, url, &e);
    }
    if ((!strncmp(url, "/v1/", 4) || routes[k].post) && !authorized(h, mc)) {
        oai_fail(&e, 401, "authentication_error", "invalid_api_key", NULL,
                 "missing or wrong API key: send 'Authorization: Bearer KEY'");
        return reply_error(c, mc, url, &e);
    }
    switch (k) {
    case 0:
        if (atomic_load(&h->stopping)) {
            oai_fail(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
            return reply_error(c, mc, url, &e);
        }
        return reply(mc, 200, "application/json", strdup("{\"status\":\"ok\"}"));
    case 1: sched_gauges(h->s); return reply(mc, 200, "text/plain; version=0.0.4", metrics_text(h->m));
    case 2:
        return reply(mc, 200, "application/json", oai_models_json(h->cfg.model, h->started, sched_max_context(h->s)));
    case 3: return generate(c, mc, url, OAI_CHAT);
    case 4: return generate(c, mc, url, OAI_COMPLETION);
    case 7: return generate(c, mc, url, OAI_RESPONSES);
    case 8: return generate(c, mc, url, OAI_MESSAGES);
    default: return tokens(c, mc, url, k == 6, k == 9);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **ctx) {
    (void)version;
    Http *h = cls;
    Conn *c = *ctx;
    if (!c) { /* first call: headers only */
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        atomic_fetch_add(&h->active, 1);
        c->h = h;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        *ctx = c;
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->cfg.max_body) {
            c->too_large = 1;
            OaiError e;
            oai_fail(&e, 413, "invalid_request_error", NULL, NULL,
                     "the request body is over the server's limit of %zu bytes", h->cfg.max_body);
            return reply_error(c, mc, url, &e);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (c->body.n + *upload_size > h->cfg.max_body)
            c->too_large = 1;
        else if (sb_put(&c->body, upload, *upload_size))
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    return route(c, mc, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **ctx, enum MHD_RequestTerminationCode toe) {
    (void)mc;
    (void)toe;
    Http *h = cls;
    Conn *c = *ctx;
    if (!c) return;
    for (int i = 0; i < c->n_ch; i++) {
        sched_release(h->s, c->ch[i].req);
        free(c->ch[i].echo);
    }
    if (c->req) sched_release(h->s, c->req);
    for (int i = 0; i < c->bs.n; i++) {
        free(c->bs.items[i].text);
        free(c->bs.items[i].call_id);
        free(c->bs.items[i].name);
        free(c->bs.items[i].lps);
    }
    free(c->bs.items);
    free(c->bs.pend);
    sb_free(&c->body);
    sb_free(&c->ev);
    free(c);
    *ctx = NULL;
    atomic_fetch_sub(&h->active, 1);
}

/* libmicrohttpd's own messages, one line each with the server's prefix. Left out: the one it writes when a stream
 * callback ends the response with an error (stream_read), which is a client gone mid-stream (or an event that could
 * not be stored): the request's own line already says so (finish abort, or its error). */
static void mhd_log(void *cls, const char *fm, va_list ap) {
    (void)cls;
    if (strstr(fm, "application error generating response")) return;
    char line[512];
    vsnprintf(line, sizeof line, fm, ap);
    size_t k = strlen(line);
    while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r')) line[--k] = 0;
    fprintf(stderr, "qwen35 serve: libmicrohttpd: %s\n", line);
}

int http_start(Http **out, const HttpConfig *cfg, Q35Engine *e, Sched *s, Metrics *m, char *err, size_t n) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai) {
        snprintf(err, n, "--host %s: %s", cfg->host, gai_strerror(gai));
        return -1;
    }
    Http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        snprintf(err, n, "out of memory");
        return -1;
    }
    h->cfg = *cfg;
    h->e = e;
    h->tok = q35_engine_tokenizer(e);
    h->s = s;
    h->m = m;
    h->vocab = h->tok ? q35_tokenizer_size(h->tok) : q35_vocab_size(e);
    if (h->vocab > q35_vocab_size(e)) h->vocab = q35_vocab_size(e);
    h->started = (long)time(NULL);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)cfg->max_connections, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        snprintf(err, n, "cannot listen on %s:%d (address in use or not allowed)", cfg->host, cfg->port);
        free(h);
        return -1;
    }
    *out = h;
    return 0;
}

int http_port(const Http *h) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : h->cfg.port;
}

void http_quiesce(Http *h) {
    atomic_store(&h->stopping, 1);
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_drain(Http *h, int ms) {
    for (int t = 0; h && t < ms && atomic_load(&h->active) > 0; t += 2) usleep(2000);
}

void http_stop(Http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
