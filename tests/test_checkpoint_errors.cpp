// Checkpoints in the training loop, one process: what --resume refuses (a truncated file, a file that
// is not HDF5, a checkpoint of another model, of another model family (an LM's for a UNet and back),
// a weights file, a missing file), each with an error naming the file and, where one is at fault, the
// model family, dataset or config key; a save that fails leaves
// the previous checkpoint intact and no temporary file; and on one rank an fp16 run with loss
// scaling resumes bit for bit, overflow-skipped steps and all.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>

#include "app/convert.h"
#include "app/make_latents.h"
#include "comm/bootstrap.h"
#include "core/error.h"
#include "io/checkpoint_file.h"
#include "io/direct_file.h"
#include "kernels/elementwise.h"
#include "io/config.h"
#include "io/token_dataset.h"
#include "runtime/diffusion_training.h"
#include "runtime/lm_training.h"
#include "runtime/train_config.h"
#include "test_runtime.h"
#include "test_util.h"
#include "tiny_unet_config.h"

namespace zp::test {
using namespace zp::runtime;
namespace fs = std::filesystem;

namespace {

// Scratch folders <temp>/zp_ckpt_err_<name>_<pid>.
struct Dir : ScratchFolder {
  explicit Dir(const std::string& name) : ScratchFolder("ckpt_err_" + name) {}
};

std::string token_file(const Dir& d) {
  std::mt19937_64 g(5);
  std::vector<int32_t> t(8 * 16 * 12 + 1);
  for (auto& x : t) x = int32_t(g() % 64);
  const std::string p = d / "tokens.bin";
  io::write_token_file(p, t, 64);
  return p;
}

io::json llama(int hidden = 32, int layers = 2) {
  return {{"model_type", "llama"}, {"vocab_size", 64}, {"hidden_size", hidden}, {"intermediate_size", 48},
          {"num_hidden_layers", layers}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"max_position_embeddings", 32}};
}

io::Config user_config(const std::string& data, const io::json& model, const std::string& dir, int64_t steps,
                       int64_t save_every) {
  io::json user = {{"train_micro_batch_size_per_gpu", 8},
                   {"steps_per_print", 1000},
                   {"optimizer", {{"params", {{"lr", 3e-3}}}}},
                   {"scheduler", {{"params", {{"warmup_num_steps", 2}, {"total_num_steps", 12}}}}},
                   {"model", {{"config", model}}},
                   {"data", {{"train_files", {data}}, {"seq_len", 16}}},
                   {"checkpoint", {{"dir", dir}, {"save_every", save_every}, {"keep_last", 0}}},
                   {"training", {{"max_steps", steps}, {"device", "cpu"}}}};
  return io::Config(train_config_schema(), user, "checkpoint-errors-test");
}

TrainConfig config(const std::string& data, const io::json& model, const std::string& dir, int64_t steps,
                   int64_t save_every, const std::string& resume = "") {
  TrainConfig c = TrainConfig::from(user_config(data, model, dir, steps, save_every));
  c.resume = resume;
  return c;
}

std::string file_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(CheckpointErrors, ResumeRefusesBadFilesNamingThem) {
  RuntimeLease rt;
  Dir d("refuse");
  const std::string data = token_file(d), dir = d / "ckpt";
  const TrainResult first = train(config(data, llama(), dir, 2, 2), *rt);
  ASSERT_EQ(first.saved.size(), 1u);
  const std::string good = first.saved[0];
  ASSERT_TRUE(io::verify_checksums(good).ok());
  auto resume = [&](const std::string& file, const io::json& model = llama()) {
    return [&, file, model] { train(config(data, model, "", 4, 0, file), *rt); };
  };

  // A truncated file (a copy cut in half).
  const std::string truncated = d / "truncated.h5";
  fs::copy_file(good, truncated);
  fs::resize_file(truncated, fs::file_size(good) / 2);
  expect_error(resume(truncated), {truncated});
  // A file that is not HDF5.
  const std::string text = d / "notes.h5";
  std::ofstream(text) << "not an HDF5 file\n";
  expect_error(resume(text), {text});
  // A missing file.
  expect_error(resume(d / "absent.h5"), {d / "absent.h5", "no such checkpoint"});
  // Another model: wider (the first parameter's shape differs), deeper (a layer is missing), shallower
  // (the file has a layer too many), or the same shapes with another rope_theta.
  expect_error(resume(good, llama(48)),
               {good, "dataset '/model/model.embed_tokens.weight'", "shape [64, 32]", "[64, 48]", "hidden_size"});
  expect_error(resume(good, llama(32, 3)), {good, "/model/model.layers.2.", "is missing", "num_hidden_layers"});
  expect_error(resume(good, llama(32, 1)), {good, "/model/model.layers.1.", "not a parameter of this model"});
  io::json rope = llama();
  rope["rope_theta"] = 500000.0;
  expect_error(resume(good, rope), {good, "'rope_theta'", "absent in the checkpoint"});
  // A weights file (what `zeropipe convert` writes) is not a checkpoint.
  const std::string weights = d / "weights.h5";
  {
    io::CheckpointWriter w(weights);
    w.file().set_attr_string("/", "kind", "weights");
    w.file().set_attr_string("/", "config", llama().dump());
    std::vector<float> x(64 * 32, 0.5f);
    w.write("/model/model.embed_tokens.weight", DType::F32, {64, 32}, DType::F32, x.data(), 0, 64 * 32);
    w.commit();
  }
  expect_error(resume(weights), {weights, "kind = 'weights'", "not a training checkpoint"});
  // "latest" needs a folder to look in.
  expect_error(resume("latest"), {"--resume latest needs checkpoint.dir"});

  // None of that touched the good checkpoint, which still resumes.
  EXPECT_TRUE(io::verify_checksums(good).ok());
  const TrainResult again = train(config(data, llama(), "", 4, 0, good), *rt);
  EXPECT_EQ(again.first_step, 2);
  EXPECT_EQ(again.losses.size(), 2u);
}

// A tiny UNet (SD layout) on 8x8 latents; `width` changes the second block's channels.
io::json tiny_unet(int width = 32) { return tiny_unet_config(false, 8, width); }

UNetTrainConfig unet_config(const std::string& latents, const io::json& unet, const std::string& dir, int64_t steps,
                            int64_t save_every, const std::string& resume = "") {
  io::json user = {{"train_micro_batch_size_per_gpu", 4},
                   {"steps_per_print", 1000},
                   {"model", {{"type", "unet"}, {"config", unet}}},
                   {"data", {{"train_files", {latents}}}},
                   {"checkpoint", {{"dir", dir}, {"save_every", save_every}, {"keep_last", 0}}},
                   {"training", {{"max_steps", steps}, {"device", "cpu"}}}};
  UNetTrainConfig c = UNetTrainConfig::from(io::Config(train_schema_with_diffusion(), user, "checkpoint-errors-test"));
  c.common.resume = resume;
  return c;
}

TEST(CheckpointErrors, UNetResumeRefusesOtherModelsNamingThem) {
  RuntimeLease rt;
  Dir d("unet");
  const std::string tokens = token_file(d), latents = d / "latents.h5";
  app::make_latents(latents, tiny_unet().dump(), 16, 3);
  const TrainResult unet = train_unet(unet_config(latents, tiny_unet(), d / "unet", 2, 2), *rt);
  const TrainResult lm = train(config(tokens, llama(), d / "lm", 1, 1), *rt);
  ASSERT_EQ(unet.saved.size(), 1u);
  ASSERT_EQ(lm.saved.size(), 1u);

  // An LM's checkpoint for a UNet run, and a UNet's for an LM run: the family is named first.
  expect_error([&] { train_unet(unet_config(latents, tiny_unet(), "", 3, 0, lm.saved[0]), *rt); },
               {lm.saved[0], "a checkpoint of a transformer model", "this run trains a unet"});
  expect_error([&] { train(config(tokens, llama(), "", 3, 0, unet.saved[0]), *rt); },
               {unet.saved[0], "a checkpoint of a unet model", "this run trains a transformer"});
  // A UNet of another width: the dataset whose shape differs, and the config key behind it.
  expect_error([&] { train_unet(unet_config(latents, tiny_unet(48), "", 3, 0, unet.saved[0]), *rt); },
               {unet.saved[0], "dataset '/model/", "block_out_channels"});
  // The same UNet with another setting that no shape shows.
  io::json eps = tiny_unet();
  eps["norm_eps"] = 1e-6;
  expect_error([&] { train_unet(unet_config(latents, eps, "", 3, 0, unet.saved[0]), *rt); },
               {unet.saved[0], "'norm_eps'", "absent in the checkpoint"});

  // The right model resumes, and continues the step count.
  const TrainResult again = train_unet(unet_config(latents, tiny_unet(), "", 3, 0, unet.saved[0]), *rt);
  EXPECT_EQ(again.first_step, 2);
  EXPECT_EQ(again.resumed_from, unet.saved[0]);
  EXPECT_EQ(again.losses.size(), 1u);
}

TEST(CheckpointErrors, LatestWithNoCheckpointStartsFresh) {
  RuntimeLease rt;
  Dir d("fresh");
  const std::string data = token_file(d);
  // A folder that does not exist is most likely a mistyped path: an error, not a fresh start.
  expect_error([&] { train(config(data, llama(), d / "empty", 2, 0, "latest"), *rt); },
               {"--resume latest", d / "empty", "does not exist"});
  fs::create_directories(d / "empty");
  const TrainResult r = train(config(data, llama(), d / "empty", 2, 0, "latest"), *rt);
  EXPECT_EQ(r.first_step, 0);
  EXPECT_EQ(r.resumed_from, "");
  EXPECT_EQ(r.losses.size(), 2u);
}

TEST(CheckpointErrors, FailedSaveKeepsThePreviousCheckpoint) {
  RuntimeLease rt;
  Dir d("failsave");
  const std::string data = token_file(d), dir = d / "ckpt";
  const TrainResult first = train(config(data, llama(), dir, 1, 1), *rt);
  ASSERT_EQ(first.saved.size(), 1u);
  const std::string good = first.saved[0], before = file_bytes(good);

  // The save of step 2 cannot be renamed into place (a folder holds its name): the error names it,
  // the temporary file is gone, step 1 is untouched and still the latest complete checkpoint.
  const std::string blocked = dir + "/" + io::checkpoint_filename(2);
  fs::create_directories(blocked + "/keep");
  expect_error([&] { train(config(data, llama(), dir, 2, 1, "latest"), *rt); }, {blocked});
  EXPECT_FALSE(fs::exists(blocked + ".tmp"));
  EXPECT_EQ(file_bytes(good), before);
  EXPECT_EQ(io::latest_checkpoint(dir).value_or(""), good);

  // checkpoint.dir below a file: nothing can be created; the error names the path.
  const std::string file = d / "a_file";
  std::ofstream(file) << "x";
  expect_error([&] { train(config(data, llama(), file + "/ckpt", 1, 1), *rt); }, {file + "/ckpt"});

  // Once the way is clear, resuming from step 1 saves step 2.
  fs::remove_all(blocked);
  const TrainResult r = train(config(data, llama(), dir, 2, 1, "latest"), *rt);
  EXPECT_EQ(r.first_step, 1);
  ASSERT_EQ(r.saved.size(), 1u);
  EXPECT_EQ(r.saved[0], blocked);
  EXPECT_TRUE(io::verify_checksums(blocked).ok());
  EXPECT_EQ(file_bytes(good), before);
}

TEST(CheckpointErrors, ConfigKeysAreChecked) {
  Dir d("keys");
  const std::string data = d / "tokens.bin";
  expect_error([&] { TrainConfig::from(user_config(data, llama(), "", 2, 5)); },
               {"checkpoint.save_every", "checkpoint.dir"});
  io::Config c = user_config(data, llama(), d.str(), 2, 1);
  c.set("checkpoint.keep_last=-1");
  expect_error([&] { TrainConfig::from(c); }, {"checkpoint.keep_last"});
}

// fp16 with a scale too large: steps overflow and are skipped, the scale halves after every second
// overflow (hysteresis) and doubles after 3 clean steps (the 12 steps go O O O . O O . . . O O .),
// so the scaler's hidden counters matter. Resumed after each kind of run, the result matches the
// straight run bit for bit, skipped steps included.
TEST(CheckpointErrors, Fp16LossScalerResumesExactly) {
  RuntimeLease rt;
  Dir d("fp16");
  const std::string data = token_file(d);
  auto fp16 = [&](const std::string& dir, int64_t steps, int64_t save_every, const std::string& resume) {
    io::Config c = user_config(data, llama(), dir, steps, save_every);
    c.set("fp16.enabled=true");
    c.set("fp16.initial_scale_power=22");
    c.set("fp16.hysteresis=2");
    c.set("fp16.loss_scale_window=3");
    TrainConfig t = TrainConfig::from(c);
    t.resume = resume;
    return train(t, *rt);
  };
  const TrainResult straight = fp16("", 12, 0, "");
  ASSERT_EQ(straight.losses.size(), 12u);
  EXPECT_GT(straight.skipped_steps, 0);
  for (int64_t at : {1, 3, 4, 5, 6, 9, 10}) {
    const std::string dir = d / ("at" + std::to_string(at));
    fp16(dir, at, at, "");
    const TrainResult rest = fp16(dir, 12, 0, "latest");
    EXPECT_EQ(rest.first_step, at);
    EXPECT_EQ(rest.losses, std::vector<double>(straight.losses.begin() + at, straight.losses.end())) << "resumed at " << at;
    EXPECT_EQ(rest.skipped_steps, straight.skipped_steps) << "resumed at " << at;
  }
}

}  // namespace zp::test

