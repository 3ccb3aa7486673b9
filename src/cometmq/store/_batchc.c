/* Optional C helpers for the write path of a batch (cometmq.store.batch_codec): the per-message loops of a
 * SEND_BATCH_MESSAGE, each done once per batch, which in Python cost the broker about 3.5 us a message.
 *
 *   bind(message_type, message_fields, raw_type, raw_fields, request_type, request_fields)
 *       Learns where the slots of MessageInner, RawProperties and DispatchRequest are (their member
 *       descriptors' offsets), so objects are made and read here without their Python __init__ (as
 *       client/message.py's send_results makes SendResults). Raises if a type is not a slots class with
 *       exactly those fields.
 *   decode_plain(body, topic, queue_id, sys_flag, born_timestamp, born_host, reconsume_times, markers)
 *           -> list | None | False
 *       protocol/batch.decode_batch_raw + properties.check_utf8 + one MessageInner per item with RawProperties
 *       (batch_codec.plain_batch_messages_py). None when the body is malformed in any way the reference
 *       rejects: the caller then runs the reference, which raises its own error. False when an item's
 *       properties hold one of ``markers`` (a tuple of bytes): the batch is not plain.
 *   count_plain(body, markers) -> int | None | False
 *       decode_plain's checks without its objects: how many items the body holds (batch_codec.plain_batch_count_py).
 *   measure(msgs, max_body, store_flags) -> int | None
 *       The bytes CommitLog.append would write for ``msgs``, or None when any message needs the Python append
 *       (a refusal, a record encoded ahead, properties not encoded yet or not a RawProperties without a tag
 *       code, a field of another type or out of its struct's range): nothing is checked twice. A message of
 *       ``batch_items`` n counts as the n records its body holds (checked as decode_plain checks a body, and n
 *       itself).
 *   pack(msgs, buf, pos, phy, now, store_host, queue_table[, total]) -> list[DispatchRequest]
 *       After ``measure``: the records, written into ``buf`` from ``pos`` (the segment's mapping), with queue
 *       offsets from ``queue_table`` (updated), the body CRCs, and the sys flags' host bits set (on the
 *       messages too), exactly as CommitLog.append's Python loop writes them; their dispatch requests (a
 *       message of ``batch_items``: one per item, its properties a RawProperties of the item's). With ``total``
 *       (measure's answer) no byte past ``pos + total`` is written, and records that do not end there are an
 *       error.
 *   put_units(buf, pos, end, requests, i, topic, queue_id, next_qoff) -> (j, written, first_phy)
 *       The consume-queue units of requests[i:] that follow on in one queue (MessageStore's dispatch):
 *       written from ``pos`` while they fit before ``end``; skips transaction halves; stops at the first
 *       request of another queue or another queue offset. ``j``: the first request not handled.
 *   offset_ids(prefix, requests) -> str | None
 *       A send answer's msgId: prefix + each request's commit-log offset in 16 upper-case hex digits, joined by
 *       commas (batch_codec.offset_msg_ids_py). None for anything else than non-negative int offsets.
 *   layout() -> dict
 *       The record-layout constants below, which a test checks against cometmq.protocol.record_layout
 *       (their owner).
 *
 * The pure-Python code stays the reference: tests compare what both produce byte for byte.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "_crecord.h"
#include "_cslots.h"
#include "_ctext.h"

/* The record layout: common/_crecord.h (tests/store/test_batch_codec.py checks the copies through layout()). The
 * batch write path's own constants: the transaction bit of exactly the halves that take no queue offset (prepared
 * 0x4, rolled back 0xC), ... */
#define HALVES_BIT 0x4
#define MAX_TOPIC_LENGTH 127
#define MAX_PROPERTIES_LENGTH 32767
/* a batch item: TOTALSIZE MAGICCODE BODYCRC FLAG BODYLEN (20) + BODY + PROPLEN (2) + PROPS */
#define ITEM_HEAD 20
#define ITEM_OVERHEAD 22
#define CQ_UNIT_SIZE 20

/* -- slots ---------------------------------------------------------------------------------------------------- */

static slots_t MSG, RAW, REQ;

/* MessageInner's fields, in ``message_fields`` order (batch_codec passes dataclass order). */
enum { M_TOPIC, M_BODY, M_QUEUE_ID, M_PROPERTIES, M_PROPERTIES_RAW, M_FLAG, M_SYS_FLAG, M_BORN_TIMESTAMP,
       M_BORN_HOST, M_RECONSUME_TIMES, M_PREPARED_OFFSET, M_TAGS_CODE, M_ENCODED, M_BATCH_ITEMS, M_COUNT };
