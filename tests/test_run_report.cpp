// `zeropipe report`: metrics JSONL read back (known fields, unknown ones ignored, events), errors that
// name file and line, decimation of long runs, escaping, every chart drawn with its data points, and
// the report of a real tiny training run. The page in a real browser: tests/report_browser_test.sh.
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>

#include "app/report_command.h"
#include "io/config.h"
#include "io/token_dataset.h"
#include "runtime/lm_training.h"
#include "runtime/run_report.h"
#include "runtime/run_report_html.h"
#include "runtime/svg_chart.h"
#include "runtime/train_config.h"
#include "test_runtime.h"
#include "test_util.h"
#include "tiny_llama_config.h"

namespace zp::test {
using namespace zp::runtime;
namespace fs = std::filesystem;

namespace {

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream o(path);
  for (const std::string& l : lines) o << l << "\n";
}

// The <svg id="<id>" ...>...</svg> element of the page, or "".
std::string chart(const std::string& html, const std::string& id) {
  const size_t at = html.find("<svg id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  return html.substr(at, html.find("</svg>", at) + 6 - at);
}

// The points of every polyline of an svg, per polyline.
std::vector<size_t> polyline_points(const std::string& svg) {
  std::vector<size_t> n;
  const std::regex points("<polyline[^>]* points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), points); it != std::sregex_iterator(); ++it) {
    const std::string p = (*it)[1];
    n.push_back(p.empty() ? 0 : size_t(std::count(p.begin(), p.end(), ',')));
  }
  return n;
}

size_t bars(const std::string& svg) {
  size_t n = 0;
  for (size_t at = svg.find("<rect class=\"bar\""); at != std::string::npos; at = svg.find("<rect class=\"bar\"", at + 1))
    ++n;
  return n;
}

// A step record with every field today's engine and the telemetry write, for `ranks` ranks.
std::string full_step(int step, int rank, int ranks) {
  nlohmann::json per_rank = {{"step_ms", nlohmann::json::array()}, {"comm_busy_ms", nlohmann::json::array()},
                             {"peak_mem_gib", nlohmann::json::array()}};
  for (int k = 0; k < ranks; ++k) {
    per_rank["step_ms"].push_back(100.0 + k);
    per_rank["comm_busy_ms"].push_back(20.0 + 5 * k);
    per_rank["peak_mem_gib"].push_back(1.0 + 0.1 * k);
  }
  nlohmann::json j = {{"step", step},
                      {"loss", 5.0 - 0.01 * step},
                      {"lr", 1e-3},
                      {"grad_norm", 1.5},
                      {"mfu", 0.3},
                      {"peak_mem_gib", 1.0 + 0.1 * rank},
                      {"step_ms", 100.0},
                      {"skipped", false},
                      {"loss_scale", 1.0},
                      {"tokens_per_s", 5120.0},
                      {"comm_busy_ms", 20.0 + 5 * rank},
                      {"a_field_from_the_future", {{"x", 1}}},
                      // As the engine writes it: the exposed 10 ms come out of the forward and backward.
                      {"breakdown",
                       {{"data_ms", 5.0},
                        {"forward_backward_ms", 80.0},
                        {"forward_ms", 32.0},
                        {"backward_ms", 48.0},
                        {"optimizer_ms", 10.0},
                        {"comm_busy_ms", 20.0 + 5 * rank},
                        {"exposed_comm_ms", 10.0},
                        {"other_ms", 5.0},
                        {"comm_busy_by_kind_ms",
                         {{"all_gather", 10.0 + 5 * rank}, {"reduce_scatter", 5.0}, {"send_recv", 5.0}}}}},
                      {"per_rank", per_rank},
                      {"pipeline",
                       {{"stage", rank}, {"busy_ms", 80.0}, {"idle_ms", 20.0}, {"recv_wait_ms", 3.0}, {"bubble", 0.2},
                        {"mean_bubble", 0.22}, {"theoretical_bubble", 0.25}}}};
  if (step % 10 == 0) j["val_loss"] = 5.1 - 0.01 * step;
  return j.dump();
}

const char* kStart =
    R"({"event":"start","world":2,"banner":["rank 0 on host <a&b>: cpu","ZeRO stage 2"],)"
    R"("config":{"model":{"type":"transformer"},"note":"<script>alert(\"x\")</script> & 'q'"}})";

