/* Optional C helpers for the key index (cometmq.store.index): the two per-key loops of indexing a
 * dispatched batch, which otherwise cost the broker about 2.6 us of GIL time a message.
 *
 *   collect(batch, floor, raw_type) -> list[(hash, phy_offset, store_timestamp)] | None
 *       The UNIQ_KEY and KEYS of each DispatchRequest past ``floor``, hashed as index.key_hash hashes
 *       "topic#key" (crc32 of the UTF-8). None when a request holds something this code does not handle
 *       (the caller then does it in Python).
 *   put_run(mm, entries, i, count, used, end_ts, end_phy, max_phy, hash_slots, max_entries, entry_base,
 *           anchor_ts, begin_ts) -> (i, count, used, end_ts, end_phy, max_phy)
 *       Writes entries from ``i`` into one index file's mapping exactly as IndexService._put_one would,
 *       and stops before the first entry that needs Python's handling (an empty or full file, a timestamp
 *       outside the file's range or before its begin time, a slot head left by a torn write). The writes
 *       run without the GIL; the caller holds the index lock, and the buffer export keeps the map alive.
 *
 *
 * And one for the pull path (cometmq.store.message_store, MessageStore._runs):
 *
 *   runs(units, log_min, byte_limit, count, max_runs) -> (k, [(phy_offset, length), ...]) | None
 *       ``units`` are consume-queue units (8-byte commit-log offset, 4-byte size, 8-byte tag code, big-endian);
 *       ``k`` is how many of them, from the first, one unfiltered read returns: as many as fit in
 *       ``byte_limit`` bytes, at least one. Each (offset, length) is a run of those records lying back to back in
 *       the commit log. None when the caller must read record by record: a unit of size 0 or less, a first
 *       record below ``log_min``, every unit fitting while fewer than ``count`` were given (the rest is in the
 *       next consume-queue file), more than ``max_runs`` runs.
 *
 *   heads(units, k, views) -> bool
 *       Whether ``views`` (the runs ``runs`` gave, read from the log) hold exactly the records the first ``k`` units
 *       name, back to back, each starting with its unit's size as TOTALSIZE and the magic code: every record of a
 *       run, not only its ends (a record damaged inside a run must not reach a consumer).
 *
 * And one for a replica's dispatcher (cometmq.store.record_walk, CommitLog.dispatch_requests):
 *
 *   walk_records(buf, pos, end, base, limit, request_type, raw_type) -> (requests, pos, why)
 *       record_walk.walk_records_py in C: a DispatchRequest (``request_type``) for each record from ``pos`` of a
 *       segment's buffer, at most ``limit``, none past ``end``; its properties a ``raw_type`` (RawProperties) over
 *       their bytes, checked to be UTF-8; its tag code the Java hash of their TAGS. Stops where that function
 *       stops, with the same ``why``. ``layout()`` returns the record-layout constants below, which a test checks
 *       against cometmq.protocol.record_layout (their owner).
 *
 * The pure-Python code stays the reference: tests compare the files (and the reads) both produce.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_ctext.h"

#define HEADER_SIZE 64
#define SLOT_SIZE 4
#define ENTRY_SIZE 20

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static inline uint32_t crc_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc;
}

static PyObject *s_phy_offset, *s_store_timestamp, *s_topic, *s_properties, *s_raw, *s_uniq, *s_keys, *s_get;

static int add_entry(PyObject *out, uint32_t h, PyObject *phy, PyObject *ts) {
    PyObject *hv = PyLong_FromUnsignedLong(h);
    if (hv == NULL) return -1;
    Py_INCREF(phy);
    Py_INCREF(ts);
    PyObject *t = PyTuple_New(3);
    if (t == NULL) {
        Py_DECREF(hv); Py_DECREF(phy); Py_DECREF(ts);
        return -1;
    }
    PyTuple_SET_ITEM(t, 0, hv);
    PyTuple_SET_ITEM(t, 1, phy);
    PyTuple_SET_ITEM(t, 2, ts);
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

/* UTF-8 of a str value from a mapping's get (None or empty -> *len = 0). -1 when it cannot be handled. */
static int str_value(PyObject *v, const char **p, Py_ssize_t *len) {
    *len = 0;
    if (v == Py_None) return 0;
    if (!PyUnicode_CheckExact(v)) return -1;
    *p = PyUnicode_AsUTF8AndSize(v, len);
    if (*p == NULL) { PyErr_Clear(); return -1; }
    return 0;
}

