"""The documentation against the code: docs/configuration.md lists exactly the ``MODELYARD_*`` variables the code
reads, each with the default the code uses; the README stays a short front page whose links resolve.

The variables are found by parsing the source of every top-level package (any folder with an ``__init__.py``
but ``tests``, and whatever pyproject.toml packages), not by naming modules, so moving a module or adding a
package (``onnxkit/``) needs no change here. A read is a call of a typed helper from the settings' env module
(``env_int("MODELYARD_X", 3)``), ``os.environ.get``/``os.getenv``/``os.environ[...]`` with the name as a
literal, or ``"MODELYARD_X" in os.environ``; a name that only appears in a message is not a read.
``mkdocs build --strict`` (``make docs-build``, part of ``make test``) checks the site's own links and pages.
"""

from __future__ import annotations

import ast
import operator
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = ROOT / "docs" / "configuration.md"
README = ROOT / "README.md"
NAME = re.compile(r"^MODELYARD_[A-Z0-9_]+$")
MENTION = re.compile(r"MODELYARD_[A-Z0-9_]*[A-Z0-9]")
# Variables read as text accept NAME_FILE in their place (a secret mounted as a file).
TEXT_HELPER = "env_str"
ENVIRON_METHODS = {"get", "setdefault", "pop"}


def packages() -> list[Path]:
    found = {path.parent for path in ROOT.glob("*/__init__.py")} - {ROOT / "tests"}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for pattern in setuptools.get("include", []):
        folder = ROOT / pattern.split(".")[0].rstrip("*")
        if folder.is_dir():
            found.add(folder)
    if (ROOT / "onnxkit").is_dir():
        found.add(ROOT / "onnxkit")
    return sorted(found)


@dataclass(frozen=True)
class Read:
    name: str
    helper: str  # env_int, env_str, ..., or "environ"
    default: ast.expr | None
    where: str


def _callee(node: ast.Call) -> str:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return ""


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "environ") or (
        isinstance(node, ast.Attribute) and node.attr == "environ"
    )


def _literal_name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value):
        return node.value
    return None


def reads_in(path: Path) -> Iterator[Read]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = str(path.relative_to(ROOT))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            name = _literal_name(node.args[0])
            if name is None:
                continue
            callee = _callee(node)
            if callee.startswith("env_"):
                default = node.args[1] if len(node.args) > 1 else None
                for keyword in node.keywords:
                    if keyword.arg == "default":
                        default = keyword.value
                yield Read(name, callee, default, where)
            elif callee == "getenv" or (
                callee in ENVIRON_METHODS and isinstance(node.func, ast.Attribute) and _is_environ(node.func.value)
            ):
                yield Read(name, "environ", None, where)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            name = _literal_name(node.slice)
            if name:
                yield Read(name, "environ", None, where)
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            name = _literal_name(node.left)
            if name and any(_is_environ(right) for right in node.comparators):
                yield Read(name, "environ", None, where)


def code_reads() -> list[Read]:
    found = [read for package in packages() for path in sorted(package.rglob("*.py")) for read in reads_in(path)]
    assert found, f"no MODELYARD_* variable read anywhere in {[p.name for p in packages()]}: is this test out of date?"
    return found


_OPERATORS = {ast.Mult: operator.mul, ast.Pow: operator.pow, ast.Add: operator.add, ast.Sub: operator.sub}


def constant(node: ast.expr) -> object:
    """The value of a literal default (``8 * 1024**3``, ``["cuda", "cpu"]``); raises ValueError for anything else."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](constant(node.left), constant(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -constant(node.operand)  # type: ignore[operator]
    return ast.literal_eval(node)


def spelled(value: object) -> str | None:
    """How the configuration page writes a default: ``true``, ``8589934592``, ``5`` for 5.0, ``cuda,cpu``."""
    if value is None or value in ("", [], ()):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def documented_rows() -> dict[str, str]:
    """{variable: its default cell} for every row of the configuration page's tables."""
    rows: dict[str, str] = {}
    for line in CONFIGURATION.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3:
            continue
        for name in re.findall(r"`(MODELYARD_[A-Z0-9_]+)`", cells[0]):
            assert name not in rows, f"docs/configuration.md has two rows for {name}"
            rows[name] = cells[1]
    return rows


def file_paragraph() -> str:
    text = CONFIGURATION.read_text()
    start = text.index("**From a file.**")
    return text[start : text.index("\n\n", start)]


def test_every_variable_the_code_reads_has_a_row_on_the_configuration_page():
    rows = documented_rows()
    missing = {
        read.name: read.where
        for read in code_reads()
        if read.name not in rows and not (read.name.endswith("_FILE") and read.name.removesuffix("_FILE") in rows)
    }
    assert not missing, f"read by the code but without a row in docs/configuration.md: {missing}"


def test_the_configuration_page_names_only_variables_the_code_reads():
    reads = code_reads()
    read = {r.name for r in reads}
    as_text = {r.name for r in reads if r.helper == TEXT_HELPER}
    named = set(MENTION.findall(CONFIGURATION.read_text()))
    unknown = {
        name
        for name in named
        if name not in read and not (name.endswith("_FILE") and name.removesuffix("_FILE") in as_text)
    }
    assert not unknown, f"docs/configuration.md names variables no code reads: {sorted(unknown)}"


def test_each_documented_default_is_the_one_the_code_uses():
    rows = documented_rows()
    wrong = []
    for read in code_reads():
        if read.default is None or read.name not in rows:
            continue
        try:
            value = spelled(constant(read.default))
        except ValueError:  # computed from another setting: the page says which in words
            continue
        if value is not None and f"`{value}`" not in rows[read.name]:
            wrong.append(f"{read.name}: the code's default is {value} ({read.where}), the page says {rows[read.name]}")
    assert not wrong, "\n".join(wrong)


def test_the_file_variants_listed_are_the_variables_read_as_text():
    listed = {name for name in MENTION.findall(file_paragraph()) if not name.endswith("_FILE")}
    as_text = {read.name for read in code_reads() if read.helper == TEXT_HELPER}
    assert listed == as_text, (
        f"docs/configuration.md's NAME_FILE list: missing {sorted(as_text - listed)}, extra {sorted(listed - as_text)}"
    )


def test_the_readme_is_a_short_front_page_with_the_two_commands_first():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the reference belongs in docs/"
    head = "\n".join(lines[:40])
    assert "make run" in head and "make test" in head


def test_the_readme_links_resolve_and_nothing_points_outside_the_clone():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target or target.startswith("#"):
            continue
        assert (ROOT / target.split("#")[0]).exists(), f"README.md links to {target}, which does not exist"
    for path in [README, ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        assert "../shared" not in path.read_text(), f"{path.relative_to(ROOT)} points into ../shared"
