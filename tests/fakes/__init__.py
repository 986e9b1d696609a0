"""Stand-ins for outside parts, for fault injection: a Kafka-protocol test broker and a Schema Registry."""
