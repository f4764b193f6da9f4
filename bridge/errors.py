"""The flat set of exception types raised at the bridge's boundaries.

Everything nats-py or the OS raises is mapped to one of these once, at the adapter edge, so callers (the
runtime, the CLI) handle a short documented list instead of a library's hierarchy; :func:`spark_failure` does the
same for what Spark raises (one line of text).
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


class ApiError(BridgeError):
    """A JetStream API request was answered with an error (``code``/``err_code`` are the server's)."""

    def __init__(self, subject: str, code: int, err_code: int, description: str) -> None:
        self.subject = subject
        self.code = code
        self.err_code = err_code
        self.description = description
        super().__init__(f"{description} (code {code}, err_code {err_code})")


class ApiTimeout(BridgeError):
    """A JetStream API request got no answer in time. For a consumer RESET this is how a missing or leaderless
    consumer shows (docs/protocol.md section 5): the server does not answer at all."""


class ApiUnavailable(BridgeError):
    """No JetStream responder for a request, or the connection cannot carry it right now."""


class PermissionDenied(BridgeError):
    """The server refused a publish or a subscription a request needed: the user lacks that permission.

    The server says so only asynchronously (``-ERR 'Permissions Violation for ...'``, ``bridge.io.permissions``), and
    the request would otherwise just go unanswered. ``operation`` is ``"publish"`` or ``"subscribe"``; ``subject`` is
    the subject as the bridge used it, or as the server wrote it (lowercased by nats-py) when the bridge does not know
    it; ``reply``: the subject was a publish's reply subject; ``detail`` says what the subject was for. The message
    is one line naming the operation, the subject and docs/permissions.md.
    """

    def __init__(self, operation: str, subject: str, detail: str = "", *, reply: bool = False) -> None:
        self.operation = operation
        self.subject = subject
        self.detail = detail
        self.reply = reply
        verb = "publish with the reply subject" if reply else f"{operation} to"
        what = f", {detail}" if detail else ""
        super().__init__(
            f'permission denied: this account may not {verb} "{subject}"{what} '
            "(the server's permissions violation); grant it as docs/permissions.md lists"
        )


class ConsumerUnfit(BridgeError):
    """A pre-created consumer cannot be used by the bridge; the message says which setting and why."""


class AuditError(BridgeError):
    """The audit cannot read a stream (missing, without ``allow_direct``, unreachable) or was given a bad option;
    the message names the stream or option and the fix."""


class SparkJobFailed(AuditError):
    """The audit's Spark job failed once Spark was asked to start it (a stream deleted while it was read, a master
    that cannot be reached, ...). The message is Spark's failure in one line; ``detail`` is the whole traceback,
    the JVM's included, written down while that JVM still ran (the text of a JVM exception is fetched from it)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def spark_failure(exc: BaseException) -> str:
    """One line for a failure Spark raised (read while its JVM still runs: a JVM exception's text is fetched from
    it, and after the JVM stops Python can only print ``<exception str() failed>``). A failure of the bridge's own
    code in a Spark worker travels inside the JVM's text as ``AuditError: <message>``: that message, else the first
    line."""
    try:
        text = str(exc)
    except Exception:  # the JVM that held it is gone
        return type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "AuditError: " in line:
            return line.split("AuditError: ", 1)[1]
    return lines[0][:500] if lines else type(exc).__name__
