"""EPD cluster on Ray: `epd ray up` / `epd ray scale` and the same as a Python API."""

from epd.ray_cluster.api import RayCluster, scale, status
from epd.ray_cluster.plan import RayClusterSpec

__all__ = ["RayCluster", "RayClusterSpec", "scale", "status"]
