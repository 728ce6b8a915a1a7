"""Smoke test on the shipped SmolLM2-135M-Instruct (converted by the set-up)."""

from typing import Any

import pytest

from inference_wrapper.defaults import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME


@pytest.mark.slow
def test_default_model_answers_and_is_pinned() -> None:
    from inference_wrapper.audit.generator import AuditedGenerator
    from inference_wrapper.engine.model import load_default_model
    from inference_wrapper.engine.params import GenerationParams

    assert DEFAULT_MODEL_DIR.is_dir(), "run scripts/setup.sh first"
    generator = AuditedGenerator(load_default_model(device="cpu"))
    prompt: Any = generator.loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False, add_generation_prompt=True,
    )
    out = generator.generate(prompt, GenerationParams(max_new_tokens=16))
    assert "Paris" in out.text
    model = out.record.body["model"]
    assert model["name"] == DEFAULT_MODEL_NAME and model["pinned"] is True
