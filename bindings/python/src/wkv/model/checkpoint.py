"""RWKV-7 checkpoints: read (.pth, .safetensors), check, infer the sizes, write; random init.

The layout is BlinkDL's (``emb.weight``, ``blocks.N.ln0/ln1/ln2``, ``blocks.N.att.x_r`` …
``att.ln_x``, ``blocks.N.ffn.x_k/key/value``, ``ln_out``, ``head.weight``). A bad file raises
:class:`CheckpointError` naming the file and the key; nothing is guessed.

The safetensors writer is here and the reader is the package's checked one
(:func:`wkv.golden.read_safetensors`; the format is an 8-byte little-endian header length, a
JSON header ``{name: {dtype, shape, data_offsets}}``, then the raw little-endian data), so no
extra package is needed; the C example reads the same files.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from typing import Dict, Mapping, Optional, Union

import torch

from ..context import Context
from .rwkv7 import RWKV7Config, RWKV7Model

__all__ = ["CheckpointError", "read_state_dict", "infer_config", "load", "from_state_dict", "random_init",
           "save_safetensors", "SIZES"]

PathLike = Union[str, "os.PathLike[str]"]

#: Named random-init sizes: (n_layer, n_embd). "0.1b" and "1.5b" are the shapes of RWKV-7's
#: 0.1B and 1.5B models (without their weights).
SIZES = {"tiny": (2, 128), "small": (4, 256), "0.1b": (12, 768), "0.4b": (24, 1024), "1.5b": (24, 2048)}

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class CheckpointError(ValueError):
    """A checkpoint that cannot be an RWKV-7 model: unreadable or truncated file, a missing,
    unexpected or misshapen key, a tensor that is not float32/float16/bfloat16."""


# ------------------------------------------------------------------------------ files

def _read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    """The file's tensors as torch tensors over its bytes (the package's one checked reader,
    wkv.golden.read_safetensors; its ValueErrors become CheckpointErrors)."""
    from ..golden import read_safetensors

    try:
        _, tensors = read_safetensors(path)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    out = {}
    for name, (st_dtype, arr) in tensors.items():
        t = torch.from_numpy(arr) if arr.size else torch.empty(arr.shape, dtype=_ST_DTYPES[st_dtype])
        out[name] = t.view(torch.bfloat16) if st_dtype == "BF16" and arr.size else t
    return out


def read_state_dict(path: PathLike) -> Dict[str, torch.Tensor]:
    """The tensors of a ``.pth`` (torch.load, weights only) or ``.safetensors`` file, on the CPU."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError("%s: no such checkpoint file" % path)
    if path.endswith(".safetensors"):
        return _read_safetensors(path)
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds for a damaged file
        raise CheckpointError("%s: not a readable torch checkpoint (%s: %s)" % (path, type(e).__name__, e)) from None
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError("%s: expected a state dict of tensors (name -> tensor)" % path)
    return dict(sd)


