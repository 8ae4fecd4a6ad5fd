// Fault injection for tests: each error path of "nothing lost" (a full disk, a dead peer, memory
// running out) is exercised without breaking a real disk or network. The environment variable
//   ZP_FAULT="write:3,collective:10@1,alloc:7"
// makes the 3rd checkpoint/weights write, the 10th collective on world rank 1 and the 7th tensor
// allocation fail, each the way the real failure fails (a write reports ENOSPC through the normal
// error path, a collective throws, an allocation is fatal as an out-of-memory is). Calls are counted
// per site and per process from 1; `@R` restricts a site to world rank R. Unset (the normal case),
// hit() is one relaxed load of a flag. A malformed ZP_FAULT is fatal at the first hit() so a test
// can never run with a fault it did not get.
#pragma once

namespace zp::fault {

enum class Site { Write, Collective, Alloc };

// True exactly once per configured site: on the call ZP_FAULT names.
bool hit(Site site);

// The text appended to an injected failure's message.
inline constexpr const char* kInjected = " (injected by ZP_FAULT)";

}  // namespace zp::fault
