"""Stand-in of the Neuron runtime's root communicator, for a model whose ranks span nodes.

What it keeps of the real thing (vLLM's multi-node example for Neuron, vllm-project/vllm
examples/neuron/multi_node: launch_script.py and worker.py; NxD Inference's "Multi-node
inference" guide, aws-neuron/neuronx-distributed-inference examples/multi_node.md):

- every rank's process reads ``NEURON_RT_ROOT_COMM_ID`` (``<rank 0's address>:<port>``) and
  ``NEURON_RANK_ID`` (its node's rank), and ``--override-neuron-config`` gives ``world_size``,
  ``local_ranks_size`` (the ranks of one node) and ``start_rank_id`` (its node's first rank);
- rank 0 starts the root communicator at that address, and no rank's engine is built until
  every node's ranks have joined it: vLLM's server answers nothing before then;
- a rank lost afterwards fails the collectives of every other: the next step fails, and the
  engine with it.

How the ranks talk to each other here is this stand-in's own (lines of JSON over TCP); the
operator depends on none of it, only on the variables and flags above.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

# How long a rank waits for the others: the whole group starts together, but a pod may wait
# for a node, a pull or the leader's address to be published.
JOIN_SECONDS = float(os.environ.get("NEURON_STANDIN_JOIN_SECONDS", "600"))


HELLO_SECONDS = 30


class CollectiveError(RuntimeError):
    pass


def multi_node_config(override: dict | None) -> dict | None:
    """The ranks' layout when vLLM runs across nodes (ENABLE_NEURON_MULTI_NODE=true, as its
    launcher sets), else None."""
    if os.environ.get("ENABLE_NEURON_MULTI_NODE") != "true":
        return None
    override = override or {}
    missing = [k for k in ("world_size", "local_ranks_size", "start_rank_id") if k not in override]
    if missing:
        raise CollectiveError(f"--override-neuron-config has no {', '.join(missing)}: a multi-node rank needs its layout")
    root = os.environ.get("NEURON_RT_ROOT_COMM_ID", "")
    host, _, port = root.rpartition(":")
    if not host or not port.isdigit():
        raise CollectiveError(f"NEURON_RT_ROOT_COMM_ID is {root!r}: it must be <address>:<port> of rank 0")
    rank = os.environ.get("NEURON_RANK_ID", "")
    if not rank.isdigit():
        raise CollectiveError(f"NEURON_RANK_ID is {rank!r}: every node's process needs its rank")
    world, local, start = (int(override[k]) for k in ("world_size", "local_ranks_size", "start_rank_id"))
    if world % local or start != int(rank) * local:
        raise CollectiveError(f"world_size {world}, local_ranks_size {local} and start_rank_id {start} do not fit node rank {rank}")
    return {"host": host, "port": int(port), "node_rank": int(rank), "nodes": world // local,
            "world_size": world, "local_ranks_size": local, "start_rank_id": start}  # fmt: skip


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _receive(reader) -> dict:
    line = reader.readline()
    if not line:
        raise CollectiveError("a rank's connection to the root communicator closed")
    return json.loads(line)


class RootCommunicator:
    """Rank 0's side: waits for every other node's ranks, then drives them one step at a time."""

    def __init__(self, layout: dict, me: dict) -> None:
        self.layout = layout
        self.me = me
        self.peers: list[tuple[socket.socket, object, dict]] = []
        self.lock = threading.Lock()
        self.steps = 0

    def gather(self) -> None:
        server = socket.create_server(("0.0.0.0", self.layout["port"]))
        server.settimeout(JOIN_SECONDS)
        try:
            while len(self.peers) < self.layout["nodes"] - 1:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    raise CollectiveError(
                        f"{len(self.peers) + 1} of {self.layout['nodes']} nodes joined the root communicator in {JOIN_SECONDS:.0f} s"
                    ) from None
                conn.settimeout(HELLO_SECONDS)  # a peer that connects and says nothing holds no one up
                reader = conn.makefile("rb")
                try:
                    hello = _receive(reader)
                except (OSError, ValueError, CollectiveError):
                    conn.close()
                    continue
                conn.settimeout(None)
                if hello.get("world_size") != self.layout["world_size"] or hello.get("local_ranks_size") != self.layout["local_ranks_size"]:
                    _send(
                        conn,
                        {
                            "error": f"rank 0 runs world_size {self.layout['world_size']}, local_ranks_size {self.layout['local_ranks_size']}"
                        },
                    )
                    conn.close()
                    continue
                _send(conn, {"joined": True})
                self.peers.append((conn, reader, hello))
        finally:
            server.close()
        print(f"root communicator: {self.layout['world_size']} ranks on {self.layout['nodes']} nodes joined", flush=True)

    def step(self) -> list[dict]:
        """One step of the model on every rank: what each node says it ran, rank 0's first."""
        with self.lock:
            self.steps += 1
            done = [{"node_rank": 0, "host": self.me["host"], "cores": self.me["cores"]}]
            for conn, reader, hello in self.peers:
                try:
                    _send(conn, {"step": self.steps})
                    answer = _receive(reader)
                except (OSError, ValueError, CollectiveError) as exc:
                    raise CollectiveError(f"node rank {hello['node_rank']} ({hello['host']}) failed step {self.steps}: {exc}") from exc
                done.append({"node_rank": hello["node_rank"], "host": answer["host"], "cores": answer["cores"]})
            return done

    def describe(self) -> dict:
        return {**self.layout, "peers": [h for _, _, h in self.peers], "steps": self.steps}


class RankWorker:
    """Another node's side: joins rank 0's root communicator, then runs each step it is sent."""

    def __init__(self, layout: dict, me: dict) -> None:
        self.layout = layout
        self.me = me
        deadline = time.monotonic() + JOIN_SECONDS
        while True:
            try:
                self.conn = socket.create_connection((layout["host"], layout["port"]), timeout=5)
                break
            except OSError as exc:  # not resolvable yet, or rank 0 not listening yet
                if time.monotonic() > deadline:
                    raise CollectiveError(f"cannot reach the root communicator at {layout['host']}:{layout['port']}: {exc}") from exc
                time.sleep(1)
        self.conn.settimeout(None)
        self.reader = self.conn.makefile("rb")
        _send(self.conn, {**{k: layout[k] for k in ("node_rank", "world_size", "local_ranks_size", "start_rank_id")}, **me})
        answer = _receive(self.reader)
        if "error" in answer:
            raise CollectiveError(answer["error"])
        print(f"node rank {layout['node_rank']} joined the root communicator at {layout['host']}:{layout['port']}", flush=True)

    def run_step(self) -> int:
        order = _receive(self.reader)
        _send(self.conn, {"step": order["step"], "host": self.me["host"], "cores": self.me["cores"]})
        return order["step"]


def fatal(exc: Exception) -> None:
    print(f"ERROR  NRT:nccl_net  {exc}", file=sys.stderr, flush=True)
