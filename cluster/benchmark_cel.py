"""Should validate and the operator run the CRD's own CEL rules through a CEL library instead
of their Python twins? This measures the three Python CEL libraries against the twins, in one
run, on the one-verdict corpus and the samples (docs/design.md, "Validation", has the table).

    make benchmark-cel          # or: python cluster/benchmark_cel.py

Per library: the time to import it and the memory that costs (in a fresh interpreter), the
time to compile every rule of the CRD, the time to judge one spec with all of them, and on how
many specs its verdicts and messages are exactly validate's. The Kubernetes library functions
the rules call (quantity, format, replace) are supplied to each as the same Python functions
(tests/crd_cel.py, which the unit test's interpreter uses too).
The libraries go into a virtualenv of their own in the project's cache, never the project's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIBRARIES = {
    # PyPI name and version: the module it imports.
    "common-expression-language==0.10.0": "cel",  # Rust cel-interpreter
    "cel-expr-python==0.1.3": "cel_expr_python.cel",  # Google's cel-cpp
    "cel-python==0.5.0": "celpy",  # pure Python
}


def scratch_python() -> Path:
    sys.path.insert(0, str(HERE))
    import images  # the project's cache directory

    home = images.cache_dir() / "benchmark-cel-venv"
    python = home / "bin" / "python"
    stamp = home / ".installed"
    wanted = " ".join(sorted(LIBRARIES)) + " pydantic>=2 pyyaml"
    if not (stamp.exists() and stamp.read_text() == wanted):
        venv.create(home, with_pip=True, clear=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wanted.split()], check=True)
        stamp.write_text(wanted)
    return python


def import_cost(python: Path, module: str) -> tuple[float, float]:
    """Seconds to import ``module`` and the resident memory it adds (MB), in a fresh interpreter: the
    fastest of three."""
    code = "\n".join(
        [
            "import os, time",
            "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20",
            "before = rss()",
            "start = time.perf_counter()",
            f"import {module}" if module else "",
            "print(time.perf_counter() - start, rss() - before)",
        ]
    )
    best = None
    for _ in range(3):
        out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.split()
        seconds, mb = float(out[0]), float(out[1])
        best = (seconds, mb) if best is None or seconds < best[0] else best
    assert best is not None
    return best


# ---- inside the scratch virtualenv ---------------------------------------------------------


def corpus() -> list[dict[str, Any]]:
    import glob

    import yaml

    from corpus import CEL_CASES, DIVERGENCE_CORPUS
    from specs import make_spec

    samples = [yaml.safe_load(Path(f).read_text())["spec"] for f in sorted(glob.glob(str(REPO / "manifests/samples/*.yaml")))]
    return [*CEL_CASES.values(), *[make_spec(**o) for o in DIVERGENCE_CORPUS], *samples]


def measure_inside() -> None:
    sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]
    from crd_cel import KUBERNETES_LIBRARY, node_at, spec_rules
    from inferentia_operator.core.findings import errors
    from inferentia_operator.core.parsing import parse_spec

    rules = spec_rules()
    specs = []
    for raw in corpus():
        spec, found = parse_spec(raw)
        if spec is not None:
            specs.append((spec.model_dump(by_alias=True, exclude_none=True, mode="json"), sorted(f.message for f in errors(found))))

    start = time.perf_counter()
    for raw in corpus():
        parse_spec(raw)
    python_per_spec = (time.perf_counter() - start) / len(specs)

    results: dict[str, Any] = {"rules": len(rules), "specs": len(specs), "python": python_per_spec}
    for requirement, module in LIBRARIES.items():
        evaluate = _Evaluator(module, KUBERNETES_LIBRARY)
        start = time.perf_counter()
        compiled = [(path, evaluate.compile(rule), evaluate.compile(message)) for path, rule, message in rules]
        compile_seconds = time.perf_counter() - start
        agree, start = 0, time.perf_counter()
        for spec, by_python in specs:
            refused = []
            for path, rule, message in compiled:
                node = node_at(spec, path)
                if node is not None and evaluate.run(rule, node) is False:
                    refused.append(str(evaluate.run(message, node)))
            agree += sorted(refused) == by_python
        results[requirement] = {"compile": compile_seconds, "per_spec": (time.perf_counter() - start) / len(specs), "agree": agree}
    print(json.dumps(results))


class _Evaluator:
    """One library behind compile(text) and run(program, self)."""

    def __init__(self, module: str, library: dict[str, Any]) -> None:
        self.module = module
        if module == "cel":
            import cel

            self.cel, self.library = cel, library
        elif module == "cel_expr_python.cel":
            from cel_expr_python import cel as google
            from cel_expr_python.ext import ext_strings

            t = google.Type

            def overload(name: str, result: Any, parameters: list[Any], member: bool) -> Any:
                return google.FunctionDecl(
                    name,
                    [google.Overload(id=name, return_type=result, parameters=parameters, is_member=member, impl=library[name])],
                )

            functions = [
                overload("isQuantity", t.BOOL, [t.STRING], False),
                overload("quantity", t.STRING, [t.STRING], False),
                overload("isInteger", t.BOOL, [t.STRING], True),
                overload("asInteger", t.INT, [t.STRING], True),
                overload("compareTo", t.INT, [t.STRING, t.STRING], True),
            ]  # format and replace: Google's strings extension
            self.env = google.NewEnv(variables={"self": t.DYN}, extensions=[ext_strings.ExtStrings()], functions=functions)
        else:
            import celpy
            import celpy.celtypes as types

            def typed(function: Any) -> Any:
                def call(*args: Any) -> Any:
                    plain = [int(a) if isinstance(a, types.IntType) else str(a) if isinstance(a, types.StringType) else a for a in args]
                    value = function(*plain)
                    kind = {bool: types.BoolType, int: types.IntType, str: types.StringType}[type(value)]
                    return kind(value)

                return call

            def format_(template: Any, args: Any) -> Any:
                plain = tuple(int(a) if isinstance(a, types.IntType) else str(a) for a in args)
                return types.StringType(str(template) % plain)

            self.celpy, self.functions = celpy, {**{k: typed(v) for k, v in library.items()}, "format": format_}
            self.env = celpy.Environment()

    def compile(self, text: str) -> Any:
        if self.module == "cel":
            return self.cel.compile(text)
        if self.module == "cel_expr_python.cel":
            return self.env.compile(text)
        return self.env.program(self.env.compile(text), functions=self.functions)

    def run(self, program: Any, node: Any) -> Any:
        if self.module == "cel":
            return program.execute(self.cel.Context(variables={"self": node}, functions=self.library))
        if self.module == "cel_expr_python.cel":
            return program.eval(data={"self": node}).value()
        value = program.evaluate({"self": self.celpy.json_to_cel(node)})
        return bool(value) if isinstance(value, self.celpy.celtypes.BoolType) else value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    if parser.parse_args().inside:
        measure_inside()
        return 0
    python = scratch_python()
    out = subprocess.run(
        [str(python), __file__, "--inside"], check=True, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}
    ).stdout
    results = json.loads(out.splitlines()[-1])
    base_import = import_cost(python, "")
    print(f"{results['rules']} CEL rules of the CRD, {results['specs']} specs (the one-verdict corpus and the samples)")
    print(f"baseline, the Python twins (parse and check): {results['python'] * 1000:.2f} ms a spec\n")
    print("| library | import | memory added | compile all rules | judge one spec | vs the twins | same verdicts and messages |")
    print("|---|---|---|---|---|---|---|")
    for requirement, module in LIBRARIES.items():
        seconds, mb = import_cost(python, module)
        r = results[requirement]
        print(
            f"| {requirement} | {(seconds - base_import[0]) * 1000:.0f} ms | {mb - base_import[1]:.0f} MB | {r['compile'] * 1000:.0f} ms "
            f"| {r['per_spec'] * 1000:.2f} ms | {r['per_spec'] / results['python']:.0f}x | {r['agree']} of {results['specs']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
