/* stub.c — linked only when CUDA=0: the CUDA backend table whose open() fails clearly. */
#include <stdio.h>

#include "backend.h"

static int stub_open(void **ctx, const Model *m, const BackendOptions *o, Err *err) {
    (void)ctx, (void)m, (void)o;
    return err_set(err, Q35_ERR_UNSUPPORTED, "CUDA backend unavailable: this build has CUDA=0");
}

const Backend cuda_backend = {.name = "cuda", .open = stub_open};

int cuda_available(void) { return 0; }
int cuda_describe(void *ctx, char *buf, size_t n) {
    (void)ctx;
    return snprintf(buf, n, "no CUDA in this build\n");
}
