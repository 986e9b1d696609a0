"""Confluent REST Proxy v3 subset (paths under ``/v3``), beside the v2 routes in ``api/v2/``.

Same service layer as v2 (:mod:`service.cluster.topics`, :mod:`service.instances.registry`, the tenant's
producer); the v3 envelopes (``kind`` / ``metadata`` / ``data``, ``related`` links) are built in :mod:`api.v3.common`.

- :mod:`api.v3.clusters`: clusters, topics (list/get/create/delete), partitions, topic configs
- :mod:`api.v3.groups`: consumer groups, their consumers, lags and lag summary
- :mod:`api.v3.produce`: ``POST /v3/clusters/{cluster_id}/topics/{topic}/records`` (single and streaming)
"""

from __future__ import annotations

from fastapi import APIRouter

from api.v3.clusters import router as clusters_router
from api.v3.groups import router as groups_router
from api.v3.produce import router as produce_router

router = APIRouter()
router.include_router(clusters_router)
router.include_router(groups_router)
router.include_router(produce_router)
