/* metrics.h — Prometheus text for GET /metrics, under vLLM's metric names (vllm:num_requests_running,
 * vllm:num_requests_waiting, vllm:kv_cache_usage_perc, vllm:time_to_first_token_seconds,
 * vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds, vllm:prompt_tokens_total,
 * vllm:generation_tokens_total, vllm:request_success_total) so vLLM's dashboards and routers read it unchanged.
 * Thread-safe: every call takes the metrics' own lock. */
#ifndef Q35_SERVER_METRICS_H
#define Q35_SERVER_METRICS_H
#include <pthread.h>

#define METRICS_MAX_BUCKETS 24
typedef struct Histogram {
    const double *le; /* upper bounds, ascending; +Inf implied */
    int n_le;
    unsigned long long count[METRICS_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last: above every bound */
    double sum;
    unsigned long long total;
} Histogram;

typedef struct Metrics {
    pthread_mutex_t mu;
    const char *model; /* label model_name */
    int running, waiting;
    double kv_usage; /* 0..1 */
    unsigned long long prompt_tokens, generation_tokens;
    unsigned long long finished_stop, finished_length, finished_abort, failed;
    unsigned long long prefix_queries, prefix_hits; /* prompt tokens looked up in the prefix cache / found there */
    Histogram ttft, itl, e2e;
} Metrics;

void metrics_init(Metrics *m, const char *model);
void metrics_free(Metrics *m);
void metrics_gauges(Metrics *m, int running, int waiting, double kv_usage);
void metrics_itl(Metrics *m, double seconds); /* one inter-token gap */
/* A request ended: reason "stop" | "length" | "abort" | NULL (failed). ttft < 0: no token came. */
void metrics_request(Metrics *m, int prompt_tokens, int generation_tokens, double ttft, double e2e, const char *reason);
/* A request admitted: its prompt tokens were looked up in the prefix cache, `hits` of them found (vLLM's
 * vllm:prefix_cache_queries / vllm:prefix_cache_hits, in tokens). */
void metrics_prefix(Metrics *m, int queries, int hits);
/* The exposition text (malloc'ed). */
char *metrics_text(Metrics *m);
#endif
