"""The compile part alone (core/parts/compile.py): one compile per key, only what the
operator proved it made counts. tests/test_decide.py has the same rules through decide()."""

from inferentia_operator.core import children
from inferentia_operator.core.parts.compile import compile_part
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
    assert (part.facts.job, part.facts.uri, part.facts.hit) == (children.compile_job_name(m), children.compiled_uri(m), False)
    done = compile_part(m, Observed(body, jobs=[complete(children.compile_job(m))]), SETTINGS)
    assert done.compiled and done.record is not None and done.record["data"]["uri"] == children.compiled_uri(m)


def test_a_completed_job_is_no_cache_hit_for_an_operator_without_the_key_that_proved_it():
    body = model_body(**COMPILED)
    m = built(body)
    job = complete(children.compile_job(m))  # proved with the tests' key, not DEFAULT_SETTINGS'
    part = compile_part(m, Observed(body, jobs=[job]), DEFAULT_SETTINGS)
    assert not part.compiled and part.record is None


def test_another_models_job_of_the_key_is_waited_for_not_started_again():
    body = model_body(**COMPILED)
    m = built(body)
    other = live(children.compile_job(m))
    other["metadata"]["ownerReferences"] = [{**other["metadata"]["ownerReferences"][0], "uid": "uid-other", "name": "other"}]
    uri = children.compiled_uri(m)
    part = compile_part(m, Observed(body, compile_jobs={uri: [other]}), SETTINGS)
    assert part.children == () and part.facts.condition.reason == "Compiling" and "of model other" in part.facts.condition.message
