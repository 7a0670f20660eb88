/* deltanet.cu — Gated DeltaNet decode step (MODEL.md §3.3, §3.5, numerics §4.1): causal depthwise
 * conv (ring state) + SiLU, per-head l2norm of q/k, gates beta/g, the delta-rule update of the fp32
 * state S [Hv][dk][dv], o = S^T q^, and the gated RMSNorm, fused in one kernel between the stacked
 * in_proj GEMV and out_proj. Contract and formulas: ops.h (DeltanetStepParams).
 *
 * Work split: block (s, j) owns columns [s*cols, (s+1)*cols) of v-head j's state; it re-derives the
 * (cheap) conv + l2norm of its k/q head so blocks need no data from each other, except the gated
 * norm's sum over all dv columns, exchanged inside the head's thread-block cluster (sm_90 DSMEM).
 * State slice stays in registers: thread (row lane rl, column group cg) holds rows rl + i*nrl
 * (i < DN_RPT) x VEC columns, and computes the conv of exactly the q/k rows and v columns it needs
 * (redundantly across the threads that share them: a few FMAs), so that one block barrier suffices:
 *   mk = S^T k,  mq = S^T q  (raw conv outputs; the l2norm factors are per-head scalars applied after)
 *   delta = beta (v - decay rk mk),  o = decay rq mq + delta (k^ . q^),  S' = decay S + k^ delta^T.
 * Barriers after the dependency wait: one __syncthreads (cross-warp sums) and one cluster barrier (each
 * block pushes its sum of o^2 into every block of the head's cluster, so nothing is read remotely and no
 * trailing barrier is needed). */
#include "cuda/cluster.cuh"

enum { DN_RPT = 4, DN_MAX_SPLIT = 8, DN_MAX_THREADS = 512 };

/* Launch shape for (dk, dv): VEC columns per thread (4 when dv % 4 == 0), tpr threads per state row
 * (a power of two <= 32), cols = tpr*VEC columns per block, splits = blocks (= cluster size) per head. */
typedef struct DnShape {
    int vec, tpr, cols, splits, threads;
} DnShape;

static int dn_shape(int dk, int dv, DnShape *s) {
    if (dk < 1 || dv < 1 || dk > 1024 || dv > 1024) return -1;
    s->vec = dv % 4 == 0 ? 4 : 1;
    const int want = ceil_div(ceil_div(dv, DN_MAX_SPLIT), s->vec);
    int tpr = 1;
    while (tpr < want) tpr <<= 1;
    if (tpr > 32) return -1;
    s->tpr = tpr;
    s->cols = tpr * s->vec;
    s->splits = ceil_div(dv, s->cols);
    s->threads = ceil_div(tpr * ceil_div(dk, DN_RPT), 32) * 32;
    return s->threads > DN_MAX_THREADS ? -1 : 0;
}

/* floats of dynamic shared memory: red_m, red_s [nw][cols]; red3 [96]; parts [DN_MAX_SPLIT] */
static size_t dn_smem_bytes(const DnShape *s) {
    const int nw = s->threads / 32;
    return sizeof(float) * ((size_t)2 * nw * s->cols + 96 + DN_MAX_SPLIT);
}

typedef struct DnArgs {
    DeltanetStepParams p;
    int tpr, cols;
} DnArgs;

/* ---- small math (accurate expf: these values are rounded to bf16 right after) ----------------- */

