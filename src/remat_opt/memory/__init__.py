"""Stage 3 — memory: the peak model, its facts about XLA, and XLA's own figure.

:func:`model_graph` is the program graph with the facts the model needs;
:func:`simulate` predicts the peak and recompute of any schedule on it;
:func:`peak_bytes` is XLA's measurement, the judge of every plan.
"""

from ._facts import model_graph as model_graph
from ._facts import with_memory_facts as with_memory_facts
from ._measure import peak_bytes as peak_bytes
from ._calibrate import calibrate as calibrate
from ._simulate import simulate as simulate

__all__ = ["calibrate", "model_graph", "peak_bytes", "simulate", "with_memory_facts"]
