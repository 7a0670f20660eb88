/* deltanet_prefill_emu.cpp — the DeltaNet prefill kernels (src/cuda/deltanet_prefill.cu, pulled in
 * as dn.inc by run.sh) run under the host emulation of emu.h, against the fp32 CPU reference:
 * calls of 130, 65 and 1 tokens (state and conv ring carried), Hk/Hv from argv, random or repeating
 * rows (keys repeating every 5 tokens, beta ~0.98, g ~0). Per call: y vs the fp32 reference (bound
 * 1e-2), y vs the CPU chunked reference on the kernels own conv outputs and gates (6e-3, worst
 * (token, head) row 2e-2), final state vs that reference (2e-4), conv ring rows (exact). The
 * scratch starts as NaN and shared memory as garbage. argv[5] = 1: bf16 states (DeltaNetPrefillParams.state_bf16,
 * a serve slot's): the call reads its state as bf16 and stores the final and point states rounded to bf16, so those
 * bounds grow by one bf16 rounding (2^-8); the next call starts from the kernel's own state. Exit 1 on a failed
 * bound. */
// clang-format off
#include "emu.h"      /* first: its macros replace CUDA's qualifiers */
#include "cuda/ops.h"
extern "C" {
#include "cpu/ops.h"
}
template <typename T> static inline T __ldcg(const T *p) { return *p; } /* bypasses L1 on the GPU */
#include "helpers.inc" /* swz, ldsm_addr_* from src/cuda/mma.cuh */
#include "dn.inc"      /* the kernels */
// clang-format on

static float *fv(size_t n) { return (float *)calloc(n, 4); }
static float *rbfv(size_t n, float mean, float sc) {
    float *p = fv(n);
    for (size_t i = 0; i < n; i++) p[i] = rbf(mean + sc * nrm());
    return p;
}
static uint16_t *tobf(const float *x, size_t n) {
    uint16_t *h = (uint16_t *)malloc(n * 2 + 64);
    for (size_t i = 0; i < n; i++) h[i] = emu_bf(x[i]);
    return h;
}
static double rel(const float *a, const float *b, size_t n) {
    double x = 0, y = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        x += d * d;
        y += (double)b[i] * b[i];
    }
    return sqrt(x / (y > 0 ? y : 1e-300));
}
static float *cols(const float *x, int T, int ld, int c0, int w) {
    float *y = fv((size_t)T * w);
    for (int t = 0; t < T; t++) memcpy(y + (size_t)t * w, x + (size_t)t * ld + c0, w * 4);
    return y;
}

static int scan_norms = 1; /* dn_scan<true> (the gated norm in the scan), else dn_scan<false> + dn_norm_out */
static void emu_prefill(const DeltaNetPrefillParams *p) {
    DeltaNetScratch sc;
    cuda_deltanet_prefill_scratch(&sc, p->scratch, p->T, p->Hk, p->Hv, p->dk, p->dv);
    const int nc = (p->T + 63) / 64, Tp = nc * 64, rows = nc * p->Hv * 128;
    const DeltaNetPrefillParams P = *p;
    emu_launch(dim3(nc * 64 / DN_TPW, (2 * p->Hk + p->Hv + 3) / 4), 128, 0, 1, [&] { dn_conv_bf16_tok<4>(P, sc); });
    emu_launch(dim3(nc, p->Hv), 256, DnLocalSmem::BYTES, 1, [&] { dn_local_chunk(P, sc); });
    DnScanMaps m;
    cuda_tma_map_bf16(&m.k, sc.k, Tp, p->Hk * DN_D, p->Hk * DN_D, 64);
    cuda_tma_map_bf16(&m.kl, sc.k_lo, Tp, p->Hk * DN_D, p->Hk * DN_D, 64);
    cuda_tma_map_bf16(&m.q, sc.q, Tp, p->Hk * DN_D, p->Hk * DN_D, 64);
    cuda_tma_map_bf16(&m.ql, sc.q_lo, Tp, p->Hk * DN_D, p->Hk * DN_D, 64);
    cuda_tma_map_bf16(&m.t, sc.t, rows, 64, 64, 128);
    cuda_tma_map_bf16(&m.p, sc.p, rows, 64, 64, 128);
    const dim3 sg(DN_NSL, p->Hv);
    if (scan_norms) { /* the head's blocks wait for each other: they run together, as one emulated cluster */
        emu_launch(sg, 512, DnScanSmem::BYTES + 16 + 1024, DN_NSL, [&] { dn_scan<true>(P, sc, m); });
        return;
    }
    emu_launch(sg, 512, DnScanSmem::BYTES + 16 + 1024, 1, [&] { dn_scan<false>(P, sc, m); });
    emu_launch(dim3((p->T * p->Hv + 8 * DN_NR - 1) / (8 * DN_NR)), 256, 0, 1, [&] { dn_norm_out(P, sc); });
}

