/* attn_emu.cpp — the EXPERIMENTAL wgmma prefill attention (src/cuda/attention_prefill_wg.cu, pulled in by
 * run_attn.sh), kernel and launcher cuda_attn_prefill_wg, run under the host emulation of emu.h +
 * emu_wgmma.h (one CTA of 256 fibers at a time, shared memory starting as garbage), against a
 * double-precision reference of the ops.h AttnPrefillParams contract: causal GQA attention of T queries
 * at positions pos .. pos+T-1 over keys 0 .. pos+T-1 of the caches, scale 1/16, then (gate != NULL)
 * out = bf16(bf16(o) bf16(sigmoid(gate))).
 * Poison: cache rows past pos+T are NaN (a read past the tensor map's rows shows), the q slots of the
 * interleaved [q | gate] rows the gate is read from are NaN, out and guards around it start as NaN
 * with a marker payload: every element of [T][Hq*hd] must be overwritten with a finite value within
 * the bound, every guard must stay bit-identical.
 * Bound per element (A = sum_k p_k |v_k| / sum_k p_k, the reference's weights p_k): P is rounded to
 * bf16 (<= 2^-8 relative per p_k) -> |o - o_ref| <= 2^-8 A; fp32 scores (<= (hd+16) 6e-8 scale
 * sum |q k| each), fp32 sums: folded in as relative errors of p_k; then the bf16 roundings of o, of
 * the sigmoid and of the product (2^-8 relative each). An error of one bf16 step in the output stays
 * well inside; a wrong tile, mask, swizzle or stage is far outside.
 * Prints the largest |error| and error/bound per case; exit 1 on a failed bound, 2/3 on an emulation
 * error or a deadlock. Usage: attn_emu [seed]. */
// clang-format off
#include "emu.h"        /* first: its macros replace CUDA's qualifiers */
#include "emu_wgmma.h"
#undef __host__
#define __host__
#include "cuda/ops.h"
#define __CUDA_ARCH_FEAT_SM90_ALL 1 /* the kernel's sm_90a branch */
#include <time.h>

/* what the launcher calls in the CUDA runtime and common.cuh */
static int emu_cc_major = 9;
cudaError_t cudaGetDevice(int *dev) {
    *dev = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int) {
    *v = attr == cudaDevAttrComputeCapabilityMajor ? emu_cc_major : 0;
    return cudaSuccess;
}
#include "emu_common.h" /* cudaGetLastError, cudaFuncSetAttribute, launch_ex */
#include "attn_helpers.inc" /* wgmma_desc, wgmma_desc_mn (mma.cuh), sigmoid_f (common.cuh), attention_softmax.cuh */
#include "attn_wg.inc"      /* src/cuda/attention_prefill_wg.cu: the kernel and cuda_attn_prefill_wg */
// clang-format on

static uint16_t *alloc16(size_t n) { return (uint16_t *)aligned_alloc(64, ((n * 2 + 63) / 64) * 64); }

static const uint16_t POISON = 0x7fa5; /* a NaN with a payload no kernel store produces */
static const int HD = 256, GUARD = 64; /* elements before out; 2 rows after it */
static int fails;

