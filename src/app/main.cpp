// zeropipe: the command-line entry point. Each subcommand parses its own options
// (Boost.ProgramOptions); bad input is reported as one clear line and a non-zero exit.
#include <boost/program_options.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "app/chat_command.h"
#include "app/convert.h"
#include "app/eval_command.h"
#include "app/generate_command.h"
#include "app/inspect_command.h"
#include "app/make_latents.h"
#include "app/parity.h"
#include "app/plan_command.h"
#include "app/report_command.h"
#include "app/tokenize_command.h"
#include "comm/bootstrap.h"
#include "core/error.h"
#include "core/log.h"
#include "io/config.h"
#include "runtime/diffusion_training.h"
#include "runtime/lm_training.h"
#include "runtime/stop_signals.h"
#include "runtime/train_config.h"

namespace po = boost::program_options;

namespace {

// Exit statuses of `zeropipe train` (README, "Keeping your work"): 0 done; 1 an error (bad input,
// a damaged file, a full disk, a failed rank); 2 a command-line error; 3 training diverged;
// runtime::kExitStopped (75) stopped by a signal with a checkpoint written; 128 + N a second signal N.
constexpr int kExitDiverged = 3;

const char* kUsage =
    "usage: zeropipe <command> [options]\n"
    "commands:\n"
    "  train    train a model: zeropipe train --config FILE [--set key.path=value ...] [--resume FILE|latest]\n"
    "  convert  hub folder (safetensors) <-> weights HDF5 file, or a checkpoint's model out to either:\n"
    "           zeropipe convert --from X --to Y [--dtype bf16|fp16|fp32|keep]\n"
    "           a LoRA checkpoint to PEFT's (LMs) or diffusers' (UNets) adapter folder: --from CKPT.h5 --to DIR\n"
    "           an adapter merged into its base: --merge-lora ADAPTER [--from BASE] --to OUT\n"
    "  make-latents  write a small latent dataset for a UNet (the UNet demo's data)\n"
    "  inspect  list and check a checkpoint or weights file: zeropipe inspect FILE [--verify]\n"
    "  plan     memory per rank and node on each tier, whether it fits, and the cheapest change if not:\n"
    "           zeropipe plan --config FILE [--world N] [--gpu-memory 24GiB] [--host-memory 64GiB]\n"
    "                         [--nvme-free 1TiB]\n"
    "  tokenize text or JSONL -> a token file for train, through a Hugging Face or GPT-2 tokenizer:\n"
    "           zeropipe tokenize --tokenizer DIR|tokenizer.json --in FILE --out FILE [--append-eos]\n"
    "           [--format instruct --chat-template auto|llama3|chatml|plain]\n"
    "  generate prompts (JSONL) -> completions (JSONL) with a paged KV cache and continuous batching:\n"
    "           zeropipe generate --model DIR|FILE.h5 --prompts in.jsonl --out out.jsonl [--device cpu|cuda]\n"
    "  chat     a conversation on stdin/stdout in the model's chat format: zeropipe chat --model DIR\n"
    "  parity   run a reference folder (hub config, weights, io.safetensors) and hold every tensor to\n"
    "           the parity criterion (its reference_error.json); exit 0 exactly when all gated pass\n"
    "  eval     lm-evaluation-harness-style scores on JSONL task files (under mpirun: requests shared by ranks):\n"
    "           zeropipe eval --model DIR|FILE.h5 --tasks FILE... [--out results.json] [--limit N]\n"
    "  report   a run's metrics files as one HTML page with charts (loss, lr, speed, memory, time):\n"
    "           zeropipe report metrics.jsonl [more.jsonl ...] [--out report.html]\n"
    "run `zeropipe <command> --help` for the command's options\n";

// Parses argv against `desc` (and the positional `pos`) into `vm`; false when --help was given,
// after printing the options. A missing required option or a bad value throws po::error.
bool parse_options(int argc, char** argv, const po::options_description& desc, po::variables_map& vm,
                   const po::positional_options_description& pos = {}) {
  po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).run(), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return false;
  }
  po::notify(vm);
  return true;
}

int cmd_parity(int argc, char** argv) {
  zp::app::ParityOptions o;
  po::options_description desc("zeropipe parity options");
  desc.add_options()("help,h", "show this help")(
      "model", po::value<std::string>(&o.model_dir)->required(),
      "reference folder (config.json, weights, io.safetensors); also as the one positional argument")(
      "device", po::value<std::string>(&o.device)->default_value("cpu"), "cpu | cuda")(
      "dtype", po::value<std::string>(&o.dtype)->default_value("fp32"), "fp32 | bf16 | fp64 (cpu only)");
  po::positional_options_description pos;  // `zeropipe parity tests/golden/gpt2-tiny`, as `inspect FILE`
  pos.add("model", 1);
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm, pos)) return 0;
  return zp::app::run_parity(o).finish();
}

