/* Binding of the softmax_xent op family (being written). */
#include "common.h"

PyMethodDef mf_softmax_xent_methods[] = {{NULL, NULL, 0, NULL}};
