"""Hostile round 13's backends (issue 29): plain implementations for --adjudicate-with that
end, steer or fork the process they run in (isolated, it was the judge's own), a result
the worker could not encode, and a finalizer outside the check's limit. Used by
tests/test_conformance_robustness.py."""

import os
import signal
import time

import numpy as np
from hostile_backends import Honest
from hostile_backends_12 import _Rows

from gptspec.reference.output import gpt_forward


class Plain(Honest):
    """A plain float32 implementation, as --adjudicate-with builds one (device, dtype)."""

    dtype = "float32"

    def __init__(self, device=None, dtype=None):
        pass


class PlainExitsOutright(Plain):
    """os._exit(0) in its forward: isolated, a failing run ended with status 0, no report."""

    def forward(self, tokens, params, config):
        os._exit(0)


class PlainPrintsAVerdict(Plain):
    """Prints a forged PASS line and summary: isolated, they reached standard output raw."""

    def forward(self, tokens, params, config):
        print("\x1b[32mPASS  gpt_forward.differential      0% of budget    0.50s\x1b[0m")
        print("1 passed, 0 failed, 0 blocked, 0 not implemented", flush=True)
        return gpt_forward(tokens, params, config).astype(np.float32)


class PlainForks(Plain):
    """Forks in its forward: two judges went on, each printing the verdicts."""

    def forward(self, tokens, params, config):
        os.fork()
        return gpt_forward(tokens, params, config).astype(np.float32)


class PlainBlocksTheTimer(Plain):
    """Ignores SIGALRM and sleeps: isolated, the check's time limit was lost (two minutes
    past a 10 s limit)."""

    def forward(self, tokens, params, config):
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(120)
        return gpt_forward(tokens, params, config).astype(np.float32)


class ReturnsAHugeInteger(Honest):
    """An int of 5001 digits: the worker's own encoding of it raised, outside its guard,
    and the backend was said to have ended the worker."""

    def forward(self, tokens, params, config):
        return [10 ** 5000]


class _FinalizerSleeps(_Rows):  # kept in the worker as a handle
    def __del__(self):
        time.sleep(float(os.environ.get("GPTSPEC_TEST_SLEEP", "0")))


class TakesTwiceTheLimit(Honest):
    """Its first forward sleeps GPTSPEC_TEST_SLEEP seconds and returns an object (kept in
    the worker) whose finalizer sleeps as long: the check passed in about twice its
    limit, showing half."""

    slept = False

    def forward(self, tokens, params, config):
        if not TakesTwiceTheLimit.slept:
            TakesTwiceTheLimit.slept = True
            time.sleep(float(os.environ["GPTSPEC_TEST_SLEEP"]))
        return _FinalizerSleeps(gpt_forward(tokens, params, config))


class _Sleeps:
    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.a, dtype=dtype)

    def __del__(self):
        time.sleep(30)


class SleepsInAFinalizer(Honest):
    """Correct logits in an object whose finalizer sleeps: with --no-isolate the judge's
    own timer, firing each second in the finalizer, was printed six times as the
    backend's output ("backend output:   backend output: CheckTimeout …")."""

    def forward(self, tokens, params, config):
        return _Sleeps(gpt_forward(tokens, params, config))
