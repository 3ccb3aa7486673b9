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
 *   measure(msgs, max_body, store_flags) -> int | None
 *       The bytes CommitLog.append would write for ``msgs``, or None when any message needs the Python append
 *       (a refusal, a record encoded ahead, properties not encoded yet or not a RawProperties without a tag
 *       code, a field of another type or out of its struct's range): nothing is checked twice.
 *   pack(msgs, buf, pos, phy, now, store_host, queue_table) -> list[DispatchRequest]
 *       After ``measure``: the records, written into ``buf`` from ``pos`` (the segment's mapping), with queue
 *       offsets from ``queue_table`` (updated), the body CRCs, and the sys flags' host bits set (on the
 *       messages too), exactly as CommitLog.append's Python loop writes them; their dispatch requests.
 *   put_units(buf, pos, end, requests, i, topic, queue_id, next_qoff) -> (j, written, first_phy)
 *       The consume-queue units of requests[i:] that follow on in one queue (MessageStore's dispatch):
 *       written from ``pos`` while they fit before ``end``; skips transaction halves; stops at the first
 *       request of another queue or another queue offset. ``j``: the first request not handled.
 *   offset_ids(prefix, requests) -> str | None
 *       A send answer's msgId: prefix + each request's commit-log offset in 16 upper-case hex digits, joined by
 *       commas (batch_codec.offset_msg_ids_py). None for anything else than non-negative int offsets.
 *   half_fields(topic_part, group_name, prepared_name, record) -> (queue_offset, physical_offset, group, prepared)
 *           | None
 *       A stored transaction half read without decoding it (broker/transaction/messages._plain_half_py): the
 *       record's queue and commit-log offsets, the values of its properties ``group_name`` ("" when absent) and
 *       ``prepared_name`` (None when absent). None unless it is a whole record whose topic length byte and name are
 *       ``topic_part`` and whose properties are plain (each pair name\x01value\x02, no name empty or twice, no
 *       \x01 in a value, at most PLAIN_PAIRS_MAX pairs) UTF-8: the reference decodes those.
 *   committed_half(topic_part, drop, topic_name, queue_name, record, prepared_offset) -> MessageInner | None
 *       The message a commit of that half delivers (messages._committed_plain_py): in the topic of property
 *       ``topic_name`` ("" when absent) and the queue of ``queue_name`` (0 when absent), the half's properties
 *       without the pairs named in ``drop`` (a tuple of bytes), the COMMIT transaction type, an IPv4-mapped IPv6
 *       born host as IPv4 (as pack_host packs it), ``prepared_offset``, the tag code of its TAGS (as the append
 *       computes it). None where half_fields says None, and for a
 *       queue that is not 1 to 9 ASCII digits (Python's int() reads the rest).
 *   commit_records(records, limit, first, first_phy, group, topic_part, group_name, prepared_name, drop,
 *                  topic_name, queue_name, commit, overhead) -> (origins, phys, msgs | None, costs, sizes) | None
 *       The stored records of a range of the half queue (from queue offset ``first``, the first at commit-log
 *       offset ``first_phy`` unless that is negative) — a list of records, or a region of the log holding them back
 *       to back (at most ``limit``, as many as lie wholly in it; each at ``first_phy`` + its position) — read as half_fields reads each: every one a
 *       plain half of ``group`` at its queue offset, else None (also when none is read). Per half its origin (TRAN_PREPARED_QUEUE_OFFSET, or its own
 *       offset), its commit-log offset, and with ``commit`` the message committed_half delivers and its size
 *       estimate (64 + body + topic + ``overhead`` + properties, as the broker's batched END counts it; 64 for a
 *       rollback), and its record's size.
 *       None also where committed_half or the origin would need Python.
 *   to_halves(msgs, half_topic, zero, tran_name, group_name, immunity_name, refused, topic_name, queue_name, mask)
 *           -> list[tuple[str, str | None]] | None
 *       A half batch's messages (decode_plain's: encoded properties) turned into their halves in place, as
 *       broker/transaction/messages.to_half's byte path turns each: topic ``half_topic``, queue ``zero``, sys flag
 *       without ``mask``, the properties + ``topic_name``\x01<topic>\x02``queue_name``\x01<queue id>\x02 (still a
 *       RawProperties; tag code and encoding left unset); per message its ``group_name`` value and its
 *       ``immunity_name`` value (None when absent). None, nothing changed, unless every message's properties are
 *       pairs name\x01value\x02 (one 0x01 each, no name empty), with ``tran_name`` once and "true", ``group_name``
 *       once and not empty, ``immunity_name`` at most once, and no other name starting with one of ``refused``.
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

#include "_cslots.h"
#include "_ctext.h"

/* Copies of cometmq.protocol.record_layout (tests/store/test_batch_codec.py checks them through layout()). */
#define MAGIC_CODE 0xDAA320A7u
#define BORN_HOST_POS 48
#define IPV4_HOST_SIZE 8
#define IPV6_HOST_SIZE 20
#define BORNHOST_V6_FLAG 0x10
#define STOREHOST_V6_FLAG 0x20
#define HOST_V6_FLAGS (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
/* the transaction bit of exactly the halves that take no queue offset (prepared 0x4, rolled back 0xC) */
#define HALVES_BIT 0x4
#define MAX_TOPIC_LENGTH 127
#define MAX_PROPERTIES_LENGTH 32767
/* a batch item: TOTALSIZE MAGICCODE BODYCRC FLAG BODYLEN (20) + BODY + PROPLEN (2) + PROPS */
#define ITEM_HEAD 20
#define ITEM_OVERHEAD 22
#define CQ_UNIT_SIZE 20
/* After the born host: STORETIMESTAMP (8), the store host, RECONSUMETIMES (4), PREPAREDTRANSACTIONOFFSET (8),
 * BODYLEN (4), then the body; a record holds a topic length (1) and a properties length (2) more. */
#define BODY_POS(born, store) (BORN_HOST_POS + (born) + 8 + (store) + 16)

/* -- slots ---------------------------------------------------------------------------------------------------- */

static slots_t MSG, RAW, REQ;

/* MessageInner's fields, in ``message_fields`` order (batch_codec passes dataclass order). */
enum { M_TOPIC, M_BODY, M_QUEUE_ID, M_PROPERTIES, M_PROPERTIES_RAW, M_FLAG, M_SYS_FLAG, M_BORN_TIMESTAMP,
       M_BORN_HOST, M_RECONSUME_TIMES, M_PREPARED_OFFSET, M_TAGS_CODE, M_ENCODED, M_COUNT };
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

/* -- bytes ---------------------------------------------------------------------------------------------------- */

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
    Py_ssize_t count = 0;
    int marked = 0;
    while (pos < end) {
        if (end - pos < ITEM_OVERHEAD) Py_RETURN_NONE;
        int64_t total = get_be32(b + pos), body_len = get_be32(b + pos + 16);
        if (total < ITEM_OVERHEAD || total > end - pos) Py_RETURN_NONE;
        int64_t item_end = pos + total, body_end = pos + ITEM_HEAD + body_len;
        if (body_len < 0 || body_end + 2 > item_end) Py_RETURN_NONE;
        int64_t props_len = (int16_t)((b[body_end] << 8) | b[body_end + 1]);
        if (props_len < 0 || body_end + 2 + props_len != item_end) Py_RETURN_NONE;
        int ok = utf8_valid(b + body_end + 2, (Py_ssize_t)props_len);
        if (ok < 0) return NULL;
        if (!ok) Py_RETURN_NONE;
        for (Py_ssize_t k = 0; k < n_markers && !marked; k++) {
            PyObject *mk = PyTuple_GET_ITEM(markers, k);
            marked = contains(b + body_end + 2, (Py_ssize_t)props_len, PyBytes_AS_STRING(mk), PyBytes_GET_SIZE(mk));
        }
        pos = (Py_ssize_t)item_end;
        count++;
    }
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
            props = make_slots(&RAW, rvals);
        }
        if (props != NULL) {
            PyObject *zero = PyLong_FromLong(0);
            if (zero != NULL) {
                PyObject *vals[M_COUNT] = {topic, ibody, queue_id, props, raw, flag, sys_flag, born_ts, born_host,
                                           reconsume, zero, Py_None, Py_None};
                m = make_slots(&MSG, vals);
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
    PyObject *m, *topic, *body, *props, *raw;
    const char *topic_p;
    Py_ssize_t topic_len, body_len, raw_len, born_len, size;
    long long queue_id, flag, sys_flag, born_ts, reconsume, prepared, tags_code;
    int has_tags_code;
} item_t;

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
    if (tags == Py_None) {
        /* the tag code comes from the TAGS property: here only from a RawProperties's bytes */
        if (Py_TYPE(props) != RAW.type) return 0;
        PyObject *praw = SLOT(props, RAW, R_RAW);
        if (praw == NULL || !PyBytes_CheckExact(praw)) return 0;
        const char *tv;
        Py_ssize_t tlen = 0;
        it->tags_code = 0;
        if (raw_get(PyBytes_AS_STRING(praw), PyBytes_GET_SIZE(praw), "TAGS", 4, &tv, &tlen) && tlen > 0) {
            /* RawProperties holds UTF-8 (check_utf8); a value that is not would make the reference raise */
            if (!all_ascii((const unsigned char *)tv, tlen)) {
                int ok = utf8_valid((const unsigned char *)tv, tlen);
                if (ok <= 0) {
                    PyErr_Clear();
                    return 0;
                }
            }
            it->tags_code = java_hash_utf8((const unsigned char *)tv, tlen);
        }
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
    it->size = BODY_POS(it->born_len, store_len) + it->body_len + 1 + it->topic_len + 2 + it->raw_len;
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

/* A new reference to an int of value ``v``: the one ``*slot`` holds when equal, else a new one kept there. */
static PyObject *shared_int(PyObject **slot, long long v) {
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
static PyObject *shared_bytes(PyObject **slot, const char *p, Py_ssize_t n) {
    if (*slot != NULL && PyBytes_GET_SIZE(*slot) == n && memcmp(PyBytes_AS_STRING(*slot), p, (size_t)n) == 0)
        return Py_NewRef(*slot);
    PyObject *o = PyBytes_FromStringAndSize(p, n);
    if (o != NULL) Py_XSETREF(*slot, Py_NewRef(o));
    return o;
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

static PyObject *pack(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *msgs, *now_obj, *table;
    Py_buffer buf;
    Py_ssize_t pos;
    long long phy, now;
    const char *store_host;
    Py_ssize_t store_len;
    if (!PyArg_ParseTuple(args, "O!w*nLOy#O!", &PyList_Type, &msgs, &buf, &pos, &phy, &now_obj, &store_host,
                          &store_len, &PyDict_Type, &table))
        return NULL;
    PyObject *out = NULL, *key = NULL, *last_size = NULL, *last_tags = NULL;
    long long next_qoff = 0, key_qid = 0;
    if (!bound()) goto done;
    if (store_len != IPV4_HOST_SIZE && store_len != IPV6_HOST_SIZE) {
        PyErr_SetString(PyExc_ValueError, "a store host is 8 or 20 bytes");
        goto done;
    }
    now = PyLong_AsLongLong(now_obj);
    if (now == -1 && PyErr_Occurred()) goto done;
    int store_flags = store_len == IPV6_HOST_SIZE ? STOREHOST_V6_FLAG : 0;
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    out = PyList_New(n);
    if (out == NULL) goto done;
    unsigned char *base = (unsigned char *)buf.buf;
    item_t it;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        if (!read_item(m, INT64_MAX, store_flags, &it) || pos < 0 || it.size > buf.len - pos) {
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
            Py_SETREF(SLOT(m, MSG, M_SYS_FLAG), Py_NewRef(sys_obj));
        }
        long long qoff = 0;
        if (!(sys & HALVES_BIT)) {
            /* Runs of one (topic, queue) (a batch is one) read and write the table once. */
            if (key == NULL || it.queue_id != key_qid
                || (PyTuple_GET_ITEM(key, 0) != it.topic
                    && PyUnicode_Compare(PyTuple_GET_ITEM(key, 0), it.topic) != 0)) {
                if (key != NULL && table_put(table, key, next_qoff) < 0) {
                    Py_DECREF(sys_obj);
                    goto fail;
                }
                Py_XSETREF(key, PyTuple_Pack(2, it.topic, SLOT(m, MSG, M_QUEUE_ID)));
                key_qid = it.queue_id;
                if (key == NULL || (next_qoff = table_get(table, key)) < 0) {
                    Py_DECREF(sys_obj);
                    goto fail;
                }
            }
            qoff = next_qoff++;
        }
        unsigned char *r = base + pos;
        const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(it.body);
        uint32_t crc = (uint32_t)crc32(0L, body, (uInt)it.body_len) & 0x7FFFFFFFu;
        put_be32(r, (uint32_t)it.size);
        put_be32(r + 4, MAGIC_CODE);
        put_be32(r + 8, crc);
        put_be32(r + 12, (uint32_t)it.queue_id);
        put_be32(r + 16, (uint32_t)it.flag);
        put_be64(r + 20, (uint64_t)qoff);
        put_be64(r + 28, (uint64_t)phy);
        put_be32(r + 36, (uint32_t)sys);
        put_be64(r + 40, (uint64_t)it.born_ts);
        unsigned char *p = r + BORN_HOST_POS;
        memcpy(p, PyBytes_AS_STRING(SLOT(m, MSG, M_BORN_HOST)), it.born_len);
        p += it.born_len;
        put_be64(p, (uint64_t)now);
        memcpy(p + 8, store_host, store_len);
        p += 8 + store_len;
        put_be32(p, (uint32_t)it.reconsume);
        put_be64(p + 4, (uint64_t)it.prepared);
        put_be32(p + 12, (uint32_t)it.body_len);
        p += 16;
        memcpy(p, body, it.body_len);
        p += it.body_len;
        *p++ = (unsigned char)it.topic_len;
        memcpy(p, it.topic_p, it.topic_len);
        p += it.topic_len;
        put_be16(p, (uint32_t)it.raw_len);
        memcpy(p + 2, PyBytes_AS_STRING(it.raw), it.raw_len);

        /* (a batch's records mostly share their size and tag code: one int each, as commit_records shares them) */
        PyObject *phy_o = PyLong_FromLongLong(phy), *size_o = shared_int(&last_size, it.size),
                 *tags_o = it.has_tags_code ? Py_NewRef(SLOT(m, MSG, M_TAGS_CODE))
                                            : shared_int(&last_tags, it.tags_code),
                 *qoff_o = PyLong_FromLongLong(qoff), *req = NULL;
        if (phy_o != NULL && size_o != NULL && tags_o != NULL && qoff_o != NULL) {
            PyObject *vals[D_COUNT] = {it.topic, SLOT(m, MSG, M_QUEUE_ID), phy_o, size_o, tags_o, now_obj, qoff_o,
                                       sys_obj, it.props};
            req = make_slots(&REQ, vals);
        }
        Py_DECREF(sys_obj);
        Py_XDECREF(phy_o);
        Py_XDECREF(size_o);
        Py_XDECREF(tags_o);
        Py_XDECREF(qoff_o);
        if (req == NULL) goto fail;
        PyList_SET_ITEM(out, i, req);
        pos += it.size;
        phy += it.size;
    }
    if (key != NULL && table_put(table, key, next_qoff) < 0) goto fail;
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(key);
    Py_XDECREF(last_size);
    Py_XDECREF(last_tags);
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

/* -- transaction halves --------------------------------------------------------------------------------------- */

/* the transaction bits of a sys flag, and the committed type (store/message.py, protocol/message.py) */
#define TRANSACTION_MASK 0xC
#define TRANSACTION_COMMIT_TYPE 0x8
/* more pairs than this: half_fields says None (names are checked for repeats pair by pair) */
#define PLAIN_PAIRS_MAX 64

typedef struct {
    const unsigned char *b;
    int32_t flag, sys_flag, reconsume;
    int64_t queue_offset, phy, born_ts;
    Py_ssize_t born_len, body_at, body_len, raw_at, raw_len, pairs;
    /* each pair's start (its name's), name length and end (its 0x02), from raw_at: found once by read_half, so a
     * property is looked up among the pairs' names, not searched for in the bytes again */
    Py_ssize_t names[PLAIN_PAIRS_MAX], name_lens[PLAIN_PAIRS_MAX], stops[PLAIN_PAIRS_MAX];
} half_t;

/* ``b`` (``n`` bytes) read as _plain_half_py reads it; 1 when it is a plain record of ``topic_part``, 0 when not,
 * -1 with an error set. */
static int read_half(const unsigned char *b, Py_ssize_t n, PyObject *topic_part, half_t *h) {
    if (n < BODY_POS(IPV4_HOST_SIZE, IPV4_HOST_SIZE) + 3) return 0;
    int hosts = b[39];
    Py_ssize_t born_len = (hosts & BORNHOST_V6_FLAG) ? IPV6_HOST_SIZE : IPV4_HOST_SIZE,
               store_len = (hosts & STOREHOST_V6_FLAG) ? IPV6_HOST_SIZE : IPV4_HOST_SIZE,
               body_at = BODY_POS(born_len, store_len);
    if (n < body_at + 3) return 0;
    if ((Py_ssize_t)get_be32(b) != n || (uint32_t)get_be32(b + 4) != MAGIC_CODE) return 0;
    int64_t body_len = get_be32(b + body_at - 4);
    if (body_len < 0 || body_at + body_len + 3 > n) return 0;
    Py_ssize_t p = body_at + (Py_ssize_t)body_len;
    const char *tp = PyBytes_AS_STRING(topic_part);
    Py_ssize_t tlen = PyBytes_GET_SIZE(topic_part);
    if (p + tlen + 2 > n || memcmp(b + p, tp, (size_t)tlen) != 0) return 0;
    p += tlen;
    int64_t raw_len = (int16_t)((b[p] << 8) | b[p + 1]);
    if (raw_len < 0 || p + 2 + raw_len != n) return 0;
    const unsigned char *raw = b + p + 2;
    int ok = utf8_valid(raw, (Py_ssize_t)raw_len);
    if (ok <= 0) return ok;
    /* plain: name\x01value\x02 pairs to the end, names neither empty nor repeated, values without \x01 */
    Py_ssize_t *names = h->names, *name_lens = h->name_lens, pairs = 0, i = 0;
    while (i < raw_len) {
        const unsigned char *sep = memchr(raw + i, 1, (size_t)(raw_len - i)), *end;
        const unsigned char *stop = memchr(raw + i, 2, (size_t)(raw_len - i));
        if (sep == NULL || stop == NULL || sep > stop || sep == raw + i || pairs == PLAIN_PAIRS_MAX) return 0;
        end = memchr(sep + 1, 1, (size_t)(stop - sep - 1));
        if (end != NULL) return 0;
        Py_ssize_t nlen = sep - (raw + i);
        for (Py_ssize_t k = 0; k < pairs; k++)
            if (name_lens[k] == nlen && memcmp(raw + names[k], raw + i, (size_t)nlen) == 0) return 0;
        names[pairs] = i;
        name_lens[pairs] = nlen;
        h->stops[pairs] = stop - raw;
        pairs++;
        i = stop - raw + 1;
    }
    h->b = b;
    h->flag = get_be32(b + 16);
    h->queue_offset = get_be64(b + 20);
    h->phy = get_be64(b + 28);
    h->sys_flag = get_be32(b + 36);
    h->born_ts = get_be64(b + 40);
    h->born_len = born_len;
    h->reconsume = get_be32(b + body_at - 16);
    h->body_at = body_at;
    h->body_len = (Py_ssize_t)body_len;
    h->raw_at = p + 2;
    h->raw_len = (Py_ssize_t)raw_len;
    h->pairs = pairs;
    return 1;
}

/* The value of the pair named ``name`` in a plain half's properties: 1 and where it is, or 0 when absent. What
 * raw_get finds (a plain half's names are each once, a match of raw_get starts a pair), from the pairs' table. */
static int half_get_n(const half_t *h, const char *n, Py_ssize_t nlen, Py_ssize_t *at, Py_ssize_t *len) {
    const char *raw = (const char *)h->b + h->raw_at;
    for (Py_ssize_t k = 0; k < h->pairs; k++) {
        if (h->name_lens[k] == nlen && memcmp(raw + h->names[k], n, (size_t)nlen) == 0) {
            *at = h->names[k] + nlen + 1;
            *len = h->stops[k] - *at;
            return 1;
        }
    }
    return 0;
}

static int half_get(const half_t *h, PyObject *name, Py_ssize_t *at, Py_ssize_t *len) {
    return half_get_n(h, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), at, len);
}

static PyObject *half_str(const half_t *h, PyObject *name, PyObject *absent) {
    Py_ssize_t at, len;
    if (!half_get(h, name, &at, &len)) return Py_NewRef(absent);
    return PyUnicode_DecodeUTF8((const char *)h->b + h->raw_at + at, len, "strict");
}

static PyObject *half_fields(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    PyObject *topic_part, *group_name, *prepared_name;
    if (!PyArg_ParseTuple(args, "SSSy*", &topic_part, &group_name, &prepared_name, &buf)) return NULL;
    PyObject *out = NULL;
    half_t h;
    int ok = read_half((const unsigned char *)buf.buf, buf.len, topic_part, &h);
    if (ok <= 0) {
        if (ok == 0) out = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *empty = PyUnicode_New(0, 127);
    PyObject *group = empty == NULL ? NULL : half_str(&h, group_name, empty);
    PyObject *prepared = group == NULL ? NULL : half_str(&h, prepared_name, Py_None);
    if (prepared != NULL) out = Py_BuildValue("(LLOO)", (long long)h.queue_offset, (long long)h.phy, group, prepared);
    Py_XDECREF(empty);
    Py_XDECREF(group);
    Py_XDECREF(prepared);
done:
    PyBuffer_Release(&buf);
    return out;
}

/* Values the halves of one range mostly share (one topic, born host and time, record size), kept by
 * commit_records from one half to the next so that equal values are one object, not one each (immutable objects:
 * the messages are the same). All NULL at first; commit_records releases them. */
typedef struct {
    PyObject *topic, *born, *born_ts, *cost, *size, *tags;
} shared_t;

static void shared_clear(shared_t *c) {
    Py_CLEAR(c->tags);
    Py_CLEAR(c->topic);
    Py_CLEAR(c->born);
    Py_CLEAR(c->born_ts);
    Py_CLEAR(c->cost);
    Py_CLEAR(c->size);
}

/* The message a commit of the plain half ``h`` delivers (committed_half's); Py_None when Python must build it (an
 * unusual queue id), NULL with an error set. ``drop`` holds bytes (checked by the caller). ``shared``: NULL, or
 * values kept from the half before (shared_t). */
static PyObject *make_committed(const half_t *hp, PyObject *drop, PyObject *topic_name, PyObject *queue_name,
                                PyObject *prepared_obj, shared_t *shared) {
    PyObject *out = NULL, *topic = NULL, *body = NULL, *raw = NULL, *props = NULL, *born = NULL, *queue_id = NULL,
             *flag = NULL, *sys_flag = NULL, *born_ts = NULL, *reconsume = NULL, *tags = NULL;
    Py_ssize_t n_drop = PyTuple_GET_SIZE(drop);
    const unsigned char *rp = hp->b + hp->raw_at;
    long long qid = 0;
    Py_ssize_t at, len;
    if (half_get(hp, queue_name, &at, &len)) {
        if (len < 1 || len > 9) return Py_NewRef(Py_None);
        for (Py_ssize_t k = 0; k < len; k++) {
            unsigned char c = rp[at + k];
            if (c < '0' || c > '9') return Py_NewRef(Py_None);
            qid = qid * 10 + (c - '0');
        }
    }
    /* the properties kept: every pair whose name is not in ``drop``, in order (measured, then copied) */
    Py_ssize_t kept = 0;
    for (int copy = 0; copy < 2; copy++) {
        char *w = NULL;
        if (copy) {
            raw = PyBytes_FromStringAndSize(NULL, kept);
            if (raw == NULL) goto done;
            w = PyBytes_AS_STRING(raw);
            kept = 0;
        }
        for (Py_ssize_t k = 0; k < hp->pairs; k++) {
            Py_ssize_t i = hp->names[k], nlen = hp->name_lens[k], plen = hp->stops[k] - i + 1;
            int dropped = 0;
            for (Py_ssize_t j = 0; j < n_drop && !dropped; j++) {
                PyObject *d = PyTuple_GET_ITEM(drop, j);
                dropped = PyBytes_GET_SIZE(d) == nlen && memcmp(PyBytes_AS_STRING(d), rp + i, (size_t)nlen) == 0;
            }
            if (!dropped) {
                if (copy) memcpy(w + kept, rp + i, (size_t)plen);
                kept += plen;
            }
        }
    }
    if (shared != NULL && shared->topic != NULL) {  /* the topic of the half before, when its name is the same */
        Py_ssize_t t_at, t_len;
        if (!half_get(hp, topic_name, &t_at, &t_len)) t_len = 0, t_at = 0;
        Py_ssize_t u_len;
        const char *u = PyUnicode_AsUTF8AndSize(shared->topic, &u_len);
        if (u == NULL) goto done;
        if (u_len == t_len && memcmp(u, hp->b + hp->raw_at + t_at, (size_t)t_len) == 0) topic = Py_NewRef(shared->topic);
    }
    if (topic == NULL) {
        PyObject *empty = PyUnicode_New(0, 127);
        if (empty == NULL) goto done;
        topic = half_str(hp, topic_name, empty);
        Py_DECREF(empty);
        if (topic != NULL && shared != NULL) Py_XSETREF(shared->topic, Py_NewRef(topic));
    }
    static const unsigned char v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    const unsigned char *bh = hp->b + BORN_HOST_POS;
    const char *born_p = (const char *)bh;
    Py_ssize_t born_n = hp->born_len;
    if (hp->born_len == IPV6_HOST_SIZE && memcmp(bh, v4_mapped, 12) == 0) {
        born_p += 12;
        born_n = IPV4_HOST_SIZE;
    }
    born = shared != NULL ? shared_bytes(&shared->born, born_p, born_n) : PyBytes_FromStringAndSize(born_p, born_n);
    body = PyBytes_FromStringAndSize((const char *)hp->b + hp->body_at, hp->body_len);
    queue_id = PyLong_FromLongLong(qid);
    flag = PyLong_FromLong(hp->flag);
    sys_flag = PyLong_FromLong((hp->sys_flag & ~TRANSACTION_MASK) | TRANSACTION_COMMIT_TYPE);
    born_ts = shared != NULL ? shared_int(&shared->born_ts, hp->born_ts) : PyLong_FromLongLong(hp->born_ts);
    reconsume = PyLong_FromLong(hp->reconsume);
    /* the tag code the store's append would compute from TAGS (read_item's): set here, so it reads no TAGS */
    long long tcode = 0;
    if (half_get_n(hp, "TAGS", 4, &at, &len) && len > 0)
        tcode = java_hash_utf8(hp->b + hp->raw_at + at, len);  /* (UTF-8: read_half checked the properties) */
    tags = shared != NULL ? shared_int(&shared->tags, tcode) : PyLong_FromLongLong(tcode);
    if (topic == NULL || born == NULL || body == NULL || queue_id == NULL || flag == NULL || sys_flag == NULL
        || born_ts == NULL || reconsume == NULL || tags == NULL)
        goto done;
    PyObject *rvals[R_COUNT] = {Py_None, raw};
    props = make_slots(&RAW, rvals);
    if (props == NULL) goto done;
    PyObject *vals[M_COUNT] = {topic, body, queue_id, props, raw, flag, sys_flag, born_ts, born, reconsume,
                               prepared_obj, tags, Py_None};
    out = make_slots(&MSG, vals);
done:
    Py_XDECREF(topic);
    Py_XDECREF(body);
    Py_XDECREF(raw);
    Py_XDECREF(props);
    Py_XDECREF(born);
    Py_XDECREF(queue_id);
    Py_XDECREF(flag);
    Py_XDECREF(sys_flag);
    Py_XDECREF(born_ts);
    Py_XDECREF(reconsume);
    Py_XDECREF(tags);
    return out;
}

static int bytes_tuple(PyObject *t, const char *what) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); k++) {
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(t, k))) {
            PyErr_Format(PyExc_TypeError, "%s: drop holds bytes", what);
            return 0;
        }
    }
    return 1;
}

