"""kc as a torch.compile backend: eleven everyday PyTorch models run by torch eager, torch.compile(backend="inductor")
and torch.compile(backend="kc", options={"device": "CLANG", "opts": "hand"}) (kc-torch, integrations/torch), in
inference (model.eval() under torch.no_grad()) and in training (forward and backward) mode, float32, on the CPU
(kc's CLANG) or, with --device CUDA, on an NVIDIA GPU (kc's CUDA, kc-cuda; inductor's Triton kernels there).
The three take turns call by call after warm-up, so that all of them see the same machine; figures are medians. Per
model: each time, kc's speed ratios (above 1: kc is faster), kc's fallbacks (ops that ran in torch instead), the
largest absolute difference from eager of the outputs and gradients, and the first call's time (Dynamo's capture and
the backend's compile) of inductor and kc, both on empty caches (a fresh KC_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR).
A model the kc backend raises on is reported as an error with the exception, and the others are still measured.
Prints the CPU, ISA and threads it ran on and writes its section of benchmarks/RESULTS.md (not with --quick or
--no-write).
Run: python benchmarks/bench_torch.py [--quick] [--no-write] [--repeats N] [--budget S] [--threads N]
                                     [--models mlp,softmax,...] [--modes inference,training] [--device CUDA]
On CUDA every call is timed to the end of its GPU work (torch.cuda.synchronize before and after), and the section
written is bench_torch_cuda (with --models too: a GPU run is often of a few models)."""
from __future__ import annotations
import argparse, atexit, collections, math, os, pathlib, platform, shutil, statistics, sys, tempfile, time, traceback
from dataclasses import dataclass, field
from typing import Callable, Optional
if __name__ == "__main__":  # before torch and kc are imported: both backends compile from empty caches
  os.environ["KC_CACHE_DIR"] = tempfile.mkdtemp(prefix="kc-bench-torch-")
  os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-bench-torch-")
  for _cache in (os.environ["KC_CACHE_DIR"], os.environ["TORCHINDUCTOR_CACHE_DIR"]):  # hundreds of MB a run
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import kc_torch  # noqa: E402
from results import write_section  # noqa: E402

KC_OPTIONS = {"device": "CLANG", "opts": "hand"}   # main() sets "device" to CUDA with --device CUDA
TORCH_DEVICE = torch.device("cpu")                 # and this to cuda
BACKENDS = ("eager", "inductor", "kc")
WARMUP_SECONDS = 3.0  # warm-up calls stop after this long (a slow backend's call can take seconds)
MODES = ("inference", "training")


@dataclass(frozen=True)
class Sizes:
  batch: int      # rows of the MLPs and the norms
  width: int      # the MLPs' input and output width
  hidden: int     # the MLPs' hidden width, the norms' row length
  elems: int      # the elementwise chain's length
  rows: int       # softmax: rows
  cols: int       # softmax: row length
  sequences: int  # attention and transformer: batch
  seq: int        # tokens per sequence
  dim: int        # model width
  heads: int
  ffn: int        # the transformer layer's feed-forward width
  vocab: int
  embed: int      # embedding width
  id_rows: int    # the embedding's token ids are id_rows x id_cols
  id_cols: int
  images: int     # the conv net's batch of 3x32x32 images


FULL = Sizes(batch=64, width=512, hidden=1024, elems=1 << 20, rows=256, cols=1024, sequences=4, seq=128, dim=256,
             heads=4, ffn=1024, vocab=1000, embed=128, id_rows=64, id_cols=32, images=8)
QUICK = Sizes(batch=16, width=64, hidden=128, elems=1 << 14, rows=32, cols=128, sequences=2, seq=16, dim=32, heads=4,
              ffn=64, vocab=100, embed=16, id_rows=8, id_cols=8, images=2)


# ***** the models *****

class Chain(nn.Module):
  def forward(self, x): return (x * 1.5 + 0.5).sigmoid() * x.tanh() - x.exp() * 0.1


class Softmax(nn.Module):
  def forward(self, x): return x.softmax(-1)


class LogSoftmax(nn.Module):
  def forward(self, x): return F.log_softmax(x, -1)


