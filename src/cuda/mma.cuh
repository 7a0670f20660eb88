/* mma.cuh — tensor-core building blocks of the prefill kernels (gemm.cu, attention_prefill.cu,
 * deltanet_prefill.cu): cp.async with zero fill, ldmatrix (plain and transposed), mma.sync
 * m16n8k16 bf16 x bf16 -> fp32 (f16 x f16 for the paged attention's fp8 values), and the XOR
 * swizzle of 16-byte chunks that keeps ldmatrix free of bank conflicts.
 *
 * Fragment layouts of mma.m16n8k16 (g = lane/4, t = lane%4; each u32 holds two bf16, the lower
 * column in the low half):
 *   A 16x16 row-major: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
 *   B 16x8  (k x n):   b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g]
 *   C 16x8  fp32:      c0,c1 = C[g][2t, 2t+1],  c2,c3 = C[g+8][2t, 2t+1]
 * The C layout of two adjacent n8 tiles equals the A layout of one 16x16 tile (flash attention
 * reuses the probabilities in registers that way). */
#ifndef Q35_CUDA_MMA_CUH
#define Q35_CUDA_MMA_CUH

#include "cuda/async.cuh"
#include "cuda/common.cuh"
#include <cuda_fp16.h>

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Four 8x8 bf16 matrices; lane l gives the address of row l%8 of matrix l/8. */
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* Two 8x8 bf16 matrices; lanes 0-15 give the addresses (row l%8 of matrix l/8): the A fragment's a0, a2 of rows
 * 0-7 (matrix 0: columns k0 .. k0 + 7, matrix 1: k0 + 8 .. k0 + 15) when rows 8-15 are zero. */
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t r[2]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
/* Two 8x8 bf16 matrices, transposed; lanes 0-15 give the addresses (row l%8 of matrix l/8): with
 * ldsm_addr_bk, the B fragment b0, b1 of one n8 tile. */
__device__ __forceinline__ void ldsm_x2_t(uint32_t addr, uint32_t r[2]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}

/* c += a b (m16n8k16, bf16 inputs, fp32 accumulators). */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The same mma on f16 operands (the paged attention's fp8 values: e4m3 codes and the probabilities' hi + lo parts
 * are f16 values; products exact, fp32 sums). */
__device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Two fp32 -> one u32 of two f16 (round to nearest even; lo to the low half), and the halves' values back. */
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float f16_lo(uint32_t u) { return __half2float(__ushort_as_half((unsigned short)u)); }
__device__ __forceinline__ float f16_hi(uint32_t u) {
    return __half2float(__ushort_as_half((unsigned short)(u >> 16)));
}

/* Two fp32 -> one u32 of two bf16 (round to nearest even); lo goes to the low half. */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Byte offset of element (r, k) of an int8 K-major operand of `cols` bytes a row, stored in tiles of R rows: tile
 * r / R, then its pieces of 128 k one after the other (R x 128 bytes each, swizzled as swz<8>: 16-byte chunk c of
 * row i at chunk c ^ (i & 7)), then the next tile. A piece copied as it is into 1024-byte aligned shared memory is a
 * wgmma operand (wgmma_desc; the k-th 32-value slice 32 k bytes into it). cols % 128 == 0. */
__host__ __device__ __forceinline__ size_t swz128_tile_off(long long r, int k, int cols, int R) {
    const long long t = r / R;
    const int i = (int)(r - t * R), c = (k >> 4) & 7;
    return ((size_t)(t * (cols >> 7) + (k >> 7)) * R + i) * 128 + (size_t)(((c ^ (i & 7)) << 4) + (k & 15));
}

/* Swizzled position of 16-byte chunk c of row r in a tile whose rows hold NCH chunks
 * (NCH * 8 bf16): the chunk index is XORed with row bits so that the 8 row addresses of one
 * ldmatrix matrix fall into 8 different 16-byte bank groups. Returns the chunk number in the
 * tile; multiply by 16 for bytes. NCH must be 2, 4 or a multiple of 8 — or SWZ_TMA16: rows of 16
 * chunks as TMA boxes of 64 rows x 8 chunks with 128-byte swizzle write them, [r/64][c/8][r%64][8]
 * (each box is a swz<8> tile). */
