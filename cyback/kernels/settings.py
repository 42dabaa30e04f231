"""Every setting cyback reads, in one place: what it is, its type, default and
range, when it is read, and the one way to read and validate it.

It lives in ``cyback.kernels``, the lowest layer, because the kernels,
``cyback.config`` and everything above them read settings; like the rest of
the kernels it imports nothing from cyback outside ``cyback.kernels``, and
nothing compiled, so that the documentation can be generated without a
build.

Reading a setting::

    from cyback.kernels import settings
    threads = settings.get("CYBACK_NUM_THREADS")      # an int, or None when unset

A value that cannot be used is a ``ConfigWarning`` naming the variable, the
value and the default used instead, and ``get`` returns the default: settings
are read at import (Keras imports cyback), and a typo in a tuning variable
must not stop a service from starting. The same values given in code
(``set_num_threads(0)``, ...) raise ``ValueError``; that is each setter's
business (docs/threads.md). Variables that belong to another program (OpenMP,
glibc, Keras) are read the same way but never warned about: their owner
decides what a value means.

``python -m cyback settings --write-docs`` writes the documentation's
configuration page (docs/configuration.md) from the declarations below
(``main``); ``--check`` fails when the page is out of date.
"""
import math
import os
import sys

from cyback.kernels._checks import setting_warning

#: The most threads a setting may ask for (kernels/runtime.pyx's MAX_THREADS;
#: tests/kernels/test_settings.py checks that the two agree).
MAX_THREADS = 4096

# When a setting is read.
IMPORT = "at import"
FIRST_USE = "at first use"
PER_CALL = "at every call"
BUILD = "when the kernels are built"
TESTS = "by the test suite"
PASSED_ON = "when a child process starts"

# Whose setting it is.
CYBACK = "cyback"
OPENMP = "OpenMP (libgomp)"
GLIBC = "glibc"
KERAS = "Keras"
PYTHON = "Python"
TENSORFLOW = "TensorFlow"


class Setting(object):
    """One declared setting; ``parse(text)`` gives its value or raises
    ValueError with what it must be."""

    __slots__ = ("name", "kind", "default", "default_text", "minimum", "maximum", "choices",
                 "values", "empty_is_unset", "unit", "read", "readers", "owner", "group",
                 "in_code", "summary", "details")

    def __init__(self, name, kind, default, summary, *, group, read, readers, owner=CYBACK,
                 default_text=None, minimum=None, maximum=None, choices=None, values=None,
                 empty_is_unset=True, unit=None, in_code=None, details=""):
        self.name = name
        self.kind = kind                # int, float, choice, flag, spin, text, pattern
        self.default = default
        self.default_text = default_text
        self.minimum, self.maximum = minimum, maximum
        self.choices = tuple(choices) if choices else ()
        self.values = dict(values) if values else {}
        self.empty_is_unset = empty_is_unset
        self.unit = unit
        self.read = read
        self.readers = tuple(readers)
        self.owner = owner
        self.group = group
        self.in_code = in_code
        self.summary = summary
        self.details = details

    def __repr__(self):
        return "Setting(%r)" % self.name

    @property
    def is_pattern(self):
        return self.kind == "pattern"

    @property
    def prefix(self):
        """``MALLOC_`` for the pattern ``MALLOC_*_``; the name itself otherwise."""
        return self.name.split("*")[0] if self.is_pattern else self.name

    def expects(self):
        """What a value must be, as the warning says it."""
        if self.kind == "int":
            return "an integer from %d to %d" % (self.minimum, self.maximum)
        if self.kind == "float":
            what = "a finite non-negative number" if self.minimum == 0 else \
                "a finite number of at least %g" % self.minimum
            return what + (" of %s" % self.unit if self.unit else "")
        if self.kind == "choice":
            if len(self.choices) == 2:
                return "%s or %s" % self.choices
            return "one of " + ", ".join(self.choices)
        if self.kind == "flag":
            return "%s for off, anything else for on" % ", ".join(_FLAG_OFF)
        if self.kind == "spin":
            return "a number of rounds (with an optional k, M, G or T suffix) or 'infinite'"
        return "a string"

    def parse(self, text):
        """The value of ``text`` (the variable is set); ValueError if bad."""
        value = text.strip()
        if self.kind == "int":
            try:
                n = int(value)
            except ValueError:
                raise ValueError(self.expects()) from None
            if not self.minimum <= n <= self.maximum:
                raise ValueError(self.expects())
            return n
        if self.kind == "float":
            try:
                x = float(value)
            except ValueError:
                raise ValueError(self.expects()) from None
            if not (math.isfinite(x) and x >= self.minimum):
                raise ValueError(self.expects())
            return x
        if self.kind == "choice":
            key = value.lower()
            if key not in self.choices:
                raise ValueError(self.expects())
            return self.values.get(key, key)
        if self.kind == "flag":
            return value.lower() not in _FLAG_OFF
        if self.kind == "spin":
            return _spin_rounds(value)
        return text

    def default_str(self):
        if self.default_text is not None:
            return self.default_text
        if self.kind == "choice" and self.default is not None:
            for k, v in self.values.items():
                if v == self.default:
                    return k
        if isinstance(self.default, float):
            return "%g" % self.default
        return "unset" if self.default is None else str(self.default)


