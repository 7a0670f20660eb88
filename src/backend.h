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
    Probe probe;       /* activation dumps (forces eager on CUDA) */
} BackendOptions;

/* On-device sampling request (CUDA): temperature 0 = argmax. */
typedef struct DeviceSampling {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed, step; /* counter-based RNG: (seed, step) -> uniform */
} DeviceSampling;

typedef struct Backend {
    const char *name;
    int (*open)(void **ctx, const Model *m, const BackendOptions *o, Err *err);
    /* Runs n tokens at positions pos..pos+n-1. logits: NULL, [n][V] (all_logits) or [V] (last). */
    int (*forward)(void *ctx, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err);
    /* Optional (NULL if absent): one decode step that samples on the device and returns the id. */
    int (*decode_sample)(void *ctx, int token, int pos, const DeviceSampling *s, int *out_id, Err *err);
    int (*reset)(void *ctx, Err *err); /* new sequence: clear KV, conv and delta state */
    void (*close)(void *ctx);
} Backend;

extern const Backend cpu_backend;
/* CUDA backend table; in a CUDA=0 build stub.c provides one whose open() fails clearly. */
extern const Backend cuda_backend;
/* 1 if a CUDA device is usable (0 in a CUDA=0 build). */
int cuda_available(void);

#endif
