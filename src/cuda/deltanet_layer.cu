/* deltanet_layer.cu — the DeltaNet layer's mixer as ONE kernel (the decode step's default where the shapes allow;
 * contract in ops.h DnLayerParams): in_proj GEMV -> conv + SiLU -> delta-rule step -> gated RMSNorm -> out_proj,
 * for one token. Two variants of the exchange between a head's blocks: through the head's thread-block cluster
 * (two exchanges per layer; o and S bitwise the step kernel's, described below), or, where the clusters do not
 * all fit at once (the 0.8B's 16 heads on a 132-SM H200), through global memory with ONE exchange per layer
 * (DL_X1_SLOT): each block holds 16 rows of the head's state instead of 16 columns, so one exchange of row
 * partials (tagged words) gives every block the head's S^T k, S^T q, v and z, and the gated norm needs no
 * second one.
 *
 * Why: the engine's DeltaNet layer is four dependent launches (in_proj GEMV, the step, out_proj, the MLP),
 * and a dependent launch costs ~2.5 us beyond its bytes even for a kernel that only loads (bench/kernels/
 * burst_lab.cu). The step of v-head j needs only head j's rows of in_proj, and
 * out_proj's columns of head j only head j's output, so the first three need no grid-wide wait: the 8 blocks
 * of a head exchange what they need among themselves.
 *
 * Block (s, j), 16 warps (Hk == Hv, dk == dv == 128):
 *   before the PDL wait: each warp loads 4 rows of head j's q, k, v or z (rows [16 s + 4 (w % 4), +4) of part
 *   w / 4) into registers (the GEMV's 4-row-group layout, U = 4); cp.async of the rows b_j and a_j, of W_out's
 *   rows [s D/8, (s+1) D/8) x columns [128 j, +128) (32 KiB at D = 1024), of the state slice S[j][:, 16 s ..
 *   +16) (8 KiB) and of the conv history and taps of the block's 48 q/k/v channels;
 *   after it: the input row normed as the 512-thread GEMV does (bitwise its xs), the 66 row sums (bitwise the
 *   GEMV's rows; b and a by warp 0 from shared memory), conv + SiLU of the block's 16 q, 16 k and 16 v
 *   channels (their raw values into the ring), exchange 1: the head's conv'd q and k to all 8 blocks -> the
 *   step on the block's 16 value columns with the first 128 threads, laid out as deltanet.cu's (tpr 4, VEC
 *   4), so o and S are bitwise the step kernel's -> exchange 2: the head's o and z -> the gated norm of the
 *   head as MV_IN_GATED computes it -> y[s D/8 + r] += W_out[s D/8 + r][head j] g (one fp32 atomic per row).
 * The exchanges go through the head's thread-block cluster (distributed shared memory) where every head's
 * cluster of 8 fits at once, else through global memory (tagged words), which needs the whole grid resident:
 * on the 132-SM H200 clusters of 8 span at most 120 SMs (15 clusters), so the 0.8B's 16 heads take the
 * global-memory path. Cluster mode: remote stores only go to
 * blocks that have started (the arrive at entry, its wait before the first push), and every push precedes
 * the barrier after which it is read, so a block may exit once it passed the second barrier.
 *
 * H200, 0.8B: 0.7484 vs 0.7564 ms/token at ctx 128, 0.7685 vs 0.7834 at 2048 (61
 * launches instead of 97). The kernel's span is ~14.5 us: its 22 MB arrive at ~2.4 TB/s (~9.5 us from
 * residency, as a one-shot GEMV), then ~5 us of chain (the GEMV's sums, conv, two exchanges through L2,
 * the step, the norm, out_proj's atomics). */
#include "cuda/cluster.cuh"
#include "cuda/common.cuh"
#include "cuda/deltanet.cuh"
#include "cuda/async.cuh"

enum {
    DL_SPLIT = 8,               /* blocks per head (the cluster) */
    DL_WARPS = 16,              /* 4 rows of q/k/v/z each; warp 0 also b and a (from shared memory) */
    DL_THREADS = 32 * DL_WARPS, /* the in_proj GEMV's block size: the same input norm bit for bit */
    DL_DK = 128,                /* dk = dv */
    DL_COLS = DL_DK / DL_SPLIT  /* value columns (and q/k/v/z rows of each part) per block */
};

/* ONEX (one exchange per layer; global-memory exchange only): block s of head j holds ROWS [16 s, +16) of the
 * head's state (all dv columns) and the matching 16 dims of q and k, so S^T k and S^T q are sums over the 8
 * blocks of their 16-row partials. Its slot in xbuf (DL_X1_SLOT floats): [0, 128) sum_r S[r][c] k[r], [128, 256)
 * sum_r S[r][c] q[r] (the conv'd, unnormalised q and k), [256, 272) its v, [272, 288) its z, 288 q.q, 289 k.k,
 * 290 q.k over its 16 dims. After the one exchange every block sums the 8 slots in block order (deterministic)
 * and has the head's whole delta and o, so the gated norm needs no second exchange. */