static PyObject *committed_half(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    PyObject *topic_part, *drop, *topic_name, *queue_name, *prepared_obj;
    if (!PyArg_ParseTuple(args, "SO!SSy*O!", &topic_part, &PyTuple_Type, &drop, &topic_name, &queue_name, &buf,
                          &PyLong_Type, &prepared_obj))
        return NULL;
    PyObject *out = NULL;
    if (!bound() || !bytes_tuple(drop, "committed_half")) goto done;
    half_t h;
    int ok = read_half((const unsigned char *)buf.buf, buf.len, topic_part, &h);
    if (ok <= 0) {
        if (ok == 0) out = Py_NewRef(Py_None);
        goto done;
    }
    out = make_committed(&h, drop, topic_name, queue_name, prepared_obj, NULL);
done:
    PyBuffer_Release(&buf);
    return out;
}

/* The origin a half's TRAN_PREPARED_QUEUE_OFFSET names (its own queue offset when absent); -1 when Python must
 * read it (anything but 1 to 18 ASCII digits). */
static long long half_origin(const half_t *h, PyObject *prepared_name) {
    Py_ssize_t at, len;
    if (!half_get(h, prepared_name, &at, &len)) return h->queue_offset;
    if (len < 1 || len > 18) return -1;
    long long v = 0;
    for (Py_ssize_t k = 0; k < len; k++) {
        unsigned char c = h->b[h->raw_at + at + k];
        if (c < '0' || c > '9') return -1;
        v = v * 10 + (c - '0');
    }
    return v;
}

