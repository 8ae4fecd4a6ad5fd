// The non-obvious parts: which PEFT config fields change what a merge must do (those are refused
// rather than ignored), and kohya's names, whose '_' stands for both '.' and itself, resolved
// against the model's own module paths.
#include "io/lora_adapter_files.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/bounded_json.h"
#include "io/checkpoint_file.h"
#include "io/config.h"
#include "io/h5file.h"
#include "io/safetensors.h"
#include "io/weight_source.h"
#include "kernels/elementwise.h"

namespace zp::io {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";
constexpr const char* kDiffusersUnetPrefix = "unet.";
constexpr const char* kKohyaUnetPrefix = "lora_unet_";

bool is_integral_value(double x) { return std::isfinite(x) && std::floor(x) == x && std::fabs(x) < 9e15; }

// alpha as PEFT writes it: an int when it is one (LoraConfig types lora_alpha as int).
nlohmann::json alpha_json(double alpha) {
  if (is_integral_value(alpha)) return int64_t(alpha);
  return alpha;
}

// The last component of each module path, unique and sorted: PEFT's usual target_modules.
std::vector<std::string> leaf_names(const std::vector<std::string>& modules) {
  std::set<std::string> s;
  for (const std::string& m : modules) s.insert(m.substr(m.rfind('.') + 1));
  return {s.begin(), s.end()};
}

std::vector<std::string> string_list(const nlohmann::json& v, const std::string& what) {
  ZP_REQUIRE(v.is_array(), what, " must be a list of strings, not ", json_excerpt(v));
  std::vector<std::string> out;
  for (const nlohmann::json& e : v) {
    ZP_REQUIRE(e.is_string(), what, " must be a list of strings; it holds ", json_excerpt(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

double finite_number(const nlohmann::json& v, const std::string& what) {
  ZP_REQUIRE(v.is_number() && std::isfinite(v.get<double>()), what, " must be a finite number, not ", json_excerpt(v));
  return v.get<double>();
}

int64_t positive_int(const nlohmann::json& v, const std::string& what) {
  ZP_REQUIRE(v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t(1) << 31)) &&
                 v.get<int64_t>() >= 1 && v.get<int64_t>() <= (int64_t(1) << 31),
             what, " must be an integer in [1, 2^31], not ", json_excerpt(v));
  return v.get<int64_t>();
}

bool boolean(const nlohmann::json& v, const std::string& what) {
  ZP_REQUIRE(v.is_boolean(), what, " must be true or false, not ", json_excerpt(v));
  return v.get<bool>();
}

bool present(const nlohmann::json& obj, const std::string& key) {
  return obj.is_object() && obj.contains(key) && !obj[key].is_null();
}

// The PEFT LoraConfig fields (in adapter_config.json, or diffusers' metadata without its "unet."
// prefix) that a plain W + scale * B A merge cannot honour. `where` names the file.
void refuse_unsupported_peft_fields(const nlohmann::json& c, const std::string& where) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw Error(where + ": " + key + " = " + json_excerpt(c[key]) + " is not supported (" + why + ")");
  };
  for (const char* key : {"use_dora", "lora_bias", "use_qalora"})
    if (present(c, key) && !(c[key].is_boolean() && !c[key].get<bool>())) refuse(key, "only plain LoRA is");
  if (present(c, "bias") && c["bias"] != "none") refuse("bias", "bias tensors are not adapter weights; bias must be \"none\"");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (present(c, key) && !(c[key].is_object() && c[key].empty()))
      refuse(key, "per-module ranks or alphas by pattern are not read; every module must use r and lora_alpha");
  if (present(c, "modules_to_save") && !(c["modules_to_save"].is_array() && c["modules_to_save"].empty()))
    refuse("modules_to_save", "fully trained modules besides the adapter are not read");
  if (present(c, "loftq_config") && !(c["loftq_config"].is_object() && c["loftq_config"].empty()))
    refuse("loftq_config", "LoftQ replaces the base weights");
  for (const char* key : {"layer_replication", "trainable_token_indices", "velora_config", "use_bdlora", "arrow_config",
                          "kasa_config", "alora_invocation_tokens", "monteclora_config"})
    if (present(c, key)) refuse(key, "a LoRA variant or extra trainable state");
  if (present(c, "target_parameters") && !(c["target_parameters"].is_array() && c["target_parameters"].empty()))
    refuse("target_parameters", "adapters on bare parameters are not read");
  if (present(c, "init_lora_weights") && c["init_lora_weights"].is_string()) {
    const std::string init = c["init_lora_weights"].get<std::string>();
    // These initialisations subtract the initial adapter from the base weights, so the adapter only
    // means something on top of that modified base, not the original one a merge starts from.
    if (init.starts_with("pissa") || init == "olora" || init == "corda" || init == "loftq")
      refuse("init_lora_weights", "this initialisation rewrites the base weights");
  }
}

// Why a key that is not an A or B of the expected form is refused.
std::string explain_unexpected_key(const std::string& key) {
  static const std::regex adapter_named(R"(\.lora_(A|B)\.([^.]+)\.weight$)");
  std::smatch m;
  if (std::regex_search(key, m, adapter_named))
    return "holds an adapter name ('" + m[2].str() +
           "') inside the key; PEFT saves keys without it (get_peft_model_state_dict)";
  if (key.find("lora_embedding_") != std::string::npos) return "is an embedding LoRA tensor, which is not supported";
  if (key.find("lora_magnitude_vector") != std::string::npos || key.find("dora_scale") != std::string::npos)
    return "is a DoRA magnitude vector; DoRA adapters are not supported";
  if (key.ends_with(".lora_B.bias") || key.ends_with(".lora_up.bias")) return "is a LoRA bias (lora_bias), which is not supported";
  if (key.find("lora.down") != std::string::npos || key.find("lora.up") != std::string::npos ||
      key.find("_lora.") != std::string::npos)
    return "uses diffusers' old attention-processor naming (lora.down / lora.up), which is not read";
  return "is not a LoRA A or B weight";
}

std::string type_of(const std::string& key) {
  return key.ends_with(kLoraASuffix) ? "A" : key.ends_with(kLoraBSuffix) ? "B" : "";
}

// Opens a safetensors file and insists on float tensors.
void check_float_tensors(const SafetensorsFile& f) {
  for (const std::string& n : f.names())
    ZP_REQUIRE(dtype_is_float(f.entry(n).dtype), f.path(), ": tensor '", n, "' has dtype ", dtype_name(f.entry(n).dtype),
               "; LoRA weights are floating point");
}

// Where the tensors of `a` go, in `dtype`, under `prefix` + internal name.
std::vector<std::pair<std::string, Tensor>> prefixed(const LoraAdapter& a, DType dtype, const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : lora_tensors_as(a, dtype)) out.emplace_back(prefix + name, t);
  return out;
}

