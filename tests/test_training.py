"""The fast trainer against the reference: gradients by parameter name, AdamW, clipping,
the schedule; determinism, exact resumption, checkpoints and bad inputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import sympy as sp
import torch

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.gradient_budgets import gpt_backward_bound
from gptspec.fast import train
from gptspec.fast.checkpoint import CheckpointError, load_training_checkpoint
from gptspec.fast.data import DataError, TokenData, open_tokens, write_tokens
from gptspec.fast.tokenizer import Tokenizer
from gptspec.spec import REGISTRY, GPTConfig, init_parameters

SMALL = dict(vocab_size=11, n_ctx=6, d_model=8, n_layers=2, n_heads=2, d_ff=12)
CONFIGS = [
    GPTConfig(**SMALL),
    GPTConfig(**SMALL, norm="post", ffn="relu", final_norm=False),
    GPTConfig(**{**SMALL, "d_ff": 8}, norm="guide", ffn="guide_product",
              tied_embeddings=False, output_bias=True, final_norm=False),
    GPTConfig(**SMALL, ffn="gelu", tied_embeddings=False, attn_bias=False, ffn_bias=False),
]


def _case(config: GPTConfig, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {k: v + rng.normal(0, 0.1, v.shape) for k, v in init_parameters(config, seed).items()}
    tokens = rng.integers(0, config.vocab_size, (2, config.n_ctx))
    targets = rng.integers(0, config.vocab_size, (2, config.n_ctx))
    return params, tokens, targets


def _within_budget(got: dict, expected: dict, params, config, tokens, targets,
                   dtype: str) -> float:
    """The largest fraction of its budget any gradient entry uses."""
    bounds = gpt_backward_bound(tokens, targets, params, config, B.Precision.of(dtype))
    return max(B.compare(got[name], g, B.budget(bounds[name][1])).fraction
               for name, g in expected.items())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("config", CONFIGS, ids=["pre", "post", "guide", "gelu-untied-nobias"])
def test_fast_gradients_equal_the_reference_by_name(config, dtype):
    params, tokens, targets = _case(config)
    if dtype == "float32":
        params = {k: B.round_to(v, dtype) for k, v in params.items()}
    loss, expected = ref.gpt_backward(tokens, targets, params, config)
    got_loss, got = train.gpt_backward(tokens, targets, params, config,
                                       dtype=getattr(torch, dtype))
    assert list(got) == list(expected)
    assert _within_budget(got, expected, params, config, tokens, targets, dtype) <= 1.0
    assert abs(got_loss - loss) <= 1e-5 * abs(loss)


def test_gradient_comparison_catches_a_planted_bug():
    """A gradient off by 0.1% in one parameter must exceed its float32 budget."""
    config = CONFIGS[0]
    params, tokens, targets = _case(config)
    _, expected = ref.gpt_backward(tokens, targets, params, config)
    broken = dict(expected)
    broken["blocks.1.ln_2.weight"] = expected["blocks.1.ln_2.weight"] * 1.001
    assert _within_budget(broken, expected, params, config, tokens, targets,
                          "float32") > 1.0


def test_adamw_trajectory_equals_the_reference():
    rng = np.random.default_rng(1)
    theta = {"w": rng.normal(size=(4, 3))}
    grads = [{"w": rng.normal(size=(4, 3))} for _ in range(5)]
    lrs = [ref.lr_schedule(t, 1e-2, 1e-3, 2, 5) for t in range(5)]
    got = train.adamw_trajectory(theta, grads, lrs, 0.9, 0.95, 1e-8, 0.1, dtype=torch.float64)
    th, m, v = theta["w"], np.zeros((4, 3)), np.zeros((4, 3))
    for t in range(5):
        th, m, v = ref.adamw_step(th, grads[t]["w"], m, v, t + 1, lrs[t], 0.9, 0.95, 1e-8, 0.1)
        np.testing.assert_allclose(got[t]["w"], th, rtol=1e-13, atol=1e-15)
    # Decoupled decay: L2 regularisation (decay added to the gradient) is a different map.
    coupled, _, _ = ref.adamw_step(theta["w"], grads[0]["w"] + 0.1 * theta["w"], 0, 0, 1,
                                   lrs[0], 0.9, 0.95, 1e-8, 0.0)
    assert not np.allclose(got[0]["w"], coupled, rtol=1e-9)


def test_adamw_reference_equals_its_spec_entry():
    rng = np.random.default_rng(2)
    theta, g, m, v = (rng.normal(size=(1, 3)) for _ in range(4))
    v = np.abs(v)
    kwargs = dict(t=3, lr=sp.Rational(1, 100), beta1=sp.Rational(9, 10),
                  beta2=sp.Rational(95, 100), eps=sp.Rational(1, 10**8),
                  weight_decay=sp.Rational(1, 10))
    exact = REGISTRY["adamw_step"].sympy(*(sp.Matrix(a) for a in (theta, g, m, v)), **kwargs)
    got = ref.adamw_step(theta, g, m, v, 3, 0.01, 0.9, 0.95, 1e-8, 0.1)
    for e, r in zip(exact, got, strict=True):
        np.testing.assert_allclose(np.array(e.evalf(30), dtype=float), r, rtol=1e-14)


def test_clip_and_schedule_equal_their_spec_entries_and_torch():
    rng = np.random.default_rng(3)
    grads = {"a": rng.normal(size=(3, 2)) * 5, "b": rng.normal(size=4)}
    clipped, norm = ref.clip_grad_norm(grads, 1.0)
    tensors = [torch.tensor(g, requires_grad=True) for g in grads.values()]
    for t, g in zip(tensors, grads.values(), strict=True):
        t.grad = torch.tensor(g)
    torch_norm = torch.nn.utils.clip_grad_norm_(tensors, 1.0)
    assert norm == pytest.approx(float(torch_norm), rel=1e-14)
    for t, g in zip(tensors, clipped.values(), strict=True):
        np.testing.assert_allclose(t.grad.numpy(), g, rtol=1e-14)
    flat = sp.Matrix([[*grads["a"].ravel(), *grads["b"].ravel()]])
    exact, _ = REGISTRY["clip_grad_norm"].sympy(flat, max_norm=1)
    np.testing.assert_allclose(np.array(exact.evalf(30), dtype=float).ravel(),
                               np.concatenate([c.ravel() for c in clipped.values()]), rtol=1e-14)
    for step in (0, 4, 9, 10, 37, 99, 100, 150):
        exact = REGISTRY["lr_schedule"].sympy(step, 1e-3, 1e-4, 10, 100)
        assert ref.lr_schedule(step, 1e-3, 1e-4, 10, 100) == pytest.approx(float(exact), rel=1e-14)
    assert ref.lr_schedule(9, 1e-3, 1e-4, 10, 100) == 1e-3  # the peak ends the warm-up
    assert ref.lr_schedule(100, 1e-3, 1e-4, 10, 100) == 1e-4


def _tokens(config, n, seed=0):
    return np.random.default_rng(seed).integers(0, config.vocab_size, n)


def test_training_is_deterministic_and_resumes_bit_identically():
    config = CONFIGS[0].replace(vocab_size=256)
    params = init_parameters(config, 1)
    tokens = _tokens(config, 200)
    a = train.train_losses(tokens, params, config, 4, seed=5)
    b = train.train_losses(tokens, params, config, 4, seed=5)
    assert a == b
    assert train.train_losses(tokens, params, config, 4, seed=6) != a  # the seed matters
    for k in (1, 3):
        assert train.train_losses(tokens, params, config, 4, seed=5, resume_at=k) == a


def test_resume_with_a_sampler_state_the_checkpoint_lacks_is_not_identical(monkeypatch):
    """The resume check can fail: a batch generator kept per trainer, whose state no
    checkpoint holds, starts over on resume and changes the losses."""
    config = CONFIGS[0].replace(vocab_size=256)
    params = init_parameters(config, 1)
    tokens = _tokens(config, 200)

    def stateful(self):
        rng = self.__dict__.setdefault("lost_rng", np.random.default_rng(self.settings.seed))
        return [self.data.batch("train", self.settings.batch_size, rng)]

    monkeypatch.setattr(train.Trainer, "next_batches", stateful)
    whole = train.train_losses(tokens, params, config, 4, seed=5)
    assert train.train_losses(tokens, params, config, 4, seed=5, resume_at=2) != whole


def test_the_batches_are_keyed_by_seed_rank_and_step():
    config = CONFIGS[0].replace(vocab_size=256)
    data = TokenData.split(_tokens(config, 300).astype(np.uint16), config.n_ctx)

    def draw(seed, rank, step):
        return data.batch("train", 4, train.batch_generator(seed, rank, step))[0]

    assert torch.equal(draw(5, 1, 3), draw(5, 1, 3))
    for other in ((6, 1, 3), (5, 0, 3), (5, 1, 2)):
        assert not torch.equal(draw(5, 1, 3), draw(*other)), other


def test_gradient_accumulation_equals_the_larger_batch():
    config = CONFIGS[0].replace(vocab_size=256)
    data = TokenData.split(_tokens(config, 300).astype(np.uint16), config.n_ctx)
    rng = np.random.default_rng(0)
    x, y = data.batch("train", 4, rng)
    one = train.Trainer(config, train.TrainSettings(batch_size=4, grad_clip=0), data,
                        Tokenizer.byte_level())
    two = train.Trainer(config, train.TrainSettings(batch_size=2, grad_accum=2, grad_clip=0),
                        data, Tokenizer.byte_level())
    one.step_on([(x, y)])
    two.step_on([(x[:2], y[:2]), (x[2:], y[2:])])
    u = B.Precision.of("float32").u
    for (name, p), q in zip(one.model.named_parameters(), two.model.parameters(), strict=True):
        # one AdamW step from the same point moves each entry by about lr; the two
        # gradients differ only by float32 rounding
        assert torch.allclose(p, q, rtol=0, atol=one.settings.lr * 1e3 * u + 1e2 * u), name


def _trained(tmp_path, steps=2):
    config = CONFIGS[0].replace(vocab_size=256)
    data = TokenData.split(_tokens(config, 200).astype(np.uint16), config.n_ctx)
    t = train.Trainer(config, train.TrainSettings(batch_size=2, max_steps=steps,
                                                  eval_interval=1, eval_batches=1),
                      data, Tokenizer.byte_level())
    assert t.run(tmp_path, progress=False) == "done"
    return t, data


def test_checkpoint_layout_and_corruption(tmp_path):
    t, data = _trained(tmp_path)
    ckpt = tmp_path / "checkpoint"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "model.safetensors", "optimizer.safetensors", "state.json", "tokenizer.json"]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = json.loads((ckpt / "state.json").read_text())
    assert state["step"] == 2 and len(state["history"]["val"]) == 2
    for f in ckpt.iterdir():
        assert b"\x80\x04" not in f.read_bytes()[:2]  # no pickle protocol header
    blob = bytearray((ckpt / "optimizer.safetensors").read_bytes())
    blob[-3] ^= 0xFF
    (ckpt / "optimizer.safetensors").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="optimizer.safetensors is corrupt"):
        load_training_checkpoint(ckpt)
    (ckpt / "state.json").write_text("{")
    with pytest.raises(CheckpointError, match="state.json is not valid JSON"):
        load_training_checkpoint(ckpt)


def test_a_kill_between_the_renames_leaves_the_previous_checkpoint(tmp_path):
    t, data = _trained(tmp_path)
    ckpt = tmp_path / "checkpoint"
    shutil.rmtree(tmp_path / ".checkpoint.previous")  # the save discards the older copy,
    ckpt.rename(tmp_path / ".checkpoint.previous")  # then moves this one aside: killed here
    config, params, _, state, _ = load_training_checkpoint(ckpt)
    assert state["step"] == 2


def test_nan_loss_stops_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    t, data = _trained(tmp_path)
    before = (tmp_path / "checkpoint" / "model.safetensors").read_bytes()
    resumed = train.Trainer.resume(tmp_path / "checkpoint", data, {"max_steps": 5})
    monkeypatch.setattr(resumed, "loss", lambda x, y, model=None: torch.tensor(float("nan")))
    with pytest.raises(train.TrainingDiverged, match="loss became nan at step 3"):
        resumed.run(tmp_path, progress=False)
    assert (tmp_path / "checkpoint" / "model.safetensors").read_bytes() == before


def test_ctrl_c_saves_then_stops(tmp_path, monkeypatch):
    t, data = _trained(tmp_path)
    resumed = train.Trainer.resume(tmp_path / "checkpoint", data, {"max_steps": 10})
    real_step = resumed.step

    def step():
        if resumed.step_count == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(resumed, "step", step)
    assert resumed.run(tmp_path, progress=False) == "interrupted"
    assert load_training_checkpoint(tmp_path / "checkpoint")[3]["step"] == 3


def test_bad_token_files(tmp_path):
    with pytest.raises(DataError, match="not found"):
        open_tokens(tmp_path / "missing.bin", 256)
    os.mkfifo(tmp_path / "fifo.bin")  # it exists: "not found" was untrue
    with pytest.raises(DataError, match="fifo.bin is not a regular file"):
        open_tokens(tmp_path / "fifo.bin", 256)
    write_tokens(tmp_path / "ok.bin", [1, 2, 3], 256)
    with pytest.raises(DataError, match="outside the model's vocabulary of 3"):
        open_tokens(tmp_path / "ok.bin", 3)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(DataError, match="holds 3 bytes, not a whole number of 2-byte ids"):
        open_tokens(tmp_path / "odd.bin", 256)
    with pytest.raises(DataError, match="too short"):
        TokenData.split(np.arange(20, dtype=np.uint16), block_size=16)
    with pytest.raises(DataError, match=r"\[0, 256\)"):
        write_tokens(tmp_path / "bad.bin", [1, 300], 256)



@pytest.mark.parametrize("dtype", ["<u2", ">u2", "<u4", ">u4"])
def test_token_files_of_either_byte_order_give_the_same_batches(tmp_path, dtype):
    ids = np.arange(40) * 1637 % 50_000  # ids whose two bytes differ
    np.save(tmp_path / "tokens.npy", ids.astype(dtype))
    data = open_tokens(tmp_path / "tokens.npy", 50_000)
    assert np.array_equal(np.asarray(data, dtype=np.int64), ids)
    x, y = TokenData(data, data, 8).batch("train", 4, np.random.default_rng(0))
    expected = TokenData(ids, ids, 8).batch("train", 4, np.random.default_rng(0))
    assert torch.equal(x, expected[0]) and torch.equal(y, expected[1])
    (tmp_path / "text.npy").write_text("First Citizen:\n")
    with pytest.raises(DataError, match="is not a NumPy .npy file"):
        open_tokens(tmp_path / "text.npy", 50_000)
    np.save(tmp_path / "signed.npy", ids.astype(">i2" if "2" in dtype else ">i4"))
    with pytest.raises(DataError, match="flat uint16 or uint32"):
        open_tokens(tmp_path / "signed.npy", 50_000)

# --- the conformance checks added for clipping and the loss sum catch planted bugs ---------


def _training_check(backend, check_id):
    from gptspec.conformance.runner import run_suite

    suite = run_suite(backend, profile="quick", area="training",
                      select=lambda c: c.id == check_id)
    (result,) = suite.results
    return result


def test_clipping_check_passes_torch_in_16_bit_and_catches_per_tensor_clipping():
    from gptspec.fast.backend import TorchBackend

    class PerTensorClipping(TorchBackend):
        """Clips each parameter's gradient on its own norm (a common slip)."""

        def clip_grad_norm(self, grads, max_norm):
            out, norms = {}, []
            for name, g in grads.items():
                clipped, n = super().clip_grad_norm({name: g}, max_norm)
                out[name] = clipped[name]
                norms.append(n)
            return out, float(np.sqrt(np.sum(np.square(norms))))

    assert _training_check(TorchBackend("cpu", "bfloat16"),
                           "clip_grad_norm.differential").status == "pass"
    result = _training_check(PerTensorClipping("cpu", "float32"), "clip_grad_norm.differential")
    assert result.status == "fail", result.detail


