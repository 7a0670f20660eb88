/* qwen35.h — public API of the qwen35 inference engine (Qwen3.5 hybrid + dense Qwen3).
 * Opaque engine and tokenizer handles; every call that can fail returns 0 or a negative
 * Q35_ERR_* code and fills a Q35Err. Nothing here exits the process. */
#ifndef QWEN35_H
#define QWEN35_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    Q35_OK = 0,
    Q35_ERR_IO = -1,          /* file missing, unreadable, short read */
    Q35_ERR_FORMAT = -2,      /* malformed safetensors / JSON / tokenizer file */
    Q35_ERR_CONFIG = -3,      /* unsupported or inconsistent config.json value */
    Q35_ERR_ARG = -4,         /* bad argument from the caller (ids out of range, ...) */
    Q35_ERR_OOM = -5,         /* host or device allocation failed */
    Q35_ERR_CUDA = -6,        /* CUDA runtime error or CUDA backend unavailable */
    Q35_ERR_UNSUPPORTED = -7, /* feature not available in this build / backend */
    Q35_ERR_CONTEXT = -8,     /* sequence would exceed the context limit */
    Q35_ERR_UTF8 = -9,        /* invalid UTF-8 input */
    Q35_ERR_NET = -10,        /* network / HTTP failure */
};

typedef struct Q35Err {
    int code;
    char msg[256];
} Q35Err;

typedef struct Q35Engine Q35Engine;
typedef struct Q35Tokenizer Q35Tokenizer;

/* Progress of a long load (random dummy weights, checkpoint tensors): done of total units of what; called on the
 * opening thread, about 100 times per load at most. */
typedef void (*Q35ProgressFn)(void *user, const char *what, double done, double total);

typedef struct Q35Options {
    const char *model_dir;  /* HF model directory; NULL when dummy is set */
    const char *dummy;      /* "qwen3.5-0.8b" | "qwen3-0.6b": random weights at real shapes */
    uint64_t dummy_seed;    /* seed for dummy weights */
    const char *backend;    /* "cpu" | "cuda" | NULL (auto: cuda if a GPU is usable, else cpu) */
    int max_seq;            /* context cap in tokens; 0 = min(4096, max_position_embeddings) */
    int keep_f32_params;    /* 1: keep F32 A_log / gated-norm weight as F32; 0 (default): round to bf16 like HF */
    int strict;             /* 1: unknown tensor names are an error (default 0: warning) */
    const char *weights;    /* NULL | "auto": as stored (bf16, or FP8 from an FP8 checkpoint); "fp8": quantize the
                            * projection matrices to FP8 e4m3 with 128 x 128 block scales at load (docs/FP8.md) */
    int threads;            /* CPU threads; 0 = all cores */
    int deterministic;      /* CUDA: deterministic split-K reductions */
    int no_graph;           /* CUDA: launch kernels one by one instead of replaying a graph */
    const char *probe_dir;  /* dump named activations (L<l>.<block>.<tensor>.f32) here; forces eager CUDA */
    int device;             /* CUDA device index (serve --device N); 0 = the first */
    Q35ProgressFn progress; /* NULL: no progress reports (the CLI draws a line on a terminal) */
    void *progress_user;
} Q35Options;

typedef struct Q35Sampling {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float presence_penalty;   /* subtracted from logits of ids already generated; 0 = off */
    float repetition_penalty; /* HF-style: logit/p if >0 else logit*p, for seen ids; 1 = off */
    uint64_t seed;
    float frequency_penalty; /* OpenAI: logit -= f * (times the id was generated); 0 = off */
} Q35Sampling;

/* Fills s with the model's defaults (generation_config.json when present, else greedy). */
void q35_sampling_defaults(const Q35Engine *e, Q35Sampling *s);

void q35_options_init(Q35Options *o);
int q35_engine_open(Q35Engine **out, const Q35Options *opt, Q35Err *err);
void q35_engine_close(Q35Engine *e);

/* Human-readable description (architecture, layer kinds, params, bytes, dtypes). */
int q35_engine_describe(const Q35Engine *e, char *buf, size_t n);
const char *q35_backend_name(const Q35Engine *e);
/* A note from opening, or NULL: e.g. backend "auto" found a GPU that cannot run this model's shapes
 * and fell back to the CPU. */
const char *q35_engine_note(const Q35Engine *e);
int q35_vocab_size(const Q35Engine *e);   /* rows of the LM head (padded) */
int q35_context_size(const Q35Engine *e); /* max_seq */
int q35_position(const Q35Engine *e);     /* tokens already in the sequence */
/* The engine's tokenizer (loaded from the model dir when tokenizer.json is there), or NULL. */
Q35Tokenizer *q35_engine_tokenizer(Q35Engine *e);