def _spin_rounds(value):
    # libgomp's GOMP_SPINCOUNT: a count, optionally scaled by k/M/G/T, or
    # 'infinite' (inf: spin forever).
    lower = value.lower()
    if lower in ("infinite", "infinity"):
        return math.inf
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(lower[-1:])
    try:
        count = float(lower[:-1]) * scale if scale else float(lower)
    except ValueError:
        raise ValueError("a number of rounds (with an optional k, M, G or T suffix) "
                         "or 'infinite'") from None
    if not math.isfinite(count):
        raise ValueError("a finite number of rounds or 'infinite'")
    return max(0.0, count)


_ON_OFF = {"0": False, "1": True}
#: What a "flag" setting takes for off (blank is unset: its default); any
#: other value is on.
_FLAG_OFF = ("0", "false", "no")

# What each kernel family counts as its work (the threads_for calls of the .pyx).
_WORK_COUNTED = [
    ("element-wise programs (fused arithmetic)",
     "4 per element per instruction (the float32 bytes each instruction touches)"),
    ("reductions (`sum`, `mean`, `max`, ...)", "the input's bytes"),
    ("softmax", "10 per element"),
    ("pooling", "forward: output elements x (window + 1); backward: input elements + 4 x "
                "output-gradient elements x window"),
    ("convolutions (im2col, direct, Winograd, 1x1)",
     "their GEMM flops / 8 (a flop of a convolution is about 8 times cheaper than a byte "
     "moved)"),
    ("depthwise convolutions", "their flops; their layout transposes half an element each"),
    ("matrix products (`dot`, Dense)",
     "a quarter of the flops; for products of at most 4 rows, the right operand's element "
     "count (such a product streams it once)"),
    ("`batch_dot`", "its flops"),
    ("locally connected layers", "bytes moved; their per-position products, flops"),
    ("recurrent layers (the fused step loop)",
     "the sequence's flops; the split of the recurrent product, its weight bytes x steps / 16"),
    ("CTC beam search", "20 x input steps x beam width x (classes + 1)"),
]

_WORK_UNIT = """\
The cutoff is in *work units*, cyback's estimate of what a kernel call costs
on one thread, on the scale of one byte moved through memory. Each kernel
family converts its work to that scale in its own way, so the unit is a
common currency rather than a physical count:

| kernels | work counted |
| --- | --- |
""" + "".join("| %s | %s |\n" % row for row in _WORK_COUNTED) + """
A kernel whose work is below the cutoff runs on the calling thread when the
team is asleep; a team still awake from the previous op (within the warm
window, `CYBACK_TEAM_WARM_US`) takes work from a quarter of the cutoff, and
a run of ops arriving back to back takes the team once their work adds up to
the cutoff. While other processes take this process's cores, only work from
16 times the cutoff takes the team. Matrix products are cut into as many
pieces as the thread setting from a quarter of the cutoff on, so this value
also moves the size from which their last bits depend on the thread count
([threads](threads.md)). `0` runs every parallel path on the team (the test
suite does this).
"""

