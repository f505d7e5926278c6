"""The clean-up part alone (core/parts/cleanup.py): what earlier plans left, once unused."""

from inferentia_operator.core import children
from inferentia_operator.core.parts.cleanup import cleanup_part
from test_decide import SETTINGS, Observed, built, complete, live, model_body, rolled_out

COMPILED = {"compile.image": "example.com/compile:1"}


def test_an_earlier_plan_goes_once_nothing_mounts_it_and_the_current_one_stays():
    old = built(model_body(processesPerReplica=1))
    body = model_body(generation=2, processesPerReplica=4)
    new = built(body)
    plans = [live(children.plan_configmap(old)), live(children.plan_configmap(new))]
    mounted = cleanup_part(new, Observed(body, deployment=rolled_out(children.serving_deployment(old)), configmaps=plans), SETTINGS)
    assert mounted.delete == ()
    rolled = cleanup_part(new, Observed(body, deployment=rolled_out(children.serving_deployment(new)), configmaps=plans), SETTINGS)
    assert rolled.delete == (("ConfigMap", children.plan_configmap_name(old)),)


def test_of_earlier_compile_jobs_the_newest_success_is_kept_for_a_rollback():
    first = built(model_body(processesPerReplica=1, **COMPILED))
    second = built(model_body(processesPerReplica=2, **COMPILED))
    body = model_body(generation=3, processesPerReplica=4, **COMPILED)
    current = built(body)
    jobs = [complete(children.compile_job(first)), complete(children.compile_job(second)), live(children.compile_job(current))]
    jobs[0]["metadata"]["creationTimestamp"] = "2026-11-01T00:00:00Z"
    jobs[1]["metadata"]["creationTimestamp"] = "2026-11-02T00:00:00Z"
    part = cleanup_part(current, Observed(body, jobs=jobs), SETTINGS)
    assert part.delete == (("Job", children.compile_job_name(first)),)