class CausalSelfAttention(nn.Module):
  """GPT-style attention written out: a qkv projection, q @ k^T scaled, the future masked, softmax, @ v, projection."""

  def __init__(self, dim: int, heads: int, seq: int):
    super().__init__()
    self.heads = heads
    self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
    self.register_buffer("future", torch.ones(seq, seq, dtype=torch.bool).triu(1))

  def forward(self, x):
    B, T, C = x.shape
    q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads))
    att = att.masked_fill(self.future[:T, :T], float("-inf")).softmax(-1)
    return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class EmbeddingHead(nn.Module):
  def __init__(self, vocab: int, embed: int):
    super().__init__()
    self.embed, self.head = nn.Embedding(vocab, embed), nn.Linear(embed, vocab)

  def forward(self, ids): return self.head(self.embed(ids))


def conv_net() -> nn.Module:
  return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                       nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def _randn(*shape): return torch.randn(*shape)


def _leaves(module: nn.Module, inputs: tuple) -> list[tuple[str, torch.Tensor]]:
  """What training differentiates, named: the parameters, then the inputs that require grad."""
  return list(module.named_parameters()) + [(f"input {i}", x) for i, x in enumerate(inputs) if x.requires_grad]


@dataclass(frozen=True)
class Model:
  name: str
  what: Callable[[Sizes], str]  # the model and its input, for the list under the table
  build: Callable[[Sizes], tuple[nn.Module, tuple]]  # the module and its inputs (seeded by the caller)


MODELS: tuple[Model, ...] = (
  Model("mlp", lambda s: f"Linear {s.width}->{s.hidden}, ReLU, Linear {s.hidden}->{s.hidden}, ReLU, Linear "
                         f"{s.hidden}->{s.width}; batch {s.batch}",
        lambda s: (nn.Sequential(nn.Linear(s.width, s.hidden), nn.ReLU(), nn.Linear(s.hidden, s.hidden), nn.ReLU(),
                                 nn.Linear(s.hidden, s.width)), (_randn(s.batch, s.width),))),
  Model("elementwise_chain", lambda s: f"(x*1.5+0.5).sigmoid()*x.tanh()-x.exp()*0.1 on {s.elems} floats",
        lambda s: (Chain(), (_randn(s.elems),))),
  Model("gelu_mlp", lambda s: f"Linear {s.width}->{s.hidden}, GELU, Linear {s.hidden}->{s.width}; batch {s.batch}",
        lambda s: (nn.Sequential(nn.Linear(s.width, s.hidden), nn.GELU(), nn.Linear(s.hidden, s.width)),
                   (_randn(s.batch, s.width),))),
  Model("layernorm", lambda s: f"nn.LayerNorm({s.hidden}) on ({s.batch}, {s.hidden})",
        lambda s: (nn.LayerNorm(s.hidden), (_randn(s.batch, s.hidden),))),
  Model("rmsnorm", lambda s: f"nn.RMSNorm({s.hidden}) on ({s.batch}, {s.hidden})",
        lambda s: (nn.RMSNorm(s.hidden), (_randn(s.batch, s.hidden),))),
  Model("softmax", lambda s: f"x.softmax(-1) on ({s.rows}, {s.cols})",
        lambda s: (Softmax(), (_randn(s.rows, s.cols),))),
  Model("log_softmax", lambda s: f"F.log_softmax(x, -1) on ({s.rows}, {s.cols})",
        lambda s: (LogSoftmax(), (_randn(s.rows, s.cols),))),
  Model("causal_attention", lambda s: f"qkv Linear, q @ k^T / sqrt(d), masked_fill(future, -inf), softmax, @ v, "
                                      f"Linear; B={s.sequences}, T={s.seq}, C={s.dim}, {s.heads} heads",
        lambda s: (CausalSelfAttention(s.dim, s.heads, s.seq), (_randn(s.sequences, s.seq, s.dim),))),
  Model("transformer_layer", lambda s: f"nn.TransformerEncoderLayer({s.dim}, {s.heads}, {s.ffn}, dropout=0, "
                                       f"batch_first=True) on ({s.sequences}, {s.seq}, {s.dim})",
        lambda s: (nn.TransformerEncoderLayer(s.dim, s.heads, s.ffn, dropout=0.0, batch_first=True),
                   (_randn(s.sequences, s.seq, s.dim),))),
  Model("embedding_head", lambda s: f"nn.Embedding({s.vocab}, {s.embed}), Linear {s.embed}->{s.vocab}; ids "
                                    f"{s.id_rows}x{s.id_cols}",
        lambda s: (EmbeddingHead(s.vocab, s.embed), (torch.randint(0, s.vocab, (s.id_rows, s.id_cols)),))),
  Model("conv_net", lambda s: f"Conv2d 3->16 3x3, ReLU, MaxPool 2, Conv2d 16->32 3x3, ReLU, MaxPool 2, Linear "
                              f"2048->10; batch {s.images} of 3x32x32",
        lambda s: (conv_net(), (_randn(s.images, 3, 32, 32),))),
)


