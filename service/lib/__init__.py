"""Helpers with no Kafka and no HTTP: asyncio utilities, the C-extension loader, Java regex → RE2, structured
logs, client TLS contexts."""
