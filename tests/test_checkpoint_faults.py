"""Checkpoints survive kills: a save killed at every step of its protocol, then the next
run's recovery and save killed again at every step, always leaves a loadable checkpoint
no older than the last one that was complete; SIGTERM and SIGINT save like Ctrl-C.

A kill is real: the save runs in a forked child whose ``crash_point`` hook calls
``os._exit`` at the chosen step, so no ``finally`` or ``except`` of the save runs, as
under SIGKILL or a power cut of the process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from stop_signals import stop_signals_by_default

from gptspec.fast import checkpoint
from gptspec.fast.checkpoint import (
    find_checkpoints,
    load_training_checkpoint,
    recover_checkpoint,
    save_training_checkpoint,
)
from gptspec.fast.tokenizer import Tokenizer
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

CONFIG = GPTConfig(vocab_size=256, n_ctx=8, d_model=8, n_layers=1, n_heads=2, d_ff=16)
TOKENIZER = Tokenizer.byte_level()
KILLED = 57  # the exit status of a child killed at its crash point


def _params(step: int) -> dict[str, np.ndarray]:
    """Parameters that say which step saved them (every value is the step)."""
    return {s.name: np.full(s.shape, float(step), dtype=np.float32)
            for s in parameter_schema(CONFIG)}


def _save(directory: Path, step: int) -> None:
    params = _params(step)
    moments = {f"{kind}.{name}": np.full_like(value, step)
               for name, value in params.items() for kind in ("exp_avg", "exp_avg_sq")}
    state = {"step": step, "settings": {}, "rng": {"torch": "", "python": [3, [0], None]},
             "history": {"train": [[step, 1.0]], "val": []}}
    save_training_checkpoint(directory, CONFIG, params, moments, state, TOKENIZER)


def _in_child(action, kill_at: int | None) -> int:
    """Run ``action`` in a forked child killed (``os._exit``) at its ``kill_at``-th crash
    point; the child's exit status (0: it finished before reaching that point)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        calls = [0]

        def crash(name: str) -> None:
            if calls[0] == kill_at:
                os._exit(KILLED)
            calls[0] += 1

        try:
            checkpoint.crash_point = crash
            action()
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _step_loaded(directory: Path) -> int:
    config, params, optimizer, state, _ = load_training_checkpoint(directory)
    step = state["step"]
    assert all((value == step).all() for value in params.values()), "weights of another step"
    assert all((value == step).all() for value in optimizer.values())
    return step


def _copy(source: Path, to: Path) -> Path:
    shutil.copytree(source, to, symlinks=True)
    return to


def _kill_points(action, run: Path, scratch: Path) -> int:
    """How many crash points ``action(copy)`` passes when nothing kills it, each try on a
    fresh copy of the run folder ``run``."""
    n = 0
    while True:
        copy = _copy(run, scratch / f"count{n}")
        status = _in_child(lambda copy=copy: action(copy), n)
        shutil.rmtree(copy)
        if status != KILLED:
            assert status == 0
            return n
        n += 1


def _save_10(run: Path) -> None:
    _save(run / "checkpoint", 10)


def _next_run(run: Path) -> None:
    """What a resumed run does: recover, then save a newer step."""
    recover_checkpoint(run / "checkpoint")
    _save(run / "checkpoint", 20)


def test_the_save_protocol_has_the_steps_it_documents(tmp_path):
    run = tmp_path / "run"
    _save(run / "checkpoint", 1)
    _save(run / "checkpoint", 2)
    assert _kill_points(_save_10, run, tmp_path) >= 8
    assert _step_loaded(run / "checkpoint") == 2  # counted on copies


@pytest.mark.parametrize("history", [[], [1], [1, 2]], ids=["first save", "second save",
                                                             "third save"])
def test_no_kill_and_no_pair_of_kills_loses_a_checkpoint(tmp_path, history):
    """Kill the save of step 10 at each of its points; then, for each, kill the next run
    (recovery, then the save of step 20) at each of its points. After every kill the
    newest checkpoint loads, and it is never older than the last complete save."""
    base = tmp_path / "base"
    base.mkdir()
    for step in history:
        _save(base / "checkpoint", step)
    first_points = _kill_points(_save_10, base, tmp_path)
    sequences = 0
    for i in range(first_points + 1):  # + 1: the save not killed at all
        run = _copy(base, tmp_path / f"run{i}")
        assert _in_child(lambda run=run: _save_10(run), i) in (KILLED, 0)
        if not history and not find_checkpoints(run / "checkpoint"):
            continue  # killed before the very first save was complete: nothing to lose
        kept = _step_loaded(run / "checkpoint")
        assert kept >= (history[-1] if history else 10)
        second_points = _kill_points(_next_run, run, tmp_path)
        for j in range(second_points + 1):
            again = _copy(run, tmp_path / f"run{i}.{j}")
            status = _in_child(lambda again=again: _next_run(again), j)
            assert status in (KILLED, 0)
            step = _step_loaded(again / "checkpoint")
            assert step >= kept and (status == KILLED or step == 20)
            # a clean start afterwards removes every leftover and keeps the newest
            recover_checkpoint(again / "checkpoint")
            leftovers = [p.name for p in again.iterdir() if p.name.endswith((".tmp", ".trash"))]
            assert leftovers == [] and _step_loaded(again / "checkpoint") == step
            shutil.rmtree(again)
            sequences += 1
    assert sequences >= first_points  # every kill point was followed by a second run


