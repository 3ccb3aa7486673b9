/* Optional C helper for cometmq.protocol.send_v2: one lone send frame read in one step.
 *
 *   decode(data, max_frame_size) -> (code, opaque, topic, queue_id, sys_flag, born_timestamp, flag, properties,
 *                                    reconsume_times, body) | None
 *       ``data`` must be exactly one whole remoting frame (length prefix included) with a JSON header whose
 *       code is 310 (SEND_MESSAGE_V2: extFields by the V2 header's one-letter keys) or 10 (SEND_MESSAGE: by the
 *       header's names, values strings, integers or, for the booleans, true/false) and whose flag has neither the
 *       response nor the oneway bit. Everything the generic decoder (protocol/remoting.py) and the header parsers
 *       (protocol/headers.py) would read differently, reject, or that this reader is not sure of answers None,
 *       and the caller takes the generic path, which decodes the same bytes and answers as it always did.
 *
 * send_v2.decode_send_v2_py is the reference: tests/protocol/test_send_v2.py compares both.
 *
 * And the JSON header of any frame, for cometmq.protocol.remoting (in place of orjson, which a broker then does not
 * load: 0.5 MiB with the modules it imports):
 *
 *   loads_header(data) -> dict | None
 *       The header object as json.loads gives it, for headers of the usual shape: an object whose values are
 *       strings, integers (at most 18 digits), true, false, null, or an object of those (extFields). None for
 *       anything else (a float, an array, deeper nesting, a lone surrogate, invalid UTF-8, data after the object):
 *       the caller then runs the json module, which decides as it always did.
 *   dumps_header(code, language, version, opaque, flag, remark, ext) -> bytes | None
 *       The header as json.dumps(ensure_ascii=True, separators=(",", ":")) writes it (remark left out when None,
 *       "serializeTypeCurrentRPC":"JSON" last). None unless the numbers are ints (not bools) within 64 bits and
 *       every other value a str.
 *
 * The json module is the reference for both: tests/protocol/test_header_codec.py compares them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define INT32_LO (-2147483647LL - 1)
#define INT32_HI 2147483647LL
#define MAX_HEADER_LENGTH 0xFFFFFF

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    unsigned char *buf; /* unescaped strings, back to back (never longer than the header) */
    Py_ssize_t used;
} parser;

typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
    int set;
} span;

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const unsigned char *p, const unsigned char *end, unsigned *out) {
    if (end - p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = (v << 4) | (unsigned)h;
    }
    *out = v;
    return 0;
}

/* A JSON string at ps->p (on its opening quote) as UTF-8 bytes: a span of the input when it holds no escape,
 * else of the scratch buffer. -1 for anything not a valid, surrogate-free JSON string. Raw bytes >= 0x80 are
 * copied as they are (the caller validates the header's UTF-8 as a whole). */
static int parse_string(parser *ps, span *out) {
    const unsigned char *p = ps->p + 1, *end = ps->end, *start = p;
    while (p < end && *p != '"' && *p != '\\') {
        if (*p < 0x20) return -1;
        p++;
    }
    if (p >= end) return -1;
    if (*p == '"') {
        out->s = start;
        out->n = p - start;
        out->set = 1;
        ps->p = p + 1;
        return 0;
    }
    unsigned char *o = ps->buf + ps->used, *o0 = o;
    memcpy(o, start, (size_t)(p - start));
    o += p - start;
    while (p < end && *p != '"') {
        unsigned char c = *p;
        if (c < 0x20) return -1;
        if (c != '\\') {
            *o++ = c;
            p++;
            continue;
        }
        if (end - p < 2) return -1;
        c = p[1];
        p += 2;
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(p, end, &cp) < 0) return -1;
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) < 0 || lo < 0xDC00 ||
                    lo > 0xDFFF)
                    return -1; /* a high surrogate not followed by a low one */
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            /* \uXXXX is 6 bytes, its UTF-8 at most 3; a pair is 12, its UTF-8 4: the buffer keeps up */
            if (cp < 0x80) {
                *o++ = (unsigned char)cp;
            } else if (cp < 0x800) {
                *o++ = (unsigned char)(0xC0 | (cp >> 6));
                *o++ = (unsigned char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                *o++ = (unsigned char)(0xE0 | (cp >> 12));
                *o++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (unsigned char)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (unsigned char)(0xF0 | (cp >> 18));
                *o++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
                *o++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (unsigned char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            return -1;
        }
    }
    if (p >= end) return -1;
    out->s = o0;
    out->n = o - o0;
    out->set = 1;
    ps->used += o - o0;
    ps->p = p + 1;
    return 0;
}

