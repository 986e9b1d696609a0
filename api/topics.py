"""Confluent REST Proxy v2 topic endpoints (metadata and partition offsets). Owned by the topics work."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["topics"])
