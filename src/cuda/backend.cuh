/* backend.cuh — the CUDA backend's context, shared by backend.cu (open/close, upload, graphs,
 * bench) and decode.cu (the decode step's launches). Internal to src/cuda.
 *
 * Device layout (all in one cudaMalloc arena, sized for max_seq in open()):
 *   weights bf16: per layer w_in = DeltaNet [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]
 *                 (conv_dim + value_dim + 2 Hv, D) or attention [q_proj; k_proj; v_proj]
 *                 (q_proj_rows + 2 kv_dim, D); w_out = out_proj / o_proj (D, value_dim | attn_dim);
 *                 w_gu = [gate_0; up_0; gate_1; up_1; ...] (2F, D) interleaved for the SwiGLU
 *                 epilogue; w_down (D, F); embed (V, D); lm_head (V, D) (= embed when tied).
 *   small vectors fp32 (bf16-valued unless loaded F32): norms, conv taps, A_log, dt_bias.
 *   with mlp_fused only: w_dT (F, D) per layer, W_down transposed, after the layers' weights.
 *   FP8 models (docs/FP8.md): each of w_in / w_out / w_gu / w_down whose source matrices are F8_E4M3 is held as
 *                 w8_* e4m3 bytes in the same row order plus s_* per-row scales (ops.h FP8_SCALES_DOC) instead of
 *                 the bf16 matrix (then NULL); an FP8 DeltaNet in_proj whose in_proj_b / in_proj_a stay bf16 (as in
 *                 Qwen's checkpoints) keeps those 2 Hv rows as w_ba (bf16), after its in8_rows FP8 rows.
 *   state: DeltaNet S fp32 (Hv, dk, dv) + conv ring bf16 (K, conv_dim) per linear layer; KV
 *          cache bf16 K, V (Hkv, max_seq, hd) per full layer.
 *   activations: residual ping-pong x[2] (D), split-K partials pa/pb (max_splits, D), proj
 *          (GEMV outputs feeding the mixer), mix (mixer output), mlp (F), logits (V). */
#ifndef Q35_CUDA_BACKEND_CUH
#define Q35_CUDA_BACKEND_CUH

#include "cuda/common.cuh"

extern "C" {
#include "backend.h"
}
#include "cuda/serve_ops.h"

#define CUDA_MAX_OPS 512 /* launches per step recorded for the bench */
typedef struct CudaLayer {
    int type;              /* LAYER_LINEAR_ATTN / LAYER_FULL_ATTN */
    float *ln1, *ln2;      /* (D) */
    uint16_t *w_in;        /* stacked input projections (see above) */
    uint16_t *w_out;       /* (D, value_dim | attn_dim) */
    uint16_t *w_gu;        /* (2F, D) interleaved gate/up */
    uint16_t *w_down;      /* (D, F) */
    uint16_t *w_dT;        /* (F, D) W_down transposed, for the fused MLP (mlp_fused only, else NULL) */
    uint8_t *w8_dT;        /* the same for an FP8 W_down: e4m3 (F, D); its scales are s_down's (ops.h MlpFusedParams) */
    int in_rows, out_cols; /* rows of w_in, cols of w_out */
    /* FP8 (see above): NULL where the matrix is bf16 */
    uint8_t *w8_in, *w8_out, *w8_gu, *w8_down;
    float *s_in, *s_out, *s_gu, *s_down;
    uint16_t *w_ba; /* (2 Hv, D) bf16 in_proj_b; in_proj_a when w8_in holds only in8_rows = in_rows - 2 Hv rows */
    int in8_rows;
    int splits_out, splits_down; /* split-K of the decode GEMVs on w_out / w_down (by format: bytes per row) */
    /* DeltaNet */
    float *conv_w;          /* (conv_dim, K) */
    float *A_log, *dt_bias; /* (Hv) */
    float *lin_norm;        /* (dv) */
    float *S;               /* (Hv, dk, dv) */
    uint16_t *conv_ring;    /* (K, conv_dim) bf16 */
    /* attention */
    float *q_norm, *k_norm; /* (hd) */
    uint16_t *Kc, *Vc;      /* (Hkv, max_seq, hd) bf16 */
} CudaLayer;

/* One recorded launch of the step (bench --ops): name, bytes moved, events around it. */
typedef struct CudaOp {
    char name[40];
    double bytes;
} CudaOp;

