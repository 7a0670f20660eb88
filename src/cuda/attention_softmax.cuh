/* attention_softmax.cuh — one key tile of the online softmax, shared by the prefill flash-attention
 * kernels (attention_prefill.cu on mma.sync, attention_prefill_wg.cu on wgmma), so both round alike.
 * sc[NT][4]: the tile's raw scores in the mma C layout (this thread: row position qp0 for e < 2, qp1
 * otherwise; key key0 + 8 n + 2 t + (e & 1)). They are scaled by sl2 (scale * log2 e), keys past the row
 * are set to ATTN_MASK when need_mask (the tile reaches past the warp's first row), the running row
 * max m (over the 4 threads of a quad) is updated, sc becomes exp2(s - m), l accumulates the row sums
 * and O [DT][4] (same rows) is rescaled by exp2(m_old - m_new). ATTN_MASK is finite: a row that sees
 * only masked keys in a tile keeps a finite max from key 0, visible to every row. */
#ifndef Q35_CUDA_ATTENTION_SOFTMAX_CUH
#define Q35_CUDA_ATTENTION_SOFTMAX_CUH

#define ATTN_MASK (-1.0e30f)

template <int NT, int DT>
__device__ __forceinline__ void attn_softmax_tile(float (&sc)[NT][4], float (&o)[DT][4], int key0, bool need_mask,
                                                  int qp0, int qp1, int t, float sl2, float &m0, float &m1, float &l0,
                                                  float &l1) {
    float mx0 = ATTN_MASK, mx1 = ATTN_MASK;
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = key0 + n * 8 + 2 * t + (e & 1);
            float v = sc[n][e] * sl2;
            if (need_mask && key > (e < 2 ? qp0 : qp1)) v = ATTN_MASK;
            sc[n][e] = v;
        }
        mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float al0 = exp2f(m0 - mn0), al1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        sc[n][0] = exp2f(sc[n][0] - m0);
        sc[n][1] = exp2f(sc[n][1] - m0);
        sc[n][2] = exp2f(sc[n][2] - m1);
        sc[n][3] = exp2f(sc[n][3] - m1);
        rs0 += sc[n][0] + sc[n][1];
        rs1 += sc[n][2] + sc[n][3];
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] *= al0, o[d][1] *= al0, o[d][2] *= al1, o[d][3] *= al1;
}

#endif
