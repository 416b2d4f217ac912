"""experiments/README.md lists every script of experiments/ once, with one of the four kinds: a
script added, renamed or removed without its row fails here."""

import re
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
KINDS = {"figure", "evaluation", "diagnostic", "library"}


def _rows() -> list[list[str]]:
    """The cells of each table row whose first cell is a backticked ``name.py``."""
    rows = []
    for line in (EXPERIMENTS / "README.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if re.fullmatch(r"`[\w.-]+\.py`", cells[0]):
            rows.append(cells)
    return rows


def test_every_experiment_script_has_one_row():
    named = [cells[0].strip("`") for cells in _rows()]
    scripts = sorted(p.name for p in EXPERIMENTS.glob("*.py"))
    assert len(named) == len(set(named)), sorted({n for n in named if named.count(n) > 1})
    assert not set(scripts) - set(named), f"not in experiments/README.md: {sorted(set(scripts) - set(named))}"
    assert not set(named) - set(scripts), f"no such script: {sorted(set(named) - set(scripts))}"


def test_every_row_has_five_cells_and_a_known_kind():
    rows = _rows()
    assert rows
    for cells in rows:
        assert len(cells) == 5 and all(cells), cells
        assert cells[1] in KINDS, cells
