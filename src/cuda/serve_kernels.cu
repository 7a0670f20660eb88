/* serve_kernels.cu — the batched step's own kernels (serve.cu; contracts in serve_ops.h): q/k norm + RoPE + append
 * into the paged KV pools, paged attention of each row over its own sequence, the DeltaNet decode step over state
 * slots and its gated norm, and a row gather for the LM head. Every CTA works on one row, so a row's values never
 * depend on the other rows of the step (batch invariance). */
#include <limits.h>

#include "cuda/common.cuh"
#include "cuda/deltanet.cuh"
#include "cuda/serve_ops.h"

/* ---- paged prep ------------------------------------------------------------------------------------------------ */

/* Address of position pos of kv head i in a pool (see serve_ops.h). */
__device__ __forceinline__ size_t paged_off(const int32_t *tables, int tab, int pos, int i, int Hkv, int block,
                                            int hd) {
    const int b = tables[tab + pos / block];
    return (((size_t)b * Hkv + i) * block + pos % block) * hd;
}

/* grid (T, ceil((Hq + 2 Hkv) / 4)), 128 threads: warp w handles head unit blockIdx.y*4 + w (q heads, k heads, v
 * heads) of row blockIdx.x; element e = lane + 32 i (attention_prefill.cu attn_prep_bf16_rows, per-row position). */
__global__ void __launch_bounds__(128) paged_prep_rows(const __grid_constant__ PagedPrepParams p) {
    pdl_begin();
    __shared__ float buf[4][256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int unit = blockIdx.y * 4 + warp, t = blockIdx.x, hd = p.hd, n = hd / 32;
    if (unit >= p.Hq + 2 * p.Hkv) return;
    const uint16_t *row = p.qkv + (size_t)t * p.ld;
    const int pos = p.pos[t], tab = p.tab[t];
    if (unit >= p.Hq + p.Hkv) { /* v: copied as projected */
        const int i = unit - p.Hq - p.Hkv;
        const uint16_t *src = row + p.v_off + i * hd;
        uint16_t *dst = p.v_pool + paged_off(p.tables, tab, pos, i, p.Hkv, p.block, hd);
        for (int e = lane; e < hd; e += 32) dst[e] = src[e];
        return;
    }
    const bool is_q = unit < p.Hq;
    const uint16_t *src = is_q ? row + unit * p.q_hs : row + p.k_off + (unit - p.Hq) * hd;
    const float *w = is_q ? p.q_norm : p.k_norm;
    float x[8];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        x[i] = i < n ? bf16u(src[lane + 32 * i]) : 0.0f;
        ss += x[i] * x[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)hd + p.eps);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i >= n) break;
        const int e = lane + 32 * i;
        x[i] = norm_apply(x[i], r, w[e], p.norm_mode);
        buf[warp][e] = x[i];
    }
    __syncwarp();
    uint16_t *dst = is_q ? p.q_out + ((size_t)t * p.Hq + unit) * hd
                         : p.k_pool + paged_off(p.tables, tab, pos, unit - p.Hq, p.Hkv, p.block, hd);
    const int half = p.R / 2;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i >= n) break;
        const int e = lane + 32 * i;
        float y = x[i];
        if (e < p.R) {
            const int f = e < half ? e : e - half;
            float sn, cs;
            sincosf((float)pos * p.inv_freq[f], &sn, &cs);
            const float c = rbf(cs), s = rbf(sn);
            y = e < half ? rbf(rbf(x[i] * c) - rbf(buf[warp][e + half] * s))
                         : rbf(rbf(x[i] * c) + rbf(buf[warp][e - half] * s));
        }
        dst[e] = bf16_bits(y);
    }
}

