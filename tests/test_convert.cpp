// zeropipe convert / inspect: hub folders <-> weights files on every golden folder, dtype
// conversion, GPT-2's transposed Conv1D weights, h5py as an outside reader, and the errors.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "app/convert.h"
#include "app/inspect_command.h"
#include "io/checkpoint_file.h"
#include "io/h5file.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace zp::test {
namespace {
using namespace zp::io;
using app::ConvertOptions;
using app::run_convert;
namespace fs = std::filesystem;
using json = nlohmann::json;

// A fresh folder under the system temp dir, removed with everything in it.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("zp_convert_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

const char* const kGolden[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "unet-sd-tiny", "unet-sdxl-tiny"};

std::string stem_of(const std::string& model) {
  return model.starts_with("unet") ? "diffusion_pytorch_model" : "model";
}

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int convert(const std::string& from, const std::string& to, const std::string& dtype = "keep", bool force = false,
            int64_t max_shard_bytes = 5'000'000'000) {
  ConvertOptions o;
  o.from = from;
  o.to = to;
  o.dtype = dtype;
  o.force = force;
  o.max_shard_bytes = max_shard_bytes;
  return run_convert(o);
}

// Every tensor of hub folder `a` is in `b` with the same dtype, shape and bytes, and nothing else is.
void expect_same_tensors(const std::string& a, const std::string& b, const std::string& stem) {
  SafetensorsCollection ca = SafetensorsCollection::open_dir(a, stem), cb = SafetensorsCollection::open_dir(b, stem);
  ASSERT_EQ(ca.names(), cb.names()) << a << " vs " << b;
  for (const std::string& n : ca.names()) {
    const SafetensorsEntry& ea = ca.file_of(n).entry(n);
    const SafetensorsEntry& eb = cb.file_of(n).entry(n);
    EXPECT_EQ(ea.dtype, eb.dtype) << n;
    EXPECT_EQ(ea.shape, eb.shape) << n;
    ASSERT_EQ(ea.end - ea.begin, eb.end - eb.begin) << n;
    EXPECT_EQ(std::memcmp(ca.file_of(n).view(n).data(), cb.file_of(n).view(n).data(), ea.end - ea.begin), 0)
        << n << ": bytes differ";
  }
}

// Values of dataset `ds` as float.
std::vector<float> read_dataset(const H5File& f, const std::string& ds) {
  DatasetInfo info = f.dataset_info(ds);
  std::vector<float> v(size_t(info.numel()));
  f.read_slice(ds, DType::F32, v.data(), 0, info.numel());
  return v;
}

TEST(Convert, RoundTripsEveryGoldenFolder) {
  for (const char* model : kGolden) {
    SCOPED_TRACE(model);
    const std::string src = golden_path(model);
    ScratchDir tmp(std::string("rt_") + model);
    const std::string h5 = tmp / "w.h5", back = tmp / "hub";
    ASSERT_EQ(convert(src, h5), 0);
    EXPECT_FALSE(fs::exists(h5 + ".tmp"));
    {
      H5File f = H5File::open(h5);
      EXPECT_EQ(f.attr_int("/", "zeropipe_format"), 1);
      EXPECT_EQ(f.attr_string("/", "kind"), "weights");
      EXPECT_EQ(f.attr_string("/", "model_family"), stem_of(model) == "model" ? "transformer" : "unet");
      EXPECT_EQ(f.attr_string("/", "config"), read_all(src + "/config.json"));
      // Every hub tensor is there, under its own name, in the source dtype.
      SafetensorsCollection c = SafetensorsCollection::open_dir(src, stem_of(model));
      EXPECT_EQ(f.children("/model"), c.names());
      for (const std::string& n : c.names()) EXPECT_EQ(f.dataset_info("/model/" + n).dtype, c.file_of(n).entry(n).dtype) << n;
    }
    ChecksumReport rep = verify_checksums(h5);
    EXPECT_TRUE(rep.ok()) << (rep.problems.empty() ? "" : rep.problems.front());
    EXPECT_EQ(rep.unchecked, 0);

    ASSERT_EQ(convert(h5, back), 0);
    EXPECT_TRUE(fs::exists(back + "/" + stem_of(model) + ".safetensors"));
    EXPECT_FALSE(fs::exists(back + "/" + stem_of(model) + ".safetensors.index.json"));
    EXPECT_EQ(read_all(back + "/config.json"), read_all(src + "/config.json"));
    EXPECT_EQ(json::parse(read_all(back + "/config.json")), json::parse(read_all(src + "/config.json")));
    expect_same_tensors(src, back, stem_of(model));
    SafetensorsFile out(back + "/" + stem_of(model) + ".safetensors");
    EXPECT_EQ(out.metadata().at("format"), "pt");  // transformers refuses files without it
  }
}

TEST(Convert, ShardsLargeModelsWithAnIndexAndReadsShardsBack) {
  const std::string src = golden_path("llama-tiny");
  ScratchDir tmp("shards");
  const std::string h5 = tmp / "w.h5", sharded = tmp / "sharded", h5b = tmp / "w2.h5", back = tmp / "back";
  ASSERT_EQ(convert(src, h5), 0);
  const int64_t limit = 100'000;  // bytes: the 500 KB model needs several shards
  ASSERT_EQ(convert(h5, sharded, "keep", false, limit), 0);
  EXPECT_FALSE(fs::exists(sharded + "/model.safetensors"));
  json index = json::parse(read_all(sharded + "/model.safetensors.index.json"));
  std::set<std::string> shards;
  int64_t total = 0;
  for (auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  for (const std::string& s : shards) {
    EXPECT_NE(s.find("-of-"), std::string::npos) << s;
    SafetensorsFile f(sharded + "/" + s);
    int64_t bytes = 0;
    for (const std::string& n : f.names()) bytes += int64_t(f.entry(n).end - f.entry(n).begin);
    // A shard exceeds the limit only when it holds a single tensor that alone is larger.
    if (f.names().size() > 1) {
      EXPECT_LE(bytes, limit) << s;
    }
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  expect_same_tensors(src, sharded, "model");

  // The sharded folder converts like a single-file one; with --force a re-conversion to a single
  // file replaces the shards and their index.
  ASSERT_EQ(convert(sharded, h5b), 0);
  ASSERT_EQ(convert(h5b, back), 0);
  expect_same_tensors(src, back, "model");
  ASSERT_EQ(convert(h5, sharded, "keep", true), 0);
  EXPECT_TRUE(fs::exists(sharded + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(sharded + "/model.safetensors.index.json"));
  for (const std::string& s : shards) EXPECT_FALSE(fs::exists(sharded + "/" + s)) << s << " should be gone";
  expect_same_tensors(src, sharded, "model");
}

TEST(Convert, Bf16StoresRoundedValues) {
  const std::string src = golden_path("gpt2-tiny");
  ScratchDir tmp("bf16");
  const std::string h5 = tmp / "w.h5";
  ASSERT_EQ(convert(src, h5, "bf16"), 0);
  SafetensorsCollection c = SafetensorsCollection::open_dir(src, "model");
  {
    H5File f = H5File::open(h5);
    for (const std::string& n : c.names()) {
      SCOPED_TRACE(n);
      const std::string ds = "/model/" + n;
      ASSERT_EQ(f.dataset_info(ds).dtype, DType::BF16);
      Tensor t = c.file_of(n).read(n);
      std::vector<float> want = round_to(download(t), DType::BF16);
      if (f.has_attr(ds, "hub_transposed")) {  // hub [in, out] -> file [out, in]
        const int64_t in = t.shape()[0], out = t.shape()[1];
        std::vector<float> tr(want.size());
        for (int64_t i = 0; i < in; ++i)
          for (int64_t o = 0; o < out; ++o) tr[size_t(o * in + i)] = want[size_t(i * out + o)];
        want = tr;
      }
      EXPECT_EQ(read_dataset(f, ds), want);
    }
  }
  EXPECT_TRUE(verify_checksums(h5).ok());

  // Back to a folder: keep gives bf16 safetensors; fp32 widens the rounded values exactly.
  ASSERT_EQ(convert(h5, tmp / "keep"), 0);
  ASSERT_EQ(convert(h5, tmp / "fp32", "fp32"), 0);
  SafetensorsCollection k = SafetensorsCollection::open_dir(tmp / "keep", "model");
  SafetensorsCollection w = SafetensorsCollection::open_dir(tmp / "fp32", "model");
  for (const std::string& n : c.names()) {
    SCOPED_TRACE(n);
    EXPECT_EQ(k.file_of(n).entry(n).dtype, DType::BF16);
    EXPECT_EQ(w.file_of(n).entry(n).dtype, DType::F32);
    EXPECT_EQ(k.file_of(n).entry(n).shape, c.file_of(n).entry(n).shape);
    const std::vector<float> want = round_to(download(c.file_of(n).read(n)), DType::BF16);
    EXPECT_EQ(download(k.file_of(n).read(n)), want);
    EXPECT_EQ(download(w.file_of(n).read(n)), want);
  }
  // A bf16 hub folder converts to fp32 and back to bf16 without change.
  ASSERT_EQ(convert(tmp / "keep", tmp / "w32.h5", "fp32"), 0);
  ASSERT_EQ(convert(tmp / "w32.h5", tmp / "again", "bf16"), 0);
  expect_same_tensors(tmp / "keep", tmp / "again", "model");
}

// Tensors the engine does not use, of any type and shape (scalar, empty, integer, f16), are carried,
// and one larger than a streamed piece (64 MiB) goes through in several pieces.
TEST(Convert, CarriesEveryTensorInPieces) {
  const std::string src = golden_path("llama-tiny");
  ScratchDir tmp("pieces");
  const std::string hub = tmp / "hub";
  fs::create_directories(hub);
  fs::copy_file(src + "/config.json", hub + "/config.json");
  std::vector<std::pair<std::string, Tensor>> tensors;
  SafetensorsFile orig(src + "/model.safetensors");
  for (const std::string& n : orig.names()) tensors.emplace_back(n, orig.read(n));
  const int64_t big_n = (int64_t(64) << 20) / 4 + 5;  // f32: a piece and 5 elements
  Tensor big = Tensor::empty({big_n}, DType::F32, Device::cpu());
  for (int64_t i = 0; i < big_n; ++i) big.data<float>()[i] = float(i % 1009) * 0.37f + float(i / 1009) * 1e-3f;
  Tensor ids = upload({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, DType::I64, Device::cpu()).view({3, 4});
  Tensor scalar = Tensor::empty({}, DType::F32, Device::cpu());
  scalar.data<float>()[0] = 2.5f;
  Tensor empty = Tensor::empty({0, 4}, DType::F32, Device::cpu());
  Tensor half = upload({0.1f, -2.f, 3.3f, 1e-3f, 7.f}, DType::F16, Device::cpu());
  tensors.emplace_back("extra.big", big);
  tensors.emplace_back("extra.position_ids", ids);
  tensors.emplace_back("extra.scalar", scalar);
  tensors.emplace_back("extra.empty", empty);
  tensors.emplace_back("extra.half", half);
  write_safetensors(hub + "/model.safetensors", tensors, {{"format", "pt"}});

  ASSERT_EQ(convert(hub, tmp / "keep.h5"), 0);
  {
    H5File f = H5File::open(tmp / "keep.h5");
    EXPECT_EQ(f.dataset_info("/model/extra.scalar").shape, Shape{});
    EXPECT_EQ(f.dataset_info("/model/extra.empty").shape, (Shape{0, 4}));
    EXPECT_EQ(f.dataset_info("/model/extra.position_ids").dtype, DType::I64);
    EXPECT_EQ(f.dataset_info("/model/extra.half").dtype, DType::F16);
    // Two pieces, written as checksum slices of 4 MiB at most (a sharded rank reading part of the
    // tensor verifies only the slices it touches): 16 and 1.
    EXPECT_EQ(f.attr_ints("/model/extra.big", "slice_checksums").size(), 3u * 17);
  }
  EXPECT_TRUE(verify_checksums(tmp / "keep.h5").ok());
  ASSERT_EQ(convert(tmp / "keep.h5", tmp / "back"), 0);
  expect_same_tensors(hub, tmp / "back", "model");

  // bf16: every float tensor rounds (in pieces too), integers stay.
  ASSERT_EQ(convert(hub, tmp / "bf16.h5", "bf16"), 0);
  {
    H5File f = H5File::open(tmp / "bf16.h5");
    EXPECT_EQ(f.dataset_info("/model/extra.big").dtype, DType::BF16);
    EXPECT_EQ(f.dataset_info("/model/extra.half").dtype, DType::BF16);
    EXPECT_EQ(f.dataset_info("/model/extra.position_ids").dtype, DType::I64);
    EXPECT_EQ(read_dataset(f, "/model/extra.big"), round_to(download(big), DType::BF16));
    EXPECT_EQ(f.attr_ints("/model/extra.big", "slice_checksums").size(), 3u * 9) << "8 slices of 4 MiB and one";
  }
  ASSERT_EQ(convert(tmp / "bf16.h5", tmp / "back32", "fp32"), 0);
  SafetensorsFile b(tmp / "back32/model.safetensors");
  EXPECT_EQ(b.entry("extra.position_ids").dtype, DType::I64);
  EXPECT_EQ(download(b.read("extra.position_ids")), download(ids));
  EXPECT_EQ(download(b.read("extra.big")), round_to(download(big), DType::BF16));
  EXPECT_EQ(download(b.read("extra.half")), round_to(download(half), DType::BF16));
  EXPECT_EQ(b.entry("extra.scalar").shape, Shape{});
  EXPECT_EQ(download(b.read("extra.scalar")), std::vector<float>{2.5f});
}

TEST(Convert, Gpt2Conv1DWeightsAreStoredOutByIn) {
  const std::string src = golden_path("gpt2-tiny");
  ScratchDir tmp("conv1d");
  const std::string h5 = tmp / "w.h5";
  ASSERT_EQ(convert(src, h5), 0);
  SafetensorsFile hub(src + "/model.safetensors");
  H5File f = H5File::open(h5);
  const std::string name = "transformer.h.0.attn.c_attn.weight", ds = "/model/" + name;
  ASSERT_EQ(hub.entry(name).shape, (Shape{64, 192}));  // [in, out] in the hub file
  EXPECT_EQ(f.dataset_info(ds).shape, (Shape{192, 64}));
  EXPECT_EQ(f.attr_int(ds, "hub_transposed"), 1);
  const std::vector<float> h = download(hub.read(name)), e = read_dataset(f, ds);
  for (int64_t i = 0; i < 64; ++i)
    for (int64_t o = 0; o < 192; ++o) ASSERT_EQ(e[size_t(o * 64 + i)], h[size_t(i * 192 + o)]) << i << "," << o;
  for (const char* other : {"transformer.h.0.attn.c_proj.weight", "transformer.h.0.mlp.c_fc.weight",
                            "transformer.h.0.mlp.c_proj.weight"})
    EXPECT_TRUE(f.has_attr(std::string("/model/") + other, "hub_transposed")) << other;
  for (const char* plain : {"transformer.wte.weight", "transformer.h.0.attn.c_attn.bias", "transformer.h.0.ln_1.weight"})
    EXPECT_FALSE(f.has_attr(std::string("/model/") + plain, "hub_transposed")) << plain;
}

TEST(Convert, H5pyReadsConvertedWeights) {
  const std::string src = golden_path("gpt2-tiny");
  if (!fs::exists("/usr/bin/python3") || std::system("/usr/bin/python3 -c 'import h5py' 2>/dev/null") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with h5py not available";
  ScratchDir tmp("h5py");
  ASSERT_EQ(convert(src, tmp / "f32.h5"), 0);
  ASSERT_EQ(convert(src, tmp / "bf16.h5", "bf16"), 0);
  // The snippet writes each dataset as raw float32 plus its shape, with nothing of ours involved.
  const std::string py = tmp / "read.py";
  std::ofstream(py) << "import sys, json, h5py, numpy as np\n"
                       "f = h5py.File(sys.argv[1], 'r')\n"
                       "ds = f['/model/' + sys.argv[2]]\n"
                       "a = np.asarray(ds[...], dtype=np.float32)\n"
                       "a.tofile(sys.argv[3])\n"
                       "json.dump({'shape': list(a.shape), 'kind': f.attrs['kind'] if isinstance(f.attrs['kind'], str)"
                       " else f.attrs['kind'].decode(), 'transposed': int(ds.attrs.get('hub_transposed', 0))},"
                       " open(sys.argv[3] + '.json', 'w'))\n";
  SafetensorsFile hub(src + "/model.safetensors");
  for (const char* file : {"f32.h5", "bf16.h5"}) {
    for (const std::string name : {"transformer.wte.weight", "transformer.h.1.attn.c_attn.weight"}) {
      SCOPED_TRACE(std::string(file) + " " + name);
      const std::string out = tmp / "out.bin";
      const std::string cmd = "/usr/bin/python3 " + py + " " + (tmp / file) + " " + name + " " + out;
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      json meta = json::parse(read_all(out + ".json"));
      EXPECT_EQ(meta["kind"], "weights");
      H5File f = H5File::open(tmp / file);
      const std::string ds = "/model/" + name;
      EXPECT_EQ(meta["shape"].get<Shape>(), f.dataset_info(ds).shape);
      EXPECT_EQ(meta["transposed"].get<int>(), f.has_attr(ds, "hub_transposed") ? 1 : 0);
      const std::string raw = read_all(out);
      std::vector<float> got(raw.size() / 4);
      std::memcpy(got.data(), raw.data(), got.size() * 4);
      EXPECT_EQ(got, read_dataset(f, ds));  // h5py reads bf16 as float32, exactly
      if (std::string(file) == "bf16.h5" && name == "transformer.wte.weight") {
        EXPECT_EQ(got, round_to(download(hub.read(name)), DType::BF16));
      }
    }
  }
}

TEST(Convert, Errors) {
  const std::string src = golden_path("gpt2-tiny");
  ScratchDir tmp("errors");
  const std::string missing = tmp / "nope";
  expect_error([&] { convert(missing, tmp / "x.h5"); }, {missing, "no such"});

  fs::create_directories(tmp / "noweights");
  std::ofstream(tmp / "noweights/config.json") << read_all(src + "/config.json");
  expect_error([&] { convert(tmp / "noweights", tmp / "x.h5"); }, {tmp / "noweights", "no weights file"});
  fs::create_directories(tmp / "noconfig");
  expect_error([&] { convert(tmp / "noconfig", tmp / "x.h5"); }, {tmp / "noconfig", "config.json"});

  // A config the engine cannot build is refused up front (the file would never load).
  fs::create_directories(tmp / "bert");
  std::ofstream(tmp / "bert/config.json") << R"({"model_type": "bert", "hidden_size": 64})";
  fs::copy_file(src + "/model.safetensors", tmp / "bert/model.safetensors");
  expect_error([&] { convert(tmp / "bert", tmp / "x.h5"); }, {tmp / "bert/config.json"});

  expect_error([&] { convert(src, tmp / "x.h5", "fp8"); }, {"fp8", "keep, bf16, fp16 or fp32"});
  EXPECT_FALSE(fs::exists(tmp / "x.h5"));

  // An existing destination is refused, and left alone, unless forced.
  const std::string h5 = tmp / "w.h5";
  std::ofstream(h5) << "precious";
  expect_error([&] { convert(src, h5); }, {h5, "already exists", "--force"});
  EXPECT_EQ(read_all(h5), "precious");
  ASSERT_EQ(convert(src, h5, "keep", true), 0);
  EXPECT_EQ(H5File::open(h5).attr_string("/", "kind"), "weights");
  fs::create_directories(tmp / "full");
  std::ofstream(tmp / "full/README.md") << "mine";
  expect_error([&] { convert(h5, tmp / "full"); }, {tmp / "full", "not empty", "--force"});
  EXPECT_FALSE(fs::exists(tmp / "full/model.safetensors"));
  ASSERT_EQ(convert(h5, tmp / "full", "keep", true), 0);
  EXPECT_EQ(read_all(tmp / "full/README.md"), "mine");  // --force replaces model files only
  expect_error([&] { convert(src, tmp / "full"); }, {tmp / "full", "is a folder"});

  // HDF5 files that are not weights files or checkpoints: a checkpoint that does not say its model, a
  // plain HDF5 file, and not HDF5 at all.
  const std::string ckpt = tmp / "step-00000010.h5";
  {
    CheckpointWriter w(ckpt);
    w.file().set_attr_string("/", "kind", "checkpoint");
    float x[3] = {1, 2, 3};
    w.write("/model/w", DType::F32, {3}, DType::F32, x, 0, 3);
    w.commit();
  }
  expect_error([&] { convert(ckpt, tmp / "out1"); }, {ckpt, "model_family missing"});
  const std::string plain = tmp / "plain.h5";
  {
    H5File f = H5File::create(plain);
    f.set_attr_int("/", "zeropipe_format", 1);
    f.close();
  }
  expect_error([&] { convert(plain, tmp / "out2"); }, {plain, "not a weights file", "no 'kind'"});
  const std::string text = tmp / "notes.txt";
  std::ofstream(text) << "not hdf5";
  expect_error([&] { convert(text, tmp / "out3"); }, {text});
  for (const char* o : {"out1", "out2", "out3"}) EXPECT_FALSE(fs::exists(tmp / o)) << o;

  // A damaged tensor in the source names the file and the tensor, and leaves no file behind.
  fs::create_directories(tmp / "bad");
  fs::copy_file(src + "/config.json", tmp / "bad/config.json");
  {
    std::string st = read_all(src + "/model.safetensors");
    uint64_t hlen = 0;
    std::memcpy(&hlen, st.data(), 8);
    json hdr = json::parse(st.substr(8, hlen));
    hdr["transformer.h.0.attn.c_attn.weight"]["shape"] = {64, 64, 3};  // same bytes, wrong rank
    std::string h = hdr.dump();
    h.append((8 - h.size() % 8) % 8, ' ');
    const uint64_t new_len = h.size();
    std::ofstream out(tmp / "bad/model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&new_len), 8);
    out << h << st.substr(8 + hlen);
  }
  expect_error([&] { convert(tmp / "bad", tmp / "bad.h5"); }, {"transformer.h.0.attn.c_attn.weight", "model.safetensors"});
  EXPECT_FALSE(fs::exists(tmp / "bad.h5"));
  EXPECT_FALSE(fs::exists(tmp / "bad.h5.tmp"));
}

TEST(Inspect, ShowsConfigAndParameterCountAndVerifies) {
  const std::string src = golden_path("gpt2-tiny");
  ScratchDir tmp("inspect");
  const std::string h5 = tmp / "w.h5";
  ASSERT_EQ(convert(src, h5), 0);
  SafetensorsCollection c = SafetensorsCollection::open_dir(src, "model");
  int64_t params = 0;
  for (const std::string& n : c.names()) params += shape_numel(c.file_of(n).entry(n).shape);

  app::InspectReport r = app::inspect_report(h5, true);
  EXPECT_TRUE(r.ok);
  auto has = [&](const std::string& s) { return r.text.find(s) != std::string::npos; };
  EXPECT_TRUE(has("/model/transformer.h.0.attn.c_attn.weight")) << r.text;
  EXPECT_TRUE(has("model: weights file, family transformer")) << r.text;
  std::string count = std::to_string(params);
  for (int i = int(count.size()) - 3; i > 0; i -= 3) count.insert(size_t(i), ",");
  EXPECT_TRUE(has("parameters: " + count + " ")) << r.text;
  EXPECT_TRUE(has("in " + std::to_string(c.names().size()) + " tensors")) << r.text;
  EXPECT_TRUE(has(json::parse(read_all(src + "/config.json")).dump(2))) << "pretty config missing:\n" << r.text;
  EXPECT_TRUE(has("checksums: ok")) << r.text;
  testing::internal::CaptureStdout();
  EXPECT_EQ(app::run_inspect(h5, true), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), r.text);

  // Flip one stored byte of a tensor: verify reports it and the command fails.
  const int64_t at = H5File::open(h5).dataset_info("/model/transformer.wte.weight").file_offset;
  ASSERT_GE(at, 0);
  {
    std::fstream f(h5, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at + 5);
    char b = 0;
    f.read(&b, 1);
    b ^= 0x10;
    f.seekp(at + 5);
    f.write(&b, 1);
  }
  r = app::inspect_report(h5, true);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(has("checksums: FAILED")) << r.text;
  EXPECT_TRUE(has("/model/transformer.wte.weight")) << r.text;
  testing::internal::CaptureStdout();
  EXPECT_EQ(app::run_inspect(h5, true), 1);
  testing::internal::GetCapturedStdout();
  EXPECT_TRUE(app::inspect_report(h5, false).ok);  // without verify nothing is re-read

  // A plain HDF5 file has no model section; missing and non-HDF5 files are errors naming them.
  const std::string plain = tmp / "plain.h5";
  {
    H5File f = H5File::create(plain);
    f.set_attr_string("/", "note", "hello");
    f.close();
  }
  r = app::inspect_report(plain, false);
  EXPECT_TRUE(r.ok);
  EXPECT_FALSE(has("parameters:")) << r.text;
  expect_error([&] { app::inspect_report(tmp / "missing.h5", false); }, {tmp / "missing.h5", "no such file"});
  const std::string text = tmp / "notes.txt";
  std::ofstream(text) << "not hdf5";
  expect_error([&] { app::run_inspect(text, false); }, {text});
}

TEST(Inspect, CheckpointShowsModelSection) {
  ScratchDir tmp("inspect_ckpt");
  const std::string ckpt = tmp / "step-00000001.h5";
  {
    CheckpointWriter w(ckpt);
    w.file().set_attr_string("/", "kind", "checkpoint");
    w.file().set_attr_string("/", "config", R"({"model":{"n_layer":2},"lr":0.001})");
    std::vector<float> x(10, 1.f);
    w.write("/model/a", DType::F32, {2, 3}, DType::F32, x.data(), 0, 6);
    w.write("/model/b", DType::BF16, {4}, DType::F32, x.data(), 0, 4);
    w.write("/optimizer/a/exp_avg", DType::F32, {2, 3}, DType::F32, x.data(), 0, 6);
    w.commit();
  }
  app::InspectReport r = app::inspect_report(ckpt, true);
  EXPECT_TRUE(r.ok);
  EXPECT_NE(r.text.find("model: checkpoint file"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("parameters: 10 (0.00M) in 2 tensors under /model"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("\"n_layer\": 2"), std::string::npos) << r.text;
}

}  // namespace
}  // namespace zp::test
