/* The checker of every op (bind.h): mf_call, its helpers for the hooks, and the output pool. */
#include "bind.h"

#include "mapformer/subnormals.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MF_MAX_ROWS 28    /* rows of an op */
#define MF_MAX_PY 20      /* Python arguments of an op */
#define MF_MAX_LETTERS 12 /* letters of a call */
#define MF_MAX_PARAMS 512 /* bytes of a params struct */

typedef struct {
    const char *name; /* in a shape string or a hook's literal: len characters */
    int len, pinned;  /* pinned: by a hook (shown as its value in the messages) */
    int64_t value;
    const char *from; /* the argument that fixed it */
} Letter;

struct MfCall {
    const MfOp *op;
    int nrows;
    PyObject *obj[MF_MAX_ROWS];      /* Python values by row (borrowed; NULL: omitted) */
    PyArrayObject *arr[MF_MAX_ROWS]; /* arrays by row (borrowed, or owned: new ones) */
    int owned[MF_MAX_ROWS];
    double result[MF_MAX_ROWS];
    Letter letter[MF_MAX_LETTERS];
    int nletters;
    int ell_ndim; /* the "..." shape, and the argument that fixed it */
    npy_intp ell_dims[NPY_MAXDIMS];
    const char *ell_from;
    void *scratch; /* a block: borrowed from the pool (scratch_pooled), or the call's own */
    int scratch_pooled;
    union {
        max_align_t align;
        unsigned char bytes[MF_MAX_PARAMS];
    } params;
};

static void set_field(MfCall *c, size_t field, const void *value, size_t size) {
    memcpy(c->params.bytes + field, value, size);
}

/* the pointer the params hold at `field` */
static const void *field_pointer(const MfCall *c, size_t field) {
    const void *v;
    memcpy(&v, c->params.bytes + field, sizeof v);
    return v;
}

static int table_error(const MfCall *c, const char *what) {
    PyErr_Format(PyExc_SystemError, "mapformer._C: the table of %s %s", c->op->name, what);
    return -1;
}

/* ---- letters --------------------------------------------------------------------------- */

static Letter *find_letter(const MfCall *c, const char *name, int len) {
    for (int i = 0; i < c->nletters; i++)
        if (c->letter[i].len == len && strncmp(c->letter[i].name, name, (size_t)len) == 0)
            return (Letter *)&c->letter[i];
    return NULL;
}

static Letter *add_letter(MfCall *c, const char *name, int len, int64_t value,
                          const char *from) {
    if (c->nletters == MF_MAX_LETTERS) {
        table_error(c, "has too many letters");
        return NULL;
    }
    Letter *l = &c->letter[c->nletters++];
    *l = (Letter){name, len, 0, value, from};
    return l;
}

int64_t mf_size(const MfCall *c, const char *letter) {
    const Letter *l = find_letter(c, letter, (int)strlen(letter));
    return l != NULL ? l->value : -1;
}

const char *mf_size_from(const MfCall *c, const char *letter) {
    const Letter *l = find_letter(c, letter, (int)strlen(letter));
    return l != NULL ? l->from : "?";
}

int mf_pin(MfCall *c, const char *letter, int64_t value, const char *from) {
    Letter *l = add_letter(c, letter, (int)strlen(letter), value, from);
    if (l == NULL) return -1;
    l->pinned = 1;
    return 0;
}

/* The next token of a shape at *s: its letter (*name, *len) and whether it is halved ("D/2").
 * Returns 0 at the end. */
static int next_token(const char **s, const char **name, int *len, int *half) {
    while (**s == ' ') (*s)++;
    if (**s == '\0') return 0;
    const char *start = *s;
    while (**s != ' ' && **s != '\0') (*s)++;
    *name = start;
    *len = (int)(*s - start);
    *half = *len > 2 && strncmp(*s - 2, "/2", 2) == 0;
    if (*half) *len -= 2;
    return 1;
}

static int count_tokens(const char *shape) {
    const char *name;
    int len, half, n = 0;
    while (next_token(&shape, &name, &len, &half)) n++;
    return n;
}

/* "(B, T, H, D)" ("(N,)" for one axis; a pinned letter shows its value) */
static void shape_text(const MfCall *c, const char *shape, char *buf, size_t size) {
    const char *name;
    int len, half, n = 0;
    size_t used = (size_t)snprintf(buf, size, "(");
    while (used < size && next_token(&shape, &name, &len, &half)) {
        const Letter *l = find_letter(c, name, len);
        const char *sep = n++ ? ", " : "";
        if (l != NULL && l->pinned)
            used += (size_t)snprintf(buf + used, size - used, "%s%lld", sep,
                                     (long long)(half ? l->value / 2 : l->value));
        else
            used += (size_t)snprintf(buf + used, size - used, "%s%.*s%s", sep, len, name,
                                     half ? "/2" : "");
    }
    if (used < size) snprintf(buf + used, size - used, n == 1 ? ",)" : ")");
}

static void dims_text(int ndim, const npy_intp *dims, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld",
                                 (long long)dims[i]);
    if (used < size) snprintf(buf + used, size - used, ndim == 1 ? ",)" : ")");
}

/* ---- arrays ---------------------------------------------------------------------------- */

static const int npy_types[] = {NPY_FLOAT32, NPY_INT32, NPY_BOOL};
static const char *const dtype_names[] = {"float32", "int32", "bool"};

