"""Share groups (KIP-932): the share session and member state machines (sans-io) and their asyncio driver."""
