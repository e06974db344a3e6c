/* Binding of the linear op family (being written). */
#include "common.h"

PyMethodDef mf_linear_methods[] = {{NULL, NULL, 0, NULL}};
