"""Durable consumer instances: descriptors in a compacted topic, re-creation on the ring owner."""
