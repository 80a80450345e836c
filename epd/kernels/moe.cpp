// The end of an MoE layer's experts in one pass over memory instead of four operators.
//
// torch.ops.epd.moe_combine(rows [R, H], index [T, k] int64, weights [T, k]) -> [T, H] rows' dtype
//   out[t] = sum_j rows[index[t, j]] * weights[t, j], as transformers' experts forward computes it
//   after its grouped products: each product in promote(rows, weights)'s dtype (so rounded to
//   bfloat16 when both are bfloat16), summed in float32 in j order, the sum rounded to the rows'
//   dtype. The library takes four operators and four passes over [T * k, H] temporaries (gather
//   back to token order, widen, scale, sum); a 1760-token Qwen prompt step spent 15% of its time
//   there. Same bits as the library's.

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "moe_combine.h"

namespace {

at::Tensor moe_combine(const at::Tensor& rows, const at::Tensor& index, const at::Tensor& weights) {
  TORCH_CHECK(rows.device().is_cpu() && rows.dim() == 2 && rows.is_contiguous(), "rows must be a contiguous [R, H] CPU tensor");
  TORCH_CHECK(index.dim() == 2 && index.is_contiguous() && index.scalar_type() == at::kLong,
              "index must be a contiguous [T, k] int64 tensor");
  TORCH_CHECK(weights.sizes() == index.sizes() && weights.is_contiguous(), "weights have shape ", weights.sizes(),
              "; expected the index's ", index.sizes());
  return epd_moe::combine_rows(rows, index.data_ptr<int64_t>(), weights);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(epd, m) {
  m.def("moe_combine(Tensor rows, Tensor index, Tensor weights) -> Tensor");
}

TORCH_LIBRARY_IMPL(epd, CPU, m) {
  m.impl("moe_combine", moe_combine);
}
