"""Telemetry ingest: the latest values in Redis, raw samples buffered there and flushed in batches.

Per heartbeat the cost is one Redis round trip and no database query (`record_heartbeat`). The
database is written by `flush_samples` (Celery beat, every few seconds) in bulk.

Redis keys (prefix KEY_PREFIX):
- `latest:<node>`  JSON of the last beat's chips/processes, expiring after LATEST_TTL_BEATS
  intervals — what pages, the API and /metrics read.
- `fleet`          a hash, node -> [received ms, *live.node_summary(chips)]: the dashboard's
  fleet totals without decoding every node's latest beat.
- `fleet:totals`   a hash, "1".."6" -> the sum of the `fleet` summaries, kept up to date by
  each beat (the delta from the node's previous summary) and rebuilt from `fleet` when missing;
  it expires every FLEET_TOTALS_REBUILD_S, so a rebuild bounds any float drift.
- `fleet:seen`     a sorted set, node -> received ms of its summary: the stale ones to take
  out of the totals are found by score, not by reading every summary.
- `samples`        a list, one compact JSON row per beat: [node_id, ms, [[chip fields]…]].
- `lock:flush`     held by the one flusher at work.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from operator import attrgetter

import orjson
import redis
from django.conf import settings
from django.db import connection
from django.utils import timezone

from console.hot import get_redis
from console.inventory.live import node_summary
from console.inventory.models import Node
from console.telemetry.models import HEALTH_CODES, ChipSample
from workers.contracts import Heartbeat

log = logging.getLogger(__name__)

KEY_PREFIX = "npc:"  # tests point this at a private prefix
LATEST_TTL_BEATS = 10
MAX_BUFFERED_BEATS = 500_000  # ~40 min of a 1,000-node fleet; older beats are dropped first
FLUSH_BATCH = 2_000  # beats per read/insert round
FLUSH_MAX_BATCHES = 50
FLUSH_LOCK_TIMEOUT_S = 300
FLEET_TOTALS_REBUILD_S = 300

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SMALLINT_MAX = 32767
LATEST_FIELDS = {"sent_at", "chips", "processes", "telemetry_ok", "telemetry_reason"}
SUMMARY_FIELDS = (
    "health",
    "temperature_c",
    "aicore_percent",
    "hbm_used_mb",
    "hbm_total_mb",
    "memory_used_mb",
    "memory_total_mb",
)
SAMPLE_FIELDS = (
    "npu_id",
    "chip_id",
    "aicore_percent",
    "hbm_used_mb",
    "hbm_total_mb",
    "memory_used_mb",
    "memory_total_mb",
    "temperature_c",
    "power_w",
    "health",
)
_sample_values = attrgetter(*SAMPLE_FIELDS)
_summary_values = attrgetter(*SUMMARY_FIELDS)


def latest_key(node_name: str) -> str:
    return f"{KEY_PREFIX}latest:{node_name}"


def fleet_key() -> str:
    return f"{KEY_PREFIX}fleet"


def fleet_totals_key() -> str:
    return f"{KEY_PREFIX}fleet:totals"


def fleet_seen_key() -> str:
    return f"{KEY_PREFIX}fleet:seen"


def _fleet_keys() -> list[str]:
    return [fleet_key(), fleet_totals_key(), fleet_seen_key()]


def samples_key() -> str:
    return f"{KEY_PREFIX}samples"


def flush_lock_key() -> str:
    return f"{KEY_PREFIX}lock:flush"


# --- ingest ---------------------------------------------------------------------------------
def record_heartbeat(
    *,
    node_id: int,
    node_name: str,
    received_at: datetime,
    hb: Heartbeat,
    pipe: redis.client.Pipeline | None = None,
    samples: list[bytes] | None = None,
    summaries: list[str | bytes] | None = None,
) -> None:
    """Store a beat's telemetry: replace the node's latest values, buffer its raw samples.

    No database query. One Redis round trip, or none when the caller passes its own `pipe`
    (the commands are queued there and run when the caller executes it; with `samples` and
    `summaries`, the raw-sample row and the fleet summary are appended there for the caller to
    send with a batch's others: see buffer_samples and put_summaries). Samples are keyed by
    `received_at` (ms): recording the same beat with the same time twice stores it once.
    """
    body = hb.model_dump_json(include=LATEST_FIELDS)
    doc = f'{{"received_at":"{received_at.isoformat()}",{body[1:]}'
    ms = int(received_at.timestamp() * 1000)
    row = orjson.dumps([node_id, ms, [_sample_values(c) for c in hb.chips]])
    chips = [dict(zip(SUMMARY_FIELDS, _summary_values(c), strict=True)) for c in hb.chips]
    summary = orjson.dumps([ms, *node_summary(chips)])
    ttl = int(settings.HEARTBEAT_INTERVAL_S * LATEST_TTL_BEATS)
    if pipe is not None:
        pipe.set(latest_key(node_name), doc, ex=ttl)
        if hb.chips and samples is not None:
            samples.append(row)
        elif hb.chips:
            buffer_samples(pipe, [row])
        if summaries is not None:
            summaries += (node_name, summary)
        else:
            put_summaries(pipe, [node_name, summary])
        return
    r = get_redis()
    pipe = r.pipeline(transaction=False)
    pipe.set(latest_key(node_name), doc, ex=ttl)
    if hb.chips:
        pipe.rpush(samples_key(), row)
    put_summaries(pipe, [node_name, summary])
    replies = pipe.execute()
    if hb.chips and replies[1] > MAX_BUFFERED_BEATS:  # the flush is not keeping up
        r.ltrim(samples_key(), -MAX_BUFFERED_BEATS, -1)


def put_summaries(pipe: redis.client.Pipeline, pairs: list[str | bytes]) -> None:
    """Queue the fleet summaries of one node or a batch (name, summary, name, summary, …):
    one script call keeps the fleet totals up to date for all of them."""
    if pairs:
        pipe.eval(_FLEET_PUT_LUA, 3, *_fleet_keys(), *pairs)


def buffer_samples(pipe: redis.client.Pipeline, rows: list[str]) -> None:
    """Queue raw-sample rows for the flush (one RPUSH for a batch), keeping the buffer bounded."""
    if rows:
        pipe.rpush(samples_key(), *rows)
        pipe.ltrim(samples_key(), -MAX_BUFFERED_BEATS, -1)


# --- latest values --------------------------------------------------------------------------
def stale_after_s() -> float:
    """A node's latest values are stale once this many seconds old (its offline threshold)."""
    return float(settings.HEARTBEAT_INTERVAL_S * settings.OFFLINE_AFTER_MISSED_BEATS)


def _decorate(raw: bytes | None, now: datetime) -> dict | None:
    if raw is None:
        return None
    try:
        doc = orjson.loads(raw)  # a dashboard page decodes 50 of these: 0.75 ms with json
    except orjson.JSONDecodeError:  # what json reads and orjson refuses (an int over 1e308)
        doc = json.loads(raw)
    received = datetime.fromisoformat(doc["received_at"])
    if received.tzinfo is None:  # a caller passed a naive time: the console runs in UTC
        received = received.replace(tzinfo=UTC)
    age = (now - received).total_seconds()
    doc["age_s"] = round(age, 3)
    doc["stale"] = age > stale_after_s()
    return doc


def latest(node_name: str, *, now: datetime | None = None) -> dict | None:
    """The node's last telemetry, or None when none arrived within LATEST_TTL_BEATS intervals.

    The dict holds received_at, sent_at (ISO strings), chips, processes, telemetry_ok,
    telemetry_reason, plus age_s and stale (older than the offline threshold) as of `now`.
    """
    return _decorate(get_redis().get(latest_key(node_name)), now or timezone.now())


# The fleet totals are kept as running sums (KEYS[2]) of the summaries in the `fleet` hash
# (KEYS[1]), so a dashboard render reads six numbers whatever the fleet's size. Invariant: the
# sums are those of every readable summary in the hash, and the sorted set (KEYS[3]) holds each
# summary's time. Both scripts run atomically in Redis; cjson is built into its Lua. Sums go
# out as '%.17g' strings: Lua numbers are doubles and Redis would truncate a returned number.
#
# Per beat, for one node or a whole batch (ARGV = name, summary, name, summary, …): store each
# node's summary, then add the sum of (new - previous) to the sums, one HINCRBYFLOAT per field
# for the batch — only while the sums exist; when they do not (expired, evicted, first use),
# the next read rebuilds them.
# Sent with EVAL, not EVALSHA: a beat's pipeline stays one round trip (redis-py checks a
# pipeline's scripts with SCRIPT EXISTS first) and Redis caches the compiled script.
_FLEET_PUT_LUA = """
local has_sums = redis.call('EXISTS', KEYS[2]) == 1
local d = {0, 0, 0, 0, 0, 0}
for i = 1, #ARGV, 2 do
  local name, raw = ARGV[i], ARGV[i + 1]
  local new = cjson.decode(raw)
  local old = redis.call('HGET', KEYS[1], name)
  redis.call('HSET', KEYS[1], name, raw)
  redis.call('ZADD', KEYS[3], new[1], name)
  if has_sums then
    for j = 1, 6 do d[j] = d[j] + new[j + 1] end
    if old then
      local ok, o = pcall(cjson.decode, old)
      if ok and type(o) == 'table' and #o == 7 then
        for j = 1, 6 do d[j] = d[j] - o[j + 1] end
      end
    end
  end
end
if not has_sums then return 0 end
for j = 1, 6 do
  if d[j] ~= 0 then redis.call('HINCRBYFLOAT', KEYS[2], j, string.format('%.17g', d[j])) end
end
return 1
"""

# Per read: summaries older than ARGV[1] (ms) — a node gone quiet or deleted — are taken out of
# the sums and removed; then the six sums. Without sums, they are rebuilt from every summary
# (unreadable ones dropped), the sorted set with them, to expire after ARGV[2] seconds.
_FLEET_TOTALS_LUA = """
local oldest = tonumber(ARGV[1])
local function summary(raw)
  if not raw then return nil end
  local ok, s = pcall(cjson.decode, raw)
  if ok and type(s) == 'table' and #s == 7 then return s end
  return nil
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[1])
  for _, name in ipairs(stale) do
    local s = summary(redis.call('HGET', KEYS[1], name))
    if s then
      for j = 1, 6 do
        if s[j + 1] ~= 0 then
          redis.call('HINCRBYFLOAT', KEYS[2], j, string.format('%.17g', -s[j + 1]))
        end
      end
    end
    redis.call('HDEL', KEYS[1], name)
    redis.call('ZREM', KEYS[3], name)
  end
  return redis.call('HMGET', KEYS[2], 1, 2, 3, 4, 5, 6)
end
local sums = {0, 0, 0, 0, 0, 0}
local drop = {}
local seen = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local s = summary(all[i + 1])
  if not s or s[1] < oldest then
    drop[#drop + 1] = all[i]
  else
    for j = 1, 6 do sums[j] = sums[j] + s[j + 1] end
    seen[#seen + 1] = s[1]
    seen[#seen + 1] = all[i]
  end
end
for i = 1, #drop, 500 do
  redis.call('HDEL', KEYS[1], unpack(drop, i, math.min(i + 499, #drop)))
end
redis.call('DEL', KEYS[3])
for i = 1, #seen, 1000 do
  redis.call('ZADD', KEYS[3], unpack(seen, i, math.min(i + 999, #seen)))
end
local out = {}
for j = 1, 6 do
  out[j] = string.format('%.17g', sums[j])
  redis.call('HSET', KEYS[2], j, out[j])
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
return out
"""


def fleet_totals(*, now: datetime | None = None) -> list:
    """The sum of every node's live summary (live.node_summary's fields: chips, memory used MB,
    memory total MB, AICore sum, AICore count, chips needing attention), for the fleet totals.

    A summary counts as long as the node's `latest` would (LATEST_TTL_BEATS intervals); older
    ones — a node gone quiet or deleted — are taken out and removed. Reads the running sums
    the beats keep (a few commands in Redis, whatever the fleet's size); rebuilds them from
    every summary when missing, at most every FLEET_TOTALS_REBUILD_S.
    """
    oldest = (
        (now or timezone.now()).timestamp() - settings.HEARTBEAT_INTERVAL_S * LATEST_TTL_BEATS
    ) * 1000
    r = get_redis()
    reply = r.register_script(_FLEET_TOTALS_LUA)(
        keys=_fleet_keys(), args=[repr(oldest), FLEET_TOTALS_REBUILD_S]
    )
    # running float sums: the counts are whole numbers up to float error, so round, not int()
    chips, used, total, aicore, aicore_n, alerts = (float(v) for v in reply)
    return [round(chips), round(used), round(total), aicore, round(aicore_n), round(alerts)]


def latest_many(
    node_names: Iterable[str], *, now: datetime | None = None
) -> dict[str, dict | None]:
    """`latest` for many nodes in one MGET round trip, keyed by name in the order given."""
    names = list(node_names)
    if not names:
        return {}
    now = now or timezone.now()
    values = get_redis().mget([latest_key(n) for n in names])
    return {name: _decorate(raw, now) for name, raw in zip(names, values, strict=True)}


# --- flush ----------------------------------------------------------------------------------
def flush_samples(*, batch: int = FLUSH_BATCH, max_batches: int = FLUSH_MAX_BATCHES) -> int:
    """Move buffered samples from Redis into ChipSample; returns the beats consumed.

    Each round reads the oldest `batch` beats (LRANGE), inserts them (one transaction,
    conflicts ignored) and only then removes them (LTRIM). A crash between insert and trim
    leaves them in the buffer: the next flush inserts them again and the unique
    (node, npu, chip, time) constraint drops the duplicates — nothing is lost or doubled.
    One flusher at a time (a Redis lock); a second one returns 0 at once. Beats of nodes
    deleted meanwhile and rows that do not decode are dropped (logged).
    """
    r = get_redis()
    lock = r.lock(flush_lock_key(), timeout=FLUSH_LOCK_TIMEOUT_S, blocking=False)
    if not lock.acquire():
        return 0
    consumed = 0
    try:
        for _ in range(max_batches):
            raw = r.lrange(samples_key(), 0, batch - 1)
            if not raw:
                break
            store_samples(_decode(raw))
            r.ltrim(samples_key(), len(raw), -1)
            consumed += len(raw)
            if len(raw) < batch:
                break
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            log.warning("telemetry flush outlived its lock (%ss)", FLUSH_LOCK_TIMEOUT_S)
    return consumed


SAMPLE_COLUMNS = (
    "node_id",
    "npu_id",
    "chip_id",
    "time",
    "aicore_percent",
    "hbm_used_mb",
    "hbm_total_mb",
    "memory_used_mb",
    "memory_total_mb",
    "temperature_c",
    "power_w",
    "health",
)


def _decode(raw: list[bytes]) -> list[tuple]:
    """Buffered beats -> sample rows (SAMPLE_COLUMNS), one per chip and time."""
    rows: dict[tuple, tuple] = {}
    for item in raw:
        try:
            node_id, ms, chips = orjson.loads(item)
            time = EPOCH + timedelta(milliseconds=int(ms))
            for chip in chips:
                row = _sample(int(node_id), time, chip)
                rows[row[:4]] = row
        except (ValueError, TypeError, OverflowError) as exc:
            log.warning("telemetry: dropped an undecodable buffered beat (%s): %.200r", exc, item)
    return list(rows.values())


def _sample(node_id: int, time: datetime, chip: list) -> tuple:
    """A row from a buffered chip; out-of-range values become NULL so one bad agent cannot
    wedge the flush (ids out of range raise ValueError: the beat is dropped)."""
    npu, chip_id, aicore, hbm_used, hbm_total, mem_used, mem_total, temp, power, health = chip
    if not (0 <= int(npu) <= SMALLINT_MAX and 0 <= int(chip_id) <= SMALLINT_MAX):
        raise ValueError(f"npu/chip id out of range: {npu}/{chip_id}")
    return (
        node_id,
        int(npu),
        int(chip_id),
        time,
        _finite(aicore),
        _int32(hbm_used),
        _int32(hbm_total),
        _int32(mem_used),
        _int32(mem_total),
        _finite(temp),
        _finite(power),
        HEALTH_CODES.get(health.strip().lower()) if isinstance(health, str) else None,
    )


def _finite(value) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _int32(value) -> int | None:
    if isinstance(value, int | float) and math.isfinite(value) and abs(value) < 2**31:
        return int(value)
    return None


def store_samples(rows: list[tuple]) -> int:
    """Insert sample rows (SAMPLE_COLUMNS), skipping ones already stored and ones whose node
    no longer exists. Idempotent. Returns how many were offered for insert.

    One INSERT … ON CONFLICT DO NOTHING per 1,000 rows through the cursor (SQLite and
    PostgreSQL both have it): at 10,000 nodes the flush writes 16,000 rows a second, and
    building a model instance per row cost more than the insert itself."""
    if not rows:
        return 0
    node_ids = {row[0] for row in rows}
    known = set(Node.objects.filter(pk__in=node_ids).values_list("pk", flat=True))
    if known != node_ids:
        log.info("telemetry: dropped samples of deleted nodes %s", sorted(node_ids - known))
        rows = [row for row in rows if row[0] in known]
    ops = connection.ops
    table = ops.quote_name(ChipSample._meta.db_table)
    columns = ", ".join(ops.quote_name(c) for c in SAMPLE_COLUMNS)
    adapt = ops.adapt_datetimefield_value
    for i in range(0, len(rows), 1000):
        chunk = rows[i : i + 1000]
        values = ", ".join(["(" + ", ".join(["%s"] * len(SAMPLE_COLUMNS)) + ")"] * len(chunk))
        params = [v for row in chunk for v in (*row[:3], adapt(row[3]), *row[4:])]
        with connection.cursor() as cursor:
            # names from the model, placeholders only: no value is formatted into the SQL
            sql = f"INSERT INTO {table} ({columns}) VALUES {values} ON CONFLICT DO NOTHING"  # noqa: S608
            cursor.execute(sql, params)
    return len(rows)
