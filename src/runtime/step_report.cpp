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
  rate_key_ = items_key() + "_per_s";
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
  const int64_t items = step_items_.value_or(items_per_step_);
  const double rate = double(items) / secs;
  items_ += double(items);
  padded_items_ += double(items_per_step_);
  if (steps_++ == 0) first_step_ = step;
  last_step_ = step;
  steps_s_ += secs;
  if (!std::isnan(val) && (std::isnan(best_val_) || val < best_val_)) {
    best_val_ = val;
    best_val_step_ = step;
  }
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
      const Breakdown& d = *breakdown_;
      char phases[96], b[256];
      if (std::isnan(d.forward_ms))
        std::snprintf(phases, sizeof(phases), "fwd+bwd %.1f", d.forward_backward_ms);
      else
        std::snprintf(phases, sizeof(phases), "fwd %.1f bwd %.1f", d.forward_ms, d.backward_ms);
      std::snprintf(b, sizeof(b), " | data %.1f %s opt %.1f comm busy %.1f exposed %.1f ms", d.data_ms, phases,
                    d.optimizer_ms, d.comm_busy_ms, d.exposed_comm_ms);
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
    if (step_items_) {
      j[items_key()] = items;
      j["padded_" + items_key()] = items_per_step_;
      j["padded_" + rate_key_] = double(items_per_step_) / secs;
    }
    if (!std::isnan(val)) j["val_loss"] = val;
    if (breakdown_) {
      const Breakdown& d = *breakdown_;
      nlohmann::json& b = j["breakdown"];
      b = {{"data_ms", d.data_ms},
           {"forward_backward_ms", d.forward_backward_ms},
           {"optimizer_ms", d.optimizer_ms},
           {"comm_busy_ms", d.comm_busy_ms},
           {"exposed_comm_ms", d.exposed_comm_ms},
           {"other_ms", std::max(0.0, secs * 1e3 - d.data_ms - d.forward_backward_ms - d.optimizer_ms)}};
      if (!std::isnan(d.forward_ms)) {
        b["forward_ms"] = d.forward_ms;
        b["backward_ms"] = d.backward_ms;
      }
      nlohmann::json kinds = nlohmann::json::object();
      for (const auto& [kind, ms] : d.comm_busy_by_kind_ms) kinds[kind] = ms;
      b["comm_busy_by_kind_ms"] = kinds;
    }
    if (pipeline_)
      j["pipeline"] = {{"stage", pipeline_->stage},         {"busy_ms", pipeline_->busy_ms},
                       {"idle_ms", pipeline_->window_ms - pipeline_->busy_ms},
                       {"recv_wait_ms", pipeline_->wait_ms}, {"recv_gap_ms", pipeline_->recv_gap_ms},
                       {"other_gap_ms", pipeline_->other_gap_ms}, {"bubble", pipeline_->bubble},
                       {"mean_bubble", pipeline_->mean_bubble}, {"theoretical_bubble", pipeline_->theory}};
    metrics_ << j.dump() << "\n";
    metrics_.flush();
  }
}

void StepReporter::start_event(const nlohmann::json& config, const std::vector<std::string>& banner,
                               const std::string& rank_line) {
  if (!metrics_.is_open()) return;
  nlohmann::json j{{"event", "start"}, {"rank", rank_}, {"world", world_}, {"config", config}, {"banner", banner}};
  if (!rank_line.empty()) j["rank_line"] = rank_line;
  metrics_ << j.dump() << "\n";
  metrics_.flush();
}

void StepReporter::checkpoint_load_event(int64_t step, const std::string& path, double seconds, int64_t bytes) {
  if (!metrics_.is_open()) return;
  metrics_ << nlohmann::json{{"event", "checkpoint_load"}, {"step", step}, {"path", path}, {"seconds", seconds},
                             {"bytes", bytes}, {"gb_per_s", seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0}}.dump()
           << "\n";
  metrics_.flush();
}

std::string StepReporter::summary(double wall_s, const std::string& last_checkpoint) {
  const double items = items_;
  const double rate = steps_s_ > 0 ? items / steps_s_ : 0.0;
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(1);
  line << "run done: " << steps_ << " step" << (steps_ == 1 ? "" : "s");
  if (steps_ > 0) line << " (" << first_step_ << ".." << last_step_ << " of " << max_steps_ << ")";
  line.precision(0);
  line << ", " << items << ' ' << unit_ << " in ";
  line.precision(1);
  line << wall_s << " s (mean " << rate << ' ' << unit_ << "/s over the steps)";
  line.precision(4);
  if (std::isnan(best_val_)) line << ", no validation";
  else line << ", best val loss " << best_val_ << " at step " << best_val_step_;
  line << ", " << (last_checkpoint.empty() ? std::string("no checkpoint") : "checkpoint " + last_checkpoint);
  if (rank_ == 0) {
    std::printf("%s\n", line.str().c_str());
    std::fflush(stdout);
  }
  if (metrics_.is_open()) {
    nlohmann::json j{{"event", "summary"}, {"rank", rank_}, {"steps", steps_}, {items_key(), items},
                     {"wall_s", wall_s}, {"steps_s", steps_s_}, {"mean_" + rate_key_, rate}};
    if (step_items_) j["padded_" + items_key()] = padded_items_;
    if (steps_ > 0) {
      j["first_step"] = first_step_;
      j["last_step"] = last_step_;
    }
    if (!std::isnan(best_val_)) {
      j["best_val_loss"] = best_val_;
      j["best_val_step"] = best_val_step_;
    }
    j["checkpoint"] = last_checkpoint.empty() ? nlohmann::json() : nlohmann::json(last_checkpoint);
    metrics_ << j.dump() << "\n";
    metrics_.flush();
  }
  return line.str();
}

std::string rank_start_line(int rank, int world, const std::string& host, const std::string& device, int numa_node,
                            double device_bytes, double host_bytes, double nvme_bytes) {
  char b[512];
  std::snprintf(b, sizeof(b), "rank %d/%d: host %s, %s, NUMA node %d | per rank: device %.2f GB, host %.2f GB, NVMe %.2f GB",
                rank, world, host.c_str(), device.c_str(), numa_node, device_bytes / 1e9, host_bytes / 1e9,
                nvme_bytes / 1e9);
  return b;
}

void StepReporter::checkpoint_event(int64_t step, const std::string& path, double seconds, int64_t bytes) {
  if (!metrics_.is_open()) return;
  metrics_ << nlohmann::json{{"event", "checkpoint"}, {"step", step}, {"path", path}, {"seconds", seconds},
                             {"bytes", bytes}, {"gb_per_s", seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0}}.dump()
           << "\n";
  metrics_.flush();
}

}  // namespace zp::runtime