/* Entries for one request; 1 = done, 0 = not handled here, -1 = error set. */
static int collect_one(PyObject *req, long long floor, PyObject *raw_type, PyObject *out) {
    int result = -1;
    PyObject *phy = NULL, *ts = NULL, *topic = NULL, *props = NULL, *raw = NULL, *uv = NULL, *kv = NULL;
    phy = PyObject_GetAttr(req, s_phy_offset);
    if (phy == NULL) goto done;
    long long phy_v = PyLong_AsLongLong(phy);
    if (phy_v == -1 && PyErr_Occurred()) { PyErr_Clear(); result = 0; goto done; }
    if (phy_v <= floor) { result = 1; goto done; }
    ts = PyObject_GetAttr(req, s_store_timestamp);
    topic = PyObject_GetAttr(req, s_topic);
    props = PyObject_GetAttr(req, s_properties);
    if (ts == NULL || topic == NULL || props == NULL) goto done;
    if (!PyLong_CheckExact(ts) || !PyLong_CheckExact(phy) || !PyUnicode_CheckExact(topic)) { result = 0; goto done; }
    Py_ssize_t tlen;
    const char *tp = PyUnicode_AsUTF8AndSize(topic, &tlen);
    if (tp == NULL) { PyErr_Clear(); result = 0; goto done; }
    uint32_t base = crc_update(crc_update(0xFFFFFFFFu, (const unsigned char *)tp, tlen),
                               (const unsigned char *)"#", 1);
    const char *up = NULL, *kp = NULL;
    Py_ssize_t ulen = 0, klen = 0;
    if (Py_TYPE(props) == (PyTypeObject *)raw_type) {
        raw = PyObject_GetAttr(props, s_raw);
        if (raw == NULL) goto done;
        if (!PyBytes_CheckExact(raw)) { result = 0; goto done; }
        const char *rp = PyBytes_AS_STRING(raw);
        Py_ssize_t rlen = PyBytes_GET_SIZE(raw);
        raw_get(rp, rlen, "UNIQ_KEY", 8, &up, &ulen);
        raw_get(rp, rlen, "KEYS", 4, &kp, &klen);
    } else {
        if (PyDict_CheckExact(props)) {
            uv = PyDict_GetItemWithError(props, s_uniq);
            Py_XINCREF(uv);
            if (uv == NULL && !PyErr_Occurred()) { uv = Py_None; Py_INCREF(uv); }
            kv = PyDict_GetItemWithError(props, s_keys);
            Py_XINCREF(kv);
            if (kv == NULL && !PyErr_Occurred()) { kv = Py_None; Py_INCREF(kv); }
        } else {
            uv = PyObject_CallMethodOneArg(props, s_get, s_uniq);
            kv = uv == NULL ? NULL : PyObject_CallMethodOneArg(props, s_get, s_keys);
        }
        if (uv == NULL || kv == NULL) goto done;
        if (str_value(uv, &up, &ulen) < 0 || str_value(kv, &kp, &klen) < 0) { result = 0; goto done; }
    }
    if (ulen > 0 && add_entry(out, ~crc_update(base, (const unsigned char *)up, ulen), phy, ts) < 0) goto done;
    Py_ssize_t s = 0;
    while (s < klen) {  /* keys.split(" "), empty parts skipped */
        Py_ssize_t e = s;
        while (e < klen && kp[e] != ' ') e++;
        if (e > s && add_entry(out, ~crc_update(base, (const unsigned char *)kp + s, e - s), phy, ts) < 0) goto done;
        s = e + 1;
    }
    result = 1;
done:
    Py_XDECREF(phy); Py_XDECREF(ts); Py_XDECREF(topic); Py_XDECREF(props); Py_XDECREF(raw);
    Py_XDECREF(uv); Py_XDECREF(kv);
    return result;
}

