"""``bridge.core.transforms``: nats-server's subject transforms of a stream source, function by function, with the
server's own test vectors (server/subject_transform_test.go), its quirks, and every refusal of checkStreamCfg.

What the server really stores is checked in tests/integration/test_transforms_server.py; here the byte-level
functions are also compared, by hypothesis, with line-by-line transcriptions of the Go loops.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.transforms import SubjectTransform, SubjectTransforms, TransformError

# --- reference transcriptions of the Go code (server/subject_transform.go), on bytes as Go works ------------


def fnv1a32(data: bytes) -> int:
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) % (1 << 32)
    return h


def go_slice_from_left(token: bytes, size: int) -> bytes:
    out = b""
    if 0 < size < len(token):
        i = 0
        while i + size <= len(token):
            if i != 0:
                out += b"."
            out += token[i : i + size]
            if i + size != len(token) and i + size + size > len(token):
                out += b"." + token[i + size :]
                break
            i += size
    else:
        out += token
    return out


def go_slice_from_right(token: bytes, size: int) -> bytes:
    out = b""
    if 0 < size < len(token):
        remainder = len(token) % size
        if remainder > 0:
            out += token[:remainder] + b"."
        i = remainder
        while i + size <= len(token):
            out += token[i : i + size]
            if i + size < len(token):
                out += b"."
            i += size
    else:
        out += token
    return out


def go_split(token: bytes, delimiter: bytes) -> bytes:
    splits = token.split(delimiter)
    out = b""
    for j, piece in enumerate(splits):
        if piece != b"":
            out += piece
        if j < len(splits) - 1 and splits[j + 1] != b"" and not (j == 0 and piece == b""):
            out += b"."
    return out


def go_split_from(token: bytes, position: int, from_right: bool) -> bytes:
    if 0 < position < len(token):
        cut = len(token) - position if from_right else position
        return token[:cut] + b"." + token[cut:]
    return token


def raw(subject: str) -> bytes:
    """The server's bytes of a result (cuts inside a character are surrogate-escaped)."""
    return subject.encode("utf-8", "surrogateescape")


def apply(src: str, dest: str, subject: str) -> str:
    return SubjectTransform(src, dest).apply(subject)


# tokens a published subject may hold: anything but '.', not empty, not a bare wildcard
tokens = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="."), min_size=1, max_size=12).filter(
    lambda t: t not in ("*", ">")
)
ascii_tokens = st.text(alphabet="abcdefghij0123456789-_", min_size=1, max_size=12)
delimiters = st.text(alphabet="ab-_|\u00e9", min_size=1, max_size=3)


# --- the server's own vectors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dest", "subject", "expected"),
    [
        ("", "prefix.>", "foo", "prefix.foo"),
        ("foo", "", "foo", "foo"),
        ("foo", "bar", "foo", "bar"),
        ("foo.*.bar.*.baz", "req.$2.$1", "foo.A.bar.B.baz", "req.B.A"),
        ("foo.*.bar.*.baz", "req.{{wildcard(2)}}.{{wildcard(1)}}", "foo.A.bar.B.baz", "req.B.A"),
        ("baz.>", "my.pre.>", "baz.1.2.3", "my.pre.1.2.3"),
        ("baz.>", "foo.bar.>", "baz.1.2.3", "foo.bar.1.2.3"),
        ("*", "foo.bar.$1", "foo", "foo.bar.foo"),
        ("*", "{{splitfromleft(1,3)}}", "12345", "123.45"),
        ("*", "{{SplitFromRight(1,3)}}", "12345", "12.345"),
        ("*", "{{SliceFromLeft(1,3)}}", "1234567890", "123.456.789.0"),
        ("*", "{{SliceFromRight(1,3)}}", "1234567890", "1.234.567.890"),
        ("*", "{{split(1,-)}}", "-abc-def--ghi-", "abc.def.ghi"),
        ("*", "{{split(1,-)}}", "abc-def--ghi-", "abc.def.ghi"),
        ("*.*", "{{split(2,-)}}.{{splitfromleft(1,2)}}", "foo.-abc-def--ghij-", "abc.def.ghij.fo.o"),
        ("*", "{{right(1,1)}}", "1234", "4"),
        ("*", "{{right(1,3)}}", "1234", "234"),
        ("*", "{{right(1,6)}}", "1234", "1234"),
        ("*", "{{left(1,1)}}", "1234", "1"),
        ("*", "{{left(1,3)}}", "1234", "123"),
        ("*", "{{left(1,6)}}", "1234", "1234"),
        ("*", "bar.{{partition(0)}}", "baz", "bar.0"),
        ("*", "bar.{{partition(10, 0)}}", "foo", "bar.3"),
        ("*.*", "bar.{{partition(10)}}", "foo.bar", "bar.6"),
        ("*", "bar.{{partition(10)}}", "foo", "bar.3"),
        ("*", "bar.{{partition(10)}}", "baz", "bar.0"),
        ("*", "bar.{{partition(10)}}", "qux", "bar.9"),
        ("*", "bar.{{random(0)}}", "qux", "bar.0"),
        ("foo.bar", "baz.{{partition(10)}}", "foo.bar", "baz.6"),
        ("foo.baz", "qux.{{partition(10)}}", "foo.baz", "qux.4"),
        ("test.subject", "result.{{partition(5)}}", "test.subject", "result.0"),
    ],
)
def test_the_servers_own_vectors(src: str, dest: str, subject: str, expected: str) -> None:
    assert apply(src, dest, subject) == expected


