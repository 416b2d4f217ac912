"""What a plan is doing while it takes its time: stage, candidate i of n, best so far.

A plan solves and compiles for seconds to minutes, and a newcomer watching a
silent terminal cannot tell planning from a hang. Once a plan has run
:data:`DELAY_S` seconds, its progress is shown: on a terminal, one line on
stderr rewritten in place (``\\r``) twice a second and cleared when the plan
ends; otherwise, a ``logging`` record per stage on the ``remat_opt.progress``
logger at INFO (shown where logging is configured; the command line does).
A quicker plan, or one loaded from the plan cache, shows nothing.

``REMAT_OPT_PROGRESS=0`` silences it; ``=1`` shows it everywhere, under pytest
too, where it is silent by default (a test's output stays its own). The planner
reports through module functions (:func:`stage`, :func:`measuring`) that do
nothing outside :func:`planning`; a plan started inside another reports on
the outer one's line.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from .._budget import format_bytes

ENV = "REMAT_OPT_PROGRESS"
DELAY_S = 3.0
"""A plan quicker than this shows no progress."""
REFRESH_S = 0.5

logger = logging.getLogger("remat_opt.progress")


def enabled() -> bool:
    """Whether progress is shown: ``REMAT_OPT_PROGRESS`` if set (``0`` off), else not under pytest."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting:
        return setting not in ("0", "false", "no", "off")
    return "PYTEST_CURRENT_TEST" not in os.environ


class Progress:
    """One plan's progress: what it is doing, and the lowest peak XLA measured so far.

    Args:
        what: the function planned and its budget, as the line starts.
        budget: the budget in bytes (a measurement at or under it fits).
        stream: where a terminal's line is drawn; ``None``: logging only.
        clock: seconds, monotonic (``time.monotonic``; tests pass their own).
    """

    def __init__(self, what: str, budget: int, stream: TextIO | None, clock: Callable[[], float] = time.monotonic):
        self.what, self.budget, self.stream, self.clock = what, budget, stream, clock
        self.started = clock()
        self.doing = "tracing"
        self.compiles = 0
        self.lowest: int | None = None
        self.drawn = False
        self._lock = threading.Lock()

    def line(self) -> str:
        """The progress line, e.g. ``remat_opt: loss under 45.98 MiB · CP-SAT solve 2/4 · 7 compiled,
        lowest peak 41.17 MiB (fits) · 23 s``: the best so far in memory, as XLA measured it."""
        parts = [self.what, self.doing]
        if self.lowest is not None:
            fits = "fits" if self.lowest <= self.budget else "over"
            parts.append(f"{self.compiles} compiled, lowest peak {format_bytes(self.lowest)} ({fits})")
        parts.append(f"{self.clock() - self.started:.0f} s")
        return "remat_opt: " + " · ".join(parts)

    def stage(self, doing: str) -> None:
        with self._lock:
            changed, self.doing = doing != self.doing, doing
        if changed and self.stream is None and self.clock() - self.started >= DELAY_S:
            logger.info("%s", self.line())

    def measured(self, peak: int) -> None:
        with self._lock:
            self.compiles += 1
            self.lowest = peak if self.lowest is None else min(self.lowest, peak)

    def draw(self) -> None:
        """Rewrites the terminal's line, once the plan has run :data:`DELAY_S`."""
        if self.stream is None or self.clock() - self.started < DELAY_S:
            return
        with self._lock:
            text = self.line()
            self.stream.write(f"\r{text}\x1b[K")
            self.stream.flush()
            self.drawn = True

    def close(self) -> None:
        """Clears the terminal's line (the caller prints what came of the plan)."""
        with self._lock:
            if self.drawn and self.stream is not None:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
        if self.clock() - self.started >= DELAY_S:
            logger.info("%s: done", self.line())


_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("remat_opt_progress", default=None)


def _terminal() -> TextIO | None:
    stream = sys.stderr
    return stream if stream is not None and hasattr(stream, "isatty") and stream.isatty() else None


@contextlib.contextmanager
def planning(name: str, budget: int, stream: TextIO | None | bool = True) -> Iterator[Progress | None]:
    """Shows the progress of the plan run inside, if :func:`enabled` and none is shown already.

    Args:
        name: the function planned.
        budget: its budget in bytes.
        stream: the terminal to draw on; ``True``: stderr if it is one, else logging.
    """
    if _current.get() is not None or not enabled():
        yield None
        return
    terminal = _terminal() if stream is True else stream or None
    progress = Progress(f"{name} under {format_bytes(budget)}", budget, terminal)
    token = _current.set(progress)
    stop = threading.Event()
    ticker = None
    if progress.stream is not None:  # a compile or a solve takes seconds: the line keeps time meanwhile
        def tick() -> None:
            while not stop.wait(REFRESH_S):
                progress.draw()

        ticker = threading.Thread(target=tick, name="remat_opt-progress", daemon=True)
        ticker.start()
    try:
        yield progress
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
        _current.reset(token)
        progress.close()


def stage(doing: str, i: int | None = None, n: int | None = None) -> None:
    """Says what the plan in progress is doing: ``stage("CP-SAT solve", 2, 4)``."""
    progress = _current.get()
    if progress is not None:
        progress.stage(doing if i is None else f"{doing} {i}/{n}")


def measuring(measure: Callable[[Any], int]) -> Callable[[Any], int]:
    """``measure`` (XLA's peak of a program), counted into the plan in progress."""
    def counted(program: Any) -> int:
        peak = measure(program)
        progress = _current.get()
        if progress is not None:
            progress.measured(peak)
        return peak

    return counted
