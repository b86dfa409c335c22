"""How the served models' large tensors are computed and placed: ``batch_invariance`` the fewest
rows a matrix product runs on, so that a session's scores do not depend on its batch, and
``huge_pages`` large read-only tables (item embeddings) moved onto huge pages where the kernel
allows it. Shared by ``ops`` and ``retrieval``.
"""
