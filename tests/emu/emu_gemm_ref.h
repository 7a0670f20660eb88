/* emu_gemm_ref.h — a GEMM epilogue's output for the GEMM emulations (gemm_emu.cpp, gemm_fp8_emu.cpp; include after
 * emu.h and cuda/ops.h): its start, and its reference with a bound. From the output column's exact sum s and its sum
 * of |terms| a over kk terms (SwiGLU: the gate's g, ag and the up's up, au), and y0 the value += fp32 adds to:
 *   e = kk 6e-8 a (fp32 accumulation), u = 2^-7;
 *   bf16 / fp32: ref = bf16(s), |y - ref| <= e + u |s|;  += fp32: ref = bf16(y0 + bf16(s)), <= e + u (|s| + |ref|);
 *   SwiGLU: ref = bf16(bf16(silu(bf16 g)) bf16(up)), the same bounds propagated through it. */
#pragma once

static inline void emu_epi_ref(int epi, double kk, double s, double a, double up, double au, float y0, double *ref,
                               double *tol) {
    const double u = 1.0 / 128;
    if (epi == GEMM_EPI_SWIGLU_BF16) {
        const double eg = kk * 6e-8 * a + u * fabs(s), eu = kk * 6e-8 * au + u * fabs(up);
        const float act = rbf(silu_f(rbf((float)s)));
        *ref = rbf(act * rbf((float)up));
        const double dact = 1.1 * eg + u * fabs(act);
        *tol = fabs(up) * dact + fabs(act) * eu + dact * eu + u * fabs(*ref) + 1e-30;
        return;
    }
    const double e = kk * 6e-8 * a;
    if (epi == GEMM_EPI_ADD_F32) {
        *ref = rbf(y0 + rbf((float)s));
        *tol = e + u * (fabs(s) + fabs(*ref)) + 1e-30;
    } else {
        *ref = rbf((float)s);
        *tol = e + u * fabs(s) + 1e-30;
    }
}

/* Y's start (ny elements, rows of ldy, the first ycols written by the epilogue, fp32 when f32, else bf16): NaN where
 * the epilogue writes (+= fp32: random values it adds to), random guards past ycols; y0 keeps the values as floats. */
static inline void emu_y_init(int epi, void *y, float *y0, size_t ny, int ldy, int ycols, bool f32) {
    for (size_t i = 0; i < ny; i++) {
        y0[i] = epi == GEMM_EPI_ADD_F32 || (int)(i % ldy) >= ycols ? rbf(nrm()) : NAN;
        if (f32)
            ((float *)y)[i] = y0[i];
        else
            ((uint16_t *)y)[i] = emu_bf(y0[i]);
    }
}
