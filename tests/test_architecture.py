"""Rules of the code's shape that a reviewer would otherwise have to remember (issue 16).

No module imports another module's private names: a leading underscore means "free to change
without telling anyone", which holds only if no other module depends on it. Checked on the
source with :mod:`ast`, for every module of the installed package (``tunecache/`` and
``kernels/``, which installs as ``tunecache.kernels``).

No test file imports another test file or conftest: that works only while pytest's default import
mode puts tests/ on ``sys.path`` (not under ``--import-mode=importlib``), and a helper kept in a
test file ties every importer to that file and its fixtures. Shared helpers are fixtures in
conftest.py or plain modules beside the tests (tests/builders.py, tests/processes.py, ...).

Layers (issue 26, docs/architecture.md): a module imports only its own package, the core and lower
layers, and only tunecache/store/ writes SQL.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: directory -> the package name it installs as (pyproject's package-dir)
PACKAGES = {"tunecache": "tunecache", "kernels": "tunecache.kernels"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules() -> list[tuple[str, Path]]:
    out = []
    for directory, package in PACKAGES.items():
        for path in sorted((ROOT / directory).rglob("*.py")):
            parts = list(path.relative_to(ROOT / directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.append((".".join([package, *parts]), path))
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name of ``from <node.module> import ...`` written in ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _class_privates(tree: ast.Module) -> set[str]:
    """Private methods and attributes a module's classes define (``def _x`` in a class, ``self._x = ...``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _private(item.name):
                    names.add(item.name)
                elif isinstance(item, ast.Assign | ast.AnnAssign):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names.update(t.id for t in targets if isinstance(t, ast.Name) and _private(t.id))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and _private(node.attr)
        ):
            names.add(node.attr)
    return names


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The module an expression such as ``alias`` or ``tunecache.store.store`` names, if any."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value, aliases)
        return f"{head}.{node.attr}" if head else None
    return None


def violations() -> list[str]:
    """Every place a module reaches into another module's private names."""
    modules = _modules()
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules}
    paths = dict(modules)
    own_class_privates = {name: _class_privates(tree) for name, tree in trees.items()}
    out: list[str] = []
    for name, tree in trees.items():
        where = paths[name].relative_to(ROOT)
        is_package = paths[name].name == "__init__.py"
        aliases: dict[str, str] = {}  # local name -> tunecache module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "tunecache":
                        aliases[a.asname or "tunecache"] = a.name if a.asname else "tunecache"
            elif isinstance(node, ast.ImportFrom):
                src = _absolute(name, is_package, node)
                if not (src == "tunecache" or src.startswith("tunecache.")):
                    continue
                for a in node.names:
                    if src != name and _private(a.name):
                        out.append(f"{where}:{node.lineno}: from {src} import {a.name}")
                    elif src != name and a.asname and _private(a.asname) and f"{src}.{a.name}" not in trees:
                        # another module's public name made to look like this module's own private one
                        out.append(f"{where}:{node.lineno}: from {src} import {a.name} as {a.asname}")
                    if f"{src}.{a.name}" in trees:  # a module, bound to a local name
                        aliases[a.asname or a.name] = f"{src}.{a.name}"
        # Names defined privately by this module's own classes may be used on any object here.
        foreign = set().union(*(p for m, p in own_class_privates.items() if m != name)) - own_class_privates[name]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            base = node.value
            module = _dotted(base, aliases)
            if module in trees and module != name:
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)} ({module})")
            elif node.attr in foreign and not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                # e.g. store._write(...): a private method of another module's class, on its object
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)} (a private name of another module's class)")
    return out


def test_no_module_imports_another_modules_private_names():
    found = violations()
    assert not found, "modules reaching into other modules' private names:\n" + "\n".join(found)


def test_the_check_sees_private_imports(tmp_path, monkeypatch):
    """The check itself: it must flag each kind of reach it claims to, and a module's own privates not."""
    pkg = tmp_path / "tunecache"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "class Store:\n    def _write(self): ...\n    def put(self):\n        return self._write()\n_hidden = 1\n"
    )
    (pkg / "b.py").write_text(
        "from tunecache.a import _hidden\n"
        "from tunecache import a as _a\n"
        "from tunecache.a import Store as _Store\n"
        "from . import a\n"
        "import tunecache.a\n"
        "def f(store):\n    return _a._hidden, a._hidden, tunecache.a._hidden, store._write()\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGES", {"tunecache": "tunecache"})
    found = violations()
    assert any("from tunecache.a import _hidden" in v for v in found), found
    assert any("_a._hidden" in v for v in found), found
    assert any(": a._hidden" in v for v in found), found
    assert any("tunecache.a._hidden" in v for v in found), found
    assert any("store._write" in v for v in found), found
    assert any("import Store as _Store" in v for v in found), found
    assert not any("import a as _a" in v for v in found), found  # a module under a private alias is fine
    assert not any("a.py" in v for v in found), found


