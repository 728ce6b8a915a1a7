"""Fingerprints of what an engine runs on: typed, versioned hardware and software."""

from inference_wrapper.engine.fingerprint.hardware import HardwareFingerprint, capture_hardware
from inference_wrapper.engine.fingerprint.software import SoftwareFingerprint, capture_software

__all__ = [
    "HardwareFingerprint",
    "SoftwareFingerprint",
    "capture_hardware",
    "capture_software",
]
