/* RWKV-6 (and RWKV-5: w with a T-stride of 0) on the CPU: forward, backward (checkpoint +
 * replay) and the backward's workspace size, run through op_common.h's run_forward /
 * run_backward / backward_workspace_size with this op's description. Internal to
 * backends/cpu/. p->op is WKV_OP_RWKV6 and p has been validated by the core. */
#ifndef WKV_BACKENDS_CPU_RWKV6_H
#define WKV_BACKENDS_CPU_RWKV6_H

#include "op_common.h"

namespace wkv_cpu {

/* Tokens between two checkpointed states in the backward pass (see rwkv6.cpp). */
constexpr int64_t kRwkv6CheckpointInterval = 32;

extern const OpDesc kRwkv6Op;

} // namespace wkv_cpu

#endif
