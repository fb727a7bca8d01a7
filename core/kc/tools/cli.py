"""The `kc` command."""
from __future__ import annotations
import argparse, ast, json, os, shutil, sys, warnings
from typing import Optional, Sequence
import kc
from kc.errors import KcError, SymbolicError
from kc.config import read
from kc.ir.uop import UOp, Variable

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}
_CMPOPS = {ast.Lt: lambda a, b: a < b, ast.Gt: lambda a, b: a > b, ast.LtE: lambda a, b: a <= b,
           ast.GtE: lambda a, b: a >= b, ast.NotEq: lambda a, b: a.ne(b), ast.Eq: lambda a, b: a.eq(b)}


def parse_expr(text: str, variables: dict[str, UOp]) -> UOp:
  """An integer expression in Python syntax (+ - * // % < <= > >= == != max min, ints, variables) as a UOp.
  `//` and `%` follow C: they truncate toward zero."""
  try: tree = ast.parse(text, mode="eval").body
  except SyntaxError as e: raise SymbolicError(f"cannot parse {text!r}: {e.msg}") from None

  def lift(x): return x if isinstance(x, UOp) else UOp.const(kc.dtypes.int32, x)

  def walk(n):
    if isinstance(n, ast.Constant) and type(n.value) is int: return lift(n.value)
    if isinstance(n, ast.Name):
      if n.id not in variables: raise SymbolicError(f"unknown variable {n.id!r}: declare it with --var {n.id}=MIN:MAX")
      return variables[n.id]
    if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS: return _BINOPS[type(n.op)](lift(walk(n.left)), walk(n.right))
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub): return -lift(walk(n.operand))
    if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _CMPOPS:
      return _CMPOPS[type(n.ops[0])](lift(walk(n.left)), walk(n.comparators[0]))
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("max", "min") and len(n.args) == 2 and not n.keywords:
      a, b = lift(walk(n.args[0])), walk(n.args[1])
      return a.maximum(b) if n.func.id == "max" else a.minimum(b)
    raise SymbolicError(f"unsupported syntax in {text!r}: {ast.unparse(n)}")
  return lift(walk(tree))


def parse_var(spec: str) -> UOp:
  try:
    name, rng = spec.split("=")
    lo, hi = rng.split(":")
    return Variable(name.strip(), int(lo), int(hi))
  except ValueError: raise SymbolicError(f"--var takes NAME=MIN:MAX, got {spec!r}") from None


def cmd_simplify(args) -> int:
  variables = {v.arg[0]: v for v in map(parse_var, args.var)}
  expr = parse_expr(args.expr, variables)
  out = expr.simplify()
  print(f"input:      {expr.render(simplify=False)}")
  print(f"simplified: {out.render(simplify=False)}")
  print(f"range:      [{out.vmin}, {out.vmax}]")
  return 0


def _renderer_summary(r) -> dict:
  return {"global_max": r.global_max, "local_max": r.local_max, "shared_max": r.shared_max, "float4": r.supports_float4,
          "locals": r.has_local, "tensor_cores": [str(tc) for tc in r.tensor_cores]}


def _plugin_errors() -> dict[str, str]:
  """Device.errors(), without the PluginWarnings of discovery: the commands that call this print the errors themselves."""
  from kc.runtime.device import Device
  from kc.runtime.plugins import PluginWarning
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", PluginWarning)
    return Device.errors()


def cmd_devices(args) -> int:
  from kc.runtime.device import Device
  _plugin_errors()
  rows = []
  for name in Device.names():
    spec = Device.spec(name)
    row = {"device": name, "distribution": spec.distribution, "version": spec.version, "priority": spec.priority,
           "available": Device.unavailable_reason(name) is None, "reason": Device.unavailable_reason(name)}
    try: row["renderer"] = _renderer_summary(Device.renderer(name))
    except KcError as e: row["renderer"] = f"unavailable: {e}"
    rows.append(row)
  if args.json:
    shown = {"devices": rows, "errors": Device.errors(), "disabled": Device.table.disabled(), "default": _default_or_none()}
    print(json.dumps(shown, indent=2, default=str))
    return 0
  for row in rows:
    state = "available" if row["available"] else f"unavailable: {row['reason']}"
    print(f"{row['device']:8s} {row['distribution'] or '(core)'} {row['version']}  priority {row['priority']}  {state}")
    if isinstance(row["renderer"], dict):
      r = row["renderer"]
      print(f"         global_max={r['global_max']} local_max={r['local_max']} shared_max={r['shared_max']} float4={r['float4']} "
            f"locals={r['locals']} tensor_cores={r['tensor_cores'] or 'none'}")
  for name, err in Device.errors().items(): print(f"plugin error {name}: {err}")
  for name, origin in Device.table.disabled().items(): print(f"disabled plugin {name}: {origin} (KC_DISABLE_PLUGINS)")
  print(f"default device: {_default_or_none()}")
  if (problem := _kc_device_problem()) is not None: print(problem)
  return 0


