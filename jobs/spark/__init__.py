"""The Spark executor: the engine inside mapPartitions / mapInArrow, tables via delta-spark.

Everything under this package imports pyspark; nothing outside it does.
"""
