// Checkpoint I/O: save and load of a synthetic model of 1.0B parameters (fp32 master weights and
// both AdamW moments, as a training checkpoint holds them) with parallel HDF5, each rank writing and
// reading only its contiguous 1/N slice of every tensor, exactly as the trainer's checkpoints do.
// Reports save and load GB/s over the whole file and each phase's peak host RSS per rank next to the
// rank's shard, beside what the disk itself does in the same run: a raw O_DIRECT write and read of the
// same bytes in the same folder (each rank its share, 64 MiB blocks from aligned buffers), and the
// ratios save/raw write and load/raw read. The page cache is kept out of every read: raw reads are
// O_DIRECT, and the checkpoint's cached pages are dropped (fsync + POSIX_FADV_DONTNEED) before the
// load. With --async, also an asynchronous save (checkpoint.async's path: the state copied at the
// save point, then written by a thread) under a synthetic training step (CPU work on a cache-resident
// buffer and an all-reduce, about 50 ms): the step's median time while the save is written against
// its median alone, and the copy's seconds at the save point.
// With --param-tier, instead: the NVMe parameter tier of stage 3 (offload_param.device = "nvme",
// parallel/nvme_parameter_shards.h) on the same layout's bf16 weights, each rank's 1/N shard of every
// layer: the gatherer's read pass (every shard in order, buffer_count - 1 read ahead; the second of
// two passes, so that no shard comes from a buffer's cache) and the optimizer's write pass (groups of
// buffer_count shards written behind), beside a raw O_DIRECT write and read of the same bytes.
// --repeats R runs the raw passes, the save and the load R times in turn (the async save in the first
// only): a virtual disk's own rate moves by a third from one minute to the next, so one pair of
// passes says little; the JSON then also lists each repeat's ratios and their medians.
// Runs on CPUs: `mpirun -np 1|2|5 build/bin/zp_bench_io [--dir D] [--params N] [--repeats R]
// [--async | --param-tier]`.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint_file.h"
#include "parallel/nvme_parameter_shards.h"

