"""The fuzzer's entry point: the random kernel of a seed, from the family the seed draws (families.py), and the seeds
of a run's cases."""
from __future__ import annotations
from typing import Optional
import numpy as np
from kc.tools.fuzz.families import build, pick_family
from kc.tools.fuzz.recipe import Recipe


def generate(seed: int, size: float = 1.0, family: Optional[str] = None) -> Recipe:
  """The random kernel of `seed` (`size` < 1 shrinks its shapes). The family (kc.tools.fuzz.families.FAMILIES) is drawn
  from the seed unless given; "classic" kernels are the ones classic.Generator made before the families existed."""
  return build(family or pick_family(seed), seed, size)


def case_seed(seed: int, index: int) -> int:
  """The seed of case `index` of a run started with `seed`."""
  return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