int cmd_convert(int argc, char** argv) {
  zp::app::ConvertOptions o;
  po::options_description desc("zeropipe convert options");
  desc.add_options()("help,h", "show this help")(
      "from", po::value<std::string>(&o.from),
      "hub folder, weights .h5 file, training checkpoint .h5 or LoRA checkpoint .h5; with --merge-lora the base "
      "weights (default: the base the adapter names)")(
      "to", po::value<std::string>(&o.to)->required(),
      "weights .h5 file (a name ending in .h5) or hub folder; for a LoRA checkpoint the adapter folder")(
      "merge-lora", po::value<std::string>(&o.merge_lora),
      "LoRA checkpoint .h5, PEFT adapter folder, or diffusers / kohya-ss .safetensors (file or folder) to merge "
      "into the base weights: W + scale * B A")(
      "dtype", po::value<std::string>(&o.dtype)->default_value("keep"), "keep | bf16 | fp16 | fp32")(
      "force", po::bool_switch(&o.force), "replace an existing destination");
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm)) return 0;
  return zp::app::run_convert(o);
}

int cmd_inspect(int argc, char** argv) {
  std::string path;
  bool verify = false;
  po::options_description desc("zeropipe inspect options");
  desc.add_options()("help,h", "show this help")("file", po::value<std::string>(&path)->required(),
                                                 "checkpoint or weights file")(
      "verify", po::bool_switch(&verify), "re-read every dataset and compare its stored checksums");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm, pos)) return 0;
  return zp::app::run_inspect(path, verify);
}

int cmd_report(int argc, char** argv) {
  zp::app::ReportOptions o;
  po::options_description desc(
      "zeropipe report: metrics JSONL files of zeropipe train (training.metrics_file) -> one self-contained\n"
      "HTML page with charts; each file is one series, labelled by its name.\n"
      "  zeropipe report runs/metrics.jsonl runs/metrics.jsonl.1 --out report.html\n"
      "options");
  desc.add_options()("help,h", "show this help")(
      "metrics", po::value<std::vector<std::string>>(&o.inputs)->required()->composing(),
      "metrics JSONL files (the positional arguments)")(
      "out", po::value<std::string>(&o.out), "HTML file to write (default: report.html beside the first file)");
  po::positional_options_description pos;
  pos.add("metrics", -1);
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm, pos)) return 0;
  return zp::app::run_report(o);
}

int cmd_make_latents(int argc, char** argv) {
  std::string out, model;
  int64_t samples = 512;
  uint64_t seed = 1234;
  po::options_description desc("zeropipe make-latents options");
  desc.add_options()("help,h", "show this help")("out", po::value<std::string>(&out)->required(),
                                                 "HDF5 latent dataset to write")(
      "model", po::value<std::string>(&model)->required(),
      "the UNet: inline config JSON, a diffusers folder, its config.json, or a training config")(
      "samples", po::value<int64_t>(&samples)->default_value(512), "number of samples")(
      "seed", po::value<uint64_t>(&seed)->default_value(1234), "seed");
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm)) return 0;
  return zp::app::make_latents(out, model, samples, seed);
}

int cmd_plan(int argc, char** argv) {
  zp::app::PlanOptions o;
  po::options_description desc("zeropipe plan options");
  desc.add_options()("help,h", "show this help")("config", po::value<std::string>(&o.config)->required(),
                                                 "training configuration (as for train)")(
      "set", po::value<std::vector<std::string>>(&o.sets)->composing(), "override a key: --set key.path=value")(
      "world", po::value<int>(&o.world)->default_value(1), "ranks (GPUs) in the run")(
      "ranks-per-node", po::value<int>(&o.ranks_per_node)->default_value(0), "ranks sharing a node (default: all)")(
      "gpu-memory", po::value<std::string>(&o.gpu_memory), "memory of each GPU, e.g. 24GiB")(
      "host-memory", po::value<std::string>(&o.host_memory), "host memory of a node, e.g. 64GiB")(
      "nvme-free", po::value<std::string>(&o.nvme_free), "free space under a node's nvme_path, e.g. 1TiB");
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm)) return 0;
  return zp::app::run_plan(o);
}

