"""gptspec.adapters.onnx — the decoder-only GPT written as ONNX graphs from the spec's
equations and run by ONNX Runtime on the CPU, as a conformance backend
(``gptspec conformance --backend onnxruntime``).

The graphs are written node by node with ``onnx.helper`` (``ops``: one function per spec
entry; ``graph``: the builder; ``backend``: the protocol), not exported from the PyTorch
model: so the adapter needs no torch, and the graph is a second transcription of the
spec, independent of the PyTorch backend, where a bug shared by the exporter's source and
the suite's expectations cannot hide. Needs the ``onnx`` extra; never imports torch.
"""

from gptspec.adapters.onnx.backend import OnnxRuntimeBackend

__all__ = ["OnnxRuntimeBackend"]
