"""The shape of the code, checked from its source with ``ast``: no import cycle, one front door for versions.

The graph has an edge for every import a module can execute, at module level or inside a function
(a function-level import hides a cycle from Python, not from the design). Imports under
``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("modelyard", "onnxkit", "registry", "storage", "inference")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those only a type checker runs."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(filter(None, (resolve(alias.name) for alias in node.names)))
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                # `from pkg import sub` imports the module pkg.sub; `from pkg import name` runs pkg/__init__.
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else resolve(base)
                if target:
                    targets.add(target)
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that starts and ends at the same module, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_there_is_no_import_cycle_among_the_project_modules():
    graph = import_graph(project_modules())
    assert graph["registry.tasks"] >= {"registry.validation.services"}  # the graph sees the project's own imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_function_level_cycle(tmp_path):
    # The check above must be able to fail: a cycle closed by an import inside a function is found.
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def later():\n    from a import thing\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    modules = {"a": tmp_path / "a.py", "b": tmp_path / "b.py", "c": tmp_path / "c.py"}
    graph = import_graph(modules)
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set()}
    assert find_cycle(graph) == ["a", "b", "a"]


def _references(path: Path, name: str) -> list[int]:
    """Lines where ``name`` is used as a name, an attribute or an imported name."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            (isinstance(node, ast.Name) and node.id == name)
            or (isinstance(node, ast.Attribute) and node.attr == name)
            or (isinstance(node, ast.alias) and name in {node.name, node.asname})
            or (isinstance(node, ast.FunctionDef) and node.name == name)
        ):
            lines.append(getattr(node, "lineno", 0))
    return lines


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        # The inner transactional step of an upload: only the upload service calls it.
        ("version_create", {"registry/services.py", "registry/uploads.py"}),
        # And no row of a version is made anywhere else.
        ("ModelVersion.objects.create", {"registry/services.py"}),
    ],
)
def test_versions_are_created_only_through_the_upload_service(name, allowed):
    users = {}
    for folder in (*PACKAGES, "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if "." in name:
                found = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if name in line]
            else:
                found = _references(path, name)
            if found and relative != "tests/test_architecture.py":
                users[relative] = found
    assert set(users) <= allowed, f"{name} is used outside {sorted(allowed)}: {users}"


def test_no_test_module_imports_from_a_conftest():
    offenders = {}
    for path in (ROOT / "tests").rglob("*.py"):
        for node in _imports(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(name.split(".")[-1] == "conftest" for name in names):
                offenders[path.relative_to(ROOT).as_posix()] = node.lineno
    assert offenders == {}, f"import helpers from tests/support, not from a conftest: {offenders}"


def test_domain_errors_know_nothing_of_http():
    from registry import errors
    from registry.http import STATUS, status_for

    source = (ROOT / "registry" / "errors.py").read_text()
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in _imports(ast.parse(source))
        for alias in node.names
    }
    assert imported <= {"__future__"}, imported
    domain = [cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.RegistryError)]
    assert len(domain) >= 10
    assert not [
        base for cls in domain for base in cls.__mro__ if base.__module__.startswith(("rest_framework", "django"))
    ]
    # Every one of them has a status in the API's one table, through itself or a base class.
    missing = [
        cls.__name__ for cls in domain if cls is not errors.RegistryError and status_for(cls.__new__(cls)) is None
    ]
    assert missing == []
    assert STATUS[errors.InvalidInput] == 400 and status_for(errors.UnsupportedModel("x")) == 400


# --- The ground floor: onnxkit imports no Django and no other package of the project ----------------

# Every top-level package of the repository that Python code could import, besides onnxkit itself.
PROJECT = ("modelyard", "registry", "storage", "inference", "bench", "scripts", "tests")
DJANGO = ("django", "rest_framework", "drf_spectacular", "celery")


def every_import(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth, ``if TYPE_CHECKING:`` included.

    ``from package import name`` counts as ``package.name``: it may import a module of that name.
    A relative import stays inside its own package and is left out.
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_the_import_walker_sees_every_form_of_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import django.conf, numpy\n"
        "from registry import serving\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from storage.base import ArtifactStorage\n"
        "def later():\n"
        "    from modelyard.metrics import exposition\n"
        "from . import sibling\n"
    )
    assert every_import(sample) == [
        (1, "django.conf"),
        (1, "numpy"),
        (2, "registry.serving"),
        (3, "typing.TYPE_CHECKING"),
        (5, "storage.base.ArtifactStorage"),
        (7, "modelyard.metrics.exposition"),
    ]


