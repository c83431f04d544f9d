"""Log shipping under load: an "engine" process writes 10,000 lines/s into its run log while
the agent's shipper (workers/engine/shipper.py, 0.5 s scans) reads it and delivers batches to an
in-process sink that validates each as a LogBatch (no broker, no database: this measures the
agent side; console ingest is covered by tests/console/logs).

Prints lines written / delivered / lost (must be 0), whether order was kept, how many lines
carrying a secret were masked, the writer's worst write() latency (the engine never waits on
the shipper), the shipper's busy time against a plain `cat`-style read of the same file, and
the delivery lag after the writer stops.

    .venv/bin/python bench/log_shipping.py --seconds 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.contracts import LogBatch  # noqa: E402
from workers.engine import logs  # noqa: E402
from workers.engine.shipper import LogShipper  # noqa: E402

WRITER = r"""
import json, os, sys, time
path, rate, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
tick, per_tick = 0.01, max(1, rate // 100)
n, worst, start = 0, 0.0, time.monotonic()
while time.monotonic() - start < seconds:
    for _ in range(per_tick):
        n += 1
        secret = " HF_TOKEN=hf_0123456789abcdefghij" if n % 1000 == 0 else ""
        line = (f"INFO 12-02 10:00:00 [engine.py:42] seq={n} Avg prompt throughput: 12.3 "
                f"tokens/s, Running: 3 reqs{secret}\n").encode()
        t0 = time.perf_counter()
        os.write(fd, line)
        worst = max(worst, time.perf_counter() - t0)
    next_at = start + (n / per_tick) * tick
    time.sleep(max(0.0, next_at - time.monotonic()))
os.close(fd)
print(json.dumps({"written": n, "max_write_s": worst, "elapsed_s": time.monotonic() - start}))
"""


class Sink:
    """Checks each batch as the console would receive it: contiguous numbers, seq order."""

    def __init__(self) -> None:
        self.delivered = 0
        self.next_line_no = 1
        self.last_seq = 0
        self.in_order = True
        self.masked = 0
        self.leaked = 0
        self.batches = 0

    def __call__(self, payload: dict) -> None:
        batch = LogBatch.model_validate(payload)
        self.batches += 1
        if batch.first_line_no != self.next_line_no:
            self.in_order = False
        self.next_line_no = batch.first_line_no + len(batch.lines)
        for line in batch.lines:
            seq = int(line.split("seq=", 1)[1].split(" ", 1)[0])
            self.in_order &= seq == self.last_seq + 1
            self.last_seq = seq
            self.masked += "HF_TOKEN=***" in line
            self.leaked += "hf_0123" in line
        self.delivered += len(batch.lines)


def cat_seconds(path: Path) -> float:
    start = time.perf_counter()
    newlines = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1024 * 1024):
            newlines += chunk.count(b"\n")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=10_000, help="lines per second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = logs.replica_dir(Path(tmp), 1) / "gen1-run1.log"
        path.parent.mkdir(parents=True)
        path.touch()
        sink = Sink()
        shipper = LogShipper(tmp, "bench", sink, interval_s=0.5)
        busy = [0.0]

        def loop() -> None:
            while not shipper.stop.is_set():
                t0 = time.perf_counter()
                shipper.scan_once()
                busy[0] += time.perf_counter() - t0
                shipper.stop.wait(shipper.interval_s)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        writer = subprocess.run(
            [sys.executable, "-c", WRITER, str(path), str(args.rate), str(args.seconds)],
            capture_output=True,
            text=True,
            check=True,
        )
        stats = json.loads(writer.stdout)
        stopped = time.monotonic()
        while sink.delivered < stats["written"] and time.monotonic() - stopped < 30:
            time.sleep(0.01)
        lag = time.monotonic() - stopped
        shipper.stop.set()
        thread.join()
        size = path.stat().st_size
        plain = cat_seconds(path)
        # the same file again, from offset 0, by a fresh shipper into a no-op sink
        (path.parent / "shipped.json").unlink()
        replay = LogShipper(tmp, "bench", lambda p: None)
        t0 = time.perf_counter()
        while replay.scan_once():
            pass
        full_read = time.perf_counter() - t0
    lost = stats["written"] - sink.delivered
    print(f"duration           {stats['elapsed_s']:.1f} s at {args.rate} lines/s")
    print(f"lines written      {stats['written']}")
    print(f"lines delivered    {sink.delivered} in {sink.batches} batches")
    print(f"lost               {lost}")
    print(f"order kept         {sink.in_order and lost == 0}")
    print(f"secrets masked     {sink.masked} (leaked: {sink.leaked})")
    print(f"writer max write() {stats['max_write_s'] * 1e3:.3f} ms")
    print(f"delivery lag       {lag:.2f} s after the writer stopped")
    print(f"file               {size / 1e6:.1f} MB")
    print(f"shipper busy       {busy[0]:.2f} s during the run ({busy[0] / stats['elapsed_s']:.1%})")
    print(f"cat-style read     {plain * 1e3:.1f} ms for the whole file")
    print(f"shipper re-read    {full_read * 1e3:.1f} ms for the whole file (no sink)")
    print(f"ratio to cat       {full_read / plain:.1f}x")
    return 0 if lost == 0 and sink.in_order and sink.leaked == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