// Two ranks' files of a 40-step pipeline run with everything.
std::vector<std::string> full_run(const ScratchFolder& dir) {
  std::vector<std::string> paths;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> lines = {kStart};
    for (int s = 1; s <= 40; ++s) {
      lines.push_back(full_step(s, rank, 2));
      if (s == 20)
        lines.push_back(R"({"event":"checkpoint","step":20,"path":"ck/step-20.h5","seconds":0.5,"bytes":1000000,)"
                        R"("gb_per_s":0.002})");
    }
    paths.push_back(dir / (rank == 0 ? "metrics.jsonl" : "metrics.jsonl.1"));
    write_lines(paths.back(), lines);
  }
  return paths;
}

const std::vector<std::string> kLineCharts = {"loss-step", "loss-items", "lr",        "grad-norm", "throughput",
                                              "mfu",       "step-time",  "memory",    "bubble"};

}  // namespace

TEST(RunReport, ReadsStepRecordsAndEventsIgnoringUnknownFields) {
  ScratchFolder dir("report_read");
  const std::vector<std::string> paths = full_run(dir);
  const std::string old = dir / "old.jsonl", unet = dir / "unet.jsonl";
  // Today's records (no telemetry), a NaN loss written as null, a blank line, an unknown event.
  write_lines(old, {R"({"grad_norm":2.72,"loss":5.54,"loss_scale":1.0,"lr":0.0,"mfu":0.0,"peak_mem_gib":0.03,)"
                    R"("skipped":false,"step":1,"step_ms":159.9,"tokens_per_s":3200.5})",
                    "", R"({"event":"something_new","x":[1,2]})",
                    R"({"grad_norm":null,"loss":null,"lr":1e-4,"step":2,"step_ms":150,"tokens_per_s":3300,"skipped":true})"});
  // The engine's own breakdown: forward_backward_ms for the compute, the communication's busy time inside.
  write_lines(unet, {R"({"loss":0.9,"lr":1e-4,"step":1,"step_ms":500,"samples_per_s":8.0,"breakdown":)"
                     R"({"data_ms":1,"forward_backward_ms":400,"optimizer_ms":50,"comm_busy_ms":30,"other_ms":49}})",
                     // With the exposed communication, which lies inside the two phases: out of them in the stack.
                     R"({"loss":0.8,"lr":1e-4,"step":2,"step_ms":500,"samples_per_s":8.0,"breakdown":)"
                     R"({"data_ms":1,"forward_backward_ms":400,"optimizer_ms":50,"comm_busy_ms":30,"other_ms":49,)"
                     R"("exposed_comm_ms":410,"forward_ms":150,"backward_ms":250,"comm_busy_by_kind_ms":{"all_gather":30}}})"});
  const RunReport r = read_run_report({paths[0], paths[1], old, unet});
  ASSERT_EQ(r.files.size(), 4u);
  const RunFile& f = r.files[0];
  EXPECT_EQ(f.label, "metrics.jsonl");
  EXPECT_EQ(r.files[1].label, "metrics.jsonl.1");
  ASSERT_EQ(f.steps.size(), 40u);
  EXPECT_EQ(f.world, 2);
  ASSERT_EQ(f.banner.size(), 2u);
  EXPECT_EQ(f.banner[0], "rank 0 on host <a&b>: cpu");
  ASSERT_TRUE(f.config);
  EXPECT_EQ((*f.config)["model"]["type"], "transformer");
  ASSERT_EQ(f.checkpoints.size(), 1u);
  EXPECT_EQ(f.checkpoints[0].step, 20);
  EXPECT_EQ(f.checkpoints[0].bytes, 1000000);
  const StepRecord& s = f.steps[9];
  EXPECT_EQ(s.step, 10);
  EXPECT_DOUBLE_EQ(s.loss, 4.9);
  EXPECT_DOUBLE_EQ(s.val_loss, 5.0);
  EXPECT_TRUE(std::isnan(f.steps[8].val_loss));
  EXPECT_DOUBLE_EQ(s.items_per_s, 5120.0);
  EXPECT_EQ(f.unit, "tokens");
  ASSERT_TRUE(s.breakdown);
  EXPECT_DOUBLE_EQ(s.breakdown->compute_ms, 70.0);
  EXPECT_DOUBLE_EQ(s.breakdown->exposed_comm_ms, 10.0);
  EXPECT_DOUBLE_EQ(s.breakdown->forward_ms, 28.0) << "the forward's share of what the waits left";
  EXPECT_DOUBLE_EQ(s.breakdown->backward_ms, 42.0);
  EXPECT_DOUBLE_EQ(s.exposed_comm_ms, 10.0);
  EXPECT_EQ(s.comm_busy_by_kind_ms, (std::vector<std::pair<std::string, double>>{
                                        {"all_gather", 10.0}, {"reduce_scatter", 5.0}, {"send_recv", 5.0}}));
  EXPECT_EQ(s.rank_comm_busy_ms, (std::vector<double>{20.0, 25.0}));
  EXPECT_DOUBLE_EQ(s.bubble, 0.2);
  EXPECT_DOUBLE_EQ(s.mean_bubble, 0.22) << "the mean over the stages, apart from this stage's";
  EXPECT_DOUBLE_EQ(s.theoretical_bubble, 0.25);
  EXPECT_DOUBLE_EQ(r.files[1].steps[0].comm_busy_ms, 25.0);

  const RunFile& o = r.files[2];
  ASSERT_EQ(o.steps.size(), 2u);
  EXPECT_FALSE(o.config);
  EXPECT_FALSE(o.steps[0].breakdown);
  EXPECT_TRUE(o.steps[0].rank_step_ms.empty());
  EXPECT_TRUE(std::isnan(o.steps[1].loss)) << "null reads as NaN";
  EXPECT_TRUE(o.steps[1].skipped);
  EXPECT_EQ(r.files[3].unit, "samples");
  EXPECT_DOUBLE_EQ(r.files[3].steps[0].items_per_s, 8.0);
  ASSERT_TRUE(r.files[3].steps[0].breakdown);
  EXPECT_DOUBLE_EQ(r.files[3].steps[0].breakdown->compute_ms, 400.0);
  EXPECT_DOUBLE_EQ(r.files[3].steps[0].breakdown->exposed_comm_ms, 0.0);
  EXPECT_DOUBLE_EQ(r.files[3].steps[0].comm_busy_ms, 30.0);
  EXPECT_FALSE(r.files[3].steps[0].breakdown->has_forward_split()) << "an older file: no forward_ms";
  EXPECT_TRUE(r.files[3].steps[0].comm_busy_by_kind_ms.empty());
  EXPECT_TRUE(std::isnan(r.files[3].steps[0].exposed_comm_ms));
  ASSERT_EQ(r.files[3].steps.size(), 2u);
  const StepBreakdown& e = *r.files[3].steps[1].breakdown;
  EXPECT_DOUBLE_EQ(e.exposed_comm_ms, 410.0);
  EXPECT_DOUBLE_EQ(e.compute_ms, 0.0) << "all 400 ms of the forward and backward were waiting";
  EXPECT_DOUBLE_EQ(e.optimizer_ms, 40.0) << "and 10 of the update's 50";
  ASSERT_TRUE(e.has_forward_split());
  EXPECT_DOUBLE_EQ(e.forward_ms, 0.0) << "nothing left of the phase to split";
  EXPECT_DOUBLE_EQ(e.backward_ms, 0.0);
  EXPECT_EQ(r.files[3].steps[1].comm_busy_by_kind_ms.size(), 1u);
}