def test_random_is_in_range_and_varies() -> None:
    transform = SubjectTransform("*", "bar.{{random(6)}}")
    seen = {transform.apply("qux") for _ in range(300)}
    assert seen <= {f"bar.{i}" for i in range(6)} and len(seen) > 1


# --- wildcards ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dest", "expected"),
    [
        ("x.$1.$2", "x.A.B"),
        ("x.$2.$1.$2", "x.B.A.B"),  # reused, reordered, not all used
        ("x.{{wildcard(1)}}", "x.A"),
        ("x.{{ Wildcard ( 2 ) }}", "x.B"),
        ("x.{{wildcard( +1 )}}", "x.A"),  # Atoi takes a sign, Trim the spaces
        ("x.$+2", "x.B"),
        ("x.$02", "x.B"),
        ("x.$0", "x.in"),  # a number the server's map does not hold: the first token
        ("x.$-1", "x.in"),
        ("x.{{wildcard(0)}}", "x.in"),
        ("x.$x", "x.$x"),  # not a number: a literal
        ("x.$", "x.$"),
        ("x.$1x", "x.$1x"),
        ("x.$99999999999999999999", "x.$99999999999999999999"),  # beyond int64: not a number either
        ("x.$" + "9" * 5000, "x.$" + "9" * 5000),
        ("x.$00000000000000000000000002", "x.B"),  # leading zeros are no digits too many
        ("x.{{wildcard(-00000000000000000000000001)}}", "x.in"),
        ("x.{{}}x.{{split(1,", "x.{{}}x.{{split(1,"),  # not function calls: literals
    ],
)
def test_wildcard_references(dest: str, expected: str) -> None:
    assert apply("in.*.mid.*", dest, "in.A.mid.B") == expected


@pytest.mark.parametrize(
    ("src", "dest", "subject", "expected"),
    [
        ("in.>", "out.>", "in.a", "out.a"),
        ("in.>", "out.>", "in.a.b.c", "out.a.b.c"),
        ("in.>", ">", "in.a.b", "a.b"),  # only the tail
        ("in.*.>", "$1.x.>", "in.a.b.c", "a.x.b.c"),
        ("in.*.>", "{{splitFromLeft(1,1)}}.>", "in.ab.c", "a.b.c"),
        ("in.>", "out.$0.>", "in.a.b", "out.in.a.b"),
        (">", "all.>", "a.b", "all.a.b"),
        ("", "all.>", "a", "all.a"),
        (">", ">", "a.b", "a.b"),
    ],
)
def test_a_full_wildcard_carries_the_remaining_tokens(src: str, dest: str, subject: str, expected: str) -> None:
    assert apply(src, dest, subject) == expected


def test_a_full_wildcard_needs_at_least_one_token() -> None:
    transform = SubjectTransform("in.>", "out.>")
    assert not transform.matches("in")
    assert SubjectTransforms([("in.>", "out.>")]).apply("in") is None


