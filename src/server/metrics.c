/* metrics.c — counters, gauges and histograms for GET /metrics (Prometheus text format 0.0.4). The histogram
 * bounds are vLLM's, so its Grafana panels' bucket queries work unchanged. */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double TTFT_LE[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                 1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double ITL_LE[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double E2E_LE[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

static void hist_init(Histogram *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n_le = n;
}

static void hist_observe(Histogram *h, double v) {
    int i = 0;
    while (i < h->n_le && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

void metrics_init(Metrics *m, const char *model) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->model = model;
    hist_init(&m->ttft, TTFT_LE, (int)(sizeof TTFT_LE / sizeof TTFT_LE[0]));
    hist_init(&m->itl, ITL_LE, (int)(sizeof ITL_LE / sizeof ITL_LE[0]));
    hist_init(&m->e2e, E2E_LE, (int)(sizeof E2E_LE / sizeof E2E_LE[0]));
}

void metrics_free(Metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_gauges(Metrics *m, int running, int waiting, double kv_usage) {
    pthread_mutex_lock(&m->mu);
    m->running = running;
    m->waiting = waiting;
    m->kv_usage = kv_usage;
    pthread_mutex_unlock(&m->mu);
}

void metrics_itl(Metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    hist_observe(&m->itl, seconds);
    pthread_mutex_unlock(&m->mu);
}

void metrics_prefix(Metrics *m, int queries, int hits) {
    pthread_mutex_lock(&m->mu);
    m->prefix_queries += (unsigned long long)queries;
    m->prefix_hits += (unsigned long long)hits;
    pthread_mutex_unlock(&m->mu);
}

void metrics_request(Metrics *m, int prompt_tokens, int generation_tokens, double ttft, double e2e,
                     const char *reason) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (unsigned long long)prompt_tokens;
    m->generation_tokens += (unsigned long long)generation_tokens;
    if (!reason)
        m->failed++;
    else if (!strcmp(reason, "stop"))
        m->finished_stop++;
    else if (!strcmp(reason, "length"))
        m->finished_length++;
    else
        m->finished_abort++;
    if (ttft >= 0) hist_observe(&m->ttft, ttft);
    hist_observe(&m->e2e, e2e);
    pthread_mutex_unlock(&m->mu);
}

typedef struct Out {
    char *p;
    size_t n, cap;
} Out;

static void put(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Out *o, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(o->p ? o->p + o->n : NULL, o->p ? o->cap - o->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (o->p && o->n + (size_t)k < o->cap) {
            o->n += (size_t)k;
            return;
        }
        size_t cap = (o->cap ? o->cap * 2 : 4096) + (size_t)k;
        char *p = realloc(o->p, cap);
        if (!p) return;
        o->p = p;
        o->cap = cap;
    }
}

static void put_hist(Out *o, const char *name, const char *help, const Histogram *h, const char *model) {
    put(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < h->n_le; i++) {
        cum += h->count[i];
        put(o, "%s_bucket{le=\"%g\",model_name=\"%s\"} %llu\n", name, h->le[i], model, cum);
    }
    put(o, "%s_bucket{le=\"+Inf\",model_name=\"%s\"} %llu\n", name, model, h->total);
    put(o, "%s_count{model_name=\"%s\"} %llu\n", name, model, h->total);
    put(o, "%s_sum{model_name=\"%s\"} %.9g\n", name, model, h->sum);
}

char *metrics_text(Metrics *m) {
    Out o = {0};
    pthread_mutex_lock(&m->mu);
    const char *md = m->model;
    put(&o, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n");
    put(&o, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"%s\"} %d\n", md,
        m->running);
    put(&o, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n");
    put(&o, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"%s\"} %d\n", md,
        m->waiting);
    put(&o, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n");
    put(&o, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"%s\"} %.6f\n", md,
        m->kv_usage);
    put(&o, "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n");
    put(&o, "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"%s\"} %llu\n", md,
        m->prompt_tokens);
    put(&o, "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n");
    put(&o, "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name=\"%s\"} %llu\n", md,
        m->generation_tokens);
    put(&o, "# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.\n");
    put(&o, "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name=\"%s\"} %llu\n", md,
        m->prefix_queries);
    put(&o, "# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.\n");
    put(&o, "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name=\"%s\"} %llu\n", md,
        m->prefix_hits);
    put(&o, "# HELP vllm:request_success_total Count of successfully processed requests.\n");
    put(&o, "# TYPE vllm:request_success_total counter\n");
    put(&o, "vllm:request_success_total{finished_reason=\"stop\",model_name=\"%s\"} %llu\n", md, m->finished_stop);
    put(&o, "vllm:request_success_total{finished_reason=\"length\",model_name=\"%s\"} %llu\n", md, m->finished_length);
    put(&o, "vllm:request_success_total{finished_reason=\"abort\",model_name=\"%s\"} %llu\n", md, m->finished_abort);
    put(&o, "# HELP qwen35:request_failure_total Requests that ended in an engine error.\n");
    put(&o, "# TYPE qwen35:request_failure_total counter\nqwen35:request_failure_total{model_name=\"%s\"} %llu\n", md,
        m->failed);
    put_hist(&o, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &m->ttft, md);
    put_hist(&o, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &m->itl, md);
    put_hist(&o, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &m->e2e, md);
    pthread_mutex_unlock(&m->mu);
    return o.p;
}