def test_onnxkit_imports_no_django_and_no_other_project_package():
    files = sorted((ROOT / "onnxkit").rglob("*.py"))
    assert ROOT / "onnxkit" / "sandbox.py" in files
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in files
        for line, module in every_import(path)
        if module.split(".")[0] in (*PROJECT, *DJANGO)
    ]
    assert wrong == []
    # The rule has something to hold: the walker does see onnxkit's imports of its own modules.
    assert "onnxkit.sandbox.run_in_child" in {module for path in files for _, module in every_import(path)}


def test_every_onnxkit_module_imports_with_django_and_the_project_unimportable():
    modules = sorted(_module_name(path) for path in (ROOT / "onnxkit").rglob("*.py"))
    code = (
        "import importlib, sys\n"
        f"for name in {(*PROJECT, *DJANGO)!r}:\n"
        "    sys.modules[name] = None\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print('imported')\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


def test_the_clients_datatype_table_is_onnxkits():
    # The client keeps its own copy (it loads no ONNX); the two must name the same dtype for each datatype.
    from modelyard.client.tensors import NUMPY_OF as CLIENT
    from onnxkit.datatypes import NUMPY_OF as SERVER

    assert list(CLIENT) == list(SERVER)
    for datatype, dtype in SERVER.items():
        assert CLIENT[datatype] is dtype, datatype


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    pending = [start]
    while pending:
        for target in graph[pending.pop()] - seen:
            seen.add(target)
            pending.append(target)
    return seen


def test_grpc_serves_the_data_plane_without_the_rest_endpoints():
    # Both transports stand on inference.dataplane (one admission, one error table in inference.errors);
    # neither reaches the other.
    graph = import_graph(project_modules())
    grpc = {name for name in graph if name.startswith("inference.grpc")}
    assert "inference.dataplane" in _reachable(graph, "inference.grpc.server")
    assert "inference.app" not in {name for module in grpc for name in _reachable(graph, module)}
    assert not _reachable(graph, "inference.app") & grpc


# --- The registry by wing ------------------------------------------------------------------------------

WINGS = ("access", "api", "audit", "benchmarks", "derive", "ui", "validation", "webhooks")


def test_the_registry_keeps_at_most_20_modules_at_its_top():
    top = sorted(path.name for path in (ROOT / "registry").glob("*.py") if path.name != "__init__.py")
    assert len(top) <= 20, top
    # Its parts are wings (sub-packages), not file name prefixes.
    assert not [name for name in top if name.startswith(("ui_", "derive", "validation", "benchmark", "audit_"))]


@pytest.mark.parametrize("wing", WINGS)
def test_each_wing_of_the_registry_says_what_it_is(wing):
    init = ROOT / "registry" / wing / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text()))
    assert docstring, f"registry/{wing}/__init__.py has no docstring"
    # A wing's face defines and imports nothing: its modules are imported by their own names.
    assert [type(node).__name__ for node in ast.parse(init.read_text()).body] in (["Expr"], [])


def test_nothing_in_the_registry_imports_its_tasks():
    # What queues a job names its Celery task (registry/queueing.py), so the tasks stay the top floor.
    graph = import_graph(project_modules())
    importers = sorted(module for module, targets in graph.items() if "registry.tasks" in targets)
    assert [module for module in importers if module.startswith(("registry", "onnxkit", "inference", "storage"))] == []


# --- ARCHITECTURE.md stays exact: every code name it mentions exists ----------------------------------

ARCHITECTURE = ROOT / "ARCHITECTURE.md"
FILE_SUFFIXES = (".py", ".md", ".json", ".onnx", ".yml", ".yaml", ".toml", ".proto", ".js", ".html", ".txt", ".bin")