/* A JSON integer of at most 18 digits (no fraction, no exponent, no leading zero): -1 for anything else. */
static int parse_int(parser *ps, long long *out) {
    const unsigned char *p = ps->p, *end = ps->end;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    const unsigned char *d = p;
    long long v = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - d >= 18) return -1; /* a 19th digit: not taken (and v * 10 would overflow) */
        v = v * 10 + (*p - '0');
        p++;
    }
    if (p == d || (*d == '0' && p - d > 1)) return -1;
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return -1;
    *out = neg ? -v : v;
    ps->p = p;
    return 0;
}

static int literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return -1;
    ps->p += n;
    return 0;
}

/* A value of a header key this reader does not use: a string, an integer, true, false or null. */
static int skip_scalar(parser *ps) {
    if (ps->p >= ps->end) return -1;
    unsigned char c = *ps->p;
    span s;
    long long v;
    if (c == '"') return parse_string(ps, &s);
    if (c == 't') return literal(ps, "true");
    if (c == 'f') return literal(ps, "false");
    if (c == 'n') return literal(ps, "null");
    return parse_int(ps, &v);
}

static int span_is(const span *s, const char *word) {
    size_t n = strlen(word);
    return (size_t)s->n == n && memcmp(s->s, word, n) == 0;
}

/* The send header's field names, in the order of their V2 letters a to m. */
static const char *const LONG_KEYS[] = {"producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId",
                                        "sysFlag", "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode",
                                        "maxReconsumeTimes", "batch", NULL};
/* of those (by letter): the string fields (a b c i) and the booleans (k m) */
#define IS_STR(i) ((i) == 0 || (i) == 1 || (i) == 2 || (i) == 8)
#define IS_BOOL(i) ((i) == 10 || (i) == 12)

static int long_key(const span *key) {
    for (int i = 0; LONG_KEYS[i]; i++)
        if (span_is(key, LONG_KEYS[i])) return i;
    return -1;
}

static const unsigned char TEXT_TRUE[] = "true", TEXT_FALSE[] = "false", TEXT_0[] = "0", TEXT_1[] = "1";

/* A V1 header's value (at ps->p) for field ``i`` (-1: a key no field has) into ``*f``: a string; for the other
 * fields an integer (its digits); for the booleans true/false or the integers 0/1, as the generic decoder turns
 * them into strings. -1 for anything else (null included). */
static int v1_value(parser *ps, int i, span *f) {
    if (ps->p >= ps->end) return -1;
    unsigned char c = *ps->p;
    span s;
    if (c == '"') {
        if (parse_string(ps, &s) < 0) return -1;
        if (i >= 0) *f = s;
        return 0;
    }
    if (c == 'n') return -1;
    if (i < 0) return skip_scalar(ps);
    if (IS_STR(i)) return -1;
    if (c == 't' || c == 'f') {
        if (!IS_BOOL(i) || literal(ps, c == 't' ? "true" : "false") < 0) return -1;
        f->s = c == 't' ? TEXT_TRUE : TEXT_FALSE;
        f->n = c == 't' ? 4 : 5;
        f->set = 1;
        return 0;
    }
    const unsigned char *start = ps->p;
    long long v;
    if (parse_int(ps, &v) < 0) return -1;
    if (IS_BOOL(i)) {
        if (v != 0 && v != 1) return -1; /* str() of it is no boolean the parser takes */
        f->s = v ? TEXT_1 : TEXT_0;
        f->n = 1;
    } else {
        f->s = start;
        f->n = ps->p - start;
    }
    f->set = 1;
    return 0;
}

