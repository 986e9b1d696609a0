"""Durable consumer instances (issue 22): descriptors in a compacted topic, re-creation on the ring owner."""