#define SWZ_TMA16 (-16)
template <int NCH>
__device__ __forceinline__ int swz(int r, int c) {
    static_assert(NCH == 2 || NCH == 4 || NCH == SWZ_TMA16 || NCH % 8 == 0,
                  "swizzle needs 2, 4 or 8k chunks per row, or SWZ_TMA16");
    if constexpr (NCH == SWZ_TMA16)
        return (((r >> 6) * 2 + (c >> 3)) * 64 + (r & 63)) * 8 + ((c & 7) ^ (r & 7));
    else if constexpr (NCH % 8 == 0)
        return r * NCH + (c ^ (r & 7));
    else if constexpr (NCH == 4)
        return r * NCH + (c ^ ((r >> 1) & 3));
    else
        return r * NCH + (c ^ ((r >> 2) & 1));
}
/* Byte offset of element (r, col) in such a tile. */
template <int NCH>
__device__ __forceinline__ uint32_t swz_off(int r, int col) {
    return (uint32_t)swz<NCH>(r, col >> 3) * 16u + (uint32_t)(col & 7) * 2u;
}

/* ldmatrix addresses for a 16x16 bf16 block at (r0, c0) of a swizzled tile with NCH chunks per
 * row, arranged so that the four result registers are:
 *   ldsm_addr_a:  stored [m][k]  -> A fragment a0..a3 (x4, no trans)
 *   ldsm_addr_bt: stored [n][k]  -> B fragments of two n8 tiles {r0,r1} (n0..7), {r2,r3} (n8..15) (x4)
 *   ldsm_addr_bk: stored [k][n]  -> the same B fragments (x4.trans)
 *   ldsm_addr_at: stored [k][m]  -> A fragment a0..a3 (x4.trans) */
template <int NCH>
__device__ __forceinline__ uint32_t ldsm_addr_a(uint32_t base, int r0, int c0, int lane) {
    return base + swz<NCH>(r0 + (lane & 15), (c0 >> 3) + (lane >> 4)) * 16;
}
template <int NCH>
__device__ __forceinline__ uint32_t ldsm_addr_bt(uint32_t base, int n0, int k0, int lane) {
    return base + swz<NCH>(n0 + (lane & 7) + ((lane >> 4) << 3), (k0 >> 3) + ((lane >> 3) & 1)) * 16;
}
template <int NCH>
__device__ __forceinline__ uint32_t ldsm_addr_bk(uint32_t base, int k0, int n0, int lane) {
    return base + swz<NCH>(k0 + (lane & 15), (n0 >> 3) + (lane >> 4)) * 16;
}
template <int NCH>
__device__ __forceinline__ uint32_t ldsm_addr_at(uint32_t base, int k0, int m0, int lane) {
    return base + swz<NCH>(k0 + (lane & 7) + ((lane >> 4) << 3), (m0 >> 3) + ((lane >> 3) & 1)) * 16;
}

/* ---- Hopper wgmma (sm_90a) ---------------------------------------------------------------
 * A warpgroup (4 warps) computes D[64][N] += A[64][16] B[16][N] with A, B read from shared memory
 * through 64-bit descriptors. Our tiles are "K-major with 128-byte swizzle": rows of 64 bf16
 * (128 B), 16-byte chunk c of row r stored at chunk c ^ (r & 7) (= swz<8>), 8-row groups 1024 B
 * apart, tile base 1024-byte aligned; the k-th 16-column slice starts 32 k bytes into the row.
 * Accumulator layout per warp w of the warpgroup: d[n8][e] = D[16w + g + 8(e>>1)][8 n8 + 2t + (e&1)],
 * i.e. the mma.sync C layout repeated over n8 tiles. */
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr) {
    uint64_t d = (uint64_t)((saddr & 0x3FFFF) >> 4); /* start address */
    d |= (uint64_t)(16 >> 4) << 16;                  /* leading byte offset (unused: K fits one swizzle row) */
    d |= (uint64_t)(1024 >> 4) << 32;                /* stride byte offset: 8 rows x 128 B */
    d |= (uint64_t)1 << 62;                          /* 128-byte swizzle */
    return d;
}
/* The same for an MN-major operand (wgmma's transposed B, imm-trans-b = 1): rows are the K index, each
 * 128-byte row holds 64 consecutive N (or M) elements, 128-byte swizzle as above; 8-row (K) groups
 * 1024 B apart (stride byte offset) and consecutive 64-element N blocks `lbo` bytes apart (leading
 * byte offset; CUTLASS's canonical MN-major SW128 layout ((8,8,n),(8,k)) : ((1,8,LBO),(64,SBO)) in
 * 16-byte units). Checked on the H200 by attention_prefill_wg.cu (test_prefill). */
