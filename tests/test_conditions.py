"""Status conditions from observed children: the rules kubectl wait, Argo CD and Flux rely on."""

from inferentia_operator.core import status as c
from inferentia_operator.core.compile.facts import compiled_condition
from inferentia_operator.core.observed import compile_failure


def deployment(*, hash_="h1", replicas=2, ready=2, updated=2, available=2, generation=3, observed=3, spec_replicas=2):
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": spec_replicas, "template": {"metadata": {"annotations": {"inferentia.dev/plan-hash": hash_}}}},
        "status": {
            "observedGeneration": observed, "replicas": replicas, "readyReplicas": ready,
            "updatedReplicas": updated, "availableReplicas": available,
            "conditions": [{"type": "Available", "status": "True" if available else "False"}],
        },
    }  # fmt: skip


def pod(scheduled=True, message=""):
    cond = {"type": "PodScheduled", "status": "True" if scheduled else "False", "reason": "Unschedulable", "message": message}
    return {"metadata": {}, "status": {"conditions": [cond]}}


COMPILED = c.cond("Compiled", "True", "Compiled", "done")


def by_type(conds):
    return {x.type: x for x in conds}


def test_ready_when_the_current_plan_is_fully_rolled_out():
    d = deployment()
    conds = by_type(c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=c.rollout_of(d, 2, "h1"), pods=[pod(), pod()]))
    assert (conds["Ready"].status, conds["Ready"].reason) == ("True", "Ready")
    assert conds["Progressing"].reason == "RolloutComplete"
    assert conds["Scheduled"].status == "True" and conds["Available"].status == "True"
    assert (conds["Reconciling"].status, conds["Stalled"].status) == ("False", "False")  # kstatus: Current


def test_not_ready_while_old_pods_remain_or_the_plan_is_old():
    for d, hash_ in [
        (deployment(replicas=3, updated=2), "h1"),  # an old pod is still there
        (deployment(), "h2"),  # the Deployment still has the previous plan
        (deployment(observed=2), "h1"),  # the Deployment controller has not seen the change
    ]:
        conds = by_type(c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=c.rollout_of(d, 2, hash_), pods=[]))
        assert (conds["Ready"].status, conds["Ready"].reason) == ("False", "RollingOut")
        assert conds["Progressing"].status == "True"
        assert conds["Reconciling"].status == "True"  # kstatus: InProgress


def test_unschedulable_pods_name_the_schedulers_reason():
    d = deployment(ready=1, available=1, updated=2)
    message = "0/6 nodes are available: 6 Insufficient aws.amazon.com/neuron."
    conds = by_type(
        c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=c.rollout_of(d, 2, "h1"), pods=[pod(), pod(False, message)])
    )
    assert (conds["Scheduled"].status, conds["Scheduled"].reason) == ("False", "Unschedulable")
    assert conds["Scheduled"].message == f"1 pod cannot be placed: {message}"
    assert conds["Ready"].reason == "Unschedulable"


def test_compile_states():
    job = lambda t, s, **kw: {"status": {"conditions": [{"type": t, "status": s, **kw}]}}  # noqa: E731
    assert compiled_condition(True, "j", job("Complete", "True"), "s3://out/").reason == "Compiled"
    failed = compiled_condition(True, "j", job("Failed", "True", reason="BackoffLimitExceeded", message="too many"), "u")
    assert (failed.status, failed.reason, failed.message) == ("False", "CompileFailed", "Job j failed: BackoffLimitExceeded: too many")
    assert compiled_condition(True, "j", None, "u").reason == "Compiling"
    assert compiled_condition(False, None, None, "u").status == "True"


