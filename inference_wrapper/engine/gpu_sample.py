"""GPU samples per batch, read through NVML (``nvidia-ml-py``'s ``pynvml`` module).

Each field is read on its own: a field the GPU or driver does not offer
(``NVMLError_NotSupported``, or any other NVML error for that one call) is a null in the
sample, never a failed batch. The NVML module is a parameter so a test double that
behaves as ``pynvml`` does (same names, same exception classes) can stand in for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SCHEMA = "gpu-sample/v1"


class GpuSampler:
    """Reads one GPU's state; ``sample()`` returns plain JSON values."""

    def __init__(self, nvml: Any, index: int = 0) -> None:
        self.nvml = nvml
        nvml.nvmlInit()  # NVMLError (no driver, no library) reaches the caller
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.uuid = self._read(lambda h: _text(nvml.nvmlDeviceGetUUID(h)))

    def _read(self, call: Callable[[Any], Any]) -> Any:
        try:
            return call(self.handle)
        except self.nvml.NVMLError:  # NotSupported, NoPermission, ...: this field is null
            return None

    def sample(self) -> dict[str, Any]:
        nvml = self.nvml
        utilization = self._read(nvml.nvmlDeviceGetUtilizationRates)
        memory = self._read(nvml.nvmlDeviceGetMemoryInfo)
        power_mw = self._read(nvml.nvmlDeviceGetPowerUsage)
        return {
            "schema": SCHEMA,
            "gpu_uuid": self.uuid,
            "sm_utilization_pct": None if utilization is None else int(utilization.gpu),
            "memory_bandwidth_utilization_pct": (None if utilization is None
                                                 else int(utilization.memory)),
            "memory_used_bytes": None if memory is None else int(memory.used),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "temperature_c": self._read(
                lambda h: int(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))),
            "sm_clock_mhz": self._read(
                lambda h: int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))),
            "memory_clock_mhz": self._read(
                lambda h: int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))),
            "throttle_reasons": self._read(
                lambda h: int(nvml.nvmlDeviceGetCurrentClocksEventReasons(h))),
            "ecc_corrected_volatile": self._read(lambda h: int(nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC))),
            "ecc_uncorrected_volatile": self._read(lambda h: int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))),
        }


def nvml_sampler(device: Any) -> Callable[[], dict[str, Any] | None] | None:
    """A sampler for a CUDA ``device`` through the real ``pynvml``; None without NVML.

    The engine process sees only its own GPU (``CUDA_VISIBLE_DEVICES``); NVML numbers
    every GPU, so the device is found by the UUID torch reports for it.
    """
    try:
        import pynvml
        import torch

        index = device.index or 0
        wanted = "GPU-" + str(torch.cuda.get_device_properties(index).uuid)
        pynvml.nvmlInit()
        for nvml_index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
            if _text(pynvml.nvmlDeviceGetUUID(handle)) == wanted:
                return GpuSampler(pynvml, nvml_index).sample
    except Exception:  # no NVML here: records carry no sample, and say so by its absence
        log.warning("no NVML for %s: batches carry no GPU sample", device, exc_info=True)
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
