"""The whole corpus: importing this module registers every case (structural kernels, the dtype matrix, programs)."""
from __future__ import annotations
from . import cases, matrix, program_cases  # noqa: F401  (registration happens at import)
from .case import CASES, Case, Setup, setup_of

__all__ = ["CASES", "Case", "Setup", "setup_of"]
