"""remat_opt: gradient-checkpoint placement for JAX, solved with CP-SAT, verified on XLA.

The pipeline, one module a stage: ``_trace`` (flat jaxpr) → ``_graph`` (JAX's own
linearization: what the backward reads) → ``_cost`` (FLOPs) → ``_memory`` (the
peak model) → ``_solve`` (CP-SAT; ``_nesting``: checkpoints within checkpoints) → ``_rewrite`` (fenced ``jax.checkpoint``) →
``_measure`` (XLA's ``memory_analysis``). ``optimize`` runs them all.
Baselines (``_baselines``, ``_policies``, ``_chen``, ``_nesting``; measured by ``_reference``) return the
same :class:`Plan`, measured the same way.
"""

from ._baselines import all_baselines as all_baselines
from ._baselines import checkpoint_policy as checkpoint_policy
from ._baselines import chen_greedy as chen_greedy
from ._baselines import chen_sqrt_n as chen_sqrt_n
from ._baselines import layer_checkpoint_policy as layer_checkpoint_policy
from ._baselines import megatron_selective as megatron_selective
from ._baselines import no_remat as no_remat
from ._baselines import revolve as revolve
from ._budget import format_bytes as format_bytes
from ._budget import parse_bytes as parse_bytes
from ._cost import CostModel as CostModel
from ._cost import FlopCostModel as FlopCostModel
from ._errors import InfeasibleBudgetError as InfeasibleBudgetError
from ._errors import InvalidBudgetError as InvalidBudgetError
from ._errors import InvalidBudgetTypeError as InvalidBudgetTypeError
from ._errors import RematOptError as RematOptError
from ._errors import UnsupportedProgramError as UnsupportedProgramError
from ._measure import peak_bytes as peak_bytes
from ._optimize import OptimizedFunction as OptimizedFunction
from ._optimize import optimize as optimize
from ._plan import Plan as Plan
from ._policies import POLICIES as POLICIES
from ._schedule import Schedule as Schedule
from ._solve import SolverOptions as SolverOptions

__all__ = [
    "POLICIES",
    "CostModel",
    "FlopCostModel",
    "InfeasibleBudgetError",
    "InvalidBudgetError",
    "InvalidBudgetTypeError",
    "OptimizedFunction",
    "Plan",
    "RematOptError",
    "Schedule",
    "SolverOptions",
    "UnsupportedProgramError",
    "all_baselines",
    "checkpoint_policy",
    "chen_greedy",
    "chen_sqrt_n",
    "format_bytes",
    "layer_checkpoint_policy",
    "megatron_selective",
    "no_remat",
    "optimize",
    "parse_bytes",
    "peak_bytes",
    "revolve",
]
__version__ = "0.1.0"
