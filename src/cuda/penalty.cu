/* penalty.cu — the logit changes of a row before its pick (penalties, logit bias, a min_tokens ban): sampler.h's
 * SamplePenalty list applied to the logits on the device, as sampler_penalize does on the host, bit for bit
 * (IEEE operations in the host's order, no contraction, then bf16 rounding: a changed logit stays on the bf16 grid that
 * sample.cu's exact 16-bit-key sort relies on).
 *
 * Between cuda_rows_argmax (the raw row's argmax id and its log-softmax; in the single-sequence decode step, the LM
 * head's argmax) and cuda_sample, per row with entries:
 *   penalty_apply: remembers the raw log-sum-exp lse = l[argmax] - lp, writes each entry's raw logit to raw[] and its
 *     changed one into the row, and moves out_id to the changed row's argmax (ties: the smallest id, as
 *     sampler_argmax): the best entry against the raw argmax, or, when the raw argmax is itself an entry, a scan of
 *     the changed row. cuda_sample then draws from the changed row (its maximum is l'[out_id]).
 *   penalty_finish (after cuda_sample): lp = raw l[out_id] - lse, the log-softmax of the raw logits (BatchItem.logprob
 *     is of the raw row), with the raw value from raw[] when the picked id is an entry.
 * Rows without entries (n = 0) are left alone: one launch serves a step's mixed rows. */
#include "cuda/common.cuh"
#include "cuda/serve_ops.h"

#define PEN_THREADS 512

/* sampler_penalize, on the device */
__device__ __forceinline__ float penalize(float l, const SamplePenalty &e, const PenaltyRow &r) {
    if (!e.flags) return l;
    if (e.flags & PEN_BIAS) l = __fadd_rn(l, e.bias);
    if (e.flags & PEN_BAN) l = -INFINITY;
    if (e.flags & PEN_SEEN) {
        if (r.repetition != 1.0f) l = l > 0.0f ? __fdiv_rn(l, r.repetition) : __fmul_rn(l, r.repetition);
        if ((e.flags & PEN_GEN) && r.presence != 0.0f) l = __fsub_rn(l, r.presence);
        if (r.frequency != 0.0f) l = __fsub_rn(l, __fmul_rn(r.frequency, (float)e.count));
    }
    return rbf(l);
}

/* grid (rows), block PEN_THREADS */
__global__ void __launch_bounds__(PEN_THREADS) penalty_apply(const __grid_constant__ PenaltyParams p) {
    __shared__ ArgMax s_best[PEN_THREADS / 32];
    pdl_wait();
    pdl_trigger();
    PenaltyRow *row = p.row + blockIdx.x;
    const int n = row->n, off = row->off;
    if (n <= 0) return;
    float *L = p.logits + (size_t)blockIdx.x * p.ld;
    const int am = p.out_id[blockIdx.x];
    const float l_am = L[am];
    __syncthreads(); /* every thread read l[argmax] before any entry is written */
    ArgMax best = {-INFINITY, INT_MAX};
    int hit = 0;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        const SamplePenalty e = p.entries[off + k];
        const float raw = L[e.id];
        p.raw[off + k] = raw;
        const float v = penalize(raw, e, *row);
        L[e.id] = v;
        hit |= e.id == am;
        if (e.id < p.n_valid) best = argmax_better(best, ArgMax{v, e.id});
    }
    if (__syncthreads_or(hit)) { /* the raw argmax changed: the changed row's argmax from a scan (writes visible) */
        for (int i = threadIdx.x; i < p.n_valid; i += blockDim.x) best = argmax_better(best, ArgMax{L[i], i});
    } else if (threadIdx.x == 0) { /* unchanged ids: the raw argmax is the smallest id of their maximum */
        best = argmax_better(best, ArgMax{l_am, am});
    }
    best = warp_argmax(best);
    if ((threadIdx.x & 31) == 0) s_best[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        best = s_best[0];
        for (int w = 1; w < PEN_THREADS / 32; w++) best = argmax_better(best, s_best[w]);
        row->lse = l_am - p.lp[blockIdx.x];
        p.out_id[blockIdx.x] = best.i;
        p.lp[blockIdx.x] = best.v - row->lse; /* cuda_sample's lse is l'[out_id] - lp; penalty_finish sets lp */
    }
}

/* grid (rows), block PEN_THREADS */
__global__ void __launch_bounds__(PEN_THREADS) penalty_finish(const __grid_constant__ PenaltyParams p) {
    pdl_wait();
    pdl_trigger();
    const PenaltyRow *row = p.row + blockIdx.x;
    const int n = row->n, off = row->off, id = p.out_id[blockIdx.x];
    if (n <= 0) return;
    int found = 0; /* ids are unique in a row's entries: one thread at most finds the picked one */
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        if (p.entries[off + k].id == id) {
            p.lp[blockIdx.x] = p.raw[off + k] - row->lse;
            found = 1;
        }
    if (!__syncthreads_or(found) && threadIdx.x == 0) /* not an entry: its raw logit is still in the row */
        p.lp[blockIdx.x] = p.logits[(size_t)blockIdx.x * p.ld + id] - row->lse;
}

extern "C" int cuda_penalty_apply(const PenaltyParams *p, const CudaLaunch *l) {
    if (!p->logits || !p->row || !p->entries || !p->raw || !p->out_id || !p->lp || p->rows <= 0 || p->n_valid <= 0 ||
        p->ld < (size_t)p->n_valid)
        return (int)cudaErrorInvalidValue;
    return launch_kernel(penalty_apply, dim3((unsigned)p->rows), dim3(PEN_THREADS), 0, l, *p);
}

extern "C" int cuda_penalty_finish(const PenaltyParams *p, const CudaLaunch *l) {
    if (!p->logits || !p->row || !p->entries || !p->raw || !p->out_id || !p->lp || p->rows <= 0)
        return (int)cudaErrorInvalidValue;
    return launch_kernel(penalty_finish, dim3((unsigned)p->rows), dim3(PEN_THREADS), 0, l, *p);
}
