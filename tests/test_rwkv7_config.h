// An RWKV-7 test problem's configuration (shape, dtype, decay form, layouts, state options) and
// the host tensors it asks for, shared by the CPU random-input tests (test_rwkv7_random.cpp) and
// the CUDA harness (backends/cuda/tests/rwkv7_harness.h). Header-only; builds on test_util.h.
#ifndef WKV_TESTS_TEST_RWKV7_CONFIG_H
#define WKV_TESTS_TEST_RWKV7_CONFIG_H

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace wkvtest {

struct Rwkv7Config {
    int64_t B = 1, T = 1, H = 1, N = 1;
    wkv_decay_form form = WKV_DECAY_CLAMPW;
    wkv_dtype dtype = WKV_DTYPE_F32;
    bool state_in = false;    // forward: state_in = s0
    bool state_out = false;   // forward: state_out
    bool dstate_out = false;  // backward: dstate_out = dsT
    bool dstate_in = false;   // backward: dstate_in (only with state_in)
    Layout layout = Layout::Contiguous;  // the per-token tensors (inputs, y, dy, gradients)
    bool w_broadcast = false;  // w has a T stride of 0
    bool padded_state = false; // states with a gap between heads and a byte_offset
    bool key_major = false;    // WKV_FLAG_STATE_KEY_MAJOR
    bool in_place = false;     // state_out is state_in
    int threads = 2;           // the CPU backend's threads

    std::string describe() const {
        std::ostringstream s;
        s << "B=" << B << " T=" << T << " H=" << H << " N=" << N << " form=" << form_name(form)
          << " dtype=" << dtype_name(dtype) << " state_in=" << state_in
          << " state_out=" << state_out << " dstate_out=" << dstate_out
          << " dstate_in=" << dstate_in << " layout=" << layout_name(layout)
          << " w_broadcast=" << w_broadcast << " padded_state=" << padded_state
          << " key_major=" << key_major << " in_place=" << in_place << " threads=" << threads;
        return s.str();
    }
};

// A per-token tensor [B,T,H,N] in c's layout (T-stride 0 when `broadcast_t`).
inline HostTensor token_tensor(const Rwkv7Config& c, wkv_dtype dt, bool broadcast_t = false) {
    return token_tensor(dt, c.B, c.T, c.H, c.N, c.layout, broadcast_t);
}

// A state [S,H,N,N], float32; with c.padded_state a gap after each head and a byte_offset.
inline HostTensor state_tensor(const Rwkv7Config& c, int64_t S) {
    std::vector<int64_t> shape = {S, c.H, c.N, c.N};
    if (c.padded_state)
        return HostTensor(WKV_DTYPE_F32, shape, {c.H * (c.N * c.N + 5), c.N * c.N + 5, c.N, 1}, 2);
    return HostTensor(WKV_DTYPE_F32, shape);
}

// A state [S,H,N,N] as the library holds it: transposed in the last two axes when key-major
// (the transpose is its own inverse, so this converts both ways).
inline std::vector<double> to_lib_state(const Rwkv7Config& c, int64_t S, const std::vector<double>& x) {
    return c.key_major ? permute(x, {S, c.H, c.N, c.N}, {0, 1, 3, 2}) : x;
}

}  // namespace wkvtest

#endif  // WKV_TESTS_TEST_RWKV7_CONFIG_H
