#include "gdn/core/error.hpp"

namespace gdn {

std::string_view status_name(Status s) noexcept {
  switch (s) {
    case Status::ok: return "ok";
    case Status::invalid_argument: return "invalid_argument";
    case Status::io_error: return "io_error";
    case Status::invalid_file: return "invalid_file";
    case Status::unsupported_model: return "unsupported_model";
    case Status::missing_tensor: return "missing_tensor";
    case Status::tensor_mismatch: return "tensor_mismatch";
    case Status::out_of_capacity: return "out_of_capacity";
    case Status::invalid_sequence: return "invalid_sequence";
    case Status::context_overflow: return "context_overflow";
    case Status::invalid_token: return "invalid_token";
    case Status::backend_unavailable: return "backend_unavailable";
    case Status::internal: return "internal";
    case Status::busy: return "busy";
  }
  return "unknown";
}

}  // namespace gdn
