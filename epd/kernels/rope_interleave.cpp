// DeepSeek-V3's interleaved rotary embedding (Kimi-K2.5's latent attention) for float32 in one pass,
// bit for bit transformers' `apply_rotary_pos_emb_interleave`:
//   out[..., i]       = q[..., 2i] * cos[i] - q[..., 2i+1] * sin[i]
//   out[..., D/2 + i] = q[..., 2i+1] * cos[i] + q[..., 2i] * sin[i]      (i < D/2)
// each product rounded before the sum, as the library's separate operators round it. The
// library's twenty-odd operators on a decode step's few rows are dispatch, not arithmetic.
//
// torch.ops.epd.rope_interleave(q [B, H, T, D], k [B, Hk, T, D], cos [B, T, >= D/2], sin [B, T, >= D/2])
//   -> (q_embed [B, H, T, D], k_embed [B, Hk, T, D]) contiguous; any strides but the last dim's (1).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "no_fma.h"

namespace {

EPD_NO_FMA void rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  const int64_t batch = x.size(0), heads = x.size(1), tokens = x.size(2), half = x.size(3) / 2;
  const float* src = x.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < tokens; ++t) {
        const float* row = src + b * x.stride(0) + h * x.stride(1) + t * x.stride(2);
        const float* cr = c + b * cos.stride(0) + t * cos.stride(1);
        const float* sr = s + b * sin.stride(0) + t * sin.stride(1);
        float* o = dst + ((b * heads + h) * tokens + t) * 2 * half;
        for (int64_t i = 0; i < half; ++i) {
          const float even = row[2 * i], odd = row[2 * i + 1];
          const float even_cos = even * cr[i], odd_sin = odd * sr[i], odd_cos = odd * cr[i], even_sin = even * sr[i];
          o[i] = even_cos - odd_sin;
          o[half + i] = odd_cos + even_sin;
        }
      }
}

void check(const at::Tensor& x, const char* name, const at::Tensor& cos) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 4 && x.stride(3) == 1 &&
                  x.size(3) % 2 == 0,
              name, " must be a float32 CPU [B, H, T, D] tensor with D even and its last dim contiguous");
  TORCH_CHECK(x.size(0) == cos.size(0) && x.size(2) == cos.size(1) && cos.size(2) >= x.size(3) / 2, name, " ",
              x.sizes(), " does not match cos ", cos.sizes());
}

std::tuple<at::Tensor, at::Tensor> rope_interleave(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                   const at::Tensor& sin) {
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 3 && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat && cos.stride(2) == 1 && sin.stride(2) == 1,
              "cos and sin must be float32 [B, T, D] with their last dim contiguous");
  check(q, "q", cos);
  check(k, "k", cos);
  at::Tensor q_embed = at::empty(q.sizes(), q.options()), k_embed = at::empty(k.sizes(), k.options());
  rotate(q, cos, sin, q_embed);
  rotate(k, cos, sin, k_embed);
  return {q_embed, k_embed};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(epd, m) {
  m.def("rope_interleave(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(epd, CPU, m) { m.impl("rope_interleave", rope_interleave); }
