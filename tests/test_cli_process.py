"""The ``gptspec`` command as a process: what a shell, a pipe or a batch system does to it.

Each test runs ``python -m gptspec`` in a child process, since what is tested belongs to
the process: signals (Ctrl-C during the imports, SIGTERM from ``kill`` or ``docker
stop``), standard output closed by the caller, full, or read by someone who stops
reading (``| head``). Every case ends in at most one line on standard error, a status a
shell understands (2 for a bad stream, 130/143 for SIGINT/SIGTERM, 141 for a reader that
went away) and no work lost: a training run saves its checkpoint, a conformance run
writes the checks it finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stop_signals import stop_signals_by_default

from gptspec.fast.checkpoint import save_model
from gptspec.fast.tokenizer import Tokenizer
from gptspec.spec import GPTConfig, init_parameters

GPTSPEC = [sys.executable, "-m", "gptspec"]
TEXT = "To be, or not to be, that is the question. " * 40
TRAIN = ["train", "--preset", "tiny", "--vocab-size", "256", "--batch-size", "2",
         "--eval-interval", "2", "--eval-batches", "1", "--warmup", "1", "--no-progress"]


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) <= 1 and "Traceback" not in stderr, stderr
    return lines[0] if lines else ""


def _to_a_reader_gone(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run with standard output a pipe whose reading end is already closed: the first
    write fails with EPIPE, as under ``| head`` once head has exited."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*GPTSPEC, *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=300, **kwargs)
    finally:
        os.close(write)


def _wait_until_loaded(pid: int, library: str, timeout: float = 120.0) -> None:
    """Wait until the process has mapped a shared library whose path names ``library``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if library in Path(f"/proc/{pid}/maps").read_text():
                return
        except OSError:
            pass
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not load {library} in {timeout} s")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model")
    tokenizer = Tokenizer.byte_level()
    config = GPTConfig(vocab_size=tokenizer.vocab_size, n_ctx=16, d_model=16, n_layers=1,
                       n_heads=2, d_ff=32)
    save_model(path, init_parameters(config, seed=0), config)
    tokenizer.save(path / "tokenizer.json")
    return path


