"""A bad rule file fails loudly at load time, naming the file and the rule."""

from __future__ import annotations

import textwrap

import pytest

from console.diagnosis.rulebook import RuleFileError, load_rules

GOOD = """
  - id: sample-rule
    category: npu-oom
    title: A rule
    severity: critical
    match:
      patterns: ['NPU out of memory']
    explanation: An explanation long enough to say something.
    remediation: ["Lower `--gpu-memory-utilization`."]
    samples: [{file: err-oom-npu-out-of-memory-v071.txt, top: true}]
    counter_samples: [{file: err-kv-cache-negative-memory-qwen3-14b-32g.txt}]
"""


def _write(tmp_path, body: str, name: str = "bad.yaml"):
    (tmp_path / name).write_text(textwrap.dedent(body))
    return tmp_path


def _load_error(tmp_path, rules: str, header: str = "") -> str:
    _write(tmp_path, header + "rules:\n" + rules)
    with pytest.raises(RuleFileError) as exc:
        load_rules(tmp_path)
    return str(exc.value)


def test_a_good_file_loads(tmp_path):
    _write(tmp_path, "rules:\n" + GOOD)
    assert [r.id for r in load_rules(tmp_path).rules] == ["sample-rule"]


def test_regex_that_does_not_compile_names_file_and_rule(tmp_path):
    message = _load_error(tmp_path, GOOD.replace("'NPU out of memory'", "'NPU (out'"))
    assert (
        "bad.yaml" in message
        and "sample-rule" in message
        and "not accepted by the linear-time engine" in message
    )


def test_unknown_category_is_refused(tmp_path):
    message = _load_error(tmp_path, GOOD.replace("npu-oom", "gpu-melted"))
    assert "bad.yaml: rule sample-rule: unknown category 'gpu-melted'" in message


def test_a_new_category_needs_a_written_reason(tmp_path):
    header = "categories:\n  - name: gpu-melted\n    reason: because\n"
    message = _load_error(tmp_path, GOOD.replace("npu-oom", "gpu-melted"), header)
    assert "bad.yaml" in message and "reason" in message


def test_missing_counter_samples_is_refused(tmp_path):
    body = GOOD.replace(
        "    counter_samples: [{file: err-kv-cache-negative-memory-qwen3-14b-32g.txt}]\n", ""
    )
    message = _load_error(tmp_path, body)
    assert "sample-rule" in message and "counter_samples" in message


def test_duplicate_ids_across_files_are_refused(tmp_path):
    _write(tmp_path, "rules:\n" + GOOD, "a.yaml")
    _write(tmp_path, "rules:\n" + GOOD, "b.yaml")
    with pytest.raises(
        RuleFileError, match=r"b.yaml: rule sample-rule: duplicate id \(also in a.yaml\)"
    ):
        load_rules(tmp_path)


def test_bad_telemetry_condition_and_unknown_field_are_refused(tmp_path):
    message = _load_error(
        tmp_path, GOOD.replace("patterns: ['NPU out of memory']", "telemetry: ['temp is hot']")
    )
    assert "sample-rule" in message and "telemetry" in message
    message = _load_error(
        tmp_path, GOOD.replace("severity: critical", "severity: critical\n    colour: red")
    )
    assert "sample-rule" in message and "colour" in message


def test_a_rule_needs_a_top_sample_and_a_sourced_text_sample(tmp_path):
    message = _load_error(tmp_path, GOOD.replace(", top: true", ""))
    assert "sample-rule: no sample is marked `top: true`" in message
    message = _load_error(
        tmp_path,
        GOOD.replace(
            "{file: err-oom-npu-out-of-memory-v071.txt, top: true}", "{text: x, top: true}"
        ),
    )
    assert "source" in message


def test_unreadable_yaml_names_the_file(tmp_path):
    _write(tmp_path, "rules: [unclosed\n")
    with pytest.raises(RuleFileError, match="bad.yaml: cannot read YAML"):
        load_rules(tmp_path)
