"""The clean-up part alone (core/cleanup/part.py): what earlier plans left, once unused."""

from inferentia_operator.core.cleanup.part import cleanup_part
from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.pod.artefact import compile_job_name
from inferentia_operator.core.pod.model import plan_configmap_name
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.service import plan_configmap
from test_decide import SETTINGS, Observed, built, complete, live, model_body, rolled_out

COMPILED = {"compile.image": "example.com/compile:1"}


def test_an_earlier_plan_goes_once_nothing_mounts_it_and_the_current_one_stays():
    old = built(model_body(processesPerReplica=1))
    body = model_body(generation=2, processesPerReplica=4)
    new = built(body)
    plans = [live(plan_configmap(old)), live(plan_configmap(new))]
    mounted = cleanup_part(new, Observed(body, deployment=rolled_out(serving_deployment(old)), configmaps=plans), SETTINGS)
    assert mounted.delete == ()
    rolled = cleanup_part(new, Observed(body, deployment=rolled_out(serving_deployment(new)), configmaps=plans), SETTINGS)
    assert rolled.delete == (("ConfigMap", plan_configmap_name(old)),)


def test_of_earlier_compile_jobs_the_newest_success_is_kept_for_a_rollback():
    first = built(model_body(processesPerReplica=1, **COMPILED))
    second = built(model_body(processesPerReplica=2, **COMPILED))
    body = model_body(generation=3, processesPerReplica=4, **COMPILED)
    current = built(body)
    jobs = [complete(compile_job(first)), complete(compile_job(second)), live(compile_job(current))]
    jobs[0]["metadata"]["creationTimestamp"] = "2026-11-01T00:00:00Z"
    jobs[1]["metadata"]["creationTimestamp"] = "2026-11-02T00:00:00Z"
    part = cleanup_part(current, Observed(body, jobs=jobs), SETTINGS)
    assert part.delete == (("Job", compile_job_name(first)),)
