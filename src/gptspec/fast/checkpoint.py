"""Checkpoints: a model's parameters in one safetensors file, its configuration in the
file's metadata.

``save_model(path, params, config)`` writes ``model.safetensors`` (``path`` is the
checkpoint directory, or the file itself if it ends in ``.safetensors``): the schema's
tensors under their schema names, and the configuration JSON under the metadata key
``gptspec_config`` (and a SHA-256 of the tensors under ``gptspec_sha256``). The file
is written under a temporary name, flushed to disk and renamed over the old one, so a
crash never leaves a half-written checkpoint.
``load_model(path) -> (config, params)`` reads it back as NumPy arrays and refuses a
missing, corrupt, truncated or mismatched file with a one-line :class:`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gptspec.atomic_files import fsync_folder, kept_mode, temporary_prefix, write_bytes
from gptspec.spec.config import ConfigError, GPTConfig, parse_json
from gptspec.spec.parameters import ParameterError, check_parameters

MODEL_FILE = "model.safetensors"
CONFIG_KEY = "gptspec_config"
DIGEST_KEY = "gptspec_sha256"  # over the tensors: catches flipped bytes the format cannot
# over the config's JSON: a config edited so that every shape still fits (norm, n_heads)
# would otherwise load as another architecture with the same weights
CONFIG_DIGEST_KEY = "gptspec_config_sha256"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or written; the message names the file."""


def model_file(path: str | os.PathLike[str]) -> Path:
    """The model file of a checkpoint directory (or the file itself)."""
    p = Path(path)
    return p if p.suffix == ".safetensors" else p / MODEL_FILE


