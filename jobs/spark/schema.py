"""The Delta tables' schemas as Spark StructTypes, derived from the Arrow schemas in
:mod:`jobs.tables.schema` (written once there)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import types as T

from jobs.tables import schema

__all__ = [
    "ACTIONS_SCHEMA",
    "ACTIONS_TABLE_SCHEMA",
    "AUDIT_RUNS_SCHEMA",
    "BOOKIE_ENTRIES_SCHEMA",
    "BOOKIE_SCHEMA",
    "FRAGMENT_ARROW",
    "FRAGMENT_SCHEMA",
    "LEDGER_SCHEMA",
    "spark_schema",
    "spark_type",
]


def spark_type(t: pa.DataType, nullable: bool = True) -> T.DataType:
    """The Spark type of an Arrow type, keeping element nullability (Spark's own converter
    drops it, and Delta compares ``containsNull`` when schemas merge)."""
    if pa.types.is_struct(t):
        return T.StructType([T.StructField(f.name, spark_type(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return T.MapType(spark_type(t.key_type), spark_type(t.item_type), t.item_field.nullable)
    if pa.types.is_list(t):
        return T.ArrayType(spark_type(t.value_type), t.value_field.nullable)
    simple = {
        pa.int64(): T.LongType(),
        pa.int32(): T.IntegerType(),
        pa.string(): T.StringType(),
        pa.binary(): T.BinaryType(),
        pa.bool_(): T.BooleanType(),
        pa.timestamp("us", tz="UTC"): T.TimestampType(),
        pa.date32(): T.DateType(),
    }
    return simple[t]


def spark_schema(schema: pa.Schema) -> T.StructType:
    """A :mod:`jobs.tables.schema` schema as a Spark StructType."""
    return T.StructType([T.StructField(f.name, spark_type(f.type), f.nullable) for f in schema])


LEDGER_SCHEMA = spark_schema(schema.LEDGER_SCHEMA)
BOOKIE_SCHEMA = spark_schema(schema.BOOKIE_SCHEMA)
BOOKIE_ENTRIES_SCHEMA = spark_schema(schema.BOOKIE_ENTRIES_SCHEMA)
FRAGMENT_ARROW = schema.FRAGMENT_SCHEMA
FRAGMENT_SCHEMA = spark_schema(FRAGMENT_ARROW)
AUDIT_RUNS_SCHEMA = spark_schema(schema.AUDIT_RUNS_SCHEMA)
ACTIONS_SCHEMA = spark_schema(schema.ACTIONS_SCHEMA)
"""A repair action as the repair jobs build it; the table adds ``run_date``."""
ACTIONS_TABLE_SCHEMA = spark_schema(schema.ACTIONS_TABLE_SCHEMA)
