#include "runtime/run_report.h"

#include <algorithm>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "io/bounded_json.h"

namespace zp::runtime {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Where a value came from, for errors: "<path>:<line>".
struct Place {
  const std::string& path;
  int64_t line;
};

// A numeric field: absent or null (how nlohmann writes NaN and infinities) reads as NaN.
double number(const json& o, const char* key, const Place& at) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return kAbsent;
  ZP_REQUIRE(it->is_number(), at.path, ":", at.line, ": \"", key, "\" is not a number: ", it->dump());
  return it->get<double>();
}

std::vector<double> numbers(const json& o, const char* key, const Place& at) {
  std::vector<double> v;
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return v;
  ZP_REQUIRE(it->is_array(), at.path, ":", at.line, ": \"", key, "\" is not an array: ", it->dump());
  for (const json& x : *it) {
    ZP_REQUIRE(x.is_number() || x.is_null(), at.path, ":", at.line, ": \"", key, "\" holds a non-number: ", x.dump());
    v.push_back(x.is_null() ? kAbsent : x.get<double>());
  }
  return v;
}

const json* object(const json& o, const char* key, const Place& at) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  ZP_REQUIRE(it->is_object(), at.path, ":", at.line, ": \"", key, "\" is not an object: ", it->dump());
  return &*it;
}

StepRecord step_record(const json& o, RunFile& file, const Place& at) {
  StepRecord r;
  const double step = number(o, "step", at);
  ZP_REQUIRE(!std::isnan(step), at.path, ":", at.line, ": a step record without a \"step\" number");
  r.step = int64_t(step);
  r.loss = number(o, "loss", at);
  r.val_loss = number(o, "val_loss", at);
  r.lr = number(o, "lr", at);
  r.grad_norm = number(o, "grad_norm", at);
  r.mfu = number(o, "mfu", at);
  r.peak_mem_gib = number(o, "peak_mem_gib", at);
  r.step_ms = number(o, "step_ms", at);
  r.comm_busy_ms = number(o, "comm_busy_ms", at);
  // The UNet counts samples, the language models tokens.
  if (o.contains("samples_per_s")) {
    file.unit = "samples";
    r.items_per_s = number(o, "samples_per_s", at);
  } else {
    r.items_per_s = number(o, "tokens_per_s", at);
  }
  if (const auto it = o.find("skipped"); it != o.end() && it->is_boolean()) r.skipped = it->get<bool>();
  if (const json* b = object(o, "breakdown", at)) {
    auto ms = [&](const char* key) { const double v = number(*b, key, at); return std::isnan(v) ? 0.0 : v; };
    // The engine writes forward_backward_ms for the compute, and the communication's busy time (which
    // overlaps the compute, so it is no part of the stack) inside the breakdown. Its exposed_comm_ms
    // is time inside the forward-and-backward and update phases (compute waiting for communication):
    // taken out of them, first the former, so the stack still adds up to the step.
    if (b->contains("compute_ms")) {
      r.breakdown = StepBreakdown{ms("data_ms"), ms("compute_ms"), ms("optimizer_ms"), ms("exposed_comm_ms"),
                                  ms("other_ms")};
    } else {
      const double forward_backward = ms("forward_backward_ms");
      double compute = forward_backward, update = ms("optimizer_ms");
      const double exposed = std::min(ms("exposed_comm_ms"), compute + update);
      const double from_compute = std::min(exposed, compute);
      compute -= from_compute;
      update -= exposed - from_compute;
      r.breakdown = StepBreakdown{ms("data_ms"), compute, update, exposed, ms("other_ms")};
      // The forward and backward split what is left of the phase in their measured proportion: the
      // waits are not attributed to either.
      const double forward = number(*b, "forward_ms", at), backward = number(*b, "backward_ms", at);
      if (!std::isnan(forward) && !std::isnan(backward)) {
        const double kept = forward_backward > 0 ? compute / forward_backward : 0.0;
        r.breakdown->forward_ms = forward * kept;
        r.breakdown->backward_ms = backward * kept;
      }
    }
    if (std::isnan(r.comm_busy_ms)) r.comm_busy_ms = number(*b, "comm_busy_ms", at);
    r.exposed_comm_ms = number(*b, "exposed_comm_ms", at);
    if (const json* kinds = object(*b, "comm_busy_by_kind_ms", at))
      for (const auto& [kind, v] : kinds->items()) {
        ZP_REQUIRE(v.is_number() || v.is_null(), at.path, ":", at.line, ": \"comm_busy_by_kind_ms.", kind,
                   "\" is not a number: ", v.dump());
        r.comm_busy_by_kind_ms.emplace_back(kind, v.is_null() ? kAbsent : v.get<double>());
      }
  }
  if (const json* p = object(o, "per_rank", at)) {
    r.rank_step_ms = numbers(*p, "step_ms", at);
    r.rank_comm_busy_ms = numbers(*p, "comm_busy_ms", at);
    r.rank_peak_mem_gib = numbers(*p, "peak_mem_gib", at);
  }
  if (const json* p = object(o, "pipeline", at)) {
    r.bubble = number(*p, "bubble", at);
    r.mean_bubble = number(*p, "mean_bubble", at);
    r.theoretical_bubble = number(*p, "theoretical_bubble", at);
    r.stage_busy_ms = number(*p, "busy_ms", at);
    r.window_ms = r.stage_busy_ms + number(*p, "idle_ms", at);
    r.recv_gap_ms = number(*p, "recv_gap_ms", at);
    r.other_gap_ms = number(*p, "other_gap_ms", at);
  }
  return r;
}

