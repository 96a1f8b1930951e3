#pragma once
// libgdn's C++ API in one include. See README.md for a tour.

#include "gdn/core/dtype.hpp"
#include "gdn/core/error.hpp"
#include "gdn/model/config.hpp"
#include "gdn/model/model.hpp"
#include "gdn/runtime/batch.hpp"
#include "gdn/runtime/context.hpp"

namespace gdn {

// Library version, as major * 10000 + minor * 100 + patch.
inline constexpr int version = 100;

}  // namespace gdn
