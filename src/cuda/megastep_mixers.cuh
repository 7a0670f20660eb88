/* megastep_mixers.cuh — the persistent kernel's mixer phases: the DeltaNet step items and the attention items + merge.
 * Included by megastep.cu only (one translation unit: device code needs no -rdc). */
#ifndef Q35_CUDA_MEGASTEP_MIXERS_CUH
#define Q35_CUDA_MEGASTEP_MIXERS_CUH

/* ---- DeltaNet step -------------------------------------------------------------------------- */


struct DnPre {
    float st[2][4]; /* state rows rl, rl + 128 x this thread's 4 columns */
};

/* Small-scratch layout (floats): hist, tap, cv (conv outputs) [2 dk + 16 each]; dl [16];
 * red_m, red_s [MG_CW][16]. */
__device__ __forceinline__ void dn_load(const MegaParams &p, const MegaLayer &ly, int item, MgSm &s, DnPre &pre) {
    const int dk = p.dk, dv = p.dv, nsp = (dv + DN_COLS - 1) / DN_COLS;
    const int j = item / nsp, e0 = (item % nsp) * DN_COLS, ncols = min(DN_COLS, dv - e0);
    const int n = j / (p.Hv / p.Hk), key_dim = p.Hk * dk, tid = threadIdx.x, cg = tid & 3, rl = tid >> 2;
    const float *Sh = ly.S + (size_t)j * dk * dv + e0 + cg * 4;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int d = rl + 128 * i;
        if (d < dk && cg * 4 < ncols) {
            const float4 t = *reinterpret_cast<const float4 *>(Sh + (size_t)d * dv);
            pre.st[i][0] = t.x, pre.st[i][1] = t.y, pre.st[i][2] = t.z, pre.st[i][3] = t.w;
        } else {
            pre.st[i][0] = pre.st[i][1] = pre.st[i][2] = pre.st[i][3] = 0.0f;
        }
    }
    /* conv history of the q, k channels of key head n and of this item's v channels */
    const int nch = 2 * dk + ncols, pos = p.step->pos, rc = pos % p.K;
    float *hist = s.small, *tap = hist + 2 * dk + DN_COLS;
    for (int i = tid; i < nch; i += MG_CT) {
        const int ch = i < dk ? n * dk + i : i < 2 * dk ? key_dim + n * dk + i - dk : 2 * key_dim + j * dv + e0 + i - 2 * dk;
        const float *w = ly.conv_w + (size_t)ch * p.K;
        float acc = 0.0f;
        for (int t = 0; t < p.K - 1; t++) {
            int row = rc + 1 + t;
            row -= row >= p.K ? p.K : 0;
            acc = fmaf(w[t], bf16u(ly.conv_ring[(size_t)row * p.conv_dim + ch]), acc);
        }
        hist[i] = acc;
        tap[i] = w[p.K - 1];
    }
}

