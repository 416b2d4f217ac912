"""The planner: the search behind ``optimize``, from one call to a plan XLA measured under the budget.

:class:`OptimizedFunction` (:mod:`._optimize`) plans once per signature: it asks the plan cache
(:mod:`remat_opt.cache`) first, refuses a budget under the step's own arguments and outputs
(:mod:`._floor`), then runs the FLOP search (:mod:`._flop_search`): every strategy, keeping the
one that fits with the fewest recomputed FLOPs: CP-SAT's schedules steered by XLA's figures
(:mod:`._steering`), loop plans (:mod:`._loop_planning`), JAX's policies around the whole
function and per layer (:mod:`._policy_planning`, :mod:`._layer_policies`); on an accelerator
the step-time search (:mod:`._timed`, its candidates and what a process measured of them in
:mod:`._candidates`, its saved values' bytes and time in :mod:`._saved_bytes`). The winner is
compiled once more as the user's ``jax.jit`` will (:mod:`._verify`), and with bare checkpoints
where the compiler honours them and XLA fits that (:mod:`._unfenced`). Around them: what a mesh
changes (:mod:`._mesh`), forward mode (:mod:`._forward`), what one search carries (:mod:`._search_state`), how long the FLOP search
may run after the step-time search found nothing (:mod:`._patience`), the error when nothing
fits (:mod:`._refusal`) and the progress shown while it runs (:mod:`._progress`).

The planner may import every stage, the plan and the cache; only the package's face
(``remat_opt``, :mod:`remat_opt._api`, :mod:`remat_opt._step`, the command line) imports it.
"""

from ._floor import floor_of as floor_of
from ._optimize import OptimizedFunction as OptimizedFunction

__all__ = ["OptimizedFunction", "floor_of"]
