/* test_lm_screen.c — the LM head's argmax through the quantized screen (src/cuda/lm_screen.cu) against the full head
 * (cuda_matvec, MV_OUT_ARGMAX: itself checked against the CPU in test_matvec) on fresh random inputs, out_id and
 * out_max poisoned first. The contract is equality: the same id and the same value, bit for bit.
 *   cuda_lm_quantize: q in range, the scale, the bound coefficients at least the quantization errors (host, double),
 *           the ring kernel's 6-bit rows equal to (q + 128) >> 2 (first 4096 and last 64 rows, the infinite row);
 *   shapes: the 0.8B head (248320 x 1024, padding rows above n_valid), rows not multiples of 8, cols 16 .. 2048
 *           (not multiples of 512; two 1024-column passes), grids of 1 .. 132 blocks;
 *   prologues: MV_IN_VEC, MV_IN_RESIDUAL with split partials and zero-centred / plain norms, the zero buffer;
 *   hard inputs: exact ties across blocks (-> smallest id), near-ties one bf16 step apart (only the exact sums can
 *           tell them apart), a larger row in the padding, all rows equal (every block overflows its list and
 *           computes all its rows), x = 0, NaN in x, a row with an infinite weight;
 *   both kernels (the TMA ring where cols is 1024 or 2048: its stream L2 evict-first twice with the blocks' shared
 *           running max and once without, plain once with it; the register kernel twice), PDL on and off; the rows
 *           recomputed reported;
 *   cuda_lm_rows (sm_90a): the int8 tiles equal to q, then 1 .. 64 rows picked through them equal to the argmax of
 *           the skinny GEMM's logits (GEMM_EPI_F32) of the same rows, three calls in a row (the union's bits and the
 *           maxima start clean each time), at the 0.8B head and smaller shapes, with outlier channels, ties, near-ties,
 *           a NaN row, a zero row, an infinite weight and all head rows equal (every pair a candidate).
 * Usage: test_lm_screen [seed [rows]] (rows: cuda_lm_rows only). Skips (exit 0, "no GPU") without a GPU. */
#include "cuda/ops.h"
#include "test.h"
#include "gpu_common.h"

static Rng rng;
static int n_sm = 132;

enum { IN_VEC, IN_RES_ZC, IN_RES_PLAIN };
enum { H_NONE, H_TIES, H_NEAR, H_ALLEQ, H_ZERO, H_NAN, H_INF };
static const char *hard_name[] = {"random", "ties", "near-ties", "all rows equal", "x = 0", "NaN in x", "inf weight"};

/* (q + 128) >> 2 of row r, column k from the ring kernel's rows (ops.h Wp; lm_screen.cu lm_quantize_bf16's layout) */
static int unpack_hi(const uint8_t *wp, int r, int cols, int k) {
    const int c = k / 1024, l = k % 1024 / 32, j = k % 32 / 4, m = k % 4;
    const uint8_t *pr = wp + (size_t)r * (cols / 4 * 3) + 768 * c;
    const int nib = pr[16 * l + 4 * (j / 2) + m] >> (4 * (j & 1)) & 15,
              top = pr[512 + 8 * l + 4 * (j / 4) + m] >> (2 * (j % 4)) & 3;
    return top << 4 | nib;
}

/* Host check of cuda_lm_quantize's output for rows [0, n): q in [-127, 127], sc_r = max |w_r| / 127,
 * c_r >= ||w_r - sc_r q_r||_2, l1_r >= ||sc_r q_r||_1, c6_r >= sc_r ||lo - 1.5||_2; with wp: the 6-bit rows hold
 * (q + 128) >> 2. */