@given(
    shape=st.lists(st.sampled_from(["lit", "*"]), min_size=1, max_size=6),
    fwc=st.booleans(),
    values=st.lists(tokens, min_size=8, max_size=8),
    use_function=st.booleans(),
)
def test_naming_every_wildcard_in_place_is_the_identity(
    shape: list[str], fwc: bool, values: list[str], use_function: bool
) -> None:
    src_tokens = [f"t{i}" if kind == "lit" else "*" for i, kind in enumerate(shape)]
    dest_tokens: list[str] = []
    number = 0
    for token in src_tokens:
        if token == "*":
            number += 1
            dest_tokens.append(f"{{{{wildcard({number})}}}}" if use_function else f"${number}")
        else:
            dest_tokens.append(token)
    if fwc:
        src_tokens.append(">")
        dest_tokens.append(">")
    subject_tokens = [values[i] if token == "*" else token for i, token in enumerate(src_tokens[: len(shape)])]
    if fwc:
        subject_tokens += values[len(shape) :]
    subject = ".".join(subject_tokens)
    transform = SubjectTransform(".".join(src_tokens), ".".join(dest_tokens))
    assert transform.matches(subject)
    assert transform.apply(subject) == subject
    assert SubjectTransforms([(transform.src, transform.dest)]).apply(subject) == subject


# --- partition and random --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", 0x811C9DC5), (b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)],  # FNV's published test vectors
)
def test_fnv1a_reference(data: bytes, expected: int) -> None:
    assert fnv1a32(data) == expected


@pytest.mark.parametrize(
    ("dest", "key"),
    [
        ("{{partition(7,1,2)}}", b"k1k2"),  # listed tokens concatenated, no separator
        ("{{partition(7, 2, 1)}}", b"k2k1"),
        ("{{partition(7)}}", b"in.k1.k2"),  # the whole subject, with its dots
        ("{{partition(7,0)}}", b"in"),  # wildcard number 0: the first token
        ("{{Partition(7,1,1)}}", b"k1k1"),
    ],
)
def test_partition_hashes_the_named_tokens(dest: str, key: bytes) -> None:
    assert apply("in.*.*", dest, "in.k1.k2") == str(fnv1a32(key) % 7)


def test_partition_of_a_literal_src_hashes_the_whole_subject_whatever_its_list() -> None:
    assert apply("in.lit", "{{partition(9,1,5)}}", "in.lit") == str(fnv1a32(b"in.lit") % 9)


@pytest.mark.parametrize(
    ("count", "modulus"),
    [
        (-1, (1 << 32) - 1),  # uint32(-1)
        (-7, (1 << 32) - 7),
        (-2147483649, 2147483647),  # int32() wraps it first
        (2147483647, 2147483647),
    ],
)
def test_partition_counts_the_server_lets_through_wrap_as_in_go(count: int, modulus: int) -> None:
    assert apply("*", f"{{{{partition({count})}}}}", "abc") == str(fnv1a32(b"abc") % modulus)


@pytest.mark.parametrize("count", [0, -4294967296, -9223372036854775808])  # all int32(0)
def test_partition_of_zero_is_zero(count: int) -> None:
    assert apply("*", f"{{{{partition({count})}}}}", "abc") == "0"


def test_partition_hashes_utf8_bytes() -> None:
    assert apply("*", "{{partition(1000)}}", "\u00e9") == str(fnv1a32("\u00e9".encode()) % 1000)


@given(count=st.integers(1, 2**31 - 1), a=tokens, b=tokens, listed=st.booleans())
def test_partition_is_always_in_range(count: int, a: str, b: str, listed: bool) -> None:
    dest = f"p.{{{{partition({count},2,1)}}}}" if listed else f"p.{{{{partition({count})}}}}"
    result = apply("x.*.*", dest, f"x.{a}.{b}")
    assert result.startswith("p.")
    assert 0 <= int(result[2:]) < count
    key = (b + a).encode() if listed else f"x.{a}.{b}".encode()
    assert int(result[2:]) == fnv1a32(key) % count


@pytest.mark.parametrize("dest", ["{{random(1)}}", "{{random(0)}}", "{{random(-1)}}", "{{ Random ( 1 ) }}"])
def test_random_of_one_zero_or_minus_one_is_zero(dest: str) -> None:
    assert apply("in", dest, "in") == "0"


@given(ceiling=st.integers(-(2**31), 2**31 - 1).filter(lambda n: n != 0))
def test_random_is_below_the_ceilings_size(ceiling: int) -> None:
    assert 0 <= int(apply("*", f"{{{{random({ceiling})}}}}", "a")) < abs(ceiling)