// --- nothing lost: verified loads, fallback, storage checks, divergence, weights out ------------

namespace zp::test {
namespace {

// Flips `n` bytes of dataset `ds`'s stored data (a contiguous dataset: its bytes sit at file_offset).
void damage_dataset(const std::string& path, const std::string& ds, int64_t at_byte, int n) {
  int64_t offset = 0;
  {
    io::H5File f = io::H5File::open(path);
    offset = f.dataset_info(ds).file_offset;
  }
  ASSERT_GE(offset, 0) << ds << " is not contiguous";
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  for (int i = 0; i < n; ++i) {
    io.seekg(offset + at_byte + i);
    const char c = char(io.get() ^ 0x5a);
    io.seekp(offset + at_byte + i);
    io.put(c);
  }
}

std::string first_model_dataset(const std::string& path) {
  io::H5File f = io::H5File::open(path);
  return "/model/" + f.children("/model").front();
}

}  // namespace

// The data path alone: back-to-back writes at unaligned offsets (each one's last piece still in
// flight when the next starts) land byte for byte, with the CRCs of what was written.
TEST(DirectFile, BackToBackUnalignedWritesReadBackExactly) {
  Dir dir("direct_file");
  const std::string path = dir / "data.bin";
  std::ofstream(path).put('\0');
  const int64_t piece = io::DirectFile::kPieceBytes;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {1, piece + 4093}, {piece + 4094, 17}, {piece + 4111, 2 * piece + 12345}, {3 * piece + 16456, 4096}};
  const int64_t end = ranges.back().first + ranges.back().second;
  std::vector<char> bytes(static_cast<size_t>(end));
  std::mt19937 rng(5);
  for (char& c : bytes) c = char(rng());
  {
    io::DirectFile f(path, true, 2);
    std::printf("O_DIRECT: %s\n", f.direct() ? "yes" : "no (buffered throughout)");
    for (const auto& [at, n] : ranges)
      EXPECT_EQ(f.write(at, bytes.data() + at, n), io::crc32(bytes.data() + at, size_t(n))) << "at " << at;
    f.sync();
  }
  io::DirectFile f(path, false);
  std::vector<char> back;
  f.read_ranges({{1, end - 1}}, [&](size_t, const char* p, int64_t n) { back.insert(back.end(), p, p + n); });
  ASSERT_EQ(int64_t(back.size()), end - 1);
  EXPECT_TRUE(std::equal(back.begin(), back.end(), bytes.begin() + 1));
}

