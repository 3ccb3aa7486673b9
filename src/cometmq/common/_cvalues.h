/* Small helpers the C helpers share: big-endian reads and writes, and "the same value as last time" objects
 * (a column of equal values made once per run). Static inline: each helper compiles what it uses. */
#ifndef COMETMQ_CVALUES_H
#define COMETMQ_CVALUES_H
#include <Python.h>
#include <stdint.h>
#include <string.h>


static inline int32_t get_be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}
static inline int64_t get_be64(const unsigned char *p) {
    return (int64_t)(((uint64_t)(uint32_t)get_be32(p) << 32) | (uint32_t)get_be32(p + 4));
}
static inline void put_be16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}
static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}
static inline void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* A new reference to an int of value ``v``: the one ``*slot`` holds when equal, else a new one kept there. */
static inline PyObject *shared_int(PyObject **slot, long long v) {
    if (*slot != NULL) {
        int overflow;
        long long old = PyLong_AsLongLongAndOverflow(*slot, &overflow);
        if (!overflow && old == v) return Py_NewRef(*slot);
    }
    PyObject *o = PyLong_FromLongLong(v);
    if (o != NULL) Py_XSETREF(*slot, Py_NewRef(o));
    return o;
}

/* A new reference to bytes equal to ``p[:n]``: the one ``*slot`` holds when equal, else a new one kept there. */
static inline PyObject *shared_bytes(PyObject **slot, const char *p, Py_ssize_t n) {
    if (*slot != NULL && PyBytes_GET_SIZE(*slot) == n && memcmp(PyBytes_AS_STRING(*slot), p, (size_t)n) == 0)
        return Py_NewRef(*slot);
    PyObject *o = PyBytes_FromStringAndSize(p, n);
    if (o != NULL) Py_XSETREF(*slot, Py_NewRef(o));
    return o;
}

#endif
