#include "io/bounded_json.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace zp::io {
namespace {

using json = nlohmann::json;

// A parser callback that stops at the first container opened past kMaxJsonDepth: nlohmann hands it
// the number of containers already open.
json::parser_callback_t depth_limit(const std::string& source) {
  return [&source](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw Error(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
}

template <class Input> json parse_with_depth_limit(Input&& in, const std::string& source, bool ignore_comments) {
  try {
    return json::parse(std::forward<Input>(in), depth_limit(source), /*allow_exceptions=*/true, ignore_comments);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number beyond a double's range.
    throw Error(source + ": not valid JSON: " + text_excerpt(e.what()));
  }
}

}  // namespace

json parse_json_bounded(std::istream& in, const std::string& source, bool ignore_comments) {
  return parse_with_depth_limit(in, source, ignore_comments);
}

json parse_json_bounded(std::string_view text, const std::string& source, bool ignore_comments) {
  return parse_with_depth_limit(text, source, ignore_comments);
}

json parse_json_or_string(std::string_view text, const std::string& source) {
  try {
    return json::parse(text, depth_limit(source));
  } catch (const json::out_of_range& e) {
    throw Error(source + ": " + text_excerpt(e.what()) + " (beyond a double's range)");
  } catch (const json::exception&) {
    return std::string(text);
  }
}

bool nested_deeper_than(const json& v, int max_depth) {
  struct Open {
    const json* container;
    int depth;
  };
  std::vector<Open> pending;
  if (v.is_structured()) pending.push_back({&v, 1});
  while (!pending.empty()) {
    const Open o = pending.back();
    pending.pop_back();
    if (o.depth > max_depth) return true;
    for (const json& child : *o.container)
      if (child.is_structured()) pending.push_back({&child, o.depth + 1});
  }
  return false;
}

std::string text_excerpt(std::string_view s, size_t max_chars) {
  if (s.size() <= max_chars) return std::string(s);
  return std::string(s.substr(0, max_chars)) + "...";
}

std::string json_excerpt(const json& v, size_t max_chars) {
  // Cutting a string may split a UTF-8 sequence, which dump() would throw on by default.
  auto quote = [](const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); };
  std::string out;
  auto full = [&] { return out.size() >= max_chars; };
  // A string is quoted from its first characters only, so a huge one is never copied whole.
  auto scalar = [&](const json& x) {
    if (x.is_string()) {
      const std::string& s = x.get_ref<const std::string&>();
      out += quote(s.substr(0, max_chars));
      if (s.size() > max_chars) out.insert(out.size() - 1, "...");
    } else if (x.is_number_float() && !std::isfinite(x.get<double>())) {
      out += x.get<double>() != x.get<double>() ? "nan" : x.get<double>() > 0 ? "inf" : "-inf";  // dump() says null
    } else {
      out += x.dump();  // numbers, booleans, null: short and flat
    }
  };
  struct Open {
    const json* container;
    json::const_iterator next;
  };
  if (!v.is_structured()) {
    scalar(v);
    return out;
  }
  std::vector<Open> stack;
  auto open = [&](const json& x) {
    if (!x.is_structured()) return scalar(x);
    out += x.is_object() ? '{' : '[';
    stack.push_back({&x, x.cbegin()});
  };
  open(v);
  while (!stack.empty() && !full()) {
    Open& top = stack.back();
    if (top.next == top.container->cend()) {
      out += top.container->is_object() ? '}' : ']';
      stack.pop_back();
      continue;
    }
    if (top.next != top.container->cbegin()) out += ',';
    const json::const_iterator child = top.next++;
    if (top.container->is_object()) out += quote(child.key().substr(0, max_chars)) + ':';
    open(*child);  // may invalidate `top`
  }
  if (!stack.empty() || out.size() > max_chars) {
    out.resize(std::min(out.size(), max_chars));
    out += "...";
  }
  return out;
}

}  // namespace zp::io
