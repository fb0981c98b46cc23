"""The backend guide's tables of what ``forward`` receives are made from the code: every
GPTConfig field with its meaning, the constraints in the code's own words, and every
schema name with the switch that removes it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

from sitegen import backend_guide  # noqa: E402

from gptspec.spec.config import GPTConfig  # noqa: E402


def test_every_config_field_is_listed_with_a_meaning():
    table = backend_guide.config_fields()
    for field in dataclasses.fields(GPTConfig):
        [row] = [r for r in table.splitlines() if r.startswith(f"| `{field.name}` |")]
        assert not row.rstrip().endswith("|  |"), f"{field.name} has no comment in GPTConfig"
    assert table.count("\n- config field") == len(backend_guide.VIOLATIONS)


def test_the_schema_names_their_shapes_in_symbols_and_their_switches():
    table = backend_guide.schema_shapes()
    assert "| `blocks.{l}.attn.w_o` | (h·d_k, d_model) | always |" in table
    assert "| `blocks.{l}.attn.b_qkv` | (3·h·d_k) | `attn_bias=true` |" in table
    assert "| `blocks.{l}.ffn.b_2` | (d_model) | `ffn_bias=true` |" in table
    assert "| `b_u` | (V) | `output_bias=true` and `tied_embeddings=false` |" in table
    assert all(n not in table for n in map(str, range(10, 50)))  # every size a symbol


def test_the_backend_guide_asks_for_both_tables():
    page = (ROOT / "docs" / "backend.md").read_text(encoding="utf-8")
    assert "<!-- gptspec:config-fields -->" in page and "<!-- gptspec:schema-shapes -->" in page
