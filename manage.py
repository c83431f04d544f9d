#!/usr/bin/env python
"""Django's command-line utility for NPU Console."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.management import execute_from_command_line

    from console.env import EnvError

    try:
        execute_from_command_line(sys.argv)
    except EnvError as exc:
        sys.stderr.write(f"configuration error: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
