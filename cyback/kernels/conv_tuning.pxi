# The tuning knobs of the convolution strategies (included by conv.pyx):
# _TUNE, read by each strategy's rule (_use_winograd, _use_direct, _tap_rows
# ...) to decide whether it takes a geometry, and by tests and benchmarks to
# force or compare the paths.


# Patch buffer per thread: half of a 2 MB L2 leaves room for the GEMM's own
# packed panels.
cdef enum:
    BUF_BYTES = 1 << 20


class _Tuning(dict):
    """The kernels' tuning knobs; ``version`` counts changes, so that a
    prepared ForwardCall sees when its choice of path is stale."""
    version = 0

    def __setitem__(self, key, value):
        dict.__setitem__(self, key, value)
        self.version += 1

    def update(self, *args, **kwargs):
        dict.update(self, *args, **kwargs)
        self.version += 1

    def clear(self):
        dict.clear(self)
        self.version += 1


def _env_winograd():
    """CYBACK_WINOGRAD, through the settings registry (a bad value warns and
    leaves Winograd on)."""
    return bool(_settings.get("CYBACK_WINOGRAD"))


# The knobs the strategy rules read, by group. Their defaults are set here
# (winograd from CYBACK_WINOGRAD at import); tests force paths with them
# (tests/kernels/test_conv*.py, test_winograd.py, tests/api/test_conv.py) and
# benchmarks/bench_conv.py sweeps them, always restoring the old values. A
# change counts in _TUNE.version, so prepared ForwardCalls plan again.
_TUNE = _Tuning({
    # Winograd (_use_winograd, _winograd_min_c): on/off (CYBACK_WINOGRAD),
    # channels_first layers too (through copies), the fewest input channels
    # (None: 12, 16 or 24 by kernel set and depth), output channels and
    # tiles, and the tiles a call needs per value of its transformed kernel.
    "winograd": _env_winograd(), "winograd_channels_first": True,
    "winograd_min_c": None, "winograd_min_f": 16,
    "winograd_min_tiles": 16, "winograd_kernel_per_tile": 8192,
    # im2col (_block_rows): the per-thread patch buffer, BUF_BYTES.
    "buf_bytes": BUF_BYTES,
    # 1x1 GEMM tiles (_use_pointwise_gemm): None decides, True / False force
    # them; the C*F and rows*C*F from which they beat the direct kernel; with
    # the direct kernel's 6-pixel AVX-512 tiles, the rows from which calls
    # stay direct, except those with up to stream_max_c input channels and
    # stream_outputs outputs or more.
    "pointwise_gemm": None, "pointwise_gemm_min_cf": 1 << 14,
    "pointwise_gemm_min_macs": 1 << 27, "pointwise_gemm_short_tiles_max_rows": 512,
    "pointwise_gemm_stream_outputs": 8 << 20, "pointwise_gemm_stream_max_c": 64,
    # Direct forward kernel (_use_direct): on/off; the input channels and
    # patch length K of the layers it always takes; the bounds of the wider
    # layers it takes from direct_wide_min_pixels output pixels on. The
    # phases' rule (_use_phases) reads direct_max_c and direct_max_k too.
    # direct_skip_pad False makes the vector kernels read a W-padded copy,
    # as the scalar kernel does (_skip_pad; None: they read rows in place).
    "direct": True, "direct_max_c": 64, "direct_max_k": 1024,
    "direct_wide_max_c": 1024, "direct_wide_max_k": 4608, "direct_wide_min_pixels": 512,
    "direct_skip_pad": None,
    # Threads (_threads, forward_call): a convolution's flops per byte of the
    # team's work cutoff, which is counted in bytes moved.
    "flops_per_byte": 8.0,
    # Stride-1 taps (_tap_rows): the fewest input channels; the m*n*k below
    # which OpenBLAS multiplies unpacked, and the fewest tile rows that leaves
    # for the taps to take a call; otherwise channels_first (and with
    # tap_last_packed, channels_last) runs tiles of tap_rows rows.
    "tap_min_c": 32, "tap_mnk": 1000000, "tap_min_rows": 96, "tap_rows": 1024,
    "tap_last_packed": False,
    # Phases of a strided input gradient (_use_phases): None decides, True /
    # False force them; channels_last layers of up to phase_max_c dy channels
    # on dy rows at least phase_min_w wide take them beyond the direct bounds.
    "phase_split": None, "phase_max_c": 512, "phase_min_w": 24,
    # Direct kernel gradient (_use_direct_wgrad): on/off; the most input
    # channels, and the most bytes of a group's partial gradient (kept in L2).
    "direct_wgrad": True, "direct_wgrad_max_c": 64, "direct_wgrad_max_bytes": 192 << 10,
    # Short im2col (_use_short_im2col): on/off; the largest patch matrix.
    "short_im2col": True, "short_im2col_bytes": 4 << 20,
    # Packed kernels (_use_packed, conv_packed.pxi): on/off; the largest
    # patch matrix; the most positions and the fewest input channels of the
    # Winograd layers they take (and their fewest outputs), how much more
    # than a map Winograd's tiles must cover for the packed product to take
    # it, and of the 1x1 layers of more than CB_PG_MAX_ROWS positions.
    "packed": True, "packed_im2col_bytes": 16 << 20,
    "packed_over_winograd_rows": 200, "packed_over_winograd_min_c": 128,
    "packed_over_winograd_min_f": 64, "packed_over_winograd_waste": 1.25,
    "packed_pointwise_max_rows": 2048, "packed_pointwise_min_c": 256,
})