# ***** one backend's step *****

Step = Callable[[], list[torch.Tensor]]  # one call; returns the outputs, then the gradients in training


def _outputs(out) -> list[torch.Tensor]: return list(out) if isinstance(out, (tuple, list)) else [out]


def make_step(fn: Callable, module: nn.Module, inputs: tuple, mode: str, cotangents: list[torch.Tensor]) -> Step:
  """One call of `fn` in `mode`: under no_grad; or forward, then backward of the fixed `cotangents` (a plain sum would
  give softmax a zero gradient) into the parameters and the float inputs, their .grad reset first."""
  if mode == "inference":
    def infer():
      with torch.no_grad(): return _outputs(fn(*inputs))
    return infer
  leaves = [p for _, p in _leaves(module, inputs)]

  def train():
    for t in leaves: t.grad = None
    outs = _outputs(fn(*inputs))
    torch.autograd.backward(outs, cotangents)
    return [o.detach() for o in outs] + [t.grad for t in leaves]
  return train


@dataclass
class Run:
  """One backend on one model in one mode."""
  step: Optional[Step] = None
  compile_s: Optional[float] = None  # the first call: Dynamo's capture, the backend's compile and the call itself
  error: str = ""                    # the exception the first call raised, with where it was raised
  max_err: Optional[float] = None    # the largest absolute difference from eager, outputs and gradients
  wrong: list[str] = field(default_factory=list)  # the results that differ from eager beyond float32 rounding
  call_s: float = 0.0                # the last warm-up call: how long a call takes, before timing
  times: list[float] = field(default_factory=list)
  fallbacks: list = field(default_factory=list)  # kc_torch.Fallback records of this model and mode (kc only)
  graph_breaks: int = 0

  @property
  def seconds(self) -> Optional[float]: return statistics.median(self.times) if self.times else None


def where_raised(e: BaseException) -> str:
  """The innermost frame of the exception's cause chain in kc or kc_torch (else the innermost frame at all)."""
  while e.__cause__ is not None: e = e.__cause__
  frames = traceback.extract_tb(e.__traceback__)
  ours = [f for f in frames if "/kc_torch/" in f.filename or "/kc/" in f.filename or "/plugins/" in f.filename]
  f = (ours or frames or [None])[-1]
  where = f"{os.path.relpath(f.filename)}:{f.lineno} in {f.name}" if f else "no frame"
  return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''} ({where})"


@dataclass
class Started:
  run: Run
  results: list[torch.Tensor]  # the first call's outputs (and gradients), copied
  names: list[str]             # what each result is: "output 0", "grad of linear1.weight"


