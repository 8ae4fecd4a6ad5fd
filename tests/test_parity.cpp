// Parity with the reference implementations (../shared/golden): every shipped LM on the CPU.
#include "app/parity.h"
#include "test_util.h"

namespace zp::test {

// Final parameters whose trajectory is rounding noise amplified by AdamW (see below). In bf16 also
// GPT-2's ln_1.bias (its gradient reaches it partly through the same key path) and Qwen2's
// q_proj.bias: a few of its elements have a true first gradient below bf16's gradient noise (0.006x
// the tensor's RMS), AdamW's first step moves each element by lr times the sign it sees, and one
// wrong sign alone is a 0.07 relative error of the final tensor. In 40 runs with other, equally
// valid bf16 rounding noise it failed 3e-2 in 25 (layer 0) and 7 (layer 1); transformers' bf16 run
// happens to pass (8.7e-3).
static bool ill_conditioned_final(const std::string& name, const std::string& dtype) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  return name.rfind("train.final.", 0) == 0 &&
         (has("attn.c_attn.bias") || has("self_attn.k_proj.bias") ||
          (dtype == "bf16" && (has("ln_1.bias") || has("self_attn.q_proj.bias"))));
}
// What they must still meet: twice the error of transformers 5.17 itself on the same folders
// (tests/reference/transformers_golden_parity.py, H200 host: fp32 worst 7.1e-4 for GPT-2's
// c_attn.bias and 1.6e-3 for Qwen2's k_proj.bias; bf16 0.61 and 0.81), so a wrong update still fails.
static double ill_conditioned_bound(const std::string& dtype) { return dtype == "bf16" ? 1.0 : 3e-3; }

static void expect_parity(const std::string& model, const std::string& device, const std::string& dtype,
                          bool skip_ill_conditioned = false) {
  std::string dir = golden_path(model);
  if (dir.empty()) GTEST_SKIP() << "golden folder " << model << " not found (set ZP_GOLDEN_DIR)";
  app::ParityReport r = app::run_parity({dir, device, dtype}, /*print=*/false);
  int checked = 0;
  for (const auto& e : r.entries()) {
    if (skip_ill_conditioned && ill_conditioned_final(e.name, dtype)) {
      EXPECT_LE(e.rel_error, ill_conditioned_bound(dtype)) << model << " " << device << " " << dtype << ": " << e.name;
      continue;
    }
    ++checked;
    EXPECT_TRUE(e.ok) << model << " " << device << " " << dtype << ": " << e.name << " rel_err " << e.rel_error
                      << " > " << r.tolerance();
  }
  EXPECT_GT(checked, 10);
}

// fp32: logits, loss, every gradient, the 5-step loss trajectory and (Llama) every final parameter.
TEST(Parity, LlamaCpuFp32) { expect_parity("llama-tiny", "cpu", "fp32"); }
// GPT-2's key bias has an exactly zero gradient (softmax ignores a per-query shift) and Qwen2's is
// nearly zero in its slow RoPE channels: in fp32 those gradients are rounding noise that AdamW
// normalises into full-size steps, so the final values of those two bias tensors are held only to
// the bound above (everything else, their gradients included, is held to the tolerance). The
// reference implementation misses the tolerance on exactly these tensors too (transformers 5.17,
// fp32: 5.4e-4 to 7.1e-4 for GPT-2, 6.1e-4 to 1.6e-3 for Qwen2, CPU and GPU). GPT-2's are checked in
// full in fp64 below. Qwen2's cannot be reproduced by any engine that keeps fp32 gradients: even in
// fp64 compute its gradient matches the reference to 2e-7 (fp32 accumulation, and the reference
// itself is stored in fp32), and AdamW turns that into a 4e-4 difference of the final value.
TEST(Parity, Gpt2CpuFp32) { expect_parity("gpt2-tiny", "cpu", "fp32", true); }
TEST(Parity, Qwen2CpuFp32) { expect_parity("qwen2-tiny", "cpu", "fp32", true); }
TEST(Parity, Gpt2CpuFp64) { expect_parity("gpt2-tiny", "cpu", "fp64"); }
TEST(Parity, Qwen2CpuFp64) { expect_parity("qwen2-tiny", "cpu", "fp64", true); }
TEST(Parity, LlamaCpuFp64) { expect_parity("llama-tiny", "cpu", "fp64"); }

TEST(ParityGpu, AllLmsCudaFp32) {
  ZP_SKIP_WITHOUT_GPU();
  expect_parity("llama-tiny", "cuda", "fp32");
  expect_parity("gpt2-tiny", "cuda", "fp32", true);
  expect_parity("qwen2-tiny", "cuda", "fp32", true);
}
// bf16 operands, fp32 accumulation and master weights: tolerance 3e-2 for everything but the
// ill-conditioned finals (transformers' bf16 autocast misses the key biases by as much: 0.57-0.81,
// and GPT-2's ln_1.bias: 0.10).
TEST(ParityGpu, AllLmsCudaBf16) {
  ZP_SKIP_WITHOUT_GPU();
  expect_parity("llama-tiny", "cuda", "bf16");
  expect_parity("gpt2-tiny", "cuda", "bf16", true);
  expect_parity("qwen2-tiny", "cuda", "bf16", true);
}

TEST(Parity, BadFoldersAreClearErrors) {
  auto msg = [](const std::string& dir) {
    try {
      app::run_parity({dir, "cpu", "fp32"}, false);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("/nonexistent-dir").find("not a directory"), std::string::npos);
  std::string cfg = golden_path("llama-tiny/config.json");
  if (!cfg.empty()) {  // a folder without the reference file
    std::filesystem::path dir = std::filesystem::temp_directory_path() / "zp_parity_no_io";
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(cfg, dir / "config.json", std::filesystem::copy_options::overwrite_existing);
    EXPECT_NE(msg(dir.string()).find("io.safetensors"), std::string::npos) << msg(dir.string());
    std::filesystem::remove_all(dir);
  }
}

}  // namespace zp::test