// A piece that the disk refuses while write() has already returned (here: past RLIMIT_FSIZE, as a
// full disk would) is thrown by sync() at the latest, naming the file and the byte range.
TEST(DirectFile, AWriteRefusedInFlightIsThrownWithItsRange) {
  Dir dir("direct_file_refused");
  const std::string path = dir / "data.bin";
  std::ofstream(path).put('\0');
  const int64_t piece = io::DirectFile::kPieceBytes;
  std::vector<char> bytes(size_t(3 * piece), 7);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  const rlimit lim{rlim_t(piece + 4096), old.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string what;
  {
    io::DirectFile f(path, true, 2);
    try {
      f.write(0, bytes.data(), int64_t(bytes.size()));
      f.sync();
    } catch (const Error& e) {
      what = e.what();
    }
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(what.find(path), std::string::npos) << what;
  EXPECT_NE(what.find("write of bytes ["), std::string::npos) << what;
  EXPECT_NE(what.find("File too large"), std::string::npos) << what;
}

// read_all streams several datasets' bytes as one sequence of pieces (a tensor larger than a piece,
// tensors smaller than one, an empty request, a cast to bf16): the same values as read() one by one,
// and damage in one dataset is thrown naming it, after the others were read.
TEST(VerifiedReads, ReadAllReadsWhatReadReadsAndNamesTheDamage) {
  Dir d("verified_all");
  const std::string path = d / "many.h5";
  const int64_t big = io::DirectFile::kPieceBytes / 4 + 12345;  // more than one piece of floats
  const std::vector<std::pair<std::string, int64_t>> shapes = {{"/model/a", 1000}, {"/model/big", big},
                                                                {"/model/b", 7}, {"/model/c", 3000}};
  std::vector<std::vector<float>> v;
  for (size_t t = 0; t < shapes.size(); ++t) {
    v.emplace_back(size_t(shapes[t].second));
    for (size_t i = 0; i < v[t].size(); ++i) v[t][i] = float(t + 1) + float(i % 977) * 0.25f;
  }
  {
    io::CheckpointWriter w(path);
    for (size_t t = 0; t < shapes.size(); ++t) {  // two slices each, as two ranks write them
      const int64_t n = shapes[t].second, half = n / 2;
      for (int64_t s : {int64_t(0), half})
        w.write(shapes[t].first, DType::F32, {n}, DType::F32, v[t].data() + s, s, s == 0 ? half : n - half);
    }
    w.commit();
  }
  // Parts of each: a range inside the second slice of `a`, all of `big`, none of `b`, a bf16 copy of `c`.
  std::vector<float> a(100), whole(static_cast<size_t>(big)), none(1, -1.f);
  std::vector<uint16_t> c16(3000);
  auto requests = [&] {
    return std::vector<io::CheckpointReader::ReadRequest>{
        {"/model/a", {1000}, DType::F32, a.data(), 700, 100},
        {"model/big", {big}, DType::F32, whole.data(), 0, big},
        {"/model/b", {7}, DType::F32, none.data(), 3, 0},
        {"/model/c", {3000}, DType::BF16, c16.data(), 0, 3000}};
  };
  {
    io::CheckpointReader r(path);
    r.read_all(requests());
    EXPECT_EQ(r.bytes_read(), 4 * (500 + big + 3000));  // `a` widened to its second slice
  }
  EXPECT_TRUE(std::equal(a.begin(), a.end(), v[0].begin() + 700));
  EXPECT_EQ(whole, v[1]);
  EXPECT_EQ(none[0], -1.f);
  std::vector<uint16_t> want16(3000);
  kernels::cpu::cast(nullptr, DType::BF16, want16.data(), DType::F32, v[3].data(), 3000);
  EXPECT_EQ(c16, want16);
  // Damage in the second slice of `big`: the read of `c` after it still lands, and the error names `big`.
  damage_dataset(path, "/model/big", 4 * (big - 10), 1);
  std::fill(c16.begin(), c16.end(), 0);
  try {
    io::CheckpointReader(path).read_all(requests());
    ADD_FAILURE() << "read_all of a damaged dataset passed";
  } catch (const io::DamagedFileError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/model/big"), std::string::npos) << m;
    EXPECT_NE(m.find("elements [" + std::to_string(big / 2) + ", " + std::to_string(big) + ")"), std::string::npos) << m;
  }
  EXPECT_EQ(c16, want16);
  // A request that cannot be read as asked is refused before anything is read, naming the dataset.
  auto bad = requests();
  bad[2].expected_shape = {8};
  expect_error([&] { io::CheckpointReader(path).read_all(bad); }, {"/model/b", "shape"});
}

// A file with three slices per dataset (as three ranks write it): damage in one slice is found by any
// read that touches it, named with its element range, and reads of the other slices still pass.
TEST(VerifiedReads, NameTheDamagedSliceAndPassTheOthers) {
  Dir d("verified");
  const std::string path = d / "three.h5";
  std::vector<float> v(300);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f;
  {
    io::CheckpointWriter w(path);
    for (int s = 0; s < 3; ++s) w.write("/model/w", DType::F32, {300}, DType::F32, v.data() + 100 * s, 100 * s, 100);
    w.commit();
  }
  std::vector<float> out(300);
  io::CheckpointReader(path).read("/model/w", {300}, DType::F32, out.data(), 0, 300);
  EXPECT_EQ(out, v);
  damage_dataset(path, "/model/w", 4 * 150, 1);  // element 150: the middle slice
  io::CheckpointReader r(path);
  // Elements [120, 130) lie in the damaged slice: the read widens to the whole slice and fails.
  try {
    r.read("/model/w", {300}, DType::F32, out.data(), 120, 10);
    ADD_FAILURE() << "a read of a damaged slice passed";
  } catch (const io::DamagedFileError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("/model/w"), std::string::npos) << m;
    EXPECT_NE(m.find("elements [100, 200)"), std::string::npos) << m;
  }
  r.read("/model/w", {300}, DType::F32, out.data(), 0, 100);    // first slice: intact
  r.read("/model/w", {300}, DType::F32, out.data() + 250, 250, 50);  // part of the last: intact
  EXPECT_EQ(out[0], 0.f);
  EXPECT_THROW(r.read("/model/w", {300}, DType::BF16, out.data(), 0, 300), io::DamagedFileError);
  EXPECT_THROW(r.stream("/model/w", DType::F32, 64, [](const void*, int64_t, int64_t) {}), io::DamagedFileError);
}

TEST(VerifiedReads, ADatasetWithoutChecksumsInAChecksummedFileIsDamaged) {
  Dir d("nochecksums");
  const std::string path = d / "x.h5";
  {
    io::H5File f = io::H5File::create(path);
    f.set_attr_int("/", "zeropipe_format", 1);
    f.set_attr_string("/", "checksum", "crc32");
    f.create_dataset("/model/w", DType::F32, {4});
    const float x[4] = {1, 2, 3, 4};
    f.write_slice("/model/w", DType::F32, x, 0, 4);
    f.close();
  }
  float out[4];
  expect_error([&] { io::CheckpointReader(path).read("/model/w", {4}, DType::F32, out, 0, 4); },
               {path, "/model/w", "no slice_checksums"});
}

// A file as the writer made it before the data path (io/direct_file.h): its data written through
// HDF5's own transfers, at whatever offset HDF5 chose (here a dataset of 3 bytes first, so the next
// one starts on no 4-byte boundary) and a chunked dataset beside it. The reader's data path reads it,
// verified, over ranges that start and end anywhere; a damaged byte is still found.
TEST(VerifiedReads, FilesWrittenThroughHdf5ReadThroughTheDataPath) {
  Dir d("hdf5_written");
  const std::string path = d / "old.h5";
  std::vector<float> v(16000);  // 64000 bytes: under the 64 KiB that new files align, over many pages
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.25f - 7.f;
  {
    io::H5File f = io::H5File::create(path);
    f.set_attr_int("/", "zeropipe_format", 1);
    f.set_attr_string("/", "checksum", "crc32");
    const uint8_t odd[3] = {1, 2, 3};
    f.create_dataset("/pad", DType::U8, {3});
    f.write_slice("/pad", DType::U8, odd, 0, 3);
    for (const char* name : {"/model/w", "/model/chunked"}) {
      f.create_dataset(name, DType::F32, {160, 100}, std::string(name) == "/model/chunked" ? Shape{64, 100} : Shape{});
      std::vector<int64_t> rows;
      for (int64_t at = 0; at < 16000; at += 5333) {  // three writers' slices
        const int64_t n = std::min<int64_t>(5333, 16000 - at);
        f.write_slice(name, DType::F32, v.data() + at, at, n);
        rows.insert(rows.end(), {at, n, int64_t(io::crc32(v.data() + at, size_t(n) * 4))});
      }
      f.set_attr_ints(name, "slice_checksums", rows, {int64_t(rows.size() / 3), 3});
    }
    f.close();
  }
  io::CheckpointReader r(path);
  ASSERT_GE(r.info("/model/w").file_offset, 0);
  EXPECT_NE(r.info("/model/w").file_offset % 4096, 0) << "the test wants a dataset off the page grid";
  for (const char* name : {"/model/w", "/model/chunked"})
    for (auto [at, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 16000}, {1, 5}, {5332, 2}, {9000, 6999}}) {
      std::vector<float> out(size_t(n), -1.f);
      r.read(name, {160, 100}, DType::F32, out.data(), at, n);
      EXPECT_TRUE(std::equal(out.begin(), out.end(), v.begin() + at)) << name << " [" << at << ", " << at + n << ")";
    }
  damage_dataset(path, "/model/w", 4 * 12000, 1);
  std::vector<float> out(10);
  EXPECT_THROW(io::CheckpointReader(path).read("/model/w", {160, 100}, DType::F32, out.data(), 11995, 10),
               io::DamagedFileError);
  io::CheckpointReader(path).read("/model/w", {160, 100}, DType::F32, out.data(), 0, 10);  // another slice
  EXPECT_EQ(out[1], v[1]);
}

