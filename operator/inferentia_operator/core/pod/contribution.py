"""One concern's share of a pod, which a feature adds instead of a branch in the pod's builder.

A builder (the serving Deployment, the compile Job) lists the contributions of its concerns in a
fixed order and combines them: each list of the pod (the main container's environment and
mounts, the volumes, the init containers, the containers beside it, the annotations) holds the
concerns' items in that order, and the builder puts the combined lists where the pod has them.
A feature that changes a pod writes a function returning its contribution, in its own module,
and adds it to the list of each builder it changes; nothing else of the builder changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PodContribution:
    # The main container's planned variables; spec.serving.env wins over them (with_user_env).
    env: Mapping[str, str] = field(default_factory=dict)
    # The main container's volumeMounts, and the pod's volumes.
    mounts: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()
    # Containers that run to completion before the main one (the fetches), and those that run
    # beside it (a serving pod's batching front end) or after it (the compile Job's upload).
    init_containers: tuple[dict[str, Any], ...] = ()
    containers: tuple[dict[str, Any], ...] = ()
    # The pod template's annotations.
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The main container's startupProbe, readinessProbe and livenessProbe.
    probes: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    # What the main container runs instead of its image's entry point, and its arguments: one
    # choice, so args come only with a command (combined() takes both from one contribution).
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    # The main container's resource claims and the pod's resourceClaims they name (allocation
    # dra), or the scheduler that places the pod's devices (the device plugin's).
    claims: tuple[dict[str, Any], ...] = ()
    resource_claims: tuple[dict[str, Any], ...] = ()
    scheduler_name: str = ""


NOTHING = PodContribution()


def combined(contributions: Iterable[PodContribution]) -> PodContribution:
    """Every concern's share, in the order given: each list in that order; a variable, an
    annotation or a probe set again takes the later value in the earlier one's place (as
    dict.update does); the last command given, with that contribution's args (never one
    contribution's command with another's args); the last scheduler given."""
    shares = list(contributions)
    assert all(share.command or not share.args for share in shares), "args without a command"
    runs = next((share for share in reversed(shares) if share.command), NOTHING)
    return PodContribution(
        env={name: value for share in shares for name, value in share.env.items()},
        mounts=tuple(mount for share in shares for mount in share.mounts),
        volumes=tuple(volume for share in shares for volume in share.volumes),
        init_containers=tuple(container for share in shares for container in share.init_containers),
        containers=tuple(container for share in shares for container in share.containers),
        annotations={name: value for share in shares for name, value in share.annotations.items()},
        probes={name: probe for share in shares for name, probe in share.probes.items()},
        command=runs.command,
        args=runs.args,
        claims=tuple(claim for share in shares for claim in share.claims),
        resource_claims=tuple(claim for share in shares for claim in share.resource_claims),
        scheduler_name=next((share.scheduler_name for share in reversed(shares) if share.scheduler_name), ""),
    )


def field_if_nonempty(field_name: str, value: Any) -> dict[str, Any]:
    """``{field_name: value}``, or nothing where the value is empty: a pod field that only some
    concerns fill (initContainers, resourceClaims, schedulerName) is written only when one does."""
    return {field_name: value} if value else {}
