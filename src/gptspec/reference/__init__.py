"""gptspec.reference — literal float64 NumPy transcriptions, one function per spec entry.

The functions are re-exported flat (as in JAX's lax_reference) so that a spec entry's
``reference`` name is looked up as ``getattr(gptspec.reference, name)``. Each module
lists its spec functions in ``__all__``; helpers that are not spec entries stay out.
"""

from gptspec.reference import (
    attention,
    block,
    costs,
    embedding,
    gradients,
    loss,
    optimizer,
    output,
    sampling,
    tokenizer,
    training,
)
from gptspec.reference.attention import *  # noqa: F401,F403
from gptspec.reference.block import *  # noqa: F401,F403
from gptspec.reference.costs import *  # noqa: F401,F403
from gptspec.reference.embedding import *  # noqa: F401,F403
from gptspec.reference.gradients import *  # noqa: F401,F403
from gptspec.reference.loss import *  # noqa: F401,F403
from gptspec.reference.optimizer import *  # noqa: F401,F403
from gptspec.reference.output import *  # noqa: F401,F403
from gptspec.reference.sampling import *  # noqa: F401,F403
from gptspec.reference.tokenizer import *  # noqa: F401,F403
from gptspec.reference.training import *  # noqa: F401,F403

# in the order of the spec's groups
MODULES = (tokenizer, embedding, attention, block, output, loss, gradients, optimizer, training,
           sampling, costs)
__all__ = [name for module in MODULES for name in module.__all__]
