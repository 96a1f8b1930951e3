#pragma once
// Errors. Every failure the library can report carries a Status code (stable, mirrored one-to-one
// by the C ABI's gdn_status) and a message that names the offending file, field or value. C++
// callers get a gdn::Error exception; the C ABI catches it at the boundary.

#include <stdexcept>
#include <string>
#include <string_view>

namespace gdn {

// Values are part of the ABI: never renumber, never reuse a retired value.
enum class Status : int {
  ok = 0,
  invalid_argument = 1,     // a parameter the caller passed is out of range or inconsistent
  io_error = 2,             // a file could not be opened, mapped or read
  invalid_file = 3,         // a file's bytes are malformed or truncated (safetensors, json)
  unsupported_model = 4,    // the config names an architecture or feature libgdn does not run
  missing_tensor = 5,       // a tensor the config implies is absent from the checkpoint
  tensor_mismatch = 6,      // a tensor exists but its dtype or shape is not what the config implies
  out_of_capacity = 7,      // a sequence slot, KV page or scratch limit is exhausted
  invalid_sequence = 8,     // a sequence id is stale, freed or never existed
  context_overflow = 9,     // a sequence would grow past the context's max length
  invalid_token = 10,       // a token id outside [0, vocab_size)
  backend_unavailable = 11, // the requested backend was not built or has no device
  internal = 12,            // a bug in libgdn; please report it
  busy = 13,                // the object is in use by another thread (or by the call whose callback is running)
};

std::string_view status_name(Status s) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace gdn
