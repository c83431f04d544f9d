"""What viewers see of a deployment's secrets, and what a `***` sent back means.

The stored spec keeps real values (the engines need them); everything shown — the API, the
pages, the audit log — goes through here or through workers.engine.argv.redact_argv. A spec
sent back with `***` where a secret was shown keeps the stored secret (restore_secrets), so
a GET -> PUT round trip never writes `***` over it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from console.errors import Invalid
from workers.engine.argv import REDACTED, is_secret_name, redact_argv, redact_value, unredact_argv
from workers.engine.shipper import mask_secrets

__all__ = ["redact_argv", "restore_secrets", "shown_env", "shown_lines"]

# names masked before is_secret_name existed; kept so that nothing shown before is shown now
_OLD_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def _secret_env_name(name: str) -> bool:
    return is_secret_name(name) or any(w in name for w in _OLD_WORDS)


def shown_env(env: Mapping[str, str]) -> dict[str, str]:
    """extra_env as viewers see it: secret-named values `***`, URL passwords hidden."""
    return {k: REDACTED if _secret_env_name(k) else redact_value(v) for k, v in env.items()}


def shown_lines(lines: Iterable[str] | None) -> list[str]:
    """Log lines as viewers see them (a replica's log_tail, lines read from the host):
    workers.engine.shipper.mask_secrets on each, the count unchanged."""
    return [mask_secrets(str(line)) for line in lines or []]


def restore_secrets(spec: dict, stored_args: list[str], stored_env: Mapping[str, str]) -> None:
    """Put the stored secrets back where `spec` (a PUT's) carries the `***` viewers were
    shown: in extra_args (workers.engine.argv.unredact_argv) and in extra_env (a value equal
    to what was shown for the stored one — `***`, or a URL with its password hidden — keeps
    the stored value). Changes `spec` in place. Raises Invalid for a `***` with no stored
    secret behind it (a literal `***` is never stored as a secret)."""
    try:
        spec["extra_args"] = unredact_argv(list(spec.get("extra_args") or []), stored_args)
    except ValueError as exc:
        raise Invalid(str(exc), field="extra_args") from None
    env = dict(spec.get("extra_env") or {})
    for name, value in env.items():
        if name in stored_env and value == shown_env({name: stored_env[name]})[name]:
            env[name] = stored_env[name]
        elif value == REDACTED and _secret_env_name(name):
            raise Invalid(
                f"{name}: *** stands for a stored value, and none is stored",
                field=f"extra_env.{name}",
            )
    spec["extra_env"] = env
