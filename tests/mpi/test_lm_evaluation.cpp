// Evaluation under mpirun (issue 13, item 5): the requests are dealt to the ranks and gathered on
// rank 0, and the results equal those of one rank alone (MPI_COMM_SELF on rank 0) exactly: a
// request's score is computed the same way whichever rank has it, and the sums run on rank 0 in
// request order. (Batch composition does differ between world sizes; the CPU kernels compute each
// position of a right-padded row the same whatever the other rows, so the scores agree bit for bit.
// Were that to change, the comparison below would still name the metric and both values.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>

#include "mpi_test_util.h"
#include "runtime/eval_tasks.h"
#include "runtime/inference_model.h"
#include "runtime/lm_evaluation.h"
#include "runtime/loglikelihood_scorer.h"

namespace zp::test {
namespace {
namespace fs = std::filesystem;
using namespace zp::runtime;

TEST(MpiLmEvaluation, SameResultsAtEveryWorldSize) {
  const fs::path data = ZP_EVAL_DATA_DIR;
  InferenceModel m({(data / "demo-model").string(), "", "cpu", "fp32"});
  const std::vector<EvalTask> tasks = {read_eval_task((data / "licenses_mc.jsonl").string()),
                                       read_eval_task((data / "licenses_rolling.jsonl").string())};
  LoglikelihoodScorer scorer(m.model(), m.stream(), m.config().max_positions, 8192);
  LmEvaluationOptions opt;
  opt.max_length = m.config().max_positions;
  opt.limit = 200;  // 800 choices and every paragraph: enough to deal unevenly over 2, 3 and 5 ranks
  const ScoreLoglikelihood score = [&](const std::vector<LoglikelihoodRequest>& r) { return scorer.score(r); };
  const auto world = evaluate_tasks(tasks, *m.tokenizer(), opt, score, {}, MPI_COMM_WORLD);
  if (world_rank() != 0) {
    EXPECT_TRUE(world.is_null());
  } else {
    const auto alone = evaluate_tasks(tasks, *m.tokenizer(), opt, score, {}, MPI_COMM_SELF);
    EXPECT_EQ(world["n-samples"], alone["n-samples"]);
    for (const char* task : {"licenses_mc", "licenses_rolling"})
      for (auto& [k, v] : alone["results"][task].items())
        EXPECT_EQ(world["results"][task][k], v) << task << " " << k << " at " << world_size() << " ranks";
    std::printf("%d ranks:\n%s", world_size(), results_table(world).c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace zp::test
