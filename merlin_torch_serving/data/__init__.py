"""The data every part shares, from the graph to the client: ``wire`` the wire format of schema
columns as Triton tensors, ``tables`` row operations on tensor tables, ``frames`` DataFrames to
tables and back, ``schemas`` the schema helpers (JSON round trip, dtype and shape descriptions),
``samples`` small valid inputs built from a schema, and ``vocabulary`` the raw values behind a
Categorify-encoded column. Nothing is imported here, so each module loads only what it needs.
"""
