"""Talking to a running tritonserver: ``schema_client`` the schema-driven ``Client`` (raw rows in,
one DataFrame row per session out), ``transport`` its connection and which errors are safe to try
again, ``chunks`` a big request cut into requests of whole sessions, ``column_names`` requests
whose columns are named otherwise than the model's inputs, and ``health`` what the server reports
of each model (the launcher reports the same). Nothing is imported here, so the launcher reads
``transport`` and ``health`` without loading the client.
"""