/* Start a new sequence: clears KV cache, conv and DeltaNet state. */
int q35_reset(Q35Engine *e, Q35Err *err);
/* Appends n ids to the sequence in one forward call. logits: NULL, or [n][vocab] when
 * all_logits, else [vocab] for the last position only. */
int q35_forward(Q35Engine *e, const int *ids, int n, int all_logits, float *logits, Q35Err *err);

/* Token callback for generation: return non-zero to stop. */
typedef int (*Q35TokenFn)(void *user, int id);

typedef struct Q35GenStats {
    int n_prompt, n_generated;
    double prefill_s, decode_s; /* wall time */
    int stop_reason;            /* 0 = length, 1 = stop id, 2 = callback, 3 = context full */
} Q35GenStats;

/* Appends prompt ids, then samples up to max_new tokens, calling fn for each. Stops on the
 * model's stop ids. The sequence keeps its state, so a later call continues it (chat); the last
 * generated id is NOT fed to the model (it is only sampled), so a continuation starts its prompt
 * with that id (e.g. the <|im_end|> that ended the reply). */
int q35_generate(Q35Engine *e, const int *prompt, int n_prompt, int max_new, const Q35Sampling *s, Q35TokenFn fn,
                 void *user, Q35GenStats *stats, Q35Err *err);

/* ---- many sequences in one engine (serve) ----
 * q35_serve_open turns the engine into a multi-sequence engine: up to max_seqs sequences at once, each in a
 * slot with its own DeltaNet state (recurrent state + conv window) and a block table into one shared, paged KV
 * cache for the full-attention layers (blocks of kv_block tokens, taken from a pool as a sequence grows and
 * returned when it closes). q35_step appends tokens to any subset of the open sequences in ONE forward pass
 * and samples each one's next token with that sequence's own parameters. The single-sequence calls
 * (q35_forward, q35_generate, q35_reset) keep their own sequence and must not be used on an engine between
 * q35_serve_open and q35_serve_close. A backend without a batched step serves one sequence at a time
 * (max_seqs is then 1). Deterministic mode (Q35Options.deterministic): a sequence's tokens and logprobs do
 * not depend on which other sequences share its steps (batch invariance). */
typedef struct Q35ServeOptions {
    int max_seqs;        /* sequences open at once (slots); 0 = 64 (capped by memory) */
    size_t kv_bytes;     /* bytes for KV blocks + slot states; 0 = kv_fraction of the free (device) memory */
    double kv_fraction;  /* used when kv_bytes is 0; 0 = 0.9 on a GPU, 0.25 of physical memory on the CPU */
    int kv_block;        /* tokens per KV block; 0 = 16 */
    int single_seq;      /* 1: one sequence at a time through the single-sequence forward, as on a backend without a
                         * batched step (tests); kv_bytes is then unused */
    size_t prefix_bytes; /* prefix cache: bytes for its DeltaNet snapshots (at most half) and cached KV blocks; 0 = a
                          * quarter of the KV budget. The snapshots come on top of kv_bytes (out of the automatic
                          * budget when kv_bytes is 0); cached blocks are pool blocks no sequence holds */
    int no_prefix_cache; /* 1: no prefix cache (also off on a backend without the snapshot hooks) */
    size_t prefix_host_bytes; /* prefix cache's host tier: host memory (pinned on a GPU) for snapshots moved out of
                               * the full device tier instead of evicted; 0 = min(4 GiB, a quarter of physical
                               * memory) on a GPU (left out if it cannot be had), none on the CPU backend */
    int no_prefix_host;       /* 1: no host tier */
    /* 1: the DeltaNet recurrent states S of the served sequences (slots and prefix-cache snapshots) are kept in bf16
     * instead of fp32 (vLLM's --mamba-ssm-cache-dtype bfloat16): half the bytes a decode step reads and writes for
     * them, and twice the sequences in the same memory. Each step computes in fp32 from the stored state and rounds
     * the new state to bf16 where it stores it (after every token of a decode step or of the per-token path of
     * deterministic mode, at the end of a prefill chunk otherwise). Needs a backend with a batched step. */
    int state_bf16;
    /* 1: the served sequences' K and V (the paged KV cache of the full-attention layers) are stored as FP8 e4m3
     * values, rounded to nearest even with no scale and saturated at +-448 (vLLM's --kv-cache-dtype fp8 with its
     * default scales of 1): half the bytes attention reads per token and twice the tokens in the same memory, for
     * the precision of a 3-bit mantissa. Attention reads the stored values (a lone sequence's single-sequence step
     * too: its caches then hold the same e4m3 values). Needs a backend with a batched step. */
    int kv_fp8;
    /* measurement only (serve_step --ablate): comma-separated launch kinds left out of the batched pass (sv.in_proj
     * sv.qkv sv.paged_prep sv.attn sv.dn_prep sv.dn_state sv.out_proj sv.o_proj sv.gate_up sv.down), so that the
     * pass's time with and without each says what it costs the chain; the outputs are garbage then (a lone sequence's
     * single-sequence step is not affected). Backends without it (the CPU) refuse a list. NULL or "" = none */
    const char *ablate;
} Q35ServeOptions;

