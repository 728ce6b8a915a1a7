"""Prometheus metrics, one registry per app (no process-wide singletons)."""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Per request: each request spends its own time here.
REQUEST_PHASES = ("parse", "queue_wait")
# Per batch: one observation per generate call, shared by every request in the batch.
BATCH_PHASES = ("tokenize", "forward", "decode", "append")
PHASES = REQUEST_PHASES + BATCH_PHASES
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0)


# What each GPU sample field is exported as: (metric name, help, scale to the unit).
GPU_GAUGES = {
    "sm_utilization_pct": ("audit_gpu_sm_utilization_ratio", "SM utilisation (0-1)", 0.01),
    "memory_bandwidth_utilization_pct": ("audit_gpu_memory_bandwidth_utilization_ratio",
                                         "memory bandwidth utilisation (0-1)", 0.01),
    "memory_used_bytes": ("audit_gpu_memory_used_bytes", "GPU memory used", 1.0),
    "power_w": ("audit_gpu_power_watts", "power draw", 1.0),
    "temperature_c": ("audit_gpu_temperature_celsius", "GPU temperature", 1.0),
    "sm_clock_mhz": ("audit_gpu_sm_clock_hertz", "SM clock", 1e6),
    "memory_clock_mhz": ("audit_gpu_memory_clock_hertz", "memory clock", 1e6),
    "throttle_reasons": ("audit_gpu_clock_event_reasons", "NVML clock event (throttle) "
                         "reason bits", 1.0),
    "ecc_corrected_volatile": ("audit_gpu_ecc_corrected_errors", "corrected ECC errors "
                               "since the driver loaded", 1.0),
    "ecc_uncorrected_volatile": ("audit_gpu_ecc_uncorrected_errors", "uncorrected ECC "
                                 "errors since the driver loaded", 1.0),
}


