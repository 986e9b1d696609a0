"""Security tests: each performs an attack against a running gateway and asserts the refusal."""
