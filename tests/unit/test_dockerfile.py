"""Static checks of the Dockerfile and .dockerignore (no container engine is needed to run them)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
VENV = "/opt/nats-bridge"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (the default ``\\`` escape only)."""
    instructions: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # comments may sit inside a continued instruction
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """Instructions grouped by stage, each group starting with its FROM (ARGs before the first FROM dropped)."""
    groups: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            groups.append([instruction])
        elif groups:
            groups[-1].append(instruction)
    return groups


def exec_form(instruction: Instruction) -> list[str]:
    """The JSON array of an exec-form instruction; fails for the shell form."""
    try:
        value = json.loads(instruction.args)
    except json.JSONDecodeError:
        pytest.fail(f"line {instruction.line}: {instruction.keyword} is not in exec (JSON array) form")
    assert isinstance(value, list) and all(isinstance(item, str) for item in value), instruction
    return value


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(instructions: list[Instruction]) -> list[Instruction]:
    return stages(instructions)[-1]


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [instruction for instruction in stage if instruction.keyword == keyword]
    assert len(found) == 1, f"expected exactly one {keyword} in the stage, found {len(found)}"
    return found[0]


def test_multi_stage_on_the_same_slim_python(instructions: list[Instruction]) -> None:
    groups = stages(instructions)
    assert len(groups) == 2
    args = {i.args.partition("=")[0]: i.args.partition("=")[2] for i in instructions if i.keyword == "ARG"}
    assert args.get("PYTHON_IMAGE") == "python:3.11-slim"
    # The venv links to the interpreter of the image it was made in: both stages must be that image.
    assert groups[0][0].args == "${PYTHON_IMAGE} AS builder"
    assert groups[1][0].args == "${PYTHON_IMAGE}"


def test_builder_installs_the_package_without_extras(instructions: list[Instruction]) -> None:
    builder = stages(instructions)[0]
    runs = " && ".join(i.args for i in builder if i.keyword == "RUN")
    assert f"python -m venv {VENV}" in runs
    installs = re.findall(r"pip install ([^&;]*)", runs)
    assert installs, "the builder installs nothing"
    for install in installs:
        targets = [word for word in shlex.split(install) if not word.startswith("-")]
        assert targets == ["."], f"install exactly the package, no extras: pip install {install}"