/* row a's shape as the messages give it: "(B, T, H, D)", or "(...)" */
static void want_text(const MfCall *c, const MfArg *a, char *buf, size_t size) {
    if (strcmp(a->shape, "...") == 0)
        snprintf(buf, size, "(...)");
    else
        shape_text(c, a->shape, buf, size);
}

/* ValueError "<name> must have shape <want><detail>, got shape <got>"; returns -1 */
static int shape_error(const MfCall *c, const MfArg *a, PyArrayObject *arr, const char *fmt,
                       ...) {
    char want[160], got[160], detail[256];
    want_text(c, a, want, sizeof want);
    dims_text(PyArray_NDIM(arr), PyArray_DIMS(arr), got, sizeof got);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    PyErr_Format(PyExc_ValueError, "%s must have shape %s%s, got shape %s", a->name, want,
                 detail, got);
    return -1;
}

/* The shape: "..." is fixed by the first such array and equal for every later one; letters
 * are bound by their first array and compared in the later ones. */
static int check_shape(MfCall *c, const MfArg *a, PyArrayObject *arr) {
    const int nd = PyArray_NDIM(arr);
    const npy_intp *dims = PyArray_DIMS(arr);
    const int any = strcmp(a->shape, "...") == 0;
    if (any ? nd < 1 : nd != count_tokens(a->shape))
        return any ? shape_error(c, a, arr, " with ndim >= 1")
                   : shape_error(c, a, arr, " (%d axes)", count_tokens(a->shape));
    for (int i = 0; i < nd; i++)
        if (dims[i] < 1) return shape_error(c, a, arr, " with no empty axis");
    if (any && c->ell_from == NULL) {
        c->ell_ndim = nd;
        memcpy(c->ell_dims, dims, (size_t)nd * sizeof(npy_intp));
        c->ell_from = a->name;
    } else if (any) {
        if (nd != c->ell_ndim || memcmp(dims, c->ell_dims, (size_t)nd * sizeof(npy_intp))) {
            char first[160];
            dims_text(c->ell_ndim, c->ell_dims, first, sizeof first);
            return shape_error(c, a, arr, " equal to %s's, %s", c->ell_from, first);
        }
    }
    const char *s = a->shape, *name;
    int len, half;
    for (int i = 0; !any && next_token(&s, &name, &len, &half); i++) {
        const Letter *l = find_letter(c, name, len);
        if (l == NULL) {
            if (add_letter(c, name, len, half ? 2 * dims[i] : dims[i], a->name) == NULL)
                return -1;
        } else if (dims[i] != (half ? l->value / 2 : l->value)) {
            return shape_error(c, a, arr,
                               "; axis %d (%.*s%s) is %lld but must be %lld: %.*s = %lld from %s",
                               i, len, name, half ? "/2" : "", (long long)dims[i],
                               (long long)(half ? l->value / 2 : l->value), len, name,
                               (long long)l->value, l->from);
        }
    }
    return 0;
}

/* Check row's array obj: type, dtype, shape, layout, writeable for what the op writes. */
static int check_array(MfCall *c, int row, PyObject *obj) {
    const MfArg *a = &c->op->args[row];
    char want[160];
    if (!PyArray_Check(obj)) {
        want_text(c, a, want, sizeof want);
        PyErr_Format(PyExc_TypeError, "%s must be a numpy array of shape %s (%s), got %s",
                     a->name, want, dtype_names[a->dtype], Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_TYPE(arr) != npy_types[a->dtype]) {
        PyErr_Format(PyExc_TypeError, "%s must have dtype %s, got %S", a->name,
                     dtype_names[a->dtype], (PyObject *)PyArray_DESCR(arr));
        return -1;
    }
    if (!PyArray_ISNOTSWAPPED(arr)) { /* read as native, it would be silently wrong */
        PyErr_Format(PyExc_ValueError,
                     "%s must be in native byte order (dtype %s), got %S: convert it with "
                     "a.astype(a.dtype.newbyteorder('='))",
                     a->name, dtype_names[a->dtype], (PyObject *)PyArray_DESCR(arr));
        return -1;
    }
    if (check_shape(c, a, arr) < 0) return -1;
    if (!PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr)) {
        want_text(c, a, want, sizeof want);
        PyErr_Format(PyExc_ValueError,
                     "%s must be C-contiguous and aligned (use np.ascontiguousarray), shape %s",
                     a->name, want);
        return -1;
    }
    if (a->kind != MF_IN && !PyArray_ISWRITEABLE(arr)) {
        PyErr_Format(PyExc_ValueError, "%s is written in place and must be writeable",
                     a->name);
        return -1;
    }
    c->arr[row] = arr;
    void *data = PyArray_DATA(arr);
    set_field(c, a->field, &data, sizeof data);
    return 0;
}

/* ---- the output pool -------------------------------------------------------------------
 * Large op outputs are recycled (and lent as scratch: make_scratch). Each lives in a
 * 64-byte-aligned block whose header records its size; the array's base object is a capsule
 * that, when the last view of the array dies, puts the block back on a free list instead of
 * freeing it. A training loop allocates the same shapes every step, so after the first step no
 * output pays the kernel's page faulting and zeroing (measured: ~4 ms per 16 MB).
 * What the pool holds is bounded by what is reused: a freed block is kept only when its size
 * has been asked for at least twice among the recent sizes (a size asked for once, as in a run
 * of outputs of varied sizes, is freed at once), and a held block whose size has not been
 * asked for in the last MF_POOL_AGE requests is freed. On top of that it holds at most
 * MAPFORMER_POOL_MB (environment, default 1024) of free blocks. It is only touched with the
 * GIL held. */
