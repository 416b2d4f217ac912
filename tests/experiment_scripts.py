"""Running the experiment scripts as a user would, for the tests that keep them from rotting."""

import csv
import subprocess
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def read_rows(path: Path) -> list[dict]:
    """The rows of a results CSV, its ``#`` stamp lines skipped."""
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def run_script(script: str, *args: str) -> str:
    """Runs ``experiments/<script>`` with ``args``; its stdout, once it exits 0."""
    done = subprocess.run([sys.executable, str(EXPERIMENTS / script), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
