"""Spark sink for the gateway: read-committed views of Kafka topics into a parquet or Delta table, exactly once.

It speaks only HTTP to the gateway (the offsets endpoint and the stateless Arrow offset-range endpoint), never
Kafka, and imports nothing from ``service``. :mod:`sink.source` is the PySpark Python data source
``kafka_gateway`` (batch and streaming), :mod:`sink.cli` the ``consumer-gateway sink`` job, :mod:`sink.delta`
the idempotent Delta writer and :mod:`sink.groups` the optional consumer-group offset mirror.
"""