typedef struct Q35ServeInfo {
    int max_seqs;       /* slots */
    int kv_block;       /* tokens per block */
    int n_blocks;       /* blocks in the pool */
    int free_blocks;    /* blocks not held by any sequence now */
    int open_seqs;      /* sequences open now */
    int max_context;    /* longest sequence the engine accepts (q35_context_size) */
    size_t slot_bytes;  /* memory of one slot's DeltaNet state */
    int state_bf16;     /* the states S are bf16 (Q35ServeOptions.state_bf16) */
    int kv_fp8;         /* K and V are stored as e4m3 (Q35ServeOptions.kv_fp8) */
    size_t block_bytes; /* memory of one KV block (all full-attention layers) */
    /* prefix cache (all 0 when it is off); free_blocks above counts the blocks only the cache holds as free */
    size_t prefix_bytes;                 /* its budget */
    int prefix_snaps, prefix_max_blocks; /* capacity: snapshots (each slot_bytes), cached blocks */
    int prefix_used_snaps, prefix_used_blocks;
    long long prefix_evicted;                      /* entries evicted so far (least recently used first) */
    int prefix_host_snaps, prefix_used_host_snaps; /* host tier: capacity (0: none), held now */
    long long prefix_demoted, prefix_promoted;     /* snapshots moved device -> host tier, host -> device so far */
} Q35ServeInfo;

/* Per-sequence generation parameters (fixed for the sequence's life). */
typedef struct Q35SeqParams {
    Q35Sampling sampling; /* temperature / top-k / top-p / min-p / the three penalties / seed */
    int top_logprobs;     /* -1: no logprobs; 0..20: the chosen id's logprob and this many top alternatives */
    /* OpenAI logit_bias: logit[bias_ids[k]] += bias[k] for k < n_bias, before the penalties and the temperature; ids
     * in [0, vocab) and finite values (else Q35_ERR_ARG); copied by q35_seq_open. Logprobs stay the raw logits'. */
    const int *bias_ids;
    const float *bias;
    int n_bias;
    /* vLLM's min_tokens: the n_min_ids ids (the stop ids: the model's and the request's) are not sampled before
     * min_tokens ids were generated; copied by q35_seq_open. */
    int min_tokens;
    const int *min_ids;
    int n_min_ids;
} Q35SeqParams;

/* One sequence's part of a step: ids appended at its end (a prompt chunk, or the id sampled last step). */
typedef struct Q35StepItem {
    int seq;        /* from q35_seq_open; at most once per step */
    const int *ids; /* n >= 1 ids */
    int n;
    int sample;    /* 1: sample the token that follows ids[n-1] into the matching Q35StepOut */
    float *logits; /* NULL, or [q35_vocab_size]: receives the raw logits of the token after ids[n-1] (with or
                     * without sample; tests and teacher-forced comparisons) */
    /* Prefix-cache snapshots taken inside the step: positions p (ascending, q35_seq_length < p < q35_seq_length + n,
     * at most Q35_MAX_STEP_SNAPS) after which the sequence's ids [0, p) are recorded with their DeltaNet state, as
     * if the step were cut at p and q35_seq_snapshot called there, without cutting it (one pass over the ids). Ignored
     * when the cache is off. */
    const int *snap_at;
    int n_snap_at;
} Q35StepItem;
#define Q35_MAX_STEP_SNAPS 8

#define Q35_MAX_TOP_LOGPROBS 20
typedef struct Q35StepOut {
    int id;        /* sampled id (items with sample = 1), else -1 */
    float logprob; /* log softmax of the raw logits (before penalties / temperature) at id; 0 without logprobs */
    int n_top;     /* top_logprobs alternatives filled, most likely first */
    int top_id[Q35_MAX_TOP_LOGPROBS];
    float top_logprob[Q35_MAX_TOP_LOGPROBS];
} Q35StepOut;

