"""The HTTP server under the routes: request-head limits in front of uvicorn, the lean hot-path routes, the GC
policy."""
