"""The category a person reading each real failure sample assigns to it (not the matcher's
answer). Used by test_accuracy.py and bench/diagnosis_accuracy.py."""

EXPECTED = {
    # tests/fixtures/ascend — real engine/driver errors from public issues and docs
    "err-310p-rc-mode-pointer-get-attributes-107000.txt": "op-unsupported",  # 310P RC mode can't do it
    "err-507011-event-query-fftsplus-aicore-hccl-watchdog.txt": "op-exception",  # aicore error first
    "err-acl-set-device-507033-samples.txt": "npu-init-failure",
    "err-acl-stream-sync-507014-dsv32-fixed-upgrade.txt": "op-exception",
    "err-acl-stream-sync-507034-llama4-aivec.txt": "op-exception",
    "err-acl-stream-sync-507035-aivec-ez9999.txt": "op-exception",
    "err-acl-sync-stream-timeout-507011.txt": "op-exception",
    "err-ascend-transport-so-mooncake.txt": "driver-missing",  # LD_LIBRARY_PATH fix
    "err-c10d-socket-timeout-multinode-1800s.txt": "hccl-failure",
    "err-ee1001-memory-async-failed-ray.txt": "op-unsupported",  # runtime refused the copy
    "err-el0003-capture-mode-not-supported-pd.txt": "graph-capture",
    "err-el0009-aclgraph-capture-stream-resources-207008.txt": "graph-capture",
    "err-engine-core-init-failed-err99999.txt": "engine-crash",  # cause not in the excerpt
    "err-ez9999-mla-numheads-graph-mode.txt": "op-unsupported",
    "err-failed-to-infer-device-type-libhccl.txt": "driver-missing",  # CANN env not loaded
    "err-hccl-allreduce-error-6-ei0006-remote-rank-stuck.txt": "hccl-failure",
    "err-hccl-ei0009-transport-init-error.txt": "hccl-failure",
    "err-hccl-ei0014-driver-topo-missing-950.txt": "driver-missing",  # driver dir not mounted
    "err-jitcompile-default-value-failed.txt": "npu-init-failure",  # NPU unusable in the pod
    "err-kv-cache-negative-memory-qwen3-14b-32g.txt": "kv-cache-insufficient",
    "err-libascend-hal-not-found-docker-missing-mounts.txt": "driver-missing",
    "err-libvllm-ascend-kernels-so-missing.txt": "version-mismatch",  # broken source install
    "err-max-seq-len-gt-kv-cache-vllm-generic.txt": "kv-cache-insufficient",
    "err-oom-el0004-memory-allocation-failure-ge.txt": "npu-oom",
    "err-oom-npu-out-of-memory-ray-deepseek-w8a8-hccl-warning.txt": "npu-oom",
    "err-oom-npu-out-of-memory-v071.txt": "npu-oom",
    "err-oom-qwen3-next-fullgraph-fix-gpu-mem-util.txt": "npu-oom",
    "err-soc-version-undetectable-setup.txt": "config-invalid",  # set SOC_VERSION (FAQ 21)
    # tests/fixtures/engine — real vLLM (CPU) failures captured by tests/engine
    "err-engine-killed.log": "engine-crash",  # worker SIGKILLed -> EngineDeadError
    "err-head-dim-unsupported.log": "op-unsupported",  # no CPU attention kernel for head_dim 16
    "err-max-model-len.log": "config-invalid",
    "err-model-missing.log": "model-not-found",
    "err-port-in-use.log": "port-in-use",
    "err-tp-heads.log": "config-invalid",
    "err-cpu-block-size.log": "config-invalid",
    "err-unknown-flag.log": "config-invalid",
}
