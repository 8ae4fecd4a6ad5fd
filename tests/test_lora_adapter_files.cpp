// LoRA adapters in PEFT's, diffusers' and kohya-ss's files (io/lora_adapter_files.h), and `zeropipe
// convert` on LoRA checkpoints: export to an adapter folder, and merging into the base weights,
// checked against W + scale * B A computed here in float64 from the golden hub folders.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "app/convert.h"
#include "io/checkpoint_file.h"
#include "io/h5file.h"
#include "io/lora_adapter_files.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace zp::test {
namespace {
using namespace zp::io;
namespace fs = std::filesystem;
using json = nlohmann::json;

struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("zp_lora_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Tensor random_tensor(const Shape& shape, uint64_t seed, float scale = 0.5f) {
  const std::vector<float> v = randn(size_t(shape_numel(shape)), seed, scale);
  Tensor t = Tensor::empty(shape, DType::F32, Device::cpu());
  std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}

std::vector<float> values_of(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  if (t.dtype() == DType::F32) std::memcpy(v.data(), t.data(), v.size() * 4);
  else
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = t.dtype() == DType::BF16 ? float(t.data<bf16>()[i]) : float(t.data<f16>()[i]);
  return v;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// One module of a tiny model to adapt: its path and the engine-layout sizes of its weight.
struct Module {
  std::string path;
  int64_t out, in;
};

// The modules of the golden tiny models the tests adapt.
std::vector<Module> llama_modules() {
  std::vector<Module> m;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m.push_back({p + "self_attn.q_proj", 64, 64});
    m.push_back({p + "self_attn.v_proj", 32, 64});
    m.push_back({p + "mlp.down_proj", 64, 176});
  }
  return m;
}
std::vector<Module> gpt2_modules() {
  // c_attn: in C = 64, out 3C = 192 (its hub weight is [64, 192], Conv1D's [in, out]); mlp.c_fc:
  // in 64, out 256 (hub [64, 256]).
  return {{"transformer.h.0.attn.c_attn", 192, 64}, {"transformer.h.1.attn.c_attn", 192, 64},
          {"transformer.h.0.mlp.c_fc", 256, 64}, {"transformer.h.1.mlp.c_fc", 256, 64}};
}

LoraAdapter make_adapter(const std::vector<Module>& mods, int64_t r, double alpha, bool rslora, uint64_t seed) {
  LoraAdapter a;
  a.config.r = r;
  a.config.alpha = alpha;
  a.config.dropout = 0.05;
  a.config.rslora = rslora;
  std::set<std::string> leaves;
  for (const Module& m : mods) {
    a.tensors[m.path + kLoraASuffix] = random_tensor({r, m.in}, seed++);
    a.tensors[m.path + kLoraBSuffix] = random_tensor({m.out, r}, seed++);  // trained: not zero
    leaves.insert(m.path.substr(m.path.rfind('.') + 1));
  }
  a.config.target_modules = {leaves.begin(), leaves.end()};
  a.source = "test";
  return a;
}

// A LoRA training checkpoint as the trainer writes one: an ordinary checkpoint whose /model holds
// only the adapter tensors (fp32, with Adam moments), plus lora, base_model and base_fingerprint.
void write_lora_checkpoint(const std::string& path, const LoraAdapter& a, const std::string& family,
                           const std::string& base_dir) {
  CheckpointWriter w(path);
  H5File& f = w.file();
  f.set_attr_string("/", "kind", "checkpoint");
  f.set_attr_string("/", "model_family", family);
  f.set_attr_string("/", "config", json{{"model", {{"hub_dir", base_dir}}}, {"lora", a.config.to_json()}}.dump());
  f.set_attr_string("/", "model_config", read_all(base_dir + "/config.json"));
  f.set_attr_string("/", "lora", a.config.to_json().dump());
  f.set_attr_string("/", "base_model", base_dir);
  f.set_attr_string("/", "base_fingerprint", "0123456789abcdef");
  f.set_attr_int("/", "step", 10);
  f.create_group("/model");
  for (auto& [name, t] : a.tensors) {
    w.write("/model/" + name, DType::F32, t.shape(), DType::F32, t.data(), 0, t.numel());
    const Tensor zero = Tensor::zeros(t.shape(), DType::F32, Device::cpu());
    w.write("/optimizer/" + name + "/exp_avg", DType::F32, t.shape(), DType::F32, zero.data(), 0, t.numel());
    w.write("/optimizer/" + name + "/exp_avg_sq", DType::F32, t.shape(), DType::F32, zero.data(), 0, t.numel());
  }
  w.commit();
}

int convert(const std::string& from, const std::string& to, const std::string& merge = "", const std::string& dtype = "keep") {
  app::ConvertOptions o;
  o.from = from;
  o.to = to;
  o.merge_lora = merge;
  o.dtype = dtype;
  return app::run_convert(o);
}

void expect_same_adapter(const LoraAdapter& want, const LoraAdapter& got) {
  ASSERT_EQ(want.tensors.size(), got.tensors.size());
  for (auto& [name, t] : want.tensors) {
    ASSERT_TRUE(got.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(t, got.tensors.at(name))) << name << ": not bit-identical";
  }
  EXPECT_EQ(got.config.r, want.config.r);
  EXPECT_EQ(got.config.alpha, want.config.alpha);
  EXPECT_EQ(got.config.dropout, want.config.dropout);
  EXPECT_EQ(got.config.rslora, want.config.rslora);
  EXPECT_EQ(got.config.target_modules, want.config.target_modules);
}

TEST(LoraAdapterFiles, PeftRoundTripIsBitExact) {
  ScratchDir d("peft_rt");
  for (bool rslora : {false, true}) {
    LoraAdapter a = make_adapter(llama_modules(), 4, 8, rslora, 11);
    a.base_model = "/models/llama";
    write_peft_adapter(d / "a", a);
    const LoraAdapter b = read_peft_adapter(d / "a");
    expect_same_adapter(a, b);
    EXPECT_EQ(b.base_model, "/models/llama");
    EXPECT_FALSE(b.fan_in_fan_out);
    EXPECT_EQ(b.source, d / "a/adapter_model.safetensors");
    EXPECT_DOUBLE_EQ(b.scale_of("model.layers.0.self_attn.q_proj"), rslora ? 8 / 2.0 : 8 / 4.0);
  }
  // bf16: what was written is the values rounded once, read back as bf16.
  LoraAdapter a = make_adapter(llama_modules(), 4, 8, false, 12);
  PeftWriteOptions o;
  o.dtype = DType::BF16;
  write_peft_adapter(d / "bf16", a, o);
  const LoraAdapter b = read_peft_adapter(d / "bf16");
  for (auto& [name, t] : a.tensors) {
    ASSERT_EQ(b.tensors.at(name).dtype(), DType::BF16) << name;
    EXPECT_EQ(values_of(b.tensors.at(name)), round_to(values_of(t), DType::BF16)) << name;
  }
}

TEST(LoraAdapterFiles, PeftNamesAndConfigAsPeftWritesThem) {
  ScratchDir d("peft_names");
  LoraAdapter a = make_adapter(gpt2_modules(), 8, 16, false, 21);
  a.fan_in_fan_out = true;
  a.base_model = "gpt2";
  write_peft_adapter(d / "a", a);
  SafetensorsFile f(d / "a/adapter_model.safetensors");
  std::vector<std::string> want;
  for (const Module& m : gpt2_modules()) {
    want.push_back("base_model.model." + m.path + ".lora_A.weight");
    want.push_back("base_model.model." + m.path + ".lora_B.weight");
    EXPECT_EQ(f.entry("base_model.model." + m.path + ".lora_A.weight").shape, (Shape{8, m.in}));
    EXPECT_EQ(f.entry("base_model.model." + m.path + ".lora_B.weight").shape, (Shape{m.out, 8}));
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(f.names(), want);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const json c = json::parse(read_all(d / "a/adapter_config.json"));
  EXPECT_EQ(c["peft_type"], "LORA");
  EXPECT_EQ(c["task_type"], "CAUSAL_LM");
  EXPECT_EQ(c["r"], 8);
  EXPECT_TRUE(c["lora_alpha"].is_number_integer());
  EXPECT_EQ(c["lora_alpha"], 16);
  EXPECT_DOUBLE_EQ(c["lora_dropout"].get<double>(), 0.05);
  EXPECT_EQ(c["target_modules"], json({"c_attn", "c_fc"}));
  EXPECT_EQ(c["use_rslora"], false);
  EXPECT_EQ(c["bias"], "none");
  EXPECT_EQ(c["fan_in_fan_out"], true);
  EXPECT_EQ(c["base_model_name_or_path"], "gpt2");
  EXPECT_EQ(c["inference_mode"], true);
  EXPECT_EQ(c["init_lora_weights"], true);
  EXPECT_TRUE(c["modules_to_save"].is_null());
  EXPECT_EQ(c["use_dora"], false);
  EXPECT_EQ(c["rank_pattern"], json::object());
  EXPECT_EQ(c["alpha_pattern"], json::object());
  // Nothing a PEFT release before 0.14 would refuse as an unknown LoraConfig argument.
  const std::set<std::string> peft_0_10_fields = {
      "alpha_pattern", "auto_mapping", "base_model_name_or_path", "bias", "fan_in_fan_out", "inference_mode",
      "init_lora_weights", "layer_replication", "layers_pattern", "layers_to_transform", "loftq_config", "lora_alpha",
      "lora_dropout", "megatron_config", "megatron_core", "modules_to_save", "peft_type", "r", "rank_pattern",
      "revision", "target_modules", "task_type", "use_dora", "use_rslora"};
  for (auto& [k, v] : c.items()) EXPECT_TRUE(peft_0_10_fields.count(k)) << k;
  // A non-integral alpha stays a number.
  a.config.alpha = 12.5;
  write_peft_adapter(d / "b", a);
  EXPECT_EQ(json::parse(read_all(d / "b/adapter_config.json"))["lora_alpha"], 12.5);
}

// Writes a PEFT folder whose safetensors holds `keys` (each [2, 4] or [4, 2]) and whose config is
// PEFT's with `config_patch` applied.
void write_odd_peft(const std::string& dir, const std::vector<std::string>& keys, const json& config_patch = json::object()) {
  LoraAdapter a = make_adapter({{"model.layers.0.self_attn.q_proj", 4, 4}}, 2, 2, false, 5);
  write_peft_adapter(dir, a);
  std::vector<std::pair<std::string, Tensor>> t;
  for (const std::string& k : keys) t.emplace_back(k, random_tensor({2, 4}, 3));
  write_safetensors(dir + "/adapter_model.safetensors", t, {{"format", "pt"}});
  json c = json::parse(read_all(dir + "/adapter_config.json"));
  c.merge_patch(config_patch);
  std::ofstream(dir + "/adapter_config.json") << c.dump(2);
}

TEST(LoraAdapterFiles, PeftReaderRefusesWhatAMergeWouldGetWrong) {
  ScratchDir d("peft_refuse");
  const std::string base = "base_model.model.model.layers.0.self_attn.q_proj.";
  write_odd_peft(d / "named", {base + "lora_A.default.weight", base + "lora_B.default.weight"});
  expect_error([&] { read_peft_adapter(d / "named"); },
               {d / "named/adapter_model.safetensors", base + "lora_A.default.weight", "adapter name ('default')"});
  write_odd_peft(d / "emb", {"base_model.model.model.embed_tokens.lora_embedding_A"});
  expect_error([&] { read_peft_adapter(d / "emb"); }, {"lora_embedding_A", "embedding LoRA"});
  write_odd_peft(d / "dora", {base + "lora_A.weight", base + "lora_B.weight", base + "lora_magnitude_vector"});
  expect_error([&] { read_peft_adapter(d / "dora"); }, {"lora_magnitude_vector", "DoRA"});
  write_odd_peft(d / "nopre", {"model.layers.0.self_attn.q_proj.lora_A.weight"});
  expect_error([&] { read_peft_adapter(d / "nopre"); }, {"model.layers.0.self_attn.q_proj.lora_A.weight", "base_model.model."});
  write_odd_peft(d / "saved", {base + "lora_A.weight", "base_model.model.lm_head.weight"});
  expect_error([&] { read_peft_adapter(d / "saved"); }, {"lm_head.weight", "not a LoRA A or B weight"});
  write_odd_peft(d / "usedora", {}, {{"use_dora", true}});
  expect_error([&] { read_peft_adapter(d / "usedora"); }, {"adapter_config.json", "use_dora"});
  write_odd_peft(d / "pissa", {}, {{"init_lora_weights", "pissa_niter_4"}});
  expect_error([&] { read_peft_adapter(d / "pissa"); }, {"init_lora_weights", "rewrites the base weights"});
  write_odd_peft(d / "pattern", {}, {{"rank_pattern", {{"q_proj", 4}}}});
  expect_error([&] { read_peft_adapter(d / "pattern"); }, {"rank_pattern"});
  write_odd_peft(d / "bias", {}, {{"bias", "all"}});
  expect_error([&] { read_peft_adapter(d / "bias"); }, {"bias"});
  write_odd_peft(d / "ia3", {}, {{"peft_type", "IA3"}});
  expect_error([&] { read_peft_adapter(d / "ia3"); }, {"peft_type", "IA3"});
  // Half a module.
  write_odd_peft(d / "half", {base + "lora_A.weight"});
  expect_error([&] { read_peft_adapter(d / "half"); }, {"model.layers.0.self_attn.q_proj", "lora_B.weight"});
}

// The module paths of a golden UNet's linear maps and 1x1 convolutions, as known adapter names.
std::vector<std::string> unet_known_names(const std::string& golden) {
  SafetensorsFile f(golden_path(golden + "/diffusion_pytorch_model.safetensors"));
  std::vector<std::string> out;
  for (const std::string& n : f.names()) {
    const Shape& s = f.entry(n).shape;
    if (!n.ends_with(".weight") || !(s.size() == 2 || (s.size() == 4 && s[2] == 1 && s[3] == 1))) continue;
    const std::string m = n.substr(0, n.size() - 7);
    out.push_back(m + kLoraASuffix);
    out.push_back(m + kLoraBSuffix);
  }
  return out;
}

std::vector<Module> unet_modules() {
  const std::string t = "down_blocks.0.attentions.0.transformer_blocks.0.";
  return {{t + "attn1.to_q", 16, 16}, {t + "attn1.to_k", 16, 16}, {t + "attn1.to_out.0", 16, 16},
          {"mid_block.attentions.0.transformer_blocks.0.attn2.to_v", 32, 16}};
}

TEST(LoraAdapterFiles, DiffusersRoundTripAndNames) {
  ScratchDir d("diffusers");
  LoraAdapter a = make_adapter(unet_modules(), 4, 4, false, 31);
  a.config.alpha = 6;
  write_diffusers_lora(d / "a", a);
  SafetensorsFile f(d / "a/pytorch_lora_weights.safetensors");
  for (const Module& m : unet_modules()) {
    EXPECT_TRUE(f.contains("unet." + m.path + ".lora_A.weight")) << m.path;
    EXPECT_TRUE(f.contains("unet." + m.path + ".lora_B.weight")) << m.path;
  }
  EXPECT_EQ(f.names().size(), 2 * unet_modules().size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const json meta = json::parse(f.metadata().at("lora_adapter_metadata"));
  EXPECT_EQ(meta["unet.r"], 4);
  EXPECT_EQ(meta["unet.lora_alpha"], 6);
  EXPECT_EQ(meta["unet.target_modules"], json(a.config.target_modules));
  const LoraAdapter b = read_diffusers_lora(d / "a", {});
  expect_same_adapter(a, b);
  EXPECT_DOUBLE_EQ(b.scale_of(unet_modules()[0].path), 1.5);
  // Read against the model's modules too, and as the file rather than the folder.
  expect_same_adapter(a, read_diffusers_lora(d / "a/pytorch_lora_weights.safetensors", unet_known_names("unet-sd-tiny")));
  // Without diffusers' metadata, alpha = r (scale 1), as diffusers loads it.
  std::vector<std::pair<std::string, Tensor>> plain;
  for (const std::string& n : f.names()) plain.emplace_back(n, f.read(n));
  write_safetensors(d / "plain.safetensors", plain, {{"format", "pt"}});
  const LoraAdapter p = read_diffusers_lora(d / "plain.safetensors", {});
  EXPECT_DOUBLE_EQ(p.scale_of(unet_modules()[0].path), 1.0);
  // Text-encoder adapters are refused, naming the tensor.
  plain.emplace_back("text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight", random_tensor({4, 8}, 1));
  write_safetensors(d / "te.safetensors", plain);
  expect_error([&] { read_diffusers_lora(d / "te.safetensors", {}); }, {"te.safetensors", "text_encoder.text_model", "text encoder"});
}

TEST(LoraAdapterFiles, KohyaNamesReadBackToTheModulePaths) {
  ScratchDir d("kohya");
  const std::vector<Module> mods = unet_modules();
  const LoraAdapter a = make_adapter(mods, 4, 4, false, 41);
  std::vector<std::pair<std::string, Tensor>> t;
  for (size_t i = 0; i < mods.size(); ++i) {
    const std::string& m = mods[i].path;
    std::string k = "lora_unet_" + m;
    std::replace(k.begin(), k.end(), '.', '_');
    t.emplace_back(k + ".lora_down.weight", a.tensors.at(m + kLoraASuffix));
    t.emplace_back(k + ".lora_up.weight", a.tensors.at(m + kLoraBSuffix));
    if (i != 3) {  // the last module has no alpha: kohya's default alpha = rank
      Tensor alpha = Tensor::empty({}, DType::F32, Device::cpu());
      alpha.data<float>()[0] = i == 0 ? 2.f : 8.f;
      t.emplace_back(k + ".alpha", alpha);
    }
  }
  write_safetensors(d / "kohya.safetensors", t);
  const LoraAdapter b = read_diffusers_lora(d / "kohya.safetensors", unet_known_names("unet-sd-tiny"));
  ASSERT_EQ(b.tensors.size(), a.tensors.size());
  for (auto& [name, v] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(v, b.tensors.at(name))) << name;
  }
  EXPECT_DOUBLE_EQ(b.scale_of(unet_modules()[0].path), 2.0 / 4);
  EXPECT_DOUBLE_EQ(b.scale_of(unet_modules()[1].path), 8.0 / 4);
  EXPECT_DOUBLE_EQ(b.scale_of(unet_modules()[2].path), 8.0 / 4);
  EXPECT_DOUBLE_EQ(b.scale_of(unet_modules()[3].path), 1.0);
  // Without the model's modules the underscores cannot be resolved.
  expect_error([&] { read_diffusers_lora(d / "kohya.safetensors", {}); }, {"kohya.safetensors", "module"});
  // Two modules that read the same with '_' for '.': refused, naming both.
  const std::vector<std::string> clash = {"x.a_b.lora_A.weight", "x.a_b.lora_B.weight", "x.a.b.lora_A.weight",
                                          "x.a.b.lora_B.weight"};
  std::vector<std::pair<std::string, Tensor>> c = {{"lora_unet_x_a_b.lora_down.weight", random_tensor({2, 3}, 1)},
                                                   {"lora_unet_x_a_b.lora_up.weight", random_tensor({3, 2}, 2)}};
  write_safetensors(d / "clash.safetensors", c);
  expect_error([&] { read_diffusers_lora(d / "clash.safetensors", clash); }, {"lora_unet_x_a_b", "x.a_b", "x.a.b"});
  // SDXL's LDM names are no module of a diffusers UNet.
  write_safetensors(d / "sgm.safetensors", {{"lora_unet_input_blocks_4_1_proj_in.lora_down.weight", random_tensor({2, 3}, 1)}});
  expect_error([&] { read_diffusers_lora(d / "sgm.safetensors", unet_known_names("unet-sd-tiny")); },
               {"lora_unet_input_blocks_4_1_proj_in", "no module of this model"});
}

// --- zeropipe convert -------------------------------------------------------------------------------

TEST(ConvertLora, CheckpointToPeftFolder) {
  ScratchDir d("ckpt_peft");
  const std::string llama = golden_path("llama-tiny");
  LoraAdapter a = make_adapter(llama_modules(), 4, 8, false, 51);
  write_lora_checkpoint(d / "lora.h5", a, "transformer", llama);
  {  // the reader
    LoraCheckpointInfo info;
    const LoraAdapter b = read_lora_checkpoint(d / "lora.h5", &info);
    expect_same_adapter(a, b);
    EXPECT_EQ(b.base_model, llama);
    EXPECT_EQ(info.model_family, "transformer");
    EXPECT_EQ(info.base_fingerprint, "0123456789abcdef");
    EXPECT_EQ(info.model_config["model_type"], "llama");
  }
  ASSERT_EQ(convert(d / "lora.h5", d / "peft"), 0);
  LoraAdapter b = read_peft_adapter(d / "peft");
  // q_proj, v_proj and down_proj of both layers are exactly what the targets name: kept as given.
  expect_same_adapter(a, b);
  EXPECT_FALSE(b.fan_in_fan_out);
  EXPECT_EQ(b.base_model, llama);

  // Only layer 0 adapted: the targets would adapt layer 1 too, so the paths are written.
  LoraAdapter half = a;
  for (auto it = half.tensors.begin(); it != half.tensors.end();)
    it = it->first.starts_with("model.layers.1.") ? half.tensors.erase(it) : std::next(it);
  write_lora_checkpoint(d / "half.h5", half, "transformer", llama);
  ASSERT_EQ(convert(d / "half.h5", d / "peft_half", "", "bf16"), 0);
  b = read_peft_adapter(d / "peft_half");
  EXPECT_EQ(b.config.target_modules, half.modules());
  EXPECT_EQ(b.tensors.begin()->second.dtype(), DType::BF16);

  // GPT-2: Conv1D modules, so fan_in_fan_out.
  const LoraAdapter g = make_adapter(gpt2_modules(), 4, 8, false, 52);
  write_lora_checkpoint(d / "gpt2.h5", g, "transformer", golden_path("gpt2-tiny"));
  ASSERT_EQ(convert(d / "gpt2.h5", d / "peft_gpt2"), 0);
  b = read_peft_adapter(d / "peft_gpt2");
  expect_same_adapter(g, b);
  EXPECT_TRUE(b.fan_in_fan_out);

  // Destinations: not an .h5, not a non-empty folder.
  expect_error([&] { convert(d / "lora.h5", d / "x.h5"); }, {"x.h5", "folder"});
  expect_error([&] { convert(d / "lora.h5", d / "peft"); }, {"peft", "not empty"});
}

TEST(ConvertLora, UnetCheckpointToDiffusersFolder) {
  ScratchDir d("ckpt_unet");
  LoraAdapter a = make_adapter(unet_modules(), 4, 8, false, 61);
  // Not every to_q of the UNet is adapted, so only the paths name these modules exactly.
  a.config.target_modules = a.modules();
  write_lora_checkpoint(d / "lora.h5", a, "unet", golden_path("unet-sd-tiny"));
  ASSERT_EQ(convert(d / "lora.h5", d / "out"), 0);
  expect_same_adapter(a, read_diffusers_lora(d / "out", unet_known_names("unet-sd-tiny")));

  // The stem's conv_in and the head's conv_out: 3x3 convolutions' adapters under diffusers' names.
  a.tensors["conv_in.lora_A.weight"] = random_tensor({4, 4, 3, 3}, 71);
  a.tensors["conv_in.lora_B.weight"] = random_tensor({16, 4, 1, 1}, 72);
  a.tensors["conv_out.lora_A.weight"] = random_tensor({4, 16, 3, 3}, 73);
  a.tensors["conv_out.lora_B.weight"] = random_tensor({4, 4, 1, 1}, 74);
  a.config.target_modules = a.modules();
  write_lora_checkpoint(d / "stem_head.h5", a, "unet", golden_path("unet-sd-tiny"));
  ASSERT_EQ(convert(d / "stem_head.h5", d / "stem_head"), 0);
  SafetensorsFile f(d / "stem_head/pytorch_lora_weights.safetensors");
  for (const char* name : {"unet.conv_in.lora_A.weight", "unet.conv_in.lora_B.weight", "unet.conv_out.lora_A.weight",
                           "unet.conv_out.lora_B.weight"})
    EXPECT_TRUE(f.contains(name)) << name;
  expect_same_adapter(a, read_diffusers_lora(d / "stem_head", {}));
}

TEST(ConvertLora, RefusesAnAdapterThatDoesNotFitTheBase) {
  ScratchDir d("misfit");
  const std::string llama = golden_path("llama-tiny");
  LoraAdapter a = make_adapter({{"model.layers.0.self_attn.v_proj", 32, 65}}, 4, 8, false, 71);  // in is 64
  write_lora_checkpoint(d / "wide.h5", a, "transformer", llama);
  expect_error([&] { convert(d / "wide.h5", d / "peft"); },
               {"model.layers.0.self_attn.v_proj.lora_A.weight", "[4, 65]", "64 inputs"});
  expect_error([&] { convert(llama, d / "m.h5", d / "wide.h5"); }, {"cannot merge", "v_proj.lora_A.weight", "64 inputs"});
  EXPECT_FALSE(fs::exists(d / "m.h5"));
  a = make_adapter({{"model.layers.0.self_attn.v_proj", 33, 64}}, 4, 8, false, 72);  // out is 32
  write_lora_checkpoint(d / "tall.h5", a, "transformer", llama);
  expect_error([&] { convert(llama, d / "m.h5", d / "tall.h5"); }, {"v_proj.lora_B.weight", "[33, 4]", "32 outputs"});
  a = make_adapter({{"model.layers.0.self_attn.w_proj", 32, 64}}, 4, 8, false, 73);
  write_lora_checkpoint(d / "none.h5", a, "transformer", llama);
  expect_error([&] { convert(llama, d / "m.h5", d / "none.h5"); }, {"w_proj.lora_A.weight", "no weight"});
  a = make_adapter({{"model.embed_tokens", 256, 64}}, 4, 8, false, 74);
  write_lora_checkpoint(d / "emb.h5", a, "transformer", llama);
  expect_error([&] { convert(d / "emb.h5", d / "peft"); }, {"embed_tokens.lora_A.weight", "embedding"});
  EXPECT_FALSE(fs::exists(d / "m.h5"));
  EXPECT_FALSE(fs::exists(d / "m.h5.lora-base.h5"));
}

// The merged weights of `merged_dir` (a hub folder) against the golden base plus scale * B A,
// computed here in float64 in the hub layout: GPT-2's Conv1D weights are [in, out], so the update
// goes in transposed. Each merged value must be the float64 result rounded once to float32 (one ulp
// leeway for a different order of summation); every other tensor is the base's, bit for bit.
void expect_merged(const std::string& golden, const std::string& merged_dir, const LoraAdapter& a,
                   const std::vector<Module>& mods, bool conv1d) {
  SafetensorsFile base(golden_path(golden + "/model.safetensors"));
  SafetensorsCollection merged = SafetensorsCollection::open_dir(merged_dir, "model");
  ASSERT_EQ(merged.names(), base.names());
  std::set<std::string> adapted;
  for (const Module& m : mods) {
    const std::string w = m.path + ".weight";
    adapted.insert(w);
    const std::vector<float> W = values_of(base.read(w));
    const std::vector<float> got = values_of(merged.file_of(w).read(w));
    const std::vector<float> A = values_of(a.tensors.at(m.path + kLoraASuffix));
    const std::vector<float> B = values_of(a.tensors.at(m.path + kLoraBSuffix));
    const int64_t r = a.config.r;
    const double scale = a.config.rslora ? a.config.alpha / std::sqrt(double(r)) : a.config.alpha / double(r);
    int64_t changed = 0;
    for (int64_t o = 0; o < m.out; ++o)
      for (int64_t i = 0; i < m.in; ++i) {
        double delta = 0;
        for (int64_t k = 0; k < r; ++k) delta += double(B[size_t(o * r + k)]) * double(A[size_t(k * m.in + i)]);
        const size_t at = conv1d ? size_t(i * m.out + o) : size_t(o * m.in + i);
        const double want = double(W[at]) + scale * delta;
        const float want_f = float(want);
        const double ulp = std::nextafter(std::fabs(want_f), INFINITY) - std::fabs(want_f);
        ASSERT_LE(std::fabs(double(got[at]) - want), ulp) << w << " [" << o << ", " << i << "]";
        changed += got[at] != W[at];
      }
    EXPECT_GT(changed, m.out * m.in / 2) << w << ": the merge left it as it was";
  }
  for (const std::string& n : base.names()) {
    if (adapted.count(n)) continue;
    EXPECT_TRUE(same_bytes(base.read(n), merged.file_of(n).read(n))) << n << " changed";
  }
}

TEST(ConvertLora, MergeEqualsBasePlusScaledUpdateLlama) {
  ScratchDir d("merge_llama");
  const std::string llama = golden_path("llama-tiny");
  for (bool rslora : {false, true}) {
    SCOPED_TRACE(rslora ? "rslora" : "plain");
    const LoraAdapter a = make_adapter(llama_modules(), 4, 8, rslora, 81);
    const std::string tag = rslora ? "rs" : "plain";
    write_lora_checkpoint(d / (tag + ".h5"), a, "transformer", llama);
    // --from left out: the checkpoint's base_model.
    ASSERT_EQ(convert("", d / (tag + "_hub"), d / (tag + ".h5")), 0);
    expect_merged("llama-tiny", d / (tag + "_hub"), a, llama_modules(), false);
    EXPECT_EQ(read_all(d / (tag + "_hub/config.json")), read_all(llama + "/config.json"));
    for (const char* scratch : {"_hub.lora-base.h5", "_hub.lora-merged.h5"}) EXPECT_FALSE(fs::exists(d / (tag + scratch)));
  }
  // Through a weights file, and from the PEFT folder the checkpoint exports to: the same bytes.
  ASSERT_EQ(convert(llama, d / "base.h5"), 0);
  ASSERT_EQ(convert(d / "base.h5", d / "merged.h5", d / "plain.h5"), 0);
  EXPECT_TRUE(verify_checksums(d / "merged.h5").ok());
  ASSERT_EQ(convert(d / "merged.h5", d / "from_h5"), 0);
  ASSERT_EQ(convert(d / "plain.h5", d / "peft"), 0);
  ASSERT_EQ(convert(llama, d / "from_peft", d / "peft"), 0);
  for (const char* other : {"from_h5", "from_peft"}) {
    SafetensorsFile x(d / "plain_hub/model.safetensors"), y(d / (std::string(other) + "/model.safetensors"));
    for (const std::string& n : x.names()) EXPECT_TRUE(same_bytes(x.read(n), y.read(n))) << other << ": " << n;
  }
}

TEST(ConvertLora, MergeEqualsBasePlusScaledUpdateGpt2) {
  ScratchDir d("merge_gpt2");
  const std::string gpt2 = golden_path("gpt2-tiny");
  const LoraAdapter a = make_adapter(gpt2_modules(), 4, 16, false, 91);
  write_lora_checkpoint(d / "lora.h5", a, "transformer", gpt2);
  ASSERT_EQ(convert(gpt2, d / "hub", d / "lora.h5"), 0);
  expect_merged("gpt2-tiny", d / "hub", a, gpt2_modules(), /*conv1d=*/true);
  // The PEFT folder (fan_in_fan_out) merges to the same bytes.
  ASSERT_EQ(convert(d / "lora.h5", d / "peft"), 0);
  ASSERT_EQ(convert(gpt2, d / "hub2", d / "peft"), 0);
  SafetensorsFile x(d / "hub/model.safetensors"), y(d / "hub2/model.safetensors");
  for (const std::string& n : x.names()) EXPECT_TRUE(same_bytes(x.read(n), y.read(n))) << n;
}

TEST(ConvertLora, MergesDiffusersAndKohyaIntoAUnet) {
  ScratchDir d("merge_unet");
  const std::string unet = golden_path("unet-sd-tiny");
  // Convolutions, as PEFT's LoRA Conv2d: A [r, in, kh, kw] with the base's kernel, B [out, r, 1, 1]:
  // proj_in of the SD UNet (1x1), a ResBlock's 3x3 conv1, the strided downsampler, a 1x1 shortcut,
  // and the stem's and the head's 3x3 conv_in (from the 4 latent channels) and conv_out (to them).
  // Their update is B A with A flattened to [r, in * kh * kw], the layout of the weight's rows.
  std::vector<Module> mods = unet_modules();
  LoraAdapter a = make_adapter(mods, 4, 8, false, 101);
  const std::vector<std::pair<Module, int64_t>> convs = {{{"down_blocks.0.attentions.0.proj_in", 16, 16}, 1},
                                                         {{"down_blocks.0.resnets.0.conv1", 16, 16}, 3},
                                                         {{"down_blocks.0.downsamplers.0.conv", 16, 16}, 3},
                                                         {{"down_blocks.1.resnets.0.conv_shortcut", 32, 16}, 1},
                                                         {{"conv_in", 16, 4}, 3},
                                                         {{"conv_out", 4, 16}, 3}};
  uint64_t seed = 7;
  for (const auto& [m, k] : convs) {
    a.tensors[m.path + kLoraASuffix] = random_tensor({4, m.in, k, k}, seed++);
    a.tensors[m.path + kLoraBSuffix] = random_tensor({m.out, 4, 1, 1}, seed++);
    mods.push_back({m.path, m.out, m.in * k * k});
  }
  a.config.target_modules = {"to_q",  "to_k", "to_out.0",      "to_v",   "proj_in",
                             "conv1", "conv", "conv_shortcut", "conv_in", "conv_out"};
  write_diffusers_lora(d / "lora", a);
  ASSERT_EQ(convert(unet, d / "merged", d / "lora"), 0);
  SafetensorsFile base(unet + "/diffusion_pytorch_model.safetensors");
  SafetensorsFile merged(d / "merged/diffusion_pytorch_model.safetensors");
  for (const Module& m : mods) {
    const std::vector<float> W = values_of(base.read(m.path + ".weight"));
    const std::vector<float> got = values_of(merged.read(m.path + ".weight"));
    const std::vector<float> A = values_of(a.tensors.at(m.path + kLoraASuffix));
    const std::vector<float> B = values_of(a.tensors.at(m.path + kLoraBSuffix));
    for (int64_t o = 0; o < m.out; ++o)
      for (int64_t i = 0; i < m.in; ++i) {
        double delta = 0;
        for (int64_t k = 0; k < 4; ++k) delta += double(B[size_t(o * 4 + k)]) * double(A[size_t(k * m.in + i)]);
        const double want = double(W[size_t(o * m.in + i)]) + 2.0 * delta;
        const double ulp = std::nextafter(std::fabs(float(want)), INFINITY) - std::fabs(float(want));
        ASSERT_LE(std::fabs(double(got[size_t(o * m.in + i)]) - want), ulp) << m.path << " [" << o << ", " << i << "]";
      }
  }
  // The same adapter under kohya's names (alpha 8 each) merges to the same bytes.
  std::vector<std::pair<std::string, Tensor>> t;
  for (const std::string& m : a.modules()) {
    std::string k = "lora_unet_" + m;
    std::replace(k.begin(), k.end(), '.', '_');
    t.emplace_back(k + ".lora_down.weight", a.tensors.at(m + kLoraASuffix));
    t.emplace_back(k + ".lora_up.weight", a.tensors.at(m + kLoraBSuffix));
    Tensor alpha = Tensor::empty({1}, DType::F32, Device::cpu());
    alpha.data<float>()[0] = 8.f;
    t.emplace_back(k + ".alpha", alpha);
  }
  write_safetensors(d / "kohya.safetensors", t);
  ASSERT_EQ(convert(unet, d / "merged_kohya", d / "kohya.safetensors"), 0);
  SafetensorsFile k(d / "merged_kohya/diffusion_pytorch_model.safetensors");
  for (const std::string& n : merged.names()) EXPECT_TRUE(same_bytes(merged.read(n), k.read(n))) << n;
}

}  // namespace
}  // namespace zp::test
