/* Binding of the elementwise op family (being written). */
#include "common.h"

PyMethodDef mf_elementwise_methods[] = {{NULL, NULL, 0, NULL}};
