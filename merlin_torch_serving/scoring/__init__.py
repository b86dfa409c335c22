"""Batch scoring: every session of a dataset answered by an exported ensemble on a Dask cluster,
exactly as a server of that export answers it, written as parquet.

``dataset`` runs it (``score_dataset``, also ``merlin_torch_serving.score_dataset``); ``inputs``
cuts the input into partitions of whole sessions; ``worker`` scores a partition on a worker with
the ensemble ``exported`` loads (its ``steps`` called as Triton calls them); ``answers`` and
``output`` write the parts. Nothing is imported here, so that the command line reads ``sizes``
without torch.
"""
