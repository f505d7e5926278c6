"""The compile Jobs of earlier plans: the compile part says what changed since the newest that
succeeded, and the clean-up keeps that one for a rollback to reuse."""

from __future__ import annotations

from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed, job_state
from inferentia_operator.core.pod.artefact import job_output_uri
from inferentia_operator.core.proof import Prover


def newest_earlier_success(observed: Observed, prover: Prover, current: str | None) -> Obj | None:
    """The newest compile Job of an earlier plan that the operator made and that succeeded, if any."""
    succeeded = [
        j for j in map(Obj, observed.all("Job"))
        if j.name != current and job_state(j.raw).phase == "Complete" and prover.made_job(j.raw, job_output_uri(j.raw))
    ]  # fmt: skip
    return max(succeeded, key=lambda j: j.created, default=None)
