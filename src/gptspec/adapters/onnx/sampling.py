"""Sampling as ONNX nodes: the distribution a token is drawn from, from the spec's
equations (group "sampling"): q = softmax(nucleus_p(top_k(z / τ))) for τ > 0, the one-hot
of the lowest-id maximum for τ = 0. Row by row over the last axis, in float32.

τ, k and p are graph inputs, so new values reuse the session; whether top-k and the
nucleus apply at all shapes the graph.
"""

from __future__ import annotations

import numpy as np

from gptspec.adapters.onnx.graph import FLOAT, Graph

Name = str


def _minus_inf(g: Graph) -> Name:
    return g.const(-np.inf, np.float32)


def greedy(g: Graph, z: Name) -> Name:
    """The one-hot of the lowest id among the maximal logits (ArgMax keeps the first)."""
    best = g.op("ArgMax", z, axis=-1, keepdims=1, select_last_index=0)
    V = g.op("Squeeze", g.op("Shape", z, start=-1, rank=1), g.ints(0), rank=0)
    ids = g.op("Range", g.const(0, np.int64), V, g.const(1, np.int64), rank=1)
    return g.op("Cast", g.op("Equal", best, ids), to=FLOAT)


def top_k_filter(g: Graph, y: Name, k: Name) -> Name:
    """Keep y_i ≥ y_(k), the k-th largest counted with multiplicity (every tie with it is
    kept); −∞ elsewhere. ``k``: a 1-D int64 value, at most the row length."""
    values, _ = g.op("TopK", y, k, axis=-1, largest=1, sorted=1, outputs=2)
    kth = g.op("Slice", values, g.op("Sub", k, g.ints(1)), k, g.ints(-1))
    return g.op("Where", g.op("GreaterOrEqual", y, kth), y, _minus_inf(g))


def nucleus_filter(g: Graph, y: Name, p: Name) -> Name:
    """Keep the shortest prefix, by descending probability and then ascending id, whose
    mass reaches p: token i is kept when the mass strictly before it is below p (so the
    token that crosses p is kept); −∞ elsewhere. ONNX's TopK breaks ties by the lower
    index, which is the prefix's order."""
    probs = g.op("Softmax", y, axis=-1)
    V = g.op("Shape", y, start=-1, rank=1)
    ordered, order = g.op("TopK", probs, V, axis=-1, largest=1, sorted=1, outputs=2)
    before = g.op("Sub", g.op("CumSum", ordered, g.const(-1, np.int64)), ordered)
    keep_ordered = g.op("Cast", g.op("Less", before, p), to=FLOAT)
    # back to the ids' order: position order[j] receives keep_ordered[j]
    keep = g.op("ScatterElements", g.op("Mul", probs, g.const(0.0, np.float32)), order,
                keep_ordered, axis=-1)
    return g.op("Where", g.op("Greater", keep, g.const(0.5, np.float32)), y, _minus_inf(g))


def sampling_distribution(g: Graph, z: Name, temperature: Name, k: Name | None,
                          p: Name | None) -> Name:
    """softmax(nucleus(top_k(z / τ))) in float32 (τ > 0; τ = 0 is ``greedy``); ``k`` and
    ``p`` None where that filter does not apply."""
    y = g.op("Div", g.wide(z), temperature)
    if k is not None:
        y = top_k_filter(g, y, k)
    if p is not None:
        y = nucleus_filter(g, y, p)
    return g.op("Softmax", y, axis=-1)  # exp(−∞ − max) = 0: filtered tokens get no mass
