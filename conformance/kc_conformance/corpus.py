"""The whole corpus: importing this module registers every case (structural kernels, then the dtype matrix)."""
from __future__ import annotations
from . import cases, matrix  # noqa: F401  (registration happens at import)
from .case import CASES, Case, Setup, setup_of

__all__ = ["CASES", "Case", "Setup", "setup_of"]
