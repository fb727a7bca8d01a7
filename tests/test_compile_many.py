"""Compiler.compile_many: every source's binary (or its CompileError in its place) in the sources' order, the misses
built in batches of max_batch through compile_batch_uncached, hits read from the disk cache, and a batch that fails
built again source by source so one bad source never fails the others."""
import os
import pytest
from hypothesis import given, settings, strategies as st
from kc import CompileError
from kc.runtime.device import Compiler


class BatchingCompiler(Compiler):
  """A compiler whose sources named "bad..." do not compile; it records every batch and every single build."""
  max_batch = 3

  def __init__(self):
    super().__init__("kc-fake 0.1")
    self.batches: list[list[str]] = []
    self.singles: list[str] = []

  def identity(self): return "batching-cc 1.0"

  def compile_uncached(self, src):
    self.singles.append(src)
    if src.startswith("bad"): raise CompileError(f"cannot compile {src}", src=src)
    return f"BIN:{src}".encode()

  def compile_batch_uncached(self, srcs):
    self.batches.append(list(srcs))
    if any(s.startswith("bad") for s in srcs): raise CompileError("the batch does not build")
    return [f"BIN:{s}".encode() for s in srcs]


def test_misses_are_built_in_batches_and_hits_come_from_the_cache(cache_dir):
  c = BatchingCompiler()
  srcs = [f"k{i}" for i in range(7)]
  assert c.compile_many(srcs) == [f"BIN:{s}".encode() for s in srcs]
  assert c.batches == [["k0", "k1", "k2"], ["k3", "k4", "k5"]] and c.singles == ["k6"]  # a batch of one is a plain build
  again = BatchingCompiler()
  assert again.compile_many(srcs[::-1]) == [f"BIN:{s}".encode() for s in srcs[::-1]]
  assert again.batches == [] and again.singles == []  # another process finds every one in the cache
  assert again.compile("k3") == b"BIN:k3" and again.singles == []  # compile() reads what compile_many stored


def test_a_bad_source_gets_its_error_and_costs_only_its_batch(cache_dir):
  c = BatchingCompiler()
  got = c.compile_many(["k0", "bad1", "k2", "k3", "k4"])
  assert [g for i, g in enumerate(got) if i != 1] == [b"BIN:k0", b"BIN:k2", b"BIN:k3", b"BIN:k4"]
  assert isinstance(got[1], CompileError) and str(got[1]) == "cannot compile bad1"
  assert c.batches == [["k0", "bad1", "k2"], ["k3", "k4"]]
  assert c.singles == ["k0", "bad1", "k2"]  # only the failed batch is built again, one by one
  with pytest.raises(CompileError, match="cannot compile bad1"): BatchingCompiler().compile("bad1")  # no error is cached


def test_duplicates_are_built_once_and_answered_in_place(cache_dir):
  c = BatchingCompiler()
  assert c.compile_many(["a", "b", "a", "a"]) == [b"BIN:a", b"BIN:b", b"BIN:a", b"BIN:a"]
  assert c.batches == [["a", "b"]]


def test_without_a_cache_every_source_is_still_built(monkeypatch):
  monkeypatch.setenv("KC_CACHE_DIR", "")
  c = BatchingCompiler()
  assert c.compile_many(["a", "b"]) == [b"BIN:a", b"BIN:b"] and c.batches == [["a", "b"]]


def test_a_compiler_with_its_own_compile_is_asked_source_by_source(cache_dir):
  class OwnRules(BatchingCompiler):
    def compile(self, src):
      if not isinstance(src, str): raise CompileError("source must be a str")
      return b"OWN:" + src.encode()
  c = OwnRules()
  got = c.compile_many(["a", 3])
  assert got[0] == b"OWN:a" and isinstance(got[1], CompileError) and c.batches == []


def test_a_source_that_is_not_a_string_is_an_error_in_its_place(cache_dir):
  got = BatchingCompiler().compile_many(["a", b"bytes"])
  assert got[0] == b"BIN:a" and isinstance(got[1], CompileError) and "must be a str" in str(got[1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "bad1", "bad2"]), max_size=12), st.integers(1, 5))
def test_compile_many_answers_what_compile_answers(tmp_path_factory, srcs, max_batch):
  before = os.environ.get("KC_CACHE_DIR")
  os.environ["KC_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))  # a fresh cache per example
  try:
    c = BatchingCompiler()
    c.max_batch = max_batch
    got = c.compile_many(srcs)
    assert len(got) == len(srcs)
    for src, out in zip(srcs, got):
      if src.startswith("bad"): assert isinstance(out, CompileError) and str(out) == f"cannot compile {src}"
      else: assert out == f"BIN:{src}".encode()
    assert all(len(b) <= max_batch for b in c.batches)
  finally:
    if before is None: del os.environ["KC_CACHE_DIR"]
    else: os.environ["KC_CACHE_DIR"] = before
