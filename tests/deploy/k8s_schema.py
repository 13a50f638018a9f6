"""Validating Kubernetes objects against a CRD's openAPIV3Schema as the API server would: defaults applied and
nulls dropped first, then the schema, with one strictness the server lacks: an unknown field is an error (the
server would silently prune it, which hides typos), except where the schema preserves unknown fields."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

KUBERAY = Path(__file__).resolve().parents[3] / "shared" / "data" / "deploy" / "kuberay"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml",
             "RayService": "ray.io_rayservices.yaml"}
# The RayJob controller's submission modes (the CRD declares a string with a default, no enum).
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}


@functools.lru_cache(maxsize=None)
def _crd(kind: str) -> dict:
    return yaml.load((KUBERAY / CRD_FILES[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def crd_schema(kind: str, api_version: str) -> dict:
    crd = _crd(kind)
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group, (crd["spec"]["group"], group)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return strict(v["schema"]["openAPIV3Schema"])
    raise KeyError(f"{kind} {api_version}: no such version in {CRD_FILES[kind]}")


def strict(schema: dict) -> dict:
    """The schema for JSON Schema to validate like the API server, plus one strictness: additionalProperties:
    false on every object that lists its properties and does not set x-kubernetes-preserve-unknown-fields (the
    server would prune an unknown field there). An x-kubernetes-int-or-string node accepts an integer or a
    string (the CRDs spell that out with anyOf; a node that does not gets it here)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            if node.get("x-kubernetes-int-or-string") and "anyOf" not in node and "oneOf" not in node:
                node.pop("type", None)
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def drop_nulls(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [drop_nulls(v) for v in obj]
    return obj


def apply_defaults(obj: Any, schema: dict) -> Any:
    """Fill in the schema's `default`s for absent properties, recursively (as structural defaulting does)."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(obj[name], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in obj:
                if name not in schema["properties"]:
                    obj[name] = apply_defaults(obj[name], extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in obj]
    return obj


def submission_modes(api_version: str) -> set[str]:
    """RayJob submission modes: the CRD's enum where it has one, else the controller's (SUBMISSION_MODES)."""
    spec = crd_schema("RayJob", api_version)["properties"]["spec"]["properties"]
    return set(spec["submissionMode"].get("enum") or SUBMISSION_MODES)


def validate(obj: dict) -> dict:
    """Validate a RayCluster / RayJob / RayService; returns the object as the server would store it."""
    schema = crd_schema(obj["kind"], obj["apiVersion"])
    stored = apply_defaults(drop_nulls(copy.deepcopy(obj)), schema)
    jsonschema.Draft7Validator(schema).validate(stored)
    return stored