#define MF_POOL_SLOTS 128
#define MF_POOL_MIN_BYTES ((size_t)1 << 20) /* smaller outputs use NumPy's allocator */
#define MF_BLOCK_HEADER 64
#define MF_POOL_SIZES 256 /* the recent sizes asked for, and how often */
#define MF_POOL_AGE 4096  /* requests after which an unasked size's blocks are freed */

static void *pool_blocks[MF_POOL_SLOTS];
static int pool_count = 0;
static size_t pool_bytes = 0;
static size_t pool_limit; /* MAPFORMER_POOL_MB's, set at import (mf_pool_read_env) */
static uint64_t pool_clock = 0;        /* requests so far */
static struct {
    size_t size;
    uint64_t last; /* pool_clock at its last request */
    uint64_t count;
} pool_sizes[MF_POOL_SIZES];

static size_t block_size(void *block) { return *(size_t *)block; }

/* A block of `size` bytes after its header, mapped from the kernel, or NULL: its own mapping,
 * so that freeing it gives the memory back at once (glibc's malloc would serve blocks of the
 * sizes it has seen freed from its heap, which keeps them resident) */
static void *block_new(size_t size) {
    void *block = mmap(NULL, MF_BLOCK_HEADER + size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) return NULL;
    *(size_t *)block = size;
    return block;
}

static void block_free(void *block) { munmap(block, MF_BLOCK_HEADER + block_size(block)); }

/* The pool's cap from MAPFORMER_POOL_MB (unset: 1024 MB): 0, or -1 with a ValueError naming
 * the variable when it is not a whole number of megabytes (decimal digits, at most 2^40) */
int mf_pool_read_env(void) {
    const char *env = getenv("MAPFORMER_POOL_MB");
    unsigned long long mb = 1024;
    if (env != NULL) {
        int digits = env[0] != '\0';
        for (const char *ch = env; *ch != '\0'; ch++) digits &= *ch >= '0' && *ch <= '9';
        mb = digits && strlen(env) <= 13 ? strtoull(env, NULL, 10) : ULLONG_MAX;
        if (mb > (1ULL << 40)) {
            PyErr_Format(PyExc_ValueError, "MAPFORMER_POOL_MB must be a whole number of "
                         "megabytes in [0, 2**40], got '%s'", env);
            return -1;
        }
    }
    pool_limit = (size_t)mb << 20;
    return 0;
}


void mf_pool_stats(size_t *limit, size_t *held, int *blocks) {
    *limit = pool_limit;
    *held = pool_bytes;
    *blocks = pool_count;
}

size_t mf_pool_clear(void) {
    size_t freed = 0;
    while (pool_count > 0) {
        void *block = pool_blocks[--pool_count];
        freed += block_size(block);
        block_free(block);
    }
    pool_bytes = 0;
    return freed;
}

/* the entry of `size` among the recent sizes, or NULL; with `add`, made (replacing the least
 * recently asked one) when missing */
static int pool_size_entry(size_t size, int add) {
    int oldest = 0;
    for (int i = 0; i < MF_POOL_SIZES; i++) {
        if (pool_sizes[i].size == size && pool_sizes[i].count > 0) return i;
        if (pool_sizes[i].last < pool_sizes[oldest].last) oldest = i;
    }
    if (!add) return -1;
    pool_sizes[oldest].size = size;
    pool_sizes[oldest].count = 0;
    return oldest;
}

/* a request for a block of `size` bytes, counted */
static void pool_note(size_t size) {
    const int e = pool_size_entry(size, 1);
    pool_sizes[e].last = ++pool_clock;
    pool_sizes[e].count++;
}

/* whether blocks of `size` are reused: asked for twice, the last time recently */
static int pool_reused(size_t size) {
    const int e = pool_size_entry(size, 0);
    return e >= 0 && pool_sizes[e].count >= 2 && pool_clock - pool_sizes[e].last <= MF_POOL_AGE;
}

/* free the held blocks whose size is no longer reused (looked at every 64 requests) */
static void pool_trim(void) {
    static uint64_t trimmed = 0;
    if (pool_clock - trimmed < 64) return;
    trimmed = pool_clock;
    for (int i = pool_count - 1; i >= 0; i--) {
        if (pool_reused(block_size(pool_blocks[i]))) continue;
        void *block = pool_blocks[i];
        pool_blocks[i] = pool_blocks[--pool_count];
        pool_bytes -= block_size(block);
        block_free(block);
    }
}

/* a block of `size` bytes (a multiple of MF_BLOCK_HEADER) after its header, or NULL */
static void *pool_take(size_t size) {
    pool_note(size);
    for (int i = pool_count - 1; i >= 0; i--) {
        if (block_size(pool_blocks[i]) == size) {
            void *block = pool_blocks[i];
            pool_blocks[i] = pool_blocks[--pool_count];
            pool_bytes -= size;
            return block;
        }
    }
    return block_new(size);
}

