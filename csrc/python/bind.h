/* The binding of the C core (only csrc/python includes Python.h): every op is data, an MfOp
 * whose arguments are MfArg rows, and one checker (bind.c: mf_call) turns a Python call into
 * the op's parameter struct (mapformer/params.h), runs the op with the GIL released (and
 * nothing else: no Python call) and builds the result; one cleanup label releases every
 * reference it took.
 *
 * An op's argument rows, in the order they are checked:
 *   {"q", 2, MF_IN, 0, "B T H D", .field = offsetof(MfAttentionParams, q)}
 * names the argument (as Python and the error messages see it), its place in the Python
 * signature (1-based; 0 for what is not a Python argument: new outputs, results), its kind and
 * what the kind needs. The arrays' shapes are space-separated letters: a letter's first array
 * (in row order) fixes its size, every later one must match, and the error names the array,
 * the axis, the shape in letters and the shape it got. "D/2" is half of D; "..." is any shape
 * with at least one axis, the same for every "..." array of the call. New outputs are
 * allocated from the output pool by their letter shapes; the op's scratch (its
 * <op>_scratch_floats) is borrowed from the same pool for the call. Every array the op writes
 * (new or in place) is checked against every other array of the call for shared memory, in
 * row order, and the written one is named. The sizes the op reads (op->sizes) are copied from
 * the letters into the struct's int64 fields.
 * Per-op checks the table cannot say (head dim ranges, id ranges, a mode's lse shape, default
 * scales) are small hooks: `prepare` after the scalars are parsed (it may pin a letter's
 * size), `check` after the arrays. The result is the new and given outputs and the results, in
 * row order: None, the one of them, or a tuple. */
#ifndef MAPFORMER_PY_BIND_H
#define MAPFORMER_PY_BIND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifndef MF_IMPORT_ARRAY /* module.c imports the NumPy C-API; everyone else uses it */
#define NO_IMPORT_ARRAY
#endif
#define PY_ARRAY_UNIQUE_SYMBOL MAPFORMER_ARRAY_API
#include <numpy/arrayobject.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "mapformer/mapformer.h"

typedef enum {
    MF_IN = 1,      /* an array the op reads */
    MF_INOUT,       /* an array the op updates in place (a gradient +=, optimizer state):
                     * must be writeable; not returned */
    MF_OUT,         /* a new array by its letter shape; returned. With MF_OPTIONAL: made
                     * only where the pointer field at `when` is not NULL, else None */
    MF_OUT_OR_INTO, /* None: as MF_OUT; an array: written into in place (+=), returned, and
                     * the int at `given` set to 1 (dx of linear_backward) */
    MF_RESULT,      /* a double the op writes through the pointer at `field`; returned as a
                     * float */
    MF_FLOAT,       /* a real number in [lo, hi] (`open`: which ends are excluded), also as
                     * float32; into a float field */
    MF_INT,         /* an int >= lo (an integer, not a bool or float); into an int64 field */
    MF_CHOICE,      /* a str among `choices`; its index into an int field */
} MfKind;

enum {
    MF_OPTIONAL = 1, /* may be omitted: arrays are then NULL, numbers `dflt` */
    MF_NONE = 2,     /* None is accepted: arrays give NULL, MF_FLOAT gives NaN (a default
                      * for the check hook to fill in) */
    MF_KWONLY = 4,   /* keyword-only (required ones are checked by mf_call) */
};
enum { MF_LO_OPEN = 1, MF_HI_OPEN = 2 };
/* an MF_FLOAT row's range: any finite float32 */
#define MF_FINITE .lo = -INFINITY, .hi = INFINITY, .open = MF_LO_OPEN | MF_HI_OPEN
enum { MF_F32 = 0, MF_I32, MF_BOOL }; /* array dtypes: float32, int32, bool */

typedef struct {
    const char *name;
    int pos;           /* place in the Python signature, from 1; 0: not a Python argument */
    int kind;          /* MfKind */
    int flags;         /* MF_OPTIONAL | MF_NONE | MF_KWONLY */
    const char *shape; /* arrays: letters, e.g. "B T H D" */
    size_t field;      /* offsetof the params field: a pointer, a scalar, a double * */
    int dtype;         /* arrays: MF_F32 (the default), MF_I32 or MF_BOOL */
    size_t given;      /* MF_OUT_OR_INTO: offsetof the int flag set when the array is given */
    size_t when;       /* MF_OUT with MF_OPTIONAL: offsetof the pointer field it depends on */
    double lo, hi;     /* MF_FLOAT: the range; MF_INT: the least value */
    int open;          /* MF_FLOAT: MF_LO_OPEN | MF_HI_OPEN */
    double dflt;       /* MF_FLOAT, MF_INT: when omitted; MF_CHOICE: the index */
    const char *const *choices; /* MF_CHOICE: the names, NULL-terminated */
    const char *field_name;     /* the params field's name (MF_FIELD), for signatures() */
    const char *given_name, *when_name; /* the names of `given` and `when` */
} MfArg;

/* an argument row's params field: its offset and its name, `M` the file's offsetof macro
 * ({"start", 3, MF_IN, 0, "H D", MF_FIELD(S, start)}) */
#define MF_FIELD(M, f) .field = M(f), .field_name = #f

/* a size of the op: the letter whose value goes to the int64 field ("..." : the element count
 * of the "..." shape) */
typedef struct {
    const char *letter;
    size_t field;
    const char *field_name;
} MfSize;

typedef struct MfCall MfCall;

