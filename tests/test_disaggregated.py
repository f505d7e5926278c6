"""Disaggregated prefill and decode on the vLLM Neuron plugin's stand-in, and the operator's proxy
in front of them, run as real processes on 127.0.0.1 (vllm_disagg, programs/pd_proxy.py;
docs/development.md, "Stand-ins and the interfaces they keep").

Each wait is for an event (a server answering /health, a process exiting); the timeouts are
only a safety net."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import images
from inferentia_operator import programs
from inferentia_operator.core import neuron_images
from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "cluster" / "node" / "standins"
PROXY = ROOT / "operator" / "inferentia_operator" / "programs" / programs.PD_PROXY_PROGRAM
PLUGIN = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04"
NXDI = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04"
# The checkpoint's KV shape: 4 layers, 2 KV heads, head dimension 512 / 8 = 64, bfloat16.
TOKEN_BYTES = 4 * 2 * 2 * 64 * 2
SAFETY = 60  # seconds: only if something hangs


def checkpoint(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16", "num_hidden_layers": 4,
        "num_key_value_heads": 2, "num_attention_heads": 8, "hidden_size": 512, "_standin_parameters": 100_000_000,
    }  # fmt: skip
    (where / "config.json").write_text(json.dumps(config))
    (where / "model.safetensors").write_bytes(b"")
    return where


def site(where: Path, image: str) -> str:
    images.write_distributions(where, neuron_images.CATALOGUE[image].distributions)
    return f"{where}:{STANDINS}"


def environment(tmp_path: Path, image: str, cores: str, side_port: int, **extra: str) -> dict[str, str]:
    """One Trainium2 chip (4 logical cores at LNC 2) shared by the servers, each on its own cores."""
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    (dev / "neuron0").touch()
    return {
        "PATH": "/usr/bin:/bin", "PYTHONPATH": site(tmp_path / "site", image), "HOME": str(tmp_path),
        "NEURON_STANDIN_DEV_DIR": str(dev), "NEURON_STANDIN_PLATFORM": "trn2", "NEURON_STANDIN_CORES_PER_DEVICE": "4",
        "NEURON_STANDIN_LOCK_DIR": str(tmp_path / "locks"), "NEURON_RT_VISIBLE_CORES": cores, "NEURON_LOGICAL_NC_CONFIG": "2",
        "VLLM_CACHE_ROOT": str(tmp_path / f"cache-{cores}"), "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port), **extra,
    }  # fmt: skip


def kv_config(role: str, **more: object) -> str:
    """The tutorial's --kv-transfer-config, with the design page's NixlConnector."""
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cuda",
                       "kv_connector_extra_config": {"backends": ["LIBFABRIC"]}, **more})  # fmt: skip


def server_argv(model: Path, port: int, config: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
            "--tensor-parallel-size", "2", "--max-num-seqs", "4", "--max-model-len", "1024", "--block-size", "32",
            "--data-parallel-size", "1", "--dtype", "bfloat16", "--max-num-batched-tokens", "1024",
            "--no-disable-hybrid-kv-cache-manager", "--kv-transfer-config", config, *more]  # fmt: skip


def wait_healthy(proc: subprocess.Popen, port: int, path: str = "/health") -> None:
    deadline = time.monotonic() + SAFETY
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if get(port, path)[0] == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"port {port} never answered {path}")


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SAFETY)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def post(port: int, path: str, body: object, raw: bytes | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SAFETY)
    try:
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples (over its labels); ``name`` may end in the first of its labels,
    unclosed ('m{bucket_name="x"'), and then matches that label's samples alone."""
    labels = r"[^}]*}" if "{" in name else r"(?:{[^}]*})?"
    found = re.findall(rf"^{re.escape(name)}{labels} (\S+)$", text, re.M)
    assert found, f"{name} not in metrics"
    return sum(float(v) for v in found)


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.model, self.procs = tmp_path, checkpoint(tmp_path / "model"), []

    def start(self, argv: list[str], env: dict[str, str], port: int, health: str = "/health") -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        wait_healthy(proc, port, health)
        return proc

    def server(self, role: str, cores: str, *more: str, config: str | None = None, **env: str) -> tuple[int, int, subprocess.Popen]:
        port, side = free_port(), free_port()
        environ = environment(self.tmp_path, PLUGIN, cores, side, **env)
        return port, side, self.start(server_argv(self.model, port, config or kv_config(role), *more), environ, port)

    def proxy(self, prefill: list[int], decode: list[int], **env: str) -> int:
        port = free_port()
        argv = [sys.executable, str(PROXY), "--port", str(port), "--prefiller-hosts", *["127.0.0.1"] * len(prefill),
                "--prefiller-ports", *map(str, prefill), "--decoder-hosts", *["127.0.0.1"] * len(decode),
                "--decoder-ports", *map(str, decode)]  # fmt: skip
        self.start(argv, {"PATH": "/usr/bin:/bin", **env}, port, "/healthcheck")
        return port

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=SAFETY)


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path)
    yield made
    made.stop()


