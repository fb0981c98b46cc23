"""The one way the project writes files: whole, or not at all."""

from __future__ import annotations

import os
import stat

import pytest

from gptspec.atomic_files import replacing, write_bytes, write_text


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_an_error_while_writing_keeps_the_old_file(tmp_path):
    target = tmp_path / "f.bin"
    write_bytes(target, b"good")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_an_error_naming_the_temporary_file_names_the_target(tmp_path):
    """A full disk while a library writes the temporary file (which it names in its
    error): the user reads the file they asked for, not a hidden name already removed."""
    import errno

    target = tmp_path / "f.bin"
    write_bytes(target, b"good")
    with pytest.raises(OSError) as caught, replacing(target) as tmp:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
    assert (caught.value.errno, caught.value.filename) == (errno.ENOSPC, str(target))
    with pytest.raises(PermissionError) as caught, replacing(target):
        raise PermissionError(errno.EACCES, "Permission denied", "/elsewhere")
    assert caught.value.filename == "/elsewhere"  # another file's error is left as it was
    assert target.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_parents_are_made_only_when_asked(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_text(tmp_path / "a" / "f.txt", "x")
    write_text(tmp_path / "a" / "f.txt", "x", make_parents=True)
    assert (tmp_path / "a" / "f.txt").read_text() == "x"


def test_the_file_gets_the_umasks_permissions_not_the_temporary_names(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.txt").stat().st_mode) == 0o644


def test_a_file_written_over_keeps_its_own_permissions(tmp_path):
    # as open(target, "w") keeps them: a private file stays private, a shared one shared
    for mode in (0o600, 0o640, 0o664):
        target = tmp_path / f"f{mode:o}.txt"
        target.write_text("old")
        target.chmod(mode)
        write_text(target, "new")
        assert stat.S_IMODE(target.stat().st_mode) == mode


def test_a_writer_that_puts_its_own_file_in_the_temporary_names_place_gets_the_umasks(
        tmp_path):
    # a library that writes a private temporary file of its own and renames it onto the
    # name it was given (transformers' model.safetensors) (issue 29)
    old = os.umask(0o022)
    try:
        with replacing(tmp_path / "f.bin") as tmp:
            own = tmp_path / "own"
            own.write_bytes(b"x")
            own.chmod(0o600)
            os.replace(own, tmp)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.bin").stat().st_mode) == 0o644


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    """A --out naming a symbolic link replaced the link with a plain file and left the
    file it pointed to stale; ``open(name, "w")`` writes the file pointed to."""
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    write_text(tmp_path / "link.json", "new")
    assert (tmp_path / "link.json").is_symlink()
    assert (tmp_path / "real.json").read_text() == "new"


def test_a_device_or_pipe_is_written_in_place(tmp_path):
    """--output /dev/null or /dev/stdout was refused ("exists and is not a regular file"):
    a stream has nothing to replace, so its bytes are written to it; a FIFO that nobody
    reads is an error, not a wait."""
    import threading

    write_bytes("/dev/null", b"discarded")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="no process reads from it"):
        write_bytes(fifo, b"x")
    got: list[bytes] = []
    ready = threading.Event()

    def reader() -> None:  # open before the writer; read until its bytes and their end
        import time

        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        ready.set()
        data, deadline = b"", time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer, nothing written yet
                chunk = None
            if chunk:
                data += chunk
            elif chunk == b"" and data:  # the writer closed after writing
                break
            else:
                time.sleep(0.01)
        os.close(fd)
        got.append(data)

    thread = threading.Thread(target=reader)
    thread.start()
    ready.wait(10)
    write_bytes(fifo, b"through the pipe")
    thread.join(10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name != "fifo"]
