"""model.safetensors checkpoints: round trip, and a clear error for every bad file."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from gptspec.fast.checkpoint import (
    CONFIG_KEY,
    MODEL_FILE,
    STATE_FORMAT,
    CheckpointError,
    check_state,
    load_model,
    save_model,
)
from gptspec.spec import PRESETS, init_parameters


@pytest.fixture
def tiny():
    config = PRESETS["tiny"]
    return config, init_parameters(config, seed=1)


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    return message


@pytest.mark.parametrize("name", ["tiny", "tiny-post", "tiny-guide"])
def test_round_trip_is_exact(tmp_path, name):
    config = PRESETS[name]
    params = init_parameters(config, seed=3)
    file = save_model(tmp_path / "ck", params, config)
    assert file == tmp_path / "ck" / MODEL_FILE
    config2, params2 = load_model(tmp_path / "ck")
    assert config2 == config
    assert params2.keys() == params.keys()
    for k in params:
        assert params2[k].dtype == np.float64
        np.testing.assert_array_equal(params2[k], params[k])


def test_file_path_and_torch_tensors(tmp_path, tiny):
    torch = pytest.importorskip("torch")
    config, params = tiny
    tensors = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in params.items()}
    save_model(tmp_path / "m.safetensors", tensors, config)
    _, loaded = load_model(tmp_path / "m.safetensors")
    for k, v in tensors.items():
        np.testing.assert_array_equal(loaded[k], v.float().numpy())


def test_the_file_holds_schema_names_and_the_config(tmp_path, tiny):
    config, params = tiny
    file = save_model(tmp_path, params, config)
    assert set(load_file(file)) == set(params)
    from safetensors import safe_open
    with safe_open(str(file), framework="numpy") as f:
        assert json.loads(f.metadata()[CONFIG_KEY]) == config.to_dict()


def test_a_config_edited_so_that_every_shape_still_fits_is_refused(tmp_path, tiny):
    # norm "pre" → "post" keeps every tensor's shape: without the config's own checksum
    # the weights would load into another architecture, silently
    from safetensors import safe_open

    from gptspec.fast.checkpoint import model_header

    config, params = tiny
    file = save_model(tmp_path, params, config)
    with safe_open(str(file), framework="numpy") as f:
        metadata = f.metadata()
    edited = json.loads(metadata[CONFIG_KEY])
    edited["norm"] = "post" if edited["norm"] != "post" else "pre"
    save_file(load_file(file), str(file), metadata={**metadata, CONFIG_KEY: json.dumps(edited)})
    for read in (load_model, model_header):
        with pytest.raises(CheckpointError, match="config was changed after it was saved") as err:
            read(file)
        one_line(err)


def test_missing(tmp_path):
    with pytest.raises(CheckpointError, match="not found") as err:
        load_model(tmp_path / "nowhere")
    one_line(err)


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "header"])
def test_corrupt_or_truncated(tmp_path, tiny, damage):
    config, params = tiny
    file = save_model(tmp_path, params, config)
    data = file.read_bytes()
    bad = {"truncated": data[: len(data) // 2], "empty": b"", "garbage": b"\x00\xff" * 100,
           "header": data[:8] + b"[" + data[9:]}[damage]
    file.write_bytes(bad)
    with pytest.raises(CheckpointError, match="not a readable safetensors file") as err:
        load_model(tmp_path)
    one_line(err)


def test_a_flipped_byte_in_the_tensors_is_caught(tmp_path, tiny):
    config, params = tiny
    file = save_model(tmp_path, params, config)
    data = bytearray(file.read_bytes())
    header_len = struct.unpack("<Q", data[:8])[0]
    data[8 + header_len + 100] ^= 0x01  # inside the tensor bytes; the header is intact
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum") as err:
        load_model(tmp_path)
    one_line(err)


def test_no_config_metadata(tmp_path, tiny):
    _, params = tiny
    save_file(params, str(tmp_path / MODEL_FILE))
    with pytest.raises(CheckpointError, match=CONFIG_KEY) as err:
        load_model(tmp_path)
    one_line(err)


def test_bad_config_metadata(tmp_path, tiny):
    _, params = tiny
    save_file(params, str(tmp_path / MODEL_FILE), metadata={CONFIG_KEY: '{"d_model": 3}'})
    with pytest.raises(CheckpointError, match="does not match its configuration") as err:
        load_model(tmp_path)
    one_line(err)


def test_parameters_that_do_not_match_the_config(tmp_path, tiny):
    config, params = tiny
    other = PRESETS["tiny-post"].replace(d_model=16, n_heads=2)
    save_file(params, str(tmp_path / MODEL_FILE), metadata={CONFIG_KEY: other.to_json()})
    with pytest.raises(CheckpointError, match="shape") as err:
        load_model(tmp_path)
    one_line(err)


def test_saving_mismatched_parameters_is_refused_and_keeps_the_old_file(tmp_path, tiny):
    config, params = tiny
    file = save_model(tmp_path, params, config)
    before = file.read_bytes()
    broken = dict(params)
    del broken["wpe"]
    with pytest.raises(CheckpointError, match="'wpe' is missing") as err:
        save_model(tmp_path, broken, config)
    one_line(err)
    assert file.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [MODEL_FILE]  # no temporary left behind


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, tiny, monkeypatch):
    config, params = tiny
    file = save_model(tmp_path, params, config)
    before = file.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("gptspec.fast.checkpoint.os.fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        save_model(tmp_path, init_parameters(config, seed=2), config)
    assert file.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [MODEL_FILE]


def test_integer_tensors_are_refused(tmp_path, tiny):
    config, params = tiny
    bad = dict(params, wpe=params["wpe"].astype(np.int64))
    save_file(bad, str(tmp_path / MODEL_FILE), metadata={CONFIG_KEY: config.to_json()})
    with pytest.raises(CheckpointError, match="'wpe' has dtype int64") as err:
        load_model(tmp_path)
    one_line(err)
    with pytest.raises(CheckpointError, match="'wpe' has dtype int64"):
        save_model(tmp_path / "other", bad, config)


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_model_file_that_is_not_a_regular_file_is_named_so(tmp_path, kind):
    """A model.safetensors that is a link to /dev/zero or a FIFO was reported "not
    found" (it was skipped as unreadable), though it is there."""
    import os

    folder = tmp_path / "ckpt"
    folder.mkdir()
    if kind == "device":
        (folder / MODEL_FILE).symlink_to("/dev/zero")
    else:
        os.mkfifo(folder / MODEL_FILE)
    with pytest.raises(CheckpointError) as err:
        load_model(folder)
    assert one_line(err).endswith(f"{MODEL_FILE} is not a regular file")