def save_safetensors(state_dict: Mapping[str, torch.Tensor], path: PathLike,
                     metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes tensors as a safetensors file (contiguous, little-endian, keys sorted), with an
    optional ``__metadata__`` of strings."""
    header: Dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    blobs, offset = [], 0
    for name in sorted(state_dict):
        t = state_dict[name].detach().cpu().contiguous()
        if t.dtype not in _ST_NAMES:
            raise CheckpointError("save_safetensors: key %r has dtype %s" % (name, t.dtype))
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # align the data to 8 bytes
    with open(os.fspath(path), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# ------------------------------------------------------------------------------ sizes and checks

def _need(sd: Mapping[str, torch.Tensor], key: str, where: str) -> torch.Tensor:
    if key not in sd:
        raise CheckpointError("%s: missing key %r" % (where, key))
    return sd[key]


def infer_config(state_dict: Mapping[str, torch.Tensor], where: str = "checkpoint") -> RWKV7Config:
    """Layers, width, head size, vocabulary and low-rank sizes read from the weights' shapes."""
    emb = _need(state_dict, "emb.weight", where)
    if emb.dim() != 2:
        raise CheckpointError("%s: key 'emb.weight' has shape %s; expected [vocab, n_embd]" % (where, tuple(emb.shape)))
    vocab, C = emb.shape
    layers = {int(m.group(1)) for k in state_dict for m in [re.match(r"blocks\.(\d+)\.", k)] if m}
    if not layers:
        raise CheckpointError("%s: no 'blocks.N.*' keys: not an RWKV model" % where)
    n_layer = max(layers) + 1
    for i in range(n_layer):
        if i not in layers:
            raise CheckpointError("%s: missing every key of layer %d ('blocks.%d.*')" % (where, i, i))
    if any(k.startswith("blocks.0.att.time_") for k in state_dict):
        raise CheckpointError("%s: 'blocks.0.att.time_*' keys: an RWKV-4/5/6 checkpoint, not RWKV-7 (x070)" % where)
    r_k = _need(state_dict, "blocks.0.att.r_k", where)
    if r_k.dim() != 2 or r_k.shape[0] * r_k.shape[1] != C:
        raise CheckpointError("%s: key 'blocks.0.att.r_k' has shape %s; expected [n_head, head_size] with "
                              "n_head * head_size = n_embd = %d" % (where, tuple(r_k.shape), C))

    def rank(key: str, default: int) -> int:
        t = state_dict.get(key)
        return int(t.shape[-1]) if t is not None and t.dim() == 2 else default

    lay = "blocks.%d.att." % (1 if n_layer > 1 else 0)
    ffn_key = _need(state_dict, "blocks.0.ffn.key.weight", where)
    return RWKV7Config(n_layer=n_layer, n_embd=int(C), head_size=int(r_k.shape[1]), vocab_size=int(vocab),
                       dim_ffn=0 if ffn_key.shape[0] == 4 * C else int(ffn_key.shape[0]), decay_lora=rank(lay + "w1", 64), iclr_lora=rank(lay + "a1", 64),
                       value_lora=rank("blocks.1.att.v1" if n_layer > 1 else "blocks.0.att.v1", 32),
                       gate_lora=rank(lay + "g1", 128), layer0_value_lora="blocks.0.att.v1" in state_dict)


def _checked(state_dict: Mapping[str, torch.Tensor], model: RWKV7Model, where: str) -> Dict[str, torch.Tensor]:
    """The checkpoint's tensors shaped like the model's parameters; raises naming the key."""
    expected = model.state_dict()
    for k in state_dict:
        if k not in expected:
            raise CheckpointError("%s: unexpected key %r (not part of an RWKV-7 x070 model of this size)" % (where, k))
    out = {}
    for k, p in expected.items():
        t = _need(state_dict, k, where)
        if t.dtype not in _FLOATS:
            raise CheckpointError("%s: key %r has dtype %s; expected float32, float16 or bfloat16" % (
                where, k, str(t.dtype).replace("torch.", "")))
        if tuple(t.shape) != tuple(p.shape):
            # [1, 1, C] rows are sometimes stored squeezed ([C]): accept exactly that
            squeezable = t.numel() == p.numel() and [d for d in t.shape if d != 1] == [d for d in p.shape if d != 1]
            if not squeezable:
                raise CheckpointError("%s: key %r has shape %s; expected %s" % (where, k, list(t.shape), list(p.shape)))
            t = t.reshape(p.shape)
        out[k] = t
    return out


# ------------------------------------------------------------------------------ models

def from_state_dict(state_dict: Mapping[str, torch.Tensor], *, dtype: Optional[torch.dtype] = None,
                    device: Union[str, torch.device, None] = None, context: Optional[Context] = None,
                    where: str = "state dict") -> RWKV7Model:
    """An :class:`RWKV7Model` holding these weights (sizes inferred), in ``dtype`` (default:
    the checkpoint's, float32 when mixed) on ``device``, in eval mode."""
    config = infer_config(state_dict, where)
    with torch.device("meta"):
        skeleton = RWKV7Model(config)
    tensors = _checked(state_dict, skeleton, where)
    if dtype is None:
        kinds = {t.dtype for t in tensors.values()}
        dtype = kinds.pop() if len(kinds) == 1 else torch.float32
    model = RWKV7Model(config, context=context).to(dtype=dtype, device=device)
    model.load_state_dict({k: t.to(dtype) for k, t in tensors.items()})
    return model.eval()


def load(path: PathLike, *, dtype: Optional[torch.dtype] = None, device: Union[str, torch.device, None] = None,
         context: Optional[Context] = None) -> RWKV7Model:
    """Loads an RWKV-7 checkpoint (``.pth`` or ``.safetensors``, BlinkDL's key names)."""
    path = os.fspath(path)
    return from_state_dict(read_state_dict(path), dtype=dtype, device=device, context=context, where=path)


def random_init(config: RWKV7Config, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: Union[str, torch.device, None] = None, context: Optional[Context] = None) -> RWKV7Model:
    """An untrained model whose every parameter is drawn (fixed seed): the token shifts, decays,
    learning rates and gates all vary by channel, so a comparison against another
    implementation exercises every term. It trains (see :func:`wkv.model.train_on_text`)."""
    g = torch.Generator().manual_seed(seed)
    model = RWKV7Model(config, context=context)
    C, L = config.n_embd, config.n_layer

    def uni(shape, lo, hi):
        return torch.rand(shape, generator=g) * (hi - lo) + lo

    def normal(shape, std):
        return torch.randn(shape, generator=g) * std

    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name.startswith("blocks.") and ".ln" in name or name.startswith("ln_out"):
                p.copy_(uni(p.shape, 0.8, 1.2) if leaf == "weight" else normal(p.shape, 0.05))
            elif leaf in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
                p.copy_(uni(p.shape, 0.0, 1.0))
            elif leaf == "w0":
                p.copy_(uni(p.shape, -6.0, 1.0))      # decays from ~0.999 to ~0.6 per token
            elif leaf in ("a0", "v0"):
                p.copy_(normal(p.shape, 0.5))
            elif leaf in ("w1", "a1", "v1", "g1"):
                p.copy_(normal(p.shape, 1.0 / math.sqrt(C)))
            elif leaf in ("w2", "a2", "v2", "g2"):
                p.copy_(normal(p.shape, 0.5 / math.sqrt(p.shape[0])))
            elif leaf == "k_k":
                p.copy_(uni(p.shape, 0.7, 1.0))
            elif leaf == "k_a":
                p.copy_(uni(p.shape, 0.5, 1.5))
            elif leaf == "r_k":
                p.copy_(normal(p.shape, 0.1))
            elif name == "emb.weight":
                p.copy_(normal(p.shape, 1.0))
            else:  # the Linear weights [out, in]
                p.copy_(normal(p.shape, 1.0 / math.sqrt(p.shape[1] * (2 * L if "output" in name or
                                                                       "ffn.value" in name else 1))))
    return model.to(dtype=dtype, device=device).eval()
