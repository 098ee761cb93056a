"""The Delta tables: schemas (:mod:`jobs.tables.schema`) and the delta-rs reader and writer
(:mod:`jobs.tables.delta`). Spark's side is :mod:`jobs.spark.load`."""
