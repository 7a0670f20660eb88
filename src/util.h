/* util.h — error helpers, bf16/f16/fp8 <-> f32, timers, the probe() hook.
 * Err is the library-wide error record (same layout as the public Q35Err). */
#ifndef Q35_UTIL_H
#define Q35_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../include/qwen35.h"

typedef Q35Err Err;

/* Sets err (if non-NULL) and returns code. printf-style message, truncated to fit. */
int err_set(Err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void err_clear(Err *err) {
    if (err) {
        err->code = 0;
        err->msg[0] = 0;
    }
}

/* bf16 = upper 16 bits of an f32; conversion rounds to nearest even (NaN kept quiet). */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/* FP8 e4m3fn (OCP, torch.float8_e4m3fn): sign | 4 exponent bits (bias 7) | 3 mantissa bits; no
 * infinities, S.1111.111 is NaN, max 448 (0x7e), min normal 2^-6, subnormals m * 2^-9. */
#define FP8_E4M3_MAX 448.0f
float fp8_e4m3_to_f32(uint8_t v);
/* Rounds to nearest even; finite |f| >= 448 saturates to +-448 (callers scale into range first,
 * as HF clamps before its cast); NaN -> 0x7f with the sign. */
uint8_t f32_to_fp8_e4m3(float f);
/* Block FP8 (HF fine-grained FP8, DeepSeek / Qwen FP8 checkpoints), blocks of FP8_BLOCK x FP8_BLOCK:
 * w (rows, cols) fp32 -> q (rows, cols) e4m3 and scale_inv (ceil(rows/128), ceil(cols/128)) fp32, row-major;
 * per block scale_inv = amax / 448 (1 for an all-zero block), q = e4m3(w / scale_inv). */
#define FP8_BLOCK 128
void fp8_quantize_blocks(uint8_t *q, float *scale_inv, const float *w, int64_t rows, int64_t cols);
/* w[r][c] = float(q[r][c]) * scale_inv[r/128][c/128]: one fp32 multiply, the same in every backend. */
void fp8_dequantize_blocks(float *w, const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols);
/* The CUDA backend's per-row scale layout (src/cuda/ops.h FP8_SCALES_DOC) from a checkpoint's block scales: row r
 * of the (rows, cols) matrix lands at device row row0 + r * row_step (stacked or interleaved matrices), and
 * dst[(c / 128) * ld + row0 + r * row_step] = scale_inv[r / 128][c / 128] for every 128-column block c / 128. */
void fp8_scales_per_row(float *dst, int64_t ld, int64_t row0, int64_t row_step, const float *scale_inv, int64_t rows,
                        int64_t cols);

double now_s(void); /* monotonic seconds */

/* Reads a whole file into a NUL-terminated malloc'ed buffer. */
int read_file(const char *path, char **data, size_t *len, Err *err);
/* Joins dir and name into out (size n). Returns 0 or Q35_ERR_ARG if it does not fit. */
int path_join(char *out, size_t n, const char *dir, const char *name);
int file_exists(const char *path);

/* Deterministic RNG (splitmix64 seeding + xoshiro256**) for dummy weights and sampling. */
typedef struct Rng {
    uint64_t s[4];
} Rng;
void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
float rng_uniform(Rng *r); /* [0,1) */
float rng_normal(Rng *r);
/* Counter-based uniform in [0, 1) with 24 random bits: (mix(mix(seed) ^ step) >> 40) / 2^24, mix = one splitmix64
 * step. The same function as q35_uniform in src/cuda/sample.cu: a draw depends on (seed, step) alone. */
float counter_uniform(uint64_t seed, uint64_t step);

/* Activation dumps: when a probe dir is set, probe() writes <dir>/<name>.f32 (raw float32). */
typedef struct Probe {
    const char *dir;
} Probe;
void probe(const Probe *p, const char *name, const float *x, size_t n);

#endif
