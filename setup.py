"""Build the Cython kernels of cyback.

Every ``cyback/kernels/*.pyx`` becomes an extension module. The .pyx files are
translated to C/C++ at build time (never shipped translated), in parallel, and
the modules are then compiled side by side, the largest first. OpenMP is found
by compiling a small probe program: a compiler without OpenMP still builds the
kernels, single-threaded, with a warning. BLAS comes from
``scipy.linalg.cython_blas`` at run time, so nothing links against a BLAS here.

Each compiled module is also kept in ``build/cyback-cache/`` under a hash of
everything that goes into it (generated source, headers, compiler and flags,
Python and NumPy versions), so a second install from the same checkout (the
README's test command after its editable install) copies the modules instead
of compiling them again.

Environment:
    CYBACK_NATIVE=1      build for the local CPU (-march=native); never for wheels.
    CYBACK_OPENMP=0      build without OpenMP even when the compiler has it.
    CYBACK_KERNELS=a,b   build only these kernel modules (development only).
    CYBACK_BUILD_CACHE=0 always compile; never read or write build/cyback-cache.
"""
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE_DIR = os.path.join(HERE, "build", "cyback-cache")
CACHE_ENTRIES = 3          # builds kept per module

CYTHON_DIRECTIVES = {
    "boundscheck": False, "wraparound": False, "cdivision": True,
    "initializedcheck": False, "nonecheck": False,
}

OPENMP_PROBE = textwrap.dedent("""
    #include <omp.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        return n > 0 ? 0 : 1;
    }
""")


def _say(msg):
    # pip shows a build's output only with -v; stderr is unbuffered there.
    # One write per line: the modules compile on several threads.
    sys.stderr.write("cyback: %s\n" % msg)
    sys.stderr.flush()


def _compiler_name(compiler):
    cc = getattr(compiler, "compiler", None) or getattr(compiler, "compiler_so", None)
    if isinstance(cc, (list, tuple)) and cc:
        return cc[0]
    return sysconfig.get_config_var("CC") or "cc"


