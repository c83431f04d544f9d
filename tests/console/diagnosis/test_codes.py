"""The published code tables: loaded whole, every entry sourced, looked up by an on-call
engineer on the rules page and through the API, and recognised in log lines."""

from __future__ import annotations

import json

import pytest

from console.diagnosis import codes
from console.diagnosis.matcher import diagnose
from console.diagnosis.recognisers import classify, vocabulary
from console.diagnosis.rulebook import rulebook


def test_the_tables_are_complete_and_every_entry_has_a_source_and_a_known_category():
    book = codes.load()
    kinds = {}
    for entry in book.codes.values():
        kinds[entry.kind] = kinds.get(entry.kind, 0) + 1
        assert entry.source_url.startswith("https://github.com/"), entry.code
        assert entry.category in rulebook().categories, entry.code
    assert kinds["acl"] >= 200  # ACL + runtime (107/207/507/5079) + graph engine
    assert kinds["message"] >= 406  # the error_code.json catalogue at least
    assert kinds["dcmi"] >= 20
    assert kinds["driver"] == 100  # drvError_t 1-99 and 0xfffe, hicann/driver ascend_hal_error.h
    runtime = [c for c in book.codes if c.startswith("507")]
    assert len(runtime) > 37  # past 507036, where older copies of rt_error_codes.h stop


@pytest.mark.parametrize(
    ("code", "category", "exact"),
    [
        ("507035", "op-exception", True),  # ACL_ERROR_RT_VECTOR_CORE_EXCEPTION
        ("EI0006", "hccl-failure", True),
        ("ei0006", "hccl-failure", True),
        ("EL0004", "npu-oom", True),
        ("-8020", "device-busy", True),
        ("-8005", "npu-init-failure", True),  # DCMI could not open the devices (round 4)
        ("EI0999", "hccl-failure", False),  # unknown code of a known module: the module's
        ("107999", "config-invalid", False),  # unknown runtime code: its class's
        # aclnn status codes (hicann/ops-nn aclnn返回码.md)
        ("561003", "driver-missing", True),  # no kernel found: the ops package is missing
        ("561112", "driver-missing", True),
        ("561104", "version-mismatch", True),  # attributes differ from the kernel library's
        ("561103", "op-exception", True),
        ("561199", "op-exception", False),  # unknown aclnn internal code: its class's
        ("107002", "npu-init-failure", True),  # no context: the device was never set up
        # the driver's drvError_t (hicann/driver pkg_inc/ascend_hal_error.h), typed as a log
        # prints it, by key, or by name
        ("drvErr=87", "device-busy", True),  # DRV_ERROR_RESOURCE_OCCUPIED
        ("DRV-87", "device-busy", True),
        ("drvRetCode 14", "device-busy", True),  # DRV_ERROR_NO_RESOURCES
        ("DRV_ERROR_BUS_DOWN", "npu-health", True),  # 33
        ("drv_ret_code=6", "npu-oom", True),
        ("drvErr=0xfffe", "version-mismatch", True),  # DRV_ERROR_NOT_SUPPORT
    ],
)
def test_lookup(code, category, exact):
    entry = codes.codebook().lookup(code)
    assert entry is not None and entry.category == category and entry.exact is exact


def test_a_generic_aclnn_code_gives_way_to_the_words_on_its_line():
    """561103 (a null pointer inside an operator) says less than the EZ9999 line before it."""
    text = (
        "EZ9999: 2024-07-27-05:01:55.672.958  get unsupported atten_mask shape, the shape is "
        "[2, 1, 28800, 28800][FUNC:AnalyzeOptionalInput]\n"
        "launch failed for FlashAttentionScore, errno:561103.\n"
    )
    found = diagnose(text)
    assert found[0].category == "op-unsupported"
    assert any(d.rule == "code:561103" and d.confidence == "low" for d in found)


def test_ee1001_says_only_that_an_argument_was_refused_its_reason_says_what():
    """EE1001 is the runtime's fallback code; the reason after it names the failure."""
    text = (  # tests/fixtures/corpus/logs/lmdeploy-2585-docker-no-device-context-null.log
        "[ERROR] RUNTIME(1,python3.10):2024-10-14-07:24:13.025.050 [error_message_manage.cc:48]1 "
        "FuncErrorReason:report error module_name=EE1001\n"
        "[ERROR] RUNTIME(1,python3.10):2024-10-14-07:24:13.025.157 [error_message_manage.cc:48]1 "
        "FuncErrorReason:rtGetDevMsg execute failed, reason=[context pointer null]\n"
    )
    found = diagnose(text)
    assert found[0].category == "npu-init-failure"
    assert any(d.rule == "code:EE1001" and d.confidence == "low" for d in found)
    assert diagnose("EE1001: The argument is invalid.")[0].category == "config-invalid"


