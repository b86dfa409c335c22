"""The side-by-side serving benchmark: this project against the in-process limit, the Triton floor
and Merlin Systems, on the session-based example. Run it with ``./run bench``.
"""