static int check_quant(const uint16_t *W, const int8_t *q, const uint8_t *wp, const float *meta, int rows, int cols,
                       int r0, int n) {
    int bad = 0;
    for (int r = r0; r < r0 + n && r < rows; r++) {
        const float sc = meta[4 * r], c = meta[4 * r + 1], l1 = meta[4 * r + 2], c6 = meta[4 * r + 3];
        double e2 = 0, amax = 0, l1r = 0, lo2 = 0;
        int finite = 1;
        for (int k = 0; k < cols; k++) {
            const float w = bf16_to_f32(W[(size_t)r * cols + k]);
            finite &= isfinite(w);
            if (fabs(w) > amax) amax = fabs(w);
            const int qi = q[(size_t)r * cols + k];
            if (qi < -127 || qi > 127) bad++;
            if (wp && unpack_hi(wp, r, cols, k) != (qi + 128) >> 2) bad++;
            const double d = (double)w - (double)sc * qi, dl = ((qi + 128) & 3) - 1.5;
            e2 += d * d, l1r += fabs((double)sc * qi), lo2 += dl * dl;
        }
        if (!finite) {
            if (!(isinf(c) && sc == 0)) bad++;
            continue;
        }
        if (!(c >= sqrt(e2)) || !(l1 >= l1r) || !(c6 >= sc * sqrt(lo2)) || !(fabs(sc - amax / 127.0) <= 1e-6 * amax)) {
            if (bad < 4)
                fprintf(stderr, "  row %d: sc %g (amax %g), c %g, error %g, l1 %g (%g)\n", r, sc, amax, c, sqrt(e2), l1,
                        l1r);
            bad++;
        }
    }
    return bad;
}

