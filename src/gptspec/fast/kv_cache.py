"""A preallocated key/value cache for incremental decoding.

The KV-cache identity: attention of the token at position t over the cached keys and
values of positions 0 … t equals row t of full causal attention, so decoding through a
cache gives the full forward's logits at one row per step instead of T. Each sequence b
has its own length ``lengths[b]`` (valid cached positions); its next token gets position
``lengths[b]`` and is written into that slot. Prompts of different lengths are fed
right-padded, ``lengths`` saying how many new tokens are real, so a prompt gives the
same logits alone and inside a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gptspec.spec.config import GPTConfig

Tensor = torch.Tensor


@dataclass
class Step:
    """Where one forward call's new tokens go; computed once, shared by every layer."""

    positions: Tensor  # (B, T_new) position of each new token (clamped to n_ctx−1 for padding)
    mask: Tensor  # (B, 1, T_new, S) True where new token i may attend to cached slot j
    n_keys: int  # S: attention reads slots 0 … S−1 (an upper bound of every valid length)
    start: int | None  # all sequences write T_new tokens from this slot (the fast path)
    rows: Tensor | None  # otherwise: (B, T_new) batch index and slot of every new token
    slots: Tensor | None
    advance: Tensor  # (B,) how far each sequence's length moves

    @property
    def causal(self) -> bool:
        """Every sequence starts empty and all new tokens are real: the mask is exactly the
        causal one, which SDPA can apply itself (its fastest kernels take no mask)."""
        return self.start == 0

    @property
    def attends_all(self) -> bool:
        """One new token per sequence, all at position ``start`` = S−1: every slot is
        visible to it, so attention needs no mask (the common decoding step)."""
        return self.start is not None and self.positions.shape[1] == 1 \
            and self.n_keys == self.start + 1