/* One record of a range (commit_records): 1 taken (its values appended to the lists), 0 declined, -1 an error. */
static int take_half(const unsigned char *b, Py_ssize_t n, long long expect, long long first_phy, PyObject *group,
                     PyObject *topic_part, PyObject *group_name, PyObject *prepared_name, PyObject *drop,
                     PyObject *topic_name, PyObject *queue_name, int commit, long long overhead, PyObject *lists[5],
                     shared_t *shared) {
    half_t h;
    int ok = read_half(b, n, topic_part, &h);
    if (ok <= 0) return ok;
    Py_ssize_t at, len;
    const char *g = "";
    Py_ssize_t glen = 0;
    if (half_get(&h, group_name, &at, &len)) {
        g = (const char *)h.b + h.raw_at + at;
        glen = len;
    }
    if ((uint64_t)h.queue_offset != (uint64_t)expect || (first_phy >= 0 && h.phy != first_phy)
        || glen != PyBytes_GET_SIZE(group) || memcmp(g, PyBytes_AS_STRING(group), (size_t)glen) != 0)
        return 0;
    long long origin = half_origin(&h, prepared_name), cost = 64;
    if (origin < 0) return 0;
    PyObject *msg = NULL, *phy = PyLong_FromLongLong(h.phy);
    if (phy == NULL) return -1;
    if (commit) {
        msg = make_committed(&h, drop, topic_name, queue_name, phy, shared);
        if (msg == NULL || msg == Py_None) {
            Py_DECREF(phy);
            Py_XDECREF(msg);
            return msg == NULL ? -1 : 0;
        }
        cost += PyBytes_GET_SIZE(SLOT(msg, MSG, M_BODY)) + PyUnicode_GET_LENGTH(SLOT(msg, MSG, M_TOPIC)) + overhead
                + PyBytes_GET_SIZE(SLOT(msg, MSG, M_PROPERTIES_RAW));
    }
    PyObject *vals[5] = {PyLong_FromLongLong(origin), phy, msg, shared_int(&shared->cost, cost),
                         shared_int(&shared->size, n)};
    int rc = 1;
    for (int k = 0; k < 5; k++) {
        if (k == 2 && !commit) continue;
        if (rc == 1 && (vals[k] == NULL || PyList_Append(lists[k], vals[k]) < 0)) rc = -1;
        Py_XDECREF(vals[k]);
    }
    return rc;
}