extern "C" int cuda_paged_prep(const PagedPrepParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->hd % 32 || p->hd > 256 || p->hd < 32 || p->R < 2 || p->R % 2 || p->R > p->hd || p->Hq < 1 ||
        (p->norm_mode != NORM_ZC && p->norm_mode != NORM_PLAIN) || p->Hkv < 1 || p->block < 1 || p->T > 2147483647 ||
        (p->Hq + 2 * p->Hkv + 3) / 4 > 65535)
        return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)p->T, (unsigned)((p->Hq + 2 * p->Hkv + 3) / 4));
    return launch_kernel(paged_prep_rows, grid, dim3(128), 0, l, *p);
}

/* ---- paged attention ------------------------------------------------------------------------------------------- */

#define PA_WARPS 4

/* grid (Hq / G, rows), 128 threads: the CTA takes query heads j0 .. j0 + G - 1 (j0 = G blockIdx.x) of one row, all
 * reading kv head j0 / (Hq / Hkv) (G divides Hq / Hkv), so each K / V row is loaded once for the G heads and their G
 * warp reductions run side by side. Lane holds dims lane*EPL .. + EPL - 1 (EPL = hd / 32 <= 8) of each head's q and
 * running o and of each K / V row it reads (16 bytes per lane at hd 256: a row is one coalesced 512-byte read). Warp w
 * takes positions w, w + 4, ...; the warps are merged in order. A head's values do not depend on G. */
template <int G>
__global__ void __launch_bounds__(PA_WARPS * 32) paged_attn_rows(const __grid_constant__ PagedAttnParams p) {
    pdl_begin();
    __shared__ float sm_o[PA_WARPS][G * 256];
    __shared__ float sm_m[PA_WARPS][G], sm_l[PA_WARPS][G];
    const int j0 = blockIdx.x * G, t = p.rows ? p.rows[blockIdx.y] : (int)blockIdx.y, warp = threadIdx.x >> 5,
              lane = threadIdx.x & 31;
    const int hd = p.hd, epl = hd / 32, kvh = j0 / (p.Hq / p.Hkv), pos = p.pos[t], tab = p.tab[t];
    float q[G][8], o[G][8], m[G], lsum[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const uint16_t *qr = p.q + ((size_t)t * p.Hq + j0 + g) * hd + lane * epl;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            q[g][e] = e < epl ? bf16u(qr[e]) : 0.0f;
            o[g][e] = 0.0f;
        }
        m[g] = -1e30f;
        lsum[g] = 0.0f;
    }
    for (int s = warp; s <= pos; s += PA_WARPS) {
        const size_t off = paged_off(p.tables, tab, s, kvh, p.Hkv, p.block, hd) + (size_t)lane * epl;
        const uint16_t *kr = p.k_pool + off, *vr = p.v_pool + off;
        float k[8], v[8], d[G];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            k[e] = e < epl ? bf16u(kr[e]) : 0.0f;
            v[e] = e < epl ? bf16u(vr[e]) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            d[g] = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (e < epl) d[g] = fmaf(q[g][e], k[e], d[g]);
        }
#pragma unroll
        for (int g = 0; g < G; g++) d[g] = warp_sum(d[g]) * p.scale;
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float mn = fmaxf(m[g], d[g]), corr = expf(m[g] - mn), pr = expf(d[g] - mn);
            lsum[g] = fmaf(lsum[g], corr, pr);
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (e < epl) o[g][e] = fmaf(o[g][e], corr, pr * v[e]);
            m[g] = mn;
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            if (e < epl) sm_o[warp][g * hd + lane * epl + e] = o[g][e];
        if (lane == 0) sm_m[warp][g] = m[g], sm_l[warp][g] = lsum[g];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * hd; i += PA_WARPS * 32) {
        const int g = i / hd, dd = i - g * hd, j = j0 + g;
        float M = sm_m[0][g];
        for (int w = 1; w < PA_WARPS; w++) M = fmaxf(M, sm_m[w][g]);
        float L = 0.0f, acc = 0.0f;
        for (int w = 0; w < PA_WARPS; w++) {
            const float f = expf(sm_m[w][g] - M);
            L = fmaf(sm_l[w][g], f, L);
            acc = fmaf(sm_o[w][i], f, acc);
        }
        float y = rbf(acc * (1.0f / L));
        if (p.gate) y = rbf(y * rbf(sigmoid_acc(bf16u(p.gate[(size_t)t * p.gate_ld + (size_t)j * p.gate_hs + dd]))));
        p.out[(size_t)t * p.Hq * hd + (size_t)j * hd + dd] = bf16_bits(y);
    }
}

