"""The README and docs/: every relative link resolves, to a file and to a heading, and
the docs speak of the product as it is, not of the project's own history."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Words of a project diary, which a reader of the docs cannot resolve.
HISTORY = re.compile(r"\b(this session|earlier in this|issue \d+|before the fix)\b", re.IGNORECASE)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_the_slug_matches_githubs():
    assert slug("The CLI: validate, plan and render offline") == "the-cli-validate-plan-and-render-offline"
    assert slug("Running it outside the cluster") == "running-it-outside-the-cluster"


def test_the_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 160


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    assert {p for p in PAGES[1:]} <= linked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_docs_do_not_tell_the_projects_history(page):
    found = [m.group(0) for m in HISTORY.finditer(page.read_text())]
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def console_examples() -> list[tuple[str, str, str]]:
    """(page, command, shown output) for every `$ inferentia-operator ...` in a console block."""
    examples = []
    for page in PAGES:
        for block in re.findall(r"```console\n(.*?)```", page.read_text(), flags=re.S):
            command, output = None, []
            for line in block.splitlines():
                if line.startswith("$ "):
                    if command is not None:
                        examples.append((page.name, command, "\n".join(output)))
                    command, output = line[2:], []
                else:
                    output.append(line)
            if command is not None:
                examples.append((page.name, command, "\n".join(output)))
    return [e for e in examples if e[1].startswith("inferentia-operator ")]


@pytest.mark.parametrize("page,command,shown", console_examples(), ids=lambda v: v if "\n" not in v else None)
def test_every_cli_example_prints_what_the_docs_show(page, command, shown):
    """The docs' CLI examples are run from the repository's root, and their output must be
    what the page shows, line for line (trailing spaces aside)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["sh", "-c", command], cwd=ROOT, capture_output=True, text=True, env=env)
    printed = [line.rstrip() for line in (result.stdout + result.stderr).rstrip("\n").splitlines()]
    assert printed == [line.rstrip() for line in shown.rstrip("\n").splitlines()], f"{page}: $ {command}"


