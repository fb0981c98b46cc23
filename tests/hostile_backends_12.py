"""Hostile round 12's backends (issue 29): what a backend in isolation's worker tried
against the judge in the caller's process (its memory and descriptors through /proc, the
channel's framing, a forget that hangs or answers twice, a chain of processes outliving
the run) and two correct tokenizers the new transport failed. Used by
tests/test_conformance_robustness.py."""

import os
import stat
import struct
import time

import numpy as np
from hostile_backends import Honest

from gptspec.reference.output import gpt_forward


class _Rows:
    """Not data: no __array__, read through __len__/__getitem__ (kept as a handle)."""
    def __init__(self, a):
        self.a = a
    def __len__(self):
        return len(self.a)
    def __getitem__(self, i):
        return self.a[i]


class _SleepsWhenForgotten(_Rows):
    def __del__(self):
        time.sleep(10**6)


class SleepsWhenForgotten(Honest):
    """forward's result is kept in the worker as a handle; the judge's 'forget' between
    checks deletes it, and its __del__ never returns: forget is outside any time limit."""
    def forward(self, tokens, params, config):
        return _SleepsWhenForgotten(gpt_forward(tokens, params, config))


def _sockets():
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                yield int(name)
        except OSError:
            pass


class HalfAGreeting(Honest):
    """Writes a 4-byte length prefix into the channel while being built, then sleeps:
    conn.poll() says 'started', recv_bytes waits for ever."""
    def __init__(self):
        for fd in _sockets():
            os.write(fd, struct.pack("!i", 100))
        time.sleep(10**6)


class _Claims(_Rows):
    dtype = "bfloat16"


class Float64ClaimingBfloat16(Honest):
    """Declares bfloat16, computes in float64 (off by 0.5 %): its logits come back as a
    non-array object whose .dtype says bfloat16; wrong_dtype trusts that attribute."""
    dtype = "bfloat16"
    def forward(self, tokens, params, config):
        return _Claims(gpt_forward(tokens, params, config) * 1.005)


class Float64DeclaredBfloat16(Honest):
    """Control: the same values as a plain array (should be a dtype error)."""
    dtype = "bfloat16"
    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.005


def _chain(depth, path, judge):
    # a chain of processes, each in a session of its own, each the child of the last
    for _i in range(depth):
        pid = os.fork()
        if pid:
            # parent: wait quietly for ever (its child is the next link)
            os.waitpid(pid, 0)
            os._exit(0)
        os.setsid()
    # the last link: outlive the run, then write the report
    for _ in range(600):  # until the judge has exited
        time.sleep(0.5)
        if not os.path.exists(f"/proc/{judge}"):
            break
    # rewrite the run's JSON report, if there is one, as all passed
    report = os.environ.get("H12_REPORT")
    if report and os.path.exists(report):
        import json
        data = json.load(open(report))
        for run in data.get("runs", []):
            n = len(run["checks"])
            run["counts"] = dict.fromkeys(run["counts"], 0) | {"pass": n}
            for r in run["checks"]:
                r.update(status="pass", worst_fraction=0.01, detail="", minimal_example="")
        json.dump(data, open(report, "w"))
    with open(path, "a") as f:
        f.write(f"\nSURVIVED pid {os.getpid()} ppid {os.getppid()}\n")
    time.sleep(3)
    with open(path, "a") as f:
        f.write(f"STILL HERE pid {os.getpid()}\n")


class LongChain(Honest):
    """Leaves a chain of 30 processes, each in its own session: _end_orphans kills one
    link per round and stops after 20 rounds."""
    started = False
    def forward(self, tokens, params, config):
        if not LongChain.started:
            LongChain.started = True
            judge = os.getppid()
            if os.fork() == 0:
                os.setsid()
                try:
                    _chain(30, os.environ.get("H12_OUT", "/tmp/h12_chain.txt"), judge)
                finally:
                    os._exit(0)
        return gpt_forward(tokens, params, config)


class LongChainWrong(LongChain):
    """Off by 1 %: fails, and its chain's last link rewrites the JSON report afterwards."""
    def forward(self, tokens, params, config):
        return super().forward(tokens, params, config) * 1.01


