#include "app/inspect_command.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "io/checkpoint_file.h"
#include "io/h5file.h"

namespace zp::app {
namespace fs = std::filesystem;

namespace {

// Every group of the file is reached by one path only. The tree walkers (io::inspect's listing,
// verify_checksums, count_parameters) recurse into every group they meet, so a hard link back to an
// ancestor would have them recurse until the stack overflows, and groups linked from several places
// multiply the work; HDF5 allows both, ZeRO-Pipe files have neither. Throws naming the links.
void require_plain_tree(const io::H5File& f, const std::string& group, std::map<uint64_t, std::string>& seen) {
  const auto [at, fresh] = seen.emplace(f.object_id(group), group);
  ZP_REQUIRE(fresh, f.path(), ": group '", group, "' is the same group as '", at->second,
             "' (a hard link; inspect does not follow groups linked from several places or link cycles)");
  for (const std::string& c : f.children(group)) {
    const std::string p = group == "/" ? "/" + c : group + "/" + c;
    if (f.is_group(p)) require_plain_tree(f, p, seen);
  }
}

void count_parameters(const io::H5File& f, const std::string& group, int64_t& params, int64_t& tensors) {
  for (const std::string& c : f.children(group)) {
    const std::string p = group + "/" + c;
    if (f.is_group(p)) {
      count_parameters(f, p, params, tensors);
    } else if (f.is_dataset(p)) {
      params += f.dataset_info(p).numel();
      ++tensors;
    }
  }
}

// 124439808 -> "124,439,808"
std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out = v < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The model section: ZeRO-Pipe files (weights or checkpoints) only.
void describe_model(std::ostream& o, const std::string& path) {
  io::H5File f = io::H5File::open(path);
  if (!f.has_attr("/", "zeropipe_format")) return;
  auto string_attr = [&](const char* name) -> std::string {
    return f.has_attr("/", name) && f.attr_kind("/", name) == io::AttrKind::String ? f.attr_string("/", name) : "";
  };
  const std::string kind = string_attr("kind"), family = string_attr("model_family"), cfg = string_attr("config");
  o << "\nmodel: " << (kind.empty() ? "ZeRO-Pipe file" : kind + " file");
  if (!family.empty()) o << ", family " << family;
  o << "\n";
  if (f.is_group("/model")) {
    int64_t params = 0, tensors = 0;
    count_parameters(f, "/model", params, tensors);
    char short_form[32];
    std::snprintf(short_form, sizeof short_form, "%.2fM", double(params) / 1e6);
    o << "parameters: " << with_commas(params) << " (" << short_form << ") in " << tensors << " tensors under /model\n";
  } else {
    o << "parameters: none (no /model group)\n";
  }
  if (!cfg.empty()) {
    o << "config:\n";
    try {
      o << nlohmann::json::parse(cfg).dump(2) << "\n";
    } catch (const std::exception&) {
      o << cfg << "\n(the config attribute is not valid JSON)\n";
    }
  }
}

// What makes a ZeRO-Pipe file unverifiable even when every checksum that could be read matched:
// verify_checksums skips what it cannot open (a damaged /model would leave nothing to compare and
// read as "ok (0 datasets)"), so its tensors must be reachable and at least one must carry checksums.
std::vector<std::string> unverifiable_model(const std::string& path, const io::ChecksumReport& rep) {
  std::vector<std::string> why;
  io::H5File f = io::H5File::open(path);
  if (!f.has_attr("/", "zeropipe_format")) return why;  // another tool's file: nothing is promised
  if (!f.is_group("/model")) {
    why.push_back(f.exists("/model") ? "/model cannot be read as a group" : "no /model group");
    return why;
  }
  // Every link under /model must lead to a group or a dataset that HDF5 can open.
  std::vector<std::string> groups = {"/model"};
  while (!groups.empty()) {
    const std::string g = groups.back();
    groups.pop_back();
    std::vector<std::string> names;
    try {
      names = f.children(g);
    } catch (const Error& e) {
      why.push_back(g + ": cannot list: " + e.what());
      continue;
    }
    for (const std::string& c : names) {
      const std::string p = g + "/" + c;
      if (f.is_group(p)) groups.push_back(p);
      else if (!f.is_dataset(p)) why.push_back(p + ": cannot be read (neither a group nor a dataset)");
    }
  }
  if (rep.datasets == 0) why.push_back("no dataset carries slice checksums, so nothing was verified");
  return why;
}

}  // namespace

InspectReport inspect_report(const std::string& path, bool verify) {
  std::error_code ec;
  ZP_REQUIRE(fs::exists(path, ec), path, ": no such file", ec ? " (" + ec.message() + ")" : "");
  ZP_REQUIRE(!fs::is_directory(path, ec), path, ": is a folder, not an HDF5 file");
  {
    const io::H5File f = io::H5File::open(path);
    std::map<uint64_t, std::string> seen;
    require_plain_tree(f, "/", seen);
  }
  InspectReport r;
  std::ostringstream o;
  o << io::inspect(path, false);
  describe_model(o, path);
  if (verify) {  // verified here rather than by io::inspect, to know the outcome without parsing text
    io::ChecksumReport rep;
    std::vector<std::string> unverifiable;
    try {
      rep = io::verify_checksums(path);
      unverifiable = unverifiable_model(path, rep);
    } catch (const Error& e) {  // a damaged file cannot be verified: that is the answer, not a crash
      unverifiable.push_back(std::string("cannot verify: ") + e.what());
    }
    r.ok = rep.ok() && unverifiable.empty();
    o << "\nchecksums: " << (r.ok ? "ok" : "FAILED") << " (" << rep.datasets << " datasets, " << rep.slices
      << " slices";
    if (rep.unchecked) o << ", " << rep.unchecked << " datasets without checksums";
    o << ")\n";
    for (const auto& p : unverifiable) o << "  " << p << "\n";
    for (const auto& p : rep.problems) o << "  " << p << "\n";
  }
  r.text = o.str();
  return r;
}

int run_inspect(const std::string& path, bool verify) {
  const InspectReport r = inspect_report(path, verify);
  std::fputs(r.text.c_str(), stdout);
  std::fflush(stdout);
  return r.ok ? 0 : 1;
}

}  // namespace zp::app