/* One launch: Hq query heads over Hkv kv heads, T new tokens after a cached prefix of pos. */
static void run_case(int Hq, int Hkv, int T, int pos, bool gate) {
    const int max_seq = pos + T + 37, nq = Hq * HD;
    uint16_t *q = alloc16((size_t)T * nq), *kc = alloc16((size_t)Hkv * max_seq * HD), *vc = alloc16((size_t)Hkv * max_seq * HD);
    const size_t nob = GUARD + (size_t)(T + 2) * nq; /* out with its guards */
    uint16_t *g = alloc16((size_t)(T + 1) * 2 * nq), *ob = alloc16(nob), *o = ob + GUARD;
    for (size_t i = 0; i < (size_t)T * nq; i++) q[i] = emu_bf(1.5f * nrm()); /* scores of spread ~1.5 */
    for (int h = 0; h < Hkv; h++)
        for (int r = 0; r < max_seq; r++)
            for (int d = 0; d < HD; d++) {
                const size_t i = ((size_t)h * max_seq + r) * HD + d;
                kc[i] = r < pos + T ? emu_bf(nrm()) : 0x7fc0;
                vc[i] = r < pos + T ? emu_bf(nrm()) : 0x7fc0;
            }
    for (size_t i = 0; i < (size_t)(T + 1) * 2 * nq; i++) /* [t][j][q | gate], then a NaN row */
        g[i] = i < (size_t)T * 2 * nq && (i / HD) % 2 ? emu_bf(2.0f * nrm()) : 0x7fc0;
    for (size_t i = 0; i < nob; i++) ob[i] = POISON;

    AttnPrefillParams p;
    memset(&p, 0, sizeof p);
    p.q = q, p.k_cache = kc, p.v_cache = vc, p.gate = gate ? g + HD : nullptr, p.gate_ld = 2 * nq, p.gate_hs = 2 * HD;
    p.out = o, p.T = T, p.pos = pos, p.Hq = Hq, p.Hkv = Hkv, p.hd = HD, p.max_seq = max_seq, p.scale = 1.0f / 16.0f;
    CudaLaunch l;
    memset(&l, 0, sizeof l);
    printf("  Hq %d Hkv %d T %3d pos %3d gate %d: ", Hq, Hkv, T, pos, gate);
    fflush(stdout); /* names the case if the emulator stops on a deadlock or an emulation error */
    const long wg0 = emu_wgmma_count, cta0 = emu_ctas;
    const int rc = cuda_attn_prefill_wg(&p, &l);

    double max_err = 0, max_ratio = 0;
    long bad = 0, bad_guard = 0;
    std::vector<double> s(pos + T), pw(pos + T);
    const double u = 1.0 / 256; /* bf16 rounding (8 significant bits), relative */
    for (int t = 0; t < T; t++)
        for (int j = 0; j < Hq; j++) {
            const int kvh = j / (Hq / Hkv), nk = pos + t + 1;
            const uint16_t *qr = q + ((size_t)t * Hq + j) * HD;
            double mx = -1e300, es = 0;
            for (int k = 0; k < nk; k++) {
                const uint16_t *kr = kc + ((size_t)kvh * max_seq + k) * HD;
                double d = 0, a = 0;
                for (int e = 0; e < HD; e++) d += bff(qr[e]) * bff(kr[e]), a += fabs(bff(qr[e]) * bff(kr[e]));
                s[k] = d * p.scale;
                mx = std::max(mx, s[k]);
                es = std::max(es, (HD + 16) * 6e-8 * a * p.scale * 1.5 + 1e-6 * fabs(s[k]));
            }
            double l = 0;
            for (int k = 0; k < nk; k++) l += (pw[k] = exp(s[k] - mx));
            /* relative error per weight: bf16 P, fp32 score (twice: the row max too), fp32 exp2 and sums */
            const double rel = u + 2.2 * es + (nk + 64) * 6e-8 + 1e-6;
            for (int d = 0; d < HD; d++) {
                double ov = 0, A = 0;
                for (int k = 0; k < nk; k++) {
                    const double v = bff(vc[((size_t)kvh * max_seq + k) * HD + d]);
                    ov += pw[k] * v, A += pw[k] * fabs(v);
                }
                ov /= l, A /= l;
                const double e1 = 1.01 * (rel * A + u * (fabs(ov) + rel * A)); /* |bf16(o) - ov| */
                double ref = ov, tol = e1;
                if (gate) {
                    const double sg = 1.0 / (1.0 + exp(-bff(g[(size_t)t * 2 * nq + (size_t)j * 2 * HD + HD + d])));
                    ref = ov * sg;
                    tol = 1.01 * (e1 * (sg * (1 + u) + 1e-6) + fabs(ov) * (u * sg + 1e-6) + u * (fabs(ov) + e1) * sg * (1 + u));
                }
                tol += 1e-30;
                const double got = bff(o[(size_t)t * nq + j * HD + d]), err = fabs(got - ref);
                if (!(err <= tol)) {
                    if (bad < 4) fprintf(stderr, "    out[%d][%d][%d]: got %.8g ref %.8g (bound %.3g)\n", t, j, d, got, ref, tol);
                    bad++;
                    if (!(err == err)) max_err = INFINITY, max_ratio = INFINITY;
                }
                if (err > max_err) max_err = err;
                if (err / tol > max_ratio) max_ratio = err / tol;
            }
        }
    for (size_t i = 0; i < nob; i++) bad_guard += (i < GUARD || i >= GUARD + (size_t)T * nq) && ob[i] != POISON;
    const bool ok = rc == 0 && bad == 0 && bad_guard == 0;
    printf("%2ld CTAs, %5ld wgmmas: max |err| %.3g (%.2f of bound)\n", emu_ctas - cta0, emu_wgmma_count - wg0, max_err, max_ratio);
    if (!ok) {
        printf("  FAIL: rc %d, %ld elements over the bound, %ld guards overwritten\n", rc, bad, bad_guard);
        fails++;
    }
    free(q), free(kc), free(vc), free(g), free(ob);
}

