"""Stage 4 — solve: schedules for a program graph, each strategy a function of the graph.

CP-SAT chooses segments and saved values under a budget (:func:`solve`,
:func:`min_peak_schedule`); beside it, the schedules a person or a paper would write:
Chen's segmentations (:func:`chen_sqrt_n_schedule`, :func:`chen_greedy_schedule`),
Revolve's and other nested trees (:func:`revolve_schedule`, :func:`nested_candidates`),
keep-sets of matmul outputs (:func:`keep_set_schedules`, :func:`measured_keep_set`),
built-in policies' saves per layer (:func:`policy_schedules`), repeated blocks solved once
(:func:`chain_schedule`) and a scan body's saved names (:func:`choose_saved`). Those that
offer schedules at any budget share one signature (:data:`ScheduleSource`: a graph in, its
schedules out), and the planner ranks what :data:`SOURCES` offer (:func:`outside_tiers`). Every one
returns :class:`remat_opt.Schedule` values that :mod:`remat_opt.memory` predicts and
:mod:`remat_opt.rewrite` applies; none measures anything itself but through a function it
is handed.
"""

from ._baseline_picks import baseline_picks as baseline_picks
from ._block_solve import chain_schedule as chain_schedule
from ._blocks import find_blocks as find_blocks
from ._body import choose_saved as choose_saved
from ._body import saveable_nodes as saveable_nodes
from ._chen import articulation_positions as articulation_positions
from ._chen import chen_greedy_candidates as chen_greedy_candidates
from ._chen import chen_greedy_schedule as chen_greedy_schedule
from ._chen import chen_schedules as chen_schedules
from ._chen import chen_sqrt_n_schedule as chen_sqrt_n_schedule
from ._encoding import cut_candidates as cut_candidates
from ._encoding import save_candidates as save_candidates
from ._keep_sets import keep_set_schedules as keep_set_schedules
from ._keep_sets import measured_keep_set as measured_keep_set
from ._layers import Layers as Layers
from ._layers import layers_of as layers_of
from ._nesting import chain_trees as chain_trees
from ._nesting import nested_candidates as nested_candidates
from ._nesting import revolve_schedule as revolve_schedule
from ._nesting import revolve_schedules as revolve_schedules
from ._outside import SOURCES as SOURCES
from ._outside import ScheduleSource as ScheduleSource
from ._outside import outside_tiers as outside_tiers
from ._policy_saves import dot_names as dot_names
from ._policy_saves import policy_schedules as policy_schedules
from ._solve import SolverClock as SolverClock
from ._solve import SolverOptions as SolverOptions
from ._solve import min_peak_schedule as min_peak_schedule
from ._solve import solve as solve

__all__ = ["Layers", "SOURCES", "ScheduleSource", "SolverClock", "SolverOptions", "articulation_positions", "baseline_picks", "chain_schedule",
           "chain_trees", "chen_greedy_candidates", "chen_greedy_schedule", "chen_schedules", "chen_sqrt_n_schedule",
           "choose_saved", "cut_candidates", "dot_names", "find_blocks", "keep_set_schedules", "layers_of",
           "measured_keep_set", "min_peak_schedule", "nested_candidates", "outside_tiers", "policy_schedules",
           "revolve_schedule", "revolve_schedules", "save_candidates", "saveable_nodes", "solve"]