enum { R_DICT, R_RAW, R_COUNT };
enum { D_TOPIC, D_QUEUE_ID, D_PHY_OFFSET, D_SIZE, D_TAGS_CODE, D_STORE_TIMESTAMP, D_QUEUE_OFFSET, D_SYS_FLAG,
       D_PROPERTIES, D_COUNT };

static PyObject *bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *mt, *mf, *rt, *rf, *dt, *df;
    if (!PyArg_ParseTuple(args, "OOOOOO", &mt, &mf, &rt, &rf, &dt, &df)) return NULL;
    /* All or nothing: a refused bind leaves the classes bound before as they were. */
    slots_t m = {NULL, 0, {0}}, r = {NULL, 0, {0}}, d = {NULL, 0, {0}};
    if (bind_slots(&m, mt, mf, M_COUNT) < 0 || bind_slots(&r, rt, rf, R_COUNT) < 0
        || bind_slots(&d, dt, df, D_COUNT) < 0) {
        Py_XDECREF(m.type);
        Py_XDECREF(r.type);
        Py_XDECREF(d.type);
        return NULL;
    }
    Py_XDECREF(MSG.type);
    Py_XDECREF(RAW.type);
    Py_XDECREF(REQ.type);
    MSG = m;
    RAW = r;
    REQ = d;
    Py_RETURN_NONE;
}

static int bound(void) {
    if (MSG.type == NULL || RAW.type == NULL || REQ.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_batchc.bind was not called");
        return 0;
    }
    return 1;
}

#include "_cvalues.h"

/* -- decode_plain --------------------------------------------------------------------------------------------- */

/* 1 when ``needle`` occurs in ``hay`` (``bytes.__contains__``). */
static int contains(const unsigned char *hay, Py_ssize_t n, const char *needle, Py_ssize_t m) {
    if (m == 0) return 1;
    for (Py_ssize_t i = 0; i + m <= n; i++) {
        const unsigned char *at = memchr(hay + i, (unsigned char)needle[0], (size_t)(n - m - i + 1));
        if (at == NULL) return 0;
        i = at - hay;
        if (memcmp(at, needle, (size_t)m) == 0) return 1;
    }
    return 0;
}

/* The items of a plain batch body ``b[:end]``, checked as the reference checks them (each item's sizes, then its
 * properties as UTF-8; with ``markers`` (a tuple of bytes, or NULL) ``*marked`` set when one's properties hold
 * one): their count; -1 when the body is malformed in any way the reference rejects; -2 with an error set. */
static Py_ssize_t scan_items(const unsigned char *b, Py_ssize_t end, PyObject *markers, int *marked) {
    Py_ssize_t n_markers = markers == NULL ? 0 : PyTuple_GET_SIZE(markers), pos = 0, count = 0;
    while (pos < end) {
        if (end - pos < ITEM_OVERHEAD) return -1;
        int64_t total = get_be32(b + pos), body_len = get_be32(b + pos + 16);
        if (total < ITEM_OVERHEAD || total > end - pos) return -1;
        int64_t item_end = pos + total, body_end = pos + ITEM_HEAD + body_len;
        if (body_len < 0 || body_end + 2 > item_end) return -1;
        int64_t props_len = (int16_t)((b[body_end] << 8) | b[body_end + 1]);
        if (props_len < 0 || body_end + 2 + props_len != item_end) return -1;
        int ok = utf8_valid(b + body_end + 2, (Py_ssize_t)props_len);
        if (ok < 0) return -2;
        if (!ok) return -1;
        for (Py_ssize_t k = 0; k < n_markers && !*marked; k++) {
            PyObject *mk = PyTuple_GET_ITEM(markers, k);
            *marked = contains(b + body_end + 2, (Py_ssize_t)props_len, PyBytes_AS_STRING(mk), PyBytes_GET_SIZE(mk));
        }
        pos = (Py_ssize_t)item_end;
        count++;
    }
    return count;
}

