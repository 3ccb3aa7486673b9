/* cometmq.client._sendfast: the SDK connection's lone-reply decoder in C (client/wire.py).
 *
 *   bind(command_cls, names, json_type, loads)
 *       Learns where RemotingCommand's slots are (common/_cslots.h; raises if ``command_cls`` is not a slots class
 *       with exactly those 9 fields), the SerializeType.JSON member and the JSON decoder (orjson.loads).
 *   lone_reply(data, max_frame_size) -> RemotingCommand | None
 *       client/wire._lone_reply_py in C: the command when ``data`` (bytes) is one whole JSON-header response frame
 *       of the usual shape (integer fields in int32, a string language, a string or no remark, string ext
 *       fields), built without RemotingCommand's __init__; None otherwise. The decoder's ValueError means None;
 *       any other error is raised, as the Python code does. A header in the compact form the brokers write (no
 *       whitespace, no escapes, integers and strings) is read here without the decoder (``compact_object``):
 *       the same dict the decoder would make.
 *
 *   bind_results(result_cls, names, queue_cls)
 *       Learns where SendResult's slots are (6 fields) and the MessageQueue class.
 *   send_result(status, ext, queue, msg_id) -> SendResult | None
 *       client/producer.Producer._result_one_py past the status check, in C: the offset and queue id from the
 *       reply's ext fields (int() of the text; either unreadable: -1 and the queue's own id), the first of its
 *       offset msgIds, its recall handle or None. None (the caller goes the Python way) when the broker names
 *       another queue, a field is not a str, or ``queue`` is not a MessageQueue.
 *
 * The Python code stays the reference: tests/client/test_wire.py compares both on the same frames.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_cslots.h"

#define RESPONSE_FLAG 0x1

static slots_t COMMAND = {NULL, 0, {0}}, RESULT = {NULL, 0, {0}};
static PyObject *QUEUE_CLS = NULL;
static PyObject *S_QUEUE_OFFSET, *S_QUEUE_ID, *S_MSG_ID, *S_RECALL, *S_QUEUE_ID_ATTR, *S_MINUS_ONE, *S_EMPTY;
static PyObject *JSON_TYPE = NULL, *LOADS = NULL;
static PyObject *S_CODE, *S_OPAQUE, *S_FLAG, *S_VERSION, *S_LANGUAGE, *S_REMARK, *S_EXT, *S_JAVA, *ZERO;

static PyObject *bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cls, *names, *json_type, *loads;
    if (!PyArg_ParseTuple(args, "OOOO", &cls, &names, &json_type, &loads)) return NULL;
    slots_t c = {NULL, 0, {0}};
    if (bind_slots(&c, cls, names, 9) < 0) return NULL;
    Py_XDECREF(COMMAND.type);
    COMMAND = c;
    Py_XSETREF(JSON_TYPE, Py_NewRef(json_type));
    Py_XSETREF(LOADS, Py_NewRef(loads));
    Py_RETURN_NONE;
}

/* 1 when ``v`` is an int (not a subclass: no bool) in int32; 0 otherwise (no error left set). */
static int is_int32(PyObject *v) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return x >= INT32_MIN && x <= INT32_MAX;
}

/* The compact JSON the brokers write (no whitespace, no escapes), read without the JSON decoder: an object of
 * strings, integers (at most 18 digits), nulls and objects of strings. Each returns 1 with the value made, 0 when
 * the text is anything else (the decoder then reads it: the same value, or its error), -1 on an error set. */
static int compact_string(const unsigned char **pp, const unsigned char *end, PyObject **out) {
    const unsigned char *p = *pp;
    if (p >= end || *p != '"') return 0;
    const unsigned char *start = ++p;
    while (p < end && *p != '"') {
        if (*p == '\\' || *p < 0x20) return 0;
        p++;
    }
    if (p >= end) return 0;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)start, p - start, NULL);
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    *out = text;
    *pp = p + 1;
    return 1;
}

static int compact_int(const unsigned char **pp, const unsigned char *end, PyObject **out) {
    const unsigned char *p = *pp;
    int negative = p < end && *p == '-';
    if (negative) p++;
    const unsigned char *digits = p;
    long long x = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - digits >= 18) return 0;  /* past 18 digits: not taken here (and x would overflow) */
        x = x * 10 + (*p - '0');
        p++;
    }
    Py_ssize_t n = p - digits;
    if (n == 0 || (n > 1 && *digits == '0')) return 0;
    if ((*out = PyLong_FromLongLong(negative ? -x : x)) == NULL) return -1;
    *pp = p;
    return 1;
}

