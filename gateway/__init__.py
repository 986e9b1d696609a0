"""The process: settings, the embedded services when asked for, the HTTP server and the sink CLI (``python -m
gateway``)."""
