/* forward.h — the CPU backend's context (internal to src/cpu): fp32 copies of the small
 * weight vectors, the per-sequence state (KV cache, conv rows, DeltaNet state) and the
 * activation buffers, all sized once in open() for max_seq tokens and CPU_TB tokens per
 * pass. backend.c allocates it; forward.c runs the layers over it. */
#ifndef Q35_CPU_FORWARD_H
#define Q35_CPU_FORWARD_H

#include "backend.h"

/* Tokens per pass through the layer stack. A longer call runs in passes of CPU_TB tokens,
 * which is exact (every op is causal and the state carries over) and keeps activations
 * small. A multiple of the DeltaNet chunk (64), so chunk boundaries match one long call. */
#define CPU_TB 256

typedef struct CpuLayer {
    float *ln1, *ln2;            /* (D) input / post-attention norm weights */
    /* full attention */
    float *q_norm, *k_norm;      /* (hd) */
    float *Kc, *Vc;              /* (Hkv, max_seq, hd) cache: K after k_norm + RoPE, V as projected */
    /* DeltaNet */
    float *conv_w;               /* (conv_dim, K) */
    float *dt_bias, *A_log;      /* (Hv) */
    float *lin_norm;             /* (dv) gated-norm weight, plain */
    float *conv_state;           /* (K-1, conv_dim) last pre-conv rows, oldest first */
    float *S;                    /* (Hv, dk, dv) recurrent state */
} CpuLayer;

typedef struct CpuCtx {
    const Model *m;
    const Config *c;
    int max_seq, threads, n_past;
    Probe probe;
    CpuLayer *layers;            /* (L) */
    float *final_norm;           /* (D) */
    float *inv_freq;             /* (R/2) */
    /* activations, CPU_TB rows each; Wd = max(key_dim, value_dim, attn_dim, kv_dim) */
    float *x, *h, *out;          /* (TB, D) residual stream, normed block input, block output */
    float *proj;                 /* (TB, max(conv_dim, q_proj_rows)) DeltaNet m / attention qg */
    float *conv;                 /* (TB, conv_dim) conv + SiLU output */
    float *q, *k, *v;            /* (TB, Wd) DeltaNet q, k (per k-head), v; attention q, k, v */
    float *gate, *o;             /* (TB, Wd) DeltaNet z / attention gate; core output */
    float *b, *a, *beta, *g;     /* (TB, Hv) DeltaNet gate inputs and gates */
    float *mlp_g, *mlp_u;        /* (TB, F) */
    float *dn_scratch;           /* cpu_deltanet_chunked_scratch(Hv, dk, dv) floats */
} CpuCtx;

int cpu_ctx_open(CpuCtx *ctx, const Model *m, const BackendOptions *o, Err *err);
void cpu_ctx_close(CpuCtx *ctx);
void cpu_ctx_reset(CpuCtx *ctx);
/* Runs n tokens at positions pos..pos+n-1 (pos must equal the tokens already seen). */
int cpu_forward(CpuCtx *ctx, const int *tokens, int n, int pos, int all_logits, float *logits, Err *err);

#endif
