"""The host agent, unchanged, plus one observer: the wall-clock time each task starts.

`python bench/agent_probe.py --simulated --node-name X` runs `python -m workers agent` with
a Celery `task_prerun` handler that pushes {task, kwargs, t} to the Redis list
BENCH_PRERUN_KEY on the agent's broker — the moment the agent is about to run the task
body. Used by bench/dispatch_latency.py; no Django here, like the agent itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from celery.signals import task_prerun  # noqa: E402

from workers.__main__ import main  # noqa: E402

KEY = os.environ.get("BENCH_PRERUN_KEY", "npc:bench:prerun")
_redis = redis.Redis.from_url(os.environ["NPU_AGENT_BROKER_URL"])


@task_prerun.connect
def _started(task_id=None, task=None, args=None, kwargs=None, **_):
    t = time.time()  # first, before the push costs anything
    _redis.rpush(KEY, json.dumps({"task": task.name, "kwargs": kwargs or {}, "t": t}))


if __name__ == "__main__":
    sys.exit(main(["agent", *sys.argv[1:]]))
