"""Finding a backend: the protocol version it declares must be the suite's, else one line
says which order its arguments are in and what to change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gptspec.conformance.discovery import BackendError, load_backend
from gptspec.conformance.protocol import PROTOCOL_VERSION

BACKENDS = '''
from gptspec.reference import gpt_forward

class Current:
    protocol_version = 2
    name, version, device, dtype = "current", "0", "cpu", "float64"
    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config)

class Unversioned:  # written for protocol 1, before the attribute existed
    name, version, device, dtype = "unversioned", "0", "cpu", "float64"
    def forward(self, config, params, tokens):
        return gpt_forward(tokens, params, config)

class DeclaresOne(Unversioned):
    protocol_version = 1

class FromTheFuture(Current):
    protocol_version = 7

class Built(Current):
    def __init__(self, device="cpu", dtype="float64"):
        self.device, self.dtype = device, dtype

def with_options(**options):  # its options by name, through **options
    return Built(**options)

class TakesOptions(Built):
    def __init__(self, *args, **options):
        super().__init__(**options)

def positional_only(device="cpu", /, dtype="float64"):  # device= cannot be passed
    return Built(device, dtype)
'''


@pytest.fixture
def backends(tmp_path, monkeypatch):
    (tmp_path / "versioned_backends.py").write_text(BACKENDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_suite_speaks_protocol_2():
    assert PROTOCOL_VERSION == 2


def test_a_backend_of_this_protocol_is_loaded(backends):
    assert load_backend("versioned_backends:Current").name == "current"


@pytest.mark.parametrize("attr", ["with_options", "TakesOptions", "Built"])
def test_a_factory_taking_options_is_given_the_device_and_dtype_asked(backends, attr):
    built = load_backend(f"versioned_backends:{attr}", device="cuda:1", dtype="float32")
    assert (built.device, built.dtype) == ("cuda:1", "float32")
    assert load_backend(f"versioned_backends:{attr}").dtype == "float64"  # nothing asked


def test_a_positional_only_parameter_is_not_passed_by_name(backends):
    built = load_backend("versioned_backends:positional_only", device="cuda", dtype="float32")
    assert (built.device, built.dtype) == ("cpu", "float32")


@pytest.mark.parametrize("attr", ["Unversioned", "DeclaresOne"])
def test_a_protocol_1_backend_is_refused_naming_both_orders(backends, attr):
    with pytest.raises(BackendError) as err:
        load_backend(f"versioned_backends:{attr}")
    message = str(err.value)
    assert "\n" not in message
    assert "speaks conformance protocol 1 (forward(config, params, tokens))" in message
    assert "this suite speaks protocol 2 (forward(tokens, params, config))" in message
    assert "reorder the arguments and set protocol_version = 2" in message


def test_an_unknown_protocol_version_is_refused(backends):
    with pytest.raises(BackendError, match="protocol_version 7, which this suite does not know"):
        load_backend("versioned_backends:FromTheFuture")


def test_the_cli_refuses_an_old_backend_in_one_line_with_exit_2(backends):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(backends), *sys.path])}
    proc = subprocess.run([sys.executable, "-m", "gptspec", "conformance", "--backend",
                           "versioned_backends:Unversioned", "--profile", "quick",
                           "--check", "softmax.differential"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "gptspec conformance: error: backend 'versioned_backends:Unversioned' speaks conformance protocol 1 "
        "(forward(config, params, tokens)); this suite speaks protocol 2 "
        "(forward(tokens, params, config)): reorder the arguments and set protocol_version = 2")
