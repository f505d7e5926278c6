"""cluster/benchmark_disaggregated.py's machinery at a tiny size, so that it cannot rot: both arms
start as the operator renders them, answer the same load, and the table and verdicts print."""

from __future__ import annotations

import argparse
import re

import pytest

import benchmark_disaggregated as bench


def test_the_load_is_seeded_and_mixes_both_kinds():
    load = bench.workload(7, 4.0, 5.0)
    assert load == bench.workload(7, 4.0, 5.0) and load != bench.workload(8, 4.0, 5.0)
    assert {(r.prompt, r.max_tokens) for r in load} == {bench.LONG_PROMPT, bench.LONG_ANSWER}
    assert all(0 < a.at < b.at < 5.0 for a, b in zip(load, load[1:], strict=False))


def test_the_aggregated_arm_has_the_pools_chips_in_replicas():
    name, spec = bench.sample()
    chips = bench.pool_chips(bench.model_of(name, spec), spec)
    assert chips == 3  # the sample: one prefill replica and two decode replicas, one chip each
    aggregated = bench.model_of("llama-8b", bench.aggregated_spec(spec, chips))
    (deployment,) = bench.deployments(aggregated).values()
    assert deployment["spec"]["replicas"] * aggregated.spec.compute.inf == chips
    assert "--kv-transfer-config" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_tiny_run_answers_on_both_arms_and_prints_the_table(capsys):
    assert bench.main(["--rate", "4", "--seconds", "1.5", "--token-seconds", "0.002", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    rows = {
        m.group(1): m.groups() for m in re.finditer(r"^\| (aggregated|disaggregated)[^|]*\| 3 \| (\d+) \| (\d+) \| (\d+) \|", out, re.M)
    }
    assert set(rows) == {"aggregated", "disaggregated"}, out
    requests = len(bench.workload(3, 4, 1.5))
    for arm, (_, sent, answered, failed) in rows.items():
        assert (int(sent), int(answered), int(failed)) == (requests, requests, 0), (arm, out)
    assert re.search(r"^TPOT p99, disaggregated / aggregated: \d+\.\d\dx \(goal at most 0\.5x\): (met|NOT met)$", out, re.M), out
    assert re.search(r"^TTFT p99, disaggregated / aggregated: \d+\.\d\dx \(goal at most 1\.2x\): (met|NOT met)$", out, re.M), out
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC, python cluster/benchmark_disaggregated\.py .*, commit \w+", out, re.M), out


def test_a_tiny_run_of_two_chip_replicas_answers_on_both_arms(capsys):
    argv = ["--rate", "4", "--seconds", "1", "--token-seconds", "0.002", "--seed", "3", "--pools", "1x2:1x2", "--aggregated-inf", "2"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    requests = len(bench.workload(3, 4, 1))
    assert re.search(rf"^\| aggregated, 2 replicas \(TP 8\) \| 4 \| {requests} \| {requests} \| 0 \|", out, re.M), out
    pools = rf"^\| disaggregated, 1 prefill \(TP 8\) \+ 1 decode \(TP 8\) \| 4 \| {requests} \| {requests} \| 0 \|"
    assert re.search(pools, out, re.M), out
    assert "--pools 1x2:1x2" in out and "--aggregated-inf 2" in out


def test_the_prompt_tokens_a_step_reach_the_timing_line_and_are_bounded(capsys):
    assert bench.main(["--rate", "4", "--seconds", "0.5", "--token-seconds", "0.002", "--prompt-tokens-per-step", "20"]) == 0
    out = capsys.readouterr().out
    assert "a prefill of p tokens 0.002 x p / 20 s" in out and "--prompt-tokens-per-step 20" in out
    with pytest.raises(SystemExit):
        bench.main(["--prompt-tokens-per-step", "0"])


def test_another_split_of_the_pools_keeps_the_chips_equal_on_both_arms():
    name, spec = bench.sample(bench.pools_split("2:1"))
    chips = bench.pool_chips(bench.model_of(name, spec), spec)
    assert chips == 3 and spec["disaggregation"]["prefill"]["replicas"] == 2 and spec["disaggregation"]["decode"]["replicas"] == 1
    assert bench.aggregated_spec(spec, chips)["replicas"] == 3
    assert bench.pools_split("2:1") == ((2, None), (1, None))
    for bad in ("2", "0:1", "2:x", "9:1", "1x0:1", "1x3:1", "1x:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="valid values are P:D"):
            bench.pools_split(bad)


def test_pools_of_two_chips_are_tensor_parallel_over_eight_cores_and_twice_as_fast():
    """--pools 2x2:1x2: two prefill replicas and a decode replica of two chips each (TP 8, as AWS's
    tutorial runs its prefill server); each server's times are the reference chip's over its
    share of the cores, the aggregated replicas' too."""
    assert bench.pools_split("2x2:1x2") == ((2, 2), (1, 2))
    name, spec = bench.sample(bench.pools_split("2x2:1x2"))
    model = bench.model_of(name, spec)
    assert bench.pool_chips(model, spec) == 6 and bench.aggregated_spec(spec, 6)["replicas"] == 6
    rendered = bench.deployments(model)
    prefill, decode = rendered[f"{name}-prefill"], rendered[f"{name}-decode"]
    assert bench.tensor_parallel(prefill) == 8 and bench.tensor_parallel(decode) == 8
    assert bench.scaled_token_seconds(0.02, prefill) == pytest.approx(0.01)
    wide = bench.model_of("llama-8b", bench.aggregated_spec(spec, 6, inf=2))
    (aggregated,) = bench.deployments(wide).values()
    assert aggregated["spec"]["replicas"] == 3 and bench.tensor_parallel(aggregated) == 8


def test_the_operator_refuses_a_decode_pool_narrower_than_the_prefill_and_so_does_the_benchmark():
    """A TP 8 prefill before a TP 4 decode fails every KV read (NixlConnector): refused."""
    with pytest.raises(Exception, match="Decode TP cannot be smaller than prefill TP"):
        bench.model_of(*bench.sample(bench.pools_split("1x2:1")))


def test_a_server_sees_all_its_replicas_cores_and_its_scaled_times(tmp_path):
    name, spec = bench.sample(bench.pools_split("1x2:1x2"))
    prefill = bench.deployments(bench.model_of(name, spec))[f"{name}-prefill"]
    env = bench.server_env(prefill, tmp_path, spec["serving"]["image"], 1, 2, bench.Timing(0.02, 5))
    assert env["NEURON_RT_VISIBLE_CORES"] == "4-11"
    assert float(env["NEURON_STANDIN_TOKEN_SECONDS"]) == pytest.approx(0.01)
    assert float(env["NEURON_STANDIN_PROMPT_TOKENS_PER_STEP"]) == 5