static void pool_give(void *block) {
    const size_t size = block_size(block);
    pool_trim();
    if (pool_reused(size) && pool_count < MF_POOL_SLOTS && pool_bytes + size <= pool_limit) {
        pool_blocks[pool_count++] = block;
        pool_bytes += size;
    } else {
        block_free(block);
    }
}

static void pool_release(PyObject *capsule) {
    pool_give(PyCapsule_GetPointer(capsule, "mapformer.buffer"));
}

static size_t block_bytes(size_t bytes) {
    return (bytes + MF_BLOCK_HEADER - 1) / MF_BLOCK_HEADER * MF_BLOCK_HEADER;
}

/* A new C-contiguous array of dtype `type` (an NPY_ type of npy_types; uninitialised): from
 * the pool when it is large, else from NumPy. */
static PyArrayObject *new_array(int ndim, const npy_intp *shape, int type) {
    size_t size = type == NPY_BOOL ? 1 : sizeof(float);
    for (int i = 0; i < ndim; i++) size *= (size_t)shape[i];
    if (size < MF_POOL_MIN_BYTES)
        return (PyArrayObject *)PyArray_EMPTY(ndim, (npy_intp *)shape, type, 0);
    void *block = pool_take(block_bytes(size));
    if (block == NULL) return (PyArrayObject *)PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(block, "mapformer.buffer", pool_release);
    if (capsule == NULL) {
        block_free(block);
        return NULL;
    }
    PyObject *array = PyArray_NewFromDescr(&PyArray_Type, PyArray_DescrFromType(type),
                                           ndim, (npy_intp *)shape, NULL,
                                           (char *)block + MF_BLOCK_HEADER, NPY_ARRAY_CARRAY,
                                           NULL);
    if (array == NULL) {
        Py_DECREF(capsule); /* gives the block back to the pool */
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)array, capsule) < 0) { /* steals capsule */
        Py_DECREF(array);
        return NULL;
    }
    return (PyArrayObject *)array;
}

/* Row a's new output, shaped by its letters */
static int new_output(MfCall *c, int row) {
    const MfArg *a = &c->op->args[row];
    npy_intp shape[NPY_MAXDIMS];
    int nd = 0;
    if (strcmp(a->shape, "...") == 0) {
        nd = c->ell_ndim;
        memcpy(shape, c->ell_dims, (size_t)nd * sizeof(npy_intp));
    } else {
        const char *s = a->shape, *name;
        int len, half;
        while (next_token(&s, &name, &len, &half)) {
            const Letter *l = find_letter(c, name, len);
            if (l == NULL || nd == NPY_MAXDIMS) return table_error(c, "has an output of no size");
            shape[nd++] = (npy_intp)(half ? l->value / 2 : l->value);
        }
    }
    if ((c->arr[row] = new_array(nd, shape, npy_types[a->dtype])) == NULL) return -1;
    c->owned[row] = 1;
    void *data = PyArray_DATA(c->arr[row]);
    set_field(c, a->field, &data, sizeof data);
    return 0;
}

/* ---- numbers --------------------------------------------------------------------------- */

static int range_error(const MfArg *a, double x) {
    char lo[32], hi[32], what[96];
    snprintf(lo, sizeof lo, "%g", a->lo);
    snprintf(hi, sizeof hi, "%g", a->hi);
    if (isinf(a->lo) && isinf(a->hi))
        snprintf(what, sizeof what, "a finite number");
    else
        snprintf(what, sizeof what, "a %snumber in %c%s, %s%c",
                 isinf(a->hi) && !(a->open & MF_HI_OPEN) ? "" : "finite ",
                 a->open & MF_LO_OPEN ? '(' : '[', lo, hi, a->open & MF_HI_OPEN ? ')' : ']');
    PyObject *value = PyFloat_FromDouble(x);
    if (value == NULL) return -1;
    PyErr_Format(PyExc_ValueError, "%s must be %s (as float32), got %R", a->name, what, value);
    Py_DECREF(value);
    return -1;
}

static int in_range(const MfArg *a, double x) {
    const int lo_ok = a->open & MF_LO_OPEN ? x > a->lo : x >= a->lo;
    const int hi_ok = a->open & MF_HI_OPEN ? x < a->hi : x <= a->hi;
    return lo_ok && hi_ok && (isfinite(x) || (isinf(x) && x == a->hi && !(a->open & MF_HI_OPEN)));
}

/* a complex number: Python's, a NumPy complex scalar or a complex array (NumPy's float()
 * of one drops the imaginary part; Python's refuses it, and so do the real arguments) */
static int is_complex(PyObject *obj) {
    return PyComplex_Check(obj) || PyArray_IsScalar(obj, ComplexFloating) ||
           (PyArray_Check(obj) && PyArray_ISCOMPLEX((PyArrayObject *)obj));
}

