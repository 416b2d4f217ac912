"""The plan cache: what a search leaves for later ones, in this process and on disk.

A plan depends only on the program, its arguments' shapes (and shardings), the budget, the
options and the versions of jax and remat_opt, so it is kept under a key made of them and
loaded back without a solve or a compile. The modules:

- :mod:`._cache`: the key, the entries (JSON: a plan's figures and its decisions), the
  folder, listing and clearing it (``remat-opt cache``);
- :mod:`._call`: :class:`Call`, one question to the planner (a function, one call's
  arguments, the options), which traces the program and makes its key once;
- :mod:`._restore`: a plan rebuilt from its entry and checked against its own figures;
  :func:`cached_or_new_plan` is the planner's way in;
- :mod:`._lowest`, :mod:`._front`, :mod:`._counted`: what holds of a program at any
  budget, under its key with no budget: the lowest-memory schedule XLA measured, the
  measured Pareto front, and the FLOPs each schedule and policy recomputes.

The cache keeps and rebuilds decisions; it never searches. It imports the stages a plan is
rebuilt with (``program``, ``memory``, ``rewrite``) and the plan, not the solver and not the
planner (:mod:`remat_opt.planner`), which asks it first and imports it.
"""

from ._cache import CACHE_DIR_ENV as CACHE_DIR_ENV
from ._cache import CacheWarning as CacheWarning
from ._cache import cache_directory as cache_directory
from ._cache import clear as clear
from ._cache import list_entries as list_entries
from ._call import Call as Call
from ._restore import cached_or_new_plan as cached_or_new_plan

__all__ = ["CACHE_DIR_ENV", "Call", "CacheWarning", "cache_directory", "cached_or_new_plan", "clear",
           "list_entries"]
