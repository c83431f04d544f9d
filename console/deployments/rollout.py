"""Rolling updates: a spec change (or an asked restart) replaces running replicas one at a
time, and a new generation that fails is rolled back to the last good spec.

A deployment's running replicas whose `spec_version` differs from the deployment's are
*outdated*. The reconcile loop calls `advance` for each running deployment once per pass; it
opens a `Rollout` when there are outdated replicas, and moves its one *step* (one replica
being replaced) forward:

- **surge** (the scheduler can place one more replica): a new row at index SURGE_INDEX starts
  with the new spec; once it is READY and has answered a test completion, the old replica is
  drained (state DRAINING: the gateway routes READY replicas only) until the gateway's
  in-flight set of it is empty or DRAIN_TIMEOUT passed, told to stop, and once stopped its row
  is deleted and the surge row takes its index. READY replicas never drop below `replicas`.
- **in place** (no capacity, a replica over several hosts, or an outdated replica that is not
  serving anyway): the old replica is drained, then restarted with a new generation on the
  same placement; READY replicas never drop below `replicas` - 1.

A new generation that crash-loops (CRASH_LOOP, or FAILED past the agent's restart_max),
stops, is not READY within READY_TIMEOUT, or fails the test completion VERIFY_TRIES times
rolls the deployment back: its spec columns are restored from `Deployment.good_spec` (the
spec last fully rolled out), its `spec_version` goes back to `good_version` (versions past it
are never issued again: services.next_spec_version), the same stepping brings every replica
back, and an incident, replica events and an audit entry (actor system) say why. A rollback
that fails itself ends the rollout `failed` and nothing more is tried until the spec changes.

Guarantees: idempotent and safe under concurrent passes: every replica change is a
conditional state transition (services.transition_replica), every step change a conditional
UPDATE of the rollout row (zero rows = another pass got there first). Nothing here waits for
an engine: a pass does at most one test completion per deployment (TEST_TIMEOUT_S) and one
Redis read per draining replica. docs/operations.md "Rolling updates".
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.deployments import scheduler
from console.deployments.engines import dispatch_start, dispatch_stop_replica
from console.deployments.models import (
    ROLLOUT_ACTIVE,
    Deployment,
    DesiredState,
    Replica,
    ReplicaEvent,
    ReplicaState,
    Rollout,
    RolloutState,
    engine_api_key,
)
from console.deployments.services import SPEC_FIELDS, get_deployment, transition_replica
from console.errors import Conflict
from workers.contracts import EngineSpec

log = logging.getLogger(__name__)
S = ReplicaState
R = RolloutState
SURGE_INDEX = 1000  # past any replica count (<= 64): the plain loop would stop an orphan
DRAIN_TIMEOUT = timedelta(seconds=30)
STOP_TIMEOUT = timedelta(seconds=90)  # an old replica's agent never confirmed the stop
TEST_TIMEOUT_S = 5.0
VERIFY_TRIES = 3
RESTART_MAX = EngineSpec.model_fields["restart_max"].default
SURGE, IN_PLACE = "surge", "in-place"
NOT_ACTIONABLE = (S.STOPPED, S.PENDING, S.STOPPING, S.UNKNOWN)
INFLIGHT = "npc:gw:in:"  # console/gateway/routing.py INFLIGHT: the gateway's leases per replica


def ready_timeout() -> timedelta:
    """How long a new generation may take to become READY (model loading on NPUs takes
    minutes): ROLLOUT_READY_TIMEOUT_S, 15 minutes unless set."""
    return timedelta(seconds=float(getattr(settings, "ROLLOUT_READY_TIMEOUT_S", 900)))


class _Lost(Exception):
    """Another pass changed the rollout first: undo this transaction."""


# --- the entry point ----------------------------------------------------------------------
def advance(dep: Deployment, latest: dict) -> set[int]:
    """Move the deployment's rolling update one step forward. Returns the ids of the
    replicas the rollout's step owns: the plain reconcile loop leaves those alone."""
    dep = Deployment.objects.get(pk=dep.pk)  # the pass began a while ago: this pass's truth
    active = dep.rollouts.filter(state__in=ROLLOUT_ACTIVE).first()
    if dep.desired_state != DesiredState.RUNNING:
        if active is not None:
            _close(active, R.SUPERSEDED, "the deployment was stopped")
        return set()
    note_good(dep, active)
    if active is not None and active.target_version != dep.spec_version:
        _close(active, R.SUPERSEDED, f"the spec changed to v{dep.spec_version}")
        active = None
    if active is None:
        undrain(dep)
        if not outdated(dep, actionable=False):
            return set()
        last = dep.rollouts.first()
        if last and last.state == R.FAILED and last.target_version == dep.spec_version:
            return set()  # a failed rollback: nothing more until the spec changes
        active = _open(dep)
        if active is None:
            return set()
    return _step(dep, active, latest)


