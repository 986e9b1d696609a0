"""Development services started by the gateway itself: an embedded Tansu or Apache Kafka broker and an embedded
Schema Registry."""
