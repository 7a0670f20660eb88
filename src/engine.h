/* engine.h — the engine's struct, shared by the core files that implement include/qwen35.h
 * (engine.c: one sequence; serve.c: many sequences in slots with a paged KV cache). Internal:
 * only the core .c files in src/ include it. */
#ifndef Q35_ENGINE_H
#define Q35_ENGINE_H

#include "backend.h"

typedef struct Serve Serve; /* serve.c: slots, block pool, per-sequence samplers and histories */

struct Q35Engine {
    Model model;
    const Backend *be;
    void *bctx;
    Q35Tokenizer *tok;
    int max_seq;
    int pos;        /* tokens already in the single sequence (q35_forward / q35_generate) */
    int n_valid;    /* real token ids: tokenizer size when known, else vocab_size */
    float *logits;  /* [vocab] scratch for generation */
    char note[320]; /* why the engine did not use the requested/auto-picked backend, or "" */
    Serve *serve;   /* non-NULL between q35_serve_open and q35_serve_close */
};

#endif