def owns(replica_id: int) -> bool:
    """Whether an active rollout's step owns the replica now (read fresh: a pass that listed
    the rows earlier must not act on a surge row created, or an old row stopped, since)."""
    from django.db.models import Q

    return Rollout.objects.filter(
        Q(step_new=replica_id) | Q(step_old=replica_id), state__in=ROLLOUT_ACTIVE
    ).exists()


def outdated(dep: Deployment, *, actionable: bool = True) -> list[Replica]:
    """The deployment's running replicas on another spec version, those not serving first.
    `actionable`: only those a step can act on now (not stopping, not on a lost node)."""
    qs = Replica.objects.filter(deployment=dep, index__lt=dep.replicas).exclude(
        spec_version=dep.spec_version
    )
    qs = qs.exclude(state__in=NOT_ACTIONABLE if actionable else (S.STOPPED, S.PENDING))
    found = list(qs.select_related("node", "deployment").order_by("index"))
    return sorted(found, key=lambda r: (r.state == S.READY, r.index))


def undrain(dep: Deployment) -> None:
    """A replica left draining on the deployment's own spec by a step given up (no step owns
    it when this is called) serves again."""
    # not in REPLICA_TRANSITIONS (an agent's READY report must not undo a drain): the same
    # conditional UPDATE and event as services.transition_replica, for this one caller
    for replica in Replica.objects.filter(
        deployment=dep, state=S.DRAINING, spec_version=dep.spec_version
    ):
        why = "the rolling update no longer needs it drained"
        if Replica.objects.filter(pk=replica.pk, state=S.DRAINING).update(
            state=S.READY, state_reason=why, state_changed_at=timezone.now()
        ):
            ReplicaEvent.objects.create(
                replica=replica,
                from_state=S.DRAINING,
                to_state=S.READY,
                reason=why,
                generation=replica.generation,
            )


def snapshot(dep: Deployment) -> dict:
    """The spec columns a rollback restores (not the replica count: a rollback never scales)."""
    spec = {k: getattr(dep, k) for k in SPEC_FIELDS if k != "replicas"}
    return spec | {
        "pinned_node_id": dep.pinned_node_id,
        "model_info": dep.model_info,
        "estimate": dep.estimate,
    }


def note_good(dep: Deployment, active: Rollout | None) -> None:
    """Remember the deployment's spec as the last good one once every wanted replica is
    READY on it (the first start, or a rollout that finished). Conditional on the version."""
    if active is not None or dep.good_version == dep.spec_version or dep.replicas == 0:
        return
    ready = Replica.objects.filter(
        deployment=dep, index__lt=dep.replicas, state=S.READY, spec_version=dep.spec_version
    ).count()
    if ready == dep.replicas:
        Deployment.objects.filter(pk=dep.pk, spec_version=dep.spec_version).update(
            good_version=dep.spec_version, good_spec=snapshot(dep)
        )
        dep.good_version, dep.good_spec = dep.spec_version, snapshot(dep)


