/* test_tensors.h — host tensors of random bf16-valued data for the GPU tests that build small models in memory
 * (test_decode, test_serve_cuda); the tests free them all at once with tt_free_all. Include after test.h and
 * gpu_common.h. */
#ifndef Q35_TEST_TENSORS_H
#define Q35_TEST_TENSORS_H

#define TT_MAX_OWN 256
static void *tt_own[TT_MAX_OWN];
static int tt_n_own;

static inline void *tt_keep(void *p) {
    if (tt_n_own < TT_MAX_OWN) tt_own[tt_n_own++] = p;
    return p;
}

static inline void tt_free_all(void) {
    for (int i = 0; i < tt_n_own; i++) free(tt_own[i]);
    tt_n_own = 0;
}

/* rows x cols tensor of bf16 values offset + scale N(0,1), stored as dt (exact in every dtype). */
static inline Tensor tt_tensor(Rng *rng, int64_t rows, int64_t cols, DType dt, float offset, float scale) {
    Tensor t;
    memset(&t, 0, sizeof t);
    const int64_t n = rows * cols;
    void *data = tt_keep(malloc((size_t)n * (dt == DT_F32 ? 4 : 2)));
    for (int64_t i = 0; i < n; i++) {
        float v = round_bf16(offset + scale * rng_normal(rng));
        if (dt == DT_F32)
            ((float *)data)[i] = v;
        else if (dt == DT_F16)
            ((uint16_t *)data)[i] = f32_to_f16(v);
        else
            ((uint16_t *)data)[i] = f32_to_bf16(v);
    }
    t.name = "test";
    t.dtype = dt;
    t.ndim = cols > 1 ? 2 : 1;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.numel = n;
    t.data = data;
    t.nbytes = (size_t)n * (dt == DT_F32 ? 4 : 2);
    return t;
}

#endif