int q35_serve_open(Q35Engine *e, const Q35ServeOptions *o, Q35Err *err);
void q35_serve_close(Q35Engine *e);
void q35_serve_info(const Q35Engine *e, Q35ServeInfo *info);
/* Opens a sequence (empty). Q35_ERR_OOM when every slot is taken. *seq is an opaque handle >= 0, not a slot index
 * (a closed sequence's handle stays invalid: later calls with it fail with Q35_ERR_ARG). */
int q35_seq_open(Q35Engine *e, const Q35SeqParams *p, int *seq, Q35Err *err);
/* Closes a sequence: its slot and KV blocks go back to the pools. A handle not open is ignored. */
void q35_seq_close(Q35Engine *e, int seq);
int q35_seq_length(const Q35Engine *e, int seq); /* tokens in the sequence (fed); Q35_ERR_ARG if not open */
/* KV blocks the sequence must newly take to grow by n tokens (0 when its last block has room); Q35_ERR_ARG if not
 * open. */
int q35_seq_blocks_needed(const Q35Engine *e, int seq, int n);
/* The sequence's history: every id fed so far, then the id sampled last if it is not fed yet; returns their count
 * (q35_seq_length, or one more) and points *ids at them (valid until the next step or close). Q35_ERR_ARG if not
 * open. A step's ids must agree with the history where they overlap it: the id fed after a sample is the sampled
 * id (else Q35_ERR_ARG). */
int q35_seq_history(const Q35Engine *e, int seq, const int **ids);
/* Preemption: the sequence gives back its KV blocks and its length drops to 0; its slot, history, penalty counts and
 * RNG stay. Recompute it by feeding its history again (q35_seq_history, in chunks like a prompt, sample = 1 on the
 * last one): those ids are not counted again, and the tokens sampled next are those an unpreempted run samples. */
int q35_seq_preempt(Q35Engine *e, int seq, Q35Err *err);
/* One forward pass over n items. On Q35_ERR_OOM (not enough free KV blocks for all items), Q35_ERR_CONTEXT (an
 * item would pass the context) or Q35_ERR_ARG (a bad item, named in the message: a sequence not open or twice in the
 * step, an id out of range, an id that contradicts the history) nothing is changed; any other error (the backend's)
 * leaves the named sequences unusable (close them). out: [n], filled for items with sample = 1 (id -1 for the
 * others); may be NULL when no item samples. Initialise Q35StepItem with designated initialisers or {0}: fields may
 * be added at its end. */
int q35_step(Q35Engine *e, const Q35StepItem *items, int n, Q35StepOut *out, Q35Err *err);
/* The logprobs q35_step reports, for a logits row [q35_vocab_size] the caller holds (a guided request's, a prompt
 * position's): o->logprob of o->id and the top (<= Q35_MAX_TOP_LOGPROBS) alternatives, a log softmax of the raw
 * logits over the tokenizer's ids. */
void q35_logprobs(const Q35Engine *e, const float *logits, int top, Q35StepOut *o);

/* ---- prefix cache (docs/SERVE_ENGINE.md "Prefix cache") ----
 * A radix tree over the ids of recorded sequences: their KV blocks (shared read-only; a resumed sequence copies its
 * partly filled last block) and snapshots of their DeltaNet state at recorded positions. In deterministic mode a
 * sequence resumed from the cache gives the same tokens and logprobs, bit for bit, as the same sequence fed cold. */
typedef struct Q35PrefixHit {
    int cached;  /* ids taken from the cache: the sequence's length after the open (its history holds them) */
    int matched; /* ids of the prompt that equal a recorded sequence (>= cached): where it diverges from the cache */
} Q35PrefixHit;
/* q35_seq_open, then resumes from the longest recorded prefix of prompt[0, n) with a snapshot at most n - 1 ids
 * long (at least one id is left to feed, for the logits). The caller feeds prompt[hit->cached, n) next. A miss, or
 * a cache that is off, opens an empty sequence (hit->cached 0). Errors as q35_seq_open. */
int q35_seq_open_cached(Q35Engine *e, const Q35SeqParams *p, const int *prompt, int n, int *seq, Q35PrefixHit *hit,
                        Q35Err *err);
/* Records the sequence's ids [0, q35_seq_length) with its current DeltaNet state in the cache, so later sequences
 * that start with those ids resume there. May evict least-recently-used entries; a no-op when the cache is off or
 * already holds that snapshot. Call it between steps, at the positions where requests are expected to diverge (a
 * position inside a step: Q35StepItem.snap_at). */
int q35_seq_snapshot(Q35Engine *e, int seq, Q35Err *err);

