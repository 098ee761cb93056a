"""The glue both executors share: choosing the executor, an audit run, a repair run, one
worker's share of a repair, the placement pass, and the Pulsar steps around a run."""
