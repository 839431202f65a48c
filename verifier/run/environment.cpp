// verifier/run/environment.cpp: what this process and machine can run (run.hpp: check_environment,
// GlobalState).
#include "verifier/run/trainer.hpp"

namespace ckv {

GlobalState GlobalState::current() {
  return {RngState::capture(), compat::AutocastState::current(), torch::GradMode::is_enabled()};
}

void check_environment(const Case& c) {
  validate(c);
  if (c.device != "cpu") {
    if (!torch::cuda::is_available())
      throw EnvironmentError("device=" + c.device + ": no CUDA device is available here");
    const torch::Device d(c.device);
    if (d.has_index() && d.index() >= static_cast<int>(torch::cuda::device_count()))
      throw EnvironmentError("device=" + c.device + ": this machine has " +
                             std::to_string(torch::cuda::device_count()) + " CUDA device(s)");
  }
  if (c.precision == Precision::fp16 && c.device == "cpu" && !compat::kCpuFp16Autocast)
    throw EnvironmentError("prec=fp16 on cpu needs LibTorch >= 2.3 (CPU autocast to fp16); this build has " +
                           std::string(TORCH_VERSION));
#if !CKV_TORCH_AT_LEAST(2, 0)
  // LibTorch 1.13's CPU autocast leaves the tied head's matmul against a bf16 input in fp32: the plain
  // run itself fails ("expected scalar type BFloat16 but found Float").
  if (c.precision == Precision::bf16 && c.device == "cpu" && c.model.tie == Tie::head)
    throw EnvironmentError(
        "tie=head with prec=bf16 on cpu needs LibTorch >= 2.0 (1.13's CPU autocast fails the "
        "plain run); this build has " +
        std::string(TORCH_VERSION));
#endif
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kb = 0;
    meminfo >> kb;
    if (key == "MemAvailable:") {
      const double need = estimated_bytes(c), have = kb * 1024.0;
      if (need > 0.8 * have)
        throw EnvironmentError("the case needs about " + std::to_string(static_cast<long>(need / (1 << 20))) +
                               " MiB and this machine has " + std::to_string(static_cast<long>(have / (1 << 20))) +
                               " MiB available");
      break;
    }
    meminfo.ignore(1 << 10, '\n');
  }
}

}  // namespace ckv