def _open(dep: Deployment) -> Rollout | None:
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().get(pk=dep.pk)
        if locked.spec_version != dep.spec_version:
            return None  # changed under us: the next pass sees the new one
        if locked.rollouts.filter(state__in=ROLLOUT_ACTIVE).exists():
            return None
        return Rollout.objects.create(
            deployment=dep,
            canary_percent=locked.canary_percent if locked.good_version else 0,
            from_version=locked.good_version,
            to_version=dep.spec_version,
            target_version=dep.spec_version,
            before=locked.good_spec,
            reason=f"rolling out spec v{dep.spec_version}",
        )


def _close(ro: Rollout, state: str, reason: str) -> bool:
    """End the rollout (conditional on its state). A surge replica it leaves is past the
    replica count: the plain loop stops and removes it."""
    changed = Rollout.objects.filter(pk=ro.pk, state=ro.state).update(
        state=state,
        reason=reason[:500],
        finished_at=timezone.now(),
        step_old=None,
        step_new=None,
        step_mode="",
    )
    if changed:
        ro.state = state
        log.info("rollout %s of %s: %s (%s)", ro.pk, ro.deployment_id, state, reason)
    return bool(changed)


# --- steps --------------------------------------------------------------------------------
def _step(dep: Deployment, ro: Rollout, latest: dict) -> set[int]:
    if ro.step_new_id is None:
        undrain(dep)
        todo = outdated(dep)
        if todo:
            _begin(dep, ro, todo[0], latest)
        elif not outdated(dep, actionable=False):
            _finish(dep, ro)
        ro.refresh_from_db()
        if ro.step_new_id is None:
            return set()
    new = Replica.objects.select_related("node", "deployment").filter(pk=ro.step_new_id).first()
    old = Replica.objects.select_related("node", "deployment").filter(pk=ro.step_old_id).first()
    if new is None or (ro.step_mode == SURGE and old is None):
        _clear_step(ro, "its replica was removed meanwhile")
        return set()
    busy = {new.pk, old.pk if old else new.pk}
    if ro.step_mode == IN_PLACE and new.spec_version != dep.spec_version:
        _restart_when_drained(dep, ro, new)
        return busy
    if ro.step_verified_at is None and not _watch(dep, ro, new):
        ro.refresh_from_db(fields=["step_new"])
        return busy if ro.step_new_id == new.pk else set()
    if _canary_holds(dep, ro, new):
        return busy
    if ro.step_mode == IN_PLACE:
        _complete(ro, f"replica {new.index} replaced in place")
        return set()
    _retire(dep, ro, old, new)
    return busy


def _canary_holds(dep: Deployment, ro: Rollout, new: Replica) -> bool:
    """The first replacement answered: with a canary, the rollout waits here (both serve,
    the gateway sends it canary_percent of the requests) until an operator promotes it or
    rolls it back; a canary that fails meanwhile rolls back by itself."""
    if ro.state != R.ROLLING or not ro.canary_percent or ro.promoted_at or ro.replaced:
        return False
    if (
        new.state == S.CRASH_LOOP
        or new.state == S.STOPPED
        or (new.state == S.FAILED and new.restarts >= RESTART_MAX)
    ):
        fail(dep, ro, new, f"canary replica {new.index} {new.state}: {new.state_reason}")
    return True


def _begin(dep: Deployment, ro: Rollout, old: Replica, latest: dict) -> None:
    """Start replacing `old`: a surge replica when one can be placed, else in place."""
    word = "rolling back to" if ro.state == R.ROLLING_BACK else "rolling out"
    why = ""
    if old.state not in (S.READY, S.UNHEALTHY):
        why = f"it is {old.state}, not serving"
    elif dep.nodes_per_replica > 1:
        why = "a replica over several hosts is replaced in place"
    elif Replica.objects.filter(deployment=dep, index=SURGE_INDEX).exists():
        return  # an earlier surge row is still being stopped and removed
    else:
        try:
            with transaction.atomic():
                _start_surge(dep, ro, old, latest, word)
            return
        except scheduler.NoCapacity as exc:
            why = f"no free capacity for an extra replica: {exc}"
        except (_Lost, IntegrityError):  # another pass created the surge row first
            return
    try:
        with transaction.atomic():
            _claim(ro, IN_PLACE, old, old)
            reason = f"{word} spec v{dep.spec_version}: replaced in place ({why})"
            if old.state in (S.READY, S.UNHEALTHY):
                if not transition_replica(old, S.DRAINING, f"draining: {reason}"):
                    raise _Lost
            elif not _restart(dep, old, reason):
                raise _Lost
    except _Lost:
        return


