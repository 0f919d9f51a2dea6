"""The documentation site (docs/, Sphinx + MyST): it builds with warnings as errors, a broken link
fails the build, every public name in the API reference has a docstring, and every public module
opens with an example."""

import importlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

DOCS = os.path.join(ROOT, "docs")


def _build(src, out, *options):
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", "-E", *options, src, out],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _api():
    """(module, [member names]) of every automodule in docs/api.md."""
    text = open(os.path.join(DOCS, "api.md")).read()
    return [
        (mod, [m.strip() for m in members.split(",")] if members.strip() else [])
        for mod, members in re.findall(r"\.\. automodule:: (\S+)\n   :members:(.*)", text)
    ]


def test_every_public_name_has_a_docstring_and_every_module_an_example():
    missing, no_example = [], []
    for mod, members in _api():
        module = importlib.import_module(mod)
        doc = module.__doc__ or ""
        if not re.search(r"Example|>>>|::\n", doc):
            no_example.append(mod)
        for name in members:
            if not (getattr(getattr(module, name), "__doc__", None) or "").strip():
                missing.append(f"{mod}.{name}")
    assert not missing and not no_example, (missing, no_example)


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors_and_a_broken_link_fails_it(tmp_path):
    done = _build(DOCS, str(tmp_path / "html"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "html" / "api.html").exists() and (
        tmp_path / "html" / "notebooks" / "01_ensembles.html"
    ).exists()
    # the same configuration on a two-page site (a second full build cost ~20 s of CPU): the page
    # that links to a missing page fails the build, and that link is the only warning
    broken = tmp_path / "docs"
    broken.mkdir()
    shutil.copy(os.path.join(DOCS, "conf.py"), broken)
    (broken / "index.md").write_text("# Home\n\n```{toctree}\npage\n```\n")
    (broken / "page.md").write_text(
        "# Page\n\nBack [home](index.md); see [the missing page](no_such_page.md#nowhere).\n"
    )
    done = _build(str(broken), str(tmp_path / "broken"), "-D", "exclude_patterns=_build,notebooks")
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if "WARNING" in line]
    assert done.returncode != 0 and warnings and all("no_such_page" in w for w in warnings), warnings
