#include "app/parity.h"
#include "app/parity_report.h"
#include "app/unet_parity.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/log.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/weight_source.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "runtime/causal_lm_loss.h"

namespace zp::app {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The first `vocab` of every `ld` values: the logits without the model's padding columns.
std::vector<double> vocab_columns(const std::vector<double>& rows, int64_t vocab, int64_t ld) {
  std::vector<double> out;
  out.reserve(rows.size() / size_t(ld) * size_t(vocab));
  for (size_t r = 0; r + size_t(ld) <= rows.size(); r += size_t(ld))
    out.insert(out.end(), rows.begin() + ptrdiff_t(r), rows.begin() + ptrdiff_t(r + size_t(vocab)));
  return out;
}

// Token ids [B, T] of a dump and their next-token targets (-1 at each sequence's end).
struct DumpTokens {
  int64_t B = 0, T = 0;
  Tensor ids, targets;  // host int32 [B * T]
};

DumpTokens dump_tokens(io::SafetensorsFile& ref, const std::string& io_path, int64_t vocab) {
  const Shape ids_shape = ref.entry("input.input_ids").shape;
  ZP_REQUIRE(ids_shape.size() == 2, io_path, ": input.input_ids must be [B, T]");
  DumpTokens d;
  d.B = ids_shape[0];
  d.T = ids_shape[1];
  const int64_t N = d.B * d.T;
  Tensor ids64 = ref.read("input.input_ids");
  d.ids = Tensor::empty({N}, DType::I32, Device::cpu());
  d.targets = Tensor::empty({N}, DType::I32, Device::cpu());
  for (int64_t i = 0; i < N; ++i) {
    int64_t v = ids64.dtype() == DType::I64 ? ids64.data<int64_t>()[i] : ids64.data<int32_t>()[i];
    ZP_REQUIRE(v >= 0 && v < vocab, io_path, ": input id ", v, " outside the vocabulary of ", vocab);
    d.ids.data<int32_t>()[i] = int32_t(v);
  }
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.T; ++t)
      d.targets.data<int32_t>()[b * d.T + t] = t + 1 < d.T ? d.ids.data<int32_t>()[b * d.T + t + 1] : -1;
  return d;
}

