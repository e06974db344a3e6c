/* Binding of the attention op family (being written). */
#include "common.h"

PyMethodDef mf_attention_methods[] = {{NULL, NULL, 0, NULL}};
