"""v3 routes: groups (being written)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["v3"])
