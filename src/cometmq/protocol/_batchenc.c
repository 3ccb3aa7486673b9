/* Optional C helper for the SDK's batch sends (cometmq.protocol.batch.encode_keyed_batch): a producer's
 * SEND_BATCH_MESSAGE body and its messages' UNIQ_KEYs in one call, instead of a key, a properties string and a
 * packed item header per message in Python; and the batch's SendResults from the answer in another.
 *
 *   encode_keyed(items, prefix, first) -> (body, keys) | None
 *       ``items`` a list of (body, properties head, flag); item i's key is ``prefix`` + ``first + i`` as 12
 *       upper-case hex digits, its properties the head + "UNIQ_KEY\x01<key>\x02WAIT\x01true\x02", packed as
 *       batch.encode_batch_raw packs them. None when anything is out of what this code handles (a value past 12
 *       digits, a non-ASCII prefix, properties over 32767 bytes, a field out of int32): the caller then runs
 *       the Python reference (batch.encode_keyed_batch_py), which encodes or raises.
 *   bind_results(cls, names)
 *       Learns where the slots of the SDK's SendResult are (common/_cslots.h); raises if ``cls`` is not a slots
 *       class with exactly those fields.
 *   send_results(status, msg_ids, offset_ids, queue, first_offset) -> list
 *       client/message.send_results in C: result i holds msg_ids[i], offset_ids[i] (or "" past its end), the
 *       queue and first_offset + i, no recall handle; made without SendResult's __init__.
 *   layout() -> dict
 *       The batch-item constants below, which tests/protocol/test_batch_encode.py checks against batch.py.
 *
 * The Python code stays the reference: tests compare the bodies and keys both produce, byte for byte.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_cslots.h"

/* Copies of cometmq.protocol.batch's: TOTALSIZE MAGICCODE BODYCRC FLAG BODYLEN (20), PROPLEN (2). */
#define ITEM_HEAD 20
#define ITEM_OVERHEAD 22
#define MAX_PROPERTIES_LENGTH 32767
#define KEY_DIGITS 12

static const char UNIQ[] = "UNIQ_KEY\x01";
static const char WAIT[] = "\x02WAIT\x01true\x02";
#define UNIQ_LEN (sizeof(UNIQ) - 1)
#define WAIT_LEN (sizeof(WAIT) - 1)

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void hex12(char *out, unsigned long long v) {
    static const char digits[] = "0123456789ABCDEF";
    for (int k = KEY_DIGITS - 1; k >= 0; k--) {
        out[k] = digits[v & 0xF];
        v >>= 4;
    }
}

typedef struct {
    Py_buffer body;
    const char *head;
    Py_ssize_t head_len;
    long flag;
} item_t;

static void release(item_t *items, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) PyBuffer_Release(&items[i].body);
    PyMem_Free(items);
}