_DECLARED = [
    # ------------------------------------------------------------ threads
    Setting(
        "CYBACK_NUM_THREADS", "int", None,
        "Threads for cyback's kernels, for the whole process.",
        group="Threads", read=IMPORT, minimum=1, maximum=MAX_THREADS, unit="threads",
        readers=("cyback/config.py", "cyback/dask/resources.py", "cyback/__main__.py",
                 "cyback/bench/scripts.py"),
        default_text="the CPUs this process may use",
        in_code="cyback.set_num_threads(n)",
        details="Without it cyback takes `OMP_NUM_THREADS` when that is set, else the "
                "CPUs of the process's affinity mask, capped by a container's CPU quota "
                "(rounded up). Every Python thread takes the count at its next kernel call. "
                "`cyback.dask` leaves a worker's count alone when this is set in the "
                "worker's environment. See [threads](threads.md)."),
    Setting(
        "CYBACK_BLAS_THREADS", "int", 1,
        "Threads of the BLAS libraries (SciPy's and NumPy's OpenBLAS).",
        group="Threads", read=IMPORT, minimum=1, maximum=MAX_THREADS, unit="threads",
        readers=("cyback/config.py",),
        details="cyback's own parallelism is OpenMP and it holds BLAS at one thread, "
                "because two thread pools on the same cores slow each other down. A "
                "program whose own NumPy products matter more than cyback's can give "
                "BLAS more threads with this."),
    Setting(
        "CYBACK_PARALLEL_MIN_WORK", "float", 1e6,
        "The work below which a kernel keeps a call on the calling thread instead of "
        "waking the thread team.",
        group="Threads", read=IMPORT, minimum=0, unit="work units",
        empty_is_unset=False, default_text="1e6",
        readers=("cyback/config.py", "cyback/kernels/process.py"),
        details=_WORK_UNIT),
    Setting(
        "CYBACK_TEAM_WARM_US", "float", None,
        "Microseconds after a parallel region during which the thread team counts as "
        "awake (at most one second).",
        group="Threads", read=IMPORT, minimum=0, unit="microseconds",
        empty_is_unset=False,
        readers=("cyback/config.py", "cyback/kernels/process.py", "cyback/kernels/runtime.pyx"),
        default_text="the time libgomp's idle threads spin (from `GOMP_SPINCOUNT` or "
                     "`OMP_WAIT_POLICY`)",
        details="Within this window work from a quarter of `CYBACK_PARALLEL_MIN_WORK` "
                "takes the team, and back-to-back ops count as one run. `0` turns both "
                "rules off: only work above the cutoff takes the team."),
    Setting(
        "CYBACK_JOIN_US", "float", 300.0,
        "Microseconds a thread done with its part of a region spins for the others "
        "before OpenMP's barrier takes over (at most one second).",
        group="Threads", read=IMPORT, minimum=0, unit="microseconds",
        empty_is_unset=False,
        readers=("cyback/config.py", "cyback/kernels/process.py", "cyback/kernels/runtime.pyx"),
        details="`0` leaves every wait to OpenMP. While other processes take this "
                "process's cores the spin is skipped whatever this says."),
    # ------------------------------------------------------------ kernels
    Setting(
        "CYBACK_WINOGRAD", "choice", True,
        "`0` turns off Winograd F(2x2, 3x3) for 3x3 stride-1 float32 convolutions.",
        group="Kernels", read=IMPORT, choices=("0", "1"), values=_ON_OFF,
        readers=("cyback/kernels/process.py", "cyback/kernels/conv_tuning.pxi"),
        details="With it off such convolutions sum their taps directly: slower on many "
                "channels, and their results differ from Winograd's in the last bits."),
    Setting(
        "CYBACK_AVX512", "choice", True,
        "`0` caps the vector kernels at AVX2 + FMA on CPUs with AVX-512F.",
        group="Kernels", read=IMPORT, choices=("0", "1"), values=_ON_OFF,
        readers=("cyback/kernels/process.py", "cyback/kernels/conv_direct.pxi",
                 "cyback/kernels/depthwise.pyx", "cyback/kernels/linalg.pyx",
                 "cyback/kernels/rnn_cell.pyx", "cyback/kernels/winograd.pyx",
                 "cyback/kernels/qgemm.pyx", "cyback/kernels/softmax.pyx",
                 "cyback/kernels/ewise.pyx", "cyback/kernels/pool.pyx",
                 "cyback/kernels/attention.pyx", "cyback/kernels/reduce.pyx"),
        details="For hosts where 512-bit code lowers the clock of other work (the "
                "quantized products then stop at AVX-VNNI). CPUs without AVX-512F never "
                "run the AVX-512 kernels."),
    Setting(
        "CYBACK_SGEMM", "choice", "auto",
        "Which OpenBLAS the kernels' float32 matrix products call.",
        group="Kernels", read=FIRST_USE, choices=("auto", "scipy", "numpy"),
        readers=("cyback/kernels/blas_threads.py",),
        details="`scipy`: SciPy's (through `scipy.linalg.cython_blas`); `numpy`: "
                "NumPy's; `auto`: NumPy's when it is the newer OpenBLAS. Read when the "
                "BLAS libraries are first loaded, during `import cyback`. "
                "`python -m cyback info` says which one runs."),
    # ------------------------------------------------------------ memory
    Setting(
        "CYBACK_MALLOC", "choice", "kept",
        "`system` keeps the C library's allocator settings.",
        group="Memory", read=IMPORT, choices=("kept", "system"),
        readers=("cyback/kernels/memory.py",),
        details="By default, with glibc, cyback raises the allocator's mmap threshold to "
                "32 MiB and its trim threshold to 256 MiB, so that the large arrays a "
                "compiled function frees stay in the process for its next call instead "
                "of being unmapped and page-faulted back in; blocks above 32 MiB, which "
                "glibc always unmaps, are kept by cyback's own cache (up to 512 MiB) "
                "while a compiled function runs. The price is up to 256 MiB plus 512 MiB "
                "kept after a peak. Any glibc malloc setting of your own "
                "(`GLIBC_TUNABLES` with a `glibc.malloc.` tunable, `MALLOC_*_` "
                "variables) also keeps the defaults."),
    # ------------------------------------------------------------ graph and API
    Setting(
        "CYBACK_OPTIMIZE", "choice", True,
        "`0` turns the plan optimizer off: compiled functions run the graph as written.",
        group="Graphs", read=IMPORT, choices=("0", "1"), values=_ON_OFF,
        readers=("cyback/graph/optimize.py",), in_code="cyback.set_graph_optimizer(False)",
        details="See [the optimizer](optimizer.md)."),
    Setting(
        "CYBACK_BIND_STEPS", "choice", True,
        "`0` keeps compiled functions on their plain plans: no step is bound to its "
        "kernel's prepared call.",
        group="Graphs", read=IMPORT, choices=("0", "1"), values=_ON_OFF,
        readers=("cyback/graph/binding.py",),
        in_code="cyback.graph.binding.set_enabled(False)",
        details="An inference function called twice in a row on inputs of the same shapes "
                "binds its steps: later calls of those shapes run each convolution, "
                "pooling and packed product through the kernel call its op would reach "
                "through a few layers of Python checks, with the same results to the bit. "
                "See [the optimizer](optimizer.md)."),
    Setting(
        "CYBACK_RESIZE_HALF_PIXEL_CENTERS", "flag", False,
        "`1` makes bilinear `resize_images` sample at pixel centres, as TF 2's "
        "`tf.image.resize` does.",
        group="Graphs", read=IMPORT, default_text="0",
        readers=("cyback/api/manip.py",),
        in_code="cyback.set_resize_half_pixel_centers(True)",
        details="Off by default (TF 1's `resize_bilinear`, which Keras 2.3.1's "
                "TensorFlow backend calls); for models trained with TF 2. "
                "Any value other than empty, 0, false or no is on. See [Keras](keras.md)."),
    # ------------------------------------------------------------ Keras
    Setting(
        "KERAS_HOME", "text", None,
        "The folder holding `keras.json`.",
        group="Keras", read=IMPORT, owner=KERAS,
        readers=("cyback/config.py", "cyback/__main__.py", "cyback/cli.py"),
        default_text="`~/.keras` (`/tmp/.keras` when the home folder is not writable)",
        details="cyback reads `floatx`, `epsilon` and `image_data_format` from "
                "`keras.json` at import (a bad value is a `ConfigWarning` and the "
                "default, like the variables here); `python -m cyback "
                "set-default-backend` writes its `backend`."),
    Setting(
        "KERAS_BACKEND", "text", None,
        "The backend multi-backend Keras loads; `cyback` selects cyback.",
        group="Keras", read=IMPORT, owner=KERAS,
        readers=("cyback/__main__.py", "cyback/bench/__main__.py", "cyback/_keras_compat.py",
                 "cyback/demo.py", "cyback/layers/_keras.py", "cyback/cli.py"),
        default_text="`keras.json`'s `backend`, else `tensorflow`",
        details="Keras reads it when it is first imported. cyback's programs that import "
                "Keras (the demo, the benchmarks, model loading, unpickling a Keras "
                "model) set it to `cyback` when it is unset; `python -m cyback info` "
                "says which backend a plain `import keras` would load. See "
                "[Keras](keras.md)."),
    # ------------------------------------------------------------ OpenMP / C library
    Setting(
        "OMP_NUM_THREADS", "text", None,
        "OpenMP's thread count; cyback takes it as its own when `CYBACK_NUM_THREADS` is "
        "unset.",
        group="OpenMP and the C library", read=IMPORT, owner=OPENMP,
        readers=("cyback/config.py",),
        default_text="unset (cyback then counts the CPUs it may use)"),
    Setting(
        "OMP_WAIT_POLICY", "choice", None,
        "How OpenMP's idle threads wait: `active` spins, `passive` sleeps.",
        group="OpenMP and the C library", read=IMPORT, owner=OPENMP,
        choices=("active", "passive"),
        readers=("cyback/kernels/cpu_budget.py", "cyback/kernels/runtime.pyx"),
        default_text="set to `PASSIVE` by cyback when neither it nor `GOMP_SPINCOUNT` is set",
        details="libgomp reads it once, when it is loaded; cyback sets it before any "
                "kernel loads, and derives the warm window from it."),
    Setting(
        "GOMP_SPINCOUNT", "spin", None,
        "Rounds libgomp's idle threads spin before they sleep.",
        group="OpenMP and the C library", read=IMPORT, owner=OPENMP,
        readers=("cyback/kernels/cpu_budget.py", "cyback/kernels/runtime.pyx"),
        default_text="set to 2000 by cyback when neither it nor `OMP_WAIT_POLICY` is set",
        details="Long enough to bridge the gaps between the ops of one call, short "
                "enough that a busy neighbour loses little "
                "([threads](threads.md)). libgomp takes it over `OMP_WAIT_POLICY`."),
    Setting(
        "GLIBC_TUNABLES", "text", None,
        "glibc's tunables; one naming a `glibc.malloc.` tunable keeps the allocator as "
        "you set it (see `CYBACK_MALLOC`).",
        group="OpenMP and the C library", read=IMPORT, owner=GLIBC,
        readers=("cyback/kernels/memory.py",)),
    Setting(
        "MALLOC_*_", "pattern", None,
        "glibc's allocator variables (`MALLOC_TRIM_THRESHOLD_`, ...); any of them keeps "
        "the allocator as you set it (see `CYBACK_MALLOC`).",
        group="OpenMP and the C library", read=IMPORT, owner=GLIBC,
        readers=("cyback/kernels/memory.py",)),
    # ------------------------------------------------------------ building
    Setting(
        "CYBACK_OPENMP", "choice", True,
        "`0` builds the kernels without OpenMP (single-threaded).",
        group="Building from source", read=BUILD, choices=("0", "1"), values=_ON_OFF,
        readers=("setup.py",),
        details="Without it the build probes the compiler for OpenMP and goes "
                "single-threaded, with a warning, when it has none."),
    Setting(
        "CYBACK_NATIVE", "choice", False,
        "`1` compiles the kernels with `-march=native` (never for wheels).",
        group="Building from source", read=BUILD, choices=("0", "1"), values=_ON_OFF,
        readers=("setup.py",)),
    Setting(
        "CYBACK_BUILD_CACHE", "choice", True,
        "`0` turns off the cache of compiled kernel modules under `build/cyback-cache/`.",
        group="Building from source", read=BUILD, choices=("0", "1"), values=_ON_OFF,
        readers=("setup.py",),
        details="See [packaging](packaging.md)."),
    Setting(
        "CYBACK_KERNELS", "text", None,
        "Comma-separated kernel modules to build (development: build only these).",
        group="Building from source", read=BUILD, readers=("setup.py",),
        default_text="all of them"),
    # ------------------------------------------------------------ tests and tools
    Setting(
        "CYBACK_FUZZ_CALLS", "int", 600,
        "Calls the fuzz test makes.",
        group="Tests and benchmarks", read=TESTS, minimum=0, maximum=10 ** 12,
        readers=("tests/test_fuzz.py",)),
    Setting(
        "CYBACK_FUZZ_SEED", "int", 0,
        "The fuzz test's seed.",
        group="Tests and benchmarks", read=TESTS, minimum=0, maximum=2 ** 63 - 1,
        readers=("tests/test_fuzz.py",)),
    Setting(
        "CYBACK_KERAS_SUITE_CACHE", "text", None,
        "Where `tests/keras_suite/run_keras_suite.py` keeps Keras 2.3.1's downloaded "
        "sources.",
        group="Tests and benchmarks", read=TESTS, readers=("tests/keras_suite/run_keras_suite.py",),
        default_text="`~/.cache/cyback/keras-suite`"),
    Setting(
        "PYTHONPATH", "text", None,
        "Passed on to the checkout's benchmark scripts, after the checkout itself.",
        group="Tests and benchmarks", read=PASSED_ON, owner=PYTHON,
        readers=("cyback/bench/scripts.py",),
        details="`python -m cyback.bench --scripts` runs `benchmarks/bench_*.py` with "
                "`CYBACK_NUM_THREADS` set to its `--threads`."),
    Setting(
        "TF_CPP_MIN_LOG_LEVEL", "text", None,
        "TensorFlow's log level; the benchmarks set it to `3` when unset, before "
        "importing TensorFlow as a peer.",
        group="Tests and benchmarks", read=FIRST_USE, owner=TENSORFLOW,
        readers=("cyback/bench/models.py",)),
]

