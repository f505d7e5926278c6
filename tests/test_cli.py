"""The CLI: validate and plan over files, directories and stdin; exit codes; never a traceback."""

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferentia_operator import manifests
from inferentia_operator.cli import main
from inferentia_operator.core.crd import crd_yaml
from specs import DROP, make_model, make_spec

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "manifests" / "samples"


def run_cli(*args, stdin=""):
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        sys.stdin = old_stdin
    return code, out.getvalue(), err.getvalue()


def test_valid_samples_pass():
    code, out, _ = run_cli("validate", *sorted(str(p) for p in SAMPLES.glob("*.yaml")))
    assert code == 0
    # Pods of more than one device need the Neuron scheduler extension's scheduler, which the
    # operator is told of and validate is not, unless given --scheduler-name.
    extension = "warning: spec.compute: each pod asks the Neuron device plugin for 4 aws.amazon.com/neuron, which needs AWS's"
    assert out.splitlines()[1].startswith(f"default/bert-base: {extension}")
    assert out.splitlines()[-1].startswith(f"default/llama-70b-trn2: {extension}")
    code, out, _ = run_cli("validate", "--scheduler-name", "my-scheduler", *sorted(str(p) for p in SAMPLES.glob("*.yaml")))
    assert code == 0
    assert out.splitlines() == [
        "default/bert-base: ok", "default/distilbert: ok", "default/gpt2: ok", "default/llama-8b: ok", "default/resnet50: ok",
        "default/llama-8b-pd: ok",
        # With its EAGLE3 draft's weights, the KV cache is sized with the draft: nothing to warn of.
        "default/llama-8b-eagle3: ok",
        # Its shape, its sequence length and its sequences at once are all in the sample: the
        # KV cache is checked too, and nothing is left to warn of.
        "default/llama-70b-trn2: ok",
    ]  # fmt: skip


def test_a_model_without_a_family_is_named_and_planned_for_inf1():
    code, out, _ = run_cli("validate", "-", stdin=yaml.safe_dump(make_model("nameless", spec=make_spec(**{"compute.family": DROP}))))
    assert code == 0
    assert out.splitlines() == [
        "default/nameless: ok",
        "default/nameless: warning: spec.compute.family: not set, so the model is planned for inf1, the default; valid values are "
        "inf1, inf2, trn1, trn2, trn3: name the family of the nodes it is to run on",
    ]


def test_invalid_samples_fail_with_field_paths():
    code, out, _ = run_cli("validate", str(SAMPLES / "invalid"))
    assert code == 1
    assert (
        "default/uneven: spec.processesPerReplica: cannot evenly distribute 1 inf1 chip (4 NeuronCores) "
        "over 3 processes; valid values are 1, 2, 4"
    ) in out.splitlines()
    assert "default/half-chip: spec.compute.inf: 1.5 is not a whole number; valid values are whole numbers" in out
    assert "default/fp32-batch: spec.compile.batchSize: a CNN in fp32 compiles only at batch size 1, got 4" in out
    assert "default/too-big: spec.compute.inf: 17 chips do not fit any inf1 instance" in out


def test_a_whole_directory_skips_other_kinds(tmp_path):
    (tmp_path / "app").mkdir()
    docs = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}},
        make_model("a", "team-a"),
        {"apiVersion": "v1", "kind": "List", "items": [make_model("b", "team-b", processesPerReplica=3)]},
        {"apiVersion": "other.example.com/v1", "kind": "InferentiaModel", "metadata": {"name": "theirs"}},
    ]
    (tmp_path / "app" / "all.yaml").write_text(yaml.safe_dump_all(docs))
    (tmp_path / "README.md").write_text("not a manifest: {{")
    code, out, _ = run_cli("validate", str(tmp_path))
    assert code == 1
    assert out.splitlines()[0] == "team-a/a: ok"
    assert out.splitlines()[1].startswith("team-b/b: spec.processesPerReplica: cannot evenly distribute")
    assert "theirs" not in out


def test_a_file_named_twice_is_checked_once():
    code, out, _ = run_cli("validate", str(SAMPLES), str(SAMPLES / "invalid"), str(SAMPLES / "gpt2-inf2.yaml"))
    assert code == 1
    assert out.count("default/uneven: spec.processesPerReplica:") == 1 and out.count("default/gpt2: ok") == 1


