"""Fused recurrent cells: a whole LSTM, GRU or SimpleRNN sequence in one call.

Per step, the recurrent product ``h @ R`` goes to BLAS (added onto the step's
input projection, computed beforehand for all steps at once), then one pass
over the batch rows applies the gate non-linearities and the state update.
The forward records what backprop through time reads; the backward produces
the per-step pre-activation gradients ``dz`` (which are the gradients of the
input projection), the initial-state gradients and the recurrent kernel's
gradient as one GEMM over all steps after the loop.

Threads: the batch rows of a recurrent layer are independent sequences, so
each OpenMP thread runs every step for its own block of rows (its own GEMMs
included) and the threads meet once, at the end, not at every step. Thread 0
polls for Ctrl-C at every step. A forward pass of a few rows splits the units
over the threads instead, which then meet after every step (below).

Without ``keep`` (an inference plan: no gradient will read the records) the
states live in a ring of two steps and the gates in one step's rows, so a
call writes only the outputs it returns.

Layouts (time-major, C-contiguous):
    zx      (T, B, G*u)  input projection (+ bias); G = 4 for LSTM (gates
                         i, f, c, o as in Keras), 3 for GRU (z, r, h), 1 for
                         SimpleRNN
    R       (u, G*u)     recurrent kernel
    rmask   (B, u)       recurrent dropout mask applied to h before ``@ R``
    mask    (T, B) uint8 Keras mask: a masked step keeps the states and
                         repeats the previous output
    hs, cs  (T, B, u)    states after each step (after masking)
    ys      (T, B, u)    outputs (differ from hs only under a mask)
    gates   (T, B, G*u)  activated gates (LSTM; the GRU's below) / new h
                         before masking (RNN)

Activation codes: 0 tanh, 1 sigmoid, 2 hard_sigmoid, 3 linear.

The parts, included in this order:
    rnn_product.pxi   the recurrent product (packed R, or BLAS)
    rnn_rows.pxi      the row-block driver all passes run on, and the step
                      pieces they share (state rows, recurrent input, the
                      backward step's dh += dz @ R^T)
    rnn_records.pxi   the records a pass returns, the masks, the recurrent
                      kernel's gradient
    rnn_split.pxi     the units split's meetings and thread count
    rnn_project.pxi   the input projection inside the steps
    rnn_lstm.pxi, rnn_gru.pxi, rnn_simple.pxi   each cell's passes and its
                      entry points (lstm_forward, ..., simple_backward)
"""
from cyback.kernels import settings as _settings
import numpy as np
cimport numpy as cnp
from cython.parallel cimport parallel, prange
from libc.string cimport memcpy, memset

from scipy.linalg.cython_blas cimport sgemv, dgemv

from cyback.kernels._blas cimport floating, gemm
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt
from cyback.kernels._omp cimport cb_get_num_threads, cb_get_thread_num
from cyback.kernels.runtime cimport join_seconds, threads_for
from cyback.kernels._tiles cimport cb_tiles, cb_tiles_init, cb_tiles_join
from cyback.kernels.runtime import host_busy

cnp.import_array()

ACTIVATIONS = {"tanh": 0, "sigmoid": 1, "hard_sigmoid": 2, "linear": 3}


# The recurrent product on R packed once per sequence (the kernels of
# include/cyback_rnn_product.h) rather than BLAS, which packs R at every step
# of every thread; off for tests of the BLAS path.
# gemv_max_rows: batches up to this size take BLAS's GEMV per row rather than
# the packed product (R packed at every call): for one or two rows packing R
# costs more than it saves, from three rows on the packed product wins
# (benchmarks/bench_rnn.py).
_TUNE = {"packed": True, "gemv_max_rows": 2, "split_max_rows": 6,
         "split_min_bytes": 1 << 17, "split_stream_per_work": 16.0, "split_lead_steps": 0}
# split_lead_steps (tests): thread 0 runs this many steps alone, then waits
# for the others and opens the split there (0: alone only until they arrive).


cdef extern from "cyback_act.h" nogil:
    void cb_act_row_f(float *p, Py_ssize_t n, int kind)
    void cb_act_row_d(double *p, Py_ssize_t n, int kind)
    void cb_act_lanes_f(float *p, Py_ssize_t rows, Py_ssize_t w, Py_ssize_t ld,
                        const float *lanes)
    int cb_simd_use_avx2(int on)
    void cb_simd_set_default_cap(int cap)
    int cb_simd_use_avx512(int on)

# CYBACK_AVX512=0 caps this module's vector kernels at AVX2 (the registry reads it).
cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


def _use_avx2(bint on):
    """Run the AVX2 + FMA gate activations and products when the CPU has them
    (the default), or the baseline ones (for tests). Returns whether AVX2
    now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the recurrent product's AVX-512 set run when the CPU has it (the
    default), or cap it at AVX2 (for tests). Returns whether AVX-512 now runs."""
    return bool(cb_simd_use_avx512(on))


include "rnn_product.pxi"
include "rnn_rows.pxi"
include "rnn_records.pxi"
include "rnn_split.pxi"
include "rnn_project.pxi"
include "rnn_lstm.pxi"
include "rnn_gru.pxi"
include "rnn_simple.pxi"
