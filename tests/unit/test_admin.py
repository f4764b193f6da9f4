"""``bridge.commands.reset``: the confirmation ``nats-bridge reset`` asks for before touching a consumer."""

from __future__ import annotations

import io
import sys

import pytest

from bridge.commands.reset import confirm_on_terminal
from tests.unit.tty import FakeTerminal

DESCRIPTION = "reset FORWARD to 200: messages 1..199 will NEVER be replicated"


@pytest.mark.parametrize(
    ("answer", "confirmed"),
    [
        ("y\n", True),
        ("yes\n", True),
        ("  Y \n", True),
        ("n\n", False),
        ("no\n", False),
        ("\n", False),  # Enter alone takes the default, which is no
        ("", False),  # Ctrl-D: no answer at all
    ],
)
def test_the_operator_answers_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answer: str, confirmed: bool
) -> None:
    monkeypatch.setattr(sys, "stdin", FakeTerminal(answer))
    assert confirm_on_terminal(DESCRIPTION) is confirmed
    out = capsys.readouterr().out
    # what the reset means comes before the question, so it is read before answering
    assert out.index(DESCRIPTION) < out.index("proceed? [y/N]")


def test_without_a_terminal_nothing_is_read_and_the_answer_is_no(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    piped = io.StringIO("y\n")  # e.g. `yes | nats-bridge reset ...`: must not count as a confirmation
    monkeypatch.setattr(sys, "stdin", piped)
    assert confirm_on_terminal(DESCRIPTION) is False
    assert piped.read() == "y\n"
    captured = capsys.readouterr()
    assert DESCRIPTION in captured.out and "proceed?" not in captured.out
    assert "pass --yes" in captured.err