// The writers need one rank and one alpha for all modules, as LoraConfig has.
void check_uniform(const LoraAdapter& a, const std::string& dest) {
  ZP_REQUIRE(a.module_alpha.empty(), dest, ": modules with their own alpha (e.g. '", a.module_alpha.begin()->first,
             "') cannot be written; every module must use alpha ", a.config.alpha);
  for (const std::string& m : a.modules())
    ZP_REQUIRE(a.rank(m) == a.config.r, dest, ": module '", m, "' has rank ", a.rank(m), ", the config says r = ",
               a.config.r);
}

void make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ZP_REQUIRE(!ec && fs::is_directory(dir), dir, ": cannot create folder: ", ec ? ec.message() : "not a folder");
}

std::string file_in(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// Reads tensor `key` of `f` as stored, into a CPU tensor (aligned copy).
Tensor read_tensor(const SafetensorsFile& f, const std::string& key) { return f.read(key); }

// Fills config.r / alpha from the modules' ranks when the file says nothing (alpha = r: scale 1).
void derive_rank_from_tensors(LoraAdapter& a) {
  const std::vector<std::string> mods = a.modules();
  ZP_REQUIRE(!mods.empty(), a.source, ": holds no LoRA tensors");
  std::map<int64_t, int> count;
  for (const std::string& m : mods) ++count[a.rank(m)];
  a.config.r = std::max_element(count.begin(), count.end(), [](auto& x, auto& y) { return x.second < y.second; })->first;
}

}  // namespace

// --- LoraConfig ----------------------------------------------------------------------------------

double LoraConfig::scale_for(int64_t rank, double module_alpha) const {
  ZP_CHECK(rank > 0);
  return rslora ? module_alpha / std::sqrt(double(rank)) : module_alpha / double(rank);
}

