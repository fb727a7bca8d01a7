"""One fuzz case on one device and opts mode: its numpy reference, the job for the worker, and the verdict."""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Optional
import numpy as np
from kc.fuzz.recipe import Recipe, evaluate, kc_lines, narrow_values, soundness_problem
from kc.fuzz.tolerance import Bound, compare, output_bound
from kc.fuzz.worker import DeviceWorker, Job, OptsSpec, Reply

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
  bounds: dict[int, Bound]
  narrow: dict[int, str] = field(default_factory=dict)


def reference(r: Recipe) -> Optional[Reference]:
  """None when numpy cannot evaluate the recipe or its answer is not one a correct kernel must match."""
  try: values = evaluate(r)
  except Exception:  # noqa: BLE001 (a recipe numpy refuses is not a case; only the minimizer produces such)
    return None
  if soundness_problem(r, values) is not None: return None
  return Reference({b: values[o] for b, o in enumerate(r.outputs)}, {b: output_bound(r, values, o) for b, o in enumerate(r.outputs)},
                   r.output_dtypes())


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
    elif (m := compare(b, _values(np.asarray(got), ref.narrow.get(b)), want, ref.bounds[b])) is not None: problems.append(m.describe())
  if problems: return Verdict("wrong", "; ".join(problems), reply.opts, stage="run")
  return Verdict("ok", "", reply.opts, stage="run")


def _values(got: np.ndarray, narrow: "str | None") -> np.ndarray:
  """kc's output as numbers: a narrow float's raw bits decoded (anything else, a wrong dtype included, as it is)."""
  if narrow is None or got.dtype.kind != "u": return got
  return narrow_values(got, narrow)


def check(worker: DeviceWorker, r: Recipe, ref: Reference, opts: OptsSpec, opt_seed: int) -> Verdict:
  return judge(ref, worker.run(Job(tuple(kc_lines(r)), r.inputs(), opts, opt_seed)))