__device__ __forceinline__ float dn_silu(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ uint16_t bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

template <int VEC>
__device__ __forceinline__ void ld_vec(const float *src, float *d) {
    if (VEC == 4) {
        const float4 t = *reinterpret_cast<const float4 *>(src);
        d[0] = t.x, d[1] = t.y, d[2] = t.z, d[3] = t.w;
    } else {
        d[0] = *src;
    }
}
template <int VEC>
__device__ __forceinline__ void st_vec(float *dst, const float *s) {
    if (VEC == 4)
        *reinterpret_cast<float4 *>(dst) = make_float4(s[0], s[1], s[2], s[3]);
    else
        *dst = s[0];
}

/* History part of the causal conv for channel ch: sum_{j<K-1} w[ch][j] m_{pos-(K-1)+j}[ch]; row of
 * position pos-(K-1)+j in the ring is (pos+1+j) mod K. *tap = w[ch][K-1] (multiplies the current m). */
__device__ __forceinline__ float conv_history(const DeltanetStepParams &p, int conv_dim, int ch, int rc,
                                              float *tap) {
    const float *w = p.conv_w + (size_t)ch * p.K;
    float acc = 0.0f;
#pragma unroll 4
    for (int j = 0; j < p.K - 1; j++) {
        int row = rc + 1 + j;
        row -= row >= p.K ? p.K : 0;
        acc = fmaf(w[j], bf16u(p.conv_ring[(size_t)row * conv_dim + ch]), acc);
    }
    *tap = w[p.K - 1];
    return acc;
}
/* c = bf16(silu(bf16(conv))) with conv = history + tap*x (HF bf16 conv1d, then bf16 SiLU). */
__device__ __forceinline__ float conv_finish(float hist, float tap, float x) {
    return rbf(dn_silu(rbf(fmaf(tap, x, hist))));
}

/* grid (splits, Hv), cluster (splits, 1, 1), block tpr * nrl threads. */
template <int VEC>
__global__ void __launch_bounds__(DN_MAX_THREADS) deltanet_step_f32_cluster(const __grid_constant__ DnArgs args) {
    const DeltanetStepParams &p = args.p;
    extern __shared__ float sm[];
    const int dk = p.dk, dv = p.dv, Hv = p.Hv, cols = args.cols, tpr = args.tpr;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wid = tid >> 5, nw = nt >> 5;
    const int split = blockIdx.x, n_splits = gridDim.x, j = blockIdx.y, n = j / (Hv / p.Hk);
    const int key_dim = p.Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;
    const int e0 = split * cols, ncols = min(cols, dv - e0);
    const int nrl = nt / tpr, cg = tid % tpr, rl = tid / tpr;
    const bool col_ok = cg * VEC < ncols; /* VEC = 4: dv % 4 == 0, so all 4 columns exist */
    const bool head_row = rl == 0;        /* the tpr threads (warp 0) that finish this block's columns */
    float *red_m = sm, *red_s = red_m + nw * cols, *red3 = red_s + nw * cols, *parts = red3 + 96;

    cluster_arrive_relaxed(); /* phase 1 (this block has started), waited on before the push below */

    /* 1. Before the dependency wait: only data of earlier tokens and weights (PDL contract): the state
     *    slice, the history part of the conv of this thread's q/k rows and v columns, small weights. */
    float s[DN_RPT][VEC];
    float *Sh = p.S + (size_t)j * dk * dv;
#pragma unroll
    for (int i = 0; i < DN_RPT; i++) {
        const int d = rl + i * nrl;
        if (d < dk && col_ok)
            ld_vec<VEC>(Sh + (size_t)d * dv + e0 + cg * VEC, s[i]);
        else
#pragma unroll
            for (int v = 0; v < VEC; v++) s[i][v] = 0.0f;
    }
    const int pos = p.step->pos, rc = pos % p.K;
    const int qch0 = n * dk, kch0 = key_dim + n * dk, vch0 = 2 * key_dim + j * dv + e0 + cg * VEC;
    float hq[DN_RPT], hk[DN_RPT], tq[DN_RPT], tk[DN_RPT], hv[VEC], tv[VEC], wn[VEC];
#pragma unroll
    for (int i = 0; i < DN_RPT; i++) {
        const int d = rl + i * nrl;
        hq[i] = hk[i] = tq[i] = tk[i] = 0.0f;
        if (d < dk) {
            hq[i] = conv_history(p, conv_dim, qch0 + d, rc, &tq[i]);
            hk[i] = conv_history(p, conv_dim, kch0 + d, rc, &tk[i]);
        }
    }
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        hv[v] = tv[v] = wn[v] = 0.0f;
        if (col_ok) {
            hv[v] = conv_history(p, conv_dim, vch0 + v, rc, &tv[v]);
            if (head_row) wn[v] = p.norm_w[e0 + cg * VEC + v];
        }
    }
    const float A_log = p.A_log[j], dt_bias = p.dt_bias[j];

    pdl_wait();
    pdl_trigger();

    /* 2. Current inputs (one round of independent L2 loads), conv + SiLU, ring row of this position
     *    (q/k rows by one block per k-head, v columns by their owner). */
    const float *tail = p.proj + conv_dim + value_dim;
    const float b_in = tail[j], a_in = tail[Hv + j];
    float xq[DN_RPT], xk[DN_RPT], xv[VEC], zv[VEC];
#pragma unroll
    for (int i = 0; i < DN_RPT; i++) {
        const int d = rl + i * nrl;
        xq[i] = d < dk ? p.proj[qch0 + d] : 0.0f;
        xk[i] = d < dk ? p.proj[kch0 + d] : 0.0f;
    }
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        xv[v] = col_ok ? p.proj[vch0 + v] : 0.0f;
        zv[v] = col_ok && head_row ? p.proj[conv_dim + j * dv + e0 + cg * VEC + v] : 0.0f;
    }
    uint16_t *ring_row = p.conv_ring + (size_t)rc * conv_dim;
    const bool qk_writer = split == 0 && j % (Hv / p.Hk) == 0 && cg == 0;
    float cq[DN_RPT], ck[DN_RPT], ssq = 0.0f, ssk = 0.0f, sqk = 0.0f;
