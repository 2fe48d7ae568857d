/* float32 -> bfloat16 casts of 2-D arrays with any strides, for the weights a bf16 step reads.
 *
 * torch makes a contiguous bf16 copy of a transposed view (W.t(), as the backward pass's products want it) with a
 * strided copy, much slower than a contiguous cast; this loop works in tiles that stay in the L1 cache (measured
 * against torch in tests/bench/results/bench_kernels.txt, rows "to bf16").  The rounding is torch's: to nearest,
 * ties to even (c10::BFloat16); a NaN stays a (quiet) NaN.
 */
#include <stdint.h>
#include <string.h>

#define TILE 64

static inline uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);                   /* NaN: keep sign and payload, set quiet bit */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);    /* round to nearest, ties to even */
}

/* dst[i * ld + j] = bf16(src[i * rs + j * cs]) for i < rows, j < cols (strides in elements). */
void nmt_cast_bf16(const float *src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, uint16_t *dst,
                   int64_t ld, int nthreads)
{
    if (cs == 1) {  /* rows read contiguously: one row at a time, vectorised */
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t i = 0; i < rows; i++) {
            const float *s = src + i * rs;
            uint16_t *d = dst + i * ld;
#pragma omp simd
            for (int64_t j = 0; j < cols; j++)
                d[j] = to_bf16(s[j]);
        }
        return;
    }
    /* e.g. a transposed view (rs = 1): TILE x TILE blocks, which stay in the L1 cache */
    int64_t ti = (rows + TILE - 1) / TILE, tj = (cols + TILE - 1) / TILE;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < ti * tj; t++) {
        int64_t i0 = (t % ti) * TILE, j0 = (t / ti) * TILE;  /* along i first: src read in long runs when rs = 1 */
        int64_t i1 = i0 + TILE < rows ? i0 + TILE : rows, j1 = j0 + TILE < cols ? j0 + TILE : cols;
        for (int64_t i = i0; i < i1; i++) {
            const float *s = src + i * rs;
            uint16_t *d = dst + i * ld;
            for (int64_t j = j0; j < j1; j++)  /* (no simd pragma: gathers measured slower) */
                d[j] = to_bf16(s[j * cs]);
        }
    }
}
