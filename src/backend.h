/* backend.h — the function table both backends fill; the only backend header core includes.
 * A backend owns all device/host buffers for one sequence of up to max_seq tokens. */
#ifndef Q35_BACKEND_H
#define Q35_BACKEND_H

#include "model.h"
#include "sampler.h"

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
    int device;        /* CUDA: device index (0 = the first) */
} BackendOptions;

/* On-device sampling request (CUDA): temperature 0 = argmax. With n_pen > 0, the logit changes pen[0 .. n_pen)
 * (sampler_penalties' list, under the three penalties' values) come first, as sampler.c applies them. */
typedef struct DeviceSampling {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed, step; /* counter-based RNG: (seed, step) -> uniform */
    float repetition, presence, frequency;
    int n_pen;
    const SamplePenalty *pen;
} DeviceSampling;

/* Decode benchmark request/result (CUDA backend's bench hook). Times are medians. */
/* The decode benchmark structs are public (include/qwen35.h) so `qwen35 bench` can print them. */
typedef Q35BenchRequest BenchRequest;
typedef Q35BenchOp BenchOp;
typedef Q35BenchResult BenchResult;
#define BENCH_MAX_OPS Q35_BENCH_MAX_OPS

/* ---- many sequences (serve): the optional batched step --------------------------------------------------------
 * Core (src/serve.c) owns the policy: which sequence holds which slot, which KV blocks, the block tables (plain int
 * arrays in host memory), sampling. The backend owns the memory: per full-attention layer a KV pool of n_blocks
 * blocks, each [Hkv][block][hd] for K and the same for V (fp32, bf16, whatever it likes: it reports the bytes), and
 * per DeltaNet layer n_slots state slots, each the recurrent state S [Hv][dk][dv] plus the conv window
 * [K-1][conv_dim]. A backend that leaves step_batch NULL serves one sequence at a time through forward() and reset()
 * (core's fallback, max_seqs 1); serve_sizes / serve_open / serve_close are then NULL too. */
typedef struct ServeSizes {
    size_t block_bytes;    /* one KV block of `block` tokens: K and V of every full-attention layer */
    size_t slot_bytes;     /* one slot: S and the conv window of every DeltaNet layer */
    size_t mem_bytes;      /* memory the serve state may come from: free device memory (GPU), physical memory (CPU) */
    double mem_fraction;   /* default share of mem_bytes (Q35ServeOptions kv_bytes and kv_fraction both 0) */
    size_t host_mem_bytes; /* host memory a host tier of snapshots may come from (physical memory); 0 when the
                            * snapshots are in host memory anyway (CPU: no host tier unless asked for) */
} ServeSizes;

typedef struct ServeLayout {
    int n_slots;      /* DeltaNet state slots: sequences open at once */
    int n_blocks;     /* KV blocks in each full-attention layer's pool */
    int block;        /* tokens per block */
    int max_blocks;   /* entries of one block table: ceil(max_seq / block) */
    int n_snaps;      /* prefix cache: DeltaNet state snapshots, each the size of a slot (0 = none; only a backend
                     * with snap_save / snap_load / block_copy is given any), ids [0, n_snaps) */
    int n_host_snaps; /* more snapshots in host memory (pinned on a GPU), ids [n_snaps, n_snaps + n_host_snaps); only
                       * a backend with snap_copy is given any */
    int state_bf16;   /* 1: the slots' (and snapshots') recurrent states S are bf16 (Q35ServeOptions.state_bf16) */
    int kv_fp8;       /* 1: K and V are stored as e4m3 values (Q35ServeOptions.kv_fp8) */
    const char *ablate; /* measurement only: Q35ServeOptions.ablate (NULL or "" = none; a backend without it refuses
                         * a list) */
} ServeLayout;