# --- split and slice ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("a-b", "a.b"),
        ("-a", "a"),
        ("a-", "a"),
        ("a--b", "a.b"),
        ("--a", ".a"),  # the server leaves a '.' of its own after two leading delimiters
        ("---a", ".a"),
        ("-", ""),  # an empty token in the result: the server stores 'x..y'
        ("---", ""),
        ("-a-b-c-", "a.b.c"),
        ("a-b--", "a.b"),
        ("nodash", "nodash"),
    ],
)
def test_split_separator_rules(token: str, expected: str) -> None:
    assert apply("in.*", "{{split(1,-)}}", f"in.{token}") == expected
    assert apply("in.*", "x.{{split(1,-)}}.y", f"in.{token}") == f"x.{expected}.y"


@pytest.mark.parametrize(
    ("dest", "token", "expected"),
    [
        ("{{split(1,ab)}}", "xabyabz", "x.y.z"),
        ("{{split(1,ab)}}", "ab", ""),
        ("{{split(1,ab)}}", "ababab1", ".1"),
        ("{{ split ( 1 ,ab) }}", "xaby", "x.y"),  # Trim'd off the number (a space after 'ab' would be refused)
        ("{{split(1,)}}", "abc", "a.b.c"),  # an empty delimiter: between every character
        ("{{split(1,\t)}}", "abc", "a.b.c"),  # the tab goes with the comma
        ("{{split(1,)}}", "h\u00e9", "h.\u00e9"),  # characters, not bytes
        ("{{split(1,x\t)}}", "ax\tb", "a.b"),  # only a space is refused in a delimiter
        ("{{split(1,a)b)}}", "1a)b2", "1.2"),  # the pattern takes everything up to the last ')'
    ],
)
def test_split_delimiters(dest: str, token: str, expected: str) -> None:
    assert apply("*", dest, token) == expected


@pytest.mark.parametrize(
    ("function", "token", "expected"),
    [
        ("sliceFromLeft(1,3)", "abcdefg", "abc.def.g"),
        ("sliceFromLeft(1,3)", "abcdefgh", "abc.def.gh"),
        ("sliceFromLeft(1,3)", "abcdef", "abc.def"),
        ("sliceFromLeft(1,3)", "abc", "abc"),  # not longer than a slice: whole
        ("sliceFromLeft(1,3)", "ab", "ab"),
        ("sliceFromRight(1,3)", "abcdefg", "a.bcd.efg"),
        ("sliceFromRight(1,3)", "abcdefgh", "ab.cde.fgh"),
        ("sliceFromRight(1,3)", "abcdef", "abc.def"),
        ("sliceFromRight(1,3)", "abcd", "a.bcd"),
        ("sliceFromRight(1,3)", "abc", "abc"),
        ("sliceFromLeft(1,1)", "abc", "a.b.c"),
        ("sliceFromLeft(1,0)", "abc", "abc"),
        ("sliceFromRight(1,-2)", "abc", "abc"),
        ("splitFromLeft(1,3)", "abcdef", "abc.def"),
        ("splitFromLeft(1,3)", "abcd", "abc.d"),
        ("splitFromLeft(1,3)", "abc", "abc"),  # at the end: no split
        ("splitFromLeft(1,0)", "abc", "abc"),
        ("splitFromRight(1,3)", "abcdef", "abc.def"),
        ("splitFromRight(1,1)", "abcdef", "abcde.f"),
        ("splitFromRight(1,3)", "abc", "abc"),
        ("splitFromRight(1,-1)", "abc", "abc"),
        ("left(1,2)", "abc", "ab"),
        ("left(1,3)", "abc", "abc"),
        ("left(1,0)", "abc", "abc"),  # a length the server does not cut at: whole
        ("left(1,-1)", "abc", "abc"),
        ("right(1,2)", "abc", "bc"),
        ("right(1,9)", "abc", "abc"),
        ("Left(1,1)", "abc", "a"),
    ],
)
def test_slices_splits_left_right(function: str, token: str, expected: str) -> None:
    assert apply("in.*", f"{{{{{function}}}}}", f"in.{token}") == expected


