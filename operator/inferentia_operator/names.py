"""The names the operator writes onto objects and that other modules look up: one place for them."""

from __future__ import annotations

from .api import GROUP

FIELD_MANAGER = "inferentia-operator"
MODEL_LABEL = f"{GROUP}/model"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
PLAN_HASH_ANNOTATION = f"{GROUP}/plan-hash"
COMPILE_HASH_LABEL = f"{GROUP}/compile-hash"

# Where the plan ConfigMap is mounted in the compile and serving pods.
PLAN_MOUNT = "/etc/inferentia"
PLAN_FILE = f"{PLAN_MOUNT}/plan.json"