extern "C" int cuda_paged_attn(const PagedAttnParams *p, const CudaLaunch *l) {
    if (p->T < 1 || p->hd % 32 || p->hd < 32 || p->hd > 256 || p->Hq < 1 || p->Hkv < 1 || p->Hq % p->Hkv ||
        p->block < 1 || p->T > 65535)
        return (int)cudaErrorInvalidValue;
    const int Gq = p->Hq / p->Hkv, G = Gq % 8 == 0 ? 8 : Gq % 4 == 0 ? 4 : Gq % 2 == 0 ? 2 : 1;
    const dim3 grid((unsigned)(p->Hq / G), (unsigned)p->T), block(PA_WARPS * 32);
    switch (G) {
    case 8: return launch_kernel(paged_attn_rows<8>, grid, block, 0, l, *p);
    case 4: return launch_kernel(paged_attn_rows<4>, grid, block, 0, l, *p);
    case 2: return launch_kernel(paged_attn_rows<2>, grid, block, 0, l, *p);
    default: return launch_kernel(paged_attn_rows<1>, grid, block, 0, l, *p);
    }
}

/* ---- paged -> contiguous ---------------------------------------------------------------------------------------- */

/* grid (len, Hkv, 2), hd / 8 threads: 16 bytes each. */
__global__ void paged_gather_rows(const __grid_constant__ PagedGatherParams p) {
    pdl_begin();
    const int s = blockIdx.x, i = blockIdx.y, hd = p.hd;
    const uint16_t *pool = blockIdx.z ? p.v_pool : p.k_pool;
    uint16_t *out = blockIdx.z ? p.v_out : p.k_out;
    const uint4 *src = (const uint4 *)(pool + paged_off(p.table, 0, s, i, p.Hkv, p.block, hd));
    uint4 *dst = (uint4 *)(out + ((size_t)i * p.stride + s) * hd);
    for (int e = threadIdx.x; e < hd / 8; e += blockDim.x) dst[e] = src[e];
}

extern "C" int cuda_paged_gather(const PagedGatherParams *p, const CudaLaunch *l) {
    if (p->len < 1 || p->len > p->stride || p->Hkv < 1 || p->Hkv > 65535 || p->hd < 8 || p->hd % 8 || p->hd > 8192 ||
        p->block < 1 || ((uintptr_t)p->k_pool & 15) || ((uintptr_t)p->v_pool & 15) || ((uintptr_t)p->k_out & 15) ||
        ((uintptr_t)p->v_out & 15))
        return (int)cudaErrorInvalidValue;
    return launch_kernel(paged_gather_rows, dim3((unsigned)p->len, (unsigned)p->Hkv, 2), dim3((unsigned)(p->hd / 8)), 0,
                         l, *p);
}

/* ---- DeltaNet step over slots ---------------------------------------------------------------------------------- */

/* Two launches per layer (one CTA per row and head group, then the state pass), so the conv, norms and gates are done
 * once per row and head instead of once per column split:
 *   dn_batch_prep  grid (Hk, nd): conv over the ring + the new proj row, ring write, q^/k^ with their L2 norms, v,
 *                  beta / decay / k^.q^ -> the row's fp32 workspace (dn_ws_ld floats, layout in serve_ops.h);
 *   dn_batch_state grid (splits / NG, Hv, nd): the state slice S[dk][NG cols] of one head, the step's dots, delta,
 *                  o and the update.
 * Both use the launch shape of the decode step (deltanet.cuh dn_shape): prep runs with its thread count so that the
 * norm sums are the step's own (same per-thread fmaf chains and block_sum3 tree), and the state pass keeps its
 * thread / row / column mapping (DN_RPT rows x VEC columns per thread, tpr threads per row), so o and S are those of
 * the single-sequence decode step (deltanet.cu: same formulas, sums and fmaf order) bit for bit. */

