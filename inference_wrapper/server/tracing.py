"""OpenTelemetry spans per request phase (parse, queue_wait, tokenize, forward, decode,
append), recorded after the fact from measured wall-clock times. Off by default;
``AUDIT_LEDGER_OTEL_EXPORTER=console`` prints them (an OTLP exporter can be plugged in
the same way where its package is installed)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.trace import set_span_in_context


class PhaseTracer:
    def __init__(self, exporter: str = "none") -> None:
        self._tracer: Any = None
        if exporter == "none":
            return
        if exporter != "console":
            raise ValueError(f"unknown span exporter {exporter!r} (none or console)")
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        self._tracer = provider.get_tracer("audit-ledger")
        self.provider = provider

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def record(self, name: str, spans_ns: dict[str, tuple[int, int]],
               attributes: dict[str, Any]) -> None:
        if self._tracer is None or not spans_ns:
            return
        start = min(s for s, _ in spans_ns.values() if s)
        end = max(e for _, e in spans_ns.values())
        root = self._tracer.start_span(name, start_time=start, attributes=attributes)
        context = set_span_in_context(root)
        for phase, (phase_start, phase_end) in spans_ns.items():
            if phase_start and phase_end >= phase_start:
                child = self._tracer.start_span(phase, context=context, start_time=phase_start)
                child.end(end_time=phase_end)
        root.end(end_time=end)
