"""Autoscaling: a deployment's replica count follows its load within [min, max].

A pass (the beat, every PASS_S) looks at each deployment with an Autoscaler and running,
using the heartbeat series of its ready replicas (engines.series_points: vLLM's
`num_requests_waiting` and `kv_cache_usage_perc`, scraped by the agent every heartbeat):

- **Up** when, over the last `window_s`, the mean waiting requests per ready replica is above
  `waiting_target` or the mean KV-cache usage above `kv_target` — *sustained*: every ready
  replica has samples covering most of the window (a spike, or a replica that just came up,
  decides nothing). The new count is HPA's rule, ceil(n × load / target), at least n + 1,
  capped by `max_replicas` and by the free NPUs (scheduler.room); when none are free the
  policy says "waiting for capacity" and why, once, instead of asking for replicas that
  cannot be placed.
- **Down** by one when, over the last `cooldown_s`, no sample shows a waiting request and the
  KV cache stayed under half its target, and nothing changed for `cooldown_s`: never below
  `min_replicas`.
- **Hold** while a rolling update runs or a replica is still coming up (its capacity is not
  in the numbers yet), and within `window_s` of its own last change.

Every change is a ScalingEvent with the numbers behind it and an audit entry by the system
actor; the replicas themselves are then placed, started and stopped by the reconcile loop
exactly as for a manual scale (services.set_desired's ordering for scale-downs included).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.deployments import scheduler
from console.deployments.engines import series_points
from console.deployments.models import (
    ROLLOUT_ACTIVE,
    Autoscaler,
    Deployment,
    DesiredState,
    ReplicaState,
    ScalingAction,
    ScalingEvent,
)
from console.deployments.services import _kick_reconcile, _order_for_scale_down, get_deployment
from console.errors import Invalid, NotFound

log = logging.getLogger(__name__)
PASS_S = 15.0
COVERAGE = 0.8  # a replica's samples must span this share of the window to count as sustained
MIN_SAMPLES = 3
KEEP_EVENTS = 200
# placed and starting: their capacity is not in the numbers yet (a PENDING one waits for a
# place, which may never come: it holds nothing)
COMING_UP = (
    ReplicaState.SCHEDULED,
    ReplicaState.STARTING,
    ReplicaState.LOADING,
)


@dataclass
class Load:
    """What the ready replicas showed over a period: per-replica means, then averaged."""

    replicas: int  # ready replicas with enough samples
    waiting: float  # mean waiting requests per ready replica
    kv: float  # mean KV-cache usage, percent
    peak_waiting: float  # the largest waiting count any sample showed
    peak_kv: float  # the largest KV-cache usage any sample showed, percent
    samples: int

    def numbers(self) -> dict:
        return {
            "ready_measured": self.replicas,
            "waiting_per_replica": round(self.waiting, 2),
            "kv_cache_percent": round(self.kv, 1),
            "peak_waiting": round(self.peak_waiting, 2),
            "peak_kv_cache_percent": round(self.peak_kv, 1),
            "samples": self.samples,
        }


def run() -> dict[str, int]:
    """One pass over every deployment with autoscaling. A failure on one is logged and never
    stops the others. Returns how many changed."""
    changed = 0
    for policy in Autoscaler.objects.select_related("deployment"):
        try:
            changed += evaluate(policy) is not None
        except Exception:  # noqa: BLE001 - one deployment's numbers must not stall the rest
            log.exception("autoscaling %s failed this pass", policy.deployment.name)
    return {"changed": changed}


def measure(series: dict[int, list[dict]], period_s: float, now: float) -> Load | None:
    """The load over the last `period_s` seconds of each replica's series (replica id ->
    points, oldest first), or None when any of them lacks samples covering most of it (not
    sustained: decide nothing)."""
    if not series:
        return None
    since = now - period_s
    waits, kvs, peaks_w, peaks_kv, samples = [], [], [0.0], [0.0], 0
    for all_points in series.values():
        points = [p for p in all_points if p["ts"] >= since]
        if len(points) < MIN_SAMPLES or points[-1]["ts"] - points[0]["ts"] < COVERAGE * period_s:
            return None
        w = [p.get("num_requests_waiting", 0.0) for p in points]
        kv = [100 * p.get("kv_cache_usage_perc", 0.0) for p in points]
        waits.append(sum(w) / len(w))
        kvs.append(sum(kv) / len(kv))
        peaks_w.append(max(w))
        peaks_kv.append(max(kv))
        samples += len(points)
    return Load(
        replicas=len(series),
        waiting=sum(waits) / len(waits),
        kv=sum(kvs) / len(kvs),
        peak_waiting=max(peaks_w),
        peak_kv=max(peaks_kv),
        samples=samples,
    )


def evaluate(policy: Autoscaler, now: float | None = None) -> ScalingEvent | None:
    """Decide for one deployment; apply and return the decision, or None (no change)."""
    dep = policy.deployment
    if dep.desired_state != DesiredState.RUNNING:
        return _set_status(policy, "idle: the deployment is stopped")
    if dep.replicas < policy.min_replicas or dep.replicas > policy.max_replicas:
        to = min(max(dep.replicas, policy.min_replicas), policy.max_replicas)
        return apply(policy, to, ScalingAction.BOUNDS, "replicas brought within min..max", {})
    if dep.rollouts.filter(state__in=ROLLOUT_ACTIVE).exists():
        return _set_status(policy, "holding: a rolling update is in progress")
    replicas = list(dep.replica_set.filter(index__lt=dep.replicas))
    if any(r.state in COMING_UP for r in replicas):
        return _set_status(policy, "holding: a replica is still coming up")
    now = timezone.now().timestamp() if now is None else now
    ready = [r for r in replicas if r.state == ReplicaState.READY]
    since_change = now - policy.changed_at.timestamp() if policy.changed_at else math.inf
    if since_change < policy.window_s:
        return _set_status(policy, "holding: settling after the last change")
    longest = max(policy.window_s, policy.cooldown_s)  # each series read once for both
    series = {r.pk: series_points(r.pk, now - longest) for r in ready}
    load = measure(series, policy.window_s, now)
    if load is not None and _over(policy, load):
        return _scale_up(policy, dep, load)
    if dep.replicas > policy.min_replicas and since_change >= policy.cooldown_s:
        quiet = measure(series, policy.cooldown_s, now)
        if quiet is not None and _idle(policy, quiet):
            why = (
                f"idle for {policy.cooldown_s}s: no waiting request, KV cache at most "
                f"{quiet.peak_kv:.0f}% (under half the {policy.kv_target:g}% target)"
            )
            return apply(policy, dep.replicas - 1, ScalingAction.DOWN, why, quiet.numbers())
    if load is None:
        return _set_status(policy, f"measuring: under {policy.window_s}s of samples")
    return _set_status(
        policy,
        f"steady: {load.waiting:.1f} waiting per replica (target {policy.waiting_target:g}), "
        f"KV cache {load.kv:.0f}% (target {policy.kv_target:g}%)",
    )


def _over(policy: Autoscaler, load: Load) -> bool:
    return load.waiting > policy.waiting_target or load.kv > policy.kv_target


def _idle(policy: Autoscaler, load: Load) -> bool:
    return load.peak_waiting == 0 and load.peak_kv < policy.kv_target / 2


def _scale_up(policy: Autoscaler, dep: Deployment, load: Load) -> ScalingEvent | None:
    n = dep.replicas
    ratio = max(load.waiting / policy.waiting_target, load.kv / policy.kv_target)
    want = min(policy.max_replicas, max(n + 1, math.ceil(n * ratio)))
    numbers = {**load.numbers(), "ratio_to_target": round(ratio, 2), "wanted": want}
    why = (
        f"{load.waiting:.1f} waiting per replica (target {policy.waiting_target:g}) and KV "
        f"cache {load.kv:.0f}% (target {policy.kv_target:g}%) over {policy.window_s}s"
    )
    if want <= n:
        return _set_status(policy, f"at max ({policy.max_replicas}): {why}")
    room = scheduler.room(dep)
    numbers["room"] = room
    if room <= 0:
        text = f"waiting for capacity: {scheduler.explain_no_capacity(dep)}"
        if policy.status == text:
            return None  # said once, not every pass
        event = apply(policy, n, ScalingAction.CAPACITY, f"{why}; {text}", numbers)
        _set_status(policy, text)
        return event
    return apply(policy, min(want, n + room), ScalingAction.UP, why, numbers)


def apply(
    policy: Autoscaler, to: int, action: str, reason: str, numbers: dict
) -> ScalingEvent | None:
    """Set the replica count (under the deployment's row lock, only if it is still what the
    decision saw), record the event and the audit entry, kick the reconcile loop."""
    with transaction.atomic():
        dep = Deployment.objects.select_for_update().get(pk=policy.deployment_id)
        before = dep.replicas
        if action != ScalingAction.CAPACITY:
            if before != policy.deployment.replicas:
                return None  # someone scaled meanwhile: decide again next pass
            if to < before:
                _order_for_scale_down(dep)
            dep.replicas = to
            dep.save(update_fields=["replicas"])
            policy.changed_at = timezone.now()
        event = ScalingEvent.objects.create(
            deployment=dep,
            action=action,
            from_replicas=before,
            to_replicas=to,
            reason=reason[:500],
            numbers=numbers,
        )
        policy.status = f"{ScalingAction(action).label}: {before} → {to}"[:500]
        policy.save(update_fields=["status", "changed_at"])
        record(
            actor=Actor.system("autoscaler"),
            action="deployment.autoscale",
            obj=dep,
            message=reason[:500],
            before={"replicas": before},
            after={"replicas": to, "action": action, **numbers},
        )
        _trim(dep)
    if to != before:
        _kick_reconcile()
    return event


def _trim(dep: Deployment) -> None:
    keep = dep.scaling_events.values_list("pk", flat=True)[:KEEP_EVENTS]
    dep.scaling_events.exclude(pk__in=list(keep)).delete()


def _set_status(policy: Autoscaler, text: str) -> None:
    if policy.status != text[:500]:
        policy.status = text[:500]
        Autoscaler.objects.filter(pk=policy.pk).update(status=policy.status)


# --- the policy's own writes (API and page) ------------------------------------------------
def set_policy(*, actor: Actor, name: str, fields: dict) -> Autoscaler:
    """Create or change the deployment's autoscaler (operator). The current count is brought
    within the new bounds at once (a BOUNDS event)."""

    check_role(actor, Role.OPERATOR)
    _check_bounds(fields)
    with transaction.atomic():
        dep = Deployment.objects.select_for_update().get(pk=get_deployment(name).pk)
        policy = Autoscaler.objects.filter(deployment=dep).first()
        before = _policy_fields(policy) if policy else None
        policy = policy or Autoscaler(deployment=dep)
        for key, value in fields.items():
            setattr(policy, key, value)
        policy.updated_at = timezone.now()
        policy.status = ""
        policy.save()
        record(
            actor=actor,
            action="deployment.autoscaler",
            obj=dep,
            before=before,
            after=_policy_fields(policy),
        )
    policy.deployment = dep
    to = min(max(dep.replicas, policy.min_replicas), policy.max_replicas)
    if to != dep.replicas:
        apply(policy, to, ScalingAction.BOUNDS, "replicas brought within the new min..max", {})
        dep.refresh_from_db(fields=["replicas"])
    return policy


def remove_policy(*, actor: Actor, name: str) -> None:
    """Turn autoscaling off: the replica count stays where it is."""

    check_role(actor, Role.OPERATOR)
    dep = get_deployment(name)
    with transaction.atomic():
        policy = Autoscaler.objects.select_for_update().filter(deployment=dep).first()
        if policy is None:
            raise NotFound(f"{name} has no autoscaling")
        before = _policy_fields(policy)
        policy.delete()
        record(actor=actor, action="deployment.autoscaler.off", obj=dep, before=before)


def check_manual_scale(dep: Deployment, replicas: int) -> None:
    """A manual scale of an autoscaled deployment stays within its bounds (422 otherwise:
    the autoscaler would undo it on its next pass)."""

    policy = Autoscaler.objects.filter(deployment=dep).first()
    if policy and not policy.min_replicas <= replicas <= policy.max_replicas:
        raise Invalid(
            f"autoscaling keeps {dep.name} within {policy.min_replicas}..{policy.max_replicas} "
            "replicas: change its bounds, or turn autoscaling off",
            field="replicas",
        )


POLICY_FIELDS = (
    "min_replicas",
    "max_replicas",
    "waiting_target",
    "kv_target",
    "window_s",
    "cooldown_s",
)


def _policy_fields(policy: Autoscaler) -> dict:
    return {key: getattr(policy, key) for key in POLICY_FIELDS}


def _check_bounds(fields: dict) -> None:

    if fields["min_replicas"] > fields["max_replicas"]:
        raise Invalid("min_replicas must not exceed max_replicas", field="max_replicas")
