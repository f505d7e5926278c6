"""Every image a model can put into a pod is under the chart's image allow-list.

The test walks the API's schema for every field named ``image``, gives each a value of its
own, renders the children, and requires that each such value reaching a container is one the
admission policy's ``images`` expression reads. An image field added to the API later fails
here until the policy checks it too."""

import re
from pathlib import Path
from typing import Any

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.decide import rendered
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.model import Model
from specs import make_spec

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "charts" / "inferentia-operator" / "templates" / "image-policy.yaml"
OPERATOR_IMAGE = "registry.example.com/the-operators-own:1"  # configuration, not the model's


def image_fields(schema: dict[str, Any], defs: dict[str, Any], path: str = "") -> list[str]:
    """Dotted paths of every property named image, through nested objects and $refs."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    for key in ("anyOf", "allOf"):
        for option in schema.get(key, []):
            return image_fields(option, defs, path) if "$ref" in option or "properties" in option else []
    found = []
    for name, prop in (schema.get("properties") or {}).items():
        child = f"{path}.{name}" if path else name
        found += [child] if name == "image" else image_fields(prop, defs, child)
    return found


def policy_paths() -> set[str]:
    """The image fields the policy reads, as paths below spec (serving.image, ...)."""
    return {m.group(1) for m in re.finditer(r"\bobject\.spec\.([a-zA-Z.]+\.image)\b", POLICY.read_text())}


def container_images(objects: list[dict[str, Any]]) -> list[str]:
    images = []
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            images.append(container["image"])
    return images


def test_every_image_field_that_reaches_a_pod_is_checked_by_the_allow_list():
    schema = InferentiaModelSpec.model_json_schema(by_alias=True)
    fields = image_fields(schema, schema.get("$defs", {}))
    assert {"serving.image", "compile.image", "serving.batching.image"} <= set(fields), fields
    values = {f"example.com/{field.replace('.', '-')}:1": field for field in fields}
    overrides = {field: value for value, field in values.items()}
    spec = InferentiaModelSpec.model_validate(make_spec(**{"serving.batching": {"maxBatchSize": 4}}, **overrides))
    m = Model("m", "ns", "uid", spec, plan(spec), operator_image=OPERATOR_IMAGE)
    reached = {values[image] for image in container_images(rendered(m)) if image != OPERATOR_IMAGE}
    assert reached == set(fields), f"image fields that never reach a pod: {set(fields) - reached}"
    unchecked = reached - policy_paths()
    assert not unchecked, f"the allow-list does not check {sorted(unchecked)}: add them to {POLICY.relative_to(ROOT)}"
