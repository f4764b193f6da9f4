"""``chaos.checker`` and ``chaos.report``: the chaos suite's verdicts, checked against histories built here.

The property tests build a "true" history (which attempts reached the origin, at which origin sequence, which
were acked), derive the aggregate a correct bridge would leave and deletion samples consistent with it, check
that the checker finds nothing, then break the aggregate in exactly one way and check that the checker reports
exactly that.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.checker import UNKNOWN_SOURCE, check_run, check_source
from chaos.model import DeletionSample, Excuse, FaultEvent, PublishLog, ScenarioResult, SourceVerdict, StoredCopy
from chaos.report import format_table, summary, write_report

SOURCE = "edge1"
COUNTERS = ("lost", "duplicated", "reordered", "unexpected", "deleted_before_stored", "stranded")


@dataclass
class History:
    log: PublishLog
    copies: list[StoredCopy]  # the clean aggregate, in aggregate order
    origin: list[tuple[int, int]]  # (attempt, origin seq) of everything that reached the origin, in origin order
    samples: list[DeletionSample] = field(default_factory=list)

    def acked_positions(self) -> list[int]:
        """Indices into ``copies`` of the acked attempts' copies."""
        return [i for i, c in enumerate(self.copies) if c.n in self.log.acked]

    def check(
        self,
        copies: list[StoredCopy] | None = None,
        *,
        excuses: list[Excuse] | None = None,
        samples: list[DeletionSample] | None = None,
        remaining: list[int] | None = None,
    ) -> SourceVerdict:
        return check_source(
            SOURCE,
            "workqueue",
            self.log,
            self.copies if copies is None else copies,
            excuses or [],
            self.samples if samples is None else samples,
            remaining,
        )


@st.composite
def histories(draw: st.DrawFn, min_acked: int = 0) -> History:
    fates = draw(
        st.lists(st.sampled_from(["acked", "acked", "acked", "unacked-stored", "absent"]), min_size=1, max_size=60)
    )
    fates += ["acked"] * min_acked  # so that tests breaking acked copies always have some
    log = PublishLog(SOURCE)
    copies: list[StoredCopy] = []
    origin: list[tuple[int, int]] = []
    seq = draw(st.integers(1, 1000))  # the origin may have held other messages before the run
    agg = draw(st.integers(0, 1000))
    for fate in fates:
        n = log.next_attempt()
        if fate == "absent":  # the publish never reached the origin
            continue
        if fate == "acked":
            log.ack(n, seq, 10)
        agg += draw(st.integers(1, 3))  # other sources' copies interleave in the aggregate
        copies.append(StoredCopy(agg, SOURCE, n))
        origin.append((n, seq))
        seq += 1

    # a sample taken when the aggregate held the first k copies: the origin can only have deleted stored messages,
    # so its first_seq is at most the origin sequence of message k+1
    samples = []
    first_origin_seq = origin[0][1] if origin else seq
    for k in draw(st.lists(st.integers(0, len(origin)), max_size=8)):
        last = copies[k - 1].aggregate_seq if k else 0
        first = draw(st.integers(1, first_origin_seq + k))
        samples.append(DeletionSample(SOURCE, first, last))
    return History(log, copies, origin, samples)


def counts(verdict: SourceVerdict) -> dict[str, int]:
    return {name: getattr(verdict, name) for name in COUNTERS}


def only(**expected: int) -> dict[str, int]:
    return {name: expected.get(name, 0) for name in COUNTERS}


def tail_seq(h: History) -> int:
    return h.copies[-1].aggregate_seq if h.copies else 0


# ---------------------------------------------------------------------------------------------------------------
# properties: clean histories pass, each injected fault is reported exactly


@given(histories())
def test_clean_history_has_no_findings(h: History) -> None:
    v = h.check()
    assert counts(v) == only()
    assert v.ok
    assert v.examples == {}
    assert (v.attempted, v.acked, v.stored, v.excused) == (h.log.attempted, len(h.log.acked), len(h.copies), 0)


@given(histories(min_acked=1), st.data())
def test_losses_are_counted_exactly(h: History, data: st.DataObject) -> None:
    positions = h.acked_positions()
    dropped = data.draw(st.lists(st.sampled_from(positions), min_size=1, unique=True))
    copies = [c for i, c in enumerate(h.copies) if i not in dropped]
    v = h.check(copies)
    seqs = sorted(h.log.acked[h.copies[i].n] for i in dropped)
    assert counts(v) == only(lost=len(dropped))
    assert v.examples == {"lost": seqs[:5]}
    assert v.stored == len(h.copies) - len(dropped)


