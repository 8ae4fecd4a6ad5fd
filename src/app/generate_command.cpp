#include "app/generate_command.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "comm/bootstrap.h"
#include "comm/text_gather.h"
#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/bounded_json.h"
#include "runtime/generation_report.h"

namespace zp::app {

using nlohmann::json;

namespace {

template <class T>
T get_number(const json& j, const char* key, const std::string& where, T fallback) {
  if (!j.contains(key)) return fallback;
  ZP_REQUIRE(j[key].is_number(), where, ": \"", key, "\" must be a number, got ", j[key].dump());
  return j[key].get<T>();
}

std::vector<int32_t> id_list(const json& v, const char* key, const std::string& where, int64_t vocab) {
  ZP_REQUIRE(v.is_array(), where, ": \"", key, "\" must be a list of token ids");
  std::vector<int32_t> ids;
  for (const json& x : v) {
    ZP_REQUIRE(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < vocab, where, ": \"", key,
               "\" holds ", x.dump(), ", not a token id below the model's vocabulary of ", vocab);
    ids.push_back(x.get<int32_t>());
  }
  return ids;
}

}  // namespace

runtime::GenerationRequest parse_generation_record(const json& j, const std::string& where,
                                                   const runtime::InferenceModel& m, const SamplingDefaults& d) {
  static const char* kKeys[] = {"prompt", "input_ids", "max_new_tokens", "temperature", "top_k", "top_p",
                                "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "id"};
  ZP_REQUIRE(j.is_object(), where, ": a request must be a JSON object");
  for (const auto& [k, v] : j.items()) {
    bool known = false;
    for (const char* key : kKeys) known = known || k == key;
    ZP_REQUIRE(known, where, ": unknown key \"", k, "\" (known: prompt, input_ids, max_new_tokens, temperature, "
               "top_k, top_p, repetition_penalty, seed, stop, stop_token_ids, ignore_eos, id)");
  }
  ZP_REQUIRE(j.contains("prompt") != j.contains("input_ids"), where,
             ": a request has either \"prompt\" (text) or \"input_ids\" (token ids)");
  const int64_t vocab = m.config().vocab;
  const io::BpeTokenizer* tok = m.tokenizer();
  runtime::GenerationRequest r;
  if (j.contains("prompt")) {
    ZP_REQUIRE(j["prompt"].is_string(), where, ": \"prompt\" must be a string");
    ZP_REQUIRE(tok, where, ": a text prompt needs a tokenizer (the model folder has none; give --tokenizer, or "
               "send \"input_ids\")");
    r.prompt = tok->encode(j["prompt"].get<std::string>(), {.add_special = true});
    for (int32_t id : r.prompt)
      ZP_REQUIRE(id < vocab, where, ": the tokenizer made id ", id, ", past the model's vocabulary of ", vocab);
  } else {
    r.prompt = id_list(j["input_ids"], "input_ids", where, vocab);
  }
  ZP_REQUIRE(!r.prompt.empty(), where, ": an empty prompt");
  r.max_new_tokens = get_number<int64_t>(j, "max_new_tokens", where, d.max_new_tokens);
  ZP_REQUIRE(r.max_new_tokens >= 1, where, ": max_new_tokens must be at least 1");
  kernels::SamplingParams& s = r.sampling;
  s.temperature = get_number<float>(j, "temperature", where, d.params.temperature);
  s.top_k = get_number<int32_t>(j, "top_k", where, d.params.top_k);
  s.top_p = get_number<float>(j, "top_p", where, d.params.top_p);
  s.repetition_penalty = get_number<float>(j, "repetition_penalty", where, d.params.repetition_penalty);
  s.seed = get_number<uint64_t>(j, "seed", where, d.params.seed);
  try {
    kernels::check_sampling_params(s);
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  if (j.contains("stop")) {
    const json& st = j["stop"];
    ZP_REQUIRE(st.is_string() || st.is_array(), where, ": \"stop\" must be a string or a list of strings");
    for (const json& x : st.is_string() ? json::array({st}) : st) {
      ZP_REQUIRE(x.is_string() && !x.get<std::string>().empty(), where, ": \"stop\" holds ", x.dump(),
                 ", not a non-empty string");
      r.stop_strings.push_back(x.get<std::string>());
    }
    ZP_REQUIRE(tok, where, ": stop strings need a tokenizer");
  }
  if (j.contains("stop_token_ids")) r.stop_tokens = id_list(j["stop_token_ids"], "stop_token_ids", where, vocab);
  const bool ignore_eos = j.value("ignore_eos", false);
  if (tok && tok->eos_id() && !ignore_eos) r.stop_tokens.push_back(*tok->eos_id());
  return r;
}

std::string completion_text(const io::BpeTokenizer& tok, const std::vector<int32_t>& ids,
                            const std::vector<std::string>& stops) {
  std::string text = tok.decode(ids, /*skip_special=*/true);
  size_t cut = std::string::npos;
  for (const std::string& s : stops) cut = std::min(cut, text.find(s));
  if (cut != std::string::npos) text.resize(cut);
  return text;
}

int run_generate(const GenerateOptions& o) {
  comm::Runtime* rt = comm::Runtime::current();
  const int rank = rt ? rt->rank() : 0, world = rt ? rt->world_size() : 1;
  runtime::InferenceModel model(o.model);
  std::ifstream in(o.prompts);
  ZP_REQUIRE(in, o.prompts, ": cannot open the prompts file");
  // Every rank reads and checks every line, so bad input fails on all ranks alike.
  std::vector<runtime::GenerationRequest> all;
  std::vector<json> ids;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = o.prompts + ":" + std::to_string(n);
    const json j = io::parse_json_bounded(std::string_view(line), where);
    all.push_back(parse_generation_record(j, where, model, o.defaults));
    ids.push_back(j.contains("id") ? j["id"] : json());
  }
  ZP_REQUIRE(!all.empty(), o.prompts, ": no requests");

  runtime::GenerationEngine engine(model.model(), model.tokenizer(), o.engine);
  engine.set_before_forward(model.forward_hook());
  std::vector<int64_t> mine;  // indices of this rank's requests, by engine id
  for (size_t i = size_t(rank); i < all.size(); i += size_t(world)) {
    mine.push_back(int64_t(i));
    engine.submit(all[i]);
  }
  runtime::GenerationMetrics metrics(o.metrics_file.empty() || rank == 0 ? o.metrics_file
                                                                           : o.metrics_file + "." + std::to_string(rank));
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  int64_t finished = 0;
  while (!engine.idle()) {
    finished += int64_t(engine.step().size());
    const auto now = std::chrono::steady_clock::now();
    metrics.step(engine, std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
    const auto& st = engine.stats();
    if (o.print_progress && rank == 0 && st.steps % 50 == 0) {
      const double s = std::chrono::duration<double>(now - t0).count();
      log_line(LogLevel::Info, false,
               detail::cat("generate: step ", st.steps, ", ", finished, "/", mine.size(), " done on rank 0, ",
                           engine.scheduler().running(), " running, ", engine.scheduler().waiting(), " waiting, ",
                           int64_t(double(st.decode_tokens + st.prefill_tokens) / std::max(s, 1e-9)),
                           " tokens/s in, KV blocks ", engine.cache_blocks() - engine.scheduler().free_blocks(), "/",
                           engine.cache_blocks()));
    }
  }
  // Sharded weights: the ranks still forwarding gather every block, and need this one in each gather.
  model.join_until_every_rank_is_done();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string lines;
  for (size_t k = 0; k < mine.size(); ++k) {
    const runtime::GenerationOutput out = engine.output(int64_t(k));
    const runtime::GenerationRequest& req = all[size_t(mine[k])];
    json j = {{"index", mine[k]}};
    if (!ids[size_t(mine[k])].is_null()) j["id"] = ids[size_t(mine[k])];
    j["output_ids"] = out.ids;
    if (model.tokenizer()) j["text"] = completion_text(*model.tokenizer(), out.ids, req.stop_strings);
    j["finish_reason"] = runtime::finish_reason_name(out.finish);
    j["prompt_tokens"] = out.prompt_tokens;
    j["completion_tokens"] = out.ids.size();
    j["time_to_first_token_ms"] = out.first_token_ms;
    j["total_ms"] = out.total_ms;
    lines += j.dump() + "\n";
  }
  std::vector<int64_t> engine_ids(mine.size());
  for (size_t k = 0; k < mine.size(); ++k) engine_ids[k] = int64_t(k);
  const runtime::GenerationSummary summary =
      runtime::summarize_generation(engine, engine_ids, seconds, model.streamed_bytes_per_forward());
  metrics.summary(summary);
  const std::vector<std::string> parts = comm::gather_text(lines, 0, rt ? rt->world() : MPI_COMM_NULL);
  if (rank != 0) return 0;
  // Rank r's k-th line is request r + k * world: put them back in input order.
  std::vector<std::string> ordered(all.size());
  for (size_t r = 0; r < parts.size(); ++r) {
    size_t k = 0, start = 0;
    for (size_t e; (e = parts[r].find('\n', start)) != std::string::npos; start = e + 1, ++k)
      ordered[r + k * parts.size()] = parts[r].substr(start, e - start);
  }
  std::string text;
  for (const std::string& l : ordered) text += l + "\n";
  io::write_file_atomically(o.out, text, io::FileSync::BeforeRename);
  const std::string sharded = model.weight_shards() > 1 ? detail::cat(" (weights sharded, ",
      double(model.resident_weight_bytes()) / 1e6, " MB on each)") : std::string();
  std::printf("generate: %d rank%s%s; rank 0: %s -> %s\n", world, world > 1 ? "s" : "", sharded.c_str(),
              summary.line().c_str(), o.out.c_str());
  return 0;
}

}  // namespace zp::app
