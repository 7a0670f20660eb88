/* deltanet.cu — Gated DeltaNet decode step (MODEL.md §3.3, §3.5, numerics §4.1): causal depthwise
 * conv (ring state) + SiLU, per-head l2norm of q/k, gates beta/g, the delta-rule update of the fp32
 * state S [Hv][dk][dv], o = S^T q^, and the gated RMSNorm, fused in one kernel between the stacked
 * in_proj GEMV and out_proj. Contract and formulas: ops.h (DeltanetStepParams).
 *
 * Work split: block (s, j) owns columns [s*cols, (s+1)*cols) of v-head j's state; it re-derives the
 * (cheap) conv + l2norm of its k/q head so blocks need no data from each other, except the gated
 * norm's sum over all dv columns, exchanged inside the head's thread-block cluster (sm_90 DSMEM).
 * State slice stays in registers: thread (row lane rl, column group cg) holds rows rl + i*nrl
 * (i < DN_RPT) x VEC columns. Per column:
 *   mem = S^T k^,  sq = S^T q^   (one pass over the undecayed S, scaled by decay after)
 *   delta = beta (v - decay mem),  o = decay sq + delta (k^ . q^),  S' = decay S + k^ delta^T.
 * With p.gated_out (the engine's default where out_proj's splits keep whole heads) the blocks write o and stop before the gated norm, which
 * out_proj computes (ops.h MV_IN_GATED): no exchange between blocks, so no cluster. */
#include <stdlib.h>

#include "cuda/cluster.cuh"
#include "cuda/common.cuh"
#include "cuda/deltanet.cuh"

/* floats of dynamic shared memory: pq,pk,tq,tk [dk]; pv,tv,zs,wn,dl,ob [cols]; red_m,red_s [nw][cols];
 * red3 [96]; part [1] */
static size_t dn_smem_bytes(int dk, const DnShape *s) {
    const int nw = s->threads / 32;
    return sizeof(float) * ((size_t)4 * dk + 6 * s->cols + 2 * nw * s->cols + 96 + 1);
}

typedef struct DnArgs {
    DeltanetStepParams p;
    int tpr, cols;
} DnArgs;

/* grid (splits, Hv), cluster (splits, 1, 1), block tpr * nrl threads. GO (p.gated_out): no
 * cluster; the block writes its o columns and leaves the gated norm to out_proj (ops.h MV_IN_GATED). */