typedef struct {
    const char *name;
    const MfArg *args;         /* terminated by a row with name NULL */
    const MfSize *sizes;       /* terminated by a row with letter NULL */
    size_t params_size;        /* sizeof the op's params struct */
    int (*run)(const void *);  /* the op: MF_OP(embedding_forward) */
    int64_t (*scratch)(const void *); /* the op's <op>_scratch_floats, or NULL */
    size_t scratch_field, scratch_floats_field; /* where it goes: MF_SCRATCH_FIELDS */
    int (*prepare)(MfCall *c, void *params); /* or NULL; -1 with an exception set */
    int (*check)(MfCall *c, void *params);   /* or NULL; -1 with an exception set */
    const char *index_arg;     /* the argument MF_EINDEX names ("a or b": either) */
} MfOp;

/* An op or scratch function as the table stores it: the params pointer's type differs by op
 * (any pointer parameter matches any other, as in CPython's own method tables). */
#define MF_OP(fn) ((int (*)(const void *))(void (*)(void))(fn))
#define MF_SCRATCH(fn) ((int64_t(*)(const void *))(void (*)(void))(fn))
#define MF_SCRATCH_FIELDS(T) \
    .scratch_field = offsetof(T, scratch), .scratch_floats_field = offsetof(T, scratch_floats)

/* The Python function of an op: parse, check, allocate, run, return. */
PyObject *mf_call(const MfOp *op, PyObject *args, PyObject *kwargs);
/* The op's table as Python data (a dict: the op's name, its argument rows and its sizes), the
 * one signature every other layer reads (module.c's signatures()). */
PyObject *mf_signature(const MfOp *op);

/* ---- for the hooks ---------------------------------------------------------------------- */

/* the size bound to `letter` (-1 if none) and the argument that fixed it */
int64_t mf_size(const MfCall *c, const char *letter);
const char *mf_size_from(const MfCall *c, const char *letter);
/* fix `letter` to `value` before the arrays are checked, as if argument `from` had */
int mf_pin(MfCall *c, const char *letter, int64_t value, const char *from);

/* ValueError naming the first id outside [0, V) in ids (n,); 0 if all fit */
int mf_check_ids(const int32_t *ids, int64_t n, int64_t V, const char *name);

/* The output pool's cap from MAPFORMER_POOL_MB, read once at import: 0, or -1 with a
 * ValueError naming the variable (not a whole number of megabytes) */
int mf_pool_read_env(void);
/* The output pool: its cap (MAPFORMER_POOL_MB), the bytes of the free blocks it holds, and
 * how many */
void mf_pool_stats(size_t *limit, size_t *held, int *blocks);
/* free every block the pool holds (arrays still alive keep theirs); the bytes freed */
size_t mf_pool_clear(void);
/* the attention ops' head dim: ValueError unless D is even and in [16, 128] (`arrays` names
 * the arrays whose last axis it is); a NaN *scale (None) becomes 1/sqrt(D) */
int mf_head_dim_and_scale(int64_t D, const char *arrays, float *scale);
/* the attention masks' names, by MfMask value ("causal", "none", "prefix"), NULL-terminated */
extern const char *const mf_mask_names[];
/* the attention ops' mask and prefix: ValueError naming `prefix` when it is missing with
 * mask='prefix', given with another mask, or has an entry outside [0, T] */
int mf_check_mask(int mask, const int32_t *prefix, int64_t B, int64_t T);
/* ValueError unless D is even, naming the array that fixed it (`why`: what the pairs are) */
int mf_even_head_dim(const MfCall *c, const char *why);

/* A method row of an op: its Python function is py_<op>, a one-line call of mf_call; called
 * from C with args NULL (which Python never passes), it returns the op's signature instead
 * (module.c's signatures() asks every op's function so) */
#define MF_METHOD(op, doc) \
    {#op, (PyCFunction)(void (*)(void))py_##op, METH_VARARGS | METH_KEYWORDS, doc}
#define MF_DEFINE(op, spec)                                                  \
    static PyObject *py_##op(PyObject *self, PyObject *args, PyObject *kw) { \
        (void)self;                                                          \
        if (args == NULL) return mf_signature(&(spec));                      \
        return mf_call(&(spec), args, kw);                                   \
    }

/* The attention masks' argument rows (mask, prefix) at positions pos, for a params struct
 * with fields mask and prefix; P(field) is the including file's offsetof macro */
#define MF_MASK_ROW(pos) {"mask", pos, MF_CHOICE, MF_OPTIONAL | MF_KWONLY, MF_FIELD(P, mask), \
                          .choices = mf_mask_names}
#define MF_PREFIX_ROW(pos) {"prefix", pos, MF_IN, MF_OPTIONAL | MF_NONE | MF_KWONLY, "B", \
                            MF_FIELD(P, prefix), .dtype = MF_I32}

/* ---- the op families: one list, for the declarations here and for module.c's registration.
 * Each family's method table is mf_<family>_methods, in csrc/python/bind_<family>.c
 * (module.c: the kernel-set functions and info). */
#define MF_FAMILIES(X)                                                                       \
    X(kernels) X(embedding) X(linear) X(layernorm) X(elementwise) X(mlp) X(attention)        \
    X(attention_decode)                                                                      \
    X(rotary) X(softmax_xent) X(optim) X(cope) X(tape) X(conj_attention) X(scan) X(ape)      \
    X(vq) X(lstm) X(sln) X(b4) X(nc) X(nc_general) X(gridpe) X(l2_normalize)        \
    X(relative)
#define MF_DECLARE_FAMILY(family) extern PyMethodDef mf_##family##_methods[];
MF_FAMILIES(MF_DECLARE_FAMILY)

#endif
