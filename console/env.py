"""Small typed helpers that read settings from the environment and fail loudly.

Every variable the console reads is listed once in `.env.example`. A bad value raises
`EnvError` whose message is one line naming the variable; `manage.py`, the ASGI app and the
Celery app turn it into that one line on stderr and exit status 2.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvError(ImproperlyConfigured):
    """A malformed environment variable; the message names it."""


def get_str(name: str, default: str | None = None) -> str | None:
    """The variable's value, or the content of the file named by `NAME_FILE`, or default."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise EnvError(f"{name}_FILE: cannot read {file_name!r}: {exc.strerror}") from exc
    return os.environ.get(name, default)


def get_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvError(f"{name}: expected a boolean (1/0, true/false, yes/no), got {raw!r}")


def get_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name}: expected an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}: must be >= {minimum}, got {value}")
    return value


def get_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def get_networks(name: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """A comma list of CIDR blocks (`10.0.0.0/8, fd00::/8`); empty or unset = []."""
    networks = []
    for item in get_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise EnvError(f"{name}: expected CIDR blocks like 10.0.0.0/8, got {item!r}") from None
    return networks


def check_url(name: str, value: str, schemes: set[str]) -> str:
    """Return `value` when it parses as a URL with one of `schemes`; else raise EnvError."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise EnvError(f"{name}: malformed URL ({exc})") from None
    if parts.scheme not in schemes:
        allowed = ", ".join(sorted(schemes))
        raise EnvError(f"{name}: malformed URL, scheme must be one of {allowed}, got {value!r}")
    if parts.scheme not in {"sqlite", "unix", "redis+socket"} and not parts.hostname:
        raise EnvError(f"{name}: malformed URL, no host in {value!r}")
    return value


def secret_key(var_dir: Path) -> str:
    """SECRET_KEY from the environment, else one generated once into var/secret_key (0600)."""
    value = get_str("SECRET_KEY")
    if value:
        return value
    path = var_dir / "secret_key"
    if path.exists():
        return path.read_text().strip()
    var_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process of the console wrote it first
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    return key


def get_port_range(name: str, default: tuple[int, int]) -> range:
    """`LOW-HIGH` (inclusive, 1024-65535, at least 10 ports) as a range; EnvError names the
    variable when it is malformed."""
    raw = get_str(name)
    if not raw:
        return range(default[0], default[1] + 1)
    m = re.fullmatch(r"\s*(\d{4,5})\s*-\s*(\d{4,5})\s*", raw)
    low, high = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not m or not 1024 <= low or high > 65535 or high - low < 9:
        raise EnvError(
            f"{name}: expected LOW-HIGH within 1024-65535, 10 ports at least, got {raw!r}"
        )
    return range(low, high + 1)