def test_loss_check_catches_a_loss_summed_where_the_mean_is_specified():
    from gptspec.fast.backend import TorchBackend

    class SummedLoss(TorchBackend):
        def gpt_backward(self, tokens, targets, params, config):
            loss, grads = super().gpt_backward(tokens, targets, params, config)
            return loss * np.asarray(targets).size, grads

    result = _training_check(SummedLoss("cpu", "float32"), "cross_entropy_mean.differential")
    assert result.status == "fail", result.detail


def _last_line_printed_by(code: str) -> str:
    """Run ``code`` in a fresh Python process (as a training run starts); its last line."""
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr
    return child.stdout.strip().splitlines()[-1]


PAGE_FAULT_PROBE = """
import resource, sys
import numpy as np, torch
from gptspec.fast.data import TokenData
from gptspec.fast.train import Trainer, TrainSettings
from gptspec.spec import preset
torch.set_num_threads(1)
config = preset("shakespeare-char")
ids = np.random.default_rng(0).integers(0, config.vocab_size, 20_000).astype(np.uint16)
trainer = Trainer(config, TrainSettings(max_steps=20), TokenData.split(ids, config.n_ctx), None)
for _ in range(3):
    trainer.step()
faults = []
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    trainer.step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(faults)[len(faults) // 2])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_training_step_reuses_freed_memory_instead_of_faulting_in_fresh_pages() -> None:
    """train.reuse_freed_memory: in a fresh process (as a training run starts), a
    shakespeare-char step's activations come from memory freed by the step before. Without
    it glibc unmaps and re-maps them every step: about 2,500 page faults a step, each a
    freshly zeroed page. Judged on the median step: the heap still grows now and then (a
    step of a few hundred faults among steps of none)."""
    median_faults = float(_last_line_printed_by(PAGE_FAULT_PROBE))
    assert median_faults < 100, median_faults


def test_the_trainers_adamw_is_torchs_fused_adamw_bit_for_bit() -> None:
    """fast/optimizer.AdamW calls the kernel torch.optim.AdamW(fused=True) calls: the same
    parameters and moments, to the bit, over steps with two groups (decayed and not) and a
    learning rate that changes every step, float32 and float64."""
    from gptspec.fast.optimizer import AdamW

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        start = [torch.randn(shape, generator=gen, dtype=dtype) for shape in ((5, 3), (3,), (4, 4))]
        grads = [[torch.randn(p.shape, generator=gen, dtype=dtype) for p in start]
                 for _ in range(6)]
        runs = []
        for make in ("ours", "torch"):
            params = [torch.nn.Parameter(p.clone()) for p in start]
            groups = [{"params": [params[0], params[2]], "weight_decay": 0.1},
                      {"params": [params[1]], "weight_decay": 0.0}]
            opt = (AdamW(groups, lr=1e-3, betas=(0.9, 0.99), eps=1e-8) if make == "ours" else
                   torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), eps=1e-8, fused=True))
            for k, step_grads in enumerate(grads):
                for p, g in zip(params, step_grads, strict=True):
                    p.grad = g.clone()
                for group in opt.param_groups:
                    group["lr"] = 1e-3 * (k + 1) / 6
                opt.step()
            runs.append([p.detach().clone() for p in params]
                        + [opt.state[p][m] for p in params for m in ("exp_avg", "exp_avg_sq")])
        assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_a_training_run_imports_neither_dynamo_nor_sympy() -> None:
    """Why the trainer's AdamW is not a torch.optim optimizer: those import torch._dynamo
    (and sympy with it) when built or stepped, about 1.5 s of every run's start-up; the
    spec's entries (sympy too) are declared only when the registry is read."""
    probe = ("import sys, numpy as np\n"
             "from gptspec.fast.data import TokenData\n"
             "from gptspec.fast.train import Trainer, TrainSettings\n"
             "from gptspec.spec import GPTConfig\n"
             "config = GPTConfig(vocab_size=11, n_ctx=6, d_model=8, n_layers=2, n_heads=2, "
             "d_ff=12)\n"
             "ids = np.arange(200) % 11\n"
             "t = Trainer(config, TrainSettings(batch_size=2, max_steps=3, eval_batches=1), "
             "TokenData.split(ids, 6), None)\n"
             "[t.step() for _ in range(3)]\n"
             "t.evaluate()\n"
             "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n")
    assert _last_line_printed_by(probe) == "[]"


