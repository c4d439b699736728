/* RWKV-6 (and RWKV-5: w with a T-stride of 0) on the CPU: forward, backward (checkpoint +
 * replay) and the backward's workspace size. Internal to backends/cpu/. p->op is WKV_OP_RWKV6
 * and p has been validated by the core. */
#ifndef WKV_BACKENDS_CPU_RWKV6_H
#define WKV_BACKENDS_CPU_RWKV6_H

#include <cstddef>

#include "backend.h"
#include "cpu_internal.h"

namespace wkv_cpu {

/* Tokens between two checkpointed states in the backward pass (see rwkv6.cpp). */
constexpr int64_t kRwkv6CheckpointInterval = 32;

wkv_status rwkv6_forward(const BackendState* st, const wkv_problem* p, wkv_message* msg);
wkv_status rwkv6_backward(const BackendState* st, const wkv_problem* p, wkv_message* msg);
wkv_status rwkv6_workspace_size(const BackendState* st, const wkv_problem* p, size_t* out_bytes,
                                wkv_message* msg);

} // namespace wkv_cpu

#endif