__device__ __forceinline__ uint64_t wgmma_desc_mn(uint32_t saddr, uint32_t lbo) {
    uint64_t d = (uint64_t)((saddr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)(1024 >> 4) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}
__device__ __forceinline__ void wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the
 * async proxy that wgmma reads through; follow with a barrier. */
__device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Keeps the compiler from moving accumulator reads/writes across wgmma issue/wait. */
__device__ __forceinline__ void reg_fence(float &x) { asm volatile("" : "+f"(x)::"memory"); }
/* reg_fence on every element of a wgmma accumulator array [M][N][4] (around the async wgmmas). */
template <int M, int N>
__device__ __forceinline__ void reg_fence_acc(float (&acc)[M][N][4]) {
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int n = 0; n < N; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) reg_fence(acc[m][n][e]);
}

/* The wgmma wrappers' accumulator operands: d[0..N/8-1][0..3] as "+f" asm operands %0 .. %(N/2 - 1). */
#define WGMMA_D4(i)     "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define WGMMA_D8ROWS(i) /* rows i .. i+7 */                                                                            \
    WGMMA_D4(i), WGMMA_D4(i + 1), WGMMA_D4(i + 2), WGMMA_D4(i + 3), WGMMA_D4(i + 4), WGMMA_D4(i + 5), WGMMA_D4(i + 6), \
        WGMMA_D4(i + 7)
#define WGMMA_D_N64  WGMMA_D8ROWS(0)
#define WGMMA_D_N128 WGMMA_D8ROWS(0), WGMMA_D8ROWS(8)
#define WGMMA_D_N256 WGMMA_D8ROWS(0), WGMMA_D8ROWS(8), WGMMA_D8ROWS(16), WGMMA_D8ROWS(24)

/* d[32][4] += A (64 x 16, smem desc) B (16 x 256, smem desc), both K-major, 128-byte swizzle. */
__device__ __forceinline__ void wgmma_m64n256k16(float (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D_N256
                 : "l"(da), "l"(db), "r"(1));
}

/* d[16][4] += A (64 x 16, smem desc) B (16 x 128, smem desc), both K-major, 128-byte swizzle. */
__device__ __forceinline__ void wgmma_m64n128k16(float (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D_N128
                 : "l"(da), "l"(db), "r"(1));
}

/* d[N / 8][4] += A (64 x 32 s8, smem desc) B (32 x N s8, smem desc), N = 32, 64 or 128, both K-major with the 128-byte
 * swizzle (a row of a tile is 128 k values, one byte each; the k-th 32-value slice starts 32 k bytes into the row),
 * exact int32 sums (the accumulator layout of the bf16 forms). */
#define WGMMA_I4(i)     "+r"(d[i][0]), "+r"(d[i][1]), "+r"(d[i][2]), "+r"(d[i][3])
#define WGMMA_I8ROWS(i) /* rows i .. i+7 */                                                                            \
    WGMMA_I4(i), WGMMA_I4(i + 1), WGMMA_I4(i + 2), WGMMA_I4(i + 3), WGMMA_I4(i + 4), WGMMA_I4(i + 5), WGMMA_I4(i + 6), \
        WGMMA_I4(i + 7)
template <int N>
__device__ __forceinline__ void wgmma_s8(int (*d)[4], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void wgmma_s8<32>(int (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                 "}, %16, %17, p;\n}\n"
                 : WGMMA_I4(0), WGMMA_I4(1), WGMMA_I4(2), WGMMA_I4(3)
                 : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_s8<64>(int (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p;\n}\n"
                 : WGMMA_I8ROWS(0)
                 : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_s8<128>(int (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p;\n}\n"
                 : WGMMA_I8ROWS(0), WGMMA_I8ROWS(8)
                 : "l"(da), "l"(db), "r"(1));
}
/* reg_fence for an int32 accumulator */
__device__ __forceinline__ void reg_fence(int &x) { asm volatile("" : "+r"(x)::"memory"); }

/* d[8][4] += A (64 x 16, smem desc) B (16 x 64, smem desc), both K-major, 128-byte swizzle. */
__device__ __forceinline__ void wgmma_m64n64k16(float (*d)[4], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D_N64
                 : "l"(da), "l"(db), "r"(1));
}

/* d[32][4] += A (64 x 16 bf16 from registers: the mma.m16n8k16 A fragment of each warp's 16 rows,
 * a[0..3]) B (16 x 256, smem desc, MN-major: wgmma_desc_mn, imm-trans-b = 1). */
__device__ __forceinline__ void wgmma_m64n256k16_rt(float (*d)[4], const uint32_t a[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                 : WGMMA_D_N256
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

#endif
