"""Build step: compile the sans-IO core (``bridge/core``) to C with mypyc, unless told not to.

Everything else about the package is in pyproject.toml. The core decides what happens to every message and is
strictly typed (``mypy --strict``), which is what mypyc needs: compiled, it costs about a third less CPU per
message (bench/RESULTS.md). The ``.py`` files stay in the package beside the compiled modules, and ``bridge``
falls back to them by itself when they are newer than the build or when ``NATS_BRIDGE_PURE_PYTHON=1`` is set at
run time (``bridge/_build.py``).

``NATS_BRIDGE_PURE_PYTHON=1`` at install time skips the compilation: for a machine without a C compiler. The same
code runs, only slower.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

PURE = "NATS_BRIDGE_PURE_PYTHON"


def compiled_core() -> list[object]:
    """The extension modules of ``bridge/core`` (none when the pure-Python build is asked for)."""
    if os.environ.get(PURE, "") not in ("", "0"):
        return []
    # the compiler setuptools will call: $CC, else the one this Python was built with
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    missing = [
        what
        for what, present in (
            (f"a C compiler ({compiler})", shutil.which(compiler) is not None),
            (f"the Python headers ({headers})", headers.is_file()),
        )
        if not present
    ]
    if missing:
        sys.exit(
            f"nats-bridge compiles its core with mypyc and needs {' and '.join(missing)}: install what is missing "
            f"(Debian/Ubuntu: apt install gcc python3-dev), or set {PURE}=1 to install the pure-Python build "
            "(the same code, more CPU per message)"
        )
    try:
        from mypyc.build import mypycify
    except ImportError:  # a build without isolation (pip --no-build-isolation) into an environment without mypy
        with (Path(__file__).resolve().parent / "pyproject.toml").open("rb") as fh:
            wanted = [r for r in tomllib.load(fh)["build-system"]["requires"] if r.startswith("mypy")]
        sys.exit(
            "nats-bridge compiles its core with mypyc, which comes with mypy, and this environment has none (pip "
            f"--no-build-isolation builds with what is installed): pip install '{wanted[0] if wanted else 'mypy'}' "
            f"first, or set {PURE}=1 to install the pure-Python build"
        )

    sources = sorted(str(path) for path in Path("bridge/core").glob("*.py"))
    return list(mypycify(sources, opt_level="3", debug_level="0"))


class BuildCore(build_ext):
    """Compiles the core, then records what it was compiled from (``bridge/_build.py`` runs the source instead when
    that differs). The record is removed first and written only once every module is built: a build that fails
    leaves none, so compiled modules of an earlier build beside the source are never taken for this source's."""

    def run(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bridge._build import DIGEST_FILE, core_digest

        records = [Path("bridge", DIGEST_FILE)]
        if not self.inplace:  # a wheel: the package data was copied already
            records.append(Path(self.build_lib, "bridge", DIGEST_FILE))
        for record in records:
            record.unlink(missing_ok=True)
        super().run()
        if self.extensions:
            for record in records:
                record.parent.mkdir(parents=True, exist_ok=True)
                record.write_text(core_digest() + "\n")


setup(ext_modules=compiled_core(), cmdclass={"build_ext": BuildCore})
