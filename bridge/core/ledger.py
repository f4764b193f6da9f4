"""What a flow-control answer may name: the newest delivery of this epoch whose message is stored.

The ledger keeps the deliveries of the current epoch that the watermark does not cover yet, the position the
watermark does cover, and the one flow-control request held until everything delivered before it is covered
(docs/design.md, "Safety"). Every answer the engine gives is made here, so ``acked_stream_seq`` is the highest
``Nats-Last-Stream`` this process ever named.
"""

from __future__ import annotations

from collections import deque

from bridge.core.effects import AnswerFlowControl

EMPTY = (0, 0)


class FlowControlLedger:
    """Deliveries not yet covered, the covered position, and the held flow-control request."""

    __slots__ = ("_current", "_held", "_position", "_records", "acked_stream_seq", "answered_dseq", "answers")

    def __init__(self) -> None:
        self._records: deque[tuple[int, int]] = deque()  # (dseq, sseq) of this epoch not yet covered
        self._position = EMPTY  # (dseq, sseq) of the newest delivery of this epoch the watermark covers
        self._held: tuple[str, int] | None = None  # (subject, last dseq delivered before it)
        self._current = True  # False once the epoch is known to be replaced by a reset nobody will see
        self.acked_stream_seq = 0
        self.answered_dseq = 0  # the delivery sequence the newest answer of this epoch named (0: none)
        self.answers = 0

    @property
    def position(self) -> tuple[int, int]:
        """``(Nats-Last-Consumer, Nats-Last-Stream)`` an answer would carry now; ``(0, 0)`` means empty.

        Both numbers come from one delivery of the current epoch: the newest one the watermark covers. Naming
        the watermark itself would be safe (it is stored) but can stall the consumer: after a reset far below it
        the server sets its ack floor to the watermark, then walks the deliveries below it into pending, where
        no later answer can clear them (an ack at or below the floor is a no-op) until ``max_ack_pending`` fills.
        """
        return self._position if self._current else EMPTY

    @property
    def held(self) -> str | None:
        return self._held[0] if self._held is not None else None

    def delivered(self, dseq: int, sseq: int) -> None:
        self._records.append((dseq, sseq))

    def cover(self, watermark: int) -> None:
        """Everything at or below ``watermark`` is stored: move the position up to the newest such delivery."""
        records = self._records
        while records and records[0][1] <= watermark:
            self._position = records.popleft()

    def hold(self, subject: str, covers: int) -> None:
        """A flow-control request that covers deliveries up to ``covers``; it replaces any held one."""
        self._held = (subject, covers)

    def answer_covered(self) -> AnswerFlowControl | None:
        """Answer the held request if every delivery before it is covered."""
        if self._held is None or self._position[0] < self._held[1]:
            return None
        return self.answer_held()

    def answer_held(self) -> AnswerFlowControl | None:
        """Answer the held request (if any) with the current position, covered or not."""
        if self._held is None:
            return None
        subject, _ = self._held
        self._held = None
        return self.answer(subject)

    def answer(self, subject: str) -> AnswerFlowControl:
        """Answer ``subject`` with the current position (drops it as the held request if it was)."""
        if self._held is not None and self._held[0] == subject:
            self._held = None
        return self._make(subject, self.position)

    def answer_empty(self, subject: str) -> AnswerFlowControl:
        """Release ``subject`` without acking anything."""
        return self._make(subject, EMPTY)

    def new_epoch(self) -> None:
        """A reset restarted delivery sequences at 1: nothing of the old epoch may be named again."""
        self._records.clear()
        self._position = EMPTY
        self.answered_dseq = 0

    def epoch_replaced(self) -> None:
        """The server's epoch is about to change without this process seeing it: answer empty from now on."""
        self._current = False

    def _make(self, subject: str, position: tuple[int, int]) -> AnswerFlowControl:
        self.answers += 1
        if position[0] > self.answered_dseq:
            self.answered_dseq = position[0]
        if position[1] > self.acked_stream_seq:
            self.acked_stream_seq = position[1]
        return AnswerFlowControl(subject, position[0], position[1])
