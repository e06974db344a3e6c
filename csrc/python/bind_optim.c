/* Binding of the optim op family (being written). */
#include "common.h"

PyMethodDef mf_optim_methods[] = {{NULL, NULL, 0, NULL}};