// Reads of megabytes go through the data path's parallel copy and CRC (its parts cut at the slices'
// bounds): seven slices of odd sizes read back whole and in ranges across their bounds, and damage in
// one is named with its range while the others still read.
TEST(VerifiedReads, LargeReadsAreVerifiedOnEveryThread) {
  Dir d("large");
  const std::string path = d / "large.h5";
  const int64_t n = 1'500'007;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 9973) * 0.5f + float(i / 9973);
  std::vector<int64_t> bounds = {0, 1, 300'001, 300'002, 777'777, 1'000'000, 1'400'003, n};
  {
    io::CheckpointWriter w(path);
    for (size_t s = 0; s + 1 < bounds.size(); ++s)
      w.write("/model/big", DType::F32, {n}, DType::F32, v.data() + bounds[s], bounds[s], bounds[s + 1] - bounds[s]);
    w.commit();
  }
  for (auto [at, c] : std::vector<std::pair<int64_t, int64_t>>{{0, n}, {299'000, 500'000}, {999'999, 2}, {5, n - 10}}) {
    std::vector<float> out(static_cast<size_t>(c), -1.f);
    io::CheckpointReader(path).read("/model/big", {n}, DType::F32, out.data(), at, c);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), v.begin() + at)) << "[" << at << ", " << at + c << ")";
  }
  damage_dataset(path, "/model/big", 4 * 900'000, 1);  // the slice [777777, 1000000)
  std::vector<float> out(static_cast<size_t>(n));
  expect_error([&] { io::CheckpointReader(path).read("/model/big", {n}, DType::F32, out.data(), 0, n); },
               {path, "/model/big", "elements [777777, 1000000)", "damaged"});
  io::CheckpointReader(path).read("/model/big", {n}, DType::F32, out.data(), 0, 777'777);
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 777'777, v.begin()));
}

// --resume refuses a checkpoint with a damaged slice (naming file, dataset and elements); `latest`
// skips a damaged or truncated newest checkpoint (renamed out of the rotation) for the newest intact
// one, and says so; when none is intact it is an error.
TEST(CheckpointErrors, ResumeVerifiesAndLatestFallsBackToAnIntactCheckpoint) {
  RuntimeLease rt;
  Dir d("fallback");
  const std::string data = token_file(d), dir = d / "ckpt";
  const TrainResult first = train(config(data, llama(), dir, 3, 1), *rt);
  ASSERT_EQ(first.saved.size(), 3u);
  const std::string s1 = first.saved[0], s2 = first.saved[1], s3 = first.saved[2];
  const std::string ds = first_model_dataset(s3);
  damage_dataset(s3, ds, 8, 4000);  // 1,000 floats

  expect_error([&] { train(config(data, llama(), dir, 4, 1, s3), *rt); }, {s3, ds, "elements [", "crc32"});
  const TrainResult r = train(config(data, llama(), dir, 4, 1, "latest"), *rt);
  EXPECT_EQ(r.resumed_from, s2);
  EXPECT_EQ(r.first_step, 2);
  EXPECT_TRUE(fs::exists(s3 + ".damaged"));
  ASSERT_EQ(r.saved.size(), 2u);  // steps 3 and 4, from the intact step 2
  EXPECT_TRUE(io::verify_checksums(r.saved.back()).ok());

  // A truncated newest file (a copy cut short) is skipped the same way.
  const std::string s4 = r.saved.back();
  fs::resize_file(s4, fs::file_size(s4) / 2);
  const TrainResult t = train(config(data, llama(), dir, 4, 1, "latest"), *rt);
  EXPECT_EQ(t.resumed_from, dir + "/" + io::checkpoint_filename(3));
  EXPECT_TRUE(fs::exists(s4 + ".damaged"));

  // Nothing intact left: an error, not a silent fresh start.
  for (const auto& c : io::list_checkpoints(dir)) damage_dataset(c.path, ds, 0, 64);
  expect_error([&] { train(config(data, llama(), dir, 5, 1, "latest"), *rt); }, {"every checkpoint", dir, "damaged"});
  EXPECT_TRUE(fs::exists(s1 + ".damaged"));
}

// checkpoint.dir is checked before any step: a path under a file cannot be created, a file is not
// a directory. The error names the key and the path.
TEST(CheckpointErrors, StorageIsCheckedBeforeTheFirstStep) {
  RuntimeLease rt;
  Dir d("storage");
  const std::string data = token_file(d), file = d / "a-file";
  std::ofstream(file) << "x";
  expect_error([&] { train(config(data, llama(), file, 2, 1), *rt); }, {"checkpoint.dir", file, "not a directory"});
  expect_error([&] { train(config(data, llama(), file + "/sub", 2, 1), *rt); },
               {"checkpoint.dir", file + "/sub", "cannot be created"});
  // A folder that can be created is created at start, before any work.
  const TrainResult r = train(config(data, llama(), d / "new/deeper", 1, 0), *rt);
  EXPECT_TRUE(fs::is_directory(d / "new/deeper"));
  // With checkpoint.dir and no save_every, the run saves once, at its end.
  ASSERT_EQ(r.saved.size(), 1u);
  EXPECT_EQ(r.saved[0], d / "new/deeper" + "/" + io::checkpoint_filename(1));
}

// A run whose loss turns non-finite stops after training.max_bad_steps such steps in a row with a
// named error; no checkpoint is written from those steps, and rotation (keep_last) never removes
// the newest healthy checkpoint.
TEST(CheckpointErrors, DivergenceStopsAndKeepsTheHealthyCheckpoints) {
  RuntimeLease rt;
  Dir d("diverge");
  const std::string data = token_file(d), dir = d / "ckpt";
  TrainConfig good = config(data, llama(), dir, 3, 1);
  good.keep_last = 2;
  ASSERT_EQ(train(good, *rt).saved.size(), 3u);
  // From step 3, a learning rate that blows the weights up: step 4's loss is still that of the
  // healthy weights, every later one is not finite.
  TrainConfig bad = good;
  bad.max_steps = 20;
  bad.lr = 1e30;
  bad.schedule = {.type = "WarmupLR", .lr = 1e30, .warmup_max_lr = 1e30};
  bad.max_bad_steps = 3;
  bad.resume = "latest";
  try {
    train(bad, *rt);
    ADD_FAILURE() << "a diverging run finished";
  } catch (const TrainingDiverged& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("diverged"), std::string::npos) << m;
    EXPECT_NE(m.find("3 steps in a row"), std::string::npos) << m;
    EXPECT_NE(m.find("training.max_bad_steps"), std::string::npos) << m;
  }
  std::vector<int64_t> steps;
  for (const auto& c : io::list_checkpoints(dir)) steps.push_back(c.step);
  ASSERT_FALSE(steps.empty());
  EXPECT_LE(steps.back(), 4) << "a checkpoint was written from a non-finite step";
  EXPECT_TRUE(fs::exists(dir + "/" + io::checkpoint_filename(3))) << "the newest healthy checkpoint was rotated out";
}

