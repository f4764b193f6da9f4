"""A source's inlet (bridge/core/inlet.py): what the wire parser appends to its sink reaches the engine in order, and
the runtime is called only when there is something to do: effects, a busy engine, or a source waiting at its fence.
A quiet engine's heartbeat calls nothing."""

from __future__ import annotations

from dataclasses import replace

from bridge.core.effects import AnswerFlowControl, Effect, Publish
from bridge.core.engine import SourceEngine
from bridge.core.frames import Frame
from bridge.core.inbound import classify_frames
from bridge.core.inlet import FC_ARRIVALS_KEPT, Inlet
from bridge.testing.engines import CONSUMER, SETTINGS, STREAM

DELIVER = b"nats-bridge.deliver.edge1"


def heartbeat(dseq: int, sseq: int) -> Frame:
    header = f"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {dseq}\r\nNats-Last-Stream: {sseq}\r\n\r\n"
    return (DELIVER, b"", header.encode(), b"")


def delivery(seq: int) -> Frame:
    return (b"orders.new", f"$JS.ACK.{STREAM}.{CONSUMER}.1.{seq}.{seq}.{seq * 1000}.0".encode(), None, b"x")


def fc_request(n: int) -> Frame:
    return (DELIVER, f"$JS.FC.{STREAM}.{CONSUMER}.r{n}".encode(), b"NATS/1.0 100 FlowControl Request\r\n\r\n", b"")


class Clock:
    def __init__(self) -> None:
        self.now = 1.0

    def __call__(self) -> float:
        return self.now


def running() -> tuple[Inlet, list[list[Effect]], Clock]:
    """An inlet in front of a flow-control engine that is replicating, nothing in flight."""
    clock = Clock()
    engine = SourceEngine(replace(SETTINGS), 0.0)
    engine.recovered(0, (), 0.0)
    engine.reset_succeeded(1, 0.0)
    emitted: list[list[Effect]] = []
    inlet = Inlet(engine, clock, emitted.append)
    assert engine.quiet
    return inlet, emitted, clock


def read(inlet: Inlet, *frames: Frame) -> None:
    inlet.sink.extend(frames)  # as the wire parser appends them
    inlet.read()
    assert inlet.sink == []  # the same list, emptied: the parser keeps appending to it


def test_a_quiet_engines_heartbeat_calls_nothing_and_a_delivery_is_handed_over_in_order() -> None:
    inlet, emitted, clock = running()
    read(inlet, heartbeat(0, 0))
    read(inlet)  # (an empty read: nothing)
    assert emitted == []
    read(inlet, delivery(1), delivery(2))
    ((first, second),) = emitted
    assert isinstance(first, Publish) and isinstance(second, Publish)
    assert [p.entry.stream_seq for p in (first, second)] == [1, 2]
    assert not inlet.engine.quiet
    # busy (awaiting its acks): a heartbeat with no effect still goes to the runtime, which places it on the ticker
    read(inlet, heartbeat(2, 2))
    assert emitted[1:] == [[]]
    clock.now += 0.1
    stored = inlet.engine.publish_stored_many([(first.entry.order, first.attempt), (second.entry.order, 1)], clock.now)
    assert inlet.engine.quiet, stored
    read(inlet, heartbeat(2, 2))
    assert len(emitted) == 2  # quiet again: nothing


def test_flow_control_requests_are_remembered_for_their_answers_latency_and_answered() -> None:
    inlet, emitted, clock = running()
    read(inlet, fc_request(1))
    assert inlet.fc_arrivals == {f"$JS.FC.{STREAM}.{CONSUMER}.r1": clock.now}
    assert any(isinstance(e, AnswerFlowControl) for e in emitted[-1])
    for n in range(2, FC_ARRIVALS_KEPT + 3):  # never answered (a runtime that dropped them): the memory is bounded
        read(inlet, fc_request(n))
    assert len(inlet.fc_arrivals) <= FC_ARRIVALS_KEPT + 1


def test_a_paused_source_hands_over_every_read_and_a_closed_one_takes_nothing() -> None:
    inlet, emitted, _ = running()
    inlet.paused = True  # waiting at its fence: the runtime wakes its ticks on any input
    read(inlet, heartbeat(0, 0))
    assert emitted == [[]]
    inlet.paused = False
    inlet.closed = True  # fenced for good
    before = inlet.engine.stats.delivered
    read(inlet, delivery(1), fc_request(1))
    assert emitted == [[]] and inlet.engine.stats.delivered == before and inlet.fc_arrivals == {}


def test_messages_classified_elsewhere_go_the_same_way() -> None:
    inlet, emitted, _ = running()
    inlet.receive(classify_frames([heartbeat(0, 0)]))
    assert emitted == []
    inlet.receive(classify_frames([delivery(1)]))
    assert len(emitted) == 1 and isinstance(emitted[0][0], Publish)
