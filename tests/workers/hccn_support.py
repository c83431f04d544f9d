"""Real hccn_tool outputs (tests/fixtures/hccn/) and a runner that answers with them."""

from __future__ import annotations

from pathlib import Path

from workers.accelerators.process import ToolRun

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hccn"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


class FakeHccn:
    """A runner answering `hccn_tool -i N <option> -g` with fixture text."""

    def __init__(
        self, outputs: dict[str, str], per_device: dict[tuple[int, str], str] | None = None
    ):
        self.outputs, self.per_device, self.calls = outputs, per_device or {}, []

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        device, option = int(argv[2]), argv[3]
        text = self.per_device.get((device, option), self.outputs.get(option))
        if text is None:
            return ToolRun(" ".join(argv), 1, "", "Invalid option")
        return ToolRun(" ".join(argv), 0, text)


def healthy_outputs() -> dict[str, str]:
    return {
        "-link": fixture("link-up-faultdiag-doc.txt"),
        "-net_health": fixture("net-health-success-elastic-training-doc.txt"),
        "-ip": fixture("ip-910b1-arthurchiao-blog.txt"),
        "-gateway": fixture("gateway-910b-gpustack-test.txt"),
        "-tls": fixture("tls-off-faultdiag-doc.txt"),
        "-vnic": fixture("vnic-950-doc.txt"),
    }
