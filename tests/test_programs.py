"""The compile program and the model server the operator ships into Neuron images, run for real:
Debian's CPU-only PyTorch with the torch-neuronx and torch-neuron stand-ins (cluster/node/standins),
which check the compiler arguments at trace time and the granted cores at load time. A real
network is traced per bucket, saved, loaded in a server process, asked over HTTP, and its
answers are compared with the same network run directly."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import images
from inferentia_operator import programs
from inferentia_operator.core import neuron_images
from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "operator" / "inferentia_operator" / "programs"
STANDINS = ROOT / "cluster" / "node" / "standins"
REFERENCE = ROOT / "tests" / "models" / "reference.py"
# Debian's python3 with python3-torch, which cluster/node-deps.sh installs on the machines that run the real node.
TORCH_PYTHON = "/usr/bin/python3"
ALLOWED_IMPORTS = {
    "__future__",
    "importlib",
    "inspect",
    "json",
    "math",
    "os",
    "argparse",
    "re",
    "logging",
    "time",
    "sys",
    "threading",
    "signal",
    "http",
    "pathlib",
    "typing",
    "torch",
    "neuron_compile",
    "vllm",
    # vLLM on NxD Inference: what AWS's vLLM image (vllm-inference-neuronx) has.
    "neuronx_distributed_inference",
    "huggingface_hub",
    # The compile steps' module beside them in the plan ConfigMap, and the standard library it uses.
    "hub_snapshot",
    "fnmatch",
    "shutil",
    "subprocess",
    # The proxy in front of disaggregated prefill and decode servers: the standard library only.
    "collections",
    "dataclasses",
    "functools",
    "io",
    "itertools",
    "socket",
    "uuid",
}


def test_the_programs_import_only_what_a_neuron_image_has():
    """They run with the user's image's Python, torch and Neuron framework, never with this package."""
    for name in (
        programs.COMPILE_PROGRAM, programs.SERVE_PROGRAM, programs.VLLM_COMPILE_PROGRAM, programs.NXDI_COMPILE_PROGRAM,
        programs.VLLM_WORKER_PROGRAM, programs.HUB_SNAPSHOT_MODULE, programs.PD_PROXY_PROGRAM,
    ):  # fmt: skip
        tree = ast.parse(programs.source(name))
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert imported <= ALLOWED_IMPORTS, (name, imported - ALLOWED_IMPORTS)


@pytest.mark.parametrize("rank", ["", "0", "one"])
def test_the_worker_program_runs_only_as_a_worker_rank(tmp_path, rank):
    """Rank 0 serves the API (serving.runtime.multi_node_command): a worker started without a rank, or
    as rank 0, says so and exits 2 before it builds an engine."""
    program = tmp_path / programs.VLLM_WORKER_PROGRAM
    program.write_text(programs.source(programs.VLLM_WORKER_PROGRAM))
    env = {"PATH": "/usr/bin:/bin", **({"NEURON_RANK_ID": rank} if rank else {})}
    done = subprocess.run([sys.executable, str(program), "--model", "m"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "rank 0 serves the API" in done.stderr, done


def torch_python() -> str:
    if subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.skip(f"{TORCH_PYTHON} has no torch: cluster/node-deps.sh installs Debian's python3-torch (as root)")
    return TORCH_PYTHON


@pytest.fixture
def models(tmp_path) -> Path:
    subprocess.run([torch_python(), str(REFERENCE), "build", str(tmp_path / "models")], check=True)
    return tmp_path / "models"


def environment(tmp_path: Path, plan: dict, **extra: str) -> dict[str, str]:
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "dev").mkdir(exist_ok=True)
    for i in range(2):
        (tmp_path / "dev" / f"neuron{i}").touch()
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(STANDINS),
        "INFERENTIA_PLAN_FILE": str(tmp_path / "plan.json"),
        "INFERENTIA_COMPILED_MODEL_DIR": str(tmp_path / "compiled"),
        "NEURON_STANDIN_DEV_DIR": str(tmp_path / "dev"),
        "TMPDIR": str(tmp_path),
        **extra,
    }


INF2_PLAN = {
    "family": "inf2", "compiler": "neuronx-cc", "compilerArgs": ["--target", "inf2", "--auto-cast", "all", "--auto-cast-type", "fp16"],
    "batchSize": 2, "dynamicBatchSize": False, "buckets": [[8], [16]], "inputDtype": "float32",
}  # fmt: skip
INF1_PLAN = {
    "family": "inf1", "compiler": "neuron-cc", "compilerArgs": ["--neuroncore-pipeline-cores", "2"],
    "batchSize": 4, "dynamicBatchSize": True, "buckets": [[16]], "inputDtype": "float32",
}  # fmt: skip


def compile_model(tmp_path: Path, plan: dict, model: Path, **extra: str) -> subprocess.CompletedProcess:
    env = environment(tmp_path, plan, INFERENTIA_MODEL_PATH=str(model), **extra)
    return subprocess.run([TORCH_PYTHON, str(PROGRAMS / programs.COMPILE_PROGRAM)], env=env, capture_output=True, text=True)


def post(port: int, body: object) -> tuple[int, object]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def serve(tmp_path: Path, plan: dict, **extra: str) -> tuple[subprocess.Popen | _Finished, int]:
    """The model server started on a free port. A port is free when picked, not when the server
    binds it: another test's server may take it meanwhile (pytest-xdist runs several), so a server
    that lost its port is started again on another, as the local cluster does its components."""
    for _ in range(5):
        server, port = _serve_once(tmp_path, plan, **extra)
        if server.poll() is None or server.returncode != 1:
            return server, port
        out, err = server.communicate()
        if "Address already in use" not in err:
            # Hand the outcome back as it was: the caller reads it with communicate().
            return _Finished(server.args, 1, out, err), port
    raise AssertionError("the model server lost its port five times running")


class _Finished:
    """A server that has exited and whose output was read: it answers as its Popen would."""

    def __init__(self, args: object, returncode: int, out: str, err: str) -> None:
        self.args, self.returncode, self._output = args, returncode, (out, err)

    def poll(self) -> int:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        return self._output

    def kill(self) -> None:
        """Nothing left to kill."""


def _serve_once(tmp_path: Path, plan: dict, **extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = environment(tmp_path, plan, PORT=str(port), **extra)
    server = subprocess.Popen(
        [TORCH_PYTHON, str(PROGRAMS / programs.SERVE_PROGRAM)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return server, port
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return server, port
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise AssertionError(f"the server did not answer /healthz: {server.communicate()}")


def expected(model: Path, inputs: list, dtype: str = "float32") -> list:
    out = subprocess.run(
        [TORCH_PYTHON, str(REFERENCE), "predict", str(model), dtype], input=json.dumps(inputs), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def close(a: list, b: list) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


def test_an_inf2_model_is_traced_per_bucket_and_answers_as_the_network_does(tmp_path, models):
    compiled = compile_model(tmp_path, INF2_PLAN, models / "conv.pt")
    assert compiled.returncode == 0, compiled.stderr
    manifest = json.loads((tmp_path / "compiled" / "manifest.json").read_text())
    assert manifest["framework"] == "torch_neuronx" and [a["shape"] for a in manifest["artefacts"]] == [[8], [16]]
    server, port = serve(tmp_path, INF2_PLAN, NEURON_RT_VISIBLE_CORES="1")
    try:
        assert server.poll() is None, server.communicate()
        # Three lengths: padded to 8, exactly 8, padded to 16; more inputs than the compiled batch.
        inputs = [[1.0, 2.0, 3.0], [float(i) for i in range(8)], [0.5] * 12, [-1.0, 4.0]]
        status, answers = post(port, inputs)
        assert status == 200
        assert close(answers, expected(models / "conv.pt", inputs))
        assert [len(a) for a in answers] == [3, 8, 12, 2]  # cut back from the bucket to each input
        status, body = post(port, [[1.0] * 17])
        assert status == 413 and "fits no compiled bucket" in body["error"]
        assert post(port, {"not": "a list"})[0] == 400
        assert post(port, [[1.0, [2.0]]])[0] == 400
        assert post(port, [[1.0, float("nan")]])[0] == 400  # json.dumps writes NaN, which is not JSON
    finally:
        server.kill()
        server.communicate()


def distributions(where: Path, **versions: str) -> str:
    """A directory of dist-info entries, as the stand-in images carry them (images.write_distributions):
    the package versions a stand-in then behaves as (torch_neuronx="2.1.2.2.3.2")."""
    images.write_distributions(where, versions)
    return str(where)


TRACE_WITHOUT_DEVICE = """
import json, sys, torch, torch_neuronx
model = torch.nn.Linear(4, 2).eval()
example = torch.zeros(1, 4)
for kwargs in json.loads(sys.argv[1]):
    try:
        torch_neuronx.trace(model, example, **kwargs)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
    else:
        print("traced")
