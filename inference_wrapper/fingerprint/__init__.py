"""Fingerprints: typed, versioned descriptions of the hardware, software and data of a call."""

from inference_wrapper.fingerprint.data import DataFingerprint, MaskPattern
from inference_wrapper.fingerprint.hardware import HardwareFingerprint, capture_hardware
from inference_wrapper.fingerprint.software import SoftwareFingerprint, capture_software

__all__ = [
    "DataFingerprint",
    "HardwareFingerprint",
    "MaskPattern",
    "SoftwareFingerprint",
    "capture_hardware",
    "capture_software",
]
