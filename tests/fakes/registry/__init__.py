"""A protocol-level Schema Registry for tests (:class:`tests.fakes.registry.server.TestRegistry`): the REST subset the
gateway's registry client uses, in memory, with fault injection (down, slow, 5xx, unknown ids)."""