/* floats per workspace row: q^ [Hk dk], k^ [Hk dk], v [Hv dv], beta [Hv], decay [Hv], kq [Hv]; a multiple of 4 */
static __host__ __device__ __forceinline__ int dn_ws_ld(int Hk, int Hv, int dk, int dv) {
    return (2 * Hk * dk + Hv * dv + 3 * Hv + 3) & ~3;
}

extern "C" size_t cuda_dn_batch_ws_bytes(int nd, int Hk, int Hv, int dk, int dv) {
    return nd < 1 || Hk < 1 ? 0 : sizeof(float) * (size_t)nd * dn_ws_ld(Hk, Hv, dk, dv);
}

/* conv_history's view of one slot's ring */
typedef struct SbConv {
    const float *conv_w;
    const uint16_t *conv_ring;
    int K;
} SbConv;

/* grid (Hk, nd), dn_shape threads. CTA (n, i): k-head n of row rows[i] and its r = Hv / Hk v-heads n r .. n r + r-1.
 * Channels: q n dk + d, k key_dim + n dk + d (d < dk), v 2 key_dim + n r dv + c (c < r dv); each is convolved
 *   c = bf16(silu(bf16(sum_{j<K-1} w[ch][j] m_{pos-K+1+j} + w[ch][K-1] m_pos)))
 * (conv_history + conv_finish), and the ring row pos % K gets m_pos. Then
 *   q^ = q rsqrt(sum q^2 + 1e-6) / sqrt(dk),  k^ = k rsqrt(sum k^2 + 1e-6),  kq = (sum q k) rq rk,
 * and dn_gates per v-head. Every channel is read and written by one thread only, and the history rows
 * (positions pos-K+1 .. pos-1) never include row pos % K, so the ring needs no ordering inside the grid. */
__global__ void dn_batch_prep(const __grid_constant__ DnBatchParams p) {
    pdl_begin();
    __shared__ float red3[96];
    const int dk = p.dk, dv = p.dv, Hv = p.Hv, r = Hv / p.Hk, tid = threadIdx.x, nt = blockDim.x;
    const int n = blockIdx.x, i = blockIdx.y;
    const int key_dim = p.Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;
    const int row = p.rows[i], slot = p.slot[i], pos = p.pos[row], rc = pos % p.K;
    uint16_t *ring = (uint16_t *)((char *)p.ring0 + (size_t)slot * p.stride), *ring_row = ring + (size_t)rc * conv_dim;
    const uint16_t *proj = p.proj + (size_t)row * p.ld_proj;
    const SbConv cv = {p.conv_w, ring, p.K};
    float *ws = p.ws + (size_t)i * dn_ws_ld(p.Hk, Hv, dk, dv);
    float *wq = ws + n * dk, *wk = ws + key_dim + n * dk, *wv = ws + 2 * key_dim + n * r * dv;
    const int qch0 = n * dk, kch0 = key_dim + n * dk, vch0 = 2 * key_dim + n * r * dv;

    float ssq = 0.0f, ssk = 0.0f, sqk = 0.0f;
    for (int d = tid; d < dk; d += nt) {
        float tq, tk;
        const float hq = conv_history(cv, conv_dim, qch0 + d, rc, &tq);
        const float hk = conv_history(cv, conv_dim, kch0 + d, rc, &tk);
        const float cq = conv_finish(hq, tq, bf16u(proj[qch0 + d])), ck = conv_finish(hk, tk, bf16u(proj[kch0 + d]));
        wq[d] = cq;
        wk[d] = ck;
        ssq = fmaf(cq, cq, ssq);
        ssk = fmaf(ck, ck, ssk);
        sqk = fmaf(cq, ck, sqk);
        ring_row[qch0 + d] = proj[qch0 + d];
        ring_row[kch0 + d] = proj[kch0 + d];
    }
    for (int c = tid; c < r * dv; c += nt) {
        float tv;
        const float hv = conv_history(cv, conv_dim, vch0 + c, rc, &tv);
        wv[c] = conv_finish(hv, tv, bf16u(proj[vch0 + c]));
        ring_row[vch0 + c] = proj[vch0 + c];
    }
    block_sum3(&ssq, &ssk, &sqk, red3);

    const float rq = rsqrtf(ssq + 1e-6f) * (1.0f / sqrtf((float)dk)), rk = rsqrtf(ssk + 1e-6f);
    for (int d = tid; d < dk; d += nt) { /* the values this thread wrote above */
        wq[d] *= rq;
        wk[d] *= rk;
    }
    const uint16_t *tail = proj + conv_dim + value_dim;
    float *wg = ws + 2 * key_dim + value_dim; /* beta [Hv], decay [Hv], kq [Hv] */
    for (int jj = tid; jj < r; jj += nt) {
        const int j = n * r + jj;
        dn_gates(bf16u(tail[j]), bf16u(tail[Hv + j]), p.dt_bias[j], p.A_log[j], &wg[j], &wg[Hv + j]);
        wg[2 * Hv + j] = sqk * rq * rk;
    }
}

