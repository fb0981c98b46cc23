"""gptspec.adapters.onnx — the decoder-only GPT written as ONNX graphs from the spec's
equations and run by ONNX Runtime on the CPU, as a conformance backend
(``gptspec conformance --backend onnxruntime``).

The graphs are written node by node with ``onnx.helper`` (``ops``: one function per spec
entry under its reference name; ``graph``: the builder), not exported from the PyTorch
model with ``torch.onnx.export``, for two reasons: the adapter then needs no torch (a
backend author validates it in an environment without torch), and the graph is a second
transcription of the spec, independent of the PyTorch backend, so that a bug shared by
the exporter's source and the suite's expectations cannot hide. ``backend`` holds the
protocol (``OnnxRuntimeBackend``). Needs ``onnx`` and ``onnxruntime`` (the ``onnx``
extra: ``pip install 'gptspec[onnx]'``); never imports torch.
"""

from gptspec.adapters.onnx.backend import OnnxRuntimeBackend

__all__ = ["OnnxRuntimeBackend"]
