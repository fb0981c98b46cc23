"""Backends that misbehave the way a careless or hostile one would, for the bad-input
corpus (tests/test_bad_input.py) and the process tests (tests/test_cli_process.py):
``gptspec conformance --backend hostile_backends:NAME`` must answer each in one line."""

from __future__ import annotations

import sys
import time

from gptspec.reference.output import gpt_forward


class Honest:
    """A correct backend: the reference itself, under the protocol's attributes."""

    protocol_version = 2
    name = "hostile"
    version = "0"
    device = "cpu"
    dtype = "float64"

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config)


class ExitsOnStart(Honest):
    """sys.exit(0) while being built: in the suite's own process this once ended the run
    with status 0, as if every check had passed."""

    def __init__(self) -> None:
        sys.exit(0)


def forgets_its_return(device=None, dtype=None):
    """A factory that builds its backend and returns None: it was told it spoke protocol 1
    (no protocol_version), which says nothing true about it."""
    Honest()


NOT_A_BACKEND = "hostile"  # a string: none of a backend's attributes


class InterruptsOnStart(Honest):
    def __init__(self) -> None:
        raise KeyboardInterrupt


class FailsInTwoLines(Honest):
    def __init__(self) -> None:
        raise RuntimeError("first line\nsecond line")


class NameRaises(Honest):
    @property
    def name(self) -> str:  # type: ignore[override]
        raise RuntimeError("no name today")


class UnknownDtype(Honest):
    dtype = "int7"


class Hangs(Honest):
    def forward(self, tokens, params, config):
        time.sleep(3600)


class Forks(Honest):
    """Its forward starts a child that outlives the call, holding the suite's standard
    output and error (``gptspec conformance … | cat`` waited for it); the child writes
    its pid to the file named by GPTSPEC_TEST_PID_FILE."""

    forked = False

    def forward(self, tokens, params, config):
        if not Forks.forked:
            Forks.forked = True
            import os

            if os.fork() == 0:
                _write_pid_and_sleep()
                os._exit(0)
        return super().forward(tokens, params, config)


def _write_pid_and_sleep() -> None:
    """A forked child's life: its pid into GPTSPEC_TEST_PID_FILE, then ten minutes asleep."""
    import os

    with open(os.environ["GPTSPEC_TEST_PID_FILE"], "w") as out:
        out.write(str(os.getpid()))
    time.sleep(600)


class EscapesItsGroup(Honest):
    """Its forward starts a grandchild in a session of its own (fork, setsid, fork), out of
    reach of the worker's process group, asleep for ten minutes; it writes its pid to the
    file named by GPTSPEC_TEST_PID_FILE."""

    forked = False

    def forward(self, tokens, params, config):
        if not EscapesItsGroup.forked:
            EscapesItsGroup.forked = True
            import os

            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    _write_pid_and_sleep()
                os._exit(0)
        return super().forward(tokens, params, config)


class HangsWritingItsPid(Honest):
    """Writes the worker's pid to GPTSPEC_TEST_PID_FILE, then hangs in forward."""

    def forward(self, tokens, params, config):
        import os

        with open(os.environ["GPTSPEC_TEST_PID_FILE"], "w") as out:
            out.write(str(os.getpid()))
        time.sleep(600)


class HangsIgnoringSigterm(Honest):
    """Ignores SIGTERM, writes the worker's pid to GPTSPEC_TEST_PID_FILE, then hangs in
    forward: a second Ctrl-C while the judge stopped it left the judge waiting for ever."""

    def forward(self, tokens, params, config):
        import os
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.environ["GPTSPEC_TEST_PID_FILE"], "w") as out:
            out.write(str(os.getpid()))
        time.sleep(600)


class Forges(Honest):
    """A name, version and error messages that would clear the terminal and print a
    verdict of their own."""

    name = "\x1b[2J\x1b[Hall checks passed\n"
    version = "1\r\x1b[32mPASS" + "x" * 10_000
    device = "cpu\x07"

    def forward(self, tokens, params, config):
        raise RuntimeError("\x1b[2J\x1b[Hall checks passed\r\n0 failed")