typedef struct SbArgs {
    DnBatchParams p;
    int tpr, cols;
} SbArgs;

/* floats of dynamic shared memory of dn_batch_state: red_m, red_s [nw][NG cols]; dl [NG cols] */
static size_t sb_smem_bytes(const DnShape *s, int ng) {
    return sizeof(float) * (size_t)(2 * (s->threads / 32) + 1) * ng * s->cols;
}

/* grid (ceil(splits / NG), Hv, nd), dn_shape threads. CTA (x, j, i): head j of row rows[i] on slot slot[i], columns
 * e0 = x NG cols .. + NG cols of its state S[dk][dv]. Thread (rl, cg) = (tid / tpr, tid % tpr) holds state rows
 * rl + m nrl (m < DN_RPT, nrl = threads / tpr) at columns e0 + g cols + cg VEC .. + VEC (g < NG): NG groups of
 * the decode step's column split, each reduced exactly as there (dn_state_dots, then the warps in order):
 *   mem = S^T k^,  sq = S^T q^,  delta = beta (v - decay mem),
 *   o = bf16(decay sq + delta kq)  (= S_new^T q^ with S_new = decay S + k^ delta^T),  S <- decay S + k^ delta^T.
 * The state slice is this CTA's only large read; it is issued before the wait on dn_batch_prep (PDL contract 1:
 * state rows of earlier tokens; prep never touches S). */
template <int VEC, int NG>
__global__ void dn_batch_state(const __grid_constant__ SbArgs args) {
    const DnBatchParams &p = args.p;
    extern __shared__ float sm[];
    const int dk = p.dk, dv = p.dv, Hv = p.Hv, cols = args.cols, tpr = args.tpr, ccols = NG * cols;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wid = tid >> 5, nw = nt >> 5;
    const int j = blockIdx.y, n = j / (Hv / p.Hk), i = blockIdx.z;
    const int e0 = blockIdx.x * ccols, nrl = nt / tpr, cg = tid % tpr, rl = tid / tpr;
    float *red_m = sm, *red_s = red_m + nw * ccols, *dl = red_s + nw * ccols;

    float *Sh = (float *)((char *)p.S0 + (size_t)p.slot[i] * p.stride) + (size_t)j * dk * dv;
    float s[NG][DN_RPT][VEC];
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int c0 = e0 + g * cols + cg * VEC;
#pragma unroll
        for (int m = 0; m < DN_RPT; m++) {
            const int d = rl + m * nrl;
            if (d < dk && c0 < dv)
                ld_vec<VEC>(Sh + (size_t)d * dv + c0, s[g][m]);
            else
#pragma unroll
                for (int v = 0; v < VEC; v++) s[g][m][v] = 0.0f;
        }
    }
    pdl_begin();

    const int key_dim = p.Hk * dk, value_dim = Hv * dv;
    const float *ws = p.ws + (size_t)i * dn_ws_ld(p.Hk, Hv, dk, dv);
    const float *wq = ws + n * dk, *wk = ws + key_dim + n * dk, *wv = ws + 2 * key_dim + j * dv;
    const float *wg = ws + 2 * key_dim + value_dim;
    float kd[DN_RPT], qd[DN_RPT];
