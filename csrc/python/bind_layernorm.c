/* Binding of the layernorm op family (being written). */
#include "common.h"

PyMethodDef mf_layernorm_methods[] = {{NULL, NULL, 0, NULL}};
