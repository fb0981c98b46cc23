"""`gptspec generate`: text from a checkpoint, streamed; bad input gets one clear line."""

from __future__ import annotations

import io

import pytest

from gptspec import reference as R
from gptspec.cli import main
from gptspec.cli.generate import TextStream
from gptspec.fast.checkpoint import save_model
from gptspec.fast.tokenizer import Tokenizer
from gptspec.spec import GPTConfig, init_parameters

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small byte-level model with large weights (peaked next-token distributions)."""
    path = tmp_path_factory.mktemp("ckpt")
    tokenizer = Tokenizer.byte_level(special_tokens=[EOT])
    config = GPTConfig(vocab_size=tokenizer.vocab_size, n_ctx=16, d_model=32, n_layers=2,
                       n_heads=4, d_ff=64)
    params = init_parameters(config, seed=3, std=0.5)
    save_model(path, params, config)
    tokenizer.save(path / "tokenizer.json")
    return path, config, params, tokenizer


def run(capsys, *argv):
    code = main(["generate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def expected_text(checkpoint, prompt_text, n, **options):
    """The reference loop's continuation (float64), decoded, end-of-text left out."""
    path, config, params, tokenizer = checkpoint
    prompt = tokenizer.encode(prompt_text) or [tokenizer.eot_token]
    [tokens] = R.generate([prompt], params, config, n, eot_token=tokenizer.eot_token,
                          **options)
    return tokenizer.decode([t for t in tokens if t != tokenizer.eot_token])


def test_greedy_text_is_the_reference_continuation(checkpoint, capsys):
    path = str(checkpoint[0])
    code, out, err = run(capsys, "--checkpoint", path, "--prompt", "Hello", "--temperature", "0",
                         "--max-new-tokens", "20", "--dtype", "float64")
    assert code == 0, err
    assert out == "Hello" + expected_text(checkpoint, "Hello", 20, temperature=0) + "\n"


def test_sampling_is_seeded_and_top_k_1_is_greedy(checkpoint, capsys):
    base = ["--checkpoint", str(checkpoint[0]), "--prompt", "ab", "--max-new-tokens", "12"]
    first = run(capsys, *base, "--seed", "7", "--top-k", "5", "--top-p", "0.9")
    again = run(capsys, *base, "--seed", "7", "--top-k", "5", "--top-p", "0.9")
    assert first[0] == 0 and first == again
    greedy = run(capsys, *base, "--temperature", "0", "--dtype", "float64")
    top1 = run(capsys, *base, "--top-k", "1", "--seed", "3", "--dtype", "float64")
    assert top1 == greedy


def test_a_prompt_longer_than_the_context_is_cropped_with_a_warning(checkpoint, capsys):
    path, config = str(checkpoint[0]), checkpoint[1]
    prompt = "the quick brown fox jumps over"  # 30 bytes > n_ctx = 16
    code, out, err = run(capsys, "--checkpoint", path, "--prompt", prompt, "--temperature",
                         "0", "--max-new-tokens", "5", "--dtype", "float64")
    assert code == 0
    assert "warning" in err and str(config.n_ctx) in err and len(err.strip().splitlines()) == 1
    assert out == prompt + expected_text(checkpoint, prompt[-config.n_ctx:], 5,
                                         temperature=0) + "\n"


def test_empty_prompt_starts_a_document_and_zero_tokens_print_the_prompt(checkpoint, capsys):
    path = str(checkpoint[0])
    code, out, _ = run(capsys, "--checkpoint", path, "--prompt", "", "--temperature", "0",
                       "--max-new-tokens", "6", "--dtype", "float64")
    assert code == 0 and out == expected_text(checkpoint, "", 6, temperature=0) + "\n"
    code, out, _ = run(capsys, "--checkpoint", path, "--prompt", "xyz", "--max-new-tokens", "0")
    assert code == 0 and out == "xyz\n"


