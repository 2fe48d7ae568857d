/* One step of the RNNsearch alignment model (A.1.2, A.2.2), forwards and backwards, for teacher-forced training.
 *
 * With the attention's tanh written as 2σ(2x) − 1 (nmtkit/models/attention.py), keys2 = 2 U_a h_j,
 * q = 2 W_a s_{i-1}, v2 = 2 v_a, the energies are, up to a constant that the softmax cancels,
 *
 *     e_ij = Σ_k v2_k σ(keys2_jk + q_k),     α_ij = softmax_j(e_ij) over the real positions j < len,
 *     g_i  = gx_i + Σ_j α_ij CH_j            (CH_j = C_stack h_j: the decoder's context term C_stack c_i).
 *
 * As torch ops (nmtkit/models/fast/fused.py), one step is a chain of passes over (B, Tx, n'): the sum, σ, the product
 * with v2, masking, softmax, and backwards the recomputed σ, its derivative, two reductions and an accumulation.
 * Here each sentence's positions are visited once per direction, only the real ones (no padding, so no row
 * groups), with σ computed in registers and never stored.  Rows go to the threads round robin (schedule(static,
 * 1)): batches come sorted by source length, so the threads get equal work; the assignment is fixed, so the
 * results do not depend on timing (the backward's ∂L/∂v2, summed per thread, depends on the number of threads).
 *
 * σ uses the exponential below (range reduction to [−ln2/2, ln2/2] and Cephes' polynomial, within 1 ulp of e^x
 * over the clamped range), which the compiler vectorises (with -fno-trapping-math: __init__.py's FLAGS; glibc's
 * vector expf needs -ffast-math); the results
 * agree with torch's to float32 rounding (tests compare both paths).
 *
 * The real positions of a row are its first lens[b] (right padding), clamped to [0, Tx]: no input reads or
 * writes outside the arrays.  A row without real positions gets α = 0 (torch's softmax would give NaN).  The
 * outputs must not overlap one another or the inputs: threads write them row by row (the Python wrappers in
 * __init__.py check the shapes, layouts and overlaps within each output).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static inline float exp_clamped(float x)
{
    /* e^x for |x| ≤ 87 (clamped there: e^±87 is a normal float; σ is then 1 or ~1.6e-38, within 1.6e-38); a NaN
     * stays NaN (it passes the clamp, and 2^n is taken from bits, with no conversion of a float to an integer) */
    x = x < -87.0f ? -87.0f : (x > 87.0f ? 87.0f : x);
    const float shift = 12582912.0f;  /* 1.5 · 2^23: adding it rounds to an integer (to nearest even) */
    float t = x * 1.44269504088896341f + shift;  /* its low mantissa bits hold n + 2^22 */
    float n = t - shift;
    float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  /* x − n ln2 in two parts (Cephes' C1, C2) */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4B400000u + 127u) << 23;  /* 2^n (|n| ≤ 126): the exponent field n + 127 */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float sigmoid(float x)
{
    return 1.0f / (1.0f + exp_clamped(-x));
}

static inline int64_t real_positions(const int64_t *lens, int64_t b, int64_t Tx)
{
    return lens[b] < 0 ? 0 : (lens[b] > Tx ? Tx : lens[b]);
}

/* Σ_k d[k] · CH_j[k] over k < n3, CH_j float32 or (ch_bf16) bfloat16 */
static inline float dot_ch(const float *d, const void *CH, int64_t offset, int64_t n3, int ch_bf16)
{
    float s = 0.0f;
    if (ch_bf16) {
        const uint16_t *c = (const uint16_t *)CH + offset;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < n3; k++)
            s += d[k] * from_bf16(c[k]);
    } else {
        const float *c = (const float *)CH + offset;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < n3; k++)
            s += d[k] * c[k];
    }
    return s;
}

/* out[k] += a · CH_j[k] over k < n3, CH_j float32 or (ch_bf16) bfloat16 */
static inline void axpy_ch(float a, const void *CH, int64_t offset, int64_t n3, int ch_bf16, float *out)
{
    if (ch_bf16) {
        const uint16_t *c = (const uint16_t *)CH + offset;
#pragma omp simd
        for (int64_t k = 0; k < n3; k++)
            out[k] += a * from_bf16(c[k]);
    } else {
        const float *c = (const float *)CH + offset;
#pragma omp simd
        for (int64_t k = 0; k < n3; k++)
            out[k] += a * c[k];
    }
}

/* Forward of one step for rows b < B: keys2[b·k_bs + j·k_js + k] (k < na), q[b·q_rs + k], v2[k], lens[b].
 * Writes α to alpha[b·a_rs + j] for j < Tx (0 at padding) and, with with_ch,
 * g[b·g_rs + k] = gx[b·gx_rs + k] + Σ_j α_bj CH[b·c_bs + j·c_js + k] for k < n3, CH float32 or, with ch_bf16,
 * bfloat16 (a bf16 product's result, read at half the bytes).  e (B · Tx floats) is scratch. */
/* Forward of one step for B query rows; ``per`` consecutive rows share one sentence's keys2, lens and CH (beam
 * search: the K hypotheses of a sentence; 1 in training), so row b reads sentence b / per. */