__device__ void dn_compute(const MegaParams &p, const MegaLayer &ly, int item, MgSm &s, DnPre &pre) {
    const int dk = p.dk, dv = p.dv, Hv = p.Hv, nsp = (dv + DN_COLS - 1) / DN_COLS;
    const int j = item / nsp, sp = item % nsp, e0 = sp * DN_COLS, ncols = min(DN_COLS, dv - e0);
    const int n = j / (Hv / p.Hk), key_dim = p.Hk * dk, value_dim = p.value_dim, conv_dim = p.conv_dim;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, cg = tid & 3, rl = tid >> 2;
    const int nch = 2 * dk + ncols, pos = p.step->pos, rc = pos % p.K;
    float *hist = s.small, *tap = hist + 2 * dk + DN_COLS, *cv = tap + 2 * dk + DN_COLS;
    float *dl = cv + 2 * dk + DN_COLS, *red_m = dl + DN_COLS, *red_s = red_m + MG_CW * DN_COLS;

    /* conv + SiLU; the current inputs go to the ring row rc (q/k by one item per key head) */
    uint16_t *ring_row = ly.conv_ring + (size_t)rc * conv_dim;
    const bool qk_writer = sp == 0 && j % (Hv / p.Hk) == 0;
    float ssq = 0.0f, ssk = 0.0f, sqk = 0.0f;
    for (int i = tid; i < nch; i += MG_CT) {
        const int ch = i < dk ? n * dk + i : i < 2 * dk ? key_dim + n * dk + i - dk : 2 * key_dim + j * dv + e0 + i - 2 * dk;
        const float x = __ldcg(p.proj + ch);
        cv[i] = rbf(mg_silu(rbf(fmaf(tap[i], x, hist[i]))));
        if (i >= 2 * dk || qk_writer) ring_row[ch] = mg_bits(x);
    }
    cbar();
    for (int d = tid; d < dk; d += MG_CT) {
        const float q = cv[d], k = cv[dk + d];
        ssq = fmaf(q, q, ssq), ssk = fmaf(k, k, ssk), sqk = fmaf(q, k, sqk);
    }
    ssq = csum(ssq, s.red), ssk = csum(ssk, s.red), sqk = csum(sqk, s.red);
    const float rq = rsqrtf(ssq + 1e-6f) * (1.0f / sqrtf((float)dk)), rk = rsqrtf(ssk + 1e-6f);
    const float kq = sqk * rq * rk;
    const float *tail = p.proj + conv_dim + value_dim;
    const float b_in = __ldcg(tail + j), a_in = __ldcg(tail + Hv + j);
    const float beta = rbf(1.0f / (1.0f + expf(-b_in)));
    const float xa = a_in + ly.dt_bias[j];
    const float decay = expf(-expf(ly.A_log[j]) * (xa > 20.0f ? xa : log1pf(expf(xa))));

    /* mem = S^T k^, sq = S^T q^ per column: rows in registers, then lanes, then warps */
    float kd[2], qd[2], mem[4], sq[4];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int d = rl + 128 * i;
        kd[i] = d < dk ? cv[dk + d] * rk : 0.0f;
        qd[i] = d < dk ? cv[d] * rq : 0.0f;
    }
#pragma unroll
    for (int v = 0; v < 4; v++) {
        float m = 0.0f, q = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; i++) m = fmaf(pre.st[i][v], kd[i], m), q = fmaf(pre.st[i][v], qd[i], q);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
            m += __shfl_xor_sync(0xffffffffu, m, o), q += __shfl_xor_sync(0xffffffffu, q, o);
        mem[v] = m, sq[v] = q;
    }
    if (lane < 4)
#pragma unroll
        for (int v = 0; v < 4; v++) red_m[w * DN_COLS + lane * 4 + v] = mem[v], red_s[w * DN_COLS + lane * 4 + v] = sq[v];
    cbar();
    if (tid < ncols) {
        float m = 0.0f, q = 0.0f;
        for (int k = 0; k < MG_CW; k++) m += red_m[k * DN_COLS + tid], q += red_s[k * DN_COLS + tid];
        const float delta = beta * (cv[2 * dk + tid] - decay * m);
        dl[tid] = delta;
        p.mix[(size_t)j * dv + e0 + tid] = rbf(fmaf(delta, kq, decay * q));
    }
    cbar();
    /* S' = decay S + k^ delta^T */
    float *Sh = ly.S + (size_t)j * dk * dv + e0 + cg * 4;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int d = rl + 128 * i;
        if (d < dk && cg * 4 < ncols) {
            float4 t;
            t.x = fmaf(kd[i], dl[cg * 4 + 0], decay * pre.st[i][0]);
            t.y = fmaf(kd[i], dl[cg * 4 + 1], decay * pre.st[i][1]);
            t.z = fmaf(kd[i], dl[cg * 4 + 2], decay * pre.st[i][2]);
            t.w = fmaf(kd[i], dl[cg * 4 + 3], decay * pre.st[i][3]);
            *reinterpret_cast<float4 *>(Sh + (size_t)d * dv) = t;
        }
    }
    cbar(); /* scratch reuse by a next item */
}

/* ---- attention ------------------------------------------------------------------------------- */

__device__ __forceinline__ int mg_nsplit(const MegaParams &p, int kv_len) {
    const int n = (kv_len + MG_MIN_CHUNK - 1) / MG_MIN_CHUNK;
    return max(1, min(n, p.nsplit));
}

