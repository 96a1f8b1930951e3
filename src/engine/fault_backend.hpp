#pragma once
// Private: a backend wrapper that injects the "dropped conv state" bug of a known server (every
// GDN conv state of a pass's sequences zeroed before the pass runs), through the backend's own
// state primitives, so the checks that must catch it can be shown to. Test hook only.

#include <memory>
#include <vector>

#include "../backend/backend.hpp"

namespace gdn {

class DropConvStateBackend final : public BackendInterface {
 public:
  explicit DropConvStateBackend(std::unique_ptr<BackendInterface> inner) : inner_(std::move(inner)) {
    const auto& l = inner_->layout();
    conv_.resize(static_cast<std::size_t>(l.gdn_layers * l.conv_floats));
    recurrent_.resize(static_cast<std::size_t>(l.recurrent_bytes_per_slot()));
  }

  const char* name() const noexcept override { return inner_->name(); }
  const StateLayout& layout() const noexcept override { return inner_->layout(); }
  void forward(const PassPlan& plan, const PassOutputs& out) override {
    for (const auto& s : plan.segments) {
      inner_->read_slot(s.slot, conv_.data(), recurrent_.data());
      std::fill(conv_.begin(), conv_.end(), 0.0f);
      inner_->write_slot(s.slot, conv_.data(), recurrent_.data());
    }
    inner_->forward(plan, out);
  }
  void clear_slot(int slot) override { inner_->clear_slot(slot); }
  void copy_slot(int from, int to) override { inner_->copy_slot(from, to); }
  void copy_kv_page(std::int32_t from, std::int32_t to) override { inner_->copy_kv_page(from, to); }
  void rollback(int slot, std::int64_t keep) override { inner_->rollback(slot, keep); }
  std::unique_ptr<StateCopy> save_slot(int slot) override { return inner_->save_slot(slot); }
  void restore_slot(int slot, const StateCopy& copy) override { inner_->restore_slot(slot, copy); }
  void read_slot(int slot, float* conv, std::byte* recurrent) override { inner_->read_slot(slot, conv, recurrent); }
  void write_slot(int slot, const float* conv, const std::byte* recurrent) override { inner_->write_slot(slot, conv, recurrent); }
  void read_kv_page(std::int32_t page, float* out) override { inner_->read_kv_page(page, out); }
  void write_kv_page(std::int32_t page, const float* in) override { inner_->write_kv_page(page, in); }
  std::int64_t rollback_bytes_per_sequence() const noexcept override { return inner_->rollback_bytes_per_sequence(); }
  std::int64_t kv_bytes_per_token() const noexcept override { return inner_->kv_bytes_per_token(); }
  bool usable() const noexcept override { return inner_->usable(); }

 private:
  std::unique_ptr<BackendInterface> inner_;
  std::vector<float> conv_;
  std::vector<std::byte> recurrent_;
};

}  // namespace gdn
