"""The RWKV-7 model (wkv.model) against the `rwkv` pip package's RWKV_x070 (ChatRWKV's model,
strategy "cpu fp32") on the same random checkpoint; prefill + decode against one prefill;
checkpoint files (round trips, and each kind of bad file named); training: the loss falls, the
infctx chunked gradient equals the one-call gradient, state tuning's gradient."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: wkv.model is not tested here")

import wkv.model as wm  # noqa: E402
from conftest import REPO, SRC  # noqa: E402

F32_TOL = 1e-4   # the bound for fp32 logits (measured 3e-7 to 5e-7; ln_x eps 1e-5 for 64e-5 gives 5e-3)
BF16_TOL = 2e-2  # bf16 weights and activations against the fp32 oracle (measured 7-8e-3)


def rel_rms(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def config(n_layer=3, n_embd=128, head_size=32, vocab=256):
    return wm.RWKV7Config(n_layer=n_layer, n_embd=n_embd, head_size=head_size, vocab_size=vocab, decay_lora=16,
                          iclr_lora=16, value_lora=8, gate_lora=32)


@pytest.fixture
def seed(rng):
    return int(rng.integers(1 << 31))


@pytest.fixture(scope="module")
def oracle_cls():
    """The rwkv package's model class (RWKV-7 enabled, no JIT, no CUDA)."""
    pytest.importorskip("rwkv", reason="the rwkv package (the oracle) is not installed: pip install rwkv")
    os.environ["RWKV_V7_ON"] = "1"
    os.environ["RWKV_JIT_ON"] = "0"
    os.environ["RWKV_CUDA_ON"] = "0"
    from rwkv.model import RWKV

    return RWKV


def oracle(oracle_cls, model, tmp_path):
    path = tmp_path / "model.pth"
    torch.save({k: v.float() for k, v in model.state_dict().items()}, path)
    return oracle_cls(str(path)[:-4], "cpu fp32", verbose=False) if "verbose" in \
        oracle_cls.__init__.__code__.co_varnames else oracle_cls(str(path)[:-4], "cpu fp32")


@pytest.mark.parametrize("head_size", [32, 64])
def test_prefill_and_decode_match_the_rwkv_package(oracle_cls, tmp_path, rng, seed, head_size):
    model = wm.random_init(config(head_size=head_size), seed=seed)
    ref = oracle(oracle_cls, model, tmp_path)
    prompt = rng.integers(0, 256, 40).tolist()
    with torch.no_grad():
        logits, state = model(torch.tensor([prompt]))
        ref_logits, ref_state = ref.forward(prompt, None, full_output=True)
        assert rel_rms(logits[0], ref_logits) <= F32_TOL
        assert logits.std() > 0.1  # a model whose logits vary: the comparison means something
        for step in range(32):
            tok = int(rng.integers(0, 256))
            logits, state = model(torch.tensor([[tok]]), state)
            ref_logits, ref_state = ref.forward([tok], ref_state)
            assert rel_rms(logits[0, -1], ref_logits) <= F32_TOL, "decode step %d" % step
        for layer in range(model.config.n_layer):  # the oracle's state: [x_att, wkv, x_ffn] per layer
            assert rel_rms(state.wkv[layer][0], ref_state[3 * layer + 1]) <= F32_TOL
            assert rel_rms(state.att_shift[layer][0], ref_state[3 * layer]) <= F32_TOL
            assert rel_rms(state.ffn_shift[layer][0], ref_state[3 * layer + 2]) <= F32_TOL


def test_bf16_model_stays_near_the_fp32_oracle(oracle_cls, tmp_path, rng, seed):
    model = wm.random_init(config(head_size=64), seed=seed)
    ref = oracle(oracle_cls, model, tmp_path)
    prompt = rng.integers(0, 256, 24).tolist()
    with torch.no_grad():
        ref_logits, _ = ref.forward(prompt, None, full_output=True)
        logits, _ = model.to(torch.bfloat16)(torch.tensor([prompt]))
    err = rel_rms(logits[0], ref_logits)
    assert err <= BF16_TOL, err


def test_prefill_then_decode_equals_one_prefill(rng, seed):
    model = wm.random_init(config(), seed=seed)
    tokens = torch.tensor(rng.integers(0, 256, (2, 30)))  # a batch of two
    with torch.no_grad():
        full, full_state = model(tokens)
        part, state = model(tokens[:, :20])
        steps = [part]
        for t in range(20, 30):
            logits, state = model(tokens[:, t:t + 1], state)
            steps.append(logits)
    assert rel_rms(torch.cat(steps, 1), full) <= 1e-5
    for a, b in zip(state.wkv, full_state.wkv):
        assert rel_rms(a, b) <= 1e-5


