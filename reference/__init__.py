"""gptspec.reference — literal float64 NumPy transcriptions, one function per spec entry.

The functions are re-exported flat (as in JAX's lax_reference) so that a spec entry's
``reference`` name is looked up as ``getattr(gptspec.reference, name)``.
"""

from gptspec.reference.forward import *  # noqa: F401,F403
from gptspec.reference.forward import __all__ as _forward_all

__all__ = list(_forward_all)