static PyObject *decode_plain(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *body, *topic, *queue_id, *sys_flag, *born_ts, *born_host, *reconsume, *markers;
    if (!PyArg_ParseTuple(args, "SOOOOOOO!", &body, &topic, &queue_id, &sys_flag, &born_ts, &born_host, &reconsume,
                          &PyTuple_Type, &markers))
        return NULL;
    if (!bound()) return NULL;
    Py_ssize_t n_markers = PyTuple_GET_SIZE(markers);
    for (Py_ssize_t k = 0; k < n_markers; k++) {
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(markers, k))) {
            PyErr_SetString(PyExc_TypeError, "decode_plain: markers are bytes");
            return NULL;
        }
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t end = PyBytes_GET_SIZE(body), pos = 0;
    /* First the checks of the whole body (the reference checks every item before any UTF-8, and the markers after
     * both), then the objects. */
    int marked = 0;
    Py_ssize_t count = scan_items(b, end, markers, &marked);
    if (count == -2) return NULL;
    if (count < 0) Py_RETURN_NONE;
    if (marked) Py_RETURN_FALSE;
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *item = b + pos;
        Py_ssize_t total = get_be32(item), body_len = get_be32(item + 16);
        Py_ssize_t props_len = total - ITEM_OVERHEAD - body_len;
        PyObject *ibody = PyBytes_FromStringAndSize((const char *)item + ITEM_HEAD, body_len);
        PyObject *raw = PyBytes_FromStringAndSize((const char *)item + ITEM_HEAD + body_len + 2, props_len);
        PyObject *flag = PyLong_FromLong(get_be32(item + 12));
        PyObject *props = NULL, *m = NULL;
        if (ibody != NULL && raw != NULL && flag != NULL) {
            PyObject *rvals[R_COUNT] = {Py_None, raw};
            props = make_leaf(&RAW, rvals);
        }
        if (props != NULL) {
            PyObject *zero = PyLong_FromLong(0);
            if (zero != NULL) {
                PyObject *vals[M_COUNT] = {topic, ibody, queue_id, props, raw, flag, sys_flag, born_ts, born_host,
                                           reconsume, zero, Py_None, Py_None, zero};
                m = make_leaf(&MSG, vals);
                Py_DECREF(zero);
            }
        }
        Py_XDECREF(ibody);
        Py_XDECREF(raw);
        Py_XDECREF(flag);
        Py_XDECREF(props);
        if (m == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, m);
        pos += total;
    }
    return out;
}

/* count_plain(body, markers) -> int | None | False: decode_plain's checks without its objects. */
static PyObject *count_plain(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *body, *markers;
    if (!PyArg_ParseTuple(args, "SO!", &body, &PyTuple_Type, &markers)) return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(markers); k++) {
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(markers, k))) {
            PyErr_SetString(PyExc_TypeError, "count_plain: markers are bytes");
            return NULL;
        }
    }
    int marked = 0;
    Py_ssize_t count = scan_items((const unsigned char *)PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), markers,
                                  &marked);
    if (count == -2) return NULL;
    if (count < 0) Py_RETURN_NONE;
    if (marked) Py_RETURN_FALSE;
    return PyLong_FromSsize_t(count);
}

/* -- measure and pack ----------------------------------------------------------------------------------------- */

static int int_in(PyObject *v, long long lo, long long hi, long long *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}
#define I32(v, out) int_in((v), INT32_MIN, INT32_MAX, (out))
#define I64(v, out) int_in((v), INT64_MIN, INT64_MAX, (out))

/* What pack needs of one message, read from its slots; 0 when it needs the Python append. */
typedef struct {
    PyObject *m, *topic, *body, *props, *raw, *born;
    const char *topic_p;
    Py_ssize_t topic_len, body_len, raw_len, born_len, size;
    long long queue_id, flag, sys_flag, born_ts, reconsume, prepared, tags_code, items;
    int has_tags_code;
} item_t;

/* The tag code of encoded properties (their TAGS value's Java hash, 0 without one); 0 when the value is not UTF-8
 * (the reference's decode raises). */
static int tags_of_raw(const char *raw, Py_ssize_t len, long long *out) {
    const char *tv;
    Py_ssize_t tlen = 0;
    *out = 0;
    if (raw_get(raw, len, "TAGS", 4, &tv, &tlen) && tlen > 0) {
        if (!all_ascii((const unsigned char *)tv, tlen)) {
            int ok = utf8_valid((const unsigned char *)tv, tlen);
            if (ok <= 0) {
                PyErr_Clear();
                return 0;
            }
        }
        *out = java_hash_utf8((const unsigned char *)tv, tlen);
    }
    return 1;
}

/* One batch item's parts (after scan_items checked the body): its flag, body and properties. */
typedef struct {
    const unsigned char *body, *props;
    Py_ssize_t body_len, props_len, total;
    long long flag;
} part_t;

static void item_at(const unsigned char *b, part_t *p) {
    p->total = get_be32(b);
    p->flag = (int32_t)get_be32(b + 12);
    p->body_len = get_be32(b + 16);
    p->body = b + ITEM_HEAD;
    p->props_len = p->total - ITEM_OVERHEAD - p->body_len;
    p->props = p->body + p->body_len + 2;
}

