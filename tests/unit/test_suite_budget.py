"""``make test``'s time budget (tests/conftest.py ``BUDGETS_S``): the passes' budgets fit the
suite's 30 minutes the way the Makefile runs them, and each pass's line says when it is over."""

import re

from tests import conftest


def _makefile_passes():
    text = open(f"{conftest.ROOT}/Makefile").read()
    get = lambda name: re.search(rf"^{name} := (.*)$", text, re.M).group(1).split()  # noqa: E731
    return get("PASSES"), get("BESIDE"), get("LAST_PASSES")


def test_the_passes_budgets_fit_the_suites_30_minutes_as_the_makefile_runs_them():
    passes, beside, last = _makefile_passes()
    name = lambda target: target.removeprefix("test-")  # noqa: E731
    serial = [name(p) for p in passes if p != "lint"]
    assert set(serial + [name(p) for p in beside + last]) == set(conftest.BUDGETS_S), (
        "every pass make test runs has a budget, and only those"
    )
    last_s = sum(conftest.BUDGETS_S[name(p)] for p in last)
    beside_s = max(conftest.BUDGETS_S[name(p)] for p in beside)
    total = sum(conftest.BUDGETS_S[p] for p in serial) + max(last_s, beside_s)
    assert total <= conftest.SUITE_BUDGET_S == 1800, total


def test_a_pass_over_its_budget_says_by_how_much():
    assert "OVER by 150 s" in conftest.budget_line("local", conftest.BUDGETS_S["local"] + 150)
    assert "within it" in conftest.budget_line("cluster", 10)
    assert "no budget" in conftest.budget_line("mine", 10)