/* extFields. V2: only string values; the letters a to m once each; none of the long names. V1: the long names
 * once each (read into their letters' places), any other key with a scalar but null. */
static int parse_ext(parser *ps, span *fields, int v1) {
    if (ps->p >= ps->end || *ps->p != '{') return -1;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return 0;
    }
    for (;;) {
        span key, value;
        if (ps->p >= ps->end || *ps->p != '"' || parse_string(ps, &key) < 0) return -1;
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') return -1;
        ps->p++;
        skip_ws(ps);
        if (v1) {
            int i = long_key(&key);
            if (i >= 0 && fields[i].set) return -1;
            if (v1_value(ps, i, i >= 0 ? &fields[i] : NULL) < 0) return -1;
        } else {
            if (ps->p >= ps->end || *ps->p != '"' || parse_string(ps, &value) < 0) return -1;
            if (key.n == 1 && key.s[0] >= 'a' && key.s[0] <= 'm') {
                span *f = &fields[key.s[0] - 'a'];
                if (f->set) return -1;
                *f = value;
            } else if (long_key(&key) >= 0) {
                return -1;
            }
        }
        skip_ws(ps);
        if (ps->p >= ps->end) return -1;
        if (*ps->p == '}') {
            ps->p++;
            return 0;
        }
        if (*ps->p != ',') return -1;
        ps->p++;
        skip_ws(ps);
    }
}

/* An integer field as int() reads it, for -?[0-9]{1,18} only. */
static int field_int(const span *f, long long dflt, long long *out) {
    if (!f->set) {
        *out = dflt;
        return 0;
    }
    const unsigned char *p = f->s, *end = f->s + f->n;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p == end || end - p > 18) return -1;
    long long v = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

/* A boolean field: 1 true, 0 false (or absent), -1 anything but exactly true, false, 1, 0 or empty. */
static int field_bool(const span *f) {
    if (!f->set || f->n == 0 || span_is(f, "false") || span_is(f, "0")) return 0;
    if (span_is(f, "true") || span_is(f, "1")) return 1;
    return -1;
}

static PyObject *make_str(const span *f, const char *dflt) {
    if (!f->set) return PyUnicode_FromString(dflt);
    return PyUnicode_DecodeUTF8((const char *)f->s, f->n, NULL);
}

/* 1 when ``h`` is UTF-8 as a whole (the generic decoder and json.loads refuse a header that is not), else 0. */
static int utf8_ok(const unsigned char *h, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (h[i] >= 0x80) {
            PyObject *check = PyUnicode_DecodeUTF8((const char *)h, n, NULL);
            if (check == NULL) {
                PyErr_Clear();
                return 0;
            }
            Py_DECREF(check);
            return 1;
        }
    }
    return 1;
}

/* A new str of a span's UTF-8, or NULL with no exception set. */
static PyObject *span_str(const span *s) {
    PyObject *out = PyUnicode_DecodeUTF8((const char *)s->s, s->n, NULL);
    if (out == NULL) PyErr_Clear();
    return out;
}

