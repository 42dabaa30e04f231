"""Post-training int8 quantization of Keras models (issue 43).

``quantize(model, calibration_data)`` returns a Keras 2.3.1 model with the
same inputs and outputs whose Dense, Conv1D and Conv2D layers (channels_last)
and the input projections of its LSTM, GRU and SimpleRNN layers run in int8
with int32 sums (``cyback.kernels.qgemm``: AVX-512 VNNI,
AVX-VNNI, AVX2 or plain C, whichever the CPU has), everything else in
float32. ``report(float_model, quantized_model, data)`` measures each int8
layer's output error, to choose the layers to ``skip``.

A quantized model saves with ``model.save`` like any Keras model and loads
with ``keras.models.load_model(path, custom_objects=custom_objects())`` or
``cyback.load_model(path, custom_objects=custom_objects())``: its file holds
arrays and plain config values only. See docs/int8.md.

Importing this package imports Keras, with the cyback backend if Keras is
not imported yet (as ``cyback.layers`` does).
"""
from cyback.layers import import_keras

import_keras()

from cyback.quantization.calibration import scale_and_zero  # noqa: E402
from cyback.quantization.convert import quantizable, quantize  # noqa: E402
from cyback.quantization.layers import (  # noqa: E402
    LAYERS,
    QuantizedConv1D,
    QuantizedConv2D,
    QuantizedConv3D,
    QuantizedDense,
    QuantizedDepthwiseConv2D,
    QuantizedSeparableConv2D,
    custom_objects,
)
from cyback.quantization.recurrent import (  # noqa: E402
    QuantizedGRU,
    QuantizedLSTM,
    QuantizedSimpleRNN,
)
from cyback.quantization.report import LayerError, QuantizationReport, report  # noqa: E402
from cyback.quantization.weights import quantize_kernel  # noqa: E402

__all__ = ['quantize', 'report', 'custom_objects', 'quantizable', 'QuantizedDense',
           'QuantizedConv1D', 'QuantizedConv2D', 'QuantizedConv3D', 'QuantizedDepthwiseConv2D',
           'QuantizedSeparableConv2D', 'QuantizedLSTM', 'QuantizedGRU',
           'QuantizedSimpleRNN', 'LAYERS', 'QuantizationReport', 'LayerError',
           'scale_and_zero', 'quantize_kernel']