nlohmann::json LoraConfig::to_json() const {
  return {{"r", r}, {"alpha", alpha_json(alpha)}, {"dropout", dropout}, {"target_modules", target_modules}, {"rslora", rslora}};
}

LoraConfig LoraConfig::from_json(const nlohmann::json& j, const std::string& source) {
  ZP_REQUIRE(j.is_object(), source, ": the LoRA config must be a JSON object, not ", json_excerpt(j));
  static const std::set<std::string> known = {"r", "alpha", "dropout", "target_modules", "rslora"};
  for (auto& [k, v] : j.items())
    ZP_REQUIRE(known.count(k), source, ": unknown LoRA config key '", k, "' (known: r, alpha, dropout, target_modules, rslora)");
  for (const char* k : {"r", "alpha", "target_modules"}) ZP_REQUIRE(present(j, k), source, ": LoRA config key '", k, "' is missing");
  LoraConfig c;
  c.r = positive_int(j["r"], source + ": LoRA config key 'r'");
  c.alpha = finite_number(j["alpha"], source + ": LoRA config key 'alpha'");
  if (present(j, "dropout")) c.dropout = finite_number(j["dropout"], source + ": LoRA config key 'dropout'");
  ZP_REQUIRE(c.dropout >= 0 && c.dropout < 1, source, ": LoRA config key 'dropout' = ", c.dropout, " must be in [0, 1)");
  c.target_modules = string_list(j["target_modules"], source + ": LoRA config key 'target_modules'");
  ZP_REQUIRE(!c.target_modules.empty(), source, ": LoRA config key 'target_modules' is empty");
  if (present(j, "rslora")) c.rslora = boolean(j["rslora"], source + ": LoRA config key 'rslora'");
  return c;
}

std::string lora_module_of(const std::string& name) {
  for (const char* suffix : {kLoraASuffix, kLoraBSuffix})
    if (name.ends_with(suffix) && name.size() > std::strlen(suffix)) return name.substr(0, name.size() - std::strlen(suffix));
  return "";
}

// --- LoraAdapter ---------------------------------------------------------------------------------

std::vector<std::string> LoraAdapter::modules() const {
  std::set<std::string> s;
  for (auto& [name, t] : tensors)
    if (std::string m = lora_module_of(name); !m.empty()) s.insert(m);
  return {s.begin(), s.end()};
}

const Tensor& LoraAdapter::a(const std::string& module) const {
  auto it = tensors.find(module + kLoraASuffix);
  ZP_REQUIRE(it != tensors.end(), source, ": module '", module, "' has no ", module, kLoraASuffix);
  return it->second;
}

const Tensor& LoraAdapter::b(const std::string& module) const {
  auto it = tensors.find(module + kLoraBSuffix);
  ZP_REQUIRE(it != tensors.end(), source, ": module '", module, "' has no ", module, kLoraBSuffix);
  return it->second;
}

double LoraAdapter::scale_of(const std::string& module) const {
  auto it = module_alpha.find(module);
  return config.scale_for(rank(module), it == module_alpha.end() ? config.alpha : it->second);
}

void LoraAdapter::check() const {
  ZP_REQUIRE(!tensors.empty(), source, ": holds no LoRA tensors");
  for (auto& [name, t] : tensors) {
    ZP_REQUIRE(!lora_module_of(name).empty(), source, ": tensor '", name, "' is not a LoRA A or B weight");
    ZP_REQUIRE(dtype_is_float(t.dtype()), source, ": tensor '", name, "' has dtype ", dtype_name(t.dtype()));
  }
  for (const std::string& m : modules()) {
    const Tensor &A = a(m), &B = b(m);
    // A convolution's A has the base's kernel, its B is 1x1 (PEFT's LoRA Conv2d).
    ZP_REQUIRE(A.dim() == 2 || A.dim() == 4, source, ": tensor '", m, kLoraASuffix, "' has shape ",
               shape_str(A.shape()), "; expected [r, in] (or [r, in, kh, kw] for a convolution)");
    ZP_REQUIRE(B.dim() == A.dim() && (B.dim() == 2 || (B.size(2) == 1 && B.size(3) == 1)), source, ": tensor '", m,
               kLoraBSuffix, "' has shape ", shape_str(B.shape()), "; expected ",
               A.dim() == 4 ? "[out, r, 1, 1]" : "[out, r]", " to go with lora_A ", shape_str(A.shape()));
    ZP_REQUIRE(B.size(1) == A.size(0), source, ": module '", m, "': lora_B ", shape_str(B.shape()),
               " and lora_A ", shape_str(A.shape()), " disagree on the rank");
    ZP_REQUIRE(A.size(0) >= 1 && A.size(1) >= 1 && B.size(0) >= 1, source, ": module '", m, "' has an empty adapter");
  }
}

