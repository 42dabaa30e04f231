# The Winograd choice (included by conv.pyx).
#
# The dispatcher tries Winograd F(2x2, 3x3) (cyback/kernels/winograd.pyx)
# first: float32, a 3x3 (or 3-D (KD, 3, 3)) kernel, stride 1, no dilation,
# enough channels and tiles (_use_winograd). channels_first runs through
# channels_last copies made inside the kernel's parallel region.


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_winograd(g, last, dtype):
    """Whether a forward convolution runs Winograd F(2x2, 3x3)
    (cyback/kernels/winograd.pyx): channels_last float32, a 2-D 3x3 kernel
    or a 3-D (KD, 3, 3) one, stride 1, no dilation, and enough channels and
    tiles. In 3-D the KD depth taps join the channels in the products.

    Winograd beats the direct kernel, batch 1 included, once there are
    enough input channels (_winograd_min_c); with fewer, the input transform
    costs as much as the products save. The transformed kernel (64 C F
    bytes) is streamed once per work item, so a call needs tiles in
    proportion to it (winograd_kernel_per_tile). benchmarks/bench_conv.py
    compares the two ("Winograd" rows); docs/performance.md. channels_first
    goes through channels_last copies of x and y, made on the team in the
    kernel's own parallel region (_run_winograd).
    CYBACK_WINOGRAD=0 turns it off (results then sum the taps directly)."""
    if not (_TUNE["winograd"] and dtype == np.float32 and winograd.available()):
        return False
    if not last and not _TUNE["winograd_channels_first"]:
        return False
    if (g["KH"], g["KW"]) != (3, 3) or g["sd"] != 1 or g["sh"] != 1 or g["sw"] != 1 or \
            g["dil_d"] != 1 or g["dil_h"] != 1 or g["dil_w"] != 1:
        return False
    if not (_winograd_min_c(g) <= g["C"] <= winograd.MAX_CHANNELS) or \
            g["F"] < _TUNE["winograd_min_f"]:
        return False
    n = winograd.tiles(g["N"], g["OH"], g["OW"], g["OD"])
    return n >= _TUNE["winograd_min_tiles"] and \
        n * _TUNE["winograd_kernel_per_tile"] >= g["KD"] * g["C"] * g["F"]


def _winograd_min_c(g):
    """The fewest input channels that run Winograd: _TUNE["winograd_min_c"],
    or by the kernel set and the kernel's depth when None. The direct
    kernel's 12-pixel AVX-512 tiles beat Winograd on 16 channels, where the
    AVX2 ones (6 pixels) do not: 24 with the former, 16 with the latter.
    With depth taps the direct kernel's patches are KD times longer and its
    packed kernel leaves L1, so 3-D layers take Winograd from 12 channels.
    Where the direct kernel runs 6-pixel AVX-512 tiles (512-bit FMAs at half
    rate), Winograd's two-vector blocks beat it on 16 channels in once there
    are more than 16 out, and its 16-channel blocks (the AVX2 set's) do not.
    benchmarks/bench_conv.py ("Winograd" rows) measures each case."""
    n = _TUNE["winograd_min_c"]
    if n is not None:
        return n
    if g["KD"] > 1:
        return 12
    if not cb_simd_has_avx512() or (_short_avx512_tiles() and g["F"] > 16):
        return 16
    return 24


cdef inline bint _short_avx512_tiles():
    """Whether the direct kernel runs its 6-pixel AVX-512 tiles (where 512-bit
    FMAs run at half rate), which moves the Winograd and 1x1 GEMM-tile rules."""
    return cb_simd_has_avx512() and not cb_cd_wide_tiles()


# (id of a cached geometry dict) -> (that dict, winograd.Winograd), as _DIRECT_GEOMS
_WINOGRADS = {}


@cython.wraparound(True)
@cython.boundscheck(True)
def _winograd(g):
    entry = _WINOGRADS.get(id(g))
    if entry is not None and entry[0] is g:
        return entry[1]
    w = winograd.Winograd(g["N"], g["H"], g["W"], g["C"], g["F"], g["OH"], g["OW"], g["ph"],
                          g["pw"], g["D"], g["OD"], g["KD"], g["pd"])
    if len(_WINOGRADS) >= 512:
        _WINOGRADS.clear()
    _WINOGRADS[id(g)] = (g, w)
    return w


def _run_winograd(w, x, kernel, y, bias, residual, int act, int nt, cache, bint last):
    """Winograd into y; True when the epilogue went in too (channels_first
    leaves a residual, and so the bias and activation after it, to the
    caller)."""
    if last:
        w.run(x, kernel, y, bias, residual, act, nt, cache, True, join_seconds())
        return True
    if residual is None:
        w.run(x, kernel, y, bias, None, act, nt, cache, False, join_seconds())
        return True
    w.run(x, kernel, y, None, None, 0, nt, cache, False, join_seconds())
    return False
