"""How much a scoring task holds at once: the defaults of ``score_dataset`` and ``score``, in a
module light enough for the command line to import."""

#: rows (clicks) per partition, about: a task holds one partition's rows and answers, and writes
#: them as one part file
DEFAULT_PARTITION_ROWS = 50_000
#: sessions per run of the ensemble within a partition: every run but a partition's last has the
#: same shapes, so the model meets few new ones (a new shape is slower the first time); one run's
#: model scores (``sessions x catalog`` floats for exact top-k) are in memory at once
DEFAULT_BATCH_SESSIONS = 1_024
