/* util.c — error helpers, f16 conversion, timers, file helpers, RNG, probe(). */
#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

int err_set(Err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        /* one line, whatever the input quoted in it holds: control bytes (newlines, escapes) become blanks */
        for (char *p = err->msg; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
        err->code = code;
    }
    return code;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1), r = man >> shift;
        if (rest > half || (rest == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (uint32_t)exp << 10 | man >> 13, rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

float fp8_e4m3_to_f32(uint8_t v) {
    const int e = (v >> 3) & 15, m = v & 7;
    float f;
    if (e == 15 && m == 7)
        f = NAN;
    else if (e == 0)
        f = ldexpf((float)m, -9); /* subnormal: m/8 * 2^-6 */
    else
        f = ldexpf((float)(8 + m), e - 10); /* (1 + m/8) * 2^(e-7) */
    return (v & 0x80) ? -f : f;
}

uint8_t f32_to_fp8_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7f;  /* NaN */
    if (a >= 0x43e00000u) return sign | 0x7e; /* >= 448 (incl. inf): saturate */
    const int e = (int)(a >> 23) - 127 + 7;   /* fp8 biased exponent */
    const uint32_t man = (a & 0x7fffffu) | 0x800000u;
    if (e < -10) return sign; /* below half the smallest subnormal */
    /* normal: keep the top 3 mantissa bits; subnormal: value / 2^-9 = man >> (21 - e) */
    const uint32_t shift = e >= 1 ? 20u : (uint32_t)(21 - e);
    const uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
    uint32_t r = e >= 1 ? ((uint32_t)e << 3 | ((man >> 20) & 7)) : man >> shift;
    if (rest > half || (rest == half && (r & 1))) r++; /* a carry into the exponent is the right result */
    return sign | (uint8_t)r;
}

void fp8_quantize_blocks(uint8_t *q, float *scale_inv, const float *w, int64_t rows, int64_t cols) {
    const int64_t nbc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    for (int64_t r0 = 0; r0 < rows; r0 += FP8_BLOCK)
        for (int64_t c0 = 0; c0 < cols; c0 += FP8_BLOCK) {
            const int64_t r1 = r0 + FP8_BLOCK < rows ? r0 + FP8_BLOCK : rows;
            const int64_t c1 = c0 + FP8_BLOCK < cols ? c0 + FP8_BLOCK : cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) {
                    const float a = fabsf(w[r * cols + c]);
                    amax = a > amax ? a : amax; /* NaN never wins, as with fmaxf */
                }
            const float si = amax > 0.0f ? amax / FP8_E4M3_MAX : 1.0f;
            scale_inv[(r0 / FP8_BLOCK) * nbc + c0 / FP8_BLOCK] = si;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) q[r * cols + c] = f32_to_fp8_e4m3(w[r * cols + c] / si);
        }
}

void fp8_dequantize_blocks(float *w, const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols) {
    float lut[256]; /* fp8_e4m3_to_f32 of every code */
    for (int v = 0; v < 256; v++) lut[v] = fp8_e4m3_to_f32((uint8_t)v);
    const int64_t nbc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        const float *s = scale_inv + (r / FP8_BLOCK) * nbc;
        for (int64_t c = 0; c < cols; c++) w[r * cols + c] = lut[q[r * cols + c]] * s[c / FP8_BLOCK];
    }
}

void fp8_scales_per_row(float *dst, int64_t ld, int64_t row0, int64_t row_step, const float *scale_inv, int64_t rows,
                        int64_t cols) {
    const int64_t nbc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    for (int64_t b = 0; b < nbc; b++)
        for (int64_t r = 0; r < rows; r++) dst[b * ld + row0 + r * row_step] = scale_inv[(r / FP8_BLOCK) * nbc + b];
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int read_file(const char *path, char **data, size_t *len, Err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, Q35_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return err_set(err, Q35_ERR_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return err_set(err, Q35_ERR_OOM, "%s: out of memory reading %zu bytes", path, n);
    }
    if (n && fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return err_set(err, Q35_ERR_IO, "%s: short read", path);
    }
    fclose(f);
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return 0;
}

int path_join(char *out, size_t n, const char *dir, const char *name) {
    int k = snprintf(out, n, "%s/%s", dir, name);
    return (k < 0 || (size_t)k >= n) ? Q35_ERR_ARG : 0;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(Rng *r) {
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

float rng_uniform(Rng *r) { return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float counter_uniform(uint64_t seed, uint64_t step) {
    uint64_t x = seed, y = splitmix64(&x) ^ step;
    return (float)(splitmix64(&y) >> 40) * (1.0f / 16777216.0f);
}

float rng_normal(Rng *r) {
    float u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

void probe(const Probe *p, const char *name, const float *x, size_t n) {
    if (!p || !p->dir) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.f32", p->dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(x, sizeof(float), n, f);
    fclose(f);
}