@pytest.mark.parametrize(
    ("function", "token", "expected"),
    [
        # bytes h, c3 a9 (é), l, l, o: the server cuts between c3 and a9
        ("sliceFromLeft(1,2)", "h\u00e9llo", b"h\xc3.\xa9l.lo"),
        ("splitFromRight(1,1)", "h\u00e9llo", "h\u00e9ll.o".encode()),
        ("left(1,2)", "h\u00e9llo", b"h\xc3"),
        ("right(1,4)", "h\u00e9llo", b"\xa9llo"),
        ("right(1,5)", "h\u00e9llo", "\u00e9llo".encode()),
        ("sliceFromRight(1,2)", "\u65e5\u672c", b"\xe6\x97.\xa5\xe6.\x9c\xac"),
        ("split(1,\u00e9)", "a\u00e9b", b"a.b"),
    ],
)
def test_non_ascii_tokens_are_cut_in_their_utf8_bytes(function: str, token: str, expected: bytes) -> None:
    assert raw(apply("*", f"{{{{{function}}}}}", token)) == expected


@given(token=st.one_of(ascii_tokens, tokens), size=st.integers(-2, 14), right=st.booleans())
def test_slices_are_the_servers_loops(token: str, size: int, right: bool) -> None:
    name = "sliceFromRight" if right else "sliceFromLeft"
    reference = go_slice_from_right if right else go_slice_from_left
    assert raw(apply("*", f"{{{{{name}(1,{size})}}}}", token)) == reference(token.encode(), size)


@given(token=st.one_of(ascii_tokens, tokens), position=st.integers(-2, 14), right=st.booleans())
def test_split_from_is_the_servers(token: str, position: int, right: bool) -> None:
    name = "splitFromRight" if right else "splitFromLeft"
    assert raw(apply("*", f"{{{{{name}(1,{position})}}}}", token)) == go_split_from(token.encode(), position, right)


@given(
    pieces=st.lists(st.one_of(st.just(""), ascii_tokens, tokens), min_size=1, max_size=6),
    delimiter=delimiters,
)
def test_split_is_the_servers_loop(pieces: list[str], delimiter: str) -> None:
    token = delimiter.join(pieces)
    if token in ("", "*", ">"):
        return
    expected = go_split(token.encode(), delimiter.encode())
    assert raw(apply("*", f"{{{{split(1,{delimiter})}}}}", token)) == expected


def test_one_dest_token_combines_the_outputs_in_order() -> None:
    transform = SubjectTransform(
        "a.*.*", "{{splitFromLeft(2,1)}}.$1.{{sliceFromRight(1,2)}}.{{split(2,-)}}.{{partition(3,1,2)}}.end"
    )
    assert transform.apply("a.xyz.p-q") == f"p.-q.xyz.x.yz.p.q.{fnv1a32(b'xyzp-q') % 3}.end"


def test_the_first_pattern_that_finds_a_function_anywhere_in_the_token_decides() -> None:
    # ValidateMapping lets it through for random's pattern; indexPlaceHolders then finds left's first
    assert apply("in.*", "{{random(1)}}{{left(1,2)}}", "in.abcdef") == "ab"
    with pytest.raises(TransformError, match="length"):
        SubjectTransform("in.*", "{{left(1,2)}}{{random(1)}}")  # left's argument list runs to the last ')'


# --- matching ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "subject", "matches"),
    [
        ("in.*", "in.a", True),
        ("in.*", "in", False),
        ("in.*", "in.a.b", False),
        ("in.>", "in.a.b", True),
        ("in.>", "in", False),
        ("in.*.b", "in.a.b", True),
        ("in.*.b", "in.a.c", False),
        ("in.lit", "in.lit", True),
        ("in.lit", "in.lot", False),
        ("in.*", "in.*", False),  # not a literal subject
        ("in.*", "in.>", False),
        ("in.>", "in..a", False),
        ("in.*xyz", "in.a", True),  # the server's subset test: a src token starting with '*' matches any
        ("", "a.b", True),
    ],
)
def test_matches(src: str, subject: str, matches: bool) -> None:
    assert SubjectTransform(src, "x.>" if src in ("", ">") or src.endswith(".>") else "x").matches(subject) is matches


def test_a_full_wildcard_to_itself_takes_any_subject_as_is() -> None:
    for dest in (">", ""):
        transform = SubjectTransform(">", dest)
        assert transform.matches("a..b") and transform.apply("a..b") == "a..b"


def test_apply_refuses_a_subject_its_src_does_not_match() -> None:
    with pytest.raises(ValueError, match=re.escape("'in.x.y' does not match src 'in.*'")):
        SubjectTransform("in.*", "out.$1").apply("in.x.y")