static PyObject *parse_frame(const unsigned char *data, Py_ssize_t n, long long max_frame, unsigned char *buf) {
    uint32_t length = ((uint32_t)data[0] << 24) | ((uint32_t)data[1] << 16) | ((uint32_t)data[2] << 8) | data[3];
    uint32_t word = ((uint32_t)data[4] << 24) | ((uint32_t)data[5] << 16) | ((uint32_t)data[6] << 8) | data[7];
    Py_ssize_t hlen = word & MAX_HEADER_LENGTH;
    if ((long long)length != (long long)n - 4 || (long long)length > max_frame || (word >> 24) != 0 ||
        hlen > (Py_ssize_t)length - 4)
        Py_RETURN_NONE;
    const unsigned char *h = data + 8;
    if (!utf8_ok(h, hlen)) Py_RETURN_NONE;
    parser ps = {h, h + hlen, buf, 0};
    span fields[13];
    memset(fields, 0, sizeof(fields));
    long long code = 0, opaque = 0, flag = 0, version = 0;
    int seen_code = 0, seen_opaque = 0, seen_flag = 0, seen_version = 0, seen_language = 0, seen_remark = 0,
        seen_ext = 0;
    const unsigned char *ext_at = NULL;
    Py_ssize_t ext_used = 0;
    skip_ws(&ps);
    if (ps.p >= ps.end || *ps.p != '{') Py_RETURN_NONE;
    ps.p++;
    skip_ws(&ps);
    if (ps.p >= ps.end || *ps.p == '}') Py_RETURN_NONE;
    for (;;) {
        span key;
        if (ps.p >= ps.end || *ps.p != '"' || parse_string(&ps, &key) < 0) Py_RETURN_NONE;
        skip_ws(&ps);
        if (ps.p >= ps.end || *ps.p != ':') Py_RETURN_NONE;
        ps.p++;
        skip_ws(&ps);
        long long *num = NULL;
        int *seen = NULL;
        if (span_is(&key, "code")) num = &code, seen = &seen_code;
        else if (span_is(&key, "opaque")) num = &opaque, seen = &seen_opaque;
        else if (span_is(&key, "flag")) num = &flag, seen = &seen_flag;
        else if (span_is(&key, "version")) num = &version, seen = &seen_version;
        if (num != NULL) {
            if (*seen || parse_int(&ps, num) < 0 || *num < INT32_LO || *num > INT32_HI) Py_RETURN_NONE;
            *seen = 1;
        } else if (span_is(&key, "language")) {
            span s;
            if (seen_language || ps.p >= ps.end || *ps.p != '"' || parse_string(&ps, &s) < 0) Py_RETURN_NONE;
            seen_language = 1;
        } else if (span_is(&key, "remark")) {
            span s;
            if (seen_remark || ps.p >= ps.end) Py_RETURN_NONE;
            if (*ps.p == 'n' ? literal(&ps, "null") < 0 : (*ps.p != '"' || parse_string(&ps, &s) < 0))
                Py_RETURN_NONE;
            seen_remark = 1;
        } else if (span_is(&key, "extFields")) {
            /* read once the code is known (it may come after): skipped here as V1 (any scalar), read again below */
            span scratch[13];
            memset(scratch, 0, sizeof(scratch));
            if (seen_ext) Py_RETURN_NONE;
            ext_at = ps.p;
            ext_used = ps.used;
            if (parse_ext(&ps, scratch, 1) < 0) {
                memset(scratch, 0, sizeof(scratch));
                ps.p = ext_at;
                ps.used = ext_used;
                if (parse_ext(&ps, scratch, 0) < 0) Py_RETURN_NONE;
            }
            ps.used = ext_used; /* (its strings are read again below, into the same room) */
            seen_ext = 1;
        } else if (skip_scalar(&ps) < 0) {
            Py_RETURN_NONE;
        }
        skip_ws(&ps);
        if (ps.p >= ps.end) Py_RETURN_NONE;
        if (*ps.p == '}') {
            ps.p++;
            break;
        }
        if (*ps.p != ',') Py_RETURN_NONE;
        ps.p++;
        skip_ws(&ps);
    }
    skip_ws(&ps);
    if (ps.p != ps.end || !seen_code || (code != 310 && code != 10) || (flag & 3) || !seen_ext) Py_RETURN_NONE;
    ps.p = ext_at;
    ps.used = ext_used;
    if (parse_ext(&ps, fields, code == 10) < 0) Py_RETURN_NONE;
    /* a producerGroup, b topic, c defaultTopic, d defaultTopicQueueNums, e queueId, f sysFlag, g bornTimestamp,
     * h flag, i properties, j reconsumeTimes, k unitMode, l maxReconsumeTimes, m batch */
    long long nums[13];
    static const int INTS[] = {3, 4, 5, 6, 7, 9, 11};
    static const long long DEFAULTS[] = {4, -1, 0, 0, 0, 0, 0};
    /* each one's Java type (headers.SendMessageRequestHeader's annotation): g a long (18 digits always fit), the
     * others ints, whose range the header parser enforces: a value past it is left to the generic path */
    static const int IS_LONG[] = {0, 0, 0, 1, 0, 0, 0};
    if (!fields[0].set || !fields[1].set) Py_RETURN_NONE;
    for (int i = 0; i < 7; i++) {
        long long *v = &nums[INTS[i]];
        if (field_int(&fields[INTS[i]], DEFAULTS[i], v) < 0) Py_RETURN_NONE;
        if (!IS_LONG[i] && (*v < INT32_LO || *v > INT32_HI)) Py_RETURN_NONE;
    }
    if (field_bool(&fields[10]) < 0 || field_bool(&fields[12]) != 0) Py_RETURN_NONE;
    PyObject *topic = make_str(&fields[1], "");
    PyObject *props = topic != NULL ? make_str(&fields[8], "") : NULL;
    if (props == NULL) {
        Py_XDECREF(topic);
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t body_start = 8 + hlen;
    return Py_BuildValue("(LLNLLLLNLy#)", code, opaque, topic, nums[4], nums[5], nums[6], nums[7], props, nums[9],
                         (const char *)data + body_start, n - body_start);
}

/* -- any frame's JSON header ------------------------------------------------------------------------- */

/* A scalar as json.loads gives it (str, int, True, False, None): a new reference, or NULL with no exception set
 * for anything this reader does not take. */
static PyObject *load_scalar(parser *ps) {
    if (ps->p >= ps->end) return NULL;
    unsigned char c = *ps->p;
    if (c == '"') {
        span s;
        Py_ssize_t used = ps->used;
        if (parse_string(ps, &s) < 0) return NULL;
        ps->used = used; /* the unescaped text is copied out below: its room can be used again */
        return span_str(&s);
    }
    if (c == 't') return literal(ps, "true") < 0 ? NULL : Py_NewRef(Py_True);
    if (c == 'f') return literal(ps, "false") < 0 ? NULL : Py_NewRef(Py_False);
    if (c == 'n') return literal(ps, "null") < 0 ? NULL : Py_NewRef(Py_None);
    long long v;
    if (parse_int(ps, &v) < 0) return NULL;
    PyObject *out = PyLong_FromLongLong(v);
    if (out == NULL) PyErr_Clear();
    return out;
}

/* Keys repeat from header to header (code, opaque, extFields, the request's field names): short ASCII ones are
 * made once and kept, in a small table indexed by a hash of their bytes (a slot holds the last key hashed to it). */
#define KEY_SLOTS 256
#define KEY_MAX 32
static PyObject *key_cache[KEY_SLOTS];

static PyObject *load_key(parser *ps) {
    span s;
    Py_ssize_t used = ps->used;
    if (parse_string(ps, &s) < 0) return NULL;
    ps->used = used;
    if (s.n > KEY_MAX) return span_str(&s);
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < s.n; i++) {
        if (s.s[i] >= 0x80) return span_str(&s);
        h = (h ^ s.s[i]) * 16777619u;
    }
    PyObject **slot = &key_cache[h % KEY_SLOTS];
    PyObject *cached = *slot;
    if (cached != NULL && PyUnicode_GET_LENGTH(cached) == s.n && memcmp(PyUnicode_1BYTE_DATA(cached), s.s, s.n) == 0)
        return Py_NewRef(cached);
    PyObject *out = PyUnicode_New(s.n, 127);
    if (out == NULL) {
        PyErr_Clear();
        return NULL;
    }
    memcpy(PyUnicode_1BYTE_DATA(out), s.s, s.n);
    Py_XSETREF(*slot, Py_NewRef(out));
    return out;
}

