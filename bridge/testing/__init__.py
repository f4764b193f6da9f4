"""The harness for running the bridge against real ``nats-server`` processes, as ``trio.testing`` is for trio.

It is used by the ``demo`` command, the test suite (its pytest fixtures live in the ``conftest.py`` files, so
nothing here imports pytest), the chaos suite (``chaos/``) and the benchmark (``bench/``). One module per job:

* :mod:`bridge.testing.servers`: find the ``nats-server`` binary; :class:`~bridge.testing.servers.NatsServer`
  (one server with JetStream on loopback, restartable on the same ports and store); a hub + leaf
  :class:`~bridge.testing.servers.Topology` (:func:`~bridge.testing.servers.start_topology`); free ports.
* :mod:`bridge.testing.processes`: the registry of child processes (SIGKILLed at interpreter exit unless reaped),
  pausing a process with SIGSTOP; the bridge CLI as a child process
  (:class:`~bridge.testing.processes.BridgeProcess`, its log read as JSON events), started as a named fleet
  instance or not, and one-shot CLI runs.
* :mod:`bridge.testing.inprocess`: the bridge run in the caller's event loop, for scenarios that patch it.
* :mod:`bridge.testing.polling`: waits on conditions against a deadline (or for a value to settle), and
  observation windows.
* :mod:`bridge.testing.configs`: bridge TOML configurations for a topology, with short test timings.
* :mod:`bridge.testing.jetstream`: raw JetStream API requests, a paced publisher, reading a stream back by
  Direct Get, exact-sequence assertions (every source replicated exactly), and a tap auditing the bridge's
  flow-control answers.
* :mod:`bridge.testing.http`: GETs on loopback listeners (server monitoring, the bridge's ``/metrics`` and
  ``/readyz``, a standby's readiness), requests written by hand for tests of an HTTP server itself, and a stand-in
  listener for the commands that ask the daemon's.
* :mod:`bridge.testing.container`: the container image under podman: a base image from Debian's packages (cached),
  the Dockerfile built on it, containers run and removed by name.
* :mod:`bridge.testing.spark_cluster`: a Spark standalone cluster on loopback (a master and workers from the installed
  pyspark's ``spark-class``), a worker killed while its executor runs a task, and every process it started stopped.
* :mod:`bridge.testing.security`: TLS certificates, NKeys, operator/account/user JWTs and creds files.
* :mod:`bridge.testing.fakes`: in-memory stand-ins for the source runner's ports, for unit tests (no servers).
* :mod:`bridge.testing.engines`: the stream, consumer and settings for driving the core's engines by hand.

Importing this package imports none of its modules; import the one you need.
"""
