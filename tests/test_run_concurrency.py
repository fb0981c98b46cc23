"""A run directory shared with other processes: one writer at a time (an OS lock), readers
that always load one complete checkpoint while it is saved over, files of one save only."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from stop_signals import stop_signals_by_default

from gptspec.cli import main
from gptspec.fast import checkpoint
from gptspec.fast.checkpoint import (
    CheckpointError,
    load_generation_checkpoint,
    load_training_checkpoint,
    save_training_checkpoint,
)
from gptspec.fast.data import tokens_sha256
from gptspec.fast.run_lock import LOCK_FILE, RunLock
from gptspec.fast.tokenizer import Tokenizer
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

CONFIG = GPTConfig(vocab_size=256, n_ctx=8, d_model=8, n_layers=1, n_heads=2, d_ff=16)
TINY = ["--preset", "tiny", "--vocab-size", "256", "--batch-size", "2", "--eval-interval", "2",
        "--eval-batches", "1", "--warmup", "1", "--no-progress"]
TEXT = "To be, or not to be, that is the question. " * 40


def _save(directory: Path, step: int, config: GPTConfig = CONFIG) -> None:
    """A checkpoint whose every weight and moment is its step (a mix shows)."""
    params = {s.name: np.full(s.shape, float(step), dtype=np.float32)
              for s in parameter_schema(config)}
    moments = {f"{kind}.{name}": np.full_like(value, step)
               for name, value in params.items() for kind in ("exp_avg", "exp_avg_sq")}
    state = {"step": step, "settings": {}, "rng": {"torch": "", "python": [3, [0], None]},
             "history": {"train": [[step, 1.0]], "val": []}}
    save_training_checkpoint(directory, config, params, moments, state, Tokenizer.byte_level())


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    return path


# --- one writer --------------------------------------------------------------------------------


def test_a_second_writer_is_refused_naming_the_first_and_the_first_is_unharmed(
        tmp_path, corpus, capsys):
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-m", "gptspec", "train", *TINY, "--data", str(corpus), "--out",
         str(out), "--steps", "100000", "--eval-interval", "1", "--checkpoint-interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=stop_signals_by_default)
    try:
        deadline = time.monotonic() + 60
        while not (out / "checkpoint" / "state.json").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        for second in (["--resume"], ["--data", str(corpus)]):  # bounded, were it let run
            assert main(["train", *TINY, "--out", str(out), "--steps", "50", *second]) == 2
            err = capsys.readouterr().err
            assert f"pid {first.pid}" in err and "another gptspec command" in err
            assert len(err.strip().splitlines()) == 1
        assert first.poll() is None  # still training, its files untouched
    finally:
        first.send_signal(signal.SIGINT)
        stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr
    assert "saved in" in stdout
    _, _, _, state, _ = load_training_checkpoint(out / "checkpoint")
    assert state["step"] >= 1


def test_a_dead_writers_lock_is_taken_over_and_its_leftovers_removed(tmp_path, corpus):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.run(  # takes the lock and dies without releasing anything
        [sys.executable, "-c", "import os, signal, sys; from gptspec.fast.run_lock import "
         "RunLock; RunLock(sys.argv[1]); os.kill(os.getpid(), signal.SIGKILL)", str(out)])
    assert holder.returncode == -signal.SIGKILL
    assert (out / LOCK_FILE).read_text().strip().isdigit()
    leftovers = [out / ".loss.png.abcd1234.tmp", out / ".tokens.bin.abcd1234.tmp"]
    for file in leftovers:
        file.write_bytes(b"half a file")
    (out / ".checkpoint.abcd1234.tmp").mkdir()
    kept = out / "notes.txt"
    kept.write_text("mine")
    assert main(["train", *TINY, "--data", str(corpus), "--out", str(out), "--steps", "2"]) == 0
    assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
    assert not any(p.exists() for p in leftovers)
    assert not (out / ".checkpoint.abcd1234.tmp").exists() and kept.read_text() == "mine"


def test_the_lock_is_held_only_while_the_run_lasts(tmp_path, corpus, capsys):
    out = tmp_path / "out"
    out.mkdir()
    with RunLock(out):  # another open of the lock file: a writer for flock
        assert main(["train", *TINY, "--data", str(corpus), "--out", str(out)]) == 2
        assert f"pid {os.getpid()}" in capsys.readouterr().err
    assert not (out / "checkpoint").exists() and not (out / "tokens.bin").exists()
    assert main(["train", *TINY, "--data", str(corpus), "--out", str(out), "--steps", "2"]) == 0
    assert main(["train", *TINY, "--out", str(out), "--resume", "--steps", "3"]) == 0


def test_a_locked_lock_file_that_names_no_pid_is_described_as_it_is(tmp_path, corpus, capsys):
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text("not-a-pid\n")
    fd = os.open(out / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held by someone, who wrote no pid
        assert main(["train", *TINY, "--data", str(corpus), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"a live process holds the lock on {out / LOCK_FILE}, which holds 'not-a-pid', " \
               "not a pid" in err and err.count("\n") == 1, err
        assert "gptspec train (" not in err  # no claim about who holds it
    finally:
        os.close(fd)
    with RunLock(out):  # not held: the junk is written over, as a dead holder's pid is
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tmp_path, corpus, capsys):
    out = tmp_path / "out"
    out.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("notes\n")
    (out / LOCK_FILE).symlink_to(precious)
    assert main(["train", *TINY, "--data", str(corpus), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and err.count("\n") == 1, err
    assert precious.read_text() == "notes\n"


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_lock_file_that_is_not_a_file_is_refused_naming_it(tmp_path, corpus, capsys, kind):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).mkdir() if kind == "directory" else os.mkfifo(out / LOCK_FILE)
    assert main(["train", *TINY, "--data", str(corpus), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    said = "is a directory" if kind == "directory" else "is not a regular file"
    assert f"{out / LOCK_FILE} {said}" in err and err.count("\n") == 1, err
    assert not (out / "checkpoint").exists()


def test_a_training_run_is_opened_fresh_then_resumed_and_holds_its_lock_throughout(tmp_path):
    from gptspec.fast.training_run import Corpus, RunError, TrainingRun

    out = tmp_path / "out"
    corpus = Corpus(None, lambda: (TEXT, "the test text"))
    changes = {"max_steps": 2, "batch_size": 2, "eval_interval": 2, "eval_batches": 1,
               "warmup_steps": 1}
    vetted = []
    with TrainingRun.fresh(out, CONFIG, changes, corpus,
                           vet=lambda config, s: vetted.append((config, s.max_steps))) as run:
        assert vetted == [(CONFIG, 2)]  # the caller's checks ran, before any data was read
        assert run.train(progress=False) == "done" and run.trainer.step_count == 2
        for second in (lambda: TrainingRun.resume(out, {"max_steps": 3}),
                       lambda: TrainingRun.fresh(out, CONFIG, changes, corpus)):
            with pytest.raises(RunError, match=f"another gptspec command \\(pid {os.getpid()}\\)"):
                second()
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 2 and state["data"] == {
        "source": "the test text", "tokens": "tokens.bin", "n_tokens": len(TEXT),
        "dtype": "uint16",
        "sha256": tokens_sha256(np.fromfile(out / "tokens.bin", dtype=np.uint16))}
    with pytest.raises(RunError, match="already holds a training run"):
        TrainingRun.fresh(out, CONFIG, changes, corpus)
    with pytest.raises(RunError, match="--d-model 16 contradicts the checkpoint"):
        TrainingRun.resume(out, {}, model={"d_model": 16})
    with pytest.raises(RunError, match="--steps 1 is below the checkpoint's step 2"):
        TrainingRun.resume(out, {"max_steps": 1})
    RunLock(out).release()  # each refusal above let go of the lock it had taken
    with TrainingRun.resume(out, {"max_steps": 3}) as run:
        assert (run.trainer.step_count, run.source, run.config) == (2, "the test text", CONFIG)
        assert run.train(progress=False) == "done"
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 3


# --- readers beside a writer ---------------------------------------------------------------------


def test_readers_load_one_complete_checkpoint_while_a_writer_saves_200_times(tmp_path):
    directory = tmp_path / "run" / "checkpoint"
    _save(directory, 1)
    saves = 200
    pid = os.fork()
    if pid == 0:  # the writer: 200 saves, one after another
        status = 1
        try:
            # what a reader can see depends on the renames alone; the flushes to the disk
            # (durability, tested in test_checkpoint_faults) would make 200 saves take 20 s
            os.fsync = lambda fd: None
            for step in range(2, 2 + saves):
                _save(directory, step)
            status = 0
        finally:
            os._exit(status)
    failures, steps, reads, writer = [], set(), 0, None
    try:
        while writer is None:  # read, in turn each way a command reads, until it is done
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                writer = status
            reads += 1
            try:
                if reads % 3 == 2:  # what info reads: the header alone
                    _, metadata, shapes = checkpoint.model_header(directory)
                    assert checkpoint.CONFIG_KEY in metadata and shapes["wte"] == (256, 8)
                    continue
                if reads % 3 == 1:
                    _, _, params, tokenizer = load_generation_checkpoint(directory)
                    step = int(params["wte"].flat[0])
                else:
                    _, params, optimizer, state, tokenizer = load_training_checkpoint(directory)
                    step = state["step"]
                    assert all((v == step).all() for v in optimizer.values())
                assert all((v == step).all() for v in params.values()), "two saves' files"
                assert tokenizer.vocab_size == 256
                steps.add(step)
            except (CheckpointError, AssertionError) as err:
                failures.append(str(err))
    finally:
        if writer is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert writer == 0 and failures == []
    assert load_training_checkpoint(directory)[3]["step"] == 1 + saves  # every save landed
    assert len(steps) >= 10, steps  # the readers did read between the saves, many times


# --- files of one save --------------------------------------------------------------------------


def _edit_state(directory: Path, edit) -> None:
    file = directory / "state.json"
    file.write_text(edit(file.read_text()))


@pytest.mark.parametrize("edit, message", [
    (lambda text: text.replace('"step": 3', '"step": 7'),
     "says step 7, but"),
    (lambda text: text.replace('"step": 3,', '"step": 3, "step": 3,'),
     "'step' is given twice"),
    (lambda text: "[" * 100000 + "]" * 100000,
     "nested too deeply"),
])
def test_an_edited_state_is_refused_in_one_line(tmp_path, edit, message):
    directory = tmp_path / "checkpoint"
    _save(directory, 3)
    _edit_state(directory, edit)
    with pytest.raises(CheckpointError, match=message) as err:
        load_training_checkpoint(directory)
    assert "state.json" in str(err.value) and "\n" not in str(err.value)


def test_a_config_with_a_key_given_twice_is_refused():
    from gptspec.spec.config import ConfigError

    text = CONFIG.to_json()
    assert GPTConfig.from_json(text) == CONFIG
    with pytest.raises(ConfigError, match="'d_model' is given twice"):
        GPTConfig.from_json(text.replace('"d_model": 8', '"d_model": 8, "d_model": 16'))


def test_a_state_with_endless_evaluations_is_refused(tmp_path, corpus, capsys):
    argv = ["train", *TINY, "--out", str(tmp_path / "out")]
    assert main([*argv, "--data", str(corpus), "--steps", "2"]) == 0
    _edit_state(tmp_path / "out" / "checkpoint",
                lambda text: text.replace('"eval_batches": 1', '"eval_batches": 1000000000000'))
    assert main(["train", "--out", str(tmp_path / "out"), "--resume", "--steps", "3",
                 "--no-progress"]) == 2
    assert "state.json: eval_batches 1000000000000" in capsys.readouterr().err


def test_an_optimizer_from_another_model_is_refused(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _save(ours, 3)
    _save(theirs, 3, CONFIG.replace(d_model=16, d_ff=32))
    os.replace(theirs / "optimizer.safetensors", ours / "optimizer.safetensors")
    with pytest.raises(CheckpointError, match="does not match the model"):
        load_training_checkpoint(ours)
    _save(theirs, 3)  # same shapes, other values: only the recorded checksum tells
    os.replace(theirs / "model.safetensors", ours / "model.safetensors")
    _save(tmp_path / "again", 3)
    os.replace(tmp_path / "again" / "optimizer.safetensors", ours / "optimizer.safetensors")
    load_training_checkpoint(ours)  # the same save's content: accepted
    params = {s.name: np.full(s.shape, 9.0, dtype=np.float32) for s in parameter_schema(CONFIG)}
    checkpoint.save_model(ours, params, CONFIG)
    with pytest.raises(CheckpointError, match="is not the model"):
        load_training_checkpoint(ours)


def _history_up_to_step_1(text: str) -> str:
    state = json.loads(text)
    state["history"] = {key: [p for p in points if p[0] <= 1]
                        for key, points in state["history"].items()}
    return json.dumps(state)


def test_a_resume_with_an_edited_step_is_refused(tmp_path, corpus, capsys):
    assert main(["train", *TINY, "--data", str(corpus), "--out", str(tmp_path / "out"),
                 "--steps", "2"]) == 0
    _edit_state(tmp_path / "out" / "checkpoint",
                lambda text: text.replace('"step": 2', '"step": 1', 1))
    assert main(["train", *TINY, "--out", str(tmp_path / "out"), "--resume",
                 "--steps", "4"]) == 2
    err = capsys.readouterr().err
    # the loss history, saved with the run's steps, is the first to contradict it
    assert "'history' 'train' has step 2, not a step of this run (0 … 1)" in err
    assert len(err.strip().splitlines()) == 1
    _edit_state(tmp_path / "out" / "checkpoint", _history_up_to_step_1)  # edited to match
    assert main(["train", *TINY, "--out", str(tmp_path / "out"), "--resume",
                 "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "says step 1, but" in err and len(err.strip().splitlines()) == 1


# --- what is said and kept ---------------------------------------------------------------------


def test_a_run_stopped_before_its_first_step_does_not_claim_a_checkpoint(
        tmp_path, corpus, monkeypatch, capsys):
    from gptspec.fast import train

    def interrupted(self):
        raise KeyboardInterrupt

    real_step = train.Trainer.step
    monkeypatch.setattr(train.Trainer, "step", interrupted)
    argv = ["train", *TINY, "--out", str(tmp_path / "out"), "--steps", "4"]
    assert main([*argv, "--data", str(corpus)]) == 130
    said = capsys.readouterr().out
    assert "no checkpoint was saved" in said and "saved in" not in said
    assert not (tmp_path / "out" / "checkpoint").exists()
    monkeypatch.setattr(train.Trainer, "step", real_step)
    assert main([*argv, "--data", str(corpus), "--steps", "2"]) == 0  # "the same command"
    monkeypatch.setattr(train.Trainer, "step", interrupted)
    assert main([*argv, "--resume"]) == 130
    said = capsys.readouterr().out
    assert "no step was taken" in said and "saved in" not in said


def test_finite_weights_whose_loss_is_not_are_not_kept_as_good(tmp_path, corpus, capsys):
    argv = ["train", *TINY, "--data", str(corpus), "--out", str(tmp_path / "out")]
    # a save after step 1 with no evaluation before it (an evaluation stops the run too:
    # "the validation loss became nan")
    assert main([*argv, "--steps", "2", "--eval-interval", "2", "--checkpoint-interval", "1",
                 "--lr", "1e30"]) == 2
    err = capsys.readouterr().err
    assert "weights after step 1 are finite but the model's loss" in err, err
    assert "no checkpoint had been saved" in err
    assert not (tmp_path / "out" / "checkpoint").exists()


def test_a_name_of_250_bytes_gets_temporary_names_that_fit(tmp_path):
    from gptspec.atomic_files import write_bytes

    name = "é" * 125  # 250 bytes: legal, and 14 bytes short of a temporary name's
    (tmp_path / "file").mkdir()
    write_bytes(tmp_path / "file" / name, b"data")
    assert (tmp_path / "file" / name).read_bytes() == b"data"
    run = tmp_path / "run"
    run.mkdir()
    for step in (1, 2, 3):
        _save(run / name, step)
    assert load_training_checkpoint(run / name)[3]["step"] == 3
    # the trash of each save (names cut short) was found and emptied
    kept = sorted(p.name for p in run.iterdir())
    assert kept == sorted([name, checkpoint._previous(run / name).name])
    assert all(len(os.fsencode(p.name)) <= 255 for p in run.iterdir())
    (run / "half.tmp").mkdir()  # a killed save's temporary folder, under the cut name
    (run / "half.tmp").rename(run / (checkpoint.temporary_prefix(run / name) + "abcdefgh.tmp"))
    assert checkpoint.recover_checkpoint(run / name) == run / name
    assert sorted(p.name for p in run.iterdir()) == kept
    # convert --to-hf's temporary folder too ("File name too long", nothing written)
    hf = tmp_path / "hf"
    hf.mkdir()
    assert main(["convert", "--to-hf", str(run / name), str(hf / name)]) == 0
    assert (hf / name / "model.safetensors").is_file() and os.listdir(hf) == [name]


def test_the_memory_check_honours_the_address_space_limit(monkeypatch):
    import resource

    from gptspec.cli import CLIError, arguments

    arguments.fits_in_memory(2**30, "a GiB")  # this machine has one
    limit = arguments._address_space_used() + 2**29  # what is mapped counts against it
    monkeypatch.setattr(resource, "getrlimit", lambda which: (
        limit if which == resource.RLIMIT_AS else resource.RLIM_INFINITY,
        resource.RLIM_INFINITY))
    arguments.fits_in_memory(2**28, "a quarter GiB")
    with pytest.raises(CLIError, match=r"ulimit -v"):
        arguments.fits_in_memory(2**30, "a GiB")


def test_a_corpus_name_read_back_from_state_json_is_printed_escaped(tmp_path, corpus, capsys):
    import json

    out = tmp_path / "out"
    assert main(["train", *TINY, "--data", str(corpus), "--out", str(out), "--steps", "2"]) == 0
    state_file = out / "checkpoint" / "state.json"
    state = json.loads(state_file.read_text())
    state["data"]["source"] = "\x1b[2J\x1b]0;title\x07corpus"
    state_file.write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["train", *TINY, "--out", str(out), "--resume", "--steps", "3"]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\\x1b[2J\\x1b]0;title\\x07corpus" in printed


@pytest.mark.parametrize("direction", ["--to-hf", "--from-hf"])
def test_a_conversion_into_a_run_being_written_is_refused(tmp_path, capsys, direction):
    """Before, a conversion into RUN/checkpoint (before the run's first save) said "wrote
    …" and the run's save then replaced what it wrote."""
    _save(tmp_path / "ckpt", 1)
    source = tmp_path / "ckpt"
    if direction == "--from-hf":
        assert main(["convert", "--to-hf", str(source), str(tmp_path / "hf")]) == 0
        source = tmp_path / "hf"
    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run):  # a training run, before its first save
        assert main(["convert", direction, str(source), str(run / "converted")]) == 2
        err = capsys.readouterr().err
        assert "is in a training run's folder" in err and f"(pid {os.getpid()})" in err
        assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]
    # the run ended: its folder may take a conversion (the lock is the convert's meanwhile)
    assert main(["convert", direction, str(source), str(run / "converted")]) == 0
    # never its checkpoint folder: the run's next save (a --resume) would delete it
    for inside in (run / "checkpoint", run / "checkpoint" / "hf"):
        assert main(["convert", direction, str(source), str(inside)]) == 2
        assert "a training run's checkpoint folder" in capsys.readouterr().err
    assert not (run / "checkpoint").exists()