/* ---- decode benchmark (backends with a device timer: CUDA) ---- */
typedef struct Q35BenchRequest {
    int ctx_len; /* position of the timed token: KV positions [0, ctx_len) hold random data */
    int iters;   /* graph replays per timing batch (5 batches, median); 0 = 200 */
    int ops;     /* 1: also time every launch of one eager step with events (no PDL) */
    /* prefill (CUDA, issue 5): n_prefill > 0 times prefill instead of decode: one prompt of each
     * length from position 0 (last-row logits on the device), plus a 4096^3 GEMM of our own kernel;
     * with ops, the launches of one eager prefill of min(2048, piece size) tokens go to ops[]. */
    int n_prefill;
    int prefill_lens[8];
    const char *ablate;    /* measurement only (bench --ablate): comma-separated launch kinds left out of the step
                            * (qkvzba qkv deltanet dnlayer attention attn_o out_proj o_proj mlp gate_up down lm_head);
                            * outputs are garbage then; NULL or "" = none */
    const char *trace_csv; /* measurement only (bench --trace-csv, the TRACE=1 build): per-block timer stamps here */
} Q35BenchRequest;

#define Q35_BENCH_MAX_OPS 512
typedef struct Q35BenchOp {
    char name[40]; /* "L03.qkv", "L03.attention", "L03.o_proj", "L03.gate_up", "L03.down", "lm_head", ... */
    double us;     /* event time of the launch in an eager step */
    double bytes;  /* bytes it moves (weights + state + activations); GB/s = bytes / us / 1e3 */
    double flop;   /* prefill ops: floating-point operations (2 per multiply-add) */
} Q35BenchOp;

/* One prefill timing (Q35BenchRequest.n_prefill). */
typedef struct Q35BenchPrefill {
    int tokens;
    double ms;       /* median over runs, device events around the whole prefill */
    double ms_nopdl; /* the same, kernels launched without programmatic dependent launch */
    double ms_graph; /* the same launches captured once into a CUDA graph and replayed (CUDA; 0 if capture fails):
                      * the device time alone, without the host's launch work */
    double tflop;    /* useful work: linear layers, causal attention, chunked DeltaNet, conv, LM head (1 row) */
} Q35BenchPrefill;

typedef struct Q35BenchResult {
    double ms_token;  /* graph replay with the options the backend was opened with */
    double ms_atomic; /* graph + PDL, atomic split-K */
    double ms_det;    /* graph + PDL, deterministic split-K */
    double ms_nopdl;  /* graph, no PDL, atomic */
    double ms_eager;  /* no graph (launch by launch), PDL, atomic */
    double ms_sync;   /* per token with the 4-byte readback and host sync (decode_sample) */
    double ms_sample; /* sampling graph (temperature 1, top_k 20, top_p 0.95, min_p 0.05) */
    int mlp_fused;    /* 1: the backend runs the fused MLP kernel (the default; --mlp-unfused: off); the columns above
                             * use it wherever the split-K is atomic */
    double ms_mlp_unfused;    /* mlp_fused only: graph + PDL, atomic, with the two MLP GEMVs instead (same run) */
    int launches_mlp_unfused; /* kernel nodes of that graph */
    int lm_screen;      /* 1: greedy steps take the LM head's argmax through its quantized screen (the default; the
                             * same id, QWEN35_LM_SCREEN=0: off); every greedy column above uses it */
    double ms_lm_full;  /* lm_screen only: graph + PDL, atomic, with the full bf16 LM head instead (same run) */
    double screen_rows; /* lm_screen only: rows whose logit the screen recomputed exactly, per step (ms_token's run) */
    double screen_fallback; /* ... and blocks per step that computed all their rows (list overflow, NaN input) */
    int launches;           /* kernel nodes in one step's graph (greedy) */
    double step_bytes;      /* bytes one step moves (sum over its launches) */
    double copy_gbs;        /* device-to-device cudaMemcpy, (read + write) bytes / s / 1e9 */
    double read_gbs;        /* streaming-read kernel, bytes / s / 1e9 */
    char device[64];
    int n_sm;
    int n_ops; /* ops[] filled when rq->ops */
    Q35BenchOp ops[Q35_BENCH_MAX_OPS];
    /* prefill (rq->n_prefill > 0) */
    int n_prefill;
    Q35BenchPrefill prefill[8];
    int prefill_piece;  /* tokens per prefill piece (longer prompts run in pieces) */
    int ops_tokens;     /* tokens of the prefill whose launches are in ops[] */
    double gemm_tflops; /* our bf16 GEMM (no cuBLAS) on gemm_m x gemm_n x gemm_k, same run */
    int gemm_m, gemm_n, gemm_k;
} Q35BenchResult;
/* Times the decode step at context rq->ctx_len (needs ctx_len < the context size). The sequence
 * state is clobbered: reset before generating again. Q35_ERR_UNSUPPORTED if the backend has no
 * device benchmark (the CPU backend). */