class Prints(Honest):
    """Prints, from Python and straight to the file descriptors, lines that would clear
    the terminal and pass for the judge's own verdict."""

    def forward(self, tokens, params, config):
        import os

        print("\x1b[2J\x1b[HPASS  gpt_forward.differential   0% of budget", flush=True)
        os.write(1, b"97 passed, 0 failed, 0 blocked, 0 not implemented\n")
        os.write(2, b"\x1b[31mFAIL\x1b[0m nothing\n")
        return super().forward(tokens, params, config)


class MovesTheDirectory(Honest):
    """Changes the working directory on every call (to the folder named by
    GPTSPEC_TEST_CHDIR), as a careless engine's cache might."""

    def __init__(self) -> None:
        import os

        os.chdir(os.environ["GPTSPEC_TEST_CHDIR"])

    def forward(self, tokens, params, config):
        import os

        os.chdir(os.environ["GPTSPEC_TEST_CHDIR"])
        return super().forward(tokens, params, config)


class ListsInAnyDtype(Honest):
    """Takes the dtype asked and declares it, but computes in float64 and returns plain
    Python lists: judged with bfloat16's budgets, float64 results always pass."""

    def __init__(self, dtype: str = "float64") -> None:
        self.dtype = dtype

    def forward(self, tokens, params, config):
        return super().forward(tokens, params, config).tolist()


class Float64InAnyDtype(ListsInAnyDtype):
    """The same, with the float64 results returned as a float64 array."""

    def forward(self, tokens, params, config):
        return Honest.forward(self, tokens, params, config)


class ObjectsInAnyDtype(ListsInAnyDtype):
    """The same, with the float64 results returned as a NumPy array of Python objects."""

    def forward(self, tokens, params, config):
        import numpy as np

        return np.array(Honest.forward(self, tokens, params, config), dtype=object)


class ComplexLogits(ListsInAnyDtype):
    """Correct real parts, and an imaginary part a real comparison would drop unseen."""

    def forward(self, tokens, params, config):
        return Honest.forward(self, tokens, params, config) + 5j


class HangsOnStart(Honest):
    """Its constructor never returns: with --no-isolate the suite's own process waits."""

    def __init__(self) -> None:
        time.sleep(3600)


class ExitsInForward(Honest):
    """os._exit(0) in a call: in the judge's own process (--no-isolate) the run ended with
    status 0 and no verdict."""

    def forward(self, tokens, params, config):
        import os

        os._exit(0)


class LeavesAThread(Honest):
    """Starts a thread that never ends: Python waits for it at exit, so the judge's own
    process (--no-isolate) never ended."""

    def forward(self, tokens, params, config):
        import threading

        threading.Thread(target=time.sleep, args=(3600,), name="endless").start()
        return super().forward(tokens, params, config)


class BlocksTheTimer(Honest):
    """Ignores SIGALRM, the in-process time limit, then hangs."""

    def forward(self, tokens, params, config):
        import signal

        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(3600)


class BlocksTheTimerOnStart(Honest):
    def __init__(self) -> None:
        import signal

        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(3600)


class PatchesTheReference(Honest):
    """Wrong logits (+1), and a constructor that rewrites the reference they are compared
    with to match: isolated, this forged a pass (issue 29)."""

    def __init__(self) -> None:
        import gptspec.reference.output as output

        self._right = output.gpt_forward
        output.gpt_forward = self.forward
        for module in list(sys.modules.values()):
            if getattr(module, "gpt_forward", None) is self._right:
                module.gpt_forward = self.forward

    def forward(self, tokens, params, config):
        return self._right(tokens, params, config) + 1.0


class RewritesTheReferenceLater(Honest):
    """Wrong logits, with the reference's code swapped during its first call, so that
    later checks compare against the backend itself."""

    def forward(self, tokens, params, config):
        import gptspec.reference.output as output

        right = gpt_forward(tokens, params, config)
        output.gpt_forward.__code__ = (lambda tokens, params, config: None).__code__
        return right + 1.0


