"""The settings registry (cyback/kernels/settings.py): every environment
variable read anywhere in cyback/, include/ or setup.py is declared there, each
declaration names the files that really read it, values are checked by one
policy, and the committed configuration page is what the registry generates."""
import math
import os
import pathlib
import re

import pytest

from cyback.kernels import settings
from cyback.kernels._checks import ConfigWarning

ROOT = pathlib.Path(__file__).resolve().parents[2]

_NAME = r"[A-Z][A-Z0-9_]*\*?[A-Z0-9_]*"
_Q = r"""["'](%s)["']""" % _NAME
# The ways source text names an environment variable it reads or sets.
_READS = [
    re.compile(r"environ\s*\[\s*" + _Q),                                 # environ["X"]
    re.compile(r"environ\s*\.\s*(?:get|pop|setdefault)\(\s*" + _Q),     # environ.get("X")
    re.compile(r"getenv\(\s*" + _Q),                                     # getenv("X"), C too
    re.compile(_Q + r"\s+(?:not\s+)?in\s+(?:os\.)?environ\b"),           # "X" in environ
    re.compile(r"environ\s*,\s*" + _Q),                                  # helper(environ, "X")
    # k.startswith("X") ... for k in environ
    re.compile(r"startswith\(\s*" + _Q + r"\)[^\n]*\benviron\b"),
    # the registry's readers: settings.get("X"), raw("X"), is_set("X"), ...
    re.compile(r"\b(?:get|raw|is_set|matching|setting|problem)\(\s*" + _Q),
    re.compile(r"""["'](CYBACK_[A-Z0-9_]+)["']"""),                      # any "CYBACK_X" literal
]
_ENV_DICT = re.compile(r"dict\(\s*(?:os\.)?environ\s*,")                 # dict(os.environ, X=...)


def _dict_keywords(text, start):
    """The keyword names at the top level of the call whose arguments begin at
    ``start`` (just after ``dict(os.environ,``)."""
    depth, names, i = 1, [], start
    token = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)")
    m = token.match(text, i)
    if m:
        names.append(m.group(1))
    while i < len(text) and depth:
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 1:
            m = token.match(text, i + 1)
            if m:
                names.append(m.group(1))
        i += 1
    return names


def environment_reads(text):
    """[(line number, variable)] for every environment variable ``text`` names
    where it reads or sets one."""
    found = set()
    for pattern in _READS:
        for m in pattern.finditer(text):
            found.add((text.count("\n", 0, m.start()) + 1, m.group(1)))
    for m in _ENV_DICT.finditer(text):
        for name in _dict_keywords(text, m.end()):
            found.add((text.count("\n", 0, m.start()) + 1, name))
    return sorted(found)


def source_files():
    """cyback's sources (not the C the build generates from the .pyx), the
    headers and setup.py; the registry itself is the declaration."""
    files = [ROOT / "setup.py"] + sorted((ROOT / "include").glob("*.h"))
    for ext in ("py", "pyx", "pxd", "pxi"):
        files += sorted((ROOT / "cyback").rglob("*." + ext))
    return [f for f in files if f.name != "settings.py" or f.parent.name != "kernels"]


def all_reads():
    reads = []
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, name in environment_reads(path.read_text(encoding="utf-8")):
            reads.append((rel, line, name))
    return reads


def test_the_scanner_finds_every_form_of_read():
    src = '\n'.join([
        'a = os.environ["ONE_A"]',
        'b = os.environ.get("TWO_B", "1")',
        'c = os.getenv("THREE_C")',
        'const char *e = getenv("FOUR_D");',
        'if "FIVE_E" not in os.environ: pass',
        'x = _env_window(environ, "SIX_F")',
        'env = dict(os.environ, SEVEN_G=str(n), EIGHT_H=":".join([a, f(b)]), ',
        '           NINE_I="1")',
        'settings.get("TEN_J")',
        'raw("ELEVEN_K", environ)',
        'helper("CYBACK_TWELVE")',
        'any(k.startswith("THIRTEEN_") for k in environ)',
        'environ.setdefault("FOURTEEN_N", "3")',
        'x = {"NOT_A_VARIABLE": 1}["NOT_A_VARIABLE"]',
        'os.environ["OMP_WAIT_POLICY"] = "PASSIVE"',
    ])
    names = {name for _, name in environment_reads(src)}
    assert names == {"ONE_A", "TWO_B", "THREE_C", "FOUR_D", "FIVE_E", "SIX_F", "SEVEN_G",
                     "EIGHT_H", "NINE_I", "TEN_J", "ELEVEN_K", "CYBACK_TWELVE", "THIRTEEN_",
                     "FOURTEEN_N", "OMP_WAIT_POLICY"}
    assert (7, "SEVEN_G") in environment_reads(src)