def test_the_api_pages_example_names_every_field_of_the_spec():
    """docs/api.md's example spec names every field the API has (a field added to the
    pydantic models and not to the page fails here)."""
    from inferentia_operator.core.api import InferentiaModelSpec

    schema = InferentiaModelSpec.model_json_schema(by_alias=True)
    defs = schema["$defs"]

    def fields(node: dict, path: str) -> list[str]:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[1]]
        for option in node.get("anyOf", []):
            if "$ref" in option:
                return fields(option, path)
        found = []
        for name, prop in (node.get("properties") or {}).items():
            child = f"{path}.{name}" if path else name
            found += [child, *fields(prop, child)]
        return found

    example = re.search(r"```yaml\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S).group(1)
    missing = [f for f in fields(schema, "") if not re.search(rf"(^|[\s#{{,]){re.escape(f.rsplit('.', 1)[-1])}:", example, re.M)]
    assert not missing, f"docs/api.md's example lacks {missing}"


def test_the_fault_table_is_the_suites_and_carries_its_date_and_command():
    """docs/faults.md's table is what cluster/fault_table.py printed from the real-node fault
    suite: one row per fault the suite defines, in its order, with its goal, a date and the command."""
    import ast
    import sys

    sys.path.insert(0, str(ROOT / "cluster"))
    import fault_table

    source = (ROOT / "tests" / "e2e" / "test_real_faults.py").read_text()
    [faults] = [
        ast.literal_eval(node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FAULTS" for t in node.targets)
    ]
    page = (ROOT / "docs" / "faults.md").read_text()
    assert fault_table.HEADER in page
    rows = page.split(fault_table.HEADER, 1)[1].strip().splitlines()
    rows = [r for r in rows if r.startswith("| ")]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == list(faults)
    assert [r.split(" | ")[1] for r in rows] == list(faults.values())
    assert re.search(r"Measured \d{4}-\d{2}-\d{2} \(`make test-faults`, then `python cluster/fault_table.py`\)", page)


def test_the_scaled_object_in_the_autoscaling_page_is_what_render_prints():
    """docs/autoscaling.md shows the ScaledObject of a model with the default windows,
    maxReplicas 3 and batches of 4 over 2 processes: `render` prints exactly that spec."""
    import yaml

    from specs import make_model, make_spec
    from test_cli import run_cli

    shown = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "autoscaling.md").read_text(), re.S)]
    [documented] = [d for d in shown if isinstance(d, dict) and d.get("kind") == "ScaledObject" and d["metadata"]["name"] == "my-model"]
    spec = make_spec(**{"serving.batching": {"maxBatchSize": 4}, "processesPerReplica": 2, "autoscaling": {"maxReplicas": 3}})

    def scaled_object(spec: dict) -> dict:
        model = make_model("my-model", "my-namespace", spec)
        code, out, err = run_cli("render", "--prometheus-address", "http://prometheus.monitoring:9090", "-", stdin=yaml.safe_dump(model))
        assert code == 0, err
        return next(o for o in yaml.safe_load_all(out) if o["kind"] == "ScaledObject")

    rendered = scaled_object(spec)
    assert rendered["metadata"]["name"] == documented["metadata"]["name"]
    assert rendered["spec"] == documented["spec"]
    # The trigger the page shows for a model that scales to zero is the one render adds.
    [push] = [d for d in shown if isinstance(d, list) and not any("job_name" in item for item in d)]
    zero = make_spec(**{"serving.batching": {"maxBatchSize": 4}, "processesPerReplica": 2, "compile.image": "example.com/c:1",
                        "autoscaling": {"minReplicas": 0, "maxReplicas": 3}})  # fmt: skip
    assert scaled_object(zero)["spec"]["triggers"][1:] == push


def test_the_pools_scaled_object_in_the_autoscaling_page_is_what_render_prints():
    """docs/autoscaling.md's pools section shows a model's disaggregation with each pool's
    autoscaling, and the decode pool's ScaledObject: `render` prints exactly that for it, and
    the prefill pool's one trigger the page names."""
    import yaml

    from specs import make_model, pd_spec
    from test_cli import run_cli

    shown = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "autoscaling.md").read_text(), re.S)]
    [example] = [d for d in shown if isinstance(d, dict) and "disaggregation" in (d.get("spec") or {})]
    [documented] = [
        d for d in shown if isinstance(d, dict) and d.get("kind") == "ScaledObject" and d["metadata"]["name"] == "my-model-decode"
    ]
    spec = pd_spec(**{"serving.batching": example["spec"]["serving"]["batching"], "disaggregation": example["spec"]["disaggregation"]})
    model = make_model("my-model", "my-namespace", spec)
    code, out, err = run_cli("render", "--prometheus-address", "http://prometheus.monitoring:9090", "-", stdin=yaml.safe_dump(model))
    assert code == 0, err
    scaled = {o["metadata"]["name"]: o for o in yaml.safe_load_all(out) if o["kind"] == "ScaledObject"}
    assert sorted(scaled) == ["my-model-decode", "my-model-prefill"]
    assert scaled["my-model-decode"]["spec"] == documented["spec"]
    [prefill] = scaled["my-model-prefill"]["spec"]["triggers"]
    assert prefill["name"] == "prompt-queue" and "vllm:num_requests_waiting" in prefill["metadata"]["query"]


def test_a_yaml_block_labelled_as_a_file_is_that_file():
    """A YAML block whose first line names a file of the repository (`# manifests/samples/x.yaml`)
    parses to exactly what that file holds: a reader who applies the file gets what the page shows."""
    import textwrap

    import yaml

    labelled = 0
    for page in PAGES:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
            block = textwrap.dedent(block)  # a block inside a list item is indented
            first = block.splitlines()[0]
            match = re.match(r"# ((?:manifests|charts|docs)/\S+\.yaml)", first)
            if match:
                labelled += 1
                shown = list(yaml.safe_load_all(block))
                assert shown == list(yaml.safe_load_all((ROOT / match.group(1)).read_text())), f"{page.name}: {match.group(1)}"
    assert labelled > 0