int main(int argc, char **argv) {
    const int Hk = argc > 1 ? atoi(argv[1]) : 1, Hv = argc > 2 ? atoi(argv[2]) : 2, rep = argc > 3 ? atoi(argv[3]) : 0;
    scan_norms = argc > 4 ? atoi(argv[4]) : 1;
    const int bf16 = argc > 5 ? atoi(argv[5]) : 0;
    const double st_tol = 2e-4 + (bf16 ? 1.0 / 256 : 0.0); /* the states' bound: one bf16 rounding more */
    const int dk = 128, dv = 128, K = 4, kd = Hk * dk, vd = Hv * dv, cd = 2 * kd + vd, n = cd + vd + 2 * Hv, ld = n + 8;
    const int calls[] = {130, 65, 1};
    const float eps = 1e-6f;
    float *convw = rbfv((size_t)cd * K, 0, 0.5f), *Alog = fv(Hv), *dt = rbfv(Hv, -2, 0.5f), *nw = rbfv(dv, 1, 0.1f);
    for (int j = 0; j < Hv; j++) Alog[j] = rbf(logf(0.1f + 1.9f * (float)urand()));
    const size_t sn = (size_t)Hv * dk * dv;
    float *S = fv(sn), *Sg = fv(sn), *Sown = fv(sn), *cstate = fv((size_t)(K - 1) * cd);
    uint16_t *ring = (uint16_t *)calloc((size_t)K * cd, 2), *Sgb = (uint16_t *)calloc(sn, 2); /* bf16: the state */
    const size_t scr = cuda_deltanet_prefill_scratch(NULL, NULL, 256, Hk, Hv, dk, dv);
    void *scratch = aligned_alloc(256, (scr + 255) / 256 * 256);
    memset(scratch, 0xff, scr); /* NaN */
    float *cscr = fv((size_t)cpu_deltanet_chunked_scratch(Hv, dk, dv));
    int pos = 0, fails = 0;
    for (int ci = 0; ci < 3; ci++) {
        const int T = calls[ci];
        float *proj = rbfv((size_t)T * ld, 0, 1);
        if (rep)
            for (int t = 5; t < T; t++) memcpy(proj + (size_t)t * ld, proj + (size_t)(t % 5) * ld, ld * 4);
        if (rep)
            for (int t = 0; t < T; t++)
                for (int j = 0; j < Hv; j++)
                    proj[(size_t)t * ld + cd + vd + j] = 4, proj[(size_t)t * ld + cd + vd + Hv + j] = -8;
        uint16_t *projb = tobf(proj, (size_t)T * ld), *y = (uint16_t *)malloc((size_t)T * vd * 2);
        memset(y, 0xff, (size_t)T * vd * 2);
        DeltaNetPrefillParams p = {};
        p.proj = projb, p.ld_proj = ld, p.z_off = cd, p.b_off = cd + vd, p.a_off = cd + vd + Hv;
        p.conv_w = convw, p.A_log = Alog, p.dt_bias = dt, p.norm_w = nw, p.conv_ring = ring, p.y = y;
        p.state = bf16 ? (float *)Sgb : Sg, p.state_bf16 = p.pt_bf16 = bf16;
        p.scratch = scratch, p.T = T, p.pos = pos, p.Hk = Hk, p.Hv = Hv, p.dk = dk, p.dv = dv, p.K = K, p.eps = eps;
        /* snapshot points inside the call: chunk starts, the first rows, the last one, mid-chunk */
        const int pts130[] = {0, 1, 5, 63, 64, 100, 129}, pts65[] = {2, 64};
        const int *pts = T == 130 ? pts130 : T == 65 ? pts65 : NULL;
        const int npt = T == 130 ? 7 : T == 65 ? 2 : 0;
        float *pst[DN_MAX_PTS] = {}, *Sown0 = fv(sn);
        uint16_t *pring[DN_MAX_PTS] = {}, *ring0 = (uint16_t *)malloc((size_t)K * cd * 2);
        memcpy(Sown0, Sown, sn * 4);
        memcpy(ring0, ring, (size_t)K * cd * 2);
        p.n_pts = npt;
        for (int i = 0; i < npt; i++) {
            pst[i] = fv(sn);
            pring[i] = (uint16_t *)malloc((size_t)K * cd * 2);
            for (size_t e = 0; e < sn; e++) pst[i][e] = NAN; /* bf16: the first half, as NaN pairs */
            memset(pring[i], 0xff, (size_t)K * cd * 2);
            p.pt_off[i] = pts[i], p.pt_state[i] = pst[i], p.pt_ring[i] = pring[i];
        }
        emu_prefill(&p);
        if (bf16) { /* the kernel's bf16 states as fp32 */
            for (size_t e = 0; e < sn; e++) Sg[e] = bff(Sgb[e]);
            for (int i = 0; i < npt; i++) {
                const uint16_t *h = (const uint16_t *)pst[i];
                for (size_t e = sn; e-- > 0;) pst[i][e] = bff(h[e]);
            }
        }
        /* CPU fp32 reference */
        float *m = cols(proj, T, ld, 0, cd), *c = fv((size_t)T * cd);
        cpu_conv1d(c, cstate, m, convw, T, cd, K);
        float *q = cols(c, T, cd, 0, kd), *k = cols(c, T, cd, kd, kd), *v = cols(c, T, cd, 2 * kd, vd);
        for (int r = 0; r < T * Hk; r++)
            for (int which = 0; which < 2; which++) {
                float *x = (which ? k : q) + (size_t)r * dk, ss = 0;
                for (int i = 0; i < dk; i++) ss += x[i] * x[i];
                const float inv = 1.0f / sqrtf(ss + 1e-6f);
                for (int i = 0; i < dk; i++) x[i] *= inv;
            }
        float *z = cols(proj, T, ld, cd, vd), *b = cols(proj, T, ld, cd + vd, Hv),
              *a = cols(proj, T, ld, cd + vd + Hv, Hv);
        float *beta = fv((size_t)T * Hv), *g = fv((size_t)T * Hv), *o = fv((size_t)T * vd), *yr = fv((size_t)T * vd);
        cpu_deltanet_gates(beta, g, b, a, Alog, dt, T, Hv);
        float *qs = fv((size_t)T * kd);
        for (size_t i = 0; i < (size_t)T * kd; i++) qs[i] = q[i] / sqrtf(128.0f);
        cpu_deltanet_chunked(o, S, qs, k, v, g, beta, T, Hk, Hv, dk, dv, cscr);
        if (bf16)
            for (size_t e = 0; e < sn; e++) S[e] = rbf(S[e]); /* stored as the kernel stores it */
        cpu_gated_rmsnorm(yr, o, z, nw, T * Hv, dv, eps);
        /* own intermediates */
        DeltaNetScratch sc;
        cuda_deltanet_prefill_scratch(&sc, scratch, T, Hk, Hv, dk, dv);
        float *gq = fv((size_t)T * kd), *gk = fv((size_t)T * kd), *gv = fv((size_t)T * vd), *o2 = fv((size_t)T * vd),
              *y2 = fv((size_t)T * vd);
        for (size_t i = 0; i < (size_t)T * kd; i++)
            gq[i] = (bff(sc.q[i]) + bff(sc.q_lo[i])) / sqrtf(128.0f), gk[i] = bff(sc.k[i]) + bff(sc.k_lo[i]);
        for (size_t i = 0; i < (size_t)T * vd; i++) gv[i] = bff(sc.v[i]);
        cpu_deltanet_chunked(o2, Sown, gq, gk, gv, sc.g, sc.beta, T, Hk, Hv, dk, dv, cscr);
        cpu_gated_rmsnorm(y2, o2, z, nw, T * Hv, dv, eps);
        float *yg = fv((size_t)T * vd);
        for (size_t i = 0; i < (size_t)T * vd; i++) yg[i] = bff(y[i]);
        double worst = 0, worst2 = 0;
        int wt = -1, wt2 = -1;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < Hv; j++) {
                const size_t off = ((size_t)t * Hv + j) * dv;
                double e = rel(yg + off, yr + off, dv), e2 = rel(yg + off, y2 + off, dv);
                if (!(e <= worst)) worst = e, wt = t;
                if (!(e2 <= worst2)) worst2 = e2, wt2 = t;
            }
        long ringbad = 0;
        for (int jr = 0; jr < K - 1; jr++) {
            const int qq = pos + T - (K - 1) + jr;
            if (qq < 0) continue;
            for (int ch = 0; ch < cd; ch++)
                ringbad += bff(ring[(size_t)(qq % K) * cd + ch]) != cstate[(size_t)jr * cd + ch];
        }
        printf("call %d T=%d pos=%d: y vs fp32 %.2e (worst row %.2e t=%d) | own %.2e (worst %.2e t=%d) | state %.2e "
               "own %.2e | "
               "q %.1e k %.1e ring bad %ld\n",
               ci, T, pos, rel(yg, yr, (size_t)T * vd), worst, wt, rel(yg, y2, (size_t)T * vd), worst2, wt2,
               rel(Sg, S, sn), rel(Sg, Sown, sn), rel(gq, qs, (size_t)T * kd), rel(gk, k, (size_t)T * kd), ringbad);
        fails += !(rel(yg, y2, (size_t)T * vd) <= 6e-3 && worst2 <= 2e-2 && rel(Sg, Sown, sn) <= st_tol &&
                   rel(yg, yr, (size_t)T * vd) <= 1e-2 && ringbad == 0);
        if (bf16) memcpy(Sown, Sg, sn * 4); /* the next call's reference starts where the kernel's state is */
        /* each point: the state vs the chunked reference over the call's first pt_off rows (own conv outputs and
         * gates, from the state before the call), the window rows exact (from proj, the ring before the call, or 0) */
        for (int i = 0; i < npt; i++) {
            const int off = pts[i];
            float *Sp = fv(sn), *op = fv((size_t)(off ? off : 1) * vd);
            memcpy(Sp, Sown0, sn * 4);
            if (off) cpu_deltanet_chunked(op, Sp, gq, gk, gv, sc.g, sc.beta, off, Hk, Hv, dk, dv, cscr);
            long bad = 0;
            for (int jr = 0; jr < K; jr++) {
                const int qq = pos + off - K + jr, u = qq - pos;
                for (int ch = 0; ch < cd; ch++) {
                    const uint16_t want = u >= 0    ? projb[(size_t)u * ld + ch]
                                          : qq >= 0 ? ring0[(size_t)(qq % K) * cd + ch]
                                                    : 0;
                    bad += pring[i][(size_t)((qq % K + K) % K) * cd + ch] != want;
                }
            }
            const double e = rel(pst[i], Sp, sn);
            printf("  point %d (after %d of %d): state %.2e | window bad %ld\n", i, off, T, e, bad);
            fails += !(e <= st_tol && bad == 0);
            free(Sp), free(op), free(pst[i]), free(pring[i]);
        }
        free(Sown0), free(ring0);
        pos += T;
    }
    printf("%s\n", fails ? "FAIL" : "ok");
    return fails != 0;
}
