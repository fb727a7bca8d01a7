"""Running fuzz cases on a device in a process of their own, so that a segfault or a hang costs one case, not the run.

The parent talks to one `DeviceWorker` per device; it starts a kc.testing.worker process that opens the device and
runs jobs (build the kernel from its kc.ast lines, pick the opts, kc.run it) until its pipe closes. A child that dies
is a crash, one that does not answer within the timeout is a hang; either way the next job starts a fresh one.
"""
from __future__ import annotations
import random, traceback
from dataclasses import dataclass, field
from typing import Optional, Union
import numpy as np
from kc.testing.worker import CRASH, HANG, Worker, lost_device

# opts as data that crosses the process boundary: a mode name, a list of (OptOps name, axis, amt), or for a program of
# several kernels (kc.schedule) one such list per kernel
OptsSpec = Union[str, list]
_RANDOM_OPS = ("UPCAST", "UPCAST", "UNROLL", "UNROLL", "LOCAL", "GROUP", "GROUPTOP", "PADTO", "SWAP", "NOLOCALS")
_PAD_UNROLL_P = 0.4   # the share of reduce kernels whose random opts include a PADTO + UNROLL pair


@dataclass(frozen=True)
class Job:
  lines: tuple[str, ...]          # kc.ast source that leaves the kernel in `sink`
  inputs: dict                    # buffer index -> np.ndarray
  opts: OptsSpec                  # "none" | "hand" | "random" | [(op, axis, amt), ...]
  opt_seed: int = 0


@dataclass
class Reply:
  """What a device made of a job. `error` is None, "typed" (kc refused the kernel or an opt: error_kind), "internal"
  (kc failed on a kernel its builder accepted), "untyped", "crash" or "hang"."""
  outputs: dict = field(default_factory=dict)
  opts: OptsSpec = "none"         # the opts that ran (random mode resolved to its list)
  error: Optional[str] = None
  stage: str = ""                 # build | opts | run
  etype: str = ""
  message: str = ""


def opts_from_spec(spec: OptsSpec):
  """A mode name for kc.compile, the list of kc.Opt, or a list of those per kernel of a program."""
  from kc.kernel import Opt, OptOps
  if isinstance(spec, str): return spec
  if per_kernel(spec): return [opts_from_spec(s) for s in spec]
  return [Opt(OptOps[op], axis, amt) for op, axis, amt in spec]


def per_kernel(spec: OptsSpec) -> bool:
  """Whether `spec` is one list of opts per kernel of a program (an opt is a (name, axis, amt) entry, a kernel's list
  is not)."""
  if isinstance(spec, str) or not spec: return False
  return all(isinstance(s, list) and not (s and isinstance(s[0], str)) for s in spec)


