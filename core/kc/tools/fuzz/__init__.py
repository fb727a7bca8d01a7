"""kc fuzz: random kernels x random legal opts on any registered device, checked against numpy.

    from kc.tools.fuzz import FuzzConfig, fuzz, summary
    results = fuzz(FuzzConfig(devices=("CLANG",), n=100, seed=1))
    print(summary(results))

Every failure (a wrong answer, an internal error: a kc.KcError on a kernel the builder accepted, an untyped exception,
a crash or a hang of the worker process) leaves a minimized, standalone reproducer script in the output folder; a
kernel kc.ast refuses to build is a typed refusal, not a failure. `kc fuzz` is the command-line front end.
"""
from kc.tools.fuzz.generate import case_seed, generate
from kc.tools.fuzz.recipe import Node, Recipe, kc_lines, np_lines
from kc.tools.fuzz.report import Result, summary, write_json
from kc.tools.fuzz.runner import MODES, FuzzConfig, fuzz

__all__ = ["FuzzConfig", "fuzz", "summary", "write_json", "Result", "generate", "case_seed", "Recipe", "Node",
           "kc_lines", "np_lines", "MODES"]