// A LoRA dump (tests/reference/lora_golden_reference.py): `dir` = <model folder>/lora with lora.json
// (the LoRA settings) and io.safetensors (the adapters as input.lora.<name>, the logits, the loss and
// the adapters' gradients, on the model folder's input ids). The base loads from the model folder,
// frozen; the adapters take the dump's values.
ParityReport run_lora_parity(const fs::path& dir, Device dev, DType dt, bool print, const AlterResult& alter) {
  const fs::path model_dir = (dir.has_filename() ? dir : dir.parent_path()).parent_path();
  const json cfg_json = io::read_json_file((model_dir / "config.json").string());
  if (cfg_json.contains("_class_name")) return run_unet_parity(model_dir.string(), dir.string(), dev, dt, print, alter);
  const auto cfg = models::TransformerConfig::from_hub_json(cfg_json, (model_dir / "config.json").string());
  const models::LoraSpec lora =
      io::LoraConfig::from_json(io::read_json_file((dir / "lora.json").string()), (dir / "lora.json").string());
  const std::string io_path = (dir / "io.safetensors").string(), base_io = (model_dir / "io.safetensors").string();
  ZP_REQUIRE(fs::exists(io_path), io_path, ": missing (the LoRA reference outputs)");
  io::SafetensorsFile ref(io_path), base_ref(base_io);

  models::Transformer model(cfg, dev, dt, nullptr, 1, true, {}, lora);
  const auto weights = io::WeightSource::open(model_dir.string(), "model");
  for (nn::ParamBlock* b : model.frozen_blocks()) model.load_block(*weights, *b);
  std::vector<nn::Parameter*> adapters;
  for (nn::ParamBlock* b : model.trainable_blocks())
    for (const auto& p : b->params()) {
      const std::string n = "input.lora." + p->name;
      ZP_REQUIRE(ref.contains(n), io_path, ": no tensor '", n, "'");
      p->value.copy_from(ref.read_as(n, dt));
      adapters.push_back(p.get());
    }
  const DumpTokens tok = dump_tokens(base_ref, base_io, cfg.vocab);
  Tensor d_ids = tok.ids.to(dev), d_tgt = tok.targets.to(dev);

  ParityReport rep(ParityCriterion::for_dump(dir.string(), dt), print);
  rep.expect(ref.names());
  rep.alter_results(alter);
  if (print)
    std::printf("parity: %s (LoRA r=%lld on %s, %zu adapter tensors) on %s, B=%lld T=%lld, tolerance %.0e\n",
                dir.c_str(), (long long)lora.r, cfg.model_type.c_str(), adapters.size(), dev.str().c_str(),
                (long long)tok.B, (long long)tok.T, rep.tolerance());
  models::TransformerActivations acts;
  model.forward(d_ids.data<int32_t>(), tok.B, tok.T, acts);
  runtime::CausalLmLoss lm(acts.logits, cfg.vocab, d_tgt.data<int32_t>(), tok.B * (tok.T - 1));
  rep.check("output.logits", vocab_columns(host_values(acts.logits), cfg.vocab, model.padded_vocab()),
            host_values(ref.read_as("output.logits", DType::F64)));
  rep.check("output.loss", {lm.mean()}, host_values(ref.read_as("output.loss", DType::F64)));
  model.backward(acts, lm.backward(acts.logits));
  for (nn::Parameter* p : adapters) {  // A [r, in] and B [out, r] in PEFT's layout and ours alike
    const std::string g = "grad." + p->name;
    ZP_REQUIRE(ref.contains(g), io_path, ": no tensor '", g, "'");
    rep.check(g, host_values(p->grad), host_values(ref.read_as(g, DType::F64)));
  }
  rep.record_missing();
  return rep;
}

}  // namespace

