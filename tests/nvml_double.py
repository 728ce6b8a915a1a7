"""An NVML double that behaves as ``nvidia-ml-py``'s ``pynvml`` module does, for one GPU.

It raises the real module's exception classes, built as the real module builds them
(``NVMLError(code)`` becomes the code's subclass, ``NVMLError_NotSupported`` for
``NVML_ERROR_NOT_SUPPORTED``): before ``nvmlInit``, every call raises
``NVMLError_Uninitialized``; a bad index ``NVMLError_InvalidArgument``; each field named
in ``unsupported`` ``NVMLError_NotSupported``. Values use NVML's units (power in
milliwatts, memory in bytes), and the structures have NVML's field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml


@dataclass
class Utilization:  # c_nvmlUtilization_t
    gpu: int
    memory: int


@dataclass
class Memory:  # c_nvmlMemory_t
    total: int
    free: int
    used: int


@dataclass
class NvmlDouble:
    uuid: str = "GPU-8f6d1b52-6c9e-4e0b-9d55-0123456789ab"
    unsupported: set[str] = field(default_factory=set)  # function names
    sm_pct: int = 87
    bandwidth_pct: int = 41
    used_bytes: int = 3 * 2**30
    total_bytes: int = 80 * 2**30
    power_mw: int = 312_500
    temperature_c: int = 64
    sm_mhz: int = 1980
    memory_mhz: int = 2619
    reasons: int = 0x4  # nvmlClocksEventReasonSwPowerCap
    ecc: dict[int, int] = field(default_factory=lambda: {0: 3, 1: 0})
    initialized: bool = False
    calls: list[str] = field(default_factory=list)

    # the real module's names, so code under test cannot tell the difference
    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if name in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call("nvmlDeviceGetHandleByIndex")
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return object()

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._call("nvmlDeviceGetUUID")
        return self.uuid

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Utilization:
        self._call("nvmlDeviceGetUtilizationRates")
        return Utilization(self.sm_pct, self.bandwidth_pct)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Memory:
        self._call("nvmlDeviceGetMemoryInfo")
        return Memory(self.total_bytes, self.total_bytes - self.used_bytes, self.used_bytes)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._call("nvmlDeviceGetPowerUsage")
        return self.power_mw

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.temperature_c

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        self._call("nvmlDeviceGetClockInfo")
        return {pynvml.NVML_CLOCK_SM: self.sm_mhz, pynvml.NVML_CLOCK_MEM: self.memory_mhz}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._call("nvmlDeviceGetCurrentClocksEventReasons")
        return self.reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        self._call("nvmlDeviceGetTotalEccErrors")
        if counter != pynvml.NVML_VOLATILE_ECC:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.ecc[error_type]


@dataclass
class NvmlMachine:
    """Several GPUs behind one NVML, each an ``NvmlDouble`` (``nvmlDeviceGetCount`` and
    the index select among them); counts the utilisation reads, i.e. the samples taken."""

    gpus: list[NvmlDouble]
    initialized: bool = False

    def __getattr__(self, name: str) -> Any:
        first = self.__dict__["gpus"][0]
        value = getattr(first, name)
        if not callable(value) or not name.startswith("nvmlDevice"):
            return value

        def by_handle(handle: Any, *args: Any) -> Any:
            gpu = self.__dict__["gpus"][handle]
            return getattr(gpu, name)(object(), *args)

        return by_handle

    def nvmlInit(self) -> None:
        self.initialized = True
        for gpu in self.gpus:
            gpu.nvmlInit()

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index
