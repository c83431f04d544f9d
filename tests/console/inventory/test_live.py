"""The dashboard heatmap's cells: value, level, state class and an escaped reason."""

from __future__ import annotations

from console.inventory.live import cell_html, heatmap


def test_a_hot_warning_chip_is_critical_and_its_title_says_both_reasons_escaped():
    chip = {"npu_id": 3, "chip_id": 0, "name": "910B<3>", "health": "Warning"}
    html = cell_html(chip | {"aicore_percent": 41.6, "temperature_c": 90.0}, "aicore")
    assert html == (
        '<span class="heatmap-cell heatmap-cell--crit" data-level="2" '
        'title="NPU 3.0 910B&lt;3&gt;: health Warning, temperature 90 °C ≥ 85 °C">42</span>'
    )


def test_levels_follow_each_metric_and_missing_values_have_none():
    chip = {"npu_id": 1, "health": "OK", "hbm_used_mb": 100, "hbm_total_mb": 400}
    assert 'data-level="1"' in cell_html(chip, "hbm") and ">25<" in cell_html(chip, "hbm")
    assert "data-level" not in cell_html(chip, "aicore") and ">–<" in cell_html(chip, "aicore")
    assert 'data-level="4"' in cell_html(chip | {"temperature_c": 84.0}, "temp")
    assert cell_html(chip, "health").endswith('title="NPU 1.0 : OK">OK</span>')
    unknown = cell_html({"npu_id": 1}, "health")
    assert "heatmap-cell--unknown" in unknown and "data-level" not in unknown


def test_heatmap_rows_tell_no_data_from_no_chips():
    nodes = [{"name": n, "status": "online"} for n in ("live", "quiet", "empty")]
    latest = {
        "live": {"chips": [{"npu_id": 0, "health": "Alarm"}]},
        "quiet": None,
        "empty": {"chips": [], "telemetry_reason": "npu-smi timed out"},
    }
    live, quiet, empty = heatmap(nodes, latest, "aicore")
    assert live["chips"] == 1 and "heatmap-cell--crit" in live["cells_html"]
    assert quiet["no_data"] and quiet["cells_html"] == ""
    assert not empty["no_data"] and empty["chips"] == 0
    assert empty["telemetry_reason"] == "npu-smi timed out"