#: Every declared setting, by name.
SETTINGS = {s.name: s for s in _DECLARED}

#: The keys of keras.json cyback reads (cyback/config.py): name -> (default, what it must be).
KERAS_JSON = {
    "floatx": ("float32", "one of 'float16', 'float32', 'float64'"),
    "epsilon": (1e-7, "a finite non-negative number"),
    "image_data_format": ("channels_last", "'channels_last' or 'channels_first'"),
    "backend": ("tensorflow", "the backend Keras loads (read by Keras; "
                              "`python -m cyback set-default-backend` writes it)"),
}

GROUPS = ("Threads", "Kernels", "Memory", "Graphs", "Keras", "OpenMP and the C library",
          "Building from source", "Tests and benchmarks")


def setting(name):
    """The declared setting ``name`` (a KeyError naming it if it is not declared)."""
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError("%r is not a declared setting; declare it in "
                       "cyback/kernels/settings.py" % (name,)) from None


def declared(name):
    """Whether ``name`` is a declared variable (or matches a declared pattern)."""
    if name in SETTINGS:
        return True
    return any(s.is_pattern and name.startswith(s.prefix) for s in _DECLARED)


def raw(name, environ=None):
    """The text of variable ``name`` as set, or None when it is not set."""
    setting(name)
    environ = os.environ if environ is None else environ
    return environ.get(name)