void add_lora_update(const LoraAdapter& a, const std::string& module, double* w, const Shape& w_shape) {
  const Tensor& A = a.a(module);
  const Tensor& B = a.b(module);
  ZP_REQUIRE(!w_shape.empty() && w_shape[0] > 0, a.source, ": module '", module, "': an empty base weight");
  const int64_t out = w_shape[0], in = shape_numel(w_shape) / out, rank = A.size(0);
  ZP_REQUIRE(A.numel() == rank * in, "cannot merge ", a.source, ": tensor '", module, kLoraASuffix, "' has shape ",
             shape_str(A.shape()), " but the base weight '", module, ".weight' takes ", in, " inputs (its shape ",
             shape_str(w_shape), " in the engine layout [out, in])");
  ZP_REQUIRE(B.size(0) == out && B.numel() == out * rank, "cannot merge ", a.source, ": tensor '", module,
             kLoraBSuffix, "' has shape ", shape_str(B.shape()), " but the base weight '", module, ".weight' has ", out,
             " outputs (its shape ", shape_str(w_shape), " in the engine layout [out, in])");
  std::vector<double> a64(static_cast<size_t>(A.numel())), b64(static_cast<size_t>(B.numel())),
      row(static_cast<size_t>(in));
  kernels::cpu::cast(nullptr, DType::F64, a64.data(), A.dtype(), A.data(), A.numel());
  kernels::cpu::cast(nullptr, DType::F64, b64.data(), B.dtype(), B.data(), B.numel());
  const double scale = a.scale_of(module);
  for (int64_t r = 0; r < out; ++r) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t k = 0; k < rank; ++k) {
      const double bk = b64[size_t(r * rank + k)];
      const double* ak = a64.data() + k * in;
      for (int64_t i = 0; i < in; ++i) row[size_t(i)] += bk * ak[i];
    }
    for (int64_t i = 0; i < in; ++i) w[r * in + i] += scale * row[size_t(i)];
  }
}

std::map<std::string, Tensor> lora_tensors_as(const LoraAdapter& a, DType dtype) {
  ZP_REQUIRE(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             "LoRA adapter files are written as fp32, bf16 or fp16, not ", dtype_name(dtype));
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : a.tensors) {
    if (t.dtype() == dtype) {
      out[name] = t;
      continue;
    }
    Tensor c = Tensor::empty(t.shape(), dtype, Device::cpu(), "lora");
    kernels::cpu::cast(nullptr, dtype, c.data(), t.dtype(), t.data(), t.numel());
    out[name] = c;
  }
  return out;
}

// --- PEFT ----------------------------------------------------------------------------------------

nlohmann::json peft_adapter_config(const LoraAdapter& a, const PeftWriteOptions& o) {
  const nlohmann::json null;
  // PEFT's own defaults for everything our adapters do not use, so that a reader comparing against
  // LoraConfig() sees a plain LoRA; peft_version is left out (it names the writing PEFT release).
  return {
      {"alpha_pattern", nlohmann::json::object()},
      {"auto_mapping", null},
      {"base_model_name_or_path", a.base_model.empty() ? null : nlohmann::json(a.base_model)},
      {"bias", "none"},
      {"fan_in_fan_out", a.fan_in_fan_out},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"layer_replication", null},
      {"layers_pattern", null},
      {"layers_to_transform", null},
      {"loftq_config", nlohmann::json::object()},
      {"lora_alpha", alpha_json(a.config.alpha)},
      {"lora_dropout", a.config.dropout},
      {"megatron_config", null},
      {"megatron_core", "megatron.core"},
      {"modules_to_save", null},
      {"peft_type", "LORA"},
      {"r", a.config.r},
      {"rank_pattern", nlohmann::json::object()},
      {"revision", null},
      {"target_modules", a.config.target_modules},
      {"task_type", o.task_type},
      {"use_dora", false},
      {"use_rslora", a.config.rslora},
  };
}

