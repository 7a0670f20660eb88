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

/* The step kernel's launch shape (deltanet.cuh dn_shape): DN_RPT state rows per thread, VEC columns. */
/* floats of dynamic shared memory: pq,pk,tq,tk [dk]; pv,tv,dl [cols]; red_m,red_s [nw][cols]; red3 [96] */
static size_t sb_smem_bytes(int dk, const DnShape *s) {
    const int nw = s->threads / 32;
    return sizeof(float) * ((size_t)4 * dk + 3 * s->cols + 2 * nw * s->cols + 96);
}

typedef struct SbArgs {
    DnBatchParams p;
    int tpr, cols;
} SbArgs;

/* conv_history's view of one slot's ring */
typedef struct SbConv {
    const float *conv_w;
    const uint16_t *conv_ring;
    int K;
} SbConv;

/* grid (splits, Hv, nd); deltanet_step_f32_cluster<VEC, GO = true> with a row / slot dimension. */
template <int VEC>
__global__ void dn_batch_step(const __grid_constant__ SbArgs args) {
    const DnBatchParams &p = args.p;
    extern __shared__ float sm[];
    const int dk = p.dk, dv = p.dv, Hv = p.Hv, cols = args.cols, tpr = args.tpr;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wid = tid >> 5, nw = nt >> 5;
    const int split = blockIdx.x, j = blockIdx.y, n = j / (Hv / p.Hk);
    const int key_dim = p.Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;
    const int e0 = split * cols, ncols = min(cols, dv - e0);
    const int nrl = nt / tpr, cg = tid % tpr, rl = tid / tpr;
    const bool col_ok = cg * VEC < ncols;

    float *pq = sm, *pk = pq + dk, *tq = pk + dk, *tk = tq + dk;
    float *pv = tk + dk, *tv = pv + cols, *dl = tv + cols;
    float *red_m = dl + cols, *red_s = red_m + nw * cols, *red3 = red_s + nw * cols;

    pdl_begin();
    const int row = p.rows[blockIdx.z], slot = p.slot[blockIdx.z], pos = p.pos[row];
    float *S = (float *)((char *)p.S0 + (size_t)slot * p.stride);
    uint16_t *ring = (uint16_t *)((char *)p.ring0 + (size_t)slot * p.stride);
    const uint16_t *proj = p.proj + (size_t)row * p.ld_proj;
    const SbConv cv = {p.conv_w, ring, p.K};

    float s[DN_RPT][VEC];
    float *Sh = S + (size_t)j * dk * dv;
#pragma unroll
    for (int i = 0; i < DN_RPT; i++) {
        const int d = rl + i * nrl;
        if (d < dk && col_ok)
            ld_vec<VEC>(Sh + (size_t)d * dv + e0 + cg * VEC, s[i]);
        else
#pragma unroll
            for (int v = 0; v < VEC; v++) s[i][v] = 0.0f;
    }
    const int rc = pos % p.K;
    const int qch0 = n * dk, kch0 = key_dim + n * dk, vch0 = 2 * key_dim + j * dv + e0;
    for (int d = tid; d < dk; d += nt) {
        pq[d] = conv_history(cv, conv_dim, qch0 + d, rc, &tq[d]);
        pk[d] = conv_history(cv, conv_dim, kch0 + d, rc, &tk[d]);
    }
    for (int c = tid; c < ncols; c += nt) pv[c] = conv_history(cv, conv_dim, vch0 + c, rc, &tv[c]);
    const float A_log = p.A_log[j], dt_bias = p.dt_bias[j];
    /* every block read the ring rows it needs before any block of this row writes row rc: the writes go to row
     * pos % K, which the reads (rows of positions pos - K + 1 .. pos - 1) never touch */

    const uint16_t *tail = proj + conv_dim + value_dim;
    const float b_in = bf16u(tail[j]), a_in = bf16u(tail[Hv + j]);
    uint16_t *ring_row = ring + (size_t)rc * conv_dim;
    const bool qk_writer = split == 0 && j % (Hv / p.Hk) == 0;
    float ssq = 0.0f, ssk = 0.0f, sqk = 0.0f;
    for (int d = tid; d < dk; d += nt) {
        const float xq = bf16u(proj[qch0 + d]), xk = bf16u(proj[kch0 + d]);
        const float cq = conv_finish(pq[d], tq[d], xq), ck = conv_finish(pk[d], tk[d], xk);
        pq[d] = cq;
        pk[d] = ck;
        ssq = fmaf(cq, cq, ssq);
        ssk = fmaf(ck, ck, ssk);
        sqk = fmaf(cq, ck, sqk);
        if (qk_writer) ring_row[qch0 + d] = proj[qch0 + d], ring_row[kch0 + d] = proj[kch0 + d];
    }
    for (int c = tid; c < ncols; c += nt) {
        const float xv = bf16u(proj[vch0 + c]);
        pv[c] = conv_finish(pv[c], tv[c], xv);
        ring_row[vch0 + c] = proj[vch0 + c];
    }
    block_sum3(&ssq, &ssk, &sqk, red3);

    const float rq = rsqrtf(ssq + 1e-6f) * (1.0f / sqrtf((float)dk)), rk = rsqrtf(ssk + 1e-6f);
    const float kq = sqk * rq * rk;
    float beta, decay;
    dn_gates(b_in, a_in, dt_bias, A_log, &beta, &decay);

    float kd[DN_RPT], qd[DN_RPT], mem[VEC], sq[VEC];
#pragma unroll
    for (int i = 0; i < DN_RPT; i++) {
        const int d = rl + i * nrl;
        kd[i] = d < dk ? pk[d] * rk : 0.0f;
        qd[i] = d < dk ? pq[d] * rq : 0.0f;
    }
    dn_state_dots<DN_RPT, VEC>(s, kd, qd, tpr, mem, sq);
    if (lane < tpr)
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            red_m[wid * cols + cg * VEC + v] = mem[v];
            red_s[wid * cols + cg * VEC + v] = sq[v];
        }
    __syncthreads();
    uint16_t *orow = p.o + (size_t)row * value_dim + (size_t)j * dv + e0;
    for (int c = tid; c < ncols; c += nt) {
        float mm = 0.0f, q = 0.0f;
        for (int w = 0; w < nw; w++) mm += red_m[w * cols + c], q += red_s[w * cols + c];
        const float delta = beta * (pv[c] - decay * mm);
        dl[c] = delta;
        orow[c] = bf16_bits(fmaf(delta, kq, decay * q));
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < DN_RPT; i++) {
        const int d = rl + i * nrl;
        if (d < dk && col_ok) {
            float t[VEC];
#pragma unroll
            for (int v = 0; v < VEC; v++) t[v] = fmaf(kd[i], dl[cg * VEC + v], decay * s[i][v]);
            st_vec<VEC>(Sh + (size_t)d * dv + e0 + cg * VEC, t);
        }
    }
}

extern "C" int cuda_dn_batch_step(const DnBatchParams *p, const CudaLaunch *l) {
    DnShape sh;
    if (!p || !l || !p->proj || !p->conv_w || !p->A_log || !p->dt_bias || !p->S0 || !p->ring0 || !p->rows || !p->slot ||
        !p->pos || !p->o || p->nd < 1 || p->nd > 65535 || p->Hk < 1 || p->Hv < 1 || p->Hv % p->Hk || p->K < 1 ||
        p->Hv > 65535 || dn_shape(p->dk, p->dv, &sh))
        return (int)cudaErrorInvalidValue;
    SbArgs a;
    a.p = *p;
    a.tpr = sh.tpr;
    a.cols = sh.cols;
    const dim3 grid((unsigned)sh.splits, (unsigned)p->Hv, (unsigned)p->nd), block((unsigned)sh.threads, 1, 1);
    const size_t smem = sb_smem_bytes(p->dk, &sh);
    return sh.vec == 4 ? launch_kernel(dn_batch_step<4>, grid, block, smem, l, a)
                       : launch_kernel(dn_batch_step<1>, grid, block, smem, l, a);
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