def test_a_completion_is_prefilled_then_decoded_and_the_kv_moved_is_the_models_shape(cluster):
    """1P1D as the tutorial runs it: the answer is the decode server's (its cores), the decode read
    the prompt's KV from the prefill (layers x 2 x KV heads x head dim x 2 bytes x prompt tokens),
    and each server's vLLM metrics carry the request's TTFT and time per output token."""
    p_port, _, _ = cluster.server("kv_producer", "0-1")
    d_port, _, _ = cluster.server("kv_consumer", "2-3")
    proxy = cluster.proxy([p_port], [d_port])
    prompt = "count the numbers one two three"
    status, text = post(proxy, "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 5})
    assert status == 200, text
    answer = json.loads(text)
    assert answer["choices"][0]["text"].startswith(" [cores [2, 3]]"), answer
    assert answer["usage"]["completion_tokens"] == 5 and answer["kv_transfer_params"] is None
    decode, prefill = get(d_port, "/metrics")[1], get(p_port, "/metrics")[1]
    assert metric(decode, "vllm:nixl_bytes_transferred_sum") == 6 * TOKEN_BYTES
    assert metric(decode, "vllm:nixl_bytes_transferred_count") == 1
    assert metric(decode, "vllm:time_to_first_token_seconds_count") == 1
    assert metric(decode, "vllm:inter_token_latency_seconds_count") == 4
    assert metric(decode, "vllm:request_time_per_output_token_seconds_count") == 1
    assert metric(decode, "vllm:generation_tokens_total") == 5
    # The prefill ran max_tokens=1 (its token discarded), and freed its blocks once the decode read them.
    assert metric(prefill, "vllm:generation_tokens_total") == 1
    assert metric(prefill, "vllm:prompt_tokens_total") == 6
    assert metric(prefill, "vllm:kv_cache_usage_perc") == 0.0
    assert metric(prefill, "vllm:time_to_first_token_seconds_count") == 1
    deadline = time.monotonic() + SAFETY  # the request leaves the running set once its answer is written
    while metric(get(d_port, "/metrics")[1], "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert metric(decode, "vllm:num_requests_waiting") == 0
    # The plugin's own: its one prefill graph (of --max-model-len 1024) ran once, the 6 tokens padded to 1024.
    assert executions(p_port)["prefill_s1024"] == 1
    assert metric(prefill, 'vllm_neuron:num_batched_tokens_padding_sum{bucket_name="prefill_s1024"') == 1024 - 6


def test_the_proxy_streams_the_decodes_answer(cluster):
    p_port, _, _ = cluster.server("kv_producer", "0-1")
    d_port, _, _ = cluster.server("kv_consumer", "2-3")
    proxy = cluster.proxy([p_port], [d_port])
    status, text = post(proxy, "/v1/completions", {"model": "m", "prompt": "a b c", "max_tokens": 3, "stream": True})
    assert status == 200, text
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 4, text
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == " [cores [2, 3]] tok0 tok1 tok2"
    assert metric(get(d_port, "/metrics")[1], "vllm:nixl_bytes_transferred_sum") == 3 * TOKEN_BYTES


def test_timing_follows_the_stated_formula(cluster):
    """Prefill: CALL + TOKEN * p / 10; a decode step: TOKEN * (1 + (s - 1) / 8). A sleep lasts at
    least its time, so each sum is bounded below by the formula."""
    timing = {"NEURON_STANDIN_TOKEN_SECONDS": "0.02", "NEURON_STANDIN_CALL_SECONDS": "0.01"}
    p_port, _, _ = cluster.server("kv_producer", "0-1", **timing)
    d_port, _, _ = cluster.server("kv_consumer", "2-3", **timing)
    proxy = cluster.proxy([p_port], [d_port])
    status, text = post(proxy, "/v1/completions", {"model": "m", "prompt": " ".join(["w"] * 20), "max_tokens": 4})
    assert status == 200, text
    prefill, decode = get(p_port, "/metrics")[1], get(d_port, "/metrics")[1]
    assert metric(prefill, "vllm:time_to_first_token_seconds_sum") >= 0.01 + 0.02 * 20 / 10
    assert metric(decode, "vllm:inter_token_latency_seconds_sum") >= 3 * 0.02
    assert metric(decode, "vllm:request_time_per_output_token_seconds_sum") >= 0.02


def test_a_decode_request_without_kv_params_is_computed_locally_as_nixl_does(cluster):
    """NixlConnector reads KV only for a request whose params say do_remote_prefill with a remote
    engine, host and port; without them vLLM prefills the request itself, and nothing is read."""
    d_port, _, proc = cluster.server("kv_consumer", "2-3")
    status, text = post(d_port, "/v1/completions", {"prompt": "a b", "max_tokens": 2})
    assert status == 200, text
    status, text = post(d_port, "/v1/completions", {"prompt": "a b", "max_tokens": 2, "kv_transfer_params": {"do_remote_prefill": True}})
    assert status == 200, text
    metrics = get(d_port, "/metrics")[1]
    assert metric(metrics, "vllm:nixl_bytes_transferred_count") == 0
    assert metric(metrics, "vllm:prompt_tokens_total") == 4


def test_stale_params_and_a_prefill_gone_fail_the_request_and_only_it(cluster):
    """kv_load_failure_policy "fail" (vLLM's default): params read once already, and a prefill
    server that went away, fail the decode's request with an internal error; the proxy answers
    that request 502 and goes on serving."""
    p_port, _, prefill = cluster.server("kv_producer", "0-1")
    d_port, _, _ = cluster.server("kv_consumer", "2-3")
    proxy = cluster.proxy([p_port], [d_port])
    status, text = post(p_port, "/v1/completions", {"prompt": "a b c d", "max_tokens": 1,
                                                    "kv_transfer_params": {"do_remote_decode": True}})  # fmt: skip
    assert status == 200, text
    params = json.loads(text)["kv_transfer_params"]
    assert {"remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "remote_request_id"} <= set(params)
    asked = {"prompt": "a b c d", "max_tokens": 2, "kv_transfer_params": params}
    assert post(d_port, "/v1/completions", asked)[0] == 200
    status, text = post(d_port, "/v1/completions", asked)  # the same blocks again: released after the first read
    assert status == 500 and json.loads(text)["error"]["message"] == "Internal server error", text
    assert metric(get(d_port, "/metrics")[1], "vllm:nixl_num_failed_transfers_total") == 1
    assert post(proxy, "/v1/completions", {"prompt": "x y", "max_tokens": 2})[0] == 200
    fresh = json.loads(post(p_port, "/v1/completions", {"prompt": "a b c d", "max_tokens": 1,
                                                        "kv_transfer_params": {"do_remote_decode": True}})[1])  # fmt: skip
    prefill.send_signal(signal.SIGKILL)
    prefill.wait(timeout=SAFETY)
    status, text = post(d_port, "/v1/completions", {**asked, "kv_transfer_params": fresh["kv_transfer_params"]})
    assert status == 500, text
    assert metric(get(d_port, "/metrics")[1], "vllm:nixl_num_failed_transfers_total") == 2
    status, text = post(proxy, "/v1/completions", {"prompt": "x y", "max_tokens": 2})
    assert status == 502 and "prefill server" in text, text
    assert get(proxy, "/healthcheck")[0] == 200


def test_recompute_policy_serves_locally_when_the_read_fails(cluster):
    d_port, _, _ = cluster.server("kv_consumer", "2-3", config=kv_config("kv_consumer", kv_load_failure_policy="recompute"))
    params = {"do_remote_prefill": True, "remote_engine_id": "gone", "remote_block_ids": [0], "remote_host": "127.0.0.1",
              "remote_port": free_port(), "remote_request_id": "r"}  # fmt: skip
    status, text = post(d_port, "/v1/completions", {"prompt": "a", "max_tokens": 1, "kv_transfer_params": params})
    assert status == 200, text


def run(tmp_path: Path, image: str, *argv: str) -> subprocess.CompletedProcess:
    env = environment(tmp_path, image, "0-1", free_port())
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=SAFETY)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ('{"kv_connector": "NixlConnector", "kv_role": "kv_sender"}',
         "kv_role\n  Input should be 'kv_producer', 'kv_consumer' or 'kv_both' [type=literal_error, input_value='kv_sender'"),
        ('{"kv_connector": "NixlConnector"}', "Value error, Please specify kv_disagg_role when kv_connector is set"),
        ('{"kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_load_failure_policy": "retry"}',
         "Input should be 'recompute' or 'fail' [type=literal_error"),
        ("{not json", "Invalid JSON"),
    ],
)  # fmt: skip
def test_a_bad_kv_transfer_config_is_refused_as_vllms_parser_refuses_it(tmp_path, config, said):
    model = checkpoint(tmp_path / "model")
    done = run(tmp_path, PLUGIN, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--kv-transfer-config", config)
    assert done.returncode == 2, done.stderr
    assert "error: argument --kv-transfer-config: 1 validation error for KVTransferConfig" in done.stderr and said in done.stderr, (
        done.stderr
    )


@pytest.mark.parametrize(
    ("image", "connector", "said"),
    [
        (PLUGIN, {"kv_connector": "P2pNcclConnector"}, "Unsupported connector type: P2pNcclConnector"),
        (PLUGIN, {"kv_connector": "NoSuchConnector"}, "Unsupported connector type: NoSuchConnector"),
        (NXDI, {"kv_connector": "NixlConnector"}, "Unsupported connector type: NixlConnector"),
        (PLUGIN, {"kv_connector": "NixlConnector", "kv_buffer_device": "xpu"}, "neuron with xpu kv_buffer is not supported."),
    ],
)
def test_a_connector_the_plugin_does_not_transfer_with_is_refused_at_start(tmp_path, image, connector, said):
    model = checkpoint(tmp_path / "model")
    config = json.dumps({**connector, "kv_role": "kv_producer"})
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--tensor-parallel-size", "2",
            "--block-size", "32", "--kv-transfer-config", config)  # fmt: skip
    done = run(tmp_path, image, *argv)
    assert done.returncode == 1 and f"ValueError: {said}" in done.stderr, done.stderr