class _Names:
    """What each project module defines, read with ``ast``: its names, and each class's members."""

    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules = set(modules)
        self.names: dict[str, dict[str, str | None]] = {}  # module -> name -> where it was imported from
        self.members: dict[str, set[str]] = {}  # "module.Class" -> its attributes, methods and self.<x>
        self.short: dict[str, set[str]] = {}  # a module's last part or a class's name -> full names
        self.literals: set[str] = set()
        for module, path in modules.items():
            tree = ast.parse(path.read_text(), str(path))
            self.short.setdefault(module.rpartition(".")[2], set()).add(module)
            names: dict[str, str | None] = {}
            for node in tree.body:
                for name, source in self._defined(node):
                    names[name] = source
                if isinstance(node, ast.ClassDef):
                    self.members[f"{module}.{node.name}"] = self._members(node)
                    self.short.setdefault(node.name, set()).add(f"{module}.{node.name}")
            self.names[module] = names
            self.literals |= {
                n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }

    @staticmethod
    def _defined(node: ast.stmt) -> list[tuple[str, str | None]]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return [(node.name, None)]
        if isinstance(node, ast.Assign):
            return [(t.id, None) for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [(node.target.id, None)]
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            return [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names]
        if isinstance(node, ast.Import):
            return [
                (a.asname or a.name.partition(".")[0], a.name if a.asname else a.name.partition(".")[0])
                for a in node.names
            ]
        if isinstance(node, ast.If | ast.Try):
            return [
                item
                for child in ast.iter_child_nodes(node)
                if isinstance(child, ast.stmt)
                for item in _Names._defined(child)
            ]
        return []

    @staticmethod
    def _members(node: ast.ClassDef) -> set[str]:
        found = set()
        for child in node.body:
            found |= {name for name, _ in _Names._defined(child)}
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.ctx, ast.Store)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
            ):
                found.add(sub.attr)
        return found

    def resolves(self, dotted: str, depth: int = 0) -> bool:
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if module in self.modules:
                return self._walk(module, parts[cut:], depth)
        return False

    def _walk(self, module: str, rest: list[str], depth: int) -> bool:
        if not rest:
            return True
        name, more = rest[0], rest[1:]
        if name not in self.names[module]:
            return f"{module}.{name}" in self.modules and self._walk(f"{module}.{name}", more, depth)
        source = self.names[module][name]
        if source is not None:  # imported here: follow it to where it is defined
            return not more or (depth < 5 and self.resolves(".".join([source, *more]), depth + 1))
        if not more:
            return True
        members = self.members.get(f"{module}.{name}")
        return members is not None and len(more) == 1 and more[0] in members

    def exists(self, dotted: str) -> bool:
        first, _, rest = dotted.partition(".")
        if first in PACKAGES:
            return self.resolves(dotted) or dotted in self.literals
        candidates = self.short.get(first, set())
        return any(self.resolves(f"{full}.{rest}" if rest else full) for full in candidates) or dotted in self.literals

    def known(self, name: str) -> bool:
        """Whether ``name`` begins with a project package, module or class, so that it must exist."""
        first = name.partition(".")[0]
        return first in PACKAGES or first in self.short


def architecture_names(text: str) -> tuple[list[str], list[str]]:
    """The code names in backticks (``a.b``, ``Class.method``, ``Class``; a call cut at its parenthesis), the paths."""
    names, paths = [], []
    for span in re.findall(r"`([^`\n]+)`", text):
        span = span.strip()
        if ": " in span and span.split(": ")[0].endswith(".py"):  # `inference/app.py: error_response`
            path, name = span.split(": ", 1)
            paths.append(path)
            names.append(_module_name(ROOT / path) + "." + name)
            continue
        if " " in span or span.startswith(("/", "@", "-", "$")):
            continue
        if "/" in span or (span.endswith(".py") and not span.startswith(".")):  # a bare name: a module of a part
            paths.append(span)
            continue
        if span.endswith(FILE_SUFFIXES):
            continue
        name = span.split("(")[0]
        if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", name) or re.fullmatch(r"_?[A-Z][a-z]\w*", name):
            names.append(name)
    return names, paths


def test_every_code_name_and_path_architecture_md_names_exists():
    index = _Names(project_modules())
    names, paths = architecture_names(ARCHITECTURE.read_text())
    checked = [name for name in names if index.known(name)]
    assert len(checked) > 150  # the check has something to hold
    missing = sorted({name for name in checked if not index.exists(name)})
    assert missing == [], f"ARCHITECTURE.md names code that does not exist: {missing}"
    project_dirs = [ROOT / package for package in PACKAGES]
    absent = sorted(
        {
            path
            for path in paths
            if not (ROOT / path).exists() and not any(list(folder.rglob(path.rstrip("/"))) for folder in project_dirs)
        }
    )
    assert absent == [], f"ARCHITECTURE.md names paths that do not exist: {absent}"


def test_the_architecture_check_finds_a_name_that_does_not_exist():
    index = _Names(project_modules())
    assert index.exists("registry.uploads.version_upload") and index.exists("services.Derivation")
    assert index.exists("DataPlane.infer") and index.exists("registry.serving.PRODUCTION")
    assert index.exists("alias.set")  # an audit action, a string the code writes
    assert not index.exists("registry.uploads.version_uploads") and not index.exists("registry.validation_process")
    assert not index.exists("DataPlane.authorize") and not index.exists("onnxkit.sandbox.ChildFailure.nothing")
    names, paths = architecture_names("`registry.serving.desired_state()`, `inference/app.py: error_response`, `api/`")
    assert names == ["registry.serving.desired_state", "inference.app.error_response"]
    assert paths == ["inference/app.py", "api/"]
    assert architecture_names("`models.py`, `tokenizer.json`, `alias.set`") == (["alias.set"], ["models.py"])