class RewritesTheVerdict(Honest):
    """Wrong logits, and json.dumps replaced so that the worker's answer to the judge says
    "pass" where it said "fail" (hostile round 6)."""

    def __init__(self) -> None:
        import json

        encode = json.dumps

        def forged(obj, *args, **kwargs):
            if isinstance(obj, dict) and obj.get("status") in ("fail", "error"):
                obj = {**obj, "status": "pass", "worst_fraction": 0.01, "detail": ""}
            return encode(obj, *args, **kwargs)

        json.dumps = forged

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) + 1.0


class SetsPrintOptions(Honest):
    """Correct, and sets NumPy's legacy print mode (as doctests do): the judge's tables
    read the same, so this is no tampering."""

    def __init__(self) -> None:
        import numpy as np

        np.set_printoptions(legacy="1.25", precision=3, suppress=True)


class RewritesTheChannel(Honest):
    """Wrong logits, and its own send_bytes set on the worker's connection object (the
    class untouched), turning the answers' failures into passes."""

    def __init__(self) -> None:
        import gc
        import json
        from multiprocessing.connection import Connection

        for channel in [o for o in gc.get_objects() if isinstance(o, Connection)]:
            def send_bytes(data, *args, _send=channel.send_bytes, **kwargs):
                try:
                    answer = json.loads(bytes(data))
                except ValueError:  # an array's bytes (isolation sends them raw)
                    return _send(data, *args, **kwargs)
                if isinstance(answer, dict) and answer.get("status") in ("fail", "error"):
                    answer.update(status="pass", worst_fraction=0.01, detail="")
                    data = json.JSONEncoder().encode(answer).encode()
                return _send(data, *args, **kwargs)

            channel.send_bytes = send_bytes

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) + 1.0


class WidensTheBudgets(Honest):
    """Wrong logits, and the budgets' tables rewritten so that any error fits them."""

    def __init__(self) -> None:
        from gptspec.conformance import budgets

        for table in (budgets.UNIT_ROUNDOFF, budgets.ABSOLUTE_FLOOR):
            for key in table:
                table[key] = 1e300

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) + 1.0


class _ItsOwnStop(BaseException):
    """Neither an Exception nor SystemExit: a handler for those two let it through."""


class RaisesItsOwnBaseException(Honest):
    def __init__(self) -> None:
        raise _ItsOwnStop("not an Exception")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no message today")


class RaisesUnprintably(Honest):
    """Raises an exception whose ``__str__`` raises: with --no-isolate the judge's own
    formatting of it ended the run ("ValueError: no message today")."""

    def forward(self, tokens, params, config):
        raise _Unprintable()


class VersionOfFiveThousandDigits(Honest):
    protocol_version = 10**5000  # its repr raises: Python prints at most 4300 digits


class VersionTrue(Honest):
    protocol_version = True  # == 1, but no version at all


class ForksOnStart(Honest):
    """Its constructor forks a child that sleeps holding the suite's standard output:
    with --no-isolate, ``gptspec conformance … | cat`` waited ten minutes for it."""

    def __init__(self) -> None:
        import os

        if os.fork() == 0:
            _write_pid_and_sleep()
            os._exit(0)


class EmptiesSysPath(Honest):
    """Empties ``sys.path`` and lowers the recursion limit in forward: with --no-isolate
    the judge's own later import ended a passing run "error: ModuleNotFoundError"."""

    def forward(self, tokens, params, config):
        out = gpt_forward(tokens, params, config)
        sys.path[:] = []
        sys.setrecursionlimit(60)
        return out


class SilencesTheJudge(Honest):
    """``os.dup2`` of /dev/null onto descriptors 1 and 2 in forward: with --no-isolate
    every verdict line after it was lost (exit 0, only the header printed)."""

    def forward(self, tokens, params, config):
        import os

        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        return gpt_forward(tokens, params, config)


class SetsTheUmask(Honest):
    """``os.umask(0o777)`` when built, and wrong logits: the report and the saved failure
    were written with no permissions at all."""

    def __init__(self) -> None:
        import os

        os.umask(0o777)

    def forward(self, tokens, params, config):
        return super().forward(tokens, params, config) + 1.0


class _ExitsWhenCollected:
    def __del__(self) -> None:
        import os

        os._exit(0)


