"""``[source_defaults]`` (bridge.config.templates): what every source takes unless it sets it, {name} and {domain}
filled in, and errors that name the default once."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import exposed_secrets, load_config
from bridge.config.templates import apply_source_defaults
from bridge.errors import ConfigError
from bridge.runtime.reload import plan_reload

HEAD = """
[target]
stream = "AGG"

[source_defaults]
servers = ["nats://hub:4222"]
stream = "ORDERS"
"""


def load(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(text, encoding="utf-8")
    return path


def problems(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={} if environ is None else environ)
    return info.value.problems


def test_a_site_is_its_name_domain_and_what_differs(tmp_path: Path) -> None:
    for name in ("store-1", "store-2"):
        (tmp_path / f"{name}.creds").write_text("creds", encoding="utf-8")
    path = load(
        tmp_path,
        HEAD
        + f"""subject_prefix = "edge.{{domain}}"
consumer = "bridge-{{name}}"
max_ack_pending = 500
auth = {{ creds_file = "{tmp_path}/{{name}}.creds" }}

[[sources]]
name = "store-1"
domain = "store1"

[[sources]]
name = "store-2"
domain = "store2"
max_ack_pending = 20
stream = "SALES"
""",
    )
    one, two = load_config(path, environ={}).sources
    assert (one.stream, one.subject_prefix, one.consumer, one.max_ack_pending) == (
        "ORDERS",
        "edge.store1",
        "bridge-store-1",
        500,
    )
    assert (two.stream, two.subject_prefix, two.consumer, two.max_ack_pending) == (
        "SALES",
        "edge.store2",
        "bridge-store-2",
        20,
    )
    assert one.servers == two.servers == ["nats://hub:4222"]
    assert one.auth is not None and one.auth.creds_file == tmp_path / "store-1.creds"
    assert one.api_prefix == "$JS.store1.API"
    assert one.deliver_subject == "nats-bridge.deliver.store-1"  # what a source derives from its name still is


def test_a_default_domain_may_use_the_name_and_the_other_defaults_see_it(tmp_path: Path) -> None:
    path = load(
        tmp_path, HEAD + 'domain = "site-{name}"\nsubject_prefix = "edge.{domain}"\n\n[[sources]]\nname = "a1"\n'
    )
    (source,) = load_config(path, environ={}).sources
    assert (source.domain, source.subject_prefix) == ("site-a1", "edge.site-a1")


def test_a_sources_own_table_replaces_the_defaults_whole_and_its_own_values_are_taken_as_written() -> None:
    applied = apply_source_defaults(
        {"auth": {"token": "t-{name}"}, "consumer": "c-{name}"},
        [{"name": "a", "auth": {"user": "u", "password": "p"}, "stream": "S-{name}"}],
    )
    assert applied.sources == [
        {"name": "a", "auth": {"user": "u", "password": "p"}, "stream": "S-{name}", "consumer": "c-a"}
    ]
    assert applied.defaulted == {(0, "consumer")} and applied.problems == []


def test_double_braces_are_left_for_the_server() -> None:
    applied = apply_source_defaults({"subject_prefix": "x.{{wildcard(1)}}.{name}"}, [{"name": "a"}])
    assert applied.sources == [{"name": "a", "subject_prefix": "x.{{wildcard(1)}}.a"}]


def test_mistakes_are_named_once_whatever_the_number_of_sources(tmp_path: Path) -> None:
    path = load(
        tmp_path,
        HEAD
        + """name = "x"
subject_prefix = "edge.{domain}"
consumer = "bridge-{nmae}"
max_ack_pending = "lots"
colour = "blue"

[[sources]]
name = "store-1"
domain = "store1"

[[sources]]
name = "store-2"

[[sources]]
name = "store-3"
domain = "store3"
""",
    )
    assert problems(path) == [
        "source_defaults.name: a source's name cannot be a default (it tells the sources apart): give each "
        "[[sources]] table its own name",
        "source_defaults.consumer: {nmae} is not a placeholder: use {name} or {domain} (the source's), or write the "
        "value out in full",
        "source_defaults.subject_prefix: uses {domain}, and the source 'store-2' has no domain: give it a domain, or "
        "set this key in its [[sources]] table",
        "source_defaults.max_ack_pending: must be a whole number (got 'lots') (as applied to sources[store-1] and 2 "
        "more)",
        "source_defaults.colour: unknown key; allowed here: servers, stream, domain, consumer, deliver_subject, "
        "manage_consumer, max_ack_pending, mode, ack_wait, filter_subjects, subject_transforms, subject_prefix, "
        "start, start_sequence, start_time, start_ago, rate_limit, window_budget, auth, tls "
        "(as applied to sources[store-1] and 2 more)",
    ]


def test_a_default_from_the_environment_is_named_with_its_variable(tmp_path: Path) -> None:
    path = load(tmp_path, HEAD + '\n[[sources]]\nname = "a"\n')
    variable = "NATS_BRIDGE_SOURCE_DEFAULTS__MAX_ACK_PENDING"
    assert load_config(path, environ={variable: "64"}).sources[0].max_ack_pending == 64
    assert problems(path, {variable: "0"}) == [
        f"source_defaults.max_ack_pending: must be between 1 and 1000000 (got 0) [from environment variable "
        f"{variable}] (as applied to sources[a])"
    ]


def test_an_inline_secret_in_the_defaults_of_a_readable_file_is_a_finding(tmp_path: Path) -> None:
    path = load(tmp_path, HEAD + 'auth = { token = "s3cr3t" }\n\n[[sources]]\nname = "a"\n')
    path.chmod(0o644)
    config = load_config(path, environ={})
    (finding,) = exposed_secrets(path, config)
    assert "source_defaults.auth.token" in finding and "s3cr3t" not in finding
    assert all(
        "s3cr3t" not in line
        for line in problems(load(tmp_path, HEAD + 'auth = { token = 7 }\n\n[[sources]]\nname = "a"\n'))
    )


def test_a_reload_restarts_the_sources_a_changed_default_reaches_and_only_those(tmp_path: Path) -> None:
    sources = '\n[[sources]]\nname = "a"\n\n[[sources]]\nname = "b"\nmax_ack_pending = 7\n'
    old = load_config(load(tmp_path, HEAD + "max_ack_pending = 100\n" + sources), environ={})
    new = load_config(load(tmp_path, HEAD + "max_ack_pending = 200\n" + sources), environ={})
    plan = plan_reload(old, new, {"a", "b"}, coordinated=True)
    assert (plan.changed, plan.unchanged, plan.restart_required) == (["a"], ["b"], [])
    assert plan.restart_if_held == ["a"]


def test_the_defaults_prefix_as_one_pattern_for_every_site() -> None:
    from bridge.config.templates import prefix_pattern

    assert prefix_pattern({"subject_prefix": "edge.{domain}"}) == "edge.*.>"
    assert prefix_pattern({"subject_prefix": "edge.{name}.copies"}) == "edge.*.copies.>"
    assert prefix_pattern({"subject_prefix": "site-{name}"}) == "*.>"
    assert prefix_pattern({"subject_prefix": "edge.fixed"}) is None  # each source's own prefix says it
    assert prefix_pattern({"subject_prefix": "edge.{{x}}"}) is None  # not a placeholder of ours
    assert prefix_pattern({}) is None
