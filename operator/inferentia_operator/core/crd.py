"""Generates the InferentiaModel CustomResourceDefinition from the pydantic models.

The pydantic JSON schema is turned into a structural OpenAPI v3 schema: references
inlined, optional fields made plain properties, pydantic-only keys dropped, and the
CEL rules of :mod:`inferentia_operator.core.rules` attached where they belong.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from . import api
from .apimodel import ApiModel
from .rules import CEL_RULES

_DROP = {"title", "additionalProperties"}


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A pydantic schema node as a Kubernetes structural schema node."""
    if "$ref" in schema:
        target = copy.deepcopy(defs[schema["$ref"].split("/")[-1]])
        # A field's own description wins over its type's docstring.
        target.update({k: v for k, v in schema.items() if k != "$ref"})
        schema = target
    if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
        # Optional[X] is anyOf [X, null]: in Kubernetes an absent field says the same.
        members = [m for m in schema["anyOf"] if m.get("type") != "null"]
        if len(members) != 1:
            raise ValueError(f"cannot express a union of {members} in a structural schema")
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        schema = {**_structural(members[0], defs), **rest}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP and not (key == "additionalProperties" and isinstance(value, dict)):
            continue
        if key == "default" and value is None:
            continue
        if key == "default" and isinstance(value, dict):
            # A structural schema's default is validated against the schema, where a null is not
            # an integer: the API server refuses the CRD. An absent field says what null does.
            value = _without_nulls(value)
        if key == "const":  # a one-value Literal
            out.setdefault("type", "string")
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _structural(prop, defs) for name, prop in value.items()}
        elif key in {"items", "additionalProperties"}:
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    if "enum" in out:
        out.setdefault("type", "string")
        # CEL's cost estimator treats a string without maxLength as unbounded.
        out.setdefault("maxLength", max(len(str(v)) for v in out["enum"]))
    if "properties" in out:
        out.setdefault("type", "object")
    return out


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _schema_of(model: type[ApiModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.pop("$defs", {}))


def _node(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = schema
    for name in dotted.split(".")[1:]:
        node = node["properties"][name]
    return node


def openapi_schema() -> dict[str, Any]:
    spec = _schema_of(api.InferentiaModelSpec)
    root_rules = [rule.as_schema() for rule in CEL_RULES if not rule.node]
    for rule in CEL_RULES:
        if rule.node:
            _node(spec, rule.node).setdefault("x-kubernetes-validations", []).append(rule.as_schema())
    # compile and rollout default to {} so that their own defaults apply when they are omitted.
    for name in ("compile", "rollout"):
        spec["properties"][name]["default"] = {}
    status = _schema_of(api.InferentiaModelStatus)
    status["default"] = api.PENDING_STATUS
    return {
        "type": "object",
        "description": "An ML model served on AWS Inferentia or Trainium NeuronCores. The operator validates the spec, "
        "plans NeuronCore Groups, compiles the model for them and serves it through a Deployment.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object: inferentia.dev/v1alpha1."},
            "kind": {"type": "string", "description": "Kind of this object: InferentiaModel."},
            # Declared so the name rule can point at it (fieldPath); 253 is every name's limit anyway.
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 253}}},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": root_rules,
    }


def _condition_column(name: str, condition: str, kind: str = "reason") -> dict[str, Any]:
    return {
        "name": name,
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="{condition}")].{kind}',
    }


PRINTER_COLUMNS = [
    {"name": "Chips", "type": "integer", "jsonPath": ".spec.compute.inf", "description": "Neuron chips per replica"},
    {
        "name": "Cores",
        "type": "integer",
        "jsonPath": ".spec.compute.cores",
        "description": "NeuronCores per replica, when it shares a chip",
    },
    {
        "name": "Processes",
        "type": "integer",
        "jsonPath": ".spec.processesPerReplica",
        "description": "Serving processes (NeuronCore Groups) per replica",
    },
    {"name": "NCG", "type": "integer", "jsonPath": ".status.plan.groupSize", "description": "NeuronCores per group"},
    {
        "name": "Replicas",
        "type": "integer",
        "jsonPath": ".spec.replicas",
        "description": "Desired replicas (with autoscaling: the autoscaler's count)",
    },
    {"name": "Min", "type": "integer", "jsonPath": ".spec.autoscaling.minReplicas", "description": "Autoscaling's fewest replicas"},
    {"name": "Max", "type": "integer", "jsonPath": ".spec.autoscaling.maxReplicas", "description": "Autoscaling's most replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    _condition_column("Status", "Ready", "reason"),
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Message", "type": "string", "priority": 1, "jsonPath": '.status.conditions[?(@.type=="Ready")].message'},
]


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": api.SHORT_NAMES,
                "categories": ["all", "inferentia"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


HEADER = "# Generated by `inferentia-operator crd` from operator/inferentia_operator/api.py. Do not edit.\n"


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=1_000_000)
