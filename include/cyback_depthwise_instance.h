/* One instance of the depthwise kernels: the three templates with the T, SUF,
 * ATTR (and, for a vector instance, V and VL) that the includer defined
 * (cyback_depthwise.h), which are then undefined for the next one, and so
 * that none of them leaks into the code that includes cyback_depthwise.h. */
#include "cyback_depthwise_last.h"
#include "cyback_depthwise_first.h"
#include "cyback_depthwise_transpose.h"
#undef T
#undef SUF
#undef ATTR
#undef V
#undef VL