int q35_bench_decode(Q35Engine *e, const Q35BenchRequest *rq, Q35BenchResult *res, Q35Err *err);

/* ---- tokenizer ---- */
int q35_tokenizer_load(Q35Tokenizer **out, const char *model_dir, Q35Err *err);
void q35_tokenizer_free(Q35Tokenizer *t);
/* Encodes UTF-8 text (len bytes). *ids is malloc'ed; caller frees. Invalid UTF-8 -> Q35_ERR_UTF8
 * with the byte offset in the message. */
int q35_tokenize(const Q35Tokenizer *t, const char *text, size_t len, int **ids, int *n, Q35Err *err);
/* Decodes ids to UTF-8 (invalid sequences -> U+FFFD). *text is malloc'ed and NUL-terminated. */
int q35_detokenize(const Q35Tokenizer *t, const int *ids, int n, int skip_special, char **text, Q35Err *err);
int q35_tokenizer_size(const Q35Tokenizer *t); /* vocab + added tokens */

/* ---- tokenizer extensions (issue 3: src/tokenizer.c, src/chat.c) ---- */
/* Like q35_tokenizer_load, from a tokenizer.json path; tokenizer_config.json, generation_config.json
 * and chat_template.jinja are read from the same directory when present. */
int q35_tokenizer_load_file(Q35Tokenizer **out, const char *tokenizer_json, Q35Err *err);
enum { Q35_TOK_OTHER = 0, Q35_TOK_QWEN3 = 3, Q35_TOK_QWEN35 = 35 };
int q35_tokenizer_family(const Q35Tokenizer *t); /* from the added-token ids / vocab size */
/* A note from loading (e.g. "stale Qwen3 split regex replaced by the Qwen3.5 one"), or NULL. */
const char *q35_tokenizer_warning(const Q35Tokenizer *t);
/* Id of an added token with exactly this content, else of the vocab entry whose bytes are text; -1 if none. */
int q35_token_id(const Q35Tokenizer *t, const char *text);
int q35_token_is_special(const Q35Tokenizer *t, int id); /* added token with special: true */
/* Stop ids: generation_config.json eos_token_id when present, else tokenizer_config's eos_token plus
 * <|im_end|> and <|endoftext|>. Returns the count; *ids points into the tokenizer. */
int q35_tokenizer_stop_ids(const Q35Tokenizer *t, const int **ids);

/* Streaming detokenizer: feed ids one by one; each push returns only complete UTF-8 (an incomplete
 * trailing sequence is held back; invalid bytes become U+FFFD exactly as q35_detokenize does), so the
 * pieces concatenated equal q35_detokenize of all ids. */
typedef struct Q35Detok Q35Detok;
int q35_detok_open(Q35Detok **out, const Q35Tokenizer *t, int skip_special, Q35Err *err);
/* *text: NUL-terminated, valid until the next call on d; *len its length (may be 0). */
int q35_detok_push(Q35Detok *d, int id, const char **text, size_t *len, Q35Err *err);
/* End of stream: a held incomplete sequence comes out as U+FFFD; the detokenizer is then empty. */
void q35_detok_flush(Q35Detok *d, const char **text, size_t *len);
void q35_detok_close(Q35Detok *d);

/* Chat template (ChatML, rendered in C; docs/CHAT.md). role: "system" | "user" | "assistant" | "tool".
 * content: NULL is allowed for an assistant turn (rendered as ""); other roles need a string.
 * reasoning: the assistant's thinking (OpenAI-style reasoning_content), or NULL (then a "<think>...</think>"
 * inside content is used, as the templates do). */
typedef struct Q35ChatToolCall {
    const char *id;        /* OpenAI tool_calls[i].id, or NULL; the Qwen templates do not render it */
    const char *name;      /* function.name (required) */
    const char *arguments; /* function.arguments: JSON text of an object, as OpenAI sends it; NULL or "" = none */
} Q35ChatToolCall;
typedef struct Q35ChatMessage {
    const char *role;
    const char *content;
    const char *reasoning;
    /* Issue 30, appended: callers that zero-initialise the rest ({role, content, reasoning}) are unchanged. */
    const Q35ChatToolCall *tool_calls; /* assistant: the calls of this turn, in order, or NULL */
    int n_tool_calls;
    const char *tool_call_id; /* tool: the call answered (OpenAI tool_call_id); the Qwen templates do not render it */
} Q35ChatMessage;
enum { Q35_THINK_DEFAULT = -1, Q35_THINK_OFF = 0, Q35_THINK_ON = 1 };
/* The thinking mode a plain generation prompt gives: Qwen3 on, Qwen3.5 small models off. */
int q35_chat_default_thinking(const Q35Tokenizer *t);
/* Renders messages (as HF apply_chat_template does) into a malloc'ed NUL-terminated *out. thinking:
 * Q35_THINK_* for the generation prompt; add_generation_prompt: append "<|im_start|>assistant\n...".
 * Same as q35_chat_render_request without tools. */