def random_opts(sink, device: str, seed: Union[int, str]) -> list:
  """A random legal opt list: random Opt(op, axis, amt) tried one after another on the kernel; those the kernel refuses
  (kc.KernelOptError) are skipped. A tensor-core opt goes first where the device has tensor cores. A reduce kernel
  gets, often, a PADTO of a reduce axis next to an UNROLL of it (either order), with an UPCAST or GROUP now and then:
  padding a reduce that is then unrolled is a combination single random opts rarely hit. That choice comes from a
  random stream of its own, so the opts the plain draws give a seed stay those they were. A program of several
  kernels (kc.schedule) gets one such list per kernel, each drawn from the seed and the kernel's place."""
  from kc.runtime.device import Device
  from kc.config import read
  from kc.errors import KernelOptError
  from kc.ir.uop import Ops
  from kc.kernel import Kernel, Opt, OptOps
  from kc.schedule import schedule
  if sink.op is Ops.SINK:
    plan = schedule(sink)
    if not plan.single: return [random_opts(sk.ast, device, f"{seed}:{i}") for i, sk in enumerate(plan.kernels)]
    # the opts apply to the one kernel's AST, as kc.compile builds it: the scheduler may have reshaped its stores
    sink = plan.kernels[0].ast
  rng = random.Random(seed)
  k = Kernel(sink, Device[device].renderer, tc_level=read("KC_TC"))  # the level kc.run will apply the opts at
  tries: list[Opt] = []
  if k.renderer.tensor_cores and rng.random() < 0.5: tries.append(Opt(OptOps.TC, rng.choice((0, 0, 1)), rng.choice((0, 1, 2))))
  for _ in range(rng.randint(1, 8)):
    op = OptOps[rng.choice(_RANDOM_OPS)]
    n = max(1, k.shape_len)
    if op is OptOps.NOLOCALS: tries.append(Opt(op))
    elif op is OptOps.SWAP: tries.append(Opt(op, rng.randrange(n), rng.randrange(n)))
    else: tries.append(Opt(op, rng.randrange(n), rng.choice((0, 2, 3, 4, 8))))
  combo = random.Random(f"{seed}:padto-unroll")
  # where the pair goes among the tries (None: nowhere); it is drawn against the kernel as the earlier tries left it
  at = combo.randint(int(bool(tries) and tries[0].op is OptOps.TC), len(tries)) \
    if k.reduceop is not None and combo.random() < _PAD_UNROLL_P else None
  applied = []
  for i in range(len(tries) + 1):
    for opt in (_pad_unroll(k, combo) if i == at else []) + tries[i:i + 1]:
      try: k.apply_opt(opt)
      except KernelOptError: continue
      applied.append((opt.op.name, opt.axis, opt.amt))
  return applied