class GpuCollector(Collector):
    """Every GPU's sample (the fields a batch's records carry), labelled by GPU UUID,
    read through NVML at most once a second however often /metrics is scraped. A field
    the GPU does not support is left out; no NVML, no GPU metrics."""

    def __init__(self, nvml: Any = None, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._interval_s, self._clock = interval_s, clock
        self._samples: list[dict[str, Any]] = []
        self._taken = -float("inf")
        self._lock = threading.Lock()

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            if self._clock() - self._taken >= self._interval_s:
                self._samples, self._taken = self._read(), self._clock()
            return self._samples

    def _read(self) -> list[dict[str, Any]]:
        from inference_wrapper.engine.gpu_sample import GpuSampler

        try:
            nvml = self._nvml if self._nvml is not None else importlib.import_module("pynvml")
            nvml.nvmlInit()
            return [GpuSampler(nvml, index).sample()
                    for index in range(nvml.nvmlDeviceGetCount())]
        except Exception:  # no NVML library or no GPU: export nothing
            return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        samples = self.samples()
        if not samples:
            return
        for field, (name, text, scale) in GPU_GAUGES.items():
            family = GaugeMetricFamily(name, text, labels=["gpu"])
            for sample in samples:
                if sample.get(field) is not None:
                    family.add_metric([str(sample["gpu_uuid"])], sample[field] * scale)
            yield family


class ReplicaCollector(Collector):
    """Who holds the integrator lease and how fresh the log's latest seal is, at scrape."""

    def __init__(self, replica_id: str, holds_lease: Callable[[], bool],
                 last_seal: Callable[[], tuple[float | None, str | None]],
                 fenced: Callable[[], int],
                 fences_other_roles: Callable[[], bool | None] = lambda: None) -> None:
        self.replica_id, self.holds_lease, self.last_seal = replica_id, holds_lease, last_seal
        self.fenced, self.fences_other_roles = fenced, fences_other_roles

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        held = GaugeMetricFamily("audit_lease_held", "1 if this replica holds the integrator "
                                 "lease (it seals and anchors)", labels=["replica"])
        held.add_metric([self.replica_id], 1.0 if self.holds_lease() else 0.0)
        yield held
        yield CounterMetricFamily("audit_fenced_writer_sessions",
                                  "other replicas' writer sessions this replica ended, as "
                                  "lease holder, for holding the sequencer too long",
                                  value=self.fenced())
        reach = self.fences_other_roles()
        if reach is not None:  # PostgreSQL, once known
            yield GaugeMetricFamily("audit_fencing_other_roles",
                                    "1 if this replica's database role can end stuck writer "
                                    "sessions of every role; 0 if only its own role's (it "
                                    "lacks pg_read_all_stats or pg_signal_backend)",
                                    value=1.0 if reach else 0.0)
        try:
            age, sealed_by = self.last_seal()
        except Exception:  # the database is unreachable: /readyz reports that
            return
        if age is not None:
            yield GaugeMetricFamily("audit_last_seal_age_seconds",
                                    "seconds since the log's latest checkpoint was sealed",
                                    value=age)
            by = GaugeMetricFamily("audit_latest_checkpoint_sealed_by",
                                   "1, labelled with the replica that sealed the latest "
                                   "checkpoint", labels=["replica"])
            by.add_metric([sealed_by or "unknown"], 1.0)
            yield by


class ThreadCpuCollector(Collector):
    """CPU seconds per named thread of this process (Linux ``/proc``), read at scrape time.

    Says which worker spends the process's CPU: the model thread, the event loop, the
    ledger writer, the audit thread, the background workers. Elsewhere than Linux it
    exports nothing.
    """

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("audit_thread_cpu_seconds",
                                     "user + system CPU time of each named thread",
                                     labels=["thread"])
        ticks = _CLOCK_TICKS
        seconds: dict[str, float] = {}  # by name: two threads may share one
        if ticks is None:  # no sysconf: not Linux
            yield family
            return
        for thread in threading.enumerate():
            tid = thread.native_id
            if tid is None:
                continue
            try:
                # Fields after the parenthesised name: utime is the 12th, stime the 13th.
                with open(f"/proc/self/task/{tid}/stat", "rb") as stat:
                    fields = stat.read().rpartition(b")")[2].split()
            except OSError:  # not Linux, or the thread has just ended
                continue
            seconds[thread.name] = (seconds.get(thread.name, 0.0)
                                    + (int(fields[11]) + int(fields[12])) / ticks)
        for name, value in sorted(seconds.items()):
            family.add_metric([name], value)
        yield family


def _clock_ticks() -> int | None:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return None


_CLOCK_TICKS = _clock_ticks()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # Two series: a batch phase observed once per batch would otherwise be weighted
        # against per-request phases as if it were one request's time.
        self.request_phase = Histogram("audit_request_phase_seconds",
                                       "time one request spends in a phase (parse, queue_wait)",
                                       ["phase"], buckets=LATENCY_BUCKETS,
                                       registry=self.registry)
        self.batch_phase = Histogram("audit_batch_phase_seconds",
                                     "time one batch spends in a phase (tokenize, forward, "
                                     "decode, append)", ["phase"], buckets=LATENCY_BUCKETS,
                                     registry=self.registry)
        self.request_latency = Histogram("audit_http_request_duration_seconds",
                                         "end-to-end HTTP request latency, per route",
                                         ["route", "method"], buckets=LATENCY_BUCKETS,
                                         registry=self.registry)
        self.batch_size = Histogram("audit_batch_size", "requests per generate call",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                                    registry=self.registry)
        self.requests = Counter("audit_http_requests_total", "HTTP requests",
                                ["route", "status"], registry=self.registry)
        self.queue_depth = Gauge("audit_queue_depth", "requests waiting for a batch",
                                 registry=self.registry)
        self.checkpoint_lag = Gauge("audit_checkpoint_lag_entries",
                                    "log entries not yet covered by a checkpoint",
                                    registry=self.registry)
        self.anchor_lag = Gauge("audit_anchor_lag_seconds",
                                "age of the oldest sealed checkpoint not yet anchored",
                                registry=self.registry)
        self.anchor_backlog = Gauge("audit_anchor_backlog_checkpoints",
                                    "sealed checkpoints not yet anchored",
                                    registry=self.registry)
        self.anchor_failures = Gauge("audit_anchor_consecutive_failures",
                                     "anchoring attempts failed in a row (0: the last "
                                     "one succeeded)", registry=self.registry)
        self.expiry_failed_tenants = Gauge("audit_retention_expiry_failed_tenants",
                                           "tenants whose content the last retention "
                                           "expiry run could not erase",
                                           registry=self.registry)
        self.anchor_conflict = Gauge("audit_anchor_conflict",
                                     "1 while the anchor holds something that is not a "
                                     "checkpoint of this log (anchoring stopped; /readyz "
                                     "names it)", registry=self.registry)
        self.in_model = Gauge("audit_requests_in_model",
                              "requests taken from the queue whose answer is not yet released",
                              registry=self.registry)
        self.in_flight = Gauge("audit_http_requests_in_flight",
                               "requests being handled, probes and scrapes aside (what the "
                               "shutdown drain waits for)", registry=self.registry)
        self.checkpoint_age = Gauge("audit_checkpoint_age_seconds",
                                    "seconds since the latest checkpoint was sealed (NaN "
                                    "before the first)", registry=self.registry)
        self.registry.register(GpuCollector())
        self.registry.register(ThreadCpuCollector())
        ProcessCollector(registry=self.registry)  # CPU, memory, open files of this process
        PlatformCollector(registry=self.registry)

    def observe(self, name: str, value: float) -> None:
        if name == "batch_size":
            self.batch_size.observe(value)
        else:
            self._child(self.request_phase if name in REQUEST_PHASES else self.batch_phase,
                        name).observe(value)

    def observe_http(self, route: str, method: str, status: int, elapsed_s: float) -> None:
        """One answered request: its latency per route and method, its count per status."""
        self._child(self.request_latency, route, method).observe(elapsed_s)
        self._child(self.requests, route, str(status)).inc()

    def _child(self, metric: Any, *labels: str) -> Any:
        # ``labels()`` takes a lock and builds a key on every call; the label sets here
        # are few and bounded, so their children are looked up once and kept.
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def bind(self, queue_depth: Callable[[], float], checkpoint_lag: Callable[[], float]) -> None:
        self.queue_depth.set_function(queue_depth)
        self.checkpoint_lag.set_function(checkpoint_lag)

    def bind_service(self, *, in_model: Callable[[], float],
                     checkpoint_age: Callable[[], float]) -> None:
        self.in_model.set_function(in_model)
        self.checkpoint_age.set_function(checkpoint_age)

    def bind_replica(self, replica_id: str, holds_lease: Callable[[], bool],
                     last_seal: Callable[[], tuple[float | None, str | None]],
                     fenced: Callable[[], int],
                     fences_other_roles: Callable[[], bool | None] = lambda: None) -> None:
        self.registry.register(ReplicaCollector(replica_id, holds_lease, last_seal, fenced,
                                                fences_other_roles))
