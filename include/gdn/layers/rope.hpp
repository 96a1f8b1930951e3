#pragma once
// Partial rotary position embedding, NeoX pairing. Only the first rotary_dim dims of each head
// rotate; dim i pairs with i + rotary_dim/2 (not head_dim/2). Qwen3.5's interleaved mRoPE reduces to
// this for text, since its three position streams are then equal.

#include <cmath>
#include <cstdint>
#include <vector>

namespace gdn::layers {

class Rope {
 public:
  Rope() = default;
  Rope(int rotary_dim, double theta) : rotary_dim_(rotary_dim) {
    inv_freq_.resize(static_cast<std::size_t>(rotary_dim / 2));
    for (int i = 0; i < rotary_dim / 2; ++i)
      inv_freq_[static_cast<std::size_t>(i)] =
          static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / rotary_dim));
  }

  int rotary_dim() const noexcept { return rotary_dim_; }

  // cos/sin of every frequency at `position`, as transformers computes them: angle in float32.
  void angles(std::int64_t position, float* cos_out, float* sin_out) const {
    const float p = static_cast<float>(position);
    for (std::size_t i = 0; i < inv_freq_.size(); ++i) {
      const float a = p * inv_freq_[i];
      cos_out[i] = std::cos(a);
      sin_out[i] = std::sin(a);
    }
  }

  // Rotates one head in place.
  void apply(float* head, const float* cos_v, const float* sin_v) const {
    const int half = rotary_dim_ / 2;
    for (int i = 0; i < half; ++i) {
      const float x1 = head[i];
      const float x2 = head[i + half];
      head[i] = x1 * cos_v[i] - x2 * sin_v[i];
      head[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
    }
  }

 private:
  int rotary_dim_ = 0;
  std::vector<float> inv_freq_;
};

}  // namespace gdn::layers