void write_peft_adapter(const std::string& dir, const LoraAdapter& a, const PeftWriteOptions& o) {
  a.check();
  check_uniform(a, dir);
  const nlohmann::json config = peft_adapter_config(a, o);
  make_dir(dir);
  const std::string weights = file_in(dir, kPeftWeightsFile);
  write_safetensors(weights, prefixed(a, o.dtype, kPeftPrefix), {{"format", "pt"}});
  try {
    write_file_atomically(file_in(dir, kPeftConfigFile), config.dump(2) + "\n", FileSync::BeforeRename);
  } catch (...) {
    std::error_code ec;
    fs::remove(weights, ec);
    throw;
  }
}

LoraAdapter read_peft_adapter(const std::string& dir) {
  const std::string config_path = file_in(dir, kPeftConfigFile);
  const std::string weights_path = file_in(dir, kPeftWeightsFile);
  ZP_REQUIRE(fs::exists(config_path), dir, ": no ", kPeftConfigFile, " (not a PEFT adapter folder)");
  if (!fs::exists(weights_path)) {
    ZP_REQUIRE(!fs::exists(file_in(dir, "adapter_model.bin")), dir,
               ": adapter_model.bin is a pickled file, which is not read; save the adapter with safe_serialization=True");
    throw Error(dir + ": no " + kPeftWeightsFile);
  }
  const nlohmann::json c = read_json_file(config_path);
  ZP_REQUIRE(c.is_object(), config_path, ": not a JSON object");
  ZP_REQUIRE(present(c, "peft_type") && c["peft_type"] == "LORA", config_path, ": peft_type is ",
             present(c, "peft_type") ? json_excerpt(c["peft_type"]) : std::string("missing"), "; only LORA adapters are read");
  refuse_unsupported_peft_fields(c, config_path);

  LoraAdapter a;
  a.source = weights_path;
  // PEFT's defaults for absent fields (LoraConfig: r 8, lora_alpha 8, lora_dropout 0).
  a.config.r = present(c, "r") ? positive_int(c["r"], config_path + ": r") : 8;
  a.config.alpha = present(c, "lora_alpha") ? finite_number(c["lora_alpha"], config_path + ": lora_alpha") : 8;
  if (present(c, "lora_dropout")) a.config.dropout = finite_number(c["lora_dropout"], config_path + ": lora_dropout");
  if (present(c, "use_rslora")) a.config.rslora = boolean(c["use_rslora"], config_path + ": use_rslora");
  if (present(c, "fan_in_fan_out")) a.fan_in_fan_out = boolean(c["fan_in_fan_out"], config_path + ": fan_in_fan_out");
  if (present(c, "base_model_name_or_path") && c["base_model_name_or_path"].is_string())
    a.base_model = c["base_model_name_or_path"].get<std::string>();

  const SafetensorsFile f(weights_path);
  check_float_tensors(f);
  for (const std::string& key : f.names()) {
    ZP_REQUIRE(key.starts_with(kPeftPrefix), weights_path, ": tensor '", key, "' does not start with '", kPeftPrefix,
               "' (", type_of(key).empty() ? explain_unexpected_key(key) : "not PEFT's naming", ")");
    const std::string name = key.substr(std::strlen(kPeftPrefix));
    ZP_REQUIRE(!type_of(name).empty(), weights_path, ": tensor '", key, "' ", explain_unexpected_key(key));
    a.tensors[name] = read_tensor(f, key);
  }
  a.check();
  for (const std::string& m : a.modules())
    ZP_REQUIRE(a.rank(m) == a.config.r, weights_path, ": tensor '", kPeftPrefix, m, kLoraASuffix, "' has rank ", a.rank(m),
               ", ", config_path, " says r = ", a.config.r);
  if (present(c, "target_modules") && c["target_modules"].is_array())
    a.config.target_modules = string_list(c["target_modules"], config_path + ": target_modules");
  else  // a regular expression, "all-linear" or nothing: name the modules the file adapts
    a.config.target_modules = leaf_names(a.modules());
  return a;
}

// --- diffusers and kohya-ss ----------------------------------------------------------------------

