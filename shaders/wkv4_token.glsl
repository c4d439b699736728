// RWKV-4's per-token arithmetic, shared by wkv4_fwd.comp and wkv4_bwd.comp: exactly the
// formulas of backends/cpu/rwkv4.cpp (token()), float32, with pp carried inside a call as an
// unevaluated pair ph + pl (|pl| <= ulp(ph) / 2) stepped with TwoSum so that it does not drift
// at large k. The TwoSum / Fast2Sum variables are `precise` (SPIR-V NoContraction): no
// contraction into fma and no reassociation, which would cancel the error terms.
const float EMPTY_PP = -1e38;

// s + e = a + b exactly; e = 0 when s is not finite.
void two_sum(float a, float b, out float s, out float e) {
    precise float sum = a + b;
    precise float bv = sum - a;
    precise float err = (a - (sum - bv)) + (b - bv);
    s = sum;
    e = (isinf(sum) || isnan(sum)) ? 0.0 : err;
}

struct Tok {
    float e1, e2, inv, y; // y = (e1 aa + e2 v) inv
    float A, Bk;          // the update's factors
    float qh, ql;         // the new pp = qh + ql
    float side;           // > 0: pp + wd wins the max, < 0: k wins
};

Tok token4(float a, float b, float ph, float pl, float kk, float vv, float uu, float wdd, bool want_y) {
    Tok o;
    o.e1 = 0.0; o.e2 = 0.0; o.inv = 0.0; o.y = 0.0;
    if (want_y) {
        float wh, wl;
        two_sum(uu, kk, wh, wl);
        const float q = ph >= wh ? ph : wh;
        o.e1 = exp((ph - q) + pl);
        o.e2 = exp((wh - q) + wl);
        o.inv = 1.0 / (o.e1 * b + o.e2);
        o.y = (o.e1 * a + o.e2 * vv) * o.inv;
    }
    float sh, sl;
    two_sum(ph, wdd, sh, sl);
    const bool fin = !(isinf(sh) || isnan(sh));
    precise float lo = sl + pl; // renormalize (sh, lo): Fast2Sum
    precise float hi = fin ? sh + lo : sh;
    precise float rl = fin ? lo - (hi - sh) : 0.0;
    precise float side = (hi - kk) + rl;
    o.side = side;
    if (side >= 0.0) {
        o.qh = hi;
        o.ql = rl;
        o.A = 1.0;
        o.Bk = exp((kk - hi) - rl);
    } else {
        o.qh = kk;
        o.ql = 0.0;
        o.A = exp((hi - kk) + rl);
        o.Bk = 1.0;
    }
    return o;
}