typedef struct CudaCtx {
    const Model *m;
    const Config *c;
    int max_seq, n_past, n_sm, n_valid;
    int deterministic, no_graph, pdl;
    int kv_e4m3; /* the context's K/V caches hold e4m3 values (AttnDecodeParams.kv_e4m3): serving over fp8 KV pools,
                  * whose lone sequence runs on the context's own step (serve.cu's solo step) */
    /* the decode schedule (backend.cu cuda_schedule_choose: from the model's shapes and the device) */
    int mlp_fused; /* the MLP as one kernel (mlp.cu) in atomic mode; w_dT uploaded */
    int dn_gn;     /* the DeltaNet step without its cluster and gated norm; out_proj computes the norm
                               * (MV_IN_GATED) */
    int dn_fused;  /* the DeltaNet layer's in_proj, step and out_proj as one kernel (deltanet_layer.cu; needs the
                               * fused MLP); 2: its heads exchange through clusters, 1: through global memory
                               * (dn_xbuf, dn_xcnt: one tagged exchange per layer) */
    float *dn_xbuf;
    unsigned *dn_xcnt;
    int attn_short;  /* steps with kv_len <= attn_short (and atomic split-K, the fused MLP, no probes) run
                               * attention + o_proj as one kernel (cuda_attn_short; cuda_attn_short_cap) */
    size_t l2_state; /* bytes of one DeltaNet layer's S kept in L2 across steps (its dn_layer launches carry a
                               * persisting access policy window), for the first l2_state_layers DeltaNet layers;
                               * 0: no set-aside on the device */
    int l2_state_layers;
    size_t l2_persist;            /* the persisting set-aside made at open (cudaLimitPersistingL2CacheSize) */
    int lm_dyn;                   /* the LM head's last rounds of row groups by tickets (MatvecParams.work_tail) */
    int lm_screen;                /* greedy steps that write no logits take the LM head's argmax through the quantized
                               * screen (lm_screen.cu): 1 its ring kernel, 2 its register kernel (other shapes);
                               * 0: the full bf16 head (bench compares with it) */
    int8_t *lm_q;                 /* (V, D) the screen's int8 head (its register kernel), NULL when off or unused */
    uint8_t *lm_p;                /* (V, 3 D / 4) its 6-bit rows (its ring kernel), NULL likewise */
    float *lm_meta;               /* (V, 4) its scales and bound coefficients */
    unsigned *lm_stats;           /* (3) its counters (LmScreenParams.stats) */
    unsigned long long *lm_key;   /* its result key: &step_dev->lm_key (LmScreenParams.key; zeroed by step_load_k) */
    unsigned long long *key_host; /* pinned: *lm_key read back */
    Probe probe;
    cudaStream_t stream;
    void *arena; /* the one device allocation */
    size_t arena_bytes;
    CudaLayer *layers; /* (L), host array of device pointers */
    uint16_t *embed, *lm_head;
    float *final_norm; /* (D) */
    float *inv_freq;   /* (R/2) RoPE inverse frequencies */
    float *attn_work;  /* cuda_attn_decode_work_bytes(), shared by the attention layers */
    int attn_splits;   /* cuda_attn_decode_splits(Hkv, max_seq) */
    /* activations */
    float *x[2];    /* (D) residual stream ping-pong */
    float *pa, *pb; /* (max_splits, D): mixer-out and down-proj partials (atomic: [0] only) */
    float *proj;    /* (max(in_rows)) */
    float *mix;     /* (max(value_dim, attn_dim)) */
    float *mlp;     /* (F) */
    float *logits;  /* (V) */
    float *am_val;  /* (lm_blocks) */
    int *am_idx;
    unsigned *am_count;
    unsigned *lm_work; /* (CUDA_MV_WORK_WORDS) the LM head's ticket counters (MatvecParams.work) */
    int *out_id;
    float *out_max;
    void *sample_scratch;
    int lm_blocks, max_splits;
    int fp8;         /* some layer matrix is FP8: the fused decode kernels (bf16 only) are off */
    uint16_t *w_tmp; /* FP8: bf16 scratch for one layer matrix (cuda_layer_w_bf16), else NULL */
    size_t w_tmp_elems;
    StepParams *step_dev; /* device StepParams */
    /* pinned host */
    StepParams *step_host;
    int *id_host;
    const StepParams *step_host_dev; /* step_host's device address (mapped; step_load_k reads it) */
    float *logits_host;              /* (V) */
    float *probe_buf;                /* host scratch for probes (probe mode only) */
    float *probe_dev;                /* device scratch: DeltaNet o / final norm for probes */
    size_t kv_off;                   /* arena offset of the KV caches (zeroed at open; state_off follows them) */
    size_t state_off, state_bytes;   /* arena range of S, conv rings and scratch counters (zeroed by reset) */
    size_t scratch_off;              /* [state_off, scratch_off): S and the conv rings; the scratch after them */
    int state_dirty; /* CUDA_DIRTY_*: what a reset left to be zeroed (cuda_state_clean) before anything reads it; a
                      * prefill from position 0 zeroes the scratch and needs no zero S and conv rings (it writes both) */
    /* a sampling step's logit changes (decode_sample with DeviceSampling.n_pen > 0; penalty.cu), allocated at the
     * first such step: the entries [pen_cap = vocab_size] (each id at most once) and the row, device and pinned host,
     * penalty_apply's raw logits [pen_cap] and its log-softmax slot */
    SamplePenalty *pen, *pen_host;
    PenaltyRow *pen_row, *pen_row_host;
    float *pen_raw, *pen_lp;
    int pen_cap;
    /* graphs: captured lazily with the current pdl/deterministic */
    cudaGraphExec_t graph[12]; /* [cuda_graph_index()]: sample (0 greedy, 1 sampling, 2 with logit changes) + 3 short
                                * + 6 screen when captured */
    int graph_kernels[12];     /* kernel nodes in each graph */
    /* bench / op recording (eager only) */
    const char *ablate; /* bench --ablate: launch kinds left out of the step (decode.cu), else NULL */
    int rec_ops, n_ops;
    CudaOp ops[CUDA_MAX_OPS];
    cudaEvent_t ev[CUDA_MAX_OPS + 1];
    int ev_ready;
    struct CudaPrefill *pf;         /* prefill buffers (prefill.cu); NULL: forward(n > 1) runs n decode steps */
    struct CudaServe *sv;           /* the batched step's pools and buffers (serve.cu); NULL until serve_open */
    const struct DnSnaps *pf_snaps; /* snapshots the next prefill takes inside it (serve.cu's lone prompt steps), or
                                     * NULL */
} CudaCtx;

