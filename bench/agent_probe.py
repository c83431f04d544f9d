"""The host agent, unchanged, plus one observer: the wall-clock time each command starts.

`python bench/agent_probe.py --simulated --node-name X` runs `python -m workers agent` with
`workers.agent.run_command` wrapped: before the command runs, {task, args, id, t} is pushed to
the Redis list BENCH_PRERUN_KEY on the agent's broker — the moment the agent's command loop,
having read and verified the signed command, is about to run it (what Celery's `task_prerun`
marked before the signed channel). Used by bench/dispatch_latency.py; no Django here, like
the agent itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from workers import agent as agent_module  # noqa: E402
from workers import channel  # noqa: E402
from workers.__main__ import main  # noqa: E402

KEY = os.environ.get("BENCH_PRERUN_KEY", "npc:bench:prerun")
_redis = redis.Redis.from_url(channel.redis_url(os.environ["NPU_AGENT_BROKER_URL"]))
_run_command = agent_module.run_command


def _observed(agent, handlers: dict, command: dict) -> None:
    t = time.time()  # first, before the push costs anything
    doc = {"task": command["k"], "args": command["a"], "id": command["id"], "t": t}
    _redis.rpush(KEY, json.dumps(doc))
    _run_command(agent, handlers, command)


# command_loop looks run_command up in its module at each command: this is the one it runs.
agent_module.run_command = _observed

if __name__ == "__main__":
    sys.exit(main(["agent", *sys.argv[1:]]))
