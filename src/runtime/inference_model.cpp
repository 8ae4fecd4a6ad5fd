#include "runtime/inference_model.h"

#include <filesystem>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/topology.h"
#include "core/log.h"
#include "core/error.h"
#include "core/progress_meter.h"
#include "io/h5file.h"
#include "io/lora_merged_weights.h"
#include "io/tokenizer_files.h"
#include "io/weight_source.h"
#include "parallel/collective_stream.h"
#include "parallel/parameter_gatherer.h"
#include "parallel/zero_engine.h"

namespace zp::runtime {
namespace fs = std::filesystem;

Device inference_device(const std::string& name) {
  ZP_REQUIRE(name == "cpu" || name == "cuda" || name == "auto", "--device must be cpu, cuda or auto, got '", name, "'");
  if (name == "cpu" || (name == "auto" && cuda_device_count() == 0)) return Device::cpu();
  ZP_REQUIRE(cuda_device_count() > 0, "--device cuda: ", cuda_unavailable_reason());
  // Under mpirun each rank has the GPU bootstrap chose for it (local rank % GPUs).
  if (const comm::Runtime* rt = comm::Runtime::current(); rt && rt->device().is_cuda()) return rt->device();
  return Device::cuda(0);
}

DType inference_dtype(const std::string& name, Device dev) {
  if (name == "auto") return dev.is_cuda() ? DType::BF16 : DType::F32;
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::F16;
  ZP_REQUIRE(name == "fp64", "--dtype must be fp32, bf16, fp16 or auto (or fp64 on the cpu), got '", name, "'");
  ZP_REQUIRE(!dev.is_cuda(), "--dtype fp64 runs on the cpu only");
  return DType::F64;
}

namespace {

// A hub folder's own tokenizer files, if it has any.
bool has_tokenizer_files(const fs::path& dir) {
  for (const char* f : {"tokenizer.json", "vocab.json", "encoder.json"})
    if (fs::exists(dir / f)) return true;
  return false;
}

}  // namespace

InferenceModel::InferenceModel(const InferenceModelOptions& o) : source_(o.model) {
  ZP_REQUIRE(!o.model.empty(), "--model: a hub folder, a weights .h5 or a checkpoint .h5 is needed");
  ZP_REQUIRE(fs::exists(o.model), o.model, ": no such file or folder");
  dev_ = inference_device(o.device);
  dt_ = inference_dtype(o.dtype, dev_);
  if (io::is_h5_path(o.model)) {
    io::H5File f = io::H5File::open(o.model);
    ZP_REQUIRE(!f.has_attr("/", "lora"), o.model,
               ": a LoRA checkpoint holds adapters, not a whole model; give the base as --model and this "
               "file as --lora");
  }
  const io::json hub = io::hub_config_of(o.model);
  ZP_REQUIRE(!hub.contains("_class_name"), o.model, ": a ", hub.value("_class_name", std::string("diffusers")),
             " model; generation and evaluation serve language models (GPT-2, Llama, Qwen2)");
  const std::string where = io::is_h5_path(o.model) ? o.model : (fs::path(o.model) / "config.json").string();
  const models::TransformerConfig cfg = models::TransformerConfig::from_hub_json(hub, where);
  if (dev_.is_cuda()) {
    stream_ = Stream(dev_);
    s_ = stream_.handle();
  }
  std::unique_ptr<io::WeightSource> weights = io::WeightSource::open(o.model, "model");
  const io::LoraMergedWeights* merged = nullptr;
  if (!o.lora.empty()) {
    io::LoraAdapter adapter = io::LoraMergedWeights::read_adapter(o.lora, *weights);
    auto m = std::make_unique<io::LoraMergedWeights>(std::move(weights), std::move(adapter));
    merged = m.get();
    weights = std::move(m);
  }
  ZP_REQUIRE(o.offload_param == "none" || o.offload_param == "cpu" || o.offload_param == "nvme",
             "--offload-param must be none, cpu or nvme, got '", o.offload_param, "'");
  ZP_REQUIRE(o.offload_param == "nvme" || o.nvme_path.empty(), "--nvme-path '", o.nvme_path,
             "' needs --offload-param nvme (got '", o.offload_param, "')");
  ZP_REQUIRE(o.offload_param != "nvme" || !o.nvme_path.empty(),
             "--offload-param nvme needs --nvme-path DIR: the directory of the weights' swap file");
  if (o.shard_weights) {
    int mpi_up = 0;
    ZP_MPI_CHECK(MPI_Initialized(&mpi_up));
    ZP_REQUIRE(mpi_up, "--shard-weights shards the weights over the ranks of an mpirun: MPI is not initialised");
    ZP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &weight_shards_));
    world_ = comm::make_communicator(dev_.is_cuda() ? comm::Backend::Nccl : comm::Backend::Mpi, MPI_COMM_WORLD);
    ZP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &control_));
  }
  if (o.offload_param == "none" && !o.shard_weights) {
    model_ = std::make_unique<models::Transformer>(cfg, dev_, dt_, s_);
  } else {
    // One block at a time, and of each block only this rank's slice is read from the files, then
    // kept on the device, in pinned host memory or in its extent of the swap file.
    model_ = std::make_unique<models::Transformer>(cfg, dev_, dt_, s_, parallel::shard_pad_multiple(weight_shards_),
                                                   /*allocate=*/false);
    collective_ = std::make_unique<parallel::CollectiveStream>(world_.get(), s_);
    collective_->set_overlap(true);  // a GPU's gathers on their own stream, so the next one overlaps compute
    const bool nvme = o.offload_param == "nvme";
    parallel::NvmeSettings swap;  // DeepSpeed's aio defaults: 1 MiB requests, 8 in flight
    swap.path = o.nvme_path;
    swap.path_key = "--nvme-path";
    swap.buffer_count = o.nvme_buffer_count;
    std::error_code ec;  // a directory that cannot be made shows when the swap file is created, named
    if (nvme) fs::create_directories(o.nvme_path, ec);
    const parallel::StateTier tier = nvme                           ? parallel::StateTier::Nvme
                                     : o.offload_param == "cpu" ? parallel::StateTier::PinnedHost
                                                                : parallel::StateTier::Device;
    gatherer_ = std::make_unique<parallel::ParameterGatherer>(world_.get(), *collective_, tier, true, swap);
  }
  // Transformer::load's walk (no adapters here), block by block so that a large model shows its
  // progress on rank 0; a small one prints nothing.
  auto block_bytes = [](const nn::ParamBlock& b) { return double(b.padded()) * double(dtype_size(b.dtype())); };
  double model_bytes = 0, loaded_bytes = 0;
  for (const nn::ParamBlock* b : model_->blocks()) model_bytes += block_bytes(*b);
  ProgressMeter progress("loading " + o.model, model_bytes, "GB");
  for (nn::ParamBlock* b : model_->blocks()) {
    if (gatherer_) {
      // Only this rank's slice of the block is read from the files (and only it is ever in memory).
      const int64_t n = b->padded() / gatherer_->world();
      Tensor slice = Tensor::zeros({n}, b->dtype(), Device::cpu(), "load");
      model_->load_block_slice(*weights, *b, gatherer_->rank() * n, slice);
      gatherer_->add_slice(*b, slice);
    } else {
      model_->load_block(*weights, *b);
    }
    loaded_bytes += block_bytes(*b);
    progress.update(loaded_bytes);
  }
  weight_bytes_read_ = weights->bytes_read();
  if (gatherer_) model_->set_block_access(gatherer_.get());
  if (o.shard_weights) {
    const char* where = o.offload_param == "nvme"                    ? "a swap file per rank"
                        : !dev_.is_cuda()                            ? "host memory"
                        : o.offload_param == "cpu"                   ? "pinned host memory"
                                                                     : "GPU memory";
    ZP_LOG_INFO("weights sharded over ", weight_shards_, " rank", weight_shards_ == 1 ? "" : "s", ": ",
                double(resident_weight_bytes()) / 1e6, " MB of the model's ", model_bytes / 1e6, " MB per rank, in ",
                where, "; every block gathered for its use");
  }
  if (merged) {
    const std::vector<std::string> left = merged->unmerged_modules();
    ZP_REQUIRE(left.empty(), o.lora, ": adapts module '", left.empty() ? "" : left.front(), "', whose weight ",
               o.model, "'s model does not use");
  }

  if (!o.tokenizer.empty()) {
    tokenizer_source_ = o.tokenizer;
  } else if (!io::is_h5_path(o.model) && has_tokenizer_files(o.model)) {
    tokenizer_source_ = o.model;
  }
  if (!tokenizer_source_.empty()) {
    tokenizer_ = std::make_unique<io::BpeTokenizer>(io::load_tokenizer(tokenizer_source_));
    // Ids the tokenizer makes must be rows of the embedding; unused added tokens past it are fine
    // until one is produced (checked where ids are made).
    ZP_REQUIRE(tokenizer_->vocab_size() > 0, tokenizer_source_, ": an empty vocabulary");
  }
}

