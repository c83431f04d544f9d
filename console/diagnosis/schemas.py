"""API schemas for diagnosis (fields listed explicitly)."""

from ninja import Schema

from console.schemas import StrictIn


class DiagnoseIn(StrictIn):
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
    confidence: str  # high: a rule; medium: a code in the tables or an exception's words; low
    symptom: bool  # a consequence (the engine died), never ranked above a cause
    collect_next: list[str]  # when only symptoms were found: what to collect next


class FaultLevelOut(Schema):
    code: str
    level: str | None
    action: str
    known: bool