void write_diffusers_lora(const std::string& dir, const LoraAdapter& a, DType dtype) {
  a.check();
  check_uniform(a, dir);
  // LoraConfig's fields, prefixed with the component, as diffusers' write_lora_layers stores them
  // (json.dumps(indent=2, sort_keys=True); nlohmann's objects are sorted too).
  nlohmann::json meta = {
      {"unet.alpha_pattern", nlohmann::json::object()}, {"unet.bias", "none"},
      {"unet.fan_in_fan_out", false},                    {"unet.init_lora_weights", true},
      {"unet.lora_alpha", alpha_json(a.config.alpha)},   {"unet.lora_dropout", a.config.dropout},
      {"unet.peft_type", "LORA"},                        {"unet.r", a.config.r},
      {"unet.rank_pattern", nlohmann::json::object()},  {"unet.target_modules", a.config.target_modules},
      {"unet.use_dora", false},                          {"unet.use_rslora", a.config.rslora},
  };
  make_dir(dir);
  write_safetensors(file_in(dir, kDiffusersLoraFile), prefixed(a, dtype, kDiffusersUnetPrefix),
                    {{"format", "pt"}, {kDiffusersMetadataKey, meta.dump(2)}});
}

namespace {

std::string find_diffusers_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    ZP_REQUIRE(fs::exists(path, ec), path, ": no such file or folder");
    return path;
  }
  if (fs::exists(file_in(path, kDiffusersLoraFile))) return file_in(path, kDiffusersLoraFile);
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
  ZP_REQUIRE(found.size() == 1, path, ": ", found.empty() ? "no" : "several", " .safetensors files and no ",
             kDiffusersLoraFile, "; name the adapter file itself");
  return found.front();
}

// diffusers' metadata entry, without its "unet." prefix; empty when there is none.
nlohmann::json diffusers_metadata(const SafetensorsFile& f) {
  auto it = f.metadata().find(kDiffusersMetadataKey);
  if (it == f.metadata().end()) return nlohmann::json::object();
  const nlohmann::json all = parse_json_bounded(it->second, f.path() + ": metadata '" + kDiffusersMetadataKey + "'");
  ZP_REQUIRE(all.is_object(), f.path(), ": metadata '", kDiffusersMetadataKey, "' is not a JSON object");
  nlohmann::json unet = nlohmann::json::object();
  for (auto& [k, v] : all.items()) {
    if (k.starts_with(kDiffusersUnetPrefix)) unet[k.substr(std::strlen(kDiffusersUnetPrefix))] = v;
    else throw Error(f.path() + ": metadata '" + kDiffusersMetadataKey + "' has '" + k +
                     "', which is not the UNet's; only UNet adapters are read");
  }
  return unet;
}

LoraAdapter read_diffusers_names(const SafetensorsFile& f, const std::set<std::string>& known) {
  LoraAdapter a;
  a.source = f.path();
  for (const std::string& key : f.names()) {
    ZP_REQUIRE(!key.starts_with("text_encoder"), f.path(), ": tensor '", key,
               "' adapts a text encoder; only UNet adapters are read");
    ZP_REQUIRE(key.starts_with(kDiffusersUnetPrefix), f.path(), ": tensor '", key, "' does not start with 'unet.' (",
               explain_unexpected_key(key), ")");
    const std::string name = key.substr(std::strlen(kDiffusersUnetPrefix));
    ZP_REQUIRE(!type_of(name).empty(), f.path(), ": tensor '", key, "' ", explain_unexpected_key(key));
    ZP_REQUIRE(known.empty() || known.count(name), f.path(), ": tensor '", key, "': the model has no module '",
               lora_module_of(name), "' to adapt");
    a.tensors[name] = read_tensor(f, key);
  }
  a.check();
  const nlohmann::json c = diffusers_metadata(f);
  const std::string where = f.path() + ": metadata '" + kDiffusersMetadataKey + "'";
  refuse_unsupported_peft_fields(c, where);
  derive_rank_from_tensors(a);
  if (present(c, "r")) a.config.r = positive_int(c["r"], where + ": unet.r");
  // No alpha in the file: diffusers loads it with lora_alpha = r, i.e. scale 1.
  a.config.alpha = present(c, "lora_alpha") ? finite_number(c["lora_alpha"], where + ": unet.lora_alpha") : double(a.config.r);
  if (present(c, "lora_dropout")) a.config.dropout = finite_number(c["lora_dropout"], where + ": unet.lora_dropout");
  if (present(c, "use_rslora")) a.config.rslora = boolean(c["use_rslora"], where + ": unet.use_rslora");
  for (const std::string& m : a.modules()) {
    if (a.rank(m) == a.config.r) continue;
    ZP_REQUIRE(!present(c, "lora_alpha"), f.path(), ": tensor 'unet.", m, kLoraASuffix, "' has rank ", a.rank(m),
               ", the metadata says r = ", a.config.r);
    a.module_alpha[m] = double(a.rank(m));  // diffusers' alpha_pattern for modules of another rank: scale 1
  }
  a.config.target_modules = present(c, "target_modules") && c["target_modules"].is_array()
                                ? string_list(c["target_modules"], where + ": unet.target_modules")
                                : leaf_names(a.modules());
  return a;
}