def _claim(ro: Rollout, mode: str, old: Replica, new: Replica) -> None:
    now = timezone.now()
    if not Rollout.objects.filter(pk=ro.pk, state=ro.state, step_new__isnull=True).update(
        step_mode=mode,
        step_old=old,
        step_new=new,
        step_started_at=now,
        step_verified_at=None,
        verify_failures=0,
    ):
        raise _Lost


def _start_surge(dep: Deployment, ro: Rollout, old: Replica, latest: dict, word: str) -> None:
    surge = Replica.objects.create(deployment=dep, index=SURGE_INDEX)
    surge = Replica.objects.select_related("deployment").get(pk=surge.pk)
    if surge.deployment.spec_version != ro.target_version:
        raise _Lost  # the spec changed in this pass: the next one starts over
    placed = scheduler.place(surge, latest)  # NoCapacity: the transaction is undone
    _claim(ro, SURGE, old, surge)
    surge.node, surge.port = placed.node, placed.port
    if not transition_replica(
        surge,
        S.SCHEDULED,
        f"surge replica: {word} spec v{dep.spec_version} beside replica {old.index}, which "
        f"stops once this one answers; placed on {placed.node.name}, port {placed.port}",
        generation=1,
        spec_version=dep.spec_version,
    ):
        raise _Lost
    dispatch_start(surge)


def _restart(dep: Deployment, replica: Replica, reason: str) -> bool:
    """The same placement, a new generation on the deployment's spec (in the caller's
    transaction); False when another pass, or a spec change, got there first."""
    replica.deployment = Deployment.objects.get(pk=dep.pk)  # what dispatch_start sends
    if replica.deployment.spec_version != dep.spec_version:
        return False
    if not transition_replica(
        replica,
        S.STARTING,
        reason,
        generation=replica.generation + 1,
        spec_version=dep.spec_version,
        restarts=0,
    ):
        return False
    dispatch_start(replica)
    return True


def _restart_when_drained(dep: Deployment, ro: Rollout, replica: Replica) -> None:
    """In place: the old generation is told to stop (replaced by the new one) once drained."""
    if replica.state == S.UNKNOWN:
        return
    if replica.state == S.DRAINING:
        left = drained(replica)
        if left is None:
            return
        reason = f"drained ({left}); restarting with spec v{dep.spec_version}"
    else:
        reason = f"restarting with spec v{dep.spec_version} ({replica.state})"
    with transaction.atomic():
        if _restart(dep, replica, reason):
            Rollout.objects.filter(pk=ro.pk, step_new=replica.pk).update(
                step_started_at=timezone.now()
            )


def drained(replica: Replica) -> str | None:
    """None while the gateway still has requests in flight to the replica (and DRAIN_TIMEOUT
    has not passed since it started draining); else a few words saying how it ended."""
    try:
        from console.hot import get_redis

        left = get_redis().zcount(f"{INFLIGHT}{replica.pk}", time.time(), "+inf")
    except Exception:  # noqa: BLE001 - no Redis: nothing to read, the timeout decides
        left = -1
    if left == 0:
        return "no request in flight"
    waited = timezone.now() - replica.state_changed_at
    if waited < DRAIN_TIMEOUT:
        return None
    count = "unknown" if left < 0 else str(left)
    return f"drain timed out after {int(DRAIN_TIMEOUT.total_seconds())}s, {count} in flight"


