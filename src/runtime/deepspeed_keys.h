// Every key of DeepSpeed's configuration reference (docs/_pages/config-json.md: the top level and
// zero_optimization, with the sections they hold) and what zeropipe does with it, as one table:
//   Honoured: read and given DeepSpeed's meaning, mapped onto the engine (TrainConfig::read);
//   Warned:   accepted; when it asks for something (a value other than DeepSpeed's default, or a
//             section that is enabled) one warning names it and says why it means nothing here;
//   Refused:  a meaning the engine does not have and must not silently drop: asking for it is an
//             error naming the key (its default, or a disabled section, is accepted).
// Keys that are neither DeepSpeed's nor zeropipe's stay errors (io::Config). configs/README.md shows
// the same table; a test keeps the two equal.
#pragma once
#include <span>
#include <string_view>

#include "io/config_reader.h"

namespace zp::runtime {

enum class KeyHandling { Honoured, Warned, Refused };

struct DeepSpeedKey {
  std::string_view path;      // dotted, as in the JSON file
  KeyHandling handling;
  std::string_view meaning;   // Honoured: what it maps to; Warned: why it means nothing; Refused: what is missing
  // For a section whose schema default is null: the key inside it that switches it on ("" = any
  // content does). The section is off while that key is absent, false, 0 or 1.
  std::string_view on_switch = "enabled";
};

std::span<const DeepSpeedKey> deepspeed_keys();

// Records a warning (ConfigReader::warn) for each Warned key that asks for something, and a problem
// for each Refused one. "auto" asks for nothing in these keys.
void check_deepspeed_keys(io::ConfigReader& r);

}  // namespace zp::runtime