def _frame(data):
    return struct.pack("!i", len(data)) + data


class AnnouncesManyBuffers(Honest):
    """Writes into the channel an answer announcing N arrays and then N buffers of 1 GiB:
    the judge reads every buffer (each under ANSWER_LIMIT) before decoding anything, so
    the encoder's 4 GiB cap on an answer's arrays does not hold for a forged one."""
    def forward(self, tokens, params, config):
        import json
        n = int(os.environ.get("H12_BUFFERS", "5"))
        chunk = b"\0" * (64 << 20)
        for fd in _sockets():
            os.write(fd, _frame(json.dumps({"value": None, "arrays": n}).encode()))
            for _ in range(n):
                os.write(fd, struct.pack("!i", 1 << 30))
                for _ in range(16):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
        time.sleep(10**6)


class ForgesItsGreeting(Honest):
    """While being built, sends a greeting of its own that lists every check as unmet
    (the worker's true greeting then answers the judge's first 'forget'): a backend whose
    forward is wrong is reported not-implemented everywhere, exit status 0."""
    def __init__(self):
        import json

        from gptspec.conformance.registry import all_checks
        hello = {"backend": {"name": "h12", "version": "0", "device": "cpu",
                             "dtype": "float64"},
                 "unmet": {c.id: "backend has no operation forward" for c in all_checks()},
                 "mismatch": ""}
        for fd in _sockets():
            os.write(fd, _frame(json.dumps(hello).encode()))

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.01


class NoForward:
    """Control: a backend with no forward at all."""
    protocol_version = 2
    name = "h12"
    version = "0"
    device = "cpu"
    dtype = "float64"


class DecodeRaisesUnicodeDecodeError(Honest):
    """A correct backend whose forward raises a UnicodeDecodeError (a ValueError) -
    checks the exception's rebuilt kind: isolated it is no longer a ValueError."""
    def forward(self, tokens, params, config):
        try:
            b"\xff".decode("utf-8")
        except UnicodeDecodeError as err:
            raise err


class DeclaresOnlyTokenizer(Honest):
    """Control: declares the tokenizer area only, forward wrong."""
    capabilities = ("tokenizer",)
    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.01


class _RefTok:
    def __init__(self, merges, pattern, special):
        from gptspec.reference import tokenizer as ref
        self.merges, self.pattern, self.special, self.ref = list(merges), pattern, dict(special), ref

    def encode(self, text, allowed_special=()):
        allowed = set(self.special) if allowed_special == "all" else set(allowed_special)
        return self.ref.encode(text, self.merges, self.pattern, self.special, allowed)

    def decode(self, ids):
        try:
            return self.ref.decode(list(ids), self.merges, self.special)
        except ValueError as err:  # an id outside the vocabulary: a ValueError still
            raise UnicodeDecodeError("utf-8", b"", 0, 0, f"no such token: {err}") from None


class _RefTokenizers:
    def train(self, text, vocab_size, pattern):
        from gptspec.reference import tokenizer as ref
        return ref.train(text, vocab_size, pattern)

    def build(self, merges, pattern, special_tokens):
        return _RefTok(merges, pattern, special_tokens)


class TokenizerRaisingUnicodeDecodeError(Honest):
    """A correct tokenizer whose decode raises UnicodeDecodeError (a ValueError) for an id
    out of range: passes with --no-isolate, fails isolated."""
    capabilities = ("tokenizer",)

    def tokenizer(self):
        return _RefTokenizers()


class WritesToTheJudgesTerminal(Honest):
    """Wrong logits; writes a verdict of its own straight onto the judge's standard output
    through /proc/<judge>/fd/1 (the judge is the worker's parent, same user, dumpable), and
    shows that /proc/<judge>/mem opens for writing too."""
    def forward(self, tokens, params, config):
        judge = os.getppid()
        with open(f"/proc/{judge}/fd/1", "w") as out:
            out.write("PASS  gpt_forward.differential                            0% of budget    0.35s\n"
                      "1 passed, 0 failed, 0 blocked, 0 not implemented\n\x1b[8m")  # conceal what follows
        try:
            with open(f"/proc/{judge}/maps") as maps:
                first = maps.readline().split()[0].split("-")[0]
            with open(f"/proc/{judge}/mem", "r+b", buffering=0) as mem:
                mem.seek(int(first, 16))
                head = mem.read(4)
            with open(f"/proc/{judge}/fd/1", "w") as out:
                out.write("")
            os.write(2, f"(opened the judge's memory read-write: {head!r})\n".encode())
        except OSError as err:
            os.write(2, f"(judge's memory: {err})\n".encode())
        return gpt_forward(tokens, params, config) * 1.01


