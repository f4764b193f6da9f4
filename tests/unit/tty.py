"""An in-memory text stream that says it is a terminal, for code that behaves differently on one."""

from __future__ import annotations

import io


class FakeTerminal(io.StringIO):
    """A ``StringIO`` whose ``isatty()`` is True: readable as stdin (its initial text), writable as stderr."""

    def isatty(self) -> bool:
        return True
