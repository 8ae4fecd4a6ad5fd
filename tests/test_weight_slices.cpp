// Slice reads for sharded loading (issue 13): a rank of `--shard-weights` reads only its slice of each
// block. A range read of a tensor must equal that range of a whole read for every dtype the files
// store and every dtype a model loads as, from safetensors (plain and transposed Conv1D weights) and
// from HDF5; a block's slice must equal that range of the whole block, with slice bounds that cut
// tensors mid-way; and the bytes a rank reads must be about 1/N of the model, not all of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "io/checkpoint_file.h"
#include "kernels/elementwise.h"
#include "io/safetensors.h"
#include "io/weight_source.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "test_util.h"

namespace zp::test {
namespace {

const std::vector<DType> kFileDtypes = {DType::F32, DType::BF16, DType::F16, DType::F64};
const std::vector<DType> kModelDtypes = {DType::F32, DType::BF16, DType::F16, DType::F64};

// Writes every tensor of `from` (as `stored`, engine layout) to an .h5 weights file in pieces of
// `piece` elements, so that its checksum slices are small and a range read widens by little.
void write_h5_weights(const io::WeightSource& from, const std::string& path, DType stored, int64_t piece,
                      const std::vector<std::string>& transposed = {}) {
  io::CheckpointWriter w(path);
  w.file().set_attr_string("/", "kind", "weights");
  w.file().set_attr_string("/", "config", from.config().dump());
  w.file().create_group("/model");
  for (const std::string& name : from.names()) {
    const bool t = std::find(transposed.begin(), transposed.end(), name) != transposed.end();
    const Tensor v = from.read(name, stored, t);
    const std::string ds = "/model/" + name;
    const char* data = static_cast<const char*>(v.data());
    if (v.numel() == 0) w.write(ds, stored, v.shape(), stored, data, 0, 0);
    for (int64_t at = 0; at < v.numel(); at += piece)
      w.write(ds, stored, v.shape(), stored, data + at * int64_t(dtype_size(stored)), at,
              std::min(piece, v.numel() - at));
    if (t) w.file().set_attr_int(ds, "hub_transposed", 1);
  }
  w.commit();
}

// Distinct values that every float dtype holds exactly (small integers over 8), so the conversions
// under test are what differs, not rounding.
Tensor values(const Shape& shape, int salt) {
  Tensor t = Tensor::empty(shape, DType::F64, Device::cpu(), "test");
  double* p = static_cast<double*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = double((i * 7 + salt) % 97 - 48) / 8.0;
  return t;
}

Tensor as(const Tensor& t, DType dt) {
  Tensor out = Tensor::empty(t.shape(), dt, Device::cpu(), "test");
  kernels::cpu::cast(nullptr, dt, out.data(), t.dtype(), t.data(), t.numel());
  return out;
}

// Ranges of a tensor of n elements whose rows have `row` elements: whole, a row's middle, across
// rows, a single element, the tail, and empty.
std::vector<std::pair<int64_t, int64_t>> ranges(int64_t n, int64_t row) {
  return {{0, n}, {1, row - 2}, {row / 2, row + 3}, {n - 1, 1}, {n / 3, n - n / 3}, {5, 0}};
}

TEST(WeightSlices, RangeReadsEqualWholeReadsForEveryDtype) {
  ScratchFolder dir("weight_slices");
  for (DType stored : kFileDtypes) {
    // "plain.weight" [6, 10] as the hub has it; "conv.weight" stored [in 9, out 5] (GPT-2's Conv1D),
    // [5, 9] in the engine's layout; "bias" 1-d.
    const std::string hub = dir / ("hub_" + std::string(dtype_name(stored)));
    std::filesystem::create_directories(hub);
    io::write_safetensors(hub + "/model.safetensors", {{"plain.weight", as(values({6, 10}, 1), stored)},
                                                   {"conv.weight", as(values({9, 5}, 2), stored)},
                                                   {"bias", as(values({37}, 3), stored)}});
    { std::ofstream(hub + "/config.json") << "{\"model_type\": \"test\"}"; }
    const std::string h5 = dir / ("weights_" + std::string(dtype_name(stored)) + ".h5");
    write_h5_weights(*io::WeightSource::open(hub, "model"), h5, stored, 4, {"conv.weight"});
    for (const std::string& path : {hub, h5}) {
      const auto src = io::WeightSource::open(path, "model");
      for (DType dt : kModelDtypes) {
        for (const auto& [name, transposed] :
             std::vector<std::pair<std::string, bool>>{{"plain.weight", false}, {"conv.weight", true}, {"bias", false}}) {
          const Tensor whole = src->read(name, dt, transposed);
          const int64_t row = whole.dim() == 2 ? whole.size(1) : 8;
          for (const auto& [first, count] : ranges(whole.numel(), row)) {
            std::vector<char> got(size_t(count) * dtype_size(dt) + 1, 0x5a);
            const int64_t before = src->bytes_read();
            src->read_range(name, dt, transposed, first, count, got.data());
            const int64_t read = src->bytes_read() - before;
            const std::string what = path + " " + name + " as " + std::string(dtype_name(dt)) + " [" + std::to_string(first) +
                                     ", +" + std::to_string(count) + ")";
            EXPECT_EQ(std::memcmp(got.data(), static_cast<const char*>(whole.data()) + first * dtype_size(dt),
                                  size_t(count) * dtype_size(dt)),
                      0)
                << what;
            EXPECT_EQ(got.back(), 0x5a) << what << ": wrote past the range";
            // Only about the range is read: a transposed weight reads whole stored rows of the columns
            // it needs (one engine row either side at most), HDF5 widens to its 4-element checksum
            // slices.
            const int64_t esize = int64_t(dtype_size(stored));
            const int64_t slack = transposed ? 2 * row : 8;
            EXPECT_LE(read, (count + slack) * esize) << what;
            if (count > 0) EXPECT_GE(read, count * esize) << what;
          }
          expect_error([&] { std::vector<char> b(64); src->read_range(name, dt, transposed, whole.numel() - 1, 2, b.data()); },
                       {path, name, "outside"});
        }
      }
    }
  }
}

// Block slices of the golden models, on N = 2 and 3 "ranks" (each with its own source, so its bytes
// are its own), from the hub folder and from an .h5 holding bf16 (a conversion on every load).
TEST(WeightSlices, BlockSlicesEqualTheWholeBlockAndEachRankReadsItsShare) {
  ScratchFolder dir("weight_slices_blocks");
  constexpr int64_t kPiece = 64;
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    const std::string hub = golden_path(model);
    const io::json hub_cfg = io::hub_config_of(hub);
    const models::TransformerConfig cfg = models::TransformerConfig::from_hub_json(hub_cfg, hub);
    const std::string h5 = dir / (std::string(model) + ".h5");
    {
      // The model knows which tensors the hub stores transposed.
      models::Transformer probe(cfg, Device::cpu(), DType::F32);
      std::vector<std::string> transposed;
      for (nn::Parameter* p : probe.parameters())
        if (p->file_transposed) transposed.push_back(p->name);
      write_h5_weights(*io::WeightSource::open(hub, "model"), h5, DType::BF16, kPiece, transposed);
    }
    for (const std::string& path : {hub, h5}) {
      for (DType dt : kModelDtypes) {
        for (int world : {2, 3}) {
          models::Transformer whole(cfg, Device::cpu(), dt, nullptr, parallel::shard_pad_multiple(world));
          const auto all = io::WeightSource::open(path, "model");
          whole.load(*all);
          std::vector<int64_t> rank_bytes;
          int64_t cut_tensors = 0, slack = 0;
          for (int rank = 0; rank < world; ++rank) {
            models::Transformer sharded(cfg, Device::cpu(), dt, nullptr, parallel::shard_pad_multiple(world),
                                        /*allocate=*/false);
            const auto mine = io::WeightSource::open(path, "model");
            const std::vector<nn::ParamBlock*> wb = whole.blocks(), sb = sharded.blocks();
            ASSERT_EQ(wb.size(), sb.size());
            for (size_t i = 0; i < sb.size(); ++i) {
              const int64_t n = sb[i]->padded() / world;
              Tensor slice = Tensor::zeros({n}, dt, Device::cpu(), "test");
              sharded.load_block_slice(*mine, *sb[i], rank * n, slice);
              EXPECT_EQ(std::memcmp(slice.data(), wb[i]->values().flat(rank * n, n).data(), slice.nbytes()), 0)
                  << path << " " << dtype_name(dt) << " block " << sb[i]->name() << " rank " << rank << " of "
                  << world;
              for (const auto& p : sb[i]->params()) {
                const int64_t lo = p->offset, hi = p->offset + p->numel();
                if (lo < rank * n && rank * n < hi) ++cut_tensors;  // the slice starts mid-tensor
                slack += 2 * std::max<int64_t>(kPiece, p->shape.back()) * 4;
              }
            }
            rank_bytes.push_back(mine->bytes_read());
          }
          EXPECT_GT(cut_tensors, 0) << "no slice bound cuts a tensor: the test would not test that";
          const int64_t total = all->bytes_read();
          const int64_t sum = std::accumulate(rank_bytes.begin(), rank_bytes.end(), int64_t(0));
          EXPECT_GE(sum, total) << path;
          for (int rank = 0; rank < world; ++rank) {
            EXPECT_LE(rank_bytes[rank], total / world + slack / world) << path << " rank " << rank << " of " << world;
            EXPECT_LT(rank_bytes[rank], total * 3 / 4) << path << " rank " << rank << " of " << world;
          }
          if (dt == DType::F32)
            std::printf("%s over %d ranks: the whole model reads %lld bytes, each rank %lld..%lld\n", path.c_str(),
                        world, (long long)total, (long long)*std::min_element(rank_bytes.begin(), rank_bytes.end()),
                        (long long)*std::max_element(rank_bytes.begin(), rank_bytes.end()));
        }
      }
    }
  }
}

}  // namespace
}  // namespace zp::test
