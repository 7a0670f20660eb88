/* norm.cu — standalone RMSNorm over rows (one block per row), optionally preceded by the
 * residual add of split-K partials: the same device code (stage_norm_row in common.cuh) as the
 * GEMV prologue, exposed alone for tests, probes and shapes the fused path does not cover.
 *   x = bf16(res + bf16(sum_s parts[s]))   (when parts is set; x_out <- x)
 *   NORM_ZC:    y = bf16(x r (1 + w)),   NORM_PLAIN: y = bf16(w bf16(x r)),   r = rsqrt(mean x^2 + eps) */
#include "cuda/common.cuh"

#define NORM_THREADS 256

/* grid (rows), block 256, dynamic smem n floats. */
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_f32_row(const __grid_constant__ RmsnormParams p) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    const size_t off = (size_t)blockIdx.x * p.n;
    pdl_wait();
    stage_norm_row(xs, red, p.n, NULL, p.x + off, p.parts, p.n_parts, p.x_out, p.w, p.mode, p.eps);
    pdl_trigger();
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) p.y[off + i] = xs[i];
}

extern "C" int cuda_rmsnorm(const RmsnormParams *p, const CudaLaunch *l) {
    if (!p->x || !p->w || !p->y || p->rows <= 0 || p->n <= 0 || (p->parts && (p->rows != 1 || p->n_parts < 1)) ||
        (p->x_out && !p->parts) || (p->mode != NORM_ZC && p->mode != NORM_PLAIN) || p->n > 16384)
        return (int)cudaErrorInvalidValue;
    size_t smem = sizeof(float) * (size_t)p->n;
    if (smem > 40 * 1024) { /* dynamic + static above the 48 KiB default needs the opt-in */
        cudaError_t e = cudaFuncSetAttribute(rmsnorm_f32_row, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
    }
    return launch_kernel(rmsnorm_f32_row, dim3((unsigned)p->rows), dim3(NORM_THREADS), smem, l, *p);
}