enum { DL_X1_SLOT = 320 };
/* ONEX 2 (the tagged exchange): the same 291 values per block, each stored with its round's epoch as one 64-bit
 * word (common.cuh tag_st: epoch << 32 | float bits) in slot (j, s) of the tag area (after the
 * float slots in xbuf). A reader polls the words it needs until every tag is this round's: no counter, no
 * release fence, no separate read-back, so the head's exchange is one L2 round trip after its last block's
 * stores instead of four (the stores' acknowledgement the release waits for, the counter add, the acquire
 * poll, the read-back). The epoch: every block of a head wrote the same tag in the previous round (the slots
 * start zeroed, or all alike), so block (j, s) reads its own slot's word 0 after the PDL wait and adds 1. */

static __host__ __device__ inline size_t dl_smem_bytes(int D, int K) {
    return (size_t)D * 4 + (size_t)(D / DL_SPLIT) * DL_DK * 2 + (size_t)DL_DK * DL_COLS * 4 + (size_t)D * 4 +
           (size_t)K * 3 * DL_COLS * 2 + (size_t)3 * DL_COLS * K * 4;
}
/* GM: one exchange per layer through global memory as tagged words (ONEX) instead of the cluster's two exchanges
 * through distributed shared memory. */
template <bool GM, bool F8>
__global__ void __launch_bounds__(DL_THREADS, 1) dn_layer_k(const __grid_constant__ DnLayerParams p) {
    constexpr int ONEX = GM ? 2 : 0;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float red[32], red3[96], prow[4 * DL_COLS + 2];
    __shared__ __align__(16) float qa[DL_DK], ka[DL_DK], oa[DL_DK], za[DL_DK], gs[DL_DK];
    __shared__ __align__(16) float cq[DL_COLS], ck[DL_COLS], pv[DL_COLS], zv[DL_COLS], ob[DL_COLS];
    __shared__ float dl[DL_COLS], red_m[4 * DL_COLS], red_s[4 * DL_COLS], rstd_s;
    __shared__ __align__(16) float dlf[ONEX ? DL_DK : 1], nrm[4]; /* ONEX: the head's delta; q.q, k.k, q.k */
    __shared__ unsigned tag_e;                                    /* ONEX 2: this round's epoch */
    const int D = p.D, dk = DL_DK, dv = DL_DK, Hv = p.Hv;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int s = blockIdx.x, j = blockIdx.y;
    const int key_dim = p.Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;
    const int e0 = s * DL_COLS, orows = D / DL_SPLIT;
    float *xs = reinterpret_cast<float *>(smem);
    uint16_t *wo = reinterpret_cast<uint16_t *>(smem + (size_t)D * 4);
    float *st = reinterpret_cast<float *>(smem + (size_t)D * 4 + (size_t)orows * DL_DK * 2);
    uint16_t *wba = reinterpret_cast<uint16_t *>(st + DL_DK * DL_COLS);
    uint16_t *rg = wba + 2 * (size_t)D; /* ring rows: [K][48], channels as channel(t) */
    float *cw = reinterpret_cast<float *>(rg + (size_t)p.K * 3 * DL_COLS); /* taps [48][K] */
    Q35_TRACE_T0;
    const int pos = p.step->pos, rc = pos % p.K; /* before the weights: a load that blocks */
    pdl_trigger();
    /* the norm weights (immutable) before everything else: the input norm's (D <= 1024) and the gated norm's;
     * loaded after the wait they cost the chain an L2 round trip each, behind the SM's weight stream */
    float nwr[2];
#pragma unroll
    for (int e = 0; e < 2; e++) nwr[e] = tid + e * DL_THREADS < D ? p.ln1[tid + e * DL_THREADS] : 0.0f;
    const float gnw = tid < DL_DK ? p.norm_w[tid] : 0.0f;
    if (!GM) cluster_arrive_relaxed(); /* matched by the wait before the first remote store */
    /* 1. Before the wait: weights, the state slice, the conv history (PDL contract, common.cuh). */
    const int part = warp >> 2;
    const long long row0 = (part == 0   ? (long long)j * dk
                            : part == 1 ? (long long)key_dim + j * dk
                            : part == 2 ? 2LL * key_dim + (long long)j * dv
                                        : (long long)conv_dim + (long long)j * dv) +
                           e0 + 4 * (warp & 3);
    const long long row_b = (long long)conv_dim + value_dim + j, row_a = row_b + Hv;
    /* FP8 (ops.h DnLayerParams): in_proj's q/k/v/z rows as the FP8 GEMV reads them (16 columns per lane and load,
     * 512 per warp step: k = k0 + 512 u + 16 lane), b / a from w_ba, W_out's slice as bytes */
    constexpr int CPL = F8 ? 16 : 8, KSTEP = 32 * CPL, KBATCH = 4 * KSTEP;
    const int ld8 = (conv_dim + value_dim + 3) & ~3; /* fp8_scale_ld of w8_in's rows */
    uint4 w[4][4];
    float4 sc[4];
    auto load = [&](int k0) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int k = k0 + u * KSTEP + lane * CPL;
#pragma unroll
            for (int r = 0; r < 4; r++) {
                if constexpr (F8)
                    w[u][r] = k < D ? ld_stream(reinterpret_cast<const uint4 *>(p.w8_in + (row0 + r) * D + k))
                                    : make_uint4(0u, 0u, 0u, 0u);
                else
                    w[u][r] = k < D ? ld_stream(reinterpret_cast<const uint4 *>(p.w_in + (row0 + r) * D + k))
                                    : make_uint4(0u, 0u, 0u, 0u);
            }
            if constexpr (F8)
                sc[u] = k < D ? __ldg(reinterpret_cast<const float4 *>(p.s_in + (size_t)(k / 128) * ld8 + row0))
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    load(0);
    if constexpr (F8) {
        for (int c = tid; c < orows * (DL_DK / 16); c += DL_THREADS) { /* W_out rows, head j's 128 columns: bytes */
            const int r = c >> 3, q = c & 7;
            cp_async16(reinterpret_cast<uint8_t *>(wo) + r * DL_DK + q * 16,
                       p.w8_out + (size_t)(s * orows + r) * value_dim + (size_t)j * dv + q * 16);
        }
    } else {
        for (int c = tid; c < orows * (DL_DK / 8); c += DL_THREADS) { /* W_out rows, head j's 128 columns */
            const int r = c >> 4, q = c & 15;
            cp_async16(wo + r * DL_DK + q * 8, p.w_out + (size_t)(s * orows + r) * value_dim + (size_t)j * dv + q * 8);
        }
    }
    if (ONEX) /* S[j][e0 .. e0 + 16)[:]: the block's 16 rows, contiguous */
        for (int c = tid; c < DL_COLS * (DL_DK / 4); c += DL_THREADS)
            cp_async16(st + c * 4, p.S + ((size_t)j * dk + e0) * dv + c * 4);
    else
        for (int c = tid; c < DL_DK * (DL_COLS / 4); c += DL_THREADS) { /* S[j][d][e0 .. e0 + 16) */
            const int d = c / (DL_COLS / 4), q = c % (DL_COLS / 4);
            cp_async16(st + d * DL_COLS + q * 4, p.S + ((size_t)j * dk + d) * dv + e0 + q * 4);
        }
    for (int c = tid; c < D / 4; c += DL_THREADS) { /* rows b_j, a_j: D / 8 pieces each */
        const int r = c / (D / 8), q = c % (D / 8);
        if constexpr (F8)
            cp_async16(wba + (size_t)r * D + q * 8, p.w_ba + ((size_t)r * Hv + j) * D + q * 8);
        else
            cp_async16(wba + (size_t)r * D + q * 8, p.w_in + (r ? row_a : row_b) * D + q * 8);
    }
    auto channel = [&](int t) { /* the block's q, k, v channels t < 48 */
                                const int pt = t / DL_COLS, i = t % DL_COLS;
                                return pt == 0   ? j * dk + e0 + i
                                       : pt == 1 ? key_dim + j * dk + e0 + i
                                                 : 2 * key_dim + j * dv + e0 + i;
    };
    /* the conv history and taps of the block's 48 channels (16 contiguous per part) */
    for (int c = tid; c < p.K * 6 + 3 * p.K * 4; c += DL_THREADS) {
        if (c < p.K * 6) { /* ring row r, part pt, half h: 8 channels */
            const int r = c / 6, pt = (c % 6) / 2, h = c % 2;
            cp_async16(rg + r * 3 * DL_COLS + pt * DL_COLS + h * 8,
                       p.conv_ring + (size_t)r * conv_dim + channel(pt * DL_COLS) + h * 8);
        } else { /* taps of part pt: 16 channels x K floats, contiguous */
            const int q = c - p.K * 6, pt = q / (p.K * 4), o = q % (p.K * 4);
            cp_async16(cw + pt * DL_COLS * p.K + o * 4, p.conv_w + (size_t)channel(pt * DL_COLS) * p.K + o * 4);
        }
    }
    cp_async_commit();
    const float A_log = p.A_log[j], dt_bias = p.dt_bias[j];

    pdl_wait();
    Q35_TRACE_T1_AT(0);
    /* ONEX 2: the previous round's tag of the block's own slot (in flight with the input row's reads) */
    unsigned long long *xtag = reinterpret_cast<unsigned long long *>(p.xbuf + (size_t)Hv * DL_SPLIT * DL_X1_SLOT) +
                               (size_t)j * DL_SPLIT * DL_X1_SLOT;
    if (ONEX == 2 && tid == 0) tag_e = (unsigned)(tag_ld(xtag + (size_t)s * DL_X1_SLOT) >> 32) + 1u;

    /* 2. The input row (bitwise the in_proj GEMV's), the zeroing, the 66 row sums. */
    if (D <= 2 * DL_THREADS) /* (its x loads batched as the MLP's: +1.7 us) */
        stage_norm_row_wr<2, false>(xs, red, D, p.embed ? p.embed + (size_t)p.step->token * D : NULL, p.x, p.parts,
                                    p.n_parts, s == 0 && j == 0 ? p.x_out : NULL, nwr, p.norm_mode, p.eps);
    else
        stage_norm_row(xs, red, D, p.embed ? p.embed + (size_t)p.step->token * D : NULL, p.x, p.parts, p.n_parts,
                       s == 0 && j == 0 ? p.x_out : NULL, p.ln1, p.norm_mode, p.eps);
    if (p.n_zero > 0 && (p.zero0 || p.zero1)) {
        const int nthr = gridDim.x * gridDim.y * DL_THREADS;
        for (int i = (j * gridDim.x + s) * DL_THREADS + tid; i < p.n_zero; i += nthr) {
            if (p.zero0) p.zero0[i] = 0.0f;
            if (p.zero1) p.zero1[i] = 0.0f;
        }
    }
    __syncthreads();
    Q35_TRACE_PROBE(1);
    {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 < D; k0 += KBATCH) {
            if (k0) load(k0);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int k = k0 + u * KSTEP + lane * CPL;
                if (k < D) {
                    const float4 *xp = reinterpret_cast<const float4 *>(xs + k);
                    if constexpr (F8) { /* gemv.cu's FP8 order: 16-product chain, times the row's scale */
                        const float4 a4 = xp[0], b4 = xp[1], c4 = xp[2], d4 = xp[3];
                        const float xv[16] = {a4.x, a4.y, a4.z, a4.w, b4.x, b4.y, b4.z, b4.w,
                                              c4.x, c4.y, c4.z, c4.w, d4.x, d4.y, d4.z, d4.w};
                        const float s4[4] = {sc[u].x, sc[u].y, sc[u].z, sc[u].w};
#pragma unroll
                        for (int r = 0; r < 4; r++) acc[r] = fmaf(dot16_e4m3(w[u][r], xv), s4[r], acc[r]);
                    } else {
                        const float4 a4 = xp[0], b4 = xp[1];
                        const float xv[8] = {a4.x, a4.y, a4.z, a4.w, b4.x, b4.y, b4.z, b4.w};
#pragma unroll
                        for (int r = 0; r < 4; r++) acc[r] = dot8(w[u][r], xv, acc[r]);
                    }
                }
            }
        }
        const float sum = warp_sum_rows4(acc, lane); /* lanes 8r .. 8r+7: row r */
        if ((lane & 7) == 0) {
            const float v = rbf(sum);
            prow[4 * warp + (lane >> 3)] = v;
            if (p.proj) p.proj[row0 + (lane >> 3)] = v;
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    if (warp == 0) { /* b_j, a_j: the same per-lane sums and reduction as the GEMV's rows */
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 < D; k0 += 1024)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int k = k0 + u * 256 + lane * 8;
                if (k < D) {
                    const float4 *xp = reinterpret_cast<const float4 *>(xs + k);
                    const float4 a4 = xp[0], b4 = xp[1];
                    const float xv[8] = {a4.x, a4.y, a4.z, a4.w, b4.x, b4.y, b4.z, b4.w};
                    acc[0] = dot8(*reinterpret_cast<const uint4 *>(wba + k), xv, acc[0]);
                    acc[1] = dot8(*reinterpret_cast<const uint4 *>(wba + D + k), xv, acc[1]);
                }
            }
        const float sum = warp_sum_rows4(acc, lane);
        if (lane == 0 || lane == 8) {
            const float v = rbf(sum);
            prow[4 * DL_COLS + (lane >> 3)] = v;
            if (p.proj) p.proj[lane ? row_a : row_b] = v;
        }
        __syncwarp();
    }
    __syncthreads();
    Q35_TRACE_PROBE(2);

    /* 3. Conv + SiLU of the block's channels (deltanet.cu's values); the raw row into the ring. */
    uint16_t ring_x = 0; /* threads < 48: the raw value for the ring, stored after the exchange's arrive */
    if (tid < 3 * DL_COLS) {
        /* deltanet.cuh conv_history's sum, from the staged ring rows and taps */
        const float *w = cw + tid * p.K;
        float hist = 0.0f;
        for (int jj = 0; jj < p.K - 1; jj++) {
            int row = rc + 1 + jj;
            row -= row >= p.K ? p.K : 0;
            hist = fmaf(w[jj], bf16u(rg[row * 3 * DL_COLS + tid]), hist);
        }
        const float x = prow[tid], c = conv_finish(hist, w[p.K - 1], x);
        ring_x = bf16_bits(x);
        const int i = tid % DL_COLS;
        if (tid < DL_COLS)
            cq[i] = c;
        else if (tid < 2 * DL_COLS)
            ck[i] = c;
        else
            pv[i] = c;
    } else if (tid < 4 * DL_COLS) {
        zv[tid - 3 * DL_COLS] = prow[tid];
    }
    __syncthreads();
    Q35_TRACE_PROBE(3);

    if constexpr (ONEX) {
        {
            /* 4'. The block's partials to its slot as tagged words (no barrier, no counter), then the head's sums
         * once every word read carries this round's epoch. */
            const unsigned e = tag_e;
            unsigned long long *xb = xtag + (size_t)s * DL_X1_SLOT;
            if (tid < 2 * DL_DK) {
                const int c = tid & (DL_DK - 1);
                const float *kv = tid < DL_DK ? ck : cq;
                float a = 0.0f;
#pragma unroll
                for (int r = 0; r < DL_COLS; r++) a = fmaf(st[r * DL_DK + c], kv[r], a);
                tag_st(xb + tid, e, a);
            } else if (warp == 8) {
                if (lane < DL_COLS)
                    tag_st(xb + 2 * DL_DK + lane, e, pv[lane]), tag_st(xb + 2 * DL_DK + DL_COLS + lane, e, zv[lane]);
            } else if (warp == 9) {
                const float q = lane < DL_COLS ? cq[lane] : 0.0f, k = lane < DL_COLS ? ck[lane] : 0.0f;
                float qq = q * q, kk = k * k, qk = q * k;
#pragma unroll
                for (int o = 8; o >= 1; o >>= 1) {
                    qq += __shfl_xor_sync(0xffffffffu, qq, o);
                    kk += __shfl_xor_sync(0xffffffffu, kk, o);
                    qk += __shfl_xor_sync(0xffffffffu, qk, o);
                }
                if (lane == 0) tag_st(xb + 288, e, qq), tag_st(xb + 289, e, kk), tag_st(xb + 290, e, qk);
            }
            if (tid < 3 * DL_COLS) p.conv_ring[(size_t)rc * conv_dim + channel(tid)] = ring_x;
            const unsigned long long *xh = xtag;
            if (tid < 2 * DL_DK) { /* qa <- S^T k, ka <- S^T q (unnormalised), summed in block order */
                float v[DL_SPLIT], a = 0.0f;
                tag_read<DL_SPLIT>(xh + tid, DL_X1_SLOT, e, v);
#pragma unroll
                for (int b2 = 0; b2 < DL_SPLIT; b2++) a += v[b2];
                (tid < DL_DK ? qa : ka)[tid & (DL_DK - 1)] = a;
                if (tid < 3) {
                    tag_read<DL_SPLIT>(xh + 288 + tid, DL_X1_SLOT, e, v);
                    a = 0.0f;
#pragma unroll
                    for (int b2 = 0; b2 < DL_SPLIT; b2++) a += v[b2];
                    nrm[tid] = a;
                }
            } else { /* oa <- v, za <- z of the head */
                const int i = tid - 2 * DL_DK, c = i & (DL_DK - 1);
                float x;
                tag_read<1>(xh + (size_t)(c / DL_COLS) * DL_X1_SLOT + 2 * DL_DK + (i < DL_DK ? 0 : DL_COLS) +
                                c % DL_COLS,
                            0, e, &x);
                (i < DL_DK ? oa : za)[c] = x;
            }
        }
        __syncthreads();
        Q35_TRACE_PROBE(4);
        /* 5'. The step for the head's 128 value columns (every block alike), then the block's 16 state rows. */
        const float rq = rsqrtf(nrm[0] + 1e-6f) * (1.0f / sqrtf((float)dk)), rk = rsqrtf(nrm[1] + 1e-6f);
        const float kq = nrm[2] * rq * rk;
        float beta, decay;
        dn_gates(prow[4 * DL_COLS], prow[4 * DL_COLS + 1], dt_bias, A_log, &beta, &decay);
        if (tid < dv) {
            const float delta = beta * (oa[tid] - decay * (qa[tid] * rk));
            dlf[tid] = delta;
            oa[tid] = rbf(fmaf(delta, kq, decay * (ka[tid] * rq)));
        }
        __syncthreads();
        Q35_TRACE_PROBE(5);
        { /* S'[e0 + r][c] = decay S + k^[e0 + r] delta[c]: 16 x 128 floats, 4 per thread */
            const int r = tid / (DL_DK / 4), c = 4 * (tid % (DL_DK / 4));
            const float kr = ck[r] * rk;
            const float4 sv4 = *reinterpret_cast<const float4 *>(st + r * DL_DK + c);
            const float4 d4 = *reinterpret_cast<const float4 *>(dlf + c);
            *reinterpret_cast<float4 *>(p.S + ((size_t)j * dk + e0 + r) * dv + c) =
                make_float4(fmaf(kr, d4.x, decay * sv4.x), fmaf(kr, d4.y, decay * sv4.y), fmaf(kr, d4.z, decay * sv4.z),
                            fmaf(kr, d4.w, decay * sv4.w));
        }
        if (p.o && tid < DL_COLS) p.o[(size_t)j * dv + e0 + tid] = oa[e0 + tid];
    } else {
        /* 4. The head's conv'd q and k to every block of the head (cluster mode). */
        {
            if (tid < 3 * DL_COLS) p.conv_ring[(size_t)rc * conv_dim + channel(tid)] = ring_x;
            cluster_wait(); /* every block of the cluster has started */
            if (tid < 8 * DL_SPLIT) {
                const unsigned rank = (unsigned)(tid >> 3);
                const int pc = tid & 7;
                const float *src = pc < 4 ? cq + 4 * pc : ck + 4 * (pc - 4);
                float *dst = pc < 4 ? qa + e0 + 4 * pc : ka + e0 + 4 * (pc - 4);
                st_dsmem4(dst, rank, *reinterpret_cast<const float4 *>(src));
            }
            cluster_arrive_release();
            cluster_wait();
        }
        __syncthreads();
        Q35_TRACE_PROBE(4);

        /* 5. The step (deltanet.cu with gated_out, nt = 128, tpr = 4, VEC = 4), threads < 128. */
        float ssq = 0.0f, ssk = 0.0f, sqk = 0.0f;
        if (tid < dk) {
            const float cqv = qa[tid], ckv = ka[tid];
            ssq = fmaf(cqv, cqv, ssq);
            ssk = fmaf(ckv, ckv, ssk);
            sqk = fmaf(cqv, ckv, sqk);
        }
        block_sum3(&ssq, &ssk, &sqk, red3); /* warps >= 4 add zeros: the 128-thread kernel's sums */
        const float rq = rsqrtf(ssq + 1e-6f) * (1.0f / sqrtf((float)dk)), rk = rsqrtf(ssk + 1e-6f);
        const float kq = sqk * rq * rk;
        float beta, decay;
        dn_gates(prow[4 * DL_COLS], prow[4 * DL_COLS + 1], dt_bias, A_log, &beta, &decay);
        constexpr int TPR = 4, NRL = DL_DK / TPR; /* 32 row lanes x 4 rows each */
        const int cg = tid % TPR, rl = tid / TPR;
        float sv[4][4], kd[4];
        if (tid < dk) {
            float qd[4], mem[4], sq[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int d = rl + i * NRL;
                const float4 t = *reinterpret_cast<const float4 *>(st + d * DL_COLS + cg * 4);
                sv[i][0] = t.x;
                sv[i][1] = t.y;
                sv[i][2] = t.z;
                sv[i][3] = t.w;
                kd[i] = ka[d] * rk;
                qd[i] = qa[d] * rq;
            }
#pragma unroll
            for (int v = 0; v < 4; v++) {
                float m = 0.0f, q = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; i++) m = fmaf(sv[i][v], kd[i], m), q = fmaf(sv[i][v], qd[i], q);
                for (int o = 16; o >= TPR; o >>= 1) {
                    m += __shfl_xor_sync(0xffffffffu, m, o);
                    q += __shfl_xor_sync(0xffffffffu, q, o);
                }
                mem[v] = m;
                sq[v] = q;
            }
            if (lane < TPR)
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    red_m[warp * DL_COLS + cg * 4 + v] = mem[v];
                    red_s[warp * DL_COLS + cg * 4 + v] = sq[v];
                }
        }
        __syncthreads();
        if (tid < DL_COLS) {
            float m = 0.0f, q = 0.0f;
            for (int ww = 0; ww < dk / 32; ww++) m += red_m[ww * DL_COLS + tid], q += red_s[ww * DL_COLS + tid];
            const float delta = beta * (pv[tid] - decay * m);
            dl[tid] = delta;
            ob[tid] = rbf(fmaf(delta, kq, decay * q));
        }
        __syncthreads();
        Q35_TRACE_PROBE(5);
        auto store_state = [&] { /* S' = decay S + k^ delta^T; o for tests */
                                 if (tid < dk) {
#pragma unroll
                                     for (int i = 0; i < 4; i++) {
                                         const int d = rl + i * NRL;
                                         float t[4];
#pragma unroll
                                         for (int v = 0; v < 4; v++)
                                             t[v] = fmaf(kd[i], dl[cg * 4 + v], decay * sv[i][v]);
                                         *reinterpret_cast<float4 *>(p.S + ((size_t)j * dk + d) * dv + e0 + cg * 4) =
                                             make_float4(t[0], t[1], t[2], t[3]);
                                     }
                                 }
                                 if (p.o && tid < DL_COLS) p.o[(size_t)j * dv + e0 + tid] = ob[tid];
        };

        /* 6. The head's o and z to every block (cluster mode); the gated norm (MV_IN_GATED's formula and order). */
        {
            store_state();
            if (tid < 8 * DL_SPLIT) {
                const unsigned rank = (unsigned)(tid >> 3);
                const int pc = tid & 7;
                const float *src = pc < 4 ? ob + 4 * pc : zv + 4 * (pc - 4);
                float *dst = pc < 4 ? oa + e0 + 4 * pc : za + e0 + 4 * (pc - 4);
                st_dsmem4(dst, rank, *reinterpret_cast<const float4 *>(src));
            }
            cluster_arrive_release();
            cluster_wait(); /* no remote access after this point */
        }
    } /* ONEX */
    __syncthreads();
    if (warp == 0) {
        float ss = 0.0f;
        for (int c = lane; c < dv; c += 32) ss = fmaf(oa[c], oa[c], ss);
        ss = warp_sum(ss);
        if (lane == 0) rstd_s = rsqrtf(ss / (float)dv + p.eps);
    }
    __syncthreads();
    if (tid < dv) {
        const float z = za[tid], u = rbf(oa[tid] * rstd_s), wu = rbf(gnw * u);
        gs[tid] = rbf(wu * (silu_acc(z)));
    }
    __syncthreads();
    Q35_TRACE_PROBE(6);

    /* 7. y[s D/8 + r] += W_out[s D/8 + r][head j] . g: 4-row groups per warp, lane = 4 columns. */
    for (int g = warp; g < orows / 4; g += DL_WARPS) {
        float acc[4];
        const float4 gv = *reinterpret_cast<const float4 *>(gs + 4 * lane);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if constexpr (F8) { /* 4 e4m3 bytes; the row's scale (head j's columns: one 128-column block) after */
                const uint32_t wv = *reinterpret_cast<const uint32_t *>(reinterpret_cast<const uint8_t *>(wo) +
                                                                        (size_t)(4 * g + r) * DL_DK + 4 * lane);
                const float2 lo = e4m3x2_f32(wv), hi = e4m3x2_f32(wv >> 16);
                float a = lo.x * gv.x;
                a = fmaf(lo.y, gv.y, a);
                a = fmaf(hi.x, gv.z, a);
                acc[r] = fmaf(hi.y, gv.w, a);
            } else {
                const uint2 wv = *reinterpret_cast<const uint2 *>(wo + (size_t)(4 * g + r) * DL_DK + 4 * lane);
                float a = bf_lo(wv.x) * gv.x;
                a = fmaf(bf_hi(wv.x), gv.y, a);
                a = fmaf(bf_lo(wv.y), gv.z, a);
                acc[r] = fmaf(bf_hi(wv.y), gv.w, a);
            }
        }
        float sum = warp_sum_rows4(acc, lane);
        if constexpr (F8)
            sum *= (lane & 7) == 0 ? __ldg(p.s_out + (size_t)j * ((D + 3) & ~3) + s * orows + 4 * g + (lane >> 3))
                                   : 1.0f;
        if ((lane & 7) == 0) atomicAdd(p.y + s * orows + 4 * g + (lane >> 3), sum);
    }
    Q35_TRACE_END(50);
}

