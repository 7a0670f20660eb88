/* http.h — the HTTP front of `qwen35 serve` on libmicrohttpd: routing, Bearer auth, the request-size limit,
 * OpenAI error objects, chat / completion requests handed to the scheduler, SSE streaming, /v1/models,
 * /health and /metrics. One thread per connection; a handler blocks only on its own request. */
#ifndef Q35_SERVER_HTTP_H
#define Q35_SERVER_HTTP_H
#include <stddef.h>

#include "qwen35.h"
#include "server/metrics.h"
#include "server/sched.h"

typedef struct HttpConfig {
    const char *host;    /* address or name to bind */
    int port;            /* 0: any free port (http_port tells which) */
    const char *api_key; /* NULL: no auth; else "Authorization: Bearer KEY" on /v1/ routes */
    size_t max_body;     /* request bytes; more is 413 */
    const char *model;   /* the served model name (/v1/models, the "model" field) */
    int think;           /* default thinking mode of chat requests: Q35_THINK_ON / OFF */
    int max_connections;
    int quiet; /* no log line per rejected request */
} HttpConfig;

typedef struct Http Http;

/* Starts listening. 0, or -1 with a one-line reason in err. */
int http_start(Http **out, const HttpConfig *cfg, Q35Engine *e, Sched *s, Metrics *m, char *err, size_t n);
int http_port(const Http *h);
/* Stops accepting connections (the ones open keep being served). */
void http_quiesce(Http *h);
/* Closes every connection and frees h (call after sched_stop, so no handler waits on a request, and after
 * http_drain, so that the replies went out; sched_close after it: the connections release their requests). */
/* Waits (at most ms) until every request taken in has completed: its reply or its stream's end written. */
void http_drain(Http *h, int ms);
void http_stop(Http *h);

#endif