// Weights out and back in: a checkpoint's model exported to a weights file starts a run
// (model.hub_dir = the .h5) with exactly the checkpoint's weights; so does the checkpoint itself.
TEST(CheckpointErrors, ACheckpointsWeightsStartARunThroughAWeightsFile) {
  RuntimeLease rt;
  Dir d("weightsout");
  const std::string data = token_file(d), dir = d / "ckpt";
  const TrainResult a = train(config(data, llama(), dir, 2, 0), *rt, MPI_COMM_NULL, /*return_params=*/true);
  ASSERT_EQ(a.saved.size(), 1u);
  app::ConvertOptions o;
  o.from = a.saved[0];
  o.to = d / "w.h5";
  ASSERT_EQ(app::run_convert(o), 0);
  for (const std::string& source : {o.to, a.saved[0]}) {
    io::json user = user_config(data, llama(), "", 0, 0).root();
    user["model"]["config"] = nullptr;
    user["model"]["hub_dir"] = source;
    user["model"]["init"] = "hub";
    TrainConfig c = TrainConfig::from(io::Config(train_config_schema(), user, "weights-in"));
    const TrainResult b = train(c, *rt, MPI_COMM_NULL, /*return_params=*/true);
    EXPECT_EQ(b.final_params, a.final_params) << source;
  }
  // A checkpoint with a tensor its model does not have is refused by convert, and nothing is written.
  {
    io::CheckpointWriter w(d / "extra.h5");
    io::CheckpointReader r(a.saved[0]);
    for (const char* attr : {"kind", "model_family", "model_config"})
      w.file().set_attr_string("/", attr, r.file().attr_string("/", attr));
    const float x[2] = {1, 2};
    w.write("/model/not.a.parameter", DType::F32, {2}, DType::F32, x, 0, 2);
    w.commit();
  }
  o.from = d / "extra.h5";
  o.to = d / "extra-out";
  expect_error([&] { app::run_convert(o); }, {d / "extra.h5", "missing"});
  EXPECT_FALSE(fs::exists(d / "extra-out"));
  // A damaged weights file converts to nothing.
  damage_dataset(d / "w.h5", first_model_dataset(d / "w.h5"), 0, 16);
  o.from = d / "w.h5";
  o.to = d / "hub";
  expect_error([&] { app::run_convert(o); }, {d / "w.h5", "crc32"});
  EXPECT_TRUE(!fs::exists(d / "hub") || fs::is_empty(d / "hub"));
}

}  // namespace zp::test

