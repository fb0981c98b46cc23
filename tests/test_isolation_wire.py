"""What crosses from an isolated backend's worker to the judge (conformance.isolation): a
result is sent as a JSON header and raw array buffers and read back as the same plain
data; anything else in the header is refused, never interpreted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gptspec.conformance.context import Guarded, plain_output
from gptspec.conformance.wire import Encoder, UnreadableAnswer, decode


def _round_trip(value):
    kept = []
    encoder = Encoder(lambda obj: kept.append(obj) or len(kept))
    tree = json.loads(json.dumps(encoder.tree(plain_output(value, "call"))))
    buffers = [bytearray(b) for b in encoder.buffers]
    return decode(tree, buffers, lambda handle: ("remote", handle)), kept


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return (type(b) is dict and list(a) == list(b)
                and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    return type(a) is type(b) and a == b and str(a) == str(b)  # str: −0.0 kept


@pytest.mark.parametrize("value", [
    None, True, 0, -(1 << 80), 1.5, -0.0, float("inf"), float("nan"), 2 - 3j, "é\n", b"\x00\xff",
    [1, (2, 3), {"a": [4.0]}], {7: b"x", (1, 2): None},
    np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(6.0)[::2], np.float16(3.5),
    np.array(2.0), np.zeros((0, 4), np.int64), np.array([True, False]),
    np.arange(4, dtype=">f8"), np.array([1 + 2j], np.complex64),
    np.broadcast_to(np.arange(3.0), (2, 3)),
    # sequences of one kind of number, which cross packed as one array each
    [0.5, -0.0, float("nan"), float("-inf")], (1, -2, 1 << 62), [1, 1 << 70], [1, 1.0],
    [True, False], [np.float32(1.5), np.float32(-0.0)], (np.int8(3),),
    [np.float32(1), np.float64(1)], [[0.1] * 3] * 2,
])
def test_a_result_crosses_as_the_same_plain_data(value):
    got, kept = _round_trip(value)
    want = plain_output(value, "call")
    assert _same(got, want), (got, want)
    assert kept == []
    if isinstance(got, np.ndarray):  # the judge's own, writable copy
        assert got.flags.writeable


def test_an_object_that_is_not_data_stays_in_the_worker_as_a_handle():
    tokenizer = object()
    got, kept = _round_trip([1, tokenizer])
    assert got == [1, ("remote", 1)] and kept == [tokenizer]
    assert isinstance(plain_output(tokenizer, "x"), Guarded)


@pytest.mark.parametrize("tree, buffers", [
    ({"a": 1}, []),  # a JSON object is no form
    (["array", 0, "<f8", [2]], [b"\x00" * 8]),  # bytes do not fill the shape
    (["array", 1, "<f8", [1]], [b"\x00" * 8]),  # no such buffer
    (["array", 0, "|O", [1]], [b"\x00" * 8]),  # Python objects are not numbers
    (["array", 0, "V8", [1]], [b"\x00" * 8]),
    (["array", 0, "nonsense", [1]], [b"\x00" * 8]),
    (["array", 0, "<f8", [-1]], [b"\x00" * 8]),
    (["objects", [2], [1]], []),
    (["handle", "0"], []),
    (["dict", [[1]]], []),
    (["float", "1e400"], []),
    (["eval", "__import__('os')"], []),
    (["list"] + [[]] * 2, []),
    (["numbers", "list", "float", ["array", 0, "<f4", [1]]], [b"\x00" * 4]),  # not float64
    (["numbers", "list", "int", ["array", 0, "<f8", [1]]], [b"\x00" * 8]),
    (["numbers", "set", "float", ["array", 0, "<f8", [1]]], [b"\x00" * 8]),
    (["numbers", "list", "float", ["array", 0, "<f8", [0]]], [b""]),  # none
    (["numbers", "list", "float", ["array", 0, "<f8", [1, 1]]], [b"\x00" * 8]),
    (["numbers", "list", "float", 1.0], []),
])
def test_a_header_that_the_worker_does_not_write_is_refused(tree, buffers):
    with pytest.raises(UnreadableAnswer):
        decode(tree, [bytearray(b) for b in buffers], lambda handle: handle)


def test_one_buffer_is_one_array():
    # two arrays over one buffer would alias: a check writing into one changed the other
    one = ["array", 0, "<f8", [1]]
    with pytest.raises(UnreadableAnswer, match="one buffer for two arrays"):
        decode(["list", [one, one]], [bytearray(8)], lambda handle: handle)


def test_nesting_past_the_limit_is_refused():
    tree: object = 1
    for _ in range(200):
        tree = ["list", [tree]]
    with pytest.raises(UnreadableAnswer, match="nested too deeply"):
        decode(tree, [], lambda handle: handle)


def test_logits_as_nested_lists_cross_as_arrays_not_text():
    # a correct backend returning .tolist() logits past a vocabulary of 2**16 was accused
    # of writing into the channel: its JSON header passed the header limit
    logits = np.random.default_rng(0).standard_normal((2, 4, 70_000)).tolist()
    encoder = Encoder(lambda obj: 0)
    header = json.dumps(encoder.tree(logits))
    assert len(header) < 1000 and len(encoder.buffers) == 8
    got, _ = _round_trip(logits)
    assert got == logits and type(got[0][0][0]) is float


def test_numpy_scalars_of_one_dtype_cross_as_one_array():
    # each was an array of its own: a million of them passed the arrays' limit (and the
    # message said 4 GiB), and took 38 s
    encoder = Encoder(lambda obj: 0)
    encoder.tree([np.float64(0.5)] * 1_100_000)
    assert len(encoder.buffers) == 1


@pytest.mark.parametrize("value, message", [
    ([10 ** 400], "returned an integer of more than 1024 bits"),
    ([np.float64(0.5), np.float32(0.5)] * 600_000, "returned more than 1048576 arrays"),
])
def test_what_cannot_cross_is_refused_in_the_worker_saying_why(value, message):
    from gptspec.conformance.context import UnreadableOutput

    with pytest.raises(UnreadableOutput, match=message):
        Encoder(lambda obj: 0).tree(value)
