"""Stages 1–2 — program: the user's function as one flat jaxpr, its graph as JAX
differentiates it, and the FLOPs of each equation."""

from ._cost import CostModel as CostModel
from ._cost import FlopCostModel as FlopCostModel
from ._graph import ProgramGraph as ProgramGraph
from ._graph import build_graph as build_graph
from ._trace import TracedProgram as TracedProgram
from ._trace import trace as trace

__all__ = ["CostModel", "FlopCostModel", "ProgramGraph", "TracedProgram", "build_graph", "trace"]
