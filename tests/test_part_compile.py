"""The compile part alone (core/compile/part.py): one compile per key, only what the
operator proved it made counts. tests/test_decide.py has the same rules through decide()."""

from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.compile.part import compile_part
from inferentia_operator.core.pod.artefact import compile_job_name, compiled_uri
from inferentia_operator.core.settings import DEFAULT_SETTINGS
from test_decide import SETTINGS, Observed, built, complete, live, model_body

COMPILED = {"compile.image": "example.com/compile:1"}


def test_without_a_compile_image_nothing_compiles_and_the_model_counts_as_compiled():
    body = model_body()
    part = compile_part(built(body), Observed(body), SETTINGS)
    assert part.children == () and part.compiled and part.facts.condition.reason == "CompiledAtLoad"


def test_a_new_key_is_one_job_and_the_model_is_not_compiled_until_it_completes():
    body = model_body(**COMPILED)
    m = built(body)
    part = compile_part(m, Observed(body), SETTINGS)
    assert [c["kind"] for c in part.children] == ["Job"] and not part.compiled
    assert (part.facts.job, part.facts.uri, part.facts.hit) == (compile_job_name(m), compiled_uri(m), False)
    done = compile_part(m, Observed(body, jobs=[complete(compile_job(m))]), SETTINGS)
    assert done.compiled and done.record is not None and done.record["data"]["uri"] == compiled_uri(m)


def test_a_completed_job_is_no_cache_hit_for_an_operator_without_the_key_that_proved_it():
    body = model_body(**COMPILED)
    m = built(body)
    job = complete(compile_job(m))  # proved with the tests' key, not DEFAULT_SETTINGS'
    part = compile_part(m, Observed(body, jobs=[job]), DEFAULT_SETTINGS)
    assert not part.compiled and part.record is None


def test_another_models_job_of_the_key_is_waited_for_not_started_again():
    body = model_body(**COMPILED)
    m = built(body)
    other = live(compile_job(m))
    other["metadata"]["ownerReferences"] = [{**other["metadata"]["ownerReferences"][0], "uid": "uid-other", "name": "other"}]
    uri = compiled_uri(m)
    part = compile_part(m, Observed(body, compile_jobs={uri: [other]}), SETTINGS)
    assert part.children == () and part.facts.condition.reason == "Compiling" and "of model other" in part.facts.condition.message


def compile_pod(job: dict, message: str, exit_code: int = 0) -> dict:
    """The projected pod of ``job`` whose compile step ended with ``message`` as its termination message."""
    from inferentia_operator.core.projection import project_pod

    return project_pod(
        {
            "metadata": {"name": "p", "namespace": "ns", "labels": {"batch.kubernetes.io/job-name": job["metadata"]["name"]}},
            "spec": {},
            "status": {
                "initContainerStatuses": [{"name": "compile", "state": {"terminated": {"exitCode": exit_code, "message": message}}}]
            },
        }
    )


def test_how_much_of_the_model_runs_on_neuron_reaches_the_record_and_the_status():
    """The compile program's termination message says what share of the model's operators
    neuron-cc compiled; the record keeps it for later cache hits, and below 100% the Compiled
    condition says the rest runs on the CPU (the Cortex docs' advice: near 100%)."""
    body = model_body(**COMPILED)
    m = built(body)
    job = complete(compile_job(m))
    part = compile_part(m, Observed(body, jobs=[job], pods=[compile_pod(job, '{"neuronPlacementPercent": 98.23}\n')]), SETTINGS)
    assert part.compiled and part.facts.on_neuron == 98.23
    assert part.record["data"]["neuronPlacementPercent"] == "98.23"
    assert "98.23% of the model's operators run on Neuron; the rest run on the CPU" in part.facts.condition.message
    # A later model of the key starts from the record, and knows it too.
    hit = compile_part(m, Observed(body, compile_records={compiled_uri(m): [live(part.record)]}), SETTINGS)
    assert hit.facts.hit and hit.facts.on_neuron == 98.23
    # All of it on Neuron: nothing to say in the condition.
    full = compile_part(m, Observed(body, jobs=[job], pods=[compile_pod(job, '{"neuronPlacementPercent": 100.0}')]), SETTINGS)
    assert full.facts.on_neuron == 100.0 and "CPU" not in full.facts.condition.message


