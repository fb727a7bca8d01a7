import subprocess, sys
import kc


def test_version_and_simplify_demo():
  out = subprocess.run([sys.executable, "-m", "kc.tools.cli", "simplify", "(x*4+y)//4 + (x*4+y)%4", "--var", "x=0:100", "--var", "y=0:3"],
                       capture_output=True, text=True, check=True).stdout
  assert "simplified: (x+y)" in out and "range:      [0, 103]" in out
  assert kc.__version__ != "0.0.0+unknown"


def test_cli_reports_unknown_variable_as_error():
  r = subprocess.run([sys.executable, "-m", "kc.tools.cli", "simplify", "z+1"], capture_output=True, text=True)
  assert r.returncode == 2 and "unknown variable 'z'" in r.stderr
