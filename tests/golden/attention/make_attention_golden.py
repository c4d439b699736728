#!/usr/bin/env python3
"""Writes the attention golden files: softmax attention computed in float64 by torch's math
backend (torch.nn.functional.scaled_dot_product_attention with SDPBackend.MATH) — an
implementation outside libwkv — on inputs drawn from fixed seeds.

    python3 tests/golden/attention/make_attention_golden.py [DIR]     # default: this folder

Each file (safetensors): q [B,Tq,Hq,D], k, v [B,Tk,Hkv,D], o [B,Tq,Hq,D] and lse [B,Hq,Tq]
(natural log; -inf for a row that sees no key, whose o is 0) in float64; packed cases add
q_offsets and k_offsets (int64, num_seqs + 1). Metadata: causal ("0"/"1"), scale (the logits'
scale as a decimal string), seed. The mask is causal bottom-right aligned (row i sees keys
j <= i + Tk - Tq, per sequence when packed). bindings/python/tests/test_attention.py checks that
this script reproduces the committed files; tests/test_attention.cpp runs them through libwkv.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bindings", "python", "src"))
from wkv.model import save_safetensors  # noqa: E402  the package's writer (no library call)

# name: (seed, B, Tq, Tk, Hq, Hkv, D, causal, scale or None, packed offsets or None)
CASES = {
    "attn_D64_causal_gqa": (401, 2, 37, 37, 4, 2, 64, True, None, None),
    "attn_D64_full": (402, 1, 50, 50, 3, 3, 64, False, None, None),
    "attn_D128_causal_tq_lt_tk": (403, 1, 9, 70, 4, 1, 128, True, None, None),
    "attn_D32_causal_tq_gt_tk": (404, 1, 20, 7, 2, 2, 32, True, 0.3, None),
    "attn_D64_decode_T1": (405, 3, 1, 129, 8, 2, 64, True, None, None),
    "attn_D64_packed_causal": (406, 1, 26, 33, 4, 2, 64, True, None, ([0, 5, 5, 25, 26], [0, 9, 12, 32, 33])),
}


def oracle(q, k, v, causal, scale, offsets):
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    o = torch.zeros_like(q)
    lse = torch.full((B, Hq, Tq), -math.inf, dtype=torch.float64)
    seqs = ([(b, 0, Tq, 0, Tk) for b in range(B)] if offsets is None else
            [(0, offsets[0][s], offsets[0][s + 1], offsets[1][s], offsets[1][s + 1])
             for s in range(len(offsets[0]) - 1)])
    sc = scale if scale is not None else 1.0 / math.sqrt(D)
    for b, q0, q1, k0, k1 in seqs:
        if q1 == q0 or k1 == k0:
            continue
        qs = q[b, q0:q1].transpose(0, 1)
        ks = k[b, k0:k1].transpose(0, 1).repeat_interleave(g, 0)
        vs = v[b, k0:k1].transpose(0, 1).repeat_interleave(g, 0)
        nq, nk = q1 - q0, k1 - k0
        mask = torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq) if causal else torch.ones(nq, nk,
                                                                                                       dtype=torch.bool)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=sc)
        seen = mask.any(-1)
        out = torch.where(seen[None, :, None], out, torch.zeros_like(out))  # torch's NaN rows: zeros
        logits = (qs @ ks.transpose(-1, -2)) * sc
        logits = logits.masked_fill(~mask, -math.inf)
        lse[b, :, q0:q1] = torch.logsumexp(logits, -1)
        o[b, q0:q1] = out.transpose(0, 1)
    return o, lse


def main() -> int:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else HERE
    torch.set_num_threads(1)  # one summation order
    for name, (seed, B, Tq, Tk, Hq, Hkv, D, causal, scale, offsets) in CASES.items():
        rng = np.random.default_rng(seed)
        q = rng.standard_normal((B, Tq, Hq, D))
        k = rng.standard_normal((B, Tk, Hkv, D))
        v = rng.standard_normal((B, Tk, Hkv, D))
        o, lse = oracle(*(torch.tensor(x) for x in (q, k, v)), causal, scale, offsets)
        tensors = {"q": torch.tensor(q), "k": torch.tensor(k), "v": torch.tensor(v), "o": o, "lse": lse}
        if offsets is not None:
            tensors["q_offsets"] = torch.tensor(offsets[0], dtype=torch.int64)
            tensors["k_offsets"] = torch.tensor(offsets[1], dtype=torch.int64)
        meta = {"op": "attention", "causal": "1" if causal else "0",
                "scale": repr(scale if scale is not None else 1.0 / math.sqrt(D)), "seed": str(seed),
                "oracle": "torch %s scaled_dot_product_attention, SDPBackend.MATH, float64" % torch.__version__.split("+")[0]}
        save_safetensors(tensors, os.path.join(out_dir, name + ".safetensors"), metadata=meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
