"""``gptspec train``: a run, its files, --resume, and every bad input named in one line."""

from __future__ import annotations

import json

import pytest

from gptspec.cli import main
from gptspec.cli import train as train_cli
from gptspec.fast import train
from gptspec.fast.checkpoint import load_model, load_training_checkpoint

TINY = ["--preset", "tiny", "--vocab-size", "256", "--batch-size", "2", "--eval-interval", "2",
        "--eval-batches", "1", "--warmup", "1", "--no-progress"]
TEXT = "To be, or not to be, that is the question. " * 40


def _train(tmp_path, *extra: str) -> int:
    return main(["train", *TINY, "--out", str(tmp_path / "out"), *extra])


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    return path


def test_train_then_resume(tmp_path, corpus, capsys):
    assert _train(tmp_path, "--data", str(corpus), "--steps", "4") == 0
    out = tmp_path / "out"
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    config, params = load_model(out / "checkpoint")
    assert config.vocab_size == 256 and "wte" in params
    assert "validation loss" in capsys.readouterr().out
    assert _train(tmp_path, "--resume", "--steps", "6") == 0
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 6 and [s for s, _ in state["history"]["train"]] == list(range(1, 7))


def test_ctrl_c_saves_and_resume_finishes_identically(tmp_path, corpus, monkeypatch, capsys):
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    assert _train(ref_dir, "--data", str(corpus), "--steps", "5") == 0
    whole = json.loads((ref_dir / "out" / "checkpoint" / "state.json").read_text())
    real_step = train.Trainer.step

    def interrupting(self):
        if self.step_count == 3:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(train.Trainer, "step", interrupting)
    assert _train(tmp_path, "--data", str(corpus), "--steps", "5") == 130
    assert "interrupted at step 3" in capsys.readouterr().out
    monkeypatch.setattr(train.Trainer, "step", real_step)
    assert _train(tmp_path, "--resume") == 0
    resumed = json.loads((tmp_path / "out" / "checkpoint" / "state.json").read_text())
    assert resumed["history"]["train"] == whole["history"]["train"]


def test_nan_loss_stops_with_a_message_and_keeps_the_checkpoint(tmp_path, corpus, monkeypatch,
                                                                capsys):
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2") == 0
    real_loss = train.Trainer.loss
    monkeypatch.setattr(train.Trainer, "loss",
                        lambda self, x, y, model=None: real_loss(self, x, y, model) * float("nan"))
    assert _train(tmp_path, "--resume", "--steps", "4") == 2
    err = capsys.readouterr().err
    assert "loss became nan at step 3" in err and "last good checkpoint" in err
    assert load_training_checkpoint(tmp_path / "out" / "checkpoint")[3]["step"] == 2


def test_default_corpus_is_the_standard_library(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train_cli, "STDLIB_MB", 0.05)
    assert _train(tmp_path, "--steps", "2") == 0
    assert "standard library" in capsys.readouterr().out


