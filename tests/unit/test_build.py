"""The compiled core (setup.py, bridge/_build.py): used only when it was compiled from the sources beside it."""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bridge
import bridge.core.engine
from bridge import _build

EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)
PACKAGE = Path(bridge.__file__).resolve().parent
COMPILED = any(p.name.endswith(EXTENSIONS) for p in (PACKAGE / "core").iterdir())
needs_compiled = pytest.mark.skipif(not COMPILED, reason="the core was installed without compiling (pure Python)")

PROBE = "import bridge, bridge.core.engine as e; print(bridge.CORE_BUILD); print(e.__file__)"


def _probe(root: Path, **env: str) -> tuple[str, str]:
    """(CORE_BUILD, the file bridge.core.engine came from) in a fresh interpreter importing ``bridge`` from ``root``."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split("\n")
    return out[0], out[1]


def test_the_build_named_is_the_one_imported() -> None:
    compiled = bridge.core.engine.__file__.endswith(EXTENSIONS)
    assert (bridge.CORE_BUILD == "compiled") == compiled
    assert bridge.CORE_BUILD == "compiled" or bridge.CORE_BUILD.startswith("interpreted")


def test_the_digest_covers_every_source_file_and_its_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = tmp_path / "core"
    core.mkdir()
    (core / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(_build, "_CORE_DIR", core)
    first = _build.core_digest()
    (core / "a.py").write_text("x = 2\n")
    assert _build.core_digest() != first
    (core / "a.py").write_text("x = 1\n")
    assert _build.core_digest() == first
    (core / "b.py").write_text("")
    assert _build.core_digest() != first


@needs_compiled
def test_pure_python_at_run_time_loads_every_core_module_from_source() -> None:
    build, engine = _probe(PACKAGE.parent, NATS_BRIDGE_PURE_PYTHON="1")
    assert build == "interpreted (NATS_BRIDGE_PURE_PYTHON)"
    assert engine == str(PACKAGE / "core" / "engine.py")


@pytest.mark.skipif(bridge.CORE_BUILD != "compiled", reason=f"this process runs the core {bridge.CORE_BUILD}")
def test_an_edited_core_runs_its_source_not_the_older_compiled_modules(tmp_path: Path) -> None:
    # a copy of the installed package with its compiled modules (and mypyc's shared library beside the package)
    shutil.copytree(PACKAGE, tmp_path / "bridge", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in PACKAGE.parent.glob("*__mypyc*"):
        shutil.copy2(shared, tmp_path)
    assert _probe(tmp_path) == ("compiled", str(next((tmp_path / "bridge" / "core").glob("engine.*.so"))))

    pipeline = tmp_path / "bridge" / "core" / "pipeline.py"
    pipeline.write_text(pipeline.read_text() + "\n# edited after the build\n")
    assert _probe(tmp_path) == ("interpreted (stale build)", str(tmp_path / "bridge" / "core" / "engine.py"))


def test_the_package_shipped_to_spark_executors_imports_from_its_zip_with_the_core_from_source() -> None:
    """Spark puts the package on a cluster's executors as a zip (bridge/spark/session.py): no extension module loads
    from one, and the core has no directory there to look for compiled modules in: its sources run."""
    pytest.importorskip("pyspark", reason="the audit extra is not installed")
    from bridge.spark.session import package_archive

    archive = package_archive()
    build, engine = _probe(archive.parent, PYTHONPATH=str(archive))
    assert (build, engine) == ("interpreted", str(archive / "bridge" / "core" / "engine.py"))


def test_bridge_children_keep_the_build_choice_but_no_configuration_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bridge.testing.processes import child_env

    monkeypatch.setenv("NATS_BRIDGE_PURE_PYTHON", "1")
    monkeypatch.setenv("NATS_BRIDGE_TARGET__STREAM", "OTHER")
    env = child_env()
    assert env["NATS_BRIDGE_PURE_PYTHON"] == "1"
    assert "NATS_BRIDGE_TARGET__STREAM" not in env


def test_bench_headers_say_which_build_was_measured() -> None:
    from bench.procs import revision_text

    assert revision_text({"commit": "abc", "bridge_dirty": True, "core": "compiled"}) == (
        "commit abc (bridge/ modified), core compiled"
    )
    assert revision_text({"commit": "abc", "bridge_dirty": False}) == "commit abc, core unknown"


def test_an_install_without_a_compiler_stops_and_names_the_fix(tmp_path: Path) -> None:
    setup = PACKAGE.parent / "setup.py"
    if not setup.is_file():
        pytest.skip("not a source checkout")
    env = {"PATH": "/usr/bin:/bin", "CC": str(tmp_path / "no-such-cc")}
    done = subprocess.run(
        [sys.executable, str(setup), "--name"], cwd=PACKAGE.parent, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "needs a C compiler" in done.stderr and "NATS_BRIDGE_PURE_PYTHON=1" in done.stderr
    pure = subprocess.run(
        [sys.executable, str(setup), "--name"],
        cwd=PACKAGE.parent,
        env={**env, "NATS_BRIDGE_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pure.returncode == 0 and pure.stdout.strip().endswith("nats-bridge")


def test_a_build_without_isolation_in_an_environment_without_mypy_stops_and_names_the_fix(tmp_path: Path) -> None:
    """``pip install --no-build-isolation`` builds with what the environment has: without mypy (mypyc), one line
    saying what to install, not a traceback."""
    setup = PACKAGE.parent / "setup.py"
    if not setup.is_file():
        pytest.skip("not a source checkout")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the compiler's message comes first")
    hidden = tmp_path / "mypyc"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('mypyc hidden by the test')\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(setup), "--name"],
        cwd=PACKAGE.parent,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "pip install 'mypy==" in done.stderr and "NATS_BRIDGE_PURE_PYTHON=1" in done.stderr
    assert "Traceback" not in done.stderr