int cmd_tokenize(int argc, char** argv) {
  zp::app::TokenizeOptions o;
  po::options_description desc(
      "zeropipe tokenize: text or JSONL in, a token file out (the layout train's data.train_files read).\n"
      "Documents are separated by the tokenizer's EOS: a text file is one document (one per line with\n"
      "--per-line), each JSONL record's field is one.\n"
      "  zeropipe tokenize --tokenizer hub-folder/ --in corpus.jsonl --out train.bin\n"
      "Instruction records (loss on the responses only) for fine-tuning:\n"
      "  zeropipe tokenize --format instruct --chat-template auto --tokenizer hub-folder/ --in sft.jsonl --out sft.zpin\n"
      "options");
  desc.add_options()("help,h", "show this help")(
      "tokenizer", po::value<std::string>(&o.tokenizer)->required(),
      "tokenizer.json, or a folder holding it or GPT-2's vocab.json + merges.txt (encoder.json + vocab.bpe); "
      "tokenizer_config.json beside it gives BOS and EOS")(
      "in", po::value<std::string>(&o.in)->required(), "input: *.jsonl (or *.ndjson) is JSONL, anything else text")(
      "out", po::value<std::string>(&o.out)->required(), "token file to write")(
      "field", po::value<std::string>(&o.field)->default_value("text"), "JSONL: the records' text field")(
      "per-line", po::bool_switch(&o.per_line), "text: each non-empty line is a document")(
      "append-eos", po::bool_switch(&o.append_eos), "end the last document with EOS too")(
      "add-special", po::bool_switch(&o.add_special),
      "put the tokenizer's own tokens around each document (Llama 3: BOS), as add_special_tokens does")(
      "format", po::value<std::string>(&o.format)->default_value("text"),
      "text: documents -> a token file; instruct: JSONL instruction records ({\"prompt\",\"response\"} or "
      "{\"messages\":[{\"role\",\"content\"},...]}) -> an instruction token file for data.format \"instruct\"")(
      "chat-template", po::value<std::string>(&o.chat_template)->default_value("auto"),
      "--format instruct: auto (from the tokenizer's special tokens), llama3, chatml or plain");
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm)) return 0;
  return zp::app::run_tokenize(o);
}

// Runs a command on every rank of the job. Errors the ranks agreed on (bad input every rank reads,
// a full disk, a damaged checkpoint) reach every rank within moments: each has cleaned up (no
// temporary file left) and the job ends normally. An error seen by one rank only must not leave the
// others waiting in a collective: it aborts them.
int on_every_rank(const char* name, int& argc, char**& argv, const std::function<int(zp::comm::Runtime&)>& run) {
  zp::comm::Runtime rt(&argc, &argv);
  try {
    return run(rt);
  } catch (const zp::Error& e) {
    const int status = dynamic_cast<const zp::runtime::TrainingDiverged*>(&e) ? kExitDiverged : 1;
    if (rt.all_ranks_failed(10.0)) {
      if (rt.rank() == 0) std::fprintf(stderr, "zeropipe %s: error: %s\n", name, e.what());
      return status;
    }
    std::fprintf(stderr, "zeropipe %s: error on rank %d (%s): %s\n", name, rt.rank(), rt.host().c_str(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
    return status;
  }
}

// Where a model comes from and runs (generate, chat, eval).
void add_model_options(po::options_description& desc, zp::runtime::InferenceModelOptions& m) {
  desc.add_options()("help,h", "show this help")(
      "model", po::value<std::string>(&m.model)->required(), "hub folder, weights .h5 or checkpoint .h5")(
      "tokenizer", po::value<std::string>(&m.tokenizer), "tokenizer folder or tokenizer.json (default: the model folder's)")(
      "device", po::value<std::string>(&m.device)->default_value("auto"), "cpu | cuda | auto (cuda if there is a GPU)")(
      "dtype", po::value<std::string>(&m.dtype)->default_value("auto"),
      "fp32 | bf16 | fp16 | auto (bf16 on a GPU, else fp32) (| fp64 on the cpu)")(
      "offload-param", po::value<std::string>(&m.offload_param)->default_value("none"),
      "none | cpu | nvme: weights in pinned host memory (cpu) or in a swap file under --nvme-path (nvme), each "
      "layer streamed up for its use (ZeRO-Inference)")(
      "nvme-path", po::value<std::string>(&m.nvme_path),
      "directory of the weights' swap file, with --offload-param nvme")(
      "shard-weights", po::bool_switch(&m.shard_weights),
      "ZeRO-3 inference: each rank of the mpirun keeps 1/N of every layer's weights (on the device, or where "
      "--offload-param puts them) and the layers are gathered for their use; generate and eval")(
      "lora", po::value<std::string>(&m.lora),
      "LoRA adapter merged into the weights as they load: a PEFT folder, a LoRA checkpoint .h5, or a "
      "diffusers / kohya-ss .safetensors");
}

// The sampling settings (generate: of requests that do not give their own; chat).
void add_sampling_options(po::options_description& desc, zp::app::SamplingDefaults& d) {
  desc.add_options()(
      "temperature", po::value<float>(&d.params.temperature)->default_value(0.f), "0 = greedy")(
      "top-k", po::value<int32_t>(&d.params.top_k)->default_value(0), "0 = off")(
      "top-p", po::value<float>(&d.params.top_p)->default_value(1.f), "1 = off")(
      "repetition-penalty", po::value<float>(&d.params.repetition_penalty)->default_value(1.f), "1 = off")(
      "seed", po::value<uint64_t>(&d.params.seed)->default_value(0), "sampling seed (of requests without one)");
}

int cmd_eval(int argc, char** argv) {
  zp::app::EvalOptions o;
  po::options_description desc(
      "zeropipe eval: lm-evaluation-harness-style evaluation on JSONL task files (multiple_choice,\n"
      "loglikelihood_rolling, generate_until; README, \"Evaluation\"). Under mpirun the requests are\n"
      "shared by the ranks and rank 0 writes the results.\n"
      "  zeropipe eval --model my-model/ --tasks mc.jsonl rolling.jsonl --out results.json\n"
      "options");
  add_model_options(desc, o.model);
  desc.add_options()(
      "tasks", po::value<std::vector<std::string>>(&o.tasks)->required()->multitoken(), "task files (JSONL)")(
      "out", po::value<std::string>(&o.out), "results JSON to write (the harness's shape)")(
      "limit", po::value<int64_t>(&o.limit)->default_value(-1), "evaluate the first N documents of each task")(
      "max-length", po::value<int64_t>(&o.max_length)->default_value(0),
      "context length in tokens (default: the model's positions)")(
      "max-batch-tokens", po::value<int64_t>(&o.max_batch_tokens)->default_value(8192),
      "padded tokens per forward when scoring");
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm)) return 0;
  return on_every_rank("eval", argc, argv, [&](zp::comm::Runtime& rt) { return zp::app::run_eval(o, rt); });
}