def test_another_engines_id_is_refused_as_nixls_handshake_refuses_it(cluster):
    p_port, _, _ = cluster.server("kv_producer", "0-1")
    d_port, _, decode = cluster.server("kv_consumer", "2-3")
    status, text = post(p_port, "/v1/completions", {"prompt": "a b", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
    params = {**json.loads(text)["kv_transfer_params"], "remote_engine_id": "another-engine"}
    status, text = post(d_port, "/v1/completions", {"prompt": "a b", "max_tokens": 1, "kv_transfer_params": params})
    assert status == 500, text
    decode.send_signal(signal.SIGTERM)
    _, err = decode.communicate(timeout=SAFETY)
    assert "Remote NIXL agent engine ID mismatch. Expected another-engine" in err, err


def test_a_side_channel_port_already_taken_stops_the_server(tmp_path):
    model = checkpoint(tmp_path / "model")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        env = environment(tmp_path, PLUGIN, "0-1", taken.getsockname()[1])
        argv = [*server_argv(model, free_port(), kv_config("kv_producer"))]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=SAFETY)
    assert done.returncode == 1 and "the NIXL side channel cannot listen on 127.0.0.1" in done.stderr, done.stderr


def test_data_parallel_ranks_each_take_a_tp_group_and_their_own_sequences(cluster):
    """--data-parallel-size 2 with --tensor-parallel-size 2 on 4 visible cores: two TP groups of
    consecutive cores (the plugin's data-parallelism design page), each a replica of the model with
    its own --max-num-seqs and its own KV cache, so the server runs twice one rank's sequences."""
    import threading

    port, _, _ = cluster.server("kv_consumer", "0-3", "--data-parallel-size", "2", "--max-num-seqs", "1",
                                NEURON_STANDIN_TOKEN_SECONDS="0.1")  # fmt: skip
    described = json.loads(get(port, "/standin")[1])
    assert described["dataParallel"] == {"size": 2, "groups": [[0, 1], [2, 3]]}
    assert described["kvCache"] is not None
    assert len(described["kvCacheRanks"]) == 2 and described["kvCacheRanks"][0] == described["kvCacheRanks"][1]
    answers: list[tuple[int, str]] = []
    calls = [threading.Thread(target=lambda: answers.append(post(port, "/v1/completions", {"prompt": "a b", "max_tokens": 10})))
             for _ in range(2)]  # fmt: skip
    for call in calls:
        call.start()
    deadline, running = time.monotonic() + SAFETY, 0.0
    while running < 2 and time.monotonic() < deadline and any(c.is_alive() for c in calls):
        running = metric(get(port, "/metrics")[1], "vllm:num_requests_running")
    for call in calls:
        call.join(SAFETY)
    assert running == 2  # one sequence on each rank at once, none waiting
    assert sorted(json.loads(text)["choices"][0]["text"].split("]]")[0] for _, text in answers) == [" [cores [0, 1", " [cores [2, 3"]


def test_an_aggregated_server_opens_no_side_channel(cluster):
    """vLLM opens the NIXL side channel only with a NIXL connector (--kv-transfer-config): the
    plugin's aggregated server (NEURON_STANDIN_SCHEDULER=neuron, no connector) starts with
    VLLM_NIXL_SIDE_CHANNEL_PORT taken, as two such servers on one host would have it, and says
    nothing of a side channel."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = free_port()
        env = environment(cluster.tmp_path, PLUGIN, "0-1", taken.getsockname()[1], NEURON_STANDIN_SCHEDULER="neuron")
        argv = [arg for arg in server_argv(cluster.model, port, "") if arg not in ("--kv-transfer-config", "")]
        proc = cluster.start(argv, env, port)
        assert post(port, "/v1/completions", {"prompt": "a b", "max_tokens": 2})[0] == 200
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=SAFETY)
    assert "as an aggregated server" in out and "side channel" not in out, out


@pytest.mark.parametrize(("cores", "dp"), [("0-2", "2"), ("0-1", "2")])
def test_visible_cores_other_than_dp_times_tp_are_refused(tmp_path, cores, dp):
    model = checkpoint(tmp_path / "model")
    port = free_port()
    argv = server_argv(model, port, kv_config("kv_consumer"), "-dp", dp)
    done = subprocess.run(argv, env=environment(tmp_path, PLUGIN, cores, free_port()), capture_output=True, text=True, timeout=SAFETY)
    assert done.returncode != 0
    assert f"data parallel size {dp}" in done.stderr and "tensor parallel size 2" in done.stderr, done.stderr


def test_a_request_in_flight_is_answered_after_the_servers_sigterm(cluster):
    """As vLLM's server (uvicorn) on SIGTERM: it stops listening and finishes the requests in hand."""
    import threading

    port, _, proc = cluster.server("kv_consumer", "2-3", NEURON_STANDIN_TOKEN_SECONDS="0.1")
    answers: list[tuple[int, str]] = []
    call = threading.Thread(target=lambda: answers.append(post(port, "/v1/completions", {"prompt": "a b", "max_tokens": 10})))
    call.start()
    deadline = time.monotonic() + SAFETY
    while metric(get(port, "/metrics")[1], "vllm:num_requests_running") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    call.join(SAFETY)
    assert [status for status, _ in answers] == [200], answers
    assert proc.wait(SAFETY) == 0


def test_with_a_draft_the_servers_kv_blocks_are_the_plugins_target_and_draft_layers(cluster):
    """With --speculative-config the plugin's cache spans "all layers (target + draft)": the
    disaggregated server sizes its blocks as the plugin does, so a block held by a prefill is one
    of budget // (32 tokens x 2 x (4 + 1) layers x 1 KV head a core x 64 x 2 bytes)."""
    draft = cluster.tmp_path / "draft"
    draft.mkdir()
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"], "torch_dtype": "bfloat16",
              "num_hidden_layers": 1, "num_key_value_heads": 2, "num_attention_heads": 8, "hidden_size": 512,
              "_standin_parameters": 10_000_000}  # fmt: skip
    (draft / "config.json").write_text(json.dumps(config))
    (draft / "model.safetensors").write_bytes(b"")
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
    port, _, _ = cluster.server("kv_producer", "0-1", "--speculative-config", spec)
    budget = json.loads(get(port, "/standin")[1])["kvCache"]["kvBudgetBytes"]
    status, text = post(port, "/v1/completions", {"prompt": "a b c d", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 200, text
    assert metric(get(port, "/metrics")[1], "vllm:kv_cache_usage_perc") == 1 / (budget // (32 * 2 * 5 * 1 * 64 * 2))


# -- the NeuronScheduler's prefill/decode separation ---------------------------------------------


def stream_times(port: int, body: dict, times: list[float]) -> None:
    """The monotonic time each streamed token's event arrived at, appended to ``times`` as it comes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SAFETY)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}).encode(),
                     headers={"Content-Type": "application/json"})  # fmt: skip
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()
        for line in iter(answer.readline, b""):
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                times.append(time.monotonic())
    finally:
        conn.close()


def longest_gap_while_a_long_prompt_arrives(port: int, long_prompt_port: int) -> float:
    """A long answer streams from ``port``; after its fifth token a 500-token prompt is sent to
    ``long_prompt_port``. The longest gap between the answer's tokens, in seconds."""
    import threading

    times: list[float] = []
    answer = threading.Thread(target=stream_times, args=(port, {"prompt": "a", "max_tokens": 40}, times))
    answer.start()
    deadline = time.monotonic() + SAFETY
    while len(times) < 5:  # the answer's decode steps under way
        assert time.monotonic() < deadline and answer.is_alive()
        time.sleep(0.01)
    status, text = post(long_prompt_port, "/v1/completions", {"prompt": " ".join(["w"] * 500), "max_tokens": 1})
    assert status == 200, text
    answer.join(SAFETY)
    assert len(times) == 40
    return max(b - a for a, b in zip(times, times[1:], strict=False))


TIMED = {"NEURON_STANDIN_TOKEN_SECONDS": "0.02"}  # a 500-token prefill: 0.02 x 500 / 10 = 1 s


# Held to windows of a second or less (a token every 20 to 50 ms, a request that must arrive
# while an answer streams): with the other runs of make test on two cores, a starved thread
# misses them, so they run in the exclusive phase.
@pytest.mark.exclusive
def test_a_long_prefill_stalls_the_running_decodes_of_an_aggregated_server(cluster):
    """The plugin's NeuronScheduler runs a prefill alone, its decodes held back ("Decode requests
    are hidden during each prefill iteration"): in one server, a long prompt stops every running
    answer for the prefill's time."""
    port, side = free_port(), free_port()
    env = environment(cluster.tmp_path, PLUGIN, "0-1", side, NEURON_STANDIN_SCHEDULER="neuron", **TIMED)
    argv = [arg for arg in server_argv(cluster.model, port, "") if arg not in ("--kv-transfer-config", "")]
    cluster.start(argv, env, port)
    assert json.loads(get(port, "/standin")[1])["kvRole"] is None
    # The prefill's 1 s and a decode step, less what the token before it took to reach the client.
    assert longest_gap_while_a_long_prompt_arrives(port, port) >= 0.9


@pytest.mark.exclusive
def test_a_long_prefill_does_not_stall_the_decode_servers_answers(cluster):
    """Disaggregated, the same long prompt is prefilled on the prefill server: the decode server
    only reads its KV and runs its one token in a decode step, so no gap near the prefill's time."""
    p_port, _, _ = cluster.server("kv_producer", "0-1", **TIMED)
    d_port, _, _ = cluster.server("kv_consumer", "2-3", **TIMED)
    proxy = cluster.proxy([p_port], [d_port])
    assert longest_gap_while_a_long_prompt_arrives(d_port, proxy) < 0.5


def executions(port: int) -> dict[str, int]:
    """vllm_neuron:neff_execution_count by bucket_name."""
    text = get(port, "/metrics")[1]
    return {
        b: int(float(n)) for b, n in re.findall(r'^vllm_neuron:neff_execution_count_total{bucket_name="([^"]+)",[^}]*} (\S+)$', text, re.M)
    }


@pytest.mark.exclusive
def test_a_decode_servers_arrival_runs_one_decode_step_alone(cluster):
    """vLLM recomputes the last prompt token of a request whose KV it read, which the plugin's
    scheduler classifies as a prefill, run alone; the DI design page has a decode server run only
    decode batches. The stand-in runs the arrival's first iteration alone, on the decode graph
    (a decode step of one sequence): an answer running there makes no token in it. Here an answer of 30 tokens (a
    local prefill, then 29 steps) and an arrival of one token in the middle are 31 iterations,
    none of them with both."""
    p_port, _, _ = cluster.server("kv_producer", "0-1")
    d_port, _, _ = cluster.server("kv_consumer", "2-3", NEURON_STANDIN_TOKEN_SECONDS="0.05")
    times: list[float] = []
    answer = threading.Thread(target=stream_times, args=(d_port, {"prompt": "a", "max_tokens": 30}, times))
    answer.start()
    deadline = time.monotonic() + SAFETY
    while len(times) < 5:
        assert time.monotonic() < deadline and answer.is_alive()
        time.sleep(0.01)
    status, text = post(p_port, "/v1/completions", {"prompt": "a b", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 200, text
    status, text = post(
        d_port, "/v1/completions", {"prompt": "a b", "max_tokens": 1, "kv_transfer_params": json.loads(text)["kv_transfer_params"]}
    )
    assert status == 200, text
    assert len(times) < 30  # the arrival ran while the answer was running
    answer.join(SAFETY)
    assert len(times) == 30
    # 31 iterations: the answer's prefill and 29 steps, and the arrival's step, each decode step of
    # one sequence, its batch padded by 3 lines to the decode graph's --max-num-seqs 4.
    assert executions(d_port) == {"prefill_s1024": 1, "decode_b4": 30}
    padded = get(d_port, "/metrics")[1]
    assert metric(padded, 'vllm_neuron:num_seqs_padding_count{bucket_name="decode_b4"') == 30
    assert metric(padded, 'vllm_neuron:num_seqs_padding_sum{bucket_name="decode_b4"') == 30 * 3


def test_prefills_on_one_engine_run_one_at_a_time(cluster):
    """ "Prefill requests are processed sequentially (FIFO order)": two 250-token prompts sent at
    once to one prefill server take two prefills' time (0.5 s each), not one."""
    import threading

    p_port, _, _ = cluster.server("kv_producer", "0-1", **TIMED)
    began, answers = time.monotonic(), []
    body = {"prompt": " ".join(["w"] * 250), "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    calls = [threading.Thread(target=lambda: answers.append(post(p_port, "/v1/completions", body))) for _ in range(2)]
    for call in calls:
        call.start()
    for call in calls:
        call.join(SAFETY)
    assert [status for status, _ in answers] == [200, 200], answers
    assert time.monotonic() - began >= 1.0


# -- the scheduler's gauges ------------------------------------------------------------------------


def gauges(port: int) -> tuple[float, float]:
    text = get(port, "/metrics")[1]
    return metric(text, "vllm:num_requests_running"), metric(text, "vllm:num_requests_waiting")


@pytest.mark.exclusive
def test_prompts_queued_behind_the_prefill_in_progress_are_waiting_not_running(cluster):
    """vLLM's gauges are its scheduler's queues (make_stats: len(self.running), len(self.waiting)),
    and the plugin's NeuronScheduler admits one prefill an iteration, draining the others back to
    waiting: four 500-token prompts in a prefill server with --max-num-seqs 4 are one running (its
    prefill, 1 s) and three waiting, not four running."""
    p_port, _, _ = cluster.server("kv_producer", "0-1", **TIMED)
    body = {"prompt": " ".join(["w"] * 500), "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    answers: list[tuple[int, str]] = []
    calls = [threading.Thread(target=lambda: answers.append(post(p_port, "/v1/completions", body))) for _ in range(4)]
    for call in calls:
        call.start()
    deadline, seen = time.monotonic() + SAFETY, (0.0, 0.0)
    while sum(seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
        seen = gauges(p_port)
    for call in calls:
        call.join(SAFETY)
    assert seen == (1, 3)
    assert [status for status, _ in answers] == [200] * 4, answers
    assert gauges(p_port) == (0, 0)


class SilentSideChannel:
    """A prefill's side channel that takes the decode's connection and answers nothing until it is
    closed, so that the decode's KV read stays in progress."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.conns.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.server.close()

    def params(self, request: str) -> dict:
        return {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [0], "remote_host": "127.0.0.1",
                "remote_port": self.port, "remote_request_id": request}  # fmt: skip


def test_requests_reading_their_kv_are_waiting_on_every_dp_rank(cluster):
    """A decode server's request waits in WAITING_FOR_REMOTE_KVS while its KV is read, which vLLM
    counts in vllm:num_requests_waiting (its waiting queue), not running; with two DP ranks the
    gauges are both ranks' schedulers summed."""
    port, _, _ = cluster.server("kv_consumer", "0-3", "--data-parallel-size", "2")
    side = SilentSideChannel()
    answers: list[tuple[int, str]] = []
    calls = [threading.Thread(target=lambda r=r: answers.append(post(port, "/v1/completions", {
        "prompt": "a b", "max_tokens": 2, "kv_transfer_params": side.params(r)}))) for r in ("r0", "r1")]  # fmt: skip
    for call in calls:
        call.start()
    try:
        deadline, seen = time.monotonic() + SAFETY, (0.0, 0.0)
        while sum(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
            seen = gauges(port)
        assert seen == (0, 2)
    finally:
        side.close()  # the reads fail, and so do their requests (kv_load_failure_policy "fail")
        for call in calls:
            call.join(SAFETY)
    assert sorted(status for status, _ in answers) == [500, 500], answers
    assert gauges(port) == (0, 0)


PLUGIN_METRICS = {
    "vllm_neuron:startup_time_seconds": "gauge", "vllm_neuron:model_load_time_seconds": "gauge",
    "vllm_neuron:model_load_size_bytes": "gauge", "vllm_neuron:compilation_time_seconds": "gauge",
    "vllm_neuron:neff_execution_count": "counter", "vllm_neuron:num_seqs_padding": "histogram",
    "vllm_neuron:num_batched_tokens_padding": "histogram",
}  # fmt: skip


@pytest.mark.parametrize("connector", [True, False], ids=["prefill server", "aggregated server"])
def test_a_plugin_server_reports_the_plugins_own_metrics(cluster, connector):
    """The seven vllm_neuron: metrics of the plugin's metrics design page, each with its type and
    model_name, on a prefill server (vllm_disagg) and on an aggregated one (neuron_standin.serve):
    the start's, from the moment the server answers, and each graph's executions and padding."""
    if connector:
        port, _, _ = cluster.server("kv_producer", "0-1")
    else:
        port = free_port()
        argv = [a for a in server_argv(cluster.model, port, "{}") if a not in ("--kv-transfer-config", "{}")]
        cluster.start(argv, environment(cluster.tmp_path, PLUGIN, "2-3", free_port()), port)
    started = get(port, "/metrics")[1]
    assert metric(started, "vllm_neuron:startup_time_seconds") > 0
    assert metric(started, "vllm_neuron:model_load_size_bytes") == 100_000_000 * 2  # the checkpoint's parameters, bfloat16
    assert metric(started, "vllm_neuron:model_load_time_seconds") >= 0
    compiled = dict(re.findall(r'^vllm_neuron:compilation_time_seconds{bucket_name="([^"]+)",[^}]*} (\S+)$', started, re.M))
    assert set(compiled) == {"prefill_s1024", "decode_b4"}, started
    status, text = post(port, "/v1/completions", {"model": "m", "prompt": "a b c", "max_tokens": 1})
    assert status == 200, text
    served = get(port, "/metrics")[1]
    assert executions(port)["prefill_s1024"] == 1
    assert metric(served, 'vllm_neuron:num_batched_tokens_padding_sum{bucket_name="prefill_s1024"') == 1024 - 3
    for name, kind in PLUGIN_METRICS.items():
        assert f"# TYPE {name} {kind}\n" in served, name
        samples = re.findall(rf"^{re.escape(name)}(?:_total|_bucket|_count|_sum)?{{([^}}]*)}} ", served, re.M)
        assert samples and all('model_name="' in labels for labels in samples), (name, samples)


def test_vllm_on_nxd_inference_reports_none_of_the_plugins_metrics(cluster):
    """The vllm_neuron: metrics are the plugin's (trn2, trn3); vLLM on NxD Inference has none."""
    port = free_port()
    argv = [a for a in server_argv(cluster.model, port, "{}") if a not in ("--kv-transfer-config", "{}", "--data-parallel-size", "1",
                                                                              "--no-disable-hybrid-kv-cache-manager")]  # fmt: skip
    env = environment(cluster.tmp_path, NXDI, "0-1", free_port(), NEURON_STANDIN_PLATFORM="inf2")
    cluster.start(argv, env, port)
    text = get(port, "/metrics")[1]
    assert "vllm:num_requests_running" in text and "vllm_neuron:" not in text


def test_a_decode_narrower_than_its_prefill_fails_the_read_as_nixl_does(cluster):
    """vLLM's NixlConnector, meeting a prefill's agent, takes tp_ratio = divide(decode TP, prefill
    TP), which asserts that it divides ("Decode TP cannot be smaller than prefill TP" follows): a
    TP 1 decode cannot read a TP 2 prefill's KV, and the request fails (kv_load_failure_policy
    "fail"); a TP 2 decode reads a TP 1 prefill's, the DI design page's direction."""
    p_port, _, p_proc = cluster.server("kv_producer", "0-1")
    d_port, _, d_proc = cluster.server("kv_consumer", "2", "--tensor-parallel-size", "1")
    status, text = post(cluster.proxy([p_port], [d_port]), "/v1/completions", {"model": "m", "prompt": "a b c", "max_tokens": 2})
    assert status == 502 and "answered 500" in text, text  # the proxy's answer to the decode's failure
    assert metric(get(d_port, "/metrics")[1], "vllm:nixl_num_failed_transfers_total") == 1
    for proc in (p_proc, d_proc):  # their cores, for the pair the other way round
        proc.kill()
    assert "AssertionError: 1 is not divisible by 2" in d_proc.communicate(timeout=SAFETY)[1]
    p_proc.communicate(timeout=SAFETY)
    narrow, _, _ = cluster.server("kv_producer", "2", "--tensor-parallel-size", "1")
    wide, _, _ = cluster.server("kv_consumer", "0-1")
    status, text = post(cluster.proxy([narrow], [wide]), "/v1/completions", {"model": "m", "prompt": "a b c", "max_tokens": 2})
    assert status == 200, text
