"""A refused commit (rebalancing, not assigned, being revoked) is answered 409 / 40903 with its reason."""

from __future__ import annotations

import orjson

from api.errors import kafka_error_response
from service.group.coordinator import (
    COMMIT_NOT_ASSIGNED,
    COMMIT_REBALANCING,
    CommitFailedError,
    rebalancing_error,
)


def test_refused_commits_map_to_409_40903_with_their_reason() -> None:
    resp = kafka_error_response(rebalancing_error("g", "this member is rejoining the group"))
    body = orjson.loads(resp.body)
    assert (resp.status_code, body["error_code"]) == (409, 40903)
    assert f"reason: {COMMIT_REBALANCING}" in body["message"] and "retried after the next poll" in body["message"]
    resp = kafka_error_response(CommitFailedError(f"commit refused (reason: {COMMIT_NOT_ASSIGNED}): t-1",
                                                  reason=COMMIT_NOT_ASSIGNED))
    assert (resp.status_code, orjson.loads(resp.body)["error_code"]) == (409, 40903)