def _watch(dep: Deployment, ro: Rollout, new: Replica) -> bool:
    """The new generation: True once it is READY and answered the test completion; a
    failure rolls back (or, when rolling back already, fails the rollout)."""
    failed = ""
    if new.state == S.CRASH_LOOP:
        failed = f"replica {new.index} crash-loops on spec v{dep.spec_version}: {new.state_reason}"
    elif new.state == S.FAILED and new.restarts >= RESTART_MAX:
        failed = f"replica {new.index} failed {new.restarts} times: {new.state_reason}"
    elif new.state == S.STOPPED:
        failed = f"replica {new.index} stopped: {new.state_reason}"
    elif new.state != S.READY and timezone.now() - ro.step_started_at > ready_timeout():
        failed = (
            f"replica {new.index} not ready within {int(ready_timeout().total_seconds())}s "
            f"({new.state}: {new.state_reason})"
        )
    if not failed and new.state == S.READY:
        ok, detail = test_completion(new)
        if ok:
            changed = Rollout.objects.filter(
                pk=ro.pk, step_new=new.pk, step_verified_at__isnull=True
            ).update(step_verified_at=timezone.now())
            if changed:
                note(new, f"answered a test completion on spec v{dep.spec_version} ({detail})")
            return bool(changed)
        tries = ro.verify_failures + 1
        Rollout.objects.filter(pk=ro.pk, step_new=new.pk).update(verify_failures=tries)
        note(new, f"test completion {tries} of {VERIFY_TRIES} failed: {detail}")
        if tries >= VERIFY_TRIES:
            failed = f"replica {new.index} failed the test completion {tries} times: {detail}"
    if failed:
        fail(dep, ro, new, failed)
    return False


def _retire(dep: Deployment, ro: Rollout, old: Replica, new: Replica) -> None:
    """Surge: the new replica answered; drain the old one, stop it, then the new row takes
    the old one's index."""
    why = f"replaced by surge replica (spec v{dep.spec_version}), which answered"
    with transaction.atomic():
        if old.state in (S.READY, S.UNHEALTHY):
            transition_replica(old, S.DRAINING, f"draining: {why}")
        elif old.state == S.DRAINING:
            left = drained(old)
            if left is not None and transition_replica(old, S.STOPPING, f"{left}: stopping"):
                dispatch_stop_replica(old)
        elif old.state == S.STOPPING:
            if timezone.now() - old.state_changed_at > STOP_TIMEOUT:
                _swap(ro, old, new, "its agent did not confirm the stop")
        elif old.state in (S.STOPPED, S.PENDING):
            _swap(ro, old, new, "stopped")
        elif transition_replica(old, S.STOPPING, f"{why}; stopping ({old.state})"):
            dispatch_stop_replica(old)


def _swap(ro: Rollout, old: Replica, new: Replica, how: str) -> None:
    """Delete the old row (its chips released) and give its index to the surge row."""
    if not Rollout.objects.filter(pk=ro.pk, step_new=new.pk, step_old=old.pk).update(
        step_old=None, step_new=None, step_mode="", replaced=F("replaced") + 1
    ):
        return
    index = old.index
    scheduler.release(old)
    old.delete()
    Replica.objects.filter(pk=new.pk).update(index=index)
    note(new, f"now replica {index}: the old replica {index} was removed ({how})")


def _complete(ro: Rollout, text: str) -> None:
    Rollout.objects.filter(pk=ro.pk, step_new=ro.step_new_id).update(
        step_old=None, step_new=None, step_mode="", replaced=F("replaced") + 1
    )
    log.info("rollout %s: %s", ro.pk, text)


def _clear_step(ro: Rollout, why: str) -> None:
    Rollout.objects.filter(pk=ro.pk, step_new=ro.step_new_id).update(
        step_old=None, step_new=None, step_mode=""
    )
    log.info("rollout %s: step given up: %s", ro.pk, why)


def _finish(dep: Deployment, ro: Rollout) -> None:
    if ro.state == R.ROLLING:
        if _close(ro, R.DONE, f"every replica runs spec v{dep.spec_version}"):
            Deployment.objects.filter(pk=dep.pk, spec_version=dep.spec_version).update(
                good_version=dep.spec_version, good_spec=snapshot(dep)
            )
    else:
        _close(ro, R.ROLLED_BACK, ro.reason)


