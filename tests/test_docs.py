"""The documentation site (mkdocs.yml, docs/): the API reference page lists
every backend function and is what docs/gen_api_page.py generates, the
navigation names pages that exist, and (where MkDocs is installed, as in CI)
the site builds in strict mode."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

import cyback

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_api_page", DOCS / "gen_api_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_page_is_up_to_date():
    gen = _generator()
    assert (DOCS / "api.md").read_text(encoding="utf-8") == gen.page(), \
        "docs/api.md is out of date: run python docs/gen_api_page.py"
    assert gen.main(["--check"]) == 0


def test_the_api_page_lists_the_161_backend_functions_once_each():
    names = _generator().names()
    assert len(names) == 161 and len(set(names)) == 161
    entries = re.findall(r"^::: cyback\.(\w+)$", (DOCS / "api.md").read_text(), re.M)
    assert entries == names
    for name in names:
        assert callable(getattr(cyback, name, None)), "cyback.%s is not a function" % name


def test_the_api_page_follows_the_api_contract():
    contract = ROOT.parent / "shared" / "API.md"
    if not contract.is_file():
        pytest.skip("shared/API.md is not beside this checkout")
    listed = re.findall(r"^- `([A-Za-z_0-9]+)", contract.read_text(encoding="utf-8"), re.M)
    assert _generator().names() == listed


def _nav_pages():
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text.split("\nnav:\n", 1)[1]
    return re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.M)


def test_the_navigation_names_pages_that_exist():
    pages = _nav_pages()
    assert pages[0] == "index.md" and {"api.md", "configuration.md"} <= set(pages)
    for page in pages:
        assert (DOCS / page).is_file(), "mkdocs.yml names docs/%s, which does not exist" % page


def test_the_site_builds_strictly(tmp_path):
    mkdocs = pathlib.Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        pytest.skip("MkDocs is not installed here (pip install '.[docs]')")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    out = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path)],
                         cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    html = (tmp_path / "api" / "index.html").read_text(encoding="utf-8")
    assert len(set(re.findall(r'id="cyback\.(\w+)"', html))) == 161