def is_set(name, environ=None):
    """Whether variable ``name`` holds something other than blanks."""
    value = raw(name, environ)
    return value is not None and value.strip() != ""


def matching(name, environ=None):
    """{variable: text} of the variables a pattern setting (``MALLOC_*_``) matches."""
    s = setting(name)
    if not s.is_pattern:
        raise ValueError("%s is not a pattern" % name)
    head, tail = s.name.split("*")
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(head) and k.endswith(tail)}


def problem(name, text):
    """What is wrong with ``text`` as the value of ``name``, or None if it is good."""
    s = setting(name)
    if not text.strip():
        return None if s.empty_is_unset else "must be %s" % s.expects()
    try:
        s.parse(text)
    except ValueError as e:
        return "must be %s" % e
    return None


def _bad_value(s, why, text):
    return "%s %s, got %r; using the default (%s)" % (s.name, why, text,
                                                       s.default_str().replace("`", ""))


def get(name, environ=None):
    """The value of setting ``name``: parsed from the environment, or its
    default when it is unset (or blank, for most) or bad. A bad value of one
    of cyback's own settings is a ConfigWarning naming the variable, the
    value and the default used instead."""
    s = setting(name)
    if s.is_pattern:
        return matching(name, environ)
    text = raw(name, environ)
    if text is None or (not text.strip() and s.empty_is_unset):
        return s.default
    why = problem(name, text)
    if why is None:
        return s.parse(text)
    if s.owner == CYBACK:
        setting_warning(_bad_value(s, why, text))
    return s.default


