"""Start-up of every console process: settings errors become one clear line, exit 2."""

from __future__ import annotations

import os
import sys


def setup_django() -> None:
    """`django.setup()`, turning a malformed environment variable into one line on stderr."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    from console.env import EnvError

    try:
        django.setup()
    except EnvError as exc:
        sys.stderr.write(f"configuration error: {exc}\n")
        sys.exit(2)
