// The Vulkan suite's shared contexts: one Vulkan and one CPU context for every test case
// (pipelines are compiled once per head size), created on first use and destroyed by main()
// after the test run, never by a static destructor. Why: a Vulkan driver may register its own
// exit-time teardown (NVIDIA's does) after the first context creates a device; exit handlers
// run in reverse order of registration, so a context destroyed from a static destructor would
// call vkDestroyDevice / vkDestroyInstance into a driver that has already torn itself down
// (the suite passed, then died with SIGSEGV at exit on the H100). Release order matters too:
// contexts first (their device and instance), while the driver is whole.
#ifndef WKV_VULKAN_SUITE_CONTEXTS_H
#define WKV_VULKAN_SUITE_CONTEXTS_H

#include "wkv/wkv.h"

namespace wkvtest {

struct SuiteContexts {
    wkv_context* vk = nullptr;
    wkv_context* cpu = nullptr;
};

// Creates them on first use (a failure fails the calling test case).
SuiteContexts& suite_contexts();
// Destroys them; called once by main() after doctest has run every case.
void suite_contexts_destroy();

} // namespace wkvtest

#endif