static int parse_float(MfCall *c, const MfArg *a, PyObject *obj) {
    float f = (float)a->dflt;
    if (obj == NULL || (obj == Py_None && (a->flags & MF_NONE))) {
        if (a->flags & MF_NONE) f = NAN; /* the check hook's default */
        set_field(c, a->field, &f, sizeof f);
        return 0;
    }
    if (is_complex(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a real number%s, got %s", a->name,
                     a->flags & MF_NONE ? " or None" : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    double x = PyFloat_AsDouble(obj); /* anything with __float__, as the "d" format */
    if (x == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) { /* an int beyond any double */
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be a finite number, got an int too large "
                         "for a float", a->name);
        } else if (PyErr_ExceptionMatches(PyExc_TypeError)) { /* say which argument */
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a real number%s, got %s", a->name,
                         a->flags & MF_NONE ? " or None" : "", Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
    f = (float)x;
    if (!in_range(a, x) || !in_range(a, (double)f)) return range_error(a, x);
    set_field(c, a->field, &f, sizeof f);
    return 0;
}

static int parse_int(MfCall *c, const MfArg *a, PyObject *obj) {
    int64_t v = (int64_t)a->dflt;
    if (obj != NULL) {
        /* an integer (int, NumPy integer: anything with __index__), not a bool or a float */
        if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
            PyErr_Format(PyExc_TypeError, "%s must be an int >= %lld, got %R", a->name,
                         (long long)a->lo, obj);
            return -1;
        }
        PyObject *i = PyNumber_Index(obj);
        if (i == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
            PyErr_Clear(); /* a 0-d array of floats has __index__ but no integer: say which */
            PyErr_Format(PyExc_TypeError, "%s must be an int >= %lld, got %R", a->name,
                         (long long)a->lo, obj);
            return -1;
        }
        int overflow = 0;
        const long long x = PyLong_AsLongLongAndOverflow(i, &overflow);
        Py_DECREF(i);
        if (x == -1 && PyErr_Occurred()) return -1;
        if (overflow != 0) {
            PyErr_Format(PyExc_ValueError, "%s must be an int >= %lld and < 2**63, got %R",
                         a->name, (long long)a->lo, obj);
            return -1;
        }
        if ((double)x < a->lo) {
            PyErr_Format(PyExc_ValueError, "%s must be an int >= %lld, got %lld", a->name,
                         (long long)a->lo, x);
            return -1;
        }
        v = (int64_t)x;
    }
    set_field(c, a->field, &v, sizeof v);
    return 0;
}

static int parse_choice(MfCall *c, const MfArg *a, PyObject *obj) {
    int index = (int)a->dflt;
    const char *s = obj == NULL ? a->choices[index] : NULL;
    Py_ssize_t len = s != NULL ? (Py_ssize_t)strlen(s) : 0;
    int text = 0; /* a str that has no UTF-8 form (a lone surrogate): no name, a ValueError */
    if (obj != NULL && PyUnicode_Check(obj) &&
        (s = PyUnicode_AsUTF8AndSize(obj, &len)) == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
        PyErr_Clear();
        text = 1;
    }
    if (s != NULL) /* the whole string: one with an embedded NUL matches no name */
        for (index = 0; a->choices[index] != NULL; index++)
            if ((size_t)len == strlen(a->choices[index]) && strcmp(s, a->choices[index]) == 0)
                break;
    if (s == NULL || a->choices[index] == NULL) {
        char names[160];
        size_t used = 0;
        for (int i = 0; a->choices[i] != NULL && used < sizeof names; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'", i ? ", " : "",
                                     a->choices[i]);
        if (s == NULL && !text)
            PyErr_Format(PyExc_TypeError, "%s must be a str, one of %s; got %s", a->name, names,
                         Py_TYPE(obj)->tp_name);
        else
            PyErr_Format(PyExc_ValueError, "%s must be one of %s, got %R", a->name, names, obj);
        return -1;
    }
    set_field(c, a->field, &index, sizeof index);
    return 0;
}

/* ---- the call -------------------------------------------------------------------------- */

/* The Python arguments into c->obj by row, with PyArg_ParseTupleAndKeywords (every argument an
 * object "O": the rows' kinds convert them) */
static int parse_args(MfCall *c, PyObject *args, PyObject *kwargs) {
    const MfArg *rows = c->op->args;
    int row_at[MF_MAX_PY], n = 0;
    for (int k = 0; k < MF_MAX_PY; k++) row_at[k] = -1;
    for (c->nrows = 0; rows[c->nrows].name != NULL; c->nrows++) {
        const int pos = rows[c->nrows].pos;
        if (c->nrows == MF_MAX_ROWS - 1 || pos > MF_MAX_PY) return table_error(c, "is too long");
        if (pos > 0) row_at[pos - 1] = c->nrows, n++;
    }
    if (n > MF_MAX_PY) return table_error(c, "repeats a position");
    char *kwlist[MF_MAX_PY + 1], fmt[MF_MAX_PY + 80];
    int f = 0, optional = 0, kwonly = 0;
    for (int k = 0; k < n; k++) {
        if (row_at[k] < 0) return table_error(c, "has a gap in its positions");
        const MfArg *a = &rows[row_at[k]];
        const int opt = (a->flags & (MF_OPTIONAL | MF_KWONLY)) != 0;
        if (optional && !opt) return table_error(c, "has a required argument after optional ones");
        if (opt && !optional) fmt[f++] = '|', optional = 1;
        if ((a->flags & MF_KWONLY) && !kwonly) fmt[f++] = '$', kwonly = 1;
        fmt[f++] = 'O';
        kwlist[k] = (char *)a->name;
    }
    kwlist[n] = NULL;
    snprintf(fmt + f, sizeof fmt - (size_t)f, ":%s", c->op->name);
    PyObject *v[MF_MAX_PY] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kwlist, &v[0], &v[1], &v[2], &v[3],
                                     &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11],
                                     &v[12], &v[13], &v[14], &v[15], &v[16], &v[17], &v[18],
                                     &v[19]))
        return -1;
    for (int k = 0; k < n; k++) {
        const MfArg *a = &rows[row_at[k]];
        if (v[k] == NULL && !(a->flags & MF_OPTIONAL)) { /* a required keyword-only one */
            PyErr_Format(PyExc_TypeError, "%s() missing required keyword-only argument '%s'",
                         c->op->name, a->name);
            return -1;
        }
        c->obj[row_at[k]] = v[k];
    }
    return 0;
}