def test_a_failed_compile_quotes_what_its_compile_step_said():
    """The compile step's termination message (FallbackToLogsOnError) reaches Compiled=False,
    from the Job's own pods only; a pod that failed and was retried counts by its last state."""
    from inferentia_operator.core.projection import project_pod

    def pod(job_name: str, exit_code: int, message: str) -> dict:
        return project_pod({
            "metadata": {"name": f"{job_name}-x", "namespace": "ns", "labels": {"batch.kubernetes.io/job-name": job_name}},
            "status": {"phase": "Failed", "initContainerStatuses": [
                {"name": "fetch-model", "state": {"terminated": {"exitCode": 0}}},
                {"name": "compile", "state": {"terminated": {"exitCode": exit_code, "message": message}}},
            ], "containerStatuses": [
                # Never ran after the compile step failed; kwok's simulated failure marks it failed all the same.
                {"name": "upload", "state": {"terminated": {"exitCode": exit_code, "message": "not the cause"}}},
            ]},
        })  # fmt: skip

    pods = [pod("other", 1, "not this one"), pod("j", 1, "line 1\nneuronx-cc failed: ERROR [NCC_EARG001] --lnc 2 is not supported")]
    failure = compile_failure("j", pods)
    assert failure.endswith("compile: line 1\nneuronx-cc failed: ERROR [NCC_EARG001] --lnc 2 is not supported")
    failed_job = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    failed = compiled_condition(True, "j", failed_job, "u", failure=failure)
    assert failed.message.startswith("Job j failed: BackoffLimitExceeded; compile: ") and "NCC_EARG001" in failed.message
    assert compile_failure("j", [pod("j", 0, "fine")]) == ""
    long = pod("j", 1, "x" * 5000)
    assert len(compile_failure("j", [long])) < 500  # the end of a long log, not all of it


def test_a_failed_compile_keeps_ready_false_and_stops_progressing():
    failed = c.cond("Compiled", "False", "CompileFailed", "Job j failed: x")
    d = deployment(hash_="old")
    conds = by_type(c.conditions(valid=True, invalid_message="", compiled=failed, rollout=c.rollout_of(d, 2, "new"), pods=[]))
    assert (conds["Ready"].reason, conds["Progressing"].status) == ("CompileFailed", "False")
    assert conds["Available"].status == "True"  # the previous Deployment keeps serving
    assert (conds["Stalled"].status, conds["Stalled"].reason) == ("True", "CompileFailed")  # kstatus: Failed


def test_invalid_spec():
    conds = by_type(c.conditions(valid=False, invalid_message="spec.x: bad", compiled=None, rollout=c.rollout_of(None, 1, None), pods=[]))
    assert (conds["Validated"].status, conds["Ready"].reason, conds["Ready"].message) == ("False", "InvalidSpec", "spec.x: bad")
    assert (conds["Stalled"].status, conds["Reconciling"].status) == ("True", "False")


def stored(conds):
    """Conditions as the API server stores them, which is what the next reconcile reads."""
    return [x.model_dump(by_alias=True, mode="json", exclude_none=True) for x in conds]


def test_transition_times_hold_while_status_holds():
    first = stored(c.stamped([c.cond("Ready", "False", "RollingOut")], [], 1, "T1"))
    same = stored(c.stamped([c.cond("Ready", "False", "Compiling")], first, 2, "T2"))
    assert same[0]["lastTransitionTime"] == "T1" and same[0]["observedGeneration"] == 2
    flipped = c.stamped([c.cond("Ready", "True", "Ready")], same, 2, "T3")
    assert flipped[0].last_transition_time == "T3"
    assert c.events(flipped, same) == [c.Event("Normal", "Ready", "Ready=True: ")]
    assert c.events(flipped, stored(flipped)) == []


def test_pods_the_replicaset_cannot_create_are_reported_never_available_with_zero_pods():
    d = deployment(replicas=0, ready=0, updated=0, available=0, spec_replicas=1)
    d["status"]["conditions"] = [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},  # within maxUnavailable 1
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
         "message": 'pods "m-1" is forbidden: violates PodSecurity "restricted:latest"'},
    ]  # fmt: skip
    conds = by_type(c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=c.rollout_of(d, 1, "h1"), pods=[]))
    assert (conds["Available"].status, conds["Available"].message) == ("False", "0 of 1 replicas available")
    assert (conds["Ready"].reason, conds["Stalled"].status) == ("FailedCreate", "True")
    assert "violates PodSecurity" in conds["Ready"].message


def test_events_tell_of_readiness_finished_compiles_and_problems_not_routine_steps():
    def cond(type_, status, reason):
        return c.cond(type_, status, reason, "m")

    before = [cond("Validated", "Unknown", "New"), cond("Scheduled", "Unknown", "Pending"), cond("Ready", "False", "RollingOut")]
    after = [cond("Validated", "True", "Valid"), cond("Scheduled", "True", "Scheduled"), cond("Ready", "True", "Ready")]
    assert c.events(after, stored(before)) == [c.Event("Normal", "Ready", "Ready=True: m")]
    broken = [cond("Validated", "False", "InvalidSpec"), cond("Scheduled", "True", "Scheduled"), cond("Ready", "False", "InvalidSpec")]
    assert c.events(broken, stored(after)) == [
        c.Event("Warning", "InvalidSpec", "Validated=False: m"), c.Event("Warning", "InvalidSpec", "Ready=False: m"),
    ]  # fmt: skip
    rolling = [*after[:2], cond("Ready", "False", "RollingOut")]
    assert c.events(rolling, stored(after)) == [c.Event("Normal", "RollingOut", "Ready=False: m")]  # no longer Ready is news