/* What the launcher must refuse without launching. */
static void check_refusals(void) {
    uint16_t *buf = alloc16(64 * 256);
    AttnPrefillParams p;
    memset(&p, 0, sizeof p);
    p.q = p.k_cache = p.v_cache = buf, p.out = buf, p.T = 4, p.pos = 0, p.Hq = 2, p.Hkv = 1, p.hd = HD, p.max_seq = 64;
    p.scale = 1.0f / 16;
    CudaLaunch l;
    memset(&l, 0, sizeof l);
    const long c0 = emu_ctas;
    AttnPrefillParams b = p;
    b.hd = 128;
    const int r_hd = cuda_attn_prefill_wg(&b, &l);
    emu_cc_major = 8;
    const int r_cc = cuda_attn_prefill_wg(&p, &l);
    emu_cc_major = 9;
    b = p, b.Hq = 3, b.Hkv = 2;
    const int r_gqa = cuda_attn_prefill_wg(&b, &l);
    b = p, b.pos = 61;
    const int r_seq = cuda_attn_prefill_wg(&b, &l);
    const bool ok = r_hd == cudaErrorNotSupported && r_cc == cudaErrorNotSupported && r_gqa == cudaErrorInvalidValue &&
                    r_seq == cudaErrorInvalidValue && emu_ctas == c0;
    printf("  refusals (hd 128, sm_80, Hq %% Hkv, pos + T > max_seq): %s (rc %d %d %d %d)\n", ok ? "ok" : "FAILED", r_hd, r_cc, r_gqa, r_seq);
    if (!ok) fails++;
    free(buf);
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : (uint64_t)time(nullptr);
    emu_rs = seed * 2654435761u + 88172645463325252ull;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    emu_wg_install();
    printf("wgmma prefill attention (src/cuda/attention_prefill_wg.cu) under the CUDA emulation, seed %llu:\n",
           (unsigned long long)seed);
    check_refusals();
    const int Ts[6] = {1, 63, 64, 65, 130, 200};
    for (int i = 0; i < 6; i++) run_case(2, 1, Ts[i], 0, i % 2 == 1);
    for (int i = 0; i < 6; i++) run_case(4, 2, Ts[i], 0, i % 2 == 0);
    run_case(2, 1, 65, 100, true);
    run_case(4, 2, 65, 100, false);
    run_case(2, 1, 150, 333, true); /* long prefix: 8 key tiles, the ring through 4 phases */
    printf("attn_emu: %s\n", fails ? "FAILED" : "all bounds met");
    return fails ? 1 : 0;
}
