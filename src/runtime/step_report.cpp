#include "runtime/step_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/allocator.h"
#include "core/error.h"

namespace zp::runtime {

StepReporter::StepReporter(const std::string& metrics_file, int rank, int world, Device dev, const std::string& unit,
                           int64_t items_per_step, double flops_per_item, int64_t max_steps, int64_t print_every,
                           bool append)
    : rank_(rank), world_(world), dev_(dev), unit_(unit), items_per_step_(items_per_step), max_steps_(max_steps),
      print_every_(std::max<int64_t>(print_every, 1)), flops_per_item_(flops_per_item),
      peak_tflops_(dev.is_cuda() ? cuda_peak_bf16_tflops(dev.index) : 0.0) {
  rate_key_ = (unit == "tok" ? std::string("tokens") : unit) + "_per_s";
  if (metrics_file.empty()) return;
  // (Built with a stream: GCC 12 warns falsely on std::string + std::to_string here.)
  std::ostringstream name;
  if (auto at = metrics_file.find("{rank}"); at != std::string::npos)
    name << metrics_file.substr(0, at) << rank << metrics_file.substr(at + 6);
  else if (rank != 0)
    name << metrics_file << '.' << rank;
  else
    name << metrics_file;
  const std::string path = name.str();
  metrics_.open(path, append ? std::ios::app : std::ios::trunc);
  ZP_REQUIRE(metrics_.good(), path, ": cannot write the metrics file");
}

void StepReporter::set_csv_monitor(const std::string& dir, int64_t samples_per_step, bool loss_scaling) {
  if (rank_ != 0 || dir.empty()) return;
  csv_.emplace(dir);
  csv_samples_per_step_ = samples_per_step;
  csv_loss_scale_ = loss_scaling;
}

void StepReporter::report(int64_t step, double loss, double lr, double grad_norm, double secs, bool skipped,
                          float loss_scale, double val) {
  const double rate = double(items_per_step_) / secs;
  const double mfu = peak_tflops_ > 0 ? flops_per_item_ * rate / world_ / (peak_tflops_ * 1e12) : 0.0;
  const double mem_gib = dev_.is_cuda() ? double(device_allocator(dev_.index).stats().peak) / double(1ull << 30)
                                        : host_peak_rss_bytes() / double(1ull << 30);
  if (rank_ == 0 && ((step - 1) % print_every_ == 0 || step == max_steps_ || !std::isnan(val))) {
    char line[512];
    std::snprintf(line, sizeof(line),
                  "step %5lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.*f %s/s | MFU %.1f%% | mem %.2f GiB%s | "
                  "%.0f ms%s",
                  (long long)step, (long long)max_steps_, loss, lr, grad_norm, unit_ == "tok" ? 0 : 1, rate,
                  unit_.c_str(), 100 * mfu, mem_gib, dev_.is_cuda() ? "" : " RSS", secs * 1e3,
                  skipped ? " | SKIPPED (overflow)" : "");
    std::string extra = std::isnan(val) ? "" : " | val loss " + std::to_string(val);
    if (show_breakdown_ && breakdown_) {
      char b[160];
      std::snprintf(b, sizeof(b), " | data %.1f fwd+bwd %.1f opt %.1f comm busy %.1f ms", breakdown_->data_ms,
                    breakdown_->forward_backward_ms, breakdown_->optimizer_ms, breakdown_->comm_busy_ms);
      extra = b + extra;
    }
    if (pipeline_) {
      char b[96];
      std::snprintf(b, sizeof(b), " | bubble %.1f%% (theory %.1f%%)", 100 * pipeline_->mean_bubble,
                    100 * pipeline_->theory);
      extra = b + extra;
    }
    std::printf("%s%s\n", line, extra.c_str());
    std::fflush(stdout);
  }
  if (csv_) {
    const int64_t samples = step * csv_samples_per_step_;
    csv_->write("Train/Samples/train_loss", samples, loss);
    csv_->write("Train/Samples/lr", samples, lr);
    if (csv_loss_scale_) csv_->write("Train/Samples/loss_scale", samples, loss_scale);
  }
  if (metrics_.is_open()) {
    nlohmann::json j = {{"step", step},           {"loss", loss},       {"lr", lr},
                        {"grad_norm", grad_norm}, {"mfu", mfu},         {"peak_mem_gib", mem_gib},
                        {"step_ms", secs * 1e3},  {"skipped", skipped}, {"loss_scale", loss_scale}};
    j[rate_key_] = rate;
    if (!std::isnan(val)) j["val_loss"] = val;
    if (breakdown_)
      j["breakdown"] = {{"data_ms", breakdown_->data_ms},
                        {"forward_backward_ms", breakdown_->forward_backward_ms},
                        {"optimizer_ms", breakdown_->optimizer_ms},
                        {"comm_busy_ms", breakdown_->comm_busy_ms},
                        {"other_ms", std::max(0.0, secs * 1e3 - breakdown_->data_ms - breakdown_->forward_backward_ms -
                                                       breakdown_->optimizer_ms)}};
    if (pipeline_)
      j["pipeline"] = {{"stage", pipeline_->stage},         {"busy_ms", pipeline_->busy_ms},
                       {"idle_ms", pipeline_->span_ms - pipeline_->busy_ms},
                       {"recv_wait_ms", pipeline_->wait_ms}, {"bubble", pipeline_->bubble},
                       {"mean_bubble", pipeline_->mean_bubble}, {"theoretical_bubble", pipeline_->theory}};
    metrics_ << j.dump() << "\n";
    metrics_.flush();
  }
}

void StepReporter::start_event(const nlohmann::json& config, const std::vector<std::string>& banner) {
  if (!metrics_.is_open()) return;
  metrics_ << nlohmann::json{{"event", "start"}, {"rank", rank_}, {"world", world_}, {"config", config},
                             {"banner", banner}}.dump()
           << "\n";
  metrics_.flush();
}

void StepReporter::checkpoint_event(int64_t step, const std::string& path, double seconds, int64_t bytes) {
  if (!metrics_.is_open()) return;
  metrics_ << nlohmann::json{{"event", "checkpoint"}, {"step", step}, {"path", path}, {"seconds", seconds},
                             {"bytes", bytes}, {"gb_per_s", seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0}}.dump()
           << "\n";
  metrics_.flush();
}

}  // namespace zp::runtime
