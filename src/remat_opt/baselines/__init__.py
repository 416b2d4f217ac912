"""Baseline strategies, measured the same way as ``optimize``'s plans (:mod:`remat_opt.baselines._baselines`).

Each baseline function (``remat_opt.no_remat``, ``remat_opt.checkpoint_policy``...) takes
a :class:`BaselineCall`: what it is measured with. :func:`reference` models and measures the
program once for them (:class:`Reference`), :func:`policy_plan` makes a plan of a program a
policy wraps, and :data:`RECIPES` are MaxText's ``remat_policy`` menu (:func:`recipe_policy`,
:func:`recipe_program` on a scan body).
"""

from ._maxtext import RECIPES as RECIPES
from ._maxtext import recipe_policy as recipe_policy
from ._maxtext import recipe_program as recipe_program
from ._reference import BaselineCall as BaselineCall
from ._reference import Reference as Reference
from ._reference import policy_plan as policy_plan
from ._reference import reference as reference

__all__ = ["RECIPES", "BaselineCall", "Reference", "policy_plan", "recipe_policy", "recipe_program", "reference"]
