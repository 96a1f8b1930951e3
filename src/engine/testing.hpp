#pragma once
// Private: contexts with deliberate faults (gdn doctor, tests). The faults stay out of the public
// ContextParams and out of the hot loop: dropping the conv state is a wrapper around the backend
// (fault_backend.hpp), the GGUF head order a backend construction parameter.

#include <memory>

#include "gdn/diagnostics/doctor.hpp"
#include "gdn/runtime/context.hpp"

namespace gdn::detail {

// Like Context(model, params), with `faults` injected (none: a plain context).
std::unique_ptr<Context> make_context_for_tests(std::shared_ptr<const Model> model, const ContextParams& params,
                                                const FaultInjection& faults);

}  // namespace gdn::detail