/* Small-scratch layout (floats): cs, sn [hd/2 each]; qs [Hq/Hkv][hd]; kn [hd]; wm, wl [MG_CW][4]. */
__device__ __forceinline__ void att_pre(const MegaParams &p, const MegaLayer &ly, MgSm &s) {
    const int pos = p.step->pos, kv_len = pos + 1, ns = mg_nsplit(p, kv_len);
    const int chunk = (kv_len + ns - 1) / ns, hd = p.hd;
    float *cs = s.small, *sn = cs + hd / 2;
    for (int i = threadIdx.x; i < p.R / 2; i += MG_CT) {
        float c, sv;
        sincosf((float)pos * p.inv_freq[i], &sv, &c);
        cs[i] = rbf(c), sn[i] = rbf(sv);
    }
    /* this block's first item: pull its cached rows of earlier tokens towards L2 */
    const int item = blockIdx.x;
    if (item < p.Hkv * ns && threadIdx.x == 0) {
        const int h = item / ns, t0 = (item % ns) * chunk, t1 = min(pos, t0 + chunk);
        if (t1 > t0) {
            const size_t off = ((size_t)h * p.max_seq + t0) * hd * 2, bytes = (size_t)(t1 - t0) * hd * 2;
            const char *k = reinterpret_cast<const char *>(ly.Kc) + off, *v = reinterpret_cast<const char *>(ly.Vc) + off;
            for (size_t o = 0; o < bytes; o += 65536) {
                const unsigned sz = (unsigned)min((size_t)65536, bytes - o);
                l2_prefetch(k + o, sz);
                l2_prefetch(v + o, sz);
            }
        }
    }
}

/* One warp: dst[hd] = rope(norm(x)) (q/k head), with cs/sn from att_pre. */
__device__ __forceinline__ void att_head(const MegaParams &p, const float *x, const float *w, float *dst,
                                         const float *cs, const float *sn) {
    const int lane = threadIdx.x & 31, hd = p.hd, half = p.R / 2;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
        const float v = __ldcg(x + i);
        dst[i] = v;
        ss = fmaf(v, v, ss);
    }
    const float r = rsqrtf(warp_sum(ss) / (float)hd + p.eps);
    for (int i = lane; i < hd; i += 32) dst[i] = norm_apply(dst[i], r, w[i], p.norm_mode);
    __syncwarp();
    for (int i = lane; i < half; i += 32) {
        const float a = dst[i], b = dst[i + half];
        dst[i] = rbf(rbf(a * cs[i]) - rbf(b * sn[i]));
        dst[i + half] = rbf(rbf(b * cs[i]) + rbf(a * sn[i]));
    }
    __syncwarp();
}

/* Online-softmax merge of (m2, l2, o2) into (m, l, o); -inf marks "no positions". */
template <int GQ>
__device__ __forceinline__ void att_merge(float *m, float *l, float (*o)[8], const float *m2, const float *l2,
                                          const float (*o2)[8]) {
#pragma unroll
    for (int g = 0; g < GQ; g++) {
        const float M = fmaxf(m[g], m2[g]);
        if (M == -INFINITY) continue;
        const float f1 = exp2f(m[g] - M), f2 = exp2f(m2[g] - M);
        l[g] = l[g] * f1 + l2[g] * f2;
#pragma unroll
        for (int k = 0; k < 8; k++) o[g][k] = o[g][k] * f1 + o2[g][k] * f2;
        m[g] = M;
    }
}