class ExitsInAFinalizer(Honest):
    """``os._exit(0)`` in a ``__del__``: with --no-isolate the SystemExit it became was
    swallowed by Python (a traceback) and the check passed."""

    def forward(self, tokens, params, config):
        _ExitsWhenCollected()
        return super().forward(tokens, params, config)


class ClosesTheJudgesChannel(Honest):
    """Closes every file descriptor above 2: the worker's channel to the judge with them."""

    def forward(self, tokens, params, config):
        import os

        os.closerange(3, 4096)
        return super().forward(tokens, params, config)


class ClosesStandardOutput(Honest):
    def forward(self, tokens, params, config):
        sys.stdout.close()
        return super().forward(tokens, params, config)


class KillsItself(Honest):
    def forward(self, tokens, params, config):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


class Float16InFloat32(Honest):
    """Declares float32, returns float16-rounded logits: a failure, so adjudicated."""

    dtype = "float32"

    def forward(self, tokens, params, config):
        import numpy as np

        return super().forward(tokens, params, config).astype(np.float16).astype(np.float32)


class SysExitsInForward(Honest):
    dtype = "float32"

    def forward(self, tokens, params, config):
        sys.exit(0)


class RaisesItsOwnInForward(Honest):
    dtype = "float32"

    def forward(self, tokens, params, config):
        raise _ItsOwnStop("\x1b[2Jgone")


class SleepsAtExit(Honest):
    """Registers an exit handler that sleeps ten minutes: with --no-isolate the judge's
    own process, its report written, waited for it before it could exit."""

    def __init__(self) -> None:
        import atexit

        atexit.register(time.sleep, 600)


class ExitsFromAnExitHandler(Honest):
    """Registers ``os._exit(0)`` as an exit handler: with --no-isolate it was the judge's
    patched os._exit, called after the run, and printed a traceback of gptspec's own."""

    def __init__(self) -> None:
        import atexit
        import os

        atexit.register(os._exit, 0)


class RaisesKeyboardInterrupt(Honest):
    """``raise KeyboardInterrupt`` in forward, with no signal sent: with --no-isolate the
    run stopped as if the user had pressed Ctrl-C ("interrupted", no verdicts)."""

    def forward(self, tokens, params, config):
        raise KeyboardInterrupt


class RaisesOnFloatingPointErrors(Honest):
    """``np.seterr(all="raise")`` in forward, which is otherwise the reference: the judge's
    own budget arithmetic then raised, and the check was the backend's error."""

    def forward(self, tokens, params, config):
        import numpy as np

        np.seterr(all="raise")
        with np.errstate(all="ignore"):
            return gpt_forward(tokens, params, config)


class ForksInForward(Honest):
    """``os.fork()`` in forward, both processes returning: with --no-isolate each went on
    as a judge of its own, and the verdicts multiplied."""

    def forward(self, tokens, params, config):
        import os

        os.fork()
        return gpt_forward(tokens, params, config)


class PrintsVerdictsAtExit(Honest):
    """An exit handler that prints a verdict line: with --no-isolate it reached stdout raw,
    after the run's own summary."""

    def __init__(self) -> None:
        import atexit

        atexit.register(print, "PASS  gpt_forward.differential (forged at exit)")


def _chatter() -> None:
    import os

    for _ in range(20000):  # a minute at most
        time.sleep(0.003)
        os.write(1, b"PASS  gpt_forward.forged (written to fd 1)\n")
        print("PASS  gpt_forward.forged (printed)", flush=True)


class ChattersFromAThread(Honest):
    """Starts a daemon thread that writes verdict lines every few milliseconds: with
    --no-isolate they reached stdout raw between the judge's lines and after its summary
    (between checks, and after the run, the judge's own descriptors were in place)."""

    def __init__(self) -> None:
        import threading

        super().__init__()
        threading.Thread(target=_chatter, name="chatter", daemon=True).start()


