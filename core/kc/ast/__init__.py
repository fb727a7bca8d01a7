"""kc.ast: a builder of programs over arrays that speaks numpy, for embedding kc in frameworks and for tests.

Any expression it accepts means what numpy means, and kc.schedule decides the kernels it takes (docs/AST.md). The
builder itself is kc.ast.builder; numpy's scans (cumsum, cumprod) are kc.ast.scan and its joins (concatenate, stack)
kc.ast.joining, which register themselves as the overrides of numpy's functions; arange is kc.ast.creation;
kc.ast.promotion holds numpy's dtype tables and kc.ast.examples the named example programs.

    import kc.ast as A
    a = A.arg(1, dtypes.float32, (M, K)); b = A.arg(2, dtypes.float32, (K, N))
    sink = A.sink(A.store(0, a @ b))
"""
from kc.ast.builder import *  # noqa: F403  (the builder's public names are kc.ast's)
from kc.ast.scan import cumsum as cumsum, cumprod as cumprod
from kc.ast.joining import concatenate as concatenate, stack as stack
from kc.ast.creation import arange as arange