static PyObject *commit_records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *records, *group, *topic_part, *group_name, *prepared_name, *drop, *topic_name, *queue_name;
    long long limit, first, first_phy, overhead;
    int commit;
    if (!PyArg_ParseTuple(args, "OLLLSSSSO!SSpL", &records, &limit, &first, &first_phy, &group, &topic_part,
                          &group_name, &prepared_name, &PyTuple_Type, &drop, &topic_name, &queue_name, &commit,
                          &overhead))
        return NULL;
    if (!bound() || !bytes_tuple(drop, "commit_records")) return NULL;
    PyObject *lists[5] = {PyList_New(0), PyList_New(0), commit ? PyList_New(0) : Py_NewRef(Py_None), PyList_New(0),
                          PyList_New(0)};
    PyObject *out = NULL;
    shared_t shared = {NULL, NULL, NULL, NULL, NULL, NULL};
    for (int k = 0; k < 5; k++)
        if (lists[k] == NULL) goto done;
    int ok = 1;
    if (PyList_CheckExact(records)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records) && ok > 0; i++) {
            Py_buffer buf;
            if (PyObject_GetBuffer(PyList_GET_ITEM(records, i), &buf, PyBUF_SIMPLE) < 0) goto done;
            ok = take_half((const unsigned char *)buf.buf, buf.len, (long long)((uint64_t)first + (uint64_t)i),
                           i == 0 ? first_phy : -1, group, topic_part, group_name, prepared_name, drop, topic_name,
                           queue_name, commit, overhead, lists, &shared);
            PyBuffer_Release(&buf);
        }
    } else {
        /* a region of the log: records back to back, up to ``limit``, as many as lie wholly inside it */
        Py_buffer buf;
        if (PyObject_GetBuffer(records, &buf, PyBUF_SIMPLE) < 0) goto done;
        const unsigned char *b = (const unsigned char *)buf.buf;
        Py_ssize_t pos = 0;
        for (long long i = 0; i < limit && ok > 0 && pos + 8 <= buf.len; i++) {
            Py_ssize_t size = (Py_ssize_t)get_be32(b + pos);
            if (size <= 0 || size > buf.len - pos) break;
            if (first_phy >= 0 && (long long)pos > LLONG_MAX - first_phy) {  /* no such position: not a half's */
                ok = 0;
                break;
            }
            /* each record where its predecessor ends: a record's own position field must say so (bytes that read
             * as a record inside another's body do not) */
            ok = take_half(b + pos, size, (long long)((uint64_t)first + (uint64_t)i),
                           first_phy < 0 ? -1 : first_phy + (long long)pos, group, topic_part, group_name,
                           prepared_name, drop, topic_name, queue_name, commit, overhead, lists, &shared);
            pos += size;
        }
        PyBuffer_Release(&buf);
    }
    if (ok < 0) goto done;
    if (ok == 0 || PyList_GET_SIZE(lists[0]) == 0) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyTuple_Pack(5, lists[0], lists[1], lists[2], lists[3], lists[4]);
