"""A preallocated key/value cache for incremental decoding, and the position plan.

The KV-cache identity: attention of the token at position t over the cached keys and
values of positions 0 … t equals row t of full causal attention, so decoding through a
cache gives the full forward's logits at one row per step instead of T. Sequence b's
next token gets position ``lengths[b]`` and is written into that slot; prompts of
different lengths are fed right-padded, ``lengths`` saying how many new tokens are real.
A ``Plan`` says where one forward call's tokens go: ``Plan()`` the whole sequence without
a cache, ``KVCache.plan`` the cached steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gptspec.spec.config import GPTConfig

Tensor = torch.Tensor


@dataclass(frozen=True)
class Plan:
    """Where one forward call's T new tokens go, computed once and read by every layer.
    ``Plan()``: positions 0 … T−1, no cache, the causal mask (the whole sequence)."""

    start: int = 0  # tokens at positions and cache slots start … start+T−1, unless
    positions: Tensor | None = None  # (B, T) each token's own (padding: clamped to n_ctx−1)
    causal: bool = True  # SDPA applies the causal mask itself; else ``mask``
    mask: Tensor | None = None  # (B, 1, T, S) True where token i may see slot j; neither
    # causal nor a mask: every slot is visible (one new token after the others)
    cache: KVCache | None = None
    n_keys: int = 0  # S: attention reads the cache's slots 0 … S−1
    rows: Tensor | None = None  # (B, T) batch index and cache slot of every token
    slots: Tensor | None = None
    advance: Tensor | None = None  # (B,) real new tokens of each sequence; None: all T
    last: Tensor | None = None  # (B,) row of each sequence's last real token; None: T−1


WHOLE_SEQUENCE = Plan()


class KVCache:
    """Per layer keys and values ``k[layer]``, ``v[layer]`` of shape (B, h, max_len, d_k),
    preallocated, and the number of valid positions of each sequence (``lengths``, (B,));
    ``max_len`` defaults to n_ctx (less saves memory where generation stops earlier).

    Padding tokens are written too, so that no step needs a data-dependent index (a
    device sync on CUDA): at their own slot when it lies past the sequence's new length
    (never attended before a real token overwrites it) or, past the end, into one scratch
    slot behind the ``max_len`` visible ones (never attended at all)."""

    def __init__(self, config: GPTConfig, batch_size: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype | str = torch.float32, max_len: int | None = None) -> None:
        from gptspec.fast.model import resolve_dtype  # model imports this module

        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"KVCache batch_size must be a positive integer, got {batch_size!r}")
        max_len = config.n_ctx if max_len is None else max_len
        if not 0 < max_len <= config.n_ctx:
            raise ValueError(f"KVCache max_len must lie in [1, n_ctx={config.n_ctx}], got {max_len}")
        self.config = config
        self.batch_size = batch_size
        self.max_len = max_len
        shape = (config.n_layers, batch_size, config.n_heads, max_len + 1,
                 config.d_attn // config.n_heads)
        self._k = torch.zeros(shape, device=device, dtype=resolve_dtype(dtype))
        self._v = torch.zeros_like(self._k)
        self.k = self._k[:, :, :, :max_len]  # views without the scratch slot
        self.v = self._v[:, :, :, :max_len]
        self.device, self.dtype = self.k.device, self.k.dtype
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        # the length of every sequence while they all have the same one (else None), and
        # an upper bound of max(lengths): both known without reading the device
        self.uniform_length: int | None = 0
        self._bound = 0

    def reset(self) -> None:
        """Forget every sequence (the storage is kept)."""
        self.lengths.zero_()
        self.uniform_length = 0
        self._bound = 0

    def plan(self, T_new: int, lengths: Tensor | None = None) -> Plan:
        """Positions, write slots and attention mask of T_new new tokens per sequence, of
        which ``lengths[b]`` are real (all of them when ``lengths`` is None). While every
        sequence has one length and all tokens are real, it reads nothing from the device."""
        t, B = self.uniform_length, self.batch_size
        if lengths is None and t is not None:
            if t + T_new > self.max_len:
                raise self._too_long(0, t + T_new)
            # no mask: from slot 0 SDPA's causal one, or one new token that sees every slot
            mask = None if t == 0 or T_new == 1 else \
                _mask(t + T_new, torch.arange(t, t + T_new, device=self.device).expand(B, T_new))
            return Plan(t, causal=t == 0, mask=mask, cache=self, n_keys=t + T_new)
        if lengths is None:
            advance = torch.full((B,), T_new, dtype=torch.long, device=self.device)
        else:
            advance = torch.as_tensor(lengths, device=self.device)
            if advance.shape != (B,) or advance.dtype.is_floating_point \
                    or advance.dtype == torch.bool:
                raise ValueError(f"lengths must be an integer tensor of shape ({B},), "
                                 f"got {tuple(advance.shape)} {advance.dtype}")
            advance = advance.long()
            if bool(((advance < 0) | (advance > T_new)).any()):
                raise ValueError(f"lengths must lie in [0, {T_new}] (the new tokens per "
                                 f"sequence), got {advance.tolist()}")
        new_lengths = self.lengths + advance
        if bool((new_lengths > self.max_len).any()):
            b = int(torch.argmax(new_lengths))
            raise self._too_long(b, int(new_lengths[b]))
        return self._on_device(T_new, advance)

    def static_plan(self) -> Plan:
        """One new token per sequence, planned on the device alone: its position read from
        ``lengths``, attention over all ``max_len`` slots under the mask. No host value in it
        changes from step to step, so a CUDA graph can capture the step and replay it. A
        sequence already at ``max_len`` writes into the scratch slot (the caller stops it)."""
        # the host's view settles at once (lengths unknown, any slot possibly written), so
        # a step that torch.compile traced needs no new trace as the lengths grow
        self.uniform_length, self._bound = None, self.max_len
        return self._on_device(1, torch.ones(self.batch_size, dtype=torch.long,
                                             device=self.device))

    def _on_device(self, T_new: int, advance: Tensor) -> Plan:
        """The plan of sequences whose lengths only the device knows: ``advance`` (B,) real
        new tokens each, every position, slot and mask computed from ``lengths``."""
        B, dev = self.batch_size, self.device
        positions = self.lengths[:, None] + torch.arange(T_new, device=dev)  # (B, T_new)
        n_keys = min(self._bound + T_new, self.max_len)
        # padding past the end: position n_ctx−1 (any row will do, its logits are unused)
        # and the scratch slot; ``last``: the last real token's row (0 where there is none,
        # so with one new token the only row: no gather)
        last = None if T_new == 1 else (advance - 1).clamp(min=0)
        return Plan(0, positions.clamp(max=self.config.n_ctx - 1), False,
                    _mask(n_keys, positions), self, n_keys,
                    torch.arange(B, device=dev)[:, None].expand(B, T_new),
                    positions.clamp(max=self.max_len), advance, last)

    def _too_long(self, b: int, length: int) -> ValueError:
        return ValueError(f"sequence {b} would reach length {length}, beyond the cache's "
                          f"{self.max_len} positions (n_ctx={self.config.n_ctx})")

    def write(self, layer: int, K: Tensor, V: Tensor, plan: Plan) -> tuple[Tensor, Tensor]:
        """Store the new keys and values (B, h, T_new, d_k) of one layer; return the layer's
        keys and values of slots 0 … S−1."""
        k, v = self._k[layer], self._v[layer]
        if plan.rows is None:  # every sequence from slot start on
            k[:, :, plan.start : plan.start + K.shape[-2]] = K
            v[:, :, plan.start : plan.start + V.shape[-2]] = V
        else:  # advanced indices on axes 0 and 2: the indexed shape is (B, T_new, h, d_k)
            k[plan.rows, :, plan.slots] = K.transpose(1, 2)
            v[plan.rows, :, plan.slots] = V.transpose(1, 2)
        return k[:, :, : plan.n_keys], v[:, :, : plan.n_keys]

    def advance(self, plan: Plan, T_new: int) -> None:
        """Move every sequence's length past its real new tokens (after all layers wrote)."""
        self.lengths += T_new if plan.advance is None else plan.advance
        self.uniform_length = plan.start + T_new if plan.rows is None else None
        self._bound = min(self._bound + T_new, self.max_len)


def _mask(n_keys: int, positions: Tensor) -> Tensor:
    """(B, 1, T_new, n_keys): the new token at ``positions[b, i]`` may see slot j ≤ it."""
    return (torch.arange(n_keys, device=positions.device) <= positions[:, :, None]).unsqueeze(1)
