/* Adadelta (Zeiler, 2012) in one pass over memory: the update of nmtkit/train/adadelta.py, element by element.
 *
 *     E[g²] ← ρ E[g²] + (1 − ρ) g²
 *     Δθ = − √(E[Δθ²] + ε) / √(E[g²] + ε) · g
 *     E[Δθ²] ← ρ E[Δθ²] + (1 − ρ) Δθ²
 *     θ ← θ + lr · Δθ
 *
 * torch.optim.Adadelta's operations in its order, with its roundings (its vectorised addcmul, where it runs with
 * FMA -- AVX2, AVX-512 --, rounds once after the multiply-add, as fmaf does here), except the square roots: IEEE-exact here, a polynomial within 1 ulp in
 * torch's vectorised code.  So the values agree to float32 rounding, not bit for bit (tests compare).  Compiled
 * with -ffp-contract=off: no other multiply-add is fused.
 */
#include <math.h>
#include <stdint.h>

/* p, sq, acc updated in place from g (times scale when use_scale: the clipped gradient); n elements each. */
void nmt_adadelta(float *p, const float *g, float *sq, float *acc, int64_t n, float lr, float rho,
                  float one_minus_rho, float eps, int use_scale, float scale, int nthreads)
{
#pragma omp parallel for simd num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = use_scale ? g[i] * scale : g[i];
        float s = fmaf(one_minus_rho * gi, gi, sq[i] * rho);  /* E[g²] */
        float d = sqrtf(acc[i] + eps) / sqrtf(s + eps) * gi;  /* −Δθ */
        sq[i] = s;
        acc[i] = fmaf(one_minus_rho * d, d, acc[i] * rho);    /* E[Δθ²] */
        p[i] = fmaf(-lr, d, p[i]);                            /* θ + lr Δθ */
    }
}