@given(histories(min_acked=1), st.data())
def test_duplicates_are_counted_exactly(h: History, data: st.DataObject) -> None:
    # extra copies of any stored attempt (acked or not), some more than once, after the originals
    dups = data.draw(st.lists(st.sampled_from(h.copies), min_size=1, max_size=12))
    at = tail_seq(h)
    copies = h.copies + [StoredCopy(at + i + 1, SOURCE, c.n) for i, c in enumerate(dups)]
    v = h.check(copies)
    assert counts(v) == only(duplicated=len(dups))
    assert v.examples == {"duplicated": list(dict.fromkeys(c.n for c in dups))[:5]}
    assert v.stored == len(h.copies)


@given(histories(min_acked=2), st.data())
def test_a_swap_is_reported_as_reordering(h: History, data: st.DataObject) -> None:
    positions = h.acked_positions()
    i = data.draw(st.integers(0, len(positions) - 2))
    j = data.draw(st.integers(i + 1, len(positions) - 1))
    p, q = positions[i], positions[j]
    copies = list(h.copies)
    copies[p] = StoredCopy(h.copies[p].aggregate_seq, SOURCE, h.copies[q].n)
    copies[q] = StoredCopy(h.copies[q].aggregate_seq, SOURCE, h.copies[p].n)
    # the later message now comes first: every acked copy between the two and the earlier message are late
    seqs = [h.log.acked[h.copies[k].n] for k in positions]
    late = [*seqs[i + 1 : j], seqs[i]]
    v = h.check(copies, samples=[])  # moving a copy later can break a sample: that is another test
    assert counts(v) == only(reordered=j - i)
    assert v.examples == {"reordered": late[:5]}


@given(histories(), st.data())
def test_copies_of_attempts_never_made_are_unexpected(h: History, data: st.DataObject) -> None:
    attempted = h.log.attempted
    bad = data.draw(st.lists(st.integers(-3, 0) | st.integers(attempted + 1, attempted + 50), min_size=1))
    at = tail_seq(h)
    copies = h.copies + [StoredCopy(at + i + 1, SOURCE, n) for i, n in enumerate(bad)]
    v = h.check(copies)
    assert counts(v) == only(unexpected=len(bad))
    assert v.examples == {"unexpected": bad[:5]}
    assert v.stored == len(h.copies)


@given(histories(), st.integers(1, 2000))
def test_a_message_left_in_the_origin_is_stranded(h: History, seq: int) -> None:
    v = h.check(remaining=[seq])
    assert counts(v) == only(stranded=1)
    assert v.examples == {"stranded": [seq]}
    # skipped on purpose by a forward reset: legitimately left behind
    excuse = Excuse(SOURCE, seq - 1, seq + 1, "forward-reset")
    assert counts(h.check(remaining=[seq], excuses=[excuse])) == only()


@given(histories(min_acked=1), st.data())
def test_a_message_deleted_before_it_was_stored_is_reported(h: History, data: st.DataObject) -> None:
    p = data.draw(st.sampled_from(h.acked_positions()))
    copy = h.copies[p]
    seq = h.log.acked[copy.n]
    # the origin had deleted `seq` (first_seq above it) while the aggregate ended just before its copy
    late = DeletionSample(SOURCE, seq + 1, copy.aggregate_seq - 1)
    v = h.check(samples=[*h.samples, late])
    assert counts(v) == only(deleted_before_stored=1)
    assert v.examples == {"deleted_before_stored": [seq]}
    # the nemesis skipped it on purpose: not the bridge's doing
    excuse = Excuse(SOURCE, seq, seq, "consumer-deleted")
    assert counts(h.check(samples=[*h.samples, late], excuses=[excuse])) == only()


@given(histories(min_acked=1), st.data())
def test_late_store_moved_to_the_end_is_deleted_before_stored(h: History, data: st.DataObject) -> None:
    # the copy of the highest acked origin sequence arrives after a sample that saw it gone from the origin
    p = h.acked_positions()[-1]
    copy = h.copies[p]
    seq = h.log.acked[copy.n]
    moved = StoredCopy(tail_seq(h) + 5, SOURCE, copy.n)
    copies = [c for i, c in enumerate(h.copies) if i != p] + [moved]
    sample = DeletionSample(SOURCE, seq + 1, tail_seq(h))
    v = h.check(copies, samples=[*h.samples, sample])
    assert counts(v) == only(deleted_before_stored=1)
    assert v.examples == {"deleted_before_stored": [seq]}