def _pad_unroll(k, rng: random.Random) -> list:
  """PADTO of a reduce axis of the kernel as it is now and an UNROLL of the padded axis, in either order (an UNROLL
  first takes a divisor of the axis, the PADTO then pads what is left), maybe with an UPCAST or a GROUP."""
  from kc.kernel import Opt, OptOps
  reduce_axes = [a for a in range(k.first_reduce, k.first_upcast) if isinstance(k.full_shape[a], int) and k.full_shape[a] > 1]
  if not reduce_axes: return []
  axis = rng.choice(reduce_axes)
  size, amt = k.full_shape[axis], rng.choice((4, 8, 16))
  padded = -(-size // amt) * amt
  unroll = rng.choice([u for u in (2, 4, 8) if padded % u == 0 and u <= padded])
  rel = axis - k.first_reduce
  if rng.random() < 0.6: opts = [Opt(OptOps.PADTO, axis, amt), Opt(OptOps.UNROLL, rel, unroll)]
  else:
    divs = [u for u in (2, 3, 4) if size % u == 0]
    first = Opt(OptOps.UNROLL, rel, rng.choice(divs)) if divs else Opt(OptOps.UNROLL, rel, 0) if size <= 8 else None
    opts = [first, Opt(OptOps.PADTO, axis, amt)] if first is not None else [Opt(OptOps.PADTO, axis, amt), Opt(OptOps.UNROLL, rel, unroll)]
  extra = rng.random()
  if extra < 0.3 and k.first_reduce > 0: opts.append(Opt(OptOps.UPCAST, rng.randrange(k.first_reduce), rng.choice((2, 4))))
  elif extra < 0.5: opts.insert(0, Opt(OptOps.GROUP, rng.randrange(max(1, k.first_upcast - k.first_reduce)), rng.choice((2, 4, 8))))
  return opts


def error_kind(e: BaseException, stage: str, explicit_opts: bool) -> str:
  """What an exception from a job says about kc, the one place the fuzzer decides it. "typed": a refusal kc may make,
  which is kc.ast refusing the expression while it is built (InvalidASTError, DTypeError), a device that cannot hold a
  buffer (AllocationError, a MemoryError), or a kernel refusing an opt chosen for it at random (KernelOptError,
  InvalidOptError). "internal": any other kc.KcError, a kernel kc accepted failing later (a RewriteError, the
  emulator's OutOfBoundsError, a DTypeError from constant folding, a CompileError, an opt kc's own heuristics chose
  and then refused). "untyped": an exception that is no kc.KcError."""
  from kc.errors import DTypeError, InvalidASTError, KcError, KernelOptError
  if not isinstance(e, KcError): return "untyped"
  if stage == "build": return "typed" if isinstance(e, (InvalidASTError, DTypeError)) else "internal"
  if isinstance(e, MemoryError) or (explicit_opts and isinstance(e, KernelOptError)): return "typed"
  return "internal"


def run_job(job: Job, device: str, note=None) -> Reply:
  """Build, optimize and run one kernel; every exception becomes a Reply (typed or untyped), except a lost device
  (kc.errors.DeviceLostError), which ends the worker. `note`
  hears the resolved opts before the kernel runs, so that a crash can still be replayed with them."""
  import kc
  from kc import ast as A, dtypes
  reply, stage = Reply(opts=job.opts), "build"
  try:
    ns = {"A": A, "dtypes": dtypes, "np": np}
    exec("\n".join(job.lines), ns)  # noqa: S102 (the fuzzer's own generated kc.ast code)
    stage = "opts"
    if job.opts == "random": reply.opts = random_opts(ns["sink"], device, job.opt_seed)
    if note is not None: note(reply.opts)
    stage = "run"
    reply.outputs = kc.run(ns["sink"], job.inputs, device=device, opts=opts_from_spec(reply.opts))
  except Exception as e:  # noqa: BLE001 (every error is an outcome: a refusal, or a finding with where it came from)
    if lost_device(e) is not None: raise  # a lost device ends the worker: the harness reports this kernel's crash
    explicit_opts = not isinstance(job.opts, str) or job.opts == "random"
    reply.error, reply.etype = error_kind(e, stage, explicit_opts), type(e).__name__
    reply.message = str(e) if reply.error == "typed" else f"{e} ({_where(e)})"
  reply.stage = stage
  reply.message = reply.message[:2000]
  return reply


def _where(e: BaseException) -> str:
  """Where an exception was raised: the last frame of its traceback, as folder/file:line in function."""
  tb = traceback.extract_tb(e.__traceback__)[-1]
  return f"at {'/'.join(tb.filename.rsplit('/', 2)[-2:])}:{tb.lineno} in {tb.name}"


def _device_handler(device: str):
  """A fuzz worker's setup: open the plugins (before it says ready), then run jobs on `device`."""
  import kc  # noqa: F401
  return lambda job, note: run_job(job, device, note)


class DeviceWorker:
  """The parent's handle on one device's worker process (kc.testing.worker: a crash or a hang is its Outcome)."""

  def __init__(self, device: str, timeout: float):
    self.device, self.timeout = device, timeout
    self.worker: Optional[Worker] = None
    self.restarts = 0

  def _start(self) -> Optional[str]:
    self.worker = Worker(_device_handler, (self.device,), name=f"kc-fuzz-{self.device}")
    if (failed := self.worker.wait_ready()) is None: return None
    self.stop()
    return f"the worker process did not start ({failed.etype}: {failed.message})"

  def stop(self) -> None:
    if self.worker is not None: self.worker.kill()
    self.worker = None

  def run(self, job: Job) -> Reply:
    if self.worker is None or not self.worker.alive:
      self.stop()
      if (why := self._start()) is not None: return Reply(opts=job.opts, error="crash", stage="start", message=why)
    resolved = [job.opts]  # ("note", opts): the kernel is about to run with these
    got = self.worker.call(job, self.timeout, on_note=lambda opts: resolved.__setitem__(0, opts))
    if got.ok: return got.value
    if got.kind in (CRASH, HANG):
      self.stop()
      self.restarts += 1
    error = got.kind if got.kind in (CRASH, HANG) else "untyped"  # run_job returns every exception: none reaches here
    return Reply(opts=resolved[0], error=error, stage="run", etype=got.etype, message=got.message)

  def __enter__(self): return self
  def __exit__(self, *exc): self.stop()
