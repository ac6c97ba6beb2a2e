// Attention of queries over [a key prefix, no mask] + [their own block, causal], either block
// optional, as one autograd function, GQA-native (see crates/rsd-model/src/attention.rs for the
// maths, the memory accounting and the Rust side).
//
// Why C++: the forward runs the fused kernel once per block and merges the outputs by their
// log-sum-exp. The kernels do not differentiate their LSE output, and tch cannot define autograd
// functions, so a Rust-only merge needs an extra kernel call per block for the LSE gradient. Here
// the backward instead runs each block's fused backward against the *merged* output and LSE, which
// gives every block exactly its share of the gradient of one softmax over all keys:
//   P_ij = exp(scale·q_i·k_j − lse_i),  D_i = Σ_d dO_id·O_id,  dS_ij = P_ij (dO_i·v_j − D_i).
// So forward and backward cost what one fused call over the visible keys costs.
//
// GQA without expanding K/V: query head h uses KV head h / G (G = H / Hkv), so the queries are
// viewed as [B, Hkv, G, Lq, D]. The prefix block has no mask, so the G query heads of a KV head
// are folded into its query rows, [B, Hkv, G·Lq, D]: one kernel call over the unexpanded K/V. The
// causal block's mask depends on the query row, so it runs once per g over q[:, :, g]
// ([B, Hkv, Lq, D], same span as the keys, so the kernel's top-left causal alignment is right);
// its dK/dV are the sums over g.
//
// The C ABI takes and returns `torch::Tensor*` (tch's C_tensor), so no tch internals are needed.
#include <torch/torch.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The merge runs in fp32 (fp64 for fp64 inputs, so fp64 parity tests stay tight).
torch::ScalarType accum_type(const Tensor& q) {
  return q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

enum class Kernel { CpuFlash, CudaFlash, CudaEfficient };

// CPU: the flash kernel (any float dtype). CUDA: the flash kernel for fp16/bf16 with a head size
// up to 256 (there is never dropout here), else memory-efficient (fp32).
//
// A half-precision head size that is not a multiple of 8 goes to flash too, padded (below): on an
// H200 (torch 2.11) the memory-efficient kernel's backward gave NaN dq/dk for the second KV head
// of a GQA call with head size 20 in bf16 and fp16 (padded; fp32, or no GQA, were exact), while
// flash with GQA was exact at every size tried.
Kernel kernel_for(const Tensor& q) {
  if (!q.is_cuda()) return Kernel::CpuFlash;
  bool half = q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16;
  int64_t d = q.size(-1);
  return half && d <= 256 ? Kernel::CudaFlash : Kernel::CudaEfficient;
}

// Both CUDA kernels need a head size that is a multiple of 8 (flash requires it; the
// memory-efficient kernel needs rows aligned to 16 bytes, "query is not correctly aligned
// (strideM)" otherwise, seen on an H200 with head_dim 20): any other size is zero-padded to one
// (as torch's SDPA does). Zero columns of q and k add nothing to the scores (the scale is passed
// explicitly, from the real head size), zero columns of v give zero output columns, and the
// backward's row sums of dO·O are unchanged; the padding is cut off the results.
Tensor pad_head(const Tensor& t) {
  const int64_t d = t.size(-1);
  if (d % 8 == 0) return t;
  return at::constant_pad_nd(t, {0, (d + 7) / 8 * 8 - d}, 0);
}
Tensor unpad_head(const Tensor& t, int64_t d) {
  return t.size(-1) == d ? t : t.narrow(-1, 0, d).contiguous();
}

// One fused call's results. `lse` is [B, Hq, Lq] in accum_type, unpadded; `state` holds what the
// kernel's backward needs besides q, k, v, out and lse (CUDA only, a few scalars' worth).
struct Call {
  Tensor out;
  Tensor lse;
  std::vector<Tensor> state;
};

Call call_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  switch (kernel_for(q)) {
    case Kernel::CpuFlash: {
      auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal,
                                                                       std::nullopt, scale);
      return {out, lse.to(accum_type(q)), {}};
    }
    case Kernel::CudaFlash: {
      // -> (out, lse [B, H, Lq] fp32, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused,
      //     debug_attn_mask); the backward takes rng_state and unused as philox seed and offset.
      const int64_t d = q.size(-1);
      auto r = at::_scaled_dot_product_flash_attention(pad_head(q), pad_head(k), pad_head(v), 0.0,
                                                       causal, false, scale);
      return {unpad_head(std::get<0>(r), d),
              std::get<1>(r).to(accum_type(q)),
              {std::get<2>(r), std::get<3>(r), std::get<6>(r), std::get<7>(r)}};
    }
    case Kernel::CudaEfficient: {
      const int64_t d = q.size(-1);
      auto r = at::_scaled_dot_product_efficient_attention(
          pad_head(q), pad_head(k), pad_head(v), std::nullopt, true, 0.0, causal, scale);
      // This kernel pads the LSE's sequence dimension to a multiple of 32.
      Tensor lse = std::get<1>(r).narrow(2, 0, q.size(2)).to(accum_type(q));
      return {unpad_head(std::get<0>(r), d), lse, {std::get<2>(r), std::get<3>(r)}};
    }
  }
  throw std::logic_error("unreachable kernel choice");
}

