/* The smallest complete libwkv program: RWKV-7 over a few tokens (also shown in README.md). */
#include <stdio.h>
#include <wkv/wkv.h>

int main(void) {
    enum { B = 1, T = 4, H = 1, N = 2, E = B * T * H * N };
    float r[E] = {.5f, .1f, .2f, .3f, .1f, .9f, .4f, .4f}, k[E] = {.3f, .2f, .1f, .5f, .7f, .2f, .6f, .1f};
    float w[E] = {.9f, .9f, .9f, .9f, .9f, .9f, .9f, .9f}, v[E] = {1, 2, 3, 4, 5, 6, 7, 8};
    float a[E] = {0}, b[E] = {0}, y[E], state[B * H * N * N] = {0};
    int64_t shape[4] = {B, T, H, N}, sshape[4] = {B, H, N, N};

    wkv_context* ctx = NULL;
    wkv_context_options opt = {0};  opt.struct_size = sizeof opt;  opt.backend = WKV_BACKEND_CPU;
    if (wkv_context_create(&opt, &ctx) != WKV_OK) return printf("%s\n", wkv_last_error(NULL)), 1;

    wkv_forward_desc f = {0};  f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;  f.decay_form = WKV_DECAY_DIRECT;   /* w is the decay multiplier */
    f.r = wkv_tensor_make(r, WKV_DTYPE_F32, 4, shape);  f.w = wkv_tensor_make(w, WKV_DTYPE_F32, 4, shape);
    f.k = wkv_tensor_make(k, WKV_DTYPE_F32, 4, shape);  f.v = wkv_tensor_make(v, WKV_DTYPE_F32, 4, shape);
    f.a = wkv_tensor_make(a, WKV_DTYPE_F32, 4, shape);  f.b = wkv_tensor_make(b, WKV_DTYPE_F32, 4, shape);
    f.y = wkv_tensor_make(y, WKV_DTYPE_F32, 4, shape);
    f.state_in = f.state_out = wkv_tensor_make(state, WKV_DTYPE_F32, 4, sshape);  /* stepped in place */
    if (wkv_forward(ctx, &f) != WKV_OK) return printf("%s\n", wkv_last_error(ctx)), 1;

    for (int t = 0; t < T; ++t) printf("y[%d] = %.4f %.4f\n", t, y[t * N], y[t * N + 1]);
    wkv_context_destroy(ctx);
}
