"""`manage.py diagnose FILE|- [--json]`: the matcher from a shell (same list as the API)."""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from console.diagnosis import services
from console.errors import Invalid


class Command(BaseCommand):
    help = (
        "Diagnose an engine/driver log (FILE, or - for stdin). Exits 0 whether or not "
        "anything matched, 2 when the file cannot be read or the input is refused."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="log file to read, or - for standard input")
        parser.add_argument("--json", action="store_true", help="print the list as JSON")
        parser.add_argument("--exit-code", type=int, default=None, help="the engine's exit code")
        parser.add_argument("--signal", type=int, default=None, help="signal that killed it")
        parser.add_argument("--health", default=None, help="npu-smi health (OK, Warning, …)")

    def _read(self, name: str) -> str:
        if name == "-":
            raw = getattr(sys.stdin, "buffer", None)  # a text stream (tests) has no bytes
            if raw is None:
                return sys.stdin.read()
            data = raw.read(services.MAX_FILE_BYTES + 1)
        else:
            try:
                with open(name, "rb") as fh:
                    data = fh.read(services.MAX_FILE_BYTES + 1)
            except OSError as exc:
                raise CommandError(f"cannot read {name}: {exc.strerror}", returncode=2) from None
        if len(data) > services.MAX_FILE_BYTES:
            raise CommandError(f"{name}: larger than 256 MB; cut it to the failure", returncode=2)
        return services.decode_log(data)

    def handle(self, *args, **options):
        text, note = services.excerpt(self._read(options["file"]))
        if note:
            self.stderr.write(note)
        try:
            found = services.diagnose_text(
                text=text,
                exit_code=options["exit_code"],
                signal=options["signal"],
                health=options["health"],
            )
        except Invalid as exc:
            raise CommandError(exc.message, returncode=2) from None
        result = [d.as_dict() for d in found]
        if options["json"]:
            self.stdout.write(json.dumps(result, indent=2, ensure_ascii=False))
            return
        self.stdout.write(render_text(result))


def render_text(result: list[dict]) -> str:
    """The human-readable report: one block per diagnosis, best first."""
    if not result:
        return "No known failure pattern matched."
    blocks = []
    for rank, d in enumerate(result, start=1):
        lines = [f"{rank}. [{d['severity']}] {d['title']}  ({d['category']}, rule {d['rule']})"]
        lines.append(f"   {d['explanation']}")
        lines.append("   Evidence:")
        for e in d["evidence"]:
            where = f"line {e['line']}: " if e["line"] else ""
            lines.append(f"     {where}{e['text']}")
        lines.append("   What to do:")
        for n, step in enumerate(d["remediation"], start=1):
            lines.append(f"     {n}. {step}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