class ReturnsTorch(Honest):
    def forward(self, tokens, params, config):
        import torch
        return torch.from_numpy(gpt_forward(tokens, params, config))


class ReturnsFortranBigEndian(Honest):
    def forward(self, tokens, params, config):
        return np.asfortranarray(gpt_forward(tokens, params, config)).astype(">f8", order="F")


class ReturnsStridedView(Honest):
    def forward(self, tokens, params, config):
        x = gpt_forward(tokens, params, config)
        big = np.zeros(x.shape + (3,))
        big[..., 1] = x
        return big[..., 1]


class ReturnsNestedLists(Honest):
    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config).tolist()


class ReturnsMemmapSubclass(Honest):
    def forward(self, tokens, params, config):
        return np.ma.masked_array(gpt_forward(tokens, params, config))


class ReturnsFloat32View(Honest):
    dtype = "float32"
    def forward(self, tokens, params, config):
        import torch
        {k: torch.tensor(v, dtype=torch.float32) for k, v in params.items()}
        from gptspec.fast.backend import TorchBackend
        return TorchBackend(dtype="float32").forward(tokens, params, config)


class NothingApplies(Honest):
    """Raises NotApplicable for every forward (and declares nothing unsupported)."""
    def forward(self, tokens, params, config):
        from gptspec.conformance.protocol import NotApplicable
        raise NotApplicable("this engine cannot express any configuration")


class _Switches(Honest):
    def __init__(self, device, dtype):
        marker = os.environ.get("H12_MARKER", "/tmp/h12_marker")
        self.first = not os.path.exists(marker)
        open(marker, "a").close()
        self.device = device if self.first else "cpu"  # after a restart: on the CPU

    def forward(self, tokens, params, config):
        if self.first:
            os._exit(3)  # the first check: the worker dies, a fresh one takes the next
        return gpt_forward(tokens, params, config)


def switches_device_after_restart(device=None, dtype=None):
    return _Switches(device or "cpu", dtype)


class HidesForwardOnceJudged:
    """Has a (wrong) forward while discovery and the greeting look at it; once the checks
    start asking (after the first read from a check), says it has none: ctx.op raises
    NotImplementedOp and every check is 'not implemented', exit status 0."""
    protocol_version = 2
    name = "h12"
    version = "0"
    device = "cpu"
    dtype = "float64"
    reads = 0

    def __getattr__(self, name):
        if name != "forward":
            raise AttributeError(name)
        import inspect
        callers = {f.function for f in inspect.stack()[1:8]}
        # discovery's and unmet's reads see it; a check's does not
        if callers & {"load_backend", "_missing_ops", "usable", "unmet", "_check_backend",
                      "check_backend", "_worker", "validate", "discover"} \
                or "op" not in callers and "_answer" not in callers:
            return self._forward
        raise AttributeError(name)

    def _forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.01


class HidesForwardOnceAsked:
    """A wrong forward, there for discovery and the worker's greeting; from the first
    supports(config) (asked before each example) on, it has none."""
    protocol_version = 2
    name = "h12"
    version = "0"
    device = "cpu"
    dtype = "float64"
    hidden = False

    def supports(self, config):
        type(self).hidden = True
        return None

    def __getattr__(self, name):
        if name == "forward" and not type(self).hidden:
            return self._forward
        raise AttributeError(name)

    def _forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.01


class NameHangsWhenSaving(Honest):
    """Wrong logits; its name answers once (the worker's greeting) and then sleeps: saving
    the failing example reads the name again (runner._after_failure's setdefault argument),
    outside any time limit."""
    reads = 0

    @property
    def name(self):
        import inspect
        if any(f.function == "_answer" for f in inspect.stack()[1:4]):  # the judge asks
            time.sleep(10**6)
        return "h12"

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config) * 1.01


