"""How much a scoring task holds at once: the defaults of ``score_dataset`` and ``score``, in a
module light enough for the command line to import."""

#: rows (clicks) per partition, about: a task holds one partition's rows and answers, and writes
#: them as one part file
DEFAULT_PARTITION_ROWS = 50_000
#: rows (clicks) per run of the ensemble within a partition, at most the export's own request
#: limit: one run's model scores (``sessions x catalog`` floats for exact top-k) are in memory
DEFAULT_BATCH_ROWS = 8_192