# --- --compile: the forward and the loss compiled together ---------------------------------


@pytest.mark.parametrize("name", ["tiny", "tiny-guide", "gpt2-like-tiny"])
def test_the_compiled_forward_and_loss_are_one_graph(name):
    """torch.compile traces the trainer's forward and loss without a graph break. A break
    splits the step into separately launched pieces; one at every product (a context
    variable read inside ops.linear, since removed) cost a third of the step on an H200."""
    from dataclasses import replace

    from gptspec.spec import preset

    if name == "gpt2-like-tiny":  # GPT-2's switches: tanh-GELU, biases, tied, final norm
        config = replace(preset("gpt2"), vocab_size=97, n_ctx=16, d_model=32, n_heads=2,
                         n_layers=2, d_ff=64)
    else:
        config = preset(name)
    settings = train.TrainSettings(batch_size=2, max_steps=1, compile=True)
    stream = np.arange(400) % config.vocab_size
    trainer = train.Trainer(config, settings, TokenData(stream, stream, config.n_ctx), None)
    x = torch.as_tensor(stream[: 2 * config.n_ctx].reshape(2, -1))
    y = torch.roll(x, -1, dims=1)
    explained = torch._dynamo.explain(trainer._forward_and_loss)(x, y)
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]
    assert explained.graph_count == 1


