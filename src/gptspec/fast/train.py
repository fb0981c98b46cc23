"""Training with torch autograd: AdamW, clipping, the learning-rate schedule, gradient
accumulation, mixed precision on CUDA, validation, checkpoints and exact resumption.

The optimizer, clipping and schedule are the spec's (``gptspec.spec.optimizer``; the
fused AdamW of ``gptspec.fast.optimizer``, the schedule ``reference.lr_schedule`` itself).
On the CPU the run is deterministic: the same seed gives bit-identical losses, and a run
resumed from a checkpoint continues bit-identically, on one process or several, because
the checkpoint holds every piece of state the next step reads (parameters, AdamW moments,
step, torch's and Python's RNG states) and the batches are a function of (seed, rank,
step) alone (:func:`batch_generator`), so no process has sampler state to lose.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import math
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gptspec.atomic_files import replacing
from gptspec.fast import cpu_gelu, ops
from gptspec.fast.checkpoint import (
    STATE_FILE,
    CheckpointError,
    load_training_checkpoint,
    save_training_checkpoint,
)
from gptspec.fast.data import TokenData
from gptspec.fast.model import GPT
from gptspec.fast.optimizer import AdamW
from gptspec.reference.optimizer import lr_schedule

# The batches of (seed, rank, step): the rule is the spec's (train_loop), imported so that the
# trainer and the judge draw the same batches.
from gptspec.reference.training import TrainLoopSettings, batch_generator
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

Batch = tuple[torch.Tensor, torch.Tensor]


class TrainingDiverged(RuntimeError):
    """The loss, or the weights, stopped being finite numbers."""


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM (what batch systems and ``docker stop`` send) or SIGHUP (a closed
    terminal): each saves the checkpoint and stops, like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class OutputLost(Interrupted):
    """The progress log could not be written (standard output's reader went away, or its
    disk is full): the run stops as after Ctrl-C, checkpoint saved, rather than losing
    the steps since the last one. ``error`` is the OSError."""

    def __init__(self, error: OSError) -> None:
        super().__init__(signal.SIGPIPE)
        self.error = error


_held: dict[str, Any] = {"depth": 0, "signal": None}  # see stop_on_signals


@contextlib.contextmanager
def signals_held():
    """A stretch of work a stopping signal must not cut short (a checkpoint save, the loss
    curve): a stopping signal (SIGINT, SIGTERM, SIGHUP) that arrives meanwhile is raised as
    it ends."""
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
        if _held["depth"] == 0 and _held["signal"] is not None:
            signum, _held["signal"] = _held["signal"], None
            raise Interrupted(signum)


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT, SIGTERM and SIGHUP (the terminal or SSH session closed) raise
    :class:`Interrupted`, which the training loop handles like Ctrl-C (save, then stop);
    one that arrives inside :func:`signals_held` waits for its end. Off the main thread
    (no handlers there) a no-op. A signal inherited as ignored (SIGINT of a job a shell
    started in the background, SIGHUP under nohup) stays ignored."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if _held["depth"]:
            _held["signal"] = signum
        else:
            raise Interrupted(signum)

    stops = (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM))
    old = {sig: signal.signal(sig, handler) for sig in stops
           if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@dataclass
class TrainSettings:
    batch_size: int = 12  # sequences per micro-batch (per process under DDP)
    max_steps: int = 2000
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    decay_steps: int = 0  # 0: decay until max_steps
    weight_decay: float = 0.1  # on matrices only (see the adamw_step entry)
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0: no clipping
    grad_accum: int = 1  # micro-batches per optimizer step
    eval_interval: int = 250
    eval_batches: int = 20
    checkpoint_interval: int = 0  # 0: at every evaluation
    seed: int = 1337
    device: str = "cpu"
    precision: str = "auto"  # auto | float32 | bfloat16 | float16 (the last two: CUDA autocast,
    # refused on the CPU)
    compile: bool = False  # torch.compile the forward and the loss together (one process)

    def __post_init__(self) -> None:
        positive = ("batch_size", "max_steps", "grad_accum", "eval_interval", "eval_batches")
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"setting {name!r} must be a positive integer, got "
                                 f"{getattr(self, name)!r}")
        for name in ("warmup_steps", "decay_steps", "checkpoint_interval"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"setting {name!r} must not be negative")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip", "eps", "beta1", "beta2"):
            value = getattr(self, name)  # NaN passes every comparison below: refused here
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value) or value < 0):
                raise ValueError(f"setting {name!r} must be a finite number ≥ 0, got "
                                 f"{repr(value)[:40]}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"need 0 < lr and 0 ≤ min_lr ≤ lr, got lr={self.lr}, "
                             f"min_lr={self.min_lr}")
        if not (self.beta1 < 1 and self.beta2 < 1):
            raise ValueError(f"settings 'beta1' and 'beta2' must be below 1, got "
                             f"{self.beta1}, {self.beta2}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"setting 'seed' must be an integer in [0, 2^63), got {self.seed!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"setting 'compile' must be true or false, got {self.compile!r}")
        if self.precision not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"setting 'precision' must be auto, float32, bfloat16 or float16, "
                             f"got {self.precision!r}")
        if (self.precision in ("bfloat16", "float16") and isinstance(self.device, str)
                and self.device.partition(":")[0] == "cpu"):
            # autocast_dtype has none on the CPU: the run would train in float32 while its
            # state.json said otherwise
            raise ValueError(f"setting 'precision' {self.precision} is mixed precision on "
                             f"CUDA; on the CPU training runs in float32 (precision float32 "
                             f"or auto, or device cuda)")

    def learning_rate(self, step: int) -> float:
        decay = self.decay_steps or self.max_steps
        return lr_schedule(step, self.lr, self.min_lr, min(self.warmup_steps, decay),
                           max(decay, self.warmup_steps + 1))

    @classmethod
    def from_dict(cls, data: dict) -> TrainSettings:
        known = [f.name for f in fields(cls)]
        unknown = [str(k)[:40] for k in data if k not in known]
        if unknown:  # dropped silently, a setting the file meant would not be the one used
            raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown[:5]))} (the settings are "
                             f"{', '.join(known)})")
        return cls(**data)


def mean_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of (B, T, V) logits, in float32 (float64 for float64)."""
    if logits.dtype != torch.float64:
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def autocast_dtype(settings: TrainSettings) -> torch.dtype | None:
    """The autocast dtype: none on the CPU (float32 throughout); on CUDA bfloat16 where
    the device has it, else float16 (with loss scaling)."""
    if torch.device(settings.device).type != "cuda" or settings.precision == "float32":
        return None
    if settings.precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if settings.precision == "bfloat16" else torch.float16


