#include "app/eval_command.h"

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "io/atomic_file.h"
#include "runtime/eval_tasks.h"
#include "runtime/inference_model.h"
#include "runtime/lm_evaluation.h"
#include "runtime/loglikelihood_scorer.h"
#include "runtime/until_generator.h"

namespace zp::app {

int run_eval(const EvalOptions& o, comm::Runtime& rt) {
  ZP_REQUIRE(!o.tasks.empty(), "--tasks: give at least one task file");
  // Task files first: a typo fails in a moment, before the model loads.
  std::vector<runtime::EvalTask> tasks;
  for (const auto& path : o.tasks) tasks.push_back(runtime::read_eval_task(path));
  const auto start = std::chrono::steady_clock::now();
  runtime::InferenceModel m(o.model);
  ZP_REQUIRE(m.tokenizer() != nullptr, o.model.model,
             ": has no tokenizer, and task files are text; name one with --tokenizer DIR|tokenizer.json");
  const int64_t positions = m.config().max_positions;
  const int64_t max_length = o.max_length > 0 ? o.max_length : positions;
  ZP_REQUIRE(max_length <= positions, "--max-length ", max_length, " exceeds the model's ", positions, " positions");
  runtime::LoglikelihoodScorer scorer(m.model(), m.stream(), max_length, o.max_batch_tokens);
  scorer.set_before_forward(m.forward_hook());
  runtime::LmEvaluationOptions eo;
  eo.max_length = max_length;
  eo.limit = o.limit;
  eo.config["model"] = o.model.model;
  eo.config["model_args"] = nullptr;
  eo.config["tokenizer"] = m.tokenizer_source();
  eo.config["dtype"] = std::string(dtype_name(m.dtype()));
  eo.config["device"] = m.device().str();
  eo.config["max_length"] = max_length;
  eo.config["batch_size"] = "auto";  // batches are sized by a token budget, not a row count
  eo.config["max_batch_tokens"] = o.max_batch_tokens;
  eo.config["world_size"] = rt.world_size();
  eo.config["weight_shards"] = m.weight_shards();
  eo.config["limit"] = o.limit < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(o.limit);
  eo.config["bootstrap_iters"] = 0;  // stderr of means in closed form; none for perplexities
  const io::BpeTokenizer& tok = *m.tokenizer();
  const nlohmann::ordered_json results = runtime::evaluate_tasks(
      tasks, tok, eo,
      // Each rank's share of the requests (none, for some), then with sharded weights the others'
      // remaining forwards joined, whose gathers need every rank.
      [&](const std::vector<runtime::LoglikelihoodRequest>& r) {
        std::vector<runtime::LoglikelihoodResult> res = scorer.score(r);
        m.join_until_every_rank_is_done();
        return res;
      },
      [&](const std::vector<runtime::GenerationAsk>& a) {
        std::vector<std::string> res = runtime::generate_greedy_until(m.model(), tok, max_length, a, m.forward_hook());
        m.join_until_every_rank_is_done();
        return res;
      },
      rt.world());
  if (rt.rank() != 0) return 0;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.out.empty()) io::write_file_atomically(o.out, results.dump(2) + "\n", io::FileSync::BeforeRename);
  std::printf("%s (%s, %s), %d rank%s, %.1f s\n%s", o.model.model.c_str(), m.device().str().c_str(), std::string(dtype_name(m.dtype())).c_str(),
              rt.world_size(), rt.world_size() == 1 ? "" : "s", seconds, runtime::results_table(results).c_str());
  if (!o.out.empty()) std::printf("results: %s\n", o.out.c_str());
  return 0;
}

}  // namespace zp::app
