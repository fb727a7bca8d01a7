"""The IR: dtypes, the hash-consed UOp graph, the one rewrite engine, and integer simplification (symbolic)."""