def make_optimizer(model: GPT, settings: TrainSettings) -> AdamW:
    """AdamW with weight decay on the matrices only (``gptspec.fast.optimizer``: torch's
    fused kernel, called directly)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return AdamW(groups, lr=settings.lr, betas=(settings.beta1, settings.beta2),
                 eps=settings.eps)


def optimizer_tensors(model: GPT, optimizer: AdamW) -> dict[str, torch.Tensor]:
    """AdamW's moments by parameter name (empty before the first step)."""
    out = {}
    for name, p in model.named_parameters():
        state = optimizer.state.get(p)
        if state:
            out[f"exp_avg.{name}"] = state["exp_avg"]
            out[f"exp_avg_sq.{name}"] = state["exp_avg_sq"]
    return out


def load_optimizer_tensors(model: GPT, optimizer: AdamW, tensors: dict[str, Any],
                           step: int) -> None:
    if step == 0:
        return
    for name, p in model.named_parameters():
        optimizer.set_state(p, step, torch.as_tensor(np.asarray(tensors[f"exp_avg.{name}"])),
                            torch.as_tensor(np.asarray(tensors[f"exp_avg_sq.{name}"])))


# --- RNG states, as JSON (no pickle) ------------------------------------------------------------


def rng_state() -> dict:
    """torch's and Python's RNG states. Every process seeds them alike and draws from
    them alike, so rank 0's states are every rank's."""
    py = random.getstate()
    return {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "python": [py[0], list(py[1]), py[2]],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])),
                                         dtype=torch.uint8))
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))