def test_a_transform_without_dest_only_filters() -> None:
    transform = SubjectTransform("in.*", "")
    assert transform.dest == "" and transform.apply("in.x") == "in.x"
    transforms = SubjectTransforms([("in.*", ""), ("other.>", "o.>")])
    assert transforms.filters == ("in.*", "other.>")
    assert transforms.apply("in.x") == "in.x"
    assert transforms.apply("other.a.b") == "o.a.b"
    assert transforms.apply("else.x") is None


def test_an_empty_src_is_the_full_wildcard() -> None:
    transform = SubjectTransform("", "")
    assert transform.src == ">" and transform.dest == ""
    transforms = SubjectTransforms([("", "e.>")])
    assert transforms.filters == (">",) and transforms.apply("a.b") == "e.a.b"


# --- a source's list -----------------------------------------------------------------------------------------


def test_the_first_matching_transform_wins() -> None:
    # these two overlap (in.a.b) without either being a subset of the other: the server takes both, in order
    assert SubjectTransforms([("in.a.*", "A.$1"), ("in.*.b", "B.$1")]).apply("in.a.b") == "A.b"
    assert SubjectTransforms([("in.*.b", "B.$1"), ("in.a.*", "A.$1")]).apply("in.a.b") == "B.a"


def test_a_filter_only_transform_is_skipped_when_looking_for_a_transform() -> None:
    transforms = SubjectTransforms([("in.a.*", ""), ("in.*.b", "B.$1")])
    assert transforms.apply("in.a.b") == "B.a"  # delivered by both, transformed by the second
    assert transforms.apply("in.a.c") == "in.a.c"
    assert transforms.apply("in.x.c") is None


def test_the_subset_quirk_picks_a_transform_for_a_subject_its_filter_would_not_deliver() -> None:
    transforms = SubjectTransforms([("in.q.*xyz.>", "qx.>"), ("in.q.*.b", "qb.$1")])
    assert transforms.apply("in.q.a.b") == "qx.b"  # delivered for the second src, matched by the first
    assert transforms.apply("in.q.a.c") is None  # '*xyz' is literal to the consumer's filter
    assert transforms.apply("in.q.*xyz.c") == "qx.c"


def test_a_subject_with_wildcards_is_copied_unchanged() -> None:
    transforms = SubjectTransforms([("in.*.*", "x.$2.$1"), ("in.f.>", "f.>")])
    assert transforms.apply("in.*.a") == "in.*.a"
    assert transforms.apply("in.f.>") == "in.f.>"
    assert transforms.apply("in.a.b") == "x.b.a"


@given(subject=st.lists(st.sampled_from(["in", "a", "b", "c"]), min_size=1, max_size=4).map(".".join))
def test_apply_is_none_exactly_when_no_src_matches(subject: str) -> None:
    transforms = SubjectTransforms([("in.a.*", "A.$1"), ("in.b", ""), ("in.c.>", "C.>")])
    matched = [t for t in transforms.transforms if t.matches(subject)]
    result = transforms.apply(subject)
    assert (result is None) == (not matched)
    if matched:
        assert result == matched[0].apply(subject)


def test_the_list_keeps_its_order_and_filters() -> None:
    transforms = SubjectTransforms(pair for pair in [("b.*", "B.$1"), ("a", "")])
    assert [(t.src, t.dest) for t in transforms.transforms] == [("b.*", "B.$1"), ("a", "")]
    assert transforms.filters == ("b.*", "a")