def test_stdin_and_json():
    code, out, _ = run_cli("validate", "-", stdin=json.dumps(make_model("j")))
    assert (code, out) == (0, "default/j: ok\n")


def test_unreadable_or_unparsable_files_exit_2_and_the_rest_is_still_checked(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(make_model("g")))
    code, out, err = run_cli("validate", str(bad), str(good), str(tmp_path / "missing.yaml"))
    assert code == 2
    assert out == "default/g: ok\n"
    assert f"error: {bad}: not valid YAML" in err
    assert "missing.yaml: no such file or directory" in err


def test_wrong_api_version_and_bad_name():
    doc = make_model("Bad_Name")
    doc["apiVersion"] = "inferentia.dev/v1"
    code, out, _ = run_cli("validate", "-", stdin=yaml.safe_dump(doc))
    assert code == 1
    assert "default/Bad_Name: apiVersion: 'inferentia.dev/v1' is not served; valid values are inferentia.dev/v1alpha1" in out
    assert "default/Bad_Name: metadata.name: 'Bad_Name' is not valid" in out


def test_plan_json_has_every_field():
    code, out, _ = run_cli("plan", str(SAMPLES / "resnet50-throughput.yaml"), "-o", "json")
    assert code == 0
    [record] = json.loads(out)
    assert record["name"] == "resnet50" and record["namespace"] == "default"
    for field in (
        "family coresPerChip totalCores groupSize groups visibleCores deviceMemoryPerGroupBytes compilerArgs env resources instanceTypes"
    ).split():
        assert field in record
    assert record["visibleCores"] == ["0", "1", "2", "3"]
    assert record["compilerArgs"][:2] == ["--neuroncore-pipeline-cores", "1"]
    assert record["resources"]["requests"]["aws.amazon.com/neuron"] == "1"


def test_plan_of_an_invalid_model_reports_and_exits_1():
    code, out, err = run_cli("plan", str(SAMPLES / "invalid" / "three-processes-one-chip.yaml"), "-o", "json")
    assert code == 1
    assert json.loads(out) == []
    assert "valid values are 1, 2, 4" in err


def test_plan_table_and_yaml():
    code, out, _ = run_cli("plan", str(SAMPLES / "bert-latency.yaml"))
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:11] == ["NAMESPACE", "NAME", "REPLICAS", "FAMILY", "COMPILER", "CHIPS", "NODES", "LNC", "CORES", "GROUPS", "NCG"]
    assert row.split()[:11] == ["default", "bert-base", "1", "inf1", "neuron-cc", "4", "1", "-", "16", "1", "16"]
    code, out, _ = run_cli("plan", str(SAMPLES / "bert-latency.yaml"), "-o", "yaml")
    assert yaml.safe_load(out)[0]["buckets"] == [[64], [128], [256], [512]]


def test_plan_shows_the_autoscaling_range_and_target():
    spec = make_spec(
        **{"serving.batching": {"maxBatchSize": 4}, "processesPerReplica": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}
    )
    text = yaml.safe_dump(make_model("scaled", "default", spec))
    code, out, _ = run_cli("plan", "-", stdin=text)
    assert code == 0 and out.splitlines()[1].split()[2] == "1-3"
    code, out, _ = run_cli("plan", "-o", "yaml", "-", stdin=text)
    record = yaml.safe_load(out)[0]
    assert record["autoscaling"] == {"minReplicas": 1, "maxReplicas": 3, "targetInFlight": 8} and "replicas" not in record


def test_console_script_runs_as_a_program():
    result = subprocess.run(
        [sys.executable, "-m", "inferentia_operator", "validate", str(SAMPLES / "gpt2-inf2.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "default/gpt2: ok\n")


def test_crd_command_prints_the_committed_crd():
    code, out, _ = run_cli("crd")
    assert code == 0
    assert out == crd_yaml()


# Arbitrary documents, and arbitrary InferentiaModels, never crash the CLI.
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=25,
)
spec_keys = st.sampled_from(
    ["model", "compute", "inf", "family", "processesPerReplica", "compile", "buckets", "serving", "image", "weights",
     "staticWeights", "batchSize", "instanceTypes", "replicas", "rollout", "maxSurge", "uri", "framework",
     "autoscaling", "minReplicas", "maxReplicas", "targetInFlight", "windowSeconds", "batching", "runtime"]
)  # fmt: skip
spec_like = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(spec_keys, inner, max_size=6)),
    max_leaves=30,
)
models = st.builds(
    lambda spec, name: {"apiVersion": "inferentia.dev/v1alpha1", "kind": "InferentiaModel", "metadata": {"name": name}, "spec": spec},
    spec_like,
    st.one_of(st.none(), st.integers(), st.text(max_size=50)),
)


