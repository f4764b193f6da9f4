"""The ``jetstream`` Spark data source: ``spark.read`` / ``spark.readStream`` of a JetStream stream, and
``df.write`` / ``df.writeStream`` to one. This package is the stable public module: import the source from here,

    from bridge.spark import JetStreamDataSource
    spark.dataSource.register(JetStreamDataSource)

The modules behind it (:mod:`bridge.spark.datasource` the batch reader and the source, :mod:`bridge.spark.stream`
the stream reader, :mod:`bridge.spark.read` the reads both share, :mod:`bridge.spark.options`,
:mod:`bridge.spark.rows`, :mod:`bridge.spark.writer` the sink) may change. Needs the ``audit`` extra (pyspark,
pyarrow)."""

from bridge.spark.datasource import JetStreamDataSource

__all__ = ["JetStreamDataSource"]
