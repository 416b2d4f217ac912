"""remat_opt: gradient-checkpoint placement for JAX, solved with CP-SAT, verified on XLA.

The pipeline is the package's layout: :mod:`remat_opt.program` (the function as
one flat jaxpr, its graph as JAX differentiates it, FLOPs) → :mod:`remat_opt.memory`
(the peak model, its facts about XLA, XLA's own measurement) → :mod:`remat_opt.solve`
(CP-SAT, Chen's segmentations, nested trees, Checkmate's MILP) → :mod:`remat_opt.rewrite`
(fenced ``jax.checkpoint``, loop plans). ``optimize`` runs them all and keeps only
plans XLA measures under the budget. :mod:`remat_opt.baselines` return the same
:class:`Plan`, measured the same way; :mod:`remat_opt.zoo` holds the models.
"""

from .baselines import BaselineCall as BaselineCall
from .baselines._baselines import all_baselines as all_baselines
from .baselines._baselines import checkpoint_policy as checkpoint_policy
from .baselines._baselines import chen_greedy as chen_greedy
from .baselines._baselines import chen_sqrt_n as chen_sqrt_n
from .baselines._baselines import layer_checkpoint_policy as layer_checkpoint_policy
from .baselines._baselines import megatron_selective as megatron_selective
from .baselines._baselines import no_remat as no_remat
from .baselines._baselines import revolve as revolve
from ._budget import format_bytes as format_bytes
from .cache._cache import CacheWarning as CacheWarning
from ._budget import parse_bytes as parse_bytes
from .program._cost import CostModel as CostModel
from .program._cost import FlopCostModel as FlopCostModel
from .program._cost import Interconnect as Interconnect
from ._errors import InfeasibleBudgetError as InfeasibleBudgetError
from ._errors import InvalidBudgetError as InvalidBudgetError
from ._errors import InvalidBudgetTypeError as InvalidBudgetTypeError
from ._errors import ClosedOverTracerError as ClosedOverTracerError
from ._errors import InvalidArgnumsError as InvalidArgnumsError
from ._errors import InvalidArgnumsTypeError as InvalidArgnumsTypeError
from ._errors import InvalidLossError as InvalidLossError
from ._errors import InvalidOptionError as InvalidOptionError
from ._errors import InvalidOptionTypeError as InvalidOptionTypeError
from ._errors import NonDifferentiableArgumentError as NonDifferentiableArgumentError
from ._errors import RematOptError as RematOptError
from ._errors import UnsupportedProgramError as UnsupportedProgramError
from .memory._fragmentation import Fragmentation as Fragmentation
from .memory._fragmentation import fragmentation as fragmentation
from .planner._optimize import OptimizedFunction as OptimizedFunction
from .memory._fusion import UnknownPrimitiveWarning as UnknownPrimitiveWarning
from ._api import optimize as optimize
from ._api import peak_bytes as peak_bytes
from ._options import device_memory as device_memory
from ._plan import Plan as Plan
from ._step import optimize_step as optimize_step
from .rewrite._policies import POLICIES as POLICIES
from ._schedule import Schedule as Schedule
from .solve._solve import SolverOptions as SolverOptions

__all__ = [
    "POLICIES",
    "BaselineCall",
    "CacheWarning",
    "ClosedOverTracerError",
    "CostModel",
    "FlopCostModel",
    "Fragmentation",
    "InfeasibleBudgetError",
    "Interconnect",
    "InvalidArgnumsError",
    "InvalidArgnumsTypeError",
    "InvalidBudgetError",
    "InvalidBudgetTypeError",
    "InvalidLossError",
    "InvalidOptionError",
    "InvalidOptionTypeError",
    "NonDifferentiableArgumentError",
    "OptimizedFunction",
    "Plan",
    "RematOptError",
    "Schedule",
    "SolverOptions",
    "UnknownPrimitiveWarning",
    "UnsupportedProgramError",
    "all_baselines",
    "checkpoint_policy",
    "chen_greedy",
    "chen_sqrt_n",
    "device_memory",
    "format_bytes",
    "fragmentation",
    "layer_checkpoint_policy",
    "megatron_selective",
    "no_remat",
    "optimize",
    "optimize_step",
    "parse_bytes",
    "peak_bytes",
    "revolve",
]
__version__ = "0.1.0"
