"""The Python API of `epd ray`: start a cluster on Ray, scale a role, ask how it is, stop it.

    from epd.ray_cluster import RayCluster, RayClusterSpec
    with RayCluster(RayClusterSpec(model_dir="/models/kimi", decodes=2), address="auto") as cluster:
        print(cluster.url)            # the OpenAI-compatible gateway
        cluster.scale("decode", 4)    # in-flight requests are not disturbed

The controller is a named Ray actor on the driver's node (the router's port is opened there),
owned by the driver: when the driver exits, Ray removes it and every worker actor it made.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import asdict

from epd.ray_cluster.plan import RayClusterSpec

NAMESPACE = "epd"


def _ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("Ray is not installed: pip install 'epd-cluster[ray]'") from None
    return ray


def worker_actor_class(spec: RayClusterSpec):
    """The worker actor with the resources each worker holds (GPUs only where the cluster has some)."""
    ray = _ray()
    from epd.ray_cluster.actors import WorkerActor

    gpus = spec.gpus(ray.cluster_resources().get("GPU", 0))
    # Two calls at once: exit_code() must answer while wait_ready() is still waiting.
    return ray.remote(WorkerActor).options(num_cpus=spec.cpus_per_worker, num_gpus=gpus, max_concurrency=2)


def connect(address: str | None, local_cpus: int | None = None) -> bool:
    """Join the Ray cluster at `address` ("auto": the one this machine belongs to), or start a
    local one when `address` is None. Returns whether this call started Ray."""
    ray = _ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report from an offline machine
    if ray.is_initialized():
        return False
    if address is None:
        # One machine's workers share its cores (as under `epd serve`): the local Ray's CPU count is
        # a scheduling allowance for the actors, not a promise of a core each.
        cpus = local_cpus or max(os.cpu_count() or 1, 16)
        # On loopback: nothing of a one-machine cluster is reachable from elsewhere unless asked.
        ray.init(num_cpus=cpus, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
                 _node_ip_address="127.0.0.1")
        return True
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    return False


class RayCluster:
    def __init__(self, spec: RayClusterSpec, address: str | None = None, local_cpus: int | None = None) -> None:
        self.spec = spec
        self.address = address
        self.local_cpus = local_cpus
        self.controller = None
        self.started_ray = False
        self.url = ""
        self.grpc_address = ""

    def start(self) -> str:
        """Place every worker and the router; return the gateway's base URL once /ready is true."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from epd.ray_cluster.actors import Controller

        self.started_ray = connect(self.address, self.local_cpus)
        here = ray.get_runtime_context().get_node_id()
        controller_class = ray.remote(Controller).options(
            name=self.spec.name, namespace=NAMESPACE, num_cpus=0, max_concurrency=8,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False))
        try:
            self.controller = controller_class.remote(asdict(self.spec))
            info = ray.get(self.controller.start.remote())
        except BaseException:
            self.stop()
            raise
        self.url, self.grpc_address = info["url"], info["grpc_address"]
        return self.url

    def scale(self, role: str, n: int) -> dict:
        return _ray().get(self.controller.scale.remote(role, n))

    def status(self) -> dict:
        return _ray().get(self.controller.status.remote())

    def stop(self) -> None:
        ray = _ray()
        if self.controller is not None:
            try:
                ray.get(self.controller.stop.remote(), timeout=60)
            except Exception as exc:  # the controller is gone already: Ray took its actors with it
                print(f"epd ray: stopping the controller: {exc}", file=sys.stderr)
            with contextlib.suppress(Exception):
                ray.kill(self.controller)
            self.controller = None
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False

    def __enter__(self) -> RayCluster:
        self.start()
        return self

    def __exit__(self, *_) -> None:
        self.stop()


def find_controller(address: str, name: str = "epd"):
    """The controller of a running `epd ray up` on the Ray cluster at `address`."""
    ray = _ray()
    connect(address)
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        raise RuntimeError(f"no EPD cluster named {name!r} on the Ray cluster at {address} "
                           "(is `epd ray up` running? --name must match)") from None


def scale(role: str, n: int, address: str = "auto", name: str = "epd") -> dict:
    """Change a running cluster's replica count for `role`; returns its status afterwards."""
    return _ray().get(find_controller(address, name).scale.remote(role, n))


def status(address: str = "auto", name: str = "epd") -> dict:
    return _ray().get(find_controller(address, name).status.remote())
