/* Optional C helpers for transactions (cometmq.broker.transaction.messages): a stored half read, and its commit
 * built, without decoding the record; a half batch's messages made halves in one call.
 *
 *   bind(message_type, message_fields, raw_type, raw_fields)
 *       Learns where the slots of MessageInner and RawProperties are (store/batch_codec.py binds its helper the
 *       same way), so messages are made here without their Python __init__.
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
 *       The record-layout constants below, which a test checks against cometmq.protocol.record_layout.
 *
 * The pure-Python code stays the reference: tests compare what both produce byte for byte.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "_crecord.h" /* (tests/broker/test_transaction_commit_bytes.py checks the copies through layout()) */
#include "_cslots.h"
#include "_ctext.h"
#include "_cvalues.h"


/* -- slots ---------------------------------------------------------------------------------------------------- */

static slots_t MSG, RAW;

/* MessageInner's fields, in ``message_fields`` order (store/batch_codec.py's MESSAGE_FIELDS: dataclass order). */
enum { M_TOPIC, M_BODY, M_QUEUE_ID, M_PROPERTIES, M_PROPERTIES_RAW, M_FLAG, M_SYS_FLAG, M_BORN_TIMESTAMP,
       M_BORN_HOST, M_RECONSUME_TIMES, M_PREPARED_OFFSET, M_TAGS_CODE, M_ENCODED, M_BATCH_ITEMS, M_COUNT };
enum { R_DICT, R_RAW, R_COUNT };

static PyObject *bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *mt, *mf, *rt, *rf;
    if (!PyArg_ParseTuple(args, "OOOO", &mt, &mf, &rt, &rf)) return NULL;
    if (bind_slots(&MSG, mt, mf, M_COUNT) < 0 || bind_slots(&RAW, rt, rf, R_COUNT) < 0) return NULL;
    Py_RETURN_NONE;
}

static int bound(void) {
    if (MSG.type == NULL || RAW.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_txc.bind was not called");
        return 0;
    }
    return 1;
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
    props = make_leaf(&RAW, rvals);
    if (props == NULL) goto done;
    PyObject *one_record = PyLong_FromLong(0);  /* batch_items: one record (a small int: cannot fail) */
    PyObject *vals[M_COUNT] = {topic, body, queue_id, props, raw, flag, sys_flag, born_ts, born, reconsume,
                               prepared_obj, tags, Py_None, one_record};
    out = make_leaf(&MSG, vals);
    Py_DECREF(one_record);
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
    return Py_BuildValue("{sksisisisisisisisisi}", "MAGIC_CODE", (unsigned long)MAGIC_CODE, "BORN_HOST_POS",
                         BORN_HOST_POS, "IPV4_HOST_SIZE", IPV4_HOST_SIZE, "IPV6_HOST_SIZE", IPV6_HOST_SIZE,
                         "BORNHOST_V6_FLAG", BORNHOST_V6_FLAG, "STOREHOST_V6_FLAG", STOREHOST_V6_FLAG, "BODY_POS_V4_V4",
                         BODY_POS(IPV4_HOST_SIZE, IPV4_HOST_SIZE), "BODY_POS_V6_V4", BODY_POS(IPV6_HOST_SIZE,
                         IPV4_HOST_SIZE), "BODY_POS_V4_V6", BODY_POS(IPV4_HOST_SIZE, IPV6_HOST_SIZE), "BODY_POS_V6_V6",
                         BODY_POS(IPV6_HOST_SIZE, IPV6_HOST_SIZE));
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
    v->props = make_leaf(&RAW, rvals);
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
    {"bind", bind, METH_VARARGS, "Learn the slots of MessageInner and RawProperties."},
    {"half_fields", half_fields, METH_VARARGS, "What an END_TRANSACTION checks of a plain stored half, or None."},
    {"committed_half", committed_half, METH_VARARGS, "The message a commit of a plain stored half delivers, or None."},
    {"commit_records", commit_records, METH_VARARGS, "A range's stored halves read and their commits built, or None."},
    {"to_halves", to_halves, METH_VARARGS, "A half batch's messages made halves in place, or None (Python's job)."},
    {"layout", layout, METH_NOARGS, "The record-layout constants this helper keeps copies of."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_txc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__txc(void) { return PyModule_Create(&module); }
