"""Writes docs/api.md, the API reference, from the docstrings of every name remat_opt exports.

    python docs/api_reference.py            # rewrite docs/api.md
    python docs/api_reference.py --check    # exit 1 if docs/api.md is not what the docstrings say

The reference is the docstrings, so it cannot drift from the code: tests/test_api_reference.py
runs ``--check``. Each exported name belongs to one group below; a new export must be placed.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

import remat_opt
from remat_opt._errors import REPR_LIMIT

OUT = Path(__file__).with_name("api.md")

GROUPS: dict[str, tuple[str, ...]] = {
    "Planning": ("optimize", "optimize_step", "OptimizedFunction", "SolverOptions"),
    "Plans": ("Plan", "Schedule"),
    "Memory": ("peak_bytes", "device_memory", "parse_bytes", "format_bytes", "fragmentation", "Fragmentation"),
    "Cost models": ("CostModel", "FlopCostModel", "Interconnect"),
    "Baselines": ("BaselineCall", "no_remat", "checkpoint_policy", "layer_checkpoint_policy", "POLICIES",
                  "megatron_selective", "chen_sqrt_n", "chen_greedy", "revolve", "all_baselines"),
    "Errors": ("RematOptError", "InvalidBudgetTypeError", "InvalidBudgetError", "InvalidOptionTypeError",
               "InvalidOptionError", "InvalidArgnumsTypeError", "InvalidArgnumsError",
               "NonDifferentiableArgumentError", "InvalidLossError", "ClosedOverTracerError",
               "InfeasibleBudgetError", "UnsupportedProgramError"),
    "Warnings": ("UnknownPrimitiveWarning", "CacheWarning"),
}

INTROS = {
    "Baselines": "Each baseline takes a `BaselineCall` (what it is measured with) and returns a measured `Plan`.",
    "Errors": ("Every error remat_opt raises on purpose derives from `RematOptError` and from the built-in a "
               "caller expects (`ValueError` for a bad value, `TypeError` for a bad type), names the argument "
               "and says what to do. Large values in messages are shown by dtype and shape (`float32[256,256]`) "
               f"and cut at {REPR_LIMIT} characters."),
}
"""A sentence under a group's heading, for what its members' docstrings each leave to the module."""

SECTIONS = ("Args", "Arguments", "Attributes", "Returns", "Raises", "Yields", "Example", "Examples")
LISTS = ("Args", "Arguments", "Attributes", "Raises")
"""The sections whose entries are ``name: description``, written as bullets."""

HEADER = """# API reference

Generated from the docstrings by `python docs/api_reference.py`; do not edit by hand. The README
gives `optimize` and its options with examples; [usage.md](usage.md) the rest of what a user does.
"""


def markdown(doc: str) -> str:
    """A Google-style docstring as Markdown: argument sections as bullets, Returns as a paragraph,
    examples as a Python block, reST roles and double backticks as code spans."""
    doc = re.sub(r":(?:func|class|mod|meth|data|attr|exc):`~?([^`]+)`", r"`\1`", doc).replace("``", "`")
    out: list[str] = []
    section = None
    for line in doc.splitlines():
        header = line.rstrip(":").strip()
        if line.endswith(":") and header in SECTIONS and not line.startswith(" "):
            section = header
            out += ["", f"**{header}:**", ""] + (["```python"] if section.startswith("Example") else [])
        elif section and section.startswith("Example") and (line.startswith(" ") or not line.strip()):
            out.append(line[4:])
        elif section in LISTS and line.startswith("    ") and not line.startswith("        "):
            out.append(f"- {line.strip()}")
        elif section and line.startswith("    ") and out[-1].strip():
            out[-1] += f" {line.strip()}"
        elif section and line.startswith("    "):
            out.append(line.strip())
        else:
            out += ["```"] if section and section.startswith("Example") else []
            section = section if section and not line.strip() else None
            out.append(line)
    if section and section.startswith("Example"):
        out.append("```")
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


class _Annotation(str):
    """An annotation kept as written (``from __future__ import annotations``), shown unquoted."""

    def __repr__(self) -> str:
        return str(self)


def signature_of(obj: object) -> str:
    """``obj``'s call signature as written in the source (annotations unquoted)."""
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"
    plain = lambda a: _Annotation(a) if isinstance(a, str) else a  # noqa: E731
    params = [q.replace(annotation=plain(q.annotation)) for q in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=plain(sig.return_annotation)))


def entry(name: str) -> str:
    """One exported name: its kind, its signature and its docstring."""
    obj = getattr(remat_opt, name)
    if isinstance(obj, dict):  # a table: its keys are the reference
        return f"### `{name}`\n\nA dict; its keys: " + ", ".join(f"`{k}`" for k in obj) + "."
    kind = "class" if inspect.isclass(obj) else "function"
    error = inspect.isclass(obj) and issubclass(obj, BaseException)
    # An error is shown by what it derives from; its constructor is not how a user meets it.
    signature = f"({', '.join(b.__name__ for b in obj.__bases__)})" if error else signature_of(obj)
    text = f"### `{name}`\n\n{kind} `{name}{signature}`\n\n{markdown(inspect.getdoc(obj) or '')}"
    if inspect.isclass(obj) and not error:
        text += "".join(f"\n\n{member}" for member in members(obj))
    return text


def members(cls: type) -> list[str]:
    """The public methods and properties ``cls`` itself defines, each with its docstring."""
    out = []
    for attr, value in vars(cls).items():
        value = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        if attr.startswith("_") or not (inspect.isfunction(value) or isinstance(value, property)):
            continue
        if isinstance(value, property):
            head = f"property `{cls.__name__}.{attr}`"
            doc = inspect.getdoc(value.fget) if value.fget else ""
        else:
            head = f"method `{cls.__name__}.{attr}{signature_of(getattr(cls, attr))}`"
            doc = inspect.getdoc(value)
        out.append(f"#### `{cls.__name__}.{attr}`\n\n{head}\n\n{markdown(doc or '')}".rstrip())
    return out


def reference() -> str:
    """The whole of docs/api.md."""
    placed = [n for names in GROUPS.values() for n in names]
    missing = sorted(set(remat_opt.__all__) - set(placed))
    if missing:
        raise SystemExit(f"exported but in no group of docs/api_reference.py: {', '.join(missing)}")
    parts = [HEADER]
    for group, names in GROUPS.items():
        parts.append(f"## {group}\n" + (f"\n{INTROS[group]}\n" if group in INTROS else ""))
        parts += [entry(n) + "\n" for n in names]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md differs from the docstrings")
    args = parser.parse_args(argv)
    text = reference()
    if args.check:
        if OUT.read_text() != text:
            print("docs/api.md is not what the docstrings say: run python docs/api_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