"""


def trace_without_device(tmp_path: Path, calls: list[dict], *site: str, **env: str) -> list[str]:
    """What each torch_neuronx.trace call (its keyword arguments) gives in one process on a node without a device."""
    (tmp_path / "no-dev").mkdir(exist_ok=True)
    done = subprocess.run(
        [torch_python(), "-c", TRACE_WITHOUT_DEVICE, json.dumps(calls)],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join([*site, str(STANDINS)]), "NEURON_STANDIN_DEV_DIR": str(tmp_path / "no-dev"), **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()


def test_torch_neuronx_traces_without_a_device_only_on_its_cpu_backend_for_a_target(tmp_path):
    """As the trace API reference documents it: without a device, tracing needs cpu_backend=True
    with --target (or the target set before the import); torch-neuronx before Neuron 2.21 has no
    cpu_backend at all."""
    target = {"compiler_args": ["--target", "inf2"]}
    on_device, on_cpu, no_target = trace_without_device(tmp_path, [target, {**target, "cpu_backend": True}, {"cpu_backend": True}])
    assert "num_devices > 0" in on_device and on_cpu == "traced" and "please supply compiler argument target" in no_target
    assert trace_without_device(tmp_path, [{"cpu_backend": True}], NEURON_PLATFORM_TARGET_OVERRIDE="inf2") == ["traced"]
    old = distributions(tmp_path / "site", torch_neuronx="2.1.2.2.3.2")  # Neuron 2.20's
    [refused] = trace_without_device(tmp_path, [{**target, "cpu_backend": True}], old)
    assert "unexpected keyword argument 'cpu_backend'" in refused


def test_an_inf2_model_compiles_in_a_job_without_a_neuron_device(tmp_path, models):
    """The compile Job runs on an ordinary node: the program traces on torch-neuronx's CPU backend,
    and refuses an image whose torch-neuronx cannot, naming the release that can."""
    (tmp_path / "no-dev").mkdir()
    compiled = compile_model(tmp_path, INF2_PLAN, models / "conv.pt", NEURON_STANDIN_DEV_DIR=str(tmp_path / "no-dev"))
    assert compiled.returncode == 0, compiled.stderr
    old = compile_model(
        tmp_path, INF2_PLAN, models / "conv.pt", NEURON_STANDIN_DEV_DIR=str(tmp_path / "no-dev"),
        PYTHONPATH=f"{distributions(tmp_path / 'site', torch_neuronx='2.1.2.2.3.2')}:{STANDINS}",
    )  # fmt: skip
    assert old.returncode == 1 and "torch-neuronx 2.1.2.2.3.2" in old.stderr and "Neuron 2.21" in old.stderr, old.stderr


def test_a_models_failure_on_an_input_is_a_500_and_the_server_goes_on(tmp_path, models):
    """An id beyond the embedding's table makes the model itself raise: the client is told so,
    and the next request is served (the thread once died, leaving the client an empty reply)."""
    plan = {**INF2_PLAN, "buckets": [[8]], "inputDtype": "int64"}
    assert compile_model(tmp_path, plan, models / "tokens.pt").returncode == 0
    server, port = serve(tmp_path, plan, NEURON_RT_VISIBLE_CORES="0")
    try:
        status, body = post(port, [[5000, 1]])
        assert status == 500 and "index out of range" in body["error"]
        status, answers = post(port, [[5, 1]])
        assert status == 200 and close(answers, expected(models / "tokens.pt", [[5, 1]], "int64"))
    finally:
        server.kill()
        server.communicate()


def test_an_inf1_module_saved_with_torch_save_runs_on_its_pipeline_cores(tmp_path, models):
    (models / "mlp").mkdir()
    (models / "mlp.pt").rename(models / "mlp" / "mlp.pt")
    assert compile_model(tmp_path, INF1_PLAN, models / "mlp").returncode == 0  # a directory with one model file
    server, port = serve(tmp_path, INF1_PLAN, NEURON_RT_VISIBLE_CORES="2-3", NEURON_STANDIN_CORES_PER_DEVICE="4")
    try:
        inputs = [[float(i) / 16 for i in range(16)], [1.0] * 16, [0.0] * 16, [-2.0] * 16, [3.0] * 16]
        status, answers = post(port, inputs)
        assert status == 200 and close(answers, expected(models / "mlp" / "mlp.pt", inputs))
    finally:
        server.kill()
        server.communicate()


def test_how_much_of_the_model_runs_on_neuron_goes_into_the_manifest_and_the_termination_message(tmp_path, models):
    """On inf1 the compile program reads torch-neuron's partitioner report (its Neuron logger's
    "Number of arithmetic operators (post-compilation) before = N, compiled = M" line); every
    operator of the MLP compiles, and with ReLU left on the CPU 2 of its 3 do."""
    log = tmp_path / "termination-log"
    result = compile_model(tmp_path, INF1_PLAN, models / "mlp.pt", INFERENTIA_TERMINATION_LOG=str(log))
    assert result.returncode == 0, result.stderr
    placement = json.loads((tmp_path / "compiled" / "manifest.json").read_text())["neuronPlacement"]
    assert placement["percent"] == 100.0 and placement["operators"] == placement["compiledOperators"] > 0
    assert json.loads(log.read_text()) == {"neuronPlacementPercent": 100.0}
    partly = compile_model(tmp_path, INF1_PLAN, models / "mlp.pt", INFERENTIA_TERMINATION_LOG=str(log), NEURON_STANDIN_CPU_OPS="aten::relu")
    assert partly.returncode == 0, partly.stderr
    placement = json.loads((tmp_path / "compiled" / "manifest.json").read_text())["neuronPlacement"]
    assert placement["compiledOperators"] == placement["operators"] - 1
    assert 0 < json.loads(log.read_text())["neuronPlacementPercent"] == placement["percent"] < 100
    assert f"compile: {placement['percent']}% of the model's operators run on Neuron" in partly.stdout
    # torch_neuronx.trace compiles the whole graph for Neuron, or fails.
    assert compile_model(tmp_path, INF2_PLAN, models / "conv.pt", INFERENTIA_TERMINATION_LOG=str(log)).returncode == 0
    assert json.loads(log.read_text()) == {"neuronPlacementPercent": 100.0}


def test_a_neuron_cc_flag_is_refused_by_the_neuronx_compile_as_the_compiler_would(tmp_path, models):
    plan = {**INF2_PLAN, "compilerArgs": ["--target", "inf2", "--neuroncore-pipeline-cores", "2"]}
    result = compile_model(tmp_path, plan, models / "conv.pt")
    assert result.returncode != 0
    assert "neuronx-cc failed: ERROR [NCC_EARG000] unrecognized arguments: --neuroncore-pipeline-cores" in result.stderr


def test_the_server_refuses_to_start_on_cores_its_devices_do_not_have(tmp_path, models):
    assert compile_model(tmp_path, INF2_PLAN, models / "conv.pt").returncode == 0
    server, _ = serve(tmp_path, INF2_PLAN, NEURON_RT_VISIBLE_CORES="6-7")
    assert server.wait(timeout=30) != 0
    _, err = server.communicate()
    # Two devices of two cores each are mounted: cores 0-3; the runtime's kind of message.
    assert "NRT:nrt_allocate_neuron_cores  Logical Neuron Core(s) not available - Requested: 6-7 Available: 0,1,2,3" in err


def test_a_traced_artefact_loads_only_after_its_framework_is_imported(tmp_path, models):
    """As the torch-neuron troubleshooting guide describes: "Unknown builtin op: neuron::forward_1"."""
    assert compile_model(tmp_path, INF1_PLAN, models / "mlp.pt").returncode == 0
    code = f"import torch; torch.jit.load({str(tmp_path / 'compiled' / 'bucket-0.pt')!r})"
    result = subprocess.run([TORCH_PYTHON, "-c", code], env={**os.environ, "PYTHONPATH": str(STANDINS)}, capture_output=True, text=True)
    assert result.returncode != 0 and "Unknown builtin op: neuron::forward_1" in result.stderr
    result = subprocess.run(
        [TORCH_PYTHON, "-c", "import torch_neuron; " + code],
        env={**os.environ, "PYTHONPATH": str(STANDINS)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_without_a_compile_step_the_server_traces_the_model_at_start(tmp_path, models):
    server, port = serve(
        tmp_path, INF2_PLAN, NEURON_RT_VISIBLE_CORES="0", INFERENTIA_MODEL_PATH=str(models / "conv.pt"), INFERENTIA_COMPILED_MODEL_DIR=""
    )
    try:
        assert server.poll() is None, server.communicate()
        status, answers = post(port, [[1.0, 2.0]])
        assert status == 200 and close(answers, expected(models / "conv.pt", [[1.0, 2.0]]))
    finally:
        server.kill()
        server.communicate()


def test_the_model_server_closes_slow_clients_and_refuses_connections_over_its_cap(tmp_path, models):
    """Without a batching front end, clients reach the model server directly: a client that
    dribbles its headers is closed at the read timeout, connections over the cap get a 503
    at once, and a normal client is answered once they are gone."""
    from test_frontend_limits import assert_whole_503

    plan = {**INF2_PLAN, "buckets": [[8]]}
    assert compile_model(tmp_path, plan, models / "conv.pt").returncode == 0
    server, port = serve(
        tmp_path, plan, NEURON_RT_VISIBLE_CORES="0", INFERENTIA_SERVE_CLIENT_TIMEOUT_S="2", INFERENTIA_SERVE_MAX_CONNECTIONS="8"
    )
    held = []
    try:
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nX-Slow: a")
            held.append(s)
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", port)) as extra:
            extra.settimeout(5)
            answer = b""
            while chunk := extra.recv(4096):
                answer += chunk
        assert_whole_503(answer)
        started = time.monotonic()
        for s in held:
            s.settimeout(10)
            assert s.recv(4096) == b""  # closed, at the read timeout
        assert time.monotonic() - started < 2 + 3
        status, answers = post(port, [[1.0, 2.0]])
        assert status == 200 and close(answers, expected(models / "conv.pt", [[1.0, 2.0]]))
    finally:
        for s in held:
            s.close()
        server.kill()
        server.communicate()


def test_a_server_whose_port_was_taken_meanwhile_is_started_on_another(tmp_path, models, monkeypatch):
    """The harness's answer to the race between picking a port and binding it: the port handed
    out first is held by another listener, and the server still comes up, on the next one."""
    plan = {**INF2_PLAN, "buckets": [[8]]}
    assert compile_model(tmp_path, plan, models / "conv.pt").returncode == 0
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        held = taken.getsockname()[1]
        ports = iter([held, free_port()])
        monkeypatch.setattr(sys.modules[__name__], "free_port", lambda: next(ports))
        server, port = serve(tmp_path, plan, NEURON_RT_VISIBLE_CORES="1")
    try:
        assert server.poll() is None and port != held, server.communicate()
    finally:
        server.kill()
        server.communicate()


def test_a_core_a_live_process_holds_cannot_be_loaded_by_another(tmp_path, models):
    """The runtime stand-in takes its cores as the Neuron runtime does: a second server on a
    core the first still holds fails to load, with the runtime's message; once the first is
    gone, the core is free again (aws-neuron-sdk#1338 is the failure this lets the suite see)."""
    plan = {**INF2_PLAN, "buckets": [[8]]}
    assert compile_model(tmp_path, plan, models / "conv.pt").returncode == 0
    locks = tmp_path / "locks"
    locks.mkdir()
    first, _ = serve(tmp_path, plan, NEURON_RT_VISIBLE_CORES="1", NEURON_STANDIN_LOCK_DIR=str(locks))
    try:
        assert first.poll() is None
        second, _ = serve(tmp_path, plan, NEURON_RT_VISIBLE_CORES="1", NEURON_STANDIN_LOCK_DIR=str(locks))
        second.wait(30)
        out, err = second.communicate()
        assert second.returncode == 1, (out, err)
        assert "nrt_allocate_neuron_cores" in err and "Logical Neuron Core(s) not available - Requested:1 Available:0" in err, err
    finally:
        first.kill()
        first.communicate()
    third, _ = serve(tmp_path, plan, NEURON_RT_VISIBLE_CORES="1", NEURON_STANDIN_LOCK_DIR=str(locks))
    try:
        assert third.poll() is None, third.communicate()
    finally:
        third.kill()
        third.communicate()


def test_the_model_server_stops_on_sigterm_and_exits_0(tmp_path, models):
    """docs/serving-pod.md: after the pod's drain, SIGTERM stops the model server, which joins
    its request threads and exits 0 (the launcher then exits 0 too)."""
    import signal

    plan = {**INF2_PLAN, "buckets": [[8]]}
    assert compile_model(tmp_path, plan, models / "conv.pt").returncode == 0
    server, port = serve(tmp_path, plan, NEURON_RT_VISIBLE_CORES="0")
    try:
        assert post(port, [[1.0, 2.0]])[0] == 200
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
    finally:
        server.kill()
    assert server.returncode == 0, err
    assert out.rstrip().endswith("serve: stopped"), out


# --- the vLLM Neuron plugin's compile step (trn2, trn3) ------------------------------------------


def image_site(where: Path, image: str) -> str:
    """A site directory with the packages AWS's ``image`` carries (neuron_images), for the stand-ins."""
    images.write_distributions(where, neuron_images.CATALOGUE[image].distributions)
    return str(where)


VLLM_IMAGE = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:"
PLUGIN_IMAGE = VLLM_IMAGE + "0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04"
NXDI_IMAGE = VLLM_IMAGE + "0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04"
V0_IMAGE = VLLM_IMAGE + "0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04"


def plugin_env(tmp_path: Path, cache: Path, image: str = PLUGIN_IMAGE, **extra: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{image_site(tmp_path / 'site', image)}:{STANDINS}", "HOME": str(tmp_path),
        "VLLM_CACHE_ROOT": str(cache), "NEURON_LOGICAL_NC_CONFIG": "2", **extra,
    }  # fmt: skip


ENGINE = {"model": "meta-llama/Llama-3.1-8B-Instruct", "tensor_parallel_size": 4, "max_model_len": 256}


def run_vllm_compile(tmp_path: Path, cache: Path, **extra: str) -> subprocess.CompletedProcess:
    env = plugin_env(tmp_path, cache, INFERENTIA_VLLM_ENGINE_ARGS=json.dumps(ENGINE), **extra)
    return subprocess.run(["/usr/bin/python3", str(PROGRAMS / programs.VLLM_COMPILE_PROGRAM)], env=env, capture_output=True, text=True)


def test_the_plugin_compile_step_fills_the_cache_a_server_then_starts_from_without_compiling(tmp_path, monkeypatch):
    cache = tmp_path / "compiled"
    done = run_vllm_compile(tmp_path, cache, VLLM_NEURON_CPU_COMPILE="1", NEURON_PLATFORM_TARGET_OVERRIDE="trn2", HF_TOKEN="hf_local")
    assert done.returncode == 0, done.stderr
    entries = sorted(p.name for p in (cache / "neuron" / "compile_cache").iterdir())
    assert len(entries) == 2 and "2 cache entries" in done.stdout
    # The serving side of the same contract, in the stand-in the real node's pods run.
    monkeypatch.syspath_prepend(str(STANDINS))
    monkeypatch.syspath_prepend(image_site(tmp_path / "site", PLUGIN_IMAGE))
    import neuron_standin

    for k, v in plugin_env(tmp_path, cache).items():
        monkeypatch.setenv(k, v)
    engine = {**ENGINE, "max_num_seqs": None}
    assert neuron_standin.plugin_warm_up(engine, "trn2", may_compile=False) == (entries, False)
    # A graph the compile step did not make (another sequence length) is a miss, fatal when warm-up may not compile.
    with pytest.raises(RuntimeError, match="VLLM_NEURON_DISABLE_WARMUP_COMPILE: local compile cache miss .*the prefill graph"):
        neuron_standin.plugin_warm_up({**engine, "max_model_len": 512}, "trn2", may_compile=False)
    # Compiled for trn2, the cache has nothing for trn3.
    with pytest.raises(RuntimeError, match="local compile cache miss"):
        neuron_standin.plugin_warm_up(engine, "trn3", may_compile=False)
    # Served by an image of other compiler versions (Neuron 2.31's plugin): the key hashes them, so every graph misses.
    monkeypatch.syspath_prepend(image_site(tmp_path / "site-2.31", VLLM_IMAGE + "0.21.0.1.0.0-neuronx-py313-sdk2.31.0-ubuntu24.04"))
    with pytest.raises(RuntimeError, match="local compile cache miss .*'neuronx-cc': '2.26.6360.0'"):
        neuron_standin.plugin_warm_up(engine, "trn2", may_compile=False)


def hub_files(hub: Path, repo: str) -> tuple[str, dict[str, Path]]:
    """The commit refs/main names in a Hub cache, and the files of its snapshot."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    commit = (folder / "refs" / "main").read_text()
    snapshot = folder / "snapshots" / commit
    return commit, {str(p.relative_to(snapshot)): p for p in snapshot.rglob("*") if not p.is_dir()}


def test_the_plugin_compile_step_keeps_the_hub_model_it_read_and_a_replica_serves_it_offline(tmp_path):
    """The Hub is read once, by the compile Job: the model's files go into the artefact, in the Hub
    cache's layout, as regular files (an object store keeps no link) with no blobs/ beside them;
    the commit is reported in the termination message. A replica with HF_HUB_OFFLINE=1 and
    HF_HUB_CACHE at the artefact's copy then starts from it, and with an empty cache it fails
    with the Hub client's reason: nothing else could have served it."""
    cache, log, downloads = tmp_path / "compiled", tmp_path / "termination-log", tmp_path / "downloads"
    hub = cache / programs.HUB_SNAPSHOT_DIR
    done = run_vllm_compile(
        tmp_path, cache, VLLM_NEURON_CPU_COMPILE="1", NEURON_PLATFORM_TARGET_OVERRIDE="trn2", HF_TOKEN="hf_local",
        INFERENTIA_HUB_CACHE=str(hub), INFERENTIA_TERMINATION_LOG=str(log), NEURON_STANDIN_HUB_LOG=str(downloads),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    commit, files = hub_files(hub, ENGINE["model"])
    assert json.loads(log.read_text()) == {"hubRevision": commit}
    assert sorted(files) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (
        not any(p.is_symlink() for p in files.values()) and not (hub / f"models--{ENGINE['model'].replace('/', '--')}" / "blobs").exists()
    )
    assert len(downloads.read_text().splitlines()) == 1  # the engine read the snapshot offline, not the Hub again
    downloads.unlink()

    def serve(hub_cache: Path) -> subprocess.CompletedProcess:
        env = plugin_env(
            tmp_path, cache, HF_HUB_CACHE=str(hub_cache), HF_HUB_OFFLINE="1", VLLM_NEURON_DISABLE_WARMUP_COMPILE="1",
            NEURON_STANDIN_HUB_LOG=str(downloads), NEURON_PLATFORM_TARGET_OVERRIDE="trn2",
        )  # fmt: skip
        # The replica's start, as far as the Hub and the plugin's cache go (the server itself is run on the real node).
        code = (
            "import neuron_standin as s\n"
            f"folder = s.local_checkpoint({ENGINE['model']!r}, weights=True)\n"
            f"keys, compiled = s.plugin_warm_up({{**{ENGINE!r}, 'max_num_seqs': None}}, 'trn2', may_compile=False)\n"
            "print(folder, compiled)\n"
        )
        return subprocess.run(["/usr/bin/python3", "-c", code], env=env, capture_output=True, text=True)

    served = serve(hub)
    assert served.returncode == 0 and served.stdout.split() == [
        str(hub / f"models--{ENGINE['model'].replace('/', '--')}" / "snapshots" / commit),
        "False",
    ], served.stderr
    missing = serve(tmp_path / "empty")
    assert missing.returncode == 1 and "LocalEntryNotFoundError" in missing.stderr, missing.stderr
    assert not downloads.exists()


def test_the_plugin_compile_step_keeps_an_eagle3_draft_from_the_hub_beside_its_target(tmp_path):
    """A replica reads the artefact's Hub snapshot offline (HF_HUB_OFFLINE=1), so a draft named by a
    Hub id must be in it too: the compile step downloads the draft as it does the target, weights
    and all (vLLM loads the draft's checkpoint itself), and the engine then reads both offline."""
    cache, downloads = tmp_path / "compiled", tmp_path / "downloads"
    hub = cache / programs.HUB_SNAPSHOT_DIR
    draft = "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"
    engine = {**ENGINE, "speculative_config": {"method": "eagle3", "model": draft, "num_speculative_tokens": 3}, "async_scheduling": False}
    env = plugin_env(
        tmp_path, cache, INFERENTIA_VLLM_ENGINE_ARGS=json.dumps(engine), VLLM_NEURON_CPU_COMPILE="1",
        NEURON_PLATFORM_TARGET_OVERRIDE="trn2", HF_TOKEN="hf_local", INFERENTIA_HUB_CACHE=str(hub),
        INFERENTIA_TERMINATION_LOG=str(tmp_path / "termination-log"), NEURON_STANDIN_HUB_LOG=str(downloads),
    )  # fmt: skip
    done = subprocess.run(["/usr/bin/python3", str(PROGRAMS / programs.VLLM_COMPILE_PROGRAM)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for repo in (ENGINE["model"], draft):
        _, files = hub_files(hub, repo)
        assert "model.safetensors" in files and not any(p.is_symlink() for p in files.values()), repo
    assert len(downloads.read_text().splitlines()) == 2  # each once, by the compile step; the engine read both offline
    assert f"kept {draft}" in done.stdout


def test_the_plugin_compile_step_keeps_the_draft_before_it_reports_the_targets_commit(tmp_path, monkeypatch):
    """The termination message (the target's commit) is what the operator reads of a finished
    artefact: a draft that cannot be kept fails the step before anything is written there."""
    monkeypatch.syspath_prepend(str(PROGRAMS))
    import hub_snapshot  # type: ignore[import-not-found]
    import vllm_compile  # type: ignore[import-not-found]

    def keep(snapshot: Path, repo_id: str, cache: Path, weights: bool) -> str:
        if repo_id == "org/draft":
            raise OSError("No space left on device")
        return "0" * 40

    monkeypatch.setattr(hub_snapshot, "keep", keep)
    log = tmp_path / "termination-log"
    monkeypatch.setenv("INFERENTIA_TERMINATION_LOG", str(log))
    hub = tmp_path / "hub"
    assert vllm_compile.keep_snapshots(hub, tmp_path / "target", "org/target", tmp_path / "draft", "org/draft") == 1
    assert not log.exists()
    assert vllm_compile.keep_snapshots(hub, tmp_path / "target", "org/target", None, None) == 0
    assert json.loads(log.read_text()) == {"hubRevision": "0" * 40}


def test_the_plugin_compile_step_fails_with_the_plugins_reason(tmp_path):
    """Without the CPU-compilation settings there is no device to compile on, and the Job says so."""
    cache = tmp_path / "compiled"
    no_cpu = run_vllm_compile(tmp_path, cache)
    assert no_cpu.returncode == 1 and "VLLM_NEURON_CPU_COMPILE=1" in no_cpu.stderr
    no_target = run_vllm_compile(tmp_path, cache, VLLM_NEURON_CPU_COMPILE="1")
    assert no_target.returncode == 1 and "NEURON_PLATFORM_TARGET_OVERRIDE is required" in no_target.stderr
    inf2 = run_vllm_compile(tmp_path, cache, VLLM_NEURON_CPU_COMPILE="1", NEURON_PLATFORM_TARGET_OVERRIDE="inf2")
    assert inf2.returncode == 1 and "supports Trn2 and Trn3, not inf2" in inf2.stderr
    assert not (cache / "neuron" / "compile_cache").exists()


# -- vLLM on NxD Inference (inf2, trn1): the operator's compile program ----------------------------

NXDI_ENGINE = {"model": "meta-llama/Llama-3.1-8B-Instruct", "tensor_parallel_size": 2, "max_model_len": 4096, "max_num_seqs": 8,
               "enable_prefix_caching": False, "num_gpu_blocks_override": 8}  # fmt: skip


def tiny_checkpoint(where: Path, model_type: str = "llama") -> Path:
    """A Hugging Face checkpoint as NxD Inference reads one: config.json and model.safetensors."""
    sys.path.insert(0, str(STANDINS))
    try:
        import standin_safetensors
    finally:
        sys.path.remove(str(STANDINS))
    where.mkdir(parents=True)
    config = {"model_type": model_type, "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16", "num_hidden_layers": 2,
              "num_key_value_heads": 2, "hidden_size": 8, "max_position_embeddings": 8192}  # fmt: skip
    (where / "config.json").write_text(json.dumps(config))
    standin_safetensors.write(where / "model.safetensors", {"embed_tokens.weight": [[0.5] * 8] * 4})
    return where


def run_nxdi_compile(tmp_path: Path, engine: dict, **extra: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{image_site(tmp_path / 'site', NXDI_IMAGE)}:{STANDINS}", "HOME": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf"), "INFERENTIA_VLLM_ENGINE_ARGS": json.dumps(engine),
        "INFERENTIA_COMPILED_MODEL_DIR": str(tmp_path / "compiled"), **extra,
    }  # fmt: skip
    return subprocess.run([sys.executable, str(PROGRAMS / programs.NXDI_COMPILE_PROGRAM)], env=env, capture_output=True, text=True)


def test_the_nxd_inference_compile_step_writes_what_vllms_loader_loads_without_compiling(tmp_path, monkeypatch):
    """The program compiles, with no Neuron device, the model vLLM on NxD Inference would compile at
    start for the same engine, into the layout its loader reads from NEURON_COMPILED_ARTIFACTS,
    weights sharded per rank; the serving stand-in then loads it and never compiles."""
    checkpoint = tiny_checkpoint(tmp_path / "model")
    done = run_nxdi_compile(tmp_path, NXDI_ENGINE, INFERENTIA_MODEL_PATH=str(checkpoint), NEURON_PLATFORM_TARGET_OVERRIDE="inf2")
    assert done.returncode == 0, done.stderr
    compiled = tmp_path / "compiled"
    saved = json.loads((compiled / "neuron_config.json").read_text())
    neuron = saved["neuron_config"]
    # vLLM's own NxD Inference settings for that engine (the vLLM User Guide for NxD Inference).
    assert (neuron["tp_degree"], neuron["batch_size"], neuron["seq_len"], neuron["max_context_length"]) == (2, 8, 4096, 4096)
    assert (neuron["ctx_batch_size"], neuron["is_continuous_batching"], neuron["padding_side"]) == (1, True, "right")
    assert neuron["save_sharded_checkpoint"] is True and neuron["torch_dtype"] == "bfloat16"
    assert (compiled / "model.pt").is_file()
    assert sorted(p.name for p in (compiled / "weights").iterdir()) == [f"tp{r}_sharded_checkpoint.safetensors" for r in range(2)]
    assert "compiled llama" in done.stdout and "for inf2" in done.stdout

    # The server's side, in the stand-in the real node's pods run: loaded, not compiled.
    monkeypatch.syspath_prepend(str(STANDINS))
    from neuronx_distributed_inference.utils.constants import MODEL_TYPES

    app = MODEL_TYPES["llama"]["causal-lm"](str(compiled))
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "inf2")
    app.load(str(compiled))
    assert app.is_loaded_to_neuron and app.neuron_config.tp_degree == 2


def test_a_compiled_nxd_inference_model_is_the_one_vllm_neuron_would_build_and_another_engine_is_refused(tmp_path, monkeypatch):
    """vllm-neuron loads a compiled model as it is, with the KV layout taken from vLLM's own cache
    settings: the compile must be the NeuronConfig its loader builds from the server's flags
    (paged-attention blocks included), and the stand-in server refuses one compiled for another engine."""
    checkpoint = tiny_checkpoint(tmp_path / "model")
    done = run_nxdi_compile(tmp_path, NXDI_ENGINE, INFERENTIA_MODEL_PATH=str(checkpoint), NEURON_PLATFORM_TARGET_OVERRIDE="inf2")
    assert done.returncode == 0, done.stderr
    compiled = json.loads((tmp_path / "compiled" / "neuron_config.json").read_text())["neuron_config"]
    monkeypatch.syspath_prepend(str(STANDINS))
    monkeypatch.syspath_prepend(image_site(tmp_path / "site", NXDI_IMAGE))
    import neuron_standin

    flags = ["--model", str(checkpoint), "--tensor-parallel-size", "2", "--max-model-len", "4096", "--max-num-seqs", "8",
             "--no-enable-prefix-caching", "--num-gpu-blocks-override", "8"]  # fmt: skip
    parser = neuron_standin.vllm_parser(neuron_standin.VLLM_NEURON_NXDI)
    expected = neuron_standin.nxdi_neuron_config(parser.parse_args(flags), neuron_standin.VLLM_NEURON_NXDI)
    assert {k: compiled[k] for k in expected} == expected
    assert (expected["pa_num_blocks"], expected["pa_block_size"], expected["is_block_kv_layout"]) == (9, 4096, False)
    neuron_standin.check_compiled_config(compiled, expected)  # the same engine: served
    other = neuron_standin.nxdi_neuron_config(parser.parse_args([*flags[:-3], "--num-gpu-blocks-override", "8"]), "vllm-neuron")
    with pytest.raises(SystemExit):  # prefix caching left on: another KV layout than the one compiled
        neuron_standin.check_compiled_config(compiled, other)
    with pytest.raises(SystemExit) as refused:  # --override-neuron-config is V0's: vLLM 0.16 has no such flag
        parser.parse_args([*flags, "--override-neuron-config", "{}"])
    assert refused.value.code == 2


def test_the_nxd_inference_compile_step_downloads_a_hub_model_with_the_token(tmp_path):
    """A Hugging Face id is downloaded into HF_HOME first (NxD Inference reads a local checkpoint);
    a gated model without a token fails with the Hub's reason."""
    no_token = run_nxdi_compile(tmp_path, NXDI_ENGINE, NEURON_PLATFORM_TARGET_OVERRIDE="inf2")
    assert no_token.returncode == 1 and "gated" in no_token.stderr.lower() and "meta-llama/Llama-3.1-8B-Instruct" in no_token.stderr
    hub, log = tmp_path / "compiled" / programs.HUB_SNAPSHOT_DIR, tmp_path / "termination-log"
    done = run_nxdi_compile(
        tmp_path, NXDI_ENGINE, NEURON_PLATFORM_TARGET_OVERRIDE="trn1", HF_TOKEN="hf_local", INFERENTIA_HUB_CACHE=str(hub),
        INFERENTIA_TERMINATION_LOG=str(log),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "hf" / "hub").glob("models--meta-llama--Llama-3.1-8B-Instruct/snapshots/*/config.json"))
    assert json.loads((tmp_path / "compiled" / "neuron_config.json").read_text())["neuron_config"]["tp_degree"] == 2
    # The artefact keeps the configuration and tokenizer the server reads, not the weights (sharded
    # into weights/ already): a replica reads them offline, and a compile is reported by its commit.
    commit, files = hub_files(hub, NXDI_ENGINE["model"])
    assert sorted(files) == ["config.json", "tokenizer.json"] and not any(p.is_symlink() for p in files.values())
    assert json.loads(log.read_text()) == {"hubRevision": commit}


def test_the_nxd_inference_compile_step_fails_with_the_reason(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "model")
    # No Neuron device, and no target named: nothing to compile for.
    no_target = run_nxdi_compile(tmp_path, NXDI_ENGINE, INFERENTIA_MODEL_PATH=str(checkpoint))
    assert no_target.returncode == 1 and "NEURON_PLATFORM_TARGET_OVERRIDE" in no_target.stderr
    # The compiled shape must be stated: vLLM's defaults are its own, and would differ from the server's.
    unsized = run_nxdi_compile(tmp_path, {"model": "x", "tensor_parallel_size": 2}, INFERENTIA_MODEL_PATH=str(checkpoint),
                               NEURON_PLATFORM_TARGET_OVERRIDE="inf2")  # fmt: skip
    assert unsized.returncode == 1 and "max_model_len" in unsized.stderr and "max_num_seqs" in unsized.stderr
    other = tiny_checkpoint(tmp_path / "other", model_type="bert")
    unknown = run_nxdi_compile(tmp_path, NXDI_ENGINE, INFERENTIA_MODEL_PATH=str(other), NEURON_PLATFORM_TARGET_OVERRIDE="inf2")
    assert unknown.returncode == 1 and "model_type 'bert'" in unknown.stderr and "llama" in unknown.stderr
    assert not (tmp_path / "compiled" / "model.pt").exists()


def test_the_vllm_standin_runs_max_num_seqs_at_once_and_counts_the_rest_as_waiting(monkeypatch):
    """As vLLM's scheduler: past --max-num-seqs a request waits, and its /metrics says so
    (vllm:num_requests_waiting), which the endpoint picker ranks replicas by."""
    import threading

    monkeypatch.syspath_prepend(str(STANDINS))
    import neuron_standin

    sequences = neuron_standin.Sequences(max_num_seqs=1)
    release = threading.Event()

    def request() -> None:
        with sequences:
            release.wait(10)

    threads = [threading.Thread(target=request) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while (sequences.running, sequences.waiting) != (1, 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (sequences.running, sequences.waiting) == (1, 2)
    release.set()
    for t in threads:
        t.join(10)
    assert (sequences.running, sequences.waiting) == (0, 0)
    unlimited = neuron_standin.Sequences(max_num_seqs=None)
    with unlimited, unlimited:
        assert (unlimited.running, unlimited.waiting) == (2, 0)


def test_a_two_node_group_serves_through_its_leader_only_once_its_worker_joined_and_dies_with_it(tmp_path):
    """The operator's multi-node command (serving.runtime.multi_node_command) run as LeaderWorkerSet
    runs it, one process a node, on the vLLM and Neuron runtime stand-ins: the leader answers
    nothing until the worker rank has joined its root communicator at LWS_LEADER_ADDRESS, each
    completion is a step of both nodes, and a worker lost fails the next step and the leader
    (vLLM's engine dies with its collectives)."""
    from inferentia_operator.core.serving.runtime import multi_node_command, multi_node_env
    from test_decide import built, model_body
    from test_multi_node import TWO_NODES

    # A Hub id, which each rank's vLLM reads through the Hub client (the token a gated model needs).
    model = built(model_body(**{**TWO_NODES, "model.uri": "meta-llama/Llama-3.1-70B-Instruct"}))
    (tmp_path / programs.VLLM_WORKER_PROGRAM).write_text(programs.source(programs.VLLM_WORKER_PROGRAM))
    port = free_port()

    def rank(index: int) -> subprocess.Popen:
        dev = tmp_path / f"dev{index}"
        dev.mkdir()
        for chip in range(16):  # a trn1.32xlarge: 16 devices of 2 NeuronCores
            (dev / f"neuron{chip}").touch()
        env = {
            "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{image_site(tmp_path / 'site', V0_IMAGE)}:{STANDINS}", "HOME": str(tmp_path), "PORT": str(port),
            "HF_TOKEN": "standin-token", "NEURON_STANDIN_DEV_DIR": str(dev), "INFERENTIA_PLAN_DIR": str(tmp_path),
            "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference", **multi_node_env(model),
            # What LeaderWorkerSet's pod webhook sets on each pod of the group.
            "LWS_WORKER_INDEX": str(index), "LWS_LEADER_ADDRESS": "localhost", "LWS_GROUP_SIZE": "2",
        }  # fmt: skip
        return subprocess.Popen(multi_node_command(model), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def complete() -> tuple[int, dict]:
        body = json.dumps({"prompt": "Trainium"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def health() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return True
        except OSError:
            return False

    leader = rank(0)
    worker = None
    try:
        time.sleep(2)
        assert leader.poll() is None and not health(), "the leader serves before its worker joined"
        worker = rank(1)
        deadline = time.monotonic() + 30
        while not health():
            assert time.monotonic() < deadline and leader.poll() is None and worker.poll() is None, (leader, worker)
            time.sleep(0.2)
        code, answer = complete()
        assert code == 200, answer
        assert "[node 0 " in answer["choices"][0]["text"] and "cores 0-31] [node 1 " in answer["choices"][0]["text"], answer
        worker.kill()
        worker.wait()
        code, answer = complete()
        assert code == 500 and "node rank 1" in answer["error"], answer
        assert leader.wait(timeout=10) == 1
        assert "NRT:" in leader.communicate()[1]
    finally:
        for p in (leader, worker):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()


def test_the_hub_snapshot_keeps_one_format_of_weights_as_vllm_picks_it():
    """vLLM's download_weights_from_hf takes the first of safetensors and bin the repository has;
    Meta's original/ folder (a second copy, in another format) is never read."""
    from inferentia_operator.programs import hub_snapshot

    llama = ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json", "original/consolidated.00.pth"]
    assert hub_snapshot.served_patterns(llama) == [*hub_snapshot.CONFIG_PATTERNS, "*.safetensors"]
    old = ["config.json", "pytorch_model.bin", "tokenizer.json"]
    assert hub_snapshot.served_patterns(old) == [*hub_snapshot.CONFIG_PATTERNS, "*.bin"]
    both = ["model.safetensors", "pytorch_model.bin"]
    assert hub_snapshot.served_patterns(both)[-1] == "*.safetensors"
    assert hub_snapshot.served_patterns(["config.json", "original/x.pth"]) == hub_snapshot.CONFIG_PATTERNS
