/* RWKV-7 on the CPU: forward, backward (checkpoint + replay) and the backward's workspace size,
 * run through op_common.h's run_forward / run_backward / backward_workspace_size with this
 * op's description. Internal to backends/cpu/. p->op is WKV_OP_RWKV7 and p has been validated
 * by the core. */
#ifndef WKV_BACKENDS_CPU_RWKV7_H
#define WKV_BACKENDS_CPU_RWKV7_H

#include "op_common.h"

namespace wkv_cpu {

/* Tokens between two checkpointed states in the backward pass (see rwkv7.cpp). */
constexpr int64_t kRwkv7CheckpointInterval = 32;

extern const OpDesc kRwkv7Op;

} // namespace wkv_cpu

#endif
