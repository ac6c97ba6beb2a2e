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
// GQA without expanding K/V: query head h uses KV head h / G (G = H / Hkv). The CUDA kernels
// used in half precision (cuDNN's and flash) take K/V at Hkv heads natively: each block is one
// kernel call, forward and backward, whatever G is (the kernels sum dK/dV over the G query heads
// themselves). Elsewhere (the CPU kernel, and the memory-efficient kernel CUDA uses in fp32) the
// queries are viewed as [B, Hkv, G, Lq, D]: the prefix block has no mask, so the G query heads of
// a KV head are folded into its query rows, [B, Hkv, G·Lq, D], one call over the unexpanded K/V;
// the causal block's mask depends on the query row, so it runs once per g over q[:, :, g]
// ([B, Hkv, Lq, D], same span as the keys, so the kernel's top-left causal alignment is right),
// and its dK/dV are the sums over g.
//
// Every call and its backward are timed as "attention forward" / "attention backward" when the
// phase clock is on (phase_clock.h).
//
// The C ABI takes and returns `torch::Tensor*` (tch's C_tensor), so no tch internals are needed.
#include <torch/torch.h>

#include <cstdlib>

#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "phase_clock.h"

namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The merge runs in fp32 (fp64 for fp64 inputs, so fp64 parity tests stay tight).
torch::ScalarType accum_type(const Tensor& q) {
  return q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

enum class Kernel { CpuFlash, CudaFlash, CudaEfficient, CudaCudnn };

// What the user forced with RSD_ATTENTION_KERNEL (read once): "cudnn", "flash", or anything
// else / unset for the automatic choice below.
enum class Forced { Auto, Cudnn, Flash };
Forced forced_kernel() {
  static const Forced forced = [] {
    const char* v = std::getenv("RSD_ATTENTION_KERNEL");
    if (v == nullptr) return Forced::Auto;
    if (std::strcmp(v, "cudnn") == 0) return Forced::Cudnn;
    if (std::strcmp(v, "flash") == 0) return Forced::Flash;
    return Forced::Auto;
  }();
  return forced;
}

// The fused SDPA backend libtorch itself would run for these inputs (SDPBackend's numbering:
// 1 flash, 2 memory-efficient, 3 cuDNN), as torch's scaled_dot_product_attention with
// enable_gqa picks it: it knows each card's preferences (cuDNN first on Hopper and Blackwell,
// flash first on Ampere) and each kernel's limits (head sizes, dtypes).
constexpr int64_t kSdpCudnn = 3;

// cuDNN builds an execution plan for every new shape (hundreds of milliseconds, reported for
// H100/H20/B200), and rsd's perturbed suffixes and document segments change shape every step.
// So cuDNN takes a call whose shape it has taken before, or a new shape while fewer than
// RSD_CUDNN_SHAPES (default 4) shapes have gone to it; every other call goes to flash. The
// standard view's whole-row causal block (one shape for the run) and context parallelism's chunks
// (a few) stay on cuDNN; per-step shapes cost at most a few plans at the start.
bool cudnn_takes_shape(const Tensor& q, const Tensor& k, bool causal) {
  static std::mutex mu;
  static std::set<std::vector<int64_t>> taken;
  static const size_t budget = [] {
    const char* v = std::getenv("RSD_CUDNN_SHAPES");
    return v == nullptr ? size_t{4} : static_cast<size_t>(std::strtoull(v, nullptr, 10));
  }();
  std::vector<int64_t> key{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3),
                           causal ? 1 : 0, static_cast<int64_t>(q.scalar_type()),
                           q.get_device()};
  for (const Tensor* t : {&q, &k}) {
    for (int64_t st : t->strides()) key.push_back(st);
  }
  std::lock_guard<std::mutex> lock(mu);
  if (taken.count(key) > 0) return true;
  if (taken.size() >= budget) return false;
  taken.insert(key);
  return true;
}

