"""deploy/k8s: each overlay renders with kubectl kustomize, validates strictly against a pinned
Kubernetes schema, and wires the roles together (probes, resources, discovery names and ports)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["cpu-demo", "gpu"]
SCHEMA_VERSION = "1.32.0"  # the kubectl on CI machines; kubernetes-validate==1.37.0 ships this schema
ROLES = ["encoder", "prefill", "decode", "router"]
WORKERS = ROLES[:3]


def render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render the kustomize overlays")
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container(objects: list[dict], role: str) -> dict:
    pod = by_kind(objects, "Deployment")[f"epd-{role}"]["spec"]["template"]["spec"]
    (main,) = [c for c in pod["containers"] if c["name"] == role]
    return main


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly(overlay):
    objects = render(overlay)
    assert {o["kind"] for o in objects} >= {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget",
                                            "HorizontalPodAutoscaler"}
    for obj in objects:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)  # raises ValidationError


def test_strict_validation_catches_a_misspelled_field():
    bad = render("cpu-demo")[0]
    bad["metadata"]["lables"] = {"a": "b"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_role_has_probes_resources_and_a_pdb(overlay):
    objects = render(overlay)
    pdbs = by_kind(objects, "PodDisruptionBudget")
    for role in ROLES:
        c = container(objects, role)
        assert c.get("livenessProbe") and c.get("readinessProbe"), role
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), role
        assert {"cpu", "memory"} <= set(c["resources"]["limits"]), role
        assert pdbs[f"epd-{role}"]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == role
    router = container(objects, "router")
    assert router["livenessProbe"]["httpGet"]["path"] == "/health"
    assert router["readinessProbe"]["httpGet"]["path"] == "/ready"
    for role in WORKERS:
        c = container(objects, role)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert c["readinessProbe"]["grpc"]["port"] == ports["grpc"], role  # grpc.health.v1
        assert c["livenessProbe"]["httpGet"]["port"] == "metrics", role
        env = {e["name"]: e for e in c["env"]}
        assert int(env["EPD_PORT"]["value"]) == ports["grpc"] and int(env["EPD_METRICS_PORT"]["value"]) == \
            ports["metrics"], role
        # the worker advertises its bind address in transfer handles: it must be the pod IP
        assert env["EPD_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_init_container_has_resources(overlay):
    for dep in by_kind(render(overlay), "Deployment").values():
        for c in dep["spec"]["template"]["spec"].get("initContainers", []):
            assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]


def test_gpu_overlay_gives_each_worker_a_gpu():
    objects = render("gpu")
    for role in WORKERS:
        resources = container(objects, role)["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == "1" == resources["requests"]["nvidia.com/gpu"], role
    assert "nvidia.com/gpu" not in container(objects, "router")["resources"]["limits"]
    assert "nvidia.com/gpu" not in str(render("cpu-demo"))


def parse_discover(arg: str) -> tuple[str, str, int, int]:
    role, _, rest = arg.removeprefix("--discover-dns=").partition("=")
    target, _, option = rest.partition(",")
    name, _, port = target.rpartition(":")
    assert option.startswith("metrics_port="), arg
    return role, name, int(port), int(option.removeprefix("metrics_port="))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_router_discovers_every_headless_service_that_exists(overlay):
    """Names and ports in the router's --discover-dns are those the render really has."""
    objects = render(overlay)
    services = by_kind(objects, "Service")
    router = container(objects, "router")
    env = {e["name"] for e in router["env"]}
    found = {}
    for arg in router["args"]:
        if arg.startswith("--discover-dns="):
            role, name, port, metrics_port = parse_discover(arg)
            found[role] = (name, port, metrics_port)
    assert set(found) == set(WORKERS)
    for role, (name, port, metrics_port) in found.items():
        short, _, domain = name.partition(".")
        assert domain == "$(POD_NAMESPACE).svc.$(CLUSTER_DOMAIN)", name  # FQDN: no resolv.conf search
        svc = services[short]["spec"]
        assert svc["clusterIP"] == "None", short
        assert svc["selector"]["app.kubernetes.io/component"] == role
        svc_ports = {p["port"]: p["targetPort"] for p in svc["ports"]}
        container_ports = {p["name"]: p["containerPort"] for p in container(objects, role)["ports"]}
        assert container_ports[svc_ports[port]] == port and container_ports[svc_ports[metrics_port]] == metrics_port
    assert {"POD_NAMESPACE", "CLUSTER_DOMAIN"} <= env
    config = next(iter(by_kind(objects, "ConfigMap").values()))["data"]
    assert config["CLUSTER_DOMAIN"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_role_autoscales_on_its_own_metrics(overlay):
    hpas = by_kind(render(overlay), "HorizontalPodAutoscaler")
    for role in WORKERS:
        spec = hpas[f"epd-{role}"]["spec"]
        assert spec["scaleTargetRef"]["name"] == f"epd-{role}"
        names = {m["pods"]["metric"]["name"] for m in spec["metrics"] if m["type"] == "Pods"}
        assert names and all(n.startswith("epd_") for n in names)
    adapter = yaml.safe_load((K8S / "extras" / "prometheus-adapter-rules.yaml").read_text())
    served = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    wanted = {m["pods"]["metric"]["name"] for h in hpas.values() for m in h["spec"]["metrics"]}
    assert wanted <= served, wanted - served


def test_extras_parse_with_required_fields():
    docs = {d["kind"]: d for f in (K8S / "extras").glob("*.yaml") for d in yaml.safe_load_all(f.read_text())
            if d and "kind" in d}
    monitor = docs["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"] and monitor["spec"]["endpoints"]
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    services = by_kind(render("cpu-demo"), "Service")
    assert ports <= {p["name"] for s in services.values() for p in s["spec"]["ports"]}
    scaled = docs["ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] in by_kind(render("cpu-demo"), "Deployment")
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and "epd_" in trigger["metadata"]["query"]
    assert {"serverAddress", "threshold"} <= set(trigger["metadata"])
