// Reading and quoting JSON that comes from users' files without unbounded recursion or output.
//
// nlohmann's parser is iterative, but copying, comparing and dump()ing a value recurse once per
// nesting level, so a file nested 100000 deep would overflow the stack long after it parsed. Files
// are therefore rejected past kMaxJsonDepth while they are parsed, and values are quoted in error
// messages through json_excerpt, which walks iteratively and stops after a bounded number of
// characters.
#pragma once
#include <nlohmann/json.hpp>
#include <cstddef>
#include <istream>
#include <string>
#include <string_view>

namespace zp::io {

// Deeper than any training or hub config (they nest at most five levels), shallow enough that
// recursive copies and comparisons stay far from the stack's limit.
inline constexpr int kMaxJsonDepth = 64;

// The document in `in` / `text`, or a zp::Error naming `source`: "<source>: not valid JSON: ..."
// (with the parser's message, bounded) or "<source>: JSON nested deeper than 64 levels". Numbers
// that do not fit a double (1e400) are parse errors, never infinities.
nlohmann::json parse_json_bounded(std::istream& in, const std::string& source, bool ignore_comments = false);
nlohmann::json parse_json_bounded(std::string_view text, const std::string& source, bool ignore_comments = false);

// For command-line values: the JSON document `text` when it is one, else `text` itself as a string
// ("cpu"). Nesting past kMaxJsonDepth, or a number beyond a double's range (1e400), is a zp::Error
// naming `source` rather than a string.
nlohmann::json parse_json_or_string(std::string_view text, const std::string& source);

// True when containers in `v` nest more than `max_depth` levels (a scalar is depth 0); iterative.
bool nested_deeper_than(const nlohmann::json& v, int max_depth);

// `v` as compact JSON, cut after about max_chars characters with "..." appended; iterative, so any
// depth is safe.
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 80);
// `s` itself, cut the same way (for library messages that quote input).
std::string text_excerpt(std::string_view s, size_t max_chars = 200);

}  // namespace zp::io
