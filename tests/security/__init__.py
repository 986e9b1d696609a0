"""Security tests (issue 21): each performs an attack against a running gateway and asserts the refusal."""