def cmd_config(args) -> int:
  """Every knob of kc and of the installed plugins (loaded first: a plugin declares its knobs when imported): its
  value now and where that comes from, or with --markdown the table docs/CONFIG.md holds."""
  from kc import config
  errors = _plugin_errors()
  if args.markdown:
    print(config.markdown_table())
    return 0
  for k in config.knobs():
    try: value = repr(v) if (v := config.read(k.name)) is not None else k.shown_default
    except KcError as e: value = f"invalid: {e}"
    print(f"{k.name:24s} {value:24s} {config.source(k.name):12s} {k.doc}")
  for name, err in errors.items(): print(f"plugin error {name}: {err}")
  return 0


def _kc_device_problem() -> Optional[str]:
  """What is wrong with $KC_DEVICE (an unknown name), or None."""
  from kc.runtime.device import Device
  if not (chosen := read("KC_DEVICE")): return None
  try: Device.spec(chosen)
  except KcError as e: return f"KC_DEVICE={chosen}: {e}"
  return None


def _default_or_none():
  from kc.runtime.device import Device
  try: return Device.DEFAULT
  except KcError: return None


def _run_example(name: str, device: str, opts: str) -> tuple[float, float]:
  """(max abs error against numpy, seconds) of one example on one device."""
  import numpy as np
  from kc.api import compile as kc_compile
  from kc.ast.examples import example
  sink, inputs, ref = example(name).build()
  ck = kc_compile(sink, device, opts)
  out = np.zeros(ref.shape, ref.dtype)
  args = [out] + [inputs[i] for i in range(1, len(inputs) + 1)]
  seconds = ck(*args)
  return float(np.abs(out - ref).max()), seconds


def cmd_doctor(args) -> int:
  """Plugin errors, a bad KC_DEVICE, devices that should open here and cannot (BackendSpec.expected_everywhere), and
  per device that opens a smoke test and the backend's own self-test (BackendSpec.self_test): each wrong result or
  failure is a problem, and any problem makes the exit status 1."""
  from kc.runtime.device import Device
  print(f"kc {kc.__version__}")
  problems = 0
  for name, err in _plugin_errors().items():
    print(f"plugin error {name}: {err}")
    problems += 1
  if (problem := _kc_device_problem()) is not None:
    print(problem)
    problems += 1
  broken = Device.broken()
  for name in Device.names():
    if name in broken:
      print(f"{name}: BROKEN: {Device.spec(name).origin} is installed and should open on any machine, "
            f"but cannot ({broken[name]})")
      problems += 1
      continue
    if (reason := Device.unavailable_reason(name)) is not None:
      print(f"{name}: unavailable ({reason})")
      continue
    problems += _smoke_test(name) + _self_test(name)
  print("no problems found" if not problems else f"{problems} problem{'s' if problems > 1 else ''} found")
  return 1 if problems else 0


def _smoke_test(name: str) -> int:
  """Runs the add example on device `name` and prints how it went; returns the number of problems (0 or 1)."""
  try:
    err, seconds = _run_example("add", name, "hand")
    ok = err == 0.0
    print(f"{name}: {'ok' if ok else 'WRONG RESULT'} (add of 65536 floats, max error {err:g}, {seconds * 1e6:.0f} us)")
    return int(not ok)
  except Exception as e:  # the doctor reports a broken backend, whatever it raises, and goes on to the next one
    print(f"{name}: FAILED ({type(e).__name__}: {e})")
    return 1


