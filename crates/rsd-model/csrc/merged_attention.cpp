// Attention of queries over [a key prefix, no mask] + [their own block, causal], as one autograd
// function (see crates/rsd-model/src/attention.rs for the maths and the Rust side).
//
// Why C++: the forward runs the fused kernel once per block and merges the outputs by their
// log-sum-exp. The kernels do not differentiate their LSE output, and tch cannot define autograd
// functions, so a Rust-only merge needs an extra kernel call per block for the LSE gradient. Here
// the backward instead runs each block's fused backward against the *merged* output and LSE, which
// gives every block exactly its share of the gradient of one softmax over all keys:
//   P_ij = exp(scale·q_i·k_j − lse_i),  D_i = Σ_d dO_id·O_id,  dS_ij = P_ij (dO_i·v_j − D_i).
// So forward and backward cost what one fused call over the visible keys costs.
//
// The C ABI takes and returns `torch::Tensor*` (tch's C_tensor), so no tch internals are needed.
#include <torch/torch.h>

#include <cstring>
#include <string>

namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The merge runs in fp32 (fp64 for fp64 inputs, so fp64 parity tests stay tight).
torch::ScalarType accum_type(const Tensor& q) {
  return q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

struct BlockResult {
  Tensor out;
  Tensor lse;  // [B, H, Lq] in accum_type
  Tensor philox_seed;
  Tensor philox_offset;
};

BlockResult block_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                          double scale) {
  if (q.is_cuda()) {
    auto r = at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, true, 0.0, causal,
                                                         scale);
    // The CUDA kernel pads the LSE's sequence dimension to a multiple of 32.
    Tensor lse = std::get<1>(r).narrow(2, 0, q.size(2)).to(accum_type(q));
    return {std::get<0>(r), lse, std::get<2>(r), std::get<3>(r)};
  }
  auto r = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, std::nullopt,
                                                           scale);
  return {std::get<0>(r), std::get<1>(r).to(accum_type(q)), Tensor(), Tensor()};
}

std::tuple<Tensor, Tensor, Tensor> block_backward(const Tensor& dout, const Tensor& q,
                                                  const Tensor& k, const Tensor& v,
                                                  const Tensor& out, const Tensor& lse,
                                                  const Tensor& seed, const Tensor& offset,
                                                  bool causal, double scale) {
  if (q.is_cuda()) {
    // The kernel expects its own padded LSE layout: [B, H, ceil32(Lq)].
    int64_t lq = q.size(2);
    int64_t padded = (lq + 31) / 32 * 32;
    Tensor lse_p = torch::zeros({lse.size(0), lse.size(1), padded}, lse.options().dtype(torch::kFloat));
    lse_p.narrow(2, 0, lq).copy_(lse);
    auto [dq, dk, dv, dbias] = at::_scaled_dot_product_efficient_attention_backward(
        dout, q, k, v, Tensor(), out, lse_p, seed, offset, 0.0, {true, true, true, false}, causal,
        scale);
    return {dq, dk, dv};
  }
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(
      dout, q, k, v, out, lse, 0.0, causal, std::nullopt, scale);
}

struct MergedAttention : public torch::autograd::Function<MergedAttention> {
  static variable_list forward(AutogradContext* ctx, Tensor q, Tensor kp, Tensor vp, Tensor ks,
                               Tensor vs, double scale) {
    BlockResult a = block_forward(q, kp, vp, false, scale);
    BlockResult b = block_forward(q, ks, vs, true, scale);
    Tensor lse = torch::logaddexp(a.lse, b.lse);
    auto acc = accum_type(q);
    Tensor out = (a.out.to(acc) * (a.lse - lse).exp().unsqueeze(-1) +
                  b.out.to(acc) * (b.lse - lse).exp().unsqueeze(-1))
                     .to(q.scalar_type());
    ctx->save_for_backward({q, kp, vp, ks, vs, out, lse});
    ctx->saved_data["scale"] = scale;
    if (q.is_cuda()) {
      ctx->saved_data["seed_a"] = a.philox_seed;
      ctx->saved_data["offset_a"] = a.philox_offset;
      ctx->saved_data["seed_b"] = b.philox_seed;
      ctx->saved_data["offset_b"] = b.philox_offset;
    }
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const Tensor &q = s[0], &kp = s[1], &vp = s[2], &ks = s[3], &vs = s[4], &out = s[5],
                 &lse = s[6];
    double scale = ctx->saved_data["scale"].toDouble();
    Tensor dout = grads[0].contiguous();
    Tensor seed_a, off_a, seed_b, off_b;
    if (q.is_cuda()) {
      seed_a = ctx->saved_data["seed_a"].toTensor();
      off_a = ctx->saved_data["offset_a"].toTensor();
      seed_b = ctx->saved_data["seed_b"].toTensor();
      off_b = ctx->saved_data["offset_b"].toTensor();
    }
    auto [dq_a, dkp, dvp] = block_backward(dout, q, kp, vp, out, lse, seed_a, off_a, false, scale);
    auto [dq_b, dks, dvs] = block_backward(dout, q, ks, vs, out, lse, seed_b, off_b, true, scale);
    return {dq_a + dq_b, dkp, dvp, dks, dvs, Tensor()};
  }
};

void write_error(const std::exception& e, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, e.what(), err_len - 1);
  err[err_len - 1] = '\0';
}

}  // namespace

extern "C" {

// Queries `q` [B, H, Lq, D] over the unmasked prefix block (`kp`, `vp`: [B, H, Lp, D]) and their own
// causal block (`ks`, `vs`: [B, H, Lq, D]), heads already repeated for GQA. On success returns 0 and
// sets `*out` ([B, H, Lq, D], query dtype, differentiable) and `*lse` ([B, H, Lq], fp32 or fp64
// for fp64 queries, not differentiable), both owned by the caller. On failure returns 1 with the message in `err`.
int rsd_merged_attention(const Tensor* q, const Tensor* kp, const Tensor* vp, const Tensor* ks,
                         const Tensor* vs, double scale, Tensor** out, Tensor** lse, char* err,
                         size_t err_len) {
  try {
    variable_list r = MergedAttention::apply(*q, *kp, *vp, *ks, *vs, scale);
    *out = new Tensor(r[0]);
    *lse = new Tensor(r[1]);
    return 0;
  } catch (const std::exception& e) {
    write_error(e, err, err_len);
    return 1;
  }
}

}  // extern "C"