def _to_numpy(name: str, value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor; bfloat16 has no NumPy dtype
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()  # exact: every bfloat16 is a float32
        value = value.numpy()
    array = np.ascontiguousarray(value)
    if array.dtype.kind != "f":
        raise CheckpointError(f"parameter {name!r} has dtype {array.dtype}, expected floats")
    return array


def config_digest(config_json: str) -> str:
    return hashlib.sha256(config_json.encode("utf-8")).hexdigest()


def check_config_digest(file: Path, metadata: Mapping[str, str]) -> None:
    """The file's config is the one it was saved with (files saved before the digest was
    recorded have none, and pass)."""
    recorded = metadata.get(CONFIG_DIGEST_KEY)
    if recorded is not None and recorded != config_digest(metadata.get(CONFIG_KEY, "")):
        raise CheckpointError(f"{file}: its config was changed after it was saved (the "
                              "config does not match its recorded checksum)")


def tensors_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def non_finite(arrays: Mapping[str, Any]) -> str | None:
    """The first (by name) array holding a NaN or an infinity, or None."""
    for name in sorted(arrays):
        value = arrays[name]
        if hasattr(value, "detach"):  # torch: checked where it lives, without a copy
            import torch

            if not bool(torch.isfinite(value.detach()).all()):
                return name
        elif not np.isfinite(np.asarray(value)).all():
            return name
    return None


def save_model(path: str | os.PathLike[str], params: Mapping[str, Any],
               config: GPTConfig) -> Path:
    """Write the parameters (NumPy arrays or torch tensors, schema names) and the config."""
    target, _ = _save_model(path, params, config)
    return target


def _save_model(path: str | os.PathLike[str], params: Mapping[str, Any],
                config: GPTConfig) -> tuple[Path, str]:
    """save_model, and the tensors' digest (a training checkpoint records it elsewhere)."""
    from safetensors.numpy import save

    try:
        check_parameters(dict(params), config)
    except ParameterError as err:
        raise CheckpointError(f"cannot save {model_file(path)}: {err}") from None
    arrays = {name: _to_numpy(name, value) for name, value in params.items()}
    bad = non_finite(arrays)
    if bad:
        raise CheckpointError(f"cannot save {model_file(path)}: parameter {bad!r} holds NaN "
                              "or infinite values")
    target = model_file(path)
    metadata = {CONFIG_KEY: config.to_json(), DIGEST_KEY: tensors_digest(arrays)}
    metadata[CONFIG_DIGEST_KEY] = config_digest(metadata[CONFIG_KEY])
    write_bytes(target, save(arrays, metadata=metadata), make_parents=True)
    return target, metadata[DIGEST_KEY]


def load_model(path: str | os.PathLike[str]) -> tuple[GPTConfig, dict[str, np.ndarray]]:
    """Read a checkpoint written by :func:`save_model`: its config and NumPy parameters.
    For a training checkpoint's folder, the newest complete copy a killed save left."""
    _, config, params = newest_model(path)
    return config, params


def newest_model(path: str | os.PathLike[str]
                 ) -> tuple[Path, GPTConfig, dict[str, np.ndarray]]:
    """(folder, config, params) of the newest complete checkpoint at ``path`` (see
    :func:`find_checkpoints`): the folder is where its tokenizer.json lies."""
    p = Path(path)
    if p.suffix == ".safetensors":
        return (p.parent, *_load_model_file(p))

    def read(folder: Path, settled: bool) -> tuple[Path, GPTConfig, dict[str, np.ndarray]]:
        with _pinned(folder, (MODEL_FILE,), settled) as files:
            if MODEL_FILE not in files:
                raise CheckpointError(f"no checkpoint at {path}: {folder / MODEL_FILE} not found")
            config, params, _ = _read_model(folder / MODEL_FILE, files[MODEL_FILE], path)
        return folder, config, params

    return _read_newest(p, read)


def load_generation_checkpoint(path: str | os.PathLike[str]) -> tuple[Path, GPTConfig,
                                                                      dict[str, np.ndarray], Any]:
    """(folder, config, params, tokenizer) of the newest complete checkpoint at ``path``,
    model and tokenizer.json read from the same folder even while a run saves over it.
    A missing or unreadable tokenizer raises :class:`TokenizerFileMissing`."""
    p = Path(path)

    def read(folder: Path, settled: bool) -> tuple[Path, GPTConfig, dict[str, np.ndarray], Any]:
        with _pinned(folder, (MODEL_FILE, TOKENIZER_FILE), settled) as files:
            if MODEL_FILE not in files:
                raise CheckpointError(f"no checkpoint at {path}: {folder / MODEL_FILE} not found")
            config, params, _ = _read_model(folder / MODEL_FILE, files[MODEL_FILE], path)
            if TOKENIZER_FILE not in files:
                raise TokenizerFileMissing(f"{folder} has no {TOKENIZER_FILE}")
            try:
                tokenizer = _read_tokenizer(folder / TOKENIZER_FILE, files[TOKENIZER_FILE])
            except CheckpointError as err:
                raise TokenizerFileMissing(str(err)) from None
        return folder, config, params, tokenizer

    return _read_newest(p, read)


def model_header(path: str | os.PathLike[str]
                 ) -> tuple[Path, dict[str, str], dict[str, tuple[int, ...]]]:
    """(model file, metadata, each tensor's shape) of the newest checkpoint at ``path``
    (a folder or a .safetensors file), from the file's header: no tensor is read."""
    p = Path(path)

    def header(file: Path, source: str) -> tuple[Path, dict[str, str], dict[str, tuple]]:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(source, framework="numpy") as f:
                metadata = f.metadata() or {}
                shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        except (SafetensorError, OSError, ValueError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise CheckpointError(f"{file} is not a readable safetensors file ({first})"
                                  ) from None
        check_config_digest(file, metadata)
        return file, metadata, shapes

    if p.suffix == ".safetensors":  # as model_file: another file is a folder's name
        _regular_file(p)
        return header(p, str(p))
    if p.exists() and not p.is_dir():  # a FIFO, a device, a file of another name
        raise CheckpointError(f"{p} is neither a preset nor a checkpoint (a checkpoint is a "
                              "directory or a .safetensors file)")

    def read(folder: Path, settled: bool) -> tuple[Path, dict[str, str], dict[str, tuple]]:
        with _pinned(folder, (MODEL_FILE,), settled) as files:
            if MODEL_FILE not in files:
                raise CheckpointError(f"{p} is neither a preset nor a checkpoint "
                                      f"({folder / MODEL_FILE} not found)")
            return header(folder / MODEL_FILE, files[MODEL_FILE])

    return _read_newest(p, read)


class TokenizerFileMissing(CheckpointError):
    """The model loads but its tokenizer.json is missing or unreadable."""


# --- reading while a run saves ------------------------------------------------------------------
#
# A reader (generate, info, resume) may run beside a training run that saves every step.
# Names change under it: checkpoint/ becomes .checkpoint.previous, a temporary folder
# becomes checkpoint/, the old previous goes to the trash. A folder, once complete, is
# never changed, only renamed or removed. So a reader opens the folder it chose once and
# every file it needs through that descriptor, and then reads the open files: they are
# one checkpoint's, whatever is renamed meanwhile. A file gone before it was opened means
# a save removed the folder: the reader chooses again (_Moved), a bounded number of times.


class _Moved(Exception):
    """The folder a reader chose was renamed away or removed by a save: choose again."""


READ_TRIES = 100  # each retry follows a save's rename: a run would have to save 100 times
# while one reader opens four files


def _fd_path(fd: int) -> str:
    """A path that opens the file behind ``fd`` itself, whatever its name is now."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fd}"


def _error_for(name: str) -> type[CheckpointError]:
    # the tokenizer's own error, so that a reader blames tokenizer.json, not the model
    return TokenizerFileMissing if name == TOKENIZER_FILE else CheckpointError


@contextlib.contextmanager
def _pinned(folder: Path, names: tuple[str, ...], settled: bool) -> Iterator[dict[str, str]]:
    """Open ``names`` in ``folder`` through one descriptor of the folder; yield a path to
    each opened regular file (a missing name is left out). ``settled``: the folder was
    complete when chosen, so a name missing now means a save moved it (raises _Moved)."""
    fds: dict[str, int] = {}
    try:
        try:
            folder_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except (FileNotFoundError, NotADirectoryError):
            if settled:
                raise _Moved() from None
            folder_fd = None
        except OSError as err:
            raise CheckpointError(f"cannot read {folder}: {err.strerror}") from None
        if folder_fd is not None:
            try:
                for name in names:
                    try:
                        # O_NONBLOCK: a FIFO in a file's place would block the open for ever
                        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK, dir_fd=folder_fd)
                    except FileNotFoundError:
                        if settled:
                            raise _Moved() from None
                        continue
                    except OSError as err:
                        raise _error_for(name)(f"cannot read {folder / name}: "
                                               f"{err.strerror}") from None
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        fds[name] = fd
                    else:  # a FIFO, a device, a folder: there, but no checkpoint file
                        os.close(fd)
                        raise _error_for(name)(f"{folder / name} is not a regular file")
            finally:
                os.close(folder_fd)
        yield {name: _fd_path(fd) for name, fd in fds.items()}
    finally:
        for fd in fds.values():
            os.close(fd)


def _read_newest(directory: Path, read: Callable[[Path, bool], Any]) -> Any:
    """``read(folder, settled)`` of the newest complete checkpoint at ``directory`` (see
    :func:`find_checkpoints`), chosen again when a save moves it away meanwhile; with no
    complete one, ``read(directory, False)`` says what is missing."""
    for _ in range(READ_TRIES):
        candidates = find_checkpoints(directory)
        if not candidates:
            return read(directory, False)
        try:
            return read(candidates[0], True)
        except _Moved:
            continue
        except CheckpointError as err:
            raise _with_fallback(err, candidates) from None
    raise CheckpointError(f"{directory} was replaced {READ_TRIES} times while being read; "
                          "try again")


def _with_fallback(err: CheckpointError, candidates: list[Path]) -> CheckpointError:
    """A damaged newest checkpoint is reported, not skipped (steps would be lost without
    a word); the message says where an older complete copy lies."""
    if len(candidates) < 2:
        return err
    step = _step_of(candidates[1])
    at_step = "" if step is None else f", step {step},"
    return type(err)(f"{err} (an older complete checkpoint{at_step} is in "
                           f"{candidates[1]}; put it in place of {candidates[0]} to use it)")


def _load_model_file(file: Path, path: str | os.PathLike[str] | None = None
                     ) -> tuple[GPTConfig, dict[str, np.ndarray]]:
    _regular_file(file, path)
    config, params, _ = _read_model(file, str(file), file if path is None else path)
    return config, params


def _regular_file(file: Path, path: str | os.PathLike[str] | None = None) -> None:
    """A model file named directly must be a regular file: a FIFO would block the read
    for ever, a device would be read as a model."""
    if not file.exists():
        raise CheckpointError(f"no checkpoint at {file if path is None else path}: "
                              f"{file} not found")
    if not file.is_file():
        raise CheckpointError(f"{file} is not a regular file")


def _read_model(file: Path, source: str, path: str | os.PathLike[str]
                ) -> tuple[GPTConfig, dict[str, np.ndarray], dict[str, str]]:
    """(config, params, metadata) of the model file ``file``, read from ``source`` (the
    file itself or an open descriptor's path); errors name ``file``."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(source, framework="numpy") as f:
            metadata = f.metadata() or {}
            params = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{file} is not a readable safetensors file ({message})") from None
    if CONFIG_KEY not in metadata:
        hint = ("; a transformers checkpoint converts with gptspec convert --from-hf"
                if (file.parent / "config.json").is_file() else "")
        raise CheckpointError(f"{file} has no {CONFIG_KEY!r} metadata: not a gptspec "
                              f"checkpoint{hint}")
    not_float = sorted(name for name, a in params.items() if a.dtype.kind != "f")
    if not_float:
        raise CheckpointError(f"{file}: parameter {not_float[0]!r} has dtype "
                              f"{params[not_float[0]].dtype}, expected floats")
    if DIGEST_KEY in metadata and metadata[DIGEST_KEY] != tensors_digest(params):
        raise CheckpointError(f"{file} is corrupt: its tensors do not match their checksum")
    check_config_digest(file, metadata)
    bad = non_finite(params)
    if bad:
        raise CheckpointError(f"{file}: parameter {bad!r} holds NaN or infinite values (a "
                              "diverged run); no usable model")
    try:
        config = GPTConfig.from_json(metadata[CONFIG_KEY])
        check_parameters(params, config)
    except (ConfigError, ParameterError, TypeError) as err:
        raise CheckpointError(f"{file} does not match its configuration: {err}") from None
    return config, params, metadata


# --- training checkpoints ----------------------------------------------------------------------
#
# A training checkpoint is a directory holding model.safetensors, optimizer.safetensors
# (AdamW's moments under "exp_avg.<name>" / "exp_avg_sq.<name>"), state.json (step, RNG
# states, settings, loss history) and tokenizer.json.
#
# The save protocol keeps at least one complete checkpoint on disk at every instant, so a
# kill (or two kills in a row, the second during the next run's recovery) never loses one:
#
#   1. write every file into a fresh ``.checkpoint.XXXX.tmp`` folder, state.json last (a
#      temporary folder holding state.json is complete), and flush it;
#   2. if ``checkpoint/`` is complete, move the old ``.checkpoint.previous`` to the trash
#      and rename ``checkpoint/`` to ``.checkpoint.previous``; an incomplete
#      ``checkpoint/`` goes to the trash and the previous one stays;
#   3. rename the temporary folder to ``checkpoint/``; flush the parent folder;
#   4. empty the trash (the previous checkpoint is kept until the next save).
#
# Folders are deleted by renaming them to ``.checkpoint.XXXX.trash`` first, so a kill in the
# middle of a deletion never leaves half a checkpoint under a name a reader trusts. A reader
# (:func:`find_checkpoints`) takes the complete candidate with the highest step among
# ``checkpoint/``, ``.checkpoint.previous`` and complete temporary folders;
# :func:`recover_checkpoint` (run at the start of ``train``) puts that one back in
# ``checkpoint/`` and removes every leftover temporary folder and trash.

OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
TOKENIZER_FILE = "tokenizer.json"
STATE_FORMAT = "gptspec-training-1"
TRAINING_FILES = (MODEL_FILE, OPTIMIZER_FILE, TOKENIZER_FILE, STATE_FILE)
MAX_STATE_BYTES = 64 * 2**20  # state.json holds settings, RNG states and the loss history
MAX_SETTING_CHARS = 100  # the longest setting that is a word: a device such as "cuda:7"
# What a save records to tie its four files together (checked on loading, where present):
# the optimizer file names the step and the model it was saved with, state.json names the
# optimizer file. A file taken from another checkpoint, or a step edited, is then refused.
STEP_KEY = "gptspec_step"
MODEL_DIGEST_KEY = "gptspec_model_sha256"
OPTIMIZER_DIGEST = "optimizer_sha256"
TOKENIZER_DIGEST = "tokenizer_sha256"  # of what it holds (tokenizer_files.fingerprint)
# state.json's "scaler": what torch's GradScaler.state_dict() saves (float16 training, on
# CUDA), each field checked against the tensors the scaler keeps it in
SCALER_FIELDS = ("scale", "growth_factor", "backoff_factor", "growth_interval",
                 "_growth_tracker")
FLOAT32_SMALLEST_NORMAL = 2.0**-126
FLOAT32_LARGEST = float(np.finfo(np.float32).max)
INT32_LARGEST = 2**31 - 1  # the growth tracker is an int32 tensor counting to the interval
# state.json's "data": the token file a run trains on (dtype and sha256 since issue 29)
DATA_FIELDS = ("source", "tokens", "n_tokens", "dtype", "sha256")
# str() of the dtypes open_tokens accepts: uint16 or uint32, in either byte order
TOKEN_DTYPES = ("uint16", "uint32", "<u2", "<u4", ">u2", ">u4")


def crash_point(name: str) -> None:
    """Called at each step of the save protocol; the fault-injection tests replace it
    with one that kills the process at a chosen step."""


def _previous(directory: Path) -> Path:
    """``.NAME.previous``, NAME cut short where that would pass the file system's limit."""
    return directory.parent / f"{temporary_prefix(directory, '.previous')[:-1]}.previous"


def _temporaries(directory: Path) -> list[Path]:
    """Leftover temporary and trash folders of ``directory``'s saves."""
    if not directory.parent.is_dir():
        return []
    # the shortest prefix a save's names get (long names are cut: temporary_prefix); the
    # dot after the name only where it was not cut
    prefix = temporary_prefix(directory, ".previous.XXXXXXXX.trash")
    if prefix != f".{directory.name}.":
        prefix = prefix[:-1]
    return sorted(p for p in directory.parent.iterdir()
                  if p.name.startswith(prefix) and p.name.endswith((".tmp", ".trash")))


def _discard(folder: Path) -> None:
    """Delete a folder: first renamed to a trash name (atomic), then removed."""
    import shutil

    if not folder.exists():
        return
    trash = folder
    if not folder.name.endswith(".trash"):
        named = folder.parent / folder.name.lstrip(".")
        trash = Path(tempfile.mkdtemp(prefix=temporary_prefix(named, ".trash"), suffix=".trash",
                                      dir=folder.parent))
        os.replace(folder, trash)  # an empty directory is replaced by a rename
        crash_point("renamed to trash")
    shutil.rmtree(trash, ignore_errors=True)


def _complete(folder: Path) -> bool:
    """All four files are there: a save writes state.json last, each file whole (written
    under a temporary name and renamed), so such a folder is as the save left it."""
    return folder.is_dir() and all((folder / name).is_file() for name in TRAINING_FILES)


def _step_of(folder: Path) -> int | None:
    """The step of a complete checkpoint folder, or None (incomplete, or a state.json
    that does not say: damaged)."""
    if not _complete(folder):
        return None
    try:
        if (folder / STATE_FILE).stat().st_size > MAX_STATE_BYTES:
            return None
        state = parse_json((folder / STATE_FILE).read_text(encoding="utf-8"))
        step = state["step"]
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None
    if state.get("format") != STATE_FORMAT or not isinstance(step, int) or isinstance(step, bool):
        return None
    return step


def find_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints a save of ``directory`` may have left, newest first:
    ``directory`` itself, its previous copy, and finished temporary folders (a save killed
    between its renames). Each may still fail to load (a flipped byte)."""
    target = Path(directory)
    candidates = [target, _previous(target)] + [p for p in _temporaries(target)
                                                if p.name.endswith(".tmp")]
    ranked = []
    for order, folder in enumerate(candidates):
        if _complete(folder):
            step = _step_of(folder)
            # a complete folder whose state.json does not parse is damaged, not killed:
            # it comes first, so that loading it reports the damage
            ranked.append((step is not None, -(step or 0), order, folder))
    return [folder for *_, folder in sorted(ranked)]


def recover_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """After kills: put the newest complete checkpoint back in ``directory`` and remove the
    temporary and trash folders of killed saves. Every step keeps a complete checkpoint.
    Returns ``directory``, or None if there is no checkpoint at all."""
    target = Path(directory)
    found = find_checkpoints(target)
    if found and found[0] != target:
        _install(found[0], target)
    for leftover in _temporaries(target):
        _discard(leftover)
        crash_point("removed a leftover")
    return target if found else None


def _install(complete: Path, target: Path) -> None:
    """Steps 2 and 3 of the protocol: make the complete folder ``complete`` the checkpoint,
    keeping the current one (if complete) as the previous."""
    previous = _previous(target)
    if complete == previous:  # killed between the renames: the previous is the newest
        if target.exists():
            _discard(target)
            crash_point("discarded an incomplete checkpoint")
        os.replace(previous, target)
        crash_point("restored the previous checkpoint")
        fsync_folder(target.parent)
        return
    if target.exists():
        if _complete(target):
            _discard(previous)
            crash_point("discarded the previous checkpoint")
            os.replace(target, previous)
            crash_point("moved the checkpoint aside")
        else:
            _discard(target)
            crash_point("discarded an incomplete checkpoint")
    os.replace(complete, target)
    crash_point("renamed the new checkpoint into place")
    fsync_folder(target.parent)


def save_training_checkpoint(directory: str | os.PathLike[str], config: GPTConfig,
                             params: Mapping[str, Any], optimizer: Mapping[str, Any],
                             state: dict, tokenizer: Any) -> Path:
    """Write a whole training checkpoint to ``directory``, replacing the old one so that a
    complete checkpoint exists at every instant (the protocol above)."""
    import json
    import shutil

    from safetensors.numpy import save

    from gptspec.fast.tokenizer_files import fingerprint

    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(target), suffix=".tmp",
                                dir=target.parent))
    crash_point("made the temporary folder")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide files that are 0644
        _, model_digest = _save_model(tmp, params, config)
        crash_point("wrote the model")
        arrays = {name: _to_numpy(name, value) for name, value in optimizer.items()}
        optimizer_digest = tensors_digest(arrays)
        write_bytes(tmp / OPTIMIZER_FILE, save(arrays, metadata={
            DIGEST_KEY: optimizer_digest, STEP_KEY: str(state["step"]),
            MODEL_DIGEST_KEY: model_digest}))
        crash_point("wrote the optimizer")
        tokenizer.save(tmp / TOKENIZER_FILE)
        crash_point("wrote the tokenizer")
        state = {"format": STATE_FORMAT, **state, OPTIMIZER_DIGEST: optimizer_digest,
                 TOKENIZER_DIGEST: fingerprint(tokenizer)}
        # allow_nan=False: NaN is not JSON, and no reader (this one included) would take it
        write_bytes(tmp / STATE_FILE, json.dumps(state, indent=1, allow_nan=False).encode())
        crash_point("wrote the state")
        _keep_modes(tmp, target)
        fsync_folder(tmp)
        _install(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for leftover in _temporaries(target):
        if leftover.name.endswith(".trash"):
            _discard(leftover)
    crash_point("emptied the trash")
    return target


def _keep_modes(new: Path, old: Path) -> None:
    """The permissions of the checkpoint a save replaces, on the new one (a folder made
    private stays private), as writing over a file keeps its mode."""
    try:
        os.chmod(new, stat.S_IMODE(os.stat(old).st_mode))
    except FileNotFoundError:  # the first save: the umask's
        return
    for file in new.iterdir():
        os.chmod(file, kept_mode(old / file.name))


def load_training_checkpoint(directory: str | os.PathLike[str]):
    """(config, params, optimizer tensors, state, tokenizer) of the newest complete training
    checkpoint at ``directory`` (see :func:`find_checkpoints`); a missing, corrupt or
    inconsistent one raises :class:`CheckpointError` naming the file."""
    return _read_newest(Path(directory), _load_training_folder)


def check_state(state: Any, file: Path) -> dict:
    """A state.json's content with every field training reads, of the right type."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{file} is not a {STATE_FORMAT} training state")
    known = ("format", "step", "settings", "rng", "history", "elapsed_seconds", "scaler",
             "data", OPTIMIZER_DIGEST, TOKENIZER_DIGEST)
    unknown = [str(k)[:40] for k in state if k not in known]
    if unknown:  # a field misspelt by hand would be dropped, its value never used
        raise CheckpointError(f"{file}: unknown field {unknown[0]!r} (a training state "
                              f"holds {', '.join(known[1:])})")
    expected: dict[str, type | tuple[type, ...]] = {
        "step": int, "settings": dict, "rng": dict, "history": dict}
    for key, kind in expected.items():
        if key not in state:
            raise CheckpointError(f"{file} lacks {key!r}")
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise CheckpointError(f"{file}: {key!r} has the wrong type "
                                  f"({type(state[key]).__name__})")
    if not 0 <= state["step"] < 2**63:
        raise CheckpointError(f"{file}: 'step' {state['step']} is out of range")
    for key, value in state["settings"].items():  # what TrainSettings checks, one level
        if (isinstance(value, (list, dict)) or not isinstance(key, str)
                or (isinstance(value, str) and len(value) > MAX_SETTING_CHARS)):
            raise CheckpointError(f"{file}: the setting {str(key)[:40]!r} is not a number, "
                                  "a short word or true/false")
    elapsed = state.get("elapsed_seconds", 0.0)
    if (not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool)
            or not math.isfinite(elapsed) or elapsed < 0):
        raise CheckpointError(f"{file}: 'elapsed_seconds' is not a number of seconds")
    _check_scaler(state.get("scaler"), file)
    rng = state["rng"]
    if not (isinstance(rng.get("torch"), str) and isinstance(rng.get("python"), list)
            and len(rng["python"]) == 3 and isinstance(rng["python"][1], list)):
        raise CheckpointError(f"{file}: 'rng' is not a saved RNG state")
    _check_history(state["history"], state["step"], file)
    if "data" in state:
        _check_data(state["data"], file)
    return state


def _shown(value: Any) -> str:
    """A state field's value for an error line, as JSON names it, cut short."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 40 else f"{text[:39]}…"
    if isinstance(value, str):
        return repr(value[:40]) + ("…" if len(value) > 40 else "")
    return "an object" if isinstance(value, dict) else "a list"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_scaler(scaler: Any, file: Path) -> None:
    """null (a run without loss scaling), or what torch's GradScaler.state_dict() saves,
    each field of its type and in the range the scaler's own updates keep it in. torch's
    load_state_dict takes any value: a string failed later in words of torch's own, and a
    scale of 0 (or 1e-300, 0 as a float32) made every step's loss NaN, which was then
    reported as the run diverging."""
    if scaler is None:
        return
    if not isinstance(scaler, dict):
        raise CheckpointError(f"{file}: 'scaler' is not a saved gradient scaler state (an "
                              f"object of {', '.join(SCALER_FIELDS)}, or null), got "
                              f"{_shown(scaler)}")
    unknown = [str(k)[:40] for k in scaler if k not in SCALER_FIELDS]
    if unknown:
        raise CheckpointError(f"{file}: 'scaler' holds {unknown[0]!r}, which a gradient "
                              f"scaler's state does not (it holds {', '.join(SCALER_FIELDS)})")
    for key in SCALER_FIELDS:
        if key not in scaler:
            raise CheckpointError(f"{file}: 'scaler' lacks {key!r}")

    def refuse(key: str, expected: str) -> CheckpointError:
        return CheckpointError(f"{file}: 'scaler' {key!r} must be {expected}, got "
                               f"{_shown(scaler[key])}")

    # the scale is a float32 tensor: below its smallest normal number a scaled loss
    # underflows, above its largest the scale is infinite
    scale = scaler["scale"]
    if not (_number(scale) and FLOAT32_SMALLEST_NORMAL <= scale <= FLOAT32_LARGEST):
        raise refuse("scale", "a positive normal float32 (2^-126 … 3.4e38)")
    growth = scaler["growth_factor"]
    if not (_number(growth) and 1 < growth <= FLOAT32_LARGEST):
        raise refuse("growth_factor", "a finite number above 1")
    backoff = scaler["backoff_factor"]
    if not (_number(backoff) and 0 < backoff < 1):
        raise refuse("backoff_factor", "a number between 0 and 1")
    interval = scaler["growth_interval"]
    if not (_integer(interval) and 0 < interval <= INT32_LARGEST):
        raise refuse("growth_interval", f"a positive integer (at most {INT32_LARGEST})")
    tracker = scaler["_growth_tracker"]
    if not (_integer(tracker) and 0 <= tracker < interval):
        # the steps since the scale last grew: it grows, and the count restarts, at the
        # growth interval
        raise refuse("_growth_tracker", f"an integer from 0 to growth_interval − 1 "
                                        f"({interval - 1})")


def _check_data(data: Any, file: Path) -> None:
    """The token file a run trains on, as its fresh start recorded it. A wrong value here
    was blamed on the token file ("changed since the checkpoint was written") or failed
    in NumPy's words; dtype and sha256 are absent from states written before issue 29."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: 'data' is not an object of {', '.join(DATA_FIELDS)}, "
                              f"got {_shown(data)}")
    unknown = [str(k)[:40] for k in data if k not in DATA_FIELDS]
    if unknown:  # a field misspelt by hand would be dropped, its value never used
        raise CheckpointError(f"{file}: 'data' holds {unknown[0]!r}, an unknown field (it "
                              f"holds {', '.join(DATA_FIELDS)})")
    for key in ("source", "tokens", "n_tokens"):
        if key not in data:
            raise CheckpointError(f"{file}: 'data' lacks {key!r}")

    def refuse(key: str, expected: str) -> CheckpointError:
        return CheckpointError(f"{file}: 'data' {key!r} must be {expected}, got "
                               f"{_shown(data[key])}")

    if not isinstance(data["source"], str):
        raise refuse("source", "text (what the tokens were made from)")
    tokens = data["tokens"]
    if not (isinstance(tokens, str) and tokens and "\x00" not in tokens):
        raise refuse("tokens", "the token file's path")
    if not (_integer(data["n_tokens"]) and 0 < data["n_tokens"] < 2**63):
        raise refuse("n_tokens", "a positive integer (the token file's length in ids)")
    if "dtype" in data and not (isinstance(data["dtype"], str)
                                and data["dtype"] in TOKEN_DTYPES):
        raise refuse("dtype", "uint16 or uint32 (the token ids' type)")
    digest = data.get("sha256")
    if "sha256" in data and not (isinstance(digest, str) and len(digest) == 64
                                 and all(c in "0123456789abcdef" for c in digest)):
        raise refuse("sha256", "a SHA-256 of the token ids (64 lowercase hexadecimal digits)")


def _check_history(history: dict, step: int, file: Path) -> None:
    """The loss history as training writes it: under "train" and "val", [step, loss]
    pairs of finite losses, each list's steps increasing and none past the state's step (a
    repeated or reordered step would draw a loss curve that folds back)."""
    unknown = sorted(str(k)[:40] for k in history if k not in ("train", "val"))
    if unknown:
        raise CheckpointError(f"{file}: 'history' holds {unknown[0]!r}; only 'train' and "
                              "'val' are known")
    for key in ("train", "val"):
        points = history.get(key)
        if not isinstance(points, list) or not all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
                and isinstance(p[1], (int, float))
                and not any(isinstance(v, bool) for v in p) for p in points):
            raise CheckpointError(f"{file}: 'history' lacks a list of [step, loss] under "
                                  f"{key!r}")
        previous = -1
        for at, loss in points:
            if not 0 <= at <= step:
                raise CheckpointError(f"{file}: 'history' {key!r} has step {at}, not a step "
                                      f"of this run (0 … {step})")
            if at <= previous:
                raise CheckpointError(f"{file}: 'history' {key!r} has step {at} after step "
                                      f"{previous} (steps must increase)")
            if not math.isfinite(loss):
                raise CheckpointError(f"{file}: 'history' {key!r} holds the loss {loss} at "
                                      f"step {at}; a saved loss is finite")
            previous = at