// kohya's module name for a module path: '.' -> '_'.
std::string kohya_name(const std::string& module) {
  std::string s = module;
  std::replace(s.begin(), s.end(), '.', '_');
  return kKohyaUnetPrefix + s;
}

LoraAdapter read_kohya_names(const SafetensorsFile& f, const std::set<std::string>& known) {
  ZP_REQUIRE(!known.empty(), f.path(), ": kohya-ss names (lora_unet_...) can only be read against the model's modules");
  std::map<std::string, std::vector<std::string>> by_kohya;  // kohya module name -> module paths
  for (const std::string& name : known)
    if (std::string m = lora_module_of(name); !m.empty()) {
      auto& v = by_kohya[kohya_name(m)];
      if (std::find(v.begin(), v.end(), m) == v.end()) v.push_back(m);
    }
  LoraAdapter a;
  a.source = f.path();
  std::map<std::string, double> alphas;  // module path -> alpha
  for (const std::string& key : f.names()) {
    ZP_REQUIRE(!key.starts_with("lora_te"), f.path(), ": tensor '", key, "' adapts a text encoder; only UNet adapters are read");
    ZP_REQUIRE(key.starts_with(kKohyaUnetPrefix), f.path(), ": tensor '", key, "' is not a kohya-ss UNet LoRA tensor (lora_unet_...)");
    const size_t dot = key.find('.');
    const std::string lora_name = key.substr(0, dot), what = dot == std::string::npos ? "" : key.substr(dot + 1);
    ZP_REQUIRE(what == "lora_down.weight" || what == "lora_up.weight" || what == "alpha", f.path(), ": tensor '", key, "' ",
               what == "dora_scale" ? explain_unexpected_key(key) : "is not lora_down.weight, lora_up.weight or alpha");
    auto it = by_kohya.find(lora_name);
    ZP_REQUIRE(it != by_kohya.end(), f.path(), ": tensor '", key, "': '", lora_name,
               "' is no module of this model (kohya's SDXL files use the original LDM names, input_blocks/output_blocks, "
               "which are not read)");
    ZP_REQUIRE(it->second.size() == 1, f.path(), ": tensor '", key, "': '", lora_name, "' could be module '",
               it->second[0], "' or '", it->second[1], "'");
    const std::string& module = it->second[0];
    if (what == "alpha") {
      const Tensor t = f.read_as(key, DType::F32);
      ZP_REQUIRE(t.numel() == 1, f.path(), ": tensor '", key, "' has shape ", shape_str(t.shape()), "; alpha is one number");
      alphas[module] = double(t.data<float>()[0]);
      ZP_REQUIRE(std::isfinite(alphas[module]), f.path(), ": tensor '", key, "' is not finite");
    } else {
      a.tensors[module + (what == "lora_down.weight" ? kLoraASuffix : kLoraBSuffix)] = read_tensor(f, key);
    }
  }
  a.check();
  for (auto& [module, alpha] : alphas)
    ZP_REQUIRE(a.tensors.count(module + kLoraASuffix), f.path(), ": tensor '", kohya_name(module),
               ".alpha' belongs to no lora_down / lora_up pair");
  const std::vector<std::string> mods = a.modules();
  derive_rank_from_tensors(a);
  // kohya-ss: a module without alpha uses alpha = its rank (scale 1).
  auto alpha_of = [&](const std::string& m) { return alphas.count(m) ? alphas[m] : double(a.rank(m)); };
  a.config.alpha = alpha_of(mods.front());
  for (const std::string& m : mods)
    if (alpha_of(m) != a.config.alpha) a.module_alpha[m] = alpha_of(m);
  a.config.target_modules = leaf_names(mods);
  return a;
}

}  // namespace