# --- distributed ------------------------------------------------------------------------------------


def distributed() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless started by torchrun with more than one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(device: str) -> tuple[int, int, str]:
    """Join the process group torchrun describes (gloo on the CPU, NCCL on CUDA); the
    device becomes the local GPU on CUDA. Without torchrun: (0, 1, device)."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, device
    cuda = torch.device(device).type == "cuda"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        # left to the interpreter's teardown, the group's threads can still be joinable when
        # their C++ destructors run, and the process aborts ("terminate called without an
        # active exception") after its command succeeded; every command has returned by now
        atexit.register(_leave_process_group)
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return dist.get_rank(), dist.get_world_size(), device


def _leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# --- the trainer ------------------------------------------------------------------------------------


def reuse_freed_memory() -> None:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the
    system, for this process. A training step frees and reallocates the same few dozen
    activation-sized blocks; by default glibc returns them (unmaps blocks above its mmap
    threshold, trims the heap above 128 KiB free), so every step faults them in again as
    fresh zeroed pages: about 2,500 page faults a shakespeare-char step, 6-10 ms of system
    time on one (loaded) CPU thread. With blocks up to 32 MiB (glibc's largest threshold)
    taken from the heap and up to 1 GiB of free heap kept, a step faults in nothing. It changes no value, only
    where freed blocks wait, like the caching allocator torch uses on CUDA. Elsewhere than
    glibc (macOS, musl) it does nothing."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h>
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)


class Trainer:
    """One model, its optimizer and data, stepped by :meth:`step` and saved by :meth:`save`."""

    def __init__(self, config: GPTConfig, settings: TrainSettings, data: TokenData,
                 tokenizer: Any, params: dict | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.config, self.settings, self.data, self.tokenizer = config, settings, data, tokenizer
        reuse_freed_memory()
        self.rank, self.world = distributed()
        torch.manual_seed(settings.seed)
        random.seed(settings.seed)
        if params is None:
            self.model = GPT(config, device=settings.device, dtype=dtype, seed=settings.seed)
        else:
            self.model = GPT.from_parameters(params, config, device=settings.device,
                                             dtype=dtype)
        self.ddp_model: torch.nn.Module = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp_model = DistributedDataParallel(self.model)
        self.optimizer = make_optimizer(self.model, settings)
        # forward and loss compiled as one function: the float32 logits are never stored
        # whole (GPT-2 small on an H200: 2.0× the eager step; docs/training.md)
        self.compiled_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        if settings.compile:
            if self.world > 1:
                raise ValueError("setting 'compile' is for one process; under torchrun "
                                 "train without it")
            cpu_gelu.available()  # decided before tracing (see cpu_gelu.applies_to)
            self.compiled_loss = torch.compile(self._forward_and_loss)
            if torch.device(settings.device).type == "cuda":
                self.model.vocab_multiple = 64  # aligned logits (ops.unembed_tied)
        self.amp = autocast_dtype(settings)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp == torch.float16 else None
        self.step_count = 0
        self.history: dict[str, list] = {"train": [], "val": []}
        self.elapsed = 0.0
        self.extra_state: dict = {}  # saved with the checkpoint (the CLI's data source)
        self._saving = False  # a signal during a save waits for its end (stop_on_signals)
        self._pending_signal: int | None = None
        self.stopped_by = int(signal.SIGINT)  # the signal that interrupted run(), if any
        self.output_lost: OSError | None = None  # why the log could not be written, if so
        self.saved_at: int | None = None  # the step of this object's last save, if any

    @property
    def tokens_per_step(self) -> int:
        s = self.settings
        return s.batch_size * self.data.block_size * s.grad_accum * self.world

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=self.amp)

    def loss(self, x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module | None = None):
        """Mean cross-entropy per token (the cross_entropy_mean entry), in float32 (in
        float64 for a float64 model)."""
        if model is None and self.compiled_loss is not None:
            with self._autocast():
                return self.compiled_loss(x, y)
        with self._autocast():
            logits = (model or self.ddp_model)(x)
        return mean_cross_entropy(logits, y)

    def _forward_and_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``loss`` as one function for torch.compile: the model's whole-sequence path (the
        batches come from the run's own checked token file: no input checks to keep)."""
        return mean_cross_entropy(self.model._forward(x), y)

    def step_on(self, batches: list[Batch]) -> float:
        """One optimizer step on these micro-batches: their mean loss's gradient (averaged
        over processes under DDP), clipped, then AdamW at this step's learning rate."""
        s = self.settings
        lr = s.learning_rate(self.step_count)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = 0.0
        for i, (x, y) in enumerate(batches):
            sync = i == len(batches) - 1 or self.world == 1
            ctx = contextlib.nullcontext() if sync else self.ddp_model.no_sync()  # type: ignore[operator]
            with ctx:
                loss = self.loss(x, y) / len(batches)
                self._stop_unless_finite(loss)
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += float(loss.detach())
        if self.scaler:
            self.scaler.unscale_(self.optimizer)  # type: ignore[arg-type]  # duck-typed optimizer
        if s.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)  # type: ignore[arg-type]
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        return total

    def _stop_unless_finite(self, loss: torch.Tensor, what: str = "loss",
                            step: int | None = None) -> None:
        """Raise TrainingDiverged if the loss is not finite, under DDP on every process
        together when it is not finite on any one: a process that stopped alone would leave
        the others waiting in the gradient all-reduce."""
        step = self.step_count + 1 if step is None else step
        value = loss.detach().float()
        where = ""
        if self.world > 1:
            import torch.distributed as dist

            losses = torch.zeros(self.world, device=value.device)
            losses[self.rank] = value
            dist.all_reduce(losses)  # the others' entries are 0: the sum is every rank's loss
            bad = (~torch.isfinite(losses)).nonzero().flatten().tolist()
            if not bad:
                return
            value, where = losses[bad[0]], f" on process {bad[0]} of {self.world}"
        elif torch.isfinite(value):
            return
        raise TrainingDiverged(f"the {what} became {float(value)} at step {step}{where}")

    def next_batches(self) -> list[Batch]:
        s = self.settings
        rng = batch_generator(s.seed, self.rank, self.step_count)
        return [self.data.batch("train", s.batch_size, rng, s.device) for _ in range(s.grad_accum)]

    def step(self) -> float:
        loss = self.step_on(self.next_batches())
        self.history["train"].append([self.step_count, loss])
        return loss

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss over ``eval_batches`` batches drawn by a fixed-seed RNG, so
        every evaluation sees the same batches and the training RNG is untouched."""
        s = self.settings
        rng = np.random.default_rng(s.seed + 7919)
        self.model.eval()
        losses = []
        for _ in range(s.eval_batches):
            x, y = self.data.batch("val", s.batch_size, rng, s.device)
            losses.append(float(self.loss(x, y, model=self.model)))
        self.model.train()
        val = sum(losses) / len(losses)
        # such a model is useless, and NaN is not JSON; every process stops together
        self._stop_unless_finite(torch.tensor(val, device=s.device), "validation loss",
                                 self.step_count)
        self.history["val"].append([self.step_count, val])
        return val

    # --- checkpoints --------------------------------------------------------------------

    def state(self) -> dict:
        return {"step": self.step_count, "settings": asdict(self.settings),
                "rng": rng_state(), "history": self.history,
                "elapsed_seconds": self.elapsed,
                "scaler": self.scaler.state_dict() if self.scaler else None,
                **self.extra_state}

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Save a checkpoint, if its weights and moments are finite: a NaN model is never
        kept as the last good checkpoint (raises TrainingDiverged instead)."""
        from gptspec.fast.checkpoint import non_finite

        params = dict(self.model.named_parameters())
        moments = optimizer_tensors(self.model, self.optimizer)
        bad = non_finite(params) or non_finite(moments)
        if bad:
            raise TrainingDiverged(f"{bad} holds NaN or infinite values after step "
                                   f"{self.step_count}")
        self._check_usable()
        with signals_held():
            saved = save_training_checkpoint(directory, self.config, params, moments,
                                             self.state(), self.tokenizer)
        self.saved_at = self.step_count
        return saved

    @torch.no_grad()
    def _check_usable(self) -> None:
        """Finite weights can still make a useless model: after a step at lr 1e30 they are
        about 1e30, and the attention scores (products of two such projections, summed
        over d_head) overflow float32 to inf and then NaN. Such a model cannot generate
        (generate refuses non-finite logits), so it is not kept as the last good one. The
        test is the model's own: its loss on one validation sequence, as evaluate()
        computes it (one forward of one sequence: small beside a step)."""
        s = self.settings
        x, y = self.data.batch("val", 1, np.random.default_rng(s.seed + 7919), s.device)
        self.model.eval()
        try:
            loss = float(self.loss(x, y, model=self.model))
        finally:
            self.model.train()
        if not math.isfinite(loss):
            raise TrainingDiverged(f"the weights after step {self.step_count} are finite but "
                                   f"the model's loss on a validation sequence is {loss}")

    @classmethod
    def resume(cls, directory: str | os.PathLike[str], data: TokenData,
               changes: dict | None = None, saved: tuple | None = None) -> Trainer:
        """The trainer as it was when ``directory`` was saved (``changes``: settings to
        override, e.g. a larger max_steps; ``saved``: what load_training_checkpoint has
        read from it already, not read twice)."""
        config, params, optimizer, state, tokenizer = saved or load_training_checkpoint(directory)
        settings = TrainSettings.from_dict({**state["settings"], **(changes or {})})
        trainer = cls(config, settings, data, tokenizer, params=params)
        trainer.step_count = int(state["step"])
        load_optimizer_tensors(trainer.model, trainer.optimizer, optimizer, trainer.step_count)
        try:
            set_rng_state(state["rng"])
        except (ValueError, TypeError, RuntimeError) as err:  # base64, sizes, Python's state
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise CheckpointError(f"{Path(directory) / STATE_FILE}: 'rng' is not a saved RNG "
                                  f"state ({why})") from None
        trainer.history = state["history"]
        trainer.elapsed = float(state.get("elapsed_seconds", 0.0))
        trainer.extra_state = {k: v for k, v in state.items() if k == "data"}
        if trainer.scaler and state.get("scaler"):
            trainer.scaler.load_state_dict(state["scaler"])
        return trainer

    # --- the loop -----------------------------------------------------------------------

    def run(self, out_dir: str | os.PathLike[str] | None = None, progress: bool = True,
            log: Callable[[str], None] = print) -> str:
        """Train until max_steps, evaluating and checkpointing as the settings say. Returns
        "done", or "interrupted" after Ctrl-C or SIGTERM (the checkpoint is saved first). A
        non-finite loss or weights raise TrainingDiverged and leave the last checkpoint
        alone."""
        s = self.settings
        main = self.rank == 0
        ckpt_every = s.checkpoint_interval or s.eval_interval
        checkpoint_dir = Path(out_dir) / "checkpoint" if out_dir is not None else None
        saved_step = self.step_count
        bar = _progress_bar(s.max_steps, self.step_count, enabled=progress and main)
        try:
            while self.step_count < s.max_steps:
                t0 = time.perf_counter()
                loss = self.step()
                dt = time.perf_counter() - t0
                self.elapsed += dt
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{self.tokens_per_step / dt:,.0f}",
                                refresh=False)
                last = self.step_count == s.max_steps
                if self.step_count % s.eval_interval == 0 or last:
                    val = self.evaluate()
                    if main:
                        _log(bar, f"step {self.step_count}: train loss {loss:.4f}, "
                                  f"val loss {val:.4f}")
                if checkpoint_dir is not None and main and (self.step_count % ckpt_every == 0
                                                            or last):
                    self.save(checkpoint_dir)
                    plot_loss_curve(self.history, Path(out_dir) / "loss.png")  # type: ignore[arg-type]
                    saved_step = self.step_count
        except KeyboardInterrupt as stop:
            self.stopped_by = getattr(stop, "signum", int(signal.SIGINT))
            self.output_lost = stop.error if isinstance(stop, OutputLost) else None
            bar.close()
            if checkpoint_dir is not None and main and self.step_count != saved_step:
                try:
                    self.save(checkpoint_dir)
                except Interrupted:
                    pass  # a second signal during this save: the save finished first
                plot_loss_curve(self.history, Path(out_dir) / "loss.png")  # type: ignore[arg-type]
            return "interrupted"
        finally:
            bar.close()
        return "done"


