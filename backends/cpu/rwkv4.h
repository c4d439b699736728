/* RWKV-4 on the CPU: forward, backward (checkpoint + replay of the (aa, bb, pp) state) and the
 * backward's workspace size. Internal to backends/cpu/. p->op is WKV_OP_RWKV4 and p has been
 * validated by the core (so the decay form is WKV_DECAY_EXP_NEG_EXP). */
#ifndef WKV_BACKENDS_CPU_RWKV4_H
#define WKV_BACKENDS_CPU_RWKV4_H

#include <cstddef>

#include "backend.h"
#include "cpu_internal.h"

namespace wkv_cpu {

/* Tokens between two checkpointed states in the backward pass (see rwkv4.cpp). */
constexpr int64_t kRwkv4CheckpointInterval = 32;
/* Channels per work item (see rwkv4.cpp). */
constexpr int64_t kRwkv4ChannelBlock = 32;

wkv_status rwkv4_forward(const BackendState* st, const wkv_problem* p, wkv_message* msg);
wkv_status rwkv4_backward(const BackendState* st, const wkv_problem* p, wkv_message* msg);
wkv_status rwkv4_workspace_size(const BackendState* st, const wkv_problem* p, size_t* out_bytes,
                                wkv_message* msg);

} // namespace wkv_cpu

#endif
