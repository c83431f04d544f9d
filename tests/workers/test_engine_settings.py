"""The one table of engine settings (workers/engine_settings.py) and what the agent derives from
it: the spec it accepts and the argv it builds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers import engine_settings as es
from workers.contracts import EngineSpec
from workers.engine.argv import build_argv

BASE = dict(
    replica_id=1,
    generation=1,
    deployment="d",
    model_path="/m",
    served_model_name="m",
    port=8100,
)


FLAGGED = [r for r in es.ROWS if r.flag]  # a row without one is applied by the agent itself


def test_every_row_is_complete_and_flags_are_unique():
    flags = [f for r in FLAGGED for f in (r.flag, *r.aliases)]
    assert len(flags) == len(set(flags))
    for row in es.ROWS:
        assert row.help and row.label, row.name
        assert row.flag.startswith("--") or (not row.flag and not row.aliases), row.name
        assert row.kind in (int, float, bool, str), row.name
        assert set(row.shows) <= {es.FORM, es.DETAIL, es.LIST}, row.name


def test_the_spec_inherits_every_row_with_its_range():
    assert set(es.NAMES) <= set(EngineSpec.model_fields)
    for row in es.ROWS:
        if row.le is not None:  # the table's upper bound is the agent's too
            with pytest.raises(ValidationError, match=row.name):
                EngineSpec(**BASE, **{row.name: row.le + 1})


@pytest.mark.parametrize("row", FLAGGED, ids=lambda r: r.name)
def test_each_row_becomes_its_flag_when_set_and_only_then(row):
    """At the top of its range: 1048576 tokens must stay 1048576 on the command line."""
    top = row.le if row.le is not None else 2
    value = {bool: True, str: row.choices[-1] if row.choices else "x"}.get(row.kind, top)
    value = row.kind(value)
    argv = build_argv(EngineSpec(**BASE, **{row.name: value}), "py")
    assert row.flag in argv
    shown = argv[argv.index(row.flag) + 1] if row.kind is not bool else None
    if row.kind is str:
        assert shown == value
    elif row.kind is not bool:
        assert float(shown) == value and "e+" not in shown
    unset = build_argv(EngineSpec(**BASE, **{row.name: row.default}), "py")
    assert (row.flag in unset) == (
        row.always or (row.default not in (None, False, row.vllm_default))
    )


def test_npu_only_rows_never_reach_a_cpu_engine():
    spec = EngineSpec(**BASE, device="cpu", gpu_memory_utilization=0.5)
    assert "--gpu-memory-utilization" not in build_argv(spec, "py")
    assert "--gpu-memory-utilization" in build_argv(spec.model_copy(update={"device": "npu"}), "py")


def test_specs_stored_by_earlier_consoles_still_load():
    """An agent re-adopts engines from specs it saved: null quantization / memory share (what
    the console sent before the table) still load, as their defaults."""
    spec = EngineSpec(**BASE, quantization=None, gpu_memory_utilization=None)
    assert (spec.quantization, spec.gpu_memory_utilization) == ("", 0.9)


def test_a_block_size_in_bytes_is_refused_saying_it_counts_tokens():
    with pytest.raises(ValidationError, match="counts tokens"):
        EngineSpec(**BASE, block_size="16MB")
    assert EngineSpec(**BASE, block_size="128").block_size == 128


def test_managed_flags_cover_every_row_and_alias():
    managed = es.managed_flags()
    assert "" not in managed
    for row in FLAGGED:
        assert all(managed[f] == row.name for f in (row.flag, *row.aliases))