int cmd_train(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> sets;
  std::string resume;
  po::options_description desc("zeropipe train options");
  desc.add_options()("help,h", "show this help")("config", po::value<std::string>(&config_path),
                                                 "training configuration (JSON; DeepSpeed key names)")(
      "set", po::value<std::vector<std::string>>(&sets)->composing(), "override a key: --set key.path=value (repeatable)")(
      "print-defaults", "print every configuration key with its default and exit")(
      "resume", po::value<std::string>(&resume),
      "continue from a checkpoint: FILE, or latest (the newest in checkpoint.dir; none there: start fresh)");
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm)) return 0;
  if (vm.count("print-defaults")) {
    std::cout << zp::runtime::train_schema_with_diffusion().dump(2) << "\n";
    return 0;
  }
  if (config_path.empty()) throw po::error("--config FILE is required");
  // Parse and validate before MPI starts, so a bad config fails the same way on every rank, at once.
  // The file's and the --set's problems are kept and reported with the readers' in one error.
  zp::io::Config cfg = zp::io::Config::from_file(zp::runtime::train_schema_with_diffusion(), config_path,
                                                 zp::io::Config::OnProblem::Keep);
  for (const auto& s : sets) cfg.set(s);
  const bool unet = cfg.get<std::string>("model.type") == "unet";
  std::optional<zp::runtime::UNetTrainConfig> uc;
  std::optional<zp::runtime::TrainConfig> tc;
  if (unet) {
    uc = zp::runtime::UNetTrainConfig::from(cfg);
    uc->common.resume = resume;
  } else {
    tc = zp::runtime::TrainConfig::from(cfg);
    tc->resume = resume;
  }
  return on_every_rank("train", argc, argv, [&](zp::comm::Runtime& rt) {
    const zp::runtime::TrainResult r = unet ? zp::runtime::train_unet(*uc, rt) : zp::runtime::train(*tc, rt);
    return r.stopped_by_signal ? zp::runtime::kExitStopped : 0;
  });
}

