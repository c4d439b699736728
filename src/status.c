/* Version, build information and status strings. */
#include "wkv/wkv.h"

#ifndef WKV_BUILD_INFO
#define WKV_BUILD_INFO "unknown build"
#endif

#define WKV_STR_(x) #x
#define WKV_STR(x) WKV_STR_(x)

uint32_t wkv_version(void) { return WKV_VERSION; }

const char* wkv_version_string(void) {
    return WKV_STR(WKV_VERSION_MAJOR) "." WKV_STR(WKV_VERSION_MINOR) "." WKV_STR(WKV_VERSION_PATCH);
}

const char* wkv_build_info(void) {
    return "libwkv " WKV_STR(WKV_VERSION_MAJOR) "." WKV_STR(WKV_VERSION_MINOR) "." WKV_STR(
        WKV_VERSION_PATCH) " (" WKV_BUILD_INFO "; cpu built in; cuda, vulkan as run-time plugins)";
}

const char* wkv_status_string(wkv_status status) {
    switch (status) {
#define WKV_STATUS_CASE_(name, value, message) \
    case name:                                 \
        return #name ": " message;
        WKV_STATUS_LIST(WKV_STATUS_CASE_)
#undef WKV_STATUS_CASE_
    default:
        return "unknown wkv_status value";
    }
}
