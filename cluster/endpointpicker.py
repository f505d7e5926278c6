"""The Gateway API Inference Extension's endpoint picker, run as a gateway would use it.

The picker (``epp``, built by build.sh from the Extension's Go module) is started here as a
process on loopback, with the kubeconfig of the local cluster: it watches one InferencePool and
the pods it selects, and scrapes each endpoint's metrics, as it does in a pod. ``pick`` then
drives it through Envoy's ext_proc API (``envoy.service.ext_proc.v3.ExternalProcessor/Process``)
the way a gateway's data plane does: the request's headers, then its body with end_of_stream,
and reads the endpoint it chose from the ``x-gateway-destination-endpoint`` header it sets
(the Extension's endpoint picker protocol; ``pkg/epp/metadata/consts.go`` and
``pkg/epp/handlers/server.go`` in v1.1.0). No gateway data plane runs here: this module is the
part of one that talks to the picker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ports import free_port

DESTINATION_HEADER = "x-gateway-destination-endpoint"


class EndpointPicker:
    def __init__(self, bins: Path, kubeconfig: Path, pool: str, namespace: str, log: Path, config: str) -> None:
        self.bins, self.kubeconfig, self.pool, self.namespace, self.log, self.config = bins, kubeconfig, pool, namespace, log, config
        self.port, self.health_port, self.metrics_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [
            str(self.bins / "epp"),
            "--pool-name", self.pool, "--pool-namespace", self.namespace,
            "--grpc-port", str(self.port), "--grpc-health-port", str(self.health_port), "--metrics-port", str(self.metrics_port),
            # Plain gRPC on loopback: the ext_proc stream a gateway would open, without its TLS.
            "--secure-serving=false",
            "--total-queued-requests-metric", "vllm:num_requests_waiting",
            "--config-text", self.config,
            "--metrics-endpoint-auth=false", "--tracing=false", "--enable-pprof=false",
        ]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "NAMESPACE": self.namespace}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def pick(self, body: dict[str, Any], path: str = "/v1/completions", timeout: float = 5.0) -> str | None:
        """The endpoint ("ip:port") the picker chooses for a request with ``body``, or None when it
        answers without one (an immediate response: its refusal)."""
        import grpc

        # Envoy's ext_proc stubs (the xds-protos package), installed apart by `make venv`, last on
        # the path: the package also ships a top-level cel module that must not shadow CEL's.
        stubs = str(Path(sys.prefix) / "xds-protos")
        if stubs not in sys.path:
            sys.path.append(stubs)
        from envoy.config.core.v3 import base_pb2
        from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

        def requests() -> Iterator[Any]:
            headers = [(":method", "POST"), (":path", path), (":authority", "gateway"), ("content-type", "application/json")]
            yield ext_proc.ProcessingRequest(
                request_headers=ext_proc.HttpHeaders(
                    headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers]),
                    end_of_stream=False,
                )
            )
            yield ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=json.dumps(body).encode(), end_of_stream=True))

        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = ext_proc_grpc.ExternalProcessorStub(channel)
            for response in stub.Process(requests(), timeout=timeout):
                if response.HasField("immediate_response"):
                    return None
                if response.HasField("request_headers"):
                    for option in response.request_headers.response.header_mutation.set_headers:
                        if option.header.key == DESTINATION_HEADER:
                            return (option.header.raw_value or option.header.value.encode()).decode()
        return None

    def wait_ready(self, body: dict[str, Any], timeout: float = 60.0) -> str:
        """Asks until the picker names an endpoint (it has read its pool, its pods and their metrics)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the endpoint picker exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                picked = self.pick(body, timeout=2.0)
                if picked:
                    return picked
            except Exception as exc:  # noqa: BLE001 - not listening yet, or no endpoint yet: ask again
                last = exc
            time.sleep(0.5)
        raise TimeoutError(f"the endpoint picker named no endpoint in {timeout} s ({last}): {self.log.read_text()[-2000:]}")
