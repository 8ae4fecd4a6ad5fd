// Checkpoint I/O: save and load of a synthetic model of 1.0B parameters (fp32 master weights and
// both AdamW moments, as a training checkpoint holds them) with parallel HDF5, each rank writing and
// reading only its contiguous 1/N slice of every tensor, exactly as the trainer's checkpoints do.
// Reports save and load GB/s over the whole file and each phase's peak host RSS per rank next to the
// rank's shard. Runs on CPUs: `mpirun -np 1|2|5 build/bin/zp_bench_io [--dir D] [--params N]`.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint_file.h"

namespace {

double rss_peak_gib() { return zp::host_peak_rss_bytes() / double(1ull << 30); }
void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Tensor1 {
  std::string name;
  zp::Shape shape;
  int64_t numel() const { return zp::shape_numel(shape); }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string dir = "/tmp/zp_bench_io";
  int64_t target = 1'000'000'000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    if (std::strcmp(argv[i], "--params") == 0) target = std::stoll(argv[i + 1]);
  }
  // A GPT-like layout: 2048 wide, layers of 12 tensors, until the target is reached.
  std::vector<Tensor1> tensors{{"model.embed_tokens.weight", {50304, 2048}}};
  int64_t total = tensors[0].numel();
  for (int l = 0; total < target; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (auto t : std::vector<Tensor1>{{p + "attn.qkv.weight", {6144, 2048}}, {p + "attn.qkv.bias", {6144}},
                                       {p + "attn.out.weight", {2048, 2048}}, {p + "attn.out.bias", {2048}},
                                       {p + "mlp.up.weight", {8192, 2048}}, {p + "mlp.up.bias", {8192}},
                                       {p + "mlp.down.weight", {2048, 8192}}, {p + "mlp.down.bias", {2048}},
                                       {p + "ln1.weight", {2048}}, {p + "ln1.bias", {2048}},
                                       {p + "ln2.weight", {2048}}, {p + "ln2.bias", {2048}}}) {
      total += t.numel();
      tensors.push_back(t);
    }
  }
  // Each rank's shard: a contiguous 1/N of every tensor (the last rank takes the remainder).
  auto slice = [&](const Tensor1& t, int r) {
    const int64_t per = t.numel() / world, off = r * per;
    return std::pair<int64_t, int64_t>{off, r == world - 1 ? t.numel() - off : per};
  };
  int64_t shard = 0;
  for (auto& t : tensors) shard += slice(t, rank).second;
  const double shard_gib = 3.0 * 4.0 * double(shard) / double(1ull << 30);
  const double file_gb = 3.0 * 4.0 * double(total) / 1e9;

  // The rank's state, as the optimizer holds it: master weights and two moments.
  std::vector<float> state(size_t(3 * shard));
  for (size_t i = 0; i < state.size(); ++i) state[i] = float(i % 1000) * 1e-3f + float(rank);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/step-00000001.h5";
  const char* parts[3] = {"/model/", "/optimizer/", "/optimizer/"};
  const char* suffix[3] = {"", "/exp_avg", "/exp_avg_sq"};

  MPI_Barrier(MPI_COMM_WORLD);
  reset_rss_peak();
  auto t0 = std::chrono::steady_clock::now();
  {
    zp::io::CheckpointWriter w(path, MPI_COMM_WORLD);
    for (int k = 0; k < 3; ++k) {
      int64_t at = int64_t(k) * shard;
      for (auto& t : tensors) {
        auto [off, n] = slice(t, rank);
        w.write(std::string(parts[k]) + t.name + suffix[k], zp::DType::F32, t.shape, zp::DType::F32,
                state.data() + at, off, n);
        at += n;
      }
    }
    w.commit();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double save_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double save_rss = rss_peak_gib();

  // Load into fresh memory: drop the state first so the load's peak is its own.
  std::vector<float>().swap(state);
  std::vector<float> loaded(size_t(3 * shard));
  reset_rss_peak();
  t0 = std::chrono::steady_clock::now();
  {
    zp::io::CheckpointReader r(path, MPI_COMM_WORLD);
    for (int k = 0; k < 3; ++k) {
      int64_t at = int64_t(k) * shard;
      for (auto& t : tensors) {
        auto [off, n] = slice(t, rank);
        r.read(std::string(parts[k]) + t.name + suffix[k], t.shape, zp::DType::F32, loaded.data() + at, off, n);
        at += n;
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double load_rss = rss_peak_gib();
  bool ok = true;
  for (size_t i = 0; i < loaded.size() && ok; ++i)
    ok = loaded[i] == float(i % 1000) * 1e-3f + float(rank);

  std::vector<double> mine = {save_rss, load_rss, shard_gib, ok ? 1.0 : 0.0}, all(4 * size_t(world));
  MPI_Gather(mine.data(), 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("{\"benchmark\": \"checkpoint_io\", \"ranks\": %d, \"parameters\": %lld, \"file_GB\": %.2f, "
                "\"save_s\": %.2f, \"save_GBps\": %.2f, \"load_s\": %.2f, \"load_GBps\": %.2f, \"per_rank\": [",
                world, (long long)total, file_gb, save_s, file_gb / save_s, load_s, file_gb / load_s);
    for (int r = 0; r < world; ++r)
      std::printf("%s{\"rank\": %d, \"shard_GiB\": %.2f, \"save_peak_rss_GiB\": %.2f, \"load_peak_rss_GiB\": %.2f, "
                  "\"load_rss_over_shard_MiB\": %.0f, \"data_ok\": %s}",
                  r ? ", " : "", r, all[4 * r + 2], all[4 * r], all[4 * r + 1],
                  (all[4 * r + 1] - all[4 * r + 2]) * 1024.0, all[4 * r + 3] ? "true" : "false");
    std::printf("]}\n");
    std::filesystem::remove(path);
  }
  MPI_Finalize();
  return 0;
}
