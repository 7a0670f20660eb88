/* skinny_lab.cu — lab for the batched decode step's GEMM at few rows (Qwen3.5-0.8B shapes, H200 sm_90a).
 *
 * The library's skinny GEMM (src/cuda/gemm_skinny.cu) stages 64 x 64 weight tiles through a 4-stage cp.async ring
 * in shared memory: at M = 1 .. 64 it streams the decode step's weights at 0.3-1.1 TB/s of the ~4 TB/s (one or two
 * CTAs per SM, at most 4 chunks of 8 KB in flight per CTA). The variant here ("direct") streams the weights straight
 * into registers like the decode GEMV (16-byte loads, U k-blocks of every row in flight per lane) and feeds them to
 * mma.sync m16n8k16 as the A operand without shared memory: lane (g, t) loads 8 consecutive k of W rows g and g + 8
 * of its 16-row strip, and the k index is permuted so that those registers ARE the A fragments (a0/a2 of row g,
 * a1/a3 of row g + 8, for two k16 steps). The activation rows (the B operand) are staged once per CTA in shared
 * memory with the same permutation: b0/b1 of k step j are one 8-byte load at k0 + 8 t + 4 j. The product is the same
 * sum over k in another order; the split partials go to the library's reduction (gemm_skinny_reduce), so both
 * variants end in the same epilogue.
 *
 *   build:  make build/bench/skinny_lab           (sm_90a)
 *   run:    build/bench/skinny_lab [--quick]
 *
 * For each decode shape (in_proj 8224 x 1024, gate_up 7168 x 1024, down 1024 x 3584, out 1024 x 2048, attention
 * in 5120 x 1024, the LM head 248320 x 1024) and M = 1, 8, 32, 64: the library kernel and the direct variant over a
 * grid of (rows per warp RW, warps per CTA, splits), each checked against the library's result (EPI_F32: within one
 * bf16 step) and timed (median of 15 launches, the weights rotated through 8 copies so they come from HBM as in the
 * step), in us and weight GB/s. A lab, not a test: it prints and exits 0 unless a variant is wrong. */
#include <algorithm>
#include <vector>

#include "../../src/cuda/gemm_skinny.cu"
#include "lab.cuh"

typedef struct SkdArgs {
    GemmParams g;
    float *work; /* [splits][M][N] */
    int ks;      /* k per split, a multiple of 32 */
} SkdArgs;

/* grid (ceil(N / (16 RW warps)), splits, ceil(M / (8 MT))); warps x 32 threads; shared memory 8 MT x (ks + 8) bf16.
 * Partial sums of W rows (blockIdx.x warps + warp) 16 RW .. against X rows 8 MT blockIdx.z .. over the split's k. */
template <int RW, int MT, int U>
__global__ void __launch_bounds__(256) skd_k(const __grid_constant__ SkdArgs a) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const GemmParams &g = a.g;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5, gq = lane >> 2, t = lane & 3;
    const int split = blockIdx.y, k0 = split * a.ks, k1 = min(g.K, k0 + a.ks), m0 = blockIdx.z * 8 * MT;
    const int mcount = min(8 * MT, g.M - m0), ldx = a.ks + 8;
    uint16_t *xs = (uint16_t *)smem;
    const int row0 = (blockIdx.x * nw + warp) * 16 * RW;
    const uint16_t *wr[RW][2];
    bool rok[RW][2];
#pragma unroll
    for (int s = 0; s < RW; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = row0 + 16 * s + gq + 8 * h;
            rok[s][h] = r < g.N;
            wr[s][h] = g.w + (size_t)(rok[s][h] ? r : 0) * g.ldw + k0 + 8 * t;
        }
    pdl_begin();
    for (int i = threadIdx.x; i < 8 * MT * (a.ks / 8); i += blockDim.x) {
        const int r = i / (a.ks / 8), c8 = i - r * (a.ks / 8), k = k0 + 8 * c8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < mcount && k < k1) v = *(const uint4 *)(g.x + (size_t)(m0 + r) * g.ldx + k);
        *(uint4 *)(xs + r * ldx + 8 * c8) = v;
    }
    __syncthreads();
    float acc[RW][MT][4];
#pragma unroll
    for (int s = 0; s < RW; s++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[s][mt][e] = 0.0f;
    const int kn = k1 - k0;
    for (int kb = 0; kb < kn; kb += 32 * U) {
        uint4 wv[U][RW][2];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < RW; s++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int k = kb + 32 * u + 8 * t;
                    wv[u][s][h] = rok[s][h] && k < kn ? ld_stream((const uint4 *)(wr[s][h] + kb + 32 * u))
                                                      : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb + 32 * u >= kn) break;
#pragma unroll
            for (int j = 0; j < 2; j++) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (8 * mt >= mcount) break;
                    const uint2 xb = *(const uint2 *)(xs + (8 * mt + gq) * ldx + kb + 32 * u + 8 * t + 4 * j);
#pragma unroll
                    for (int s = 0; s < RW; s++) {
                        const uint4 &w0 = wv[u][s][0], &w1 = wv[u][s][1];
                        const uint32_t af[4] = {j ? w0.z : w0.x, j ? w1.z : w1.x, j ? w0.w : w0.y, j ? w1.w : w1.y};
                        mma_bf16(acc[s][mt], af, xb.x, xb.y);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int s = 0; s < RW; s++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = row0 + 16 * s + gq + 8 * (e >> 1), m = m0 + 8 * mt + 2 * t + (e & 1);
                if (n < g.N && m < g.M) a.work[((size_t)split * g.M + m) * g.N + n] = acc[s][mt][e];
            }
}

