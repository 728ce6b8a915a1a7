"""GPU samples per batch through an NVML double that behaves as nvidia-ml-py does: a field
the GPU does not support is a null in the sample, never a failed batch; the records of a
batch carry its sample, and a CPU engine's records carry none."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from inference_wrapper.engine.gpu_sample import GpuSampler
from tests.nvml_double import NvmlDouble


def test_a_sample_reads_every_field_in_its_units() -> None:
    sample = GpuSampler(NvmlDouble()).sample()
    assert sample == {
        "schema": "gpu-sample/v1", "gpu_uuid": "GPU-8f6d1b52-6c9e-4e0b-9d55-0123456789ab",
        "sm_utilization_pct": 87, "memory_bandwidth_utilization_pct": 41,
        "memory_used_bytes": 3 * 2**30, "power_w": 312.5, "temperature_c": 64,
        "sm_clock_mhz": 1980, "memory_clock_mhz": 2619, "throttle_reasons": 4,
        "ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 0,
    }


def test_an_unsupported_field_is_null_and_the_others_are_read() -> None:
    nvml = NvmlDouble(unsupported={"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage"})
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):  # the double raises as NVML does
        nvml.nvmlDeviceGetPowerUsage(None)
    sample = GpuSampler(nvml).sample()
    assert sample["ecc_corrected_volatile"] is None
    assert sample["ecc_uncorrected_volatile"] is None
    assert sample["power_w"] is None
    assert sample["sm_utilization_pct"] == 87 and sample["temperature_c"] == 64


def test_a_sampler_without_nvml_fails_at_its_start_not_at_a_batch() -> None:
    class NoLibrary(NvmlDouble):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        GpuSampler(NoLibrary())


def test_the_records_of_a_batch_carry_its_sample(tiny_model_dir: Any,
                                                 tiny_manifest: dict[str, Any],
                                                 tiny_generator: Any) -> None:
    from inference_wrapper.audit.generator import AuditedGenerator
    from inference_wrapper.engine.inprocess import InProcessEngine

    loaded = tiny_generator.loaded
    sampler = GpuSampler(NvmlDouble(unsupported={"nvmlDeviceGetTotalEccErrors"}))
    gpu = AuditedGenerator(loaded, engines=[InProcessEngine(loaded, sample_gpu=sampler.sample)])
    outputs = gpu.generate_batch([gpu.prepare("a", None), gpu.prepare("b", None)])
    samples = [o.record.body["data"]["gpu_sample"] for o in outputs]
    assert samples[0] == samples[1] and samples[0]["sm_utilization_pct"] == 87
    assert samples[0]["ecc_corrected_volatile"] is None
    assert outputs[0].record.body["data"]["batch"]["engine"] == "engine-0"
    plain = tiny_generator.generate_batch([tiny_generator.prepare("a", None)])
    assert "gpu_sample" not in plain[0].record.body["data"]  # a CPU engine: no sample


def test_metrics_export_every_gpu_sample_at_most_once_a_second() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from inference_wrapper.server.metrics import GpuCollector
    from tests.nvml_double import NvmlMachine

    machine = NvmlMachine([NvmlDouble(uuid="GPU-a"),
                           NvmlDouble(uuid="GPU-b", unsupported={"nvmlDeviceGetPowerUsage"})])
    now = [100.0]
    registry = CollectorRegistry()
    registry.register(GpuCollector(machine, clock=lambda: now[0]))
    text = generate_latest(registry).decode()
    assert 'audit_gpu_sm_utilization_ratio{gpu="GPU-a"} 0.87' in text
    assert 'audit_gpu_sm_utilization_ratio{gpu="GPU-b"} 0.87' in text
    assert 'audit_gpu_power_watts{gpu="GPU-a"} 312.5' in text
    assert 'audit_gpu_power_watts{gpu="GPU-b"}' not in text  # not supported: left out
    assert 'audit_gpu_ecc_corrected_errors{gpu="GPU-a"} 3.0' in text
    reads = machine.gpus[0].calls.count("nvmlDeviceGetUtilizationRates")
    generate_latest(registry)  # a second scrape within the second: no new NVML reads
    assert machine.gpus[0].calls.count("nvmlDeviceGetUtilizationRates") == reads
    now[0] += 1.0
    generate_latest(registry)
    assert machine.gpus[0].calls.count("nvmlDeviceGetUtilizationRates") == reads + 1


def test_no_nvml_exports_no_gpu_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from inference_wrapper.server.metrics import GpuCollector

    registry = CollectorRegistry()
    registry.register(GpuCollector())  # this machine: the real pynvml finds no library
    assert "audit_gpu_" not in generate_latest(registry).decode()