void event(const json& o, RunFile& file, const Place& at) {
  const json& kind = o["event"];
  if (kind == "start") {
    if (const auto it = o.find("config"); it != o.end()) file.config = *it;
    if (const auto it = o.find("banner"); it != o.end() && it->is_array())
      for (const json& l : *it) file.banner.push_back(l.is_string() ? l.get<std::string>() : l.dump());
    const double world = number(o, "world", at);
    if (!std::isnan(world)) file.world = int(world);
  } else if (kind == "checkpoint") {
    CheckpointEvent c;
    const double step = number(o, "step", at);
    c.step = std::isnan(step) ? 0 : int64_t(step);
    if (const auto it = o.find("path"); it != o.end() && it->is_string()) c.path = it->get<std::string>();
    c.seconds = number(o, "seconds", at);
    c.gb_per_s = number(o, "gb_per_s", at);
    const double bytes = number(o, "bytes", at);
    c.bytes = std::isnan(bytes) ? 0 : int64_t(bytes);
    file.checkpoints.push_back(std::move(c));
  }
  // Other events (a later engine's) are not an error: the report shows what it knows.
}

}  // namespace

RunFile read_metrics_file(const std::string& path) {
  std::ifstream in(path);
  ZP_REQUIRE(in.good(), path, ": cannot open the metrics file");
  RunFile file;
  file.path = path;
  file.label = fs::path(path).filename().string();
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const Place at{path, n};
    // Bounded like every reader of users' JSON: a line nested thousands deep is an error, not a crash.
    const json o = io::parse_json_bounded(line, detail::cat(path, ":", n));
    ZP_REQUIRE(o.is_object(), path, ":", n, ": not a JSON object: ", line.substr(0, 80));
    if (o.contains("event"))
      event(o, file, at);
    else
      file.steps.push_back(step_record(o, file, at));
  }
  ZP_REQUIRE(!file.steps.empty(), path, ": no step records (is it a metrics file of zeropipe train, "
                                        "training.metrics_file?)");
  return file;
}

RunReport read_run_report(const std::vector<std::string>& paths) {
  ZP_REQUIRE(!paths.empty(), "no metrics files given");
  RunReport r;
  std::map<std::string, int> names;
  for (const std::string& p : paths) {
    r.files.push_back(read_metrics_file(p));
    ++names[r.files.back().label];
  }
  // metrics.jsonl from two runs' folders: the file names alone would not tell them apart.
  for (RunFile& f : r.files)
    if (names[f.label] > 1) f.label = f.path;
  return r;
}

}  // namespace zp::runtime
