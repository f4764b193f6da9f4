"""``bridge.core.transforms`` against a real nats-server's own sourcing: the subjects a stream that sources ORIGIN
with ``subject_transforms`` stores, and the transform configs the server refuses.

One server, one ORIGIN (subjects ``in.>``) holding a table of subjects, and one stream (MAIN) sourcing it with
many transforms at once: the subjects MAIN stores, in order, must be what
``SubjectTransforms(MAIN_TRANSFORMS).apply`` gives for the table (``None``: not sourced at all).

Versions: 2.15.1 (the project's server) accepts ``{{left(..)}}`` and ``{{right(..)}}`` in a stream source, 2.14.0
refuses them as unknown functions (its ``ValidateMapping`` does not list them, though ``indexPlaceHolders`` knows
them). The Python side follows the newest: on an older server the LEFT_RIGHT stream is expected refused, with that
error, and its subjects are compared on 2.15 and later only. Everything else holds on both.
"""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client

from bridge.core.transforms import SubjectTransforms, TransformError
from bridge.testing.jetstream import ApiFailure, connect, create_stream, js_request, read_stream, stream_messages
from bridge.testing.polling import wait_until
from bridge.testing.servers import ServerFactory, server_version

pytestmark = pytest.mark.anyio

Pairs = list[tuple[str, str]]

SOURCE_INVALID_SUBJECT = 10145  # JSSourceInvalidSubjectFilter: src is not a valid subject
SOURCE_INVALID_TRANSFORM = 10146  # JSSourceInvalidTransformDestination: ValidateMapping refused the pair
SOURCE_OVERLAPPING = 10147  # JSSourceOverlappingSubjectFilters: one src is a subset of another

# Every src differs from the others in its second token (no overlap) unless it is there to show what overlaps
# the server still accepts (coll, qk).
MAIN_TRANSFORMS: Pairs = [
    ("in.wild.*.*", "w.$2.{{wildcard(1)}}.{{ Wildcard ( 2 ) }}.$0.$-1.{{wildcard( +1 )}}.$x"),
    (
        "in.part.*.*",
        "p.{{partition(7,1,2)}}.{{partition(7, 2)}}.{{partition(5)}}.{{Partition(0,1)}}.{{partition(-1,1)}}"
        ".{{partition(2147483647)}}.{{partition(-9223372036854775807)}}.{{partition(10,0)}}",
    ),
    ("in.lit", "lit.{{partition(3)}}.{{partition(3,7)}}.{{random(1)}}.{{random(0)}}.{{random(-1)}}"),
    ("in.sfl.*", "sfl.{{splitFromLeft(1,3)}}"),
    ("in.sfr.*", "sfr.{{SplitFromRight(1,3)}}"),
    ("in.sll.*", "sll.{{sliceFromLeft(1,3)}}"),
    ("in.slr.*", "slr.{{slicefromright(1,3)}}"),
    ("in.neg.*", "neg.{{sliceFromLeft(1,-2)}}.{{splitFromRight(1,0)}}.{{sliceFromRight(1,1)}}"),
    ("in.split.*", "sp.{{split(1,-)}}.end"),
    ("in.explode.*", "ex.{{split(1,)}}"),
    ("in.splitab.*", "sab.{{ split(1, ab) }}"),
    ("in.trick.*", "t.{{random(1)}}{{left(1,2)}}"),  # a left, reached through random's pattern: 2.14 too
    ("in.rnd.*", "rnd.{{random(3)}}.$1"),
    ("in.fwc.>", "f.>"),
    ("in.fwcw.*.>", "fw.$1.x.>"),
    ("in.strip.>", ">"),
    ("in.keep.*", ""),
    # these two overlap (in.coll.a.b) but neither is a subset of the other: the server takes them, and skips the
    # filter-only one when it looks for a transform
    ("in.coll.a.*", ""),
    ("in.coll.*.b", "cb.$1"),
    # the server's subset test reads a src token starting with '*' as a wildcard ('*xyz' matches 'a')
    ("in.qk.*xyz.>", "qx.>"),
    ("in.qk.*.b", "qb.$1"),
    ("in.uni.*", "u.{{sliceFromLeft(1,2)}}.{{splitFromRight(1,1)}}"),
    ("in.zero.*", "z.{{splitFromLeft(0,1)}}.{{partition(4,0,1)}}"),
]