# --- refusals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dest", "fragments"),
    [
        ("in..x", "y", ["src 'in..x'", "token 2 is empty"]),
        ("in .x", "y", ["src 'in .x'", "'in '", "whitespace"]),
        ("in.\tx", "", ["src 'in.\\tx'", "whitespace"]),
        ("in.>.x", "y", ["src 'in.>.x'", "'>' must be its last token"]),
        ("in.*", "out..$1", ["dest 'out..$1'", "token 2 is empty"]),
        ("in.*", "out.>.$1", ["dest 'out.>.$1'", "'>' must be its last token"]),
        ("in.*", "out.a b", ["dest 'out.a b'", "'a b'", "whitespace"]),
        ("in.*", "out.*", ["dest 'out.*'", "'*' cannot be written in a dest", "$1 or {{wildcard(1)}}"]),
        ("in.>", "out", ["dest 'out' must end in '>'", "src 'in.>'"]),
        ("in.*", "out.>", ["dest 'out.>' ends in '>'", "src 'in.*' does not"]),
        (
            "orders.*",
            "foo.{{wildcard(3)}}",
            ["dest 'foo.{{wildcard(3)}}': wildcard index 3 is out of range: src 'orders.*' has 1 wildcard"],
        ),
        ("a.*.*", "$3", ["wildcard index 3 is out of range: src 'a.*.*' has 2 wildcards", "1 to 2"]),
        ("in.>", "out.$1.>", ["wildcard index 1", "src 'in.>' has no '*'"]),
        ("in", "out.$1", ["'$1' refers to a wildcard of src 'in', which has none", "{{partition(n)}}"]),
        ("in", "out.$0", ["'$0'", "has none"]),
        ("in", "{{split(1,-)}}", ["'{{split(1,-)}}'", "has none"]),
        ("in.*", "{{foo(1)}}", ["'{{foo(1)}}' is not a known function", "{{wildcard(i)}}", "{{left(i, length)}}"]),
        ("in.*", "{{LEFT(1,2)}}", ["'{{LEFT(1,2)}}' is not a known function"]),
        ("in.*", "{{wildcard()}}", ["'{{wildcard()}}' has no argument", "{{wildcard(i)}}"]),
        ("in.*", "{{wildcard(1,2)}}", ["has 2 arguments, wildcard takes one"]),
        ("in.*", "{{wildcard(x)}}", ["has 'x' for a wildcard number"]),
        ("in.*", "{{wildcard(\t1)}}", ["has '\\t1' for a wildcard number"]),
        ("in.*", "{{wildcard(1_0)}}", ["has '1_0'"]),
        ("in.*", "{{wildcard(99999999999999999999)}}", ["'99999999999999999999'"]),
        ("in.*", "{{partition()}}", ["has '' for its number of partitions"]),
        ("in.*", "{{partition(3,x)}}", ["has 'x' for a wildcard number", "{{partition(n, i, ...)}}"]),
        ("in.*", "{{partition(2147483648)}}", ["'2147483648'", "at most 2147483647"]),
        ("in.*", "{{partition(3,2)}}", ["wildcard index 2 is out of range"]),
        ("in.*", "{{random(2147483648)}}", ["'2147483648'", "at most 2147483647"]),
        ("in.*", "{{random(1,2)}}", ["has 2 arguments, random takes one"]),
        ("in.*", "{{random()}}", ["has '' for its n"]),
        ("in.*", "{{split(1)}}", ["has 1 argument, split takes two"]),
        ("in.*", "{{split(1,-,x)}}", ["has 3 arguments, split takes two"]),
        ("in.*", "{{split(1,- )}}", ["delimiter '- '", "space"]),
        ("in.*", "{{splitFromLeft(1)}}", ["has 1 argument, splitFromLeft takes two", "{{splitFromLeft(i, position)}}"]),
        ("in.*", "{{sliceFromLeft(1,2,3)}}", ["has 3 arguments, sliceFromLeft takes two"]),
        ("in.*", "{{sliceFromRight(x,1)}}", ["has 'x' for a wildcard number"]),
        ("in.*", "{{splitFromRight(1,2147483648)}}", ["'2147483648' for its position", "-2147483648 to 2147483647"]),
        ("in.*", "{{left(1)}}", ["has 1 argument, left takes two"]),
        ("in.*", "{{right(1,x)}}", ["has 'x' for its length"]),
        ("in.*", "{{left(2,1)}}", ["wildcard index 2 is out of range"]),
        ("in.*", "{{wildcard(1)}} ", ["whitespace"]),
        ("in.*", "$1 ", ["whitespace"]),
    ],
)
def test_refusals_name_the_bad_part(src: str, dest: str, fragments: list[str]) -> None:
    with pytest.raises(TransformError) as refused:
        SubjectTransform(src, dest)
    message = str(refused.value)
    assert "\n" not in message and "Traceback" not in message
    for fragment in fragments:
        assert fragment in message, message
    # the same through a list
    with pytest.raises(TransformError, match=None) as in_list:
        SubjectTransforms([("ok.x", "y"), (src, dest)])
    assert str(in_list.value) == message


