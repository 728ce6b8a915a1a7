"""Hardware fingerprint: which accelerator (or none) ran the model.

The GPU path reads ``torch.cuda.get_device_properties`` and NVML (``nvidia-ml-py``,
which provides the ``pynvml`` module) through a small probe interface, so it can be
exercised without a GPU by injecting a probe.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from typing import Any, Protocol

SCHEMA = "hardware-fingerprint/v1"


@dataclass(frozen=True)
class GpuProperties:
    name: str
    compute_capability: str
    total_memory_bytes: int
    sm_count: int
    uuid: str


@dataclass(frozen=True)
class NvmlInfo:
    driver_version: str
    cuda_driver_version: str
    name: str
    uuid: str
    memory_total_bytes: int
    power_limit_w: float | None
    pci_bus_id: str


class GpuProbe(Protocol):
    """What the hardware fingerprint needs to know about a CUDA device."""

    def available(self) -> bool: ...
    def properties(self, index: int) -> GpuProperties: ...
    def device_count(self) -> int: ...
    def cuda_runtime_version(self) -> str | None: ...
    def cudnn_version(self) -> int | None: ...
    def nvml(self, index: int) -> NvmlInfo | None: ...


@dataclass(frozen=True)
class HardwareFingerprint:
    accelerator: str  # "cuda" or "none"
    accelerator_model: str | None
    accelerator_count: int
    compute_capability: str | None
    total_memory_bytes: int | None
    sm_count: int | None
    uuid: str | None
    driver_version: str | None
    cuda_runtime_version: str | None
    cuda_driver_version: str | None
    cudnn_version: int | None
    nvml: dict[str, Any] | None
    cpu_model: str
    cpu_count: int
    torch_threads: int
    machine: str
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class TorchNvmlProbe:
    """The real probe: torch's CUDA runtime and NVML."""

    def available(self) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def device_count(self) -> int:
        import torch

        return int(torch.cuda.device_count())

    def properties(self, index: int) -> GpuProperties:
        import torch

        props = torch.cuda.get_device_properties(index)
        return GpuProperties(
            name=str(props.name),
            compute_capability=f"{props.major}.{props.minor}",
            total_memory_bytes=int(props.total_memory),
            sm_count=int(props.multi_processor_count),
            uuid=str(getattr(props, "uuid", "unknown")),
        )

    def cuda_runtime_version(self) -> str | None:
        import torch

        return torch.version.cuda

    def cudnn_version(self) -> int | None:
        import torch

        version = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
        return int(version) if version is not None else None

    def nvml(self, index: int) -> NvmlInfo | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return None
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            try:
                power: float | None = pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0
            except pynvml.NVMLError:
                power = None
            return NvmlInfo(
                driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
                cuda_driver_version=f"{cuda // 1000}.{(cuda % 1000) // 10}",
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                power_limit_w=power,
                pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            )
        except pynvml.NVMLError:
            return None
        finally:
            pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def capture_hardware(
    probe: GpuProbe | None = None, device_index: int = 0, torch_threads: int | None = None
) -> HardwareFingerprint:
    """Describe the machine; on a CUDA device, every GPU field is filled."""
    if torch_threads is None:
        import torch

        torch_threads = int(torch.get_num_threads())
    probe = probe or TorchNvmlProbe()
    common: dict[str, Any] = {
        "cpu_model": cpu_model_name(),
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": torch_threads,
        "machine": platform.machine(),
    }
    if not probe.available():
        return HardwareFingerprint(
            accelerator="none", accelerator_model=None, accelerator_count=0,
            compute_capability=None, total_memory_bytes=None, sm_count=None, uuid=None,
            driver_version=None, cuda_runtime_version=None, cuda_driver_version=None,
            cudnn_version=None, nvml=None, **common,
        )
    props = probe.properties(device_index)
    nvml = probe.nvml(device_index)
    return HardwareFingerprint(
        accelerator="cuda",
        accelerator_model=props.name,
        accelerator_count=probe.device_count(),
        compute_capability=props.compute_capability,
        total_memory_bytes=props.total_memory_bytes,
        sm_count=props.sm_count,
        uuid=props.uuid,
        driver_version=nvml.driver_version if nvml else None,
        cuda_runtime_version=probe.cuda_runtime_version(),
        cuda_driver_version=nvml.cuda_driver_version if nvml else None,
        cudnn_version=probe.cudnn_version(),
        nvml=asdict(nvml) if nvml else None,
        **common,
    )
