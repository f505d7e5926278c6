"""A feature is a folder: each concern owns one package under core/ (its part and its builders),
and what the features share sits below them in core/pod/. A feature package never imports
another feature package, and the shared package imports none: when two features need the same
builder, it moves down into core/pod/. core/decide.py, which composes the parts, and
core/status.py, which reports what they concluded, sit above the features and may import every
one; no feature imports them, and every other module of core/ is below the features."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "operator" / "inferentia_operator" / "core"
PACKAGE = "inferentia_operator.core"
SHARED = "pod"
# Packages under core/ that are not features: the shared one, and the rules of the spec.
NOT_FEATURES = {SHARED, "rules"}
# The modules at core/'s top that sit above the features: the decision, which composes the
# parts, and the report, which reads the facts they concluded.
ABOVE = {"decide", "status"}


def packages() -> list[str]:
    return sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").is_file())


def features() -> list[str]:
    return [p for p in packages() if p not in NOT_FEATURES]


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute, at any depth of its code: relative imports
    resolved, and ``from package import name`` counted as importing ``package.name`` too."""
    here = ".".join((PACKAGE, *path.relative_to(CORE).with_suffix("").parts)).removesuffix(".__init__")
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found |= {base, *(f"{base}.{a.name}" for a in node.names)}
    return found


def feature_of(module: str) -> str | None:
    """The core package ``module`` is in (or is), if any."""
    if not module.startswith(PACKAGE + "."):
        return None
    name = module.removeprefix(PACKAGE + ".").split(".")[0]
    return name if name in packages() else None


def test_the_features_are_found():
    assert {"compile", "serving", "scaling", "scale_to_zero", "routing", "cleanup"} <= set(features())
    assert SHARED in packages() and SHARED not in features()


def test_no_feature_package_imports_another():
    wrong = []
    for feature in features():
        for path in sorted((CORE / feature).rglob("*.py")):
            for module in imported(path):
                other = feature_of(module)
                if other is not None and other != feature and other in features():
                    wrong.append(f"{path.relative_to(CORE)} imports {module}")
    assert not wrong, "a feature package imports another (move what both need into core/pod/): " + "; ".join(sorted(set(wrong)))


def test_the_shared_package_imports_no_feature():
    wrong = [
        f"{path.relative_to(CORE)} imports {module}"
        for path in sorted((CORE / SHARED).rglob("*.py"))
        for module in imported(path)
        if feature_of(module) in features()
    ]
    assert not wrong, "core/pod/ is below the features: " + "; ".join(sorted(set(wrong)))


def test_no_feature_package_imports_the_modules_above_it():
    above = {f"{PACKAGE}.{name}" for name in ABOVE}
    wrong = [
        f"{path.relative_to(CORE)} imports {module}"
        for feature in features()
        for path in sorted((CORE / feature).rglob("*.py"))
        for module in imported(path)
        if module in above
    ]
    assert not wrong, "core/decide.py and core/status.py are above the features: " + "; ".join(sorted(set(wrong)))


def below() -> list[Path]:
    """Every module of core/ below the features: its top-level modules but those above, and the
    packages that are no feature (the shared one, the rules)."""
    top = [p for p in sorted(CORE.glob("*.py")) if p.stem not in ABOVE]
    return top + [p for package in sorted(NOT_FEATURES) for p in sorted((CORE / package).rglob("*.py"))]


def test_the_modules_below_the_features_import_no_feature_and_nothing_above():
    above = {f"{PACKAGE}.{name}" for name in ABOVE}
    wrong = [
        f"{path.relative_to(CORE)} imports {module}"
        for path in below()
        for module in imported(path)
        if feature_of(module) in features() or module in above
    ]
    assert not wrong, "a module below the features reaches up (move what it needs down): " + "; ".join(sorted(set(wrong)))


def test_the_modules_above_are_found():
    assert {p.stem for p in CORE.glob("*.py")} >= ABOVE
    assert CORE / "observed.py" in below() and CORE / "status.py" not in below()


def test_an_import_is_told_by_the_package_it_names():
    """A module of a feature, the feature's package itself, and a module below or beside them."""
    assert feature_of("inferentia_operator.core.serving.deployment") == "serving"
    assert feature_of("inferentia_operator.core.serving") == "serving"
    assert feature_of("inferentia_operator.core.status") is None
    assert feature_of("inferentia_operator.core.pod.model") == SHARED
    assert "inferentia_operator.core.serving.deployment" in imported(CORE / "serving" / "groups.py")