static PyObject *encode_keyed(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *list, *prefix, *first_obj;
    if (!PyArg_ParseTuple(args, "O!UO!", &PyList_Type, &list, &prefix, &PyLong_Type, &first_obj)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list), prefix_len;
    int overflow;
    long long first_v = PyLong_AsLongLongAndOverflow(first_obj, &overflow);
    if (first_v == -1 && PyErr_Occurred()) return NULL;
    if (overflow || first_v < 0 || !PyUnicode_IS_ASCII(prefix)) Py_RETURN_NONE;
    unsigned long long first = (unsigned long long)first_v;
    const char *prefix_p = PyUnicode_AsUTF8AndSize(prefix, &prefix_len);
    if (prefix_p == NULL) return NULL;
    if (first >= (1ull << 48) || (unsigned long long)n > (1ull << 48) - first) Py_RETURN_NONE;  /* > 12 digits */
    Py_ssize_t key_len = prefix_len + KEY_DIGITS, tail = UNIQ_LEN + key_len + WAIT_LEN;
    item_t *items = PyMem_Calloc(n ? n : 1, sizeof(item_t));
    if (items == NULL) return PyErr_NoMemory();
    Py_ssize_t got = 0;
    long long total = 0;
    for (; got < n; got++) {
        PyObject *t = PyList_GET_ITEM(list, got);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(t, 1))
            || !PyLong_CheckExact(PyTuple_GET_ITEM(t, 2)))
            goto hand_back;
        item_t *it = &items[got];
        long long flag = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(t, 2), &overflow);
        if (overflow || flag < INT32_MIN || flag > INT32_MAX) goto hand_back;
        it->flag = (long)flag;
        it->head = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 1));
        it->head_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 1));
        if (it->head_len + tail > MAX_PROPERTIES_LENGTH) goto hand_back;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 0), &it->body, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            goto hand_back;
        }
        long long size = ITEM_OVERHEAD + (long long)it->body.len + it->head_len + tail;
        if (size > INT32_MAX) {
            got++;
            goto hand_back;
        }
        total += size;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total), *keys = PyList_New(n);
    if (out == NULL || keys == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(keys);
        release(items, got);
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        item_t *it = &items[i];
        Py_ssize_t props_len = it->head_len + tail;
        put_be32(p, (uint32_t)(ITEM_OVERHEAD + it->body.len + props_len));
        memset(p + 4, 0, 8);  /* MAGICCODE and BODYCRC: 0 from a client */
        put_be32(p + 12, (uint32_t)it->flag);
        put_be32(p + 16, (uint32_t)it->body.len);
        p += ITEM_HEAD;
        memcpy(p, it->body.buf, it->body.len);
        p += it->body.len;
        *p++ = (unsigned char)(props_len >> 8);
        *p++ = (unsigned char)props_len;
        memcpy(p, it->head, it->head_len);
        p += it->head_len;
        memcpy(p, UNIQ, UNIQ_LEN);
        p += UNIQ_LEN;
        char *key_at = (char *)p;
        memcpy(p, prefix_p, prefix_len);
        hex12((char *)p + prefix_len, first + (unsigned long long)i);
        p += key_len;
        memcpy(p, WAIT, WAIT_LEN);
        p += WAIT_LEN;
        PyObject *key = PyUnicode_New(key_len, 127);
        if (key == NULL) {
            Py_DECREF(out);
            Py_DECREF(keys);
            release(items, n);
            return NULL;
        }
        memcpy(PyUnicode_DATA(key), key_at, key_len);
        PyList_SET_ITEM(keys, i, key);
    }
    release(items, n);
    return Py_BuildValue("(NN)", out, keys);
hand_back:
    release(items, got);
    Py_RETURN_NONE;
}

/* -- send results ---------------------------------------------------------------------------------------------- */

static slots_t RESULT;

static PyObject *bind_results(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cls, *names;
    if (!PyArg_ParseTuple(args, "OO", &cls, &names)) return NULL;
    slots_t r = {NULL, 0, {0}};
    if (bind_slots(&r, cls, names, 6) < 0) return NULL;
    Py_XDECREF(RESULT.type);
    RESULT = r;
    Py_RETURN_NONE;
}

static PyObject *send_results(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *status, *ids, *offset_ids, *queue;
    long long first;
    if (!PyArg_ParseTuple(args, "OO!O!OL", &status, &PyList_Type, &ids, &PyList_Type, &offset_ids, &queue, &first))
        return NULL;
    if (RESULT.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_batchenc.bind_results was not called");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids), n_offset_ids = PyList_GET_SIZE(offset_ids);
    PyObject *out = PyList_New(n), *empty = PyUnicode_New(0, 0);
    if (out == NULL || empty == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *offset = PyLong_FromLongLong(first + i);
        if (offset == NULL) goto fail;
        PyObject *vals[6] = {status, PyList_GET_ITEM(ids, i),
                             i < n_offset_ids ? PyList_GET_ITEM(offset_ids, i) : empty, queue, offset, Py_None};
        PyObject *r = make_slots(&RESULT, vals);
        Py_DECREF(offset);
        if (r == NULL) goto fail;
        PyList_SET_ITEM(out, i, r);
    }
    Py_DECREF(empty);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(empty);
    return NULL;
}

static PyObject *layout(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return Py_BuildValue("{sisisisi}", "ITEM_HEAD", ITEM_HEAD, "ITEM_OVERHEAD", ITEM_OVERHEAD,
                         "MAX_PROPERTIES_LENGTH", MAX_PROPERTIES_LENGTH, "KEY_DIGITS", KEY_DIGITS);
}

static PyMethodDef methods[] = {
    {"encode_keyed", encode_keyed, METH_VARARGS, "A producer's batch body and its keys, or None (Python's job)."},
    {"bind_results", bind_results, METH_VARARGS, "Learn the slots of the SDK's SendResult."},
    {"send_results", send_results, METH_VARARGS, "A batch's SendResults, made without their __init__."},
    {"layout", layout, METH_NOARGS, "The batch-item constants this helper keeps copies of."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batchenc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__batchenc(void) { return PyModule_Create(&module); }
