#pragma once
// Helpers shared by the tests: fixture paths, reading the golden references (safetensors written
// by tests/fixtures/make_fixtures.py from transformers), and running prompts through a Context.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gdn/gdn.hpp"
#include "gdn/io/safetensors.hpp"

namespace gdn::test {

// The source tree, as built; GDN_SOURCE_DIR in the environment overrides it (binaries carried to
// another machine, scripts/device-check.sh).
inline std::string source_dir() {
  const char* e = std::getenv("GDN_SOURCE_DIR");
  return e != nullptr ? std::string(e) : std::string(GDN_SOURCE_DIR);
}
inline std::string fixtures_dir() {
  const char* e = std::getenv("GDN_SOURCE_DIR");
  return e != nullptr ? std::string(e) + "/tests/fixtures" : std::string(GDN_FIXTURES_DIR);
}
inline std::string fixture_model(const std::string& name) { return fixtures_dir() + "/models/" + name; }
inline std::string fixture_reference(const std::string& name) {
  return fixtures_dir() + "/reference/" + name + ".safetensors";
}

class Reference {
 public:
  explicit Reference(const std::string& name) : file_(fixture_reference(name)) {}
  bool has(const std::string& tensor) const { return file_.find(tensor) != nullptr; }
  std::vector<Token> tokens(const std::string& tensor) const {
    const TensorView t = view(tensor);
    std::vector<Token> out(static_cast<std::size_t>(t.numel()));
    std::memcpy(out.data(), t.data, out.size() * sizeof(Token));
    return out;
  }
  std::vector<float> floats(const std::string& tensor) const {
    const TensorView t = view(tensor);
    std::vector<float> out(static_cast<std::size_t>(t.numel()));
    std::memcpy(out.data(), t.data, out.size() * sizeof(float));
    return out;
  }
  TensorView view(const std::string& tensor) const {
    const auto* e = file_.find(tensor);
    if (e == nullptr) throw Error(Status::missing_tensor, "reference has no " + tensor);
    return file_.view(*e);
  }

 private:
  io::SafetensorsFile file_;
};

inline float max_abs_diff(const float* a, const float* b, std::size_t n) {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

inline double rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t j = 0; j < a.size(); ++j) s += (static_cast<double>(a[j]) - b[j]) * (static_cast<double>(a[j]) - b[j]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

// Runs `tokens` through a fresh sequence of `ctx` as one step and returns [T, V] logits.
inline std::vector<float> prefill_logits(Context& ctx, std::span<const Token> tokens) {
  const SeqId s = ctx.create_sequence();
  Batch b;
  b.add(s, tokens, LogitsFor::all);
  ctx.step(b);
  std::vector<float> out;
  for (std::int64_t t = 0; t < static_cast<std::int64_t>(tokens.size()); ++t) {
    const auto row = ctx.logits(t);
    out.insert(out.end(), row.begin(), row.end());
  }
  ctx.free_sequence(s);
  return out;
}

// Feeds `tokens` one per step and returns [T, V] logits.
inline std::vector<float> decode_logits(Context& ctx, std::span<const Token> tokens) {
  const SeqId s = ctx.create_sequence();
  std::vector<float> out;
  Batch b;
  for (const Token t : tokens) {
    b.clear();
    b.add(s, t, LogitsFor::last);
    ctx.step(b);
    const auto row = ctx.logits(0);
    out.insert(out.end(), row.begin(), row.end());
  }
  ctx.free_sequence(s);
  return out;
}

}  // namespace gdn::test
