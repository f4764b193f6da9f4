"""What the aggregate proves about each source, computed with Spark from the copies' provenance headers.

Every copy the bridge writes names its origin (``Bridge-Source``, ``Bridge-Stream``, ``Bridge-Seq``), the origin
sequence the bridge accepted just before it (``Bridge-Prev``), the origin store time (``Bridge-Time``) and, on the
first copy after a forward reset, the range that reset skipped (``Bridge-Skipped``); see
:mod:`bridge.core.headers`. The origin and its time are the ``jetstream`` data source's typed columns
(:mod:`bridge.spark.rows`), parsed as the bridge itself reads a copy; the rest comes from the headers map
(:data:`HEADERS`). Per source (and origin stream):

* **duplicates**: copies of an origin sequence after its first (aggregate order).
* **reordered**: first copies stored after a first copy of a higher origin sequence (the chaos checker's rule).
* **gaps**: between two consecutive present origin sequences ``a < b``, the missing ``a+1..b-1`` are split by
  what copy ``b`` testifies. Its ``Bridge-Prev`` ``p`` says the bridge accepted ``p`` just before ``b``: so
  ``max(a, p)+1..b-1`` never reached the bridge (**not delivered**: deleted by the origin's limits, a purge, or
  outside the source's filter) and, when ``p > a``, ``a+1..p`` were accepted but are not here (**lost**), except
  what ``Bridge-Skipped`` names (**skipped** on purpose by a forward reset).
* **latency**: aggregate store time minus origin store time, per first copy.
* **inconsistent provenance**: copies whose ``Nats-Msg-Id`` is not the ``<source>:<stream>:<seq>`` their
  ``Bridge-Source``, ``Bridge-Stream`` and ``Bridge-Seq`` say (the bridge writes both from the same values, so a
  disagreement means the copy was not written by the bridge as it stands, or was altered). A copy without
  ``Nats-Msg-Id`` is not judged by this check.

Sequences before a source's first copy are judged as a gap from 0 when its chain starts at 0; otherwise the bridge
began on a consumer whose ack floor was already higher and they are not judged (``chain_start`` says where).
Ranges are kept as ranges; nothing here builds a list of sequences.

A message whose provenance does not parse (no ``Bridge-Source``, ``Bridge-Stream`` or ``Bridge-Seq``, or a
``Bridge-Seq``, ``Bridge-Prev`` or ``Bridge-Time`` that is not a number) is **foreign**, as the bridge's own restart
recovery takes it: not a copy, so its origin sequence is missing from its source's chain and judged as such.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from bridge.core import headers as hdr

KEYS = ["source", "origin_stream"]
# the provenance the data source has no typed column for: the only headers the audit asks it for
HEADERS = [hdr.PREV, hdr.SKIPPED, hdr.MSG_ID]

# gap kinds
LOST = "lost"
SKIPPED = "skipped"
NOT_DELIVERED = "not_delivered"
# a copy's Nats-Msg-Id disagrees with its Bridge-* provenance
INCONSISTENT = "inconsistent_provenance"
# origin comparison kinds
ABSENT = "absent"
EXTRA = "extra"
HASH_MISMATCH = "hash_mismatch"
PENDING = "pending"


@dataclass
class Findings:
    """The audit's DataFrames: ``copies`` (one row per bridge copy, with ``first``, ``reordered`` and
    ``inconsistent`` flags), ``gaps`` (ranges of missing origin sequences by kind), ``duplicates``, ``reordered``
    and ``inconsistent`` (ranges of origin sequences), ``origin`` (ranges by origin comparison kind; None without
    ``--origin-too``), and ``foreign`` (aggregate messages without provenance)."""

    copies: DataFrame
    gaps: DataFrame
    duplicates: DataFrame
    reordered: DataFrame
    inconsistent: DataFrame
    origin: DataFrame | None
    foreign: DataFrame


def provenance(aggregate: DataFrame) -> DataFrame:
    """The aggregate's rows with their provenance as the audit's columns.

    ``source``, ``origin_stream``, ``oseq`` and ``origin_time`` are the data source's typed columns: null on a
    message that is not a bridge copy (then it is foreign, :func:`analyse`). ``prev`` is ``Bridge-Prev`` (0 without
    it, as :func:`bridge.core.headers.parse_provenance` reads it), ``skip_from``/``skip_to`` the ``Bridge-Skipped``
    range, and ``inconsistent`` says the ``Nats-Msg-Id`` is not the one the bridge writes for that provenance. A
    header value Spark cannot read as the number it should be counts as absent: with ANSI casts (Spark 4's default)
    a plain cast would fail the whole audit on one malformed message."""
    h = F.col("headers")
    skipped = [F.regexp_extract(h[hdr.SKIPPED], r"^(\d+)-(\d+)$", group).try_cast("long") for group in (1, 2)]
    readable_skip = skipped[0].isNotNull() & skipped[1].isNotNull()
    # what hdr.msg_id makes of the parsed provenance: the bridge writes both from the same values
    written_id = F.concat(
        F.col("source"), F.lit(":"), F.col("origin_stream"), F.lit(":"), F.col("origin_seq").cast("string")
    )
    return aggregate.select(
        F.col("seq").alias("agg_seq"),
        F.col("timestamp").alias("agg_time"),
        F.col("payload_hash"),
        F.col("source"),
        F.col("origin_stream"),
        F.col("origin_seq").alias("oseq"),
        F.coalesce(h[hdr.PREV].try_cast("long"), F.lit(0)).alias("prev"),
        F.col("origin_time"),
        F.when(readable_skip, skipped[0]).alias("skip_from"),
        F.when(readable_skip, skipped[1]).alias("skip_to"),
        # a copy without Nats-Msg-Id is not judged by this check
        F.coalesce(h[hdr.MSG_ID] != written_id, F.lit(False)).alias("inconsistent"),
    )


def chain_start() -> Column:
    """Aggregate: where a source's chain begins, the origin sequence before its lowest copy (the first copy's
    ``Bridge-Prev``, or the start of the range a forward reset skipped just before it)."""
    return F.min_by(F.coalesce(F.col("skip_from") - 1, F.col("prev")), F.col("oseq"))


def _range(kind: str, first: Column, last: Column) -> Column:
    return F.when(first <= last, F.struct(F.lit(kind).alias("kind"), first.alias("first"), last.alias("last")))


def _islands(df: DataFrame, seq: str) -> DataFrame:
    """Consecutive values of ``seq`` (distinct per source) as ranges ``first, last, count``."""
    w = Window.partitionBy(*KEYS).orderBy(seq)
    return (
        df.withColumn("_island", F.col(seq) - F.row_number().over(w))
        .groupBy(*KEYS, "_island")
        .agg(F.min(seq).alias("first"), F.max(seq).alias("last"), F.count(F.lit(1)).alias("count"))
        .drop("_island")
    )


def analyse(
    aggregate: DataFrame, origins: DataFrame | None = None, origin_last: dict[tuple[str, str], int] | None = None
) -> Findings:
    """Judge every source found in ``aggregate`` (rows of the ``jetstream`` data source). With ``origins`` (the
    origins' rows plus a ``source`` column) and ``origin_last`` (each ``(source, origin stream)``'s last sequence
    when it was read), also compare against what the origins still hold."""
    rows = provenance(aggregate)
    bridged = rows.where(F.col("source").isNotNull() & F.col("oseq").isNotNull())
    foreign = rows.where(F.col("source").isNull() | F.col("oseq").isNull()).select("agg_seq")

    by_copy = Window.partitionBy(*KEYS, "oseq").orderBy("agg_seq")
    before = Window.partitionBy(*KEYS).orderBy("agg_seq").rowsBetween(Window.unboundedPreceding, -1)
    copies = bridged.withColumn("first", F.row_number().over(by_copy) == 1)
    firsts = copies.where("first").withColumn("_prior_max", F.max("oseq").over(before))
    firsts = firsts.withColumn("reordered", F.coalesce(F.col("oseq") < F.col("_prior_max"), F.lit(False)))
    copies = copies.where(~F.col("first")).withColumn("reordered", F.lit(False)).unionByName(firsts.drop("_prior_max"))

    by_origin = Window.partitionBy(*KEYS).orderBy("oseq")
    # the source's first copy is judged from origin sequence 0 when its chain starts there (a fresh consumer; a
    # forward reset before the first copy still counts as a start at 0); else the bridge began on a consumer
    # whose ack floor was already higher, and what lies below is not the audit's to judge
    head = F.when(F.coalesce(F.col("skip_from") - 1, F.col("prev")) == 0, F.lit(0))
    a = F.coalesce(F.lag("oseq").over(by_origin), head)
    stepped = firsts.select(*KEYS, "oseq", "prev", "skip_from", "skip_to", "agg_seq", "agg_time", a.alias("a"))
    gap = stepped.where(F.col("a").isNotNull() & (F.col("oseq") > F.col("a") + 1))
    b, p, sf, st = F.col("oseq"), F.col("prev"), F.col("skip_from"), F.col("skip_to")
    low = F.col("a") + 1
    claimed_to = F.least(p, b - 1)  # accepted by the bridge, per copy b
    has_skip = sf.isNotNull()
    ranges = F.array(
        _range(NOT_DELIVERED, F.greatest(p, F.col("a")) + 1, b - 1),
        # with a skip: what was accepted below it, and above it, is lost; the skip itself is not
        _range(LOST, low, F.when(has_skip, F.least(sf - 1, claimed_to)).otherwise(claimed_to)),
        F.when(has_skip, _range(LOST, F.greatest(st + 1, low), claimed_to)),
        F.when(has_skip, _range(SKIPPED, F.greatest(sf, low), F.least(st, b - 1))),
    )
    gaps = (
        gap.select(*KEYS, F.col("agg_seq").alias("at_agg_seq"), F.col("agg_time").alias("at_time"), F.explode(ranges))
        .where(F.col("col").isNotNull())
        .select(*KEYS, "col.kind", "col.first", "col.last", "at_agg_seq", "at_time")
        .withColumn("count", F.col("last") - F.col("first") + 1)
    )

    duplicates = _islands(copies.where(~F.col("first")).select(*KEYS, "oseq").distinct(), "oseq")
    reordered = _islands(firsts.where("reordered").select(*KEYS, "oseq"), "oseq")
    inconsistent = _islands(copies.where("inconsistent").select(*KEYS, "oseq").distinct(), "oseq")
    origin = compare_origin(firsts, gaps, origins, origin_last or {}) if origins is not None else None
    return Findings(copies, gaps, duplicates, reordered, inconsistent, origin, foreign)


def compare_origin(
    firsts: DataFrame, gaps: DataFrame, origins: DataFrame, origin_last: dict[tuple[str, str], int]
) -> DataFrame:
    """Ranges of origin sequences by kind: ``absent`` (the origin holds it, the aggregate does not, it is within
    the source's chain and no forward reset skipped it), ``pending`` (above the newest copy: not replicated yet),
    ``extra`` (a copy of a sequence above the origin's last sequence: never stored there) and ``hash_mismatch``
    (the copy's payload differs from the origin's)."""
    span = firsts.groupBy(*KEYS).agg(chain_start().alias("chain_start"), F.max("oseq").alias("newest"))
    o = origins.select(
        F.col("source"),
        F.col("stream").alias("origin_stream"),
        F.col("seq").alias("oseq"),
        F.col("payload_hash").alias("origin_hash"),
    )
    joined = o.join(span, KEYS, "left").join(firsts.select(*KEYS, "oseq", "payload_hash"), [*KEYS, "oseq"], "left")
    skips = gaps.where(F.col("kind") == SKIPPED).select(*KEYS, F.col("first").alias("_sf"), F.col("last").alias("_sl"))
    missing = joined.where(F.col("payload_hash").isNull())
    skipped_seqs = (
        missing.join(skips, [*KEYS], "inner")
        .where((F.col("oseq") >= F.col("_sf")) & (F.col("oseq") <= F.col("_sl")))
        .select(*KEYS, "oseq")
    )
    missing = missing.join(skipped_seqs, [*KEYS, "oseq"], "left_anti")
    absent = missing.where(
        F.col("newest").isNotNull() & (F.col("oseq") > F.col("chain_start")) & (F.col("oseq") <= F.col("newest"))
    )
    pending = missing.where(F.col("newest").isNull() | (F.col("oseq") > F.col("newest")))
    mismatch = joined.where(F.col("payload_hash").isNotNull() & (F.col("payload_hash") != F.col("origin_hash")))
    lasts = origins.sparkSession.createDataFrame(
        [(source, stream, last) for (source, stream), last in origin_last.items()],
        "source string, origin_stream string, _origin_last long",
    )
    # a source not compared (not configured, or its origin not read) has no row here and is not judged
    extra = firsts.join(lasts, KEYS, "inner").where(F.col("oseq") > F.col("_origin_last"))
    parts = [
        _islands(df.select(*KEYS, "oseq"), "oseq").withColumn("kind", F.lit(kind))
        for kind, df in ((ABSENT, absent), (PENDING, pending), (HASH_MISMATCH, mismatch), (EXTRA, extra))
    ]
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out
