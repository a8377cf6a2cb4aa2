"""``deploy/k8s``: valid against Kubernetes' own schemas, offline, and consistent with what Modelyard reads and serves.

Each kustomization (the base, the GPU overlay, the queue-depth overlay) is rendered (with kustomize or
kubectl where installed, else from the files; see ``kustomize.py``) and every resource is validated
with ``kubernetes-validate`` in strict mode (unknown fields are errors) against pinned schema versions.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from modelyard.cli import parse_args
from modelyard.health import PATHS as WEB_PROBES
from tests.deploy.kustomize import (
    K8S,
    KUSTOMIZATIONS,
    ROOT,
    Resource,
    by_name,
    containers,
    kustomize_command,
    pod_specs,
    render,
    render_files,
    render_with_tool,
)

# The oldest Kubernetes these manifests are meant for, and a recent one.
KUBERNETES_VERSIONS = ["1.31", "1.34"]
SECRET_EXAMPLE = K8S / "base" / "secret.example.yaml"
SOURCES = ("modelyard", "registry", "storage", "inference")
INFERENCE_PROBES = {"/v2/health/live", "/v2/health/ready"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Resource]]:
    return {name: render(ROOT / name) for name in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def base(rendered: dict[str, list[Resource]]) -> list[Resource]:
    return rendered["deploy/k8s"]


def secret_example() -> Resource:
    [secret] = [doc for doc in yaml.safe_load_all(SECRET_EXAMPLE.read_text()) if doc]
    return secret


# --- Valid Kubernetes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_manifest_is_valid_kubernetes(rendered, kustomization, version):
    resources = rendered[kustomization]
    assert len(resources) >= 12
    for resource in resources:
        name = f"{resource['kind']}/{resource['metadata']['name']}"
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            pytest.fail(f"{kustomization}: {name} is not valid Kubernetes {version}: {path}: {exc.message}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_example_secret_is_valid_kubernetes(version):
    kubernetes_validate.validate(secret_example(), version, strict=True)


def test_the_validator_rejects_a_misspelt_field():
    """The check above can fail: strict schemas refuse a field Kubernetes does not know."""
    deployment = by_name(render_files(K8S), "Deployment", "modelyard-beat")
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.skipif(kustomize_command() is None, reason="neither kustomize nor kubectl is installed")
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_file_renderer_agrees_with_kustomize(kustomization):
    def key(resource: Resource) -> tuple[str, str]:
        return resource["kind"], resource["metadata"]["name"]

    by_tool = sorted(render_with_tool(ROOT / kustomization), key=key)
    by_files = sorted(render_files(ROOT / kustomization), key=key)
    assert by_files == by_tool


# --- Settings the manifests set are settings Modelyard reads -------------------------------------------


def variables_read() -> set[str]:
    """Every ``MODELYARD_*`` name in the Python sources, plus ``NAME_FILE`` for each read through env_str."""
    names: set[str] = set()
    for source in SOURCES:
        for path in (ROOT / source).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    names.update(re.findall(r"\bMODELYARD_[A-Z0-9_]*[A-Z0-9]\b", node.value))
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "env_str"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    names.add(f"{node.args[0].value}_FILE")
    return names


def variables_set(resources: list[Resource]) -> dict[str, str]:
    """``MODELYARD_*`` name -> where a manifest sets it (container env, ConfigMap or Secret keys)."""
    found: dict[str, str] = {}
    for resource in resources:
        where = f"{resource['kind']}/{resource['metadata']['name']}"
        if resource["kind"] in ("ConfigMap", "Secret"):
            keys = [*resource.get("data", {}), *resource.get("stringData", {})]
            found.update({key: where for key in keys})
    for workload, spec in pod_specs(resources).items():
        for container in containers(spec):
            found.update({env["name"]: f"{workload} {container['name']}" for env in container.get("env", [])})
    return {name: where for name, where in found.items() if name.startswith("MODELYARD_")}


def unknown_variables(resources: list[Resource]) -> list[str]:
    read = variables_read()
    return sorted(f"{name} ({where})" for name, where in variables_set(resources).items() if name not in read)


def test_every_modelyard_variable_the_manifests_set_is_one_the_settings_read(rendered):
    resources = [r for name in KUSTOMIZATIONS for r in rendered[name]] + [secret_example()]
    assert len(variables_set(resources)) >= 15
    assert unknown_variables(resources) == []


def test_a_misspelt_variable_in_a_manifest_is_reported():
    configmap = {"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"MODELYARD_STORGE_URL": "s3://b/p"}}
    assert variables_read() >= {"MODELYARD_STORAGE_URL", "MODELYARD_SECRET_KEY_FILE"}
    assert unknown_variables([configmap]) == ["MODELYARD_STORGE_URL (ConfigMap/x)"]


def test_every_workload_reads_the_configmap_and_the_one_secret(base):
    for workload, spec in pod_specs(base).items():
        for container in containers(spec):
            sources = [next(iter(source.values()))["name"] for source in container["envFrom"]]
            assert sources == ["modelyard-config", "modelyard-secrets"], f"{workload} {container['name']}"
    configmap = by_name(base, "ConfigMap", "modelyard-config")
    assert not {"MODELYARD_SECRET_KEY", "MODELYARD_DATABASE_URL", "MODELYARD_BROKER_URL"} & set(configmap["data"])
    assert {"MODELYARD_SECRET_KEY", "MODELYARD_SIGNING_KEY", "MODELYARD_DATABASE_URL", "AWS_SECRET_ACCESS_KEY"} <= set(
        secret_example()["stringData"]
    )


def test_the_example_secret_holds_placeholders_only_and_its_key_is_refused(tmp_path):
    values = secret_example()["stringData"]
    assert all("REPLACE-ME" in value for value in values.values()), values
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "MODELYARD_DATA_DIR": str(tmp_path),
        "MODELYARD_SECRET_KEY": values["MODELYARD_SECRET_KEY"],
    }
    result = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "manage", "check"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "MODELYARD_SECRET_KEY: still the example Secret's placeholder; set a long random one" in result.stderr

    env.update(MODELYARD_SECRET_KEY="a-real-one-" * 5, MODELYARD_SIGNING_KEY=values["MODELYARD_SIGNING_KEY"])
    result = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "manage", "check"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "MODELYARD_SIGNING_KEY: still the example Secret's placeholder; put a PEM key there" in result.stderr


# --- Commands, probes, security -------------------------------------------------------------------------


def test_every_container_runs_a_command_the_cli_accepts(base):
    roles = {}
    for workload, spec in pod_specs(base).items():
        for container in spec["containers"]:
            assert container["image"].startswith("registry.example.com/modelyard")
            args = parse_args(container["args"])  # exits on an unknown command or option
            roles[workload] = (args.command, getattr(args, "role", None))
        for init in spec.get("initContainers", []):
            assert init["command"][:2] == ["sh", "-c"]
            assert "modelyard manage migrate --check" in init["command"][2]
    assert roles == {
        "Job/modelyard-migrate": ("manage", None),
        "Deployment/modelyard-web": ("serve", "web"),
        "Deployment/modelyard-worker": ("worker", None),
        "Deployment/modelyard-beat": ("beat", None),
        "Deployment/modelyard-inference": ("serve", "inference"),
    }


def test_probes_ask_each_role_its_own_health_endpoints(base):
    def probes(name: str) -> dict[str, str]:
        [container] = pod_specs(base)[f"Deployment/{name}"]["containers"]
        ports = {port["name"] for port in container["ports"]}
        found = {}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[kind]["httpGet"]["port"] in ports
            found[kind] = container[kind]["httpGet"]["path"]
        return found

    web = probes("modelyard-web")
    assert (web["livenessProbe"], web["readinessProbe"]) == ("/healthz", "/readyz")
    assert set(web.values()) <= set(WEB_PROBES)
    inference = probes("modelyard-inference")
    assert (inference["livenessProbe"], inference["readinessProbe"]) == ("/v2/health/live", "/v2/health/ready")
    assert set(inference.values()) <= INFERENCE_PROBES


def test_every_container_runs_unprivileged_on_a_read_only_root_with_requests_and_limits(rendered):
    for name in KUSTOMIZATIONS:
        for workload, spec in pod_specs(rendered[name]).items():
            assert spec["securityContext"]["runAsNonRoot"] is True, workload
            assert spec["securityContext"]["runAsUser"] == 10001, workload  # the Dockerfile's USER
            assert spec["automountServiceAccountToken"] is False, workload
            assert spec["enableServiceLinks"] is False, workload
            mounted = set()
            for container in containers(spec):
                context = container["securityContext"]
                where = f"{name}: {workload} {container['name']}"
                assert context["allowPrivilegeEscalation"] is False, where
                assert context["readOnlyRootFilesystem"] is True, where
                assert context["capabilities"]["drop"] == ["ALL"], where
                assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
                assert {"cpu", "memory"} <= set(container["resources"]["limits"]), where
                mounted |= {mount["mountPath"] for mount in container["volumeMounts"]}
            # The settings write to the data folder at start-up; everything else writable is an emptyDir.
            assert "/var/lib/modelyard" in mounted, workload
            assert all("emptyDir" in volume for volume in spec["volumes"]), workload
    configmap = by_name(rendered["deploy/k8s"], "ConfigMap", "modelyard-config")
    assert configmap["data"]["MODELYARD_DATA_DIR"] == "/var/lib/modelyard"


def test_beat_runs_once_and_is_replaced_not_rolled(base):
    beat = by_name(base, "Deployment", "modelyard-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}


def test_inference_has_http_and_grpc_services_a_disruption_budget_and_an_autoscaler(base):
    labels = by_name(base, "Deployment", "modelyard-inference")["spec"]["template"]["metadata"]["labels"]
    [container] = pod_specs(base)["Deployment/modelyard-inference"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001}
    served = parse_args(container["args"])  # what the container listens on is what it declares
    assert (served.port, served.grpc_port) == (ports["http"], ports["grpc"])
    http = by_name(base, "Service", "modelyard-inference")
    grpc = by_name(base, "Service", "modelyard-inference-grpc")
    assert (http["spec"]["selector"], grpc["spec"]["selector"]) == (labels, labels)
    assert [(p["name"], p["port"], p["targetPort"]) for p in http["spec"]["ports"]] == [("http", 8000, "http")]
    assert [(p["name"], p["port"], p["targetPort"]) for p in grpc["spec"]["ports"]] == [("grpc", 8001, "grpc")]
    web = by_name(base, "Service", "modelyard-web")
    assert web["spec"]["selector"]["app.kubernetes.io/component"] == "web"
    pdb = by_name(base, "PodDisruptionBudget", "modelyard-inference")
    assert pdb["spec"]["selector"]["matchLabels"] == labels
    hpa = by_name(base, "HorizontalPodAutoscaler", "modelyard-inference")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "modelyard-inference",
    }
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]


def test_the_queue_depth_variant_scales_on_a_metric_inference_exports(rendered):
    from inference.metrics import QUEUE_DEPTH

    hpa = by_name(rendered["deploy/k8s/overlays/queue-depth"], "HorizontalPodAutoscaler", "modelyard-inference")
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == QUEUE_DEPTH._name


def test_the_gpu_overlay_asks_for_a_gpu_on_gpu_nodes_and_changes_nothing_else(rendered):
    gpu, cpu = rendered["deploy/k8s/overlays/gpu"], rendered["deploy/k8s"]
    spec = pod_specs(gpu)["Deployment/modelyard-inference"]
    [container] = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["image"] == spec["initContainers"][0]["image"] == "registry.example.com/modelyard-gpu:0.1.0"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    others: Any = [r for r in gpu if r["metadata"]["name"] != "modelyard-inference" or r["kind"] != "Deployment"]
    assert others == [r for r in cpu if r["metadata"]["name"] != "modelyard-inference" or r["kind"] != "Deployment"]


def test_every_manifest_file_is_in_a_kustomization_or_the_example_secret():
    """A manifest left out of every kustomization would never be validated or applied."""
    listed: set[Path] = {SECRET_EXAMPLE}
    for kustomization in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        listed |= {(kustomization.parent / entry).resolve() for entry in spec.get("resources", [])}
        listed |= {(kustomization.parent / patch["path"]).resolve() for patch in spec.get("patches", [])}
        listed.add(kustomization.resolve())
    files = {path.resolve() for path in K8S.rglob("*.yaml")}
    assert sorted(str(path.relative_to(ROOT)) for path in files - listed) == []