int q35_chat_render(const Q35Tokenizer *t, const Q35ChatMessage *msgs, int n, int add_generation_prompt, int thinking,
                    char **out, Q35Err *err);

/* OpenAI tool_choice. NONE: the prompt keeps the tools (as vLLM does; pass tools = NULL to drop them) and
 * the parser returns all text as content; REQUIRED / FUNCTION: see Q35Guide. */
enum { Q35_TOOL_CHOICE_AUTO = 0, Q35_TOOL_CHOICE_NONE = 1, Q35_TOOL_CHOICE_REQUIRED = 2, Q35_TOOL_CHOICE_FUNCTION = 3 };
typedef struct Q35ChatRequest {
    const Q35ChatMessage *messages;
    int n_messages;
    const char *tools;            /* JSON text of the OpenAI "tools" array ([{"type":"function","function":
                                     {"name", "description", "parameters"}}]), or NULL; rendered by json.dumps
                                     rules (key order kept, 1.0 stays "1.0") */
    int tool_choice;              /* Q35_TOOL_CHOICE_* (0 = auto) */
    const char *tool_choice_name; /* FUNCTION: the function's name (must be one of tools) */
    int add_generation_prompt;
    int thinking; /* Q35_THINK_* */
    int family;   /* 0: the tokenizer's template; Q35_TOK_QWEN3 / Q35_TOK_QWEN35 force one (t may then be NULL) */
    const char *response_schema; /* OpenAI response_format: the reply (after any reasoning) is one JSON value valid
                                    under this JSON Schema (its text; "{\"type\": \"object\"}" for json_object),
                                    NULL: free text. Not rendered into the prompt; see Q35Guide */
} Q35ChatRequest;
/* Renders the conversation and the tools byte for byte as the official template does (Qwen3.5: XML tool
 * calls, tools in the system turn; Qwen3: JSON tool calls). Errors (Q35_ERR_ARG / Q35_ERR_FORMAT, one line):
 * what the template raises on (Qwen3.5: no user query, a system message not first), malformed tools or
 * arguments JSON, arguments that are not an object, an unknown tool_choice_name. *out: malloc'ed. */
int q35_chat_render_request(const Q35Tokenizer *t, const Q35ChatRequest *rq, char **out, Q35Err *err);

/* Prefix-cache snapshot points of a rendered chat prompt (the server's scheduler and `qwen35 chat` both take them):
 * the ids of the template's turn marks, then the points of ids[0, n) after `from` where q35_seq_snapshot should
 * record the sequence: the divergence from the cache (matched), the start of each message (after "<|im_end|>\n": a
 * shared system prompt ends there), the end of the last "<|im_start|>assistant\n" (a resent history diverges right
 * after it: the earlier reply is re-rendered without its think block, docs/TOKENIZER.md §7), and n - 1 (an exact
 * repeat resumes there). Ascending; the last max_pts of them (max_pts <= 32); returns their count. */
typedef struct Q35ChatMarks {
    int im_start, im_end, nl; /* ids of "<|im_start|>", "<|im_end|>", "\n"; -1 when the tokenizer has none */
    int asst[4], n_asst;      /* "assistant\n" as ids */
} Q35ChatMarks;
void q35_chat_marks(const Q35Tokenizer *t, Q35ChatMarks *m); /* t NULL (no tokenizer): no marks */
int q35_chat_prefix_points(const Q35ChatMarks *m, const int *ids, int n, int from, int matched, int *pts, int max_pts);

/* Streaming parse of the generated text (src/chat_parse.c): feed the detokenizer's pieces in order; events
 * come out as soon as they are certain. Only text that may still be the start of a tag is held back (a run of
 * newlines right before "</think>" or "<tool_call>" counts as part of that tag). A call is emitted once it is
 * complete (Qwen3.5: its </function>; Qwen3: its </tool_call>), as TOOL_START (index, id, name) then
 * TOOL_ARGS pieces whose concatenation is the arguments JSON object. Qwen3.5 parameter values are typed by
 * the tool's JSON schema ("integer", "number", "boolean", "object", "array", else string; a value that does
 * not read as its type stays a string). Text after a call is content; a malformed or unfinished call comes
 * out as content at finish, never dropped. */
