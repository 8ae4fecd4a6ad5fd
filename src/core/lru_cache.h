// A map of bounded size that evicts its least recently used entry: what keeps generation's decode
// CUDA graphs (one per batch shape, each holding device memory) from growing without limit in a long
// job whose batch sizes and context lengths keep changing. A template so that the policy is tested
// on the CPU with a stand-in value; values are destroyed on eviction (a graph frees its executable).
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace zp {

template <class Key, class Value>
class LruCache {
 public:
  explicit LruCache(int64_t capacity) : capacity_(capacity) {
    ZP_CHECK(capacity > 0, "LruCache: capacity ", capacity, " must be > 0");
  }
  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // The entry of `key`, now the most recently used; a new one is value-initialised, after the least
  // recently used entry is destroyed when the cache is full. The reference stays valid until an
  // entry is evicted for another key.
  Value& get(const Key& key) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    if (int64_t(order_.size()) == capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++evictions_;
    }
    order_.emplace_front(std::piecewise_construct, std::forward_as_tuple(key), std::forward_as_tuple());
    index_.emplace(key, order_.begin());
    return order_.front().second;
  }
  bool contains(const Key& key) const { return index_.count(key) != 0; }
  int64_t size() const { return int64_t(order_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t evictions() const { return evictions_; }

 private:
  using Entry = std::pair<Key, Value>;
  int64_t capacity_;
  int64_t evictions_ = 0;
  std::list<Entry> order_;  // most recently used first
  std::map<Key, typename std::list<Entry>::iterator> index_;
};

}  // namespace zp
