// Hub config.json readers (models/hub_keys.h): sizes are positive integers up to 2^31, heads divide
// the hidden size, products that would overflow int64 are refused, epsilons and rope_theta are
// finite positive floats, and every problem is a zp::Error naming the file and the key (never an
// abort, never an unbounded message).
#include <cmath>
#include <functional>

#include "io/bounded_json.h"
#include "models/transformer.h"
#include "models/unet.h"
#include "test_util.h"
#include "tiny_llama_config.h"
#include "tiny_unet_config.h"

namespace zp::test {
namespace {
using json = nlohmann::json;

json tiny_gpt2() {
  return {{"model_type", "gpt2"}, {"vocab_size", 100}, {"n_positions", 32}, {"n_embd", 32}, {"n_layer", 2}, {"n_head", 2}};
}


}  // namespace

TEST(HubConfigRules, TransformerSizesArePositiveBoundedAndConsistent) {
  auto parse = [](const json& j) { return models::TransformerConfig::from_hub_json(j, "config.json"); };
  EXPECT_EQ(parse(tiny_gpt2()).ffn, 128);
  EXPECT_EQ(parse(tiny_llama()).kv_heads, 2);
  struct Case {
    json base;
    std::string key;
    json value;
    std::vector<std::string> fragments;
  };
  const json big = int64_t(1) << 32;
  const std::vector<Case> cases = {
      {tiny_gpt2(), "n_inner", -4, {"'n_inner'", "-4", "[1, 2^31]"}},  // used to abort in Tensor::flat
      {tiny_gpt2(), "n_embd", 0, {"'n_embd'", "= 0"}},
      {tiny_gpt2(), "n_layer", -2, {"'n_layer'", "-2"}},
      {tiny_gpt2(), "n_head", 0, {"'n_head'"}},
      {tiny_gpt2(), "n_head", 3, {"'n_embd' = 32", "'n_head' = 3"}},
      {tiny_gpt2(), "n_positions", 2.5, {"'n_positions'", "2.5"}},
      {tiny_gpt2(), "vocab_size", big, {"'vocab_size'", "4294967296"}},
      {tiny_gpt2(), "vocab_size", json(UINT64_MAX), {"'vocab_size'", "18446744073709551615"}},
      {tiny_gpt2(), "layer_norm_epsilon", 0, {"'layer_norm_epsilon'", "> 0"}},
      {tiny_gpt2(), "layer_norm_epsilon", 1e-60, {"'layer_norm_epsilon'", "> 0"}},
      {tiny_gpt2(), "activation_function", std::string(5000, 'g'), {"'activation_function'", "ggg..."}},
      {tiny_llama(), "hidden_size", -32, {"'hidden_size'", "-32"}},
      {tiny_llama(), "intermediate_size", 0, {"'intermediate_size'"}},
      {tiny_llama(), "num_attention_heads", 6, {"'hidden_size' = 32", "'num_attention_heads' = 6"}},
      {tiny_llama(), "num_key_value_heads", 0, {"'num_key_value_heads'"}},
      {tiny_llama(), "num_key_value_heads", 3, {"4 attention heads cannot share 3"}},
      {tiny_llama(), "head_dim", -8, {"'head_dim'"}},
      {tiny_llama(), "max_position_embeddings", -1, {"'max_position_embeddings'"}},
      {tiny_llama(), "rope_theta", "big", {"'rope_theta'", "\"big\"", "> 0"}},
      {tiny_llama(), "rope_theta", INFINITY, {"'rope_theta'", "inf"}},
      {tiny_llama(), "rope_theta", 1e300, {"'rope_theta'", "as a float"}},
      {tiny_llama(), "rope_theta", -1, {"'rope_theta'", "-1"}},
      {tiny_llama(), "rope_parameters", {{"rope_theta", "x"}}, {"'rope_parameters.rope_theta'"}},
      {tiny_llama(), "rope_parameters", {{"rope_type", 3}}, {"'rope_parameters.rope_type'"}},
      {tiny_llama(), "rope_parameters", 7, {"'rope_parameters'", "object"}},
      {tiny_llama(), "rms_norm_eps", "tiny", {"'rms_norm_eps'"}},
      {tiny_llama(), "tie_word_embeddings", 1, {"'tie_word_embeddings'", "true or false"}},
  };
  for (const Case& c : cases) {
    json j = c.base;
    j[c.key] = c.value;
    SCOPED_TRACE(c.key + " = " + io::json_excerpt(c.value));
    expect_error([&] { parse(j); }, c.fragments);
    EXPECT_LT(error_message([&] { parse(j); }).size(), 400u);
  }
  // Each size fits 2^31, but the products do not fit int64.
  json wide = tiny_llama();
  wide["hidden_size"] = int64_t(1) << 30;
  wide["intermediate_size"] = int64_t(1) << 31;
  wide["vocab_size"] = int64_t(1) << 31;
  expect_error([&] { parse(wide); }, {"config.json", "2^56"});
  expect_error([&] { parse(json::array()); }, {"config.json", "not a JSON object"});
}

TEST(HubConfigRules, UNetSizesArePositiveAndBounded) {
  auto parse = [](const json& j) { return models::UNetConfig::from_hub_json(j, "unet/config.json"); };
  EXPECT_EQ(parse(tiny_unet_config()).block_out.size(), 2u);
  struct Case {
    std::string key;
    json value;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"block_out_channels", {16, -32}, {"'block_out_channels'", "-32"}},
      {"block_out_channels", {16, 32.5}, {"'block_out_channels'", "32.5"}},
      {"block_out_channels", {16, int64_t(1) << 40}, {"'block_out_channels'", "1099511627776"}},
      {"layers_per_block", 0, {"'layers_per_block'"}},
      {"layers_per_block", {1, -1}, {"'layers_per_block'"}},
      {"attention_head_dim", 0, {"'attention_head_dim'"}},
      {"attention_head_dim", 2.5, {"'attention_head_dim'"}},
      {"cross_attention_dim", -16, {"'cross_attention_dim'"}},
      {"cross_attention_dim", int64_t(1) << 32, {"'cross_attention_dim'"}},
      {"transformer_layers_per_block", 0, {"'transformer_layers_per_block'"}},
      {"norm_num_groups", 0, {"'norm_num_groups'"}},
      {"in_channels", -4, {"'in_channels'"}},
      {"out_channels", 0, {"'out_channels'"}},
      {"time_embedding_dim", -1, {"'time_embedding_dim'"}},
      {"conv_in_kernel", 2.0, {"'conv_in_kernel'"}},
      {"norm_eps", 0, {"'norm_eps'", "> 0"}},
      {"norm_eps", "small", {"'norm_eps'"}},
      {"freq_shift", INFINITY, {"'freq_shift'", "finite"}},
      {"mid_block_scale_factor", 1e300, {"'mid_block_scale_factor'"}},
  };
  for (const Case& c : cases) {
    json j = tiny_unet_config();
    j[c.key] = c.value;
    SCOPED_TRACE(c.key + " = " + io::json_excerpt(c.value));
    expect_error([&] { parse(j); }, c.fragments);
  }
  json sdxl = tiny_unet_config(true);
  sdxl["addition_time_embed_dim"] = -8;
  expect_error([&] { parse(sdxl); }, {"'addition_time_embed_dim'"});
  // Sizes within 2^31 whose products would overflow int64.
  json wide = tiny_unet_config();
  wide["block_out_channels"] = {int64_t(1) << 30, int64_t(1) << 30};
  wide["norm_num_groups"] = 1;
  wide["attention_head_dim"] = 1;
  expect_error([&] { parse(wide); }, {"unet/config.json", "2^56"});
}

}  // namespace zp::test