/* Query heads hq0 .. hq0+GQ-1 of kv head h over positions [t0, t1): partials into work[.][sp]. */
template <int GQ>
__device__ void att_group(const MegaParams &p, const MegaLayer &ly, MgSm &s, int h, int hq0, int qi0, int sp, int t0,
                          int t1) {
    const int hd = p.hd, LP = hd / 8, PW = 32 / LP, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int sg = lane / LP, li = lane % LP, gq = p.Hq / p.Hkv;
    const float *qs = s.small + hd; /* after cs, sn */
    float *wm = s.small + hd + (gq + 1) * hd, *wl = wm + MG_CW * 4;
    const float qscale = 1.4426950408889634f / sqrtf((float)hd);
    float q[GQ][8], o[GQ][8], m[GQ], l[GQ];
#pragma unroll
    for (int g = 0; g < GQ; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) q[g][k] = qs[(qi0 + g) * hd + li * 8 + k] * qscale, o[g][k] = 0.0f;
    }
    const uint16_t *Kh = ly.Kc + (size_t)h * p.max_seq * hd + li * 8, *Vh = ly.Vc + (size_t)h * p.max_seq * hd + li * 8;
    for (int tb = t0 + w * PW * 2; tb < t1; tb += MG_CW * PW * 2) {
        uint4 kr[2], vr[2];
        bool ok[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int t = tb + u * PW + sg;
            ok[u] = t < t1;
            if (ok[u]) {
                kr[u] = *reinterpret_cast<const uint4 *>(Kh + (size_t)t * hd);
                vr[u] = *reinterpret_cast<const uint4 *>(Vh + (size_t)t * hd);
            } else {
                kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int g = 0; g < GQ; g++) {
            float sc[2];
#pragma unroll
            for (int u = 0; u < 2; u++) {
                float d = dot8(kr[u], q[g], 0.0f);
                for (int x = LP / 2; x > 0; x >>= 1) d += __shfl_xor_sync(0xffffffffu, d, x);
                sc[u] = ok[u] ? d : -INFINITY;
            }
            const float mx = fmaxf(m[g], fmaxf(sc[0], sc[1]));
            if (mx == -INFINITY) continue;
            const float alpha = exp2f(m[g] - mx), p0 = exp2f(sc[0] - mx), p1 = exp2f(sc[1] - mx);
            l[g] = l[g] * alpha + p0 + p1;
            const uint32_t v0[4] = {vr[0].x, vr[0].y, vr[0].z, vr[0].w}, v1[4] = {vr[1].x, vr[1].y, vr[1].z, vr[1].w};
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float a = k & 1 ? bf_hi(v0[k >> 1]) : bf_lo(v0[k >> 1]);
                const float b = k & 1 ? bf_hi(v1[k >> 1]) : bf_lo(v1[k >> 1]);
                o[g][k] = fmaf(p1, b, fmaf(p0, a, o[g][k] * alpha));
            }
            m[g] = mx;
        }
    }
    /* sub-groups of the warp -> one partial per warp */
    for (int x = LP; x < 32; x <<= 1) {
        float m2[GQ], l2[GQ], o2[GQ][8];
#pragma unroll
        for (int g = 0; g < GQ; g++) {
            m2[g] = __shfl_xor_sync(0xffffffffu, m[g], x);
            l2[g] = __shfl_xor_sync(0xffffffffu, l[g], x);
#pragma unroll
            for (int k = 0; k < 8; k++) o2[g][k] = __shfl_xor_sync(0xffffffffu, o[g][k], x);
        }
        att_merge<GQ>(m, l, o, m2, l2, o2);
    }
    /* warps 8..15 hand over to warps 0..7, then 8 partials merged per (head, dim) */
    float *wo = s.big; /* [8][GQ][hd] */
    for (int round = 0; round < 2; round++) {
        const bool writer = round == 0 ? w >= MG_CW / 2 : w < MG_CW / 2;
        const int slot = w % (MG_CW / 2);
        if (writer) {
            if (sg == 0)
#pragma unroll
                for (int g = 0; g < GQ; g++)
#pragma unroll
                    for (int k = 0; k < 8; k++) wo[(slot * GQ + g) * hd + li * 8 + k] = o[g][k];
            if (lane == 0)
#pragma unroll
                for (int g = 0; g < GQ; g++) wm[slot * 4 + g] = m[g], wl[slot * 4 + g] = l[g];
        }
        cbar();
        if (round == 0 && w < MG_CW / 2) {
            float m2[GQ], l2[GQ], o2[GQ][8];
#pragma unroll
            for (int g = 0; g < GQ; g++) {
                m2[g] = wm[slot * 4 + g], l2[g] = wl[slot * 4 + g];
#pragma unroll
                for (int k = 0; k < 8; k++) o2[g][k] = wo[(slot * GQ + g) * hd + li * 8 + k];
            }
            att_merge<GQ>(m, l, o, m2, l2, o2);
        }
        cbar();
    }
    const int ns_max = p.nsplit;
    for (int idx = threadIdx.x; idx < GQ * hd; idx += MG_CT) {
        const int g = idx / hd, d = idx % hd;
        float M = -INFINITY;
        for (int k = 0; k < MG_CW / 2; k++) M = fmaxf(M, wm[k * 4 + g]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY)
            for (int k = 0; k < MG_CW / 2; k++) {
                const float f = exp2f(wm[k * 4 + g] - M);
                L = fmaf(wl[k * 4 + g], f, L);
                O = fmaf(wo[(k * GQ + g) * hd + d], f, O);
            }
        float *dst = p.work + ((size_t)(hq0 + g) * ns_max + sp) * (hd + 2);
        dst[d] = O;
        if (d == 0) dst[hd] = M, dst[hd + 1] = L;
    }
    cbar();
}

