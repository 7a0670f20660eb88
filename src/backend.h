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
} BackendOptions;

/* On-device sampling request (CUDA): temperature 0 = argmax. */
typedef struct DeviceSampling {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed, step; /* counter-based RNG: (seed, step) -> uniform */
} DeviceSampling;

/* Decode benchmark request/result (CUDA backend's bench hook). Times are medians. */
typedef struct BenchRequest {
    int ctx_len; /* position of the timed token: KV positions [0, ctx_len) hold random data */
    int iters;   /* graph replays per timing batch (5 batches, median); 0 = 200 */
    int ops;     /* 1: also time every launch of one eager step with events (no PDL) */
} BenchRequest;

#define BENCH_MAX_OPS 512
typedef struct BenchOp {
    char name[40]; /* "L03.qkv", "L03.attention", "L03.o_proj", "L03.gate_up", "L03.down", "lm_head", ... */
    double us;     /* event time of the launch in an eager step */
    double bytes;  /* bytes it moves (weights + state + activations); GB/s = bytes / us / 1e3 */
} BenchOp;

typedef struct BenchResult {
    double ms_token;        /* graph replay with the options the backend was opened with */
    double ms_atomic;       /* graph + PDL, atomic split-K */
    double ms_det;          /* graph + PDL, deterministic split-K */
    double ms_nopdl;        /* graph, no PDL, atomic */
    double ms_eager;        /* no graph (launch by launch), PDL, atomic */
    double ms_sync;         /* per token with the 4-byte readback and host sync (decode_sample) */
    double ms_sample;       /* sampling graph (temperature 1, top_k 20, top_p 0.95, min_p 0.05) */
    int launches;           /* kernel nodes in one step's graph (greedy) */
    double step_bytes;      /* bytes one step moves (sum over its launches) */
    double copy_gbs;        /* device-to-device cudaMemcpy, (read + write) bytes / s / 1e9 */
    double read_gbs;        /* streaming-read kernel, bytes / s / 1e9 */
    char device[64];
    int n_sm;
    int n_ops;              /* ops[] filled when rq->ops */
    BenchOp ops[BENCH_MAX_OPS];
} BenchResult;

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
/* 1 if a CUDA device is usable (0 in a CUDA=0 build). */
int cuda_available(void);

#endif