def note(replica: Replica, text: str) -> None:
    """A line on the replica's journal that is not a state change."""
    ReplicaEvent.objects.create(
        replica=replica,
        from_state=replica.state,
        to_state=replica.state,
        reason=text[:500],
        generation=replica.generation,
    )


# --- failure and rollback -----------------------------------------------------------------
def fail(
    dep: Deployment, ro: Rollout, replica: Replica, why: str, *, incident: bool = True
) -> None:
    """The new generation failed: roll back to the last good spec (or, failing while rolling
    back or with no good spec, end the rollout failed). Events, an incident (unless an
    operator asked for the rollback: `incident` False), an audit entry."""
    from console.diagnosis.incidents import open_incident_for_rollout

    with transaction.atomic():
        locked = Deployment.objects.select_for_update().get(pk=dep.pk)
        if locked.spec_version != ro.target_version:
            return  # the spec changed meanwhile: that rollout supersedes this one
        if ro.state == R.ROLLING and locked.good_version and locked.good_spec:
            if not _roll_back(locked, ro, why):
                return
            action = f"rolled back to spec v{locked.good_version}"
        else:
            what = "rollback failed" if ro.state == R.ROLLING_BACK else "no good spec to go back to"
            if not _close(ro, R.FAILED, f"{what}: {why}"):
                return
            action = f"rollout failed ({what}); nothing more is tried until the spec changes"
        note(replica, f"{why}; {action}")
        if ro.step_old_id and ro.step_old_id != replica.pk:  # a surge row goes, with its events
            old = Replica.objects.filter(pk=ro.step_old_id).first()
            if old is not None:
                note(old, f"its replacement failed: {why}; {action}")
    if incident:
        open_incident_for_rollout(dep, ro, replica, f"{why}; {action}")


def _roll_back(dep: Deployment, ro: Rollout, why: str) -> bool:
    """Restore the good spec columns (in the caller's transaction, under the row lock)."""
    if not Rollout.objects.filter(pk=ro.pk, state=R.ROLLING).update(
        state=R.ROLLING_BACK,
        target_version=dep.good_version,
        reason=why[:500],
        replaced=0,
        step_old=None,
        step_new=None,
        step_mode="",
    ):
        return False
    bad = dep.spec_version
    spec = dict(dep.good_spec)
    for key, value in spec.items():
        setattr(dep, key, value)
    dep.spec_version = dep.good_version
    dep.updated_at = timezone.now()
    dep.save(update_fields=[*spec, "spec_version", "updated_at"])
    record(
        actor=Actor.system(),
        action="deployment.rollback",
        obj=dep,
        message=why[:500],
        before={"spec_version": bad},
        after={"spec_version": dep.good_version, "reason": why[:500]},
    )
    ro.state = R.ROLLING_BACK
    return True


# --- the canary's decision (API and page) -------------------------------------------------
def held_canary(name: str) -> tuple[Deployment, Rollout, Replica]:
    """The deployment's rollout paused at its canary, and the canary replica (409 if none)."""
    dep = get_deployment(name)
    ro = dep.rollouts.filter(state=R.ROLLING).first()
    new = Replica.objects.filter(pk=ro.step_new_id).first() if ro else None
    if ro is None or not ro.canary_held or new is None:
        raise Conflict(f"{name} has no canary waiting for a decision")
    return dep, ro, new


def promote(*, actor: Actor, name: str) -> Rollout:
    """Go on with the rollout past its canary (operators)."""
    check_role(actor, Role.OPERATOR)
    dep, ro, _ = held_canary(name)
    with transaction.atomic():
        if not Rollout.objects.filter(pk=ro.pk, state=R.ROLLING, promoted_at__isnull=True).update(
            promoted_at=timezone.now()
        ):
            raise Conflict(f"{name}: the rollout changed meanwhile")
        record(
            actor=actor,
            action="deployment.canary.promote",
            obj=dep,
            after={"spec_version": ro.to_version, "canary_percent": ro.canary_percent},
        )
    ro.refresh_from_db()
    return ro


