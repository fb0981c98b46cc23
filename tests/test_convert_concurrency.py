"""One writer per folder for ``gptspec convert`` (issue 29, hostile round h6 finding 4).

A conversion said "wrote …" and its files were then gone: (a) a fresh ``train --out RUN``
started while ``convert … RUN/checkpoint`` ran replaced that folder at its first save
(the run's lock was taken only where its file already existed); (b) a second conversion
into the same new OUT_DIR replaced the first's files, both saying "wrote". Each race runs
two real processes; the first conversion is held after its checks, before it writes (a
file the test makes lets it go on), so the second comes while it runs, every time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from gptspec.cli import main  # noqa: E402
from gptspec.fast.run_lock import LOCK_FILE  # noqa: E402

TRAIN = ["train", "--preset", "tiny", "--vocab-size", "256", "--batch-size", "2",
         "--eval-interval", "2", "--eval-batches", "1", "--warmup", "1", "--steps", "2",
         "--no-progress"]
TEXT = "To be, or not to be, that is the question. " * 40

# `gptspec convert` that stops once it has checked OUT_DIR, before it writes anything
# (--from-hf: as it reads HF_DIR; --to-hf: in save_hf_dir, past its own checks), says so
# by making READY and waits for GO
HELD = """
import sys, time
from pathlib import Path
from gptspec.fast import hf_interop
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
def held(real):
    def wait_then(*args, **kwargs):
        ready.touch()
        while not go.exists():
            time.sleep(0.02)
        return real(*args, **kwargs)
    return wait_then