def _assert_clean(code, out, err):
    assert code in (0, 1, 2)
    assert out or err, "every run says something"
    assert "Traceback" not in out + err


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(values, models), min_size=1, max_size=3), st.sampled_from(["yaml", "json"]))
def test_arbitrary_documents_never_crash(documents, fmt):
    if fmt == "json":
        text = "\n".join(json.dumps(d) for d in documents[:1])
    else:
        text = yaml.safe_dump_all(documents)
    for command in ("validate", "plan"):
        _assert_clean(*run_cli(command, "-", stdin=text))


AUTOSCALING_FIELDS = [
    "minReplicas", "maxReplicas", "targetInFlight", "windowSeconds", "scaleUpStabilizationSeconds", "scaleDownStabilizationSeconds",
]  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(st.dictionaries(st.sampled_from(AUTOSCALING_FIELDS), st.one_of(scalars, st.integers(-5, 5))), values),
    st.sampled_from(["custom", "vllm"]),
    st.booleans(),
)
def test_arbitrary_autoscaling_never_crashes_and_valid_ones_render_a_scaled_object(autoscaling, runtime, batching):
    overrides = {"autoscaling": autoscaling, "serving.runtime": runtime, "compute.family": "inf2", "model.architecture": "transformer"}
    if batching:
        overrides["serving.batching"] = {"maxBatchSize": 4}
    text = yaml.safe_dump(make_model("scaled", "default", make_spec(**overrides)))
    for command in ("validate", "plan"):
        _assert_clean(*run_cli(command, "-", stdin=text))
    code, out, err = run_cli("render", "--prometheus-address", "http://p:9090", "-", stdin=text)
    _assert_clean(code, out, err)
    if code == 0 and autoscaling is not None:  # null is no autoscaling, as the API server reads it
        assert [d["kind"] for d in yaml.safe_load_all(out)][-1] == "ScaledObject"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes(text):
    _assert_clean(*run_cli("validate", "-", stdin=text))


def test_render_prints_what_the_operator_applies_for_every_sample():
    from inferentia_operator.cli import PLACEHOLDER_UID
    from inferentia_operator.core.compile.job import compile_job
    from inferentia_operator.core.pod.model import Model
    from inferentia_operator.core.serving.deployment import serving_deployment
    from inferentia_operator.core.serving.part import serving_part
    from inferentia_operator.core.serving.service import disruption_budget, plan_configmap, service, serving_network_policy
    from inferentia_operator.manifests import load_models

    paths = sorted(str(p) for p in SAMPLES.glob("*.yaml"))
    code, out, err = run_cli("render", *paths, "-o", "json")
    assert code == 0 and err == ""
    objects = json.loads(out)
    expected = []
    for doc in load_models(paths).models:
        # The plan as checked, with its warnings (the scheduler extension's, with no --scheduler-name).
        m = Model(doc.name, doc.namespace, PLACEHOLDER_UID, doc.spec, doc.model.plan)
        if doc.spec.disaggregation is not None:
            # Prefill and decode pools: the proxy as the model's Deployment, and each pool's (serving/pools.py).
            expected += [*serving_part(m, compiled=True, replicas=doc.spec.replicas, to_holder=False).children, compile_job(m)]
            continue
        expected += [
            plan_configmap(m),
            service(m),
            serving_deployment(m),
            disruption_budget(m),
            *filter(None, [serving_network_policy(m), compile_job(m)]),
        ]
    assert objects == expected
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    jobs = [o for o in objects if o["kind"] == "Job"]
    assert ("Deployment", "llama-8b") in kinds and any(j["metadata"]["labels"]["inferentia.dev/model"] == "bert-base" for j in jobs)
    assert {o["metadata"]["ownerReferences"][0]["uid"] for o in objects} == {PLACEHOLDER_UID}
    # YAML: the same objects, multi-line files as literal blocks.
    code, out, _ = run_cli("render", *paths)
    assert code == 0 and list(yaml.safe_load_all(out)) == objects
    assert "  launch.sh: |" in out