/* An object at ps->p into a new dict: its values scalars, or (``depth`` > 0) objects of scalars. NULL with no
 * exception set for anything else. Duplicate keys: the last wins, as in json.loads. */
static PyObject *load_object(parser *ps, int depth) {
    if (ps->p >= ps->end || *ps->p != '{') return NULL;
    ps->p++;
    PyObject *out = PyDict_New();
    if (out == NULL) {
        PyErr_Clear();
        return NULL;
    }
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return out;
    }
    for (;;) {
        if (ps->p >= ps->end || *ps->p != '"') goto fail;
        PyObject *key = load_key(ps);
        if (key == NULL) goto fail;
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') {
            Py_DECREF(key);
            goto fail;
        }
        ps->p++;
        skip_ws(ps);
        PyObject *value = ps->p < ps->end && *ps->p == '{' ? (depth > 0 ? load_object(ps, depth - 1) : NULL)
                                                           : load_scalar(ps);
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        int err = PyDict_SetItem(out, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (err < 0) {
            PyErr_Clear();
            goto fail;
        }
        skip_ws(ps);
        if (ps->p >= ps->end) goto fail;
        if (*ps->p == '}') {
            ps->p++;
            return out;
        }
        if (*ps->p != ',') goto fail;
        ps->p++;
        skip_ws(ps);
    }
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *loads_header(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    const unsigned char *h = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *out = NULL;
    if (!utf8_ok(h, n)) goto done; /* json.loads reads a str */
    unsigned char small[2048];
    unsigned char *buf = n <= (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc(n + 1);
    if (buf == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    parser ps = {h, h + n, buf, 0};
    skip_ws(&ps);
    out = load_object(&ps, 1);
    skip_ws(&ps);
    if (out != NULL && ps.p != ps.end) Py_CLEAR(out);
    if (buf != small) PyMem_Free(buf);
done:
    PyBuffer_Release(&view);
    return out != NULL ? out : Py_NewRef(Py_None);
}

/* Writes ``text`` as json.dumps(ensure_ascii=True) writes it (quotes included) at ``o``; returns the end. ``o``
 * has room for 2 + 12 * len(text) bytes. */
static char *put_string(PyObject *text, char *o) {
    static const char HEX[] = "0123456789abcdef";
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    *o++ = '"';
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= 0x20 && c <= 0x7e && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        char esc = 0;
        switch (c) {
        case '"': esc = '"'; break;
        case '\\': esc = '\\'; break;
        case '\n': esc = 'n'; break;
        case '\r': esc = 'r'; break;
        case '\t': esc = 't'; break;
        case '\b': esc = 'b'; break;
        case '\f': esc = 'f'; break;
        }
        if (esc) {
            *o++ = '\\', *o++ = esc;
            continue;
        }
        Py_UCS4 units[2] = {c, 0};
        int count = 1;
        if (c >= 0x10000) {
            units[0] = 0xD800 | ((c - 0x10000) >> 10);
            units[1] = 0xDC00 | ((c - 0x10000) & 0x3FF);
            count = 2;
        }
        for (int k = 0; k < count; k++) {
            Py_UCS4 u = units[k];
            *o++ = '\\', *o++ = 'u';
            *o++ = HEX[(u >> 12) & 0xF], *o++ = HEX[(u >> 8) & 0xF], *o++ = HEX[(u >> 4) & 0xF], *o++ = HEX[u & 0xF];
        }
    }
    *o++ = '"';
    return o;
}

static char *put_text(char *o, const char *text, size_t n) {
    memcpy(o, text, n);
    return o + n;
}

static char *put_int(char *o, long long v) {
    char digits[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *o++ = '-';
    while (n) *o++ = digits[--n];
    return o;
}

/* An int field (not a bool) as a 64-bit value: -1 for anything else. */
static int int_arg(PyObject *v, long long *out) {
    if (!PyLong_Check(v) || PyBool_Check(v)) return -1;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

#define LIT(o, text) put_text((o), (text), sizeof(text) - 1)

/* The header at ``o`` (room for ``bound`` bytes, see dumps_header); returns the end. */
static char *put_header(char *o, const long long *nums, PyObject *language, PyObject *remark, PyObject *ext) {
    o = put_int(LIT(o, "{\"code\":"), nums[0]);
    o = put_string(language, LIT(o, ",\"language\":"));
    o = put_int(LIT(o, ",\"version\":"), nums[1]);
    o = put_int(LIT(o, ",\"opaque\":"), nums[2]);
    o = put_int(LIT(o, ",\"flag\":"), nums[3]);
    if (remark != Py_None) o = put_string(remark, LIT(o, ",\"remark\":"));
    o = LIT(o, ",\"extFields\":{");
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    int first = 1;
    while (PyDict_Next(ext, &pos, &key, &value)) {
        if (!first) *o++ = ',';
        first = 0;
        o = put_string(key, o);
        *o++ = ':';
        o = put_string(value, o);
    }
    return LIT(o, "},\"serializeTypeCurrentRPC\":\"JSON\"}");
}

static PyObject *dumps_header(PyObject *self, PyObject *args) {
    PyObject *code, *language, *version, *opaque, *flag, *remark, *ext;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &code, &language, &version, &opaque, &flag, &remark, &ext)) return NULL;
    long long nums[4]; /* code, version, opaque, flag */
    if (int_arg(code, &nums[0]) < 0 || int_arg(version, &nums[1]) < 0 || int_arg(opaque, &nums[2]) < 0 ||
        int_arg(flag, &nums[3]) < 0 || !PyUnicode_CheckExact(language) ||
        (remark != Py_None && !PyUnicode_CheckExact(remark)) || !PyDict_CheckExact(ext))
        Py_RETURN_NONE;
    /* room: the fixed text, four numbers of at most 20 characters, each string at most 12 bytes a character */
    Py_ssize_t bound = 256 + 14 * PyUnicode_GET_LENGTH(language);
    if (remark != Py_None) bound += 14 + 12 * PyUnicode_GET_LENGTH(remark);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(ext, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(value)) Py_RETURN_NONE;
        bound += 6 + 12 * (PyUnicode_GET_LENGTH(key) + PyUnicode_GET_LENGTH(value));
    }
    char small[4096];
    char *buf = bound <= (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc((size_t)bound);
    if (buf == NULL) return PyErr_NoMemory();
    char *end = put_header(buf, nums, language, remark, ext);
    PyObject *out = PyBytes_FromStringAndSize(buf, end - buf);
    if (buf != small) PyMem_Free(buf);
    return out;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long max_frame;
    if (!PyArg_ParseTuple(args, "y*L", &view, &max_frame)) return NULL;
    PyObject *out;
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    if (n < 8) {
        out = Py_NewRef(Py_None);
    } else {
        Py_ssize_t hlen = ((Py_ssize_t)data[5] << 16) | ((Py_ssize_t)data[6] << 8) | data[7];
        unsigned char small[2048];
        unsigned char *buf = hlen <= (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc(hlen + 1);
        if (buf == NULL) {
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
        out = hlen > n - 8 ? Py_NewRef(Py_None) : parse_frame(data, n, max_frame, buf);
        if (buf != small) PyMem_Free(buf);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "A lone SEND_MESSAGE_V2 or SEND_MESSAGE frame's code, send fields and body, or None."},
    {"loads_header", loads_header, METH_VARARGS, "A JSON header object as json.loads reads it, or None."},
    {"dumps_header", dumps_header, METH_VARARGS, "A JSON header as json.dumps(ensure_ascii=True) writes it, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sendv2c", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sendv2c(void) { return PyModule_Create(&module); }
