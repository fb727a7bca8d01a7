"""kc-conformance: the suite that certifies a kc backend. A pytest plugin (`pytest --pyargs kc_conformance
--kc-device=NAME`) and `kc conformance --device NAME`: the same kernels on every device, three tiers (render, compile,
run), numpy as the oracle, tests selected by the capabilities a device declares, a versioned JSON report."""
from kc.backend import distribution_version

__version__ = distribution_version("kc-conformance")

# The suite's version follows kc's: kc-conformance X.Y.* holds the tests for kc X.Y.*, so a plugin that pins it to
# its kc range never meets a test written for a newer kc.
SUITE_VERSION = __version__
REPORT_SCHEMA_VERSION = 1
TIERS = ("render", "compile", "run")

__all__ = ["__version__", "SUITE_VERSION", "REPORT_SCHEMA_VERSION", "TIERS"]