@pytest.mark.parametrize("command", ["info", "encode", "generate"])
def test_a_reader_that_went_away_stops_the_command_quietly_with_141(command, model, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    args = {"info": ["info", "gpt2"],
            "encode": ["tokenizer", "encode", "--tokenizer", str(model / "tokenizer.json"),
                       "--input", str(text)],
            "generate": ["generate", "--checkpoint", str(model), "--prompt", "To be",
                         "--max-new-tokens", "8", "--seed", "0"]}[command]
    done = _to_a_reader_gone(args)
    assert done.returncode == 141, done.stderr
    assert _one_line(done.stderr) == ""  # what a pipeline's reader chose to end is no error


def test_a_training_run_whose_reader_goes_away_saves_its_checkpoint(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    proc = subprocess.Popen([*GPTSPEC, *TRAIN, "--data", str(corpus), "--out", str(out),
                             "--steps", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:  # read until two evaluations went by, then stop reading
        if line.startswith("step 4:"):
            break
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141
    line = _one_line(err)
    assert "cannot write to standard output" in line and "checkpoint saved" in line
    step = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    assert step >= 4 and f"stopped at step {step}" in line


def test_standard_output_closed_by_the_caller_is_one_line():
    done = subprocess.run(["bash", "-c", 'exec "$@" >&-', "bash", *GPTSPEC, "info", "gpt2"],
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2
    assert _one_line(done.stderr) == ("gptspec info: error: standard output is closed; "
                                      "info prints its table there")


@pytest.mark.parametrize(("argv", "why"), [
    (["conformance", "--list-checks"], "the list is printed there"),
    (["experiment", "tying", "--plan"], "--plan prints the plan there"),
    (["conformance", "--backend", "reference", "--check", "softmax.differential"],
     "the checks' verdicts are printed there")])
def test_a_listing_to_a_closed_standard_output_is_one_line(argv, why):
    # experiment --plan printed into the void and exited 0 (issue 29)
    done = subprocess.run(["bash", "-c", 'exec "$@" >&-', "bash", *GPTSPEC, *argv],
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2
    assert _one_line(done.stderr) == (f"gptspec {argv[0]}: error: standard output is "
                                      f"closed; {why}")


def test_a_full_standard_output_is_one_line():
    with open("/dev/full", "w") as full:
        done = subprocess.run([*GPTSPEC, "info", "gpt2"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert done.returncode == 2
    assert _one_line(done.stderr) == ("gptspec info: error: cannot write to standard output: "
                                      "No space left on device")


@pytest.mark.parametrize(("signum", "status", "word"),
                         [(signal.SIGINT, 130, "interrupted"),
                          (signal.SIGTERM, 143, "terminated"),
                          (signal.SIGHUP, 129, "hung up (SIGHUP)")],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_while_the_modules_are_imported_is_one_line(signum, status, word):
    # the command has started once it loads NumPy (gptspec.cli itself does not); torch
    # and Hypothesis take a second or more to import after it: the signal lands there.
    # (Before the command starts, a Ctrl-C is Python's own: a loaded machine once took
    # longer than a fixed 0.8 s to get there.)
    proc = subprocess.Popen([*GPTSPEC, "conformance", "--profile", "quick"],
                            preexec_fn=stop_signals_by_default, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_until_loaded(proc.pid, "numpy")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert _one_line(err) == f"gptspec conformance: {word}"


def test_sigterm_during_a_conformance_run_reports_the_checks_it_finished(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.Popen([*GPTSPEC, "conformance", "--profile", "quick", "--report",
                             str(report)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    finished = 0
    for line in proc.stdout:
        finished += line.startswith("PASS")
        if finished == 3:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert _one_line(err) == "gptspec conformance: terminated"
    (run,) = json.loads(report.read_text())["runs"]
    assert run["settings"]["interrupted"] is True
    assert len(run["checks"]) >= 3 and all(c["status"] == "pass" for c in run["checks"])


STOP_IN_A_FINALIZER = """
import signal, sys
from gptspec import cli

signal.signal(signal.SIGINT, signal.default_int_handler)  # even where inherited as ignored
signal.signal(signal.SIGTERM, cli._terminate)
sys.unraisablehook = cli._stop_again


class Finalized:
    def __del__(self):  # where Python ignores what is raised, as in a gc callback
        raise cli.{stop}()


try:
    Finalized()
    import time
    time.sleep(5)  # the stop comes back within milliseconds
    print("went on")
except KeyboardInterrupt as stop:
    print(type(stop).__name__)
"""


@pytest.mark.parametrize("stop", ["Terminated", "KeyboardInterrupt"])
def test_a_stop_raised_where_python_ignores_exceptions_still_stops(stop):
    # SIGTERM once landed in Hypothesis's garbage-collector callback: Python printed a
    # traceback, ignored it, and the conformance run went on to its end with status 0
    code = STOP_IN_A_FINALIZER.format(stop=stop)
    if stop == "KeyboardInterrupt":
        code = code.replace("cli.KeyboardInterrupt()", "KeyboardInterrupt()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == stop, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("stop", "status", "word"),
                         [("KeyboardInterrupt", 130, "interrupted"),
                          ("Terminated", 143, "terminated")])
def test_an_import_error_caused_by_a_stop_is_reported_as_the_stop(stop, status, word,
                                                                  monkeypatch, capsys):
    # a Ctrl-C while NumPy's C extension loads surfaces as NumPy's own ImportError
    # ("IMPORTANT: PLEASE READ THIS …"), whose context is the KeyboardInterrupt
    from gptspec import cli
    from gptspec.cli import info

    def interrupted_import(args):
        try:
            raise (cli.Terminated() if stop == "Terminated" else KeyboardInterrupt())
        except KeyboardInterrupt:
            raise ImportError("IMPORTANT: PLEASE READ THIS FOR ADVICE") from None

    monkeypatch.setattr(info, "run", interrupted_import)
    assert cli.main(["info", "gpt2"]) == status
    assert capsys.readouterr().err == f"gptspec info: {word}\n"


def test_an_error_after_a_stop_signal_that_left_no_trace_is_reported_as_the_stop(monkeypatch,
                                                                               capsys):
    # SIGTERM while NumPy's C extension imported "datetime": the extension swallowed the
    # stop and raised an ImportError of its own with no trace of it
    from gptspec import cli
    from gptspec.cli import info

    def swallowed(args):
        raise ImportError('PyCapsule_Import could not import module "datetime"')

    monkeypatch.setattr(info, "run", swallowed)
    monkeypatch.setattr(cli, "_RECEIVED", [signal.SIGTERM])
    assert cli.main(["info", "gpt2"]) == 143
    assert capsys.readouterr().err == "gptspec info: terminated\n"
    monkeypatch.setattr(cli, "_RECEIVED", [signal.SIGHUP])  # (a SIGHUP read as Ctrl-C, 130)
    assert cli.main(["info", "gpt2"]) == 129
    assert capsys.readouterr().err == "gptspec info: hung up (SIGHUP)\n"
    monkeypatch.setattr(cli, "_RECEIVED", [])  # with no stop received it is an error
    assert cli.main(["info", "gpt2"]) == 1
    assert "ImportError: PyCapsule_Import" in capsys.readouterr().err


def test_training_with_both_output_streams_closed_trains_and_saves(tmp_path):
    # the progress bar wrote to a closed standard error and crashed the run (issue 29)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    progress = [a for a in TRAIN if a != "--no-progress"]
    done = subprocess.run(["bash", "-c", 'exec "$@" >&- 2>&-', "bash", *GPTSPEC, *progress,
                           "--data", str(corpus), "--out", str(out), "--steps", "2"],
                          timeout=300)
    assert done.returncode == 0
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 2


def test_a_prompt_that_is_not_utf8_is_named_by_its_byte(model):
    """Bytes the locale cannot decode reach Python as lone surrogates: the line named
    "lone surrogate '\\udcff'", Python's spelling, not the byte the user gave."""
    done = subprocess.run([*map(os.fsencode, GPTSPEC), b"generate", b"--checkpoint",
                           os.fsencode(model), b"--prompt", b"ab\xff", b"--max-new-tokens", b"1"],
                          capture_output=True, timeout=300,
                          env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert done.returncode == 2
    line = _one_line(done.stderr.decode("utf-8", "replace"))
    assert line.endswith("--prompt is not valid UTF-8 (byte 2: b'\\xff')"), line


def test_a_training_run_started_with_ctrl_c_ignored_stays_immune_to_it(tmp_path):
    # a shell's background job inherits SIGINT ignored; the training loop's own handler
    # replaced that, and Ctrl-C in the terminal stopped a job meant to be immune (issue 29)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    proc = subprocess.Popen([*GPTSPEC, *TRAIN, "--data", str(corpus), "--out", str(out),
                             "--steps", "6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout is not None
    for line in proc.stdout:  # training has begun: its handlers are in place
        if line.startswith("step 2:"):
            proc.send_signal(signal.SIGINT)
            break
    proc.stdout.read()
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 6


@pytest.mark.parametrize("command", [["conformance", "--check", "softmax.differential",
                                      "--dtype", "float64", "--profile", "quick"],
                                     TRAIN + ["--data", "nope.txt", "--out", "nope"]])
def test_an_address_space_too_small_to_load_a_library_is_said_as_that(command, tmp_path):
    """Under ``ulimit -v`` 300 MiB torch's (or OpenMP's) library cannot be mapped: it was
    "ImportError: … (GPTSPEC_TRACEBACK=1 shows where)", and for conformance the false
    "cannot write to standard output"."""
    import resource

    limit = 300 << 20

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run(GPTSPEC + command, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, preexec_fn=limited)
    assert "Traceback" not in proc.stderr and "GPTSPEC_TRACEBACK" not in proc.stderr
    assert "standard output" not in proc.stderr
    if proc.returncode != 0:  # where the libraries fit, the command simply runs
        line = _one_line(proc.stderr)
        assert proc.returncode == 2
        # said by the command, or as the backend's import failure (conformance)
        assert ("address-space limit (ulimit -v) is 300 MiB" in line
                or "cannot import backend module" in line and "failed to map" in line), line


def test_writing_stdout_names_only_errors_of_a_write():
    from gptspec.cli import CLIError, writing_stdout

    with pytest.raises(CLIError, match="cannot write to standard output: No space left"):
        with writing_stdout():
            raise OSError(28, "No space left on device")
    unloadable = OSError("libgomp.so.1: failed to map segment from shared object")
    with pytest.raises(OSError) as raised, writing_stdout():
        raise unloadable
    assert raised.value is unloadable
    # too many open files is an open's: blamed on standard output under ulimit -n 12
    with pytest.raises(CLIError, match=r"Too many open files: this process may have \d+ "
                                       r"files open at once \(ulimit -n\)"):
        with writing_stdout():
            raise OSError(24, "Too many open files")


def test_two_ctrl_cs_end_a_run_whose_worker_ignores_sigterm(tmp_path):
    """The second SIGINT landed while the judge stopped the worker, before it killed the
    worker's group: the judge said "interrupted" and then waited for ever at exit."""
    pid_file = tmp_path / "worker.pid"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptspec", "conformance", "--check", "gpt_forward.differential",
         "--profile", "quick", "--adjudicate-with", "none", "--timeout", "300",
         "--backend", "hostile_backends:HangsIgnoringSigterm"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent),
             "GPTSPEC_TEST_PID_FILE": str(pid_file)}, preexec_fn=stop_signals_by_default)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        # 130, or ended by the second SIGINT itself where it came once the command was done
        # (Python's exit then runs under the default handler: a shell says 130 for both)
        assert proc.returncode in (130, -signal.SIGINT), err
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid_file.exists() and pid_file.read_text():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("command", ["generate", "train", "tokenizer"])
@pytest.mark.parametrize("stderr", ["full", "closed"])
def test_a_standard_error_that_cannot_be_written_loses_nothing(command, model, tmp_path, stderr):
    # a warning (the prompt cut to the context), the progress bar, and then the error
    # handler's own line raised ENOSPC on 2>/dev/full: status 1, no text, no checkpoint,
    # no tokenizer (issue 29)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    args = {"generate": ["generate", "--checkpoint", str(model), "--prompt", TEXT[:60],
                         "--max-new-tokens", "2"],
            "train": [*(a for a in TRAIN if a != "--no-progress"), "--data", str(corpus),
                      "--out", str(tmp_path / "run"), "--steps", "2"],
            "tokenizer": ["tokenizer", "train", "--data", str(corpus), "--vocab-size", "260",
                          "--out", str(tmp_path / "tokenizer.json")]}[command]
    # closed (2>&-), tokenizer train's progress bar wrote to None: status 1, no file
    with open("/dev/full", "w") as full:
        done = subprocess.run([*GPTSPEC, *args], stdout=subprocess.PIPE, text=True,
                              timeout=300, stderr=full if stderr == "full" else None,
                              preexec_fn=None if stderr == "full" else (lambda: os.close(2)))
    assert done.returncode == 0
    if command == "generate":
        assert done.stdout.startswith(TEXT[:60])
    elif command == "train":
        assert json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())[
            "step"] == 2
    else:
        assert (tmp_path / "tokenizer.json").is_file()


def test_an_error_with_a_standard_error_that_cannot_be_written_still_fails():
    with open("/dev/full", "w") as full:
        done = subprocess.run([*GPTSPEC, "info", "no-such-preset"], stdout=subprocess.PIPE,
                              stderr=full, timeout=120)
    assert done.returncode == 2


def test_a_home_that_cannot_be_written_gives_one_line_warnings(tmp_path, model):
    """With HOME unwritable the kernels cannot be built and matplotlib has no config
    folder: Python's warning form (file:line and the source line) and matplotlib's two
    long log lines used to surround the output."""
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    (tmp_path / "text.txt").write_text(TEXT)
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
           "XDG_CONFIG_HOME": str(home / "config"), "TORCH_EXTENSIONS_DIR": str(home / "ext")}
    env.pop("MPLCONFIGDIR", None)
    for command in (["generate", "--checkpoint", str(model), "--prompt", "hi",
                     "--max-new-tokens", "2"],
                    [*TRAIN, "--data", str(tmp_path / "text.txt"), "--out",
                     str(tmp_path / "run"), "--steps", "2"]):
        proc = subprocess.run([*GPTSPEC, *command], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        for line in proc.stderr.splitlines():
            assert line.startswith(f"gptspec {command[0]}: warning: "), proc.stderr
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0


def test_a_hangup_saves_the_run_as_ctrl_c_does(tmp_path):
    """Closing the terminal (SIGHUP) ended `train` with status 129 and nothing saved since
    the last checkpoint; SIGINT and SIGTERM save first."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    proc = subprocess.Popen([*GPTSPEC, *TRAIN, "--data", str(corpus), "--out", str(out),
                             "--steps", "100000", "--checkpoint-interval", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=stop_signals_by_default)  # under nohup, SIGHUP came ignored
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 2:"):  # no checkpoint yet: the first save is at step 1000
            proc.send_signal(signal.SIGHUP)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=300) == 128 + signal.SIGHUP, proc.stderr.read() if proc.stderr else ""
    assert "interrupted at step" in rest
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] >= 2