def test_render_of_invalid_models_reports_like_validate_and_exits_1():
    invalid = sorted(str(p) for p in (SAMPLES / "invalid").glob("*.yaml"))
    code, out, err = run_cli("render", *invalid, "-o", "json")
    _, validate_out, _ = run_cli("validate", *invalid)
    assert code == 1 and json.loads(out) == []
    assert sorted(err.splitlines()) == sorted(validate_out.splitlines())
    assert "spec.compute.lnc: 2 is not supported on trn1; valid values are 1" in err
    assert "valid values for 8 NeuronCores are 1, 4, 8" in err
    assert "vllm does not run on inf1" in err


def test_a_plan_too_large_for_its_configmap_is_refused_by_validate():
    long_args = ["--opt=" + "x" * 1000] * 64
    body = make_model("huge-plan", spec={
        "model": {"uri": "s3://m/", "framework": "pytorch"},
        "compute": {"family": "trn2", "inf": 16, "lnc": 1},
        "processesPerReplica": 128,
        "compile": {"extraArgs": long_args},
        "serving": {"image": "example.com/serve:1"},
    })  # fmt: skip
    code, out, _ = run_cli("validate", "-", stdin=yaml.safe_dump(body))
    assert code == 1
    assert "default/huge-plan: spec.compile.extraArgs: the plan of 128 processes with these compiler arguments is" in out
    assert "more than the 1032192 a ConfigMap can hold" in out


def run_cli_process(*args, stdin=b"", encoding=None):
    """The CLI as a program, so that a traceback or a hang would show."""
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONIOENCODING": encoding} if encoding else {})}
    return subprocess.run([sys.executable, "-m", "inferentia_operator", *args], input=stdin, capture_output=True, timeout=60, env=env)


def test_yaml_type_tags_are_errors_of_their_file_not_tracebacks(tmp_path):
    for i, text in enumerate(['a: !!int ""\n', 'a: !!bool ""\n', 'a: !!timestamp "x"\n']):
        (tmp_path / f"bad-{i}.yaml").write_text(text)
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(make_model("fine")))
    result = run_cli_process("validate", str(tmp_path))
    assert result.returncode == 2 and b"Traceback" not in result.stderr
    assert result.stdout.decode().splitlines() == ["default/fine: ok"]  # the other file is still checked
    assert len(result.stderr.decode().splitlines()) == 3 and b"a tagged value is not what its tag says" in result.stderr


def test_a_billion_laughs_is_refused_at_once(tmp_path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]")
    lines += ["apiVersion: inferentia.dev/v1alpha1", "kind: InferentiaModel", "metadata: {name: *a8}"]
    started = time.monotonic()
    result = run_cli_process("validate", "-", stdin="\n".join(lines).encode())
    assert time.monotonic() - started < 20
    assert result.returncode == 2 and b"aliases expand to more than 1000000 nodes" in result.stderr


def test_output_in_any_encoding_never_crashes():
    body = json.dumps(make_model("\ud83d\ude00"))
    result = run_cli_process("validate", "-", stdin=body.encode("utf-8", "surrogatepass"), encoding="ascii")
    assert result.returncode == 1 and b"Traceback" not in result.stderr
    assert b"metadata.name" in result.stdout


def test_a_huge_file_is_not_read():
    result = run_cli_process("validate", "-", stdin=b"a: " + b"x" * (9 * 1024 * 1024))
    assert result.returncode == 2 and b"larger than 8388608 bytes" in result.stderr


_scalars = st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False))
# Scalars as written, where YAML 1.1 and go-yaml (kubectl's reader) part ways or a tag has
# nothing to construct: validate reads these as kubectl does (tests/e2e/test_control_plane.py).
_yaml_forms = st.sampled_from(
    ["2e0", "1E3", "0o17", "1_0", ".5e1", "2.0", "9" * 25, "-0", "0x1F", "~", "''", '!!int ""', "!!float 2", "!!binary MjI=", ".nan"]
)
_tags = st.sampled_from(["", "!!int ", "!!bool ", "!!float ", "!!timestamp ", "!!binary ", "!!str ", "!!null ", "!!set ", "!!omap "])