/* Max active clusters of 8 (cluster mode) or blocks per SM x SMs >= grid (global-memory exchange), for one instance
 * of the kernel. */
static int dl_fit_kernel(void (*kern)(DnLayerParams), int D, int K, int Hv, int cluster) {
    int dev = 0, optin = 0, n_sm = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    const size_t smem = dl_smem_bytes(D, K);
    if (smem + 8192 > (size_t)optin ||
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (!cluster) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, DL_THREADS, smem) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        return (long long)n * n_sm >= (long long)DL_SPLIT * Hv; /* every block resident at once: the spin is safe */
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(DL_SPLIT, (unsigned)Hv);
    cfg.blockDim = dim3(DL_THREADS);
    cfg.dynamicSmemBytes = smem;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = DL_SPLIT;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n >= Hv; /* every head's cluster resident at once */
}
/* Both weight formats' instances fit (the tagged words' spins and the clusters need every block resident). */
static int dl_fit_query(int D, int K, int Hv, int cluster) {
    return cluster ? dl_fit_kernel(dn_layer_k<false, false>, D, K, Hv, 1) &&
                         dl_fit_kernel(dn_layer_k<false, true>, D, K, Hv, 1)
                   : dl_fit_kernel(dn_layer_k<true, false>, D, K, Hv, 0) &&
                         dl_fit_kernel(dn_layer_k<true, true>, D, K, Hv, 0);
}
/* dl_fit_query, remembered per exchange mode for the last (device, D, K, Hv): cuda_dn_layer checks it at every
 * launch (per layer and token when the step runs without a graph); its kernel attribute, once set, stays set. */