static PyObject *collect(PyObject *self, PyObject *args) {
    PyObject *batch, *raw_type;
    long long floor;
    if (!PyArg_ParseTuple(args, "O!LO", &PyList_Type, &batch, &floor, &raw_type)) return NULL;
    if (!PyType_Check(raw_type)) {
        PyErr_SetString(PyExc_TypeError, "raw_type must be a type");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(batch);
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = collect_one(PyList_GET_ITEM(batch, i), floor, raw_type, out);
        if (rc <= 0) {
            Py_DECREF(out);
            if (rc < 0) return NULL;
            Py_RETURN_NONE;
        }
    }
    return out;
}

typedef struct { uint32_t h; int64_t phy, ts; } entry_t;

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static inline void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static inline int32_t get_be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

static PyObject *put_run(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyObject *entries;
    Py_ssize_t i;
    long long count, used, end_ts, end_phy, max_phy, slots, max_entries, entry_base, anchor_ts, begin_ts;
    if (!PyArg_ParseTuple(args, "w*O!nLLLLLLLLLL", &buf, &PyList_Type, &entries, &i, &count, &used, &end_ts,
                          &end_phy, &max_phy, &slots, &max_entries, &entry_base, &anchor_ts, &begin_ts))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(entries);
    if (i < 0 || slots <= 0 || entry_base < HEADER_SIZE - ENTRY_SIZE
            || HEADER_SIZE + slots * SLOT_SIZE > buf.len
            || entry_base + (max_entries + 1) * ENTRY_SIZE > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "index file geometry does not fit the buffer");
        return NULL;
    }
    /* Read the entries with the GIL, write them without it. */
    Py_ssize_t take = n > i ? n - i : 0;
    if (take > max_entries - count) take = max_entries - count > 0 ? max_entries - count : 0;
    entry_t *es = take ? PyMem_Malloc(take * sizeof(entry_t)) : NULL;
    if (take && es == NULL) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < take; k++) {
        PyObject *t = PyList_GET_ITEM(entries, i + k);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3) {
            PyErr_SetString(PyExc_TypeError, "entries must be (hash, phy_offset, store_timestamp) tuples");
            goto fail;
        }
        unsigned long h = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, 0));
        long long phy = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
        long long ts = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
        if (PyErr_Occurred()) goto fail;
        if (h > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_OverflowError, "hash does not fit 32 bits");
            goto fail;
        }
        es[k] = (entry_t){(uint32_t)h, phy, ts};
    }
    Py_ssize_t done = 0;
    unsigned char *mm = buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (; done < take; done++) {
        const entry_t *e = &es[done];
        if (count == 0 || e->ts < begin_ts) break;
        long long delta = e->ts - anchor_ts;
        if (delta < INT32_MIN || delta > INT32_MAX) break;
        unsigned char *slot = mm + HEADER_SIZE + (long long)(e->h % (uint64_t)slots) * SLOT_SIZE;
        int32_t prev = get_be32(slot);
        if (prev < 0 || prev > count) break;
        if (prev == 0) used++;
        count++;
        unsigned char *p = mm + entry_base + count * ENTRY_SIZE;
        put_be32(p, e->h);
        put_be64(p + 4, (uint64_t)e->phy);
        put_be32(p + 12, (uint32_t)(int32_t)delta);
        put_be32(p + 16, (uint32_t)prev);
        put_be32(slot, (uint32_t)count);
        if (e->ts > end_ts) end_ts = e->ts;
        if (e->phy > end_phy) end_phy = e->phy;
        if (e->phy > max_phy) max_phy = e->phy;
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(es);
    PyBuffer_Release(&buf);
    return Py_BuildValue("nLLLLL", i + done, count, used, end_ts, end_phy, max_phy);
fail:
    PyMem_Free(es);
    PyBuffer_Release(&buf);
    return NULL;
}

static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) | ((uint64_t)p[3] << 32) |
           ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) | ((uint64_t)p[6] << 8) | (uint64_t)p[7];
}

#define CQ_UNIT_SIZE 20
#define MAX_RUNS 64

