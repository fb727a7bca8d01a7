"""What a fuzz run leaves behind: standalone reproducer scripts, the summary table, and the JSON of every result."""
from __future__ import annotations
import json, os, re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Optional
import numpy as np
from kc.tools.fuzz.check import FAILURES, OUTCOMES, Reference
from kc.tools.fuzz.generate import generate
from kc.tools.fuzz.recipe import NP_IMPORTS, NP_NAMES, Recipe, kc_lines, np_lines
from kc.tools.fuzz.worker import OptsSpec, per_kernel

_INLINE_ELEMENTS = 256   # inputs up to this size are written into the script; larger ones go to an .npz beside it


@dataclass
class Result:
  """One case on one device under one opts mode."""
  case: int
  seed: int                 # the case's own seed (kc.tools.fuzz.generate.generate(seed) rebuilds its kernel)
  device: str
  mode: str
  opts: OptsSpec
  outcome: str
  message: str = ""
  stage: str = ""
  ops: list = field(default_factory=list)
  reproducer: Optional[str] = None
  family: str = ""          # the generator family of the case (kc.tools.fuzz.families)
  numpy: str = ""           # a refusal while building: "refuses" where numpy refuses the numpy twin too, else "accepts"

  def kind(self) -> str:
    """What failures have in common, for counting: the outcome and the error's type and normalized message, or for a
    wrong answer the ops of the (minimized) kernel."""
    if self.outcome in ("wrong", "ok"): return f"{self.outcome}: " + "+".join(sorted(set(self.ops) - {"input"}))
    return f"{self.outcome}: {normalize(self.message)}"


def numpy_refuses(r: Recipe) -> bool:
  """Whether numpy refuses the kernel's numpy twin: its lines (as a reproducer runs them) raise."""
  ns = {**NP_NAMES, "inputs": r.inputs()}
  try:
    with np.errstate(all="ignore"): exec("\n".join(np_lines(r)), ns)  # noqa: S102 (the fuzzer's own numpy lines)
  except Exception:  # noqa: BLE001 (any error of numpy's is its refusal)
    return True
  return False


def mark_refusals(results: list[Result]) -> None:
  """Fill `numpy` of every refusal while building (kc.ast refused the program): whether numpy refuses the case's
  numpy twin too, the case remade from its seed and family. A refusal numpy shares is a correct one; one numpy does
  not share is a program kc cannot run yet."""
  verdicts: dict[tuple[int, str], str] = {}
  for res in results:
    if res.outcome != "typed-error" or res.stage != "build" or res.numpy: continue
    key = (res.seed, res.family or "classic")
    if key not in verdicts: verdicts[key] = "refuses" if numpy_refuses(generate(res.seed, family=key[1])) else "accepts"
    res.numpy = verdicts[key]


def refusal_tag(res: Result) -> str:
  """What a typed refusal was of: the program (numpy refusing it too, or not) or an opt drawn for it."""
  if res.stage != "build": return "an opt"
  return "numpy refuses too" if res.numpy == "refuses" else "numpy accepts"


def normalize(msg: str) -> str:
  """A message with its numbers, shapes and names of one kernel taken out, so equal causes count together."""
  msg = msg.splitlines()[0] if msg else ""
  msg = re.sub(r"\(at \S+.*?\)", "", msg)
  msg = re.sub(r"\d+", "N", msg)
  return msg[:140]


def opts_source(opts: OptsSpec) -> str:
  """Source for `opts`: a mode name, a list of kc.Opt, or one such list per kernel of a program."""
  if isinstance(opts, str): return repr(opts)
  if per_kernel(opts): return "[" + ", ".join(opts_source(o) for o in opts) + "]"
  return "[" + ", ".join(f"Opt(OptOps.{op}, {axis}, {amt})" for op, axis, amt in opts) + "]"


def _array_source(a: np.ndarray) -> str:
  dt = "np.bool_" if a.dtype == np.bool_ else f"np.{a.dtype.name}"
  return f"np.array({a.reshape(-1).tolist()!r}, dtype={dt}).reshape({tuple(a.shape)})"


