"""REST routes for telemetry: thin adapters over services (reads only)."""

from ninja import Query, Router

from console.inventory.services import get_node
from console.telemetry import series, services
from console.telemetry.schemas import LatestOut, SeriesOut, SeriesQuery

router = Router(tags=["telemetry"])


@router.get("/nodes/{name}/telemetry/latest", response=LatestOut)
def node_latest(request, name: str):
    """The node's last heartbeat telemetry from the hot store; `stale` when older than the
    offline threshold, empty chips when none arrived recently."""
    node = get_node(name)
    doc = services.latest(node.name)
    if doc is None:
        return {"node": node.name, "stale": True}
    return {"node": node.name, **doc}


@router.get("/telemetry", response=SeriesOut)
def telemetry_series(request, filters: Query[SeriesQuery]):
    """Stored series of a node's chips. 422 naming `start` or `resolution` on bad input."""
    return series.query_series(
        node=filters.node,
        npu_id=filters.npu_id,
        chip_id=filters.chip_id,
        start=filters.start,
        end=filters.end,
        resolution=filters.resolution,
    )