static int parse_numbers(MfCall *c) {
    for (int i = 0; i < c->nrows; i++) {
        const MfArg *a = &c->op->args[i];
        const int st = a->kind == MF_FLOAT    ? parse_float(c, a, c->obj[i])
                       : a->kind == MF_INT    ? parse_int(c, a, c->obj[i])
                       : a->kind == MF_CHOICE ? parse_choice(c, a, c->obj[i])
                                              : 0;
        if (st < 0) return -1;
    }
    return 0;
}

static int check_arrays(MfCall *c) {
    for (int i = 0; i < c->nrows; i++) {
        const MfArg *a = &c->op->args[i];
        PyObject *obj = c->obj[i];
        if (a->kind != MF_IN && a->kind != MF_INOUT && a->kind != MF_OUT_OR_INTO) continue;
        if (obj == NULL || (obj == Py_None && (a->flags & MF_NONE))) continue; /* NULL, new */
        if (check_array(c, i, obj) < 0) return -1;
        if (a->kind == MF_OUT_OR_INTO) set_field(c, a->given, &(int){1}, sizeof(int));
    }
    return 0;
}

/* the op's sizes from the letters into its fields */
static int set_sizes(MfCall *c) {
    for (const MfSize *s = c->op->sizes; s != NULL && s->letter != NULL; s++) {
        int64_t v = 1;
        if (strcmp(s->letter, "...") == 0) {
            for (int i = 0; i < c->ell_ndim; i++) v *= (int64_t)c->ell_dims[i];
        } else {
            const Letter *l = find_letter(c, s->letter, (int)strlen(s->letter));
            if (l == NULL) return table_error(c, "has a size no array fixes");
            v = l->value;
        }
        set_field(c, s->field, &v, sizeof v);
    }
    return 0;
}

/* new outputs, and where the results go */
static int make_outputs(MfCall *c) {
    for (int i = 0; i < c->nrows; i++) {
        const MfArg *a = &c->op->args[i];
        if (a->kind == MF_OUT && (a->flags & MF_OPTIONAL) && field_pointer(c, a->when) == NULL)
            continue; /* not made: None */
        if ((a->kind == MF_OUT || a->kind == MF_OUT_OR_INTO) && c->arr[i] == NULL &&
            new_output(c, i) < 0)
            return -1;
        if (a->kind == MF_RESULT) {
            double *r = &c->result[i];
            set_field(c, a->field, &r, sizeof r);
        }
    }
    return 0;
}

/* every array the op writes against every other array of the call */
static int check_overlaps(const MfCall *c) {
    for (int i = 0; i < c->nrows; i++) {
        const int kind = c->op->args[i].kind;
        if (c->arr[i] == NULL || kind == MF_IN) continue;
        const char *o = PyArray_BYTES(c->arr[i]), *oe = o + PyArray_NBYTES(c->arr[i]);
        for (int j = 0; j < c->nrows; j++) {
            if (j == i || c->arr[j] == NULL) continue;
            const char *a = PyArray_BYTES(c->arr[j]), *ae = a + PyArray_NBYTES(c->arr[j]);
            if (o < ae && a < oe) {
                PyErr_Format(PyExc_ValueError, "%s must not share memory with %s",
                             c->op->args[i].name, c->op->args[j].name);
                return -1;
            }
        }
    }
    return 0;
}

/* The op's scratch (64-byte aligned): borrowed from the pool, the smallest free block that
 * holds it (a training step frees activations of every size it allocates), and given back
 * after the call; when none is free, a block of its own for the call: from the heap when
 * small (below glibc's mmap threshold), else mapped and unmapped. Scratch so keeps no memory
 * resident that the op's own malloc would not have had (measured: larger blocks freed to or
 * pooled from the heap moved glibc's mmap threshold and left a training step's peak RSS 4 to
 * 90 MB higher; mapped ones left it as before). */
#define MF_SCRATCH_HEAP_BYTES ((size_t)1 << 17) /* glibc's default M_MMAP_THRESHOLD */