def _log(bar: Any, text: str) -> None:
    try:
        bar.write(text)
    except OSError as err:  # standard output, not a checkpoint: see OutputLost
        raise OutputLost(err) from None


class _NoBar:
    def update(self, n: int) -> None: ...
    def set_postfix(self, **kw: Any) -> None: ...
    def write(self, text: str) -> None:
        print(text, flush=True)
    def close(self) -> None: ...


def _progress_bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")


def plot_loss_curve(history: dict, path: str | os.PathLike[str]) -> Path:
    """Training and validation loss against step, as a PNG written atomically."""
    target = Path(path)
    with signals_held():  # a signal must not cut matplotlib's first import in half
        import logging

        # with HOME unwritable matplotlib works from a temporary config folder and says so in
        # two long lines of its log; the figure is written all the same
        logging.getLogger("matplotlib").setLevel(logging.ERROR)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        _plot(history, target, plt)
    return target


def _plot(history: dict, target: Path, plt: Any) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    if history["train"]:
        steps, losses = zip(*history["train"], strict=True)
        ax.plot(steps, losses, lw=0.8, alpha=0.7, label="train")
    if history["val"]:
        steps, losses = zip(*history["val"], strict=True)
        ax.plot(steps, losses, "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend()
    try:
        with replacing(target) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)


