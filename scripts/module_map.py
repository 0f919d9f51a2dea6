"""Write the module map (every module of sparkml_dist, where it runs, what it holds) from the
modules' own docstrings into a Markdown file, between the table's header and the first line after
it that is not a table row.  ``python scripts/module_map.py docs/layout.md``; tests/unit/
test_layout.py checks the map against the package."""

import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = "| path | runs | what |"
TAG = re.compile(r"\s\[(\w+)\]$")


def rows() -> list:
    out = []
    for path in sorted((ROOT / "sparkml_dist").rglob("*.py"), key=lambda p: (len(p.parts), str(p))):
        doc = (ast.get_docstring(ast.parse(path.read_text()), clean=False) or "").split("\n")[0]
        match = TAG.search(doc)
        tag = match.group(1) if match else "?"
        what = doc[: match.start()].strip() if match else doc
        out.append(f"| `{path.relative_to(ROOT)}` | [{tag}] | {what.replace('|', chr(92) + '|')} |")
    return out


def write(target: pathlib.Path) -> None:
    lines = target.read_text().split("\n")
    start = lines.index(HEADER)
    end = start + 2
    while end < len(lines) and lines[end].startswith("| `"):
        end += 1
    lines[start + 2 : end] = rows()
    target.write_text("\n".join(lines))


if __name__ == "__main__":
    write(pathlib.Path(sys.argv[1]))