static int make_scratch(MfCall *c) {
    if (c->op->scratch == NULL) return 0;
    const int64_t n = c->op->scratch(c->params.bytes);
    if (n <= 0) return 0;
    const size_t size = block_bytes((size_t)n * sizeof(float));
    int best = -1;
    for (int i = 0; i < pool_count; i++)
        if (block_size(pool_blocks[i]) >= size &&
            (best < 0 || block_size(pool_blocks[i]) < block_size(pool_blocks[best])))
            best = i;
    void *block;
    if (best >= 0) {
        block = pool_blocks[best];
        pool_blocks[best] = pool_blocks[--pool_count];
        pool_bytes -= block_size(block);
        c->scratch_pooled = 1;
    } else {
        if (size >= MF_SCRATCH_HEAP_BYTES) {
            block = block_new(size);
        } else if ((block = aligned_alloc(MF_BLOCK_HEADER, MF_BLOCK_HEADER + size)) != NULL) {
            *(size_t *)block = size;
        }
        if (block == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    c->scratch = block;
    float *data = (float *)((char *)block + MF_BLOCK_HEADER);
    set_field(c, c->op->scratch_field, &data, sizeof data);
    set_field(c, c->op->scratch_floats_field, &n, sizeof n);
    return 0;
}

static void release_scratch(MfCall *c) {
    if (c->scratch == NULL) return;
    const size_t size = block_size(c->scratch);
    if (c->scratch_pooled)
        pool_give(c->scratch);
    else if (size < MF_SCRATCH_HEAP_BYTES)
        free(c->scratch);
    else
        block_free(c->scratch);
}

static void raise_status(const MfCall *c, int status) {
    if (PyErr_Occurred()) return;
    if (status == MF_EINDEX && c->op->index_arg != NULL)
        PyErr_Format(PyExc_ValueError,
                     "%s holds an id out of range where %s read it (the array was changed "
                     "while the op ran)",
                     c->op->index_arg, c->op->name);
    else
        PyErr_Format(status == MF_ENOMEM ? PyExc_MemoryError : PyExc_ValueError,
                     "%s failed: %s (status %d)", c->op->name, mf_status_string(status),
                     status);
}

/* None, the one output, or a tuple of them, in row order */
static PyObject *build_result(const MfCall *c) {
    PyObject *out[MF_MAX_ROWS];
    int n = 0;
    for (int i = 0; i < c->nrows; i++) {
        const int kind = c->op->args[i].kind;
        if (kind == MF_OUT || kind == MF_OUT_OR_INTO) {
            PyObject *o = c->arr[i] ? (PyObject *)c->arr[i] : Py_None; /* None: not made */
            Py_INCREF(o);
            out[n++] = o;
        } else if (kind == MF_RESULT && (out[n++] = PyFloat_FromDouble(c->result[i])) == NULL) {
            for (int k = 0; k < n - 1; k++) Py_DECREF(out[k]);
            return NULL;
        }
    }
    if (n < 2) {
        if (n == 0) Py_INCREF(Py_None);
        return n == 0 ? Py_None : out[0];
    }
    PyObject *tuple = PyTuple_New(n);
    for (int k = 0; k < n; k++) {
        if (tuple != NULL)
            PyTuple_SET_ITEM(tuple, k, out[k]); /* steals */
        else
            Py_DECREF(out[k]);
    }
    return tuple;
}

PyObject *mf_call(const MfOp *op, PyObject *args, PyObject *kwargs) {
    MfCall c;
    memset(&c, 0, sizeof c);
    c.op = op;
    PyObject *result = NULL;
    void *p = c.params.bytes;
    int status;
    if (op->params_size > sizeof c.params) {
        table_error(&c, "has too large a params struct");
        goto done;
    }
    if (parse_args(&c, args, kwargs) < 0 || parse_numbers(&c) < 0) goto done;
    if (op->prepare != NULL && op->prepare(&c, p) < 0) goto done;
    /* overlaps first (new outputs cannot overlap what was given): the value checks of a hook
     * would otherwise read one argument's values through another's name */
    if (check_arrays(&c) < 0 || set_sizes(&c) < 0 || check_overlaps(&c) < 0) goto done;
    if (op->check != NULL && op->check(&c, p) < 0) goto done;
    if (make_outputs(&c) < 0 || make_scratch(&c) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS;
    const unsigned long long fp_state = mf_subnormals_enter();
    status = op->run(p);
    mf_subnormals_leave(fp_state);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK)
        raise_status(&c, status);
    else
        result = build_result(&c);
done:
    for (int i = 0; i < c.nrows; i++)
        if (c.owned[i]) Py_DECREF(c.arr[i]);
    release_scratch(&c);
    return result;
}

/* ---- helpers of the hooks -------------------------------------------------------------- */

int mf_check_ids(const int32_t *ids, int64_t n, int64_t V, const char *name) {
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) {
            PyErr_Format(PyExc_ValueError, "%s[%lld] = %d is out of range [0, %lld)", name,
                         (long long)i, (int)ids[i], (long long)V);
            return -1;
        }
    }
    return 0;
}

const char *const mf_mask_names[] = {"causal", "none", "prefix", NULL};

int mf_check_mask(int mask, const int32_t *prefix, int64_t B, int64_t T) {
    if (mask == MF_MASK_PREFIX && prefix == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "prefix (int32 (B,), the prefix lengths) is required with mask='prefix'");
        return -1;
    }
    if (mask != MF_MASK_PREFIX && prefix != NULL) {
        PyErr_Format(PyExc_ValueError, "prefix is read only with mask='prefix', got mask='%s'",
                     mf_mask_names[mask]);
        return -1;
    }
    return prefix != NULL ? mf_check_ids(prefix, B, T + 1, "prefix") : 0;
}

int mf_head_dim_and_scale(int64_t D, const char *arrays, float *scale) {
    if (D % 2 != 0 || D < 16 || D > 128) {
        PyErr_Format(PyExc_ValueError,
                     "head dim D (the last axis of %s) must be even and in [16, 128], got %lld",
                     arrays, (long long)D);
        return -1;
    }
    if (isnan(*scale)) *scale = (float)(1.0 / sqrt((double)D));
    return 0;
}