#pragma unroll
    for (int m = 0; m < DN_RPT; m++) {
        const int d = rl + m * nrl;
        kd[m] = d < dk ? wk[d] : 0.0f;
        qd[m] = d < dk ? wq[d] : 0.0f;
    }
    const float beta = wg[j], decay = wg[Hv + j], kq = wg[2 * Hv + j];

#pragma unroll
    for (int g = 0; g < NG; g++) {
        float mem[VEC], sq[VEC];
        dn_state_dots<DN_RPT, VEC>(s[g], kd, qd, tpr, mem, sq);
        if (lane < tpr)
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                red_m[wid * ccols + g * cols + cg * VEC + v] = mem[v];
                red_s[wid * ccols + g * cols + cg * VEC + v] = sq[v];
            }
    }
    __syncthreads();
    uint16_t *orow = p.o + (size_t)p.rows[i] * value_dim + (size_t)j * dv;
    for (int c = tid; c < ccols && e0 + c < dv; c += nt) {
        float mm = 0.0f, q = 0.0f;
        for (int w = 0; w < nw; w++) mm += red_m[w * ccols + c], q += red_s[w * ccols + c];
        const float delta = beta * (wv[e0 + c] - decay * mm);
        dl[c] = delta;
        orow[e0 + c] = bf16_bits(fmaf(delta, kq, decay * q));
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int c0 = e0 + g * cols + cg * VEC;
#pragma unroll
        for (int m = 0; m < DN_RPT; m++) {
            const int d = rl + m * nrl;
            if (d < dk && c0 < dv) {
                float t[VEC];
#pragma unroll
                for (int v = 0; v < VEC; v++) t[v] = fmaf(kd[m], dl[g * cols + cg * VEC + v], decay * s[g][m][v]);
                st_vec<VEC>(Sh + (size_t)d * dv + c0, t);
            }
        }
    }
}

extern "C" int cuda_dn_batch_step(const DnBatchParams *p, const CudaLaunch *l) {
    DnShape sh;
    if (!p || !l || !p->proj || !p->conv_w || !p->A_log || !p->dt_bias || !p->S0 || !p->ring0 || !p->rows || !p->slot ||
        !p->pos || !p->o || !p->ws || ((uintptr_t)p->ws & 15) || p->nd < 1 || p->nd > 65535 || p->Hk < 1 || p->Hv < 1 ||
        p->Hv % p->Hk || p->K < 1 || p->Hk > 65535 || p->Hv > 65535 || dn_shape(p->dk, p->dv, &sh))
        return (int)cudaErrorInvalidValue;
    const dim3 block((unsigned)sh.threads, 1, 1);
    int rc = launch_kernel(dn_batch_prep, dim3((unsigned)p->Hk, (unsigned)p->nd), block, 0, l, *p);
    if (rc) return rc;
    SbArgs a;
    a.p = *p;
    a.tpr = sh.tpr;
    a.cols = sh.cols;
    /* two column groups per CTA when the splits pair up: half the CTAs, twice the state loads in flight per thread */
    const int ng = sh.splits % 2 == 0 ? 2 : 1;
    const dim3 grid((unsigned)(sh.splits / ng), (unsigned)p->Hv, (unsigned)p->nd);
    const size_t smem = sb_smem_bytes(&sh, ng);
    if (sh.vec == 4)
        return ng == 2 ? launch_kernel(dn_batch_state<4, 2>, grid, block, smem, l, a)
                       : launch_kernel(dn_batch_state<4, 1>, grid, block, smem, l, a);
    return ng == 2 ? launch_kernel(dn_batch_state<1, 2>, grid, block, smem, l, a)
                   : launch_kernel(dn_batch_state<1, 1>, grid, block, smem, l, a);
}