#pragma unroll
    for (int i = 0; i < DN_RPT; i++) {
        const int d = rl + i * nrl;
        cq[i] = d < dk ? conv_finish(hq[i], tq[i], xq[i]) : 0.0f;
        ck[i] = d < dk ? conv_finish(hk[i], tk[i], xk[i]) : 0.0f;
        if (cg == 0) ssq = fmaf(cq[i], cq[i], ssq), ssk = fmaf(ck[i], ck[i], ssk), sqk = fmaf(cq[i], ck[i], sqk);
        if (qk_writer && d < dk) ring_row[qch0 + d] = bf16_bits(xq[i]), ring_row[kch0 + d] = bf16_bits(xk[i]);
    }
    float cv[VEC];
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        cv[v] = conv_finish(hv[v], tv[v], xv[v]);
        if (col_ok && head_row) ring_row[vch0 + v] = bf16_bits(xv[v]);
    }

    /* 3. mk = S^T k, mq = S^T q over this thread's rows, then the warp's rows (lanes of equal cg), then
     *    the block (shared memory, the one block barrier); the l2norm sums likewise. */
    float mk[VEC], mq[VEC];
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int i = 0; i < DN_RPT; i++) a = fmaf(s[i][v], ck[i], a), b = fmaf(s[i][v], cq[i], b);
        for (int o = 16; o >= tpr; o >>= 1)
            a += __shfl_xor_sync(0xffffffffu, a, o), b += __shfl_xor_sync(0xffffffffu, b, o);
        mk[v] = a, mq[v] = b;
    }
    ssq = warp_sum(ssq), ssk = warp_sum(ssk), sqk = warp_sum(sqk);
    if (lane < tpr)
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            red_m[wid * cols + cg * VEC + v] = mk[v];
            red_s[wid * cols + cg * VEC + v] = mq[v];
        }
    if (lane == 0) red3[wid] = ssq, red3[32 + wid] = ssk, red3[64 + wid] = sqk;
    __syncthreads();
    ssq = ssk = sqk = 0.0f;
    for (int w = 0; w < nw; w++) ssq += red3[w], ssk += red3[32 + w], sqk += red3[64 + w];
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        float a = 0.0f, b = 0.0f;
        for (int w = 0; w < nw; w++) a += red_m[w * cols + cg * VEC + v], b += red_s[w * cols + cg * VEC + v];
        mk[v] = a, mq[v] = b;
    }

    /* 4. l2norm factors, gates, delta and o of this thread's columns, S' = decay S + k^ delta^T. */
    const float rq = rsqrtf(ssq + 1e-6f) * (1.0f / sqrtf((float)dk)), rk = rsqrtf(ssk + 1e-6f);
    const float kq = sqk * rq * rk; /* k^ . q^ */
    const float beta = rbf(1.0f / (1.0f + expf(-b_in)));
    const float xa = a_in + dt_bias;
    const float decay = expf(-expf(A_log) * (xa > 20.0f ? xa : log1pf(expf(xa))));
    float dl[VEC], ob[VEC];
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        dl[v] = beta * (cv[v] - decay * (mk[v] * rk));
        ob[v] = rbf(fmaf(dl[v], kq, decay * (mq[v] * rq)));
    }
