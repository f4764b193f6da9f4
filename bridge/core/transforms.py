"""Subject transforms of a stream source (``subject_transforms: [{src, dest}]``), as nats-server applies them.

A port of nats-server's ``server/subject_transform.go`` (``NewSubjectTransformWithStrict`` with strict off,
``indexPlaceHolders``, ``Match``, ``TransformTokenizedSubject``) and of the checks ``checkStreamCfg`` in
``server/stream.go`` makes on a source's transforms: each non-empty ``src`` a valid subject (``IsValidSubject``),
``ValidateMapping(src, dest)`` (``server/sublist.go``), and no ``src`` a subset of another
(``subjectIsSubsetMatch`` either way). Sourcing (``processInboundSourceMsg``) asks the source consumer for every
subject some ``src`` matches, then tries the transforms in order and takes the first whose ``Match`` succeeds; a
transform with an empty ``dest`` is no transform at all there (only a filter), and a subject no transform matches
is stored unchanged.

Destination tokens: literals, ``$n`` / ``{{wildcard(n)}}`` (the n-th ``*`` of ``src``; ``$0`` and negative numbers
name the subject's first token, as the server's map lookup does), ``{{partition(n[, i, ...])}}`` (FNV-1a 32 of the
listed wildcard tokens concatenated, or of the whole subject, modulo n), ``{{splitFromLeft(i, pos)}}``,
``{{splitFromRight(i, pos)}}``, ``{{sliceFromLeft(i, size)}}``, ``{{sliceFromRight(i, size)}}``,
``{{split(i, delim)}}``, ``{{left(i, len)}}``, ``{{right(i, len)}}``, ``{{random(n)}}``; a trailing ``>`` carries
the subject's tokens from the position of ``src``'s ``>`` on. Function names, case and whitespace are read with the
server's own patterns, quirks included (``{{random(1)}}{{left(1,2)}}`` is a ``left``: the first pattern that finds
a match anywhere in the token decides).

Versions: this follows nats-server 2.15.1, whose ``ValidateMapping`` accepts ``left`` and ``right`` in a stream
source. 2.14 refuses them as unknown functions, though it can apply them, and so does the source this port was read
from (main at 2.15.0-dev): 2.15.1's list was established against its binary. Everything else is the same from
2.14.0 to 2.15.1 (tests/integration/test_transforms_server.py runs both).

The server slices tokens by bytes: a token that is not ASCII is cut in its UTF-8 bytes, and a cut inside a
character gives what the server stores, bytes that are not UTF-8, carried here as ``surrogateescape`` characters
(``result.encode("utf-8", "surrogateescape")`` is the server's subject).

An empty ``src`` is read as ``>``, as ``NewSubjectTransform`` does; the server also accepts it in a stream config,
but its source consumer then refuses the empty filter and the source copies nothing. Here it is ``>`` everywhere,
the overlap check included, so :attr:`SubjectTransforms.filters` is always a consumer's valid ``filter_subjects``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from typing import Final

__all__ = ["SubjectTransform", "SubjectTransforms", "TransformError"]


class TransformError(ValueError):
    """A transform the server would refuse: str(exc) is one line naming the bad part and what to write instead."""


# --- the server's function patterns (construction only: apply never runs a regex) ---------------------------

# Go's \s is ASCII [\t\n\f\r ] (RE2), Python's is any Unicode space: spelled out so both read the same tokens.
_S: Final = "[\t\n\f\r ]*"


def _function_pattern(name: str) -> re.Pattern[str]:
    return re.compile(r"\{\{" + _S + name + _S + r"\((.*)\)" + _S + r"\}\}")


_PARTITION_RE: Final = _function_pattern("[pP]artition")
_WILDCARD_RE: Final = _function_pattern("[wW]ildcard")
_SPLIT_FROM_LEFT_RE: Final = _function_pattern("[sS]plit[fF]rom[lL]eft")
_SPLIT_FROM_RIGHT_RE: Final = _function_pattern("[sS]plit[fF]rom[rR]ight")
_SLICE_FROM_LEFT_RE: Final = _function_pattern("[sS]lice[fF]rom[lL]eft")
_SLICE_FROM_RIGHT_RE: Final = _function_pattern("[sS]lice[fF]rom[rR]ight")
_SPLIT_RE: Final = _function_pattern("[sS]plit")
_LEFT_RE: Final = _function_pattern("[lL]eft")
_RIGHT_RE: Final = _function_pattern("[rR]ight")
_RANDOM_RE: Final = _function_pattern("[rR]andom")
_COMMA_RE: Final = re.compile(",[\t\n\f\r ]*")

# ValidateMapping's list: a {{...}} token none of these finds a match in is an unknown function (2.15.1's list;
# 2.14's lacks left and right).
_KNOWN_FUNCTIONS: Final = (
    _PARTITION_RE,
    _WILDCARD_RE,
    _SPLIT_FROM_LEFT_RE,
    _SPLIT_FROM_RIGHT_RE,
    _SLICE_FROM_LEFT_RE,
    _SLICE_FROM_RIGHT_RE,
    _SPLIT_RE,
    _LEFT_RE,
    _RIGHT_RE,
    _RANDOM_RE,
)

_FUNCTION_NAMES: Final = (
    "{{wildcard(i)}} (or $i), {{partition(n)}}, {{partition(n, i, ...)}}, {{splitFromLeft(i, position)}}, "
    "{{splitFromRight(i, position)}}, {{sliceFromLeft(i, size)}}, {{sliceFromRight(i, size)}}, "
    "{{split(i, delimiter)}}, {{left(i, length)}}, {{right(i, length)}}, {{random(n)}}"
)

# --- destination token kinds (indexPlaceHolders' transform types) -------------------------------------------

_LITERAL: Final = 0
_WILDCARD: Final = 1
_PARTITION: Final = 2
_SPLIT_FROM_LEFT: Final = 3
_SPLIT_FROM_RIGHT: Final = 4
_SLICE_FROM_LEFT: Final = 5
_SLICE_FROM_RIGHT: Final = 6
_SPLIT: Final = 7
_LEFT: Final = 8
_RIGHT: Final = 9
_RANDOM: Final = 10

# functions taking (wildcard index, int32) in the order indexPlaceHolders tries them: right before left
_INDEX_INT_FUNCTIONS: Final = (
    (_SPLIT_FROM_LEFT_RE, _SPLIT_FROM_LEFT, "splitFromLeft", "position"),
    (_SPLIT_FROM_RIGHT_RE, _SPLIT_FROM_RIGHT, "splitFromRight", "position"),
    (_SLICE_FROM_LEFT_RE, _SLICE_FROM_LEFT, "sliceFromLeft", "size"),
    (_SLICE_FROM_RIGHT_RE, _SLICE_FROM_RIGHT, "sliceFromRight", "size"),
    (_RIGHT_RE, _RIGHT, "right", "length"),
    (_LEFT_RE, _LEFT, "left", "length"),
)

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_INT32_MIN: Final = -(1 << 31)
_INT32_MAX: Final = (1 << 31) - 1
_WHITESPACE: Final = frozenset("\t\n\f\r ")  # isValidSubject's, and ValidateMapping's, whitespace
_FNV_OFFSET: Final = 0x811C9DC5
_FNV_PRIME: Final = 0x01000193


def _q(text: str) -> str:
    """``text`` quoted for an error message on one line (control characters escaped)."""
    return repr(text)


def _atoi(text: str, low: int = _INT64_MIN, high: int = _INT64_MAX) -> int | None:
    """Go's ``strconv.Atoi`` (``ParseInt(text, 10, 32)`` with the int32 bounds): an optional sign and ASCII digits
    only (no spaces, no underscores, unlike ``int()``), None when it is not one or out of range."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    if len(digits.lstrip("0")) > 19:
        return None  # beyond int64 whatever its digits, and int() refuses very long numbers with an error of its own
    value = int(text)
    return value if low <= value <= high else None