@st.composite
def hostile_yaml(draw):
    """YAML text with type tags, anchors and aliases, unicode and odd structure."""
    lines = ["apiVersion: inferentia.dev/v1alpha1", "kind: InferentiaModel"]
    anchors = []
    for i in range(draw(st.integers(0, 6))):
        tag = draw(_tags)
        value = draw(st.one_of(st.builds(lambda v, a: json.dumps(v, ensure_ascii=a), _scalars, st.booleans()), _yaml_forms))
        if anchors and draw(st.booleans()):
            value = f"[{', '.join('*' + draw(st.sampled_from(anchors)) for _ in range(draw(st.integers(1, 4))))}]"
            tag = ""
        lines.append(f"k{i}: &n{i} {tag}{value}")
        anchors.append(f"n{i}")
    field = draw(st.sampled_from(["metadata: {name: %s}", "spec: %s", "spec: {compute: {inf: %s}}", "metadata: %s"]))
    lines.append(
        field % (("*" + draw(st.sampled_from(anchors))) if anchors else draw(st.one_of(st.builds(json.dumps, _scalars), _yaml_forms)))
    )
    return "\n".join(lines) + "\n" + draw(st.sampled_from(["", "---\n", "--- !!map\n", "...\n", "\t\n"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_yaml())
def test_no_yaml_makes_the_cli_crash(text):
    for command in ("validate", "plan", "render"):
        code, out, err = run_cli(command, "-", stdin=text)
        assert code in (0, 1, 2), (command, code)
        assert "Traceback" not in err


def test_validate_of_a_repository_skips_chart_templates_and_hidden_folders_and_says_so(tmp_path, capsys):
    chart = tmp_path / "charts" / "op"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: op\nversion: 0.1.0\n")
    (chart / "templates" / "deployment.yaml").write_text('metadata:\n  {{- include "x" . | nindent 4 }}\n')
    (tmp_path / ".venv" / "data").mkdir(parents=True)
    (tmp_path / ".venv" / "data" / "x.json").write_text('{\n\t"tab": 1\n}')
    (tmp_path / "model.yaml").write_text(
        "apiVersion: inferentia.dev/v1alpha1\nkind: InferentiaModel\nmetadata: {name: m}\n"
        "spec: {model: {uri: 's3://a/', framework: pytorch}, compute: {inf: 1}, serving: {image: x}}\n"
    )
    assert main(["validate", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"note: {chart}: 1 Helm chart templates skipped (render them first: helm template {chart}" in err
    assert "error" not in err


@pytest.mark.parametrize("namespace", ["Team_A", "a" * 64, "-x", "team.a"])
def test_an_invalid_namespace_is_refused(tmp_path, capsys, namespace):
    (tmp_path / "m.yaml").write_text(
        f"apiVersion: inferentia.dev/v1alpha1\nkind: InferentiaModel\nmetadata: {{name: m, namespace: '{namespace}'}}\n"
        "spec: {model: {uri: 's3://a/', framework: pytorch}, compute: {inf: 1}, serving: {image: x}}\n"
    )
    assert main(["validate", str(tmp_path / "m.yaml")]) == 1
    assert f"metadata.namespace: '{namespace}' is not a valid namespace" in capsys.readouterr().out


def test_a_missing_api_version_is_named_in_yaml_terms(tmp_path, capsys):
    (tmp_path / "m.yaml").write_text("kind: InferentiaModel\nmetadata: {name: m}\nspec: {}\n")
    main(["validate", str(tmp_path / "m.yaml")])
    assert "apiVersion: null is not served; valid values are inferentia.dev/v1alpha1" in capsys.readouterr().out


def test_render_of_a_dra_model_prints_its_claim_template_and_no_device_plugin_resource():
    """With --allocation dra (the operator's default for models that name none), the trn2 sample
    claims its devices from the Neuron DRA driver."""
    code, out, err = run_cli("render", str(SAMPLES / "trn2-lnc2.yaml"), "--allocation", "dra", "-o", "json")
    assert code == 0 and err == "", err
    objects = json.loads(out)
    [template] = [o for o in objects if o["kind"] == "ResourceClaimTemplate"]
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 4
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    resources = [c["resources"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert "aws.amazon.com/" not in json.dumps(resources), resources  # the taint's toleration stays
    # A model that says devicePlugin keeps it, whatever the default.
    doc = yaml.safe_load((SAMPLES / "trn2-lnc2.yaml").read_text())
    doc["spec"]["compute"]["allocation"] = "devicePlugin"
    code, out, _ = run_cli("render", "-", "--allocation", "dra", "-o", "json", stdin=yaml.safe_dump(doc))
    assert code == 0 and not any(o["kind"] == "ResourceClaimTemplate" for o in json.loads(out))


def test_validate_with_the_dra_default_refuses_what_the_driver_cannot_give():
    code, out, _ = run_cli("validate", str(SAMPLES / "distilbert-one-core.yaml"), "--allocation", "dra")
    assert code == 1
    assert out.splitlines() == [
        "default/distilbert: spec.compute.cores: 1 NeuronCores cannot be claimed with allocation dra: AWS's Neuron DRA driver "
        "hands out whole Neuron devices; use compute.inf, or allocation devicePlugin for NeuronCores"
    ], out


# --- what a hostile file can cost (issue 38) --------------------------------------------------


def _validate_measured(path: Path) -> tuple[subprocess.CompletedProcess, float, int]:
    """validate as a program, with the CPU seconds it used and its peak memory in bytes (the
    rusage of the only child of a wrapper process, so no earlier child is counted). CPU time,
    not wall time: the suite shares two cores with the end-to-end runs, which stretch a wall
    clock but not the work the parse does."""
    wrapper = (
        "import resource, subprocess, sys; "
        "r = subprocess.run([sys.executable, '-m', 'inferentia_operator', 'validate', sys.argv[1]], capture_output=True); "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "sys.stderr.buffer.write(r.stderr); print(u.ru_utime + u.ru_stime, u.ru_maxrss); sys.exit(r.returncode)"
    )
    result = subprocess.run([sys.executable, "-c", wrapper, str(path)], capture_output=True, timeout=300)
    cpu_seconds, peak_kib = result.stdout.split()[-2:]
    return result, float(cpu_seconds), int(peak_kib) * 1024


def test_a_symlink_loop_a_fifo_and_a_device_are_refused_at_once_with_exit_2(tmp_path):
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")
    os.mkfifo(tmp_path / "fifo.yaml")  # opening it for reading would wait for a writer for ever
    for path, said in [
        (tmp_path / "loop.yaml", "cannot be read: Too many levels of symbolic links"),
        (tmp_path / "fifo.yaml", "a FIFO; only regular files are read"),
        (Path("/dev/zero"), "a device; only regular files are read"),
    ]:
        result = run_cli_process("validate", str(path))
        assert result.returncode == 2 and b"Traceback" not in result.stderr, result.stderr
        assert said in result.stderr.decode()


def test_a_flow_list_of_millions_of_items_is_refused_while_it_is_parsed(tmp_path):
    """An 8 MB flow list of 4 million items once took 81 s and 2.9 GB before it was refused."""
    (tmp_path / "big.yaml").write_text("[" + "1," * 4_000_000 + "1]")
    result, took, peak = _validate_measured(tmp_path / "big.yaml")
    assert result.returncode == 2 and f"more than {manifests.MAX_NODES} YAML nodes" in result.stderr.decode()
    assert peak < 400 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"
    assert took < 30, f"{took:.0f} CPU seconds"


def test_the_alias_budget_is_the_whole_files_not_each_documents(tmp_path):
    """60 documents of 111,111 nodes each once passed one by one and took 882 MB in all."""
    laughs = "a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [" + ",".join(["*a"] * 10) + "]\nc: &c [" + ",".join(["*b"] * 10) + "]\n"
    laughs += "d: &d [" + ",".join(["*c"] * 10) + "]\ne: [" + ",".join(["*d"] * 10) + "]\n"
    (tmp_path / "many.yaml").write_text("---\n".join([laughs] * 60))
    (tmp_path / "one.yaml").write_text(laughs)
    result, _, peak = _validate_measured(tmp_path / "many.yaml")
    assert result.returncode == 2 and f"expand to more than {manifests.MAX_EXPANDED_NODES} nodes in all" in result.stderr.decode()
    assert peak < 400 * 1024 * 1024
    assert run_cli_process("validate", str(tmp_path / "one.yaml")).returncode == 0  # one such document alone is fine: no model in it


def test_plan_shows_data_parallel_over_tensor_parallel_with_each_processs_cores():
    """Issue 42: a vLLM model of several processes is DP x TP, as vLLM Neuron lays out its DP ranks."""
    code, out, _ = run_cli("plan", "manifests/samples/trn2-lnc2.yaml")
    assert code == 0
    header, row = out.splitlines()[:2]
    cells = dict(zip(header.split(), row.split(), strict=True))
    assert (cells["GROUPS"], cells["NCG"], cells["DPxTP"], cells["VISIBLE-CORES"]) == ("2", "8", "2x8", "0-7,8-15")
    code, out, _ = run_cli("plan", "manifests/samples/resnet50-throughput.yaml")
    header, row = out.splitlines()[:2]
    assert dict(zip(header.split(), row.split(), strict=True))["DPxTP"] == "-"  # inf1 pipelines, never shards


def test_plan_shows_a_replica_across_nodes(tmp_path):
    """A replica across two trn1.32xlarge: 16 chips and 32 cores a node, one tensor-parallel model of 64 ranks."""
    import re

    example = re.search(r"```yaml\n(.*?)```", (ROOT / "docs" / "multi-node.md").read_text(), re.S).group(1)
    (tmp_path / "llama.yaml").write_text(example)
    code, out, _ = run_cli("plan", str(tmp_path / "llama.yaml"))
    assert code == 0
    header, row = out.splitlines()[:2]
    cells = dict(zip(header.split(), row.split(), strict=True))
    assert (cells["CHIPS"], cells["NODES"], cells["CORES"], cells["DPxTP"]) == ("16", "2", "32", "1x64")


def test_plan_prints_the_wait_timeout_a_model_sizes_for_itself():
    """kubectl wait's --timeout, as the README and the chart's NOTES use it: the compile Job's
    deadline (compile.timeoutSeconds) and the serving pods' start-up budget, the longest of the models."""
    import json as json_

    code, out, _ = run_cli("plan", "-o", "wait-timeout", "manifests/samples/llama-inf2-vllm.yaml")
    _, planned, _ = run_cli("plan", "-o", "json", "manifests/samples/llama-inf2-vllm.yaml")
    [record] = json_.loads(planned)
    assert code == 0 and out == f"{6 * 3600 + record['sizes']['startupSeconds']}s\n"
    code, both, _ = run_cli("plan", "-o", "wait-timeout", "manifests/samples/llama-inf2-vllm.yaml", "manifests/samples/gpt2-inf2.yaml")
    assert code == 0 and both == out  # the longer of the two
    flux = (ROOT / "manifests" / "gitops" / "flux-helmrelease.yaml").read_text()
    assert f"timeout: {out.strip()}" in flux  # the example shows what the command prints for the sample


@pytest.mark.parametrize("flag", ["--prometheus-namespace", "--keda-namespace"])
def test_a_namespace_flag_that_names_no_namespace_stops_the_cli_with_the_reason(flag, capsys):
    """Each becomes a NetworkPolicy's namespaceSelector, which the API server would refuse model by model."""
    with pytest.raises(SystemExit) as stopped:
        main(["render", flag, "Team_A", "-"])
    assert stopped.value.code == 2
    assert f"argument {flag}: 'Team_A' is not a valid namespace; valid namespaces are at most 63" in capsys.readouterr().err


BATCH = ["batch", "--port", "1", "--processes", "1", "--process-base-port", "2", "--max-batch-size", "1", "--max-latency-ms", "1"]
HOLD = ["hold", "--upstream", "127.0.0.1", "--ports", "1"]


@pytest.mark.parametrize("command", [BATCH, HOLD], ids=["batch", "hold"])
@pytest.mark.parametrize(
    "flags,why",
    [
        (["--max-peer-connections", "0"], "--max-peer-connections: '0': valid values are finite numbers above 0"),
        (["--max-peer-connections", "many"], "--max-peer-connections: 'many': valid values are finite numbers above 0"),
        (["--peer-body-budget-mib", "nan"], "--peer-body-budget-mib: 'nan': valid values are finite numbers above 0"),
        (["--max-connections", "10", "--max-peer-connections", "11"], "--max-peer-connections 11 is more than --max-connections 10"),
        (["--peer-body-budget-mib", "9"], "--peer-body-budget-mib 9 is more than --body-budget-mib 8"),
    ],
)
def test_one_address_s_share_is_a_number_within_the_caps_or_the_server_does_not_start(command, flags, why):
    """Each is refused before anything listens, exit 2 with why (a server that started would outlast the timeout)."""
    # This checkout's CLI, as the tests import it (run_cli_process's bare environment finds the installed one).
    result = subprocess.run([sys.executable, "-m", "inferentia_operator", *command, *flags], capture_output=True, timeout=60)
    assert result.returncode == 2 and b"Traceback" not in result.stderr
    assert why in result.stderr.decode(), result.stderr
