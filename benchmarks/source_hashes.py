"""sha256 (first 16 hex digits) of the generated source of the benchmark kernels: every kernel of the kc.ast.examples programs on CLANG,
LLVM, OPENCL and EMU under opts none and hand, and bench_clang.py's CLANG workloads under hand. Run it before and after a
change that must not change code generation and diff the two outputs. (EMU's source embeds its pickled UOps, so a
moved class changes its lines and nothing else.) `--conformance` adds every kernel of every conformance case on
CLANG and on bench_compile's GPU-like renderer under none and hand, bench_compile's kernels, and every conformance
case's tensor-core and random-opts specs on EMU's, CUDA's, CLANG's and LLVM's renderers (a minute or two; run it with
KC_CLANG_ISA=avx2 too): what a change to the codegen passes that must keep their output is checked against.

  python benchmarks/source_hashes.py > before.txt; ...; python benchmarks/source_hashes.py | diff before.txt -"""
import hashlib, os, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kc  # noqa: E402
from kc.api import optimize  # noqa: E402
from kc.ast.examples import EXAMPLES  # noqa: E402
from kc.schedule import schedule  # noqa: E402


def source_hash(k) -> str: return hashlib.sha256(k.to_program().src.encode()).hexdigest()[:16]


def main():
  for dev in ("CLANG", "LLVM", "OPENCL", "EMU"):
    if kc.Device.unavailable_reason(dev) is not None: continue
    r = kc.Device[dev].renderer
    for name, ex in EXAMPLES.items():
      kernels = schedule(ex.build()[0]).kernels  # a program of several kernels: a line per kernel, numbered
      for opts in ("none", "hand"):
        for i, k in enumerate(kernels):
          print(f"{dev}/{name}/{opts}" + (f"/{i}" if len(kernels) > 1 else ""), source_hash(optimize(kc.Kernel(k.ast, r), opts)))
  from bench_clang import kc_ast
  from clang_workloads import WORKLOADS
  for name, (_, _, shapes) in WORKLOADS.items():
    print(f"CLANG/workload/{name}/hand", source_hash(optimize(kc.Kernel(kc_ast(name, shapes), kc.Device["CLANG"].renderer), "hand")))
  if "--conformance" in sys.argv: conformance_hashes()


def conformance_hashes():
  from kc_conformance.corpus import CASES, setup_of
  from bench_compile import RENDERERS, build
  from compile_cases import CASES as COMPILE_CASES
  for name in sorted(CASES):
    kernels = schedule(setup_of(name).sink).kernels
    for rname, r in RENDERERS:
      for opts in ("none", "hand"):
        for i, k in enumerate(kernels):
          try: h = source_hash(optimize(kc.Kernel(k.ast, r), opts))
          except kc.KcError as e: h = f"refused {type(e).__name__}"
          print(f"conformance/{name}/{rname}/{opts}/{i}", h)
  for name, case in COMPILE_CASES.items():
    for rname, r in RENDERERS: print(f"compile/{name}/{rname}", source_hash(kc.Kernel(build(*case(3)), r).hand_coded_optimizations()))
  # the tensor-core and random-opts specs, on renderers with tensor cores (EMU's built-in ones, CUDA's where kc-cuda
  # is installed: its renderer needs no GPU) and on the vector dialects (CLANG's, LLVM's: random tiles of vectors)
  from kc_conformance.specs import SPECS, NotApplicable, optimized_kernel
  spec_renderers = [("EMU", kc.Device.renderer("EMU"))]
  try:
    from kc_cuda.renderer import CUDARenderer
    spec_renderers.append(("CUDA", CUDARenderer("sm_90")))
  except ImportError: pass
  spec_renderers += [(dev, kc.Device[dev].renderer) for dev in ("CLANG", "LLVM") if kc.Device.unavailable_reason(dev) is None]
  for name in sorted(CASES):
    kernels = schedule(setup_of(name).sink).kernels
    for rname, r in spec_renderers:
      for sname, spec in SPECS.items():
        if spec.kind not in ("tc", "random"): continue
        for i, k in enumerate(kernels):
          try: h = source_hash(optimized_kernel(k.ast, r, spec))
          except (kc.KcError, NotApplicable) as e: h = f"refused {type(e).__name__}"
          print(f"conformance/{name}/{rname}/{sname}/{i}", h)


if __name__ == "__main__": main()