def start(backend: str, model: Model, sizes: Sizes, mode: str, warmup: int) -> Started:
  """A fresh copy of `model` (same seed, so the same weights and inputs) under `backend`: first call timed, `warmup`
  more calls."""
  torch.manual_seed(0)
  module, inputs = model.build(sizes)   # built on the CPU, then moved: the same weights and inputs on every device
  module, inputs = module.to(TORCH_DEVICE), tuple(x.to(TORCH_DEVICE) for x in inputs)
  module.train(mode == "training")
  if mode == "training": inputs = tuple(x.requires_grad_() if x.is_floating_point() else x for x in inputs)
  torch.manual_seed(1)
  with torch.no_grad(): cotangents = [torch.randn_like(o) for o in _outputs(module(*inputs))]
  names = [f"output {i}" for i in range(len(cotangents))]
  if mode == "training": names += [f"grad of {name}" for name, _ in _leaves(module, inputs)]
  fn = module if backend == "eager" else torch.compile(module, backend=backend,
                                                       options=KC_OPTIONS if backend == "kc" else None)
  step, run = make_step(fn, module, inputs, mode, cotangents), Run()
  kc_torch.clear_fallbacks()
  torch._dynamo.utils.counters.clear()
  sync()
  t0 = time.perf_counter()
  try:
    first = step()
    sync()
  except Exception as e:  # the table says "error" and the notes say what and where; the other backends still run
    traceback.print_exc()
    run.error = where_raised(e)
    return Started(run, [], names)
  run.compile_s = time.perf_counter() - t0
  warm_start = time.perf_counter()
  for _ in range(warmup):  # no more once they have taken a few seconds: a slow backend's call can take seconds
    t_call = time.perf_counter()
    step()
    sync()
    run.call_s = time.perf_counter() - t_call
    if time.perf_counter() - warm_start > WARMUP_SECONDS: break
  run.step = step
  run.fallbacks = kc_torch.fallbacks() if backend == "kc" else []
  run.graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
  return Started(run, [t.detach().clone() for t in first], names)


def compare(run: Run, got: list[torch.Tensor], want: list[torch.Tensor], names: list[str]) -> None:
  """The largest absolute difference from eager, and which results differ beyond float32 rounding (relative to each
  result's scale): a fast wrong answer is not a result."""
  errors = [(g.double() - w.double()).abs().max().item() for g, w in zip(got, want)]
  run.max_err = max(errors)
  run.wrong = [f"{name} (max abs err {e:.2g}, eager's largest magnitude {w.abs().max().item():.2g})"
               for name, e, w in zip(names, errors, want) if not e <= 1e-3 * max(1.0, w.abs().max().item())]


def measure(model: Model, sizes: Sizes, mode: str, repeats: int, warmup: int, budget: float) -> dict[str, Run]:
  """Each backend started in turn, then timed call by call, interleaved: on 2 shared cores the same call measured
  seconds apart can differ by more than the backends do. Fewer repeats (at least 3) where `repeats` rounds of the
  three would take more than `budget` seconds."""
  torch._dynamo.reset()  # the first call of each compiled model compiles it (no graph of an earlier model reused)
  started = {backend: start(backend, model, sizes, mode, warmup) for backend in BACKENDS}
  runs = {backend: s.run for backend, s in started.items()}
  for backend in ("inductor", "kc"):
    if runs[backend].step is not None and runs["eager"].step is not None:
      compare(runs[backend], started[backend].results, started["eager"].results, started["eager"].names)
  live = [r for r in runs.values() if r.step is not None]
  repeats = max(3, min(repeats, int(budget / max(1e-9, sum(r.call_s for r in live)))))
  for i in range(repeats):  # each backend follows each other in turn: none always runs after the same neighbour
    for r in live[i % len(live):] + live[:i % len(live)]:
      sync()
      t0 = time.perf_counter()
      r.step()
      sync()
      r.times.append(time.perf_counter() - t0)
  for r in live: r.step = None  # the compiled models and their inputs go: the report needs only the figures
  return runs


def warm_up_backends() -> dict[str, float]:
  """Seconds of the first compile of a one-op function per backend: what the process pays once (inductor loads its
  C++ toolchain and headers), kept out of every model's compile time."""
  out = {}
  for backend in ("inductor", "kc"):
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend=backend, options=KC_OPTIONS if backend == "kc" else None)
    t0 = time.perf_counter()
    fn(torch.ones(8, device=TORCH_DEVICE))
    sync()
    out[backend] = time.perf_counter() - t0
  kc_torch.clear_fallbacks()
  return out


# ***** the report *****

def sync() -> None:
  """Wait for the GPU's queued work (on the CPU a call's work is done when it returns)."""
  if TORCH_DEVICE.type == "cuda": torch.cuda.synchronize()


def ms(r: Run) -> str: return "error" if r.error else f"{r.seconds * 1e3:.3f}"
def sec(r: Run) -> str: return "error" if r.error else f"{r.compile_s:.2f}"