@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 80)), max_size=40),
    st.lists(st.tuples(st.integers(1, 60), st.integers(0, 80)), max_size=20),
)
def test_deleted_before_stored_matches_brute_force(
    stored: list[tuple[int, int]], samples: list[tuple[int, int]]
) -> None:
    # arbitrary (origin seq, aggregate seq) pairs and samples, against the definition applied pair by pair
    log = PublishLog(SOURCE)
    pairs = {}
    for seq, agg in stored:
        n = log.next_attempt()
        log.ack(n, seq, 1)
        pairs[n] = (seq, agg)
    copies = sorted((StoredCopy(agg, SOURCE, n) for n, (_, agg) in pairs.items()), key=lambda c: c.aggregate_seq)
    deletion = [DeletionSample(SOURCE, f, last) for f, last in samples]
    v = check_source(SOURCE, "interest", log, copies, [], deletion, None)
    expected = sorted(seq for seq, agg in pairs.values() if any(seq < f and agg > last for f, last in samples))
    assert v.deleted_before_stored == len(expected)
    assert v.examples.get("deleted_before_stored", []) == expected[:5]


# ---------------------------------------------------------------------------------------------------------------
# excuses and edge cases


def simple_log(acked: int, unacked: int = 0, first_seq: int = 1) -> PublishLog:
    """``acked`` attempts acked at origin sequences ``first_seq``.., then ``unacked`` attempts with no ack."""
    log = PublishLog(SOURCE)
    for i in range(acked):
        log.ack(log.next_attempt(), first_seq + i, 1)
    for _ in range(unacked):
        log.next_attempt()
    return log


def clean_copies(log: PublishLog, skip: Collection[int] = ()) -> list[StoredCopy]:
    """The aggregate a correct bridge leaves for ``log`` (aggregate seq = origin seq), without attempts ``skip``."""
    return [StoredCopy(seq, SOURCE, n) for n, seq in log.acked.items() if n not in skip]


def test_absent_message_inside_a_forward_reset_excuse_is_excused_not_lost() -> None:
    log = simple_log(10)
    copies = clean_copies(log, skip={4, 5, 9})  # origin seqs 4, 5, 9
    excuses = [Excuse(SOURCE, 3, 5, "forward-reset"), Excuse("other", 9, 9, "forward-reset")]
    v = check_source(SOURCE, "workqueue", log, copies, excuses, [], None)
    assert (v.lost, v.excused, v.examples) == (1, 2, {"lost": [9]})
    assert not v.ok


def test_absent_message_inside_a_consumer_deleted_excuse_is_excused() -> None:
    log = simple_log(10)
    copies = clean_copies(log, skip={7})
    v = check_source(SOURCE, "interest", log, copies, [Excuse(SOURCE, 6, 8, "consumer-deleted")], [], None)
    assert (v.lost, v.excused, v.ok) == (0, 1, True)


def test_remaining_message_inside_a_consumer_deleted_excuse_is_still_stranded() -> None:
    # deleting the consumer excuses messages the server dropped, not ones the bridge left in the origin
    log = simple_log(10)
    excuses = [Excuse(SOURCE, 1, 20, "consumer-deleted"), Excuse(SOURCE, 14, 15, "forward-reset")]
    v = check_source(SOURCE, "interest", log, clean_copies(log), excuses, [], [11, 12, 14, 15, 16])
    assert (v.stranded, v.examples) == (3, {"stranded": [11, 12, 16]})


def test_remaining_not_checked_means_nothing_stranded() -> None:
    log = simple_log(3)
    assert check_source(SOURCE, "workqueue", log, [], [], [], None).stranded == 0
    assert check_source(SOURCE, "workqueue", log, [], [], [], []).stranded == 0


def test_overlapping_and_adjacent_excuses_merge() -> None:
    log = simple_log(30)
    excuses = [
        Excuse(SOURCE, 5, 10, "forward-reset"),
        Excuse(SOURCE, 8, 12, "forward-reset"),
        Excuse(SOURCE, 13, 13, "forward-reset"),
        Excuse(SOURCE, 20, 19, "forward-reset"),  # empty
    ]
    v = check_source(SOURCE, "workqueue", log, [], excuses, [], None)
    assert (v.excused, v.lost) == (9, 21)
    assert v.examples["lost"] == [1, 2, 3, 4, 14]