void nmt_attend_forward(const float *keys2, int64_t k_bs, int64_t k_js, const float *q, int64_t q_rs,
                        const float *v2, int64_t na, const int64_t *lens, int64_t B, int64_t Tx, float *e,
                        float *alpha, int64_t a_rs, int with_ch, const void *CH, int64_t c_bs, int64_t c_js,
                        int64_t n3, int ch_bf16, const float *gx, int64_t gx_rs, float *g, int64_t g_rs,
                        int64_t per, int nthreads)
{
#pragma omp parallel for num_threads(nthreads) schedule(static, 1)
    for (int64_t b = 0; b < B; b++) {
        const float *qb = q + b * q_rs;
        float *eb = e + b * Tx, *ab = alpha + b * a_rs;
        int64_t sb = b / per;  /* the row's sentence */
        int64_t len = real_positions(lens, sb, Tx);
        float top = -INFINITY;
        for (int64_t j = 0; j < len; j++) {
            const float *kj = keys2 + sb * k_bs + j * k_js;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t k = 0; k < na; k++)
                s += v2[k] * sigmoid(kj[k] + qb[k]);
            eb[j] = s;
            top = s > top ? s : top;
        }
        float total = 0.0f;
        for (int64_t j = 0; j < len; j++) {
            eb[j] = exp_clamped(eb[j] - top);
            total += eb[j];
        }
        for (int64_t j = 0; j < len; j++)
            ab[j] = eb[j] / total;
        for (int64_t j = len; j < Tx; j++)
            ab[j] = 0.0f;
        if (with_ch) {
            float *gb = g + b * g_rs;
            const float *gxb = gx + b * gx_rs;
            for (int64_t k = 0; k < n3; k++)
                gb[k] = gxb[k];
            for (int64_t j = 0; j < len; j++)
                axpy_ch(ab[j], CH, sb * c_bs + j * c_js, n3, ch_bf16, gb);
        }
    }
}

/* Backward of one step, given, with with_ch, dg = ∂L/∂g_i (dg[b·dg_rs + k], k < n3) and, when dA is not NULL,
 * ∂L/∂α_i from elsewhere (dA[b·da_rs + j]):
 *     ∂L/∂α_bj = dg_b · CH_bj (+ dA_bj),   ∂L/∂e_bj = α_bj (∂L/∂α_bj − Σ_j' α_bj' ∂L/∂α_bj'),
 * and with σ_bjk = σ(keys2_bjk + q_bk) recomputed:
 *     dkeys2[b, j, k] += ∂L/∂e_bj σ'_bjk         (summed over steps; the caller multiplies by v2 at the end),
 *     dv[t·na + k]    += ∂L/∂e_bj σ_bjk          (one row of partial sums per thread t, added up by the caller),
 *     dq[b·dq_rs + k]  = v2_k Σ_j ∂L/∂e_bj σ'_bjk  (∂L/∂q, written).
 * alpha as written by the forward; CH as there (without with_ch, as when dg = 0, it is not read); de (B · Tx
 * floats) is scratch. */
void nmt_attend_backward(const float *keys2, int64_t k_bs, int64_t k_js, const float *q, int64_t q_rs,
                         const float *v2, int64_t na, const int64_t *lens, int64_t B, int64_t Tx, float *de,
                         const float *alpha, int64_t a_rs, const float *dA, int64_t da_rs, int with_ch,
                         const void *CH, int64_t c_bs, int64_t c_js, int64_t n3, int ch_bf16, const float *dg,
                         int64_t dg_rs, float *dkeys2, int64_t dk_bs, int64_t dk_js, float *dv, float *dq,
                         int64_t dq_rs, int nthreads)
{
#pragma omp parallel num_threads(nthreads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        float *dvt = dv + t * na;
#pragma omp for schedule(static, 1)
        for (int64_t b = 0; b < B; b++) {
            const float *qb = q + b * q_rs, *ab = alpha + b * a_rs;
            float *deb = de + b * Tx, *dqb = dq + b * dq_rs;
            int64_t len = real_positions(lens, b, Tx);
            float dot = 0.0f;
            for (int64_t j = 0; j < len; j++) {
                float s = with_ch ? dot_ch(dg + b * dg_rs, CH, b * c_bs + j * c_js, n3, ch_bf16) : 0.0f;
                if (dA)
                    s += dA[b * da_rs + j];
                deb[j] = s;
                dot += ab[j] * s;
            }
            for (int64_t k = 0; k < na; k++)
                dqb[k] = 0.0f;
            for (int64_t j = 0; j < len; j++) {
                float d = ab[j] * (deb[j] - dot);
                const float *kj = keys2 + b * k_bs + j * k_js;
                float *dkj = dkeys2 + b * dk_bs + j * dk_js;
#pragma omp simd
                for (int64_t k = 0; k < na; k++) {
                    float s = sigmoid(kj[k] + qb[k]);
                    float dx = d * (s * (1.0f - s));
                    dvt[k] += d * s;
                    dkj[k] += dx;
                    dqb[k] += dx;
                }
            }
            for (int64_t k = 0; k < na; k++)
                dqb[k] *= v2[k];
        }
    }
}