# --- state.json: the gradient scaler's state and the data block -------------------------------

# what torch's GradScaler.state_dict() saves for a float16 run (CUDA): its defaults
SCALER = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
          "growth_interval": 2000, "_growth_tracker": 0}
DATA = {"source": "corpus.txt", "tokens": "tokens.bin", "n_tokens": 1760, "dtype": "uint16",
        "sha256": "0123456789abcdef" * 4}


def training_state(**fields) -> dict:
    """A state.json's content as a run saves it (its RNG states only of the right shape),
    with ``fields`` replaced."""
    state = {"format": STATE_FORMAT, "step": 2, "settings": {"lr": 0.001},
             "rng": {"torch": "AAAA", "python": [3, [0] * 625, None]},
             "history": {"train": [[1, 5.5], [2, 5.4]], "val": [[2, 5.4]]},
             "elapsed_seconds": 1.5, "scaler": None, "data": dict(DATA)}
    return {**state, **fields}


@pytest.mark.parametrize("scaler", [
    None, SCALER, dict(SCALER, scale=2.0**-126, _growth_tracker=1999),
    dict(SCALER, scale=1, growth_factor=3, backoff_factor=0.25, growth_interval=1),
], ids=["none", "defaults", "extremes", "integers"])
def test_a_saved_scaler_state_is_accepted(tmp_path, scaler):
    check_state(training_state(scaler=scaler), tmp_path / "state.json")


@pytest.mark.parametrize(("scaler", "needle"), [
    ({"scale": 65536.0}, "'scaler' lacks 'growth_factor'"),  # was KeyError: 'growth_factor'
    ({}, "'scaler' lacks 'scale'"),
    (dict(SCALER, extra=1), "'scaler' holds 'extra'"),
    ([1, 2], "'scaler' is not a saved gradient scaler state"),
    ("x", "'scaler' is not a saved gradient scaler state"),
    # torch took these and failed on the first step in words of its own (TypeError: full()…)
    (dict(SCALER, scale="x"), "'scaler' 'scale' must be a positive normal float32"),
    (dict(SCALER, _growth_tracker="x"), "'scaler' '_growth_tracker' must be an integer from 0"),
    (dict(SCALER, growth_factor=[1]), "'scaler' 'growth_factor' must be a finite number above 1"),
    # a loss scale of 0 (1e-300 is 0 as a float32) was reported as the run diverging
    (dict(SCALER, scale=0.0),
     "'scale' must be a positive normal float32 (2^-126 … 3.4e38), got 0.0"),
    (dict(SCALER, scale=1e-300), "'scale' must be a positive normal float32"),
    (dict(SCALER, scale=-1.0), "'scale' must be a positive normal float32"),
    (dict(SCALER, scale=1e39), "'scale' must be a positive normal float32"),
    (dict(SCALER, scale=10**400), "'scale' must be a positive normal float32"),
    (dict(SCALER, scale=float("nan")), "got nan"),
    (dict(SCALER, scale=True), "got true"),
    (dict(SCALER, growth_factor=1.0), "'growth_factor' must be a finite number above 1"),
    (dict(SCALER, growth_factor=float("inf")), "'growth_factor' must be a finite number"),
    (dict(SCALER, backoff_factor=0), "'backoff_factor' must be a number between 0 and 1"),
    (dict(SCALER, backoff_factor=1.0), "'backoff_factor' must be a number between 0 and 1"),
    (dict(SCALER, growth_interval=0), "'growth_interval' must be a positive integer"),
    (dict(SCALER, growth_interval=2000.0), "'growth_interval' must be a positive integer"),
    (dict(SCALER, growth_interval=2**31), "'growth_interval' must be a positive integer (at most"),
    (dict(SCALER, _growth_tracker=-1), "'_growth_tracker' must be an integer from 0 to "
                                       "growth_interval − 1 (1999), got -1"),
    (dict(SCALER, _growth_tracker=2000), "got 2000"),
    (dict(SCALER, _growth_tracker=None), "got null"),
], ids=lambda value: None if isinstance(value, str) else repr(value)[:60])
def test_a_damaged_scaler_state_is_refused_naming_the_field(tmp_path, scaler, needle):
    file = tmp_path / "checkpoint" / "state.json"
    with pytest.raises(CheckpointError) as err:
        check_state(training_state(scaler=scaler), file)
    assert one_line(err).startswith(f"{file}: ")
    assert needle in str(err.value)