static int read_item(PyObject *m, long long max_body, int store_flags, item_t *it) {
    if (Py_TYPE(m) != MSG.type) return 0;
    PyObject *topic = SLOT(m, MSG, M_TOPIC), *body = SLOT(m, MSG, M_BODY), *raw = SLOT(m, MSG, M_PROPERTIES_RAW),
             *props = SLOT(m, MSG, M_PROPERTIES), *born = SLOT(m, MSG, M_BORN_HOST),
             *tags = SLOT(m, MSG, M_TAGS_CODE), *enc = SLOT(m, MSG, M_ENCODED);
    if (topic == NULL || body == NULL || raw == NULL || props == NULL || born == NULL || tags == NULL || enc == NULL)
        return 0;
    if (enc != Py_None || !PyUnicode_CheckExact(topic) || !PyBytes_CheckExact(body) || !PyBytes_CheckExact(raw)
        || !PyBytes_CheckExact(born))
        return 0;
    it->m = m;
    it->born = born;
    it->topic = topic;
    it->body = body;
    it->props = props;
    it->raw = raw;
    it->topic_p = PyUnicode_AsUTF8AndSize(topic, &it->topic_len);
    if (it->topic_p == NULL) {  /* a lone surrogate: the reference's encode raises */
        PyErr_Clear();
        return 0;
    }
    if (it->topic_len < 1 || it->topic_len > MAX_TOPIC_LENGTH) return 0;
    it->raw_len = PyBytes_GET_SIZE(raw);
    it->body_len = PyBytes_GET_SIZE(body);
    it->born_len = PyBytes_GET_SIZE(born);
    if (it->raw_len > MAX_PROPERTIES_LENGTH || it->body_len > max_body) return 0;
    if (it->born_len != IPV4_HOST_SIZE && it->born_len != IPV6_HOST_SIZE) return 0;
    PyObject *bi = SLOT(m, MSG, M_BATCH_ITEMS);
    if (bi == NULL || !int_in(bi, 0, INT32_MAX, &it->items)) return 0;
    if (it->items) {
        it->has_tags_code = 0;  /* each record's own, from its item's properties */
    } else if (tags == Py_None) {
        /* the tag code comes from the TAGS property: here only from a RawProperties's bytes (which hold UTF-8:
         * check_utf8; a value that is not would make the reference raise) */
        if (Py_TYPE(props) != RAW.type) return 0;
        PyObject *praw = SLOT(props, RAW, R_RAW);
        if (praw == NULL || !PyBytes_CheckExact(praw)) return 0;
        if (!tags_of_raw(PyBytes_AS_STRING(praw), PyBytes_GET_SIZE(praw), &it->tags_code)) return 0;
        it->has_tags_code = 0;
    } else {
        if (!I64(tags, &it->tags_code)) return 0;
        it->has_tags_code = 1;
    }
    PyObject *q = SLOT(m, MSG, M_QUEUE_ID), *f = SLOT(m, MSG, M_FLAG), *sf = SLOT(m, MSG, M_SYS_FLAG),
             *bt = SLOT(m, MSG, M_BORN_TIMESTAMP), *rc = SLOT(m, MSG, M_RECONSUME_TIMES),
             *po = SLOT(m, MSG, M_PREPARED_OFFSET);
    if (q == NULL || f == NULL || sf == NULL || bt == NULL || rc == NULL || po == NULL) return 0;
    if (!I32(q, &it->queue_id) || !I32(f, &it->flag) || !I32(sf, &it->sys_flag) || !I64(bt, &it->born_ts)
        || !I32(rc, &it->reconsume) || !I64(po, &it->prepared))
        return 0;
    Py_ssize_t store_len = (store_flags & STOREHOST_V6_FLAG) ? IPV6_HOST_SIZE : IPV4_HOST_SIZE;
    if (!it->items) {
        it->size = BODY_POS(it->born_len, store_len) + it->body_len + 1 + it->topic_len + 2 + it->raw_len;
        return 1;
    }
    /* A batch of items (MessageInner.batch_items): a record each, of the size the reference's decoded messages
     * take. Their count, their bodies' sizes and their properties' UTF-8 are checked as the reference checks them. */
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(body);
    int marked = 0;
    Py_ssize_t count = scan_items(b, it->body_len, NULL, &marked);
    if (count == -2) PyErr_Clear();
    if (count != it->items) return 0;
    Py_ssize_t head = BODY_POS(it->born_len, store_len) + 1 + it->topic_len + 2, pos = 0;
    part_t p;
    it->size = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        item_at(b + pos, &p);
        if (p.body_len > max_body) return 0;
        it->size += head + p.body_len + p.props_len;
        pos += p.total;
    }
    return 1;
}