// CPU: the flash kernel (any float dtype). CUDA, fp16/bf16: cuDNN's attention where libtorch
// would choose it for this call (on an H100/H200 at Llama-3-8B's heads it ran forward + backward
// in ~0.6 of flash's time), else flash with a head size up to 256 (there is never dropout here).
// fp32 and larger heads: memory-efficient. RSD_ATTENTION_KERNEL=cudnn|flash forces one of the two
// half-precision kernels (for measurements and tests; cuDNN then must accept the call's shapes).
//
// A half-precision head size that is not a multiple of 8 goes to flash too, padded (below): on an
// H200 (torch 2.11) the memory-efficient kernel's backward gave NaN dq/dk for the second KV head
// of a GQA call with head size 20 in bf16 and fp16 (padded; fp32, or no GQA, were exact), while
// flash with GQA was exact at every size tried.
Kernel kernel_for(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  if (!q.is_cuda()) return Kernel::CpuFlash;
  bool half = q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16;
  int64_t d = q.size(-1);
  if (!half || d > 256) return Kernel::CudaEfficient;
  switch (forced_kernel()) {
    case Forced::Cudnn:
      // cuDNN takes head sizes that are multiples of 8 only; others stay on padded flash.
      return d % 8 == 0 ? Kernel::CudaCudnn : Kernel::CudaFlash;
    case Forced::Flash:
      return Kernel::CudaFlash;
    case Forced::Auto:
      break;
  }
  int64_t choice = at::_fused_sdp_choice(q, k, v, std::nullopt, 0.0, causal, scale, true);
  return choice == kSdpCudnn && cudnn_takes_shape(q, k, causal) ? Kernel::CudaCudnn
                                                                : Kernel::CudaFlash;
}