def test_readers_find_the_previous_copy_after_a_kill_between_the_renames(tmp_path, capsys):
    from gptspec.cli import main

    ckpt = tmp_path / "checkpoint"
    _save(ckpt, 1)
    os.replace(ckpt, tmp_path / ".checkpoint.previous")  # the state such a kill leaves
    assert main(["info", str(ckpt)]) == 0
    assert "total parameters" in capsys.readouterr().out
    assert _step_loaded(ckpt) == 1
    config, params = checkpoint.load_model(ckpt)
    assert config == CONFIG and (params["wte"] == 1).all()


def test_files_and_folder_share_the_umasks_permissions(tmp_path):
    ckpt = tmp_path / "checkpoint"
    _save(ckpt, 1)
    umask = os.umask(0)
    os.umask(umask)
    assert ckpt.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (ckpt / "state.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_run_with_nan_weights_is_not_saved_as_good(tmp_path):
    import torch

    from gptspec.fast.data import TokenData
    from gptspec.fast.train import Trainer, TrainingDiverged, TrainSettings

    data = TokenData.split(np.arange(200) % 256, CONFIG.n_ctx, val_fraction=0.25)
    trainer = Trainer(CONFIG, TrainSettings(batch_size=2, max_steps=2, eval_batches=1),
                      data, TOKENIZER)
    trainer.step()
    trainer.save(tmp_path / "checkpoint")
    with torch.no_grad():
        trainer.model.wte[0, 0] = float("nan")
    trainer.step_count += 1
    with pytest.raises(TrainingDiverged, match="wte"):
        trainer.save(tmp_path / "checkpoint")
    assert load_training_checkpoint(tmp_path / "checkpoint")[3]["step"] == 1


def test_a_non_finite_validation_loss_stops_the_run_and_is_never_written(tmp_path,
                                                                           monkeypatch):
    import torch

    from gptspec.fast.data import TokenData
    from gptspec.fast.train import Trainer, TrainingDiverged, TrainSettings

    data = TokenData.split(np.arange(200) % 256, CONFIG.n_ctx, val_fraction=0.25)
    trainer = Trainer(CONFIG, TrainSettings(batch_size=2, max_steps=4, eval_interval=2,
                                            eval_batches=1), data, TOKENIZER)
    trainer.run(tmp_path, progress=False, log=lambda text: None)
    saved = (tmp_path / "checkpoint" / "state.json").read_bytes()
    trainer.settings = TrainSettings(batch_size=2, max_steps=6, eval_interval=2, eval_batches=1)
    real = trainer.loss  # the training loss stays finite; the model's loss on val is inf
    monkeypatch.setattr(trainer, "loss", lambda x, y, model=None: real(x, y, model) * (
        float("inf") if model is not None else 1.0))
    with pytest.raises(TrainingDiverged, match="validation loss became inf at step 6"):
        trainer.run(tmp_path, progress=False, log=lambda text: None)
    assert all(torch.isfinite(torch.tensor(v)) for _, v in trainer.history["val"])
    assert (tmp_path / "checkpoint" / "state.json").read_bytes() == saved  # never rewritten
    assert load_training_checkpoint(tmp_path / "checkpoint")[3]["step"] == 4


def test_a_signal_during_a_save_waits_for_its_end(tmp_path, monkeypatch):
    from gptspec.fast import train
    from gptspec.fast.data import TokenData
    from gptspec.fast.train import Interrupted, Trainer, TrainSettings, stop_on_signals

    data = TokenData.split(np.arange(200) % 256, CONFIG.n_ctx, val_fraction=0.25)
    trainer = Trainer(CONFIG, TrainSettings(batch_size=2, max_steps=2, eval_batches=1),
                      data, TOKENIZER)
    trainer.step()
    real_save = train.save_training_checkpoint

    def save_then_signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the save
        return real_save(*args, **kwargs)

    monkeypatch.setattr(train, "save_training_checkpoint", save_then_signalled)
    with stop_on_signals(), pytest.raises(Interrupted) as caught:
        trainer.save(tmp_path / "checkpoint")
    assert caught.value.signum == signal.SIGTERM
    assert load_training_checkpoint(tmp_path / "checkpoint")[3]["step"] == 1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_training_run_saves_and_resumes(tmp_path, signum):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question. " * 40)
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "gptspec", "train", "--preset", "tiny", "--vocab-size",
            "256", "--batch-size", "2", "--eval-interval", "1", "--eval-batches", "1",
            "--warmup", "1", "--no-progress", "--steps", "100000", "--data", str(corpus),
            "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=stop_signals_by_default)
    deadline = time.monotonic() + 120
    while not (out / "checkpoint" / "state.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 2 minutes"
        time.sleep(0.2)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr
    assert "interrupted at step" in stdout and "Traceback" not in stderr
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert 0 < state["step"] < 100000
    stopped_at = int(stdout.split("interrupted at step ")[1].split(";")[0])
    assert state["step"] == stopped_at  # the step it stopped at is the step it saved
    # the run directory moved elsewhere still resumes (state.json holds relative paths)
    moved = tmp_path / "moved"
    os.replace(out, moved)
    resumed = subprocess.run([sys.executable, "-m", "gptspec", "train", "--out", str(moved),
                              "--resume", "--steps", str(stopped_at + 1), "--no-progress"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((moved / "checkpoint" / "state.json").read_text())["step"] == \
        stopped_at + 1
