"""BEAM search over a kernel's optimizations (kc.search.beam_search), with its parts: the action list and the
legal next kernels (actions), compiling many sources at once (executor), running candidates on the device (timing),
the correctness check against the hand-coded kernel (check) and what a search reports (result).

This layer sits above codegen and below the runtime: it never imports a device; the caller passes one in."""
from kc.search.actions import DEFAULT_LIMITS, SearchLimits, action_list, next_kernels
from kc.search.beam import SearchWarning, beam_search
from kc.search.executor import CompileOutcome, LocalCompilePool, shared_pool
from kc.search.result import RoundStats, SearchEvent, SearchInterrupted, SearchResult
from kc.search.timing import TimingPlan

__all__ = ["beam_search", "SearchResult", "SearchEvent", "RoundStats", "SearchInterrupted", "SearchWarning",
           "LocalCompilePool", "CompileOutcome", "shared_pool", "action_list", "next_kernels", "SearchLimits",
           "DEFAULT_LIMITS", "TimingPlan"]