def test_the_build_copies_what_pyproject_reads(instructions: list[Instruction]) -> None:
    """``pip install .`` in the builder reads pyproject.toml, its readme, and the version from the package."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    builder = stages(instructions)[0]
    copied = {source for i in builder if i.keyword == "COPY" for source in i.args.split()[:-1]}
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    assert "version" in pyproject["project"]["dynamic"]
    version_attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert version_attr.split(".")[0] in copied, f"the version comes from {version_attr}"
    # the image installs the dependencies only: the dev group is not an extra (pip install . cannot pull it in)
    assert "test" not in pyproject["project"]["optional-dependencies"]
    assert "dev" in pyproject["dependency-groups"]


def test_final_stage_runs_as_a_non_root_user(final: list[Instruction]) -> None:
    user = only(final, "USER").args
    name, _, group = user.partition(":")
    assert name not in ("", "0", "root") and group not in ("0", "root"), user
    assert name == "10001"  # numeric, so Kubernetes' runAsNonRoot can verify it
    position = final.index(only(final, "USER"))
    # Nothing after USER may need root again.
    assert all(i.keyword != "RUN" for i in final[position:])


def test_the_comments_say_which_user_must_read_the_mounted_configuration(final: list[Instruction]) -> None:
    """The operator mounts the configuration: the Dockerfile names the uid (and gid) that must be able to read it,
    and they are the ones USER sets."""
    uid, _, gid = only(final, "USER").args.partition(":")
    comments = " ".join(
        line.strip().lstrip("#").strip() for line in DOCKERFILE.read_text().splitlines() if line.strip().startswith("#")
    )
    assert f"uid {uid}" in comments and f"gid {gid or uid}" in comments, "name the user that reads the config"
    assert "/etc/nats-bridge/bridge.toml" in comments and "read the mounted file" in comments
    lines = DOCKERFILE.read_text().splitlines()
    above_user = lines[only(final, "USER").line - 2]
    assert above_user.startswith("#") and uid in above_user and "configuration" in above_user, above_user


def test_final_stage_copies_only_the_venv_and_installs_nothing(final: list[Instruction]) -> None:
    copies = [i for i in final if i.keyword in ("COPY", "ADD")]
    assert [i.args for i in copies] == [f"--from=builder {VENV} {VENV}"]
    for run in (i for i in final if i.keyword == "RUN"):
        assert not re.search(r"\bpip3?\s+install\b|-m\s+pip\b|apt-get\s+install|\bapk\s+add\b", run.args), run


def test_environment_health_check_and_entry_point(final: list[Instruction]) -> None:
    env = " ".join(i.args for i in final if i.keyword == "ENV")
    assert f"PATH={VENV}/bin:$PATH" in env and "PYTHONUNBUFFERED=1" in env
    assert only(final, "EXPOSE").args == "9464"
    assert only(final, "STOPSIGNAL").args == "SIGTERM"

    healthcheck = only(final, "HEALTHCHECK")
    options, _, command = healthcheck.args.partition("CMD ")
    assert "--timeout=" in options and "--interval=" in options
    probe = exec_form(Instruction("CMD", command, healthcheck.line))
    # the probe reads http.listen from the same file the daemon runs with, so it follows the port (no port here)
    run = exec_form(only(final, "CMD"))
    assert probe == ["nats-bridge", "health", *run[1:]], probe
    assert not any("9464" in word for word in probe)

    assert exec_form(only(final, "ENTRYPOINT")) == ["nats-bridge"]
    assert run == ["run", "-c", "/etc/nats-bridge/bridge.toml"]


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore excludes ``path`` (last matching pattern wins; a match on a parent counts)."""
    parts = path.split("/")
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        if glob.startswith("**/"):
            candidates += ["/".join(parts[n:]) for n in range(len(parts))]
            glob = glob.removeprefix("**/")
        if any(fnmatch.fnmatchcase(candidate, glob) for candidate in candidates):
            verdict = not negated
    return verdict


def test_dockerignore_lets_in_what_the_build_copies_and_nothing_else(instructions: list[Instruction]) -> None:
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    sources = [
        source
        for i in instructions
        if i.keyword == "COPY" and not i.args.startswith("--from")
        for source in i.args.split()[:-1]
    ]
    assert sources, "the build copies nothing from the context"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
    assert not ignored("bridge/observe/systemd.py", patterns)
    for unwanted in (".git/config", ".venv/bin/python", ".cache/x", "tests/conftest.py", "chaos-results/run/x.json"):
        assert ignored(unwanted, patterns), f"{unwanted} would be sent to the build"
    assert ignored("bridge/__pycache__/config.cpython-311.pyc", patterns)
    # a local build's compiled core: the image compiles its own
    assert ignored("bridge/core/engine.cpython-311-x86_64-linux-gnu.so", patterns)
    assert ignored("bridge/core.sha256", patterns)


@pytest.mark.parametrize("example", ["kubernetes-sidecar.yaml", "kubernetes-deployment.yaml"])
def test_the_kubernetes_example_bridge_config_loads(tmp_path: Path, example: str) -> None:
    """The ConfigMap's bridge.toml (the indented block after ``bridge.toml: |``) is a valid configuration."""
    from bridge.config import load_config

    text = (Path(__file__).resolve().parents[2] / "config" / example).read_text()
    lines = text.split("  bridge.toml: |\n", 1)[1].splitlines()
    block = []
    for line in lines:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    path = tmp_path / "bridge.toml"
    path.write_text("\n".join(block) + "\n")
    config = load_config(path, environ={})
    assert config.http.listen == "0.0.0.0:9464"
    assert [s.name for s in config.sources] == ["leaf-a"]
    assert config.coordination.enabled
