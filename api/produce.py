"""Confluent REST Proxy v2 produce endpoints. Owned by the produce work."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["produce"])
