/* backend.h — the function table both backends fill; the only backend header core includes.
 * A backend owns all device/host buffers for one sequence of up to max_seq tokens. */
#ifndef Q35_BACKEND_H
#define Q35_BACKEND_H

#include "model.h"

typedef struct BackendOptions {
    int max_seq;
    int threads;       /* CPU */
    int deterministic; /* CUDA split-K reduction mode */
    int no_graph;      /* CUDA */
    int no_pdl;        /* CUDA: launch without programmatic dependent launch */
    Probe probe;       /* activation dumps (forces eager on CUDA) */
    int n_valid;       /* ids >= n_valid are embedding padding: never argmax'ed or sampled on the
                        * device (0 = vocab_size); the engine passes the tokenizer size */
    int prefill_piece; /* CUDA: tokens per prefill piece (0 = min(2048, max_seq)) */
    int persistent;    /* CUDA: decode the layers with the persistent kernel (experimental) */
    int mlp_fused;     /* CUDA: the decode step's MLP as one kernel (atomic mode only; needs W_down transposed:
                        * + F x D x 2 bytes per layer). The engine sets it unless Q35Options.mlp_unfused. */
} BackendOptions;

/* On-device sampling request (CUDA): temperature 0 = argmax. */
typedef struct DeviceSampling {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed, step; /* counter-based RNG: (seed, step) -> uniform */
} DeviceSampling;

/* Decode benchmark request/result (CUDA backend's bench hook). Times are medians. */
/* The decode benchmark structs are public (include/qwen35.h) so `qwen35 bench` can print them. */
typedef Q35BenchRequest BenchRequest;
typedef Q35BenchOp BenchOp;
typedef Q35BenchResult BenchResult;
#define BENCH_MAX_OPS Q35_BENCH_MAX_OPS

typedef struct Backend {
    const char *name;
    int (*open)(void **ctx, const Model *m, const BackendOptions *o, Err *err);
    /* Runs n tokens at positions pos..pos+n-1. logits: NULL, [n][V] (all_logits) or [V] (last). */
    int (*forward)(void *ctx, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err);
    /* Optional (NULL if absent): one decode step that samples on the device and returns the id. */
    int (*decode_sample)(void *ctx, int token, int pos, const DeviceSampling *s, int *out_id, Err *err);
    int (*reset)(void *ctx, Err *err); /* new sequence: clear KV, conv and delta state */
    void (*close)(void *ctx);
    /* Optional (NULL if absent): decode timings at rq->ctx_len. Clobbers the sequence (reset after). */
    int (*bench)(void *ctx, const BenchRequest *rq, BenchResult *res, Err *err);
} Backend;

extern const Backend cpu_backend;
/* CUDA backend table; in a CUDA=0 build stub.c provides one whose open() fails clearly. */
extern const Backend cuda_backend;
/* 1 when the CUDA context decodes with the persistent layer kernel, else 0 with the reason in
 * why[n] (tests, bench). */
int cuda_decode_path(void *ctx, char *why, size_t n);
/* 1 if a CUDA device is usable (0 in a CUDA=0 build). */
int cuda_available(void);

#endif
