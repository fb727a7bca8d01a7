"""One fuzz case on one device and opts mode: its numpy reference, the job for the worker, and the verdict."""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Optional
import numpy as np
from kc.ir.dtype import dtypes
from kc.tools.fuzz.recipe import Recipe, evaluate, kc_lines, narrow_values, soundness_problem
from kc.tools.fuzz.tolerance import output_bound
from kc.tools.fuzz.worker import DeviceWorker, Job, OptsSpec, Reply
from kc.testing.compare import Comparison, compare
from kc.testing.tolerance import Tolerance

# typed-error: kc refused the kernel or an opt, as it may (worker.error_kind says which errors are refusals);
# internal-error: a kc.KcError on a kernel the builder accepted. Every outcome in FAILURES fails a run.
OUTCOMES = ("ok", "wrong", "typed-error", "internal-error", "untyped-error", "crash", "hang")
FAILURES = ("wrong", "internal-error", "untyped-error", "crash", "hang")
_FROM_ERROR = {"typed": "typed-error", "internal": "internal-error", "untyped": "untyped-error", "crash": "crash",
               "hang": "hang"}


@dataclass
class Reference:
  """numpy's answer for each output buffer and the bound each must meet; `narrow` names the outputs of a float type
  numpy lacks (kc returns their bits; `want` holds their float32 values)."""
  want: dict[int, np.ndarray]
  bounds: dict[int, Tolerance]
  narrow: dict[int, str] = field(default_factory=dict)


def reference(r: Recipe) -> Optional[Reference]:
  """None when numpy cannot evaluate the recipe or its answer is not one a correct kernel must match."""
  try: values = evaluate(r)
  except Exception:  # noqa: BLE001 (a recipe numpy refuses is not a case; only the minimizer produces such)
    return None
  if soundness_problem(r, values) is not None: return None
  return Reference({b: values[o] for b, o in enumerate(r.outputs)},
                   {b: output_bound(r, values, o) for b, o in enumerate(r.outputs)}, r.output_dtypes())


@dataclass
class Verdict:
  outcome: str
  message: str
  opts: OptsSpec
  etype: str = ""
  stage: str = ""


def judge(ref: Reference, reply: Reply) -> Verdict:
  if reply.error is not None:
    named = reply.etype and reply.error in ("typed", "internal", "untyped")
    msg = f"{reply.etype}: {reply.message}" if named else reply.message
    return Verdict(_FROM_ERROR[reply.error], msg, reply.opts, reply.etype, reply.stage)
  problems = []
  for b, want in ref.want.items():
    got = reply.outputs.get(b)
    if got is None: problems.append(f"output {b}: missing")
    elif not (c := output_comparison(b, got, want, ref.bounds[b], ref.narrow.get(b))).ok: problems.append(c.describe())
  if problems: return Verdict("wrong", "; ".join(problems), reply.opts, stage="run")
  return Verdict("ok", "", reply.opts, stage="run")


def output_comparison(output: int, got, want: np.ndarray, bound: Tolerance, narrow: Optional[str] = None) -> Comparison:
  """kc's output `got` against numpy's `want`: the raw bits of a narrow float type (`narrow`) decoded, anything else,
  a wrong dtype included, compared as it is. The reproducers call this too."""
  got = np.asarray(got)
  if narrow is not None and got.dtype.kind == "u": got = narrow_values(got, narrow)
  return compare(output, got, want, getattr(dtypes, narrow) if narrow else dtypes.from_numpy(want.dtype), bound)


def check(worker: DeviceWorker, r: Recipe, ref: Reference, opts: OptsSpec, opt_seed: int) -> Verdict:
  return judge(ref, worker.run(Job(tuple(kc_lines(r)), r.inputs(), opts, opt_seed)))