ParityReport run_parity(const ParityOptions& opt, bool print) {
  const fs::path dir = opt.model_dir;
  ZP_REQUIRE(fs::is_directory(dir), opt.model_dir, ": not a directory");
  ZP_REQUIRE(opt.device == "cpu" || opt.device == "cuda", "--device must be cpu or cuda, got '", opt.device, "'");
  ZP_REQUIRE(opt.dtype == "fp32" || opt.dtype == "bf16" || (opt.dtype == "fp64" && opt.device == "cpu"),
             "--dtype must be fp32 or bf16 (or fp64 on the cpu), got '", opt.dtype, "'");
  const Device dev = opt.device == "cuda" ? Device::cuda(0) : Device::cpu();
  if (dev.is_cuda()) ZP_REQUIRE(cuda_device_count() > 0, "--device cuda: ", cuda_unavailable_reason());
  const DType dt = opt.dtype == "bf16" ? DType::BF16 : opt.dtype == "fp64" ? DType::F64 : DType::F32;

  if (fs::exists(dir / "lora.json")) return run_lora_parity(dir, dev, dt, print, opt.alter_result);
  const fs::path cfg_path = dir / "config.json";
  const json cfg_json = io::read_json_file(cfg_path.string());
  if (cfg_json.contains("_class_name")) {
    ZP_REQUIRE(cfg_json["_class_name"] == "UNet2DConditionModel", cfg_path.string(), ": _class_name ",
               cfg_json["_class_name"].dump(), " is not supported (UNet2DConditionModel or a transformer LM)");
    return run_unet_parity(dir.string(), dev, dt, print, opt.alter_result);
  }
  auto cfg = models::TransformerConfig::from_hub_json(cfg_json, cfg_path.string());
  const fs::path io_path = dir / "io.safetensors";
  ZP_REQUIRE(fs::exists(io_path), io_path.string(), ": missing (the reference inputs and outputs)");
  io::SafetensorsFile ref(io_path.string());
  for (const char* n : {"input.input_ids", "output.logits", "output.loss"}) ZP_REQUIRE(ref.contains(n), io_path.string(), ": no tensor '", n, "'");

  models::Transformer model(cfg, dev, dt);
  model.load(*io::WeightSource::open(dir.string(), "model"));

  const DumpTokens tok = dump_tokens(ref, io_path.string(), cfg.vocab);
  const int64_t B = tok.B, T = tok.T;
  const Tensor& ids = tok.ids;
  const Tensor& tgt = tok.targets;
  Tensor d_ids = ids.to(dev), d_tgt = tgt.to(dev);
  const int64_t num_valid = B * (T - 1);

  ParityReport rep(ParityCriterion::for_dump(dir.string(), dt), print);
  rep.expect(ref.names());
  rep.alter_results(opt.alter_result);
  if (print) std::printf("parity: %s (%s, %lld parameters) on %s in %s, B=%lld T=%lld, tolerance %.0e\n", opt.model_dir.c_str(),
              cfg.model_type.c_str(), (long long)cfg.num_parameters(), dev.str().c_str(), opt.dtype.c_str(),
              (long long)B, (long long)T, rep.tolerance());
  models::TransformerActivations acts;
  model.forward(d_ids.data<int32_t>(), B, T, acts);
  runtime::CausalLmLoss lm(acts.logits, cfg.vocab, d_tgt.data<int32_t>(), num_valid);
  rep.check("output.logits", vocab_columns(host_values(acts.logits), cfg.vocab, model.padded_vocab()),
            host_values(ref.read_as("output.logits", DType::F64)));
  rep.check("output.loss", {lm.mean()}, host_values(ref.read_as("output.loss", DType::F64)));
  model.backward(acts, lm.backward(acts.logits));  // the logits were read: the gradient may overwrite them
  for (nn::Parameter* p : model.parameters()) {
    const std::string g = "grad." + p->name;
    ZP_REQUIRE(ref.contains(g), io_path.string(), ": no tensor '", g, "'");
    std::vector<double> want = host_values(ref.read_as(g, DType::F64));
    std::vector<double> got = host_values(p->grad);
    if (p->file_transposed) got = transpose(got, p->shape[0], p->shape[1]);  // the reference is [in, out]
    rep.check(g, got, want);
  }

  if (ref.contains("train.loss")) {
    // The reference's optimizer: lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on everything.
    parallel::ZeroEngine engine(model.blocks(), parallel::ShardingPolicy::zero_stage(0), nullptr, {1e-3, 0.9, 0.95, 1e-8, 0.1, true});
    std::vector<double> losses;
    const int64_t steps = ref.entry("train.loss").shape.at(0);
    for (int64_t s = 0; s < steps; ++s) {
      engine.begin_step();
      models::TransformerActivations step_acts;
      model.forward(d_ids.data<int32_t>(), B, T, step_acts);
      runtime::CausalLmLoss step_loss(step_acts.logits, cfg.vocab, d_tgt.data<int32_t>(), num_valid);
      model.backward(step_acts, step_loss.backward(step_acts.logits));
      losses.push_back(step_loss.mean());
      engine.step(1.f);
    }
    rep.check("train.loss", losses, host_values(ref.read_as("train.loss", DType::F64)));
    for (nn::Parameter* p : model.parameters()) {
      const std::string f = "train.final." + p->name;
      ZP_REQUIRE(ref.contains(f), io_path.string(), ": has train.loss but no tensor '", f, "'");
      std::vector<double> got = host_values(p->value), want = host_values(ref.read_as(f, DType::F64));
      if (p->file_transposed) got = transpose(got, p->shape[0], p->shape[1]);
      rep.check(f, got, want);
    }
  }
  rep.record_missing();
  return rep;
}

}  // namespace zp::app