static int dl_fit(int D, int K, int Hv, int cluster) {
    static int key[2][4], val[2], have[2];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    const int k[4] = {dev, D, K, Hv};
    const int c = cluster ? 1 : 0;
    if (have[c] && !memcmp(key[c], k, sizeof k)) return val[c];
    val[c] = dl_fit_query(D, K, Hv, cluster);
    memcpy(key[c], k, sizeof k);
    have[c] = 1;
    return val[c];
}

extern "C" int cuda_dn_layer_supported(int D, int Hk, int Hv, int dk, int dv, int K) {
    if (Hk != Hv || dk != DL_DK || dv != DL_DK || D < 32 || D % 32 || K < 2 || K > 64 || Hv < 1 || Hv > 65535) return 0;
    return dl_fit(D, K, Hv, 1) ? 2 : dl_fit(D, K, Hv, 0) ? 1 : 0;
}

extern "C" size_t cuda_dn_layer_xbuf_floats(int Hv) {
    /* per head: the two exchanges' 4 x 128 or ONEX's 8 float slots, then ONEX 2's 8 slots of 64-bit tagged words */
    return (size_t)Hv * DL_SPLIT * DL_X1_SLOT * 3;
}
extern "C" size_t cuda_dn_layer_xcnt_count(int Hv, int stride) { return (size_t)2 * Hv * (stride > 0 ? stride : 1); }