def test_the_install_guides_files_are_what_it_shows_and_what_the_code_needs():
    """docs/install.md's add-on manifests are files of docs/install/, labelled in their blocks
    (the test above holds each block to its file; the end-to-end suite applies them); its IAM
    policy is the JSON file, and it allows every S3 call fetch and upload make."""
    import json

    page = (ROOT / "docs" / "install.md").read_text()
    for name in ("models-reader.yaml", "storageclass-gp3.yaml", "keda-aws-authentication.yaml"):
        assert f"# docs/install/{name}" in page, name
    policy_text = (ROOT / "docs" / "install" / "models-reader-policy.json").read_text()
    assert policy_text in page
    allowed = {a for statement in json.loads(policy_text)["Statement"] for a in statement["Action"]}
    fetch = (ROOT / "operator" / "inferentia_operator" / "fetch.py").read_text()
    # boto3's calls and the IAM actions they need.
    needs = {"list_objects_v2": "s3:ListBucket", "get_object": "s3:GetObject", "download_file": "s3:GetObject",
             "upload_file": "s3:PutObject", "put_object": "s3:PutObject"}  # fmt: skip
    used = {call for call in needs if re.search(rf"\b{call}\b", fetch)}
    assert used == set(needs), used
    assert {needs[call] for call in used} <= allowed


