"""remat_opt: gradient-checkpoint placement for JAX, solved with CP-SAT, verified on XLA.

The pipeline, one module a stage: ``_trace`` (flat jaxpr) → ``_graph`` (JAX's own
linearization: what the backward reads) → ``_cost`` (FLOPs) → ``_memory`` (the
peak model) → ``_solve`` (CP-SAT) → ``_rewrite`` (fenced ``jax.checkpoint``) →
``_measure`` (XLA's ``memory_analysis``). ``optimize`` runs them all.
"""

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
from ._memory import Schedule as Schedule
from ._optimize import OptimizedFunction as OptimizedFunction
from ._optimize import optimize as optimize
from ._plan import Plan as Plan
from ._solve import SolverOptions as SolverOptions

__all__ = [
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
    "format_bytes",
    "optimize",
    "parse_bytes",
    "peak_bytes",
]
__version__ = "0.1.0"