static PyObject *runs(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    long long log_min, byte_limit;
    Py_ssize_t count, max_runs;
    if (!PyArg_ParseTuple(args, "y*LLnn", &buf, &log_min, &byte_limit, &count, &max_runs)) return NULL;
    const unsigned char *u = (const unsigned char *)buf.buf;
    Py_ssize_t n = buf.len / CQ_UNIT_SIZE, k = 0, nruns = 0;
    int64_t starts[MAX_RUNS], lengths[MAX_RUNS];
    if (max_runs > MAX_RUNS) max_runs = MAX_RUNS;
    if (n == 0) goto fallback;
    /* every unit must be a record (as the Python code checks min(sizes) over all it was given) */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (get_be32(u + i * CQ_UNIT_SIZE + 8) <= 0) goto fallback;
    }
    int64_t phy0 = (int64_t)be64(u);
    if (phy0 < log_min) goto fallback;
    /* k: the longest prefix whose sizes sum to at most byte_limit, at least one record */
    int64_t total = 0, next_phy = 0;
    for (; k < n; k++) {
        const unsigned char *p = u + k * CQ_UNIT_SIZE;
        int64_t phy = (int64_t)be64(p);
        int64_t size = get_be32(p + 8);
        if (k > 0 && total + size > byte_limit) break;
        total += size;
        if (k > 0 && phy == next_phy) {
            lengths[nruns - 1] += size;
        } else {
            if (nruns == max_runs) goto fallback;
            starts[nruns] = phy;
            lengths[nruns] = size;
            nruns++;
        }
        next_phy = phy + size;
    }
    if (k == n && n < count) goto fallback;
    PyBuffer_Release(&buf);
    PyObject *list = PyList_New(nruns);
    if (list == NULL) return NULL;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *pair = Py_BuildValue("(LL)", (long long)starts[r], (long long)lengths[r]);
        if (pair == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, r, pair);
    }
    return Py_BuildValue("(nN)", k, list);
fallback:
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

/* -- walk_records ------------------------------------------------------------------------------------------------ */

/* Copies of cometmq.protocol.record_layout (test_record_walk.py checks them through layout()). */
#define MAGIC_CODE 0xDAA320A7u
#define BLANK_MAGIC_CODE 0xCBD43194u
#define MAGIC_CODE_POS 4
#define QUEUE_ID_POS 12
#define QUEUE_OFFSET_POS 20
#define SYS_FLAG_POS 36
#define BORN_HOST_POS 48
#define HOST_FLAGS_BYTE (SYS_FLAG_POS + 3)
#define HOST_FLAGS_SHIFT 4
#define IPV4_HOST_SIZE 8
#define IPV6_HOST_SIZE 20
#define MIN_RECORD_SIZE 91

/* Per layout ((sys_flag >> 4) & 3: IPv4 hosts, IPv6 born host, IPv6 store host, both): where STORETIMESTAMP and
 * BODYLEN are, where the body starts, the smallest record. After the born host: STORETIMESTAMP (8), the store host,
 * RECONSUMETIMES (4), PREPAREDTRANSACTIONOFFSET (8), BODYLEN (4); a record holds a topic length (1) and a
 * properties length (2) more. */
typedef struct { Py_ssize_t store_timestamp, body_length, body_pos, min_size; } walk_layout_t;
#define WALK_LAYOUT(born, store)                                                                                 \
    {BORN_HOST_POS + (born), BORN_HOST_POS + (born) + 8 + (store) + 12, BORN_HOST_POS + (born) + 8 + (store) + 16, \
     BORN_HOST_POS + (born) + 8 + (store) + 16 + 3}
static const walk_layout_t WALK_LAYOUTS[4] = {
    WALK_LAYOUT(IPV4_HOST_SIZE, IPV4_HOST_SIZE), WALK_LAYOUT(IPV6_HOST_SIZE, IPV4_HOST_SIZE),
    WALK_LAYOUT(IPV4_HOST_SIZE, IPV6_HOST_SIZE), WALK_LAYOUT(IPV6_HOST_SIZE, IPV6_HOST_SIZE)};

/* Why a walk stopped: record_walk's LIMIT, BLANK, SHORT, INVALID, UNDECODABLE. */
enum { WALK_LIMIT, WALK_BLANK, WALK_SHORT, WALK_INVALID, WALK_UNDECODABLE };

static inline int64_t get_be64s(const unsigned char *p) { return (int64_t)be64(p); }