@pytest.mark.parametrize(
    ("src", "dest"),
    [
        ("in.*", "{{left(1,2)}}"),  # 2.15.1 lists left and right in ValidateMapping (2.14 does not)
        ("in.*", "{{ Right ( 1 , 2 ) }}"),
        ("in.*", "{{wildcard( 1 )}}"),
        ("in.*", "{{partition(-1)}}"),
        ("in.*", "{{split(1,)}}"),
        ("in.*", "{{sliceFromRight(1,-2)}}"),
        ("in.*", "{{}}x"),
        ("in.*", "a\vb"),  # not whitespace to the server
        ("in.*", "a\u00a0b"),
        ("in", "x.{{partition(3,7)}}.{{random(2)}}"),
        ("in.*", ""),
        ("", ""),
        (">", ">"),
    ],
)
def test_accepted(src: str, dest: str) -> None:
    transform = SubjectTransform(src, dest)
    assert (transform.src, transform.dest) == (src or ">", dest)


@pytest.mark.parametrize(
    ("pairs", "fragments"),
    [
        ([("in.a", "x"), ("in.*", "y")], ["src 'in.a' overlaps src 'in.*'"]),
        ([("in.>", "x.>"), ("in.a.b", "y")], ["src 'in.a.b' overlaps src 'in.>'"]),
        ([("in.a", "x"), ("in.a", "y")], ["src 'in.a' overlaps src 'in.a'"]),
        ([("in.a", ""), ("in.*", "")], ["'in.a'", "'in.*'"]),
        ([("", "x.>"), ("in.a", "y")], ["src 'in.a' overlaps src '>'"]),
        ([("in.q.a", "x"), ("in.q.*abc", "y")], ["src 'in.q.a' overlaps src 'in.q.*abc'"]),
    ],
)
def test_overlapping_srcs_are_refused(pairs: list[tuple[str, str]], fragments: list[str]) -> None:
    with pytest.raises(TransformError) as refused:
        SubjectTransforms(pairs)
    message = str(refused.value)
    assert "\n" not in message and "must not overlap" in message
    for fragment in fragments:
        assert fragment in message, message


def test_overlap_means_one_src_within_the_other() -> None:
    SubjectTransforms([("in.a.*", "x"), ("in.*.b", "y")])  # they share in.a.b, yet neither holds the other
    SubjectTransforms([("in.*", "x"), ("in.*.*", "y")])


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(TransformError, match="at least one"):
        SubjectTransforms([])


def test_transform_error_is_a_value_error() -> None:
    assert issubclass(TransformError, ValueError)


def test_results_are_the_same_at_every_call() -> None:
    transforms = SubjectTransforms([("in.*", "out.{{partition(1000,1)}}.$1")])
    subjects = [f"in.k{i}" for i in range(9000)]
    first = [transforms.apply(s) for s in subjects]
    assert first == [transforms.apply(s) for s in subjects]
    assert first[0] == f"out.{fnv1a32(b'k0') % 1000}.k0"
    assert transforms.apply("other") is None and transforms.apply("other") is None


def test_random_results_are_drawn_every_time() -> None:
    transforms = SubjectTransforms([("in.*", "out.{{random(1000000)}}")])
    assert len({transforms.apply("in.x") for _ in range(20)}) > 1


@pytest.mark.parametrize(
    ("pairs", "patterns"),
    [
        ([("in.*", "out.$1")], ["out.*"]),
        ([("in.*.*", "out.{{partition(4,1,2)}}.{{left(1,2)}}.{{random(3)}}")], ["out.*.*.*"]),
        ([("in.*", "out.{{split(1,-)}}.x")], ["out.>"]),  # split may give several tokens
        ([("in.*.>", "out.{{sliceFromLeft(1,2)}}.>")], ["out.>"]),
        ([("in.>", "out.>")], ["out.>"]),
        ([("in.a", ""), ("in.b.*", "b.$1")], ["in.a", "b.*"]),
        ([("in.a.*", "x.$1"), ("in.b.*", "x.$1")], ["x.*"]),
    ],
)
def test_copies_is_a_pattern_every_result_matches(pairs: list[tuple[str, str]], patterns: list[str]) -> None:
    transforms = SubjectTransforms(pairs)
    assert transforms.copies() == patterns
    for subject in ("in.a", "in.b.q-r", "in.q.r", "in.ab-cd.x.y", "in.a.b"):
        result = transforms.apply(subject)
        if result is not None:
            assert any(SubjectTransform(p, "").matches(result) for p in patterns), (subject, result)
