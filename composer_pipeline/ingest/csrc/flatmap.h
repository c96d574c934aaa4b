// A small open-addressing hash map keyed by string_view (the session code's uuid/key lookups).
// std::unordered_map allocated a node per entry and hashed with a general-purpose hash; these
// maps live for one stream, hold a few hundred to a few thousand short keys, and never erase.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

namespace cp {

// Keys are uuids, message/request ids and tool ids: their first and last 8 bytes carry the entropy
// (a weak hash only costs extra probes, never a wrong answer: keys are compared in full).
inline uint64_t hash_sv(std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t a = 0, b = 0;
  if (n >= 8) {
    std::memcpy(&a, p, 8);
    std::memcpy(&b, p + n - 8, 8);
  } else {
    std::memcpy(&a, p, n);
  }
  uint64_t h = (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^ n;
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 32);
}

template <class V>
class FlatMap {
 public:
  explicit FlatMap(size_t expected = 16) { reserve(expected); }

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    if (cap > slots_.size()) rehash(cap);
  }
  size_t size() const { return size_; }

  V* find(std::string_view k) {
    if (size_ == 0) return nullptr;
    uint64_t h = hash_sv(k);
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.hash == h && s.key == k) return &s.value;
    }
  }
  const V* find(std::string_view k) const { return const_cast<FlatMap*>(this)->find(k); }
  bool contains(std::string_view k) const { return find(k) != nullptr; }

  // (value, inserted): inserts a default value when absent (``setdefault``)
  std::pair<V*, bool> try_emplace(std::string_view k) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    uint64_t h = hash_sv(k);
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (!s.used) {
        s.used = true;
        s.hash = h;
        s.key = k;
        s.value = V();
        ++size_;
        return {&s.value, true};
      }
      if (s.hash == h && s.key == k) return {&s.value, false};
    }
  }
  V& operator[](std::string_view k) { return *try_emplace(k).first; }

  void clear() {
    for (Slot& s : slots_) s.used = false;
    size_ = 0;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    std::string_view key;
    V value{};
    bool used = false;
  };

  void rehash(size_t cap) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(cap, Slot());
    size_ = 0;
    size_t mask = cap - 1;
    for (Slot& s : old) {
      if (!s.used) continue;
      size_t i = s.hash & mask;
      while (slots_[i].used) i = (i + 1) & mask;
      slots_[i] = std::move(s);
      ++size_;
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

using FlatSet = FlatMap<char>;

}  // namespace cp