# --- the training operations a conformance backend exposes ---------------------------------------


def _grad(parameter: torch.Tensor) -> torch.Tensor:
    if parameter.grad is None:  # every parameter of the schema takes part in the loss
        raise RuntimeError("a parameter received no gradient")
    return parameter.grad


def gpt_backward(tokens, targets, params: dict, config: GPTConfig, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> tuple[float, dict[str, np.ndarray]]:
    """The mean cross-entropy and its gradient by parameter name, through torch autograd
    (the reference's ``gpt_backward``, computed by the fast model)."""
    model = GPT.from_parameters(params, config, device=device, dtype=dtype)
    x = torch.as_tensor(np.asarray(tokens), device=device, dtype=torch.long)
    y = torch.as_tensor(np.asarray(targets), device=device, dtype=torch.long)
    loss = mean_cross_entropy(model(x), y)  # 16-bit logits: the loss is computed in float32
    loss.backward()
    named = dict(model.named_parameters())
    grads = {s.name: _grad(named[s.name]).detach().to("cpu", torch.float64).numpy()
             for s in parameter_schema(config)}
    return float(loss.detach()), grads


def adamw_trajectory(params: dict, grads: list[dict], lrs: list[float], beta1: float,
                     beta2: float, eps: float, weight_decay: float, device: str = "cpu",
                     dtype: torch.dtype = torch.float32) -> list[dict[str, np.ndarray]]:
    """The parameters after each of len(grads) steps of the trainer's AdamW fed
    the given gradients at the given learning rates, every parameter decayed.

    In a 16-bit dtype the step follows the spec's decision on ``adamw_step``: the
    optimizer state and the update are float32 (the optimizer works on float32 copies),
    and after each step the parameter is stored in the dtype, one rounding, and read back
    from it for the next step."""
    compute = ops.accumulation_dtype(dtype)
    tensors = {k: torch.nn.Parameter(torch.tensor(np.asarray(v), dtype=dtype, device=device)
                                     .to(compute))
               for k, v in params.items()}  # a copy: the caller's arrays stay as they are
    opt = AdamW([{"params": list(tensors.values()), "weight_decay": weight_decay}], lr=lrs[0],
                betas=(beta1, beta2), eps=eps)  # the trainer's optimizer
    out = []
    for g, lr in zip(grads, lrs, strict=True):
        for k, p in tensors.items():
            p.grad = torch.tensor(np.asarray(g[k]), dtype=dtype, device=device).to(compute)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        with torch.no_grad():
            for p in tensors.values():  # the parameter as the backend stores it
                p.copy_(p.to(dtype))
        out.append({k: p.detach().to("cpu", torch.float64).numpy().copy()
                    for k, p in tensors.items()})
    return out


def train_losses(tokens, params: dict, config: GPTConfig, steps: int, seed: int,
                 resume_at: int | None = None, batch_size: int = 2,
                 device: str = "cpu") -> list[float]:
    """The training losses of ``steps`` steps on ``tokens`` from ``params``; with
    ``resume_at`` the run is checkpointed after that many steps and a new trainer resumed
    from the checkpoint finishes it."""
    from gptspec.fast.tokenizer import Tokenizer

    data = TokenData.split(np.asarray(tokens), config.n_ctx, val_fraction=0.25)
    settings = TrainSettings(batch_size=batch_size, max_steps=steps, warmup_steps=1,
                             eval_batches=1, seed=seed, device=device)
    trainer = Trainer(config, settings, data, Tokenizer.byte_level(), params=params)
    losses = []
    for _ in range(steps if resume_at is None else resume_at):
        losses.append(trainer.step())
    if resume_at is not None:
        with tempfile.TemporaryDirectory() as tmp:
            trainer.save(Path(tmp) / "checkpoint")
            del trainer
            trainer = Trainer.resume(Path(tmp) / "checkpoint", data)
        for _ in range(steps - resume_at):
            losses.append(trainer.step())
    return losses


def train_loop(tokens, params: dict, config: GPTConfig, settings: TrainLoopSettings,
               device: str = "cpu", dtype: torch.dtype = torch.float32, compile: bool = False
               ) -> tuple[list[float], list[dict[str, float]], list[dict[str, np.ndarray]]]:
    """The reference's ``train_loop``, run by the trainer ``gptspec train`` uses: a
    :class:`Trainer` with these settings (float32 throughout, or float64 parameters),
    stepped ``max_steps`` times with :meth:`Trainer.step` on ``tokens`` as its training
    split. Returns, step by step, the loss, the learning rate each parameter was stepped
    with (read from its optimizer group as AdamW runs) and the parameters after the step."""
    stream = np.asarray(tokens)
    data = TokenData(stream, stream, config.n_ctx)  # no validation: the trainer never evaluates here
    loop = settings.as_dict()
    unknown = set(loop) - {f.name for f in fields(TrainSettings)}
    if unknown:
        raise ValueError(f"the trainer has no setting {', '.join(sorted(unknown))}")
    trainer = Trainer(config, TrainSettings(**loop, precision="float32", device=device,
                                            compile=compile),
                      data, None, params=params, dtype=dtype)  # no tokenizer: nothing is saved
    names = {p: name for name, p in trainer.model.named_parameters()}
    used: list[dict[str, float]] = []

    def record_lr(optimizer: AdamW, args: Any, kwargs: Any) -> None:
        used.append({names[p]: float(group["lr"]) for group in optimizer.param_groups
                     for p in group["params"]})

    hook = trainer.optimizer.register_step_pre_hook(record_lr)
    losses, trajectory = [], []
    try:
        for _ in range(settings.max_steps):
            losses.append(trainer.step())
            trajectory.append({name: p.detach().to("cpu", torch.float64).numpy().copy()
                               for name, p in trainer.model.named_parameters()})
    finally:
        hook.remove()
    return losses, used, trajectory