/* Prefix-cache snapshots taken inside a prefill (BatchItem.snap_off): the state after the sequence's first at[i]
 * tokens, each DeltaNet layer's S to base[i] + q lstride and its conv ring ring_off bytes further, q the layer's
 * DeltaNet ordinal (serve.cu's snapshot layout). */
typedef struct DnSnaps {
    int n;
    int at[DN_MAX_PTS];
    char *base[DN_MAX_PTS];
    size_t lstride, ring_off;
    int state_bf16; /* the snapshots' states S are bf16 (a serve layout's ServeLayout.state_bf16) */
} DnSnaps;
/* dp's points (DeltaNetPrefillParams.n_pts ..): those of ps at [dp->pos, dp->pos + dp->T), for DeltaNet ordinal q. */
void cuda_dn_snap_points(DeltaNetPrefillParams *dp, const DnSnaps *ps, int q);

/* The projections of a layer (CudaLayer's w_in, w_out, w_gu, w_down). */
enum { CW_IN = 0, CW_OUT = 1, CW_GU = 2, CW_DOWN = 3 };
/* backend.cu: layer ly's projection `which` as a GEMM weight: g->w (bf16; ldw = its cols) or g->w8 + g->w8_scale
 * (FP8; the FP8 DeltaNet in_proj: its first in8_rows rows, w_ba the rest). Sets w, w8, w8_scale, ldw only. */
void cuda_layer_gemm_w(const CudaLayer *ly, int which, int cols, GemmParams *g);
/* The FP8 DeltaNet in_proj keeps its b / a rows bf16 (w_ba, after its in8_rows FP8 rows): for g as set by
 * cuda_layer_gemm_w (bf16 output y), narrows g to the FP8 rows and sets *t to the GEMM of the w_ba rows into the
 * columns after them. Returns that tail's row count; 0 (g unchanged, *t untouched) for every other weight. */
int cuda_layer_gemm_tail(const CudaLayer *ly, int which, GemmParams *g, GemmParams *t);
/* The same projection as one bf16 matrix on the device: the bf16 weight itself, or the FP8 one dequantized
 * (cuda_fp8_to_bf16, w_ba copied after it) into dst (w_tmp_elems elements; NULL: ctx->w_tmp) on l's stream (valid
 * until the next call). *w = the matrix; elems (may be NULL): its rows x cols. */
int cuda_layer_w_bf16(CudaCtx *ctx, const CudaLayer *ly, int which, const CudaLaunch *l, uint16_t *dst,
                      const uint16_t **w, size_t *elems);

/* Enqueues one decode step on ctx->stream: the StepParams copy from step_host, then every kernel (sample = 1 adds the
 * sampling kernels, 2 also the logit changes of ctx->pen_row before them). With probes set it runs eagerly, syncing to
 * dump activations. Returns 0 or a Q35_ERR_* with err set. */
int cuda_step_enqueue(CudaCtx *ctx, int sample, Err *err);

/* backend.cu: capture ctx->graph[cuda_graph_index()] (records its graph_kernels); drop the graphs (after a mode
 * change); run one step with step_host already filled (graph replay, captured on first use, or eager when no_graph /
 * probing). */