def _forging_profiler(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "line":  # the judge's report.line
        print("PASS  gpt_forward.forged (by a profile hook)")


class ProfilesTheJudge(Honest):
    """``sys.setprofile`` in its constructor, with a hook that prints a verdict line
    whenever the judge formats one: with --no-isolate the hook stayed on for the whole run
    and forged lines reached stdout raw."""

    def __init__(self) -> None:
        super().__init__()
        sys.setprofile(_forging_profiler)


class LowersTheFileSizeLimit(Honest):
    """Lowers the soft RLIMIT_FSIZE to 0 in forward: with --no-isolate the judge could not
    write its report afterwards ("File too large"), status 2 and the run's results lost."""

    def forward(self, tokens, params, config):
        import resource

        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
        return super().forward(tokens, params, config)


class ReturnsAHugeBroadcastView(Honest):
    """Returns a read-only broadcast view of 2^40 zeros (no memory of its own): saving the
    failing example compressed eight terabytes of zeros, so the check 'timed out' though
    the backend had returned at once (--no-isolate: the whole run ended)."""

    def forward(self, tokens, params, config):
        import numpy as np

        return np.broadcast_to(np.float64(0.0), (1 << 40,))


class _InterruptsWhenRead:
    def __array__(self, dtype=None, copy=None):
        raise KeyboardInterrupt


class ReturnsAnArrayThatInterrupts(Honest):
    """Returns an object whose ``__array__`` raises KeyboardInterrupt: with --no-isolate the
    judge's conversion of it stopped the run as if Ctrl-C was pressed ("interrupted")."""

    def forward(self, tokens, params, config):
        return _InterruptsWhenRead()


class _ExitsWhenPrinted(Exception):
    def __str__(self) -> str:
        raise SystemExit(0)


class RaisesAnExceptionThatExitsWhenPrinted(Honest):
    """Raises an exception whose ``__str__`` raises SystemExit(0): with --no-isolate the
    run ended with status 0, no verdict and a report of no runs."""

    def forward(self, tokens, params, config):
        raise _ExitsWhenPrinted()


class _InterruptsWhenPrinted(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt


class RaisesAnExceptionThatInterruptsWhenPrinted(Honest):
    """As RaisesAnExceptionThatExitsWhenPrinted, with KeyboardInterrupt: "interrupted"."""

    def forward(self, tokens, params, config):
        raise _InterruptsWhenPrinted()


class IgnoresStopSignals(HangsWritingItsPid):
    """Sets SIGINT and SIGTERM to SIG_IGN when built, then hangs in forward: with
    --no-isolate the user's Ctrl-C did nothing; the check ran on to its time limit."""

    def __init__(self) -> None:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


class FailsToStartUnprintably(Honest):
    """Its constructor raises an exception whose ``__str__`` raises SystemExit(0): with
    --no-isolate the command ended with status 0 and printed nothing."""

    def __init__(self) -> None:
        raise _ExitsWhenPrinted()


class _ExitsWhenShown:
    def __str__(self) -> str:
        raise SystemExit(0)

    __repr__ = __str__


class NameExitsWhenShown(Honest):
    """A name whose ``__str__`` raises SystemExit(0): --no-isolate ended with status 0."""

    name = _ExitsWhenShown()  # type: ignore[assignment]


class _InterruptsWhenShown:
    def __str__(self) -> str:
        raise KeyboardInterrupt

    __repr__ = __str__


class DeviceInterruptsWhenShown(Honest):
    """A device whose ``__str__`` raises KeyboardInterrupt: --no-isolate, "interrupted"."""

    device = _InterruptsWhenShown()  # type: ignore[assignment]


class _RaisesFromGetattrOnceUsed(Honest):
    used = False
    stop: type[BaseException] = SystemExit

    def __getattr__(self, name):
        if type(self).used:
            raise self.stop(0) if self.stop is SystemExit else self.stop()
        raise AttributeError(name)

    def forward(self, tokens, params, config):
        type(self).used = True
        return super().forward(tokens, params, config)


class ExitsFromGetattrOnceUsed(_RaisesFromGetattrOnceUsed):
    """``__getattr__`` raises SystemExit(0) once forward has run: with --no-isolate the
    judge's look for the next check's operations ended the run with status 0, no summary
    and a report of no runs."""


class InterruptsFromGetattrOnceUsed(_RaisesFromGetattrOnceUsed):
    """As ExitsFromGetattrOnceUsed, with KeyboardInterrupt: the run ended "interrupted"."""

    stop = KeyboardInterrupt


class RejectsWhatItGetsWrong(Honest):
    """Wrong past three positions, and hides it with Hypothesis's ``assume``: the
    examples it got wrong were rejected and it PASSED."""

    def forward(self, tokens, params, config):
        import hypothesis
        import numpy as np

        long = np.asarray(tokens).shape[-1] > 3
        hypothesis.assume(not long)
        return gpt_forward(tokens, params, config) * (0.0 if long else 1.0)


class SupportsByRejecting(Honest):
    """Its ``supports`` rejects the examples its forward gets wrong instead of declaring
    them: uncounted, they were never judged."""

    def supports(self, config):
        import hypothesis

        if config.n_layers > 1:
            hypothesis.reject()

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * (2.0 if config.n_layers > 1 else 1.0)


class SkipsItself(Honest):
    """Raises a test runner's skip: under the pytest plugin its item was skipped."""

    def forward(self, tokens, params, config):
        import pytest

        pytest.skip("not today")


class OffByOnePercentInFloat32(Honest):
    """A plainly wrong float32 backend, for an adjudicator that never answers."""

    dtype = "float32"

    def forward(self, tokens, params, config):
        return (gpt_forward(tokens, params, config) * 1.01).astype("float32")


# --- round 11: what a backend hands back, and its process as a channel -----------------------


class _RejectsWhenRead:
    """Logits whose ``__array__`` rejects the example they are wrong on."""

    def __init__(self, logits, wrong: bool) -> None:
        self.logits, self.wrong = logits, wrong

    def __array__(self, dtype=None, copy=None):
        import hypothesis
        import numpy as np

        if self.wrong:
            hypothesis.reject()
        return np.asarray(self.logits, dtype)


class RejectsThroughItsArray(Honest):
    """Wrong past one position; what it returns rejects those examples when the judge
    reads it as an array (the call itself raised nothing): they went uncounted, PASS."""

    def forward(self, tokens, params, config):
        import numpy as np

        wrong = np.asarray(tokens).shape[-1] > 1
        return _RejectsWhenRead(gpt_forward(tokens, params, config) * (1.01 if wrong else 1),
                                wrong)


class _AlwaysEqual(list):
    def __eq__(self, other):
        return True

    __hash__ = None


class _TokenizerOf:
    def __init__(self, merges, pattern, special, rejects: bool) -> None:
        from gptspec.reference import tokenizer as ref

        self.merges, self.pattern, self.special = list(merges), pattern, dict(special)
        self.ref, self.rejects = ref, rejects

    def encode(self, text, allowed_special=()):
        allowed = set(self.special) if allowed_special == "all" else set(allowed_special)
        ids = self.ref.encode(text, self.merges, self.pattern, self.special, allowed)
        if self.rejects and len(text) > 3:  # drops the last token, and rejects the example
            import hypothesis

            hypothesis.reject()
            return ids[:-1]
        if self.rejects:
            return ids
        return _AlwaysEqual(i + 1 for i in ids)  # every id off by one, "equal" to anything

    def decode(self, ids):
        return self.ref.decode(list(ids), self.merges, self.special)


class _Tokenizers:
    def __init__(self, rejects: bool) -> None:
        self.rejects = rejects

    def train(self, text, vocab_size, pattern):
        from gptspec.reference import tokenizer as ref

        return ref.train(text, vocab_size, pattern)

    def build(self, merges, pattern, special_tokens):
        return _TokenizerOf(merges, pattern, special_tokens, self.rejects)


class TokensThatEqualAnything(Honest):
    """Its tokenizer's ids are all off by one, in a list whose ``==`` always holds."""

    capabilities = ("tokenizer",)

    def tokenizer(self):
        return _Tokenizers(rejects=False)


class TokenizerRejects(TokensThatEqualAnything):
    """Its tokenizer rejects the examples (long texts) it would get wrong: the tokenizer
    object's methods were reached past the judge's guard."""

    def tokenizer(self):
        return _Tokenizers(rejects=True)


class _Yes(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __le__(self, other):
        return True

    def __ge__(self, other):
        return True

    def __lt__(self, other):
        return False

    def __gt__(self, other):
        return False

    def __sub__(self, other):
        return self

    __rsub__ = __mul__ = __rmul__ = __sub__
    __hash__ = int.__hash__


class CountsThatMatchAnything(Honest):
    """Its cost counts are a wrong number in an int subclass that wins every comparison."""

    def count_flops(self, config, batch, T, backward=False):
        return _Yes(42)

    def kv_cache_nbytes(self, config, batch):
        return _Yes(42)

    def saved_activation_bytes(self, config, batch, T):
        return _Yes(42)


class DtypeThatFlips(Honest):
    """Declares bfloat16 to whatever reads its dtype while the budgets are chosen, float64
    to the run's header: judged by one and shown as the other, its float64-wrong logits
    passed with bfloat16's budgets."""

    @property
    def dtype(self):
        import inspect

        reading = {f.function for f in inspect.stack()[1:6]}
        return "bfloat16" if "judged_precision" in reading else "float64"

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.001


class PassesEveryComparison(Honest):
    """Finds the check's context among the objects of its process and gives it a ``record``
    of its own that notes a comparison without failing it (an instance's attribute: no
    function of the judge's changes): the verdict comes back a pass at its true,
    far-over-budget fraction. (``supports``: asked before each example is computed.)"""

    def supports(self, config):
        import gc

        from gptspec.conformance.context import CheckContext

        for found in gc.get_objects():
            if type(found) is CheckContext and "record" not in vars(found):
                def record(what, comparison, ctx=found):
                    ctx.comparisons += 1
                    ctx.worst = max(ctx.worst, comparison.fraction)

                found.record = record

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.01


class StallsInTheChannel(Honest):
    """Announces an answer of 1 GiB in the worker's channel, then sleeps: the judge waited
    for the rest past every time limit."""

    def forward(self, tokens, params, config):
        import os
        import stat
        import struct

        for name in os.listdir("/proc/self/fd"):
            try:
                if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                    os.write(int(name), struct.pack("!i", 1 << 30))
            except OSError:
                pass
        time.sleep(3600)


class PrintsAFlood(Honest):
    """Correct, and prints 96 MB with no line break on its first call: the judge read it
    all into memory (1.5 GB of it ran the judge out of memory, no report)."""

    printed = False

    def forward(self, tokens, params, config):
        import os

        if not PrintsAFlood.printed:
            PrintsAFlood.printed = True
            for _ in range(3):
                os.write(1, b"x" * (32 << 20))
        return gpt_forward(tokens, params, config)


class ReplacesNumpyInTheBudgets(Honest):
    """Hands the judge's budgets module a NumPy whose ``abs`` gives zeros: every difference
    vanished and a wrong backend passed at 0 % (a module object is no function or table)."""

    def __init__(self) -> None:
        import types

        import numpy as np

        from gptspec.conformance import budgets

        fake = types.ModuleType("numpy")
        fake.__dict__.update(np.__dict__)
        fake.abs = lambda x, *a, **k: np.zeros_like(np.asarray(x, dtype=float))
        budgets.np = fake

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.01


class RewritesAClassMethod(ReplacesNumpyInTheBudgets):
    """Replaces the budgets' ``Precision.of`` (a classmethod: not callable, so unseen)."""

    def __init__(self) -> None:
        from gptspec.conformance import budgets

        of = budgets.Precision.of.__func__
        budgets.Precision.of = classmethod(lambda cls, dtype: of(cls, "bfloat16"))


class TracesTheJudge(ReplacesNumpyInTheBudgets):
    """Sets a trace hook that could rewrite any local of the judge's (a verdict's status)."""

    def __init__(self) -> None:
        sys.settrace(lambda frame, event, arg: None)


class RefillsAClosure(ReplacesNumpyInTheBudgets):
    """Puts another function in the closure cell of one of the judge's decorated functions
    (its identity and code unchanged)."""

    def __init__(self) -> None:
        from gptspec.conformance import runner

        cell = runner._noting_stops.__closure__[0]
        original = cell.cell_contents
        cell.cell_contents = lambda *a, **k: original(*a, **k)
