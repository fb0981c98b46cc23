"""Training batches from a memory-mapped token file.

A token file is a flat array of token ids: raw ``uint16`` (nanoGPT's ``.bin``; ``uint32``
when the vocabulary does not fit in 16 bits) or a NumPy ``.npy`` of either dtype. It is
memory-mapped, so a corpus larger than memory trains the same way. A batch is B windows
of T + 1 consecutive tokens at random offsets: inputs are the first T, targets the last T.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import torch

from gptspec.atomic_files import write_bytes

TOKEN_FILE_SUFFIXES = (".bin", ".npy")  # token ids, memory-mapped; any other file is text


class DataError(ValueError):
    """A token file that cannot be trained on (or written); the message names the file and
    the problem."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every token id."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def write_tokens(path: str | os.PathLike[str], ids, vocab_size: int) -> Path:
    """Write token ids as a raw array (dtype from ``vocab_size``), atomically."""
    target = Path(path)
    array = np.asarray(ids, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        raise DataError(f"token ids must lie in [0, {vocab_size}) to be written to {target}")
    try:
        write_bytes(target, array.astype(token_dtype(vocab_size)).tobytes(), make_parents=True)
    except OSError as err:  # the OS's words name no file (the write went to a temporary
        # one, removed since): the target is named here
        full = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up"}
        why = err.strerror or str(err) or type(err).__name__
        if err.errno in full:
            why = f"{full[err.errno]} ({why})"
        raise DataError(f"cannot write the token file {target}: {why}") from None
    return target


def open_tokens(path: str | os.PathLike[str], vocab_size: int,
                dtype: str | None = None) -> np.ndarray:
    """Memory-map a token file (``.npy``, or raw ``uint16``/``uint32``) and check that its
    ids fit the vocabulary."""
    file = Path(path)
    if not file.is_file():  # a FIFO or a folder there was called "not found"
        raise DataError(f"token file {file} " + ("is not a regular file" if file.exists()
                                                 else "not found"))
    try:
        if file.suffix == ".npy":
            with open(file, "rb") as head:  # np.load reads anything else as a pickle
                if head.read(6) != b"\x93NUMPY":
                    raise DataError(f"token file {file} is not a NumPy .npy file (it lacks "
                                    "the format's header); give a .npy array or a raw .bin")
            data = np.load(file, mmap_mode="r", allow_pickle=False)
        else:
            dt = np.dtype(dtype) if dtype else token_dtype(vocab_size)
            size = file.stat().st_size
            if size % dt.itemsize:  # cut short, or written for another vocabulary: not said
                raise DataError(f"token file {file} holds {size:,} bytes, not a whole number "
                                f"of {dt.itemsize}-byte ids ({dt.name})")
            data = (np.memmap(file, dtype=dt, mode="r") if file.stat().st_size
                    else np.zeros(0, dt))
    except (ValueError, OSError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"token file {file} cannot be read: {err}") from None
    # either byte order: a big-endian file's ids read the same through NumPy
    if data.ndim != 1 or data.dtype.kind != "u" or data.dtype.itemsize not in (2, 4):
        raise DataError(f"token file {file} must hold a flat uint16 or uint32 array, got "
                        f"{data.dtype} of shape {data.shape}")
    if data.size and int(data.max()) >= vocab_size:
        raise DataError(f"token file {file} holds id {int(data.max())}, outside the model's "
                        f"vocabulary of {vocab_size}")
    return data


def tokens_sha256(data: np.ndarray) -> str:
    """SHA-256 of a token array's bytes, read in slices (the array may be a memory map of
    gigabytes): recorded at a run's start, so that a resume notices a token file whose
    ids changed but not its length."""
    digest = hashlib.sha256()
    step = 1 << 24
    for start in range(0, len(data), step):
        digest.update(np.ascontiguousarray(data[start:start + step]).tobytes())
    return digest.hexdigest()


class TokenData:
    """The train and validation token arrays, and the batches drawn from them."""

    def __init__(self, train: np.ndarray, val: np.ndarray, block_size: int) -> None:
        for name, data in (("training", train), ("validation", val)):
            if len(data) < block_size + 1:
                raise DataError(f"the {name} split has {len(data)} tokens; a batch needs at "
                                f"least block_size + 1 = {block_size + 1}")
        self.train, self.val, self.block_size = train, val, block_size

    @classmethod
    def split(cls, data: np.ndarray, block_size: int, val_fraction: float = 0.1) -> TokenData:
        """The first (1 − val_fraction) of the tokens for training, the rest for validation."""
        n_val = max(int(len(data) * val_fraction), block_size + 1)
        if len(data) - n_val < block_size + 1:
            raise DataError(f"the corpus has {len(data)} tokens: too short for a training and a "
                            f"validation split of at least {block_size + 1} tokens each")
        return cls(data[:-n_val], data[-n_val:], block_size)

    def batch(self, split: str, batch_size: int, rng: np.random.Generator,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (B, T) int64: B windows at offsets drawn from ``rng``."""
        data = self.train if split == "train" else self.val
        T = self.block_size
        starts = rng.integers(0, len(data) - T, size=batch_size)
        windows = np.stack([np.asarray(data[s: s + T + 1], dtype=np.int64) for s in starts])
        x = torch.from_numpy(windows[:, :-1].copy())
        y = torch.from_numpy(windows[:, 1:].copy())
        if torch.device(device).type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device,
                                                                                non_blocking=True)
        return x, y
