"""Contexts, introspection, log callbacks, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import wkv
import reference as ref


def test_info_describes_the_library():
    d = wkv.info()
    assert d["version"] == wkv.__version__ == wkv.version()
    assert d["version_code"] == 100  # 0.1.0
    assert set(d["backends"]) == {"cpu", "cuda", "vulkan"}
    cpu = d["backends"]["cpu"]
    assert cpu["available"] and cpu["device_count"] >= 1 and cpu["devices"][0]["name"]
    assert "rwkv7" in cpu["ops"] and cpu["dtypes"] == ["f32", "f16", "bf16"]
    assert cpu["decay_forms"] == ["direct", "log", "exp_neg_exp", "clampw"]
    assert cpu["head_sizes"] == "any"
    assert d["auto"] in ("cpu", "cuda", "vulkan")
    assert str(wkv.library_path()) == d["library"]
    for name, b in d["backends"].items():
        assert b["available"] or b["reason"], name  # unavailable says why


def test_context_lifecycle():
    ctx = wkv.Context("cpu", threads=1)
    assert ctx.backend == "cpu" and not ctx.closed and ctx.handle
    assert "backend='cpu'" in repr(ctx)
    assert ctx.last_error == ""
    ctx.close()
    ctx.close()
    assert ctx.closed
    with pytest.raises(ValueError, match="closed"):
        ctx.handle
    with pytest.raises(wkv.InvalidArgumentError, match="backend is 'gpu'"):
        wkv.Context("gpu")


def test_cuda_stream_calls_refuse_a_cpu_context():
    with wkv.Context("cpu") as ctx:
        with pytest.raises(wkv.InvalidArgumentError, match="wkv_cuda_set_stream: the context runs on the cpu backend"):
            ctx.set_cuda_stream(0)
        with pytest.raises(wkv.InvalidArgumentError, match="wkv_cuda_get_stream"):
            ctx.cuda_stream()


def test_log_callback_hears_the_backend_choice_and_failures(rng):
    lines = []
    with wkv.Context("cpu", log=lambda level, msg: lines.append((level, msg)), log_level="info") as ctx:
        assert any(level == "info" and "backend cpu" in msg for level, msg in lines), lines
        x = ref.random_inputs(rng, 1, 3, 1, 4)
        x["r"] = x["r"][:, :2]
        with pytest.raises(wkv.ShapeError):
            wkv.rwkv7(*x.values(), context=ctx)
        assert ("error", "wkv_forward: desc->r.shape[1] is 2, expected 3") in lines


def test_log_callback_exceptions_do_not_unwind_into_c(capsys):
    def bad(level, msg):
        raise RuntimeError("boom in log")

    with wkv.Context("cpu", log=bad, log_level="debug") as ctx:
        assert ctx.backend == "cpu"
    assert "boom in log" in capsys.readouterr().err


def test_default_context_is_shared_and_thread_safe(rng):
    B, T, H, N = 1, 64, 2, 16
    x = ref.random_inputs(rng, B, T, H, N)
    want, _ = wkv.rwkv7(*x.values())
    assert wkv.default_context() is wkv.default_context()
    errors = []

    def work():
        try:
            for _ in range(20):
                y, _ = wkv.rwkv7(*x.values())
                np.testing.assert_array_equal(y, want)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_backend_and_device_info_functions():
    b = wkv.backend_info("cpu")
    d = wkv.device_info("cpu", 0)
    assert d == b["devices"][0]
    for name in ("cuda", "vulkan"):
        if not wkv.backend_info(name)["available"]:
            with pytest.raises(wkv.BackendUnavailableError, match="wkv_device_get_info: backend %s" % name):
                wkv.device_info(name, 0)


def test_health_is_ok_on_a_working_context():
    with wkv.Context("cpu", threads=1) as ctx:
        assert ctx.health() == "ok"
    with pytest.raises(ValueError, match="closed"):
        ctx.health()


@pytest.mark.skipif("fault injection" not in wkv.info()["build"],
                    reason="libwkv built without fault injection (WKV_FAULT_INJECTION=OFF)")
def test_a_lost_context_says_so_and_refuses_every_call(rng, monkeypatch):
    # WKV_FAULT (src/fault.h) is read when a context is created: the first op of `lost` loses
    # its "device"; `other`, created before, keeps working.
    x = ref.random_inputs(rng, 1, 8, 2, 8)
    other = wkv.Context("cpu", threads=1)
    monkeypatch.setenv("WKV_FAULT", "device_lost")
    lost = wkv.Context("cpu", threads=1)
    monkeypatch.delenv("WKV_FAULT")
    with pytest.raises(wkv.DeviceLostError, match="device was lost"):
        wkv.rwkv7(*x.values(), context=lost)
    assert lost.health() == "lost"
    with pytest.raises(wkv.DeviceLostError, match="destroy this context"):
        wkv.rwkv7(*x.values(), context=lost)
    y, _ = wkv.rwkv7(*x.values(), context=other)
    want, _ = ref.rwkv7_forward(*x.values())
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    assert other.health() == "ok"
    lost.close()
    other.close()
    # out of memory leaves the context healthy, and the retry works
    monkeypatch.setenv("WKV_FAULT", "oom:scratch@1")
    ctx = wkv.Context("cpu", threads=1)
    monkeypatch.delenv("WKV_FAULT")
    with pytest.raises(wkv.OutOfMemoryError, match="scratch"):
        wkv.rwkv7(*x.values(), context=ctx)
    assert ctx.health() == "ok"
    y, _ = wkv.rwkv7(*x.values(), context=ctx)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    ctx.close()