static void test_screen(int rows, int cols, int n_valid, int blocks, int in, int hard, int pdl) {
    const int64_t nw = (int64_t)rows * cols;
    const int n_parts = in == IN_VEC ? 0 : 3;
    uint16_t *W = bf16_random(&rng, nw, 1.0f / sqrtf((float)cols));
    float *x = f32_bf16_random(&rng, cols, 1.0f, 0.0f);
    float *parts = f32_bf16_random(&rng, (int64_t)(n_parts ? n_parts : 1) * cols, 0.3f, 0.0f);
    float *nw_ = f32_bf16_random(&rng, cols, 0.2f, in == IN_RES_PLAIN ? 1.0f : 0.0f);
    const int ring = cols % 1024 == 0; /* the 6 + 2 bit rows exist (the ring kernel runs where the device has TMA) */
    int8_t *q = malloc((size_t)nw);
    uint8_t *wp = malloc((size_t)nw / 4 * 3 + 1);
    float *meta = malloc(sizeof(float) * 4 * (size_t)rows);
    char what[160];
    snprintf(what, sizeof what, "%dx%d valid %d blocks %d %s %s pdl %d", rows, cols, n_valid, blocks,
             in == IN_VEC      ? "vec"
             : in == IN_RES_ZC ? "residual zc"
                               : "residual plain",
             hard_name[hard], pdl);
    /* the hard inputs */
    const int a = (int)(rng_u64(&rng) % (uint64_t)(n_valid / 2)),
              b = n_valid / 2 + (int)(rng_u64(&rng) % (uint64_t)(n_valid - n_valid / 2));
    if (hard == H_TIES || hard == H_NEAR) { /* rows a < b with the largest logit (b one bf16 step above at k0) */
        for (int k = 0; k < cols; k++) {
            const float v = (k * 7 % 5 == 0 ? 0.75f : 0.5f) / sqrtf((float)cols) * 8.0f;
            W[(size_t)a * cols + k] = W[(size_t)b * cols + k] = f32_to_bf16(x[k] >= 0 ? v : -v);
        }
        if (hard == H_NEAR) {
            const int k0 = (int)(rng_u64(&rng) % (uint64_t)cols);
            uint16_t *wb = &W[(size_t)b * cols + k0];
            *wb = (uint16_t)(*wb + 1); /* one step away from zero: |w| larger, same sign as x[k0] */
        }
    }
    if (hard == H_NONE) /* the largest valid row last: in the last piece / group */
        for (int k = 0; k < cols; k++)
            W[(size_t)(n_valid - 1) * cols + k] = f32_to_bf16((x[k] >= 0 ? 0.9f : -0.9f) * 8.0f / sqrtf((float)cols));
    if (n_valid < rows) /* a larger row in the padding: never the answer */
        for (int k = 0; k < cols; k++) W[(size_t)(rows - 1) * cols + k] = f32_to_bf16(x[k] >= 0 ? 2.0f : -2.0f);
    if (hard == H_ALLEQ)
        for (int r = 1; r < rows; r++) memcpy(&W[(size_t)r * cols], W, sizeof(uint16_t) * (size_t)cols);
    if (hard == H_ZERO)
        memset(x, 0, sizeof(float) * (size_t)cols), memset(parts, 0, sizeof(float) * (size_t)n_parts * cols);
    if (hard == H_NAN) x[cols / 3] = NAN;
    if (hard == H_INF) W[(size_t)b * cols + cols / 2] = 0x7f80; /* +inf */

    uint16_t *dW = dev_copy(W, (size_t)nw * 2);
    int8_t *dq = dev_poison((size_t)nw);
    uint8_t *dp = ring ? dev_poison((size_t)nw / 4 * 3) : NULL;
    float *dmeta = dev_poison(sizeof(float) * 4 * (size_t)rows);
    float *dx = dev_copy(x, sizeof(float) * cols), *dparts = dev_copy(parts, sizeof(float) * (size_t)n_parts * cols);
    float *dnw = dev_copy(nw_, sizeof(float) * cols), *dxo = dev_poison(sizeof(float) * cols);
    float *dzero = dev_poison(sizeof(float) * 100), *dval = dev_poison(sizeof(float) * 4096);
    float *dmax = dev_poison(4);
    int *didx = dev_poison(sizeof(int) * 4096), *did = dev_poison(4);
    unsigned *dcnt = dev_copy(NULL, 4), *dstats = dev_copy(NULL, 16);
    unsigned long long *dkey = dev_poison(16);
    StepParams sp;
    memset(&sp, 0, sizeof sp);
    StepParams *dsp = dev_copy(&sp, sizeof sp);
    CudaLaunch l = {0, pdl, NULL, 0};
    if (!dW || !dq || (ring && !dp) || !dmeta || !dx || !dparts || !dnw || !dxo || !dzero || !dval || !dmax || !didx ||
        !did || !dcnt || !dstats || !dsp || !dkey) {
        CHECK(0, "device alloc");
        goto done;
    }
    CU(cudaMemset(dcnt, 0, 4));
    CU(cudaMemset(dstats, 0, 16));
    LAUNCH(cuda_lm_quantize(dW, rows, cols, dq, dp, dmeta, NULL, NULL, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(q, dq, (size_t)nw, cudaMemcpyDeviceToHost));
    if (ring) CU(cudaMemcpy(wp, dp, (size_t)nw / 4 * 3, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(meta, dmeta, sizeof(float) * 4 * (size_t)rows, cudaMemcpyDeviceToHost));
    {
        uint8_t *hp = ring ? wp : NULL;
        int bad = check_quant(W, q, hp, meta, rows, cols, 0, 4096) +
                  check_quant(W, q, hp, meta, rows, cols, rows > 64 ? rows - 64 : 0, 64);
        if (hard == H_INF) bad += check_quant(W, q, hp, meta, rows, cols, b, 1);
        CHECK(bad == 0, "%s: quantized rows: %d bad", what, bad);
    }
    MatvecParams p;
    memset(&p, 0, sizeof p);
    p.W = dW, p.rows = rows, p.cols = cols, p.splits = 1, p.blocks = blocks, p.x = dx;
    if (in == IN_VEC) {
        p.in_mode = MV_IN_VEC;
    } else {
        p.in_mode = MV_IN_RESIDUAL, p.parts = dparts, p.n_parts = n_parts, p.norm_w = dnw, p.eps = 1e-6f;
        p.norm_mode = in == IN_RES_ZC ? NORM_ZC : NORM_PLAIN, p.x_out = dxo, p.zero = dzero, p.n_zero = 100;
    }
    p.out_mode = MV_OUT_ARGMAX, p.step = dsp, p.n_valid = n_valid;
    p.am_val = dval, p.am_idx = didx, p.am_count = dcnt, p.out_id = did, p.out_max = dmax;
    int id_full = -1;
    float max_full = 0;
    LAUNCH(cuda_matvec(&p, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(&id_full, did, 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&max_full, dmax, 4, cudaMemcpyDeviceToHost));
    /* with MV_IN_VEC the built rows are the largest (with the norms the signs of h differ from those of x) */
    if (hard == H_NONE && in == IN_VEC)
        CHECK(id_full == n_valid - 1, "%s: the full head chose %d, not the last valid row", what, id_full);
    if (hard == H_TIES && in == IN_VEC)
        CHECK(id_full == a, "%s: the full head chose %d, not the first tied row %d", what, id_full, a);
    if (hard == H_NEAR && in == IN_VEC)
        CHECK(id_full == a || id_full == b, "%s: the full head chose %d, not a near-tied row (%d, %d)", what, id_full,
              a, b);
    LmScreenParams ls;
    memset(&ls, 0, sizeof ls);
    ls.head = p, ls.Wq = dq, ls.Wp = dp, ls.meta = dmeta, ls.stats = dstats, ls.key = dkey;
    unsigned st[3] = {0, 0, 0}, st2[3] = {0, 0, 0};
    enum { RUNS = 6 };
    for (int run = 0; run < RUNS;
         run++) { /* the ring kernel (where cols is 1024 or 2048): its running max shared across
                                           blocks or not, its stream L2 evict-first or not; then the register kernel */
        ls.reg = run >= 4, ls.gmax = run < 3 ? (unsigned *)(dkey + 1) : NULL;
        float mx = 0, xo[8], zr[100];
        unsigned long long key[1] = {0};
        CU(cudaMemset(dkey, 0, 16)); /* the caller's part: the key and gmax zero before each launch */
        CU(cudaMemset(dxo, 0xff, sizeof(float) * cols));
        CU(cudaMemset(dzero, 0xff, sizeof(float) * 100));
        LAUNCH(cuda_lm_screen(&ls, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(key, dkey, sizeof key, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(xo, dxo, sizeof xo, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(zr, dzero, sizeof zr, cudaMemcpyDeviceToHost));
        const int id = cuda_lm_key_id(key[0], &mx);
        CHECK(id == id_full, "%s run %d: id %d, full head %d", what, run, id, id_full);
        CHECK(id_full == 0 && !(max_full > -INFINITY) ? 1 : memcmp(&mx, &max_full, 4) == 0,
              "%s run %d: max %.9g, full head %.9g", what, run, mx, max_full);
        if (in != IN_VEC) {
            int ok = 1;
            for (int i = 0; i < 100; i++) ok &= zr[i] == 0.0f;
            for (int i = 0; i < 8 && hard != H_NAN; i++) ok &= !isnan(xo[i]);
            CHECK(ok, "%s: zero buffer or x_out not written", what);
        }
        if (run == 1) CU(cudaMemcpy(st2, dstats, 12, cudaMemcpyDeviceToHost)); /* the engine's setting, twice */
    }
    CU(cudaMemcpy(st, dstats, 12, cudaMemcpyDeviceToHost));
    CHECK(st[2] == RUNS * (unsigned)blocks, "%s: %u block records for %d calls of %d blocks", what, st[2], RUNS,
          blocks);
    if (hard == H_NAN) CHECK(st[1] == st[2], "%s: %u of %u blocks computed all their rows", what, st[1], st[2]);
    if ((hard == H_ALLEQ || hard == H_ZERO) && n_valid / blocks > 600) /* more than the list holds in every block */
        CHECK(st[1] == st[2], "%s: %u of %u blocks computed all their rows", what, st[1], st[2]);
    if (hard == H_NONE && rows > 100000) /* a few dozen rows per block recomputed at most (ring: with gmax) */
        CHECK(st2[1] == 0 && st2[0] < 2u * 128u * (unsigned)blocks,
              "%s: %u rows recomputed, %u blocks computed all in 2 calls", what, st2[0], st2[1]);
    printf("  %s: id %d; with gmax %.1f rows recomputed, %.1f blocks with all rows per call; all %d calls %u, %u\n",
           what, id_full, st2[0] / 2.0, st2[1] / 2.0, (int)RUNS, st[0], st[1]);
done:
    cudaFree(dW), cudaFree(dq), cudaFree(dmeta), cudaFree(dx), cudaFree(dparts), cudaFree(dnw), cudaFree(dxo);
    cudaFree(dzero), cudaFree(dval), cudaFree(dmax), cudaFree(didx), cudaFree(did), cudaFree(dcnt), cudaFree(dstats);
    cudaFree(dsp), cudaFree(dkey), cudaFree(dp);
    free(W), free(x), free(parts), free(nw_), free(q), free(wp), free(meta);
}

/* ---- cuda_lm_rows: up to 64 rows through the int8 tiles (lm_screen_rows.cu) against the skinny GEMM's logits ---- */

/* Byte (r, k) of the tiles of 64 rows (mma.cuh swz128_tile_off, rewritten here) */
static size_t tile_off(int64_t r, int k, int cols) {
    const int64_t t = r / 64;
    const int i = (int)(r - t * 64), c = (k >> 4) & 7;
    return (size_t)((t * (cols / 128) + k / 128) * 64 + i) * 128 + (size_t)(((c ^ (i & 7)) << 4) + (k & 15));
}

/* row m of y [rows][V]: argmax over [0, n_valid), larger wins, ties the smaller id, NaN never, none 0 */
static int host_argmax(const float *y, int n_valid) {
    int best = -1;
    for (int r = 0; r < n_valid; r++)
        if (y[r] == y[r] && (best < 0 || y[r] > y[best])) best = r;
    return best < 0 ? 0 : best;
}

enum { HR_NONE, HR_OUTLIER, HR_TIES, HR_NEAR, HR_NAN, HR_ZERO, HR_INF, HR_ALLEQ };
static const char *hr_name[] = {"random",  "outlier channels", "ties",       "near-ties",
                                "NaN row", "zero row",         "inf weight", "all head rows equal"};

static void test_rows(int V, int D, int n_valid, int rows, int hard, int pdl) {
    char what[160];
    snprintf(what, sizeof what, "rows %dx%d valid %d, %d rows, %s, pdl %d", V, D, n_valid, rows, hr_name[hard], pdl);
    const int64_t nw = (int64_t)V * D;
    uint16_t *W = bf16_random(&rng, nw, 1.0f / sqrtf((float)D));
    uint16_t *h = bf16_random(&rng, (int64_t)rows * D, 1.0f);
    const int a = (int)(rng_u64(&rng) % (uint64_t)(n_valid / 2)),
              b = n_valid / 2 + (int)(rng_u64(&rng) % (uint64_t)(n_valid - n_valid / 2)), m0 = rows - 1;
    if (hard == HR_OUTLIER) /* a few channels 40x larger in every row: a coarse hq step */
        for (int m = 0; m < rows; m++)
            for (int k = 3; k < D; k += D / 4)
                h[(size_t)m * D + k] = f32_to_bf16(40.0f * bf16_to_f32(h[(size_t)m * D + k]));
    if (hard == HR_TIES || hard == HR_NEAR) { /* head rows a < b with row m0's largest logit */
        for (int k = 0; k < D; k++) {
            const float v = (k * 7 % 5 == 0 ? 0.75f : 0.5f) / sqrtf((float)D) * 8.0f;
            W[(size_t)a * D + k] = W[(size_t)b * D + k] = f32_to_bf16(bf16_to_f32(h[(size_t)m0 * D + k]) >= 0 ? v : -v);
        }
        if (hard == HR_NEAR) {
            const int k0 = (int)(rng_u64(&rng) % (uint64_t)D);
            W[(size_t)b * D + k0] = (uint16_t)(W[(size_t)b * D + k0] + 1);
        }
    }
    if (n_valid < V) /* a larger row in the padding: never the answer */
        for (int k = 0; k < D; k++) W[(size_t)(V - 1) * D + k] = f32_to_bf16(bf16_to_f32(h[k]) >= 0 ? 2.0f : -2.0f);
    if (hard == HR_NAN) h[(size_t)m0 * D + D / 3] = 0x7fc0;
    if (hard == HR_ZERO) memset(h + (size_t)m0 * D, 0, sizeof(uint16_t) * (size_t)D);
    if (hard == HR_INF) W[(size_t)b * D + D / 2] = 0x7f80;
    if (hard == HR_ALLEQ)
        for (int r = 1; r < V; r++) memcpy(&W[(size_t)r * D], W, sizeof(uint16_t) * (size_t)D);

    const size_t wsb = cuda_lm_rows_ws_bytes(V, D), tb = cuda_lm_rows_tiles_bytes(V, D);
    uint16_t *dW = dev_copy(W, (size_t)nw * 2), *dh = dev_copy(h, sizeof(uint16_t) * (size_t)rows * D);
    int8_t *dWt = dev_poison(tb);
    float *dmeta = dev_poison(sizeof(float) * 4 * (size_t)V), *dy = dev_poison(sizeof(float) * (size_t)rows * V);
    float *dyf = dev_poison(sizeof(float) * (size_t)rows * V);
    void *dws = NULL;
    int32_t *dout = dev_poison(sizeof(int32_t) * 64);
    float *y = malloc(sizeof(float) * (size_t)rows * V);
    int8_t *wt = malloc(tb);
    float *meta = malloc(sizeof(float) * 4 * (size_t)V);
    int want[64], got[64];
    CudaLaunch l = {0, pdl, NULL, 0};
    if (!dW || !dh || !dWt || !dmeta || !dy || !dyf || !dout || !y || !wt || !meta ||
        cudaMalloc(&dws, wsb) != cudaSuccess || cudaMemset(dws, 0, wsb) != cudaSuccess) {
        CHECK(0, "%s: alloc", what);
        goto done;
    }
    LAUNCH(cuda_lm_quantize(dW, V, D, NULL, NULL, NULL, dWt, dmeta, &l));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(wt, dWt, tb, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(meta, dmeta, sizeof(float) * 4 * (size_t)V, cudaMemcpyDeviceToHost));
    { /* the tiles hold q = rint(w / sc) (sc = max |w| / 127, sc 0 and c infinite for a non-finite row), the tail zero */
        int bad = 0;
        for (int64_t r = 0; r < (int64_t)(tb / D); r++) {
            const int check = r < 300 || r >= V - 300 || r == b;
            if (!check) continue;
            for (int k = 0; k < D; k++) {
                int qi = 0;
                if (r < V && meta[4 * r] > 0.0f) {
                    qi = (int)rintf(bf16_to_f32(W[(size_t)r * D + k]) / meta[4 * r]);
                    qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
                }
                bad += wt[tile_off(r, k, D)] != qi;
            }
            if (hard == HR_INF && r == b && !(meta[4 * r] == 0.0f && meta[4 * r + 1] == INFINITY)) bad++;
        }
        CHECK(bad == 0, "%s: %d tile bytes or rows wrong", what, bad);
    }
    { /* the reference: the full head on the skinny GEMM, host argmax */
        GemmParams g = {
            .x = dh, .w = dW, .y = dyf, .M = rows, .N = V, .K = D, .ldx = D, .ldw = D, .ldy = V, .epi = GEMM_EPI_F32};
        LAUNCH(cuda_gemm_skinny(&g, NULL, 0, n_sm, &l));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(y, dyf, sizeof(float) * (size_t)rows * V, cudaMemcpyDeviceToHost));
        for (int m = 0; m < rows; m++) want[m] = host_argmax(y + (size_t)m * V, n_valid);
    }
    if (hard == HR_TIES)
        CHECK(want[m0] == a, "%s: the full head chose %d, not the first tied row %d", what, want[m0], a);
    if (hard == HR_ZERO) CHECK(want[m0] == 0, "%s: the full head chose %d for the zero row", what, want[m0]);
    LmRowsParams p = {.h = dh,
                      .rows = rows,
                      .ldh = D,
                      .W = dW,
                      .Wt = dWt,
                      .meta = dmeta,
                      .V = V,
                      .D = D,
                      .n_valid = n_valid,
                      .ws = dws,
                      .y = dy,
                      .out = dout,
                      .n_sm = n_sm};
    long cnt[3] = {0, 0, 0};
    /* again: the union's bits and the maxima start clean each call (the union's size may differ: it depends on when
     * each CTA sees the others' maxima) */
    for (int run = 0; run < 3; run++) {
        CU(cudaMemset(dout, 0xff, sizeof(int32_t) * 64));
        LAUNCH(cuda_lm_rows(&p, &l));
        CU(cudaDeviceSynchronize());
        cnt[run] = cuda_lm_rows_count(&p);
        CU(cudaMemcpy(got, dout, sizeof(int32_t) * (size_t)rows, cudaMemcpyDeviceToHost));
        int diff = 0, first = -1;
        for (int m = 0; m < rows; m++)
            if (got[m] != want[m]) diff++, first = first < 0 ? m : first;
        CHECK(diff == 0, "%s run %d: %d of %d picks differ (row %d: %d, full head %d)", what, run, diff, rows, first,
              first >= 0 ? got[first] : 0, first >= 0 ? want[first] : 0);
    }
    if (hard == HR_NONE && V > 100000)
        CHECK(cnt[0] < 60L * rows + 2000, "%s: %ld rows computed exactly (%d rows)", what, cnt[0], rows);
    printf("  %s: %ld head rows computed exactly per call\n", what, cnt[0]);
done:
    cudaFree(dW), cudaFree(dh), cudaFree(dWt), cudaFree(dmeta), cudaFree(dy), cudaFree(dyf), cudaFree(dws);
    cudaFree(dout);
    free(W), free(h), free(y), free(wt), free(meta);
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("test_lm_screen");
    rng_seed(&rng, test_seed(argc, argv, "test_lm_screen"));
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
    const int blk = cuda_matvec_blocks(248320, 1024, 1, n_sm);
    const int rows_only = argc > 2 && strcmp(argv[2], "rows") == 0; /* test_lm_screen SEED rows: cuda_lm_rows only */
    if (rows_only) goto rows;
    /* the 0.8B head: random, ties, near-ties, residual + norm (both modes) */
    test_screen(248320, 1024, 248077, blk, IN_RES_ZC, H_NONE, 1);
    test_screen(248320, 1024, 248077, blk, IN_VEC, H_NONE, 1);
    test_screen(248320, 1024, 248077, blk, IN_VEC, H_TIES, 1);
    test_screen(248320, 1024, 248077, blk, IN_RES_PLAIN, H_NEAR, 0);
    /* smaller shapes and grids */
    const int shapes[][3] = {{1000, 64, 3},      {4099, 1040, 17}, {5003, 2048, 40}, {777, 16, 1},
                             {20000, 1536, 132}, {65, 1024, 5},    {3001, 1024, 7},  {100003, 1024, 132}};
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        const int r = shapes[s][0], c = shapes[s][1], bl = shapes[s][2] < n_sm ? shapes[s][2] : n_sm;
        for (int hard = H_NONE; hard <= H_INF; hard++)
            test_screen(r, c, r - (hard % 2 ? 3 : 0), bl,
                        hard % 3 == 0   ? IN_VEC
                        : hard % 3 == 1 ? IN_RES_ZC
                                        : IN_RES_PLAIN,
                        hard, hard % 2);
    }
    /* the hard cases at the 0.8B shape: every block overflows (all rows equal), x = 0 */
    test_screen(248320, 1024, 248077, blk, IN_VEC, H_ALLEQ, 1);
    test_screen(248320, 1024, 248077, blk, IN_RES_ZC, H_ZERO, 1);
rows: /* up to 64 rows at once (sm_90a): the 0.8B head, smaller shapes, the hard inputs */
    if (cuda_lm_rows_ok(248320, 1024)) {
        test_rows(248320, 1024, 248077, 64, HR_NONE, 1);
        test_rows(248320, 1024, 248077, 1, HR_NONE, 1);
        test_rows(248320, 1024, 248077, 8, HR_OUTLIER, 0);
        test_rows(248320, 1024, 248077, 64, HR_TIES, 1);
        test_rows(248320, 1024, 248077, 32, HR_NEAR, 1); /* the kernel's three forms: 16, 32 and 64 rows of X */
        const int rs[][3] = {{5000, 1024, 33}, {4480, 512, 64}, {9000, 640, 20}, {70000, 256, 7}, {64, 128, 2}};
        for (int s = 0; s < (int)(sizeof rs / sizeof rs[0]); s++)
            for (int hard = HR_NONE; hard <= HR_ALLEQ; hard++)
                if (hard != HR_ALLEQ || rs[s][0] < 10000)
                    test_rows(rs[s][0], rs[s][1], rs[s][0] - (hard % 2 && rs[s][0] > 100 ? 5 : 0), rs[s][2], hard,
                              hard % 2);
    } else {
        printf("  cuda_lm_rows: not on this device (sm_90a only)\n");
    }
    return TEST_SUMMARY("test_lm_screen");
}
