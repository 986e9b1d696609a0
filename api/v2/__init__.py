"""The Confluent REST Proxy v2-compatible API and its extensions: consumers, streams, topics, produce, rendering."""
