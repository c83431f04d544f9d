"""The deployment form: browser fields -> the same DeploymentIn schema the API validates."""

from __future__ import annotations

import shlex

from pydantic import ValidationError

from console.deployments.schemas import DeploymentIn
from console.errors import Invalid
from workers import engine_settings

_ROWS = engine_settings.ROWS
TEXT_FIELDS = (
    "name",
    "model_path",
    "model_label",
    "served_model_name",
    "device",
    "pinned_node",
    "cpu_binding",
    "desired_state",
    *(r.name for r in _ROWS if r.kind is str),
)
NUMBER_FIELDS = (
    "replicas",
    "npus_per_replica",
    "nodes_per_replica",
    *(r.name for r in _ROWS if r.kind in (int, float)),
)
BOOL_FIELDS = ("reschedule_on_node_loss", *(r.name for r in _ROWS if r.kind is bool))


def engine_rows(post) -> list[dict]:
    """The form's engine fields, from the table: each row with the value to show (what was
    posted, else the table's default) and how to render it (number, checkbox or choice)."""
    out = []
    for row in engine_settings.rows(engine_settings.FORM):
        value = post.get(row.name) if row.name in post else row.default
        widget = "check" if row.kind is bool else "select" if row.choices else "number"
        choices = [(c, row.choice_labels.get(c, c)) for c in row.choices]
        out.append(
            {"row": row, "value": "" if value is None else value, "widget": widget}
            | {"choices": choices, "step": row.step or ("any" if row.kind is float else 1)}
        )
    return out


def _pairs(text: str, field: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.strip():
            key, sep, value = line.partition("=")
            if not sep:
                raise Invalid(f"write one KEY=VALUE per line, got {line.strip()!r}", field=field)
            out[key.strip()] = value.strip()
    return out


def parse_form(post) -> DeploymentIn:
    """Raise Invalid naming the field, exactly as the API would."""
    data: dict = {k: post.get(k, "").strip() for k in TEXT_FIELDS if post.get(k, "").strip()}
    data.update({k: post.get(k).strip() for k in NUMBER_FIELDS if post.get(k, "").strip()})
    data.update({k: True for k in BOOL_FIELDS if post.get(k)})
    try:
        data["extra_args"] = shlex.split(
            post.get("extra_args", "")
        )  # split only: nothing is executed
    except ValueError as exc:
        raise Invalid(f"extra args: {exc}", field="extra_args") from None
    data["extra_env"] = _pairs(post.get("extra_env", ""), "extra_env")
    data["node_selector"] = _pairs(post.get("node_selector", ""), "node_selector")
    ids = post.get("npu_ids", "").replace(",", " ").split()
    if not all(i.isdigit() for i in ids):
        raise Invalid("NPU ids are numbers separated by commas", field="npu_ids")
    data["npu_ids"] = [int(i) for i in ids]
    try:
        return DeploymentIn.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ())) or "form"
        raise Invalid(f"{field}: {err.get('msg')}", field=field) from None