def _self_test(name: str) -> int:
  """Runs device `name`'s BackendSpec.self_test, if it has one, and prints each failed check (or one line when all
  passed); returns the number of problems."""
  from kc.runtime.device import Device
  if (test := Device.spec(name).self_test) is None: return 0
  try: results = test()
  except Exception as e:  # a self-test that cannot run is a problem too, and the other devices still get checked
    print(f"{name}: self-test FAILED ({type(e).__name__}: {e})")
    return 1
  if not isinstance(results, dict):
    print(f"{name}: self-test FAILED (it returned {type(results).__name__}, not a dict of check -> problem or None)")
    return 1
  failed = {check: problem for check, problem in results.items() if problem is not None}
  for check, problem in failed.items(): print(f"{name}: self-test {check}: WRONG: {problem}")
  if not failed: print(f"{name}: self-test ok ({len(results)} checks)")
  return len(failed)


def cmd_render(args) -> int:
  """The source of every kernel of an example program, in launch order (kc.schedule decides the kernels)."""
  from kc.api import optimize
  from kc.runtime.device import Device
  from kc.ast.examples import example
  from kc.kernel import Kernel
  from kc.schedule import schedule_for
  sink, _, _ = example(args.example).build()
  device = args.device or Device.DEFAULT
  plan = schedule_for(sink, Device.renderer(device))
  for i, sk in enumerate(plan.kernels):
    if args.opts == "beam":
      from kc.api import beam_opts
      k = beam_opts(sk.ast, device).kernel
    else: k = optimize(Kernel(sk.ast, Device.renderer(device)), args.opts)
    prg = k.to_program()
    where = f" (kernel {i + 1} of {len(plan.kernels)}: {sk.describe()})" if len(plan.kernels) > 1 else ""
    print(f"// {prg.name} on {device}: opts {k.applied_opts}{where}")
    print(prg.src)
  if plan.temps: print(f"// {len(plan.temps)} intermediates, {plan.peak_bytes} bytes at peak")
  return 0


def cmd_run(args) -> int:
  from kc.runtime.device import Device
  device = args.device or Device.DEFAULT
  err, seconds = _run_example(args.example, device, args.opts)
  ok = err <= 1e-3
  print(f"{args.example} on {device} (opts {args.opts}): max abs error vs numpy {err:.3g} {'ok' if ok else 'WRONG'}, {seconds * 1e6:.1f} us")
  return 0 if ok else 1


def cmd_bench(args) -> int:
  """Every example on every chosen device: compile time, median run time, and the check against numpy."""
  import statistics, time
  import numpy as np
  from kc.api import compile as kc_compile
  from kc.runtime.device import Device
  from kc.ast.examples import EXAMPLES
  devices = args.device or Device.available()
  rows, failed = [], 0
  for dev in devices:
    for name, ex in EXAMPLES.items():
      sink, inputs, ref = ex.build()
      t0 = time.perf_counter()
      try: ck = kc_compile(sink, dev, "hand")
      except KcError as e:
        print(f"{dev:8s} {name:10s} FAILED to compile: {e}")
        failed += 1
        continue
      compile_s = time.perf_counter() - t0
      out = np.zeros(ref.shape, ref.dtype)
      call = [out] + [inputs[i] for i in range(1, len(inputs) + 1)]
      times = [ck(*call) for _ in range(args.repeats)]
      err = float(np.abs(out - ref).max())
      row = {"device": dev, "example": name, "compile_s": compile_s, "run_s": statistics.median(times), "max_abs_error": err, "ok": err <= 1e-3}
      failed += not row["ok"]
      rows.append(row)
      print(f"{dev:8s} {name:10s} compile {compile_s * 1e3:8.1f} ms  run {row['run_s'] * 1e6:10.1f} us  "
            f"error {err:.2g}{'' if row['ok'] else '  WRONG'}")
  if args.json:
    with open(args.json, "w") as f: json.dump({"kc": kc.__version__, "results": rows}, f, indent=2)
  return 1 if failed else 0


def _per_device(path: str, device: str, several: bool) -> str:
  """With several devices, each run's file gets the device's name before its extension (out.json -> out.CLANG.json)."""
  if not several: return path
  root, ext = os.path.splitext(path)
  return f"{root}.{device}{ext}"


