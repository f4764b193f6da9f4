"""The Spark cluster harness's own logic (bridge/testing/spark_cluster.py), without Spark: which task attempts an
executor's log shows running, whether another executor ran a lost one again, and that the processes carrying a
cluster's mark are all found and killed, those in process groups of their own and those left to init included."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from bridge.testing.processes import reap_child, register_child
from bridge.testing.spark_cluster import MARK, LostTask, kill_marked, marked_pids, tasks_in_flight

LOG = """\
26/11/30 04:51:25 INFO Executor: Running task 0.0 in stage 0.0 (TID 0)
26/11/30 04:51:30 INFO Executor: Finished task 0.0 in stage 0.0 (TID 0). 4455 bytes result sent to driver
26/11/30 04:51:31 INFO Executor: Running task 0.0 in stage 1.0 (TID 1)
26/11/30 04:51:31 ERROR Executor: Exception in task 0.0 in stage 1.0 (TID 1)
26/11/30 04:51:32 INFO Executor: Running task 1.0 in stage 2.0 (TID 3)
26/11/30 04:51:32 INFO Executor: Executor killed task 1.0 in stage 2.0 (TID 3), reason: Stage cancelled
26/11/30 04:51:33 INFO Executor: Running task 2.0 in stage 4.1 (TID 7)
"""


def test_a_task_is_in_flight_from_its_running_line_until_its_end_whatever_the_end() -> None:
    assert tasks_in_flight(LOG) == [(2, 0, 4, 1, 7)]
    assert tasks_in_flight(LOG + "26/11/30 04:51:34 INFO Executor: Finished task 2.0 in stage 4.1 (TID 7). 9 b\n") == []
    assert tasks_in_flight("") == []


def test_a_lost_task_counts_as_retried_only_for_a_later_attempt_of_the_same_task_and_stage() -> None:
    lost = LostTask(worker=0, app="app-1", partition=2, attempt=0, stage=4, stage_attempt=1, tid=7)
    assert lost.retried_in("INFO Executor: Running task 2.1 in stage 4.1 (TID 9)")
    assert lost.retried_in("INFO Executor: Running task 2.1 in stage 4.2 (TID 9)")  # in a new attempt of the stage
    assert not lost.retried_in("INFO Executor: Running task 2.0 in stage 4.1 (TID 7)")  # the lost attempt itself
    assert not lost.retried_in("INFO Executor: Running task 3.1 in stage 4.1 (TID 9)")  # another task
    assert not lost.retried_in("INFO Executor: Running task 2.1 in stage 5.0 (TID 9)")  # another stage


def test_every_marked_process_is_killed_even_in_a_group_of_its_own_or_orphaned() -> None:
    token = f"unit-{uuid.uuid4().hex[:8]}"
    # a shell (the group leader) with a child in a session of its own (as pyspark's daemon makes one), and a
    # grandchild the shell leaves to init at once
    script = "setsid sleep 300 & (sleep 300 &) ; echo ready; exec sleep 300"
    proc = subprocess.Popen(
        ["sh", "-c", script],
        env={**os.environ, MARK: f"{token}/worker-0"},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    register_child(proc)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 10
        while len(found := marked_pids(token)) != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(found) == 3, found
        assert marked_pids(f"{token}/worker-1") == []  # another worker's mark
        assert marked_pids(token[:-1]) == []  # a mark is matched whole, never by a prefix of its token
        assert sorted(kill_marked(token, timeout=10)) == found
        assert marked_pids(token) == []
    finally:
        kill_marked(token, timeout=10)
        reap_child(proc, timeout=10)