def status_of(ready_reason, ready_status="False", generation=1):
    from inferentia_operator.core import api

    return api.InferentiaModelStatus(observed_generation=generation, conditions=[c.cond("Ready", ready_status, ready_reason, "m")])


def test_a_rollouts_progress_is_held_until_it_completes_and_nothing_else_is():
    from inferentia_operator.core.api import PENDING_STATUS

    rolling = {"observedGeneration": 1, "conditions": stored([c.cond("Ready", "False", "RollingOut", "m")])}
    # A new model (the CRD's default status) and progress within a rollout are held...
    assert c.hold_seconds(PENDING_STATUS, status_of("RollingOut"), held_for=0) == c.MAX_HOLD_SECONDS
    assert 0 < c.hold_seconds(rolling, status_of("RollingOut"), held_for=10) < c.MAX_HOLD_SECONDS
    # ...but never longer than the Deployment's own progress deadline,
    assert c.hold_seconds(PENDING_STATUS, status_of("RollingOut"), held_for=c.MAX_HOLD_SECONDS) == 0
    # and completion, problems, a finished compile and a new generation go at once.
    assert c.hold_seconds(PENDING_STATUS, status_of("Ready", "True"), held_for=0) == 0
    for problem in ("Unschedulable", "FailedCreate", "InvalidSpec", "ApplyFailed", "ProgressDeadlineExceeded", "Compiling"):
        assert c.hold_seconds(PENDING_STATUS, status_of(problem), held_for=0) == 0, problem
    compiling = {"observedGeneration": 1, "conditions": stored([c.cond("Ready", "False", "Compiling", "m")])}
    assert c.hold_seconds(compiling, status_of("RollingOut"), held_for=0) == 0
    was_ready = {"observedGeneration": 1, "conditions": stored([c.cond("Ready", "True", "Ready", "m")])}
    assert c.hold_seconds(was_ready, status_of("RollingOut", generation=2), held_for=0) == 0
    assert c.hold_seconds(rolling, status_of("RollingOut", generation=2), held_for=0) == 0
    # A status without the default (a CRD from before it) is written at once.
    assert c.hold_seconds({}, status_of("RollingOut"), held_for=0) == 0


def test_a_rollout_past_its_progress_deadline_is_reported_and_stalls():
    d = deployment(ready=0, available=0, updated=2)
    d["status"]["conditions"] = [
        {"type": "Available", "status": "False"},
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "m-1" has timed out progressing.',
        },
    ]
    conds = by_type(c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=c.rollout_of(d, 2, "h1"), pods=[]))
    assert (conds["Ready"].reason, conds["Progressing"].status, conds["Stalled"].status) == ("ProgressDeadlineExceeded", "False", "True")
    assert "has timed out progressing" in conds["Ready"].message
    assert c.events([conds["Ready"]], []) == [c.Event("Warning", "ProgressDeadlineExceeded", f"Ready=False: {conds['Ready'].message}")]


def serving_pod(name, ready, message="", failures=()):
    cond = {"type": "Ready", "status": "True" if ready else "False", "reason": "" if ready else "ContainersNotReady", "message": message}
    return {
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}, cond], "failures": list(failures)},
    }


def rolled_out(**kw):
    """A Deployment whose ReplicaSet completed its rollout once (the controller's Progressing reason)."""
    d = deployment(**kw)
    d["status"]["conditions"].append({"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"})
    return d