SPEC_KINDS = frozenset({"none", "hand", "single", "random", "tc"})  # kc_conformance.specs.Spec.kind (the CLI does not import the suite)
CONFORMANCE_TIERS = ("render", "compile", "run")  # kc_conformance.TIERS, in order


def cmd_conformance(args) -> int:
  """Run the conformance suite (the kc-conformance pytest plugin) once per device, each in its own pytest process."""
  import importlib.util, subprocess
  from kc.runtime.device import Device
  if importlib.util.find_spec("kc_conformance") is None:
    raise UsageError("the conformance suite is not installed: pip install kc-conformance")
  if args.numprocesses is not None:
    if importlib.util.find_spec("xdist") is None:
      raise UsageError(f"-n {args.numprocesses} runs the suite in parallel with pytest-xdist, which is not installed: "
                       "pip install pytest-xdist (or kc-conformance[parallel])")
    if args.numprocesses not in ("auto", "logical") and not (args.numprocesses.isdigit()):
      raise UsageError(f"-n takes a number of processes or 'auto', got {args.numprocesses!r}")
  if args.specs and (bad := {k.strip() for k in args.specs.split(",")} - SPEC_KINDS):
    raise UsageError(f"--specs: unknown kind(s) {', '.join(sorted(bad))}; the kinds are {', '.join(sorted(SPEC_KINDS))}")
  if args.require_tier is not None and CONFORMANCE_TIERS.index(args.require_tier) > CONFORMANCE_TIERS.index(args.tier):
    raise UsageError(f"--require-tier {args.require_tier} needs that tier to run, but --tier {args.tier} stops "
                     "before it")
  # every device is checked before any run starts: a typo fails once, here, not once per test
  devices = [Device.spec(d).name for d in args.device] or [Device.DEFAULT]
  if args.list: return _list_conformance(args, devices)
  status = 0
  for dev in devices:
    several = len(devices) > 1
    argv = _conformance_argv(args, dev) + [f"--kc-timeout={args.timeout}", "-q", "-rfE"]
    if args.require_tier: argv.append(f"--kc-require-tier={args.require_tier}")
    argv += [f"--kc-report={_per_device(r, dev, several)}" for r in args.report]
    if args.expect: argv.append(f"--kc-expect={args.expect}")
    if args.numprocesses is not None: argv += ["-n", args.numprocesses]
    if args.junitxml: argv.append(f"--junitxml={_per_device(args.junitxml, dev, several)}")
    print("+ " + " ".join(argv), flush=True)
    rc = subprocess.call(argv)
    status = status or rc
  return status


def _conformance_argv(args, device: str) -> list[str]:
  """The pytest command that runs (or lists) the suite for one device, with the selection the options make."""
  argv = [sys.executable, "-m", "pytest", "--pyargs", "kc_conformance", f"--kc-device={device}",
          f"--kc-tier={args.tier}", "-p", "no:cacheprovider"]
  if args.k: argv += ["-k", args.k]
  if args.specs: argv.append(f"--kc-specs={args.specs}")
  return argv


def _list_conformance(args, devices: list[str]) -> int:
  """--list: the ids of the tests a run would select, one per line (with several devices, each after its device's
  name); nothing is compiled or run."""
  import subprocess, tempfile
  for dev in devices:
    with tempfile.TemporaryDirectory(prefix="kc-conformance-") as tmp:
      listed = os.path.join(tmp, "ids.txt")
      # pytest's own collection output goes nowhere: the ids come back in the file
      r = subprocess.run(_conformance_argv(args, dev) + [f"--kc-list={listed}", "-q"], capture_output=True, text=True)
      if r.returncode != 0 or not os.path.exists(listed):
        said = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
        raise UsageError(f"listing the conformance tests for {dev} failed (exit {r.returncode}): {said}")
      with open(listed) as f: ids = f.read().split()
    for test in ids: print(f"{dev} {test}" if len(devices) > 1 else test)
  return 0


class UsageError(KcError):
  """A command line kc cannot act on (a missing extra, a bad option value)."""


