"""The layout tells the truth (issue 24): every module says where it runs, in one vocabulary; code
that runs on executors or in rank processes never imports driver-only code; no import cycle; and
the module map (docs/design.md) lists every module with the same tag.  The checker is tried on a small
package built here, so it is known to fail on each of those faults."""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Dict, List, Set, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
TAGS = ("driver", "executor", "rank", "anywhere")
REMOTE = ("executor", "rank")  # where driver-only code must never be imported
TAG_RE = re.compile(r"\s\[(\w+)\]$")
MAP_ROW = re.compile(r"^\| `([\w/]+\.py)` \| \[(\w+)\] \|", re.M)


def modules(root: pathlib.Path, package: str) -> Dict[str, pathlib.Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def tag_of(path: pathlib.Path) -> "str | None":
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    match = TAG_RE.search(doc.split("\n", 1)[0])
    return match.group(1) if match and match.group(1) in TAGS else None


def imports(name: str, path: pathlib.Path, known: Dict[str, pathlib.Path]) -> List[Tuple[str, bool]]:
    """(module imported, at module level?) for each package module ``name`` imports; importing
    ``a.b.c`` at module level from outside package ``a.b`` also runs ``a.b``'s ``__init__`` first
    (an edge; inside a function it runs when called, after every module has loaded)."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body} | {
        id(n) for b in tree.body if isinstance(b, (ast.If, ast.Try)) for n in ast.walk(b)
    }
    is_pkg = path.name == "__init__.py"
    found: List[Tuple[str, bool]] = []
    for node in ast.walk(tree):
        targets: List[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            prefix = (
                ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                if node.level
                else node.module or ""
            )
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if not target or target == name:
                continue
            found.append((target, id(node) in top))
            package = target.rpartition(".")[0]
            while id(node) in top and package and not name.startswith(package + "."):
                if package in known and package != name:
                    found.append((package, id(node) in top))
                package = package.rpartition(".")[0]
    return found


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def faults(root: pathlib.Path, package: str, readme: str) -> List[str]:
    """Every way the layout of ``package`` under ``root`` lies, as sentences (none: it is true)."""
    known = modules(root, package)
    tags = {name: tag_of(path) for name, path in known.items()}
    out = [
        f"{known[n].relative_to(root)}: no [{'|'.join(TAGS)}] tag at the end of its docstring's first line"
        for n, t in tags.items()
        if t is None
    ]
    edges: Dict[str, Set[str]] = {}
    for name, path in known.items():
        for target, at_top in imports(name, path, known):
            edges.setdefault(name, set()).add(target)
            if tags[target] != "driver" or tags[name] == "driver" or tags[name] is None:
                continue
            if tags[name] in REMOTE:
                out.append(f"{name} [{tags[name]}] imports {target} [driver]")
            elif at_top:
                out.append(f"{name} [anywhere] imports {target} [driver] at module level")
    out += [f"import cycle: {' -> '.join(c)}" for c in cycles(edges)]
    listed = dict(MAP_ROW.findall(readme))
    for name, path in known.items():
        rel = str(path.relative_to(root))
        if rel not in listed:
            out.append(f"{rel} is missing from the README's module map")
        elif tags[name] and listed[rel] != tags[name]:
            out.append(f"{rel} is [{listed[rel]}] in the README's map but [{tags[name]}] in its docstring")
    out += [
        f"the README's map lists {rel}, which does not exist" for rel in listed if not (root / rel).exists()
    ]
    return out


def test_the_package_layout_tells_the_truth():
    assert faults(ROOT, "sparkml_dist", (ROOT / "docs" / "design.md").read_text()) == []


def test_no_module_over_350_lines_and_no_function_over_60():
    too_long = []
    for path in sorted((ROOT / "sparkml_dist").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 350:
            too_long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno >= 60
            ):
                too_long.append(
                    f"{path.relative_to(ROOT)}: {node.name}() {node.end_lineno - node.lineno + 1} lines"
                )
    assert too_long == []


def _package(tmp_path: pathlib.Path, files: Dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


GOOD = {
    "pkg/__init__.py": '"""A package.  [anywhere]"""\n',
    "pkg/drv.py": '"""Driver code.  [driver]"""\nfrom . import common\n',
    "pkg/common.py": '"""Shared.  [anywhere]"""\n\n\ndef f():\n    from . import late  # lazily: fine\n',
    "pkg/late.py": '"""Driver code used lazily.  [driver]"""\n',
    "pkg/sub/__init__.py": '"""Sub.  [executor]"""\n',
    "pkg/sub/task.py": '"""Task.  [executor]"""\nfrom .. import common\n',
}
BRACKET = re.compile(r"\[(\w+)\]")
MAP = "".join(f"| `{rel}` | [{BRACKET.search(t).group(1)}] | x |\n" for rel, t in GOOD.items())


def test_the_checker_passes_a_true_layout(tmp_path):
    assert faults(_package(tmp_path, GOOD), "pkg", MAP) == []


def test_the_checker_finds_each_lie(tmp_path):
    bad = dict(GOOD)
    bad["pkg/untagged.py"] = '"""No tag here."""\n'
    bad["pkg/sub/task.py"] = '"""Task.  [executor]"""\n\n\ndef run():\n    from .. import drv\n'
    bad["pkg/common.py"] = '"""Shared.  [anywhere]"""\nfrom . import drv\n'  # drv imports common: a cycle
    found = faults(_package(tmp_path, bad), "pkg", MAP + "| `pkg/gone.py` | [driver] | x |\n")
    assert any("pkg/untagged.py: no [" in f for f in found)
    assert "pkg.sub.task [executor] imports pkg.drv [driver]" in found
    assert "pkg.common [anywhere] imports pkg.drv [driver] at module level" in found
    assert "import cycle: pkg.common -> pkg.drv" in found
    assert "pkg/untagged.py is missing from the README's module map" in found
    assert "the README's map lists pkg/gone.py, which does not exist" in found


# ------------------------------------------------------------------ rooms: no arrow runs back up
# The feature rooms (sub-packages), the shared floor beneath them (the top-level modules and
# formats/), and the front doors above (the command line, the drop-ins and facades): the floor
# imports no room, and a room uses another room only through its package or its documented
# modules (the runner's context, protocol, checkpoint and comm settings, the reduction servers' wire
# that parallel's DDP hook speaks; an ensemble's persistence).
ROOMS = ("ensemble", "runner", "tune", "parallel", "search")
FRONT_DOORS = (
    "cli", "horovod", "distributor", "tensorflow_distributor", "keras", "inference", "mlflow_flavor",
    "__main__",
)  # fmt: skip
PUBLIC_MODULES = (
    "runner.context", "runner.protocol", "runner.checkpoint", "runner.comm_settings",
    "runner.backends.reducers", "ensemble.stored.persistence",
)  # fmt: skip


def back_arrows(root: pathlib.Path, package: str) -> List[str]:
    known = modules(root, package)

    def place(name: str) -> str:
        parts = name.split(".")
        if len(parts) == 1:
            return "floor"  # the package itself: its errors and version
        return "door" if parts[1] in FRONT_DOORS else (parts[1] if parts[1] in ROOMS else "floor")

    out = []
    for name, path in known.items():
        for target, _ in imports(name, path, known):
            here, there = place(name), place(target)
            if there in ("floor", "door") or here in ("door", there):
                if there == "door" and here != "door":
                    out.append(f"{name} ({here}) imports the front door {target}")
                continue
            inside = target.split(".", 1)[1] if "." in target else ""
            if here == "floor":
                out.append(f"{name} (the shared floor) imports the {there} room ({target})")
            elif target != f"{package}.{there}" and inside not in PUBLIC_MODULES:
                out.append(f"{name} ({here}) borrows {target} from inside the {there} room")
    return sorted(set(out))


def test_no_arrow_runs_back_up_and_the_top_floor_stays_small():
    assert back_arrows(ROOT, "sparkml_dist") == []
    top = sorted(p.name for p in (ROOT / "sparkml_dist").glob("*.py"))
    assert len(top) <= 27, top


def test_the_runner_wing_is_in_rooms():
    """The runner's data path, backends, checkpoints and executor side each in a room of its own;
    its top level small."""
    runner = ROOT / "sparkml_dist" / "runner"
    top = sorted(p.name for p in runner.glob("*.py"))
    assert len(top) <= 20, top
    rooms = {
        d.name: sorted(p.stem for p in d.glob("*.py"))
        for d in runner.iterdir()
        if (d / "__init__.py").exists()
    }
    assert set(rooms) >= {"data", "backends", "checkpoint", "tasks"}, rooms
    data_path = {"sharding", "staging", "range_deal", "sample_order", "feeding", "sources", "shard", "loader"}
    assert data_path | {"framework_data", "parquet_split", "plan"} <= set(rooms["data"])


def test_the_ensemble_wing_is_in_rooms():
    """The per-group engine (plan and fit), what is stored (blocks, key models, tables, save/load)
    and scoring each in a room; the stages and the member format at the wing's top."""
    wing = ROOT / "sparkml_dist" / "ensemble"
    rooms = {
        d.name: sorted(p.stem for p in d.glob("*.py")) for d in wing.iterdir() if (d / "__init__.py").exists()
    }
    assert {"fitting", "groups", "key_watch", "task", "stream"} <= set(rooms["engine"])
    assert {"key_blocks", "key_models", "members_table", "persistence"} <= set(rooms["stored"])
    assert {"keys", "members", "oob"} <= set(rooms["scoring"])
    assert len(list(wing.glob("*.py"))) <= 16


# ------------------------------------------------------------------ only a backend names a backend
BACKEND_NAMES = {"torch", "horovod", "tensorflow", "jax"}


def backend_names_outside(root: pathlib.Path, package: str, inside: str) -> List[str]:
    """Where a module outside ``inside`` (the backends' room) tests a backend's name: a comparison
    of one of :data:`BACKEND_NAMES` with something named ``*backend*`` (Keras's own backend aside),
    or a literal listing two of them (a hard-coded choice of backends)."""
    out = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(inside):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                named = [
                    getattr(n, "id", None) or getattr(n, "attr", None)
                    for side in sides
                    for n in ast.walk(side)
                    if isinstance(n, (ast.Name, ast.Attribute))
                ]
                names = {c.value for side in sides for c in ast.walk(side) if isinstance(c, ast.Constant)}
                if names & BACKEND_NAMES and any(
                    "backend" in n.lower() and "keras" not in n.lower() for n in named
                ):
                    out.append(f"{rel}:{node.lineno} compares a backend's name: {ast.unparse(node)}")
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                listed = {e.value for e in node.elts if isinstance(e, ast.Constant)} & BACKEND_NAMES
                if len(listed) >= 2:
                    out.append(f"{rel}:{node.lineno} lists backends by name: {ast.unparse(node)}")
    return out


def test_only_the_backends_room_names_a_backend():
    assert backend_names_outside(ROOT, "sparkml_dist", "sparkml_dist/runner/backends/") == []


def test_the_backend_name_checker_finds_each_kind(tmp_path):
    files = {
        "pkg/__init__.py": '"""Pkg.  [anywhere]"""\n',
        "pkg/cli.py": '"""Cli.  [driver]"""\nCHOICES = ("torch", "horovod")\n',
        "pkg/comm.py": '"""Comm.  [anywhere]"""\n\n\ndef f(backend):\n    return backend == "horovod"\n',
        "pkg/keras.py": '"""K.  [rank]"""\n\n\ndef f(keras_backend):\n    return keras_backend == "torch"\n',
        "pkg/backends/__init__.py": '"""B.  [anywhere]"""\nNAMES = ("torch", "jax")\n',
    }
    found = backend_names_outside(_package(tmp_path, files), "pkg", "pkg/backends/")
    assert found == [
        "pkg/cli.py:2 lists backends by name: ('torch', 'horovod')",
        "pkg/comm.py:5 compares a backend's name: backend == 'horovod'",
    ], found


def test_the_rooms_checker_finds_each_back_arrow(tmp_path):
    files = {
        "pkg/__init__.py": '"""Pkg.  [anywhere]"""\n',
        "pkg/shared.py": '"""Shared.  [anywhere]"""\nfrom .runner import thing\n',
        "pkg/runner/__init__.py": '"""Runner.  [driver]"""\n',
        "pkg/runner/thing.py": '"""Thing.  [driver]"""\n',
        "pkg/tune/__init__.py": '"""Tune.  [driver]"""\n',
        "pkg/tune/trial.py": '"""Trial.  [driver]"""\nfrom ..runner import thing\nfrom .. import runner\n',
        "pkg/inference.py": '"""Door.  [driver]"""\nfrom .tune import trial\n',
        "pkg/other.py": '"""Floor.  [anywhere]"""\nfrom . import inference\n',
    }
    found = back_arrows(_package(tmp_path, files), "pkg")
    assert found == [
        "pkg.other (floor) imports the front door pkg.inference",
        "pkg.shared (the shared floor) imports the runner room (pkg.runner)",
        "pkg.shared (the shared floor) imports the runner room (pkg.runner.thing)",
        "pkg.tune.trial (tune) borrows pkg.runner.thing from inside the runner room",
    ], found


# ------------------------------------------------------------------ the wings' inner rooms
# Inside a wing (the runner, the ensembles), each sub-package and each top-level module is a room;
# drawn as floors (a room above every room it imports, function-level imports included), no arrow
# may run up: the rooms' import graph has no cycle. The rooms hand each other values instead.
WINGS = ("runner", "ensemble")


def inner_back_arrows(root: pathlib.Path, package: str, wing: str) -> List[str]:
    """The imports that close a cycle among ``wing``'s rooms (none: they stand as floors)."""
    known = modules(root, package)
    prefix = f"{package}.{wing}."

    def room(name: str) -> "str | None":
        return name[len(prefix) :].split(".")[0] if name.startswith(prefix) else None

    edges: Dict[str, Set[str]] = {}
    lines: Dict[Tuple[str, str], List[str]] = {}
    for name, path in known.items():
        here = room(name)
        for target, at_top in imports(name, path, known):
            there = room(target)
            if here is None or there is None or here == there:
                continue
            edges.setdefault(here, set()).add(there)
            lines.setdefault((here, there), []).append(
                f"{name} -> {target}" + ("" if at_top else " (in a function)")
            )
    out = []
    for cycle in cycles(edges):
        inside = [f"{a} -> {b}: {line}" for a in cycle for b in cycle for line in lines.get((a, b), [])]
        out.append(f"rooms of {wing} import each other ({', '.join(cycle)}): " + "; ".join(sorted(inside)))
    return out


def private_imports(root: pathlib.Path, package: str) -> List[str]:
    """Each ``from <our module> import _name`` of a private name (not a module) across modules."""
    known = modules(root, package)
    out = []
    for name, path in known.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            source = (
                ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                if node.level
                else node.module or ""
            )
            if source.split(".")[0] != package:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{source}.{alias.name}" not in known:
                    out.append(f"{name} imports the private name {alias.name} from {source}")
    return sorted(out)


def np_sign_tests(root: pathlib.Path, package: str) -> List[str]:
    """Where code compares ``np`` (or ``np_``) with 0: the sign that picks local processes."""
    out = []
    for path in sorted((root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            signed = (ast.Lt, ast.Gt, ast.LtE, ast.GtE)
            if (
                isinstance(node, ast.Compare)
                and len(node.comparators) == 1
                and isinstance(node.ops[0], signed)
            ):
                sides = [node.left, node.comparators[0]]
                named = {getattr(s, "id", None) or getattr(s, "attr", None) for s in sides}
                zero = any(isinstance(s, ast.Constant) and s.value == 0 for s in sides)
                if zero and named & {"np", "np_"}:
                    out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def test_inside_each_wing_the_rooms_stand_as_floors():
    for wing in WINGS:
        assert inner_back_arrows(ROOT, "sparkml_dist", wing) == [], wing


def test_no_private_name_crosses_modules_and_nps_sign_is_tested_once():
    assert private_imports(ROOT, "sparkml_dist") == []
    assert np_sign_tests(ROOT, "sparkml_dist") == ["sparkml_dist/runner/launchers.py:" + str(_line_of_sign())]


def _line_of_sign() -> int:
    text = (ROOT / "sparkml_dist" / "runner" / "launchers.py").read_text()
    return next(i for i, line in enumerate(text.splitlines(), 1) if "return np_ < 0" in line)


def test_the_inner_rooms_checker_finds_a_planted_upward_import(tmp_path):
    """An upward import planted in an inner room of a wing (a lazy one, inside a function) is found;
    a private name imported across modules and a second test of np's sign too."""
    files = {
        "pkg/__init__.py": '"""Pkg.  [anywhere]"""\n',
        "pkg/runner/__init__.py": '"""Runner.  [driver]"""\n',
        "pkg/runner/launch.py": (
            '"""Top.  [driver]"""\nfrom .tasks import task\n\n\ndef go(np):\n    return np < 0\n'
        ),
        "pkg/runner/tasks/__init__.py": '"""Tasks.  [executor]"""\n',
        "pkg/runner/tasks/task.py": (
            '"""Task.  [executor]"""\nfrom ..data import feed\n\n\ndef up(np_):\n'
            "    from .. import launch  # planted: runs back up\n    return np_ > 0\n"
        ),
        "pkg/runner/data/__init__.py": '"""Data.  [executor]"""\n',
        "pkg/runner/data/feed.py": '"""Feed.  [executor]"""\nfrom ..tasks.task import _helper\n',
    }
    root = _package(tmp_path, files)
    found = inner_back_arrows(root, "pkg", "runner")
    assert len(found) == 1 and "(data, launch, tasks)" in found[0], found
    assert "tasks -> launch: pkg.runner.tasks.task -> pkg.runner.launch (in a function)" in found[0]
    assert private_imports(root, "pkg") == [
        "pkg.runner.data.feed imports the private name _helper from pkg.runner.tasks.task"
    ]
    assert np_sign_tests(root, "pkg") == ["pkg/runner/launch.py:6", "pkg/runner/tasks/task.py:7"]
    del files["pkg/runner/tasks/task.py"]
    files["pkg/runner/tasks/task.py"] = '"""Task.  [executor]"""\nfrom ..data import feed\n'
    files["pkg/runner/data/feed.py"] = '"""Feed.  [executor]"""\n'
    assert inner_back_arrows(_package(tmp_path / "good", files), "pkg", "runner") == []
