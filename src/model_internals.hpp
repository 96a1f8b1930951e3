#pragma once
// Private: what backends need of a Model beyond its public interface: the checkpoint (to let go of
// its pages after packing, to read tensors for an upload), and a place to keep their own form of
// the weights, made once per model and key (a backend and device) and shared by its contexts.

#include <functional>
#include <memory>
#include <string>

#include "gdn/model/model.hpp"

namespace gdn::detail {

struct ModelInternals {
  static const io::Checkpoint& checkpoint(const Model& m) { return *m.checkpoint_; }

  // The object stored under `key`, made by make() the first time it is asked for (under a lock, so
  // two contexts created at once make it once). A failed make() stores nothing.
  static std::shared_ptr<const void> prepared(const Model& m, const std::string& key,
                                              const std::function<std::shared_ptr<const void>()>& make);
  // The object under `key` if it was made, else null.
  static std::shared_ptr<const void> find_prepared(const Model& m, const std::string& key);
};

}  // namespace gdn::detail
