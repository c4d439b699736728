/* RWKV-4 on the CPU: forward, backward (checkpoint + replay of the (aa, bb, pp) state) and the
 * backward's workspace size, run through op_common.h's run_forward / run_backward /
 * backward_workspace_size with this op's description. Internal to backends/cpu/. p->op is
 * WKV_OP_RWKV4 and p has been validated by the core (so the decay form is
 * WKV_DECAY_EXP_NEG_EXP). */
#ifndef WKV_BACKENDS_CPU_RWKV4_H
#define WKV_BACKENDS_CPU_RWKV4_H

#include "op_common.h"

namespace wkv_cpu {

/* Tokens between two checkpointed states in the backward pass (see rwkv4.cpp). */
constexpr int64_t kRwkv4CheckpointInterval = 32;
/* Channels per block: a forward unit, and the checkpoints' layout (see rwkv4.cpp). */
constexpr int64_t kRwkv4ChannelBlock = 32;
/* The most channel blocks one backward item walks together (see rwkv4.cpp). */
constexpr int64_t kRwkv4BackwardBlocks = 16;

extern const OpDesc kRwkv4Op;

} // namespace wkv_cpu

#endif
