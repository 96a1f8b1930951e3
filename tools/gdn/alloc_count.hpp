#pragma once
// Counting heap allocations where they are measured: `gdn bench` (the gdn-bench program) reports
// the allocations of its decode steps, and tests/test_no_alloc.cpp checks there are none. Linking
// alloc_count.cpp into a program replaces every form of the global operator new and delete of that
// program (see there why only those two programs carry it).

namespace gdn::alloc_count {

// Starts counting the operator new calls of every thread, from zero.
void begin() noexcept;
// Stops counting; the calls since begin().
long end() noexcept;

}  // namespace gdn::alloc_count
