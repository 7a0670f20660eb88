/* util.h — error helpers, bf16/f16 <-> f32, timers, the probe() hook.
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
static inline void err_clear(Err *err) { if (err) { err->code = 0; err->msg[0] = 0; } }

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

double now_s(void); /* monotonic seconds */

/* Reads a whole file into a NUL-terminated malloc'ed buffer. */
int read_file(const char *path, char **data, size_t *len, Err *err);
/* Joins dir and name into out (size n). Returns 0 or Q35_ERR_ARG if it does not fit. */
int path_join(char *out, size_t n, const char *dir, const char *name);
int file_exists(const char *path);

/* Deterministic RNG (splitmix64 seeding + xoshiro256**) for dummy weights and sampling. */
typedef struct Rng { uint64_t s[4]; } Rng;
void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
float rng_uniform(Rng *r); /* [0,1) */
float rng_normal(Rng *r);

/* Activation dumps: when a probe dir is set, probe() writes <dir>/<name>.f32 (raw float32). */
typedef struct Probe { const char *dir; } Probe;
void probe(const Probe *p, const char *name, const float *x, size_t n);

#endif
