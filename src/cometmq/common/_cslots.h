/* Objects of a Python slots class made and read from C without its __init__: what cometmq's C helpers use to
 * build many small dataclass instances per call (store/_batchc.c, protocol/_batchenc.c). ``bind_slots`` finds where
 * each named field lives (its member descriptor's offset) and refuses a class that is not a plain slots class with
 * exactly those writable object fields; ``make_slots`` allocates an instance (as object.__new__ does) and sets them
 * all. Every field must be set: the Python side checks the field list (dataclasses.fields) before binding. */
#ifndef COMETMQ_CSLOTS_H
#define COMETMQ_CSLOTS_H
#include <Python.h>
#include <structmember.h>

#define MAX_SLOTS 16
typedef struct {
    PyTypeObject *type;
    int n;
    Py_ssize_t off[MAX_SLOTS];
} slots_t;

static int bind_slots(slots_t *s, PyObject *type, PyObject *names, int expected) {
    if (!PyType_Check(type) || !PyTuple_Check(names) || PyTuple_GET_SIZE(names) != expected || expected > MAX_SLOTS) {
        PyErr_SetString(PyExc_TypeError, "bind: a type and a tuple of its field names");
        return -1;
    }
    PyTypeObject *t = (PyTypeObject *)type;
    if (t->tp_dictoffset != 0 || t->tp_alloc != PyType_GenericAlloc) {
        PyErr_Format(PyExc_TypeError, "bind: %s is not a plain slots class", t->tp_name);
        return -1;
    }
    for (int k = 0; k < expected; k++) {
        PyObject *d = PyObject_GetAttr(type, PyTuple_GET_ITEM(names, k));
        if (d == NULL) {
            PyErr_Format(PyExc_TypeError, "bind: %s has no field %R", t->tp_name, PyTuple_GET_ITEM(names, k));
            return -1;
        }
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyDescrObject *)d)->d_type == t
                 && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
                 && !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        if (ok) s->off[k] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "bind: %R is not a writable slot of %s", PyTuple_GET_ITEM(names, k),
                         t->tp_name);
            return -1;
        }
    }
    Py_INCREF(type);
    s->type = t;
    s->n = expected;
    return 0;
}

#define SLOT(obj, s, k) (*(PyObject **)((char *)(obj) + (s).off[k]))

/* A new instance of ``s``'s type with its slots set to ``vals`` (new references taken; NULL: an error). */
static PyObject *make_slots(slots_t *s, PyObject *const *vals) {
    PyObject *o = s->type->tp_alloc(s->type, 0);
    if (o == NULL) return NULL;
    for (int k = 0; k < s->n; k++) SLOT(o, *s, k) = Py_NewRef(vals[k]);
    return o;
}

/* ``make_slots`` for an object that can be in no reference cycle: one whose fields hold only strings, numbers, bytes,
 * None and other such objects (a RawProperties, a dict of strings), as a message, its properties and its dispatch
 * request do. It is left out of the cycle collector's walks, as CPython leaves a tuple or dict of such values out:
 * a broker makes one or more per message, keeps them until dispatched and indexed, and the collector's walks over
 * them were a third of the CPU of a large append (docs/benchmarks.md). */
static inline PyObject *make_leaf(slots_t *s, PyObject *const *vals) {
    PyObject *o = make_slots(s, vals);
    if (o != NULL && PyObject_IS_GC(o)) PyObject_GC_UnTrack(o);
    return o;
}

#endif
