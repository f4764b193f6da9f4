"""The flat set of exception types raised at the bridge's boundaries.

Everything nats-py or the OS raises is mapped to one of these once, at the adapter edge, so callers (the
runtime, the CLI) handle a short documented list instead of a library's hierarchy.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base of every error the bridge raises on purpose."""


class ConfigError(BridgeError):
    """The configuration is invalid. ``problems`` holds one line per problem, each naming the key and the fix."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        super().__init__(f"invalid configuration{where}:\n" + "\n".join(f"  {p}" for p in self.problems))


class OriginUnavailable(BridgeError):
    """The origin (source) server or its JetStream API cannot be reached or did not answer."""


class TargetUnavailable(BridgeError):
    """The target (aggregate) server or stream cannot be reached or did not answer."""


class PublishRejected(BridgeError):
    """The target refused a publish. ``code``/``err_code`` are the server's, ``permanent`` says retrying the
    same message cannot help without an operator's action (it is still retried: nothing is ever skipped)."""

    def __init__(self, description: str, code: int = 0, err_code: int = 0, permanent: bool = False) -> None:
        self.description = description
        self.code = code
        self.err_code = err_code
        self.permanent = permanent
        super().__init__(f"publish rejected: {description} (code {code}, err_code {err_code})")


class ResetTimeout(BridgeError):
    """A consumer RESET got no reply in time: the consumer is missing, leaderless, or the origin unreachable."""


class ConsumerUnfit(BridgeError):
    """A pre-created consumer cannot be used by the bridge; the message says which setting and why."""
