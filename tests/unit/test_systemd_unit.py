"""The systemd unit in systemd/: the settings the daemon relies on, and systemd's own verdict on the file."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import EngineConfig

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD_DIR / "nats-bridge.service"
SYSUSERS = SYSTEMD_DIR / "nats-bridge.sysusers"
INSTALLED_EXEC = "/usr/local/bin/nats-bridge"
DRAIN_GRACE_SECONDS = EngineConfig().shutdown_grace  # the default drain, which the stop timeout must exceed
# `systemd-analyze security` exposure, 0 (locked down) to 10; it scores this unit at about 1.2 (systemd 252).
MAX_EXPOSURE = 2.5
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "UMask": "0077",
}


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value assigned, in order (systemd keys may repeat, unlike configparser's)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"line {number}: continuation lines are not parsed by this test"
        if line.startswith("["):
            assert line.endswith("]"), f"line {number}: malformed section header {line!r}"
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"line {number}: not a key=value in a section: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    """A systemd time span as seconds; the plain forms this unit uses (``30``, ``30s``, ``2min``)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m)?", value)
    assert match, f"unsupported time span {value!r}"
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60}[unit]


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


def last(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    """The effective value of ``key``: systemd lets a later assignment override an earlier one."""
    values = unit.get(section, {}).get(key)
    assert values, f"[{section}] {key}= is missing"
    return values[-1]


def test_notify_type_watchdog_and_restart(unit: dict[str, dict[str, list[str]]]) -> None:
    assert last(unit, "Service", "Type") == "notify"
    assert last(unit, "Service", "NotifyAccess") == "main"
    assert seconds(last(unit, "Service", "WatchdogSec")) > 0
    assert last(unit, "Service", "Restart") == "on-failure"
    assert seconds(last(unit, "Service", "RestartSec")) > 0
    assert last(unit, "Service", "RestartPreventExitStatus") == "2"  # a configuration error is not retried


def test_stop_timeout_leaves_room_for_the_drain(unit: dict[str, dict[str, list[str]]]) -> None:
    assert seconds(last(unit, "Service", "TimeoutStopSec")) > DRAIN_GRACE_SECONDS
    # SIGTERM must reach the main process (it drains), not every process at once or nobody.
    assert last(unit, "Service", "KillMode") in ("mixed", "main")


def test_exec_lines(unit: dict[str, dict[str, list[str]]]) -> None:
    assert last(unit, "Service", "ExecStart") == f"{INSTALLED_EXEC} run -c /etc/nats-bridge/bridge.toml"
    assert last(unit, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"


def test_runs_as_its_own_user_with_secrets_from_a_root_only_file(unit: dict[str, dict[str, list[str]]]) -> None:
    assert last(unit, "Service", "User") == "nats-bridge"
    assert last(unit, "Service", "Group") == "nats-bridge"
    assert last(unit, "Service", "EnvironmentFile") == "-/etc/nats-bridge/env"
    environment = unit["Service"]["Environment"]
    assert "PYTHONUNBUFFERED=1" in environment


def test_hardening(unit: dict[str, dict[str, list[str]]]) -> None:
    settings = {key: last(unit, "Service", key) for key in HARDENING}
    assert settings == HARDENING
    assert "@system-service" in unit["Service"]["SystemCallFilter"]


def test_logging_and_ordering(unit: dict[str, dict[str, list[str]]]) -> None:
    assert last(unit, "Service", "StandardOutput") == "journal"
    assert last(unit, "Service", "StandardError") == "journal"
    assert last(unit, "Service", "SyslogIdentifier") == "nats-bridge"
    assert last(unit, "Unit", "After") == "network-online.target"
    assert last(unit, "Unit", "Wants") == "network-online.target"
    assert last(unit, "Install", "WantedBy") == "multi-user.target"


def verifiable_copy(tmp_path: Path) -> Path:
    """A copy of the unit whose ExecStart is this venv's real ``nats-bridge``, which ``verify`` checks exists.

    The ``User=`` line stays: systemd 252's ``verify`` does not resolve users, so an absent ``nats-bridge`` user
    is not an error (if a later version checks, the copy would need ``DynamicUser=yes`` instead).
    """
    executable = Path(sys.prefix) / "bin" / "nats-bridge"
    if not executable.is_file():
        pytest.skip(f"no nats-bridge console script at {executable} (install the package into this environment)")
    text = UNIT.read_text()
    assert text.count(f"ExecStart={INSTALLED_EXEC} ") == 1
    copy = tmp_path / UNIT.name  # verify wants the real name: the suffix says what kind of unit it is
    copy.write_text(text.replace(f"ExecStart={INSTALLED_EXEC} ", f"ExecStart={executable} "))
    return copy


def systemd_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not on PATH (systemd is not installed here)")
    return path


def unit_problems(unit_path: Path, result: subprocess.CompletedProcess[str]) -> list[str]:
    """Lines systemd printed about our unit: it reports unknown keys and bad values but still exits 0 for them."""
    return [line for line in (result.stdout + result.stderr).splitlines() if unit_path.name in line]


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = systemd_tool("systemd-analyze")
    copy = verifiable_copy(tmp_path)
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert result.returncode == 0 and not unit_problems(copy, result), result.stdout + result.stderr


@pytest.mark.parametrize(
    ("good", "bad"),
    [("Type=notify", "Typ=notify"), ("WatchdogSec=30", "WatchdogSec=thirty"), ("KillMode=mixed", "KillMode=bogus")],
)
def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path: Path, good: str, bad: str) -> None:
    """The check above can fail: a misspelled key or a bad value makes it report the unit."""
    analyze = systemd_tool("systemd-analyze")
    copy = verifiable_copy(tmp_path)
    text = copy.read_text()
    assert f"\n{good}\n" in text
    copy.write_text(text.replace(f"\n{good}\n", f"\n{bad}\n"))
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert unit_problems(copy, result), f"verify did not notice {bad!r}: {result.stdout + result.stderr}"


def test_systemd_analyze_security_exposure_stays_low(tmp_path: Path) -> None:
    analyze = systemd_tool("systemd-analyze")
    copy = verifiable_copy(tmp_path)
    # --threshold counts in tenths of the printed exposure; it fails the command when the unit scores above it.
    command = [analyze, "security", "--offline=true", f"--threshold={round(MAX_EXPOSURE * 10)}", str(copy)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no offline security analysis (systemd < 250)")
    summary = [line for line in result.stdout.splitlines() if "Overall exposure level" in line]
    assert result.returncode == 0, "\n".join([*summary, result.stderr])


def test_sysusers_snippet_creates_the_user_and_group(tmp_path: Path) -> None:
    sysusers = systemd_tool("systemd-sysusers")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    result = subprocess.run(
        [sysusers, f"--root={root}", str(SYSUSERS)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    passwd = {line.split(":")[0]: line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines()}
    group = {line.split(":")[0]: line.split(":") for line in (root / "etc" / "group").read_text().splitlines()}
    assert "nats-bridge" in passwd and "nats-bridge" in group
    user = passwd["nats-bridge"]
    assert user[3] == group["nats-bridge"][2]  # primary group is its own
    assert int(user[2]) < 1000  # a system user
    assert user[6] in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false")