def test_a_report_that_is_not_a_share_is_ignored():
    """The compile step runs the user's image: what it writes is bounded and checked, never trusted as is."""
    body = model_body(**COMPILED)
    m = built(body)
    job = complete(compile_job(m))
    for message in (
        "not json",
        '{"neuronPlacementPercent": 140}',
        '{"neuronPlacementPercent": "x"}',
        '{"neuronPlacementPercent": NaN}',
        "[]",
    ):
        part = compile_part(m, Observed(body, jobs=[job], pods=[compile_pod(job, message)]), SETTINGS)
        assert part.compiled and part.facts.on_neuron is None, message
        assert "neuronPlacementPercent" not in part.record["data"]


def test_a_compile_job_whose_pod_cannot_be_created_says_why_and_stalls():
    """Seen on the local cluster: a model whose serviceAccountName did not exist said
    Compiling while the Job's event said FailedCreate. The Job controller's event is the one
    place Kubernetes says it; status quotes it, for this Job (its uid) only."""
    from inferentia_operator.core import status

    body = model_body(**COMPILED)
    m = built(body)
    job = live(compile_job(m))
    said = 'pods "c-abc" is forbidden: error looking up service account ns/does-not-exist: serviceaccount "does-not-exist" not found'
    event = {"reason": "FailedCreate", "message": said, "uid": job["metadata"]["uid"]}
    part = compile_part(m, Observed(body, jobs=[job], job_events={job["metadata"]["name"]: [event]}), SETTINGS)
    condition = part.facts.condition
    assert (condition.status, condition.reason) == ("False", "FailedCreate")
    assert condition.message.startswith(f"Job {job['metadata']['name']} cannot create its pod: {said} (the Job keeps")
    conditions = {c.type: c for c in status.conditions(valid=True, invalid_message="", compiled=condition,
                                                       rollout=status.rollout_of(None, 1, None), pods=[])}  # fmt: skip
    assert (conditions["Ready"].reason, conditions["Stalled"].status, conditions["Progressing"].status) == ("FailedCreate", "True", "False")
    # An event of an earlier Job of that name (another uid), or a Job that has its pod: nothing to say.
    stale = {**event, "uid": "uid-of-a-deleted-job"}
    assert (
        compile_part(m, Observed(body, jobs=[job], job_events={job["metadata"]["name"]: [stale]}), SETTINGS).facts.condition.reason
        == "Compiling"
    )


def test_a_compile_pod_no_node_can_take_says_so_and_waits_for_capacity():
    from inferentia_operator.core import status
    from inferentia_operator.core.projection import project_pod

    body = model_body(**COMPILED)
    m = built(body)
    job = live(compile_job(m))
    said = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    pod = project_pod({
        "metadata": {"name": "p", "namespace": "ns", "labels": {"batch.kubernetes.io/job-name": job["metadata"]["name"]}},
        "spec": {},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}]},
    })  # fmt: skip
    condition = compile_part(m, Observed(body, jobs=[job], pods=[pod]), SETTINGS).facts.condition
    assert condition.reason == "Unschedulable"
    assert condition.message.startswith(f"Job {job['metadata']['name']} has a pod no node can take: {said} (the Job keeps")
    conditions = {c.type: c for c in status.conditions(valid=True, invalid_message="", compiled=condition,
                                                       rollout=status.rollout_of(None, 1, None), pods=[])}  # fmt: skip
    assert (conditions["Ready"].reason, conditions["Progressing"].reason, conditions["Stalled"].status) == (
        "Unschedulable", "WaitingForCapacity", "False")  # fmt: skip


def test_the_hub_commit_a_compile_read_reaches_the_record_and_the_status():
    """The compile step of a Hub model reports the commit it downloaded; the record keeps it, so
    a later model of the key (a cache hit) names it too, and status shows it once compiled.
    Anything but a 40-digit hexadecimal commit from the user's image is ignored."""
    body = model_body(**COMPILED)
    m = built(body)
    job = complete(compile_job(m))
    commit = "0123456789abcdef0123456789abcdef01234567"
    part = compile_part(m, Observed(body, jobs=[job], pods=[compile_pod(job, f'{{"hubRevision": "{commit}"}}\n')]), SETTINGS)
    assert part.compiled and part.facts.revision == commit and part.record["data"]["hubRevision"] == commit
    hit = compile_part(m, Observed(body, compile_records={compiled_uri(m): [live(part.record)]}), SETTINGS)
    assert hit.facts.hit and hit.facts.revision == commit
    running = compile_part(m, Observed(body, jobs=[compile_job(m)]), SETTINGS)
    assert not running.compiled and running.facts.revision is None
    for message in ('{"hubRevision": "main"}', '{"hubRevision": "' + commit.upper() + '"}', '{"hubRevision": 1}', "x"):
        part = compile_part(m, Observed(body, jobs=[job], pods=[compile_pod(job, message)]), SETTINGS)
        assert part.facts.revision is None and "hubRevision" not in part.record["data"], message