def _test_module(name: str) -> bool:
    top = name.split(".")[0]
    return top == "conftest" or top.startswith("test_")


def imports_of_test_modules() -> list[str]:
    """Every place a file under tests/ imports conftest or a test file."""
    out = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module] if node.module else [a.name for a in node.names]  # from . import x
            else:
                continue
            out += [f"{path.relative_to(ROOT)}:{node.lineno}: imports {n}" for n in names if _test_module(n)]
    return out


def test_no_test_file_imports_a_test_file_or_conftest():
    found = imports_of_test_modules()
    assert not found, "import shared helpers from a helper module or use a fixture, not:\n" + "\n".join(found)


def test_the_check_sees_imports_of_test_files(tmp_path, monkeypatch):
    """The check itself: each way of importing a test file or conftest is flagged; a helper module is not."""
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "test_a.py").write_text("from conftest import run_json\nimport builders\n")
    (tmp_path / "tests" / "sub" / "helper.py").write_text(
        "def f():\n    import test_b.x\n    from . import test_c\n    from test_d import y\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    found = imports_of_test_modules()
    assert [v.split(": imports ")[1] for v in found] == ["test_b.x", "test_c", "test_d", "conftest"], found


# ---- layers (issue 26) ----------------------------------------------------------------------------

#: The core every layer shares: top-level modules of tunecache/ (tunecache/__init__.py, the public
#: API, is exempt from the rule and may import anything). At most six of them (issue 46): the rest
#: of the package is in packages named for what they are.
CORE = "core"
#: package -> rank; a module may import its own package, the core and lower ranks only. Packages
#: of one rank (problem and process; tuner and inductor; exchange and report) do not import each other.
LAYERS = {
    CORE: 0,
    "tunecache.problem": 1,  # what a tuning problem is: its identity, its config's, the data model, the target
    "tunecache.process": 1,  # a process's life: forks, counters, its end, deferred writes, Ctrl-C
    "tunecache.trust": 2,  # what is trusted: which signed rows are placed, the keys, what may be shared
    "tunecache.store": 3,
    "tunecache.binaries": 4,
    "tunecache.metrics": 4,  # the counters as Prometheus metrics: read by the tuner and inductor's first store open
    "tunecache.tuner": 5,
    "tunecache.inductor": 5,  # torch.compile's remote caches on the store: beside the tuner, not on it
    "tunecache.exchange": 6,
    "tunecache.kernels": 6,  # the bundled kernels: built on the tuner, run by the CLI's demo
    "tunecache.report": 6,
    "tunecache.cli": 7,
}
#: The most modules tunecache/ keeps at its top (``__init__.py`` among them).
TOP_LEVEL_MODULES = 6
#: The SQL the project looks for: SQLAlchemy statements built or executed. Only tunecache/store/ may.
SQL = re.compile(r"\b(sa|sqlalchemy)\.(select|insert|delete|update|text)\(|\.execute\(")


def layer_of(module: str) -> str | None:
    """The layer a tunecache module belongs to (None: the package ``tunecache`` itself)."""
    if module == "tunecache":
        return None
    parts = module.split(".")
    package = ".".join(parts[:2])
    return package if package in LAYERS else CORE


def imported_modules(module: str, is_package: bool, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, absolute module) of every tunecache module that ``tree`` imports, at any depth
    (imports inside functions too: a lazy import is still a dependency)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tunecache"]
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(module, is_package, node)
            if src == "tunecache" or src.startswith("tunecache."):
                # ``from tunecache import settings``: the module imported is tunecache.settings
                out += [(node.lineno, f"tunecache.{a.name}" if src == "tunecache" else src) for a in node.names]
    return out


def layering_violations() -> list[str]:
    """Every import of a higher layer (or a sibling package of the same rank), and every SQL
    statement outside tunecache/store/."""
    out: list[str] = []
    for name, path in _modules():
        where = path.relative_to(ROOT)
        text = path.read_text()
        own = layer_of(name)
        if own != "tunecache.store":
            for lineno, line in enumerate(text.splitlines(), 1):
                if SQL.search(line):
                    out.append(f"{where}:{lineno}: SQL outside tunecache/store/: {line.strip()}")
        if own is None:  # tunecache/__init__.py: the public API
            continue
        for lineno, target in imported_modules(name, path.name == "__init__.py", ast.parse(text, str(where))):
            other = layer_of(target)
            if other is None or other in (own, CORE) or LAYERS[other] < LAYERS[own]:
                continue
            out.append(f"{where}:{lineno}: {own} ({name}) imports {target} ({other}), a layer not below it")
    return out


def test_layers_import_only_downwards_and_only_the_store_writes_sql():
    found = layering_violations()
    assert not found, "see docs/architecture.md:\n" + "\n".join(found)


def test_the_layer_check_sees_upward_imports_and_stray_sql(tmp_path, monkeypatch):
    """The check itself, over a small tree: each kind of violation is flagged, the allowed cases not."""
    files = {
        "__init__.py": "from tunecache.tuner.t import x\n",  # exempt: the public API
        "settings.py": "from tunecache.store import s\n",  # core imports the store: flagged
        "errors.py": "import tunecache.settings\n",  # core imports core: fine
        "problem/__init__.py": "",
        # a module of problem imports core (fine) and process, a sibling of the same rank (flagged)
        "problem/model.py": "from tunecache import settings\nfrom tunecache.process import forks\n",
        "process/__init__.py": "",
        "process/forks.py": "def f():\n    from tunecache.trust import t\n",  # a lazy upward import: flagged
        "trust/__init__.py": "",
        "trust/t.py": "from tunecache.problem import model\nfrom tunecache.process.forks import f\n",  # fine
        "store/__init__.py": "",
        "store/s.py": "import sqlalchemy as sa\nq = sa.select(1)\nfrom tunecache.problem import model\n",  # fine
        "store/w.py": "def f():\n    from tunecache.tuner import t\n",  # a lazy upward import: flagged
        "tuner/__init__.py": "",
        "tuner/t.py": "from tunecache.store.s import q\nfrom . import u\nfrom tunecache import __version__\n",
        "tuner/u.py": "from tunecache.trust import t\n",  # fine
        "exchange/__init__.py": "",
        "exchange/e.py": "from tunecache.report import r\n",  # a sibling of the same rank: flagged
        "report/__init__.py": "",
        "report/r.py": "def f(conn):\n    return conn.execute(q)\n",  # SQL outside the store: flagged
        "cli/__init__.py": "from tunecache.report import r\nfrom tunecache.exchange.e import x\n",  # fine
    }
    for rel, text in files.items():
        (tmp_path / "tunecache" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tunecache" / rel).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGES", {"tunecache": "tunecache"})
    found = sorted(v.split(": ", 1)[0] for v in layering_violations())
    assert found == [
        "tunecache/exchange/e.py:1",
        "tunecache/problem/model.py:2",
        "tunecache/process/forks.py:2",
        "tunecache/report/r.py:2",
        "tunecache/settings.py:1",
        "tunecache/store/w.py:2",
    ], layering_violations()


def top_level_modules(root: Path | None = None) -> list[str]:
    """The modules at the top of tunecache/ (``__init__.py`` among them)."""
    return sorted(p.name for p in ((root or ROOT) / "tunecache").glob("*.py"))


def test_the_top_level_keeps_at_most_six_modules():
    """tunecache/'s top level is the core every layer shares (issue 46: "the top level by idea"): a
    module of a tuning problem, of a process's life or of trust goes in problem/, process/ or trust/,
    and anything else in a package named for what it is."""
    found = top_level_modules()
    assert "__init__.py" in found and len(found) <= TOP_LEVEL_MODULES, found


def test_the_top_level_count_sees_every_module(tmp_path):
    """The check itself: every .py at the top is counted, a package's modules are not."""
    (tmp_path / "tunecache" / "process").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "process/__init__.py", "process/forks.py"):
        (tmp_path / "tunecache" / name).write_text("")
    assert top_level_modules(tmp_path) == ["__init__.py", "a.py", "b.py"]


