"""Which build of the core runs: compiled by mypyc (setup.py) or the Python source beside it.

Imported by ``bridge/__init__.py`` before anything imports ``bridge.core``. The compiled modules are used only
when the core's source files are the ones they were compiled from (their digest, recorded by setup.py): mypyc
compiles the core as one unit whose modules call each other directly, so a core that is partly compiled and partly
edited source would run old code.
When any source differs (an edited checkout, a ``git checkout`` after an editable install) or
``NATS_BRIDGE_PURE_PYTHON=1`` is set, every ``bridge.core`` module is loaded from its source instead: the same
code, slower; ``nats-bridge run`` logs which build it uses.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PURE_ENV = "NATS_BRIDGE_PURE_PYTHON"
CORE = "bridge.core"
DIGEST_FILE = "core.sha256"  # in the bridge package, written by setup.py when it compiles
_CORE_DIR = Path(__file__).resolve().parent / "core"


class _CoreFromSource(importlib.abc.MetaPathFinder):
    """Finds ``bridge.core`` and its modules as source files, ahead of the compiled ones beside them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == CORE:
            return importlib.util.spec_from_file_location(
                fullname, _CORE_DIR / "__init__.py", submodule_search_locations=[str(_CORE_DIR)]
            )
        if fullname.startswith(CORE + ".") and fullname.count(".") == 2:
            source = _CORE_DIR / (fullname.rpartition(".")[2] + ".py")
            if source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def core_digest() -> str:
    """A digest of the core's source files (names and contents): setup.py records it beside the compiled modules."""
    digest = hashlib.sha256()
    for source in sorted(_CORE_DIR.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()


def _compiled_build() -> str:
    """``compiled``, or why the source runs: ``interpreted`` (nothing compiled), ``interpreted (stale build)``,
    ``interpreted (NATS_BRIDGE_PURE_PYTHON)``."""
    if not _CORE_DIR.is_dir():
        # imported from a zip (the package Spark ships to a cluster's executors, bridge/spark/session.py): no
        # extension module loads from one, and the zip importer finds the core's sources by itself
        return "interpreted"
    if not any(p.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) for p in _CORE_DIR.iterdir()):
        return "interpreted"
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"interpreted ({PURE_ENV})"
    try:
        built = (_CORE_DIR.parent / DIGEST_FILE).read_text().strip()
    except OSError:
        built = ""
    return "compiled" if built == core_digest() else "interpreted (stale build)"


CORE_BUILD = _compiled_build()
"""How ``bridge.core`` runs in this process: ``compiled`` or ``interpreted ...`` with the reason."""

if CORE_BUILD != "compiled" and CORE_BUILD != "interpreted" and CORE not in sys.modules:
    sys.meta_path.insert(0, _CoreFromSource())