InferenceModel::~InferenceModel() {
  if (model_) model_->set_block_access(nullptr);
  gatherer_.reset();  // before the stream it orders work on
  collective_.reset();
  world_.reset();
  if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
}

int64_t InferenceModel::resident_weight_bytes() const {
  if (gatherer_) return int64_t(gatherer_->shard_bytes());
  int64_t n = 0;
  for (const nn::ParamBlock* b : model_->blocks()) n += b->padded() * int64_t(dtype_size(b->dtype()));
  return n;
}

bool InferenceModel::any_rank_forwarding(bool mine) {
  int m = mine ? 1 : 0, any = 0;
  ZP_MPI_CHECK(MPI_Allreduce(&m, &any, 1, MPI_INT, MPI_LOR, control_));
  return any != 0;
}

void InferenceModel::join_until_every_rank_is_done() {
  if (control_ == MPI_COMM_NULL) return;
  while (any_rank_forwarding(false)) {
    begin_forward();
    model_->forward_without_tokens();
  }
}

int64_t InferenceModel::streamed_bytes_per_forward() const {
  // From NVMe every forward reads the weights from the disk, on a CPU as well.
  if (gatherer_ && gatherer_->tier() == parallel::StateTier::Nvme) return int64_t(gatherer_->shard_bytes());
  // Sharded on the device: the gathers move the weights between GPUs, none from host memory.
  const bool on_host = gatherer_ && gatherer_->tier() != parallel::StateTier::Device;
  return on_host && dev_.is_cuda() ? int64_t(gatherer_->shard_bytes()) : 0;
}

void InferenceModel::begin_forward() {
  if (gatherer_) gatherer_->begin_step();
}

}  // namespace zp::runtime