namespace {

double rss_peak_gib() { return zp::host_peak_rss_bytes() / double(1ull << 30); }
void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Tensor1 {
  std::string name;
  zp::Shape shape;
  int64_t numel() const { return zp::shape_numel(shape); }
};

// The upper median (0 for none): the step times' and the repeats' ratios.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "zp_bench_io: %s: %s\n", what.c_str(), std::strerror(errno));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// The disk's own speed for `bytes` split over the ranks: each rank writes (then reads) its share of
// one file with O_DIRECT in `block`-byte requests from an aligned buffer; wall seconds, all ranks.
struct Raw {
  double write_s = 0, read_s = 0;
};
Raw raw_odirect(const std::string& path, int64_t bytes, int rank, int world) {
  constexpr int64_t kAlign = 4096, kBlock = 64 << 20;
  const int64_t share = (bytes / world + kAlign - 1) / kAlign * kAlign, begin = share * rank;
  void* mem = nullptr;
  if (posix_memalign(&mem, kAlign, kBlock) != 0) die("posix_memalign");
  std::memset(mem, 0x5a, kBlock);
  Raw raw;
  for (int pass = 0; pass < 2; ++pass) {
    const bool write = pass == 0;
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    const int fd = ::open(path.c_str(), (write ? O_WRONLY | O_CREAT : O_RDONLY) | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) die(path + ": open with O_DIRECT");
    for (int64_t at = 0; at < share; at += kBlock) {
      const size_t n = size_t(std::min(kBlock, share - at));
      const ssize_t got = write ? ::pwrite(fd, mem, n, begin + at) : ::pread(fd, mem, n, begin + at);
      if (got != ssize_t(n)) die(path + (write ? ": pwrite" : ": pread"));
    }
    if (write && ::fsync(fd) != 0) die(path + ": fsync");
    ::close(fd);
    MPI_Barrier(MPI_COMM_WORLD);
    (write ? raw.write_s : raw.read_s) = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::free(mem);
  if (rank == 0) std::filesystem::remove(path);
  return raw;
}

// Writes the file's dirty pages and drops its cached ones, so that a read of it comes from the disk.
void drop_cached(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) die(path + ": open");
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// The NVMe parameter tier against the disk: bf16 blocks of `blocks` elements, each rank a 1/world
// shard of every block in its own swap file under `dir`, `buffers` host buffers.
void param_tier(const std::string& dir, const std::vector<int64_t>& blocks, int buffers, int rank, int world) {
  zp::parallel::NvmeSettings nvme;
  nvme.path = dir;
  nvme.path_key = "--dir";
  nvme.buffer_count = buffers;
  bool pinned = false;
  zp::parallel::NvmeParameterShards shards(nvme, /*gpu=*/false, pinned);
  int64_t mine = 0, total = 0;
  for (int64_t b : blocks) {
    const int64_t n = (b + world - 1) / world;
    const std::vector<zp::bf16> values(size_t(n), zp::bf16{float(rank)});
    shards.add("block", values.data(), zp::Device::cpu(), n, zp::DType::BF16, nullptr);
    mine += n;
    total += b;
  }
  shards.flush();
  const size_t count = shards.size();
  auto timed = [&](auto&& pass) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    MPI_Barrier(MPI_COMM_WORLD);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto read_pass = [&] {
    for (size_t i = 0; i < count; ++i) {
      for (size_t j = i + 1; j < std::min(count, i + size_t(buffers)); ++j) shards.read_ahead(j);
      shards.take(i);
      shards.release(i, nullptr);
    }
  };
  auto write_pass = [&] {
    for (size_t i = 0; i < count; i += size_t(buffers)) {
      std::vector<size_t> group;
      for (size_t j = i; j < std::min(count, i + size_t(buffers)); ++j) {
        shards.begin_write(j);
        group.push_back(j);
      }
      shards.commit(group, nullptr);
    }
    shards.flush();
  };
  timed(read_pass);
  const double read_s = timed(read_pass), write_s = timed(write_pass);
  const double gb = 2.0 * double(total) / 1e9;
  const Raw raw = raw_odirect(dir + "/raw-odirect.bin", 2 * total, rank, world);
  if (rank == 0)
    std::printf("{\"benchmark\": \"nvme_parameter_tier\", \"ranks\": %d, \"parameters\": %lld, \"blocks\": %zu, "
                "\"buffer_count\": %d, \"shard_GB_per_rank\": %.2f, \"read_GBps\": %.2f, \"raw_read_GBps\": %.2f, "
                "\"read_over_raw\": %.2f, \"write_GBps\": %.2f, \"raw_write_GBps\": %.2f, \"write_over_raw\": %.2f}\n",
                world, (long long)total, count, buffers, 2.0 * double(mine) / 1e9, gb / read_s, gb / raw.read_s,
                raw.read_s / read_s, gb / write_s, gb / raw.write_s, raw.write_s / write_s);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string dir = "/tmp/zp_bench_io";
  int64_t target = 1'000'000'000;
  bool async = false, tier = false;
  int repeats = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--async") == 0) async = true;
    if (std::strcmp(argv[i], "--param-tier") == 0) tier = true;
    if (i + 1 == argc) break;
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    if (std::strcmp(argv[i], "--params") == 0) target = std::stoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::max(1, std::atoi(argv[i + 1]));
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
  if (tier) {  // one block per layer (the embedding its own), as the model's sharding units
    std::vector<int64_t> blocks{tensors[0].numel()};
    for (size_t i = 1; i < tensors.size(); i += 12) {
      int64_t n = 0;
      for (size_t j = i; j < i + 12 && j < tensors.size(); ++j) n += tensors[j].numel();
      blocks.push_back(n);
    }
    std::filesystem::create_directories(dir);
    param_tier(dir, blocks, 5, rank, world);
    MPI_Finalize();
    return 0;
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

  std::filesystem::create_directories(dir);
  const std::string path = dir + "/step-00000001.h5";
  std::vector<double> save_ratios, load_ratios;
  double step_alone = 0, step_during = 0, snapshot_s = 0, commit_s = 0;  // --async, the first repeat's
  int steps_during = 0;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    // The rank's state, as the optimizer holds it: master weights and two moments.
    std::vector<float> state(size_t(3 * shard));
    for (size_t i = 0; i < state.size(); ++i) state[i] = float(i % 1000) * 1e-3f + float(rank);
    // The disk first, on the same bytes, while the state above is already resident.
    const Raw raw = raw_odirect(dir + "/raw-odirect.bin", int64_t(3 * 4 * total), rank, world);
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

    // The asynchronous save under a synthetic step.
    if (async && repeat == 0) {
      std::vector<float> work(size_t(1) << 18, 1.0f);
      int rounds = 1;
      auto step = [&] {
        const auto s0 = std::chrono::steady_clock::now();
        for (int r = 0; r < rounds; ++r)
          for (float& x : work) x = x * 0.9999f + 1e-4f;
        double v = work[0];
        MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      };
      rounds = 20;  // about 50 ms (rank 0's count for all), from the quickest of five tries
      double quickest = 1e9;
      for (int i = 0; i < 5; ++i) quickest = std::min(quickest, step());
      rounds = std::max(1, int(20 * 0.05 / std::max(1e-6, quickest)));
      MPI_Bcast(&rounds, 1, MPI_INT, 0, MPI_COMM_WORLD);
      std::vector<double> alone, during;
      std::vector<float> snapshot(state.size());  // the loop keeps its snapshot from one save to the next
      for (int i = 0; i < 10; ++i) alone.push_back(step());
      const std::string async_path = dir + "/step-00000002.h5";
      MPI_Barrier(MPI_COMM_WORLD);
      auto s0 = std::chrono::steady_clock::now();
      std::copy(state.begin(), state.end(), snapshot.begin());  // the save point's copy
      auto w = std::make_unique<zp::io::CheckpointWriter>(async_path, MPI_COMM_WORLD);
      for (int k = 0; k < 3; ++k) {
        int64_t at = int64_t(k) * shard;
        for (auto& t : tensors) {
          auto [off, n] = slice(t, rank);
          w->write_later(std::string(parts[k]) + t.name + suffix[k], zp::DType::F32, t.shape, zp::DType::F32,
                         snapshot.data() + at, off, n);
          at += n;
        }
      }
      w->start_writing();
      snapshot_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      for (int done = 0; !done;) {  // as the loop does: the ranks agree after each step
        during.push_back(step());
        done = w->written() ? 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &done, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      }
      s0 = std::chrono::steady_clock::now();
      w->commit();
      commit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      w.reset();
      if (rank == 0) std::filesystem::remove(async_path);
      step_alone = median(alone);
      step_during = median(during);
      steps_during = int(during.size());
    }

    // Load into fresh memory: drop the state first so the load's peak is its own.
    std::vector<float>().swap(state);
    std::vector<float> loaded(size_t(3 * shard));
    if (rank == 0) drop_cached(path);
    MPI_Barrier(MPI_COMM_WORLD);
    reset_rss_peak();
    t0 = std::chrono::steady_clock::now();
    {
      // As the trainer loads: a block's tensors (the embedding, then each layer's 12) for one kind of
      // state in one read_all.
      zp::io::CheckpointReader r(path, MPI_COMM_WORLD);
      for (int k = 0; k < 3; ++k) {
        int64_t at = int64_t(k) * shard;
        for (size_t b = 0, end = 1; b < tensors.size(); b = end, end = std::min(tensors.size(), end + 12)) {
          std::vector<zp::io::CheckpointReader::ReadRequest> reads;
          for (size_t i = b; i < end; ++i) {
            const auto& t = tensors[i];
            auto [off, n] = slice(t, rank);
            reads.push_back({std::string(parts[k]) + t.name + suffix[k], t.shape, zp::DType::F32,
                             loaded.data() + at, off, n});
            at += n;
          }
          r.read_all(reads);
        }
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double load_rss = rss_peak_gib();
    bool ok = true;
    for (size_t i = 0; i < loaded.size() && ok; ++i)
      ok = loaded[i] == float(i % 1000) * 1e-3f + float(rank);
    save_ratios.push_back(raw.write_s / save_s);
    load_ratios.push_back(raw.read_s / load_s);
    if (repeat + 1 < repeats) {  // the last repeat's figures are reported below
      int all_ok = ok ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      if (!all_ok) die("repeat " + std::to_string(repeat) + ": the loaded state differs from the saved one");
      continue;
    }

    std::vector<double> mine = {save_rss, load_rss, shard_gib, ok ? 1.0 : 0.0}, all(4 * size_t(world));
    MPI_Gather(mine.data(), 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("{\"benchmark\": \"checkpoint_io\", \"ranks\": %d, \"parameters\": %lld, \"file_GB\": %.2f, "
                  "\"save_s\": %.2f, \"save_GBps\": %.2f, \"raw_write_GBps\": %.2f, \"save_over_raw\": %.2f, "
                  "\"load_s\": %.2f, \"load_GBps\": %.2f, \"raw_read_GBps\": %.2f, \"load_over_raw\": %.2f, "
                  "\"per_rank\": [",
                  world, (long long)total, file_gb, save_s, file_gb / save_s, file_gb / raw.write_s,
                  raw.write_s / save_s, load_s, file_gb / load_s, file_gb / raw.read_s, raw.read_s / load_s);
      for (int r = 0; r < world; ++r)
        std::printf("%s{\"rank\": %d, \"shard_GiB\": %.2f, \"save_peak_rss_GiB\": %.2f, \"load_peak_rss_GiB\": %.2f, "
                    "\"load_rss_over_shard_MiB\": %.0f, \"data_ok\": %s}",
                    r ? ", " : "", r, all[4 * r + 2], all[4 * r], all[4 * r + 1],
                    (all[4 * r + 1] - all[4 * r + 2]) * 1024.0, all[4 * r + 3] ? "true" : "false");
      std::printf("]");
      if (async)
        std::printf(", \"async\": {\"step_ms\": %.1f, \"step_during_save_ms\": %.1f, \"step_ratio\": %.2f, "
                    "\"steps_during_save\": %d, \"snapshot_s\": %.2f, \"commit_s\": %.2f}",
                    step_alone * 1e3, step_during * 1e3, step_during / step_alone, steps_during, snapshot_s, commit_s);
      if (repeats > 1) {
        auto list = [](const std::vector<double>& v) {
          std::string out;
          char buf[32];
          for (double x : v) {
            std::snprintf(buf, sizeof buf, "%s%.2f", out.empty() ? "" : ", ", x);
            out += buf;
          }
          return out;
        };
        std::printf(", \"repeats\": %d, \"save_over_raw_runs\": [%s], \"load_over_raw_runs\": [%s], "
                    "\"save_over_raw_median\": %.2f, \"load_over_raw_median\": %.2f",
                    repeats, list(save_ratios).c_str(), list(load_ratios).c_str(), median(save_ratios),
                    median(load_ratios));
      }
      std::printf("}\n");
      std::filesystem::remove(path);
    }
  }
  MPI_Finalize();
  return 0;
}