@pytest.mark.parametrize("data", [DATA, {k: DATA[k] for k in ("source", "tokens", "n_tokens")},
                                  dict(DATA, dtype=">u4")], ids=["whole", "before-issue-29",
                                                                 "big-endian-npy"])
def test_a_saved_data_block_is_accepted(tmp_path, data):
    check_state(training_state(data=data), tmp_path / "state.json")


@pytest.mark.parametrize(("change", "needle"), [
    # NumPy's words: TypeError: Cannot interpret '5' as a data type
    ({"dtype": 5}, "'data' 'dtype' must be uint16 or uint32 (the token ids' type), got 5"),
    ({"dtype": {"a": 1}}, "'data' 'dtype' must be uint16 or uint32 (the token ids' type), "
                          "got an object"),
    ({"dtype": "int16"}, "'data' 'dtype' must be uint16 or uint32"),
    ({"dtype": None}, "'data' 'dtype' must be uint16 or uint32"),
    ({"extra": 1}, "'data' holds 'extra', an unknown field"),  # was accepted silently
    # these were blamed on the token file ("changed since the checkpoint was written")
    ({"sha256": 5}, "'data' 'sha256' must be a SHA-256 of the token ids (64 lowercase "
                    "hexadecimal digits), got 5"),
    ({"sha256": "0" * 63}, "'data' 'sha256' must be a SHA-256"),
    ({"sha256": "G" * 64}, "'data' 'sha256' must be a SHA-256"),
    ({"n_tokens": -1}, "'data' 'n_tokens' must be a positive integer (the token file's length "
                       "in ids), got -1"),
    ({"n_tokens": 0}, "'data' 'n_tokens' must be a positive integer"),
    ({"n_tokens": 2**63}, "'data' 'n_tokens' must be a positive integer"),
    ({"n_tokens": 17.0}, "'data' 'n_tokens' must be a positive integer"),
    ({"n_tokens": True}, "'data' 'n_tokens' must be a positive integer"),
    ({"tokens": ""}, "'data' 'tokens' must be the token file's path, got ''"),
    ({"tokens": "tokens\x00.bin"}, "'data' 'tokens' must be the token file's path"),
    ({"tokens": 3}, "'data' 'tokens' must be the token file's path, got 3"),
    ({"source": ["x"]},
     "'data' 'source' must be text (what the tokens were made from), got a list"),
    ({"source": None}, "'data' 'source' must be text"),
], ids=lambda value: None if isinstance(value, str) else repr(value)[:60])
def test_a_damaged_data_block_is_refused_naming_the_field(tmp_path, change, needle):
    file = tmp_path / "checkpoint" / "state.json"
    with pytest.raises(CheckpointError) as err:
        check_state(training_state(data=dict(DATA, **change)), file)
    assert one_line(err).startswith(f"{file}: ")
    assert needle in str(err.value)


@pytest.mark.parametrize(("data", "needle"), [
    ({k: v for k, v in DATA.items() if k != "n_tokens"}, "'data' lacks 'n_tokens'"),
    ({"tokens": 3}, "'data' lacks 'source'"),
    ("tokens.bin", "'data' is not an object of source, tokens, n_tokens, dtype, sha256, got "
                   "'tokens.bin'"),
], ids=["no-n_tokens", "tokens-only", "a-string"])
def test_a_data_block_lacking_a_field_is_refused_naming_it(tmp_path, data, needle):
    file = tmp_path / "state.json"
    with pytest.raises(CheckpointError) as err:
        check_state(training_state(data=data), file)
    assert needle in one_line(err)