__device__ void att_items(const MegaParams &p, const MegaLayer &ly, MgSm &s) {
    const int pos = p.step->pos, kv_len = pos + 1, ns = mg_nsplit(p, kv_len), chunk = (kv_len + ns - 1) / ns;
    const int hd = p.hd, gq = p.Hq / p.Hkv, q_stride = p.gated ? 2 * hd : hd, q_rows = p.Hq * q_stride;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float *cs = s.small, *sn = cs + hd / 2;
    float *qs = s.small + hd, *kn = qs + gq * hd;
    for (int item = blockIdx.x; item < p.Hkv * ns; item += gridDim.x) {
        const int h = item / ns, sp = item % ns, t0 = sp * chunk, t1 = min(kv_len, t0 + chunk);
        const bool owns_pos = t0 < t1 && t1 == kv_len;
        for (int it = w; it < gq + (owns_pos ? 1 : 0); it += MG_CW) {
            if (it < gq) {
                att_head(p, p.proj + (size_t)(h * gq + it) * q_stride, ly.q_norm, qs + it * hd, cs, sn);
            } else {
                att_head(p, p.proj + q_rows + (size_t)h * hd, ly.k_norm, kn, cs, sn);
                const float *v = p.proj + q_rows + (size_t)(p.Hkv + h) * hd;
                uint16_t *kd = ly.Kc + ((size_t)h * p.max_seq + pos) * hd, *vd = ly.Vc + ((size_t)h * p.max_seq + pos) * hd;
                for (int d = lane; d < hd; d += 32) kd[d] = mg_bits(kn[d]), vd[d] = mg_bits(__ldcg(v + d));
            }
        }
        cbar(); /* qs ready; K/V[pos] visible to this block */
        /* two query heads per pass (4 spill registers at the 120-register cap) */
        const int GQ = gq % 2 == 0 ? 2 : 1;
        for (int g0 = 0; g0 < gq; g0 += GQ) {
            if (GQ == 2) att_group<2>(p, ly, s, h, h * gq + g0, g0, sp, t0, t1);
            else att_group<1>(p, ly, s, h, h * gq + g0, g0, sp, t0, t1);
        }
    }
}

/* mix[hq][d] = bf16(sum_s 2^(m_s-M) O_s / sum_s 2^(m_s-M) l_s), times bf16(sigmoid(gate)) when gated. */
__device__ void att_combine(const MegaParams &p) {
    const int kv_len = p.step->pos + 1, ns = mg_nsplit(p, kv_len), hd = p.hd;
    for (int idx = blockIdx.x * MG_CT + threadIdx.x; idx < p.Hq * hd; idx += gridDim.x * MG_CT) {
        const int hq = idx / hd, d = idx % hd;
        const float *src = p.work + (size_t)hq * p.nsplit * (hd + 2);
        float M = -INFINITY;
        for (int s = 0; s < ns; s++) M = fmaxf(M, __ldcg(src + (size_t)s * (hd + 2) + hd));
        float L = 0.0f, O = 0.0f;
        for (int s = 0; s < ns; s++) {
            const float *r = src + (size_t)s * (hd + 2);
            const float f = exp2f(__ldcg(r + hd) - M);
            L = fmaf(__ldcg(r + hd + 1), f, L);
            O = fmaf(__ldcg(r + d), f, O);
        }
        float out = rbf(O / L);
        if (p.gated) out = rbf(out * rbf(1.0f / (1.0f + expf(-__ldcg(p.proj + (size_t)hq * 2 * hd + hd + d)))));
        p.mix[idx] = out;
    }
}

#endif