// The fused backward of one call, against the merged `out` and `lse` ([B, Hq, Lq], accum_type).
std::tuple<Tensor, Tensor, Tensor> call_backward(const Tensor& dout, const Tensor& q,
                                                 const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse,
                                                 const std::vector<Tensor>& state, bool causal,
                                                 double scale) {
  switch (kernel_for(q)) {
    case Kernel::CpuFlash:
      return at::_scaled_dot_product_flash_attention_for_cpu_backward(
          dout, q, k, v, out, lse.contiguous(), 0.0, causal, std::nullopt, scale);
    case Kernel::CudaFlash: {
      // Non-varlen: max_q / max_k are the sequence lengths, as the forward returned them.
      const int64_t d = q.size(-1);
      auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_backward(
          pad_head(dout), pad_head(q), pad_head(k), pad_head(v), pad_head(out),
          lse.to(torch::kFloat).contiguous(), state[0], state[1], q.size(2), k.size(2), 0.0,
          causal, state[2], state[3], scale);
      return {unpad_head(dq, d), unpad_head(dk, d), unpad_head(dv, d)};
    }
    case Kernel::CudaEfficient: {
      // The kernel expects its own padded LSE layout: [B, H, ceil32(Lq)].
      int64_t lq = q.size(2);
      int64_t padded = (lq + 31) / 32 * 32;
      Tensor lse_p =
          torch::zeros({lse.size(0), lse.size(1), padded}, lse.options().dtype(torch::kFloat));
      lse_p.narrow(2, 0, lq).copy_(lse);
      const int64_t d = q.size(-1);
      auto [dq, dk, dv, dbias] = at::_scaled_dot_product_efficient_attention_backward(
          pad_head(dout), pad_head(q), pad_head(k), pad_head(v), Tensor(), pad_head(out), lse_p,
          state[0], state[1], 0.0, {true, true, true, false}, causal, scale);
      return {unpad_head(dq, d), unpad_head(dk, d), unpad_head(dv, d)};
    }
  }
  throw std::logic_error("unreachable kernel choice");
}

// [B, H, L, X] -> [B, Hkv, G·L, X] (the G query heads of a KV head as extra rows; copies only
// when the layout needs it) and back.
Tensor fold(const Tensor& t, int64_t hkv) {
  auto s = t.sizes();
  return t.reshape({s[0], hkv, -1, s[3]});
}
Tensor unfold_heads(const Tensor& t, int64_t heads) {
  auto s = t.sizes();
  return t.reshape({s[0], heads, -1, s[3]});
}
// [B, H, L] <-> [B, Hkv, G·L] for the LSE.
Tensor fold3(const Tensor& t, int64_t hkv) { return t.reshape({t.size(0), hkv, -1}); }
Tensor unfold3(const Tensor& t, int64_t heads) { return t.reshape({t.size(0), heads, -1}); }
// [B, H, ...] -> [B, Hkv, G, ...] as a view.
Tensor group(const Tensor& t, int64_t hkv) {
  std::vector<int64_t> s = t.sizes().vec();
  s[1] = t.size(1) / hkv;
  s.insert(s.begin() + 1, hkv);
  return t.view(s);
}