def test_unacked_copies_are_stored_but_not_ordered() -> None:
    # an unacked attempt's origin sequence is unknown, so its position says nothing about order
    log = simple_log(3, unacked=2)  # attempts 4, 5 unacked
    copies = [StoredCopy(1, SOURCE, 5), StoredCopy(2, SOURCE, 1), StoredCopy(3, SOURCE, 4), StoredCopy(4, SOURCE, 2)]
    copies.append(StoredCopy(5, SOURCE, 3))
    v = check_source(SOURCE, "workqueue", log, copies, [], [], None)
    assert (v.stored, v.reordered, v.ok) == (5, 0, True)


def test_a_late_copy_counts_once_and_does_not_lower_the_maximum() -> None:
    log = simple_log(6)
    order = [1, 2, 5, 3, 4, 6]  # 3 and 4 are both below 5: both late
    copies = [StoredCopy(i + 1, SOURCE, n) for i, n in enumerate(order)]
    v = check_source(SOURCE, "workqueue", log, copies, [], [], None)
    assert (v.reordered, v.examples) == (2, {"reordered": [3, 4]})


def test_only_the_first_copy_counts_for_order_and_deletion() -> None:
    log = simple_log(3)
    copies = [StoredCopy(1, SOURCE, 1), StoredCopy(2, SOURCE, 2), StoredCopy(3, SOURCE, 3), StoredCopy(4, SOURCE, 1)]
    samples = [DeletionSample(SOURCE, 2, 1)]  # seq 1 gone from the origin while the aggregate held seq 1's copy
    v = check_source(SOURCE, "workqueue", log, copies, [], samples, None)
    assert counts(v) == only(duplicated=1)


def test_copies_out_of_aggregate_order_are_sorted_first() -> None:
    log = simple_log(4)
    copies = [StoredCopy(3, SOURCE, 3), StoredCopy(1, SOURCE, 1), StoredCopy(4, SOURCE, 4), StoredCopy(2, SOURCE, 2)]
    assert check_source(SOURCE, "workqueue", log, copies, [], [], None).ok


def test_check_run_splits_by_source_and_collects_strays() -> None:
    a, b = simple_log(3), simple_log(2, first_seq=100)
    a.source, b.source = "a", "b"
    copies = [
        StoredCopy(1, "a", 1),
        StoredCopy(2, "b", 1),
        StoredCopy(3, None, 0),
        StoredCopy(4, "a", 2),
        StoredCopy(5, "c", 1),
        StoredCopy(6, "a", 3),
        StoredCopy(7, "a", 9),
    ]
    excuses = [Excuse("b", 101, 101, "forward-reset"), Excuse("a", 5, 5, "forward-reset")]
    samples = [DeletionSample("a", 4, 0)]  # only a's: b's seqs are far above 4
    verdicts = check_run({"a": a, "b": b}, {"a": "workqueue", "b": "interest"}, copies, excuses, samples, {"a": [5, 6]})
    assert [v.source for v in verdicts] == ["a", "b", UNKNOWN_SOURCE]
    va, vb, vu = verdicts
    assert (va.retention, va.stored, va.unexpected, va.deleted_before_stored, va.stranded) == ("workqueue", 3, 1, 3, 1)
    assert va.examples == {"unexpected": [9], "deleted_before_stored": [1, 2, 3], "stranded": [6]}
    assert (vb.retention, vb.stored, vb.excused, vb.ok) == ("interest", 1, 1, True)
    assert (vu.retention, vu.unexpected, vu.examples) == ("-", 2, {"unexpected": [3, 5]})


def test_check_run_without_strays_has_no_unknown_verdict() -> None:
    log = simple_log(2)
    verdicts = check_run({SOURCE: log}, {SOURCE: "workqueue"}, clean_copies(log), [], [], {})
    assert [(v.source, v.ok) for v in verdicts] == [(SOURCE, True)]


