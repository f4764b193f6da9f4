"""The ``nats-bridge`` commands, one module each: ``run``, ``check``, ``setup``, ``status``,
``reset``, ``audit``, ``ingest`` and ``demo``.

:mod:`bridge.cli` parses the arguments and calls them; nothing here imports the CLI. What several commands share
(exit codes, the request timeout, the coordination bucket's connection) is in :mod:`bridge.commands.common`.
"""
