"""REST routes for benchmark runs: thin adapters over services."""

from ninja import Query, Router, Status
from ninja.pagination import paginate

from console.accounts.services import actor_from_request
from console.benchmarks import services
from console.benchmarks.models import BenchmarkRun
from console.benchmarks.schemas import BenchmarkDetailOut, BenchmarkIn, BenchmarkOut, CompareOut
from console.errors import NotFound
from console.pagination import LimitOffsetPagination

router = Router(tags=["benchmarks"])


@router.post("/deployments/{name}/benchmarks", response={201: BenchmarkDetailOut})
def start_benchmark(request, name: str, payload: BenchmarkIn):
    run = services.start_run(
        actor=actor_from_request(request), deployment=name, params=payload.model_dump()
    )
    return Status(201, services.get_run(run.pk))


@router.get("/benchmarks", response=list[BenchmarkOut])
@paginate(LimitOffsetPagination)
def list_benchmarks(request, deployment: str | None = None, status: str | None = None):
    runs = BenchmarkRun.objects.select_related("deployment", "created_by")
    if deployment:
        runs = runs.filter(deployment__name=deployment)
    if status:
        runs = runs.filter(status=status)
    return runs


@router.get("/benchmarks/compare", response=CompareOut)
def compare_benchmarks(request, a: int = Query(..., ge=1), b: int = Query(..., ge=1)):
    runs = []
    for field, run_id in (("a", a), ("b", b)):
        try:
            runs.append(services.get_run(run_id))
        except NotFound as exc:
            raise NotFound(exc.message, field=field) from None
    run_a, run_b = runs
    return {"a": run_a, "b": run_b, **services.compare_runs(run_a, run_b)}


@router.get("/benchmarks/{run_id}", response=BenchmarkDetailOut)
def get_benchmark(request, run_id: int):
    return services.get_run(run_id)


@router.post("/benchmarks/{run_id}/cancel", response=BenchmarkDetailOut)
def cancel_benchmark(request, run_id: int):
    return services.cancel_run(actor=actor_from_request(request), run_id=run_id)
