/* Binding helpers shared by every csrc/python/bind_*.c file. Only csrc/python includes Python.h. */
#ifndef MAPFORMER_PY_COMMON_H
#define MAPFORMER_PY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL MAPFORMER_ARRAY_API
#include <numpy/arrayobject.h>
#include <stdint.h>

#include "mapformer/mapformer.h"

/* Check that `obj` is a C-contiguous ndarray of dtype `typenum` with `ndim` axes, each of size
 * >= 1, whose sizes agree with `dims`: an entry < 0 is free and is filled in from the array,
 * an entry >= 0 must match. On failure sets TypeError (not an array, wrong dtype) or ValueError
 * (ndim, shape, empty axis, layout) naming `name` and the expected `shape` text, e.g.
 * "(B, T, H, D)", and returns NULL. The result is a borrowed reference to obj. */
PyArrayObject *mf_array(PyObject *obj, const char *name, int typenum, int ndim, int64_t *dims,
                        const char *shape);

/* As mf_array, for an array the op writes into (a gradient accumulated with +=, an optimizer
 * state): also requires it to be writeable. */
PyArrayObject *mf_output_array(PyObject *obj, const char *name, int typenum, int ndim,
                               int64_t *dims, const char *shape);

/* As mf_array, but Py_None is allowed and gives NULL without an exception (check
 * PyErr_Occurred() to tell the two apart). */
PyArrayObject *mf_optional_array(PyObject *obj, const char *name, int typenum, int ndim,
                                 int64_t *dims, const char *shape);

/* Raise ValueError naming the first id outside [0, V) in ids (n,), return -1; 0 if all fit. */
int mf_check_ids(const int32_t *ids, int64_t n, int64_t V, const char *name);

/* Raise ValueError naming `name` unless x is finite (and, when positive_only, > 0). */
int mf_check_finite(double x, const char *name, int positive_only);

/* Raise ValueError naming both arrays if the buffer `out` (written) overlaps `in`; NULL
 * arrays pass. Returns -1 on overlap, else 0. */
int mf_check_disjoint(PyArrayObject *out, const char *out_name, PyArrayObject *in,
                      const char *in_name);

/* For the attention-like ops: check the head dim D (even, in [16, 128]; `arrays` lists the
 * arrays whose last axis it is, for the message) and resolve scale (None -> 1/sqrt(D); a
 * number must be finite and fit in float32). Returns -1 with an exception set. */
int mf_head_dim_and_scale(int64_t D, const char *arrays, PyObject *scale_obj, float *scale);

/* Map a non-OK status of op `op` to a Python exception; returns NULL for `return` chaining. */
PyObject *mf_raise_status(int status, const char *op);

/* A new C-contiguous float32 array of the given shape (uninitialised). */
PyArrayObject *mf_empty_f32(int ndim, const int64_t *dims);

#define MF_F32 NPY_FLOAT32
#define MF_I32 NPY_INT32

/* The method tables of each family (csrc/python/bind_<family>.c), merged by module.c. */
extern PyMethodDef mf_embedding_methods[];
extern PyMethodDef mf_linear_methods[];
extern PyMethodDef mf_layernorm_methods[];
extern PyMethodDef mf_elementwise_methods[];   /* gelu, residual */
extern PyMethodDef mf_mlp_methods[];           /* fused linear, GELU, linear */
extern PyMethodDef mf_attention_methods[];
extern PyMethodDef mf_rotary_methods[];        /* path integration, rotary */
extern PyMethodDef mf_softmax_xent_methods[];
extern PyMethodDef mf_optim_methods[];         /* adamw, global norm, clipping */
extern PyMethodDef mf_cope_methods[];
extern PyMethodDef mf_tape_methods[];          /* TAPE: complex-state rotary, state mix */
extern PyMethodDef mf_conj_attention_methods[]; /* MapEM conjunctive attention */

#endif
