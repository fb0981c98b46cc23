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
    CheckpointError,
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
