"""Kubernetes manifests checked by the official Python client's models, strictly.

The client's models check types and required fields (pydantic) but drop keys they do not
know; :func:`validate` also refuses those, so a misspelt field (``terminationGracePeriod``)
fails the test instead of vanishing when applied.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

client = pytest.importorskip(
    "kubernetes.client", reason="the kubernetes package (dev extra) validates the manifests"
)

MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("batch/v1", "Job"): "V1Job",
}
_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")


class UnknownField(ValueError):
    """A key the Kubernetes model of that object does not have."""


def validate(doc: dict[str, Any]) -> Any:
    """``doc`` as the client's model object; raises on unknown fields, wrong types, missing
    required fields."""
    name = MODELS[(doc["apiVersion"], doc["kind"])]
    check_fields(doc, name, doc["kind"])
    return client.ApiClient()._ApiClient__deserialize(doc, name)


def check_fields(value: Any, type_name: str, path: str) -> None:
    """Every key of ``value`` (recursively) is a field of the model ``type_name``."""
    if (m := _LIST.match(type_name)) and isinstance(value, list):
        for i, item in enumerate(value):
            check_fields(item, m.group(1), f"{path}[{i}]")
        return
    if (m := _DICT.match(type_name)) and isinstance(value, dict):
        for key, item in value.items():
            check_fields(item, m.group(1), f"{path}.{key}")
        return
    model = getattr(client, type_name, None)
    if model is None or not hasattr(model, "attribute_map") or not isinstance(value, dict):
        return  # a primitive, or a type error the model itself reports
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            raise UnknownField(f"{path}.{key} is not a field of {type_name}")
        check_fields(item, model.openapi_types[by_json[key]], f"{path}.{key}")