/* grid (Hv, nd), 128 threads. */
__global__ void __launch_bounds__(128) dn_gated_norm_rows(const __grid_constant__ DnGatedNormParams p) {
    pdl_begin();
    __shared__ float red[32];
    const int j = blockIdx.x, row = p.rows[blockIdx.y], dv = p.dv;
    const uint16_t *o = p.o + (size_t)row * p.Hv * dv + (size_t)j * dv;
    const uint16_t *z = p.proj + (size_t)row * p.ld_proj + p.z_off + (size_t)j * dv;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dv; c += 128) ss = fmaf(bf16u(o[c]), bf16u(o[c]), ss);
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / (float)dv + p.eps);
    uint16_t *y = p.y + (size_t)row * p.Hv * dv + (size_t)j * dv;
    for (int c = threadIdx.x; c < dv; c += 128) {
        const float u = rbf(bf16u(o[c]) * rstd), wu = rbf(p.norm_w[c] * u);
        y[c] = bf16_bits(wu * silu_acc(bf16u(z[c])));
    }
}

extern "C" int cuda_dn_gated_norm_rows(const DnGatedNormParams *p, const CudaLaunch *l) {
    if (p->nd < 1 || p->nd > 65535 || p->Hv < 1 || p->dv < 1) return (int)cudaErrorInvalidValue;
    return launch_kernel(dn_gated_norm_rows, dim3((unsigned)p->Hv, (unsigned)p->nd), dim3(128), 0, l, *p);
}

/* grid n, 128 threads. */
__global__ void __launch_bounds__(128) gather_rows_f32(const __grid_constant__ GatherRowsParams p) {
    pdl_begin();
    const float *x = p.x + (size_t)p.rows[blockIdx.x] * p.D;
    float *y = p.y + (size_t)blockIdx.x * p.D;
    for (int i = threadIdx.x; i < p.D; i += 128) y[i] = x[i];
}

extern "C" int cuda_gather_rows(const GatherRowsParams *p, const CudaLaunch *l) {
    if (p->n < 1 || p->D < 1) return (int)cudaErrorInvalidValue;
    return launch_kernel(gather_rows_f32, dim3((unsigned)p->n), dim3(128), 0, l, *p);
}

/* ---- the greedy pick of the logits rows -------------------------------------------------------------------------- */

__global__ void __launch_bounds__(1024) rows_argmax_f32(const __grid_constant__ RowsArgmaxParams p) {
    __shared__ ArgMax am_s[32];
    const float *x = p.x + (size_t)blockIdx.x * p.cols;
    pdl_wait();
    ArgMax best = {-INFINITY, INT_MAX};
    for (int i = threadIdx.x; i < p.n_valid; i += blockDim.x) best = argmax_better(best, ArgMax{x[i], i});
    best = warp_argmax(best);
    if ((threadIdx.x & 31) == 0) am_s[threadIdx.x >> 5] = best;
    __syncthreads();
    pdl_trigger();
    if (threadIdx.x != 0) return;
    ArgMax b = am_s[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) b = argmax_better(b, am_s[w]);
    p.out[blockIdx.x] = b.i == INT_MAX ? 0 : b.i; /* every value NaN: 0, as sampler_argmax */
}

extern "C" int cuda_rows_argmax(const RowsArgmaxParams *p, const CudaLaunch *l) {
    if (!p->x || !p->out || p->rows < 1 || p->cols < 1 || p->n_valid < 1 || p->n_valid > p->cols)
        return (int)cudaErrorInvalidValue;
    return launch_kernel(rows_argmax_f32, dim3((unsigned)p->rows), dim3(1024), 0, l, *p);
}
