"""What the README tells a newcomer to run matches what runs: the demo's table (in
docs/measurements.md, summed up in the README) is the demo's output, and the notebook's
command installs what the notebook imports."""

import json
import re
import sys
import tomllib
from pathlib import Path

from remat_opt import _demo

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MEASUREMENTS = (ROOT / "docs" / "measurements.md").read_text(encoding="utf-8")


def _demo_block() -> list[str]:
    """The indented block of the demo's output in docs/measurements.md's demo section."""
    start = MEASUREMENTS.index("## The demo")
    lines = MEASUREMENTS[start:].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("    ") and line.strip())
    block = []
    for line in lines[first:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    return block


def test_the_readme_demo_table_is_what_the_demo_prints():
    block = _demo_block()
    text = "\n".join(block)
    assert _demo.LEGEND in text and _demo.HEADER in block
    rows = block[block.index(_demo.HEADER) + 1:]
    table = [r for r in rows if re.match(r"^\s+\d", r)]
    assert table, text
    # The demo's columns, right-aligned under the header's names as it prints them.
    ends = [m.end() for m in re.finditer(r"\S+", _demo.HEADER) if m.group() not in ("grad", "solve", "total", "status")]
    for row in table:
        fields = [row[a:b].strip() for a, b in zip([0, *ends], ends)]
        budget, predicted, measured, recompute, grad_err, solve_s, total_s = fields
        assert re.fullmatch(r"[\d.]+ [KMG]iB", budget) and re.fullmatch(r"[\d.]+ [KMG]iB|-", predicted)
        assert float(measured.split()[0]) <= float(budget.split()[0]) and measured.split()[1] == budget.split()[1]
        assert re.fullmatch(r"[\d.]+%", recompute) and float(grad_err) <= _demo.GRAD_TOLERANCE
        assert float(solve_s) <= float(total_s)
        assert row[len(_demo.HEADER) - len("status"):].strip() in ("OPTIMAL", "PLAIN", "BASELINE") or \
            row[len(_demo.HEADER) - len("status"):].startswith("FEASIBLE")
    summary = next(r for r in rows if "budgets met on XLA" in r)
    assert re.fullmatch(r"\d+ of \d+ budgets met on XLA(?: \(\d+ refused\))?; gradients equal to jax\.grad's in "
                        r"\d+ of \d+ \(largest relative difference \S+, tolerance 1e-05\); \d+ s in all\.", summary)
    assert summary.startswith(f"{len(table)} of {len(table)} budgets met")
    # The README's sentence on the demo quotes this output.
    said = README[README.index("**The demo**"):].split("\n\n")[0]
    largest = re.search(r"largest relative difference (\S+),", summary).group(1)
    assert f"{len(table)} of {len(table)} budgets met on XLA" in said and f"difference {largest})" in said


def test_the_notebook_command_installs_what_the_notebook_imports():
    command = re.search(r'pip install -e "\.\[(\w+)\]"[^\n]*jupyter lab notebooks/quickstart\.ipynb', README)
    assert command, "the README says how to run the notebook"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    installed = {re.split(r"[<>=\[ ]", r)[0].lower() for r in
                 project["dependencies"] + project["optional-dependencies"][command.group(1)]}
    cells = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text(encoding="utf-8"))["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    modules = {m.split(".")[0] for m in re.findall(r"^\s*(?:import|from) (\w[\w.]*)", source, re.M)}
    third_party = modules - set(sys.stdlib_module_names) - {"remat_opt"}
    assert third_party and third_party <= installed, third_party - installed