def roll_back_canary(*, actor: Actor, name: str) -> Rollout:
    """Roll the canary back to the last good spec (operators): the same path as a failed
    new generation, without an incident (nothing failed; someone decided)."""
    check_role(actor, Role.OPERATOR)
    dep, ro, new = held_canary(name)
    fail(dep, ro, new, f"canary rolled back by {actor.name}", incident=False)
    record(
        actor=actor,
        action="deployment.canary.rollback",
        obj=dep,
        after={"spec_version": ro.to_version},
    )
    ro.refresh_from_db()
    return ro


def set_canary(*, actor: Actor, name: str, percent: int) -> Deployment:
    """The canary share the next rolling updates of the deployment pause at (0: none)."""
    check_role(actor, Role.OPERATOR)
    dep = get_deployment(name)
    with transaction.atomic():
        before = Deployment.objects.select_for_update().get(pk=dep.pk).canary_percent
        Deployment.objects.filter(pk=dep.pk).update(canary_percent=percent)
        record(
            actor=actor,
            action="deployment.canary",
            obj=dep,
            before={"canary_percent": before},
            after={"canary_percent": percent},
        )
    dep.canary_percent = percent
    return dep


# --- what pages and the API show ---------------------------------------------------------
def summary(ro: Rollout, replicas: int) -> str:
    """One line saying where the rollout stands, e.g. "Rolling out spec v3: 1 of 3 replaced"."""
    step = {SURGE: " · now: one extra replica first", IN_PLACE: " · now: one in place"}.get(
        ro.step_mode, ""
    )
    if ro.canary_held:
        return (
            f"Canary: one replica on spec v{ro.to_version} takes {ro.canary_percent}% of "
            f"requests beside the replicas on v{ro.from_version}; promote it or roll back"
        )
    return {
        R.ROLLING: f"Rolling out spec v{ro.to_version}: {ro.replaced} of {replicas} replaced{step}",
        R.ROLLING_BACK: f"Rolling back to v{ro.target_version}: {ro.replaced} of {replicas} "
        f"replaced{step}; why: {ro.reason}",
        R.ROLLED_BACK: f"Rolled back to v{ro.target_version}: {ro.reason}",
        R.DONE: f"Spec v{ro.to_version} rolled out to every replica",
        R.FAILED: f"Rollout of spec v{ro.to_version} failed: {ro.reason}",
        R.SUPERSEDED: f"Rollout of spec v{ro.to_version} stopped: {ro.reason}",
    }.get(ro.state, ro.state)


# --- the test completion ------------------------------------------------------------------
def test_completion(replica: Replica) -> tuple[bool, str]:
    """POST /v1/completions with max_tokens 1 to the replica itself, with its engine key,
    waiting at most TEST_TIMEOUT_S. (ok, a few words). A replica on a simulated node has no
    engine to ask: its READY is taken as is."""
    if replica.node is not None and replica.node.simulated:
        return True, "simulated node: no engine to ask"
    url = replica.base_url
    if url is None:
        return False, "no address to reach the replica at"
    body = {"model": replica.deployment.served_model_name, "prompt": "ping", "max_tokens": 1}
    headers = {"Authorization": f"Bearer {engine_api_key(replica.pk)}"}
    started = time.monotonic()
    try:
        resp = httpx.post(
            f"{url}/v1/completions", json=body, headers=headers, timeout=TEST_TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__} from {url}"
    ms = int((time.monotonic() - started) * 1000)
    if resp.status_code != 200:
        return False, f"HTTP {resp.status_code} from {url}"
    try:
        choices = resp.json().get("choices")
    except ValueError:
        choices = None
    if not choices:
        return False, f"no completion in the answer from {url}"
    return True, f"HTTP 200 in {ms} ms"