static int compact_object(const unsigned char **pp, const unsigned char *end, int nested, PyObject **out) {
    const unsigned char *p = *pp;
    if (p >= end || *p != '{') return 0;
    PyObject *dict = PyDict_New();
    if (dict == NULL) return -1;
    int r = 0;
    if (++p < end && *p == '}') {
        p++;
        goto made;
    }
    for (;;) {
        PyObject *key = NULL, *value = NULL;
        if ((r = compact_string(&p, end, &key)) <= 0) goto fail;
        r = 0;
        if (p < end && *p == ':') {
            p++;
            if (p < end && *p == '"')
                r = compact_string(&p, end, &value);
            else if (nested)
                r = 0;
            else if (p < end && *p == '{')
                r = compact_object(&p, end, 1, &value);
            else if (p + 4 <= end && memcmp(p, "null", 4) == 0) {
                p += 4;
                value = Py_NewRef(Py_None);
                r = 1;
            } else
                r = compact_int(&p, end, &value);
        }
        if (r == 1) {
            r = PyDict_Contains(dict, key);  /* a key twice: the decoder says what that means */
            if (r == 0) r = PyDict_SetItem(dict, key, value) < 0 ? -1 : 1;
            else if (r == 1) r = 0;
        }
        Py_DECREF(key);
        Py_XDECREF(value);
        if (r <= 0) goto fail;
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}') {
            p++;
            goto made;
        }
        r = 0;
        goto fail;
    }
made:
    *out = dict;
    *pp = p;
    return 1;
fail:
    Py_DECREF(dict);
    return r;
}

/* header[key], or ``dflt`` when absent (borrowed); NULL with an error set on a failed lookup. */
static PyObject *field(PyObject *header, PyObject *key, PyObject *dflt) {
    PyObject *v = PyDict_GetItemWithError(header, key);
    if (v == NULL && !PyErr_Occurred()) return dflt;
    return v;
}

static PyObject *lone_reply(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data;
    long long max_frame_size;
    if (!PyArg_ParseTuple(args, "OL", &data, &max_frame_size)) return NULL;
    if (COMMAND.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_sendfast.bind was not called");
        return NULL;
    }
    if (!PyBytes_CheckExact(data)) Py_RETURN_NONE;
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    if (size < 8 || p[4] != 0) Py_RETURN_NONE;
    long long length = ((long long)p[0] << 24) | ((long long)p[1] << 16) | ((long long)p[2] << 8) | p[3];
    Py_ssize_t header_end = 8 + (((Py_ssize_t)p[5] << 16) | ((Py_ssize_t)p[6] << 8) | p[7]);
    if ((long long)size != length + 4 || header_end > size || length > max_frame_size) Py_RETURN_NONE;
    const unsigned char *at = p + 8, *header_stop = p + header_end;
    PyObject *header = NULL;
    int compact = compact_object(&at, header_stop, 0, &header);
    if (compact < 0) return NULL;
    if (compact == 1 && at != header_stop) {  /* more after the object: the decoder's error */
        Py_CLEAR(header);
        compact = 0;
    }
    if (compact == 0) {
        PyObject *raw = PyBytes_FromStringAndSize((const char *)p + 8, header_end - 8);
        if (raw == NULL) return NULL;
        header = PyObject_CallOneArg(LOADS, raw);
        Py_DECREF(raw);
        if (header == NULL) {
            if (PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear();
                Py_RETURN_NONE;
            }
            return NULL;
        }
    }
    PyObject *result = NULL, *ext_owned = NULL;
    if (!PyDict_CheckExact(header)) goto none;
    PyObject *code = field(header, S_CODE, Py_None), *opaque = field(header, S_OPAQUE, ZERO),
             *flag = field(header, S_FLAG, ZERO), *version = field(header, S_VERSION, ZERO),
             *language = field(header, S_LANGUAGE, S_JAVA), *remark = field(header, S_REMARK, Py_None),
             *ext = field(header, S_EXT, Py_None);
    if (code == NULL || opaque == NULL || flag == NULL || version == NULL || language == NULL || remark == NULL
        || ext == NULL)
        goto done;  /* a failed lookup (an unhashable key cannot happen: these are str): raise it */
    if (!is_int32(code) || !is_int32(opaque) || !is_int32(flag) || !is_int32(version)) goto none;
    if (!(PyLong_AsLong(flag) & RESPONSE_FLAG)) goto none;
    if (!PyUnicode_CheckExact(language) || (remark != Py_None && !PyUnicode_CheckExact(remark))) goto none;
    if (ext == Py_None) {
        ext = ext_owned = PyDict_New();
        if (ext == NULL) goto done;
    } else if (!PyDict_CheckExact(ext)) {
        goto none;
    } else {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(ext, &pos, &key, &value))
            if (!PyUnicode_CheckExact(value)) goto none;
    }
    PyObject *body = PyBytes_FromStringAndSize((const char *)p + header_end, size - header_end);
    if (body == NULL) goto done;
    PyObject *vals[9] = {code, language, version, opaque, flag, remark, ext, body, JSON_TYPE};
    result = make_slots(&COMMAND, vals);
    Py_DECREF(body);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(ext_owned);
    Py_DECREF(header);
    return result;
}

static PyObject *bind_results(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cls, *names, *queue_cls;
    if (!PyArg_ParseTuple(args, "OOO", &cls, &names, &queue_cls)) return NULL;
    slots_t r = {NULL, 0, {0}};
    if (bind_slots(&r, cls, names, 6) < 0) return NULL;
    Py_XDECREF(RESULT.type);
    RESULT = r;
    Py_XSETREF(QUEUE_CLS, Py_NewRef(queue_cls));
    Py_RETURN_NONE;
}

