"""Baseline strategies, measured the same way as ``optimize``'s plans (:mod:`remat_opt.baselines._baselines`).

Each baseline function (``remat_opt.no_remat``, ``remat_opt.checkpoint_policy``...) takes
a :class:`BaselineCall`: what it is measured with.
"""

from ._reference import BaselineCall as BaselineCall

__all__ = ["BaselineCall"]
