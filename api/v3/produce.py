"""v3 routes: produce (being written)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["v3"])