def _load_training_folder(path: Path, settled: bool = False):
    from gptspec.fast.tokenizer_files import fingerprint

    if not settled and not path.is_dir():
        raise CheckpointError(f"no training checkpoint at {path}")
    with _pinned(path, TRAINING_FILES, settled) as files:
        for name in (STATE_FILE, OPTIMIZER_FILE, TOKENIZER_FILE, MODEL_FILE):
            if name not in files:
                raise CheckpointError(f"{path} is not a training checkpoint: {name} is missing")
        state = _read_state(path / STATE_FILE, files[STATE_FILE])
        config, params, model = _read_model(path / MODEL_FILE, files[MODEL_FILE], path)
        optimizer, metadata = _read_optimizer(path / OPTIMIZER_FILE, files[OPTIMIZER_FILE])
        _check_together(path, params, model.get(DIGEST_KEY), optimizer, metadata, state)
        tokenizer = _read_tokenizer(path / TOKENIZER_FILE, files[TOKENIZER_FILE])
        recorded = state.get(TOKENIZER_DIGEST)
        if recorded is not None and recorded != fingerprint(tokenizer):
            raise CheckpointError(f"{path / TOKENIZER_FILE} is not the tokenizer "
                                  f"{path / STATE_FILE} was saved with (its checksum differs "
                                  "from the recorded one)")
    return config, params, optimizer, state, tokenizer


