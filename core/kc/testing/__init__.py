"""What kc's checkers share: the BEAM search's compile pool, kc fuzz and the conformance suite run fragile work in
isolated worker processes (kc.testing.worker). This package imports nothing itself."""