class _Parser(argparse.ArgumentParser):
  """argparse with its errors as one line (`kc render: error: ...`) and exit status 2, like every other kc error."""

  def error(self, message: str):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def cmd_fuzz(args) -> int:
  """Random kernels x opts modes on the chosen devices against numpy; non-zero when any fails (kc.tools.fuzz.check.FAILURES:
  a wrong answer, an internal or untyped error, a crash or a hang)."""
  import time
  from kc.runtime.device import Device
  from kc.tools.fuzz import FuzzConfig, fuzz, summary, write_json
  from kc.tools.fuzz.check import FAILURES
  cfg = FuzzConfig(devices=tuple(args.device or [Device.DEFAULT]), n=args.n, seed=args.seed,
                   modes=tuple(m.strip() for m in args.opts.split(",") if m.strip()), timeout=args.timeout, out_dir=args.out,
                   minimize_seconds=args.minimize, families=tuple(f.strip() for f in args.family.split(",") if f.strip()))
  t0 = time.perf_counter()
  results = fuzz(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
  print(summary(results))
  print(f"{len(results)} runs of {cfg.n} kernels (seed {cfg.seed}) in {time.perf_counter() - t0:.1f} s")
  if args.json: write_json(args.json, {"devices": cfg.devices, "n": cfg.n, "seed": cfg.seed, "modes": cfg.modes, "timeout": cfg.timeout,
                                     "families": cfg.families}, results)
  return 1 if any(r.outcome in FAILURES for r in results) else 0


def load_ast_file(path: str) -> UOp:
  """The kernel a Python file leaves in its variable `sink`: a kc.ast sink (a UOp SINK, as A.sink(A.store(0, ...))
  builds) or a kc.ast expression, which becomes output buffer 0. Errors in the file are typed (UsageError)."""
  import runpy
  from kc import ast as A
  from kc.ir.uop import Ops
  try: ns = runpy.run_path(path, run_name="__kc_ast__")
  except KcError: raise
  except FileNotFoundError: raise UsageError(f"--ast {path}: no such file") from None
  except Exception as e:  # noqa: BLE001  (the user's file may fail in any way; each is the same usage error)
    raise UsageError(f"--ast {path} failed to run: {type(e).__name__}: {e}") from None
  if "sink" not in ns: raise UsageError(f"--ast {path} defines no variable `sink` (a kc.ast sink such as A.sink(A.store(0, x + y)))")
  sink = ns["sink"]
  if isinstance(sink, A.Expr): sink = A.sink(A.store(0, sink))
  if not isinstance(sink, UOp) or sink.op is not Ops.SINK:
    raise UsageError(f"--ast {path}: `sink` must be a kc.ast sink (A.sink(...)) or a kc.ast expression, got {type(sink).__name__}")
  return sink


def _rate(program, seconds: Optional[float]) -> str:
  """A kernel's time with its GFLOP/s and GB/s (from the program's op and memory estimates)."""
  from kc.ir.symbolic import sym_infer
  if seconds is None: return "not timed"
  text = f"{seconds * 1e6:10.1f} us"
  try: ops, mem = (sym_infer(x, {}) for x in (program.op_estimate, program.mem_estimate))
  except KcError: return text  # a kernel with Variables has no figures without their values
  return text + f"  {ops / max(seconds, 1e-12) / 1e9:9.2f} GFLOP/s  {mem / max(seconds, 1e-12) / 1e9:9.2f} GB/s"


class BeamProgress:
  """kc beam's display of a search's SearchEvents: a tqdm bar per round (candidates compiled, with timed and the best
  time so far) where tqdm is installed and `stream` is a terminal, else one plain line per round."""

  def __init__(self, stream=None, bar: Optional[bool] = None):
    self.stream = stream if stream is not None else sys.stderr
    if bar is None: bar = self.stream.isatty() and _installed("tqdm")
    self.bar_enabled, self._bar, self._timed = bar, None, (0, 0)

  def __call__(self, ev) -> None:
    best = f"{ev.best_seconds * 1e6:.1f} us" if ev.best_seconds is not None else "-"
    hand = f"{ev.hand_seconds * 1e6:.1f} us" if ev.hand_seconds is not None else "-"
    if ev.kind == "round":
      self.close()
      self._timed = (0, 0)
      if self.bar_enabled:
        from tqdm import tqdm
        # a terminal that reports no size (a pty nobody sized) would get no room for a bar: tqdm then shows nothing
        size = shutil.get_terminal_size((100, 20))
        self._bar = tqdm(total=ev.total, desc=f"round {ev.round}", unit="compile", file=self.stream, leave=True,
                         ncols=min(size.columns or 100, 120), nrows=size.lines or 20)
      return
    if ev.kind == "timed": self._timed = (ev.done, ev.total)
    if self._bar is not None:
      if ev.kind == "compiled": self._bar.update(ev.done - self._bar.n)
      self._bar.set_postfix_str(f"timed {self._timed[0]}/{self._timed[1]}, best {best}, hand {hand}", refresh=ev.kind != "compiled")
      if ev.kind in ("round_done", "done"): self.close()
    elif ev.kind in ("round_done", "done"):
      print(f"beam: {ev.message or ev.kind} (best {best}, hand-coded {hand})", file=self.stream, flush=True)

  def close(self):
    if self._bar is not None: self._bar.close()
    self._bar = None


def _installed(name: str) -> bool:
  import importlib.util
  return importlib.util.find_spec(name) is not None


INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C, as a shell reports one (128 + SIGINT)


def cmd_beam(args) -> int:
  """BEAM search for one kernel: the chosen opts, their speedup over the hand-coded kernel and the search's time.
  Ctrl-C prints the best opts timed so far (stored nowhere) and one line on stderr, and exits with status 130."""
  try: return _beam_command(args)
  except KeyboardInterrupt as e:  # kc.search.SearchInterrupted when the search had started: it carries the best so far
    best = getattr(e, "best", None)
    if best is not None:
      rounds = len(best.rounds)
      print(f"best so far: {list(best.opts)} at {_us(best.seconds)} (hand-coded {_us(best.hand_seconds)}) "
            f"after {rounds} finished round{'s' if rounds != 1 else ''}: timed in the search only, output not checked",
            flush=True)
    print("kc beam: interrupted; the search's result was not stored in the opt cache", file=sys.stderr, flush=True)
    return INTERRUPTED


def _us(seconds: float) -> str: return f"{seconds * 1e6:.1f} us" if seconds < float("inf") else "not timed"


def _beam_command(args) -> int:
  from kc.api import DEFAULT_BEAM_WIDTH, beam_width_from_env
  from kc.runtime.device import Device
  from kc.ast.examples import example
  if (args.example is None) == (args.ast is None): raise UsageError("kc beam takes an EXAMPLE or --ast FILE (one of them)")
  sink, what = (example(args.example).build()[0], args.example) if args.example is not None else (load_ast_file(args.ast), args.ast)
  device = Device.spec(args.device).name if args.device else Device.DEFAULT
  from kc.schedule import schedule_for
  # the kernels kc.compile(sink, device, opts="beam") searches
  kernels = [k.ast for k in schedule_for(sink, Device.renderer(device)).kernels] if sink.op is kc.Ops.SINK else [sink]
  width = args.width if args.width is not None else beam_width_from_env() or DEFAULT_BEAM_WIDTH
  if width < 1: raise UsageError(f"--width is the number of kernels kept per round (>= 1), got {width}")
  executor = None
  if (address := args.cluster or read("KC_BEAM_CLUSTER")):
    from kc.search.dask_executor import DaskCompileExecutor
    executor = DaskCompileExecutor(address)
  where = f" (compiles on the Dask cluster {address})" if executor is not None else ""
  try:
    for i, ast in enumerate(kernels):
      # a program of several kernels: each is searched (and cached) on its own, as kc.compile(opts="beam") does
      part = f", kernel {i + 1} of {len(kernels)}" if len(kernels) > 1 else ""
      print(f"BEAM width {width} for {what}{part} on {device}{where}", flush=True)
      _beam_kernel(ast, device, width, args, executor)
  finally:
    if executor is not None: executor.close()
  return 0


def _beam_kernel(sink: UOp, device: str, width: int, args, executor) -> None:
  from kc.api import beam_opts, optimize
  from kc.kernel import Kernel
  from kc.runtime.device import Device
  progress = BeamProgress()
  try: choice = beam_opts(sink, device, width, cache=not args.no_cache, seed=args.seed, executor=executor, progress=progress)
  finally: progress.close()
  e = choice.entry
  hand_prg = optimize(Kernel(sink, Device[device].renderer), "hand").to_program()
  print(f"opts:        {list(choice.opts)}")
  print(f"hand-coded:  {_rate(hand_prg, e.hand_seconds)}")
  print(f"beam:        {_rate(choice.kernel.to_program(), e.seconds)}")
  if e.seconds and e.hand_seconds: print(f"speedup:     {e.hand_seconds / e.seconds:.2f}x over the hand-coded kernel")
  if choice.cached:
    print(f"search:      none, from the opt cache (the search took {e.elapsed or 0.0:.1f} s; --no-cache searches again)")
  else:
    r = choice.result
    print(f"search:      {r.elapsed:.1f} s ({len(r.rounds)} rounds, {r.compiled} compiled, {r.timed} timed)")
    for why in r.rejected: print(f"rejected:    {why}")


def cmd_new_backend(args) -> int:
  """Write a backend plugin package to start from, and say what to do with it next."""
  from kc.tools.new_backend import backend_names, write_backend
  root = write_backend(args.name, args.dir)
  n = backend_names(args.name)
  print(f"wrote {root}/ (distribution {n.distribution}, package {n.package}, device {n.device}):")
  for path in sorted(p for p in root.rglob("*") if p.is_file()): print(f"  {path.relative_to(root)}")
  print(f"next: python -m pip install -e {root} && kc conformance --device {n.device}   (docs/BACKENDS.md explains each step)")
  return 0


def build_parser() -> argparse.ArgumentParser:
  p = _Parser(prog="kc", description="kc: a pluggable kernel compiler runtime")
  p.add_argument("--version", action="version", version=f"kc {kc.__version__}")
  sub = p.add_subparsers(dest="command")
  s = sub.add_parser("simplify", help="simplify an integer index expression with kc's symbolic rules")
  s.add_argument("expr", help="e.g. '(x*4+y)//4' (// and %% truncate toward zero, as in C)")
  s.add_argument("--var", action="append", default=[], metavar="NAME=MIN:MAX", help="declare a variable and its range")
  s.set_defaults(fn=cmd_simplify)
  d = sub.add_parser("devices", help="every registered device: plugin, availability, renderer limits, tensor cores")
  d.add_argument("--json", action="store_true")
  d.set_defaults(fn=cmd_devices)
  sub.add_parser("doctor", help="plugin errors, broken devices, and a smoke test and the backend's self-test per device"
                 ).set_defaults(fn=cmd_doctor)
  cf = sub.add_parser("config", help="every environment knob of kc and the installed plugins: value, source, meaning")
  cf.add_argument("--markdown", action="store_true", help="print the table of knobs docs/CONFIG.md holds")
  cf.set_defaults(fn=cmd_config)
  c = sub.add_parser("conformance", help="run the conformance suite against devices (needs kc-conformance)")
  c.add_argument("--device", action="append", default=[], help="a device to certify (repeatable; default: the default device)")
  c.add_argument("--tier", default="run", choices=CONFORMANCE_TIERS, help="run the tiers up to this one (default: all)")
  c.add_argument("--report", action="append", default=[], metavar="FILE", help="FILE.json or FILE.html (repeatable)")
  c.add_argument("--expect", default=None, metavar="FILE", help="an expectation file of the backend's known failures")
  c.add_argument("--timeout", type=float, default=120.0, help="seconds one compile or run may take before it counts as a crash")
  c.add_argument("-k", default=None, metavar="EXPR", help="only tests matching the pytest -k expression")
  c.add_argument("--specs", default=None, metavar="KINDS",
                 help="only these kinds of optimization choice, comma-separated: none, hand, single, random, tc (default: all)")
  c.add_argument("-n", dest="numprocesses", default=None, metavar="N|auto", help="run the tests in N processes (needs pytest-xdist)")
  c.add_argument("--junitxml", default=None, metavar="FILE", help="also write JUnit XML for CI")
  c.add_argument("--require-tier", default=None, choices=CONFORMANCE_TIERS,
                 help="exit non-zero when this tier did not run for a selected case (a device that cannot open here)")
  c.add_argument("--list", action="store_true", help="print the selected tests' ids, one per line, and run nothing")
  c.set_defaults(fn=cmd_conformance)
  b = sub.add_parser("bench", help="compile and time every example kernel on the available devices, checked against numpy")
  b.add_argument("--device", action="append", default=None, help="a device to run (repeatable; default: every available one)")
  b.add_argument("--repeats", type=int, default=5)
  b.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
  b.set_defaults(fn=cmd_bench)
  z = sub.add_parser("fuzz", help="random kernels x random legal opts against numpy; writes a reproducer per failure")
  z.add_argument("--device", action="append", default=[], help="a device to fuzz (repeatable; default: the default device)")
  z.add_argument("--n", type=int, default=100, help="how many random kernels (default 100)")
  z.add_argument("--seed", type=int, default=0, help="the same seed gives the same kernels")
  z.add_argument("--opts", default="none,hand,random", help="opts modes to run each kernel with: some of none,hand,random")
  z.add_argument("--json", default=None, metavar="F", help="write every result as JSON")
  z.add_argument("--out", default="kc-fuzz-failures", metavar="DIR", help="where reproducers go (default ./kc-fuzz-failures)")
  z.add_argument("--timeout", type=float, default=60.0, metavar="SEC", help="seconds a case may run before it counts as a hang")
  z.add_argument("--minimize", type=float, default=120.0, metavar="SEC", help="seconds per device for minimizing failures")
  from kc.tools.fuzz.families import FAMILIES
  z.add_argument("--family", default="", metavar="F[,F]", help="only kernels of these generator families (kc.tools.fuzz.families): "
                 f"{', '.join(FAMILIES)} (default: all, drawn by seed)")
  z.set_defaults(fn=cmd_fuzz)
  bm = sub.add_parser("beam", help="BEAM search for an example kernel (or one from a file): the chosen opts and their speedup")
  from kc.ast.examples import EXAMPLES
  bm.add_argument("example", nargs="?", choices=list(EXAMPLES), default=None, help="a named example kernel (or give --ast)")
  bm.add_argument("--ast", default=None, metavar="FILE", help="a Python file that leaves a kc.ast sink in the variable `sink`")
  bm.add_argument("--device", default=None, help="the device to search on (default: the default device)")
  bm.add_argument("--width", type=int, default=None, metavar="N", help="kernels kept per round (default: KC_BEAM, else 2)")
  bm.add_argument("--cluster", default=None, metavar="local|ADDRESS",
                  help="compile on a Dask cluster: a scheduler address, or 'local' for one in this process (default: KC_BEAM_CLUSTER)")
  bm.add_argument("--seed", type=int, default=0, help="seed of the random inputs the candidates are checked on")
  bm.add_argument("--no-cache", action="store_true", help="search even when the opt cache has a result (the new one is stored)")
  bm.set_defaults(fn=cmd_beam)
  nb = sub.add_parser("new-backend", help="write a complete backend plugin package (C on the host) to start a new backend from")
  nb.add_argument("name", help="the backend's name: device NAME in upper case, package kc_NAME, distribution kc-NAME")
  nb.add_argument("--dir", default=".", metavar="D", help="where to write the kc-NAME folder (default: the current folder)")
  nb.set_defaults(fn=cmd_new_backend)
  for cmd, fn, what in (("render", cmd_render, "print the optimized source of an example kernel"),
                        ("run", cmd_run, "compile, run and check an example kernel against numpy")):
    r = sub.add_parser(cmd, help=what)
    r.add_argument("example", choices=list(EXAMPLES))
    r.add_argument("--device", default=None)
    r.add_argument("--opts", default="hand", choices=["hand", "none", "beam"], help="beam: BEAM search (or its cached result)")
    r.set_defaults(fn=fn)
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if not getattr(args, "fn", None):
    parser.print_help()
    return 0
  try: return args.fn(args)
  except KcError as e:
    print(f"kc: error: {e}", file=sys.stderr)
    return 2
  except BrokenPipeError:
    # the reader of the output went away (`kc conformance --list | head`): stop quietly, as other commands do; stdout
    # points at devnull so that the interpreter's final flush does not fail again
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141  # a shell's status for a command ended by SIGPIPE


if __name__ == "__main__":
  sys.exit(main())
