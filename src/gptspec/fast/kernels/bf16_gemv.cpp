// y = x Aᵀ + b for bfloat16 x with few rows, A stored in 16-row blocks: the product of
// batch-1 decoding, which streams every weight once and so runs at the speed of memory.
//
// Layout of A (N × K): blocks of 16 rows; within a block, for each pair of columns
// (2k, 2k+1), the 16 rows' two values side by side: shape (⌈N/16⌉, K'/2, 16, 2) with K'
// = K rounded up to a multiple of 4 (zero padded; padded rows are computed, never stored).
// A block is one contiguous run of memory, read front to back, so the hardware prefetcher
// (helped by an explicit prefetch a little ahead) keeps the memory bus busy.
//
// Arithmetic: AVX-512 BF16's dot-product instruction multiplies bfloat16 pairs exactly
// and accumulates in float32 (two interleaved accumulators per 16 outputs); the bias is
// added in float32 and the sum rounded to bfloat16 once, to nearest even. That is the
// contract of PyTorch's own bfloat16 products (bfloat16 operands, float32 accumulation,
// one rounding), in another summation order.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <immintrin.h>

namespace {

constexpr int64_t kBlockRows = 16;
constexpr int64_t kPrefetchPairs = 16;  // how far ahead, in column pairs (64 bytes each)

inline uint16_t round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

inline float widen_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// One row x (K' values) times one block: the block's 16 outputs, bias added, rounded.
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void block_times_row(const uint16_t* block, const uint16_t* x, int64_t pairs,
                     const uint16_t* bias, uint16_t* y, int64_t n_valid) {
  __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
  const uint32_t* x_pairs = reinterpret_cast<const uint32_t*>(x);
  for (int64_t k = 0; k < pairs; k += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(block + (k + kPrefetchPairs) * 32), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(block + (k + kPrefetchPairs + 1) * 32), _MM_HINT_T0);
    __m512i w0 = _mm512_loadu_si512(block + k * 32);
    __m512i w1 = _mm512_loadu_si512(block + (k + 1) * 32);
    even = _mm512_dpbf16_ps(even, (__m512bh)_mm512_set1_epi32(x_pairs[k]), (__m512bh)w0);
    odd = _mm512_dpbf16_ps(odd, (__m512bh)_mm512_set1_epi32(x_pairs[k + 1]), (__m512bh)w1);
  }
  alignas(64) float sums[kBlockRows];
  _mm512_store_ps(sums, _mm512_add_ps(even, odd));
  for (int64_t j = 0; j < n_valid; ++j)
    y[j] = round_to_bf16(bias != nullptr ? sums[j] + widen_bf16(bias[j]) : sums[j]);
}

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

at::Tensor bf16_gemv(const at::Tensor& x, const at::Tensor& blocks,
                     const c10::optional<at::Tensor>& bias, int64_t n_out) {
  static const bool cpu_supported = cpu_has_avx512_bf16();  // asked once, not per product
  TORCH_CHECK(cpu_supported, "bf16_gemv: this CPU lacks AVX-512 BF16");
  TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu(), "bf16_gemv: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && blocks.scalar_type() == at::kBFloat16,
              "bf16_gemv: bfloat16 tensors only");
  TORCH_CHECK(blocks.dim() == 4 && blocks.size(2) == kBlockRows && blocks.size(3) == 2 &&
                  blocks.is_contiguous(), "bf16_gemv: blocks must be (N'/16, K'/2, 16, 2)");
  const int64_t K = x.size(-1), padded_k = 2 * blocks.size(1);
  // A fixed message: one that formatted K into it crashed the process instead of raising,
  // on an H200 host with PyTorch 2.11 (BlockedWeight.refusal says it with the numbers).
  TORCH_CHECK(padded_k % 4 == 0 && K <= padded_k && padded_k < K + 4,
              "bf16_gemv: x's columns do not match the blocks'");
  TORCH_CHECK(n_out > 0 && n_out <= blocks.size(0) * kBlockRows &&
                  n_out > (blocks.size(0) - 1) * kBlockRows, "bf16_gemv: bad n_out");
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == n_out &&
                    bias->is_contiguous(), "bf16_gemv: bias must be bfloat16 of n_out values");
  }
  at::Tensor rows = x.reshape({-1, K});
  if (padded_k != K) rows = at::constant_pad_nd(rows, {0, padded_k - K}, 0);
  rows = rows.contiguous();
  const int64_t M = rows.size(0);
  at::Tensor y = at::empty({M, n_out}, x.options());

  const auto* x_data = reinterpret_cast<const uint16_t*>(rows.data_ptr());
  const auto* a_data = reinterpret_cast<const uint16_t*>(blocks.data_ptr());
  const auto* b_data = bias.has_value() ? reinterpret_cast<const uint16_t*>(bias->data_ptr())
                                        : nullptr;
  auto* y_data = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int64_t pairs = padded_k / 2, n_blocks = blocks.size(0);
  at::parallel_for(0, n_blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t n0 = b * kBlockRows;
      const int64_t n_valid = std::min(kBlockRows, n_out - n0);
      for (int64_t m = 0; m < M; ++m)
        block_times_row(a_data + b * kBlockRows * padded_k, x_data + m * padded_k, pairs,
                        b_data != nullptr ? b_data + n0 : nullptr, y_data + m * n_out + n0,
                        n_valid);
    }
  });
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n_out;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY(gptspec, m) {
  m.def("bf16_gemv(Tensor x, Tensor blocks, Tensor? bias, int n_out) -> Tensor", &bf16_gemv);
  m.def("bf16_gemv_supported() -> bool", &cpu_has_avx512_bf16);
}
