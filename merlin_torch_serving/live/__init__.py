"""Live sessions: a graph that takes only each session's new clicks and keeps the rest in a
store (``history.SessionHistory``), block lists changed while it serves (``rules.BlockList``,
read by ``FilterCandidates`` and ``TopK``), and trending items counted as clicks arrive
(``trending.Trending``, ``trending_items.TrendingItems``). Import them from the package root;
this package imports nothing itself, as ``ops`` reads ``rules`` and ``trending_items`` reads
``ops``."""
