/* gpu_common.h — shared bits of the GPU tests (C11 + CUDA runtime API): the skip rule, a
 * checking macro for runtime calls, seeds, bf16-valued random data, device buffer helpers and
 * error measures. Include after test.h. */
#ifndef Q35_GPU_COMMON_H
#define Q35_GPU_COMMON_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

/* 1: a GPU is there; 0: none (print "no GPU" and exit 0); -1: the runtime failed otherwise
 * (the test must fail). "None" means cudaGetDeviceCount reports no device, or reports a missing
 * driver on a machine without /dev/nvidia0. */
static inline int gpu_present(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0) return 1;
    if (e == cudaSuccess || e == cudaErrorNoDevice) return 0;
    if (e == cudaErrorInsufficientDriver && access("/dev/nvidia0", F_OK) != 0) return 0;
    fprintf(stderr, "FAIL: cudaGetDeviceCount: %s\n", cudaGetErrorString(e));
    return -1;
}

/* Skip/fail prologue for main(): returns from main when there is no usable GPU. */
#define GPU_TEST_PROLOGUE(name)                                   \
    do {                                                          \
        int g_ = gpu_present();                                   \
        if (g_ == 0) {                                            \
            printf("%s: no GPU\n%s: 0 passed, 0 failed\n", name, name); \
            return 0;                                             \
        }                                                         \
        if (g_ < 0) {                                             \
            t_fail++;                                             \
            return TEST_SUMMARY(name);                            \
        }                                                         \
    } while (0)

/* Runtime call that must succeed, else the test binary stops (exit 2, reported by tests/run.sh). */
#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* Runtime call that must succeed: records a failure and jumps to `done`. */
#define CU(call)                                                             \
    do {                                                                     \
        cudaError_t e_ = (call);                                             \
        if (e_ != cudaSuccess) {                                             \
            CHECK(0, "%s -> %s", #call, cudaGetErrorString(e_));             \
            goto done;                                                       \
        }                                                                    \
    } while (0)
/* Launcher that must succeed (returns 0 or a cudaError_t value). */
#define LAUNCH(call)                                                                         \
    do {                                                                                     \
        int r_ = (call);                                                                     \
        if (r_ != 0) {                                                                       \
            CHECK(0, "%s -> %s", #call, cudaGetErrorString((cudaError_t)r_));                \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

/* Seed from argv[1] or the clock; printed so a failure can be replayed. */
static inline uint64_t test_seed(int argc, char **argv, const char *name) {
    uint64_t s = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    printf("%s: seed %llu (replay: %s %llu)\n", name, (unsigned long long)s, name, (unsigned long long)s);
    return s;
}

static inline float bf_normal(Rng *r, float scale) { return round_bf16(scale * rng_normal(r)); }
static inline uint16_t *bf16_random(Rng *r, int64_t n, float scale) {
    uint16_t *p = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = f32_to_bf16(scale * rng_normal(r));
    return p;
}
static inline float *f32_bf16_random(Rng *r, int64_t n, float scale, float offset) {
    float *p = (float *)malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = round_bf16(offset + scale * rng_normal(r));
    return p;
}

/* Device copy of host data (NULL on failure, reported by the caller's CU on use). */
static inline void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) return NULL;
    if (h && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return d;
}
/* Device buffer filled with NaN (0xff bytes). */
static inline void *dev_poison(size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) return NULL;
    cudaMemset(d, 0xff, bytes ? bytes : 4);
    return d;
}

/* Number of i with |got - ref| > atol + rtol |ref| (NaN counts); prints the first few. */
static inline int64_t count_bad(const char *what, const float *got, const float *ref, int64_t n, double rtol, double atol) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= atol + rtol * fabs(ref[i]))) {
            if (bad < 4) fprintf(stderr, "  %s[%lld]: got %.8g ref %.8g\n", what, (long long)i, got[i], ref[i]);
            bad++;
        }
    }
    return bad;
}

/* As count_bad, with a per-element absolute tolerance tol[i] (+ rtol |ref|). */
static inline int64_t count_bad_tol(const char *what, const float *got, const float *ref, const float *tol, int64_t n,
                                    double rtol) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= tol[i] + rtol * fabs(ref[i]))) {
            if (bad < 4) fprintf(stderr, "  %s[%lld]: got %.8g ref %.8g tol %.3g\n", what, (long long)i, got[i], ref[i],
                                 tol[i] + rtol * fabs(ref[i]));
            bad++;
        }
    }
    return bad;
}

static inline double rel_l2(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

#endif
