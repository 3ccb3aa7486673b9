/* Text helpers of cometmq's C helpers over encoded properties (name\x01value\x02...): a strict UTF-8 check as
 * Python makes it, RawProperties.get's search for one name, and the tag code (Java's String.hashCode). Used by
 * store/_indexc.c and store/_batchc.c; each keeps its Python reference, which the tests compare it with. */
#ifndef COMETMQ_CTEXT_H
#define COMETMQ_CTEXT_H
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int all_ascii(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w & 0x8080808080808080ull) return 0;
    }
    for (; i < n; i++)
        if (p[i] & 0x80) return 0;
    return 1;
}

/* 1 when ``p`` is strict UTF-8 (Python's own check, as check_utf8 makes it), 0 when not, -1 on another error. */
static int utf8_valid(const unsigned char *p, Py_ssize_t n) {
    if (all_ascii(p, n)) return 1;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (s != NULL) {
        Py_DECREF(s);
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
    PyErr_Clear();
    return 0;
}

/* The value of the last pair named ``name`` in encoded properties (name\x01value\x02...), as RawProperties.get
 * finds it: a match must start the buffer or follow a \x02. */
static inline int raw_get(const char *raw, Py_ssize_t len, const char *name, Py_ssize_t nlen, const char **val,
                          Py_ssize_t *vlen) {
    for (Py_ssize_t i = len - nlen - 1; i >= 0; i--) {
        if (raw[i + nlen] == '\x01' && memcmp(raw + i, name, nlen) == 0 && (i == 0 || raw[i - 1] == '\x02')) {
            Py_ssize_t start = i + nlen + 1, end = start;
            while (end < len && raw[end] != '\x02') end++;
            *val = raw + start;
            *vlen = end - start;
            return 1;
        }
    }
    return 0;
}

/* Java's String.hashCode of valid UTF-8 (taghash.java_string_hash): over UTF-16 code units, wrapped to int32. */
static int32_t java_hash_utf8(const unsigned char *s, Py_ssize_t n) {
    uint32_t h = 0;
    Py_ssize_t i = 0;
    while (i < n) {
        uint32_t c = s[i];
        if (c < 0x80) {
            i += 1;
        } else if (c < 0xE0) {
            c = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
            i += 2;
        } else if (c < 0xF0) {
            c = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
            i += 3;
        } else {
            c = ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
            i += 4;
        }
        if (c >= 0x10000) {
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return (int32_t)h;
}

#endif