done:
    shared_clear(&shared);
    for (int k = 0; k < 5; k++) Py_XDECREF(lists[k]);
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


/* -- to_halves ------------------------------------------------------------------------------------------------ */

static int name_is(const unsigned char *p, Py_ssize_t n, PyObject *name) {
    return n == PyBytes_GET_SIZE(name) && memcmp(p, PyBytes_AS_STRING(name), (size_t)n) == 0;
}

/* The group and immunity values of one half batch item's properties (offsets into ``raw``), 0 when the item is not
 * one to_halves takes. */
typedef struct {
    Py_ssize_t group_at, group_len, imm_at, imm_len;
} half_props_t;

static int half_props(const unsigned char *raw, Py_ssize_t n, PyObject *tran_name, PyObject *group_name,
                      PyObject *immunity_name, PyObject *refused, half_props_t *out) {
    if (n == 0 || raw[n - 1] != 2) return 0;
    int tran = 0, group = 0, imm = 0;
    Py_ssize_t refused_n = PyTuple_GET_SIZE(refused);
    for (Py_ssize_t pos = 0; pos < n;) {
        const unsigned char *end = memchr(raw + pos, 2, (size_t)(n - pos));
        Py_ssize_t pair_end = end - raw; /* found: raw ends with 0x02 */
        const unsigned char *sep = memchr(raw + pos, 1, (size_t)(pair_end - pos));
        if (sep == NULL || sep == raw + pos) return 0;
        Py_ssize_t name_len = sep - (raw + pos), value_at = sep - raw + 1, value_len = pair_end - value_at;
        if (memchr(raw + value_at, 1, (size_t)value_len) != NULL) return 0;
        const unsigned char *name = raw + pos;
        if (name_is(name, name_len, tran_name)) {
            if (tran++ || value_len != 4 || memcmp(raw + value_at, "true", 4) != 0) return 0;
        } else if (name_is(name, name_len, group_name)) {
            if (group++ || value_len == 0) return 0;
            out->group_at = value_at;
            out->group_len = value_len;
        } else if (name_is(name, name_len, immunity_name)) {
            if (imm++) return 0;
            out->imm_at = value_at;
            out->imm_len = value_len;
        } else {
            for (Py_ssize_t k = 0; k < refused_n; k++) {
                PyObject *pre = PyTuple_GET_ITEM(refused, k);
                Py_ssize_t m = PyBytes_GET_SIZE(pre);
                if (name_len >= m && memcmp(name, PyBytes_AS_STRING(pre), (size_t)m) == 0) return 0;
            }
        }
        pos = pair_end + 1;
    }
    if (!imm) out->imm_at = -1;
    return tran && group;
}

