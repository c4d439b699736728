/* The backends libwkv knows: the built-in CPU backend and the run-time plugins. Plugins are
 * looked for, loaded and probed once per process, on first use, under a lock. */
#ifndef WKV_SRC_REGISTRY_H
#define WKV_SRC_REGISTRY_H

#include "backend.h"

/* The backend's table if it is loaded and available; otherwise NULL and `why` (if not NULL)
 * points at a static reason string. kind must be CPU, CUDA or VULKAN. */
const wkv_backend_iface* wkv_registry_get(wkv_backend kind, const char** why);
/* Its probe result (loads the plugin first). */
void wkv_registry_info(wkv_backend kind, wkv_backend_info* out);
const char* wkv_backend_name(wkv_backend kind);
/* Whether a tensor in this memory space can be handed to the backend. */
int wkv_backend_accepts_device(wkv_backend kind, int32_t device_type);

#endif