struct GqaAttention : public torch::autograd::Function<GqaAttention> {
  // The prefix (`kp`, `vp`) or the own block (`ks`, `vs`) may be absent (not both): then it is a
  // placeholder (autograd functions take no undefined inputs) and its flag is false.
  static variable_list forward(AutogradContext* ctx, Tensor q, Tensor kp, Tensor vp, Tensor ks,
                               Tensor vs, double scale, bool has_prefix, bool has_own) {
    const int64_t heads = q.size(1);
    const int64_t hkv = (has_prefix ? kp : ks).size(1);
    const int64_t groups = heads / hkv;
    const auto acc = accum_type(q);
    Tensor out, lse;
    std::vector<Tensor> state_p;
    std::vector<std::vector<Tensor>> state_s;
    if (has_prefix) {
      Call c = call_forward(fold(q, hkv), kp, vp, false, scale);
      out = unfold_heads(c.out, heads);
      lse = unfold3(c.lse, heads);
      state_p = std::move(c.state);
    }
    if (has_own) {
      Tensor qg = group(q, hkv);
      Tensor out_s = torch::empty(q.sizes(), q.options());
      Tensor lse_s = torch::empty({q.size(0), heads, q.size(2)}, q.options().dtype(acc));
      Tensor out_sg = group(out_s, hkv), lse_sg = group(lse_s, hkv);
      for (int64_t g = 0; g < groups; ++g) {
        Call c = call_forward(qg.select(2, g), ks, vs, true, scale);
        out_sg.select(2, g).copy_(c.out);
        lse_sg.select(2, g).copy_(c.lse);
        state_s.push_back(std::move(c.state));
      }
      if (has_prefix) {
        Tensor merged = torch::logaddexp(lse, lse_s);
        out = (out.to(acc) * (lse - merged).exp().unsqueeze(-1) +
               out_s.to(acc) * (lse_s - merged).exp().unsqueeze(-1))
                  .to(q.scalar_type());
        lse = merged;
      } else {
        out = out_s;
        lse = lse_s;
      }
    }
    ctx->save_for_backward({q, kp, vp, ks, vs, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["has_prefix"] = has_prefix;
    ctx->saved_data["has_own"] = has_own;
    ctx->saved_data["state_p"] = state_p;
    for (size_t g = 0; g < state_s.size(); ++g) {
      ctx->saved_data["state_s" + std::to_string(g)] = state_s[g];
    }
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const Tensor &q = s[0], &kp = s[1], &vp = s[2], &ks = s[3], &vs = s[4], &out = s[5],
                 &lse = s[6];
    variable_list none(8);
    if (!grads[0].defined()) return none;
    const double scale = ctx->saved_data["scale"].toDouble();
    const bool has_prefix = ctx->saved_data["has_prefix"].toBool();
    const bool has_own = ctx->saved_data["has_own"].toBool();
    const int64_t heads = q.size(1);
    const int64_t hkv = (has_prefix ? kp : ks).size(1);
    const int64_t groups = heads / hkv;
    Tensor dout = grads[0].contiguous();
    Tensor dq, dkp, dvp, dks, dvs;
    if (has_prefix) {
      auto state = ctx->saved_data["state_p"].toTensorVector();
      auto [dqf, dk, dv] = call_backward(fold(dout, hkv), fold(q, hkv), kp, vp, fold(out, hkv),
                                         fold3(lse, hkv), state, false, scale);
      dq = unfold_heads(dqf, heads);
      dkp = dk;
      dvp = dv;
    }
    if (has_own) {
      Tensor qg = group(q, hkv), doutg = group(dout, hkv), outg = group(out, hkv);
      Tensor lseg = group(lse, hkv);
      Tensor dq_s = torch::empty(q.sizes(), q.options());
      Tensor dq_sg = group(dq_s, hkv);
      for (int64_t g = 0; g < groups; ++g) {
        auto state = ctx->saved_data["state_s" + std::to_string(g)].toTensorVector();
        auto [dqg, dk, dv] = call_backward(doutg.select(2, g), qg.select(2, g), ks, vs,
                                           outg.select(2, g), lseg.select(2, g), state, true,
                                           scale);
        dq_sg.select(2, g).copy_(dqg);
        // dK/dV of the shared KV head: the sum over its G query heads, in one buffer.
        if (g == 0) {
          dks = dk;
          dvs = dv;
        } else {
          dks.add_(dk);
          dvs.add_(dv);
        }
      }
      dq = dq.defined() ? dq + dq_s : dq_s;
    }
    return {dq, dkp, dvp, dks, dvs, Tensor(), Tensor(), Tensor()};
  }
};

void write_error(const std::exception& e, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, e.what(), err_len - 1);
  err[err_len - 1] = '\0';
}

}  // namespace

extern "C" {

// Queries `q` [B, H, Lq, D] over an unmasked prefix block (`kp`, `vp`: [B, Hkv, Lp, D], or both
// null) and their own causal block (`ks`, `vs`: [B, Hkv, Lq, D], or both null), Hkv dividing H
// (GQA, never expanded). On success returns 0 and sets `*out` ([B, H, Lq, D], query dtype,
// differentiable) and `*lse` ([B, H, Lq], fp32 or fp64 for fp64 queries, not differentiable),
// both owned by the caller. On failure returns 1 with the message in `err`.
int rsd_gqa_attention(const Tensor* q, const Tensor* kp, const Tensor* vp, const Tensor* ks,
                      const Tensor* vs, double scale, Tensor** out, Tensor** lse, char* err,
                      size_t err_len) {
  try {
    Tensor absent = torch::empty({0}, q->options());
    auto or_absent = [&](const Tensor* t) { return t == nullptr ? absent : *t; };
    TORCH_CHECK(kp != nullptr || ks != nullptr, "no key block");
    TORCH_CHECK((kp == nullptr) == (vp == nullptr) && (ks == nullptr) == (vs == nullptr),
                "keys and values must be given together");
    variable_list r = GqaAttention::apply(*q, or_absent(kp), or_absent(vp), or_absent(ks),
                                          or_absent(vs), scale, kp != nullptr, ks != nullptr);
    *out = new Tensor(r[0]);
    *lse = new Tensor(r[1]);
    return 0;
  } catch (const std::exception& e) {
    write_error(e, err, err_len);
    return 1;
  }
}

}  // extern "C"