hf_interop.load_hf_dir = held(hf_interop.load_hf_dir)
hf_interop.to_hf_model = held(hf_interop.to_hf_model)
from gptspec.cli import main
sys.exit(main(sys.argv[3:]))
"""


class Held:
    """A conversion in another process, held before it writes until :meth:`go`."""

    def __init__(self, tmp_path: Path, *argv: object) -> None:
        self.ready, self.go_file = tmp_path / "held.ready", tmp_path / "held.go"
        self.process = subprocess.Popen(
            [sys.executable, "-c", HELD, str(self.ready), str(self.go_file), "convert",
             *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.pid = self.process.pid

    def wait_until_held(self) -> None:
        deadline = time.monotonic() + 120
        while not self.ready.exists():
            assert self.process.poll() is None, self.process.communicate()
            assert time.monotonic() < deadline, "the conversion never came to its write"
            time.sleep(0.05)

    def go(self) -> tuple[int, str, str]:
        self.go_file.touch()
        stdout, stderr = self.process.communicate(timeout=120)
        return self.process.returncode, stdout, stderr

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def held():
    started: list[Held] = []

    def start(tmp_path: Path, *argv: object) -> Held:
        started.append(Held(tmp_path, *argv))
        return started[-1]

    yield start
    for process in started:
        process.kill()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """(a gptspec checkpoint, a transformers directory, another transformers directory
    with other weights): what each conversion reads."""
    from gptspec.fast.checkpoint import save_model
    from gptspec.fast.hf_interop import save_hf_dir
    from gptspec.fast.tokenizer import Tokenizer
    from gptspec.spec import PRESETS, init_parameters

    folder = tmp_path_factory.mktemp("sources")
    config = PRESETS["tiny"].replace(vocab_size=256)
    paths = []
    for seed in (1, 2):
        params = {k: v.astype(np.float32) for k, v in init_parameters(config, seed=seed).items()}
        save_model(folder / f"ck{seed}", params, config)
        Tokenizer.byte_level().save(folder / f"ck{seed}" / "tokenizer.json")
        save_hf_dir(folder / f"hf{seed}", params, config, tokenizer=Tokenizer.byte_level())
        paths.append((folder / f"ck{seed}", folder / f"hf{seed}"))
    return paths[0][0], paths[0][1], paths[1][1]


def same_weights(converted: Path, source_checkpoint: Path) -> bool:
    from gptspec.fast.checkpoint import load_model

    _, mine = load_model(converted)
    _, theirs = load_model(source_checkpoint)
    return all(np.array_equal(mine[k], theirs[k]) for k in theirs)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# --- (a) a fresh train on the run whose checkpoint folder is being converted into ---------


@pytest.mark.parametrize("direction", ["--from-hf", "--to-hf"])
def test_a_train_started_during_a_conversion_into_its_checkpoint_is_refused_naming_it(
        tmp_path, capsys, held, sources, direction):
    ck, hf, _ = sources
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    run = tmp_path / "run"
    source = hf if direction == "--from-hf" else ck
    conversion = held(tmp_path, direction, source, run / "checkpoint")
    conversion.wait_until_held()
    assert main([*TRAIN, "--data", str(corpus), "--out", str(run)]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{run} is being written by another gptspec command (pid {conversion.pid})" in line
    code, stdout, stderr = conversion.go()
    assert code == 0, stderr
    assert stdout.startswith(f"wrote {run / 'checkpoint'}")
    # what it said it wrote is there, and the run's lock file it made is gone
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint"]
    if direction == "--from-hf":
        assert same_weights(run / "checkpoint", ck)
    else:
        assert (run / "checkpoint" / "config.json").is_file()
    # a train now refuses the folder of other files instead of replacing it
    before = sorted(p.name for p in (run / "checkpoint").iterdir())
    assert main([*TRAIN, "--data", str(corpus), "--out", str(run)]) == 2
    assert "holds files of its own" in one_line(capsys.readouterr().err)
    assert sorted(p.name for p in (run / "checkpoint").iterdir()) == before


def test_a_conversion_into_a_run_being_trained_is_refused_naming_the_train(
        tmp_path, capsys, sources):
    """Into RUN/checkpoint it was refused as "a training run's checkpoint folder" whoever
    held RUN's lock (a conversion too); now the holder is named, as for RUN/other."""
    ck, hf, _ = sources
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    run = tmp_path / "run"
    train = subprocess.Popen(
        [sys.executable, "-m", "gptspec", *TRAIN, "--data", str(corpus), "--out", str(run),
         "--steps", "100000", "--checkpoint-interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while not (run / "checkpoint" / "state.json").exists():
            assert train.poll() is None and time.monotonic() < deadline, train.communicate()
            time.sleep(0.05)
        for out in (run / "checkpoint", run / "converted"):
            assert main(["convert", "--from-hf", str(hf), str(out)]) == 2
            line = one_line(capsys.readouterr().err)
            assert f"{run} is being written by another gptspec command (pid {train.pid})" \
                in line, line
        assert not (run / "converted").exists()
        assert train.poll() is None
    finally:
        train.terminate()
        train.communicate(timeout=60)


# --- (b) two conversions into one OUT_DIR --------------------------------------------------


@pytest.mark.parametrize("out_name", ["new", "checkpoint"])
def test_a_second_conversion_into_the_same_out_dir_is_refused_naming_the_first(
        tmp_path, held, sources, out_name):
    ck, hf1, hf2 = sources
    out = tmp_path / "parent" / out_name
    first = held(tmp_path, "--from-hf", hf1, out)
    first.wait_until_held()
    second = subprocess.run([sys.executable, "-m", "gptspec", "convert", "--from-hf",
                             str(hf2), str(out)], capture_output=True, text=True)
    assert second.returncode == 2, second.stdout
    line = one_line(second.stderr)
    assert line.startswith(f"gptspec convert: error: OUT_DIR {out}: ")
    assert f"being written by another gptspec command (pid {first.pid})" in line
    code, stdout, stderr = first.go()
    assert code == 0, stderr
    assert stdout.startswith(f"wrote {out / 'model.safetensors'}")
    assert same_weights(out, ck)  # the first's, which it said it wrote
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "tokenizer.json"]
    assert sorted(p.name for p in out.parent.iterdir()) == [out_name]  # no lock file left


def test_a_second_export_into_the_same_out_dir_is_refused(tmp_path, held, sources):
    """--to-hf renames a whole folder into place: the second of two is refused by the
    rename (it replaces only an empty folder) and leaves nothing behind."""
    ck, _, _ = sources
    out = tmp_path / "out"
    out.mkdir()  # empty: a legal OUT_DIR for either
    first = held(tmp_path, "--to-hf", ck, out)
    first.wait_until_held()  # past its checks of OUT_DIR
    second = subprocess.run([sys.executable, "-m", "gptspec", "convert", "--to-hf", str(ck),
                             str(out)], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    written = {p.name: p.stat().st_ino for p in out.iterdir()}
    code, stdout, stderr = first.go()
    assert code == 2, stdout
    line = one_line(stderr)
    assert line == (f"gptspec convert: error: {out} was filled by another process while this "
                    "conversion ran; nothing was written")
    assert {p.name: p.stat().st_ino for p in out.iterdir()} == written
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("held.")) == \
        ["out"]


def test_a_lock_file_a_conversion_made_goes_with_the_folders_made_for_it(tmp_path, capsys,
                                                                         sources):
    """A refused conversion leaves nothing it made: not RUN, not RUN/.train.lock."""
    ck, _, _ = sources
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_text("not weights")
    for out in (tmp_path / "a" / "b" / "checkpoint", tmp_path / "c"):
        assert main(["convert", "--from-hf", str(bad), str(out)]) == 2
        one_line(capsys.readouterr().err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_conversion_finished_inside_a_fresh_trains_checks_is_not_replaced(tmp_path,
                                                                            sources):
    """train's checks of RUN (before it reads its data) and its lock (after) are apart:
    a conversion into RUN/checkpoint that starts and ends between them passes both."""
    from gptspec.fast.training_run import Corpus, RunError, TrainingRun
    from gptspec.spec import PRESETS

    _, hf, _ = sources
    run = tmp_path / "run"

    def read_text() -> tuple[str, str]:  # while train reads its data
        converted = subprocess.run([sys.executable, "-m", "gptspec", "convert", "--from-hf",
                                    str(hf), str(run / "checkpoint")],
                                   capture_output=True, text=True)
        assert converted.returncode == 0, converted.stderr
        return TEXT, "corpus"

    config = PRESETS["tiny"].replace(vocab_size=256, n_ctx=8)
    try:
        with pytest.raises(RunError, match="holds files of its own"):
            TrainingRun.fresh(run, config, {"max_steps": 2},
                              Corpus(file=None, read_text=read_text)).close()
    finally:
        assert sorted(p.name for p in (run / "checkpoint").iterdir()) == [
            "model.safetensors", "tokenizer.json"]


def test_a_refusal_for_a_lock_file_alone_names_it(tmp_path, capsys, sources):
    """A convert killed by SIGKILL leaves RUN/.train.lock; the retry's refusal called RUN a
    training run's folder with nothing else to go on (hostile round 7). A run ended before
    its first save looks the same, and its checkpoint folder stays guarded: the refusal
    names the lock file, to be removed where no run uses the folder."""
    ck, hf, _ = sources
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text("999999999\n")  # a pid no process has
    assert main(["convert", "--from-hf", str(hf), str(run / "checkpoint")]) == 2
    assert f"its lock file {run / LOCK_FILE} says so: if no run uses that folder, remove " \
        "the file" in one_line(capsys.readouterr().err)
    (run / LOCK_FILE).unlink()
    assert main(["convert", "--from-hf", str(hf), str(run / "checkpoint")]) == 0
    assert same_weights(run / "checkpoint", ck)


def test_a_lock_file_beside_a_runs_checkpoint_still_guards_it(tmp_path, capsys, sources):
    ck, hf, _ = sources
    run = tmp_path / "run"
    shutil.copytree(ck, run / "checkpoint")
    (run / "checkpoint" / "state.json").write_text("{}")  # what a run's save leaves there
    (run / LOCK_FILE).write_text("999999999\n")
    assert main(["convert", "--from-hf", str(hf), str(run / "checkpoint")]) == 2
    assert "a training run's checkpoint folder" in one_line(capsys.readouterr().err)