def test_a_million_copies_check_quickly() -> None:
    # a performance guard, not a benchmark: the bound is generous on purpose
    rng = random.Random(7)
    log = simple_log(500_000, unacked=500_000)
    copies = [StoredCopy(n, SOURCE, n) for n in range(1, 1_000_001)]
    # consistent samples: when the origin had deleted up to f-1, the aggregate held it (at aggregate seq f-1)
    samples = [DeletionSample(SOURCE, f, f - 1) for f in (rng.randrange(1, 500_001) for _ in range(5_000))]
    remaining = list(range(500_001, 510_001))
    started = time.perf_counter()
    verdicts = check_run({SOURCE: log}, {SOURCE: "workqueue"}, copies, [], samples, {SOURCE: remaining})
    elapsed = time.perf_counter() - started
    (v,) = verdicts
    assert (v.stored, v.acked, v.stranded, v.lost, v.reordered, v.deleted_before_stored) == (
        1_000_000,
        500_000,
        10_000,
        0,
        0,
        0,
    )
    assert elapsed < 20, f"checking 1,000,000 copies took {elapsed:.1f}s"


# ---------------------------------------------------------------------------------------------------------------
# the report


def ok_result() -> ScenarioResult:
    return ScenarioResult(
        name="calm",
        seed=11,
        command="python -m chaos --scenario calm --seed 11",
        verdicts=[
            SourceVerdict("edge1", "workqueue", attempted=100, acked=98, stored=99),
            SourceVerdict("edge2", "limits", attempted=50, acked=50, stored=50),
        ],
        timeline=[FaultEvent(1.0, "leaf-kill", "inject", {"leaf": "edge1"}), FaultEvent(3.0, "leaf-kill", "heal")],
        workload_seconds=30.04,
        wall_seconds=41.26,
    )


def failing_result() -> ScenarioResult:
    return ScenarioResult(
        name="storm",
        seed=4242,
        command="python -m chaos --scenario storm --seed 4242",
        verdicts=[
            SourceVerdict("edge1", "interest", attempted=10, acked=9, stored=7, lost=2, examples={"lost": [3, 8]}),
            SourceVerdict("edge2", "workqueue", attempted=5, acked=5, stored=5),
        ],
        timeline=[
            FaultEvent(12.3451, "leaf-kill", "inject", {"leaf": "edge1"}),
            FaultEvent(20.5, "partition", "inject"),
            FaultEvent(25.0, "partition", "heal"),
        ],
        problems=["bridge did not converge within 60 s"],
        workload_seconds=60.0,
        wall_seconds=75.0,
    )


def test_table_of_a_passing_run() -> None:
    text = format_table([ok_result()])
    lines = text.splitlines()
    header = lines[0].split()
    assert header == [
        "scenario",
        "source",
        "retention",
        "faults",
        "attempted",
        "acked",
        "stored",
        "lost",
        "dup",
        "reord",
        "unexp",
        "excused",
        "del<store",
        "stranded",
        "verdict",
    ]
    assert lines[2].split() == ["calm", "edge1", "workqueue", "1", "100", "98", "99", *["0"] * 7, "OK"]
    assert lines[3].split() == ["calm", "edge2", "limits", "50", "50", "50", *["0"] * 7, "OK"]  # faults: first row
    assert next(line for line in lines if line.startswith("TOTAL")).split() == [
        "TOTAL",
        "1",
        "150",
        "148",
        "149",
        *["0"] * 7,
        "OK",
    ]
    assert lines[-1] == "OVERALL: OK (1 scenarios, 148 messages acked, 1 faults)"
    assert "replay" not in text
    assert len({len(line) for line in lines[:2]}) == 1  # the header and its rule line up


def test_table_of_a_failing_run_names_seed_command_and_timeline() -> None:
    text = format_table([ok_result(), failing_result()])
    assert "FAIL storm (seed 4242)" in text
    assert "  problem: bridge did not converge within 60 s" in text
    assert "  edge1 (interest): lost 2 (origin seqs 3 8)" in text
    assert "edge2 (workqueue)" not in text  # a passing source of a failing scenario has no findings to show
    assert "  seed: 4242" in text
    assert "  replay: python -m chaos --scenario storm --seed 4242" in text
    assert '    +12.345s inject leaf-kill {"leaf": "edge1"}' in text
    assert "    +20.500s inject partition\n" in text
    assert "    +25.000s heal partition\n" in text
    assert "FAIL calm" not in text
    assert text.splitlines()[-1] == "OVERALL: FAIL (1 of 2 scenarios failed, 162 messages acked, 3 faults)"
    rows = [line.split() for line in text.splitlines() if line.startswith("storm")]
    assert [row[-1] for row in rows] == ["FAIL", "FAIL"]  # a harness problem fails every row of the scenario