def speed(kc_run: Run, other: Run) -> str:
  if kc_run.error or other.error: return "error" if kc_run.error else "n/a"
  return f"{other.seconds / kc_run.seconds:.2f}"


def err(r: Run) -> str:
  if r.error or r.max_err is None: return "error" if r.error else "n/a"
  return f"{r.max_err:.2g}" + (" (wrong)" if r.wrong else "")


def geomean(pairs: list[tuple[Run, Run]]) -> str:
  """Of the models both ran without an error, and kc right (a wrong answer's time counts for nothing)."""
  ratios = [o.seconds / k.seconds for k, o in pairs if not (k.error or o.error or k.wrong)]
  return f"{statistics.geometric_mean(ratios):.2f} (of {len(ratios)})" if ratios else "n/a"


def table(mode: str, results: dict[str, dict[str, Run]], models: list[Model]) -> list[str]:
  lines = [f"### {mode}", "", "| model | eager ms | inductor ms | kc ms | kc/eager | kc/inductor | kc fallbacks | "
           "kc max abs err | inductor max abs err | inductor compile s | kc compile s |", "|---|" + "---:|" * 10]
  for m in models:
    e, i, k = (results[m.name][b] for b in BACKENDS)
    fallbacks = "-" if k.error else str(len(k.fallbacks)) + (f" [{m.name}-{mode}]" if k.fallbacks else "")
    lines.append(f"| {m.name} | {ms(e)} | {ms(i)} | {ms(k)} | {speed(k, e)} | {speed(k, i)} | {fallbacks} | {err(k)} | "
                 f"{err(i)} | {sec(i)} | {sec(k)} |")
  pairs = [(results[m.name]["kc"], results[m.name][b]) for b in ("eager", "inductor") for m in models]
  half = len(models)
  lines.append(f"| geometric mean | | | | {geomean(pairs[:half])} | {geomean(pairs[half:])} | | | | | |")
  return lines


def footnotes(mode: str, results: dict[str, dict[str, Run]], models: list[Model], repeats: int) -> list[str]:
  """The ops behind each fallback count, the exceptions behind each error, the graph breaks, the repeats cut short."""
  notes = []
  for m in models:
    if (timed := next((len(r.times) for r in results[m.name].values() if r.times), None)) and timed < repeats:
      slowest = max((r for r in results[m.name].values() if r.times), key=lambda r: r.call_s)
      which = next(b for b, r in results[m.name].items() if r is slowest)
      notes.append(f"{m.name} ({mode}): {timed} repeats, not {repeats}: a call of {which} takes "
                   f"{slowest.call_s:.2f} s")
    for backend, r in results[m.name].items():
      if r.error: notes.append(f"{m.name} ({mode}): {backend} raised {r.error}")
      if r.wrong: notes.append(f"{m.name} ({mode}): {backend} is WRONG: " + "; ".join(r.wrong))
      elif r.graph_breaks: notes.append(f"{m.name} ({mode}): {backend}: {r.graph_breaks} Dynamo graph break(s)")
    k = results[m.name]["kc"]
    if k.fallbacks:
      ops = collections.Counter(f"{f.op} ({f.reason})" for f in k.fallbacks)
      ran = "; ".join(f"{n}x {op}" if n > 1 else op for op, n in ops.items())
      notes.append(f"[{m.name}-{mode}] ran in torch: {ran}")
  return notes


def host_lines(warm: dict[str, float], load_at_start: tuple[float, ...]) -> list[str]:
  load = "load average {:.2f}, {:.2f}, {:.2f} at the start of the run, {:.2f}, {:.2f}, {:.2f} at the end".format(
    *load_at_start, *os.getloadavg())
  threads = os.environ.get("KC_CLANG_THREADS", f"every core ({os.cpu_count()})")
  if TORCH_DEVICE.type == "cuda":
    from kc_cuda import driver
    return [f"GPU: {torch.cuda.get_device_name()} ({driver.device_props(driver.selected_ordinal())}); torch "
            f"{torch.__version__} for CUDA {torch.version.cuda}; kc CUDA (kc-cuda). One-time start-up, kept out of the "
            f"compile columns (the first compile of `x + 1`): inductor {warm['inductor']:.1f} s, kc {warm['kc']:.1f} s.",
            f"host: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}; {load}"]
  from bench_clang import host_line   # the CPU, ISA and compiler kc-clang builds with (a GPU run has no kc-clang)
  return [f"{host_line()}; {load}",
          f"torch {torch.__version__} on {torch.get_num_threads()} intra-op threads (inductor's kernels use as many); "
          f"kc CLANG threads: {threads}. One-time start-up, kept out of the compile columns (the first compile of "
          f"`x + 1`): inductor {warm['inductor']:.1f} s, kc {warm['kc']:.1f} s."] + \
    ([busy()] if others_were_busy(load_at_start) else [])