LEFT_RIGHT_TRANSFORMS: Pairs = [
    ("in.left.*", "l.{{left(1,3)}}.{{Left(1,0)}}.{{ left ( 1 , 99 ) }}"),
    ("in.right.*", "r.{{right(1,3)}}.{{Right(1,-1)}}"),
]

SUBJECTS = [
    "in.wild.a.b",
    "in.wild.a",
    "in.wild.a.b.c",
    "in.wild.*.x",  # stored as published (a client may publish a wildcard): no transform matches it
    "in.part.k1.k2",
    "in.part.x.y",
    "in.part.\u00e9t\u00e9.\u00fc",
    "in.lit",
    "in.lit.x",
    "in.sfl.abcdef",
    "in.sfl.abcd",
    "in.sfl.abc",
    "in.sfl.ab",
    "in.sfr.abcdef",
    "in.sfr.abc",
    "in.sfr.a",
    "in.sll.abcdefg",
    "in.sll.abcdefgh",
    "in.sll.abcdef",
    "in.sll.abc",
    "in.sll.ab",
    "in.slr.abcdefg",
    "in.slr.abcdefgh",
    "in.slr.abcdef",
    "in.slr.abcd",
    "in.slr.abc",
    "in.neg.abcdef",
    "in.neg.a",
    "in.split.a-b",
    "in.split.-a",
    "in.split.a-",
    "in.split.a--b",
    "in.split.--a",
    "in.split.-",
    "in.split.---",
    "in.split.-a-b-c-",
    "in.split.nodash",
    "in.explode.abc",
    "in.explode.a",
    "in.explode.h\u00e9",
    "in.splitab.xabyabz",
    "in.splitab.ab",
    "in.splitab.ababab1",
    "in.trick.abcdef",
    "in.trick.a",
    *[f"in.rnd.r{i}" for i in range(6)],
    "in.fwc.a",
    "in.fwc.a.b.c",
    "in.fwc.>",
    "in.fwcw.x.y",
    "in.fwcw.x.y.z",
    "in.fwcw.x",
    "in.strip.a",
    "in.strip.a.b",
    "in.keep.x",
    "in.keep.*",
    "in.coll.a.b",
    "in.coll.a.c",
    "in.coll.x.b",
    "in.coll.x.c",
    "in.qk.a.b",
    "in.qk.abc.b",
    "in.qk.a.c",
    "in.qk.*xyz.q",
    "in.uni.h\u00e9llo",
    "in.uni.\u65e5\u672c",
    "in.zero.abc",
    "in.other.x",
    "in.left.abcdef",
    "in.left.ab",
    "in.left.h\u00e9llo",
    "in.right.abcdef",
    "in.right.a",
]