static PyObject *measure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *msgs;
    long long max_body;
    int store_flags;
    if (!PyArg_ParseTuple(args, "O!Li", &PyList_Type, &msgs, &max_body, &store_flags)) return NULL;
    if (!bound()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    if (n == 0) Py_RETURN_NONE;
    long long total = 0;
    item_t it;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!read_item(PyList_GET_ITEM(msgs, i), max_body, store_flags, &it)) Py_RETURN_NONE;
        total += it.size;
    }
    return PyLong_FromLongLong(total);
}


/* The next queue offset of (topic, queue_id) in ``table`` (0 when absent); -1 with an error set. */
static long long table_get(PyObject *table, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(table, key);
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    return x;
}

static int table_put(PyObject *table, PyObject *key, long long next) {
    PyObject *v = PyLong_FromLongLong(next);
    if (v == NULL) return -1;
    int rc = PyDict_SetItem(table, key, v);
    Py_DECREF(v);
    return rc;
}

/* Writes one record at ``r`` (CommitLog.append's layout: protocol/record_layout.py). */
static void write_record(unsigned char *r, const item_t *it, long long flag, long long qoff, long long phy,
                         long long sys, long long now, const char *store_host, Py_ssize_t store_len, Py_ssize_t size,
                         const unsigned char *body, Py_ssize_t body_len, const unsigned char *raw, Py_ssize_t raw_len) {
    uint32_t crc = (uint32_t)crc32(0L, body, (uInt)body_len) & 0x7FFFFFFFu;
    put_be32(r, (uint32_t)size);
    put_be32(r + 4, MAGIC_CODE);
    put_be32(r + 8, crc);
    put_be32(r + 12, (uint32_t)it->queue_id);
    put_be32(r + 16, (uint32_t)flag);
    put_be64(r + 20, (uint64_t)qoff);
    put_be64(r + 28, (uint64_t)phy);
    put_be32(r + 36, (uint32_t)sys);
    put_be64(r + 40, (uint64_t)it->born_ts);
    unsigned char *p = r + BORN_HOST_POS;
    memcpy(p, PyBytes_AS_STRING(it->born), it->born_len);
    p += it->born_len;
    put_be64(p, (uint64_t)now);
    memcpy(p + 8, store_host, store_len);
    p += 8 + store_len;
    put_be32(p, (uint32_t)it->reconsume);
    put_be64(p + 4, (uint64_t)it->prepared);
    put_be32(p + 12, (uint32_t)body_len);
    p += 16;
    memcpy(p, body, body_len);
    p += body_len;
    *p++ = (unsigned char)it->topic_len;
    memcpy(p, it->topic_p, it->topic_len);
    p += it->topic_len;
    put_be16(p, (uint32_t)raw_len);
    memcpy(p + 2, raw, raw_len);
}

/* The state of one pack call: the run of one (topic, queue) whose next queue offset is held here (a batch is one
 * run: the table is read and written once), and the ints its requests share. */
typedef struct {
    /* ``staged``: the next queue offsets of the runs ended so far, written into ``table`` only once every record
     * is written (a pack that fails leaves the table as it was) */
    PyObject *table, *staged, *key, *last_size, *last_tags, *last_raw, *last_props;
    long long next_qoff, key_qid;
} run_t;

/* The queue offset of the next record of ``it``'s (topic, queue); -1 with an error set. */
static long long take_qoff(run_t *run, const item_t *it) {
    if (run->key == NULL || it->queue_id != run->key_qid
        || (PyTuple_GET_ITEM(run->key, 0) != it->topic && PyUnicode_Compare(PyTuple_GET_ITEM(run->key, 0), it->topic) != 0)) {
        if (run->key != NULL && table_put(run->staged, run->key, run->next_qoff) < 0) return -1;
        Py_XSETREF(run->key, PyTuple_Pack(2, it->topic, SLOT(it->m, MSG, M_QUEUE_ID)));
        run->key_qid = it->queue_id;
        if (run->key == NULL) return -1;
        int staged = PyDict_Contains(run->staged, run->key);
        if (staged < 0 || (run->next_qoff = table_get(staged ? run->staged : run->table, run->key)) < 0) return -1;
    }
    return run->next_qoff++;
}