LoraAdapter read_diffusers_lora(const std::string& path, const std::vector<std::string>& known_names) {
  const std::string file = find_diffusers_file(path);
  const SafetensorsFile f(file);
  check_float_tensors(f);
  const std::set<std::string> known(known_names.begin(), known_names.end());
  const std::vector<std::string> names = f.names();
  ZP_REQUIRE(!names.empty(), file, ": holds no tensors");
  const bool kohya = std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.starts_with("lora_"); });
  return kohya ? read_kohya_names(f, known) : read_diffusers_names(f, known);
}

LoraAdapter read_lora_adapter_files(const std::string& path, const std::vector<std::string>& known_names) {
  std::error_code ec;
  ZP_REQUIRE(fs::exists(path, ec), path, ": no such file or folder (the LoRA adapter)");
  if (fs::is_directory(path, ec) && fs::exists(file_in(path, kPeftConfigFile))) return read_peft_adapter(path);
  if (is_lora_checkpoint(path)) return read_lora_checkpoint(path);
  return read_diffusers_lora(path, known_names);
}

// --- LoRA checkpoints ----------------------------------------------------------------------------

bool is_lora_checkpoint(const std::string& path) {
  if (!is_h5_path(path) || !fs::exists(path)) return false;
  try {
    const H5File f = H5File::open(path);
    return f.has_attr("/", "lora");
  } catch (const Error&) {
    return false;  // not readable: the caller's reader says why
  }
}

LoraAdapter read_lora_checkpoint(const std::string& path, LoraCheckpointInfo* info) {
  const CheckpointReader r(path);
  const H5File& f = r.file();
  auto string_attr = [&](const std::string& name, bool required) -> std::string {
    if (!f.has_attr("/", name)) {
      ZP_REQUIRE(!required, path, ": no root attribute '", name, "' (not a LoRA checkpoint)");
      return "";
    }
    ZP_REQUIRE(f.attr_kind("/", name) == AttrKind::String, path, ": root attribute '", name, "' is not a string");
    return f.attr_string("/", name);
  };
  const std::string kind = string_attr("kind", true);
  ZP_REQUIRE(kind == "checkpoint", path, ": kind '", kind, "': a LoRA training checkpoint was expected");
  LoraAdapter a;
  a.source = path;
  a.config = LoraConfig::from_json(parse_json_bounded(string_attr("lora", true), path + ": attribute 'lora'"),
                                   path + ": attribute 'lora'");
  a.base_model = string_attr("base_model", true);
  ZP_REQUIRE(!a.base_model.empty(), path, ": root attribute 'base_model' is empty");
  LoraCheckpointInfo meta;
  meta.model_family = string_attr("model_family", true);
  ZP_REQUIRE(meta.model_family == "transformer" || meta.model_family == "unet", path, ": model_family '",
             meta.model_family, "' is not transformer or unet");
  meta.base_fingerprint = string_attr("base_fingerprint", false);
  const std::string model_config = string_attr("model_config", false);
  meta.model_config = model_config.empty() ? hub_config_of(a.base_model)
                                           : parse_json_bounded(model_config, path + ": attribute 'model_config'");

  ZP_REQUIRE(f.is_group("/model"), path, ": no /model group");
  for (const std::string& name : f.children("/model")) {
    const std::string ds = "/model/" + name;
    ZP_REQUIRE(f.is_dataset(ds), path, ": ", ds, " is not a dataset");
    ZP_REQUIRE(!lora_module_of(name).empty(), path, ": ", ds,
               " is not a LoRA adapter tensor (a LoRA checkpoint's /model holds only <module>.lora_A.weight and "
               "<module>.lora_B.weight)");
    const DatasetInfo di = r.info(ds);
    ZP_REQUIRE(dtype_is_float(di.dtype), path, ": ", ds, " has dtype ", dtype_name(di.dtype));
    Tensor t = Tensor::empty(di.shape, DType::F32, Device::cpu(), "lora");
    r.read(ds, di.shape, DType::F32, t.data(), 0, di.numel());
    a.tensors[name] = t;
  }
  a.check();
  for (const std::string& m : a.modules())
    ZP_REQUIRE(a.rank(m) == a.config.r, path, ": /model/", m, kLoraASuffix, " has rank ", a.rank(m),
               ", attribute 'lora' says r = ", a.config.r);
  if (info) *info = std::move(meta);
  return a;
}

}  // namespace zp::io
