"""The replication audit on Spark: the job that proves, from the provenance headers the bridge writes, that the
aggregate holds every origin message once and in order (:mod:`bridge.audit.job`), reading streams with the
``jetstream`` data source (:mod:`bridge.spark`). Needs the ``audit`` extra (pyspark, pyarrow, matplotlib)."""
