"""What an engine runs on, captured inside the engine: the environment of its records."""

from __future__ import annotations

from typing import Any

from inference_wrapper.engine.contract import TokenizationContract
from inference_wrapper.engine.fingerprint.hardware import GpuProbe, capture_hardware
from inference_wrapper.engine.fingerprint.software import capture_software
from inference_wrapper.engine.model import LoadedModel


def capture_environment(loaded: LoadedModel, contract: TokenizationContract, engine_id: str,
                        probe: GpuProbe | None = None) -> dict[str, Any]:
    """The engine's model, hardware, software, tokenization contract and generation
    config, as plain JSON values. Hardware and software do not change while a model is
    loaded: captured once per engine start."""
    hardware = capture_hardware(probe, device_index=loaded.device.index or 0)
    software = capture_software(model_digest=loaded.digest,
                                tokenizer_digest=loaded.tokenizer_digest,
                                generation_config_digest=loaded.generation_config_digest)
    return {
        "engine": engine_id,
        "model": {"name": loaded.name, "digest": loaded.digest, "pinned": loaded.pinned},
        "hardware": hardware.to_dict(),
        "software": software.to_dict(),
        "tokenization_contract": contract.to_dict(),
        "generation_config_digest": loaded.generation_config_digest,
    }


def bind_contract(loaded: LoadedModel,
                  contract: TokenizationContract | None) -> TokenizationContract:
    """The contract an engine runs under (the model's tokenizer by default), applied to its
    tokenizer; refuses a contract that pins another tokenizer."""
    contract = contract or TokenizationContract(tokenizer_digest=loaded.tokenizer_digest)
    if contract.tokenizer_digest != loaded.tokenizer_digest:
        raise ValueError(
            f"tokenization contract pins tokenizer {contract.tokenizer_digest}, "
            f"the model directory has {loaded.tokenizer_digest}"
        )
    contract.apply(loaded.tokenizer)
    return contract
