"""The committed CRD is what the code generates, and it is a structural schema with documentation."""

from pathlib import Path

import yaml

from inferentia_operator.core.crd import crd, crd_yaml
from inferentia_operator.core.rules import CEL_RULES

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "crds" / "inferentia.dev_inferentiamodels.yaml"


def test_committed_crd_matches_the_code():
    assert COMMITTED.read_text() == crd_yaml(), "run `make crd` to regenerate crds/ from the pydantic models"


def _walk(node, path="spec"):
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], f"{path}[]")


def _schema():
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_every_spec_field_is_documented_and_typed():
    for path, node in _walk(_schema()["properties"]["spec"]):
        if path.endswith("[]"):
            continue
        assert node.get("description"), f"{path} has no description"
        assert node.get("type") or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields"), (
            f"{path} has no type"
        )
        assert "$ref" not in node and "title" not in node


def test_defaults_minimums_and_enums():
    spec = _schema()["properties"]["spec"]["properties"]
    compute = spec["compute"]["properties"]
    # No maximum of its own: the family rule refuses what no instance of the family holds, naming its largest.
    assert compute["inf"] == {"type": "integer", "minimum": 1, "description": compute["inf"]["description"]}
    assert compute["family"]["enum"] == ["inf1", "inf2", "trn1", "trn2", "trn3"] and compute["family"]["default"] == "inf1"
    assert spec["processesPerReplica"]["default"] == 1
    assert spec["model"]["properties"]["precision"]["default"] == "fp16"
    assert spec["compile"]["default"] == {}


def test_cel_rules_are_attached_where_they_belong():
    placed = [("", r["rule"]) for r in _schema()["x-kubernetes-validations"]]
    spec = _schema()["properties"]["spec"]
    for path, node in _walk(spec):
        placed += [(path, r["rule"]) for r in node.get("x-kubernetes-validations", [])]
    assert sorted(placed) == sorted((r.node, r.cel_rule) for r in CEL_RULES)


def test_subresources_and_printer_columns():
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    for wanted in ("Chips", "Processes", "NCG", "Replicas", "Ready", "Status", "Age"):
        assert wanted in names
    assert yaml.safe_load(crd_yaml()) == crd()


def test_no_default_holds_a_null():
    """The API server checks each default against its schema, where null is of no type: a CRD with
    one is refused whole ("inf in body must be of type integer: \\"null\\"")."""

    def nulls(value, where):
        if value is None:
            yield where
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from nulls(v, f"{where}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from nulls(v, f"{where}[{i}]")

    found = [n for path, node in _walk(_schema()) if "default" in node for n in nulls(node["default"], path)]
    assert not found, found
    # The pools' defaults are objects with optional fields: the case that had them.
    assert _schema()["properties"]["spec"]["properties"]["disaggregation"]["properties"]["prefill"]["default"] == {
        "dataParallelSize": 1, "replicas": 1,
    }  # fmt: skip