@pytest.mark.parametrize("command", ["tokenizer train", "tokenizer encode"])
def test_a_tokenizer_or_token_file_written_into_a_run_being_written_is_refused(
        tmp_path, capsys, corpus, command):
    """As for convert: `tokenizer train --out RUN/checkpoint/tokenizer.json` (or encode's
    --output there) during a run said "wrote …", then the run's next save replaced it."""
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    target = run / "tokenizer.json"
    if command == "tokenizer train":
        args = ["tokenizer", "train", "--data", str(corpus), "--vocab-size", "260", "--quiet",
                "--out", str(target)]
    else:
        tokenizer = tmp_path / "tok.json"
        assert main(["tokenizer", "train", "--data", str(corpus), "--vocab-size", "260",
                     "--quiet", "--out", str(tokenizer)]) == 0
        args = ["tokenizer", "encode", "--tokenizer", str(tokenizer), "--input", str(corpus),
                "--output", str(target)]
    capsys.readouterr()
    with RunLock(run):  # a training run is writing RUN
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "is in a training run's folder" in err and f"(pid {os.getpid()})" in err
        assert not target.exists()
    assert main(args) == 0 and target.exists()  # the run ended: the lock is free
    # never into its checkpoint folder, run or not: the next save would delete it
    inside = [str(run / "checkpoint" / "tokenizer.json") if a == str(target) else a for a in args]
    assert main(inside) == 2
    assert "a training run's checkpoint folder" in capsys.readouterr().err
    assert not (run / "checkpoint" / "tokenizer.json").exists()