int cmd_generate(int argc, char** argv) {
  zp::app::GenerateOptions o;
  zp::app::SamplingDefaults& d = o.defaults;
  zp::runtime::GenerationOptions& e = o.engine;
  std::string kv_memory, kv_swap;
  po::options_description desc(
      "zeropipe generate: a batch of prompts (JSONL) -> completions (JSONL, input order), with a paged KV\n"
      "cache and continuous batching; under mpirun the requests are split across the ranks.\n"
      "  zeropipe generate --model hub-folder/ --prompts prompts.jsonl --out completions.jsonl\n"
      "Each line: {\"prompt\": TEXT} or {\"input_ids\": [...]}, and optionally max_new_tokens, temperature\n"
      "(0 = greedy), top_k, top_p, repetition_penalty, seed, stop, stop_token_ids, ignore_eos, id.\n"
      "options");
  add_model_options(desc, o.model);
  desc.add_options()(
      "prompts", po::value<std::string>(&o.prompts)->required(), "input JSONL")(
      "out", po::value<std::string>(&o.out)->required(), "output JSONL")(
      "metrics-file", po::value<std::string>(&o.metrics_file),
      "JSONL: one line per step and a summary (latencies, tokens/s, occupancy, KV blocks); other ranks add .RANK")(
      "max-new-tokens", po::value<int64_t>(&d.max_new_tokens)->default_value(256), "per request unless it says")(
      "max-batch-tokens", po::value<int64_t>(&e.max_batch_tokens)->default_value(8192), "new tokens per step")(
      "max-seqs", po::value<int64_t>(&e.max_seqs)->default_value(256), "sequences running at once")(
      "block-size", po::value<int64_t>(&e.block_size)->default_value(16), "tokens per KV cache block")(
      "kv-cache-memory", po::value<std::string>(&kv_memory),
      "KV cache size, e.g. 20GiB (default: the GPU memory left after the weights and a step's activations)")(
      "kv-swap-memory", po::value<std::string>(&kv_swap),
      "host memory (pinned on a GPU) that preempted sequences' keys and values move to, e.g. 16GiB, so they resume "
      "without being prefilled again (default 0: recomputed)");
  add_sampling_options(desc, d);
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm)) return 0;
  if (!kv_memory.empty()) e.kv_cache_bytes = int64_t(zp::app::parse_bytes(kv_memory, "--kv-cache-memory"));
  if (!kv_swap.empty()) e.kv_swap_bytes = int64_t(zp::app::parse_bytes(kv_swap, "--kv-swap-memory"));
  return on_every_rank("generate", argc, argv, [&](zp::comm::Runtime&) { return zp::app::run_generate(o); });
}

int cmd_chat(int argc, char** argv) {
  zp::app::ChatOptions o;
  zp::app::SamplingDefaults& d = o.sampling;
  po::options_description desc(
      "zeropipe chat: a conversation on stdin/stdout in the model's chat format; each line is your turn\n"
      "(/reset forgets the conversation, /exit or end of input ends it); replies stream as they are made.\n"
      "  zeropipe chat --model hub-folder/ --temperature 0.7 --top-p 0.9\n"
      "options");
  add_model_options(desc, o.model);
  desc.add_options()(
      "chat-template", po::value<std::string>(&o.chat_template)->default_value("auto"), "auto | llama3 | chatml | plain")(
      "system", po::value<std::string>(&o.system), "a system message for the conversation")(
      "max-new-tokens", po::value<int64_t>(&d.max_new_tokens)->default_value(512), "longest reply");
  add_sampling_options(desc, d);
  po::variables_map vm;
  if (!parse_options(argc, argv, desc, vm)) return 0;
  o.engine.max_seqs = 1;
  return zp::app::run_chat(o, std::cin, std::cout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "parity") return cmd_parity(argc - 1, argv + 1);
    if (cmd == "train") return cmd_train(argc - 1, argv + 1);
    if (cmd == "convert") return cmd_convert(argc - 1, argv + 1);
    if (cmd == "inspect") return cmd_inspect(argc - 1, argv + 1);
    if (cmd == "plan") return cmd_plan(argc - 1, argv + 1);
    if (cmd == "report") return cmd_report(argc - 1, argv + 1);
    if (cmd == "make-latents") return cmd_make_latents(argc - 1, argv + 1);
    if (cmd == "tokenize") return cmd_tokenize(argc - 1, argv + 1);
    if (cmd == "generate") return cmd_generate(argc - 1, argv + 1);
    if (cmd == "chat") return cmd_chat(argc - 1, argv + 1);
    if (cmd == "eval") return cmd_eval(argc - 1, argv + 1);
    std::fprintf(stderr, "zeropipe: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const po::error& e) {
    std::fprintf(stderr, "zeropipe %s: %s\n", cmd.c_str(), e.what());
    return 2;
  } catch (const zp::Error& e) {
    std::fprintf(stderr, "zeropipe %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
