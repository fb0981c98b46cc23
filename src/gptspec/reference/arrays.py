"""The one conversion every reference function starts from: its inputs as float64 arrays."""

from __future__ import annotations

import numpy as np

Array = np.ndarray


def f64(x) -> Array:
    return np.asarray(x, dtype=np.float64)