TEST(RunReport, SameFileNamesAreLabelledByPath) {
  ScratchFolder dir("report_labels");
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  for (const char* d : {"a", "b"}) write_lines(dir / (std::string(d) + "/m.jsonl"), {R"({"step":1,"loss":1})"});
  const RunReport r = read_run_report({dir / "a/m.jsonl", dir / "b/m.jsonl"});
  EXPECT_EQ(r.files[0].label, dir / "a/m.jsonl");
  EXPECT_EQ(r.files[1].label, dir / "b/m.jsonl");
}

TEST(RunReport, BadInputNamesFileAndLine) {
  ScratchFolder dir("report_errors");
  const std::string bad = dir / "bad.jsonl", type = dir / "type.jsonl", none = dir / "none.jsonl",
                    nostep = dir / "nostep.jsonl", array = dir / "array.jsonl";
  write_lines(bad, {R"({"step":1,"loss":1})", R"({"step":2,"loss":1})", R"({"step":3,"loss":)"});
  write_lines(type, {R"({"step":1,"loss":"low"})"});
  write_lines(none, {kStart, R"({"event":"checkpoint","step":1})"});
  write_lines(nostep, {R"({"loss":1})"});
  write_lines(array, {"[1,2]"});
  expect_error([&] { read_run_report({dir / "missing.jsonl"}); }, {"missing.jsonl", "cannot open"});
  expect_error([&] { read_run_report({bad}); }, {bad + ":3: not valid JSON"});
  expect_error([&] { read_run_report({type}); }, {type + ":1:", "\"loss\"", "not a number"});
  expect_error([&] { read_run_report({none}); }, {none + ":", "no step records"});
  expect_error([&] { read_run_report({nostep}); }, {nostep + ":1:", "\"step\""});
  expect_error([&] { read_run_report({array}); }, {array + ":1:", "not a JSON object"});
  expect_error([&] { read_run_report({}); }, {"no metrics files"});
}

