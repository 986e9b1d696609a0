"""The cluster as the admin endpoints see it: the topic catalog and offsets (v2 /topics), topic administration
and consumer-group views (v3)."""
