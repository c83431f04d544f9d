"""REST routes for deployments and replicas: thin adapters over services."""

from django.db.models import Prefetch
from ninja import Router, Status
from ninja.pagination import paginate

from console.accounts.services import actor_from_request
from console.deployments import autoscale, catalog, inspection, rollout, services
from console.deployments.models import Autoscaler, Deployment, Replica, ReplicaEvent, Rollout
from console.deployments.schemas import (
    AutoscalerIn,
    AutoscalerOut,
    CanaryIn,
    CatalogModelOut,
    CatalogOut,
    DeploymentIn,
    DeploymentOut,
    ModelInspectionOut,
    ReplicaDetailOut,
    ReplicaEventOut,
    ReplicaOut,
    RolloutOut,
    ScaleIn,
)
from console.errors import NotFound
from console.pagination import LimitOffsetPagination

router = Router(tags=["deployments"])


@router.get("/deployments", response=list[DeploymentOut])
@paginate(LimitOffsetPagination)
def list_deployments(request):
    return Deployment.objects.select_related("pinned_node").prefetch_related(
        "replica_set",
        # their rollouts, newest first, in one query (DeploymentOut.rollout takes the first)
        Prefetch("rollouts", queryset=Rollout.objects.order_by("-started_at", "-id")),
    )


@router.post("/deployments", response={201: DeploymentOut})
def create_deployment(request, payload: DeploymentIn):
    """Create a deployment; `desired_state: running` also starts it."""
    return Status(
        201, services.create_deployment(actor=actor_from_request(request), payload=payload)
    )


@router.get("/deployments/{name}", response=DeploymentOut)
def get_deployment(request, name: str):
    return services.get_deployment(name)


@router.put("/deployments/{name}", response=DeploymentOut)
def update_deployment(request, name: str, payload: DeploymentIn):
    """Replace the spec (running replicas restart with it); `desired_state` changes only when
    it is given."""
    return services.update_deployment(actor=actor_from_request(request), name=name, payload=payload)


@router.delete("/deployments/{name}", response={204: None})
def delete_deployment(request, name: str):
    services.delete_deployment(actor=actor_from_request(request), name=name)
    return Status(204, None)


@router.post("/deployments/{name}/start", response=DeploymentOut)
def start(request, name: str):
    return services.set_desired(actor=actor_from_request(request), name=name, state="running")


@router.post("/deployments/{name}/stop", response=DeploymentOut)
def stop(request, name: str):
    return services.set_desired(actor=actor_from_request(request), name=name, state="stopped")


@router.post("/deployments/{name}/restart", response=DeploymentOut)
def restart(request, name: str):
    return services.restart_deployment(actor=actor_from_request(request), name=name)


@router.post("/deployments/{name}/scale", response=DeploymentOut)
def scale(request, name: str, payload: ScaleIn):
    return services.set_desired(
        actor=actor_from_request(request), name=name, state=None, replicas=payload.replicas
    )


@router.put("/deployments/{name}/canary", response=DeploymentOut)
def set_canary(request, name: str, payload: CanaryIn):
    """The share of requests the first replacement of the next rolling updates takes while
    the rollout waits for a decision (0: no canary; operators)."""
    rollout.set_canary(actor=actor_from_request(request), name=name, percent=payload.percent)
    return get_deployment(request, name)


@router.post("/deployments/{name}/rollout/promote", response=RolloutOut)
def promote_canary(request, name: str):
    """Go on with a rollout paused at its canary (409 when none waits; operators)."""
    return rollout.promote(actor=actor_from_request(request), name=name)


@router.post("/deployments/{name}/rollout/rollback", response=RolloutOut)
def roll_back_canary(request, name: str):
    """Roll a rollout paused at its canary back to the last good spec (operators)."""
    return rollout.roll_back_canary(actor=actor_from_request(request), name=name)


@router.get("/deployments/{name}/autoscaler", response=AutoscalerOut)
def get_autoscaler(request, name: str):
    """The deployment's autoscaling bounds, what it is doing now and its last decisions with
    the numbers behind each (404: no autoscaling)."""
    dep = services.get_deployment(name)
    policy = Autoscaler.objects.filter(deployment=dep).select_related("deployment").first()
    if policy is None:
        raise NotFound(f"{name} has no autoscaling")
    return policy


@router.put("/deployments/{name}/autoscaler", response=AutoscalerOut)
def set_autoscaler(request, name: str, payload: AutoscalerIn):
    """Turn autoscaling on or change it (operators); the replica count is brought within
    the bounds at once."""
    return autoscale.set_policy(actor=actor_from_request(request), name=name, fields=payload.dict())


@router.delete("/deployments/{name}/autoscaler", response={204: None})
def delete_autoscaler(request, name: str):
    """Turn autoscaling off (operators); the replica count stays as it is."""
    autoscale.remove_policy(actor=actor_from_request(request), name=name)
    return Status(204, None)


@router.get("/deployments/{name}/replicas", response=list[ReplicaOut])
def list_replicas(request, name: str):
    dep = services.get_deployment(name)
    return list(
        dep.replica_set.select_related("node", "deployment").prefetch_related(
            "allocations__accelerator"
        )
    )


def _replica(replica_id: int) -> Replica:
    replica = (
        Replica.objects.select_related("node", "deployment")
        .prefetch_related("allocations__accelerator")
        .filter(pk=replica_id)
        .first()
    )
    if replica is None:
        raise NotFound(f"no replica with id {replica_id}", field="replica_id")
    return replica


@router.get("/replicas/{replica_id}", response=ReplicaDetailOut)
def get_replica(request, replica_id: int):
    return _replica(replica_id)


@router.get("/replicas/{replica_id}/events", response=list[ReplicaEventOut])
@paginate(LimitOffsetPagination)
def replica_events(request, replica_id: int):
    return ReplicaEvent.objects.filter(replica=_replica(replica_id))


@router.get("/catalog", response=CatalogOut, tags=["catalog"])
def list_catalog(request):
    """Every catalog model with its preset per card type (settings, spec to POST, estimate)."""
    cat = catalog.load_catalog()
    return {
        "cards": [c.model_dump() for c in cat.cards.values()],
        "models": [catalog.model_out(m) for m in cat.models.values()],
    }


@router.get("/catalog/{model_id}", response=CatalogModelOut, tags=["catalog"])
def get_catalog_model(request, model_id: str):
    return catalog.model_out(catalog.get_model(model_id))


@router.get("/deployments/inspections/{int:inspection_id}", response=ModelInspectionOut)
def get_inspection(request, inspection_id: int):
    """A model inspection (the `inspection.id` of a 409 "still inspecting"): poll until its
    status is done or failed, then send the deployment again."""
    return inspection.get(inspection_id)
