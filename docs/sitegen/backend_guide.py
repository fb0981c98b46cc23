"""The backend guide's tables of what ``forward`` receives, made from the code so that
they cannot drift from it: GPTConfig's fields (type, default, meaning, allowed values)
and the constraints between them (each stated by the ConfigError the code raises), and
the parameter schema's names and shapes with a free head width, with the configuration
switch that removes or adds each name.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from gptspec.spec.config import FFNS, NORMS, ConfigError, GPTConfig
from gptspec.spec.parameters import parameter_schema

# A configuration whose sizes are all different numbers, so that each shape reads back
# as symbols: d_k = 7 is free (h·d_k = 14 ≠ d_model = 10)
SIZES = dict(vocab_size=11, n_ctx=13, d_model=10, n_layers=1, n_heads=2, d_ff=12, d_head=7)
SYMBOLS = {11: "V", 13: "n_ctx", 10: "d_model", 12: "d_ff", 14: "h·d_k", 42: "3·h·d_k"}
EVERYTHING = dict(attn_bias=True, ffn_bias=True, positional_embedding=True, final_norm=True,
                  tied_embeddings=False, output_bias=True)
# each switch turned the other way, one at a time, from EVERYTHING (pre-LN blocks), and
# the condition under which the names it removes are present
SWITCHES = (({"attn_bias": False}, "`attn_bias=true`"), ({"ffn_bias": False}, "`ffn_bias=true`"),
            ({"positional_embedding": False}, "`positional_embedding=true`"),
            ({"final_norm": False}, "`final_norm=true`"),
            ({"output_bias": False}, "`output_bias=true`"),
            ({"tied_embeddings": True, "output_bias": False}, "`tied_embeddings=false`"),
            ({"norm": "guide"}, "`norm` is `pre` or `post`"))
# violations of the constraints between fields; the code's own message states each
VIOLATIONS = ({"n_heads": 3, "d_model": 10, "d_head": None},
              {"ffn": "guide_product", "d_ff": 12, "d_model": 10},
              {"tied_embeddings": True, "output_bias": True})


def _comments() -> dict[str, str]:
    """Each field's trailing comment in GPTConfig's source: its meaning."""
    found = {}
    for line in inspect.getsource(GPTConfig).splitlines():
        match = re.match(r"\s+(\w+): [^=#]+(?:= [^#]+)?#\s*(.+)$", line)
        if match:
            found[match[1]] = match[2].strip()
    return found


def _allowed(field: dataclasses.Field) -> str:
    if field.name == "norm":
        return ", ".join(f"`{v}`" for v in NORMS)
    if field.name == "ffn":
        return ", ".join(f"`{v}`" for v in FFNS)
    if field.type in ("bool", bool):
        return "`true`, `false`"
    if field.name == "d_head":
        return "a positive integer, or null (d_model / n_heads)"
    if field.name == "ln_eps":
        return "a positive finite number"
    return "a positive integer"


def _json(value: Any) -> str:
    """A default as a config file writes it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def config_fields() -> str:
    """GPTConfig's fields as a Markdown table, then the constraints between them."""
    comments = _comments()
    rows = ["| field | type | default | allowed | meaning |", "| --- | --- | --- | --- | --- |"]
    for field in dataclasses.fields(GPTConfig):
        default = ("required" if field.default is dataclasses.MISSING
                   else f"`{_json(field.default)}`")
        meaning = comments.get(field.name, "").replace("|", "\\|")
        kind = " or ".join(f"`{t}`" for t in str(field.type).split(" | "))  # no | in a cell
        rows.append(f"| `{field.name}` | {kind} | {default} | {_allowed(field)} "
                    f"| {meaning} |")
    base = GPTConfig(**{**SIZES, "d_head": None, "d_model": 12, "d_ff": 12})
    messages = []
    for changes in VIOLATIONS:
        try:
            base.replace(**changes)
        except ConfigError as err:
            messages.append(f"- {err}")
    return "\n".join(rows) + "\n\nBetween fields (the messages are the code's own):\n\n" + \
        "\n".join(messages) + "\n"


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(SYMBOLS.get(n, str(n)) for n in shape) + ")"


def _names(**switches: Any) -> dict[str, tuple[int, ...]]:
    config = GPTConfig(**SIZES, **{**EVERYTHING, **switches})
    return {p.name: p.shape for p in parameter_schema(config)}


def schema_shapes() -> str:
    """The schema of one block with every switch on and a free d_k, as a Markdown table:
    each name, its shape in symbols, and the switch that removes or adds it."""
    everything = _names()
    present_when = {}
    for changes, condition in SWITCHES:
        for name in set(everything) ^ set(_names(**changes)):
            present_when.setdefault(name, []).append(condition)
    rows = ["| name | shape | present when |", "| --- | --- | --- |"]
    for name, shape in everything.items():
        rows.append(f"| `{name.replace('blocks.0.', 'blocks.{l}.')}` | {_shape(shape)} | "
                    f"{' and '.join(present_when.get(name, [])) or 'always'} |")
    return "\n".join(rows) + "\n"
