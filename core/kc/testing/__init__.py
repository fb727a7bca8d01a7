"""What kc's checkers share: BEAM's check, kc fuzz and the conformance suite run fragile work in isolated worker
processes (kc.testing.worker), take their bounds from one tolerance table (kc.testing.tolerance: Tolerance, tolerance,
TABLE, KINDS, EXACT) and judge a result against its reference with one comparison (kc.testing.compare: compare,
Comparison, spacing). Import those from their modules: this package imports nothing itself, so that a worker process
starts on the standard library alone (and `compare` and `tolerance` name both a module and its function)."""