# Refused by both: the server's error code for each (the first bad part decides, as in checkStreamCfg's order)
REFUSED: list[tuple[Pairs, int]] = [
    ([("in..x", "y")], SOURCE_INVALID_SUBJECT),
    ([("in .x", "y")], SOURCE_INVALID_SUBJECT),
    ([("in.\tx", "")], SOURCE_INVALID_SUBJECT),
    ([("in.>.x", "y")], SOURCE_INVALID_SUBJECT),
    ([("in.*", "out..$1")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "out.>.$1")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "out.a b")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "out. ")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "out.a\rb")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "out.*")], SOURCE_INVALID_TRANSFORM),
    ([("in.>", "out")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "out.>")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "out.$2")], SOURCE_INVALID_TRANSFORM),
    ([("in", "out.$1")], SOURCE_INVALID_TRANSFORM),
    ([("in", "out.$0")], SOURCE_INVALID_TRANSFORM),
    ([("in", "out.{{splitFromLeft(1,2)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.>", "out.$1.>")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{foo(1)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{LEFT(1,2)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{x}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{wildcard()}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{wildcard(1,2)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{wildcard(x)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{wildcard(\t1)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{wildcard(1_0)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{wildcard(99999999999999999999)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{partition()}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{partition(3,x)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{partition(2147483648)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{partition(3,2)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{random(2147483648)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{random(1,2)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{random()}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{split(1)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{split(1,-,x)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{split(1,- )}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{splitFromLeft(1)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{splitFromLeft(1,2,3)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{splitFromLeft(1,2147483648)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{sliceFromRight(x,1)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{splitFromLeft(2,1)}}")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "{{left(1,2)}}{{random(1)}}")], SOURCE_INVALID_TRANSFORM),  # left's pattern takes it all
    ([("in.*", "{{left(1)}}")], SOURCE_INVALID_TRANSFORM),  # not enough arguments (2.14: unknown function)
    ([("in.*", "{{wildcard(1)}} ")], SOURCE_INVALID_TRANSFORM),
    ([("in.*", "$1 ")], SOURCE_INVALID_TRANSFORM),
    ([("in.a", "x"), ("in.b", "out.*")], SOURCE_INVALID_TRANSFORM),  # the second pair is the bad one
    ([("in.a", "x"), ("in.*", "y")], SOURCE_OVERLAPPING),
    ([("in.>", "x.>"), ("in.a.b", "y")], SOURCE_OVERLAPPING),
    ([("in.a", "x"), ("in.a", "y")], SOURCE_OVERLAPPING),
    ([("in.a", ""), ("in.*", "")], SOURCE_OVERLAPPING),
    ([(">", ""), ("in.a", "")], SOURCE_OVERLAPPING),
    ([("in.q.a", "x"), ("in.q.*abc", "y")], SOURCE_OVERLAPPING),  # '*abc' read as a wildcard
]

# Accepted by both
ACCEPTED: list[Pairs] = [
    [("in.*", "out.$0")],
    [("in.*", "out.$-1")],
    [("in.*", "out.$x")],
    [("in.*", "out.$99999999999999999999")],  # not a number to Atoi: a literal token
    [("in.*", "out.{{wildcard(00000000000000000000000001)}}")],
    [("in", "out.{{partition(3,1)}}")],  # a src without wildcards drops partition's list
    [("in", "out.{{random(4)}}")],
    [("in.>", "out.$0.>")],
    [("in.*", "{{wildcard( 1 )}}")],
    [("in.*", "{{ wildcard (1) }}")],
    [("in.*", "{{partition(-1)}}")],
    [("in.*", "{{partition(-9223372036854775808)}}")],
    [("in.*", "{{split(1,)}}")],
    [("in.*", "{{split(1,\t)}}")],  # the tab goes with the comma: an empty delimiter
    [("in.*", "{{sliceFromRight(1,-2)}}")],
    [("in.*", "{{slicefromright(1,2)}}")],
    [("in.*", "{{random(1)}}{{left(1,2)}}")],
    [("in.*", "{{}}x")],
    [("in.*", "{{split(1,")],  # not a function call: a literal token
    [("in.*", "a\vb")],  # \v is not whitespace to the server
    [("in.*", "a\u00a0b")],
    [("in.a.*", "x"), ("in.*.b", "y")],  # overlapping, yet neither a subset of the other
    [("in.q.*xyz.>", "qx.>"), ("in.q.*.b", "qb.$1")],
    [("", "")],
    [("", "out.>")],  # accepted, and then sources nothing: test_an_empty_src_sources_nothing_on_the_server
    [(">", ">")],
    [("in.*", "")],
]

# Accepted by 2.15.1 (and the Python side), refused by 2.14 as unknown functions
LEFT_RIGHT_ACCEPTED: list[Pairs] = [
    [("in.*", "{{left(1,2)}}")],
    [("in.*", "{{right(1,2)}}")],
    [("in.*", "{{ Left (1, 2) }}")],
    [("in.*", "x.{{right(1,2)}}.$1")],
]


def _source(pairs: Pairs) -> dict[str, Any]:
    return {"name": "ORIGIN", "subject_transforms": [{"src": src, "dest": dest} for src, dest in pairs]}


def _newest(nats_server_bin: str) -> bool:
    """Whether the server takes left and right in a stream source (2.15 and later)."""
    major, minor = (int(part) for part in server_version(nats_server_bin).split(".")[:2])
    return (major, minor) >= (2, 15)


def _as_stored(subject: str) -> str:
    """A subject as nats-py reads it back: bytes the server cut inside a character come back as U+FFFD."""
    return subject.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


async def _create_sourcing(nc: Client, name: str, pairs: Pairs) -> None:
    await create_stream(nc, name, [], allow_direct=True, sources=[_source(pairs)])


async def _stored_subjects(nc: Client, name: str, count: int) -> list[str]:
    """The subjects of ``name``, once it holds ``count`` messages (or more: the comparison then says what)."""

    async def enough() -> bool:
        return await stream_messages(nc, name) >= count

    await wait_until(enough, timeout=10, what=f"{count} messages sourced into {name}")
    return [msg.subject for msg in await read_stream(nc, name)]


def _sourced(pairs: Pairs) -> list[tuple[str, str]]:
    """(subject, what ``apply`` gives) for each subject of the table the source copies, in order."""
    transforms = SubjectTransforms(pairs)
    results = [(subject, transforms.apply(subject)) for subject in SUBJECTS]
    return [(subject, result) for subject, result in results if result is not None]


def _compare(expected: list[tuple[str, str]], stored: list[str]) -> None:
    assert len(stored) == len(expected), (stored, expected)
    for (subject, want), got in zip(expected, stored, strict=True):
        if want.startswith("rnd."):
            # random: the same shape, and both draws in range
            assert got.split(".")[0::2] == want.split(".")[0::2], (subject, got, want)
            assert got.split(".")[1] in {"0", "1", "2"} and want.split(".")[1] in {"0", "1", "2"}, (subject, got)
        else:
            assert got == _as_stored(want), f"{subject!r}: server stored {got!r}, apply gives {want!r}"


async def test_sourced_subjects_are_what_apply_gives(servers: ServerFactory, nats_server_bin: str) -> None:
    newest = _newest(nats_server_bin)
    server = servers("transforms", "")
    async with connect(server.url) as nc:
        await create_stream(nc, "ORIGIN", ["in.>"])
        js = nc.jetstream(timeout=5)
        for subject in SUBJECTS:
            await js.publish(subject, b"")
        # an empty src: the server takes the config, but its source consumer refuses the empty filter
        await _create_sourcing(nc, "EMPTY", [("", "e.>")])
        await _create_sourcing(nc, "MAIN", MAIN_TRANSFORMS)
        if newest:
            await _create_sourcing(nc, "LEFT_RIGHT", LEFT_RIGHT_TRANSFORMS)
        else:
            with pytest.raises(ApiFailure, match="unknown function") as refused:
                await _create_sourcing(nc, "LEFT_RIGHT", LEFT_RIGHT_TRANSFORMS)
            assert refused.value.err_code == SOURCE_INVALID_TRANSFORM

        main = _sourced(MAIN_TRANSFORMS)
        _compare(main, await _stored_subjects(nc, "MAIN", len(main)))
        if newest:
            left_right = _sourced(LEFT_RIGHT_TRANSFORMS)
            _compare(left_right, await _stored_subjects(nc, "LEFT_RIGHT", len(left_right)))
        # EMPTY was created before MAIN and sources the same ORIGIN: a working source would hold copies by now
        info = await js_request(nc, "STREAM.INFO.EMPTY")
        assert info["state"]["messages"] == 0 and info["sources"][0]["active"] == -1, info
    # while the Python side reads the empty src as '>' (NewSubjectTransform does): everything, prefixed
    assert SubjectTransforms([("", "e.>")]).apply("in.lit") == "e.in.lit"


async def test_what_python_refuses_the_server_refuses(servers: ServerFactory, nats_server_bin: str) -> None:
    newest = _newest(nats_server_bin)
    server = servers("transforms", "")
    async with connect(server.url) as nc:
        await create_stream(nc, "ORIGIN", ["in", "in.>"])
        for n, (pairs, err_code) in enumerate(REFUSED):
            with pytest.raises(TransformError) as python:
                SubjectTransforms(pairs)
            assert "\n" not in str(python.value)
            with pytest.raises(ApiFailure) as server_error:
                await _create_sourcing(nc, f"R{n}", pairs)
            assert server_error.value.err_code == err_code, (pairs, server_error.value.error, str(python.value))

        for n, pairs in enumerate(ACCEPTED + LEFT_RIGHT_ACCEPTED):
            SubjectTransforms(pairs)
            if pairs in LEFT_RIGHT_ACCEPTED and not newest:
                with pytest.raises(ApiFailure, match="unknown function"):
                    await _create_sourcing(nc, f"A{n}", pairs)
                continue
            await _create_sourcing(nc, f"A{n}", pairs)
            await js_request(nc, f"STREAM.DELETE.A{n}")

        # Refused by the Python side only: an empty list (the server reads it as no transforms at all, a plain
        # source) and an empty src beside another (the server takes it, then sources nothing; Python reads '' as
        # '>', which overlaps every other src)
        for n, pairs in enumerate([[], [("", "x.>"), ("in.a", "y")]]):
            with pytest.raises(TransformError):
                SubjectTransforms(pairs)
            await _create_sourcing(nc, f"P{n}", pairs)
