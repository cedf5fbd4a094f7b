"""``make test-quick``'s subset: the tests marked ``quick`` reach every folder of tests/, and the Makefile selects
them with the marker expression under which conftest.py collects only the modules that mark some."""

from __future__ import annotations

import pytest
from conftest import QUICK, ROOT

TESTS = ROOT / "tests"


@pytest.mark.quick
def test_the_quick_subset_has_tests_in_every_folder() -> None:
    modules = list(TESTS.glob("*/test_*.py"))
    marking = {path.parent.name for path in modules if "pytest.mark.quick" in path.read_text(encoding="utf-8")}
    assert marking == {path.parent.name for path in modules}


@pytest.mark.quick
def test_make_test_quick_selects_the_quick_subset() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert f'-m "{QUICK}"' in makefile.split("\ntest-quick:")[1].split("\n\n")[0]