@pytest.mark.parametrize("option, value, named", [
    ("--top-k", "0", "--top-k"),
    ("--top-k", "-3", "--top-k"),
    ("--top-p", "0", "--top-p"),
    ("--top-p", "1.5", "--top-p"),
    ("--top-p", "nan", "--top-p"),
    ("--temperature", "-0.5", "--temperature"),
    ("--temperature", "inf", "--temperature"),
    ("--max-new-tokens", "-1", "--max-new-tokens"),
])
def test_bad_settings_get_one_line_naming_the_option(checkpoint, capsys, option, value, named):
    code, out, err = run(capsys, "--checkpoint", str(checkpoint[0]), "--prompt", "a",
                         option, value)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and named in err


def _copy(checkpoint, tmp_path):
    src = checkpoint[0]
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    return tmp_path


@pytest.mark.parametrize("damage, named", [
    ("missing dir", "does not exist"),
    ("no model", "model.safetensors"),
    ("truncated model", "model.safetensors"),
    ("flipped byte", "corrupt"),
    ("no tokenizer", "tokenizer.json"),
    ("garbage tokenizer", "tokenizer"),
])
def test_a_missing_or_corrupt_checkpoint_gets_one_line(checkpoint, capsys, tmp_path, damage,
                                                        named):
    path = _copy(checkpoint, tmp_path)
    model = path / "model.safetensors"
    data = model.read_bytes()
    if damage == "missing dir":
        path = tmp_path / "nowhere"
    elif damage == "no model":
        model.unlink()
    elif damage == "truncated model":
        model.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        model.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "no tokenizer":
        (path / "tokenizer.json").unlink()
    else:
        (path / "tokenizer.json").write_text("{not json")
    code, out, err = run(capsys, "--checkpoint", str(path), "--prompt", "a")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and named in err, err


def test_text_streams_token_by_token_and_holds_back_split_characters():
    tokenizer = Tokenizer.byte_level()
    sink = io.StringIO()
    stream = TextStream(tokenizer, sink)
    writes = []
    for byte in "hé!".encode():
        stream.write(byte)
        writes.append(sink.getvalue())
    stream.close()
    # "é" is two bytes: nothing is printed for its first, the whole character with its last
    assert writes == ["h", "h", "hé", "hé!"]
    assert sink.getvalue() == "hé!"


def test_streaming_prints_before_generation_ends(checkpoint, monkeypatch, capsys):
    """Each token is written to stdout before the next one is sampled."""
    from gptspec.cli import generate as cli_generate
    from gptspec.fast import generate as fast_generate

    events = []
    sample, write = fast_generate.sample, cli_generate.TextStream.write

    def spy_sample(*args, **kwargs):
        events.append("sample")
        return sample(*args, **kwargs)

    def spy_write(self, token):
        events.append("write")
        return write(self, token)

    monkeypatch.setattr(fast_generate, "sample", spy_sample)
    monkeypatch.setattr(cli_generate.TextStream, "write", spy_write)
    code = main(["generate", "--checkpoint", str(checkpoint[0]), "--prompt", "Hi",
                 "--temperature", "0", "--max-new-tokens", "4", "--dtype", "float64"])
    assert code == 0
    _, config, params, tokenizer = checkpoint
    [tokens] = R.generate([tokenizer.encode("Hi")], params, config, 4, temperature=0)
    assert tokenizer.eot_token not in tokens  # (else the last step would print nothing)
    assert events == ["sample", "write"] * 4


def test_a_utf8_prompt_under_the_c_locale(checkpoint):
    """Under LC_ALL=C (PYTHONUTF8=0) the prompt 'héllo' reached Python as surrogates and
    was refused as "not valid Unicode: lone surrogate"; its bytes are valid UTF-8."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"}
    env.pop("PYTHONIOENCODING", None)
    done = subprocess.run([sys.executable, "-m", "gptspec", "generate", "--checkpoint",
                           str(checkpoint[0]), "--prompt", "héllo", "--max-new-tokens", "1"],
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"h\\xe9llo")  # an ASCII terminal gets escapes


def test_a_special_token_in_the_prompt_is_refused_with_a_remedy_generate_has(checkpoint, capsys):
    """The tokenizer's own advice ("allow special tokens") named no flag of generate's."""
    code, out, err = run(capsys, "--checkpoint", str(checkpoint[0]), "--prompt", f"a {EOT} b")
    assert code == 2 and out == ""
    assert err.strip() == (f"gptspec generate: error: --prompt contains the special token "
                           f"'{EOT}', which generate does not read in a prompt; remove it")