def test_the_compiled_trainer_takes_the_references_steps(monkeypatch):
    """The trainer with ``compile=True`` judged by train_loop.matches_reference. Its
    function is traced by dynamo and differentiated by AOT autograd as under the default
    compiler, then run by eager kernels (backend "aot_eager": the inductor's code
    generation is PyTorch's, and minutes per example on this CPU)."""
    from gptspec.conformance.runner import run_suite
    from gptspec.fast.backend import TorchBackend

    compiled: list[object] = []
    real_compile = torch.compile

    def compile_spy(fn, **options):
        compiled.append(fn)
        return real_compile(fn, backend="aot_eager", **options)

    class CompiledTrainer(TorchBackend):
        def train_loop(self, tokens, params, config, settings):
            rounded = {k: self._to_torch(np.asarray(v)) for k, v in params.items()}
            return train.train_loop(tokens, rounded, config, settings, self.device,
                                    self.torch_dtype, compile=True)

    monkeypatch.setattr(train.torch, "compile", compile_spy)
    suite = run_suite(CompiledTrainer("cpu", "float32"), profile="quick", seed=0,
                      area="training", select=lambda c: c.id == "train_loop.matches_reference")
    assert compiled, "the trainer did not compile"
    assert [(r.id, r.status) for r in suite.results] == [("train_loop.matches_reference", "pass")], \
        [r.detail for r in suite.results]


def test_compile_is_a_boolean_setting_for_one_process():
    with pytest.raises(ValueError, match="'compile' must be true or false"):
        train.TrainSettings(compile="yes")  # type: ignore[arg-type]
