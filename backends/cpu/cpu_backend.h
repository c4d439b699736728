/* The built-in CPU backend. */
#ifndef WKV_BACKENDS_CPU_BACKEND_H
#define WKV_BACKENDS_CPU_BACKEND_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU backend's function table (always available). */
const wkv_backend_iface* wkv_cpu_backend_iface(void);

#ifdef __cplusplus
}
#endif

#endif