def remove_bad(names, environ=None):
    """Warn about and delete every variable of ``names`` whose value is bad;
    returns the names removed. For the settings that compiled kernels read
    themselves (``getenv``, or Cython at its import): once removed, they take
    their default, as the policy says, instead of reading a bad value in
    their own way (``atof("abc")`` is 0)."""
    environ = os.environ if environ is None else environ
    removed = []
    for name in names:
        text = raw(name, environ)
        if text is None:
            continue
        why = problem(name, text)
        if why is not None:
            setting_warning(_bad_value(setting(name), why, text))
            del environ[name]
            removed.append(name)
    return removed


# ------------------------------------------------------------ the docs page

_PAGE_HEAD = """\
# Configuration

<!-- Generated from cyback/kernels/settings.py by `python -m cyback settings --write-docs`:
     edit the declarations there, not this page. -->

cyback reads the environment variables below, each declared once in
`cyback/kernels/settings.py`, which reads and checks them
(`settings.get("CYBACK_NUM_THREADS")`); a test fails when code reads a
variable that is not declared there.

**Bad values.** A setting read at import (the variables here and
`keras.json`) that cannot be used is a `ConfigWarning` naming it, the value
and the default used instead, and the import goes on: Keras imports cyback,
and a typo in a tuning variable must not stop a service from starting. The
same values given in code (`cyback.set_num_threads(0)`,
`cyback.set_floatx("float8")`, ...) raise `ValueError`. Variables that belong
to another program (OpenMP, glibc, Keras) are left to it.

"""