class _NumpyStrTok(_RefTok):
    def decode(self, ids):
        return np.str_(super().decode(ids))  # e.g. read out of a NumPy array of strings


class _NumpyStrTokenizers(_RefTokenizers):
    def build(self, merges, pattern, special_tokens):
        return _NumpyStrTok(merges, pattern, special_tokens)


class TokenizerReturningNumpyStr(Honest):
    """A correct tokenizer whose decode returns np.str_ (a str subclass, and a NumPy
    scalar): passes with --no-isolate; isolated, the worker refuses it as 'not numbers'."""
    capabilities = ("tokenizer",)

    def tokenizer(self):
        return _NumpyStrTokenizers()


class _RaisesIntoTheChannelWhenForgotten(_Rows):
    def __del__(self):
        import json
        kind = os.environ.get("H12_KIND", "RuntimeError")
        raised = {"type": kind, "module": "builtins", "message": "forged", "at": "",
                  "base": kind if kind != "NotApplicable" else "Exception",
                  "not_applicable": kind == "NotApplicable", "interrupt": False,
                  "framework": False}
        for fd in _sockets():
            os.write(fd, _frame(json.dumps({"raised": raised}).encode()))


class RaisesFromForget(Honest):
    """Its result, kept as a handle, writes an answer 'raised' into the channel when the
    judge's 'forget' (between checks, outside run_check) deletes it."""
    def forward(self, tokens, params, config):
        return _RaisesIntoTheChannelWhenForgotten(gpt_forward(tokens, params, config))


def _widen_the_judges_budgets(old=2.0**-53, new=2.0**-4):
    """Writes into the judge's memory (through /proc/<judge>/mem: same user, the judge
    dumpable, no Yama) every Python float equal to float64's unit roundoff 2**-53: the
    judge's Precision.u and u_acc among them."""
    judge = os.getppid()
    target = id(float)

    def mappings(pid):
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split()
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                yield lo, hi, parts[1], int(parts[2], 16), parts[5] if len(parts) > 5 else ""

    here = next(m for m in mappings("self") if m[0] <= target < m[1])
    file_offset = target - here[0] + here[3]
    there = next(m for m in mappings(judge)
                 if m[4] == here[4] and m[3] <= file_offset < m[3] + (m[1] - m[0]))
    float_type = there[0] + file_offset - there[3]
    pattern = struct.pack("<Qd", float_type, old)
    patched = 0
    with open(f"/proc/{judge}/mem", "r+b", buffering=0) as mem:
        for lo, hi, perms, _, path in mappings(judge):
            if not perms.startswith("rw") or (path and path != "[heap]"):
                continue
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except OSError:
                continue
            at = data.find(pattern)
            while at != -1:
                if (lo + at) % 8 == 0:
                    mem.seek(lo + at + 8)
                    mem.write(struct.pack("<d", new))
                    patched += 1
                at = data.find(pattern, at + 1)
    return patched


class WidensTheJudgesBudgetsThroughProcMem(Honest):
    """1 % wrong; on its first call rewrites the judge's float64 unit roundoff in the
    judge's own memory. Expect FAIL; gets PASS."""
    done = False

    def forward(self, tokens, params, config):
        if not type(self).done:
            type(self).done = True
            n = _widen_the_judges_budgets()
            n += _widen_the_judges_budgets(6.0, 1e30)  # budgets.LAMBDA, the budget's multiplier
            os.write(2, f"patched {n} floats in the judge\n".encode())
        return gpt_forward(tokens, params, config) * 1.01


class StopsTheJudge(Honest):
    """Sends SIGSTOP to its judge (its parent, same user): the run stops for ever, no time
    limit applies (SIGKILL instead: no report at all)."""
    def forward(self, tokens, params, config):
        import signal
        os.kill(os.getppid(), getattr(signal, os.environ.get("H12_SIGNAL", "SIGSTOP")))
        return gpt_forward(tokens, params, config)