enum { Q35_CHAT_EV_REASONING = 1, Q35_CHAT_EV_CONTENT = 2, Q35_CHAT_EV_TOOL_START = 3, Q35_CHAT_EV_TOOL_ARGS = 4 };
typedef struct Q35ChatEvent {
    int type;         /* Q35_CHAT_EV_* */
    int index;        /* TOOL_*: the call's index in this turn, from 0 */
    const char *id;   /* TOOL_START: "call_" + 24 hex digits (from id_seed and index) */
    const char *name; /* TOOL_START: the function name */
    const char *text; /* REASONING / CONTENT / TOOL_ARGS: the delta, len bytes (NUL-terminated) */
    size_t len;
} Q35ChatEvent;
/* Called per event; pointers are valid during the call only. A non-zero return stops and is returned. */
typedef int (*Q35ChatEventFn)(void *user, const Q35ChatEvent *ev);
typedef struct Q35ChatParseOptions {
    int family;        /* 0: the tokenizer's; Q35_TOK_QWEN35 (XML calls) | Q35_TOK_QWEN3 (JSON calls) */
    int thinking;      /* the generation prompt's mode (Q35_THINK_*): on -> the text starts as reasoning
                         (an opening "<think>" written by the model is consumed) until "</think>" */
    const char *tools; /* the request's tools JSON (parameter types), or NULL: no calls are parsed */
    int tool_choice;   /* Q35_TOOL_CHOICE_NONE: no calls are parsed, all text is content */
    uint64_t id_seed;  /* call ids derive from it (a server passes a random value per request) */
} Q35ChatParseOptions;
typedef struct Q35ChatParser Q35ChatParser;
int q35_chat_parser_open(Q35ChatParser **out, const Q35Tokenizer *t, const Q35ChatParseOptions *o, Q35Err *err);
int q35_chat_parser_push(Q35ChatParser *p, const char *text, size_t len, Q35ChatEventFn fn, void *user, Q35Err *err);
/* End of generation: releases held text (an unfinished call as content) and sets *n_tool_calls (calls
 * emitted in this turn; finish_reason "tool_calls" when > 0). The parser is then spent. */
int q35_chat_parser_finish(Q35ChatParser *p, Q35ChatEventFn fn, void *user, int *n_tool_calls, Q35Err *err);
void q35_chat_parser_close(Q35ChatParser *p);

/* Guided generation (src/chat_guide.c): a byte-level automaton over the output shape a sampler can constrain
 * generation with, for tool_choice "required" / a named function, or for a response_schema (then tool_choice must
 * be auto or none: the reply is the JSON value, with no calls).
 * response_schema: [thinking: reasoning, "</think>", "\n\n"] then one JSON value the schema accepts, nothing
 * after it (src/chat_schema.h lists the keywords enforced; a schema with an assertion it cannot enforce, such as
 * "pattern" or "minimum", fails q35_guide_open with Q35_ERR_ARG naming the keyword).
 * Tool calls: [thinking: reasoning, "</think>", "\n\n"]
 * then one or more calls (FUNCTION: exactly one, of that name) in the family's form, nothing after the last.
 * Qwen3.5: "<tool_call>\n<function=NAME>\n" {"<parameter=P>\n" VALUE "\n</parameter>\n"} "</function>\n
 * </tool_call>" with NAME among the tools, P among its declared properties, each at most once, all
 * "required" ones before "</function>"; calls joined by "\n". Qwen3: "<tool_call>\n{\"name\": \"NAME\",
 * \"arguments\": " a balanced JSON object "}\n</tool_call>". */
typedef struct Q35Guide Q35Guide;
int q35_guide_open(Q35Guide **out, const Q35Tokenizer *t, const Q35ChatRequest *rq, Q35Err *err);
/* 1 if the output so far followed by x[0..n) is still a prefix of an allowed output, else 0 (no change). */
int q35_guide_allows(const Q35Guide *g, const char *x, size_t n);
/* Advances over x (Q35_ERR_ARG, state unchanged, if not allowed). */
int q35_guide_push(Q35Guide *g, const char *x, size_t n, Q35Err *err);
/* 1 when the output may end here (allow the stop token). */
int q35_guide_can_stop(const Q35Guide *g);
/* The bytes every allowed continuation starts with (e.g. "<tool_call>\n<function=get_weather>\n"), "" if
 * there is a choice: a server may append them to the prompt instead of sampling them. Valid until the next
 * call on g. */
const char *q35_guide_forced(const Q35Guide *g);
void q35_guide_close(Q35Guide *g);
/* ---- end of tokenizer extensions ---- */

const char *q35_strerror(int code);

#ifdef __cplusplus
}
#endif
#endif
