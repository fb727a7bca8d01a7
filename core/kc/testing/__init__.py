"""What kc's checkers share: the BEAM search's compile pool, kc fuzz and the conformance suite run fragile work in
isolated worker processes (kc.testing.worker) and hold results to one tolerance table with one comparison
(kc.testing.tolerance). This package imports nothing itself, so a worker harness user does not load the table."""