extern "C" int cuda_dn_layer(const DnLayerParams *p, const CudaLaunch *l) {
    const bool f8 = p && p->w8_in;
    if (p && (f8 ? (p->w_in || p->w_out || !p->s_in || !p->w_ba || !p->w8_out || !p->s_out || p->D % 16)
                 : (!p->w_in || !p->w_out || p->w_ba || p->w8_out)))
        return (int)cudaErrorInvalidValue;
    if (!p || !l || !p->ln1 || !p->conv_w || !p->conv_ring || !p->A_log || !p->dt_bias || !p->norm_w ||
        !p->S || !p->y || !p->step || (!p->embed && !p->x) || p->Hk != p->Hv || p->dk != DL_DK ||
        p->dv != DL_DK || p->D < 32 || p->D % 32 || p->K < 2 || p->Hv < 1 || p->Hv > 65535 ||
        ((p->zero0 || p->zero1) && p->n_zero < 0) || !p->xbuf != !p->xcnt || p->xcnt_stride < 0 || p->xcnt_stride > 64)
        return (int)cudaErrorInvalidValue;
    const size_t smem = dl_smem_bytes(p->D, p->K);
    const dim3 grid(DL_SPLIT, (unsigned)p->Hv), block(DL_THREADS);
    if (p->xbuf) { /* the tagged words' spins need every block resident */
        if (!dl_fit(p->D, p->K, p->Hv, 0)) return (int)cudaErrorInvalidConfiguration;
        /* the bf16 sizes: the FP8 instance's W_out slice uses half (dl_fit sized and attributed both instances) */
        return launch_kernel(f8 ? dn_layer_k<true, true> : dn_layer_k<true, false>, grid, block, smem, l, *p);
    }
    void (*kern)(DnLayerParams) = f8 ? dn_layer_k<false, true> : dn_layer_k<false, false>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)e;
    }
    return launch_cluster(kern, grid, block, smem, DL_SPLIT, l, *p);
}

Q35_TRACE_FETCH_FN(cuda_trace_fetch_dn_layer)