# ---- the tuner without its circle (issue 46) ------------------------------------------------------

TUNER = "tunecache.tuner"
#: Calls that import or find a module by its name: ``importlib.import_module("x")``, ``__import__("x")``.
_BY_NAME_CALLS = {"import_module", "__import__"}


def _named_module(node: ast.expr, modules: set[str]) -> str | None:
    return node.value if isinstance(node, ast.Constant) and node.value in modules else None


def tuner_import_graph(root: Path | None = None) -> dict[str, set[str]]:
    """module -> the modules of tunecache/tuner it imports: at module level or inside a function,
    ``import``/``from ... import`` (a module imported by ``from tunecache.tuner import x`` too), and
    lookups by name (``importlib.import_module``, ``__import__``, ``sys.modules[...]`` or ``.get``)."""
    directory = (root or ROOT) / "tunecache" / "tuner"
    paths = {}
    for path in sorted(directory.glob("*.py")):
        paths[TUNER if path.stem == "__init__" else f"{TUNER}.{path.stem}"] = path
    modules = set(paths)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in paths.items():
        edges = graph[name]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                src = _absolute(name, name == TUNER, node)
                edges.update(f"{src}.{a.name}" for a in node.names if f"{src}.{a.name}" in modules)
                if src in modules and src != TUNER:
                    edges.add(src)
            elif isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if called in _BY_NAME_CALLS or (called == "get" and "sys.modules" in ast.unparse(f)):
                    edges.update(m for a in node.args[:1] if (m := _named_module(a, modules)))
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
                edges.update(m for m in [_named_module(node.slice, modules)] if m)
        edges.discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path around it (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_tuner_imports_only_downwards():
    """tunecache/tuner is layered: no module reaches a module that imports it back, not even
    lazily inside a function or by name (issue 46: basepatch looked up adoption, which imports
    autotuner, which imports basepatch). What is needed from above is registered from there."""
    cycle = find_cycle(tuner_import_graph())
    assert cycle is None, "tunecache/tuner imports in a circle: " + " -> ".join(cycle)


def test_the_tuner_graph_sees_every_kind_of_import(tmp_path):
    """The check itself: each kind of import makes an edge, and a circle through one is found."""
    tuner = tmp_path / "tunecache" / "tuner"
    tuner.mkdir(parents=True)
    files = {
        "__init__.py": '"""Nothing."""\n',
        "a.py": "from tunecache.tuner import b\n",
        "b.py": "def f():\n    from . import c\n",
        "c.py": "import importlib\ndef f():\n    return importlib.import_module('tunecache.tuner.d')\n",
        "d.py": "import sys\ndef f():\n    return sys.modules['tunecache.tuner.e']\n",
        "e.py": "import sys\ndef f():\n    return sys.modules.get('tunecache.tuner.f')\n",
        "f.py": "from tunecache.tuner.g import x\n",
        "g.py": "def f():\n    import tunecache.tuner.a\n",
        "h.py": '"""See tunecache.tuner.a."""\nfrom tunecache.tuner import settings_like\n',
    }
    for rel, text in files.items():
        (tuner / rel).write_text(text)
    graph = tuner_import_graph(tmp_path)
    t = "tunecache.tuner."
    assert {m: sorted(e) for m, e in graph.items() if e} == {
        t + "a": [t + "b"],
        t + "b": [t + "c"],
        t + "c": [t + "d"],
        t + "d": [t + "e"],
        t + "e": [t + "f"],
        t + "f": [t + "g"],
        t + "g": [t + "a"],
    }
    assert find_cycle(graph) == [t + x for x in "abcdefga"]
    graph[t + "g"].clear()
    assert find_cycle(graph) is None
