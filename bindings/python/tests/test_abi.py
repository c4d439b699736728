"""The ctypes mirrors of wkv.h match the C compiler's layout, and every exported function has
argtypes/restype."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

import pytest

import wkv
from wkv import _dlpack, _lib

from conftest import REPO

# Field lists per struct, as named in wkv.h (the ctypes structs must use the same names).
STRUCT_FIELDS = {name: [f[0] for f in cls._fields_] for name, cls in _lib.STRUCTS.items()}

# LP64 (x86-64, aarch64 Linux/macOS) sizes, derived by hand from the header's layout rules:
# wkv_tensor = 8 data + 8 device + 4 ndim + 4 dtype + 8 shape + 8 strides + 8 byte_offset.
LP64_SIZES = {
    "wkv_device": 8,
    "wkv_dtype": 4,
    "wkv_tensor": 48,
    "wkv_context_options": 64 + 8,  # + flags (uint64_t: past the old tail padding)
    "wkv_forward_desc": 24 + 10 * 48 + 8 + 8 + 8 + 8 + 8 + 8,  # ... workspace, scratch
    "wkv_backward_desc": 16 + 10 * 48 + 16 + 8,
    "wkv_backend_info": 64 + 4 * 16,
    "wkv_device_info": 8 + 256 + 8 + 4 + 4,
    "wkv_attention_desc": 16 + 5 * 48 + 8 + 8 + 8 + 8,
    "wkv_attention_config": 8 + 64 + 4 + 10 * 4 + 4 + 8 + 4 + 4,  # + padding before shared_bytes
}


def _cc():
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8 or sys.platform == "win32", reason="LP64 only")
def test_sizes_match_the_lp64_layout():
    for name, size in LP64_SIZES.items():
        assert ctypes.sizeof(_lib.STRUCTS[name]) == size, name


def test_sizes_and_offsets_match_the_c_compiler(tmp_path):
    cc = _cc()
    if cc is None:
        pytest.skip("no C compiler (cc/gcc/clang) to compile the layout probe")
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <wkv/wkv.h>", "int main(void) {"]
    for name, fields in STRUCT_FIELDS.items():
        lines.append('printf("%s size %%zu\\n", sizeof(%s));' % (name, name))
        for f in fields:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (name, f, name, f))
    lines.append("return 0; }")
    src = tmp_path / "probe.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "probe"
    subprocess.run([cc, "-std=c11", "-I", str(REPO / "include"), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    c_layout = {}
    for line in out.splitlines():
        key, *rest = line.split()
        c_layout[key] = int(rest[-1])
    for name, cls in _lib.STRUCTS.items():
        assert ctypes.sizeof(cls) == c_layout[name], "sizeof(%s)" % name
        for f in STRUCT_FIELDS[name]:
            assert getattr(cls, f).offset == c_layout["%s.%s" % (name, f)], "offsetof(%s, %s)" % (name, f)


def test_dlpack_structs_have_the_spec_layout():
    # DLTensor is wkv_tensor field for field (the header promises it)
    assert ctypes.sizeof(_dlpack.DLTensor) == ctypes.sizeof(_lib.wkv_tensor)
    for (n1, _), (n2, _) in zip(_dlpack.DLTensor._fields_, _lib.wkv_tensor._fields_):
        assert getattr(_dlpack.DLTensor, n1).offset == getattr(_lib.wkv_tensor, n2).offset
    p = ctypes.sizeof(ctypes.c_void_p)
    t = ctypes.sizeof(_dlpack.DLTensor)
    assert ctypes.sizeof(_dlpack.DLManagedTensor) == t + 2 * p
    assert _dlpack.DLManagedTensorVersioned.dl_tensor.offset == 8 + 2 * p + 8
    assert ctypes.sizeof(_dlpack.DLManagedTensorVersioned) == 8 + 2 * p + 8 + t


def test_every_exported_function_is_declared():
    lib = _lib.load()
    for name in _lib.FUNCTIONS:
        f = getattr(lib, name)
        assert f.argtypes is not None, name
    nm = shutil.which("nm")
    if nm and sys.platform.startswith("linux"):
        out = subprocess.run([nm, "-D", "--defined-only", str(wkv.library_path())], capture_output=True,
                             text=True).stdout
        exported = {line.split()[-1] for line in out.splitlines() if " T " in line and "wkv_" in line}
        known = set(_lib.FUNCTIONS) | set(_lib.OPTIONAL_FUNCTIONS)
        assert set(_lib.FUNCTIONS) <= exported
        assert exported <= known, "exports without a ctypes declaration in wkv/_lib.py: %s" % (exported - known)


def test_status_values_match_the_library():
    from wkv.errors import STATUS_NAMES

    for value, name in STATUS_NAMES.items():
        assert _lib.status_string(value).startswith(name + ":"), value


def test_version_matches_the_package():
    assert wkv.version() == wkv.__version__
    assert _lib.load().wkv_version() == 100 * 100 * int(wkv.__version__.split(".")[0]) + \
        100 * int(wkv.__version__.split(".")[1]) + int(wkv.__version__.split(".")[2])