namespace zp::test {

// libhdf5 1.10 crashes (SIGSEGV in H5HG_read) reading a string attribute whose global heap object
// has a damaged size. --resume latest reads each candidate's metadata in a child process first, so
// such a checkpoint is skipped like any damaged one instead of taking the job down.
TEST(CheckpointErrors, ACheckpointWhoseMetadataCrashesHdf5IsSkipped) {
  RuntimeLease rt;
  Dir d("heapcrash");
  const std::string data = token_file(d), dir = d / "ckpt";
  const TrainResult first = train(config(data, llama(), dir, 2, 1), *rt);
  ASSERT_EQ(first.saved.size(), 2u);
  // The global heap collection ("GCOL", 16-byte header) holds the string attributes; the top byte of
  // each object's 8-byte size (after its 2-byte index, 2-byte count and 4 reserved bytes) set wild.
  std::string bytes = file_bytes(first.saved[1]);
  const size_t gcol = bytes.find("GCOL");
  ASSERT_NE(gcol, std::string::npos);
  for (size_t obj = gcol + 16, n = 0; n < 4 && obj + 16 <= bytes.size(); ++n) {
    uint64_t size = 0;
    std::memcpy(&size, bytes.data() + obj + 8, 8);
    if (size == 0) break;
    bytes[obj + 15] = char(0x7b);
    obj += 16 + ((size + 7) / 8) * 8;
  }
  std::ofstream(first.saved[1], std::ios::binary | std::ios::trunc) << bytes;
  const std::string problem = io::probe_metadata(first.saved[1]);
  EXPECT_NE(problem, "") << "the damaged heap went unnoticed";
  std::printf("probe: %s\n", problem.substr(0, 200).c_str());
  const TrainResult r = train(config(data, llama(), dir, 3, 1, "latest"), *rt);
  EXPECT_EQ(r.resumed_from, first.saved[0]);
  EXPECT_TRUE(fs::exists(first.saved[1] + ".damaged"));
}

}  // namespace zp::test