def test_a_pydantic_value_error_is_a_rejected_setting_unless_its_words_say_more():
    refused = diagnose(
        "  Value error, Ascend scheduler is enabled without chunked prefill feature. Argument "
        "max_num_batched_tokens (4096) is smaller than max_model_len (32768). [type=value_error]"
    )
    assert refused and refused[0].category == "config-invalid"
    cache = diagnose("  Value error, No available memory for the cache blocks. [type=value_error]")
    assert cache and cache[0].category == "kv-cache-insufficient"
    assert diagnose("the value error, said nobody") == []


def _cpu_log(name: str) -> str:
    from tests.console.diagnosis.corpus import CPU_CORPUS
    from tests.console.diagnosis.samples import log_text

    return log_text(CPU_CORPUS / name)


def test_pydantics_reason_outranks_its_summary_line():
    """'1 validation error for ModelConfig' names a class; the Value error line after it names
    the reason (a model directory without config.json: a missing model, not a setting)."""
    text = _cpu_log("config-json-missing.log")  # a development log made on this CPU
    assert "1 validation error for ModelConfig" in text
    assert diagnose(text)[0].category == "model-not-found"
    # vLLM's process prefix before it; words of pydantic's input repr after it do not count
    found = diagnose(
        "(APIServer pid=7) pydantic_core._pydantic_core.ValidationError: 1 validation error for "
        "CacheConfig\n(APIServer pid=7)   Value error, Cannot find the config file for awq "
        "[type=value_error, input_value=ArgsKwargs((), {'shutdown_timeout': 0})]"
    )
    assert found[0].category == "config-invalid" and found[0].confidence == "medium"


def test_a_deprecation_warning_is_never_read_as_the_cause():
    line = (
        "/venv/lib/python3.11/site-packages/vllm/entrypoints/openai/api_server.py:24: "
        "DeprecationWarning: `vllm.entrypoints.openai.api_server` is deprecated and will likely "
        "beunsupported in a future version."
    )
    assert line.split(": ", 1)[1] in _cpu_log("host-address-not-local.log")
    assert diagnose(line) == []
    assert diagnose(line.replace("DeprecationWarning", "UserWarning"))[0].category == (
        "op-unsupported"
    )
    found = diagnose(_cpu_log("host-address-not-local.log"))
    assert found[0].category == "config-invalid"


@pytest.mark.parametrize(
    "line",
    [
        "Killed",
        "(raylet) 2 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed",
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.",
    ],
)
def test_a_kill_by_the_oom_killer_is_host_memory(line):
    found = diagnose(line)
    assert found and found[0].category == "host-oom"


def test_lookup_of_nothing_known():
    assert codes.codebook().lookup("EX1234") is None
    assert codes.codebook().lookup("hello") is None
    assert codes.codebook().lookup("DRV-100") is None  # past the last drvError_t
    assert codes.codebook().lookup("87") is None  # a bare number is no driver code


@pytest.mark.parametrize(
    ("line", "key"),
    [
        # the shapes as real plog lines print them (corpus logs of vllm-ascend #248 and #5213,
        # MinerU #4233, vllm-ascend #8186)
        (
            "[ERROR] ATRACE(618,python3):2025-03-06-01:09:06.981.451 [trace_driver_api.c:56]"
            "(tid:618) get platform info failed, drvErr=87.",
            "DRV-87",
        ),
        (
            "[ERROR] RUNTIME(6651,):2025-12-20-12:52:31.887.683 [npu_driver.cc:1065]6651 "
            "NormalSqCqAllocate:[drv api] halSqCqAllocate failed: device_id=3, drvRetCode=14!",
            "DRV-14",
        ),
        ("GetDeviceCount:Call drvGetDevNum, drvRetCode=87.", "DRV-87"),
        (
            "[drv api] halCqReportRecv failed: device_id=1, ts_id=0, drv_ret_code=33[FUNC:X]",
            "DRV-33",
        ),
    ],
)
def test_a_driver_code_is_found_where_the_plog_prints_it(line, key):
    assert [e.code for e in codes.find_codes(line)] == [key]