def others_were_busy(load_at_start: tuple[float, ...]) -> bool:
  """Whether other processes held a core: the one-minute load as the run began is theirs (this run had barely
  started), the one at the end counts this run's own threads too."""
  return load_at_start[0] >= 1.0 or os.getloadavg()[0] > (os.cpu_count() or 1)


# seen on this benchmark's 2-core machine: a quick-size transformer layer in eager took 0.6 to 1.4 ms a call with a
# core to itself and 64 to 94 ms while other processes held one
def busy() -> str:
  """What other processes' load did to the figures, for the threads this run used."""
  held = "Other processes held cores during the run (the load averages above), and every column is slower for it"
  if torch.get_num_threads() == 1:
    return f"{held} (on one thread, no call waits for a descheduled thread of its own)."
  return (f"{held}, by more than the share of the cores lost where a call's work is split over threads that wait for "
          "each other (torch's OpenMP regions, one per eager op; inductor's kernels; kc's split kernels): a thread "
          "descheduled by another process stalls the whole call. On a busy machine the one-thread run "
          "(`--threads 1`, section bench_torch_threads1) is the steadier comparison.")


INTRO = (
  "{count}, float32 on {where}, run by torch eager, `torch.compile(backend=\"inductor\")` and "
  "`torch.compile(backend=\"kc\", options={{\"device\": \"{device}\", \"opts\": \"hand\"}})` (kc-torch, "
  "integrations/torch). Inference: `model.eval()` under `torch.no_grad()`, with the fused native fast path of "
  "nn.TransformerEncoderLayer off for all three (`torch.backends.mha.set_fastpath_enabled(False)`: kc has no lowering"
  " for it); training: forward, then backward of a fixed random cotangent into the parameters and the float inputs. "
  "The three take turns call by call; times are medians of {repeats} whole calls in ms (fewer where the calls are "
  "slow, named in the notes) after up to {warmup} warm-up calls (fewer once they took {warmup_s:.0f} s). kc/eager and"
  " kc/inductor are speed ratios: above 1, kc is faster. kc fallbacks: the ops kc-torch ran in torch instead "
  "(`kc_torch.fallbacks()`), named in the notes. Max abs err: the largest absolute difference from eager over the "
  "outputs (and, training, the gradients); (wrong): a result differs by more than 1e-3 of its scale, named in the "
  "notes. Compile s: the first call (Dynamo's capture, AOTAutograd, the backend's compile and the call), both "
  "backends on empty caches.")


def report(args, sizes: Sizes, models: list[Model], results: dict, warm: dict[str, float]) -> str:
  flags = f"--repeats {args.repeats}" + (" --quick" if args.quick else "") + \
    (f" --models {args.models}" if args.models else "") + (f" --threads {args.threads}" if args.threads else "") + \
    (f" --modes {args.modes}" if args.modes != ",".join(MODES) else "") + (" --device CUDA" if args.device == "CUDA" else "")
  lines = [f"## kc as a torch.compile backend (`python benchmarks/bench_torch.py {flags}`)", "",
           INTRO.format(repeats=args.repeats, warmup=args.warmup, warmup_s=WARMUP_SECONDS, device=KC_OPTIONS["device"],
                        count=f"{len(models)} PyTorch model" + "s" * (len(models) != 1),
                        where="an NVIDIA GPU" if args.device == "CUDA" else "the CPU"), "",
           *host_lines(warm, args.load_at_start), ""]
  lines += [f"- {m.name}: {m.what(sizes)}" for m in models] + [""]
  notes = []
  for mode in args.modes.split(","):
    lines += table(mode, results[mode], models) + [""]
    notes += footnotes(mode, results[mode], models, args.repeats)
  return "\n".join(lines + (["Notes:", ""] + [f"- {n}" for n in notes] if notes else []))


