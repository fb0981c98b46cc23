"""Checkpoints: a model's parameters in one safetensors file, its configuration in the
file's metadata.

``save_model(path, config, params)`` writes ``model.safetensors`` (``path`` is the
checkpoint directory, or the file itself if it ends in ``.safetensors``): the schema's
tensors under their schema names, and the configuration JSON under the metadata key
``gptspec_config`` (and a SHA-256 of the tensors under ``gptspec_sha256``). The file
is written under a temporary name, flushed to disk and renamed over the old one, so a
crash never leaves a half-written checkpoint.
``load_model(path) -> (config, params)`` reads it back as NumPy arrays and refuses a
missing, corrupt, truncated or mismatched file with a one-line :class:`CheckpointError`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gptspec.atomic_files import fsync_folder, write_bytes
from gptspec.spec.config import ConfigError, GPTConfig
from gptspec.spec.parameters import ParameterError, check_parameters

MODEL_FILE = "model.safetensors"
CONFIG_KEY = "gptspec_config"
DIGEST_KEY = "gptspec_sha256"  # over the tensors: catches flipped bytes the format cannot


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


def tensors_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def save_model(path: str | os.PathLike[str], config: GPTConfig,
               params: Mapping[str, Any]) -> Path:
    """Write the parameters (NumPy arrays or torch tensors, schema names) and the config."""
    from safetensors.numpy import save

    try:
        check_parameters(config, dict(params))
    except ParameterError as err:
        raise CheckpointError(f"cannot save {model_file(path)}: {err}") from None
    arrays = {name: _to_numpy(name, value) for name, value in params.items()}
    target = model_file(path)
    metadata = {CONFIG_KEY: config.to_json(), DIGEST_KEY: tensors_digest(arrays)}
    write_bytes(target, save(arrays, metadata=metadata), make_parents=True)
    return target


def load_model(path: str | os.PathLike[str]) -> tuple[GPTConfig, dict[str, np.ndarray]]:
    """Read a checkpoint written by :func:`save_model`: its config and NumPy parameters."""
    from safetensors import SafetensorError, safe_open

    file = model_file(path)
    if not file.is_file():
        raise CheckpointError(f"no checkpoint at {path}: {file} not found")
    try:
        with safe_open(str(file), framework="numpy") as f:
            metadata = f.metadata() or {}
            params = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{file} is not a readable safetensors file ({message})") from None
    if CONFIG_KEY not in metadata:
        raise CheckpointError(f"{file} has no {CONFIG_KEY!r} metadata: not a gptspec checkpoint")
    not_float = sorted(name for name, a in params.items() if a.dtype.kind != "f")
    if not_float:
        raise CheckpointError(f"{file}: parameter {not_float[0]!r} has dtype "
                              f"{params[not_float[0]].dtype}, expected floats")
    if DIGEST_KEY in metadata and metadata[DIGEST_KEY] != tensors_digest(params):
        raise CheckpointError(f"{file} is corrupt: its tensors do not match their checksum")
    try:
        config = GPTConfig.from_json(metadata[CONFIG_KEY])
        check_parameters(config, params)
    except (ConfigError, ParameterError, TypeError) as err:
        raise CheckpointError(f"{file} does not match its configuration: {err}") from None
    return config, params


# --- training checkpoints ----------------------------------------------------------------------
#
# A training checkpoint is a directory holding model.safetensors, optimizer.safetensors
# (AdamW's moments under "exp_avg.<name>" / "exp_avg_sq.<name>"), state.json (step, RNG
# states, settings, loss history) and tokenizer.json. The files are written into a fresh
# temporary directory, each fsynced, and the directory is then renamed into place; the
# previous checkpoint is moved aside first and deleted only after the rename, so a kill at
# any moment leaves one whole checkpoint (``load_training_checkpoint`` falls back to the
# moved-aside one).

OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
TOKENIZER_FILE = "tokenizer.json"
STATE_FORMAT = "gptspec-training-1"


def _previous(directory: Path) -> Path:
    return directory.parent / f".{directory.name}.previous"


def save_training_checkpoint(directory: str | os.PathLike[str], config: GPTConfig,
                             params: Mapping[str, Any], optimizer: Mapping[str, Any],
                             state: dict, tokenizer: Any) -> Path:
    """Write a whole training checkpoint to ``directory``, replacing the old one atomically."""
    import json
    import shutil

    from safetensors.numpy import save

    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        save_model(tmp, config, params)
        arrays = {name: _to_numpy(name, value) for name, value in optimizer.items()}
        write_bytes(tmp / OPTIMIZER_FILE,
                           save(arrays, metadata={DIGEST_KEY: tensors_digest(arrays)}))
        tokenizer.save(tmp / TOKENIZER_FILE)
        state = {"format": STATE_FORMAT, **state}
        write_bytes(tmp / STATE_FILE, json.dumps(state, indent=1).encode())
        fsync_folder(tmp)
        previous = _previous(target)
        if previous.exists():
            shutil.rmtree(previous)
        if target.exists():
            os.replace(target, previous)
        os.replace(tmp, target)
        fsync_folder(target.parent)
        shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def load_training_checkpoint(directory: str | os.PathLike[str]):
    """(config, params, optimizer tensors, state, tokenizer) of a training checkpoint; a
    missing, corrupt or inconsistent one raises :class:`CheckpointError` naming the file."""
    import json

    from safetensors import SafetensorError, safe_open

    from gptspec.fast.tokenizer import Tokenizer

    path = Path(directory)
    if not (path / STATE_FILE).is_file() and (_previous(path) / STATE_FILE).is_file():
        path = _previous(path)  # killed between the two renames: the previous one is whole
    if not path.is_dir():
        raise CheckpointError(f"no training checkpoint at {directory}")
    for name in (STATE_FILE, OPTIMIZER_FILE, TOKENIZER_FILE, MODEL_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"{path} is not a training checkpoint: {name} is missing")
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path / STATE_FILE} is not valid JSON ({err})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path / STATE_FILE} is not a {STATE_FORMAT} training state")
    config, params = load_model(path)
    file = path / OPTIMIZER_FILE
    try:
        with safe_open(str(file), framework="numpy") as f:
            metadata = f.metadata() or {}
            optimizer = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{file} is not a readable safetensors file ({message})") from None
    if metadata.get(DIGEST_KEY) != tensors_digest(optimizer):
        raise CheckpointError(f"{file} is corrupt: its tensors do not match their checksum")
    for name, value in params.items():
        for key in (f"exp_avg.{name}", f"exp_avg_sq.{name}"):
            if key not in optimizer or optimizer[key].shape != value.shape:
                raise CheckpointError(f"{file} does not match the model: {key!r} is missing "
                                      "or misshapen")
    try:
        tokenizer = Tokenizer.load(path / TOKENIZER_FILE)
    except Exception as err:  # the tokenizer's own errors name the problem
        raise CheckpointError(f"{path / TOKENIZER_FILE} cannot be loaded: {err}") from None
    return config, params, optimizer, state, tokenizer