def test_the_model_saving_example_saves_what_the_compile_program_loads(tmp_path):
    """docs/install/save_model.py, run as the guide says, writes a file the operator's compile
    program loads (programs/neuron_compile.py, load_model) and that answers an input."""
    import subprocess

    torch_python = "/usr/bin/python3"  # Debian's python3-torch (cluster/node-deps.sh), as test_programs uses
    if subprocess.run([torch_python, "-c", "import torch"], capture_output=True).returncode:
        pytest.skip("no PyTorch on this machine (make test installs it)")
    target = tmp_path / "model.pt"
    subprocess.run([torch_python, str(ROOT / "docs" / "install" / "save_model.py"), str(target)], check=True)
    program = ROOT / "operator" / "inferentia_operator" / "programs"
    check = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); from neuron_compile import load_model; from pathlib import Path; "
        "m = load_model(torch, Path(sys.argv[2])); print(tuple(m(torch.zeros(2, 3, 224, 224)).shape))"
    )
    out = subprocess.run([torch_python, "-c", check, str(program), str(target)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(2, 10)"


def test_the_conditions_table_names_every_reason_the_status_code_writes():
    """Every (type, reason) that the core writes as literals (the report in core/status.py, the
    parts' facts in their folders) appears in the row of that type in docs/design.md's
    conditions table."""
    core = ROOT / "operator" / "inferentia_operator" / "core"
    source = "\n".join(p.read_text() for p in sorted(core.rglob("*.py")))
    written = set(re.findall(r'cond\(\s*"([A-Za-z]+)",\s*"(?:True|False|Unknown)",\s*"([A-Za-z]+)"', source))
    assert len(written) > 30
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([A-Za-z]+)`.*$", (ROOT / "docs" / "design.md").read_text(), flags=re.M)}
    missing = sorted(f"{kind}/{reason}" for kind, reason in written if f"`{reason}`" not in rows.get(kind, ""))
    assert not missing, missing


def test_kubectl_get_as_the_docs_show_it_has_the_crds_columns():
    """The header of every `kubectl get infm` the docs show is the CRD's printer columns (the
    ones without a priority; -o wide adds the rest)."""
    import yaml

    crd = yaml.safe_load((ROOT / "crds" / "inferentia.dev_inferentiamodels.yaml").read_text())
    columns = ["NAME"] + [c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]
    shown = 0
    for page in PAGES:
        for block in re.findall(r"```console\n(.*?)```", page.read_text(), flags=re.S):
            lines = block.splitlines()
            for i, line in enumerate(lines):
                command = line.split("#")[0]
                if re.match(r"\$ kubectl get (infm|inferentiamodels?)\b", command) and " -o " not in command:
                    assert lines[i + 1].split() == columns, f"{page.name}: {line}"
                    shown += 1
    assert shown > 0


def test_the_corpus_counts_the_docs_give_are_the_corpus():
    """A count of the one-verdict corpus in the docs is the corpus's length."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from corpus import DIVERGENCE_CORPUS

    counts = [
        (page.name, int(m.group(1)))
        for page in PAGES
        for m in re.finditer(r"(?:corpus of |one-verdict corpus \()(\d[\d,]*) edge cases", page.read_text().replace("\n", " "))
    ]
    assert counts, "no count found: the pattern or the docs changed"
    assert {count for _, count in counts} == {len(DIVERGENCE_CORPUS)}, counts


def test_the_field_reference_is_the_models():
    """docs/api.md's field reference is what `make docs` generates from core/api.py: a field,
    default, bound or description changed in the models and not regenerated fails here."""
    from inferentia_operator.core.reference import BEGIN, END, in_page

    page = (ROOT / "docs" / "api.md").read_text()
    assert BEGIN in page and END in page
    assert in_page(page) == page, "run `make docs`"
    for field in (
        "spec.serving.batching.image",
        "spec.serving.envFrom[].secretRef",
        "spec.serving.env[].valueFrom.secretKeyRef",
        "status.plan.sizes",
    ):
        assert f"`{field}`" in page, field


def test_every_variable_the_operator_sets_in_a_pod_is_documented():
    """Each environment variable the compile Job and the serving container get from the
    operator (for every sample, the batching and the vLLM ones included) is named in
    docs/serving-pod.md."""
    from inferentia_operator.core.compile.job import compile_job
    from inferentia_operator.core.serving.deployment import serving_deployment
    from inferentia_operator.manifests import load_models

    page = (ROOT / "docs" / "serving-pod.md").read_text()
    names: set[str] = set()
    for doc in load_models([str(ROOT / "manifests" / "samples")]).models:
        if doc.model is None:
            continue
        job = compile_job(doc.model)
        containers = [serving_deployment(doc.model)["spec"]["template"]["spec"]["containers"][0]]
        if job:
            containers += job["spec"]["template"]["spec"]["initContainers"]
        names |= {e["name"] for c in containers for e in c.get("env", []) if "value" in e}
    assert len(names) > 20
    undocumented = sorted(n for n in names if f"`{n}`" not in page and not re.search(rf"\b{n}\b", page))
    assert not undocumented, undocumented


def test_every_option_of_run_is_documented_with_its_real_default():
    """Each of `inferentia-operator run`'s options is named in the docs, and a default a page
    states for one, as `--option ARG` (default X), is the one the command has."""
    import contextlib
    import io

    from inferentia_operator.cli import parser

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        parser().parse_args(["run", "--help"])
    options = set(re.findall(r"(--[a-z][a-z-]+)", shown.getvalue())) - {"--help"}
    assert len(options) > 20
    defaults = vars(parser().parse_args(["run"]))
    text = "".join(page.read_text() for page in PAGES)
    assert sorted(o for o in options if f"`{o}" not in text) == []
    stated = re.findall(r"`(--[a-z-]+)(?: [A-Z]+)?`\s+\(default\s+`?([^`,;)\s]+)`?", text)
    assert len(stated) >= 4, stated
    for option, default in stated:
        real = defaults[option[2:].replace("-", "_")]
        assert default == (f"{real:g}" if isinstance(real, float) else str(real)), (option, default, real)
