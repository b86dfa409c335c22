"""The graph and how it runs: ``ensemble`` the schema-checked graph of serving operators,
``plan`` the graph flattened into operator calls, ``executors`` where a plan runs (this process or
a Triton server), ``merging_executor`` concurrent in-process calls answered by merged runs,
``threads`` the torch thread budget a block of work runs on, ``validation`` the check every request
meets where it enters a step, and ``metrics`` what the operators count while they run. Nothing is
imported here, so each module loads only what it needs.
"""