def _int32(value: int) -> int:
    """Go's ``int32(value)``: the server truncates partition and random counts it only checked against MaxInt32."""
    return ((value + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _function_args(pattern: re.Pattern[str], token: str) -> list[str] | None:
    """getMappingFunctionArgs: the arguments of the leftmost match of ``pattern`` in ``token``, split at commas
    (and the whitespace after them), or None when it matches nowhere."""
    found = pattern.search(token)
    if found is None:
        return None
    return _COMMA_RE.split(found.group(1))


def _valid_subject(subject: str) -> str:
    """IsValidSubject, with the reason ("" when valid): non-empty tokens, no whitespace, nothing after ``>``."""
    if subject == "":
        return "it is empty"
    fwc = False
    for n, token in enumerate(subject.split("."), 1):
        if fwc:
            return "'>' must be its last token"
        if token == "":
            return f"token {n} is empty"
        if any(c in _WHITESPACE for c in token):
            return f"token {_q(token)} holds whitespace (a space, tab or line break)"
        if token == ">":
            fwc = True
    return ""


# --- the server's subset test (sublist.go) ------------------------------------------------------------------


def _subset_match(tokens: list[str], test: list[str]) -> bool:
    """isSubsetMatchTokenized: whether every subject ``tokens`` matches (it may hold wildcards) is matched by
    ``test``. Ported as is, quirk included: a token of ``test`` that merely starts with ``*`` (``*abc``) matches
    any token, as the server compares first bytes; Match and the overlap check both rely on it."""
    for i, t2 in enumerate(test):
        if i >= len(tokens):
            return False
        if t2 == "":
            return False
        if t2 == ">":
            return True
        t1 = tokens[i]
        if t1 == "" or t1 == ">":
            return False
        if t1 == "*":
            if t2 != "*":
                return False
            continue
        if t2[0] != "*" and t1 != t2:
            return False
    return len(tokens) == len(test)


def _filter_match(tokens: list[str], filter_tokens: list[str]) -> bool:
    """Whether the source consumer delivers a stored subject for one filter (the store's matching: ``*`` is one
    token, ``>`` one or more, anything else compared whole)."""
    count = len(tokens)
    for i in range(len(filter_tokens)):
        ft = filter_tokens[i]
        if ft == ">":
            return count > i
        if i >= count:
            return False
        if ft != "*" and ft != tokens[i]:
            return False
    return count == len(filter_tokens)


# --- applying one destination token -------------------------------------------------------------------------


def _fnv1a32(data: bytes) -> int:
    """FNV-1a, 32 bits (Go's ``hash/fnv`` New32a)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def _partition(key: str, buckets: int) -> str:
    if buckets == 0:
        return "0"
    # uint32(numBuckets): a negative count the server let through divides by its two's complement
    return str(_fnv1a32(key.encode("utf-8", "surrogateescape")) % (buckets & 0xFFFFFFFF))


def _random(ceiling: int) -> str:
    if ceiling == 0:
        return "0"
    # rand.Int31() % ceiling: Go's remainder takes the dividend's sign, which is never negative
    return str(random.getrandbits(31) % abs(ceiling))


def _bytes_view(token: str) -> str:
    """``token``'s UTF-8 bytes as one character each, for the server's byte offsets (an ASCII token is its own)."""
    if token.isascii():
        return token
    return token.encode("utf-8", "surrogateescape").decode("latin-1")


def _from_bytes_view(view: str, token: str) -> str:
    if token.isascii():
        return view
    return view.encode("latin-1").decode("utf-8", "surrogateescape")


def _split_at(token: str, position: int, from_right: bool) -> str:
    view = _bytes_view(token)
    size = len(view)
    if position <= 0 or position >= size:
        return token  # too short to split there: the server leaves it whole
    cut = size - position if from_right else position
    return _from_bytes_view(view[:cut] + "." + view[cut:], token)


def _slice(token: str, size: int, from_right: bool) -> str:
    view = _bytes_view(token)
    length = len(view)
    if size <= 0 or size >= length:
        return token  # too short to slice: the server leaves it whole
    # the uneven piece goes last from the left, first from the right (the server's two loops amount to this)
    start = length % size if from_right else 0
    pieces = [view[:start]] if start else []
    for i in range(start, length, size):
        pieces.append(view[i : i + size])
    return _from_bytes_view(".".join(pieces), token)


def _split(token: str, delimiter: str) -> str:
    if delimiter == "":
        # strings.Split(s, "") cuts between characters (an invalid byte is one character, as here)
        pieces = list(token)
    elif token.isascii():
        pieces = token.split(delimiter)
    else:
        view = _bytes_view(token)
        pieces = [_from_bytes_view(p, token) for p in view.split(_bytes_view(delimiter))]
    # The server's separator rule, kept as written: empty pieces vanish, yet a run of delimiters after the first
    # piece can leave a '.' of its own (split of '--a' by '-' is '.a', of '-' is '').
    out: list[str] = []
    last = len(pieces) - 1
    for j, piece in enumerate(pieces):
        if piece != "":
            out.append(piece)
        if j < last and pieces[j + 1] != "" and not (j == 0 and piece == ""):
            out.append(".")
    return "".join(out)


def _left(token: str, size: int, from_right: bool) -> str:
    view = _bytes_view(token)
    length = len(view)
    if size <= 0 or size >= length:
        return token
    return _from_bytes_view(view[length - size :] if from_right else view[:size], token)


# --- one transform ------------------------------------------------------------------------------------------


class SubjectTransform:
    """One ``{src, dest}`` of a stream source, validated as the server validates it (:class:`TransformError`).

    ``src`` is ``>`` when given empty; an empty ``dest`` makes a filter only (the subject stays as it is).
    """

    __slots__ = (
        "_dest_fwc",
        "_filter_only",
        "_identity",
        "_indexes",
        "_ints",
        "_kinds",
        "_literals",
        "_src_tokens",
        "_strings",
        "_tail",
        "dest",
        "src",
    )

    src: str
    dest: str

    def __init__(self, src: str, dest: str) -> None:
        if src != "":
            why = _valid_subject(src)
            if why:
                raise TransformError(f"src {_q(src)} is not a valid subject: {why}")
        self.src = src if src != "" else ">"
        self.dest = dest
        self._src_tokens = self.src.split(".")
        self._kinds: list[int] = []
        self._literals: list[str] = []
        self._indexes: list[list[int]] = []
        self._ints: list[int] = []
        self._strings: list[str] = []
        self._filter_only = dest == ""
        # Match's shortcut: '>' to '>' (or to nothing) hands back any subject, without looking at it
        self._identity = self.src == ">" and dest in ("", ">")
        self._dest_fwc = False
        self._tail = len(self._src_tokens) - 1
        if not self._filter_only:
            _check_dest_tokens(dest)
            self._build()

    def __repr__(self) -> str:
        return f"SubjectTransform({self.src!r}, {self.dest!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubjectTransform) and (self.src, self.dest) == (other.src, other.dest)

    def __hash__(self) -> int:
        return hash((self.src, self.dest))

    def _build(self) -> None:
        """NewSubjectTransformWithStrict (strict off) from here on: the subjects' shapes, then each dest token."""
        src, dest = self.src, self.dest
        dest_tokens = dest.split(".")
        wildcards = [i for i, token in enumerate(self._src_tokens) if token == "*"]
        src_fwc = self._src_tokens[-1] == ">"
        dest_fwc = dest_tokens[-1] == ">"
        if any(token == "" for token in dest_tokens):  # ValidateMapping refuses it first: kept as the server has it
            raise TransformError(f"dest {_q(dest)} is not a valid subject: it has an empty token")
        if "*" in dest_tokens:
            raise TransformError(
                f"dest {_q(dest)}: '*' cannot be written in a dest: name src's wildcards by number instead, "
                "$1 or {{wildcard(1)}} for the first"
            )
        if src_fwc and not dest_fwc:
            raise TransformError(
                f"dest {_q(dest)} must end in '>' as src {_q(src)} does (it carries the subject's remaining tokens)"
            )
        if dest_fwc and not src_fwc:
            raise TransformError(
                f"dest {_q(dest)} ends in '>' but src {_q(src)} does not: end src in '>' too, or drop it from dest"
            )
        self._dest_fwc = dest_fwc
        has_wildcards = bool(wildcards) or src_fwc
        for token in dest_tokens[:-1] if dest_fwc else dest_tokens:
            kind, indexes, int_arg, str_arg = _index_placeholders(token, dest)
            positions: list[int] = []
            if kind == _LITERAL:
                pass
            elif not has_wildcards:
                # a src without wildcards allows only partition (of the whole subject: its list is dropped) and
                # random
                if kind != _PARTITION and kind != _RANDOM:
                    raise TransformError(
                        f"dest {_q(dest)}: {_q(token)} refers to a wildcard of src {_q(src)}, which has none: add "
                        "a '*' token to src, or use only literal tokens, {{partition(n)}} and {{random(n)}}"
                    )
            elif kind != _RANDOM:
                for index in indexes:
                    if index > len(wildcards):
                        raise TransformError(_out_of_range(dest, token, index, src, len(wildcards)))
                    # the server's map from wildcard number to token position answers 0 for a number it does not
                    # hold ($0, $-1): the subject's first token
                    positions.append(wildcards[index - 1] if index >= 1 else 0)
            self._kinds.append(kind)
            self._literals.append(token)
            self._indexes.append(positions)
            self._ints.append(int_arg)
            self._strings.append(str_arg)

    def matches(self, subject: str) -> bool:
        """The server's ``Match`` test: ``subject`` is a valid literal subject (no empty, ``*`` or ``>`` token) that
        ``src`` matches (``*`` one token, ``>`` the rest). A ``>`` to ``>`` transform matches anything."""
        return self._identity or self._matches(subject.split("."))

    def apply(self, subject: str) -> str:
        """The transformed ``subject``, which must match ``src`` (:meth:`matches`; ValueError otherwise); with an
        empty ``dest``, the subject itself."""
        if self._identity:
            return subject
        tokens = subject.split(".")
        if not self._matches(tokens):
            raise ValueError(f"subject {_q(subject)} does not match src {_q(self.src)}")
        if self._filter_only:
            return subject
        return self._transform(tokens)

    def copies(self) -> str:
        """A subject pattern every result of this transform matches (what an aggregate must capture): dest with
        each function that gives one token as ``*``; from a function that may give several (split, slice) on, ``>``;
        a filter-only transform's, its ``src``."""
        if self._filter_only:
            return self.src
        out: list[str] = []
        for kind, literal in zip(self._kinds, self._literals, strict=True):
            if kind == _LITERAL:
                out.append(literal)
            elif kind in (_WILDCARD, _PARTITION, _RANDOM, _LEFT, _RIGHT):
                out.append("*")
            else:
                return ".".join([*out, ">"])
        if self._dest_fwc:
            out.append(">")
        return ".".join(out)

    def _matches(self, tokens: list[str]) -> bool:
        for token in tokens:
            if token == "" or token == "*" or token == ">":
                return False
        return _subset_match(tokens, self._src_tokens)

    def _transform(self, tokens: list[str]) -> str:
        """TransformTokenizedSubject: ``tokens`` are a subject :meth:`_matches` accepted."""
        out: list[str] = []
        kinds = self._kinds
        for i in range(len(kinds)):
            kind = kinds[i]
            if kind == _LITERAL:
                out.append(self._literals[i])
            elif kind == _WILDCARD:
                position = self._indexes[i][0]
                out.append(tokens[position] if position < len(tokens) else "")
            elif kind == _PARTITION:
                positions = self._indexes[i]
                key = "".join([tokens[p] for p in positions]) if positions else ".".join(tokens)
                out.append(_partition(key, self._ints[i]))
            elif kind == _RANDOM:
                out.append(_random(self._ints[i]))
            else:
                token = tokens[self._indexes[i][0]]
                if kind == _SPLIT:
                    out.append(_split(token, self._strings[i]))
                elif kind in (_SPLIT_FROM_LEFT, _SPLIT_FROM_RIGHT):
                    out.append(_split_at(token, self._ints[i], kind == _SPLIT_FROM_RIGHT))
                elif kind in (_SLICE_FROM_LEFT, _SLICE_FROM_RIGHT):
                    out.append(_slice(token, self._ints[i], kind == _SLICE_FROM_RIGHT))
                else:
                    out.append(_left(token, self._ints[i], kind == _RIGHT))
        if self._dest_fwc:
            # what '>' matched: the subject's tokens from the position of src's '>' on (the server writes the
            # '.' before it with the token before, so a dest of '>' alone is the tail alone, as here)
            out.append(".".join(tokens[self._tail :]))
        return ".".join(out)


def _out_of_range(dest: str, token: str, index: int, src: str, wildcards: int) -> str:
    if wildcards == 0:
        return (
            f"dest {_q(dest)}: wildcard index {index} in {_q(token)} is out of range: src {_q(src)} has no '*' "
            "('>' has no number: a trailing '>' in dest carries what it matched)"
        )
    if wildcards == 1:
        return f"dest {_q(dest)}: wildcard index {index} is out of range: src {_q(src)} has 1 wildcard (write 1)"
    return (
        f"dest {_q(dest)}: wildcard index {index} is out of range: src {_q(src)} has {wildcards} wildcards"
        f" (write 1 to {wildcards})"
    )


def _check_dest_tokens(dest: str) -> None:
    """ValidateMapping's own pass over a non-empty ``dest``, before it builds the transform."""
    fwc = False
    for n, token in enumerate(dest.split("."), 1):
        if fwc:
            raise TransformError(f"dest {_q(dest)}: '>' must be its last token")
        if token == "":
            raise TransformError(f"dest {_q(dest)}: token {n} is empty: write one token between dots")
        if len(token) > 4 and token.startswith("{{") and token.endswith("}}"):
            # a function call: its spaces are the function's business, and its name must be known
            if not any(pattern.search(token) for pattern in _KNOWN_FUNCTIONS):
                raise TransformError(f"dest {_q(dest)}: {_q(token)} is not a known function: write {_FUNCTION_NAMES}")
            continue
        if token == ">":
            fwc = True
        elif any(c in _WHITESPACE for c in token):
            raise TransformError(f"dest {_q(dest)}: token {_q(token)} holds whitespace (a space, tab or line break)")


def _usage(name: str, second: str) -> str:
    return f"{{{{{name}(i, {second})}}}} with i a wildcard number of src and {second} an integer"


def _index_placeholders(token: str, dest: str) -> tuple[int, list[int], int, str]:
    """indexPlaceHolders: the kind of one dest token, the wildcard numbers it names, its integer argument and its
    string argument (split's delimiter)."""
    length = len(token)
    if length <= 1:
        return _LITERAL, [], -1, ""
    if token[0] == "$":
        number = _atoi(token[1:])
        if number is None:
            return _LITERAL, [], -1, ""  # the server leaves other '$' tokens be: something else may use them
        return _WILDCARD, [number], -1, ""
    if not (length > 4 and token.startswith("{{") and token.endswith("}}")):
        return _LITERAL, [], -1, ""

    def bad(what: str, fix: str) -> TransformError:
        return TransformError(f"dest {_q(dest)}: {_q(token)} {what}: write {fix}")

    def two(args: list[str], name: str, fix: str, more: str = "") -> int:
        """The wildcard number of a function of two arguments (the first; the caller reads the second)."""
        if len(args) != 2:
            many = "argument" if len(args) == 1 else "arguments"
            raise bad(f"has {len(args)} {many}, {name} takes two{more if len(args) > 2 else ''}", fix)
        index = _atoi(args[0].strip(" "))
        if index is None:
            raise bad(f"has {_q(args[0])} for a wildcard number", fix)
        return index

    args = _function_args(_WILDCARD_RE, token)
    if args is not None:
        fix = "{{wildcard(i)}} with i a wildcard number of src, 1 for its first '*'"
        if len(args) == 1 and args[0] == "":
            raise bad("has no argument", fix)
        if len(args) > 1:
            raise bad(f"has {len(args)} arguments, wildcard takes one", fix)
        index = _atoi(args[0].strip(" "))
        if index is None:
            raise bad(f"has {_q(args[0])} for a wildcard number", fix)
        return _WILDCARD, [index], -1, ""

    args = _function_args(_PARTITION_RE, token)
    if args is not None:
        fix = "{{partition(n)}} or {{partition(n, i, ...)}} with n the number of partitions (at most 2147483647)"
        count = _atoi(args[0].strip(" "))
        if count is None or count > _INT32_MAX:
            raise bad(f"has {_q(args[0])} for its number of partitions", fix)
        indexes: list[int] = []
        for arg in args[1:]:
            index = _atoi(arg.strip(" "))
            if index is None:
                raise bad(f"has {_q(arg)} for a wildcard number", fix)
            indexes.append(index)
        return _PARTITION, indexes, _int32(count), ""

    for pattern, kind, name, second in _INDEX_INT_FUNCTIONS:
        args = _function_args(pattern, token)
        if args is not None:
            fix = _usage(name, second)
            index = two(args, name, fix)
            value = _atoi(args[1].strip(" "), _INT32_MIN, _INT32_MAX)
            if value is None:
                raise bad(f"has {_q(args[1])} for its {second} (an integer from -2147483648 to 2147483647)", fix)
            return kind, [index], value, ""

    args = _function_args(_SPLIT_RE, token)
    if args is not None:
        fix = "{{split(i, delimiter)}} with i a wildcard number of src and a delimiter without spaces or '.'"
        index = two(args, "split", fix, " (a delimiter cannot hold a comma)")
        if " " in args[1] or "." in args[1]:
            raise bad(f"has the delimiter {_q(args[1])}, which holds a space or a '.'", fix)
        return _SPLIT, [index], -1, args[1]

    args = _function_args(_RANDOM_RE, token)
    if args is not None:
        fix = "{{random(n)}} for a number from 0 to n-1 (n at most 2147483647)"
        if len(args) != 1:
            raise bad(f"has {len(args)} arguments, random takes one", fix)
        count = _atoi(args[0].strip(" "))
        if count is None or count > _INT32_MAX:
            raise bad(f"has {_q(args[0])} for its n", fix)
        return _RANDOM, [], _int32(count), ""

    raise bad("is not a known function", _FUNCTION_NAMES)


# --- a source's transforms ----------------------------------------------------------------------------------


class SubjectTransforms:
    """An ordered list of transforms, validated together (no overlapping srcs).

    :meth:`apply` is what the server's sourcing does with a message: ``None`` when no ``src`` lets the source
    consumer deliver it, else the result of the first transform (with a ``dest``) whose ``src`` matches it, else
    the subject unchanged (matched only by a filter-only transform).
    """

    __slots__ = ("_active", "_filter_tokens", "filters", "transforms")

    transforms: tuple[SubjectTransform, ...]
    filters: tuple[str, ...]

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        transforms = tuple([SubjectTransform(src, dest) for src, dest in pairs])
        if not transforms:
            raise TransformError("no subject transforms: give at least one (src, dest) pair")
        for outer, first in enumerate(transforms):
            for inner, second in enumerate(transforms):
                if inner != outer and _subset_match(first._src_tokens, second._src_tokens):
                    raise TransformError(
                        f"src {_q(first.src)} overlaps src {_q(second.src)} (every subject the first matches, the "
                        "second matches too): the srcs of one source must not overlap: drop one or narrow it"
                    )
        self.transforms = transforms
        self.filters = tuple([t.src for t in transforms])
        self._filter_tokens = tuple([t._src_tokens for t in transforms])
        # the server skips a filter-only transform (it builds none) and tries the next
        self._active = tuple([t for t in transforms if not t._filter_only])

    def __repr__(self) -> str:
        return f"SubjectTransforms({[(t.src, t.dest) for t in self.transforms]!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubjectTransforms) and self.transforms == other.transforms

    def __hash__(self) -> int:
        return hash(self.transforms)

    def copies(self) -> list[str]:
        """Subject patterns that together match every subject :meth:`apply` can give (an aggregate capturing them
        captures every copy; a subject only a filter-only transform matches keeps its own, the ``src``)."""
        return list(dict.fromkeys(t.copies() for t in self.transforms))

    def apply(self, subject: str) -> str | None:
        """The subject the server stores for a message of ``subject``; None when its source would not copy it.

        Nothing is remembered between calls: a source's subjects can be many, and a thousand sources each keeping
        a memo would cost more memory than the microsecond a transform takes."""
        tokens = subject.split(".")
        delivered = False
        for filter_tokens in self._filter_tokens:
            if _filter_match(tokens, filter_tokens):
                delivered = True
                break
        if not delivered:
            return None
        for transform in self._active:
            if transform._identity:
                return subject
            if transform._matches(tokens):
                return transform._transform(tokens)
        return subject