def _cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def _anchor(name):
    # the id MkDocs gives the heading "### `NAME`"
    return "".join(c for c in name.lower() if c.isalnum() or c in "_-")


def _allowed(s):
    if s.kind == "int":
        return "integer, %d to %d" % (s.minimum, s.maximum)
    if s.kind == "float":
        return "number >= %g%s" % (s.minimum, " (%s)" % s.unit if s.unit else "")
    if s.kind == "choice":
        return ", ".join("`%s`" % c for c in s.choices)
    if s.kind == "flag":
        return "%s (off); anything else (on)" % ", ".join("`%s`" % c for c in _FLAG_OFF)
    if s.kind == "spin":
        return "rounds (`k`/`M`/`G`/`T` suffix) or `infinite`"
    if s.kind == "pattern":
        return "any"
    return "text"


def markdown():
    """The configuration page (docs/configuration.md)."""
    out = [_PAGE_HEAD, "| variable | values | default | read |", "| --- | --- | --- | --- |"]
    for group in GROUPS:
        for s in (s for s in _DECLARED if s.group == group):
            out.append("| [`%s`](#%s) | %s | %s | %s |" % (
                s.name, _anchor(s.name), _cell(_allowed(s)), _cell(s.default_str()), s.read))
    out.append("")
    for group in GROUPS:
        out += ["## %s" % group, ""]
        for s in (s for s in _DECLARED if s.group == group):
            out += ["### `%s`" % s.name, "", s.summary, ""]
            out.append("- Values: %s" % _allowed(s))
            out.append("- Default: %s" % s.default_str())
            out.append("- Read %s by %s" % (s.read, ", ".join("`%s`" % r for r in s.readers)))
            if s.owner != CYBACK:
                out.append("- Belongs to: %s" % s.owner)
            if s.in_code:
                out.append("- In code: `%s`" % s.in_code)
            out.append("")
            if s.details:
                out += [s.details.rstrip("\n"), ""]
    out += ["## keras.json", "",
            "Read from `$KERAS_HOME/keras.json` (see `KERAS_HOME`) at import; a bad file "
            "or value is a `ConfigWarning` and the default.", "",
            "| key | default | value |", "| --- | --- | --- |"]
    for key, (default, what) in KERAS_JSON.items():
        out.append("| `%s` | `%s` | %s |" % (key, default, _cell(what)))
    out.append("")
    return "\n".join(out)


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m cyback.kernels.settings",
                                description="Write the configuration page of the docs from "
                                            "the settings registry.")
    p.add_argument("-o", "--output", default=os.path.join("docs", "configuration.md"),
                   help="the page to write (default docs/configuration.md)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if the page differs from what the registry generates")
    args = p.parse_args(argv)
    text = markdown()
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                same = f.read() == text
        except OSError:
            same = False
        if not same:
            print("%s is out of date: run python -m cyback settings --write-docs"
                  % args.output,
                  file=sys.stderr)
            return 1
        return 0
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %s" % args.output)
    return 0

