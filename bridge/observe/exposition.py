"""The Prometheus text exposition format (0.0.4), written straight from values: a string per line, no object per
sample.

prometheus-client builds a ``Sample`` (a named tuple with a dict of labels) for every value and renders them one by
one: a scrape of 2,000 sources (about 60 values each) took 0.9 s of CPU and 37 MB of memory at its peak, every
time Prometheus asked. :class:`Exposition` writes the same bytes (``tests/unit/test_observe_exposition.py``
compares them with prometheus-client's own rendering) from label text made once per source.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["Exposition", "label", "value_text"]


def label(name: str, value: str) -> str:
    """``name="value"``, the value escaped as the format wants (backslash, double quote, newline)."""
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return f'{name}="{value}"'


def value_text(value: float) -> str:
    """A sample's value as prometheus-client writes it (its ``floatToGoString``: Go's formatting, ``1.0``,
    ``1e+06``, ``+Inf``)."""
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


CHUNK_LINES = 512


class Exposition:
    """One scrape's body, family by family."""

    __slots__ = ("_chunks",)

    def __init__(self) -> None:
        # encoded every CHUNK_LINES lines: the body exists once, as these, plus a few hundred lines of text
        self._chunks: list[bytes] = []

    def family(self, name: str, kind: str, doc: str, samples: Iterable[tuple[str, float]]) -> None:
        """A counter or gauge family; ``samples`` are ``(labels, value)``, ``labels`` the text between the braces
        (names in alphabetical order, as prometheus-client writes them; "" for none). A counter's name gets
        ``_total``."""
        full = f"{name}_total" if kind == "counter" else name
        lines = [f"# HELP {full} {_doc(doc)}\n# TYPE {full} {kind}\n"]
        for labels, value in samples:
            text = value_text(value)
            lines.append(f"{full}{{{labels}}} {text}\n" if labels else f"{full} {text}\n")
            if len(lines) >= CHUNK_LINES:
                self._flush(lines)
        self._flush(lines)

    def info(self, name: str, doc: str, labels: str) -> None:
        """An info family (``<name>_info``, a gauge of 1 carrying ``labels``)."""
        self.family(f"{name}_info", "gauge", doc, [(labels, 1.0)])

    def histogram(
        self, name: str, doc: str, bounds: Iterable[float], rows: Iterable[tuple[str, list[int], float]]
    ) -> None:
        """A histogram family; ``rows`` are ``(labels, counts, sum)``, ``counts`` per bucket (not cumulative), the
        last one above every bound (+Inf). ``labels`` must sort after ``le`` (as ``source`` does)."""
        les = [f'le="{value_text(bound)}",' for bound in bounds] + ['le="+Inf",']
        lines = [f"# HELP {name} {_doc(doc)}\n# TYPE {name} histogram\n"]
        bucket, count, total_name = f"{name}_bucket{{", f"{name}_count{{", f"{name}_sum{{"
        for labels, counts, total in rows:
            cumulative = 0
            for le, n in zip(les, counts, strict=True):
                cumulative += n
                lines.append(f"{bucket}{le}{labels}}} {value_text(cumulative)}\n")
            lines.append(f"{count}{labels}}} {value_text(cumulative)}\n")
            lines.append(f"{total_name}{labels}}} {value_text(total)}\n")
            if len(lines) >= CHUNK_LINES:
                self._flush(lines)
        self._flush(lines)

    def _flush(self, lines: list[str]) -> None:
        if lines:
            self._chunks.append("".join(lines).encode())
            lines.clear()

    def append(self, text: bytes) -> None:
        """Families already written (prometheus-client's own ``generate_latest``)."""
        self._chunks.append(text)

    def chunks(self) -> list[bytes]:
        """The body so far, in the chunks it was written in (sent as they are: joined, it would be in memory
        twice)."""
        return self._chunks


def _doc(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n")