def test_a_replica_that_stops_serving_after_its_rollout_is_named_with_why_not_a_rollout():
    """A crash, a node gone NotReady or a fetch that fails after the rollout completed: Ready
    says ReplicasUnavailable and quotes the pod, where it once said RollingOut."""
    d = rolled_out(ready=1, available=1)
    cases = [
        (serving_pod("m-b", False, "containers with unready status: [batcher]"), "pod m-b: containers with unready status: [batcher]"),
        (
            serving_pod("m-b", False, "x", [{"container": "fetch", "message": "fetching s3://b/m/\nthe object store did not answer\n"}]),
            "pod m-b: fetch failed: the object store did not answer",
        ),
    ]
    for unready, said in cases:
        pods = [serving_pod("m-a", True), unready]
        conds = by_type(c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=c.rollout_of(d, 2, "h1"), pods=pods))
        assert (conds["Ready"].status, conds["Ready"].reason) == ("False", "ReplicasUnavailable")
        assert conds["Ready"].message == f"1 of 2 replicas available; {said}"
        assert conds["Reconciling"].status == "True" and conds["Stalled"].status == "False"  # kstatus: InProgress, not Failed
    # A first rollout whose pods are not ready yet is RollingOut, with the same why.
    first = c.rollout_of(deployment(ready=1, available=1), 2, "h1")
    conds = by_type(c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=first, pods=cases[0][:1]))
    assert conds["Ready"].reason == "RollingOut" and conds["Ready"].message.endswith(cases[0][1])
    # Mid-rollout the reason stays RollingOut too.
    mid = c.rollout_of(rolled_out(replicas=3, updated=1, ready=2, available=2), 2, "h1")
    conds = by_type(c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=mid, pods=cases[0][:1]))
    assert conds["Ready"].reason == "RollingOut" and conds["Ready"].message.endswith(cases[0][1])
    # Losing replicas is a Warning event; getting them back, a Normal one.
    ready = [c.cond("Ready", "True", "Ready", "2 of 2")]
    lost = [c.cond("Ready", "False", "ReplicasUnavailable", "1 of 2")]
    assert c.events(lost, [x.model_dump(by_alias=True) for x in ready]) == [
        c.Event("Warning", "ReplicasUnavailable", "Ready=False: 1 of 2")
    ]
    assert c.events(ready, [x.model_dump(by_alias=True) for x in lost]) == [c.Event("Normal", "Ready", "Ready=True: 2 of 2")]


def test_a_pod_marked_not_ready_by_the_node_controller_points_at_its_node():
    lost = {
        "metadata": {"name": "m-a"},
        "spec": {"nodeName": "ip-10-0-0-1"},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}], "failures": []},
    }
    d = rolled_out(ready=0, available=0)
    conds = by_type(c.conditions(valid=True, invalid_message="", compiled=COMPILED, rollout=c.rollout_of(d, 2, "h1"), pods=[lost]))
    assert conds["Ready"].message == (
        "0 of 2 replicas available; pod m-a: marked not ready without a reason from its kubelet; node ip-10-0-0-1 may be NotReady"
    )


def test_serving_pods_are_counted_by_the_first_step_they_have_not_passed():
    def p(scheduled=True, initialized=True, ready=True, deleting=False):
        conds = [
            {"type": "PodScheduled", "status": str(scheduled)},
            {"type": "Initialized", "status": str(initialized)},
            {"type": "Ready", "status": str(ready)},
        ]
        meta = {"deletionTimestamp": "2026-11-24T00:00:00Z"} if deleting else {}
        return {"metadata": meta, "status": {"conditions": conds}}

    pods = [
        p(scheduled=False, initialized=False, ready=False),
        p(initialized=False, ready=False),
        p(ready=False),
        p(),
        p(),
        p(deleting=True),
    ]
    assert c.pod_counts(pods) == c.api.PodCounts(pending=1, fetching=1, loading=1, ready=2)


def test_what_autoscaling_or_routing_meet_mid_rollout_is_written_at_once():
    """The Autoscaling and Routing conditions are not the rollout's progress: a change of either
    is written at once, even while a rollout's own steps are held (a model whose pods never
    become ready would otherwise say nothing of its pool for up to MAX_HOLD_SECONDS)."""
    from inferentia_operator.core import api

    rolling = {"observedGeneration": 1, "conditions": stored([c.cond("Ready", "False", "RollingOut", "m")])}
    for side in ("Routing", "Autoscaling"):
        new = api.InferentiaModelStatus(
            observed_generation=1,
            conditions=[c.cond("Ready", "False", "RollingOut", "m"), c.cond(side, "False", "SomethingMissing", "m")],
        )
        assert c.hold_seconds(rolling, new, held_for=0) == 0, side
        unchanged = {"observedGeneration": 1, "conditions": stored(new.conditions)}
        assert c.hold_seconds(unchanged, new, held_for=10) > 0, side  # the same again: progress alone, held
