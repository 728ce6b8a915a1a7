"""Every fingerprint field is present and typed; the GPU path via an injected probe."""

from typing import Any

from inference_wrapper.engine.fingerprint.hardware import (
    GpuProperties,
    NvmlInfo,
    capture_hardware,
)


class FakeH200Probe:
    """Stands in for torch.cuda + NVML, which need a GPU this machine does not have."""

    def available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def properties(self, index: int) -> GpuProperties:
        return GpuProperties("NVIDIA H200", "9.0", 150_000_000_000, 132,
                             "GPU-1f2e3d4c-0000-1111-2222-333344445555")

    def cuda_runtime_version(self) -> str | None:
        return "12.8"

    def cudnn_version(self) -> int | None:
        return 91002

    def nvml(self, index: int) -> NvmlInfo | None:
        return NvmlInfo("570.124.06", "12.8", "NVIDIA H200",
                        "GPU-1f2e3d4c-0000-1111-2222-333344445555", 150_000_000_000, 700.0,
                        "00000000:18:00.0")


class NoGpuProbe(FakeH200Probe):
    def available(self) -> bool:
        return False


def test_cpu_path_says_accelerator_none() -> None:
    hw = capture_hardware(NoGpuProbe(), torch_threads=1)
    assert hw.accelerator == "none"
    assert hw.accelerator_model is None and hw.driver_version is None
    assert isinstance(hw.cpu_model, str) and hw.cpu_model
    assert hw.cpu_count >= 1 and hw.torch_threads == 1


def test_real_probe_on_this_cpu_machine() -> None:
    import torch

    hw = capture_hardware()
    expected = "cuda" if torch.cuda.is_available() else "none"
    assert hw.accelerator == expected


def test_gpu_path_fills_every_hardware_field() -> None:
    hw = capture_hardware(FakeH200Probe(), torch_threads=1).to_dict()
    assert hw["schema"] == "hardware-fingerprint/v1"
    assert hw["accelerator"] == "cuda"
    assert hw["accelerator_model"] == "NVIDIA H200"
    assert hw["compute_capability"] == "9.0"
    assert hw["total_memory_bytes"] == 150_000_000_000
    assert hw["sm_count"] == 132
    assert hw["uuid"].startswith("GPU-")
    assert hw["driver_version"] == "570.124.06"
    assert hw["cuda_runtime_version"] == "12.8"
    assert hw["cuda_driver_version"] == "12.8"
    assert hw["cudnn_version"] == 91002
    assert hw["nvml"]["power_limit_w"] == 700.0
    assert all(value is not None for value in hw.values()), hw


SOFTWARE_TYPES: dict[str, Any] = {
    "python": dict, "torch": dict, "transformers": dict, "service": dict,
    "dependencies_digest": str, "model_digest": str, "tokenizer_digest": str,
    "generation_config_digest": str, "schema": str,
}


def test_software_fingerprint_fields(tiny_generator: Any) -> None:
    sw = tiny_generator.software
    for key, kind in SOFTWARE_TYPES.items():
        assert isinstance(sw[key], kind), key
    assert sw["schema"] == "software-fingerprint/v1"
    assert set(sw["python"]) >= {"version", "implementation", "build"}
    assert set(sw["torch"]) == {"version", "git_version", "cuda_build"}
    assert len(sw["torch"]["git_version"]) == 40
    assert sw["transformers"]["version"] == "5.24.0"
    assert sw["transformers"]["git_sha"] == "unknown"  # installed from a wheel
    rev = sw["service"]["git_revision"]
    assert rev == "unknown" or len(rev) == 40
    for key in ("dependencies_digest", "model_digest", "tokenizer_digest",
                "generation_config_digest"):
        assert sw[key].startswith("sha256:") and len(sw[key]) == 71


def test_service_revision_outside_a_checkout(tmp_path: Any) -> None:
    from inference_wrapper.engine.fingerprint.software import service_revision

    assert service_revision(tmp_path) == {"git_revision": "unknown", "dirty": None}