def main():
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--repeats", type=int, default=15)
  ap.add_argument("--warmup", type=int, default=3, help="calls of each backend after the first, before timing")
  ap.add_argument("--budget", type=float, default=20.0,
                  help="seconds of timed calls per model and mode: fewer repeats (at least 3) where the calls are slow")
  ap.add_argument("--quick", action="store_true",
                  help=f"small sizes ({QUICK}), 3 repeats, 1 warm-up call; RESULTS.md is not written")
  ap.add_argument("--no-write", action="store_true", help="print only (RESULTS.md is not written)")
  ap.add_argument("--models", default="", help=f"comma-separated subset of {', '.join(m.name for m in MODELS)}")
  ap.add_argument("--threads", type=int, help="threads for torch (eager and inductor's kernels) and for kc CLANG's "
                                              "kernels (KC_CLANG_THREADS); default: torch's and kc's own (every core); "
                                              "writes the section bench_torch_threads<N>")
  ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
  ap.add_argument("--device", default="CPU", choices=("CPU", "CUDA"),
                  help="CPU (kc's CLANG) or CUDA (an NVIDIA GPU, kc-cuda's CUDA): writes the section bench_torch_cuda")
  args = ap.parse_args()
  if (bad := set(args.modes.split(",")) - set(MODES)) or not args.modes:
    raise SystemExit(f"--modes: unknown {sorted(bad)}; the modes are {list(MODES)}")
  if args.device == "CUDA":
    global TORCH_DEVICE
    if not torch.cuda.is_available(): raise SystemExit("--device CUDA: torch sees no CUDA GPU here")
    TORCH_DEVICE = torch.device("cuda")
    KC_OPTIONS["device"] = "CUDA"
  if args.threads is not None:
    if args.threads < 1: raise SystemExit(f"--threads is a positive count, got {args.threads}")
    torch.set_num_threads(args.threads)
    os.environ["KC_CLANG_THREADS"] = str(args.threads)
  sizes = QUICK if args.quick else FULL
  if args.quick: args.repeats, args.warmup = 3, 1
  if args.repeats < 1 or args.warmup < 1:
    raise SystemExit(f"--repeats and --warmup are at least 1, got {args.repeats} and {args.warmup}")
  names = [n for n in args.models.split(",") if n]
  if (unknown := set(names) - {m.name for m in MODELS}):
    raise SystemExit(f"--models: unknown {sorted(unknown)}; the models are {[m.name for m in MODELS]}")
  models = [m for m in MODELS if not names or m.name in names]
  # eval() under no_grad sends nn.TransformerEncoderLayer and nn.MultiheadAttention to one fused native op, which
  # kc has no lowering for (it would run in torch whole); without the fast path all three run the same composite ops
  torch.backends.mha.set_fastpath_enabled(False)
  args.load_at_start = os.getloadavg()
  warm = warm_up_backends()
  print(*host_lines(warm, args.load_at_start), sep="\n", flush=True)
  results: dict[str, dict[str, dict[str, Run]]] = {mode: {} for mode in MODES}
  for mode in args.modes.split(","):
    for m in models:
      runs = results[mode][m.name] = measure(m, sizes, mode, args.repeats, args.warmup, args.budget)
      print(f"{mode} {m.name}: " + ", ".join(f"{b} {ms(r)} ms" for b, r in runs.items()) +
            f"; compile inductor {sec(runs['inductor'])} s, kc {sec(runs['kc'])} s; kc fallbacks "
            f"{len(runs['kc'].fallbacks)}", flush=True)
  body = report(args, sizes, models, results, warm)
  print(body)
  if args.device == "CUDA":
    if not (args.quick or args.no_write): write_section("bench_torch_cuda", body)
  elif not (args.quick or args.no_write or args.models or args.modes != ",".join(MODES)):
    write_section("bench_torch" if args.threads is None else f"bench_torch_threads{args.threads}", body)


if __name__ == "__main__":
  main()