TEST(RunReport, DecimationKeepsAtMostTheLimitAndTheSpikes) {
  std::vector<ChartPoint> p;
  for (int i = 0; i < 1000000; ++i) p.push_back({double(i), 1.0 + 1e-6 * (i % 7)});
  p[777777].y = 50.0;  // a loss spike
  p[123456].y = -3.0;
  const std::vector<ChartPoint> d = decimate(p, kMaxChartPoints);
  EXPECT_LE(d.size(), kMaxChartPoints);
  EXPECT_GE(d.size(), kMaxChartPoints / 2);
  EXPECT_EQ(d.front().x, 0.0);
  EXPECT_TRUE(std::is_sorted(d.begin(), d.end(), [](auto& a, auto& b) { return a.x < b.x; }));
  EXPECT_TRUE(std::any_of(d.begin(), d.end(), [](auto& q) { return q.y == 50.0 && q.x == 777777; }));
  EXPECT_TRUE(std::any_of(d.begin(), d.end(), [](auto& q) { return q.y == -3.0; }));
  const std::vector<ChartPoint> few(p.begin(), p.begin() + 10);
  EXPECT_EQ(decimate(few, kMaxChartPoints).size(), 10u);
}

TEST(RunReport, EscapesTextFromTheFiles) {
  EXPECT_EQ(xml_escape(R"(<a href="x">'&'</a>)"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  ScratchFolder dir("report_escape");
  const std::string odd = dir / "run<1>&\"x\".jsonl";
  write_lines(odd, {kStart, R"({"step":1,"loss":2})", R"({"step":2,"loss":1})"});
  const std::string html = run_report_html(read_run_report({odd}));
  EXPECT_EQ(html.find("<script"), std::string::npos) << "nothing from the files runs";
  EXPECT_EQ(html.find("<a&b>"), std::string::npos);
  EXPECT_EQ(html.find("run<1>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(\\&quot;x\\&quot;)&lt;/script&gt; &amp; &#39;q&#39;"), std::string::npos);
  EXPECT_NE(html.find("rank 0 on host &lt;a&amp;b&gt;: cpu"), std::string::npos);
  EXPECT_NE(html.find("run&lt;1&gt;&amp;&quot;x&quot;.jsonl"), std::string::npos);
}

TEST(RunReport, EveryChartHasItsDataPoints) {
  ScratchFolder dir("report_charts");
  const std::string html = run_report_html(read_run_report(full_run(dir)));
  for (const std::string& id : kLineCharts) {
    const std::string svg = chart(html, id);
    ASSERT_FALSE(svg.empty()) << id;
    const std::vector<size_t> n = polyline_points(svg);
    ASSERT_FALSE(n.empty()) << id;
    for (size_t k : n) EXPECT_GT(k, 0u) << id;
  }
  // Loss: each file's 40 steps and its 4 validations.
  EXPECT_EQ(polyline_points(chart(html, "loss-step")), (std::vector<size_t>{40, 4, 40, 4}));
  EXPECT_EQ(polyline_points(chart(html, "loss-items")), (std::vector<size_t>{40, 4, 40, 4}));
  EXPECT_EQ(polyline_points(chart(html, "memory")), (std::vector<size_t>{40, 40})) << "one series per rank";
  EXPECT_EQ(polyline_points(chart(html, "bubble")), (std::vector<size_t>{40, 40, 40})) << "two stages + theory";
  EXPECT_EQ(bars(chart(html, "breakdown")), 40u * 6) << "a bar per step, six parts: forward and backward apart";
  EXPECT_NE(chart(html, "breakdown").find("backward 42</title>"), std::string::npos);
  EXPECT_EQ(bars(chart(html, "comm-per-rank")), 2u * 2) << "a bar per rank: communication and the rest";
  EXPECT_EQ(bars(chart(html, "comm-exposed")), 2u * 2) << "a bar per rank's file: exposed and the rest";
  EXPECT_NE(chart(html, "comm-exposed").find("busy, not exposed 15</title>"), std::string::npos)
      << "rank 1: 25 ms busy, 10 exposed";
  EXPECT_EQ(bars(chart(html, "comm-kinds")), 2u * 3) << "a bar per rank's file, a part per kind";
  EXPECT_NE(chart(html, "comm-kinds").find("send_recv 5</title>"), std::string::npos);
  EXPECT_EQ(html.find("class=\"absent\">No "), std::string::npos);
  EXPECT_NE(html.find("ck/step-20.h5"), std::string::npos) << "the checkpoint table";
  EXPECT_NE(html.find("ZeRO stage 2"), std::string::npos) << "the banner";
  for (const char* fetches : {"<script", "<link", "<img", " src=", " href=", "url(", "@import"})
    EXPECT_EQ(html.find(fetches), std::string::npos) << fetches << ": the page fetches nothing and runs nothing";
}

TEST(RunReport, TodaysRecordsWithoutTelemetrySayWhatIsMissing) {
  ScratchFolder dir("report_today");
  std::vector<std::string> lines;
  for (int s = 1; s <= 5; ++s)
    lines.push_back(R"({"grad_norm":2.7,"loss":)" + std::to_string(6 - s) +
                    R"(,"lr":0.001,"mfu":0.0,"peak_mem_gib":0.03,"skipped":false,"step":)" + std::to_string(s) +
                    R"(,"step_ms":160,"tokens_per_s":3200})");
  write_lines(dir / "m.jsonl", lines);
  const std::string html = run_report_html(read_run_report({dir / "m.jsonl"}));
  for (const char* id : {"loss-step", "loss-items", "lr", "grad-norm", "throughput", "mfu", "step-time", "memory"})
    EXPECT_EQ(polyline_points(chart(html, id)), (std::vector<size_t>{5})) << id;
  for (const char* id : {"breakdown", "comm-per-rank", "comm-exposed", "comm-kinds", "bubble"})
    EXPECT_EQ(chart(html, id), "") << id;
  EXPECT_NE(html.find("No step-time breakdown"), std::string::npos);
  EXPECT_NE(html.find("No pipeline"), std::string::npos);
  EXPECT_NE(html.find("No start event"), std::string::npos);
}

// Breakdowns without the forward split (older files; pipeline stages) draw one "compute" part, and
// the communication charts show what the files have: a pipeline stage's kinds with its send_recv.
TEST(RunReport, BreakdownsWithoutTheSplitDrawCompute) {
  ScratchFolder dir("report_no_split");
  std::vector<std::string> old_lines, stage_lines;
  for (int s = 1; s <= 4; ++s) {
    old_lines.push_back(R"({"step":)" + std::to_string(s) +
                        R"(,"loss":1,"step_ms":100,"breakdown":{"data_ms":5,"forward_backward_ms":80,"optimizer_ms":10,)"
                        R"("comm_busy_ms":0,"other_ms":5}})");
    stage_lines.push_back(R"({"step":)" + std::to_string(s) +
                          R"(,"loss":1,"step_ms":100,"breakdown":{"data_ms":5,"forward_backward_ms":80,"optimizer_ms":10,)"
                          R"("comm_busy_ms":12,"exposed_comm_ms":2,"other_ms":5,)"
                          R"("comm_busy_by_kind_ms":{"all_reduce":2,"all_gather":0,"reduce_scatter":0,"send_recv":10}}})");
  }
  write_lines(dir / "old.jsonl", old_lines);
  write_lines(dir / "stage.jsonl", stage_lines);
  const std::string old = run_report_html(read_run_report({dir / "old.jsonl"}));
  EXPECT_EQ(bars(chart(old, "breakdown")), 4u * 4) << "data, compute, optimizer, other (nothing exposed)";
  EXPECT_NE(chart(old, "breakdown").find("compute 80</title>"), std::string::npos);
  EXPECT_EQ(chart(old, "breakdown").find(">forward<"), std::string::npos);
  EXPECT_EQ(chart(old, "comm-exposed"), "");
  EXPECT_EQ(chart(old, "comm-kinds"), "");
  EXPECT_NE(old.find("No exposed communication"), std::string::npos);
  EXPECT_NE(old.find("No communication time per kind"), std::string::npos);

  const std::string both = run_report_html(read_run_report({dir / "stage.jsonl", dir / "old.jsonl"}));
  EXPECT_NE(chart(both, "breakdown").find("compute 78</title>"), std::string::npos) << "2 ms exposed taken out";
  EXPECT_EQ(bars(chart(both, "comm-exposed")), 2u) << "the stage's file only: exposed 2, the other 10";
  EXPECT_NE(chart(both, "comm-exposed").find("busy, not exposed 10</title>"), std::string::npos);
  const std::string kinds = chart(both, "comm-kinds");
  EXPECT_EQ(bars(kinds), 2u) << "the stage's file only: all_reduce and send_recv (zero kinds draw nothing)";
  EXPECT_NE(kinds.find("send_recv 10</title>"), std::string::npos);
  EXPECT_NE(kinds.find("all_reduce 2</title>"), std::string::npos);
}

// A 100,000-step run of 5 ranks' files stays small: every series is decimated.
TEST(RunReport, LongRunsStaySmall) {
  RunReport r;
  for (int rank = 0; rank < 5; ++rank) {
    RunFile f;
    f.label = f.path = "metrics.jsonl." + std::to_string(rank);
    for (int s = 1; s <= 100000; ++s) {
      StepRecord x;
      x.step = s, x.loss = 5.0 / std::sqrt(double(s)), x.lr = 1e-3, x.grad_norm = 1, x.mfu = 0.4;
      x.items_per_s = 1e5, x.step_ms = 100, x.peak_mem_gib = 20, x.val_loss = s % 1000 == 0 ? x.loss : kAbsent;
      x.breakdown = StepBreakdown{1, 80, 10, 5, 4};
      f.steps.push_back(x);
    }
    r.files.push_back(std::move(f));
  }
  const std::string html = run_report_html(r);
  EXPECT_LT(html.size(), 4u << 20) << "a few MB at most";
  for (const std::string& id : kLineCharts)
    for (size_t n : polyline_points(chart(html, id))) EXPECT_LE(n, kMaxChartPoints) << id;
  EXPECT_LE(bars(chart(html, "breakdown")), 60u * 5);
}

// A real tiny training run writes its metrics file; `zeropipe report` draws it.
TEST(RunReport, ReportsARealTrainingRun) {
  ScratchFolder dir("report_training");
  std::mt19937_64 g(5);
  std::vector<int32_t> tokens(64 * 16 + 1);
  for (auto& t : tokens) t = int32_t(g() % 64);
  io::write_token_file(dir / "tokens.bin", tokens, 64);
  const io::json user = {
      {"train_micro_batch_size_per_gpu", 4},
      {"steps_per_print", 1000},
      {"optimizer", {{"params", {{"lr", 1e-2}}}}},
      {"model", {{"config", tiny_llama()}}},
      {"data", {{"train_files", {dir / "tokens.bin"}}, {"seq_len", 16}, {"val_fraction", 0.25}}},
      {"training",
       {{"max_steps", 12}, {"device", "cpu"}, {"eval_every", 4}, {"eval_batches", 1},
        {"metrics_file", dir / "metrics.jsonl"}}}};
  with_runtime([&](comm::Runtime& rt) { train(TrainConfig::from(io::Config(train_config_schema(), user, "test")), rt); });
  ASSERT_TRUE(fs::exists(dir / "metrics.jsonl"));
  app::ReportOptions o{{dir / "metrics.jsonl"}, ""};
  EXPECT_EQ(app::report_path(o), dir / "report.html") << "beside the first file";
  ASSERT_EQ(app::run_report(o), 0);
  std::ifstream in(dir / "report.html");
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(polyline_points(chart(html, "loss-step")), (std::vector<size_t>{12, 3})) << "12 steps, 3 validations";
  EXPECT_EQ(polyline_points(chart(html, "loss-items")), (std::vector<size_t>{12, 3}));
  EXPECT_GE(bars(chart(html, "breakdown")), 12u) << "the engine's step-time breakdown, a bar per step";
  EXPECT_NE(chart(html, "breakdown").find(">forward<"), std::string::npos) << "the forward and backward apart";
  EXPECT_NE(chart(html, "breakdown").find(">backward<"), std::string::npos);
  EXPECT_NE(chart(html, "comm-exposed"), "") << "one rank: its bar, of nothing";
  EXPECT_NE(chart(html, "comm-kinds").find(">all_reduce<"), std::string::npos) << "the kinds the engine writes";
  EXPECT_GE(bars(chart(html, "comm-per-rank")), 1u) << "one rank, one file: its bar";
  EXPECT_NE(html.find("<pre class=\"config\">"), std::string::npos) << "the start event's config";
  for (const char* id : {"lr", "grad-norm", "throughput", "mfu", "step-time", "memory"})
    EXPECT_EQ(polyline_points(chart(html, id)), (std::vector<size_t>{12})) << id;
}

}  // namespace zp::test
