"""What `/metrics` shows, in Prometheus text format (prometheus-client), one registry per app."""

from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pocketchat.records import Message

# Seconds: from a fast provider's first chunk to a queued embedded model's.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)


# What the metrics read of a turn that ended: a protocol, not conversations.Turn, so that this module sits
# below the turns that it counts (every layer may count things).
class _Log(Protocol):
    @property
    def seq(self) -> int: ...


class EndedTurn(Protocol):
    @property
    def log(self) -> _Log: ...

    @property
    def reply(self) -> Message: ...

    @property
    def error_kind(self) -> str | None: ...


class Metrics:
    def __init__(self, running_turns: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        Gauge("pocketchat_running_turns", "Replies this replica is writing now.", registry=registry).set_function(
            running_turns
        )
        self.sockets = Gauge("pocketchat_open_sockets", "WebSockets open on this replica.", registry=registry)
        self.chunks = Counter("pocketchat_chunks", "Chunks streamed by the turns this replica ran.", registry=registry)
        self.first_chunk = Histogram(
            "pocketchat_first_chunk_seconds",
            "Time from a turn's start to its first chunk.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.provider_errors = Counter(
            "pocketchat_provider_errors", "Turns the provider failed, by kind.", ["kind"], registry=registry
        )
        self.store_writes = Histogram(
            "pocketchat_store_write_seconds",
            "Time to write one group of queued writes to the database.",
            buckets=WRITE_BUCKETS,
            registry=registry,
        )
        self.log_lag = Histogram(
            "pocketchat_turn_log_lag_seconds",
            "With replicas: how long after its producer appended an entry this replica read it.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

        self.documents_indexed = Counter(
            "pocketchat_documents_indexed", "Documents this replica indexed, ready to search.", registry=registry
        )
        self.documents_failed = Counter(
            "pocketchat_documents_failed", "Documents whose indexing failed (or was cut short).", registry=registry
        )
        self.document_chunks = Counter(
            "pocketchat_document_chunks", "Passages of the documents this replica indexed.", registry=registry
        )
        self.embedding_model_loaded = Gauge(
            "pocketchat_embedding_model_loaded",
            "1 once the local embedding model is loaded (on the first document or question that needs it).",
            registry=registry,
        )
        self.retrieval = Histogram(
            "pocketchat_retrieval_seconds",
            "Time to find the passages for a question, in a conversation with documents.",
            buckets=WRITE_BUCKETS,
            registry=registry,
        )

    def turn_ended(self, turn: EndedTurn) -> None:
        self.chunks.inc(turn.log.seq)
        if (ttft_ms := turn.reply.meta.get("ttft_ms")) is not None:
            self.first_chunk.observe(ttft_ms / 1000)
        if turn.error_kind is not None:
            self.provider_errors.labels(turn.error_kind).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
