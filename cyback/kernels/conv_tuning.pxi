# The tuning knobs of the convolution strategies (included by conv.pyx).


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


# Patch-buffer size per thread, a dict so that benchmarks can sweep it.
_TUNE = _Tuning({"winograd": _env_winograd(), "winograd_channels_first": True,
         "winograd_min_c": None, "winograd_min_f": 16,
         "winograd_min_tiles": 16, "winograd_kernel_per_tile": 8192,
"buf_bytes": BUF_BYTES, "pointwise_gemm": None, "pointwise_gemm_min_cf": 1 << 14,
         "pointwise_gemm_min_macs": 1 << 27, "pointwise_gemm_short_tiles_max_rows": 512,
         "pointwise_gemm_stream_outputs": 8 << 20, "pointwise_gemm_stream_max_c": 64,
         "direct": True, "direct_max_c": 64, "direct_max_k": 1024,
         "direct_wide_max_c": 1024, "direct_wide_max_k": 4608, "direct_wide_min_pixels": 512,
         "flops_per_byte": 8.0,
         "tap_min_c": 32, "tap_mnk": 1000000, "tap_min_rows": 96, "tap_rows": 1024,
         "tap_last_packed": False, "direct_skip_pad": None,
         "phase_split": None, "phase_max_c": 512, "phase_min_w": 24,
         "direct_wgrad": True, "direct_wgrad_max_c": 64, "direct_wgrad_max_bytes": 192 << 10,
         "short_im2col": True, "short_im2col_bytes": 4 << 20})
