// verifier/runner.cpp: see runner.hpp.
#include "verifier/runner.hpp"

#include "verifier/compat.hpp"
#include "verifier/model.hpp"

namespace ckv {
namespace {

// The parameters a segment's units read: the whole block, or the norm + sublayer of one part.
std::vector<torch::Tensor> segment_params(TransformerImpl& model, const Segment& seg) {
  std::vector<torch::Tensor> out;
  for (const Unit& u : seg.units) {
    const std::string L = "layer" + std::to_string(u.layer) + ".";
    for (const auto& kv : model.named_parameters()) {
      const std::string& n = kv.key();
      if (n.rfind(L, 0) != 0) continue;
      const std::string rest = n.substr(L.size());
      const bool attn_part = rest.rfind("norm1.", 0) == 0 || rest.rfind("attn.", 0) == 0;
      if (u.part == BlockPart::whole || (u.part == BlockPart::attn) == attn_part) out.push_back(kv.value());
    }
  }
  return out;
}

torch::Tensor to_tensor(const std::vector<double>& v, std::vector<int64_t> shape, const torch::Device& d) {
  return torch::from_blob(const_cast<double*>(v.data()), shape, torch::kDouble).to(torch::kFloat).to(d);
}

}  // namespace

RunObservation run_case(const Case& c, CheckpointImpl* impl) {
  validate(c);
  RunObservation obs;
  obs.c = c;
  obs.segments = c.plan.segments(c.model.layers, c.model.attention);
  obs.initial_params = make_params(c.model, c.seed);
  obs.data = make_case_data(c.model, c.batch, c.seq, c.seed);

  const torch::Device device = parse_device(c.device);
  if (c.precision == Precision::fp16 && device.is_cpu() && !compat::kCpuFp16Autocast)
    throw std::invalid_argument("prec=fp16 on cpu needs LibTorch >= 2.3 (CPU autocast to fp16); this build has " +
                                std::string(TORCH_VERSION));
  // Dropout masks come from the device's default generator, seeded from the case so a run replays.
  torch::manual_seed(c.seed);
  DropoutTap tap(c.dropout_impl, c.dropout);
  TransformerImpl model(c.model, &tap);
  model.to(device);
  model.load(obs.initial_params);
  model.train();

  const torch::Tensor x0 = to_tensor(obs.data.x, {c.batch, c.seq, c.model.d_model}, device);
  const torch::Tensor targets =
      torch::from_blob(obs.data.targets.data(), {c.batch, c.seq}, torch::kLong).clone().to(device);
  const torch::Tensor y = to_tensor(obs.data.y, {c.batch, c.seq, c.model.vocab}, device);
  const bool autocast = c.precision != Precision::fp32;
  const std::vector<std::string> names = [&] {
    std::vector<std::string> n;
    for (const auto& a : obs.initial_params.items) n.push_back(a.name);
    return n;
  }();

  for (int step = 0; step < c.steps; ++step) {
    tap.begin_step(step);
    model.zero_grad();
    StepObservation so;
    so.segment_calls.assign(obs.segments.size(), 0);
    const torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      compat::ScopedAutocastState ac(
          compat::AutocastState::current().with(device.type(), autocast, autocast_dtype(c.precision)));
      torch::Tensor h = x;
      for (size_t s = 0; s < obs.segments.size(); ++s) {
        const Segment& seg = obs.segments[s];
        int* calls = &so.segment_calls[s];
        SegmentFn fn = [&model, &seg, calls](const torch::Tensor& in) {
          ++*calls;
          torch::Tensor t = in;
          for (const Unit& u : seg.units) t = model.run_unit(u, t);
          return t;
        };
        h = (seg.checkpointed && impl) ? impl->run(fn, h, segment_params(model, seg)) : fn(h);
      }
      loss = model.head_loss(h, targets, y);
    }
    loss.backward();
    so.loss = loss.item<double>();
    so.grads = model.grads();
    for (const auto& n : names) so.grad_defined.push_back(model.named_parameters()[n].grad().defined());
    so.dx = x.grad().defined() ? to_doubles(x.grad()) : std::vector<double>(obs.data.x.size(), 0.0);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model.parameters())
        if (p.grad().defined()) p.sub_(p.grad() * c.lr);
    }
    so.params_after = model.values();
    obs.steps.push_back(std::move(so));
  }
  obs.masks = tap.records();
  return obs;
}

}  // namespace ckv
