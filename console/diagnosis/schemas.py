"""API schemas for diagnosis (fields listed explicitly)."""

from ninja import Schema


class DiagnoseIn(Schema):
    text: str
    exit_code: int | None = None
    signal: int | None = None
    health: str | None = None
    telemetry: dict[str, float] | None = None


class EvidenceOut(Schema):
    line: int | None
    text: str


class LinkOut(Schema):
    title: str
    url: str


class DiagnosisOut(Schema):
    rule: str
    category: str
    severity: str
    title: str
    evidence: list[EvidenceOut]
    remediation: list[str]
    explanation: str
    links: list[LinkOut]


class FaultLevelOut(Schema):
    code: str
    level: str | None
    action: str
    known: bool