def test_a_driver_code_is_not_read_from_other_numbers():
    # a runtime's inner code printed as drvRetCode is past the driver's table
    assert codes.find_codes("DevMemAllocManaged failed: device_id=0, drvRetCode=117571606!") == []
    assert codes.find_codes("driver 87 loaded, drv version 23.0.3") == []
    assert codes.find_codes("hdrvErr=87") == []  # not a word of its own


def test_a_log_that_holds_only_a_driver_code_gets_its_meaning_not_nothing():
    """vllm-ascend #248: one 910B mounted into two containers; the second's only error line."""
    found = diagnose(
        "[INFO] RUNTIME(618,python3):2025-03-06-01:09:06.985.224 [task_fail_callback_manager.cc:52]"
        " 618 TaskFailCallBackManager: Constructor.\n"
        "[ERROR] ATRACE(618,python3):2025-03-06-01:09:06.981.451 [trace_driver_api.c:56](tid:618) "
        "get platform info failed, drvErr=87.\n"
    )
    top = found[0]
    assert top.rule == "code:DRV-87" and top.category == "device-busy"
    assert top.confidence == "medium" and "RESOURCE_OCCUPIED" in top.title
    assert top.links[0]["url"].startswith("https://github.com/hicann/driver/")
    assert "is an Ascend driver return code" in top.explanation


def test_codes_are_found_by_shape_and_context_not_in_any_number():
    found = codes.find_codes("RuntimeError: ACL stream synchronize failed, error code:507035")
    assert [e.code for e in found] == ["507035"]
    assert codes.find_codes("started worker pid 507035 at 12:00") == []
    assert [e.code for e in codes.find_codes("dcmi module initialize failed. ret is -8005")] == [
        "-8005"
    ]
    assert [e.code for e in codes.find_codes("[ERROR] EI0006: Getting socket times out")] == [
        "EI0006"
    ]


def test_a_code_without_a_rule_still_gets_its_table_meaning_with_lower_confidence():
    found = diagnose("[ERROR] RUNTIME: rtStreamSynchronize failed, error code is 507048")
    top = found[0]
    assert top.rule == "code:507048" and top.confidence in {"medium", "low"}
    assert top.links and top.links[0]["url"].startswith("https://github.com/hicann/")


def test_the_new_users_lines_from_the_issue_are_recognised():
    hccl = diagnose("[ERROR] HCCL(1234,python):2025-01-01 wait socket establish timeout, role[0]")
    assert hccl and hccl[0].category == "hccl-failure"
    module = diagnose(
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'vllm'"
    )
    assert module[0].category == "version-mismatch" and not module[0].symptom
    assert module[0].evidence and "No module named 'vllm'" in module[0].evidence[0].text


def test_only_symptoms_say_so_and_what_to_collect_next():
    found = diagnose(
        "ERROR [core.py:1] EngineCore failed to start.\nvllm.v1.engine.exceptions.EngineDeadError:"
        " EngineCore encountered an issue."
    )
    assert found and all(d.symptom for d in found)
    assert found[0].collect_next and any("plog" in step for step in found[0].collect_next)


@pytest.mark.parametrize("word", vocabulary(), ids=lambda w: w.entry.id)
def test_every_vocabulary_entry_reads_its_examples_and_not_its_counters(word):
    from console.diagnosis.recognisers import read_line

    for example in word.entry.examples:
        reading = read_line(example.text, error_line=True)
        assert reading is not None and reading.entry == word.entry, example.text
    for counter in word.entry.counter:
        reading = read_line(counter.text, error_line=True)
        assert reading is None or reading.entry != word.entry, counter.text
    assert classify(None, "") is None


def test_api_looks_up_a_code(viewer_client):
    resp = viewer_client.get("/api/v1/diagnose/codes/507035")
    assert resp.status_code == 200
    body = resp.json()
    assert (
        body["name"] == "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION" and body["category"] == "op-exception"
    )
    assert body["source"]["url"].startswith("https://github.com/hicann/runtime/")
    driver = viewer_client.get("/api/v1/diagnose/codes/drvErr=87").json()
    assert driver["code"] == "DRV-87" and driver["kind"] == "driver"
    by_name = viewer_client.get("/api/v1/diagnose/codes/DRV_ERROR_RESOURCE_OCCUPIED").json()
    assert by_name["code"] == "DRV-87"
    unknown = viewer_client.get("/api/v1/diagnose/codes/EX1234")
    assert unknown.status_code == 422 and unknown.json()["field"] == "code"