/* A record's dispatch request (new reference; NULL: an error). */
static PyObject *request(run_t *run, const item_t *it, long long phy, Py_ssize_t size, PyObject *tags_o,
                         PyObject *now_obj, long long qoff, PyObject *sys_obj, PyObject *props) {
    PyObject *phy_o = PyLong_FromLongLong(phy), *size_o = shared_int(&run->last_size, size),
             *qoff_o = PyLong_FromLongLong(qoff), *req = NULL;
    if (phy_o != NULL && size_o != NULL && tags_o != NULL && qoff_o != NULL) {
        PyObject *vals[D_COUNT] = {it->topic, SLOT(it->m, MSG, M_QUEUE_ID), phy_o, size_o, tags_o, now_obj, qoff_o,
                                   sys_obj, props};
        req = make_leaf(&REQ, vals);
    }
    Py_XDECREF(phy_o);
    Py_XDECREF(size_o);
    Py_XDECREF(qoff_o);
    return req;
}

/* The RawProperties of an item's properties ``raw[:n]`` (new reference): the last one made when its bytes are
 * equal (a batch's items mostly share theirs; a RawProperties is read-only), else a new one. */
static PyObject *item_props(run_t *run, const unsigned char *raw, Py_ssize_t n) {
    if (run->last_raw != NULL && PyBytes_GET_SIZE(run->last_raw) == n
        && memcmp(PyBytes_AS_STRING(run->last_raw), raw, (size_t)n) == 0)
        return Py_NewRef(run->last_props);
    PyObject *b = PyBytes_FromStringAndSize((const char *)raw, n);
    if (b == NULL) return NULL;
    PyObject *rvals[R_COUNT] = {Py_None, b};
    PyObject *props = make_leaf(&RAW, rvals);
    if (props == NULL) {
        Py_DECREF(b);
        return NULL;
    }
    Py_XSETREF(run->last_raw, b);
    Py_XSETREF(run->last_props, Py_NewRef(props));
    return props;
}

static void release4(PyObject **held) {
    for (int k = 0; k < 4; k++) Py_DECREF(held[k]);
}

static PyObject *pack(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *msgs, *now_obj, *table;
    Py_buffer buf;
    Py_ssize_t pos;
    long long phy, now;
    const char *store_host;
    Py_ssize_t store_len;
    Py_ssize_t total = -1;
    if (!PyArg_ParseTuple(args, "O!w*nLOy#O!|n", &PyList_Type, &msgs, &buf, &pos, &phy, &now_obj, &store_host,
                          &store_len, &PyDict_Type, &table, &total))
        return NULL;
    PyObject *out = NULL;
    run_t run = {table, PyDict_New(), NULL, NULL, NULL, NULL, NULL, 0, 0};
    if (run.staged == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    /* the records end at ``pos + total`` (what measure gave: the room the caller reserved), else at the buffer's */
    Py_ssize_t end = total >= 0 && pos >= 0 && total <= buf.len - pos ? pos + total : buf.len;
    if (!bound()) goto done;
    if (store_len != IPV4_HOST_SIZE && store_len != IPV6_HOST_SIZE) {
        PyErr_SetString(PyExc_ValueError, "a store host is 8 or 20 bytes");
        goto done;
    }
    now = PyLong_AsLongLong(now_obj);
    if (now == -1 && PyErr_Occurred()) goto done;
    int store_flags = store_len == IPV6_HOST_SIZE ? STOREHOST_V6_FLAG : 0;
    Py_ssize_t n = PyList_GET_SIZE(msgs), k = 0;
    out = PyList_New(0);
    if (out == NULL) goto done;
    unsigned char *base = (unsigned char *)buf.buf;
    item_t it;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        if (!read_item(m, INT64_MAX, store_flags, &it) || pos < 0 || it.size > end - pos) {
            PyErr_SetString(PyExc_ValueError, "pack: a message changed since measure, or the buffer is short");
            goto fail;
        }
        /* The host bits as CommitLog sets them from the hosts' widths (its _layout_of / _checked_flags). */
        long long sys = (it.sys_flag & ~HOST_V6_FLAGS) | store_flags
                        | (it.born_len == IPV6_HOST_SIZE ? BORNHOST_V6_FLAG : 0);
        PyObject *sys_obj = SLOT(m, MSG, M_SYS_FLAG);
        Py_INCREF(sys_obj);
        if (sys != it.sys_flag) {
            Py_SETREF(sys_obj, PyLong_FromLongLong(sys));
            if (sys_obj == NULL) goto fail;
            /* (on a message of batch_items its records have them: it is not appended itself) */
            if (!it.items) Py_SETREF(SLOT(m, MSG, M_SYS_FLAG), Py_NewRef(sys_obj));
        }
        /* (held for the message's records: each record's objects may start a collection, whose finalizers run
         * Python code) */
        PyObject *held[4] = {Py_NewRef(it.body), Py_NewRef(it.topic), Py_NewRef(it.born), Py_NewRef(it.raw)};
        const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(it.body);
        Py_ssize_t records = it.items ? it.items : 1, at = 0;
        for (Py_ssize_t j = 0; j < records; j++, k++) {
            long long qoff = 0;
            if (!(sys & HALVES_BIT) && (qoff = take_qoff(&run, &it)) < 0) {
                Py_DECREF(sys_obj);
                release4(held);
                goto fail;
            }
            PyObject *tags_o, *props, *req;
            Py_ssize_t size;
            if (!it.items) {
                size = it.size;
                write_record(base + pos, &it, it.flag, qoff, phy, sys, now, store_host, store_len, size, body,
                             it.body_len, (const unsigned char *)PyBytes_AS_STRING(it.raw), it.raw_len);
                /* (a batch's records mostly share their size and tag code: one int each) */
                tags_o = it.has_tags_code ? Py_NewRef(SLOT(m, MSG, M_TAGS_CODE))
                                          : shared_int(&run.last_tags, it.tags_code);
                props = Py_NewRef(it.props);
            } else {
                part_t p;
                long long tags;
                item_at(body + at, &p);
                at += p.total;
                size = BODY_POS(it.born_len, store_len) + p.body_len + 1 + it.topic_len + 2 + p.props_len;
                if (size > end - pos) {
                    PyErr_SetString(PyExc_ValueError, "pack: a message changed since measure");
                    Py_DECREF(sys_obj);
                    release4(held);
                    goto fail;
                }
                write_record(base + pos, &it, p.flag, qoff, phy, sys, now, store_host, store_len, size, p.body,
                             p.body_len, p.props, p.props_len);
                tags_of_raw((const char *)p.props, p.props_len, &tags);  /* (UTF-8: measure checked) */
                tags_o = shared_int(&run.last_tags, tags);
                props = item_props(&run, p.props, p.props_len);
            }
            req = props == NULL ? NULL : request(&run, &it, phy, size, tags_o, now_obj, qoff, sys_obj, props);
            Py_XDECREF(tags_o);
            Py_XDECREF(props);
            if (req == NULL || PyList_Append(out, req) < 0) {
                Py_XDECREF(req);
                Py_DECREF(sys_obj);
                release4(held);
                goto fail;
            }
            Py_DECREF(req);
            pos += size;
            phy += size;
        }
        Py_DECREF(sys_obj);
        release4(held);
    }
    if (total >= 0 && pos != end) {
        PyErr_SetString(PyExc_ValueError, "pack: the messages changed since measure");
        goto fail;
    }
    if ((run.key != NULL && table_put(run.staged, run.key, run.next_qoff) < 0) || PyDict_Update(table, run.staged) < 0)
        goto fail;
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(run.key);
    Py_XDECREF(run.staged);
    Py_XDECREF(run.last_size);
    Py_XDECREF(run.last_tags);
    Py_XDECREF(run.last_raw);
    Py_XDECREF(run.last_props);
    PyBuffer_Release(&buf);
    return out;
}

