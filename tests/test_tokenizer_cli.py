"""``gptspec tokenizer train | encode | decode``, and each bad input's one-line error."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptspec.cli import main
from gptspec.fast.tokenizer import Tokenizer
from gptspec.fast.tokenizer_files import TokenizerFileError

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "It's 1234 o'clock — naïve 中文 😀.\n") * 20


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture
def trained(tmp_path, corpus) -> Path:
    out = tmp_path / "tok.json"
    assert main(["tokenizer", "train", "--data", str(corpus), "--vocab-size", "320",
                 "--out", str(out), "--quiet"]) == 0
    return out


def run_cli(args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptspec", *args], input=stdin,
                          capture_output=True, timeout=120)


def error_of(capsys, args) -> str:
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_train_writes_a_loadable_tokenizer(trained):
    tok = Tokenizer.load(trained)
    assert tok.vocab_size == 320 and tok.eot_token == 319
    assert tok.merges == Tokenizer.train(TEXT, 320).merges


@pytest.mark.parametrize("fmt", ["tiktoken", "hf"])
def test_train_in_other_formats(tmp_path, corpus, fmt):
    out = tmp_path / f"tok.{fmt}"
    assert main(["tokenizer", "train", "--data", str(corpus), "--vocab-size", "300",
                 "--out", str(out), "--format", fmt, "--quiet"]) == 0
    assert Tokenizer.load(out).merges == Tokenizer.train(TEXT, 300).merges


def test_encode_decode_through_stdin_and_stdout(trained):
    done = run_cli(["tokenizer", "encode", "--tokenizer", str(trained)], TEXT.encode())
    assert done.returncode == 0, done.stderr
    ids = [int(t) for t in done.stdout.split()]
    assert ids == Tokenizer.load(trained).encode(TEXT)
    back = run_cli(["tokenizer", "decode", "--tokenizer", str(trained)], done.stdout)
    assert back.returncode == 0 and back.stdout.decode() == TEXT


def test_encode_decode_through_files(tmp_path, trained, corpus, monkeypatch):
    ids_path, text_path = tmp_path / "ids.json", tmp_path / "back.txt"
    assert main(["tokenizer", "encode", "--tokenizer", str(trained), "--input", str(corpus),
                 "--output", str(ids_path), "--json"]) == 0
    assert json.loads(ids_path.read_text()) == Tokenizer.load(trained).encode(TEXT)
    assert main(["tokenizer", "decode", "--tokenizer", str(trained), "--input", str(ids_path),
                 "--output", str(text_path)]) == 0
    assert text_path.read_text(encoding="utf-8") == TEXT


def test_train_shows_a_progress_bar(tmp_path, corpus):
    done = run_cli(["tokenizer", "train", "--data", str(corpus), "--vocab-size", "300",
                    "--out", str(tmp_path / "t.json")])
    assert done.returncode == 0 and b"learning merges" in done.stderr and b"43/43" in done.stderr


def test_special_tokens_need_allow_special(capsys, tmp_path, trained):
    src = tmp_path / "s.txt"
    src.write_text("a<|endoftext|>b")
    line = error_of(capsys, ["tokenizer", "encode", "--tokenizer", str(trained),
                             "--input", str(src)])
    assert "<|endoftext|>" in line and "not allowed" in line
    out = tmp_path / "ids.txt"
    assert main(["tokenizer", "encode", "--tokenizer", str(trained), "--input", str(src),
                 "--output", str(out), "--allow-special"]) == 0
    assert "319" in out.read_text().split()


def test_missing_and_unreadable_files(capsys, tmp_path, corpus, trained):
    out = str(tmp_path / "t.json")
    line = error_of(capsys, ["tokenizer", "train", "--data", str(tmp_path / "nope.txt"),
                             "--vocab-size", "300", "--out", out])
    assert "does not exist" in line
    assert "is a directory" in error_of(capsys, ["tokenizer", "train", "--data", str(tmp_path),
                                                 "--vocab-size", "300", "--out", out])
    assert "does not exist" in error_of(capsys, ["tokenizer", "encode", "--tokenizer",
                                                 str(tmp_path / "none.json")])
    assert "folder" in error_of(capsys, ["tokenizer", "train", "--data", str(corpus),
                                         "--vocab-size", "300", "--out",
                                         str(tmp_path / "no" / "t.json")])
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.txt"
        locked.write_text("x")
        locked.chmod(0)
        assert "cannot read" in error_of(capsys, ["tokenizer", "train", "--data", str(locked),
                                                  "--vocab-size", "300", "--out", out])


def test_input_from_a_pipe(tmp_path, trained):
    """``--input <(command)`` and a named pipe read like a file; a pipe nobody writes to,
    a device that never ends, and a pipe that gives more than memory allows are refused
    in one line."""
    text = b"Speak, speak.\n"
    read, write = os.pipe()
    os.write(write, text)
    os.close(write)
    proc = subprocess.run([sys.executable, "-m", "gptspec", "tokenizer", "encode",
                           "--tokenizer", str(trained), "--input", f"/dev/fd/{read}"],
                          pass_fds=(read,), capture_output=True, timeout=120)
    os.close(read)
    expected = Tokenizer.load(trained).encode(text.decode())
    assert proc.returncode == 0, proc.stderr
    assert [int(t) for t in proc.stdout.split()] == expected

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = run_cli(["tokenizer", "train", "--data", str(fifo), "--vocab-size", "300",
                    "--out", str(tmp_path / "t.json")])
    assert proc.returncode == 2 and b"gave nothing: no process was writing" in proc.stderr
    assert not (tmp_path / "t.json").exists()
    proc = run_cli(["tokenizer", "encode", "--tokenizer", str(trained), "--input", "/dev/zero"])
    assert proc.returncode == 2 and b"is not a regular file or a pipe" in proc.stderr

    endless = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    assert endless.stdout is not None
    fd = endless.stdout.fileno()
    limit = 1 << 31  # an address-space limit this process and its libraries fit in

    def limited() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        proc = subprocess.run([sys.executable, "-m", "gptspec", "tokenizer", "encode",
                               "--tokenizer", str(trained), "--input", f"/dev/fd/{fd}"],
                              pass_fds=(fd,), capture_output=True, timeout=120,
                              preexec_fn=limited)
    finally:
        endless.kill()
        endless.wait()
    assert proc.returncode == 2, proc.stderr
    assert b"gives more than" in proc.stderr and b"address-space limit" in proc.stderr


@pytest.mark.parametrize("vocab_size, message", [
    ("100", "below 256"), ("256", "below 256"), ("99999999999", "absurdly large"),
])
def test_bad_vocab_size(capsys, tmp_path, corpus, vocab_size, message):
    out = tmp_path / "t.json"
    line = error_of(capsys, ["tokenizer", "train", "--data", str(corpus), "--vocab-size",
                             vocab_size, "--out", str(out)])
    assert message in line and not out.exists()


def test_invalid_utf8_input(capsys, tmp_path, trained):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine so far \xff\xfe then not")
    out = tmp_path / "t2.json"
    line = error_of(capsys, ["tokenizer", "train", "--data", str(bad), "--vocab-size", "300",
                             "--out", str(out)])
    assert "not valid UTF-8" in line and "byte 12" in line and not out.exists()
    line = error_of(capsys, ["tokenizer", "encode", "--tokenizer", str(trained), "--input",
                             str(bad)])
    assert "not valid UTF-8" in line


def test_bad_token_ids(capsys, tmp_path, trained):
    ids = tmp_path / "ids.txt"
    for content, message in (("1 2 x3", "not an integer"), ("1 2 320", "not in the vocabulary"),
                             ("[1, 2", "not closed"), ("-4", "not in the vocabulary")):
        ids.write_text(content)
        line = error_of(capsys, ["tokenizer", "decode", "--tokenizer", str(trained),
                                 "--input", str(ids)])
        assert message in line, line


def corruptions(data: bytes) -> dict[str, bytes]:
    doc = json.loads(data)
    undefined = dict(doc, merges=[[0, 999]])
    return {
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "garbage": b"\x00\x01\x02 not a tokenizer",
        "not utf-8": b"{\xff\xfe}",
        "wrong version": json.dumps(dict(doc, version=99)).encode(),
        "missing merges": json.dumps({k: v for k, v in doc.items() if k != "merges"}).encode(),
        "undefined token": json.dumps(undefined).encode(),
        "bad special id": json.dumps(dict(doc, special_tokens={"<|endoftext|>": 3})).encode(),
        "bad base": json.dumps(dict(doc, base=[0] * 256)).encode(),
    }


@pytest.mark.parametrize("kind", list(corruptions(json.dumps({"merges": []}).encode())))
def test_corrupt_tokenizer_file(capsys, tmp_path, trained, kind):
    bad = tmp_path / "bad.json"
    bad.write_bytes(corruptions(trained.read_bytes())[kind])
    with pytest.raises(TokenizerFileError) as err:
        Tokenizer.load(bad)
    assert "\n" not in str(err.value) and str(bad) in str(err.value)
    line = error_of(capsys, ["tokenizer", "encode", "--tokenizer", str(bad)])
    assert str(bad) in line


def test_truncated_tiktoken_and_hf_files(tmp_path, trained):
    tok = Tokenizer.load(trained)
    for fmt in ("tiktoken", "hf"):
        path = tmp_path / f"t.{fmt}"
        tok.save(path, fmt)
        data = path.read_bytes()
        # cut inside a line: a tiktoken file cut exactly at a line end is a valid,
        # smaller vocabulary, which no reader can tell from the whole one
        mid_line = data.index(b"\n", len(data) // 3) - 2
        for cut in (mid_line, len(data) - 7):
            path.write_bytes(data[:cut])
            with pytest.raises(TokenizerFileError) as err:
                Tokenizer.load(path, format=fmt)
            assert "\n" not in str(err.value)


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, corpus, trained, monkeypatch):
    before = trained.read_bytes()

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    assert main(["tokenizer", "train", "--data", str(corpus), "--vocab-size", "300",
                 "--out", str(trained), "--quiet"]) == 2
    assert trained.read_bytes() == before
    assert sorted(p.name for p in trained.parent.iterdir()) == ["corpus.txt", "tok.json"]


def test_decode_to_stdout_keeps_bytes_exact(trained, monkeypatch, capsysbinary):
    tok = Tokenizer.load(trained)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        " ".join(map(str, tok.encode("naïve 😀"))).encode())))
    assert main(["tokenizer", "decode", "--tokenizer", str(trained)]) == 0
    assert capsysbinary.readouterr().out == "naïve 😀".encode()


def test_dash_is_a_standard_stream_where_one_is_taken_and_refused_elsewhere(tmp_path, trained):
    """``-`` was read as a file named "-": `--input -` said "- does not exist", `--output -`
    and `conformance --report -` created a file called "-"."""
    text = b"Speak, speak.\n"
    proc = subprocess.run([sys.executable, "-m", "gptspec", "tokenizer", "encode",
                           "--tokenizer", str(trained), "--input", "-", "--output", "-"],
                          input=text, capture_output=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [int(t) for t in proc.stdout.split()] == Tokenizer.load(trained).encode(text.decode())
    proc = subprocess.run([sys.executable, "-m", "gptspec", "tokenizer", "train", "--data", "-",
                           "--vocab-size", "260", "--quiet", "--out", "t.json"],
                          input=TEXT.encode(), capture_output=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert Tokenizer.load(tmp_path / "t.json").vocab_size == 260
    for args in (["train", "--data", "-", "--out", "run", "--steps", "1"],
                 ["tokenizer", "encode", "--tokenizer", "-"],
                 ["conformance", "--report", "-", "--check", "one_hot.differential"],
                 ["train", "--data", "t.json", "--out", "-", "--steps", "1"],
                 ["conformance", "--save-failures", "-", "--check", "one_hot.differential"]):
        proc = subprocess.run([sys.executable, "-m", "gptspec", *args], capture_output=True,
                              timeout=120, cwd=tmp_path)
        said = proc.stderr
        assert proc.returncode == 2, (args, said)
        assert b"is not taken here" in said or b"not a standard stream" in said, (args, said)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "-").exists() and not (tmp_path / "run").exists()


def test_output_to_a_device(tmp_path, trained, corpus):
    """--output /dev/null and /dev/stdout were refused as "not a regular file"; a device
    that refuses the bytes (/dev/full) is a one-line error."""
    args = ["tokenizer", "encode", "--tokenizer", str(trained), "--input", str(corpus)]
    assert run_cli([*args, "--output", "/dev/null"]).returncode == 0
    proc = run_cli([*args, "--output", "/dev/stdout"])
    assert proc.returncode == 0 and proc.stdout.split() == run_cli(args).stdout.split()
    proc = run_cli([*args, "--output", "/dev/full"])
    assert proc.returncode == 2 and b"No space left on device" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_output_to_dev_stdout_appends_where_the_shell_sent_it(tmp_path, trained, corpus):
    """`--output /dev/stdout >> log` replaced log by a new file holding only the ids (the
    link was followed to the file and the file renamed over): the ids now go to the
    descriptor itself, after what log held."""
    log = tmp_path / "log.txt"
    log.write_bytes(b"earlier line\n")
    inode = log.stat().st_ino
    expected = run_cli(["tokenizer", "encode", "--tokenizer", str(trained),
                        "--input", str(corpus)]).stdout
    for name in ("/dev/stdout", "/proc/self/fd/1"):
        with open(log, "ab") as out:
            done = subprocess.run([sys.executable, "-m", "gptspec", "tokenizer", "encode",
                                   "--tokenizer", str(trained), "--input", str(corpus),
                                   "--output", name], stdout=out, timeout=120)
        assert done.returncode == 0
    assert log.stat().st_ino == inode
    assert log.read_bytes() == b"earlier line\n" + expected + expected