/* One sequence's part of a batched step: n tokens at positions pos .. pos+n-1 of the sequence in `slot`. */
typedef struct BatchItem {
    int slot;          /* [0, n_slots); at most once per step */
    const int *tokens; /* [n], n >= 1, ids checked by core */
    int n;
    int pos;           /* tokens the slot's sequence already holds; 0 = a new sequence: the backend zeroes the slot's
                        * DeltaNet state (S and conv window) before these tokens */
    const int *blocks; /* block table: position p's K/V row is row p % block of block blocks[p / block]; covers
                        * positions [0, pos + n) (core took the blocks before the call) */
    int logits;        /* 1: the last token's logits go to the next row of the step's logits output */
    int *pick;         /* optional, with logits = 1: the backend may write the row's pick here and leave the row itself
                     * out of the output (its place in the output stays): the argmax over the valid ids (ties: the
                     * smallest id, as sampler_argmax), or with sample (temperature > 0) the id drawn by its rules
                     * (sampler.c's, u from counter_uniform(seed, step)); core sets *pick = -1 first and picks on the
                     * host when it stays -1 */
    float *logprob;    /* optional, with pick: a backend that writes *pick writes here the row's log-softmax at it (raw
                     * logits over the valid ids: l - log sum exp(l)); one that cannot leaves *pick -1 */
    const DeviceSampling *sample; /* optional, with pick: the row's sampling settings; a backend that cannot apply its
                                   * logit changes (n_pen > 0) leaves *pick -1 */
    int n_snaps;                  /* prefix-cache snapshots inside the item (Q35StepItem.snap_at; a backend with the
                                   * snapshot hooks must take them): the slot's state after the first snap_off[k] tokens
                                   * (ascending, in (0, n)), as snap_save would copy it, into snapshot snap_id[k] (a
                                   * device-tier id; -1: none, skip it) */
    const int *snap_off, *snap_id;
} BatchItem;

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
    /* Optional batched step (NULL: core's one-sequence fallback). serve_sizes reports the bytes of one block of
     * `block` tokens and of one slot as the backend stores it (state_bf16: with bf16 states S, kv_fp8: with e4m3 K
     * and V, where it keeps them so), and the memory they may come from. serve_open allocates the pools for layout l
     * (a second call replaces them); serve_close frees them. The single-sequence forward() keeps working beside them
     * (its own state), though core does not mix the two. */
    int (*serve_sizes)(void *ctx, int block, int state_bf16, int kv_fp8, ServeSizes *s, Err *err);
    int (*serve_open)(void *ctx, const ServeLayout *l, Err *err);
    void (*serve_close)(void *ctx);
    /* Runs the n items in one step. logits: [n_out][V] with n_out = the items with logits = 1, rows in item order
     * (NULL when n_out is 0). Items are independent sequences: a sequence's results must not depend on the other
     * items, their order or the thread count (batch invariance; with QWEN35_DETERMINISTIC / deterministic on GPUs).
     * On error the items' slots and blocks hold undefined state (core closes those sequences). */
    int (*step_batch)(void *ctx, const BatchItem *items, int n, float *logits, Err *err);
    /* Optional: the sequence in `slot` was closed or preempted. Its blocks are already given back and a later
     * sequence in the slot starts at position 0, so whatever the backend still holds for it (the CUDA backend's solo
     * state, not yet written back to the slot and pages) may be dropped instead of written back. */
    void (*seq_end)(void *ctx, int slot);
    /* Optional prefix-cache hooks (src/prefix.c; all three or none: NULL means no cache hits, never wrong output).
     * snap_save copies slot's DeltaNet state (S and conv window of every DeltaNet layer) into snapshot snap
     * ([0, ServeLayout.n_snaps + n_host_snaps): either tier); snap_load copies it back into slot. block_copy copies
     * KV block src into block dst (K and V, every full-attention layer): the copy-on-write of a shared, partly filled
     * last block. snap_copy (optional beside them; NULL: no host tier) copies snapshot src into snapshot dst, either
     * tier: core demotes a device snapshot to the host tier with it. Each runs in stream order with step_batch and
     * with the others (a later step or copy sees the copy). */
    int (*snap_save)(void *ctx, int slot, int snap, Err *err);
    int (*snap_load)(void *ctx, int snap, int slot, Err *err);
    int (*block_copy)(void *ctx, int src, int dst, Err *err);
    int (*snap_copy)(void *ctx, int src, int dst, Err *err);
} Backend;

extern const Backend cpu_backend;
/* CUDA backend table; in a CUDA=0 build stub.c provides one whose open() fails clearly. */
extern const Backend cuda_backend;
/* The CUDA context's decode schedule (which fused kernels the model's shapes and the device allow) as text
 * lines into buf[n]; returns snprintf's count. */
int cuda_describe(void *ctx, char *buf, size_t n);
/* 1 if a CUDA device is usable (0 in a CUDA=0 build). */
int cuda_available(void);

#endif
