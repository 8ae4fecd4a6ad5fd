// The decode-graph cache's policy (core/lru_cache.h) on the CPU, with a stand-in for a CUDA graph
// that counts how many exist: the cache never holds more than its capacity, evicts the least
// recently used shape (a use refreshes it), destroys what it evicts, and a long job of changing batch
// shapes keeps the count bounded. The engine derives the capacity from max_graph_seqs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/lru_cache.h"
#include "io/weight_source.h"
#include "runtime/generation_engine.h"
#include "test_util.h"

namespace zp::test {
namespace {

using Shape2 = std::pair<int64_t, int64_t>;  // (rows, block-table width), as the engine keys graphs

// Stands in for a captured graph: counts the live ones, remembers the shape it was made for.
struct FakeGraph {
  static inline int64_t live = 0;
  Shape2 shape{-1, -1};
  int64_t uses = 0;
  FakeGraph() { ++live; }
  ~FakeGraph() { --live; }
  FakeGraph(const FakeGraph&) = delete;
  FakeGraph& operator=(const FakeGraph&) = delete;
};

TEST(LruCache, EvictsTheLeastRecentlyUsedAndDestroysIt) {
  {
    LruCache<Shape2, FakeGraph> cache(3);
    for (int64_t rows : {1, 2, 4}) cache.get({rows, 8}).shape = {rows, 8};
    EXPECT_EQ(cache.size(), 3);
    EXPECT_EQ(FakeGraph::live, 3);
    // A use refreshes (1, 8): the next new shape evicts (2, 8), the least recently used.
    EXPECT_EQ(cache.get({1, 8}).shape, Shape2(1, 8));
    cache.get({8, 8}).shape = {8, 8};
    EXPECT_FALSE(cache.contains({2, 8}));
    EXPECT_TRUE(cache.contains({1, 8}) && cache.contains({4, 8}) && cache.contains({8, 8}));
    EXPECT_EQ(cache.evictions(), 1);
    EXPECT_EQ(FakeGraph::live, 3) << "the evicted graph is destroyed";
    // A shape that comes back is a new entry (captured again), evicting (4, 8).
    FakeGraph& again = cache.get({2, 8});
    EXPECT_EQ(again.shape, Shape2(-1, -1));
    EXPECT_EQ(again.uses, 0);
    EXPECT_FALSE(cache.contains({4, 8}));
    EXPECT_EQ(cache.evictions(), 2);
  }
  EXPECT_EQ(FakeGraph::live, 0);
  using Small = LruCache<Shape2, FakeGraph>;
  EXPECT_DEATH(Small(0), "capacity 0");
}

// A long continuous-batching job: the batch size and the longest context drift step by step. The
// cache follows a plain list model of LRU exactly and never holds more than its capacity.
TEST(LruCache, LongJobOfChangingShapesStaysBoundedAndFollowsLru) {
  for (int64_t capacity : {1, 2, 14}) {
    LruCache<Shape2, FakeGraph> cache(capacity);
    std::vector<Shape2> model;  // most recently used first
    std::mt19937_64 g{uint64_t(capacity)};
    int64_t rows = 1, width = 1, evicted = 0;
    for (int step = 0; step < 20000; ++step) {
      if (g() % 4 == 0) rows = std::clamp<int64_t>(g() % 2 ? rows * 2 : rows / 2, 1, 64);
      if (g() % 16 == 0) width = g() % 3 == 0 ? 1 : std::min<int64_t>(width * 2, 8192);
      const Shape2 key{rows, width};
      FakeGraph& graph = cache.get(key);
      if (graph.uses++ == 0) graph.shape = key;
      EXPECT_EQ(graph.shape, key);
      auto it = std::find(model.begin(), model.end(), key);
      if (it != model.end()) {
        model.erase(it);
      } else if (int64_t(model.size()) == capacity) {
        EXPECT_FALSE(cache.contains(model.back()));
        model.pop_back();
        ++evicted;
      }
      model.insert(model.begin(), key);
      ASSERT_LE(cache.size(), capacity);
      ASSERT_EQ(FakeGraph::live, cache.size());
      ASSERT_EQ(cache.size(), int64_t(model.size()));
    }
    for (const Shape2& k : model) EXPECT_TRUE(cache.contains(k));
    EXPECT_EQ(cache.evictions(), evicted);
    EXPECT_GT(evicted, 0) << "capacity " << capacity << ": the job never overflowed the cache";
  }
  EXPECT_EQ(FakeGraph::live, 0);
}

// The engine's capacity: max_graphs when given, else two per power-of-two row count up to
// max_graph_seqs; a negative one is refused naming the key.
TEST(LruCache, GenerationEngineDerivesItsGraphCapacity) {
  const io::json hub = io::hub_config_of(golden_path("llama-tiny"));
  models::Transformer model(models::TransformerConfig::from_hub_json(hub, "llama-tiny"), Device::cpu(), DType::F32);
  auto capacity = [&](int64_t max_graph_seqs, int64_t max_graphs) {
    runtime::GenerationOptions o;
    o.kv_cache_bytes = 1 << 20;
    o.max_graph_seqs = max_graph_seqs;
    o.max_graphs = max_graphs;
    return runtime::GenerationEngine(model, nullptr, o).graph_capacity();
  };
  EXPECT_EQ(capacity(64, 0), 14);  // rows 1, 2, 4, ..., 64
  EXPECT_EQ(capacity(48, 0), 14);  // 48 pads up to 64
  EXPECT_EQ(capacity(1, 0), 2);
  EXPECT_EQ(capacity(64, 3), 3);
  test::expect_error([&] { capacity(64, -1); }, {"max_graphs", "-1"});
}

}  // namespace
}  // namespace zp::test
