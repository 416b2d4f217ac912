"""docs/api.md is generated from the docstrings of every exported name, and kept so."""

import importlib.util
from pathlib import Path

import pytest

import remat_opt

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "api_reference.py"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("api_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_is_what_the_docstrings_say(generator):
    assert generator.main(["--check"]) == 0, "run: python docs/api_reference.py"


def test_every_export_is_in_the_reference_with_its_docstring(generator):
    text = generator.reference()
    for name in remat_opt.__all__:
        assert f"### `{name}`" in text
    first_line = remat_opt.optimize.__doc__.strip().splitlines()[0].replace("``", "`")
    assert first_line in text


def test_an_export_in_no_group_is_refused(generator, monkeypatch):
    monkeypatch.setattr(remat_opt, "__all__", [*remat_opt.__all__, "peak_bytes_of_nothing"])
    with pytest.raises(SystemExit, match="peak_bytes_of_nothing"):
        generator.reference()
