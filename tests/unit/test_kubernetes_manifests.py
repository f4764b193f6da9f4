"""The Kubernetes manifests in config/ against the Kubernetes API's own schemas (kubernetes-validate, which bundles
them: nothing is fetched), strictly: a misspelt or misplaced field fails, not only a wrong type."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

CONFIG = Path(__file__).resolve().parents[2] / "config"
MANIFESTS = ["kubernetes-sidecar.yaml", "kubernetes-deployment.yaml"]
# the oldest Kubernetes still supported upstream when this was written, and the newest the validator knows
VERSIONS = ["1.32", kubernetes_validate.latest_version()]


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((CONFIG / name).read_text()) if doc is not None]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", MANIFESTS)
def test_every_manifest_is_valid_kubernetes(name: str, version: str) -> None:
    docs = documents(name)
    assert {doc["kind"] for doc in docs} >= {"Deployment", "ConfigMap", "Secret"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_catches_a_misspelt_field() -> None:
    """The check can fail: the same Deployment with one field misspelt is refused."""
    deployment = next(doc for doc in documents("kubernetes-deployment.yaml") if doc["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)