/* -- put_units ------------------------------------------------------------------------------------------------ */

static PyObject *put_units(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t pos, end, i;
    PyObject *reqs, *topic;
    long long queue_id, next_qoff;
    if (!PyArg_ParseTuple(args, "w*nnO!nULL", &buf, &pos, &end, &PyList_Type, &reqs, &i, &topic, &queue_id,
                          &next_qoff))
        return NULL;
    PyObject *result = NULL;
    if (!bound()) goto done;
    if (pos < 0 || end > buf.len || i < 0) {
        PyErr_SetString(PyExc_ValueError, "put_units: out of range");
        goto done;
    }
    unsigned char *b = (unsigned char *)buf.buf;
    Py_ssize_t n = PyList_GET_SIZE(reqs), written = 0;
    long long first_phy = -1;
    for (; i < n; i++) {
        PyObject *req = PyList_GET_ITEM(reqs, i);
        if (Py_TYPE(req) != REQ.type) break;
        PyObject *t = SLOT(req, REQ, D_TOPIC), *q = SLOT(req, REQ, D_QUEUE_ID), *sf = SLOT(req, REQ, D_SYS_FLAG),
                 *ph = SLOT(req, REQ, D_PHY_OFFSET), *sz = SLOT(req, REQ, D_SIZE), *tc = SLOT(req, REQ, D_TAGS_CODE),
                 *qo = SLOT(req, REQ, D_QUEUE_OFFSET);
        if (t == NULL || q == NULL || sf == NULL || ph == NULL || sz == NULL || tc == NULL || qo == NULL) break;
        long long sys, qid, phy, size, tags, qoff;
        if (!I64(sf, &sys)) break;
        if (sys & HALVES_BIT) continue;  /* a prepared or rolled-back half: in no consume queue */
        if (!I64(q, &qid) || qid != queue_id || !I64(ph, &phy) || !I32(sz, &size) || !I64(tc, &tags)
            || !I64(qo, &qoff))
            break;
        if (t != topic && (!PyUnicode_CheckExact(t) || PyUnicode_Compare(t, topic) != 0)) break;
        if (qoff != next_qoff + written || pos + CQ_UNIT_SIZE > end) break;
        unsigned char *u = b + pos;
        put_be64(u, (uint64_t)phy);
        put_be32(u + 8, (uint32_t)size);
        put_be64(u + 12, (uint64_t)tags);
        if (first_phy < 0) first_phy = phy;
        pos += CQ_UNIT_SIZE;
        written++;
    }
    if (PyErr_Occurred()) goto done;
    result = Py_BuildValue("(nnL)", i, written, first_phy);
done:
    PyBuffer_Release(&buf);
    return result;
}

