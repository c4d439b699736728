/* Softmax attention on the CPU (attention.cpp): the kernel and its configuration list. */
#ifndef WKV_BACKENDS_CPU_ATTENTION_H
#define WKV_BACKENDS_CPU_ATTENTION_H

#include "cpu_internal.h"

namespace wkv_cpu {

/* wkv_backend_iface.attention_configs: fills min(capacity, total) entries, returns the total. */
int32_t attention_configs(wkv_attention_config* out, int32_t capacity) noexcept;
/* wkv_backend_iface.attention for a validated problem. */
wkv_status attention(const BackendState& st, const wkv_attention_problem* p, wkv_message* msg) noexcept;

} // namespace wkv_cpu

#endif
