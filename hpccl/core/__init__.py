"""The communicator: the Communicator and its call pipeline, from a user's call to the engine that runs it.
The front end validates arguments into a Call (frontend, call), the planner picks the algorithm once per
(collective, memory kind, size) with the cost model (planner, tuning), dispatch runs the plan, and p2p and
lifecycle are the point-to-point calls and the making and ending of communicators. The top of hpccl's import
order: it may import every other package (gpu, host, observe, algorithms, runtime, transport, memory,
topology, bootstrap) and the top modules; nothing but hpccl/__init__.py, cli and torch imports it."""
