/* forward.h — the CPU backend's context (internal to src/cpu): fp32 copies of the small
 * weight vectors, the single sequence's state (KV cache, conv rows, DeltaNet state) and the
 * activation buffers, all sized once in open() for max_seq tokens and CPU_TB tokens per
 * pass; for serving (serve_open) a paged KV pool per full-attention layer and state slots per
 * DeltaNet layer. backend.c allocates it; forward.c runs the layers over it, for the single
 * sequence or for one slot, through a CpuSeq that says where that sequence's state lives. */
#ifndef Q35_CPU_FORWARD_H
#define Q35_CPU_FORWARD_H

#include "backend.h"

/* Tokens per pass through the layer stack. A longer call runs in passes of CPU_TB tokens,
 * which is exact (every op is causal and the state carries over) and keeps activations
 * small. A multiple of the DeltaNet chunk (64), so chunk boundaries match one long call. */
#define CPU_TB 256

typedef struct CpuLayer {
    float *ln1, *ln2; /* (D) input / post-attention norm weights */
    /* full attention */
    float *q_norm, *k_norm; /* (hd) */
    float *Kc, *Vc;         /* (Hkv, max_seq, hd) cache: K after k_norm + RoPE, V as projected */
    /* DeltaNet */
    float *conv_w;          /* (conv_dim, K) */
    float *dt_bias, *A_log; /* (Hv) */
    float *lin_norm;        /* (dv) gated-norm weight, plain */
    float *conv_state;      /* (K-1, conv_dim) last pre-conv rows, oldest first */
    float *S;               /* (Hv, dk, dv) recurrent state */
    /* serving (NULL until serve_open) */
    float *Kp, *Vp;    /* (n_blocks, Hkv, block, hd) KV pool of a full-attention layer */
    float *conv_slots; /* (n_slots, K-1, conv_dim) conv windows of a DeltaNet layer */
    float *S_slots;    /* (n_slots, Hv, dk, dv) recurrent states of a DeltaNet layer */
    float *conv_snaps; /* (n_snaps, K-1, conv_dim) prefix-cache snapshots of conv_slots rows */
    float *S_snaps;    /* (n_snaps, Hv, dk, dv) prefix-cache snapshots of S_slots rows */
} CpuLayer;

/* Where one sequence's state lives: the single sequence (KV [Hkv][max_seq][hd] = one block of max_seq rows) or a
 * serving slot (a block table into the layer pools). Per layer l, K[l] / V[l] are set for full-attention layers,
 * conv[l] / S[l] for DeltaNet layers. */
typedef struct CpuSeq {
    int block;         /* tokens per KV block */
    const int *blocks; /* block table: position p is row p % block of block blocks[p / block] */
    float **K, **V;    /* [L] KV pools (n_blocks, Hkv, block, hd) */
    float **conv, **S; /* [L] (K-1, conv_dim) and (Hv, dk, dv) */
    int state_bf16;    /* 1 (serve slots, ServeLayout.state_bf16): S is rounded to bf16 wherever a step stores it (after
                        * each token of the recurrence, at the end of a chunked run), as a bf16 store would; it stays
                        * in fp32 memory */
    int kv_fp8;        /* 1 (serve slots, ServeLayout.kv_fp8): K and V are rounded to e4m3 (f32_to_fp8_e4m3: nearest
                        * even, saturated at +-448) where they are appended to the pools, as an fp8 store would */
} CpuSeq;

typedef struct CpuCtx {
    const Model *m; /* the model, or deq */
    Model *deq;     /* FP8 checkpoints: the model with its F8_E4M3 matrices dequantized to fp32 */
    const Config *c;
    int max_seq, threads, n_past;
    Probe probe;
    CpuLayer *layers;             /* (L) */
    CpuSeq solo, slot;            /* the single sequence; a serving slot (pointers set per item) */
    float **seq_ptrs;             /* (8, L): the pointer arrays of solo and slot */
    int solo_block;               /* 0: solo's block table {0} */
    int n_slots, n_blocks, block; /* serving layout (0 until serve_open) */
    int n_snaps;                  /* prefix-cache snapshots (serve_open): both tiers, in host memory alike */
    int exact;                    /* deterministic mode: every token's bits independent of how its sequence was
                                   * split into calls (DeltaNet recurrence for all tokens, linear as matmul rows
                                   * for T = 1 too), so a prefix-cache resume at any position equals a cold run */
    float *final_norm;            /* (D) */
    float *inv_freq;              /* (R/2) */
    /* activations, CPU_TB rows each; Wd = max(key_dim, value_dim, attn_dim, kv_dim) */
    float *x, *h, *out;      /* (TB, D) residual stream, normed block input, block output */
    float *proj;             /* (TB, max(conv_dim, q_proj_rows)) DeltaNet m / attention qg */
    float *conv;             /* (TB, conv_dim) conv + SiLU output */
    float *q, *k, *v;        /* (TB, Wd) DeltaNet q, k (per k-head), v; attention q, k, v */
    float *gate, *o;         /* (TB, Wd) DeltaNet z / attention gate; core output */
    float *b, *a, *beta, *g; /* (TB, Hv) DeltaNet gate inputs and gates */
    float *mlp_g, *mlp_u;    /* (TB, F) */
    float *dn_scratch;       /* cpu_deltanet_chunked_scratch(Hv, dk, dv) floats */
} CpuCtx;

int cpu_ctx_open(CpuCtx *ctx, const Model *m, const BackendOptions *o, Err *err);
void cpu_ctx_close(CpuCtx *ctx);
void cpu_ctx_reset(CpuCtx *ctx);
/* Runs n tokens at positions pos..pos+n-1 (pos must equal the tokens already seen). */
int cpu_forward(CpuCtx *ctx, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err);
/* Serving: pools for layout l (replacing any), their release, and the batched step (Backend.step_batch). */
int cpu_serve_open(CpuCtx *ctx, const ServeLayout *l, Err *err);
void cpu_serve_close(CpuCtx *ctx);
int cpu_step_batch(CpuCtx *ctx, const BatchItem *items, int n, float *logits, Err *err);
/* Prefix cache: slot state <-> snapshot (save: slot -> snap; load: snap -> slot), snapshot src -> snapshot dst, KV
 * block copy src -> dst. */
int cpu_snap_copy(CpuCtx *ctx, int slot, int snap, int save, Err *err);
int cpu_snap_to_snap(CpuCtx *ctx, int src, int dst, Err *err);
int cpu_block_copy(CpuCtx *ctx, int src, int dst, Err *err);

#endif
