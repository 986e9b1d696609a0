"""Share groups (KIP-932) over HTTP: share consumer instances (routes) and their v3 administration (admin)."""

from fastapi import APIRouter

from api.share.admin import router as admin_router
from api.share.routes import router as instances_router

router = APIRouter()
router.include_router(instances_router)
router.include_router(admin_router)