def write_reproducer(out_dir: str, res: Result, r: Recipe, ref: Reference, opts: OptsSpec, opt_seed: int = 0) -> str:
  """A Python script that builds the kernel with kc.ast, runs it on the device with the same opts and inputs, compares
  with numpy and prints the difference; it exits 1 while kc disagrees (or raises, or crashes) and 0 once fixed.
  `opts` still "random" means drawing them failed (they were never resolved to a list): the script draws them as the
  fuzzer did, from `opt_seed`, so that it fails where the fuzzer did."""
  os.makedirs(out_dir, exist_ok=True)
  stem = f"{res.device}_{res.mode}_case{res.case:04d}_{res.outcome}"
  path = os.path.join(out_dir, stem + ".py")
  inputs = r.inputs()
  if sum(a.size for a in inputs.values()) <= _INLINE_ELEMENTS:
    load = ["inputs = {"] + [f"  {b}: {_array_source(a)}," for b, a in inputs.items()] + ["}"]
  else:
    np.savez(os.path.join(out_dir, stem + ".npz"), **{f"b{b}": a for b, a in inputs.items()})
    load = [f"_saved = np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), {stem + '.npz'!r}))",
            "inputs = {int(k[1:]): _saved[k] for k in _saved.files}"]
  bounds = {b: (bd.rtol, bd.atol) for b, bd in ref.bounds.items()}
  narrow = r.output_dtypes()
  first = res.message.splitlines()[0][:300] if res.message else ""
  src = [
    f'"""kc fuzz reproducer: {res.outcome} on {res.device} with opts {opts_source(opts)}.',
    "",
    f"Case {res.case} (case seed {res.seed}), minimized. The fuzzer saw: {first}",
    "Run it with python; it exits 1 while kc disagrees with numpy (or raises, or crashes) and 0 once fixed.",
    '"""',
    "import os, sys",
    "import numpy as np",
    "import kc",
    "from kc import Opt, OptOps, ast as A, dtypes  # noqa: F401",
    NP_IMPORTS,
    "from kc.tools.fuzz.check import output_comparison",
    "from kc.testing.tolerance import Tolerance",
    "nan, inf = float('nan'), float('inf')  # as the input lists below spell them",
    "",
    *load,
    "",
    "# the kernel, built with kc.ast",
    *kc_lines(r),
    "",
    "# numpy's answer: the same expression, step by step",
    "with np.errstate(all='ignore'):",
    *("  " + line for line in np_lines(r)),
    f"expected = {{{', '.join(f'{b}: n{o}' for b, o in enumerate(r.outputs))}}}",
    f"bounds = {bounds!r}  # output -> (rtol, atol); (0, 0) means bit-exact",
    f"narrow = {narrow!r}  # outputs of a float type numpy lacks: kc returns their bits",
    "",
    *(["from kc.tools.fuzz.worker import opts_from_spec, random_opts",
       f"opts = opts_from_spec(random_opts(sink, {res.device!r}, {opt_seed!r}))  # the fuzzer's draw, where it failed"]
      if opts == "random" else [f"opts = {opts_source(opts)}"]),
    f"got = kc.run(sink, inputs, device={res.device!r}, opts=opts)",
    "failed = False",
    "for i, want in expected.items():",
    "  have = decode(got[i], narrow[i]) if i in narrow and got[i].dtype.kind == 'u' else got[i]",
    "  if not (m := output_comparison(i, have, want, Tolerance(*bounds[i]), narrow.get(i))).ok:",
    "    failed = True",
    "    print(m.describe())",
    "    if have.shape == want.shape:",
    "      print('kc:', have.tolist())",
    "      print('numpy:', want.tolist())",
    "print('FAIL' if failed else 'ok: kc matches numpy')",
    "sys.exit(1 if failed else 0)",
  ]
  with open(path, "w") as f: f.write("\n".join(src) + "\n")
  return path


def summary(results: list[Result]) -> str:
  """A table of outcomes per device and opts mode, the typed errors by message, and the failure kinds with a
  reproducer each."""
  rows: dict[tuple[str, str], Counter] = defaultdict(Counter)
  for res in results: rows[(res.device, res.mode)][res.outcome] += 1
  lines = [f"{'device':8s} {'opts':7s} " + " ".join(f"{o:>14s}" for o in OUTCOMES)]
  for (dev, mode), c in sorted(rows.items()):
    lines.append(f"{dev:8s} {mode:7s} " + " ".join(f"{c[o]:14d}" for o in OUTCOMES))
  fams: dict[str, Counter] = defaultdict(Counter)
  for res in results: fams[res.family or "classic"][res.outcome] += 1
  if len(fams) > 1:
    lines += ["", f"{'family':15s} " + " ".join(f"{o:>14s}" for o in OUTCOMES)]
    lines += [f"{fam:15s} " + " ".join(f"{c[o]:14d}" for o in OUTCOMES) for fam, c in sorted(fams.items())]
  mark_refusals(results)
  refused = [r for r in results if r.outcome == "typed-error"]
  typed = Counter(f"{r.device}: [{refusal_tag(r)}] {normalize(r.message)}" for r in refused)
  if typed:
    lines += ["", "typed errors (kc refused the kernel or an opt; by message, with whether numpy refuses the program):"]
    lines += [f"  {n:5d}  {msg}" for msg, n in typed.most_common(15)]
    built = [r for r in refused if r.stage == "build"]
    shared = sum(r.numpy == "refuses" for r in built)
    lines.append(f"  {len(built)} refusals of a program, {shared} of them of a program numpy refuses too" +
                 (" (each refusal is a program numpy also refuses)" if built and shared == len(built) else ""))
  kinds: dict[str, list[Result]] = defaultdict(list)
  for r in results:
    if r.outcome in FAILURES: kinds[f"{r.device}: {r.kind()}"].append(r)
  if kinds:
    lines += ["", "failures by kind (count, kind, one reproducer):"]
    for kind, rs in sorted(kinds.items(), key=lambda kv: -len(kv[1]))[:25]:
      repro = next((r.reproducer for r in rs if r.reproducer), None)
      lines.append(f"  {len(rs):5d}  {kind}\n         {repro}")
  return "\n".join(lines)


def write_json(path: str, config: dict, results: list[Result]) -> None:
  mark_refusals(results)
  counts = Counter(r.outcome for r in results)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump({"config": config, "counts": dict(counts), "results": [asdict(r) | {"kind": r.kind()} for r in results]}, f, indent=1, default=str)
