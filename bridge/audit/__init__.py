"""The replication audit on Spark: a JetStream data source (:mod:`bridge.audit.datasource`) and the job that
proves, from the provenance headers the bridge writes, that the aggregate holds every origin message once and in
order (:mod:`bridge.audit.job`). Needs the ``audit`` extra (pyspark, pyarrow, matplotlib)."""