def test_the_scan_covers_the_sources():
    rels = {p.relative_to(ROOT).as_posix() for p in source_files()}
    assert {"setup.py", "include/cyback_omp.h", "include/cyback_simd.h",
            "cyback/kernels/runtime.pyx", "cyback/kernels/conv.pyx", "cyback/config.py",
            "cyback/dask/resources.py"} <= rels
    assert not any(r.endswith((".c", ".cpp")) for r in rels)
    assert len({name for _, _, name in all_reads()}) >= 20


def test_every_environment_variable_read_is_declared():
    undeclared = ["%s:%d reads %s" % r for r in all_reads() if not settings.declared(r[2])]
    assert not undeclared, ("declare these in cyback/kernels/settings.py:\n"
                            + "\n".join(undeclared))


def _declaration(name):
    if name in settings.SETTINGS:
        return settings.SETTINGS[name]
    return next(s for s in settings.SETTINGS.values()
                if s.is_pattern and name.startswith(s.prefix))


def test_every_file_that_reads_a_setting_is_among_its_readers():
    missing = ["%s:%d reads %s, not among its readers %s"
               % (rel, line, name, list(_declaration(name).readers))
               for rel, line, name in all_reads()
               if settings.declared(name) and rel not in _declaration(name).readers]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("s", list(settings.SETTINGS.values()), ids=lambda s: s.name)
def test_each_declared_reader_reads_it(s):
    assert s.readers and s.summary and s.group in settings.GROUPS
    for rel in s.readers:
        path = ROOT / rel
        assert path.is_file(), "%s: reader %s does not exist" % (s.name, rel)
        assert s.prefix in path.read_text(encoding="utf-8"), \
            "%s is declared as read by %s, which does not mention it" % (s.name, rel)


def test_declared_defaults_are_values_of_the_declared_type():
    for s in settings.SETTINGS.values():
        if s.default is None or s.is_pattern:
            continue
        if s.kind == "int":
            assert s.minimum <= s.default <= s.maximum, s.name
        elif s.kind == "float":
            assert math.isfinite(s.default) and s.default >= s.minimum, s.name
        elif s.kind == "choice":
            assert s.default in [s.values.get(c, c) for c in s.choices], s.name


def test_max_threads_agrees_with_the_runtime():
    from cyback.kernels import runtime
    assert settings.MAX_THREADS == runtime.MAX_THREADS


def test_values_and_defaults():
    get = settings.get
    assert get("CYBACK_NUM_THREADS", {}) is None
    assert get("CYBACK_NUM_THREADS", {"CYBACK_NUM_THREADS": " 3 "}) == 3
    assert get("CYBACK_NUM_THREADS", {"CYBACK_NUM_THREADS": ""}) is None
    assert get("CYBACK_BLAS_THREADS", {}) == 1
    assert get("CYBACK_PARALLEL_MIN_WORK", {}) == 1e6
    assert get("CYBACK_PARALLEL_MIN_WORK", {"CYBACK_PARALLEL_MIN_WORK": "2.5e5"}) == 2.5e5
    assert get("CYBACK_PARALLEL_MIN_WORK", {"CYBACK_PARALLEL_MIN_WORK": "0"}) == 0
    assert get("CYBACK_WINOGRAD", {"CYBACK_WINOGRAD": "0"}) is False
    assert get("CYBACK_WINOGRAD", {"CYBACK_WINOGRAD": ""}) is True
    assert get("CYBACK_SGEMM", {"CYBACK_SGEMM": " NumPy "}) == "numpy"
    assert get("CYBACK_RESIZE_HALF_PIXEL_CENTERS", {"CYBACK_RESIZE_HALF_PIXEL_CENTERS": "Yes"})
    assert get("GOMP_SPINCOUNT", {"GOMP_SPINCOUNT": "2k"}) == 2000
    assert get("GOMP_SPINCOUNT", {"GOMP_SPINCOUNT": "1.5M"}) == 1.5e6
    assert get("GOMP_SPINCOUNT", {"GOMP_SPINCOUNT": "infinite"}) == math.inf
    assert get("MALLOC_*_", {"MALLOC_ARENA_MAX_": "2", "MALLOC": "x", "OTHER_": "y"}) == \
        {"MALLOC_ARENA_MAX_": "2"}
    assert get("KERAS_HOME", {"KERAS_HOME": "/somewhere"}) == "/somewhere"
    assert settings.is_set("KERAS_HOME", {"KERAS_HOME": "  "}) is False
    assert settings.raw("KERAS_HOME", {}) is None


def test_a_flag_is_off_for_0_false_and_no_and_on_for_anything_else(recwarn):
    name = "CYBACK_RESIZE_HALF_PIXEL_CENTERS"
    for text, on in [("0", False), (" False ", False), ("NO", False), ("", False),
                     ("1", True), ("yes", True), ("on", True), ("2", True)]:
        assert settings.get(name, {name: text}) is on, text
    assert settings.get(name, {}) is False
    assert not [w for w in recwarn if issubclass(w.category, ConfigWarning)]


