// The tiny Llama hub config.json the config-rule tests share (grouped-query attention, 70 tokens):
// valid as it is, so each test changes one key to see that key's error.
#pragma once
#include <nlohmann/json.hpp>

namespace zp::test {

inline nlohmann::json tiny_llama() {
  return {{"model_type", "llama"},       {"vocab_size", 70},        {"hidden_size", 32},
          {"intermediate_size", 64},     {"num_hidden_layers", 2},  {"num_attention_heads", 4},
          {"num_key_value_heads", 2},    {"max_position_embeddings", 32}};
}

}  // namespace zp::test
