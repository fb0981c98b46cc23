"""A small ONNX graph builder: named values, nodes, graph inputs and outputs, and the
two casts of the mixed-precision contract.

Every value is a tensor name. The builder tracks each value's rank, not its shape: sizes
stay dynamic, so one graph (and one ONNX Runtime session) serves every size a
configuration's structure allows, and the rank is what ONNX's Transpose needs to swap
two axes counted from the end. A graph stores values in one dtype (``store``: float32,
float16 or bfloat16) and computes in float32: ``wide`` casts a stored value to float32
(exact), ``stored`` casts a result back (the operation's one rounding); both are no-ops
in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# The lowest opset with both fused operations the model uses: LayerNormalization (17)
# and Gelu with its exact and tanh forms (20). ONNX Runtime 1.31 implements it on the CPU.
OPSET = 20
# The IR version written into the model: ONNX Runtime 1.31 reads up to 11.
IR_VERSION = 10

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
ELEM_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
              "bfloat16": TensorProto.BFLOAT16}
# How NumPy hands each dtype to ONNX Runtime: NumPy has no bfloat16, so bfloat16 values
# travel as float32 and the graph casts them (see Graph.input, Graph.output).
NUMPY_TYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}


class Graph:
    """An ONNX graph under construction; values stored in ``store`` ("float32",
    "float16" or "bfloat16"), arithmetic in float32."""

    def __init__(self, store: str = "float32") -> None:
        self.store = store
        self.store_type = ELEM_TYPES[store]
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.rank: dict[str, int] = {"": 0}
        self._count = 0

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    # --- values ------------------------------------------------------------------------

    def input(self, name: str, elem_type: int, rank: int) -> str:
        """A graph input of dynamic sizes (one symbolic dimension per axis)."""
        dims = [f"{name}:{i}" for i in range(rank)]
        self.rank[name] = rank
        if elem_type == TensorProto.BFLOAT16:  # fed as float32, rounded here, once
            self.inputs.append(helper.make_tensor_value_info(name, FLOAT, dims))
            return self.op("Cast", name, to=elem_type)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, dims))
        return name

    def const(self, value: Any, dtype: Any = None, hint: str = "const") -> str:
        """A constant (an initializer of the graph)."""
        array = np.asarray(value, dtype=dtype)
        name = self._fresh(hint)
        self.initializers.append(numpy_helper.from_array(array, name))
        self.rank[name] = array.ndim
        return name

    def ints(self, *values: int) -> str:
        """A 1-D int64 constant (shapes, axes, slice bounds)."""
        return self.const(np.array(values, dtype=np.int64), hint="ints")

    def op(self, op_type: str, *inputs: str | None, outputs: int = 1, rank: int | None = None,
           **attributes: Any) -> Any:
        """One node; returns its output name (or a tuple of ``outputs`` names). The outputs'
        rank is ``rank`` if given, else the largest rank among the inputs (the rule of
        broadcasting and of every rank-preserving operation used here)."""
        names = [self._fresh(op_type.lower()) for _ in range(outputs)]
        args = ["" if x is None else x for x in inputs]
        self.nodes.append(helper.make_node(op_type, args, names, **attributes))
        out_rank = rank if rank is not None else max((self.rank[x] for x in args), default=0)
        for n in names:
            self.rank[n] = out_rank
        return names[0] if outputs == 1 else tuple(names)

    # --- the mixed-precision contract ----------------------------------------------------

    def wide(self, x: str) -> str:
        """``x`` in float32, the accumulation dtype (exact from float16)."""
        return x if self.store_type == FLOAT else self.op("Cast", x, to=FLOAT)

    def stored(self, y: str) -> str:
        """A float32 result rounded once to the stored dtype."""
        return y if self.store_type == FLOAT else self.op("Cast", y, to=self.store_type)

    # --- the model -----------------------------------------------------------------------

    def output(self, name: str, elem_type: int | None = None) -> None:
        elem = self.store_type if elem_type is None else elem_type
        if elem == TensorProto.BFLOAT16:  # handed back as float32 (exact)
            name, elem = self.op("Cast", name, to=FLOAT), FLOAT
        dims = [f"out:{len(self.outputs)}:{i}" for i in range(self.rank[name])]
        self.outputs.append(helper.make_tensor_value_info(name, elem, dims))

    def model(self, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs,
                                  self.initializers)
        model = helper.make_model(graph, producer_name="gptspec",
                                  opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        return model