@pytest.mark.parametrize("name,value,message", [
    ("CYBACK_NUM_THREADS", "two", "CYBACK_NUM_THREADS must be an integer from 1 to 4096, "
                                  "got 'two'; using the default"),
    ("CYBACK_NUM_THREADS", "0", "must be an integer from 1"),
    ("CYBACK_NUM_THREADS", "4097", "must be an integer from 1"),
    ("CYBACK_BLAS_THREADS", "1.5", r"CYBACK_BLAS_THREADS must be .*using the default \(1\)"),
    ("CYBACK_PARALLEL_MIN_WORK", "abc", "must be a finite non-negative number of work units"),
    ("CYBACK_PARALLEL_MIN_WORK", "-1", "must be a finite non-negative"),
    ("CYBACK_PARALLEL_MIN_WORK", "nan", "must be a finite non-negative"),
    ("CYBACK_PARALLEL_MIN_WORK", "", "must be a finite non-negative"),
    ("CYBACK_TEAM_WARM_US", "inf", "must be a finite non-negative number of microseconds"),
    ("CYBACK_JOIN_US", "soon", "must be a finite non-negative number of microseconds"),
    ("CYBACK_WINOGRAD", "yes", r"CYBACK_WINOGRAD must be 0 or 1, got 'yes'; using the "
                               r"default \(1\)"),
    ("CYBACK_SGEMM", "mkl", "CYBACK_SGEMM must be one of auto, scipy, numpy, got 'mkl'"),
    ("CYBACK_MALLOC", "never", "CYBACK_MALLOC must be kept or system"),
])
def test_a_bad_value_warns_and_gives_the_default(name, value, message):
    with pytest.warns(ConfigWarning, match="^cyback: .*" + message):
        got = settings.get(name, {name: value})
    assert got == settings.setting(name).default


def test_other_programs_variables_are_never_warned_about(recwarn):
    assert settings.get("GOMP_SPINCOUNT", {"GOMP_SPINCOUNT": "junk"}) is None
    assert settings.get("OMP_WAIT_POLICY", {"OMP_WAIT_POLICY": "sometimes"}) is None
    assert settings.get("OMP_WAIT_POLICY", {"OMP_WAIT_POLICY": "ACTIVE"}) == "active"
    assert not [w for w in recwarn if issubclass(w.category, ConfigWarning)]


def test_remove_bad_deletes_bad_values_only():
    env = {"CYBACK_PARALLEL_MIN_WORK": "abc", "CYBACK_JOIN_US": "50", "CYBACK_AVX512": "off"}
    with pytest.warns(ConfigWarning) as record:
        removed = settings.remove_bad(["CYBACK_PARALLEL_MIN_WORK", "CYBACK_JOIN_US",
                                       "CYBACK_AVX512", "CYBACK_WINOGRAD"], env)
    assert removed == ["CYBACK_PARALLEL_MIN_WORK", "CYBACK_AVX512"]
    assert env == {"CYBACK_JOIN_US": "50"}
    assert len(record) == 2 and "CYBACK_AVX512 must be 0 or 1, got 'off'" in str(record[1].message)


def test_undeclared_names_are_refused():
    with pytest.raises(KeyError, match="CYBACK_NOPE.*declare it"):
        settings.get("CYBACK_NOPE", {})
    assert not settings.declared("CYBACK_NOPE")
    assert settings.declared("MALLOC_TOP_PAD_")


def test_the_configuration_page_is_up_to_date():
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text(encoding="utf-8") == settings.markdown(), \
        "docs/configuration.md is out of date: run python -m cyback settings --write-docs"


def test_the_page_names_every_setting_and_its_anchor():
    text = settings.markdown()
    for s in settings.SETTINGS.values():
        assert "### `%s`" % s.name in text
        assert "(#%s)" % settings._anchor(s.name) in text
    # the cutoff's unit is said once, truthfully: mixed, per kernel family
    section = text.split("### `CYBACK_PARALLEL_MIN_WORK`")[1].split("### ")[0]
    assert "work units" in section
    for family in ("element-wise", "convolutions", "matrix products", "pooling", "softmax",
                   "reductions", "recurrent", "CTC"):
        assert family in section, family


def test_the_command_writes_and_checks_the_page(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    assert settings.main(["--check", "-o", str(out)]) == 1
    assert settings.main(["-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == settings.markdown()
    assert settings.main(["--check", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out


def test_config_reads_threads_through_the_registry(monkeypatch):
    # a bad value of a setting the kernels read themselves is removed, so that
    # the kernels take their default (the policy), and said once
    monkeypatch.setenv("CYBACK_AVX512", "off")
    from cyback.kernels import process
    with pytest.warns(ConfigWarning, match="CYBACK_AVX512 must be 0 or 1"):
        process.remove_bad_kernel_settings()
    assert "CYBACK_AVX512" not in os.environ
