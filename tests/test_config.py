"""The model configuration: presets, validation, JSON, parameter counts."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from gptspec.spec import PRESETS, ConfigError, GPTConfig, parameter_count, parameter_schema, preset

SIZE_FIELDS = ("vocab_size", "n_ctx", "d_model", "n_layers", "n_heads", "d_ff")


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_valid_and_round_trips(name: str) -> None:
    config = preset(name)
    assert GPTConfig.from_json(config.to_json()) == config
    assert config.d_attn == config.d_head * config.n_heads
    # h·d_H = d_model except where a document fixes the head width apart (Decision data)
    assert config.head_width_is_derived or name in ("notes", "gpt3-xl", "gpt3-13b")
    schema = parameter_schema(config)
    assert len({s.name for s in schema}) == len(schema)
    assert all(all(n > 0 for n in s.shape) for s in schema)


def test_unknown_preset_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="'gpt5'"):
        preset("gpt5")


# Published sizes: GPT-2 small, medium, large and XL as released (tied embeddings,
# n_ctx = 1024, V = 50257).
@pytest.mark.parametrize(("name", "count"), [
    ("gpt2", 124_439_808),
    ("gpt2-medium", 354_823_168),
    ("gpt2-large", 774_030_080),
    ("gpt2-xl", 1_557_611_200),
])
def test_parameter_count_matches_the_published_gpt2_sizes(name: str, count: int) -> None:
    assert parameter_count(PRESETS[name]) == count


def test_parameter_count_follows_the_variants() -> None:
    base = PRESETS["tiny"]
    d, V = base.d_model, base.vocab_size
    assert parameter_count(base.replace(tied_embeddings=False)) == parameter_count(base) + d * V
    untied_bias = base.replace(tied_embeddings=False, output_bias=True)
    assert parameter_count(untied_bias) == parameter_count(base) + d * V + V
    assert parameter_count(base.replace(final_norm=False)) == parameter_count(base) - 2 * d
    # Per layer: the Q/K/V, output and FFN biases.
    biases = 3 * d + d + base.d_ff + d
    assert parameter_count(base.replace(attn_bias=False, ffn_bias=False)) == parameter_count(base) \
        - base.n_layers * biases


BAD: list[tuple[dict[str, Any], str]] = [
    *[({field: 0}, field) for field in SIZE_FIELDS],
    *[({field: -3}, field) for field in SIZE_FIELDS],
    *[({field: 2.0}, field) for field in SIZE_FIELDS],
    *[({field: True}, field) for field in SIZE_FIELDS],
    ({"d_model": 30, "n_heads": 4}, "n_heads"),
    ({"norm": "sandwich"}, "norm"),
    ({"norm": "PRE"}, "norm"),
    ({"ffn": "swiglu"}, "ffn"),
    ({"ffn": "guide_product", "d_ff": 64}, "d_ff"),
    ({"output_bias": True}, "output_bias"),
    ({"tied_embeddings": "yes"}, "tied_embeddings"),
    ({"bias": 1}, "bias"),
    ({"attn_bias": 1}, "attn_bias"),
    ({"ffn_bias": "no"}, "ffn_bias"),
    ({"positional_embedding": None}, "positional_embedding"),
    ({"d_head": 0}, "d_head"),
    ({"d_head": -8}, "d_head"),
    ({"d_head": 8.0}, "d_head"),
    ({"d_head": True}, "d_head"),
    ({"final_norm": None}, "final_norm"),
    ({"ln_eps": 0.0}, "ln_eps"),
    ({"ln_eps": -1e-5}, "ln_eps"),
    ({"ln_eps": math.nan}, "ln_eps"),
    ({"ln_eps": "1e-5"}, "ln_eps"),
    ({"ln_eps": math.inf}, "ln_eps"),
    ({"ln_eps": True}, "ln_eps"),
]


@pytest.mark.parametrize(("changes", "field"), BAD, ids=[repr(c) for c, _ in BAD])
def test_bad_configuration_is_refused_naming_the_field(changes: dict[str, Any], field: str
                                                       ) -> None:
    with pytest.raises(ConfigError) as raised:
        PRESETS["tiny"].replace(**changes)
    message = str(raised.value)
    assert f"'{field}'" in message
    assert "\n" not in message


def test_a_free_head_width_needs_no_divisibility_and_survives_replace() -> None:
    free = PRESETS["tiny"].replace(d_model=30, n_heads=4, d_head=7)
    assert (free.d_attn, free.head_width_is_derived) == (28, False)
    assert free.replace(d_model=40).d_head == 7  # a free width stays
    derived = PRESETS["tiny"].replace(d_model=48)  # a derived width follows d_model / h
    assert (derived.d_head, derived.head_width_is_derived) == (12, True)
    assert PRESETS["tiny"].replace(n_heads=8).d_head == 4


def test_a_checkpoint_config_with_the_old_single_bias_switch_still_loads() -> None:
    data = PRESETS["tiny"].to_dict()
    for key in ("attn_bias", "ffn_bias", "d_head", "positional_embedding"):
        del data[key]  # written before these fields existed
    for old in (True, False):
        config = GPTConfig.from_json(json.dumps({**data, "bias": old}))
        assert (config.attn_bias, config.ffn_bias) == (old, old)
        assert config.d_head == 8 and config.positional_embedding
    with pytest.raises(ConfigError, match="'bias'"):
        GPTConfig.from_json(json.dumps({**data, "bias": False, "attn_bias": True}))


def test_bias_switches_and_positions_change_the_schema_as_the_documents_write() -> None:
    names = {s.name for s in parameter_schema(PRESETS["blueprint"])}
    assert "blocks.0.ffn.b_1" in names and "blocks.0.ffn.b_2" in names  # eq 6
    assert not {"blocks.0.attn.b_qkv", "blocks.0.attn.b_o"} & names  # eqs 2, 4
    guide = {s.name for s in parameter_schema(PRESETS["guide"])}
    assert "wpe" not in guide and "wpe" in {s.name for s in parameter_schema(
        PRESETS["guide-positional"])}
    shapes = {s.name: s.shape for s in parameter_schema(PRESETS["notes"])}
    assert shapes["blocks.0.attn.w_qkv"] == (512, 3 * 6 * 64)
    assert shapes["blocks.0.attn.w_o"] == (6 * 64, 512)


def test_guide_product_with_d_ff_equal_to_d_model_is_accepted() -> None:
    config = PRESETS["tiny"].replace(ffn="guide_product", d_ff=PRESETS["tiny"].d_model)
    assert config.ffn == "guide_product"


def test_unknown_json_field_is_refused_by_name() -> None:
    data = {**PRESETS["tiny"].to_dict(), "dropout": 0.1}
    with pytest.raises(ConfigError, match="'dropout'"):
        GPTConfig.from_json(json.dumps(data))


def test_missing_json_field_is_refused_by_name() -> None:
    data = PRESETS["tiny"].to_dict()
    del data["d_ff"]
    with pytest.raises(ConfigError, match="'d_ff'"):
        GPTConfig.from_json(json.dumps(data))


def test_json_defaults_apply_to_optional_fields() -> None:
    data = {k: v for k, v in PRESETS["tiny"].to_dict().items() if k in SIZE_FIELDS}
    assert GPTConfig.from_json(json.dumps(data)) == PRESETS["tiny"]


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '"gpt2"', "null"])
def test_malformed_json_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="JSON"):
        GPTConfig.from_json(text)


def test_bad_value_inside_json_is_refused_naming_the_field() -> None:
    data = {**PRESETS["tiny"].to_dict(), "n_heads": 5}
    with pytest.raises(ConfigError, match="'n_heads'"):
        GPTConfig.from_json(json.dumps(data))