static PyObject *walk_records(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t pos, end, limit;
    long long base;
    PyObject *request_type, *raw_type;
    if (!PyArg_ParseTuple(args, "y*nnLnOO", &buf, &pos, &end, &base, &limit, &request_type, &raw_type)) return NULL;
    if (pos < 0 || end > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "the walk does not fit the buffer");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)buf.buf;
    PyObject *out = PyList_New(0), *topic = NULL;
    const unsigned char *topic_p = NULL;
    Py_ssize_t topic_n = -1, count = 0;
    int why = WALK_LIMIT;
    if (out == NULL) goto error;
    while (count < limit) {
        if (pos + 8 > end) { why = WALK_SHORT; break; }
        const unsigned char *r = b + pos;
        int64_t size = get_be32(r);
        uint32_t magic = (uint32_t)get_be32(r + MAGIC_CODE_POS);
        if (magic != MAGIC_CODE) { why = magic == BLANK_MAGIC_CODE ? WALK_BLANK : WALK_INVALID; break; }
        if (size < MIN_RECORD_SIZE || pos + size > end) { why = WALK_INVALID; break; }
        const walk_layout_t *L = &WALK_LAYOUTS[(r[HOST_FLAGS_BYTE] >> HOST_FLAGS_SHIFT) & 3];
        if (size < L->min_size) { why = WALK_INVALID; break; }
        int64_t body_len = get_be32(r + L->body_length);
        int64_t p = L->body_pos + body_len;
        if (body_len < 0 || p + 3 > size) { why = WALK_INVALID; break; }
        Py_ssize_t topic_len = r[p];
        int64_t q = p + 1 + topic_len;
        if (q + 2 > size) { why = WALK_INVALID; break; }
        int64_t props_len = (int16_t)(((unsigned)r[q] << 8) | r[q + 1]);
        if (props_len < 0 || q + 2 + props_len != size) { why = WALK_INVALID; break; }
        const unsigned char *tp = r + p + 1, *pp = r + q + 2;
        /* A batch is one topic: its name is decoded once. */
        if (topic == NULL || topic_len != topic_n || memcmp(tp, topic_p, topic_len) != 0) {
            PyObject *t = PyUnicode_DecodeUTF8((const char *)tp, topic_len, "strict");
            if (t == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto error;
                PyErr_Clear();
                why = WALK_UNDECODABLE;
                break;
            }
            Py_XSETREF(topic, t);
            topic_p = tp;
            topic_n = topic_len;
        }
        int ok = utf8_valid(pp, props_len);
        if (ok < 0) goto error;
        if (!ok) { why = WALK_UNDECODABLE; break; }
        const char *tv;
        Py_ssize_t tlen = 0;
        int32_t tags_code = raw_get((const char *)pp, props_len, "TAGS", 4, &tv, &tlen) && tlen > 0
                                ? java_hash_utf8((const unsigned char *)tv, tlen) : 0;
        PyObject *raw = PyBytes_FromStringAndSize((const char *)pp, props_len);
        if (raw == NULL) goto error;
        PyObject *props = PyObject_CallOneArg(raw_type, raw);
        Py_DECREF(raw);
        if (props == NULL) goto error;
        PyObject *fields[9] = {topic,
                               PyLong_FromLong(get_be32(r + QUEUE_ID_POS)),
                               PyLong_FromLongLong(base + pos),
                               PyLong_FromLongLong(size),
                               PyLong_FromLong(tags_code),
                               PyLong_FromLongLong(get_be64s(r + L->store_timestamp)),
                               PyLong_FromLongLong(get_be64s(r + QUEUE_OFFSET_POS)),
                               PyLong_FromLong(get_be32(r + SYS_FLAG_POS)),
                               props};
        PyObject *req = NULL;
        int filled = 1;
        for (int k = 1; k < 8; k++) filled &= fields[k] != NULL;
        if (filled) req = PyObject_Vectorcall(request_type, fields, 9, NULL);
        for (int k = 1; k < 9; k++) Py_XDECREF(fields[k]);
        if (req == NULL) goto error;
        int rc = PyList_Append(out, req);
        Py_DECREF(req);
        if (rc < 0) goto error;
        count++;
        pos += size;
    }
    Py_XDECREF(topic);
    PyBuffer_Release(&buf);
    return Py_BuildValue("(Nni)", out, pos, why);
error:
    Py_XDECREF(topic);
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}

