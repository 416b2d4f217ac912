"""Stage 3 — memory: the peak model, its facts about XLA, and XLA's own figure.

:func:`model_graph` is the program graph with the facts the model needs;
:func:`simulate` predicts the peak and recompute of any schedule on it;
:func:`peak_bytes` is XLA's measurement, the judge of every plan (:func:`memory_of`: its
parts; :func:`gradient_step`, :func:`traced_step`: the step it compiles; :func:`gradient_flops`:
the FLOPs its gradient runs, counted on the traced step).
"""

from ._facts import model_graph as model_graph
from ._facts import with_memory_facts as with_memory_facts
from ._measure import abstract as abstract
from ._measure import gradient_flops as gradient_flops
from ._measure import gradient_step as gradient_step
from ._measure import memory_of as memory_of
from ._measure import peak_bytes as peak_bytes
from ._measure import traced_step as traced_step
from ._calibrate import calibrate as calibrate
from ._simulate import simulate as simulate

__all__ = ["abstract", "calibrate", "gradient_flops", "gradient_step", "memory_of", "model_graph", "peak_bytes",
           "simulate", "traced_step", "with_memory_facts"]