typedef struct Variant {
    int rw, warps, splits; /* splits 0: the library's sk_plan */
} Variant;

/* The direct variant's launch: partials, then the library's split reduction and epilogue. */
static int skd_run(const GemmParams &g, const Variant &v, float *work, int n_sm, cudaStream_t st) {
    int kc = 0;
    int S = v.splits ? v.splits : sk_plan(g.N, g.K, sk_mb(&g), n_sm, &kc);
    const int ks = ((g.K + S - 1) / S + 31) / 32 * 32;
    S = (g.K + ks - 1) / ks;
    const int MT = g.M <= 8 ? 1 : g.M <= 32 ? 4 : 8;
    SkdArgs a = {g, work, ks};
    const dim3 grid((unsigned)((g.N + 16 * v.rw * v.warps - 1) / (16 * v.rw * v.warps)), (unsigned)S,
                    (unsigned)((g.M + 8 * MT - 1) / (8 * MT)));
    const size_t smem = (size_t)8 * MT * (ks + 8) * 2;
    const CudaLaunch l = {st, 1, NULL, 0};
#define SKD(RW_, MT_)                                                                                                  \
    do {                                                                                                               \
        CK(cudaFuncSetAttribute(skd_k<RW_, MT_, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));          \
        rc = launch_kernel(skd_k<RW_, MT_, 4>, grid, dim3(32 * v.warps), smem, &l, a);                                 \
    } while (0)
    int rc = 0;
    if (v.rw == 1 && MT == 1) SKD(1, 1);
    if (v.rw == 1 && MT == 4) SKD(1, 4);
    if (v.rw == 1 && MT == 8) SKD(1, 8);
    if (v.rw == 2 && MT == 1) SKD(2, 1);
    if (v.rw == 2 && MT == 4) SKD(2, 4);
    if (v.rw == 2 && MT == 8) SKD(2, 8);
#undef SKD
    if (rc) return rc;
    SkArgs ra;
    ra.g = g;
    ra.work = work;
    const int cols = g.epi == GEMM_EPI_SWIGLU_BF16 ? g.N / 2 : g.N;
    const dim3 rg((unsigned)((cols + 255) / 256), (unsigned)g.M);
    switch (g.epi) {
    case GEMM_EPI_BF16: return launch_ex(gemm_skinny_reduce<GEMM_EPI_BF16>, rg, dim3(256), 0, 0, &l, ra, S);
    case GEMM_EPI_F32: return launch_ex(gemm_skinny_reduce<GEMM_EPI_F32>, rg, dim3(256), 0, 0, &l, ra, S);
    case GEMM_EPI_ADD_F32: return launch_ex(gemm_skinny_reduce<GEMM_EPI_ADD_F32>, rg, dim3(256), 0, 0, &l, ra, S);
    default: return launch_ex(gemm_skinny_reduce<GEMM_EPI_SWIGLU_BF16>, rg, dim3(256), 0, 0, &l, ra, S);
    }
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    int dev = 0, n_sm = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    struct Shape {
        const char *name;
        int N, K, epi;
    } shapes[] = {{"DeltaNet in_proj", 8224, 1024, GEMM_EPI_BF16}, {"MLP gate_up", 7168, 1024, GEMM_EPI_SWIGLU_BF16},
                  {"MLP down", 1024, 3584, GEMM_EPI_ADD_F32},      {"out_proj", 1024, 2048, GEMM_EPI_ADD_F32},
                  {"attention in", 5120, 1024, GEMM_EPI_BF16},     {"LM head", 248320, 1024, GEMM_EPI_F32}};
    const int Ms[] = {1, 8, 32, 64};
    std::vector<Variant> vars;
    for (int rw = 1; rw <= 2; rw++)
        for (int warps = 4; warps <= 8; warps *= 2)
            for (int sp : {0, 1, 2, 4, 8}) vars.push_back({rw, warps, sp});
    if (quick) vars = {{1, 8, 0}, {2, 8, 0}, {2, 4, 2}};
    const int COPIES = 8; /* weights rotated through 8 copies: > L2 for every shape but the LM head (one copy) */
    int wrong = 0;
    printf("skinny lab: %d SMs; us per launch (median of 15), weight GB/s\n", n_sm);
    for (const Shape &sh : shapes) {
        const int copies = sh.N > 100000 ? 1 : COPIES;
        const size_t wn = (size_t)sh.N * sh.K;
        std::vector<uint16_t> hw(wn);
        uint32_t seed = 12345;
        for (size_t i = 0; i < wn; i++) {
            seed = seed * 1664525u + 1013904223u;
            hw[i] = (uint16_t)(0x3c00 + (seed >> 16) % 0x400 - 0x200) ^ (uint16_t)((seed >> 31) << 15);
        }
        std::vector<uint16_t *> dw(copies);
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&dw[c], wn * 2));
            CK(cudaMemcpy(dw[c], hw.data(), wn * 2, cudaMemcpyHostToDevice));
        }
        for (int M : Ms) {
            std::vector<uint16_t> hx((size_t)M * sh.K);
            for (auto &v : hx) {
                seed = seed * 1664525u + 1013904223u;
                v = (uint16_t)(0x3c00 + (seed >> 16) % 0x200) ^ (uint16_t)((seed >> 31) << 15);
            }
            uint16_t *dx;
            float *y_ref, *y, *work;
            const size_t wf =
                std::max<size_t>((size_t)8 * M * sh.N, cuda_gemm_skinny_work(M, sh.N, sh.K, n_sm, sh.epi, 1));
            CK(cudaMalloc(&dx, hx.size() * 2));
            CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
            CK(cudaMalloc(&y_ref, (size_t)M * sh.N * 4));
            CK(cudaMalloc(&y, (size_t)M * sh.N * 4));
            CK(cudaMalloc(&work, wf * 4));
            /* correctness on EPI_F32 against the library's kernel */
            GemmParams gr = {dx, dw[0], y_ref, M, sh.N, sh.K, sh.K, sh.K, sh.N, GEMM_EPI_F32, 1, 0};
            const CudaLaunch l = {st, 1, NULL, 0};
            CK((cudaError_t)cuda_gemm_skinny(&gr, work, wf, n_sm, &l));
            std::vector<float> ref((size_t)M * sh.N), got((size_t)M * sh.N);
            CK(cudaMemcpyAsync(ref.data(), y_ref, ref.size() * 4, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            auto time_it = [&](auto &&launch) {
                cudaEvent_t e0, e1;
                CK(cudaEventCreate(&e0));
                CK(cudaEventCreate(&e1));
                std::vector<float> ms;
                for (int it = 0; it < 18; it++) {
                    CK(cudaEventRecord(e0, st));
                    CK((cudaError_t)launch(it % copies));
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float v;
                    CK(cudaEventElapsedTime(&v, e0, e1));
                    if (it >= 3) ms.push_back(v);
                }
                std::sort(ms.begin(), ms.end());
                CK(cudaEventDestroy(e0));
                CK(cudaEventDestroy(e1));
                return 1e3 * ms[ms.size() / 2];
            };
            const int ycols = sh.epi == GEMM_EPI_SWIGLU_BF16 ? sh.N / 2 : sh.N;
            const double lib_us = time_it([&](int c) {
                GemmParams g = {dx, dw[c], y, M, sh.N, sh.K, sh.K, sh.K, ycols, sh.epi, 1, 0};
                return cuda_gemm_skinny(&g, work, wf, n_sm, &l);
            });
            printf("%-17s N %6d K %5d M %3d  library %8.1f us %6.0f GB/s |", sh.name, sh.N, sh.K, M, lib_us,
                   wn * 2 / (lib_us * 1e3));
            double best = 1e30;
            const Variant *bv = nullptr;
            for (const Variant &v : vars) {
                GemmParams g = gr;
                g.y = y;
                CK(cudaMemset(y, 0xff, (size_t)M * sh.N * 4));
                CK((cudaError_t)skd_run(g, v, work, n_sm, st));
                CK(cudaMemcpyAsync(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost, st));
                CK(cudaStreamSynchronize(st));
                int bad = 0;
                for (size_t i = 0; i < got.size(); i++)
                    bad += !(fabsf(got[i] - ref[i]) <= ldexpf(fabsf(ref[i]), -7) + 1e-6f);
                if (bad) {
                    printf("\n  WRONG: rw %d warps %d splits %d: %d of %zu values\n", v.rw, v.warps, v.splits, bad,
                           got.size());
                    wrong++;
                    continue;
                }
                const double us = time_it([&](int c) {
                    GemmParams gt = {dx, dw[c], y, M, sh.N, sh.K, sh.K, sh.K, ycols, sh.epi, 1, 0};
                    return skd_run(gt, v, work, n_sm, st);
                });
                if (us < best) best = us, bv = &v;
            }
            if (bv)
                printf(" direct best %8.1f us %6.0f GB/s (rw %d, %d warps, splits %d)\n", best, wn * 2 / (best * 1e3),
                       bv->rw, bv->warps, bv->splits);
            else
                printf("\n");
            CK(cudaFree(dx));
            CK(cudaFree(y_ref));
            CK(cudaFree(y));
            CK(cudaFree(work));
        }
        for (int c = 0; c < copies; c++) CK(cudaFree(dw[c]));
    }
    printf("skinny lab: %s\n", wrong ? "SOME VARIANTS WRONG" : "every variant matched the library kernel");
    return wrong ? 1 : 0;
}
