/* stub.c — linked only when CUDA=0: the CUDA backend table whose open() fails clearly. */
#include "backend.h"

static int stub_open(void **ctx, const Model *m, const BackendOptions *o, Err *err) {
    (void)ctx, (void)m, (void)o;
    return err_set(err, Q35_ERR_UNSUPPORTED, "CUDA backend unavailable: this build has CUDA=0");
}

const Backend cuda_backend = {"cuda", stub_open, NULL, NULL, NULL, NULL, NULL};

int cuda_available(void) { return 0; }