def test_scenario_without_verdicts_still_gets_a_row() -> None:
    broken = ScenarioResult(name="dead", seed=1, command="replay", problems=["bridge exited 3"])
    text = format_table([broken])
    assert next(line for line in text.splitlines() if line.startswith("dead")).split()[-1] == "FAIL"
    assert "  problem: bridge exited 3" in text
    assert "  timeline: (no faults)" in text


def test_no_scenarios_is_not_a_pass() -> None:
    assert format_table([]).splitlines()[-1] == "OVERALL: FAIL (no scenarios ran)"
    assert summary([], command="c", seed=0)["ok"] is False


def test_summary_totals_and_fault_kinds() -> None:
    data = summary([ok_result(), failing_result()], command="python -m chaos --seed 9", seed=9)
    assert (data["command"], data["seed"], data["ok"]) == ("python -m chaos --seed 9", 9, False)
    assert data["totals"] == {
        "scenarios": 2,
        "faults": 3,
        "attempted": 165,
        "acked": 162,
        "stored": 161,
        "lost": 2,
        "duplicated": 0,
        "reordered": 0,
        "unexpected": 0,
        "excused": 0,
        "deleted_before_stored": 0,
        "stranded": 0,
        "workload_seconds": 90.0,
        "wall_seconds": 116.3,
    }
    assert data["fault_kinds"] == ["leaf-kill", "partition"]
    assert [s["name"] for s in data["scenarios"]] == ["calm", "storm"]
    assert data["scenarios"][1]["ok"] is False
    json.dumps(data)  # JSON-ready


def test_write_report(tmp_path: Path) -> None:
    results = [ok_result(), failing_result()]
    path = write_report(tmp_path / "runs" / "1", results, command="python -m chaos", seed=5)
    assert path == tmp_path / "runs" / "1" / "report.json"
    assert json.loads(path.read_text(encoding="utf-8")) == summary(results, command="python -m chaos", seed=5)
    assert (path.parent / "report.txt").read_text(encoding="utf-8") == format_table(results)


@settings(max_examples=25)
@given(histories(min_acked=1))
def test_report_of_checked_history_is_consistent(h: History) -> None:
    verdicts = check_run({SOURCE: h.log}, {SOURCE: "workqueue"}, h.copies, [], h.samples, {})
    result = ScenarioResult(name="prop", seed=1, command="c", verdicts=verdicts)
    assert format_table([result]).splitlines()[-1].startswith("OVERALL: OK (1 scenarios")
    assert summary([result], command="c", seed=1)["totals"]["acked"] == len(h.log.acked)


def _audited(distinct: int, skipped: int, not_delivered: int = 0) -> dict[str, object]:
    return {
        "distinct": distinct,
        "lost": 0,
        "duplicates": 0,
        "reordered": 0,
        "skipped": skipped,
        "not_delivered": not_delivered,
        "chain_start": 0,
    }


def test_audit_agreement_allows_unacked_attempts_inside_a_skipped_range_and_nothing_else() -> None:
    from chaos.audit import agreement

    # 9 attempts lost their publish ack; the origin stored them inside a range a forward reset skipped: the
    # audit counts their sequences as skipped, the checker (which knows only acked sequences) cannot
    verdict = SourceVerdict("interest", "interest", attempted=1000, acked=991, stored=600, excused=391)
    result = ScenarioResult("nemesis", 1, "cmd", verdicts=[verdict])
    assert agreement(result, {"interest": _audited(600, 391)}) == []
    assert agreement(result, {"interest": _audited(600, 391 + 9)}) == []
    assert agreement(result, {"interest": _audited(600, 390, not_delivered=10)}) == []
    (beyond,) = agreement(result, {"interest": _audited(600, 391 + 10)})
    assert "excused: checker 391, audit 401" in beyond
    (fewer,) = agreement(result, {"interest": _audited(600, 390)})
    assert "excused: checker 391, audit 390" in fewer
    # with every attempt acked the counts must be equal
    exact = ScenarioResult("n", 1, "c", verdicts=[SourceVerdict("s", "workqueue", attempted=5, acked=5, excused=2)])
    assert len(agreement(exact, {"s": _audited(0, 3)})) == 1
    (stored,) = agreement(result, {"interest": _audited(599, 391)})
    assert "stored: checker 600, audit 599" in stored
