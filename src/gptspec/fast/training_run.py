"""A training run's directory (OUT), opened fresh or resumed, and the Trainer that writes it.

:class:`TrainingRun` holds OUT's one-writer lock (``run_lock``) for the run's life, turns
the data into ``tokens.bin`` on a fresh run and finds it again from state.json on a
resumed one, checks that what the caller asks for agrees with the checkpoint, and builds
the :class:`~gptspec.fast.train.Trainer`. What it refuses is a :class:`RunError`, one line.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptspec.fast.checkpoint import (
    STATE_FILE,
    CheckpointError,
    find_checkpoints,
    load_training_checkpoint,
    recover_checkpoint,
)
from gptspec.fast.data import (
    TOKEN_FILE_SUFFIXES,
    DataError,
    TokenData,
    open_tokens,
    tokens_sha256,
    write_tokens,
)
from gptspec.fast.run_lock import (
    LOCK_FILE,
    RunLock,
    RunLocked,
    missing_folders,
    remove_empty,
    remove_stale_temporaries,
)
from gptspec.fast.train import (
    Interrupted,
    Trainer,
    TrainingDiverged,
    TrainSettings,
    init_distributed,
    stop_on_signals,
)
from gptspec.spec.config import ConfigError, GPTConfig, preset

TEMPORARY_FILES = ("loss.png", "tokens.bin")  # written beside their targets (atomic_files)

# The caller's checks of the settings against this machine (memory, device), run before
# any data is read or any model is built; what they raise passes through unchanged.
Vet = Callable[[GPTConfig, TrainSettings], None]


class RunError(RuntimeError):
    """A run that cannot start or go on, said in one line."""


class RunDiverged(RunError):
    """The loss or the weights stopped being finite; the last good checkpoint is kept."""


@dataclass(frozen=True)
class Corpus:
    """A fresh run's data: ``file`` holds token ids (.bin, .npy), or else ``read_text``
    gives (text, its description), called only once OUT is known not to hold a run."""

    file: Path | None
    read_text: Callable[[], tuple[str, str]]
    tokenizer: Path | None = None  # a tokenizer file to load
    train_tokenizer: int | None = None  # or the vocabulary of a BPE tokenizer to train


class TrainingRun:
    """OUT, this process's to write: made by :meth:`fresh` or :meth:`resume`, trained by
    :meth:`train`, let go by :meth:`close` (or ``with``)."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = Path(out)
        self.checkpoint = self.out / "checkpoint"
        self._lock: RunLock | None = None
        self.config: GPTConfig
        self.settings: TrainSettings
        self.trainer: Trainer
        self.tokens: np.ndarray
        self.source = ""  # what the tokens were made from, as state.json says
        self.rank, self.world = 0, 1
        self.stopped_by = 0  # the signal that interrupted train(), once it has
        self._made: list[Path] = []  # folders a fresh run made, the deepest first
        self._wrote_tokens = False
        self._lock_file_found = True  # (fresh() looks)

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # --- opening ------------------------------------------------------------------------

    @classmethod
    def fresh(cls, out: str | os.PathLike[str], config: GPTConfig, changes: dict,
              corpus: Corpus, vet: Vet | None = None) -> TrainingRun:
        """A new run in OUT (refused if OUT holds one) of the model ``config``, with the
        default settings but ``changes``, on ``corpus``."""
        run = cls(out)
        # a lock file found here is a run's (or a conversion's): kept; one that appeared
        # after this point, made by a fresh run racing this one, goes with this run's refusal
        run._lock_file_found = (Path(out) / LOCK_FILE).exists()
        try:
            run._fresh(config, changes, corpus, vet)
        except BaseException:
            run._discard()
            raise
        return run

    @classmethod
    def resume(cls, out: str | os.PathLike[str], changes: dict, model: dict | None = None,
               preset_name: str | None = None, vet: Vet | None = None) -> TrainingRun:
        """The run saved in OUT, its settings but ``changes`` (a larger max_steps, say).
        ``preset_name`` and ``model`` (config fields) may only repeat the saved model."""
        run = cls(out)
        try:
            run._resume(changes, model or {}, preset_name, vet)
        except BaseException:
            run.close()
            raise
        return run

    def _discard(self) -> None:
        """Let go of a fresh run refused before its first save, leaving OUT as it was found:
        the tokens.bin, lock file and folders it made go (a single process only: under
        torchrun the other ranks may still be writing)."""
        lock = self._lock
        if lock is None or not _single_process() or find_checkpoints(self.checkpoint):
            self.close()
            return
        if self._wrote_tokens:
            (self.out / "tokens.bin").unlink(missing_ok=True)
        lock.release(remove=lock.created or not self._lock_file_found)
        self._lock = None
        remove_empty(self._made)  # one the user filled meanwhile stays

    def _claim(self, resume: bool = False) -> None:
        """Make OUT this process's to write (refused if another live run writes it), then
        remove what killed runs left there; every later write happens under the lock."""
        out = self.out
        if not self._made and not resume:
            self._made = missing_folders(out)
        out.mkdir(parents=True, exist_ok=True)
        if self._lock is not None or os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 writes
            return
        try:
            self._lock = RunLock(out)
        except RunLocked as err:
            raise RunError(str(err)) from None
        except OSError as err:
            raise RunError(f"--out: cannot lock {out}: {err.strerror}") from None
        if not resume and ((self.checkpoint / STATE_FILE).exists()
                           or find_checkpoints(self.checkpoint)):
            # a run that ended between the check in _fresh and the lock
            raise RunError(self._holds_a_run())
        if not resume:  # nor a conversion into it that ended between them (it held the lock)
            self._refuse_other_files()
        # under torchrun every rank writes tokens.bin (the same bytes) at this moment: only
        # the files rank 0 alone writes are a killed run's
        remove_stale_temporaries(out, TEMPORARY_FILES if _single_process() else ("loss.png",))
        recover_checkpoint(self.checkpoint)  # the temporary folders of killed saves go

    def _refuse_other_files(self) -> None:
        checkpoint = self.checkpoint
        if checkpoint.is_dir() and not checkpoint.is_symlink():
            # not a run's: a run replaces this folder at each save, and its files would go
            others = sorted(p.name for p in checkpoint.iterdir())
            if others:
                shown = ", ".join(others[:3]) + (", …" if len(others) > 3 else "")
                raise RunError(f"{checkpoint} holds files of its own ({shown}), not a "
                               "training run's checkpoint; a run replaces that folder at "
                               "each save: move them or choose another --out")

    def _holds_a_run(self) -> str:
        return (f"{self.out} already holds a training run; pass --resume to continue it or "
                "choose another --out")

    def _fresh(self, config: GPTConfig, changes: dict, corpus: Corpus, vet: Vet | None) -> None:
        out, checkpoint = self.out, self.checkpoint
        alone = _single_process()  # under torchrun every
        # rank writes tokens.bin, before or after rank 0 takes the lock
        if alone and out.is_dir() and not (out / LOCK_FILE).exists():  # no run was ever
            # here: files of a run's names are the user's, which the run would write over
            text = corpus.file is None or corpus.file.suffix not in TOKEN_FILE_SUFFIXES
            written = ("tokens.bin", "loss.png") if text else ("loss.png",)
            mine = [name for name in written if (out / name).exists()]
            if mine:
                raise RunError(f"{out} holds {' and '.join(mine)} of its own, which the run "
                               f"would write there: move {'it' if len(mine) == 1 else 'them'} "
                               "or choose another --out")
        if out.is_dir():  # a live writer there is named, whatever it has written yet
            self._claim()
        if out.exists() and ((checkpoint / STATE_FILE).exists() or find_checkpoints(checkpoint)):
            raise RunError(self._holds_a_run())
        self._refuse_other_files()
        settings = _settings(changes)  # before the data is read: a bad setting costs nothing
        if vet is not None:
            vet(config, settings)
        self.config, tokenizer = self._prepare_data(config, corpus)  # makes OUT
        self._start(settings)
        try:
            data = TokenData.split(self.tokens, self.config.n_ctx)
        except DataError as err:
            raise RunError(f"{self.source}: {err}") from None
        self.trainer = Trainer(self.config, self.settings, data, tokenizer)
        tokens, mapped = self.tokens, getattr(self.tokens, "filename", None)
        file = Path(mapped) if mapped else corpus.file
        self.trainer.extra_state = {"data": {
            "source": self.source, "tokens": _stored_path(out, file),  # type: ignore[arg-type]
            "n_tokens": int(len(tokens)), "dtype": str(tokens.dtype),
            "sha256": tokens_sha256(tokens)}}

    def _prepare_data(self, config: GPTConfig, corpus: Corpus) -> tuple[GPTConfig, Any]:
        """(config, tokenizer) of a fresh run; its tokens memory-mapped into self.tokens.
        Every refusal of the input comes before OUT is made."""
        if corpus.file is not None and corpus.file.suffix in TOKEN_FILE_SUFFIXES:
            tokenizer = _tokenizer(corpus, None)
            _fits(tokenizer, config)
            try:
                self.tokens = open_tokens(corpus.file, config.vocab_size)
            except DataError as err:
                raise RunError(str(err)) from None
            self._claim()
            self.source = str(corpus.file)
            return config, tokenizer
        text, source = corpus.read_text()
        if not text:
            raise RunError(f"the corpus {source} is empty")
        tokenizer = _tokenizer(corpus, text)
        _fits(tokenizer, config)
        ids = _encode(tokenizer, text)
        try:  # a corpus too short to split is refused before OUT and tokens.bin are made
            TokenData.split(ids, config.n_ctx)
        except DataError as err:
            raise RunError(f"{source}: {err}") from None
        self._claim()  # makes OUT only now: a refused input leaves no folder
        try:  # a full disk: the temporary file went, _discard removes what the run made
            written = write_tokens(self.out / "tokens.bin", ids, config.vocab_size)
        except DataError as err:
            raise RunError(str(err)) from None
        self._wrote_tokens = True
        self.tokens, self.source = open_tokens(written, config.vocab_size), source
        return config, tokenizer

    def _resume(self, changes: dict, model: dict, preset_name: str | None,
                vet: Vet | None) -> None:
        out, checkpoint = self.out, self.checkpoint
        if not out.is_dir() or not (checkpoint.exists() or find_checkpoints(checkpoint)):
            raise RunError(f"no training checkpoint to resume in {out} ({checkpoint} not "
                           "found)")
        self._claim(resume=True)  # before reading: another writer may be mid-save
        try:
            saved = load_training_checkpoint(checkpoint)  # once: the lock keeps it as read
            config, _, _, state, tokenizer = saved
            _same_model(config, model, preset_name, checkpoint)
            if tokenizer.vocab_size > config.vocab_size:
                raise RunError(f"{checkpoint}: the tokenizer has {tokenizer.vocab_size} "
                               f"tokens, the model only {config.vocab_size}")
            if "data" not in state:
                raise RunError(f"{checkpoint}/{STATE_FILE} does not say which data it was "
                               "trained on")
            data_state = state["data"]
            self.tokens = open_tokens(_tokens_path(out, data_state["tokens"]),
                                      config.vocab_size, data_state.get("dtype"))
            if len(self.tokens) != data_state["n_tokens"] or (  # a length, then the ids
                    "sha256" in data_state  # (recorded since issue 29)
                    and tokens_sha256(self.tokens) != data_state["sha256"]):
                raise RunError(f"the token file {data_state['tokens']} changed since the "
                               "checkpoint was written")
        except (CheckpointError, DataError) as err:
            raise RunError(str(err)) from None
        except KeyError as err:
            raise RunError(f"{checkpoint}/{STATE_FILE} lacks {err}") from None
        steps = changes.get("max_steps")
        if steps is not None and steps < state["step"]:
            raise RunError(f"--steps {steps} is below the checkpoint's step {state['step']} "
                           f"({checkpoint}); --resume trains on to a larger --steps")
        if checkpoint.is_dir():  # before training, not at the first save
            _writable(checkpoint)
        _all_settings_saved(state.get("settings"), checkpoint / STATE_FILE)
        try:  # the saved file is blamed only where its own settings are wrong
            _settings(state["settings"])
            blame = ""  # what the command line changed (--precision bfloat16 on the CPU)
        except RunError:
            blame = f"{checkpoint / STATE_FILE}: "
        settings = _settings({**state["settings"], **changes}, blame)
        if vet is not None:
            vet(config, settings)
        self.config, self.source = config, data_state["source"]
        self._start(settings)
        try:
            data = TokenData.split(self.tokens, config.n_ctx)
            self.trainer = Trainer.resume(checkpoint, data, dict(vars(self.settings)), saved)
        except (CheckpointError, DataError) as err:
            raise RunError(str(err)) from None
        self.trainer.extra_state = {"data": data_state}

    def _start(self, settings: TrainSettings) -> None:
        """Join torchrun's process group, if any; the device becomes this process's."""
        self.rank, self.world, settings.device = init_distributed(settings.device)
        self.settings = settings

    # --- training -----------------------------------------------------------------------

    def train(self, progress: bool = True) -> str:
        """Train to max_steps: "done", or "interrupted" (a signal, or standard output
        lost; the checkpoint is saved first). A checkpoint that cannot be written and a
        run that diverged raise RunError and RunDiverged, each saying what is kept."""
        try:
            with stop_on_signals():
                try:
                    status = self.trainer.run(self.out, progress=progress)
                except Interrupted as signal_during_save:  # arrived as a save ended
                    self.stopped_by = signal_during_save.signum
                    return "interrupted"
        except OSError as err:  # disk full, permission lost: what was written before is kept
            raise RunError(f"cannot write the checkpoint: {err.strerror or err}"
                           f"{f' ({err.filename})' if err.filename else ''}; "
                           f"{self._kept('complete')}") from None
        except TrainingDiverged as err:
            raise RunDiverged(f"{err}; stopped without saving — {self._kept('good')}"
                              ) from None
        if status == "interrupted":
            self.stopped_by = self.trainer.stopped_by
        return status

    def wait_for_the_others(self) -> None:
        """Under torchrun, return once every process has come here."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def _kept(self, what: str) -> str:
        """What a run that stopped on an error leaves: its last checkpoint, or none (it
        stopped before the first save, and there is nothing to resume)."""
        if find_checkpoints(self.checkpoint):
            return f"the last {what} checkpoint is kept in {self.checkpoint}"
        return f"no checkpoint had been saved yet in {self.checkpoint}"

    def where_saved(self) -> str:
        """Where an interrupted run's work is, as it is: saved by this run, kept from an
        earlier one (no step was taken), or nowhere yet."""
        checkpoint = self.checkpoint
        # a command that works as printed: a name with a space or a quote is quoted
        resume = f"continue with: gptspec train --out {shlex.quote(str(self.out))} --resume"
        if self.trainer.saved_at is not None:
            return f"checkpoint saved in {checkpoint} (step {self.trainer.saved_at}); {resume}"
        if find_checkpoints(checkpoint):
            return f"no step was taken; the checkpoint in {checkpoint} is as it was; {resume}"
        return ("no checkpoint was saved (stopped before the first step); to train, run the "
                "same command again")


# --- the pieces -----------------------------------------------------------------------------


# settings a run records since a later version: missing, they mean this default
SETTINGS_ADDED_LATER = {"compile": False}  # since 2026-11-26: older runs were not compiled


def _single_process() -> bool:
    """Not one rank of several under torchrun."""
    return os.environ.get("WORLD_SIZE", "1") in ("", "1")


def _all_settings_saved(saved: Any, state_file: Path) -> None:
    """A resumed run goes on with its own settings: one missing from state.json (an edit, a
    damaged file) would have been replaced by its default without a word."""
    if not isinstance(saved, dict):
        raise RunError(f"{state_file}: 'settings' is not an object")
    missing = [f.name for f in dataclasses.fields(TrainSettings)
               if f.name not in saved and f.name not in SETTINGS_ADDED_LATER]
    if missing:
        raise RunError(f"{state_file} lacks the setting{'s' if len(missing) > 1 else ''} "
                       f"{', '.join(missing)} of the run it saved (edited or damaged)")


def _settings(values: dict, where: str = "") -> TrainSettings:
    try:
        return TrainSettings.from_dict(values)
    except (ValueError, TypeError) as err:  # TypeError: a state.json with odd values
        raise RunError(f"{where}{err}") from None


def _tokenizer(corpus: Corpus, text: str | None) -> Any:
    from gptspec.fast.tokenizer import Tokenizer

    if corpus.tokenizer is not None and corpus.train_tokenizer is not None:
        raise RunError("give --tokenizer or --train-tokenizer, not both")
    if corpus.tokenizer is not None:
        try:
            return Tokenizer.load(corpus.tokenizer)
        except Exception as err:
            raise RunError(f"cannot load the tokenizer {str(corpus.tokenizer)!r}: {err}"
                           ) from None
    if corpus.train_tokenizer is not None:
        if text is None:
            raise RunError("--train-tokenizer needs a text corpus, not a token file")
        try:
            return Tokenizer.train(text, corpus.train_tokenizer)
        except ValueError as err:
            raise RunError(f"cannot train the tokenizer: {err}") from None
    return Tokenizer.byte_level()


def _fits(tokenizer: Any, config: GPTConfig) -> None:
    if tokenizer.vocab_size > config.vocab_size:
        raise RunError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                       f"vocab_size is {config.vocab_size}; pass --vocab-size "
                       f"{tokenizer.vocab_size} or a smaller tokenizer")


def _encode(tokenizer: Any, text: str) -> np.ndarray:
    if not tokenizer.merges and not tokenizer.special_tokens:  # byte level: ids are the bytes
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    return np.asarray(tokenizer.encode_ordinary(text), dtype=np.int64)


def _same_model(config: GPTConfig, model: dict, preset_name: str | None,
                checkpoint: Path) -> None:
    """On resume the model is the checkpoint's: a preset and model fields may only repeat
    it (each refusal names the flag, as ``gptspec train`` spells it)."""
    if preset_name is not None:
        try:
            described = asdict(preset(preset_name).replace(**model))
        except ConfigError as err:
            raise RunError(str(err)) from None
        saved = asdict(config)
        differ = [k for k, v in saved.items() if described.get(k) != v]
        if differ:
            raise RunError(f"--preset {preset_name} contradicts the checkpoint in {checkpoint} "
                           f"({differ[0]} = {described.get(differ[0])}, the checkpoint's "
                           f"{saved[differ[0]]}); --resume continues that model")
    for name, given in model.items():
        if given != getattr(config, name):
            raise RunError(f"--{name.replace('_', '-')} {given} contradicts the checkpoint in "
                           f"{checkpoint} ({name} = {getattr(config, name)}); --resume "
                           "continues that model")


def _writable(folder: Path) -> None:
    """Try it, as a save will: permission bits say nothing for root or a read-only mount."""
    try:
        fd, name = tempfile.mkstemp(prefix=".gptspec-write-test.", dir=folder)
    except OSError as err:
        raise RunError(f"--out: cannot write into {folder}: creating a file there failed: "
                       f"{err.strerror}") from None
    os.close(fd)
    os.unlink(name)


def _stored_path(out: Path, file: Path) -> str:
    """A token file's path as state.json keeps it: relative to the run directory when it
    lies inside it (so the directory can be moved), else absolute."""
    full = Path(file).resolve()
    try:
        return full.relative_to(Path(out).resolve()).as_posix()
    except ValueError:
        return str(full)


def _tokens_path(out: Path, stored: str) -> Path:
    """Where a stored token path is now: relative ones are inside the run directory; an
    absolute one inside a run directory since moved is looked for in the new one."""
    path = Path(stored)
    if not path.is_absolute():
        return out / path
    if not path.exists() and (out / path.name).is_file():
        return out / path.name
    return path