/* ext[key] when it is a str, ``dflt`` when absent (borrowed); NULL without an error: present and not a str;
 * NULL with an error: the lookup failed. */
static PyObject *text_field(PyObject *ext, PyObject *key, PyObject *dflt) {
    PyObject *v = PyDict_GetItemWithError(ext, key);
    if (v == NULL) return PyErr_Occurred() ? NULL : dflt;
    return PyUnicode_CheckExact(v) ? v : NULL;
}

static PyObject *send_result(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *status, *ext, *queue, *msg_id;
    if (!PyArg_ParseTuple(args, "OOOU", &status, &ext, &queue, &msg_id)) return NULL;
    if (RESULT.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_sendfast.bind_results was not called");
        return NULL;
    }
    if ((PyObject *)Py_TYPE(queue) != QUEUE_CLS || !PyDict_CheckExact(ext)) Py_RETURN_NONE;
    PyObject *offset_text = text_field(ext, S_QUEUE_OFFSET, S_MINUS_ONE);
    if (offset_text == NULL) goto none_or_error;
    PyObject *id_text = text_field(ext, S_QUEUE_ID, Py_None);
    if (id_text == NULL) goto none_or_error;
    PyObject *ids = text_field(ext, S_MSG_ID, S_EMPTY);
    if (ids == NULL) goto none_or_error;
    PyObject *recall = text_field(ext, S_RECALL, Py_None);
    if (recall == NULL) goto none_or_error;
    PyObject *own_id = PyObject_GetAttr(queue, S_QUEUE_ID_ATTR);
    if (own_id == NULL) return NULL;
    PyObject *offset = PyLong_FromUnicodeObject(offset_text, 10), *queue_id = NULL;
    if (offset != NULL && id_text != Py_None) queue_id = PyLong_FromUnicodeObject(id_text, 10);
    else if (offset != NULL) queue_id = Py_NewRef(own_id);
    if (queue_id == NULL) {  /* int() failed: as the Python code, -1 and the queue's own id */
        Py_XDECREF(offset);
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) {
            Py_DECREF(own_id);
            return NULL;
        }
        PyErr_Clear();
        offset = PyLong_FromLong(-1);
        queue_id = Py_NewRef(own_id);
        if (offset == NULL) {
            Py_DECREF(own_id);
            Py_DECREF(queue_id);
            return NULL;
        }
    }
    int same = PyObject_RichCompareBool(queue_id, own_id, Py_EQ);
    Py_DECREF(queue_id);
    Py_DECREF(own_id);
    if (same != 1) {
        Py_DECREF(offset);
        if (same < 0) return NULL;
        Py_RETURN_NONE;  /* another queue: the caller builds it */
    }
    Py_ssize_t comma = PyUnicode_FindChar(ids, ',', 0, PyUnicode_GET_LENGTH(ids), 1);
    PyObject *first_id = comma == -2 ? NULL
                         : comma < 0 ? Py_NewRef(ids) : PyUnicode_Substring(ids, 0, comma);
    if (first_id == NULL) {
        Py_DECREF(offset);
        return NULL;
    }
    PyObject *vals[6] = {status, msg_id, first_id, queue, offset,
                         recall != Py_None && PyUnicode_GET_LENGTH(recall) > 0 ? recall : Py_None};
    PyObject *result = make_slots(&RESULT, vals);
    Py_DECREF(first_id);
    Py_DECREF(offset);
    return result;
none_or_error:
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"bind", bind, METH_VARARGS, "bind(command_cls, names, json_type, loads)"},
    {"lone_reply", lone_reply, METH_VARARGS, "lone_reply(data, max_frame_size) -> RemotingCommand | None"},
    {"bind_results", bind_results, METH_VARARGS, "bind_results(result_cls, names, queue_cls)"},
    {"send_result", send_result, METH_VARARGS, "send_result(status, ext, queue, msg_id) -> SendResult | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_sendfast", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__sendfast(void) {
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(S_CODE, "code");
    INTERN(S_OPAQUE, "opaque");
    INTERN(S_FLAG, "flag");
    INTERN(S_VERSION, "version");
    INTERN(S_LANGUAGE, "language");
    INTERN(S_REMARK, "remark");
    INTERN(S_EXT, "extFields");
    INTERN(S_JAVA, "JAVA");
    INTERN(S_QUEUE_OFFSET, "queueOffset");
    INTERN(S_QUEUE_ID, "queueId");
    INTERN(S_MSG_ID, "msgId");
    INTERN(S_RECALL, "recallHandle");
    INTERN(S_QUEUE_ID_ATTR, "queue_id");
    INTERN(S_MINUS_ONE, "-1");
    INTERN(S_EMPTY, "");
#undef INTERN
    if ((ZERO = PyLong_FromLong(0)) == NULL) return NULL;
    return PyModule_Create(&MODULE);
}
