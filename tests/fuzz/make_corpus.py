#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer harnesses: tests/fuzz/corpus/{forward,backward,context,attention}/.

The byte layout is the one fuzz_desc.h / fuzz_context.cpp / fuzz_attention.cpp decode (README.md here). Every seed is
small and named after what it exercises; rerun this script after changing the layout:

    python3 tests/fuzz/make_corpus.py        # rewrites the corpus directories
    python3 tests/fuzz/make_corpus.py DIR    # writes them under DIR instead (ctest compares)
"""
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROLES = ["r", "w", "k", "v", "a", "b", "u", "y", "state_in", "state_out",
         "dy", "dstate_out", "dr", "dw", "dk", "dv", "da", "db", "du", "dstate_in"]
HEADER, SPEC = 48, 24
BWD = HEADER + SPEC * len(ROLES)

# header fields: name -> (offset, struct format)
H = {"ctx": (0, "B"), "op": (1, "B"), "op_raw": (2, "<i"), "form": (6, "B"), "form_raw": (7, "<i"),
     "flags": (11, "B"), "flags_raw": (12, "<I"), "B": (16, "B"), "T": (17, "B"), "H": (18, "B"),
     "N": (19, "B"), "pack": (20, "B"), "nseq": (21, "B"), "cuts": (22, "<Q"), "nseq_raw": (30, "<Q"),
     "ss": (38, "B"), "state": (39, "B"), "seed": (40, "<I"), "data": (44, "B"), "dtype": (45, "B"),
     "tail": (46, "B")}
# per-tensor spec fields
S = {"dtype": 0, "dcode": 1, "dbits": 2, "presence": 5, "ndim": 6, "ndim_raw": 7, "shape": 8,
     "shape_dim": 9, "stride": 10, "sarg": 11, "sarg2": 12, "offset": 13, "oarg": 14, "device": 15,
     "device_raw": 16, "alias": 17, "alias_role": 18, "alias_delta": 19, "garbage": 20}
# backward spec fields
W = {"ss": 0, "ws": 1, "outb_null": 2, "warg": 3, "dstate": 4}

OPS = {7: 0, 6: 1, 4: 2}


def desc(backward=False, op=7, dims=(1, 1, 1, 1), head=None, tensors=None, bwd=None):
    size = BWD + SPEC if backward else HEADER + SPEC * 10
    b = bytearray(size)
    h = {"op": OPS.get(op, 3), "B": dims[0] - 1, "T": dims[1] - 1, "H": dims[2] - 1, "N": dims[3] - 1,
         "seed": 12345}
    if op not in OPS:
        h["op_raw"] = op
    h.update(head or {})
    for k, v in h.items():
        off, fmt = H[k]
        struct.pack_into(fmt, b, off, v)
    for role, fields in (tensors or {}).items():
        base = HEADER + SPEC * ROLES.index(role)
        for k, v in fields.items():
            b[base + S[k]] = v & 0xFF
    for k, v in (bwd or {}).items() if backward else ():
        b[BWD + W[k]] = v & 0xFF
    # trailing zero bytes decode as zeros anyway: keep seeds short
    return bytes(b).rstrip(b"\0") or b"\0"


def desc_seeds(backward):
    s = {}
    for op in (7, 6, 4):
        for dt, name in ((0, "f32"), (1, "f16"), (2, "bf16"), (3, "mixed")):
            s[f"rwkv{op}_{name}"] = desc(backward, op, (2, 17, 2, 8), {"dtype": dt})
        s[f"rwkv{op}_state"] = desc(backward, op, (2, 9, 2, 4), {"state": 3},
                                    bwd={"dstate": 3})
        s[f"rwkv{op}_inplace_state"] = desc(backward, op, (1, 5, 1, 4), {"state": 7})
        s[f"rwkv{op}_packed"] = desc(backward, op, (1, 33, 2, 4),
                                     {"pack": 1, "nseq": 4, "cuts": 0x0102030405060708, "state": 3})
        s[f"rwkv{op}_many_seqs"] = desc(backward, op, (1, 20, 1, 2), {"pack": 9, "nseq_raw": 40, "state": 1})
        s[f"rwkv{op}_N1_T64"] = desc(backward, op, (1, 64, 1, 1))
        s[f"rwkv{op}_ctx1"] = desc(backward, op, (2, 40, 2, 8), {"ctx": 1})
        s[f"rwkv{op}_hostpf_busy_twice"] = desc(backward, op, (1, 12, 3, 4), {"ctx": 2 | 4 | 8})
        s[f"rwkv{op}_ctx3_twice"] = desc(backward, op, (2, 12, 2, 16), {"ctx": 3 | 8})
    s["rwkv7_N64"] = desc(backward, 7, (1, 8, 1, 64))
    s["rwkv7_key_major"] = desc(backward, 7, (1, 6, 2, 8), {"flags": 1, "state": 3}, bwd={"dstate": 3})
    s["rwkv4_interleaved"] = desc(backward, 4, (2, 6, 1, 8), {"flags": 2, "state": 3}, bwd={"dstate": 3})
    for form in (1, 2, 3, 4):
        s[f"rwkv7_form{form}"] = desc(backward, 7, (1, 16, 1, 8), {"form": form, "data": 1})
    s["rwkv7_specials"] = desc(backward, 7, (1, 16, 2, 8), {"data": 1})
    s["rwkv7_huge_values"] = desc(backward, 7, (1, 16, 2, 8), {"data": 3})
    s["rwkv6_rwkv5_decay"] = desc(backward, 6, (2, 8, 2, 8), tensors={"w": {"stride": 5, "sarg": 2}})
    # strides
    for mode, name in ((1, "explicit"), (2, "permuted"), (3, "padded"), (4, "negated"), (7, "mixed")):
        t = {"r": {"stride": mode, "sarg": 5, "sarg2": 0x9C}, "v": {"stride": mode, "sarg": 3, "sarg2": 0x31},
             "y": {"stride": mode, "sarg": 7, "sarg2": 0x44}}
        if backward:
            t.update({"dr": {"stride": mode, "sarg": 9, "sarg2": 0x21}, "dy": {"stride": mode, "sarg": 1}})
        s[f"strides_{name}"] = desc(backward, 7, (2, 5, 2, 4), tensors=t)
    s["stride_broadcast_input"] = desc(backward, 7, (2, 5, 2, 4), tensors={"k": {"stride": 5, "sarg": 5}})
    s["stride_broadcast_output"] = desc(backward, 7, (2, 5, 2, 4), tensors={"y": {"stride": 5, "sarg": 2}})
    s["stride_int64_max"] = desc(backward, 7, (2, 5, 2, 4), tensors={"k": {"stride": 6, "sarg": 1, "sarg2": 0}})
    s["stride_int64_min"] = desc(backward, 6, (2, 5, 2, 4), tensors={"r": {"stride": 6, "sarg": 0, "sarg2": 1}})
    s["stride_2_62"] = desc(backward, 4, (2, 5, 1, 4), tensors={"v": {"stride": 6, "sarg": 2, "sarg2": 2}})
    # offsets and pointers
    s["offset_elements"] = desc(backward, 7, (1, 4, 1, 4), tensors={"r": {"offset": 1, "oarg": 3}})
    s["offset_misaligned"] = desc(backward, 7, (1, 4, 1, 4), tensors={"k": {"offset": 2, "oarg": 1},
                                                                     "y": {"offset": 2, "oarg": 2}})
    s["offset_dangling_data"] = desc(backward, 6, (1, 4, 1, 4), tensors={"v": {"offset": 3, "oarg": 9}})
    s["offset_2_63"] = desc(backward, 7, (1, 4, 1, 4), tensors={"w": {"offset": 4}})
    s["offset_wraps"] = desc(backward, 7, (1, 4, 1, 4), tensors={"a": {"offset": 5, "oarg": 1}})
    s["data_near_top"] = desc(backward, 7, (1, 4, 1, 4), tensors={"b": {"offset": 6}})
    s["data_near_zero"] = desc(backward, 7, (1, 4, 1, 4), tensors={"v": {"offset": 7, "stride": 4, "sarg": 2}})
    # aliasing
    s["alias_inputs"] = desc(backward, 7, (1, 4, 1, 4), tensors={"k": {"alias": 2, "alias_role": 0}})
    s["alias_output_input"] = desc(backward, 7, (1, 4, 1, 4), tensors={"y": {"alias": 2, "alias_role": 0}})
    s["alias_output_shifted"] = desc(backward, 7, (1, 4, 1, 4), tensors={"y": {"alias": 1, "alias_role": 3, "alias_delta": 3}})
    s["alias_state_shifted"] = desc(backward, 7, (1, 4, 1, 4), {"state": 3},
                                    tensors={"state_out": {"alias": 1, "alias_role": 8, "alias_delta": 1}})
    # state_out exactly on state_in through an alias (not the in-place flag), the call made
    # twice: the repeat must start from the inputs as drawn
    for op in (7, 4):
        s[f"rwkv{op}_alias_state_exact_twice"] = desc(
            backward, op, (1, 1, 1, 18), {"state": 3, "ctx": 3 | 8},
            tensors={"state_out": {"alias": 2, "alias_role": 8}})
    # invalid descriptors
    s["bad_op"] = desc(backward, 5, (1, 2, 1, 2))
    s["bad_form"] = desc(backward, 7, (1, 2, 1, 2), {"form": 5})
    s["bad_form_rwkv4"] = desc(backward, 4, (1, 2, 1, 2), {"form": 4})
    s["bad_flags"] = desc(backward, 7, (1, 2, 1, 2), {"flags": 0x80, "flags_raw": 0x10})
    for ss in range(1, 10):
        s[f"struct_size_{ss}"] = desc(backward, 7, (1, 2, 1, 2), {"ss": ss, "state": 5, "tail": 7})
    s["dtype_f64"] = desc(backward, 7, (1, 2, 1, 2), tensors={"r": {"dtype": 5}})
    s["dtype_raw"] = desc(backward, 6, (1, 2, 1, 2), tensors={"u": {"dtype": 4, "dcode": 2, "dbits": 8}})
    s["dtype_state_f16"] = desc(backward, 7, (1, 2, 1, 2), {"state": 1}, tensors={"state_in": {"dtype": 2}})
    s["ndim_wrong"] = desc(backward, 7, (1, 2, 1, 2), tensors={"v": {"ndim": 1}})
    s["ndim_int_min"] = desc(backward, 4, (1, 2, 1, 2), tensors={"k": {"ndim": 6}})
    s["shape_null"] = desc(backward, 7, (1, 2, 1, 2), tensors={"v": {"shape": 1}})
    s["shape_zero"] = desc(backward, 7, (1, 2, 1, 2), tensors={"v": {"shape": 3, "shape_dim": 1}})
    s["shape_huge"] = desc(backward, 7, (1, 2, 1, 2), tensors={"v": {"shape": 5, "shape_dim": 3}})
    s["shape_2_33"] = desc(backward, 6, (1, 2, 1, 2), tensors={"r": {"shape": 8, "shape_dim": 2}})
    s["absent_required"] = desc(backward, 7, (1, 2, 1, 2), tensors={"a": {"presence": 1}})
    s["present_unused"] = desc(backward, 6, (1, 2, 1, 2), tensors={"a": {"presence": 1}})
    s["absent_garbage"] = desc(backward, 7, (1, 2, 1, 2), tensors={"u": {"presence": 2}})
    for dev in range(1, 8):
        s[f"device_{dev}"] = desc(backward, 7, (1, 2, 1, 2), tensors={"k": {"device": dev, "device_raw": 9}})
    for pk in range(2, 11):
        s[f"packing_{pk}"] = desc(backward, 7, (1, 9, 1, 2), {"pack": pk, "nseq": 3, "nseq_raw": 5, "state": 3})
    s["ctx_null"] = desc(backward, 7, (1, 2, 1, 2), {"ss": 9})
    if backward:
        for ws in range(1, 6):
            s[f"workspace_{ws}"] = desc(True, 7, (1, 40, 1, 4), bwd={"ws": ws, "warg": 3})
        s["out_bytes_null"] = desc(True, 7, (1, 4, 1, 4), bwd={"outb_null": 1})
        for bss in (1, 3, 4, 5, 6, 8):
            s[f"bwd_struct_size_{bss}"] = desc(True, 6, (1, 4, 1, 4), bwd={"ss": bss, "warg": 2})
        s["grad_alias_dy"] = desc(True, 7, (1, 4, 1, 4), tensors={"dr": {"alias": 2, "alias_role": 10}})
        s["grad_present_unused"] = desc(True, 6, (1, 4, 1, 4), tensors={"da": {"presence": 1}})
    return s


def context_seeds():
    s = {}
    def ctx(**f):
        b = bytearray(44)
        for k, v in f.items():
            off, fmt = {"ss": (0, "B"), "backend": (1, "B"), "backend_raw": (2, "<i"), "dev": (6, "B"),
                        "dev_raw": (7, "<i"), "threads": (11, "B"), "threads_raw": (12, "<i"),
                        "piece": (16, "B"), "pf": (17, "B"), "log": (18, "B"), "level_raw": (19, "<i"),
                        "tail_at": (23, "B"), "tail_val": (24, "B"), "post": (25, "B"), "buf": (26, "B"),
                        "qbackend": (27, "B"), "qbackend_raw": (28, "<i"), "qss": (32, "B"),
                        "dss": (33, "B"), "didx": (34, "B"), "didx_raw": (35, "<i"),
                        "status": (39, "<i")}[k]
            struct.pack_into(fmt, b, off, v)
        return bytes(b).rstrip(b"\0") or b"\0"
    s["cpu_default"] = ctx(post=3)
    s["auto"] = ctx(backend=1, post=1)
    s["cuda_unavailable"] = ctx(backend=2)
    s["vulkan_unavailable"] = ctx(backend=3, qbackend=3)
    s["backend_bad"] = ctx(backend=4)
    s["backend_raw"] = ctx(backend=6, backend_raw=-7)
    s["device_index_bad"] = ctx(dev=2)
    s["threads_2_host_pf"] = ctx(threads=1, pf=1, piece=3, post=3)
    s["threads_default"] = ctx(threads=2, post=1)
    s["threads_bad"] = ctx(threads=3)
    s["threads_negative"] = ctx(threads=4)
    s["user_data_without_pf"] = ctx(pf=2)
    s["pf_null_user_data"] = ctx(pf=3, post=2)
    s["log_debug"] = ctx(log=1 | (4 << 1), post=1)
    s["log_level_bad"] = ctx(log=1 | (5 << 1))
    s["log_level_raw"] = ctx(log=1 | (7 << 1), level_raw=1 << 30)
    for ss in range(1, 9):
        s[f"struct_size_{ss}"] = ctx(ss=ss, tail_at=5, tail_val=1, post=1)
    s["query_info_bad_size"] = ctx(qbackend=1, qss=1)
    s["query_info_null"] = ctx(qbackend=2, qss=3)
    s["query_device_raw"] = ctx(qbackend=9, qbackend_raw=1, didx=0x80, didx_raw=-1)
    s["query_device_null"] = ctx(qbackend=1, dss=2)
    s["status_string_raw"] = ctx(status=-5)
    return s


def attention_seeds():
    """fuzz_attention.cpp's layout: a 40-byte header, then 8 bytes per tensor (q k v o lse)."""
    heads = {"ctx": 0, "ss": 1, "flags": 2, "scale": 7, "B": 8, "Tq": 9, "Tk": 10, "Hkv": 11, "group": 12,
             "D": 13, "dtype": 14, "lse": 15, "pack": 16, "nseq": 17, "config": 26, "config_idx": 27,
             "data": 32}
    tens = {"layout": 0, "axis": 1, "defect": 2, "alias": 3, "mis": 4}
    names = ["q", "k", "v", "o", "lse"]

    def att(dims=(1, 4, 4, 1, 1, 8), head=None, tensors=None, cuts=(), raw=None, bwd=None):
        b = bytearray(40 + 8 * len(names) + 8)
        B, Tq, Tk, Hkv, g, D = dims
        h = {"B": B - 1, "Tq": Tq, "Tk": Tk, "Hkv": Hkv - 1, "group": g - 1,
             "D": {64: 250, 128: 251, 256: 252, 257: 253}.get(D, D - 1)}
        h.update(head or {})
        for k, v in h.items():
            b[heads[k]] = v & 0xFF
        for i, c in enumerate(cuts):
            b[18 + i] = c
        for k, v in (raw or {}).items():
            struct.pack_into("<I", b, k, v)
        for name, fields in (tensors or {}).items():
            for k, v in fields.items():
                b[40 + 8 * names.index(name) + tens[k]] = v & 0xFF
        for i, v in enumerate(bwd or ()):  # the backward: mode, defect, defect axis
            b[80 + i] = v
        return bytes(b).rstrip(b"\0") or b"\0"

    s = {"plain": att(), "empty_input": b"\0"}
    s["causal_gqa"] = att((2, 9, 9, 2, 3, 16), {"flags": 1, "lse": 1})
    s["causal_tq_gt_tk"] = att((1, 12, 5, 1, 2, 8), {"flags": 1, "lse": 1})
    s["causal_tq_lt_tk"] = att((1, 5, 17, 1, 1, 8), {"flags": 1})
    s["tq_zero"] = att((1, 0, 6, 1, 1, 8))
    s["tq_zero_batched"] = att((3, 0, 6, 1, 1, 8), {"ctx": 4})  # an empty output overlaps nothing
    s["tk_zero"] = att((1, 6, 0, 1, 1, 8), {"lse": 1})
    for D in (1, 7, 33, 64, 128, 256):
        s[f"head_dim_{D}"] = att((1, 3, 5, 1, 1, D), {"lse": 1})
    s["head_dim_257"] = att((1, 2, 2, 1, 1, 257))
    for dt, name in ((1, "f16"), (2, "bf16")):
        s[f"dtype_{name}"] = att((1, 7, 7, 1, 2, 16), {"dtype": dt, "flags": 1, "lse": 1})
    s["dtype_mixed"] = att(head={"dtype": 3})
    s["dtype_f64"] = att(head={"dtype": 4})
    s["lse_f16"] = att(head={"lse": 2})
    s["lse_shape"] = att(head={"lse": 3})
    s["lse_absent_garbage"] = att(head={"lse": 1}, tensors={"lse": {"defect": 4}})
    for sc in range(1, 7):
        s[f"scale_{sc}"] = att(head={"scale": sc})
    s["flags_unknown"] = att(head={"flags": 2}, raw={36: 0x40})
    s["large_logits"] = att((1, 20, 20, 1, 1, 32), {"data": 1, "flags": 1, "lse": 1})
    s["specials"] = att((1, 6, 6, 1, 1, 8), {"data": 2})
    s["zeros"] = att(head={"data": 3, "lse": 1})
    s["packed"] = att((1, 20, 24, 1, 2, 8), {"pack": 1, "nseq": 2, "flags": 1, "lse": 1}, cuts=(3, 7, 11, 0, 5, 9, 20))
    s["packed_empty_sequence"] = att((1, 10, 10, 1, 1, 8), {"pack": 1, "nseq": 3, "flags": 1}, cuts=(0, 4, 10, 0, 0, 2))
    for pk in range(2, 10):
        s[f"packing_{pk}"] = att((1, 8, 8, 1, 1, 8), {"pack": pk, "nseq": 1}, cuts=(3, 0, 0, 4))
    for ss in range(1, 8):
        s[f"struct_size_{ss}"] = att(head={"ss": ss})
    for cm in range(1, 4):
        s[f"config_{cm}"] = att((1, 9, 9, 1, 1, 8), {"config": cm, "config_idx": 4})
    for lay in range(1, 7):
        for t in ("q", "v", "o"):
            s[f"layout_{lay}_{t}"] = att((2, 5, 5, 2, 1, 8), {"lse": 1}, tensors={t: {"layout": lay, "axis": 1}})
    s["layout_lse_padded"] = att((2, 5, 5, 2, 1, 8), {"lse": 1}, tensors={"lse": {"layout": 3, "axis": 2}})
    for d in range(1, 6):
        for t in ("q", "k", "o", "lse"):
            s[f"defect_{d}_{t}"] = att(head={"lse": 1}, tensors={t: {"defect": d, "axis": 3}})
    for al in range(1, 5):
        s[f"alias_{al}"] = att(head={"lse": 1}, tensors={"o": {"alias": al}})
    s["misaligned_k"] = att(tensors={"k": {"mis": 2}})
    # decode steps (keys read as rows, in place when aligned float32): misaligned, strided, grouped
    s["decode_misaligned_k"] = att((1, 1, 30, 1, 1, 4), tensors={"k": {"mis": 2}})
    s["decode_gqa_causal"] = att((2, 1, 70, 2, 4, 32), {"flags": 1, "lse": 1})
    s["decode_padded_v"] = att((1, 2, 65, 1, 3, 16), tensors={"v": {"layout": 3, "axis": 2}})
    s["twice_3_threads"] = att((3, 17, 17, 1, 2, 24), {"ctx": 2 | 4, "flags": 1, "lse": 1})
    # the backward (byte 80: 1 plain, 2 with dlse, 3 with dlse and [B, H, T, D] strides)
    s["bwd_plain"] = att((1, 9, 9, 1, 1, 16), {"lse": 1}, bwd=(1,))
    s["bwd_causal_gqa_dlse"] = att((2, 9, 9, 2, 3, 16), {"flags": 1, "lse": 1}, bwd=(2,))
    s["bwd_strided"] = att((2, 7, 11, 2, 2, 24), {"flags": 1, "lse": 1}, bwd=(3,))
    s["bwd_rows_without_keys"] = att((1, 12, 5, 1, 2, 8), {"flags": 1, "lse": 1}, bwd=(2,))
    s["bwd_keys_nobody_sees"] = att((1, 5, 17, 1, 1, 8), {"flags": 1, "lse": 1}, bwd=(1,))
    s["bwd_decode"] = att((2, 1, 40, 2, 4, 32), {"flags": 1, "lse": 1}, bwd=(2,))
    for D in (64, 128, 256):
        s[f"bwd_head_dim_{D}"] = att((1, 3, 5, 1, 1, D), {"lse": 1}, bwd=(2,))
    for dt, name in ((1, "f16"), (2, "bf16")):
        s[f"bwd_dtype_{name}"] = att((1, 7, 7, 1, 2, 16), {"dtype": dt, "flags": 1, "lse": 1}, bwd=(3,))
    s["bwd_large_logits"] = att((1, 20, 20, 1, 1, 32), {"data": 1, "flags": 1, "lse": 1}, bwd=(2,))
    s["bwd_specials"] = att((1, 6, 6, 1, 1, 8), {"data": 2, "lse": 1}, bwd=(2,))
    s["bwd_packed"] = att((1, 20, 24, 1, 2, 8), {"pack": 1, "nseq": 2, "flags": 1, "lse": 1},
                          cuts=(3, 7, 11, 0, 5, 9, 20), bwd=(2,))
    s["bwd_tq_zero"] = att((1, 0, 6, 1, 1, 8), {"lse": 1}, bwd=(1,))
    s["bwd_tk_zero"] = att((1, 6, 0, 1, 1, 8), {"lse": 1}, bwd=(2,))
    s["bwd_3_threads"] = att((3, 17, 17, 1, 2, 24), {"ctx": 2, "flags": 1, "lse": 1}, bwd=(2,))
    s["bwd_without_lse"] = att((1, 4, 4, 1, 1, 8), bwd=(1,))
    # the CPU backward's ways (attention_backward.cpp): 8 (sequence, kv head) items, the single
    # pass; one kv head of 8 query heads, 8 slices; packed, 2 sequences x 4 slices
    s["bwd_single_pass"] = att((2, 9, 9, 4, 2, 16), {"flags": 1, "lse": 1}, bwd=(2,))
    s["bwd_sliced_mqa"] = att((1, 9, 13, 1, 8, 16), {"flags": 1, "lse": 1}, bwd=(3,))
    s["bwd_sliced_packed"] = att((1, 20, 24, 1, 4, 8), {"pack": 1, "nseq": 2, "flags": 1, "lse": 1},
                                 cuts=(3, 7, 11, 0, 5, 9, 20), bwd=(2,))
    # f16 with gradients of ~1e-2: the stored o's rounding is a visible share of them (the slack)
    s["bwd_f16_small_gradients"] = att((1, 4, 4, 1, 1, 2), {"dtype": 1, "lse": 1, "pack": 1, "data": 0},
                                       raw={28: 0xB5B5B5B5}, bwd=(1,))
    for d in range(1, 14):
        s[f"bwd_defect_{d}"] = att((1, 6, 6, 1, 2, 8), {"lse": 1}, bwd=(2, d, 3))
    return s


def write(name, seeds, root=os.path.join(HERE, "corpus")):
    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for k, v in sorted(seeds.items()):
        with open(os.path.join(d, k), "wb") as f:
            f.write(v)
    print(f"{d}: {len(seeds)} seeds")


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    write("forward", desc_seeds(False), root)
    write("backward", desc_seeds(True), root)
    write("context", context_seeds(), root)
    write("attention", attention_seeds(), root)