/* What to_halves makes of one message before it changes any: its new properties (bytes and RawProperties), sys
 * flag, and the (group, immunity) pair it returns. */
typedef struct {
    PyObject *raw, *props, *flag, *kept;
} half_new_t;

static void half_new_clear(half_new_t *v, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(v[i].raw);
        Py_XDECREF(v[i].props);
        Py_XDECREF(v[i].flag);
        Py_XDECREF(v[i].kept);
    }
    PyMem_Free(v);
}

/* 1 made, 0 not a message to_halves takes, -1 an error. */
static int half_new(PyObject *m, PyObject *tran_name, PyObject *group_name, PyObject *immunity_name,
                    PyObject *refused, PyObject *topic_name, PyObject *queue_name, long long mask, half_new_t *v) {
    if (Py_TYPE(m) != MSG.type) return 0;
    PyObject *raw = SLOT(m, MSG, M_PROPERTIES_RAW), *props = SLOT(m, MSG, M_PROPERTIES),
             *topic_obj = SLOT(m, MSG, M_TOPIC), *qid_obj = SLOT(m, MSG, M_QUEUE_ID), *sf = SLOT(m, MSG, M_SYS_FLAG);
    if (raw == NULL || props == NULL || topic_obj == NULL || qid_obj == NULL || sf == NULL) return 0;
    if (!PyBytes_CheckExact(raw) || Py_TYPE(props) != RAW.type || !PyUnicode_CheckExact(topic_obj)
        || !PyLong_CheckExact(qid_obj) || !PyLong_CheckExact(sf))
        return 0;
    const char *rp = PyBytes_AS_STRING(raw);
    Py_ssize_t rn = PyBytes_GET_SIZE(raw);
    half_props_t hp = {0, 0, -1, 0};
    if (!half_props((const unsigned char *)rp, rn, tran_name, group_name, immunity_name, refused, &hp)) return 0;
    Py_ssize_t topic_len;
    const char *topic = PyUnicode_AsUTF8AndSize(topic_obj, &topic_len);
    int overflow;
    long long qid = PyLong_AsLongLongAndOverflow(qid_obj, &overflow), sys_flag;
    if (topic == NULL || overflow || (qid == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    sys_flag = PyLong_AsLongLongAndOverflow(sf, &overflow);
    if (overflow || (sys_flag == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    PyObject *group = PyUnicode_DecodeUTF8(rp + hp.group_at, hp.group_len, "strict");
    PyObject *imm = hp.imm_at < 0 ? Py_NewRef(Py_None) : PyUnicode_DecodeUTF8(rp + hp.imm_at, hp.imm_len, "strict");
    if (group != NULL && imm != NULL) v->kept = PyTuple_Pack(2, group, imm);
    Py_XDECREF(group);
    Py_XDECREF(imm);
    if (v->kept == NULL) return -1;
    char qbuf[32];
    int qlen = PyOS_snprintf(qbuf, sizeof qbuf, "%lld", qid);
    Py_ssize_t tn = PyBytes_GET_SIZE(topic_name), qn = PyBytes_GET_SIZE(queue_name);
    v->raw = PyBytes_FromStringAndSize(NULL, rn + tn + 1 + topic_len + 1 + qn + 1 + qlen + 1);
    if (v->raw == NULL) return -1;
    char *w = PyBytes_AS_STRING(v->raw);
    memcpy(w, rp, (size_t)rn);
    w += rn;
    memcpy(w, PyBytes_AS_STRING(topic_name), (size_t)tn);
    w += tn;
    *w++ = 1;
    memcpy(w, topic, (size_t)topic_len);
    w += topic_len;
    *w++ = 2;
    memcpy(w, PyBytes_AS_STRING(queue_name), (size_t)qn);
    w += qn;
    *w++ = 1;
    memcpy(w, qbuf, (size_t)qlen);
    w += qlen;
    *w++ = 2;
    PyObject *rvals[R_COUNT] = {Py_None, v->raw};
    v->props = make_slots(&RAW, rvals);
    v->flag = PyLong_FromLongLong(sys_flag & ~mask);
    return v->props != NULL && v->flag != NULL ? 1 : -1;
}

static PyObject *to_halves(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *msgs, *half_topic, *zero, *tran_name, *group_name, *immunity_name, *refused, *topic_name, *queue_name;
    long long mask;
    if (!PyArg_ParseTuple(args, "O!UO!SSSO!SSL", &PyList_Type, &msgs, &half_topic, &PyLong_Type, &zero, &tran_name,
                          &group_name, &immunity_name, &PyTuple_Type, &refused, &topic_name, &queue_name, &mask))
        return NULL;
    if (!bound()) return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(refused); k++) {
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(refused, k))) {
            PyErr_SetString(PyExc_TypeError, "to_halves: refused holds bytes");
            return NULL;
        }
    }
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    if (n == 0) Py_RETURN_NONE;
    half_new_t *v = PyMem_Calloc((size_t)n, sizeof(half_new_t));
    if (v == NULL) return PyErr_NoMemory();
    /* Everything made first, from the messages as they are (one listed twice is made the same twice): either every
     * message becomes its half here, or none changes. */
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = half_new(PyList_GET_ITEM(msgs, i), tran_name, group_name, immunity_name, refused, topic_name,
                          queue_name, mask, &v[i]);
        if (ok <= 0) {
            half_new_clear(v, n);
            if (ok < 0) return NULL;
            Py_RETURN_NONE;
        }
    }
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        half_new_clear(v, n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        Py_SETREF(SLOT(m, MSG, M_TOPIC), Py_NewRef(half_topic));
        Py_SETREF(SLOT(m, MSG, M_QUEUE_ID), Py_NewRef(zero));
        Py_SETREF(SLOT(m, MSG, M_PROPERTIES), Py_NewRef(v[i].props));
        Py_SETREF(SLOT(m, MSG, M_PROPERTIES_RAW), Py_NewRef(v[i].raw));
        Py_SETREF(SLOT(m, MSG, M_SYS_FLAG), Py_NewRef(v[i].flag));
        Py_XSETREF(SLOT(m, MSG, M_TAGS_CODE), Py_NewRef(Py_None));
        Py_XSETREF(SLOT(m, MSG, M_ENCODED), Py_NewRef(Py_None));
        PyList_SET_ITEM(out, i, Py_NewRef(v[i].kept));
    }
    half_new_clear(v, n);
    return out;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Learn the slots of MessageInner, RawProperties and DispatchRequest."},
    {"decode_plain", decode_plain, METH_VARARGS, "A plain batch body's messages, or None when it is malformed."},
    {"measure", measure, METH_VARARGS, "The bytes an append of these messages writes, or None (Python's job)."},
    {"pack", pack, METH_VARARGS, "Write the records of measured messages; their dispatch requests."},
    {"put_units", put_units, METH_VARARGS, "Write the consume-queue units of a run of dispatch requests."},
    {"offset_ids", offset_ids, METH_VARARGS, "A send answer's msgId of these dispatch requests, or None."},
    {"half_fields", half_fields, METH_VARARGS, "What an END_TRANSACTION checks of a plain stored half, or None."},
    {"committed_half", committed_half, METH_VARARGS, "The message a commit of a plain stored half delivers, or None."},
    {"commit_records", commit_records, METH_VARARGS, "A range's stored halves read and their commits built, or None."},
    {"to_halves", to_halves, METH_VARARGS, "A half batch's messages made halves in place, or None (Python's job)."},
    {"layout", layout, METH_NOARGS, "The record-layout constants this helper keeps copies of."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batchc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__batchc(void) { return PyModule_Create(&module); }