def test_one_token_step_equals_the_module_path(rng, seed):
    # without autograd one token takes RWKV7Model's written-out step (_decode_step); with it the
    # blocks' modules: same logits and every part of the state
    model = wm.random_init(config(), seed=seed)
    tokens = torch.tensor(rng.integers(0, 256, (3, 6)))
    with torch.no_grad():
        _, state = model(tokens[:, :5])
    fast_state = state.clone()
    with torch.no_grad():
        fast, fast_state = model(tokens[:, 5:], fast_state)
    slow, slow_state = model(tokens[:, 5:], state.clone())  # grad enabled: the module path
    assert fast.shape == slow.shape == (3, 1, 256)
    assert rel_rms(fast, slow.detach()) <= 1e-6
    for part in ("att_shift", "wkv", "ffn_shift"):
        for a, b in zip(getattr(fast_state, part), getattr(slow_state, part)):
            assert a.shape == b.shape and rel_rms(a, b.detach()) <= 1e-6, part


def test_generate_greedy_is_the_argmax_chain(seed):
    model = wm.random_init(config(), seed=seed)
    g = wm.generate(model, [1, 2, 3], 8, temperature=0)
    assert len(g.tokens) == 8 and g.prefill_seconds > 0
    seq = [1, 2, 3]
    with torch.no_grad():
        for tok in g.tokens:
            logits, _ = model(torch.tensor([seq]))
            assert int(logits[0, -1].argmax()) == tok
            seq.append(tok)


def test_sampling_respects_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = torch.Generator().manual_seed(0)
    seen = {wm.sample(logits, 1.0, 0.7, gen) for _ in range(300)}
    assert seen == {0, 1}  # 0.5 + 0.3 reaches 0.7: tokens 2 and 3 are cut
    assert wm.sample(logits, 0.0, 0.9) == 0


# ------------------------------------------------------------------------------ checkpoints

@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_checkpoint_round_trip(tmp_path, seed, suffix):
    model = wm.random_init(config(n_layer=2), seed=seed, dtype=torch.bfloat16)
    path = tmp_path / ("m" + suffix)
    if suffix == ".pth":
        torch.save(model.state_dict(), path)
    else:
        wm.save_safetensors(model.state_dict(), path)
    again = wm.load(path)
    assert again.config == model.config and again.emb.weight.dtype == torch.bfloat16
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k


def test_squeezed_rows_and_layer0_value_lora_load(seed):
    """Checkpoints storing [1,1,C] rows as [C], and ones with (unused) v0/v1/v2 in layer 0."""
    model = wm.random_init(config(n_layer=2), seed=seed)
    sd = {k: (v.reshape(-1) if v.shape[:2] == (1, 1) else v) for k, v in model.state_dict().items()}
    sd.update({"blocks.0.att.v0": torch.zeros(1, 1, 128), "blocks.0.att.v1": torch.zeros(128, 8),
               "blocks.0.att.v2": torch.zeros(8, 128)})
    again = wm.from_state_dict(sd)
    x = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(again(x)[0], model(x)[0])


def _bad(model, change):
    sd = dict(model.state_dict())
    change(sd)
    return sd