// Whether the kernel takes K/V at fewer heads than q in one call (else the fold and the loop over
// g above).
bool native_gqa(Kernel kernel) {
  return kernel == Kernel::CudaFlash || kernel == Kernel::CudaCudnn;
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

Call call_forward(Kernel kernel, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                  double scale) {
  rsd::PhaseScope timed("attention forward");
  switch (kernel) {
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
    case Kernel::CudaCudnn: {
      // -> (out, lse [B, H, Lq, 1] fp32, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed,
      //     philox_offset, debug_attn_mask); the backward takes the seed and offset. Causal is
      //     top-left aligned: only for a block of the queries' own span (Lq == Lk).
      auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, true, 0.0, causal,
                                                       false, scale);
      return {std::get<0>(r), std::get<1>(r).squeeze(-1).to(accum_type(q)),
              {std::get<6>(r), std::get<7>(r)}};
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
std::tuple<Tensor, Tensor, Tensor> call_backward(Kernel kernel, const Tensor& dout, const Tensor& q,
                                                 const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse,
                                                 const std::vector<Tensor>& state, bool causal,
                                                 double scale) {
  rsd::PhaseScope timed("attention backward");
  switch (kernel) {
    case Kernel::CpuFlash:
      return at::_scaled_dot_product_flash_attention_for_cpu_backward(
          dout, q, k, v, out, lse.contiguous(), 0.0, causal, std::nullopt, scale);
    case Kernel::CudaFlash: {
      // Non-varlen: max_q / max_k are the sequence lengths, as the forward returned them.
      const int64_t d = q.size(-1);
      auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_backward(
          pad_head(dout.stride(-1) == 1 ? dout : dout.contiguous()), pad_head(q), pad_head(k),
          pad_head(v), pad_head(out), lse.to(torch::kFloat).contiguous(), state[0], state[1], q.size(2), k.size(2), 0.0,
          causal, state[2], state[3], scale);
      return {unpad_head(dq, d), unpad_head(dk, d), unpad_head(dv, d)};
    }
    case Kernel::CudaCudnn: {
      // Non-varlen: no cumulative sequence lengths; max_q / max_k are the sequence lengths. dO in
      // the layout of O (older cuDNN releases assume it).
      Tensor d = dout.strides() == out.strides() ? dout : at::empty_like(out).copy_(dout);
      return at::_scaled_dot_product_cudnn_attention_backward(
          d, q, k, v, out, lse.to(torch::kFloat).unsqueeze(-1).contiguous(), state[0],
          state[1], Tensor(), Tensor(), Tensor(), q.size(2), k.size(2), 0.0, causal, scale);
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

// One block's forward: queries [B, H, Lq, D] over K/V [B, Hkv, Lk, D], in one call where the
// kernel takes GQA natively, else folded (unmasked) or per g (causal). Returns the output
// [B, H, Lq, D], the LSE [B, H, Lq] (accum_type) and each call's backward state.
struct Block {
  Tensor out;
  Tensor lse;
  std::vector<std::vector<Tensor>> state;
};

Block block_forward(Kernel kernel, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                    double scale) {
  const int64_t heads = q.size(1), hkv = k.size(1), groups = heads / hkv;
  if (native_gqa(kernel) || groups == 1) {
    Call c = call_forward(kernel, q, k, v, causal, scale);
    return {c.out, c.lse, {std::move(c.state)}};
  }
  if (!causal) {
    Call c = call_forward(kernel, fold(q, hkv), k, v, false, scale);
    return {unfold_heads(c.out, heads), unfold3(c.lse, heads), {std::move(c.state)}};
  }
  Tensor qg = group(q, hkv);
  Block b{torch::empty(q.sizes(), q.options()),
          torch::empty({q.size(0), heads, q.size(2)}, q.options().dtype(accum_type(q))),
          {}};
  Tensor out_g = group(b.out, hkv), lse_g = group(b.lse, hkv);
  for (int64_t g = 0; g < groups; ++g) {
    Call c = call_forward(kernel, qg.select(2, g), k, v, true, scale);
    out_g.select(2, g).copy_(c.out);
    lse_g.select(2, g).copy_(c.lse);
    b.state.push_back(std::move(c.state));
  }
  return b;
}

// One block's backward against the merged `out` and `lse`: (dq [B, H, Lq, D], dk, dv at Hkv).
std::tuple<Tensor, Tensor, Tensor> block_backward(Kernel kernel, const Tensor& dout,
                                                  const Tensor& q, const Tensor& k,
                                                  const Tensor& v, const Tensor& out,
                                                  const Tensor& lse,
                                                  const std::vector<std::vector<Tensor>>& state,
                                                  bool causal, double scale) {
  const int64_t heads = q.size(1), hkv = k.size(1), groups = heads / hkv;
  if (native_gqa(kernel)) {
    return call_backward(kernel, dout, q, k, v, out, lse, state[0], causal, scale);
  }
  const Tensor dout_c = dout.contiguous();
  if (groups == 1) {
    return call_backward(kernel, dout_c, q, k, v, out, lse, state[0], causal, scale);
  }
  if (!causal) {
    auto [dq, dk, dv] = call_backward(kernel, fold(dout_c, hkv), fold(q, hkv), k, v, fold(out, hkv),
                                      fold3(lse, hkv), state[0], false, scale);
    return {unfold_heads(dq, heads), dk, dv};
  }
  Tensor qg = group(q, hkv), doutg = group(dout_c, hkv), outg = group(out, hkv);
  Tensor lseg = group(lse, hkv);
  Tensor dq = torch::empty(q.sizes(), q.options());
  Tensor dq_g = group(dq, hkv);
  Tensor dk, dv;
  for (int64_t g = 0; g < groups; ++g) {
    auto [dqg, dkg, dvg] = call_backward(kernel, doutg.select(2, g), qg.select(2, g), k, v,
                                         outg.select(2, g), lseg.select(2, g), state[g], true,
                                         scale);
    dq_g.select(2, g).copy_(dqg);
    // dK/dV of the shared KV head: the sum over its G query heads, in one buffer.
    if (g == 0) {
      dk = dkg;
      dv = dvg;
    } else {
      dk.add_(dkg);
      dv.add_(dvg);
    }
  }
  return {dq, dk, dv};
}

// Backward state as one flat list for saved_data, with the number of calls' entries first.
std::vector<Tensor> flatten_state(const std::vector<std::vector<Tensor>>& state) {
  std::vector<Tensor> flat;
  for (const auto& s : state) {
    flat.push_back(torch::tensor(static_cast<int64_t>(s.size())));
    flat.insert(flat.end(), s.begin(), s.end());
  }
  return flat;
}
std::vector<std::vector<Tensor>> unflatten_state(const std::vector<Tensor>& flat) {
  std::vector<std::vector<Tensor>> state;
  for (size_t i = 0; i < flat.size();) {
    const auto n = static_cast<size_t>(flat[i].item<int64_t>());
    state.emplace_back(flat.begin() + i + 1, flat.begin() + i + 1 + n);
    i += 1 + n;
  }
  return state;
}

struct GqaAttention : public torch::autograd::Function<GqaAttention> {
  // The prefix (`kp`, `vp`) or the own block (`ks`, `vs`) may be absent (not both): then it is a
  // placeholder (autograd functions take no undefined inputs) and its flag is false.
  static variable_list forward(AutogradContext* ctx, Tensor q, Tensor kp, Tensor vp, Tensor ks,
                               Tensor vs, double scale, bool has_prefix, bool has_own) {
    const auto acc = accum_type(q);
    Tensor out, lse;
    if (has_prefix) {
      const Kernel kernel = kernel_for(q, kp, vp, false, scale);
      Block b = block_forward(kernel, q, kp, vp, false, scale);
      out = b.out;
      lse = b.lse;
      ctx->saved_data["kernel_p"] = static_cast<int64_t>(kernel);
      ctx->saved_data["state_p"] = flatten_state(b.state);
    }
    if (has_own) {
      const Kernel kernel = kernel_for(q, ks, vs, true, scale);
      Block b = block_forward(kernel, q, ks, vs, true, scale);
      ctx->saved_data["kernel_s"] = static_cast<int64_t>(kernel);
      ctx->saved_data["state_s"] = flatten_state(b.state);
      if (has_prefix) {
        Tensor merged = torch::logaddexp(lse, b.lse);
        out = (out.to(acc) * (lse - merged).exp().unsqueeze(-1) +
               b.out.to(acc) * (b.lse - merged).exp().unsqueeze(-1))
                  .to(q.scalar_type());
        lse = merged;
      } else {
        out = b.out;
        lse = b.lse;
      }
    }
    ctx->save_for_backward({q, kp, vp, ks, vs, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["has_prefix"] = has_prefix;
    ctx->saved_data["has_own"] = has_own;
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
    const auto kernel_of = [&](const char* key) {
      return static_cast<Kernel>(ctx->saved_data[key].toInt());
    };
    const auto state_of = [&](const char* key) {
      return unflatten_state(ctx->saved_data[key].toTensorVector());
    };
    // The native kernels take the upstream gradient in the layout it arrives in (call_backward);
    // the folded and per-g paths view it, so they need it contiguous.
    Tensor dout = grads[0];
    Tensor dq, dkp, dvp, dks, dvs;
    if (has_prefix) {
      std::tie(dq, dkp, dvp) = block_backward(kernel_of("kernel_p"), dout, q, kp, vp, out, lse,
                                              state_of("state_p"), false, scale);
    }
    if (has_own) {
      Tensor dq_s;
      std::tie(dq_s, dks, dvs) = block_backward(kernel_of("kernel_s"), dout, q, ks, vs, out, lse,
                                                state_of("state_s"), true, scale);
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