class KVCache:
    """Per layer keys and values of shape (B, h, max_len, d_k), preallocated, and the
    number of valid positions of each sequence (``lengths``, shape (B,)).

    ``k[layer]`` and ``v[layer]`` are the layer's cache; ``max_len`` defaults to n_ctx
    (a smaller one saves memory when generation is known to stop earlier).

    Padding tokens are written too, so that no step needs a data-dependent index (a
    device sync on CUDA): at their own slot when it lies past the sequence's new length
    (never attended before a real token overwrites it) or, past the end, into one scratch
    slot behind the ``max_len`` visible ones (never attended at all)."""

    def __init__(
        self,
        config: GPTConfig,
        batch_size: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | str = torch.float32,
        max_len: int | None = None,
    ) -> None:
        from gptspec.fast.model import resolve_dtype  # model imports this module

        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"KVCache batch_size must be a positive integer, got {batch_size!r}")
        max_len = config.n_ctx if max_len is None else max_len
        if not 0 < max_len <= config.n_ctx:
            raise ValueError(f"KVCache max_len must lie in [1, n_ctx={config.n_ctx}], "
                             f"got {max_len}")
        self.config = config
        self.batch_size = batch_size
        self.max_len = max_len
        shape = (config.n_layers, batch_size, config.n_heads, max_len + 1,
                 config.d_attn // config.n_heads)
        self._k = torch.zeros(shape, device=device, dtype=resolve_dtype(dtype))
        self._v = torch.zeros_like(self._k)
        self.k = self._k[:, :, :, :max_len]  # views without the scratch slot
        self.v = self._v[:, :, :, :max_len]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.k.device)
        self._uniform: int | None = 0  # the common length while all sequences share one
        self._bound = 0  # an upper bound of max(lengths), known without reading the device

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    def reset(self) -> None:
        """Forget every sequence (the storage is kept)."""
        self.lengths.zero_()
        self._uniform = 0
        self._bound = 0

    def plan(self, T_new: int, lengths: Tensor | None = None) -> Step:
        """Positions, write slots and attention mask of T_new new tokens per sequence, of
        which ``lengths[b]`` are real (all of them when ``lengths`` is None)."""
        B, dev = self.batch_size, self.device
        offsets = torch.arange(T_new, device=dev)
        if lengths is None:
            advance = torch.full((B,), T_new, dtype=torch.long, device=dev)
        else:
            advance = torch.as_tensor(lengths, device=dev)
            if advance.shape != (B,) or advance.dtype.is_floating_point \
                    or advance.dtype == torch.bool:
                raise ValueError(f"lengths must be an integer tensor of shape ({B},), "
                                 f"got {tuple(advance.shape)} {advance.dtype}")
            advance = advance.long()
            if bool(((advance < 0) | (advance > T_new)).any()):
                raise ValueError(f"lengths must lie in [0, {T_new}] (the new tokens per sequence), "
                                 f"got {advance.tolist()}")
        new_lengths = self.lengths + advance
        if bool((new_lengths > self.max_len).any()):
            b = int(torch.argmax(new_lengths))
            raise ValueError(f"sequence {b} would reach length {int(new_lengths[b])}, beyond the "
                             f"cache's {self.max_len} positions (n_ctx={self.config.n_ctx})")
        positions = self.lengths[:, None] + offsets  # (B, T_new)
        n_keys = min(self._bound + T_new, self.max_len)
        keys = torch.arange(n_keys, device=dev)
        mask = (keys <= positions[:, :, None]).unsqueeze(1)  # (B, 1, T_new, S)
        if lengths is None and self._uniform is not None:
            return Step(positions.clamp(max=self.config.n_ctx - 1), mask, n_keys, self._uniform,
                        None, None, advance)
        rows = torch.arange(B, device=dev)[:, None].expand(B, T_new)
        slots = positions.clamp(max=self.max_len)  # padding past the end: the scratch slot
        # the embedding of padding past the end: any row will do, its logits are unused
        positions = positions.clamp(max=self.config.n_ctx - 1)
        return Step(positions, mask, n_keys, None, rows, slots, advance)

    def write(self, layer: int, K: Tensor, V: Tensor, step: Step) -> tuple[Tensor, Tensor]:
        """Store the new keys and values (B, h, T_new, d_k) of one layer; return the layer's
        keys and values of slots 0 … S−1."""
        if step.start is not None:
            return self._write_from(layer, K, V, step.start, step.n_keys)
        assert step.rows is not None and step.slots is not None
        k, v = self._k[layer], self._v[layer]
        # advanced indices on axes 0 and 2: the indexed shape is (B, T_new, h, d_k)
        k[step.rows, :, step.slots] = K.transpose(1, 2)
        v[step.rows, :, step.slots] = V.transpose(1, 2)
        return k[:, :, : step.n_keys], v[:, :, : step.n_keys]

    def _write_from(self, layer: int, K: Tensor, V: Tensor, start: int,
                    n_keys: int) -> tuple[Tensor, Tensor]:
        """Every sequence's new tokens into slots start, start + 1, …; slots 0 … n_keys−1."""
        k, v = self._k[layer], self._v[layer]
        T_new = K.shape[-2]
        k[:, :, start : start + T_new] = K
        v[:, :, start : start + T_new] = V
        return k[:, :, :n_keys], v[:, :, :n_keys]

    # --- the common decoding step: one new token per sequence, all at one length ----------

    @property
    def uniform_length(self) -> int | None:
        """The length every sequence has, if they all have the same one (else None)."""
        return self._uniform

    def append(self, layer: int, K: Tensor, V: Tensor) -> tuple[Tensor, Tensor]:
        """``write`` for one new token per sequence at slot ``uniform_length`` (K, V of
        shape (B, h, 1, d_k)), without a Step: return the layer's slots 0 … that one."""
        t = self._uniform
        assert t is not None and t < self.max_len and K.shape[-2] == 1
        return self._write_from(layer, K, V, t, t + 1)

    def appended(self) -> None:
        """``advance`` after every layer has ``append``-ed its token."""
        assert self._uniform is not None
        self.lengths += 1
        self._uniform += 1
        self._bound = min(self._bound + 1, self.max_len)

    def advance(self, step: Step) -> None:
        """Move every sequence's length past its real new tokens (after all layers wrote)."""
        self.lengths += step.advance
        T_new = step.positions.shape[1]
        if step.start is not None:
            self._uniform = step.start + T_new
        else:
            self._uniform = None
        self._bound = min(self._bound + T_new, self.max_len)
