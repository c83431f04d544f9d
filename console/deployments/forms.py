"""The deployment form: browser fields -> the same DeploymentIn schema the API validates."""

from __future__ import annotations

import shlex

from pydantic import ValidationError

from console.deployments.masking import redact_argv, shown_env
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
LINE_FIELDS = ("extra_env", "node_selector")  # KEY=VALUE per line
# Every field the form carries; the rest of a DeploymentIn (preflight_override, ...) is API-only
# and an edit keeps the stored value (form_spec's `keep`).
FORM_FIELDS = frozenset(
    (*TEXT_FIELDS, *NUMBER_FIELDS, *BOOL_FIELDS, *LINE_FIELDS, "extra_args", "npu_ids")
)


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


def initial_from(dep) -> dict[str, object]:
    """A stored deployment as the form's fields hold it (the edit page's first render):
    secrets as viewers see them (`***`, kept by update_deployment when sent back unchanged),
    checkboxes "on" or empty, lists as the text the form parses back to the same values."""
    data: dict[str, object] = {k: getattr(dep, k) for k in (*TEXT_FIELDS, *NUMBER_FIELDS)}
    data |= {k: "on" if getattr(dep, k) else "" for k in BOOL_FIELDS}
    data["pinned_node"] = dep.pinned_node.name if dep.pinned_node_id else ""
    data["extra_args"] = shlex.join(redact_argv([str(a) for a in dep.extra_args or []]))
    data["extra_env"] = _lines(shown_env(dep.extra_env or {}))
    data["node_selector"] = _lines(dep.node_selector or {})
    data["npu_ids"] = ",".join(str(i) for i in dep.npu_ids or [])
    return {k: "" if v is None else v for k, v in data.items()}


def kept_fields(dep) -> dict[str, object]:
    """The spec fields the form does not show, as stored: an edit through the form keeps them."""
    return {
        k: getattr(dep, k)
        for k in DeploymentIn.model_fields
        if k not in FORM_FIELDS and hasattr(dep, k)
    }


def _lines(pairs: dict) -> str:
    return "\n".join(f"{k}={v}" for k, v in pairs.items())


def parse_form(post, *, keep: dict | None = None) -> DeploymentIn:
    """Raise Invalid naming the field, exactly as the API would. `keep`: values for the
    fields the form does not carry (an edit: kept_fields of the stored deployment)."""
    data: dict = dict(keep or {})
    data |= {k: post.get(k, "").strip() for k in TEXT_FIELDS if post.get(k, "").strip()}
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
