"""bklib: Apache BookKeeper 4.17 formats and protocols in Python (metadata, wire, digests)."""

__version__ = "0.1.0"
