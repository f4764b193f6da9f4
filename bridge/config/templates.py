"""``[source_defaults]``: settings every ``[[sources]]`` table takes unless it sets them itself, with ``{name}`` and
``{domain}`` standing for the source's own.

Why: a fleet of many sites has sources that differ only by name, domain and stream; with the rest written once
(``subject_prefix = "edge.{domain}"``, ``consumer = "bridge-{name}"``, the servers, the credentials), a site's
entry is three lines.

Rules (README, "Configuration"):

* A source's own key wins over the default, whole: a source's ``auth`` or ``tls`` table replaces the default's
  rather than merging with it (mixing one source's user with the defaults' token would be a credential nobody
  wrote).
* ``{name}`` and ``{domain}`` are replaced in every string of a default, inside arrays and tables too, and only in
  the defaults (a source's own values are taken as written). ``{domain}`` is the source's domain after the
  defaults (its own, or the default's). Double braces (``{{...}}``, the server's subject-mapping functions) are
  left alone; any other single-brace word is an error, as is ``{domain}`` for a source without a domain.
* ``name`` cannot be a default: it is what tells the sources apart.

The values are validated as each source's, after the merge; :func:`apply_source_defaults` says which keys came
from the defaults so an error names ``source_defaults.<key>`` once rather than once per source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# a single-brace word that is not part of a double-brace expression: {name}, {domain}, or a mistake
_PLACEHOLDER = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})")
PLACEHOLDERS = ("name", "domain")
NOT_DEFAULTS = ("name",)  # keys a source must set itself

Value = object


@dataclass
class Applied:
    """The sources with their defaults, which keys each took from them, and what could not be applied."""

    sources: list[object]
    # (source index, key) of every key a source took from the defaults
    defaulted: set[tuple[int, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def apply_source_defaults(defaults: Mapping[str, Value], sources: list[object]) -> Applied:
    """Each source (a raw table) with the defaults it does not set itself, placeholders replaced."""
    applied = Applied([])
    if "name" in defaults:
        applied.problems.append(
            "source_defaults.name: a source's name cannot be a default (it tells the sources apart): give each "
            "[[sources]] table its own name"
        )
    # the domain first: the other defaults' {domain} is the source's domain after the defaults
    keys = sorted((key for key in defaults if key not in NOT_DEFAULTS), key=lambda key: key != "domain")
    reported: set[tuple[str, str]] = set()
    for index, raw in enumerate(sources):
        if not isinstance(raw, dict):
            applied.sources.append(raw)  # validation says what is wrong with it
            continue
        source = dict(raw)
        name = source.get("name")
        if not isinstance(name, str):
            applied.sources.append(source)  # no name to fill in: validation reports it first
            continue
        for key in keys:
            if key in source:
                continue
            domain = source.get("domain")
            value, problem = _fill(defaults[key], name, domain if isinstance(domain, str) else None)
            if problem is not None:
                if (key, problem) not in reported:
                    reported.add((key, problem))
                    applied.problems.append(f"source_defaults.{key}: {problem}")
                continue
            source[key] = value
            applied.defaulted.add((index, key))
        applied.sources.append(source)
    return applied


def _fill(value: Value, name: str, domain: str | None) -> tuple[Value, str | None]:
    """``value`` with the placeholders replaced, or the problem that prevents it."""
    if isinstance(value, str):
        return _fill_text(value, name, domain)
    if isinstance(value, list):
        out: list[Value] = []
        for item in value:
            filled, problem = _fill(item, name, domain)
            if problem is not None:
                return value, problem
            out.append(filled)
        return out, None
    if isinstance(value, dict):
        table: dict[str, Value] = {}
        for key, item in value.items():
            filled, problem = _fill(item, name, domain)
            if problem is not None:
                return value, problem
            table[key] = filled
        return table, None
    return value, None  # a number, a boolean or a date: nothing to fill, nothing shared that could change


def _fill_text(text: str, name: str, domain: str | None) -> tuple[str, str | None]:
    unknown = [word for word in _PLACEHOLDER.findall(text) if word not in PLACEHOLDERS]
    if unknown:
        return text, (
            f"{{{unknown[0]}}} is not a placeholder: use {{name}} or {{domain}} (the source's), or write the value "
            "out in full"
        )
    if domain is None and "domain" in _PLACEHOLDER.findall(text):
        return text, (
            f"uses {{domain}}, and the source {name!r} has no domain: give it a domain, or set this key in its "
            "[[sources]] table"
        )
    return _PLACEHOLDER.sub(lambda m: name if m[1] == "name" else str(domain), text), None


def prefix_pattern(defaults: Mapping[str, Value]) -> str | None:
    """The subjects every source taking ``[source_defaults]``' ``subject_prefix`` publishes its copies on, as one
    pattern (``edge.{domain}`` -> ``edge.*.>``: a token with a placeholder may be anything); None when that
    default is absent or names no placeholder (then each source's own prefix says it)."""
    prefix = defaults.get("subject_prefix")
    if not isinstance(prefix, str) or not _PLACEHOLDER.search(prefix):
        return None
    return ".".join("*" if _PLACEHOLDER.search(token) else token for token in prefix.split(".")) + ".>"