int cuda_graph_capture(CudaCtx *ctx, int sample, Err *err);
/* The graph a step with the current step_host and modes replays: sample + 3 cuda_step_short() + 6 cuda_step_screen(). */
int cuda_graph_index(const CudaCtx *ctx, int sample);
/* decode.cu: 1 when this step (step_host->pos) takes the short attention kernel */
int cuda_step_short(const CudaCtx *ctx);
/* decode.cu: the LM head screen's parameters for head (MV_OUT_ARGMAX): the context's quantized head, key and running
 * max (the decode step's screen and the prefill's greedy last row) */
LmScreenParams cuda_lm_screen_params(const CudaCtx *ctx, const MatvecParams *head);
/* decode.cu: 1 when this step's LM head is the quantized screen (lm_screen, greedy, no logits written, no probes) */
int cuda_step_screen(const CudaCtx *ctx, int sample);
void cuda_graphs_drop(CudaCtx *ctx);
int cuda_run_step(CudaCtx *ctx, int sample, Err *err);
/* The parts of the sequence state range (CUDA_DIRTY_STATE: S and the conv rings; CUDA_DIRTY_SCRATCH: the decode
 * step's split-K partials, counters and sampling scratch) zeroed, stream-ordered (capturable); ctx->state_dirty as
 * it was */
enum { CUDA_DIRTY_STATE = 1, CUDA_DIRTY_SCRATCH = 2 };
int cuda_state_zero(CudaCtx *ctx, int parts, Err *err);
/* cuda_state_zero of what a reset left (ctx->state_dirty), which is then 0; 0 or an error */
int cuda_state_clean(CudaCtx *ctx, Err *err);

/* decode.cu: the kinds bench --ablate accepts; 1 when every kind of list is one (else the first unknown in bad) */
extern const char cuda_ablate_kinds[];
int cuda_ablate_check(const char *list, char *bad, size_t n);
/* 1 when the comma-separated list holds kind */
int cuda_ablate_listed(const char *list, const char *kind);

/* bench.cu: the Backend.bench hook's body (the caller drops graphs and resets afterwards). */
int cuda_bench_run(CudaCtx *ctx, const BenchRequest *rq, BenchResult *res, Err *err);

/* ---- prefill (prefill.cu) ----
 * open: after the weights and the stream exist; allocates the buffers for pieces of
 * min(piece > 0 ? piece : 2048, max_seq) tokens when the prefill kernels support the model's
 * shapes (else leaves ctx->pf NULL and returns 0). forward: tokens at
 * pos .. pos+n-1 (pos == n_past), in pieces of at most the piece size; logits NULL, [V] (last row)
 * or [n][V] (all_logits); n_past += n. bench: prefill timings when rq->n_prefill > 0. */
int cuda_prefill_open(CudaCtx *ctx, int piece, Err *err);
void cuda_prefill_dims(const CudaCtx *ctx, PrefillDims *d); /* the model's prefill shapes (also the batched step's) */
void cuda_prefill_close(CudaCtx *ctx);
/* drops the prompt graphs (captured again at their next use: after ctx->kv_e4m3 changed) */
void cuda_prefill_graphs_drop(CudaCtx *ctx);
int cuda_prefill_forward(CudaCtx *ctx, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err);
/* The same without logits on the host: the last token's fp32 logits [V] stay on the device at *dev_row (valid until
 * the next prefill). */
int cuda_prefill_forward_dev(CudaCtx *ctx, const int *tokens, int n, int pos, const float **dev_row, Err *err);
/* the prefill's last row as its greedy id through the LM head screen (ctx->lm_screen), no logits */
int cuda_prefill_forward_greedy(CudaCtx *ctx, const int *tokens, int n, int pos, int *id, Err *err);
int cuda_prefill_bench(CudaCtx *ctx, const BenchRequest *rq, BenchResult *res, Err *err);

/* ---- many sequences (serve.cu): the Backend's serve_sizes / serve_open / serve_close / step_batch and the prefix
 * cache's snap_save / snap_load / block_copy / snap_copy ---- */
extern "C" int cuda_serve_sizes(void *ctx, int block, int state_bf16, int kv_fp8, ServeSizes *s, Err *err);
extern "C" int cuda_serve_open(void *ctx, const ServeLayout *l, Err *err);
extern "C" void cuda_serve_close(void *ctx);
extern "C" int cuda_step_batch(void *ctx, const BatchItem *items, int n, float *logits, Err *err);
extern "C" void cuda_seq_end(void *ctx, int slot);
extern "C" int cuda_snap_save(void *ctx, int slot, int snap, Err *err);
extern "C" int cuda_snap_load(void *ctx, int snap, int slot, Err *err);
extern "C" int cuda_block_copy(void *ctx, int src, int dst, Err *err);
extern "C" int cuda_snap_copy(void *ctx, int src, int dst, Err *err);

#endif