static PyObject *layout(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    PyObject *layouts = PyList_New(4);
    if (layouts == NULL) return NULL;
    for (int i = 0; i < 4; i++) {
        const walk_layout_t *L = &WALK_LAYOUTS[i];
        PyObject *d = Py_BuildValue("{snsnsnsn}", "store_timestamp_pos", L->store_timestamp, "body_length_pos",
                                    L->body_length, "body_pos", L->body_pos, "min_record_size", L->min_size);
        if (d == NULL) {
            Py_DECREF(layouts);
            return NULL;
        }
        PyList_SET_ITEM(layouts, i, d);
    }
    return Py_BuildValue(
        "{sksk" "sisisisisisisisisisi" "sisisisisi" "sN}", "MAGIC_CODE", (unsigned long)MAGIC_CODE, "BLANK_MAGIC_CODE",
        (unsigned long)BLANK_MAGIC_CODE, "MAGIC_CODE_POS", MAGIC_CODE_POS, "QUEUE_ID_POS", QUEUE_ID_POS,
        "QUEUE_OFFSET_POS", QUEUE_OFFSET_POS, "SYS_FLAG_POS", SYS_FLAG_POS, "BORN_HOST_POS", BORN_HOST_POS,
        "HOST_FLAGS_BYTE", HOST_FLAGS_BYTE, "HOST_FLAGS_SHIFT", HOST_FLAGS_SHIFT, "IPV4_HOST_SIZE", IPV4_HOST_SIZE,
        "IPV6_HOST_SIZE", IPV6_HOST_SIZE, "MIN_RECORD_SIZE", MIN_RECORD_SIZE, "LIMIT", WALK_LIMIT, "BLANK",
        WALK_BLANK, "SHORT", WALK_SHORT, "INVALID", WALK_INVALID, "UNDECODABLE", WALK_UNDECODABLE, "LAYOUTS",
        layouts);
}

static PyObject *heads(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer ub;
    Py_ssize_t k;
    PyObject *views;
    if (!PyArg_ParseTuple(args, "y*nO!", &ub, &k, &PyList_Type, &views)) return NULL;
    const unsigned char *u = (const unsigned char *)ub.buf;
    int ok = k >= 0 && k <= ub.len / CQ_UNIT_SIZE;
    Py_ssize_t i = 0;
    for (Py_ssize_t v = 0; ok && v < PyList_GET_SIZE(views); v++) {
        Py_buffer vb;
        if (PyObject_GetBuffer(PyList_GET_ITEM(views, v), &vb, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&ub);
            return NULL;
        }
        const unsigned char *p = (const unsigned char *)vb.buf;
        Py_ssize_t pos = 0;
        while (pos < vb.len) {
            if (i >= k) {
                ok = 0;
                break;
            }
            int64_t size = get_be32(u + i * CQ_UNIT_SIZE + 8);
            if (size < 8 || size > vb.len - pos || get_be32(p + pos) != size ||
                (uint32_t)get_be32(p + pos + MAGIC_CODE_POS) != MAGIC_CODE) {
                ok = 0;
                break;
            }
            pos += size;
            i++;
        }
        PyBuffer_Release(&vb);
    }
    PyBuffer_Release(&ub);
    if (ok && i == k) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"collect", collect, METH_VARARGS, "The hashed UNIQ_KEY/KEYS entries of a dispatched batch, or None."},
    {"put_run", put_run, METH_VARARGS, "Write index entries into one file's mapping until Python must step in."},
    {"runs", runs, METH_VARARGS, "The records one unfiltered read returns, as runs back to back in the log, or None."},
    {"heads", heads, METH_VARARGS, "Whether every record of the runs starts with its unit's size and the magic code."},
    {"walk_records", walk_records, METH_VARARGS, "Dispatch requests for a run of records in a segment's buffer."},
    {"layout", layout, METH_NOARGS, "The record-layout constants this helper keeps copies of."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_indexc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__indexc(void) {
    crc_init();
#define INTERN(var, s) if ((var = PyUnicode_InternFromString(s)) == NULL) return NULL
    INTERN(s_phy_offset, "phy_offset");
    INTERN(s_store_timestamp, "store_timestamp");
    INTERN(s_topic, "topic");
    INTERN(s_properties, "properties");
    INTERN(s_raw, "raw");
    INTERN(s_uniq, "UNIQ_KEY");
    INTERN(s_keys, "KEYS");
    INTERN(s_get, "get");
#undef INTERN
    return PyModule_Create(&module);
}