def test_rules_page_looks_up_a_code(viewer_client):
    page = viewer_client.get("/diagnose/rules/", {"code": "EI0006"}).content.decode()
    assert "data-code-result" in page and "hccl-failure" in page and "EI0006" in page
    driver = viewer_client.get("/diagnose/rules/", {"code": "drvErr=87"}).content.decode()
    assert "data-code-result" in driver and "DRV_ERROR_RESOURCE_OCCUPIED" in driver
    assert "device-busy" in driver and "hicann/driver" in driver
    fault = viewer_client.get("/diagnose/rules/", {"code": "80E01801"}).content.decode()
    assert "handling level" in fault
    nothing = viewer_client.get("/diagnose/rules/", {"code": "EX1234"}).content.decode()
    assert "No Ascend code" in nothing


def test_the_api_runs_within_a_time_limit(viewer_client, monkeypatch):
    from console.diagnosis import services

    monkeypatch.setattr(services, "TIME_LIMIT_S", -1.0)  # already passed: the pass stops at once
    resp = viewer_client.post(
        "/api/v1/diagnose", data=json.dumps({"text": "x\n" * 1000}), content_type="application/json"
    )
    assert resp.status_code == 422 and resp.json()["field"] == "text"
    assert "took longer" in resp.json()["message"]


def test_an_exception_is_read_after_full_width_punctuation_or_cjk_text():
    # pasted from a Chinese issue: "the error is as follows：AttributeError: …"
    found = diagnose("报错如下：AttributeError: module 'torch_npu' has no attribute 'npu_geglu'")
    assert found and found[0].category == "version-mismatch"
    assert found[0].rule == "words:python-environment:exception"


@pytest.mark.parametrize(
    ("line", "category"),
    [
        # the loader's own wording, with no ERROR level and no exception class
        (
            "npu-smi: error while loading shared libraries: libc_sec.so: cannot open shared "
            "object file: No such file or directory",
            "driver-missing",
        ),
        (
            "The quantization method awq is not supported for the current GPU. Minimum "
            "capability: 75. Current capability: 70.",
            "op-unsupported",
        ),
        (
            "Some link files (e.g. libascend_hal.so) can not be found and importing `torch_npu` "
            "will raise `No such file or directory` error.",
            "driver-missing",
        ),
        # round 4 (development logs): the loader's and pip's wordings, a retyped exception
        # class, torch_npu's CPU-fallback warning, Chinese failure words (its c10d socket
        # timeout line is now a sample of the c10d-socket-timeout rule)
        ("torch-npu==2.7.1导入时报错undefined symbol: MsprofSysCycleTime", "version-mismatch"),
        ("报错信息显示与vllm版本不匹配", "version-mismatch"),
        (
            "When installing vllm and vllm-ascend, a dependency conflict occurs regarding the "
            "torch version.",
            "version-mismatch",
        ),
        ("0SError: Can't load the configuration of '/data/0wen/0wen3-0.6B'", "model-not-found"),
        (
            "Warning: CAUTION: The operator 'aten::isin.Tensor_Tensor_out' is not currently "
            "supported on the NPU backend and will fall back to run on the CPU.",
            "op-unsupported",
        ),
        # round 5 (development logs): the linker's missing library, a driver "too old", the
        # hardware lacking a data type, PyTorch's view refusing a shape
        ("/usr/bin/ld: cannot find -lcuda: No such file or directory", "driver-missing"),
        (
            "torch/cuda/__init__.py:180: UserWarning: CUDA initialization: The NVIDIA driver on "
            "your system is too old (found version 12080).",
            "version-mismatch",
        ),
    ],
)
def test_an_error_line_is_recognised_by_its_failure_words_without_a_log_level(line, category):
    found = diagnose(line)
    assert found and found[0].category == category and found[0].confidence == "low"