int mf_even_head_dim(const MfCall *c, const char *why) {
    const int64_t D = mf_size(c, "D");
    if (D % 2 == 0) return 0;
    PyErr_Format(PyExc_ValueError, "%s has head dim D = %lld: the head dim D must be even (%s)",
                 mf_size_from(c, "D"), (long long)D, why);
    return -1;
}

/* ---- signatures ------------------------------------------------------------------------- */

/* dict[key] = value, consuming the new reference `value` (NULL: an exception is set) */
static int put(PyObject *dict, const char *key, PyObject *value) {
    if (value == NULL) return -1;
    const int status = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return status;
}

static PyObject *str_or_none(const char *s) {
    if (s == NULL) Py_RETURN_NONE;
    return PyUnicode_FromString(s);
}

static PyObject *flag(int set) { return PyBool_FromLong(set != 0); }

static PyObject *new_ref(PyObject *o) {
    Py_INCREF(o);
    return o;
}

static const char *const kind_names[] = {NULL,     "in",     "inout", "out",   "out_or_into",
                                         "result", "float", "int",   "choice"};

/* what an omitted optional row is: None for arrays (and MF_NONE numbers), else its dflt */
static PyObject *default_of(const MfArg *a) {
    if (!(a->flags & MF_OPTIONAL) || a->kind <= MF_OUT_OR_INTO || (a->flags & MF_NONE))
        Py_RETURN_NONE;
    if (a->kind == MF_FLOAT) return PyFloat_FromDouble(a->dflt);
    if (a->kind == MF_INT) return PyLong_FromLongLong((long long)a->dflt);
    if (a->kind == MF_CHOICE) return PyUnicode_FromString(a->choices[(int)a->dflt]);
    Py_RETURN_NONE;
}

static PyObject *arg_signature(const MfArg *a) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    const int array = a->kind >= MF_IN && a->kind <= MF_OUT_OR_INTO;
    const int written = a->kind >= MF_INOUT && a->kind <= MF_RESULT;
    if (put(d, "name", PyUnicode_FromString(a->name)) < 0 ||
        put(d, "pos", a->pos ? PyLong_FromLong(a->pos) : new_ref(Py_None)) < 0 ||
        put(d, "kind", PyUnicode_FromString(kind_names[a->kind])) < 0 ||
        put(d, "written", flag(written)) < 0 ||
        put(d, "optional", flag(a->flags & MF_OPTIONAL)) < 0 ||
        put(d, "accepts_none", flag(a->flags & MF_NONE)) < 0 ||
        put(d, "kwonly", flag(a->flags & MF_KWONLY)) < 0 ||
        put(d, "shape", str_or_none(array ? a->shape : NULL)) < 0 ||
        put(d, "dtype", str_or_none(array ? dtype_names[a->dtype] : NULL)) < 0 ||
        put(d, "field", str_or_none(a->field_name)) < 0 ||
        put(d, "given", str_or_none(a->given_name)) < 0 ||
        put(d, "when", str_or_none(a->when_name)) < 0 ||
        put(d, "default", default_of(a)) < 0)
        goto fail;
    if (a->kind == MF_FLOAT &&
        (put(d, "low", PyFloat_FromDouble(a->lo)) < 0 ||
         put(d, "high", PyFloat_FromDouble(a->hi)) < 0 ||
         put(d, "low_open", flag(a->open & MF_LO_OPEN)) < 0 ||
         put(d, "high_open", flag(a->open & MF_HI_OPEN)) < 0))
        goto fail;
    if (a->kind == MF_INT && put(d, "low", PyLong_FromLongLong((long long)a->lo)) < 0)
        goto fail;
    if (a->kind == MF_CHOICE) {
        PyObject *names = PyList_New(0);
        if (names == NULL) goto fail;
        for (int i = 0; a->choices[i] != NULL; i++) {
            PyObject *s = PyUnicode_FromString(a->choices[i]);
            if (s == NULL || PyList_Append(names, s) < 0) {
                Py_XDECREF(s);
                Py_DECREF(names);
                goto fail;
            }
            Py_DECREF(s);
        }
        if (put(d, "choices", names) < 0) goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

PyObject *mf_signature(const MfOp *op) {
    PyObject *d = PyDict_New(), *args = PyList_New(0), *sizes = PyDict_New();
    if (d == NULL || args == NULL || sizes == NULL) goto fail;
    for (const MfArg *a = op->args; a->name != NULL; a++) {
        PyObject *row = arg_signature(a);
        if (row == NULL || PyList_Append(args, row) < 0) {
            Py_XDECREF(row);
            goto fail;
        }
        Py_DECREF(row);
    }
    for (const MfSize *s = op->sizes; s != NULL && s->letter != NULL; s++)
        if (put(sizes, s->letter, str_or_none(s->field_name)) < 0) goto fail;
    if (put(d, "name", PyUnicode_FromString(op->name)) < 0 ||
        put(d, "args", new_ref(args)) < 0 || put(d, "sizes", new_ref(sizes)) < 0 ||
        put(d, "scratch", flag(op->scratch != NULL)) < 0 ||
        put(d, "index_arg", str_or_none(op->index_arg)) < 0)
        goto fail;
    Py_DECREF(args);
    Py_DECREF(sizes);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(args);
    Py_XDECREF(sizes);
    return NULL;
}