def _compiler_version(compiler):
    try:
        return subprocess.run([_compiler_name(compiler), "--version"], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _openmp_flags(compiler):
    """Return (compile_args, link_args) that enable OpenMP, or None."""
    if os.environ.get("CYBACK_OPENMP", "1") == "0":
        return None
    if sys.platform == "win32":
        candidates = [(["/openmp"], [])]
    elif sys.platform == "darwin":
        candidates = [(["-Xpreprocessor", "-fopenmp"], ["-lomp"]), (["-fopenmp"], ["-fopenmp"])]
    else:
        candidates = [(["-fopenmp"], ["-fopenmp"])]
    tmp = tempfile.mkdtemp()
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        for cflags, lflags in candidates:
            try:
                objs = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
                exe = os.path.join(tmp, "probe")
                compiler.link_executable(objs, exe, extra_postargs=lflags)
                subprocess.check_call([exe])
                return cflags, lflags
            except Exception:
                continue
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return None


class BuildExt(build_ext):
    def finalize_options(self):
        super().finalize_options()
        # The kernel modules are independent: compile them side by side.
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        from Cython.Build import cythonize

        native = os.environ.get("CYBACK_NATIVE", "0") == "1"
        omp = _openmp_flags(self.compiler)
        if omp is None:
            _say("WARNING: the compiler has no OpenMP; kernels build single-threaded.")
            cflags, lflags = [], []
        else:
            cflags, lflags = omp
        if self.compiler.compiler_type == "msvc":
            base = ["/O2"]
        else:
            # -g0 overrides the -g in Python's own CFLAGS: wheels stay small.
            base = ["-O3", "-g0", "-fno-math-errno", "-Wno-unused-function",
                    "-Wno-unreachable-code"]
            if native:
                base.append("-march=native")
        # The symbol tables serve debuggers only; stripped, the wheel is ~90 kB smaller.
        strip = ["-s"] if sys.platform.startswith("linux") else []
        _say("translating %d kernel modules with Cython" % len(self.extensions))
        translated = cythonize(
            self.extensions, language_level=3, compiler_directives=CYTHON_DIRECTIVES,
            nthreads=self.parallel if self.parallel > 1 else 0)
        # Translated at build time, not when setup.py loads: sdist must see the .pyx
        # sources. cythonize returns new Extension objects; keep setuptools' own.
        by_name = {ext.name: ext for ext in translated}
        for ext in self.extensions:
            ext.sources = by_name[ext.name].sources
            ext.language = by_name[ext.name].language
            ext.extra_compile_args = base + cflags
            ext.extra_link_args = lflags + strip
        # Largest first, so the longest compile never starts last.
        self.extensions.sort(key=lambda e: -sum(os.path.getsize(s) for s in e.sources))
        self._cache_base = self._cache_base_key()
        self._done = 0
        self._done_lock = threading.Lock()
        self._write_build_info(base + cflags, lflags, omp is not None, native)
        _say("compiling %d kernel modules, %d at a time"
             % (len(self.extensions), self.parallel))
        super().build_extensions()

    def _cache_base_key(self):
        if os.environ.get("CYBACK_BUILD_CACHE", "1") == "0":
            return None
        h = hashlib.sha256()
        parts = [sys.version, sysconfig.get_platform(), sysconfig.get_config_var("EXT_SUFFIX"),
                 numpy.__version__, _compiler_version(self.compiler),
                 repr(getattr(self.compiler, "compiler_so", None)),
                 repr(getattr(self.compiler, "compiler_so_cxx", None)),
                 repr(getattr(self.compiler, "linker_so", None)),
                 repr(getattr(self.compiler, "linker_so_cxx", None))]
        for part in parts:
            h.update(str(part).encode() + b"\0")
        for path in _shared_sources(HERE):
            with open(path, "rb") as f:
                h.update(f.read())
        return h.hexdigest()

    def _cache_path(self, ext):
        if self._cache_base is None:
            return None
        h = hashlib.sha256(self._cache_base.encode())
        # pip builds in a fresh temporary environment each time: name NumPy's headers by
        # NumPy's version (in the base key), not by their path.
        include_dirs = ["<numpy>" if d == numpy.get_include() else d for d in ext.include_dirs]
        h.update(repr((ext.name, ext.language, ext.extra_compile_args, ext.extra_link_args,
                       ext.define_macros, include_dirs)).encode())
        # The generated source names the .pxd files it read (SciPy's cython_blas.pxd) by
        # their path in that temporary environment too, and its metadata header records the
        # include path of the build that translated it (the key covers both otherwise).
        site = os.path.dirname(os.path.dirname(numpy.__file__)).encode()
        for src in ext.sources:
            with open(src, "rb") as f:
                text = re.sub(rb"/\* BEGIN: Cython Metadata.*?END: Cython Metadata \*/", b"",
                              f.read(), count=1, flags=re.S)
            h.update(text.replace(site, b"<site-packages>"))
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        return os.path.join(CACHE_DIR, "%s-%s%s" % (ext.name, h.hexdigest()[:20], suffix))

    def build_extension(self, ext):
        short = ext.name.rsplit(".", 1)[-1]
        cached = self._cache_path(ext)
        target = self.get_ext_fullpath(ext.name)
        start = time.time()
        if cached and os.path.exists(cached):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(cached, target)
            how = "reused from build/cyback-cache"
        else:
            _say("compiling %s ..." % short)
            super().build_extension(ext)
            if cached:
                self._store(cached, target, ext.name)
            how = "compiled in %.0f s" % (time.time() - start)
        with self._done_lock:
            self._done += 1
            _say("[%d/%d] %s %s" % (self._done, len(self.extensions), short, how))

    @staticmethod
    def _store(cached, built, name):
        os.makedirs(CACHE_DIR, exist_ok=True)
        # Keep the newest few entries per module: a checkout is often built both by pip
        # (in its temporary build environment) and in place (with the venv's paths),
        # whose keys differ; older entries are stale builds.
        old = sorted(glob.glob(os.path.join(CACHE_DIR, name + "-*")), key=os.path.getmtime)
        for path in old[:max(0, len(old) - (CACHE_ENTRIES - 1))]:
            os.remove(path)
        tmp = cached + ".tmp%d" % os.getpid()
        shutil.copy(built, tmp)
        os.replace(tmp, cached)

    def _write_build_info(self, cflags, lflags, openmp, native):
        info = {
            "compiler": _compiler_name(self.compiler),
            "compile_args": cflags,
            "link_args": lflags,
            "openmp": openmp,
            "native": native,
            "cython_version": __import__("Cython").__version__,
            "numpy_build_version": numpy.__version__,
        }
        text = "# Written by setup.py at build time.\nBUILD_INFO = %r\n" % (info,)
        for root in (HERE, self.build_lib):
            path = os.path.join(root, "cyback", "_build_info.py")
            if os.path.isdir(os.path.dirname(path)):
                with open(path, "w") as f:
                    f.write(text)


def _shared_sources(root):
    """The files a kernel module may read besides its .pyx: C headers, and the
    .pxi/.pxd files of cyback/kernels (a module split into included parts)."""
    found = glob.glob(os.path.join(root, "include", "*.h"))
    for ext in ("pxi", "pxd"):
        found += glob.glob(os.path.join(root, "cyback", "kernels", "**", "*." + ext),
                           recursive=True)
    return sorted(found)


def extensions():
    only = [k for k in os.environ.get("CYBACK_KERNELS", "").split(",") if k]
    exts = []
    for pyx in sorted(glob.glob(os.path.join("cyback", "kernels", "*.pyx"))):
        name = pyx[:-4].replace(os.sep, ".")
        if only and name.rsplit(".", 1)[1] not in only:
            continue
        exts.append(Extension(
            name, [pyx],
            include_dirs=[numpy.get_include(), "include"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            # Without these, a changed header or included .pxi leaves an older
            # module "up to date" (setuptools compares the sources' times only).
            depends=_shared_sources("."),
        ))
    if not exts and not only:
        raise SystemExit("cyback: no cyback/kernels/*.pyx found: this source tree is incomplete")
    return exts


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