def test_a_symptom_rule_on_the_same_line_does_not_hide_the_code_that_names_the_cause():
    # one JSON error body: the ERR00100 trailer (a symptom rule) and EZ1001 share the line
    line = (
        'AssertionError: {"object":"error","message":"Internal server error: copy_d2d_baseformat'
        "_opapi:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:88 NPU function error: call "
        "aclnnInplaceCopy failed, error code is 161002\\n[ERROR] 2025-11-30-05:12:25 (PID:4346, "
        "Device:0, RankID:-1) ERR00100 PTA call acl api failed.\\n[PID: 4346] AclNN_Parameter_Error"
        '(EZ1001): The self tensor cannot be larger than 8 dimensions.\\n"}'
    )
    found = diagnose(line)
    assert found[0].rule == "code:EZ1001" and found[0].category == "op-unsupported"
    assert any(d.rule == "torch-npu-error-trailer" and d.symptom for d in found)


def test_a_failed_stream_sync_alone_is_not_taken_for_a_kernel_fault():
    text = (
        "RuntimeError: ACL stream synchronize failed.\nEI9999: Inner Error!\nEI9999: The error "
        "from device(chipId:3, dieId:0), serial number is 9, hccl fftsplus task timeout occurred "
        "during task execution, stream_id:5"
    )
    assert diagnose(text)[0].category == "hccl-failure"


@pytest.mark.parametrize(
    "line",
    [
        "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
        "Your Tesla T4 GPU has compute capability 7.5.",
        "RuntimeError: shape '[38400, 0, -1]' is invalid for input of size 2457600",
    ],
)
def test_an_exception_naming_what_the_hardware_or_operator_cannot_take_is_op_unsupported(line):
    found = diagnose(line)
    assert found and found[0].category == "op-unsupported" and not found[0].symptom


def test_an_operators_kernel_list_is_not_taken_for_a_model_config_file():
    # binary_info_config.json lists the SoC's kernels: the chip lacks the operator
    found = diagnose(
        "Get regInfo failed, The binary_info_config.json of socVersion [ascend310p] does not "
        "support opType [RotaryPositionEmbedding]"
    )
    assert found[0].category == "op-unsupported"
    assert all(d.category != "model-not-found" for d in found)
    # a model's own config.json still reads as the model's files
    assert classify(None, "OSError: /models/qwen/config.json not found").category == (
        "model-not-found"
    )


def test_a_hccl_notify_timeout_outranks_the_runtime_task_timeout_it_causes():
    text = (
        "npuSynchronizeDevice:torch_npu/csrc/core/npu/NPUStream.cpp:370 NPU error, error code is "
        "107020.\nEI0002: The wait execution of the Notify register times out. Reason: The Notify "
        "register has not received the Notify record from remote rank [1]."
    )
    found = diagnose(text)
    assert found[0].rule == "hccl-notify-wait-timeout"
    assert any(d.category == "engine-hang" for d in found[1:])


def test_a_stuck_collective_watchdog_is_a_hang_below_any_cause():
    stuck = (
        "[rank0]:[F ProcessGroupNCCL.cpp:1169] [PG 2 Rank 0] ProcessGroupNCCL's watchdog got "
        "stuck for 600 seconds without making progress in monitoring enqueued collectives."
    )
    assert diagnose(stuck)[0].category == "engine-hang"
    with_cause = stuck + "\nRuntimeError: NPU out of memory. Tried to allocate 2.00 GiB"
    found = diagnose(with_cause)
    assert found[0].category == "npu-oom"
    assert any(d.rule == "collective-watchdog-stuck" and d.symptom for d in found)


def test_a_timeout_code_is_the_wait_not_the_cause_of_an_hccl_stall():
    """vllm-ascend #1193: a stuck collective's own task times out (507048, FFTS+); the HCCL rule
    is not demoted by it. Alone, the timeout code keeps its table category."""
    sync = (
        "(RayWorkerWrapper pid=11394, ip=10.0.1.4) ERROR 06-12 09:47:56 [worker_base.py:620] "
        "RuntimeError: ACL stream synchronize failed, error code:507048\n"
    )
    stuck = (
        "[rank8]:[W612 09:47:56.859970564 compiler_depend.ts:57] Warning: EI0002: The wait "
        "execution of the Notify register times out. Reason: The Notify register has not "
        "received the Notify record from remote rank [0].\n"
    )
    assert codes.codebook().lookup("507048").timeout
    found = diagnose(sync + stuck)
    assert found[0].category == "hccl-failure" and not found[0].symptom
    assert diagnose(sync)[0].category == "op-exception"
