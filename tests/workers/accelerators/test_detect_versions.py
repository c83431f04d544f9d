"""detect_versions on fake /usr/local/Ascend trees."""

from __future__ import annotations

import platform
from pathlib import Path

from workers.accelerators import versions
from workers.accelerators.versions import detect_versions

# Contents as in Huawei's fault-collection doc (npu-smi-fault-collection-* sample).
DRIVER_INFO = "Version=24.1.rc1\nascendhal_version=7.35.19\nInnerversion=V100R001C15SPC006B220\n"
FIRMWARE_INFO = "Version=7.1.0.11.220\nfirmware_version=1.0\npackage_version=23.0.7\n"
TOOLKIT_INFO = (
    "package_name=Ascend-cann-toolkit\nversion=8.5.0\ninnerversion=V100R001C25SPC001B212\n"
)


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_driver_firmware_and_toolkit_of_the_current_arch(tmp_path) -> None:
    write(tmp_path, "usr/local/Ascend/driver/version.info", DRIVER_INFO)
    write(tmp_path, "usr/local/Ascend/firmware/version.info", FIRMWARE_INFO)
    arch = platform.machine()
    write(
        tmp_path,
        f"usr/local/Ascend/ascend-toolkit/latest/{arch}-linux/ascend_toolkit_install.info",
        TOOLKIT_INFO,
    )
    found = detect_versions(tmp_path)
    assert (found["npu_driver"], found["npu_firmware"], found["cann_toolkit"]) == (
        "24.1.rc1", "7.1.0.11.220", "8.5.0",
    )  # fmt: skip


def test_toolkit_of_another_arch_dir_and_new_cann_layout(tmp_path) -> None:
    write(tmp_path, "usr/local/Ascend/cann/aarch64-linux/ascend_toolkit_install.info", TOOLKIT_INFO)
    assert detect_versions(tmp_path)["cann_toolkit"] == "8.5.0"


def test_toolkit_from_version_cfg_running_version(tmp_path) -> None:
    # Line format as pasted from a CANN 8.0.RC2 host in a public README.
    cfg = (
        "runtime_running_version=[7.3.0.1.231:8.0.RC2]\n"
        "toolkit_running_version=[7.3.0.1.231:8.0.RC2]\n"
    )
    write(tmp_path, "usr/local/Ascend/ascend-toolkit/latest/version.cfg", cfg)
    assert detect_versions(tmp_path)["cann_toolkit"] == "8.0.RC2"


def test_empty_tree_gives_none_everywhere(tmp_path) -> None:
    found = detect_versions(tmp_path)
    assert list(found) == [
        "npu_driver", "npu_firmware", "cann_toolkit", "vllm", "vllm_ascend", "torch", "torch_npu",
    ]  # fmt: skip
    assert found["npu_driver"] is found["npu_firmware"] is found["cann_toolkit"] is None


def test_python_packages_come_from_metadata_without_import(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(versions, "PACKAGES", {"pytest": "pytest", "absent": "no-such-dist-xyz"})
    import pytest

    found = detect_versions(tmp_path)
    assert found["pytest"] == pytest.__version__ and found["absent"] is None


def test_packages_are_read_in_the_engines_environment(tmp_path):
    """The agent's own python has no vLLM: a multi-host group compares what the engines run,
    so the versions come from the engine interpreter (metadata only, nothing imported)."""
    from workers.accelerators import versions

    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'echo \'{"vllm": "0.11.0", "vllm_ascend": "0.11.0rc1", "torch": "2.7.1", '
        '"torch_npu": "2.7.1.post1", "planted": "x"}\'\n'
    )
    fake.chmod(0o755)
    versions._versions_in.cache_clear()
    found = versions.detect_versions(tmp_path, python=str(fake))
    assert (found["vllm"], found["vllm_ascend"], found["torch_npu"]) == (
        "0.11.0",
        "0.11.0rc1",
        "2.7.1.post1",
    )
    assert "planted" not in found
    broken = tmp_path / "bin" / "broken"
    broken.write_text("#!/bin/sh\necho not-json\n")
    broken.chmod(0o755)
    versions._versions_in.cache_clear()  # an interpreter that cannot tell: the agent's own view
    assert versions.package_versions(str(broken)) == versions.package_versions()
