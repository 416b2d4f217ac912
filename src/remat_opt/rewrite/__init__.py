"""Stage 5 — rewrite: a schedule or a policy as the JAX program that runs it.

:func:`apply_schedule` turns a :class:`remat_opt.Schedule` into the user's function with
fenced ``jax.checkpoint`` segments and names saved; :func:`policy_program` and
:func:`layer_policy_program` wrap a function, or each of its layers, in one of JAX's
built-in policies (:data:`POLICIES`); :func:`loop_program` keeps a ``lax.scan`` a loop with
its body and iterations checkpointed (:class:`LoopPlan`); :func:`layer_program` puts each
stage under its own policy (:class:`LayerPlan`); :func:`fenced_checkpoint` is the fence
itself, which XLA cannot undo.
"""

from ._apply import apply_schedule as apply_schedule
from ._layers import LayerPlan as LayerPlan
from ._layers import layer_program as layer_program
from ._loops import LoopPlan as LoopPlan
from ._loops import loop_candidates as loop_candidates
from ._loops import loop_program as loop_program
from ._loops import near_sqrt_divisors as near_sqrt_divisors
from ._loops import planned_scans as planned_scans
from ._loops import recipe_candidates as recipe_candidates
from ._loops import scan_lengths as scan_lengths
from ._loops import user_names as user_names
from ._policies import POLICIES as POLICIES
from ._policies import layer_policy_program as layer_policy_program
from ._policies import policy_program as policy_program
from ._rewrite import fenced_checkpoint as fenced_checkpoint

__all__ = ["LayerPlan", "LoopPlan", "POLICIES", "apply_schedule", "fenced_checkpoint", "layer_policy_program",
           "layer_program", "loop_candidates", "loop_program", "near_sqrt_divisors", "planned_scans",
           "policy_program", "recipe_candidates", "scan_lengths", "user_names"]
