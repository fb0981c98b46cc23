"""``gptspec info PRESET``: a model's size and costs, from the formulas in spec/costs.py.

PRESET is a preset name or a checkpoint (its configuration is read from the metadata).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

from gptspec.cli import CLIError, arguments, printable, standard_stream, writing_stdout
from gptspec.spec.config import PRESETS, ConfigError, GPTConfig, preset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", metavar="PRESET",
                        help=f"a preset ({', '.join(PRESETS)}) or a checkpoint directory")
    parser.add_argument("--batch", type=int, default=1, help="sequences per batch (default 1)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per sequence for activation memory (default n_ctx)")
    parser.add_argument("--bytes", type=int, default=2, dest="bytes_per_element",
                        help="bytes per activation / cache element (default 2: bf16)")


def config_of(name: str) -> GPTConfig:
    if name in PRESETS:
        return PRESETS[name]
    from gptspec.fast.checkpoint import find_checkpoints

    arguments.path_name(name, "PRESET")
    path = Path(name)
    if not path.exists() and not find_checkpoints(path):
        try:
            return preset(name)
        except ConfigError as err:
            raise CLIError(str(err)) from None
    from gptspec.fast.checkpoint import CONFIG_KEY, CheckpointError, model_header

    try:  # the newest complete copy, read through one folder descriptor (a save may run)
        file, metadata, header_shapes = model_header(path)
    except CheckpointError as err:
        raise CLIError(str(err)) from None
    # the header's shapes, not the tensors: sizes are printed for what the file holds,
    # without reading gigabytes
    shapes = {name: SimpleNamespace(shape=shape) for name, shape in header_shapes.items()}
    if CONFIG_KEY not in metadata:
        hint = ("; a transformers checkpoint converts with gptspec convert --from-hf"
                if (file.parent / "config.json").is_file() else "")
        raise CLIError(f"{file} has no {CONFIG_KEY!r} metadata: not a gptspec checkpoint{hint}")
    try:
        config = GPTConfig.from_json(metadata[CONFIG_KEY])
    except (ConfigError, ValueError, TypeError, RecursionError) as err:
        raise CLIError(f"{file}: {err}") from None
    from gptspec.spec.parameters import ParameterError, check_parameters

    try:
        check_parameters(shapes, config)  # type: ignore[arg-type]  # np.shape reads .shape
    except ParameterError as err:
        raise CLIError(f"{file}: its tensors do not match its configuration ({err})") from None
    return config


def human(n: int, unit: str = "") -> str:
    """1234567 → '1.23 M'; bytes in binary units."""
    if unit == "B":
        for suffix, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if n >= 2**power:
                return f"{n / 2**power:.2f} {suffix}"
        return f"{n} B"
    for suffix, exponent in (("G", 9), ("M", 6), ("k", 3)):
        if n >= 10**exponent:
            return f"{n / 10**exponent:.2f} {suffix}{unit}"
    return f"{n} {unit}".strip()


def rows(config: GPTConfig, batch: int, seq_len: int | None, nbytes: int
         ) -> list[tuple[str, int, str]]:
    """(quantity, exact value, unit) for every costs entry."""
    from gptspec.reference import costs as c

    L = config.n_layers
    T = config.n_ctx if seq_len is None else seq_len
    return [
        ("token embedding W_E", c.param_count_token_embedding(config), "params"),
        ("positional embedding W_P", c.param_count_positional_embedding(config), "params"),
        (f"attention, per block (× {L})", c.param_count_attention(config), "params"),
        (f"feed-forward, per block (× {L})", c.param_count_ffn(config), "params"),
        (f"LayerNorms, per block (× {L})", c.param_count_block_norms(config), "params"),
        (f"one block (× {L})", c.param_count_block(config), "params"),
        ("final LayerNorm", c.param_count_final_norm(config), "params"),
        ("unembedding" + (" (tied to W_E)" if config.tied_embeddings else ""),
         c.param_count_unembedding(config), "params"),
        ("total parameters", c.param_count_total(config), "params"),
        ("weights in matmuls per token", c.matmul_weights_per_token(config), "params"),
        ("forward FLOPs per token", c.forward_flops_per_token(config), "FLOP"),
        ("training FLOPs per token", c.training_flops_per_token(config), "FLOP"),
        (f"KV cache (B={batch}, {nbytes} B/elt)",
         c.kv_cache_bytes(config, batch=batch, bytes_per_element=nbytes), "B"),
        (f"activation memory (B={batch}, T={T}, {nbytes} B/elt)",
         c.activation_memory_bytes(config, batch=batch, seq_len=T, bytes_per_element=nbytes),
         "B"),
    ]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    class PipedConsole(Console):
        """rich's Console, except that a reader going away (``gptspec info gpt2 | head``)
        raises BrokenPipeError, which the command reports as every other does (quietly,
        exit status 141), where rich would exit with status 1."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError("the reader of standard output went away")

    for flag, name in (("--batch", "batch"), ("--bytes", "bytes_per_element")):
        if getattr(args, name) <= 0:  # the flag as typed: there is no --bytes-per-element
            raise CLIError(f"{flag} must be positive")
    if args.seq_len is not None and args.seq_len <= 0:
        raise CLIError("--seq-len must be positive")
    if args.bytes_per_element not in (1, 2, 4, 8):  # no floating-point element has 3 bytes
        raise CLIError(f"--bytes must be 1, 2, 4 or 8 (a float8, 16-bit, float32 or float64 "
                       f"element), got {args.bytes_per_element}")
    config = config_of(args.preset)
    if args.seq_len is not None and args.seq_len > config.n_ctx:
        raise CLIError(f"--seq-len {args.seq_len} is longer than the model's context "
                       f"(n_ctx {config.n_ctx}): no sequence that long is ever processed")
    standard_stream("stdout", "info prints its table there")
    # the name as written: no escape sequence reaches the terminal, no [markup] is read
    table = Table(title=Text(f"{printable(args.preset)}: sizes and costs (spec/costs.py)"))
    table.add_column("quantity")
    table.add_column("exact", justify="right")
    table.add_column("", justify="right")
    for quantity, value, unit in rows(config, args.batch, args.seq_len, args.bytes_per_element):
        exact = f"{value:,}" + (" B" if unit == "B" else "")
        table.add_row(quantity, exact, human(value, "B" if unit == "B" else ""))
    console = PipedConsole()
    with writing_stdout():
        console.print(table)
        console.print("FLOPs: a multiply-add is 2, matrix products only, unembedding "
                      "included, attention over a causal window of n_ctx (Kaplan et al. "
                      "2020, table 1). Activation memory: no recomputation, attention "
                      "weights stored.")
    return 0