@pytest.mark.parametrize("change, message", [
    (lambda sd: sd.pop("blocks.1.att.k_k"), "missing key 'blocks.1.att.k_k'"),
    (lambda sd: sd.__setitem__("blocks.0.ffn.value.weight", torch.zeros(128, 100)),
     "key 'blocks.0.ffn.value.weight' has shape [128, 100]; expected [128, 512]"),
    (lambda sd: sd.__setitem__("blocks.1.att.w0", torch.zeros(1, 1, 128, dtype=torch.int32)),
     "key 'blocks.1.att.w0' has dtype int32"),
    (lambda sd: sd.__setitem__("blocks.0.att.bogus", torch.zeros(3)), "unexpected key 'blocks.0.att.bogus'"),
    (lambda sd: sd.pop("emb.weight"), "missing key 'emb.weight'"),
    (lambda sd: sd.__setitem__("blocks.0.att.r_k", torch.zeros(3, 5)), "key 'blocks.0.att.r_k' has shape"),
    (lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("blocks.0.")], "missing every key of layer 0"),
])
def test_bad_state_dicts_name_the_key(seed, change, message):
    model = wm.random_init(config(n_layer=2), seed=seed)
    with pytest.raises(wm.CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")):
        wm.from_state_dict(_bad(model, change))


def test_bad_files_name_the_file_and_key(tmp_path, seed):
    model = wm.random_init(config(n_layer=2), seed=seed)
    good = tmp_path / "m.safetensors"
    wm.save_safetensors(model.state_dict(), good)
    raw = good.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    cases = {
        "truncated.safetensors": (raw[:len(raw) - 100], "truncated file"),
        "header.safetensors": (raw[:8 + n // 2], "truncated safetensors file"),
        "empty.safetensors": (b"", "no header length"),
        "json.safetensors": (struct.pack("<Q", 4) + b"{{{{", "not valid JSON"),
        "truncated.pth": (b"PK\x03\x04garbage", "not a readable torch checkpoint"),
    }
    for name, (data, message) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(wm.CheckpointError, match=message) as e:
            wm.load(p)
        assert name in str(e.value)
    with pytest.raises(wm.CheckpointError, match="no such checkpoint file"):
        wm.load(tmp_path / "absent.pth")
    # the truncated file names the first key whose data is cut
    with pytest.raises(wm.CheckpointError, match=r"key '[a-z_.0-9]+': truncated"):
        wm.load(tmp_path / "truncated.safetensors")


def test_rwkv6_checkpoint_is_refused_by_name(tmp_path):
    sd = {"emb.weight": torch.zeros(256, 64), "blocks.0.att.time_decay": torch.zeros(64),
          "blocks.0.att.r_k": torch.zeros(1, 64)}
    with pytest.raises(wm.CheckpointError, match="RWKV-4/5/6 checkpoint"):
        wm.from_state_dict(sd)


# ------------------------------------------------------------------------------ training

def _text_tokens():
    return torch.tensor(list((REPO / "README.md").read_bytes()), dtype=torch.long)


def test_training_lowers_the_loss(seed):
    torch.manual_seed(seed)
    model = wm.random_init(wm.RWKV7Config(n_layer=2, n_embd=64, head_size=32, vocab_size=256, decay_lora=16,
                                          iclr_lora=16, value_lora=8, gate_lora=16), seed=seed)
    losses = wm.train_on_text(model, _text_tokens(), steps=150, batch=8, seq_len=48, lr=4e-3, seed=seed, log=None)
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert last < first - 2.0 and last < 3.3, (first, last)  # from ~ln 256 = 5.5 to well under 3.3 nats


def test_infctx_chunked_gradient_equals_the_full_gradient(rng, seed):
    model = wm.random_init(config(), seed=seed).train()
    tokens = torch.tensor(rng.integers(0, 256, (2, 45)))
    targets = torch.roll(tokens, -1, 1)
    targets[:, -1] = -100

    def grads(chunk):
        model.zero_grad()
        loss, _ = wm.chunked_loss(model, tokens, targets, chunk)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    full_loss, full = grads(45)
    for chunk in (16, 7):
        loss, g = grads(chunk)
        assert abs(float(loss - full_loss)) <= 1e-5 * float(full_loss)
        for n in full:
            assert rel_rms(g[n], full[n]) <= 1e-4, (chunk, n)


def test_state_tuning_gradient_and_training(rng, seed):
    model = wm.random_init(config(n_layer=2), seed=seed).requires_grad_(False)
    tuner = wm.StateTuner(model)
    with torch.no_grad():
        tuner.wkv0.normal_(0, 0.1, generator=torch.Generator().manual_seed(seed))
    tokens = torch.tensor(rng.integers(0, 256, (2, 24)))
    targets = torch.roll(tokens, -1, 1)

    def loss_of(wkv0):
        s = model.zero_state(2)
        s.wkv = [wkv0[i].unsqueeze(0).expand(2, -1, -1, -1).contiguous() for i in range(2)]
        logits, _ = model(tokens, s)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    loss = loss_of(tuner.wkv0)
    loss.backward()
    g = tuner.wkv0.grad
    assert g.abs().max() > 0
    # directional derivatives against central differences (float32 forwards, step 1e-2): along
    # the gradient itself (the largest, so relative error means something: measured <= 9e-4 over
    # 25 seeds) and along a random direction (whose derivative may be near zero: the bound adds a
    # share of |g|; measured errors <= 7e-5 against |g| ~ 5e-2)
    eps = 1e-2
    u = g / g.norm()
    d = torch.randn(tuner.wkv0.shape, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        fd_u = (loss_of(tuner.wkv0 + eps * u) - loss_of(tuner.wkv0 - eps * u)) / (2 * eps)
        fd_d = (loss_of(tuner.wkv0 + eps * d) - loss_of(tuner.wkv0 - eps * d)) / (2 * eps)
    assert abs(float(g.norm()) - float(fd_u)) <= 5e-3 * abs(float(fd_u)), (float(g.norm()), float(fd_u))
    assert abs(float((g * d).sum()) - float(fd_d)) <= 2e-2 * abs(float(fd_d)) + 5e-3 * float(g.norm()), (
        float((g * d).sum()), float(fd_d))
    # a few steps of tuning only the state lower the loss on this sequence
    opt = torch.optim.Adam(tuner.parameters(), lr=0.05)
    start = float(loss_of(tuner.wkv0).detach())
    for _ in range(30):
        opt.zero_grad()
        loss = loss_of(tuner.wkv0)
        loss.backward()
        opt.step()
    assert float(loss_of(tuner.wkv0).detach()) < start - 0.1
    assert all(p.grad is None for p in model.parameters())  # the model stayed frozen


def test_cli_generates_and_reports_speed(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "wkv.model", "generate", "--random-init", "2x64", "--head-size", "32",
                          "--tokenizer", "bytes", "--tokens", "12", "--temperature", "0", "--device", "cpu"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "prefill: 19 tokens" in out.stdout and "decode: 11 tokens" in out.stdout
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 4)
    out = subprocess.run([sys.executable, "-m", "wkv.model", "generate", "--weights", str(bad)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "bad.safetensors" in out.stderr and "Traceback" not in out.stderr


# ------------------------------------------------------------------------------ the C example

C_EXAMPLE = os.environ.get("WKV_RWKV7_MODEL_EXAMPLE")  # set by ctest when examples are built
needs_c_example = pytest.mark.skipif(not C_EXAMPLE, reason="WKV_RWKV7_MODEL_EXAMPLE is not set (ctest sets it to "
                                                           "the built examples/rwkv7_model binary)")


def _run_c(*args):
    return subprocess.run([C_EXAMPLE, *map(str, args)], capture_output=True, text=True, timeout=300)


@needs_c_example
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_example_prints_the_python_models_tokens(tmp_path, rng, seed, dtype):
    model = wm.random_init(config(head_size=32), seed=seed, dtype=dtype)
    path = tmp_path / "m.safetensors"
    wm.save_safetensors(model.state_dict(), path)
    model = model.float()  # the C example converts the weights to float32 at load
    prompt = rng.integers(0, 256, 33).tolist()
    out = _run_c(path, "--tokens", ",".join(map(str, prompt)), "--generate", 12)
    assert out.returncode == 0, out.stderr
    lines = {ln.split(":", 1)[0]: ln.split(":", 1)[1].split() for ln in out.stdout.splitlines() if ":" in ln}
    with torch.no_grad():
        logits, _ = model(torch.tensor([prompt]), last_only=True)
    c_logits = torch.tensor([float(v) for v in lines["logits"]])
    assert rel_rms(c_logits, logits[0, -1, :8]) <= 1e-4
    g = wm.generate(model, prompt, 12, temperature=0)
    assert [int(t) for t in lines["tokens"]] == g.tokens


@needs_c_example
def test_c_example_names_the_bad_key_and_exits_1(tmp_path, seed):
    model = wm.random_init(config(n_layer=2), seed=seed)
    sd = dict(model.state_dict())
    sd.pop("blocks.1.att.a0")
    path = tmp_path / "missing.safetensors"
    wm.save_safetensors(sd, path)
    out = _run_c(path)
    assert out.returncode == 1 and "missing key 'blocks.1.att.a0'" in out.stderr
    sd = dict(model.state_dict(), **{"blocks.0.att.w1": torch.zeros(128, 3)})  # a rank that disagrees with w2
    wm.save_safetensors(sd, path)
    out = _run_c(path)
    assert out.returncode == 1 and "blocks.0.att.w2" in out.stderr, out.stderr
    raw = (tmp_path / "missing.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:len(raw) // 2])
    out = _run_c(tmp_path / "cut.safetensors")
    assert out.returncode == 1 and "cut.safetensors" in out.stderr
    out = _run_c(tmp_path / "absent.safetensors")
    assert out.returncode == 1
    out = _run_c(path, "--tokens", "1,x")
    assert out.returncode == 2