@pytest.mark.parametrize("content, args, message", [
    (b"", [], "is empty"),
    (b"\xff\xfe bad", [], "not valid UTF-8"),
    (b"short", [], "too short"),
    (TEXT.encode(), ["--vocab-size", "64"], "tokenizer has 256 tokens but the model's vocab_size is 64"),
    (TEXT.encode(), ["--n-heads", "5"], "n_heads"),
    (TEXT.encode(), ["--lr", "-1"], "lr"),
    (TEXT.encode(), ["--preset", "nope"], "unknown preset"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, content, args, message):
    path = tmp_path / "data.txt"
    path.write_bytes(content)
    assert _train(tmp_path, "--data", str(path), "--steps", "1", *args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_missing_data_existing_run_and_corrupt_checkpoint(tmp_path, corpus, capsys):
    assert _train(tmp_path, "--data", str(tmp_path / "missing.txt")) == 2
    err = capsys.readouterr().err
    assert "--data" in err and "does not exist" in err
    assert _train(tmp_path, "--resume") == 2
    assert "no training checkpoint" in capsys.readouterr().err
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2") == 0
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2") == 2
    assert "pass --resume" in capsys.readouterr().err
    model = tmp_path / "out" / "checkpoint" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:100])
    assert _train(tmp_path, "--resume", "--steps", "3") == 2
    assert "model.safetensors" in capsys.readouterr().err


def test_compile_is_kept_by_the_run_and_its_resume(tmp_path, corpus, monkeypatch):
    """--compile reaches the trainer (which compiles its forward and loss), is saved with
    the run's settings, and a --resume without the flag continues compiled. The default
    compiler is swapped for aot_eager here: the inductor's minutes of C++ on this CPU
    would test PyTorch, not this flag."""
    import torch

    real_compile, compiled = torch.compile, []

    def compile_spy(fn, **options):
        compiled.append(fn)
        return real_compile(fn, backend="aot_eager", **options)

    monkeypatch.setattr(train.torch, "compile", compile_spy)
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2", "--compile") == 0
    state = json.loads((tmp_path / "out" / "checkpoint" / "state.json").read_text())
    assert state["settings"]["compile"] is True and len(compiled) == 1
    assert _train(tmp_path, "--resume", "--steps", "3") == 0
    state = json.loads((tmp_path / "out" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 3 and state["settings"]["compile"] is True and len(compiled) == 2


def test_a_data_file_name_with_escape_sequences_is_printed_as_escapes(tmp_path, capsys):
    """A corpus named with a terminal escape (clear screen) and a line break: the run's
    header spells them out, in a fresh run as on --resume, so the file name cannot rewrite
    what the terminal shows."""
    corpus = tmp_path / "a\x1b[2Jb\nc.txt"
    corpus.write_text(TEXT)
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2") == 0
    assert _train(tmp_path, "--resume", "--steps", "3") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.count("a\\x1b[2Jb\\nc.txt") == 2


def test_a_mixed_precision_the_cpu_would_not_use_is_refused_on_resume(tmp_path, corpus, capsys):
    # on the CPU autocast_dtype has none: the run trained in float32 and its state.json
    # said "precision": "float16" (issue 29); a state.json saying so (a CUDA run resumed
    # with --device cpu) is refused too, naming the file
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2") == 0
    state_file = tmp_path / "out" / "checkpoint" / "state.json"
    state = json.loads(state_file.read_text())
    state["settings"]["precision"] = "bfloat16"
    state_file.write_text(json.dumps(state))
    capsys.readouterr()
    assert _train(tmp_path, "--resume", "--steps", "3") == 2
    err = capsys.readouterr().err
    assert "state.json" in err and "precision' bfloat16" in err and "float32" in err, err
    assert len(err.splitlines()) == 1
    with pytest.raises(ValueError, match="mixed precision on CUDA"):
        train.TrainSettings(device="cpu", precision="float16")


def test_a_text_corpus_from_a_pipe_trains_as_from_its_file(tmp_path, corpus):
    """`train --data <(command)` was refused ("is not a regular file"): a text corpus is
    read once, into tokens.bin, so a pipe serves; a token file is memory-mapped, so it
    must stay a regular file."""
    import os

    read, write = os.pipe()
    os.write(write, TEXT.encode())
    os.close(write)
    try:
        assert main(["train", *TINY, "--out", str(tmp_path / "piped"), "--data",
                     f"/dev/fd/{read}", "--steps", "2"]) == 0
    finally:
        os.close(read)
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2") == 0
    assert (tmp_path / "piped" / "tokens.bin").read_bytes() == \
        (tmp_path / "out" / "tokens.bin").read_bytes()
    os.mkfifo(tmp_path / "ids.bin")
    assert main(["train", *TINY, "--out", str(tmp_path / "x"), "--data",
                 str(tmp_path / "ids.bin"), "--steps", "2"]) == 2


def test_a_changed_setting_that_is_refused_blames_the_command_line(tmp_path, corpus, capsys):
    """`--resume --precision bfloat16` on the CPU said "…/state.json: setting 'precision'
    bfloat16 …", as if the saved file were wrong."""
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2") == 0
    capsys.readouterr()
    assert _train(tmp_path, "--resume", "--steps", "3", "--precision", "bfloat16") == 2
    err = capsys.readouterr().err
    assert "bfloat16" in err and "state.json" not in err


def test_a_warm_up_longer_than_the_schedule_is_said(tmp_path, corpus, capsys):
    """--warmup 50 on a 3-step run was shortened to 3 steps without a word."""
    assert _train(tmp_path, "--data", str(corpus), "--steps", "3", "--warmup", "50") == 0
    assert ("warning: a warm-up of 50 steps does not fit the schedule's 3: the learning rate "
            "warms up over 3 steps instead") in capsys.readouterr().err
    assert _train(tmp_path, "--resume", "--steps", "4", "--warmup", "4") == 0
    assert "warm-up" not in capsys.readouterr().err


def test_each_heads_width_is_a_flag(tmp_path, corpus, capsys):
    """The refusal of --n-heads 3 with --d-model 16 said 'd_head' must be given, which no
    flag could give."""
    args = ["--data", str(corpus), "--steps", "2", "--d-model", "16", "--n-heads", "3"]
    assert _train(tmp_path, *args) == 2
    assert "'d_head' must be given" in capsys.readouterr().err
    assert _train(tmp_path, *args, "--d-head", "4") == 0
    config, _ = load_model(tmp_path / "out" / "checkpoint")
    assert (config.n_heads, config.d_head, config.d_model) == (3, 4, 16)
    assert main(["train", "--out", str(tmp_path / "out"), "--resume", "--steps", "3",
                 "--d-head", "5", "--no-progress"]) == 2
    assert "--d-head 5 contradicts the checkpoint" in capsys.readouterr().err


def test_a_setting_missing_from_state_json_is_refused_not_defaulted(tmp_path, corpus, capsys):
    """With lr and warmup_steps deleted from state.json, a resume went on at the defaults
    (lr 0.001 where the run had 0.05) without a word."""
    assert _train(tmp_path, "--data", str(corpus), "--steps", "2", "--lr", "0.05") == 0
    state_file = tmp_path / "out" / "checkpoint" / "state.json"
    saved = json.loads(state_file.read_text())
    edited = {**saved, "settings": {k: v for k, v in saved["settings"].items()
                                    if k not in ("lr", "warmup_steps")}}
    state_file.write_text(json.dumps(edited))
    resume = ["train", "--out", str(tmp_path / "out"), "--resume", "--steps", "3",
              "--no-progress"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert "lacks the settings lr, warmup_steps" in err and len(err.splitlines()) == 1
    # a run saved before `compile` was recorded (2026-11-26) was not compiled
    older = {**saved, "settings": {k: v for k, v in saved["settings"].items()
                                   if k != "compile"}}
    state_file.write_text(json.dumps(older))
    assert main(resume) == 0


@pytest.mark.parametrize(("code", "said"), [("ENOSPC", "the disk is full"),
                                            ("EDQUOT", "the disk quota is used up")])
def test_a_full_disk_while_writing_the_tokens_names_the_file(tmp_path, corpus, monkeypatch,
                                                             capsys, code, said):
    """A fresh run on a full disk said "error: No space left on device", exit 1, with no
    file named (the write goes to a temporary name): now the token file is named, and
    the run leaves nothing behind."""
    import errno
    import os
    from pathlib import Path

    real_write_bytes = Path.write_bytes

    def full_disk(self, data):
        if self.name.startswith(".tokens.bin."):  # atomic_files' temporary for tokens.bin
            number = getattr(errno, code)
            raise OSError(number, os.strerror(number))
        return real_write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    assert _train(tmp_path, "--data", str(corpus), "--steps", "1") == 2
    err = capsys.readouterr().err.strip()
    tokens = tmp_path / "out" / "tokens.bin"
    assert err.splitlines() == [f"gptspec train: error: cannot write the token file {tokens}: "
                                f"{said} ({os.strerror(getattr(errno, code))})"]
    assert not (tmp_path / "out").exists()  # the run's folder, lock and temporary went
