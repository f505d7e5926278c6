"""The linters the project configures fail the suite: ruff (undefined names, unused imports,
import order, bugbear's traps, blind excepts, private access, a noqa that silences
nothing, the pure core importing kopf or the Kubernetes client, and the format), and
mypy, strict (pyproject.toml's [tool.ruff] and [tool.mypy])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_pure_core_may_not_import_kubernetes(tmp_path):
    """The ban covers the core folder as a whole, a module added later included, and
    nothing outside it: the same import is refused in core/ and allowed in shell/."""
    package = tmp_path / "operator" / "inferentia_operator"
    for folder in ("core", "shell"):
        (package / folder).mkdir(parents=True)
        (package / folder / "newly_added.py").write_text("import kopf\nimport kubernetes\n\nkopf.event\nkubernetes.client\n")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    refused = [line for line in result.stdout.splitlines() if "TID251" in line]
    assert result.returncode == 1 and "must not import kopf" in result.stdout, result.stdout
    assert len(refused) == 2 and all("core/newly_added.py" in line for line in refused), result.stdout


def test_importing_the_core_loads_neither_kopf_nor_the_kubernetes_client():
    """The ban holds at run time too: no core module pulls kopf or the client in through
    another module (an import the linter cannot follow)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import inferentia_operator.core as core\n"
        "for m in pkgutil.iter_modules(core.__path__): importlib.import_module(f'inferentia_operator.core.{m.name}')\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('kopf', 'kubernetes')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_mypy_finds_nothing():
    """The type checker, strict on the whole package (pyproject.toml [tool.mypy])."""
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_code_is_formatted():
    """``ruff format`` (line length 140) leaves every file as it is."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _imports_of(package: Path, name: str) -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports, at any depth of its
    code (an import inside a function closes a circle as surely as one at the top)."""
    import ast

    modules = {".".join((name, *p.relative_to(package).with_suffix("").parts)).removesuffix(".__init__"): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join([*here.split(".")[: len(here.split(".")) - node.level + 1]] + ([node.module] if node.module else []))
                base = base if node.level else node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph[module] |= {t for t in targets if t in modules and t != module}
    return graph


def test_no_module_of_the_package_imports_itself_through_others():
    """No import circle (cli.py and the runner once imported each other): a module's
    dependencies come before it, which graphlib can order only without a cycle."""
    import graphlib

    graph = _imports_of(ROOT / "operator" / "inferentia_operator", "inferentia_operator")
    assert graph["inferentia_operator.core.decide"] >= {"inferentia_operator.core.compile.part", "inferentia_operator.core.status"}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as circle:
        raise AssertionError(f"import circle: {' -> '.join(circle.args[1])}") from None
