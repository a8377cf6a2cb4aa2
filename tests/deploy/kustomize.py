"""Render ``deploy/k8s`` kustomizations: with ``kustomize``/``kubectl`` when installed, otherwise from the files.

The file renderer understands exactly what the kustomizations here use (``resources``, ``namespace``,
JSON patches with a ``target``) and refuses anything else, so it cannot quietly render something
different from kustomize; where kubectl is installed a test checks that both agree.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATIONS = ["deploy/k8s", "deploy/k8s/overlays/gpu", "deploy/k8s/overlays/queue-depth"]
CLUSTER_SCOPED = {"Namespace"}
KNOWN_FIELDS = {"apiVersion", "kind", "namespace", "resources", "patches"}

Resource = dict[str, Any]


def kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def render_with_tool(folder: Path) -> list[Resource]:
    command = kustomize_command()
    assert command is not None, "neither kustomize nor kubectl is installed"
    result = subprocess.run([*command, str(folder)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_files(folder: Path) -> list[Resource]:
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise NotImplementedError(f"{folder}: the file renderer does not handle {sorted(unknown)}; use kustomize")
    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        target = folder / entry
        if target.is_dir():
            resources += render_files(target)
        else:
            resources += [doc for doc in yaml.safe_load_all(target.read_text()) if doc]
    if spec.get("namespace"):
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = spec["namespace"]
    for patch in spec.get("patches", []):
        operations = yaml.safe_load((folder / patch["path"]).read_text())
        if not isinstance(operations, list) or set(patch) != {"path", "target"}:
            raise NotImplementedError(f"{folder}: only JSON patches from a file, with a target, are handled")
        matched = [r for r in resources if _matches(r, patch["target"])]
        assert matched, f"{folder}: patch {patch['path']} matches no resource"
        for resource in matched:
            for operation in operations:
                _apply(resource, operation)
    return resources


def render(folder: Path) -> list[Resource]:
    return render_with_tool(folder) if kustomize_command() else render_files(folder)


def _matches(resource: Resource, target: dict[str, str]) -> bool:
    group, _, version = resource["apiVersion"].rpartition("/")
    actual = {"kind": resource["kind"], "name": resource["metadata"]["name"], "group": group, "version": version}
    return all(actual[key] == value for key, value in target.items())


def _apply(resource: Resource, operation: dict[str, Any]) -> None:
    """One RFC 6902 operation: add, replace or remove."""
    keys = [part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]]
    parent: Any = resource
    for key in keys[:-1]:
        parent = parent[int(key)] if isinstance(parent, list) else parent[key]
    last, op = keys[-1], operation["op"]
    value = copy.deepcopy(operation.get("value"))
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if op == "add":
            parent.insert(index, value)
        elif op == "replace":
            parent[index] = value
        elif op == "remove":
            del parent[index]
        else:
            raise NotImplementedError(op)
    elif op == "add":
        parent[last] = value
    elif op == "replace":
        assert last in parent, f"replace of a missing {operation['path']}"
        parent[last] = value
    elif op == "remove":
        del parent[last]
    else:
        raise NotImplementedError(op)


def pod_specs(resources: list[Resource]) -> dict[str, Resource]:
    """``Kind/name`` -> pod spec, for every workload."""
    specs = {}
    for resource in resources:
        if resource["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            specs[f"{resource['kind']}/{resource['metadata']['name']}"] = resource["spec"]["template"]["spec"]
    return specs


def containers(spec: Resource) -> list[Resource]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def by_name(resources: list[Resource], kind: str, name: str) -> Resource:
    [found] = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    return found
