"""The vLLM Neuron plugin's own metrics, beside vLLM's at the server's /metrics, as the plugin's
metrics design page lists them (aws-neuron/aws-neuron-sdk a3247f5b,
vllm-neuron/docs/design/vllm/metrics.md;
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/metrics.html):
"vLLM Neuron reports Neuron-specific metrics under the ``vllm_neuron:`` prefix", each labelled
``model_name`` ("Present on all metrics") and, where it concerns a compiled graph, ``bucket_name``
("a format similar to ``prefill_s1024``"):

- ``vllm_neuron:num_seqs_padding`` (histogram): "Number of padded batch lines processed by the
  model", by bucket;
- ``vllm_neuron:num_batched_tokens_padding`` (histogram): "Number of padded sequence lengths
  processed by the model", by bucket;
- ``vllm_neuron:neff_execution_count`` (counter): "Number of NEFF executions", by bucket;
- ``vllm_neuron:startup_time_seconds`` (gauge): "Total server startup time from worker spawn to ready";
- ``vllm_neuron:compilation_time_seconds`` (gauge): "Time spent compiling Neuron graphs (FX trace +
  neuronxcc compile). Includes compile cache hits", by bucket;
- ``vllm_neuron:model_load_time_seconds`` and ``vllm_neuron:model_load_size_bytes`` (gauges): the
  time, and the size, of the "model weights transferred to device (host to HBM transfer)".

Only the plugin (trn2, trn3) reports them; vLLM on NxD Inference does not. Each graph is a bucket,
and "Inputs padded to nearest bucket" (the configuration reference's num_batched_tokens_buckets,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/guides/reference-configuration.html).
The stand-in compiles one prefill graph at the model's length and one decode graph at
--max-num-seqs (neuron_standin.plugin_graphs), so its buckets are those two: a prefill of p
tokens runs the prefill bucket padded by its length less p, a decode step of s sequences the
decode bucket padded by --max-num-seqs less s. The real plugin compiles powers of two by default
and pads less; the names, types and labels are the page's, the values what the stand-in did.
The padding histograms' bucket bounds are the stand-in's (the page gives none)."""

from __future__ import annotations

import threading
import time

from standin_serving import Histogram

PADDING_BOUNDS = tuple(float(2**k) for k in range(0, 17))  # 1 to 65,536 padded tokens or lines


def prefill_bucket(tokens: int) -> str:
    return f"prefill_s{tokens}"


def decode_bucket(sequences: int) -> str:
    return f"decode_b{sequences}"


class PluginMetrics:
    """One server's vllm_neuron: metrics: its start (from ``began``, a time.monotonic() as the server
    process began), its graphs' compilation, its weights' load, and each execution of its prefill
    graph of ``prefill_tokens`` and decode graph of ``decode_sequences``."""

    def __init__(self, prefill_tokens: int, decode_sequences: int, began: float) -> None:
        self.prefill_tokens, self.decode_sequences, self.began = prefill_tokens, decode_sequences, began
        self.lock = threading.Lock()
        self.gauges: dict[str, float] = {}
        self.compilation: dict[str, float] = {}
        self.executions: dict[str, int] = {}
        self.seqs_padding: dict[str, Histogram] = {}
        self.tokens_padding: dict[str, Histogram] = {}

    def loaded(self, seconds: float, size: int) -> None:
        with self.lock:
            self.gauges["vllm_neuron:model_load_time_seconds"] = seconds
            self.gauges["vllm_neuron:model_load_size_bytes"] = size

    def compiled(self, bucket: str, seconds: float) -> None:
        with self.lock:
            self.compilation[bucket] = seconds

    def ready(self) -> None:
        """The server is ready: it answers from now on."""
        with self.lock:
            self.gauges["vllm_neuron:startup_time_seconds"] = time.monotonic() - self.began

    def prefill(self, tokens: int) -> None:
        """One prefill graph's execution over ``tokens`` prompt tokens (one batch line)."""
        self._executed(prefill_bucket(self.prefill_tokens), 0, max(self.prefill_tokens - tokens, 0))

    def decode(self, sequences: int) -> None:
        """One decode step of ``sequences`` sequences (a token each)."""
        self._executed(decode_bucket(self.decode_sequences), max(self.decode_sequences - sequences, 0), 0)

    def _executed(self, bucket: str, lines: int, tokens: int) -> None:
        with self.lock:
            self.executions[bucket] = self.executions.get(bucket, 0) + 1
            self.seqs_padding.setdefault(bucket, self._histogram("num_seqs_padding")).observe(lines)
            self.tokens_padding.setdefault(bucket, self._histogram("num_batched_tokens_padding")).observe(tokens)

    @staticmethod
    def _histogram(name: str) -> Histogram:
        what = "batch lines" if name == "num_seqs_padding" else "sequence lengths"
        return Histogram(f"vllm_neuron:{name}", f"Number of padded {what} processed by the model.", PADDING_BOUNDS)

    def text(self, label: str) -> str:
        """Prometheus's text format, each metric's HELP and TYPE once (``label``: model_name's)."""
        with self.lock:
            out = []
            for name, value in sorted(self.gauges.items()):
                out += [f"# TYPE {name} gauge", f"{name}{{{label}}} {value}"]
            if self.compilation:
                out += ["# TYPE vllm_neuron:compilation_time_seconds gauge"]
                out += [
                    f'vllm_neuron:compilation_time_seconds{{bucket_name="{b}",{label}}} {s}' for b, s in sorted(self.compilation.items())
                ]
            if self.executions:
                out += [
                    "# HELP vllm_neuron:neff_execution_count Number of NEFF executions.",
                    "# TYPE vllm_neuron:neff_execution_count counter",
                ]
                out += [
                    f'vllm_neuron:neff_execution_count_total{{bucket_name="{b}",{label}}} {n}' for b, n in sorted(self.executions.items())
                ]
            text = "\n".join(out) + "\n" if out else ""
            for histograms in (self.seqs_padding, self.tokens_padding):
                for i, (bucket, histogram) in enumerate(sorted(histograms.items())):
                    body = histogram.text(f'bucket_name="{bucket}",{label}')
                    text += body if i == 0 else "".join(line + "\n" for line in body.splitlines() if not line.startswith("#"))
        return text