@pytest.mark.parametrize("data", ["corpus.txt", "ids.bin"])
def test_a_token_file_whose_ids_changed_but_not_its_length_is_refused(tmp_path, corpus,
                                                                       capsys, data):
    """Only the number of tokens was compared: one id changed in place resumed silently,
    on other data than the run began with."""
    if data == "ids.bin":
        (np.arange(400) % 256).astype(np.uint16).tofile(tmp_path / data)
    else:
        corpus.rename(tmp_path / data)
    out = tmp_path / "out"
    assert main(["train", *TINY, "--data", str(tmp_path / data), "--out", str(out),
                 "--steps", "2"]) == 0
    tokens = out / "tokens.bin" if data == "corpus.txt" else tmp_path / data
    ids = np.fromfile(tokens, dtype=np.uint16)
    ids[len(ids) // 2] = (ids[len(ids) // 2] + 1) % 256
    ids.tofile(tokens)
    assert main(["train", *TINY, "--out", str(out), "--resume", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "changed since the checkpoint was written" in err
    assert len(err.strip().splitlines()) == 1


def test_the_command_to_continue_an_interrupted_run_works_as_printed(tmp_path):
    """"continue with: gptspec train --out my run --resume" named two arguments."""
    import shlex
    from types import SimpleNamespace

    from gptspec.fast.training_run import TrainingRun

    run = object.__new__(TrainingRun)  # only what where_saved reads
    run.out = tmp_path / "my run's"
    run.checkpoint = run.out / "checkpoint"
    run.trainer = SimpleNamespace(saved_at=3)
    command = run.where_saved().split("continue with: ")[1]
    assert shlex.split(command) == ["gptspec", "train", "--out", str(run.out), "--resume"]


def test_a_lock_held_by_convert_is_not_said_to_be_a_trains(tmp_path):
    """convert into RUN/checkpoint holds the run's lock: a train refused meanwhile was told
    "being written by another gptspec train (pid N)", N being the convert."""
    from gptspec.fast.run_lock import RunLock, RunLocked

    with RunLock(tmp_path), pytest.raises(RunLocked) as refused:
        RunLock(tmp_path)
    assert f"another gptspec command (pid {os.getpid()})" in str(refused.value)
    assert "gptspec train" not in str(refused.value)


def test_a_run_inside_another_runs_checkpoint_folder_is_refused(tmp_path, capsys, corpus):
    """`train --out RUN/checkpoint` (directly or through a link) trained, said "done: …
    checkpoint in RUN/checkpoint/checkpoint", and the outer run's next save deleted it."""
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / LOCK_FILE).write_text("1")
    (tmp_path / "link").symlink_to(run)
    for out in (run / "checkpoint", tmp_path / "link" / "checkpoint" / "inner"):
        assert main(["train", "--preset", "tiny", "--vocab-size", "256", "--data", str(corpus),
                     "--steps", "2", "--no-progress", "--out", str(out)]) == 2
        assert "a training run's checkpoint folder" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoint").iterdir()) == []


def test_a_save_keeps_the_permissions_of_the_checkpoint_it_replaces(tmp_path):
    """A resumed run's save made a checkpoint folder kept private (750/640) world-readable
    again (755/644)."""
    target = tmp_path / "checkpoint"
    _save(target, 1)
    target.chmod(0o750)
    for file in target.iterdir():
        file.chmod(0o640)
    _save(target, 2)
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert {stat.S_IMODE(f.stat().st_mode) for f in target.iterdir()} == {0o640}


def test_a_fresh_run_keeps_a_checkpoint_folder_of_other_files_and_its_own_data(tmp_path,
                                                                               capsys, corpus):
    """A fresh `train --out D` replaced D/checkpoint holding a user's own files (a
    conversion, notes) without a word; `--data D/loss.png` was overwritten by the loss
    curve."""
    out = tmp_path / "D"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "notes.txt").write_text("mine")
    args = ["train", "--preset", "tiny", "--vocab-size", "256", "--steps", "2", "--no-progress"]
    assert main([*args, "--data", str(corpus), "--out", str(out)]) == 2
    assert "holds files of its own (notes.txt)" in capsys.readouterr().err
    assert (out / "checkpoint" / "notes.txt").read_text() == "mine"
    for name in ("loss.png",):  # (a token file given as D/tokens.bin is not written over)
        data = tmp_path / "E" / name
        data.parent.mkdir(exist_ok=True)
        data.write_text(corpus.read_text())
        assert main([*args, "--data", str(data), "--out", str(data.parent)]) == 2
        assert "the run writes its" in capsys.readouterr().err
        assert data.read_text() == corpus.read_text()


def test_a_checkpoint_folder_with_a_runs_state_counts_as_a_runs(tmp_path, capsys, corpus):
    """RUN/checkpoint/state.json without the run's lock file (a copied run) was taken for
    a plain folder, while `train --out RUN` said it held a run (whose resume replaces it)."""
    _save(tmp_path / "copied" / "checkpoint", 1)
    assert main(["tokenizer", "train", "--data", str(corpus), "--vocab-size", "260", "--quiet",
                 "--out", str(tmp_path / "copied" / "checkpoint" / "t.json")]) == 2
    assert "a training run's checkpoint folder" in capsys.readouterr().err


def test_a_fresh_run_keeps_the_users_files_of_a_runs_names(tmp_path, capsys, corpus):
    """A fresh `train --out D` wrote over the user's own D/tokens.bin and D/loss.png (no
    run had been there: no lock file); a token file given as --data inside D is the
    run's data, not overwritten, and stays legal."""
    args = ["train", "--preset", "tiny", "--vocab-size", "256", "--steps", "2", "--no-progress"]
    out = tmp_path / "D"
    out.mkdir()
    (out / "loss.png").write_text("my photo")
    assert main([*args, "--data", str(corpus), "--out", str(out)]) == 2
    assert "holds loss.png of its own" in capsys.readouterr().err
    assert (out / "loss.png").read_text() == "my photo"
    tokens = tmp_path / "T" / "tokens.bin"
    tokens.parent.mkdir()
    (np.frombuffer(corpus.read_bytes(), dtype=np.uint8).astype(np.uint16)).tofile(tokens)
    assert main([*args, "--data", str(tokens), "--out", str(tokens.parent)]) == 0


def test_other_commands_do_not_write_over_a_runs_token_file_or_loss_curve(tmp_path, capsys,
                                                                         corpus):
    """`tokenizer encode --output RUN/tokens.bin` or `conformance --report RUN/loss.png`
    replaced files the run's resume reads, and the resume then failed."""
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text("1")
    for name in ("tokens.bin", "loss.png"):
        assert main(["tokenizer", "train", "--data", str(corpus), "--vocab-size", "260",
                     "--quiet", "--out", str(run / name)]) == 2
        assert f"is a training run's {name}" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--data", "EMPTY"], ["--train-tokenizer", "100000"]])
def test_a_refused_fresh_run_leaves_its_folder_as_it_found_it(tmp_path, capsys, corpus, bad):
    """A fresh run refused after it took the lock left OUT/.train.lock (and could leave
    tokens.bin) behind, in a folder the user had made empty."""
    (tmp_path / "EMPTY").write_text("")
    bad = [str(tmp_path / "EMPTY") if word == "EMPTY" else word for word in bad]
    for out in (tmp_path / "made", tmp_path / "new" / "deeper"):
        if out.name == "made":
            out.mkdir()
        args = ["train", *TINY, "--data", str(corpus), "--out", str(out), "--steps", "2", *bad]
        assert main(args) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
        assert (sorted(out.iterdir()) == []) if out.name == "made" else not out.parent.exists()


def test_a_lock_file_removed_by_its_holder_is_taken_afresh(tmp_path, monkeypatch):
    """A process that opened the lock file just before its holder removed it must not
    hold a lock on the removed file: a third would lock the new one beside it."""
    first = RunLock(tmp_path)
    assert first.created
    first.release(remove=True)
    assert not (tmp_path / LOCK_FILE).exists()
    lock = RunLock._lock
    removals = []

    def removed_before_locking(self, out):  # the holder lets go between open and flock
        if not removals:
            removals.append(os.fstat(self.fd).st_ino)
            (tmp_path / LOCK_FILE).unlink()
        lock(self, out)

    monkeypatch.setattr(RunLock, "_lock", removed_before_locking)
    second = RunLock(tmp_path)
    assert removals and os.stat(tmp_path / LOCK_FILE).st_ino == os.fstat(second.fd).st_ino
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    second.release()
    assert (tmp_path / LOCK_FILE).exists()  # kept unless asked


def test_a_lock_file_made_by_a_racing_fresh_run_goes_with_the_refusal(tmp_path, monkeypatch):
    """Two fresh runs on one new folder: P makes the lock file, Q wins the lock, P is
    refused; Q, refused later, kept the file because it had not made it, and the file then
    turned off the check that keeps the user's own tokens.bin and loss.png."""
    from gptspec.fast.training_run import Corpus, RunError, TrainingRun

    out = tmp_path / "new"
    out.mkdir()

    def raced_then_refused(self, *args):
        RunLock(out).release()  # P: made the file, let go of it
        self._claim()  # Q takes the lock on P's file
        assert not self._lock.created
        raise RunError("refused later")

    monkeypatch.setattr(TrainingRun, "_fresh", raced_then_refused)
    with pytest.raises(RunError):
        TrainingRun.fresh(out, CONFIG, {}, Corpus(None, lambda: (TEXT, "text")))
    assert list(out.iterdir()) == []
