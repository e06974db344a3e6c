/* Binding of the rotary op family (being written). */
#include "common.h"

PyMethodDef mf_rotary_methods[] = {{NULL, NULL, 0, NULL}};
