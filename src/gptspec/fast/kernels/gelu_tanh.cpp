// tanh-GELU and its derivative in one pass over float32, AVX2 + FMA (gptspec.fast.cpu_gelu).
//
//   y  = ½ x (1 + tanh z) = x σ(2z),                    z = √(2/π) (x + 0.044715 x³)
//   y' = σ(2z) + x σ(2z) σ(−2z) · 2√(2/π) (1 + 3·0.044715 x²)
//
// σ(2z) and σ(−2z) both come from e = exp(−|2z|) (q = 1/(1+e) and e q), so neither is
// formed as 1 − the other: where σ(2z) rounds to 1, σ(−2z) keeps its digits.
// No torch headers: the function takes raw pointers and is called through ctypes.

#include <immintrin.h>
#include <stddef.h>

namespace {

// exp(v) for v ≤ 0 (NaN reads as −87.3): v = k ln 2 + f with |f| ≤ ln 2 / 2 (ln 2 split in
// two parts, Cody & Waite), exp(f) by its Taylor polynomial of degree 7 (truncation below
// 5e-9 relative), times 2^k built in the exponent bits; below 2^-126 the result is 0.
inline __m256 exp_nonpositive(__m256 v) {
    const __m256 lowest = _mm256_set1_ps(-87.33654475f);  // ln 2^-126
    const __m256 underflows = _mm256_cmp_ps(v, lowest, _CMP_LT_OQ);
    v = _mm256_max_ps(v, lowest);
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), v);
    f = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428606765330187e-06f), f);
    __m256 p = _mm256_set1_ps(1.f / 5040.f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 720.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 120.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 24.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 6.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
    const __m256i two_to_k = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflows, _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_k)));
}

inline void gelu_tanh8(__m256 x, __m256* y, __m256* dy) {
    const __m256 c = _mm256_set1_ps(1.5957691216057308f);    // 2 √(2/π)
    const __m256 ca = _mm256_set1_ps(0.07135481627159788f);  // 2 √(2/π) · 0.044715
    const __m256 c3a = _mm256_set1_ps(0.21406444881479364f); // 2 √(2/π) · 3 · 0.044715
    const __m256 x2 = _mm256_mul_ps(x, x);
    const __m256 two_z = _mm256_mul_ps(x, _mm256_fmadd_ps(ca, x2, c));
    const __m256 negative = _mm256_cmp_ps(two_z, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 e = exp_nonpositive(_mm256_or_ps(two_z, _mm256_set1_ps(-0.0f)));  // −|2z|
    const __m256 q = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_add_ps(_mm256_set1_ps(1.f), e));
    const __m256 eq = _mm256_mul_ps(e, q);
    const __m256 s = _mm256_blendv_ps(q, eq, negative);      // σ(2z)
    const __m256 s_neg = _mm256_blendv_ps(eq, q, negative);  // σ(−2z)
    *y = _mm256_mul_ps(x, s);
    if (dy) *dy = _mm256_fmadd_ps(_mm256_mul_ps(*y, s_neg), _mm256_fmadd_ps(c3a, x2, c), s);
}

}  // namespace

// y[i] = GELU_tanh(x[i]) and, where dy is not null, dy[i] = its derivative at x[i].
extern "C" void gptspec_gelu_tanh_f32(const float* x, float* y, float* dy, size_t n) {
    size_t i = 0;
    __m256 vy, vdy;
    for (; i + 8 <= n; i += 8) {
        gelu_tanh8(_mm256_loadu_ps(x + i), &vy, dy ? &vdy : nullptr);
        _mm256_storeu_ps(y + i, vy);
        if (dy) _mm256_storeu_ps(dy + i, vdy);
    }
    if (i < n) {  // the last 1–7 values, through a lane mask
        const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)),
                                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        gelu_tanh8(_mm256_maskload_ps(x + i, lanes), &vy, dy ? &vdy : nullptr);
        _mm256_maskstore_ps(y + i, lanes, vy);
        if (dy) _mm256_maskstore_ps(dy + i, lanes, vdy);
    }
}
