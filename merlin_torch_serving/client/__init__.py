"""Talking to a running tritonserver: ``schema_client`` the schema-driven ``Client`` (raw rows in,
one DataFrame row per session out) and ``async_client`` its asyncio twin ``AsyncClient``, both
carrying out ``conversation`` (what is asked and made of the answers, written once) over
``transport`` / ``async_transport`` (connections, and which errors are safe to try again);
``model_schemas`` and ``codec`` what a model's config says and its requests and answers, ``chunks``
a big request cut into requests of whole sessions, ``column_names`` requests whose columns are
named otherwise than the model's inputs, and ``health`` what the server reports of each model (the
launcher reports the same). Nothing is imported here, so the launcher reads ``transport`` and
``health`` without loading the client.
"""
