"""A request's way in: its rate-limit admission (limits.py) and its replica pick (routing.py)
in ONE Redis round trip, one script that runs the admission check and, only when it lets the
request in, the pick. Both scripts are the ones limits.py and routing.py run alone (each
wrapped as a Lua function whose parameters shadow KEYS and ARGV), so the combined path
decides exactly what the two calls in a row would, atomically. Measured: one round trip of
the two the request path made before it was sent (docs/gateway.md). When Redis fails, the
request is served unlimited on this process's own counts; the gateway's client (redisclient.py)
then fails the next calls at once for its breaker's DOWN_S instead of each waiting on Redis.
"""

from __future__ import annotations

from .limits import ADMIT, Admission, Limiter, Refusal
from .redisclient import Turn
from .routing import PICK, Lease, Overloaded, Router, Upstream

# KEYS: the admission's keys, then the pick's. ARGV: the number of admission keys, of
# admission arguments, then the admission's arguments, then the pick's. Returns the
# admission's {index, what} when it does not admit (refused, or -2: the table is stale),
# else {-1, '', the pick's reply...}.
ADMIT_AND_PICK = f"""
local function admit(KEYS, ARGV)
{ADMIT}
end
local function pick(KEYS, ARGV)
{PICK}
end
local nk, na = tonumber(ARGV[1]), tonumber(ARGV[2])
local ak, aa, pk, pa = {{}}, {{}}, {{}}, {{}}
for i = 1, #KEYS do
  if i <= nk then ak[#ak + 1] = KEYS[i] else pk[#pk + 1] = KEYS[i] end
end
for i = 3, #ARGV do
  if i <= na + 2 then aa[#aa + 1] = ARGV[i] else pa[#pa + 1] = ARGV[i] end
end
if nk > 0 then
  local a = admit(ak, aa)
  if tonumber(a[1]) ~= -1 then
    return a
  end
end
local p = pick(pk, pa)
return {{-1, '', unpack(p)}}
"""


async def admit_and_pick(
    turn: Turn,
    limiter: Limiter,
    router: Router,
    model: str,
    upstreams: list[Upstream],
    *,
    token_id: int,
    affinity: str | None,
) -> Refusal | tuple[Admission, Overloaded] | tuple[Admission, list[Upstream], Lease]:
    """Admit the request and pick its replica: a Refusal (nothing counted), or its admission
    with the model overloaded (the admission is counted: the caller ends it), or its
    admission, the upstreams in the order to try and its lease."""
    # one pick plan for both tries: a "stale" answer ran no part of the pick
    pick = router.plan(model, upstreams, token_id=token_id, affinity=affinity)
    force = False
    for _ in range(2):
        plan = await limiter.plan(token_id, model, force=force)
        keys = plan.keys if plan else []
        args = plan.args if plan else []
        try:
            pipe, replies = turn.join()
            index = len(pipe)
            await router.script(turn.redis, ADMIT_AND_PICK)(
                keys=[*keys, *pick.keys],
                args=[len(keys), len(args), *args, *pick.args],
                client=pipe,  # queued: sent with the turn's other calls
            )
            (reply,) = await Turn.replies(replies, range(index, index + 1))
        except Exception as exc:  # serving outranks limiting and sharing
            admission = limiter.unlimited(plan, exc)
            return (admission, *await router.alone(pick, exc))
        index, what, *picked = reply
        admitted = limiter.outcome(plan, index, what) if plan else Admission("", ())
        if admitted is None:  # a limit changed since this process read them
            force = True
            continue
        if isinstance(admitted, Refusal):
            return admitted
        chosen = router.outcome(pick, picked)
        if isinstance(chosen, Overloaded):
            return admitted, chosen
        return (admitted, *chosen)
    # the limits changed under us twice: let it in unlimited, as Limiter.admit does
    chosen = await router.pick(turn.redis, model, upstreams, token_id=token_id, affinity=affinity)
    admitted = Admission(plan.admission.request_id if plan else "", ())
    return (admitted, chosen) if isinstance(chosen, Overloaded) else (admitted, *chosen)
