"""The code blocks of the README and of the install page (the quickstart): each is run by the
suite or says why not, and the Python ones that say they are run here run as written, in order
(one namespace per page, on the pass's session: get_session finds it)."""

import contextlib
import io
import os
import re

from tests.conftest import ROOT, masters

BLOCK = re.compile(r"(<!-- [^\n]*? -->\n)?```(\w+)\n(.*?)\n```", re.S)


PAGES = ("README.md", os.path.join("docs", "install.md"))


def _blocks(page):
    return BLOCK.findall(open(os.path.join(ROOT, page)).read())


def test_every_block_is_run_by_the_suite_or_says_why_not():
    for page in PAGES:
        blocks = _blocks(page)
        assert blocks and all(m.startswith(("<!-- run by", "<!-- not run by")) for m, _, _ in blocks), page


@masters("local")
def test_the_python_blocks_run_as_written(spark):
    ran = 0
    for page in PAGES:
        namespace = {"__name__": "__readme__"}
        for mark, lang, code in _blocks(page):
            if lang == "python" and "run by tests/spark/test_readme.py" in mark:
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(compile(code, page, "exec"), namespace)
                assert out.getvalue().strip(), code
                ran += 1
    assert ran >= 3
