"""plugins/metal/mac_check.py, the Mac smoke test: elsewhere it says why it cannot run and exits 0; its checks that
need only kc's Metal lowering (math, views, the bfloat simdgroup helper, launches) pass on EMU impersonating METAL,
so what a Mac reports is the Mac's own doing."""
import importlib.util, sys
from pathlib import Path
import pytest
import kc

SCRIPT = Path(__file__).parents[1] / "mac_check.py"


@pytest.fixture(scope="module")
def mac_check():
  spec = importlib.util.spec_from_file_location("mac_check", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules["mac_check"] = module  # dataclasses look their module up while the class is made
  spec.loader.exec_module(module)
  yield module
  del sys.modules["mac_check"]


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS it runs the checks")
def test_elsewhere_it_says_why_and_exits_cleanly(mac_check, capsys):
  assert mac_check.main(["--skip-conformance"]) == 0
  assert "nothing to check here: Metal needs macOS" in capsys.readouterr().out


@pytest.mark.parametrize("check", ["check_math", "check_views", "check_bfloat_simdgroup"])
def test_portable_checks_pass_on_emu_as_metal(mac_check, emu_metal, check):
  result = getattr(mac_check, check)("EMU")
  assert result.status == "PASS", result.detail


def test_the_views_check_expects_refusals_where_reads_misalign(mac_check, emu_metal):
  detail = mac_check.check_views("EMU").detail
  assert "int8@1: ran" in detail and "float32x4@4: refused ArgumentError" in detail and "int64@4: refused" in detail


def test_the_launch_check_measures(mac_check, emu_metal):
  result = mac_check.check_launches("EMU", 200)
  assert result.status == "PASS" and "over 200 launches" in result.detail


def test_a_failed_check_is_reported_and_counted(mac_check, capsys):
  def broken(): raise kc.KcError("no")
  assert mac_check.run_checks([("fine", lambda: mac_check.Result("PASS", "ok")), ("broken", broken)]) == 1
  out = capsys.readouterr().out
  assert "FAIL broken: KcError: no" in out and "1 of 2 checks failed" in out
