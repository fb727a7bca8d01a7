"""The distributions as they would be published: names PyPI leaves free (the core is kc-core, imported as kc), SPDX
license strings with the license file shipped, classifiers, a lower bound on every dependency, plugins depending on
the core's series, and READMEs (PyPI pages) without links that only work inside the repository. CI builds each one,
runs twine check and installs the wheels into a fresh venv (.ci/run)."""
import re, tomllib
from pathlib import Path
import pytest
import kc
from kc.helpers import distribution_version

REPO = Path(__file__).resolve().parent.parent
PROJECTS = [REPO, *sorted(p for p in (REPO / "plugins").iterdir() if (p / "pyproject.toml").exists()), REPO / "conformance"]


def _project(folder: Path) -> dict: return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


def _requirements(project: dict) -> list[str]:
  reqs = list(project.get("dependencies", []))
  for extra in project.get("optional-dependencies", {}).values(): reqs += extra
  return reqs


@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_metadata_is_ready_to_publish(folder):
  project = _project(folder)
  assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]  # SPDX, not the deprecated table
  assert (folder / "LICENSE").read_text() == (REPO / "LICENSE").read_text()
  assert "Copyright (c) 2026 the kc authors" in (REPO / "LICENSE").read_text()
  classifiers = project["classifiers"]
  assert "Programming Language :: Python :: 3" in classifiers and not any(c.startswith("License ::") for c in classifiers)
  requires = tomllib.loads((folder / "pyproject.toml").read_text())["build-system"]["requires"]
  assert requires == ["setuptools>=77"]  # the first setuptools that writes SPDX license expressions


@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_every_dependency_has_a_lower_bound(folder):
  for req in _requirements(_project(folder)):
    spec = req.split(";")[0]
    assert re.search(r">=\s*\d", spec), f"{folder.name}: {req!r} has no lower bound"


def test_plugins_depend_on_the_core_series():
  assert _project(REPO)["name"] == "kc-core"
  for folder in PROJECTS[1:]:
    deps = _project(folder)["dependencies"]
    assert "kc-core>=0.1,<0.2" in deps and not any(re.match(r"kc\s*[<>=]", d) for d in deps), folder.name


def test_the_core_names_its_own_distribution():
  assert kc.__version__ == distribution_version("kc-core") != "0.0.0+unknown"
  assert kc.Device.spec("EMU").distribution == "kc-core"
  stale = [f"{p.relative_to(REPO)}:{n}" for p in (REPO / "core" / "kc").rglob("*.py")
           for n, line in enumerate(p.read_text().splitlines(), 1) if 'distribution_version("kc")' in line]
  assert not stale, f"distribution_version of the old name 'kc': {stale}"


@pytest.mark.parametrize("folder", PROJECTS, ids=lambda p: p.name)
def test_readmes_link_nothing_relative(folder):
  # a README is its distribution's PyPI page, where a relative link leads nowhere: links are absolute URLs only
  text = (folder / _project(folder)["readme"]).read_text()
  links = re.findall(r"\]\(([^)]+)\)", text) + re.findall(r'(?:href|src)="([^"]+)"', text)
  assert not [link for link in links if not re.match(r"https?://", link)], folder.name


def test_the_docs_the_readme_names_ship_in_the_sdist():
  manifest = (REPO / "MANIFEST.in").read_text()
  assert "recursive-include docs *.md" in manifest
  named = set(re.findall(r"docs/(\w+\.md)", (REPO / "README.md").read_text()))
  assert "EMBEDDING.md" in named and all((REPO / "docs" / name).exists() for name in named)