def _read_state(file: Path, source: str) -> dict:
    try:
        with open(source, "rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
        if len(data) > MAX_STATE_BYTES:
            raise CheckpointError(f"{file} is larger than {MAX_STATE_BYTES >> 20} MiB: not a "
                                  "training state")
        state = parse_json(data.decode("utf-8"))
    except OSError as err:
        raise CheckpointError(f"cannot read {file}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{file} is not UTF-8 text (byte {err.start})") from None
    except ValueError as err:  # parse_json's: one line
        said = str(err)
        raise CheckpointError(f"{file} is {said}" if said.startswith("not valid JSON")
                              else f"{file}: {said}") from None
    return check_state(state, file)


def _read_optimizer(file: Path, source: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(source, framework="numpy") as f:
            metadata = f.metadata() or {}
            optimizer = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{file} is not a readable safetensors file ({message})") from None
    if metadata.get(DIGEST_KEY) != tensors_digest(optimizer):
        raise CheckpointError(f"{file} is corrupt: its tensors do not match their checksum")
    return optimizer, metadata


def _check_together(path: Path, params: dict[str, np.ndarray], model_digest: str | None,
                    optimizer: dict[str, np.ndarray], metadata: dict[str, str],
                    state: dict) -> None:
    """The four files are one save's: AdamW's moments are exactly the model's parameters'
    (after a step), and what the save recorded (STEP_KEY …) agrees."""
    file = path / OPTIMIZER_FILE
    if optimizer or state["step"] > 0:
        expected = {f"{kind}.{name}": value.shape for name, value in params.items()
                    for kind in ("exp_avg", "exp_avg_sq")}
        for key in sorted(set(expected) | set(optimizer)):
            if key not in expected:
                raise CheckpointError(f"{file} does not match the model: {key!r} is not the "
                                      "moment of one of its parameters")
            if key not in optimizer or optimizer[key].shape != expected[key]:
                raise CheckpointError(f"{file} does not match the model: {key!r} is missing "
                                      "or misshapen")
    recorded = state.get(OPTIMIZER_DIGEST)
    if recorded is not None and recorded != metadata.get(DIGEST_KEY):
        raise CheckpointError(f"{file} is not the one {path / STATE_FILE} was saved with "
                              "(its checksum differs from the recorded one)")
    step = metadata.get(STEP_KEY)
    if step is not None and step != str(state["step"]):
        raise CheckpointError(f"{path / STATE_FILE} says step {state['step']}, but {file} was "
                              f"saved at step {step}")
    model = metadata.get(MODEL_DIGEST_KEY)
    if model is not None and model != (model_digest or tensors_digest(params)):
        raise CheckpointError(f"{path / MODEL_FILE} is not the model {file} was saved with "
                              "(its checksum differs from the recorded one)")


def _read_tokenizer(file: Path, source: str) -> Any:
    from gptspec.fast.tokenizer import Tokenizer

    try:
        return Tokenizer.load(source)
    except Exception as err:  # the tokenizer's own errors name the problem
        text = str(err).replace(source, str(file))
        raise CheckpointError(f"{file} cannot be loaded: {text}") from None