#pragma unroll
    for (int i = 0; i < DN_RPT; i++) {
        const int d = rl + i * nrl;
        if (d < dk && col_ok) {
            const float kd = ck[i] * rk;
            float t[VEC];
#pragma unroll
            for (int v = 0; v < VEC; v++) t[v] = fmaf(kd, dl[v], decay * s[i][v]);
            st_vec<VEC>(Sh + (size_t)d * dv + e0 + cg * VEC, t);
        }
    }

    /* 5. Gated RMSNorm: this block's sum of bf16(o)^2 (lanes < tpr of warp 0, fixed order) pushed into
     *    slot `split` of every block of the cluster; after the barrier each block sums the slots in rank
     *    order, so all get the same value. */
    float ss = 0.0f;
    if (wid == 0) {
        if (head_row && col_ok)
#pragma unroll
            for (int v = 0; v < VEC; v++) ss = fmaf(ob[v], ob[v], ss);
        for (int o = 1; o < tpr; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    }
    cluster_wait(); /* phase 1: every block of the cluster runs */
    if (tid == 0)
        for (int r = 0; r < n_splits; r++) st_dsmem(&parts[split], (unsigned)r, ss);
    cluster_arrive_release();
    cluster_wait(); /* phase 2: parts[] complete */
    if (head_row && col_ok) {
        float tot = 0.0f;
        for (int r = 0; r < n_splits; r++) tot += parts[r];
        const float rstd = rsqrtf(tot / (float)dv + p.eps);
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            const size_t e = (size_t)j * dv + e0 + cg * VEC + v;
            const float u = rbf(ob[v] * rstd), wu = rbf(wn[v] * u);
            p.y[e] = rbf(wu * dn_silu(zv[v]));
            if (p.o) p.o[e] = ob[v];
        }
    }
}

extern "C" size_t cuda_deltanet_conv_ring_bytes(int Hk, int Hv, int dk, int dv, int K) {
    return (size_t)K * (size_t)(2 * Hk * dk + Hv * dv) * 2;
}

extern "C" int cuda_deltanet_step(const DeltanetStepParams *p, const CudaLaunch *l) {
    DnShape sh;
    if (!p || !l || !p->proj || !p->conv_w || !p->conv_ring || !p->A_log || !p->dt_bias || !p->norm_w || !p->S ||
        !p->y || !p->step || p->Hk < 1 || p->Hv < 1 || p->Hv % p->Hk || p->K < 1 || p->Hv > 65535 ||
        dn_shape(p->dk, p->dv, &sh))
        return (int)cudaErrorInvalidValue;
    DnArgs a;
    a.p = *p;
    a.tpr = sh.tpr;
    a.cols = sh.cols;
    const dim3 grid((unsigned)sh.splits, (unsigned)p->Hv), block((unsigned)sh.threads);
    const size_t smem = dn_smem_bytes(&sh);
    return sh.vec == 4 ? launch_cluster(deltanet_step_f32_cluster<4>, grid, block, smem, (unsigned)sh.splits, l, a)
                       : launch_cluster(deltanet_step_f32_cluster<1>, grid, block, smem, (unsigned)sh.splits, l, a);
}