/* -- offset_ids ----------------------------------------------------------------------------------------------- */

static PyObject *offset_ids(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *prefix, *reqs;
    if (!PyArg_ParseTuple(args, "UO!", &prefix, &PyList_Type, &reqs)) return NULL;
    if (!bound()) return NULL;
    if (!PyUnicode_IS_ASCII(prefix)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(reqs), plen = PyUnicode_GET_LENGTH(prefix), id_len = plen + 16;
    if (n == 0) return PyUnicode_New(0, 127);
    PyObject *out = PyUnicode_New(n * (id_len + 1) - 1, 127);
    if (out == NULL) return NULL;
    char *p = (char *)PyUnicode_DATA(out);
    const char *pre = (const char *)PyUnicode_DATA(prefix);
    static const char digits[] = "0123456789ABCDEF";
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *req = PyList_GET_ITEM(reqs, i), *ph;
        long long phy;
        if (Py_TYPE(req) != REQ.type || (ph = SLOT(req, REQ, D_PHY_OFFSET)) == NULL || !I64(ph, &phy) || phy < 0) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        if (i) *p++ = ',';
        memcpy(p, pre, plen);
        p += plen;
        for (int k = 15; k >= 0; k--) {
            p[k] = digits[phy & 0xF];
            phy >>= 4;
        }
        p += 16;
    }
    return out;
}

/* -- layout --------------------------------------------------------------------------------------------------- */

static PyObject *layout(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return Py_BuildValue(
        "{sk" "sisisisisisisi" "sisisisisisisi}", "MAGIC_CODE", (unsigned long)MAGIC_CODE, "BORN_HOST_POS",
        BORN_HOST_POS, "IPV4_HOST_SIZE", IPV4_HOST_SIZE, "IPV6_HOST_SIZE", IPV6_HOST_SIZE, "BORNHOST_V6_FLAG",
        BORNHOST_V6_FLAG, "STOREHOST_V6_FLAG", STOREHOST_V6_FLAG, "HALVES_BIT", HALVES_BIT, "MAX_TOPIC_LENGTH",
        MAX_TOPIC_LENGTH, "MAX_PROPERTIES_LENGTH", MAX_PROPERTIES_LENGTH, "ITEM_OVERHEAD", ITEM_OVERHEAD,
        "CQ_UNIT_SIZE", CQ_UNIT_SIZE, "BODY_POS_V4_V4", BODY_POS(IPV4_HOST_SIZE, IPV4_HOST_SIZE), "BODY_POS_V6_V4",
        BODY_POS(IPV6_HOST_SIZE, IPV4_HOST_SIZE), "BODY_POS_V4_V6", BODY_POS(IPV4_HOST_SIZE, IPV6_HOST_SIZE),
        "BODY_POS_V6_V6", BODY_POS(IPV6_HOST_SIZE, IPV6_HOST_SIZE));
}


static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Learn the slots of MessageInner, RawProperties and DispatchRequest."},
    {"decode_plain", decode_plain, METH_VARARGS, "A plain batch body's messages, or None when it is malformed."},
    {"count_plain", count_plain, METH_VARARGS, "How many items a plain batch body holds: decode_plain's checks."},
    {"measure", measure, METH_VARARGS, "The bytes an append of these messages writes, or None (Python's job)."},
    {"pack", pack, METH_VARARGS, "Write the records of measured messages; their dispatch requests."},
    {"put_units", put_units, METH_VARARGS, "Write the consume-queue units of a run of dispatch requests."},
    {"offset_ids", offset_ids, METH_VARARGS, "A send answer's msgId of these dispatch requests, or None."},
    {"layout", layout, METH_NOARGS, "The record-layout constants this helper keeps copies of."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batchc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__batchc(void) { return PyModule_Create(&module); }