template <int VEC, bool GO>
__global__ void deltanet_step_f32_cluster(const __grid_constant__ DnArgs args) {
    const DeltanetStepParams &p = args.p;
    extern __shared__ float sm[];
    const int dk = p.dk, dv = p.dv, Hv = p.Hv, cols = args.cols, tpr = args.tpr;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wid = tid >> 5, nw = nt >> 5;
    const int split = blockIdx.x, j = blockIdx.y, n = j / (Hv / p.Hk);
    const int key_dim = p.Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;
    const int e0 = split * cols, ncols = min(cols, dv - e0);
    const int nrl = nt / tpr, cg = tid % tpr, rl = tid / tpr;
    const bool col_ok = cg * VEC < ncols; /* VEC = 4: dv % 4 == 0, so all 4 columns exist */
    Q35_TRACE_T0;

    float *pq = sm, *pk = pq + dk, *tq = pk + dk, *tk = tq + dk; /* pq/pk become q/k after the conv */
    float *pv = tk + dk, *tv = pv + cols, *zs = tv + cols, *wn = zs + cols, *dl = wn + cols, *ob = dl + cols;
    float *red_m = ob + cols, *red_s = red_m + nw * cols, *red3 = red_s + nw * cols, *part = red3 + 96;

    /* 1. Before the dependency wait: only data of earlier tokens and weights (PDL contract). */
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
    const int qch0 = n * dk, kch0 = key_dim + n * dk, vch0 = 2 * key_dim + j * dv + e0;
    for (int d = tid; d < dk; d += nt) {
        pq[d] = conv_history(p, conv_dim, qch0 + d, rc, &tq[d]);
        pk[d] = conv_history(p, conv_dim, kch0 + d, rc, &tk[d]);
    }
    for (int c = tid; c < ncols; c += nt) {
        pv[c] = conv_history(p, conv_dim, vch0 + c, rc, &tv[c]);
        wn[c] = p.norm_w[e0 + c];
    }
    const float A_log = p.A_log[j], dt_bias = p.dt_bias[j];

    pdl_wait();
    Q35_TRACE_T1_AT(0);
    pdl_trigger();

    /* 2. Conv + SiLU of this block's q/k head and v columns; store the current row in the ring
     *    (q/k rows by one block per k-head, v rows by their owner). */
    const float *tail = p.proj + conv_dim + value_dim;
    const float b_in = tail[j], a_in = tail[Hv + j];
    uint16_t *ring_row = p.conv_ring + (size_t)rc * conv_dim;
    const bool qk_writer = split == 0 && j % (Hv / p.Hk) == 0;
    float ssq = 0.0f, ssk = 0.0f, sqk = 0.0f;
    for (int d = tid; d < dk; d += nt) {
        const float xq = p.proj[qch0 + d], xk = p.proj[kch0 + d];
        const float cq = conv_finish(pq[d], tq[d], xq), ck = conv_finish(pk[d], tk[d], xk);
        pq[d] = cq;
        pk[d] = ck;
        ssq = fmaf(cq, cq, ssq);
        ssk = fmaf(ck, ck, ssk);
        sqk = fmaf(cq, ck, sqk);
        if (qk_writer) ring_row[qch0 + d] = bf16_bits(xq), ring_row[kch0 + d] = bf16_bits(xk);
    }
    for (int c = tid; c < ncols; c += nt) {
        const float xv = p.proj[vch0 + c];
        pv[c] = conv_finish(pv[c], tv[c], xv);
        zs[c] = p.proj[conv_dim + j * dv + e0 + c];
        ring_row[vch0 + c] = bf16_bits(xv);
    }
    block_sum3(&ssq, &ssk, &sqk, red3); /* also publishes pq/pk/pv/zs to the block */
    Q35_TRACE_PROBE(1);

    /* 3. l2norm factors, gates. */
    const float rq = rsqrtf(ssq + 1e-6f) * (1.0f / sqrtf((float)dk)), rk = rsqrtf(ssk + 1e-6f);
    const float kq = sqk * rq * rk; /* k^ . q^ */
    float beta, decay;
    dn_gates(b_in, a_in, dt_bias, A_log, &beta, &decay);

    /* 4. mem = S^T k^, sq = S^T q^ over this thread's rows, then over the block. */
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
    for (int c = tid; c < ncols; c += nt) {
        float m = 0.0f, q = 0.0f;
        for (int w = 0; w < nw; w++) m += red_m[w * cols + c], q += red_s[w * cols + c];
        const float delta = beta * (pv[c] - decay * m);
        dl[c] = delta;
        ob[c] = rbf(fmaf(delta, kq, decay * q));
    }
    __syncthreads();
    Q35_TRACE_PROBE(2);

    /* 5. S' = decay S + k^ delta^T. */
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

    if constexpr (GO) {
        for (int c = tid; c < ncols; c += nt) p.o[(size_t)j * dv + e0 + c] = ob[c];
        Q35_TRACE_END(20);
        return;
    }
    /* 6. Gated RMSNorm: the head's sum of bf16(o)^2 gathered over the cluster (fixed rank order,
     *    so every block gets the same value). */
    float ss = 0.0f;
    for (int c = tid; c < ncols; c += nt) ss = fmaf(ob[c], ob[c], ss);
    ss = block_sum(ss, red3);
    if (tid == 0) part[0] = ss;
    cluster_arrive_release();
    cluster_wait();
    if (wid == 0) {
        float v = lane < (int)gridDim.x ? ld_dsmem(part, (unsigned)lane) : 0.0f;
        v = warp_sum(v);
        if (lane == 0) red3[0] = v; /* block_sum's readers are past its last barrier */
    }
    cluster_arrive_relaxed(); /* our DSMEM reads are done (their values are consumed above) */
    __syncthreads();
    Q35_TRACE_PROBE(3);
    const float rstd = rsqrtf(red3[0] / (float)dv + p.eps);
    for (int c = tid; c < ncols; c += nt) {
        const size_t e = (size_t)j * dv + e0 + c;
        const float u = rbf(ob[c] * rstd), wu = rbf(wn[c] * u);
        p.y[e] = rbf(wu * silu_acc(zs[c]));
        if (p.o) p.o[e] = ob[c];
    }
    Q35_TRACE_PROBE(4);
    cluster_wait(); /* keep our shared memory alive until the cluster has read `part` */
    Q35_TRACE_END(20);
}

extern "C" size_t cuda_deltanet_conv_ring_bytes(int Hk, int Hv, int dk, int dv, int K) {
    return (size_t)K * (size_t)(2 * Hk * dk + Hv * dv) * 2;
}

extern "C" int cuda_deltanet_step(const DeltanetStepParams *p, const CudaLaunch *l) {
    DnShape sh;
    if (!p || !l || !p->proj || !p->conv_w || !p->conv_ring || !p->A_log || !p->dt_bias || !p->norm_w || !p->S ||
        (p->gated_out ? !p->o : !p->y) || !p->step || p->Hk < 1 || p->Hv < 1 || p->Hv % p->Hk || p->K < 1 ||
        p->Hv > 65535 || dn_shape(p->dk, p->dv, &sh))
        return (int)cudaErrorInvalidValue;
    DnArgs a;
    a.p = *p;
    a.tpr = sh.tpr;
    a.cols = sh.cols;
    const dim3 grid((unsigned)sh.splits, (unsigned)p->Hv, 1), block((unsigned)sh.threads, 1, 1);
    const size_t smem = dn_smem_bytes(p->dk, &sh);
    if (p->gated_out)
        return sh.vec == 4 ? launch_kernel(deltanet_step_f32_cluster<4, true>, grid, block, smem, l, a)
                           : launch_kernel(deltanet_step_f32_cluster<1, true>, grid, block, smem, l, a);
    return sh.vec == 4
               ? launch_cluster(deltanet_step_f32_cluster<4, false>, grid, block, smem, (unsigned)sh.splits, l, a)
               : launch_cluster(deltanet_step_f32_cluster<1, false>, grid, block, smem, (unsigned)sh.splits, l, a);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_deltanet)
