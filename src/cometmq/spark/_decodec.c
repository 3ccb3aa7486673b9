/* Optional C helper of the Spark source (cometmq.spark.decode): pulled message records -> the buffers of the
 * Arrow columns, in one pass over the records and one copy of each value.
 *
 *   decode(bufs, want_map, wanted, hidden) -> tuple | None
 *       bufs      buffers of records, back to back in each (PULL_MESSAGE answers of one queue, v1 layout)
 *       want_map  build the ``properties`` map
 *       wanted    (b"TAGS", b"KEYS", b"UNIQ_KEY"): the properties with a column of their own
 *       hidden    the property names the map leaves out
 *
 *   The answer, for n records (all integers native-endian, offsets int32, as Arrow lays them out):
 *       (n, queueId i32[n], queueOffset i64[n], bornTimestamp i64[n] (us), storeTimestamp i64[n] (us),
 *        reconsumeTimes i32[n], (body offsets, data), (msgId offsets, data),
 *        (tags validity|None, null count, offsets, data), (keys ...),
 *        (map offsets, name offsets, name data, value offsets, value data) | None,
 *        compressed: i64 indices of the records whose body is compressed (bytes))
 *
 *   None when anything is not the common case the Python code (the reference) handles the same way: a
 *   malformed or truncated record, an IPv6 host, a property value or name that is not UTF-8, 2 GiB of records
 *   or more. The caller then decodes with the pure-Python path, which raises the error or handles the case.
 *
 * Semantics, as the Python path: the records are found by walking the sizes from the start of each buffer; each
 * property string is split at \x02 into pairs, each pair at its first \x01 into name and value (a pair without
 * \x01, or with an empty name, is dropped); the last pair of a wanted name gives its column (null when none); the map keeps the
 * other pairs, in order, whose names are not hidden; msgId is UNIQ_KEY, else the offset message id (store host
 * and commit-log offset, 32 upper-case hex digits). Compressed bodies are copied as stored (the caller inflates).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC_CODE 0xDAA320A7u
#define MIN_RECORD_SIZE 91
#define BODY_AT 88
#define V6_FLAGS (0x10 | 0x20)
#define COMPRESSED 0x1
#define MAX_HIDDEN 32
#define OFFSET_ID_LEN 32

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF), as Arrow and Python check it. */
static int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;
            if (c == 0xED && c1 >= 0xA0) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;
            if (c == 0xF4 && c1 >= 0x90) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

typedef struct {
    const char *p;
    Py_ssize_t n;
} Name;

/* The first byte in [p, e) that is \x01 or \x02 (a property separator), else e. Eight bytes at a time: a
 * word has a byte below 3 when (w - 0x03..03) & ~w & 0x80..80 is not 0, and its lowest set bit marks the
 * first such byte (a \x00 there is skipped). Byte by byte where the word trick does not apply. */
static inline const unsigned char *next_sep(const unsigned char *p, const unsigned char *e) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (e - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t t = (w - 0x0303030303030303ull) & ~w & 0x8080808080808080ull;
        if (t == 0) {
            p += 8;
            continue;
        }
        const unsigned char *stop = p + 8;
        for (p += __builtin_ctzll(t) >> 3; p < stop; p++)
            if (*p == 0x01 || *p == 0x02) return p;
    }
#endif
    for (; p < e; p++)
        if (*p == 0x01 || *p == 0x02) return p;
    return e;
}

typedef struct {
    const unsigned char *start;  /* the record */
    const unsigned char *at[3];  /* wanted[k]'s value, or NULL */
    int32_t len[3];
    int32_t body_len;
    int32_t map_count;           /* kept map pairs */
} Rec;

typedef struct {
    const unsigned char *name, *value;
    int32_t name_len, value_len;
} Pair;

static inline int same(const unsigned char *p, Py_ssize_t n, const Name *name) {
    if (n != name->n) return 0;
    const unsigned char *q = (const unsigned char *)name->p;
    for (Py_ssize_t i = 0; i < n; i++) /* names are short: no call to memcmp */
        if (p[i] != q[i]) return 0;
    return 1;
}

static PyObject *new_bytes(Py_ssize_t n, char **data) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, n);
    if (b != NULL) *data = PyBytes_AS_STRING(b);
    return b;
}

static int names_from(PyObject *seq, Name *out, Py_ssize_t max, Py_ssize_t *count) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of bytes");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > max) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many names");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyBytes_Check(item)) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_TypeError, "names must be bytes");
            return -1;
        }
        out[i].p = PyBytes_AS_STRING(item);
        out[i].n = PyBytes_GET_SIZE(item);
    }
    *count = n;
    Py_DECREF(fast); /* the names stay alive: the caller's tuples hold them */
    return 0;
}

static const char HEX[] = "0123456789ABCDEF";

/* Checks one record at r (size bytes, the size field read already) and fills rec; appends its map pairs.
 * 0: fine; 1: not the common case (the caller falls back); -1: an exception is set. */
typedef struct {
    const Name *wanted, *hidden;
    Py_ssize_t n_hidden;
    uint64_t lengths; /* bit n set: some wanted or hidden name is n bytes long (n < 64) */
    int want_map;
    Pair *pairs;
    Py_ssize_t n_pairs, pairs_cap;
    int64_t *compressed;
    Py_ssize_t n_compressed, compressed_cap;
    Py_ssize_t body_total, id_total, text_total[2], nulls[2], names_total, values_total;
} Scan;

static int grow(void **arr, Py_ssize_t *cap, Py_ssize_t item, Py_ssize_t first) {
    Py_ssize_t n = *cap ? 2 * *cap : first;
    void *grown = PyMem_Realloc(*arr, (size_t)(item * n));
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *arr = grown;
    *cap = n;
    return 0;
}

static int scan_record(Scan *sc, const unsigned char *r, Py_ssize_t size, Py_ssize_t index, Rec *rec) {
    rec->start = r;
    if (be32(r + 4) != MAGIC_CODE) return 1;
    int32_t sys_flag = (int32_t)be32(r + 36);
    if (sys_flag & V6_FLAGS) return 1;
    int32_t body_len = (int32_t)be32(r + 84);
    if (body_len < 0 || BODY_AT + (Py_ssize_t)body_len + 3 > size) return 1;
    Py_ssize_t props_len_at = BODY_AT + (Py_ssize_t)body_len + 1 + r[BODY_AT + body_len];
    if (props_len_at + 2 > size) return 1;
    Py_ssize_t props_len = ((Py_ssize_t)r[props_len_at] << 8) | r[props_len_at + 1];
    if (props_len_at + 2 + props_len > size || props_len >= (1 << 15)) return 1;
    rec->body_len = body_len;
    sc->body_total += body_len;
    if (sys_flag & COMPRESSED) {
        if (sc->n_compressed == sc->compressed_cap &&
            grow((void **)&sc->compressed, &sc->compressed_cap, sizeof(int64_t), 64) < 0)
            return -1;
        sc->compressed[sc->n_compressed++] = index;
    }
    rec->at[0] = rec->at[1] = rec->at[2] = NULL;
    rec->len[0] = rec->len[1] = rec->len[2] = 0;
    rec->map_count = 0;
    const unsigned char *p = r + props_len_at + 2, *e = p + props_len;
    while (p < e) {
        /* the pair's first \x01, and the \x02 that ends it (or the end) */
        const unsigned char *sep = NULL, *q = next_sep(p, e);
        if (q < e && *q == 0x01) {
            sep = q;
            do q = next_sep(q + 1, e);
            while (q < e && *q == 0x01);
        }
        if (sep != NULL && sep > p) {
            Py_ssize_t name_len = sep - p;
            const unsigned char *v = sep + 1;
            Py_ssize_t value_len = q - v;
            int keep = 1;
            if (name_len < 64 && (sc->lengths >> name_len) & 1) {
                for (int w = 0; w < 3; w++) {
                    if (same(p, name_len, &sc->wanted[w])) {
                        rec->at[w] = v;
                        rec->len[w] = (int32_t)value_len;
                        break;
                    }
                }
                for (Py_ssize_t h = 0; h < sc->n_hidden; h++) {
                    if (same(p, name_len, &sc->hidden[h])) {
                        keep = 0;
                        break;
                    }
                }
            }
            if (keep && sc->want_map) {
                if (!utf8_ok(p, name_len) || !utf8_ok(v, value_len)) return 1;
                if (sc->n_pairs == sc->pairs_cap && grow((void **)&sc->pairs, &sc->pairs_cap, sizeof(Pair), 1024) < 0)
                    return -1;
                Pair *pr = &sc->pairs[sc->n_pairs++];
                pr->name = p;
                pr->name_len = (int32_t)name_len;
                pr->value = v;
                pr->value_len = (int32_t)value_len;
                rec->map_count++;
                sc->names_total += name_len;
                sc->values_total += value_len;
            }
        }
        p = q + 1; /* past the \x02 (or past the end: the loop stops) */
    }
    for (int k = 0; k < 3; k++) {
        if (rec->at[k] == NULL) {
            if (k == 2) sc->id_total += OFFSET_ID_LEN;
            else sc->nulls[k]++;
        } else {
            if (!utf8_ok(rec->at[k], rec->len[k])) return 1;
            if (k == 2) sc->id_total += rec->len[k];
            else sc->text_total[k] += rec->len[k];
        }
    }
    return 0;
}

#define MAX_BUFFERS 4096

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *bufs_obj, *wanted_obj, *hidden_obj;
    int want_map;
    if (!PyArg_ParseTuple(args, "OpOO", &bufs_obj, &want_map, &wanted_obj, &hidden_obj)) return NULL;
    Name wanted[3], hidden[MAX_HIDDEN];
    Py_ssize_t n_wanted = 0, n_hidden = 0;
    Py_buffer *views = NULL;
    Py_ssize_t n_views = 0;
    Rec *recs = NULL;
    PyObject *fast = NULL, *result = NULL;
    PyObject *o[32] = {NULL};
    int no = 0;
    Scan sc;
    memset(&sc, 0, sizeof(sc));

    if (names_from(wanted_obj, wanted, 3, &n_wanted) < 0 || names_from(hidden_obj, hidden, MAX_HIDDEN, &n_hidden) < 0)
        goto done;
    if (n_wanted != 3) {
        PyErr_SetString(PyExc_ValueError, "wanted must name 3 properties");
        goto done;
    }
    sc.wanted = wanted;
    sc.hidden = hidden;
    sc.n_hidden = n_hidden;
    for (Py_ssize_t k = 0; k < 3 + n_hidden; k++) {
        Py_ssize_t len = k < 3 ? wanted[k].n : hidden[k - 3].n;
        if (len == 0 || len >= 64) {
            PyErr_SetString(PyExc_ValueError, "property names must be 1 to 63 bytes");
            goto done;
        }
        sc.lengths |= (uint64_t)1 << len;
    }
    sc.want_map = want_map;
    fast = PySequence_Fast(bufs_obj, "expected a sequence of buffers");
    if (fast == NULL) goto done;
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(fast);
    if (nb > MAX_BUFFERS) goto fallback;
    views = (Py_buffer *)PyMem_Calloc((size_t)(nb ? nb : 1), sizeof(Py_buffer));
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    for (; n_views < nb; n_views++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, n_views), &views[n_views], PyBUF_SIMPLE) < 0) goto done;
        total += views[n_views].len;
    }
    if (total >= ((Py_ssize_t)1 << 31) - 64) goto fallback;

    /* Pass 0: count the records (and check that the sizes chain to the end of each buffer). */
    Py_ssize_t n = 0;
    for (Py_ssize_t b = 0; b < nb; b++) {
        const unsigned char *buf = (const unsigned char *)views[b].buf;
        Py_ssize_t end = views[b].len;
        for (Py_ssize_t pos = 0; pos < end;) {
            if (pos > end - MIN_RECORD_SIZE) goto fallback;
            int32_t size = (int32_t)be32(buf + pos);
            if (size < MIN_RECORD_SIZE || size > end - pos) goto fallback;
            pos += size;
            n++;
        }
    }
    recs = (Rec *)PyMem_Malloc(sizeof(Rec) * (size_t)(n ? n : 1));
    if (recs == NULL) {
        PyErr_NoMemory();
        goto done;
    }

    /* Pass 1: check each record, locate its body and properties, split the properties. */
    Py_ssize_t i = 0;
    for (Py_ssize_t b = 0; b < nb; b++) {
        const unsigned char *buf = (const unsigned char *)views[b].buf;
        Py_ssize_t end = views[b].len;
        for (Py_ssize_t pos = 0; pos < end; i++) {
            Py_ssize_t size = (int32_t)be32(buf + pos);
            int rc = scan_record(&sc, buf + pos, size, i, &recs[i]);
            if (rc < 0) goto done;
            if (rc > 0) goto fallback;
            pos += size;
        }
    }

    /* Pass 2: the column buffers. */
    char *d;
    int32_t *qid, *rc, *boff, *ioff, *toff[2], *moff = NULL, *noff = NULL, *voff = NULL;
    int64_t *qoff, *born, *store;
    char *bdata, *idata, *tdata[2], *ndata = NULL, *vdata = NULL;
    uint8_t *valid[2] = {NULL, NULL};
#define NEW(size, ptr, type)                         \
    do {                                             \
        if ((o[no] = new_bytes((size), &d)) == NULL) \
            goto done;                               \
        no++;                                        \
        ptr = (type)d;                               \
    } while (0)
    NEW(4 * n, qid, int32_t *);
    NEW(8 * n, qoff, int64_t *);
    NEW(8 * n, born, int64_t *);
    NEW(8 * n, store, int64_t *);
    NEW(4 * n, rc, int32_t *);
    NEW(4 * (n + 1), boff, int32_t *);
    NEW(sc.body_total, bdata, char *);
    NEW(4 * (n + 1), ioff, int32_t *);
    NEW(sc.id_total, idata, char *);
    for (int k = 0; k < 2; k++) {
        if (sc.nulls[k]) {
            NEW((n + 7) / 8, valid[k], uint8_t *);
            memset(valid[k], 0, (size_t)((n + 7) / 8));
        } else {
            Py_INCREF(Py_None);
            o[no++] = Py_None;
        }
        NEW(4 * (n + 1), toff[k], int32_t *);
        NEW(sc.text_total[k], tdata[k], char *);
    }
    if (want_map) {
        NEW(4 * (n + 1), moff, int32_t *);
        NEW(4 * (sc.n_pairs + 1), noff, int32_t *);
        NEW(sc.names_total, ndata, char *);
        NEW(4 * (sc.n_pairs + 1), voff, int32_t *);
        NEW(sc.values_total, vdata, char *);
    }
    NEW(8 * sc.n_compressed, d, char *);
    if (sc.n_compressed) memcpy(d, sc.compressed, sizeof(int64_t) * (size_t)sc.n_compressed);
#undef NEW

    int32_t bo = 0, io = 0, to[2] = {0, 0}, mo = 0, nmo = 0, vo = 0;
    Py_ssize_t pi = 0;
    boff[0] = ioff[0] = toff[0][0] = toff[1][0] = 0;
    if (want_map) moff[0] = noff[0] = voff[0] = 0;
    for (i = 0; i < n; i++) {
        const Rec *rec = &recs[i];
        const unsigned char *r = rec->start;
        qid[i] = (int32_t)be32(r + 12);
        qoff[i] = (int64_t)be64(r + 20);
        born[i] = (int64_t)be64(r + 40) * 1000;
        store[i] = (int64_t)be64(r + 56) * 1000;
        rc[i] = (int32_t)be32(r + 72);
        memcpy(bdata + bo, r + BODY_AT, (size_t)rec->body_len);
        bo += rec->body_len;
        boff[i + 1] = bo;
        if (rec->at[2] != NULL) {
            memcpy(idata + io, rec->at[2], (size_t)rec->len[2]);
            io += rec->len[2];
        } else {
            char *h = idata + io;
            for (int b = 0; b < 8; b++) {
                h[2 * b] = HEX[r[64 + b] >> 4];
                h[2 * b + 1] = HEX[r[64 + b] & 15];
                h[16 + 2 * b] = HEX[r[28 + b] >> 4];
                h[16 + 2 * b + 1] = HEX[r[28 + b] & 15];
            }
            io += OFFSET_ID_LEN;
        }
        ioff[i + 1] = io;
        for (int k = 0; k < 2; k++) {
            if (rec->at[k] != NULL) {
                memcpy(tdata[k] + to[k], rec->at[k], (size_t)rec->len[k]);
                to[k] += rec->len[k];
                if (valid[k]) valid[k][i >> 3] |= (uint8_t)(1u << (i & 7));
            }
            toff[k][i + 1] = to[k];
        }
        if (want_map) {
            for (int32_t j = 0; j < rec->map_count; j++, pi++) {
                const Pair *pr = &sc.pairs[pi];
                memcpy(ndata + nmo, pr->name, (size_t)pr->name_len);
                nmo += pr->name_len;
                noff[pi + 1] = nmo;
                memcpy(vdata + vo, pr->value, (size_t)pr->value_len);
                vo += pr->value_len;
                voff[pi + 1] = vo;
            }
            mo += rec->map_count;
            moff[i + 1] = mo;
        }
    }

    /* o: qid qoff born store rc boff bdata ioff idata [valid0 toff0 tdata0] [valid1 toff1 tdata1] (map x5) comp */
    {
        PyObject *map = Py_None;
        int last = 15;
        if (want_map) {
            map = PyTuple_Pack(5, o[15], o[16], o[17], o[18], o[19]);
            if (map == NULL) goto done;
            last = 20;
        } else {
            Py_INCREF(map);
        }
        result = Py_BuildValue("(nOOOOO(OO)(OO)(OnOO)(OnOO)NO)", n, o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7],
                               o[8], o[9], sc.nulls[0], o[10], o[11], o[12], sc.nulls[1], o[13], o[14], map, o[last]);
    }
    goto done;

fallback:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int k = 0; k < no; k++) Py_XDECREF(o[k]);
    for (Py_ssize_t b = 0; b < n_views; b++) PyBuffer_Release(&views[b]);
    PyMem_Free(views);
    Py_XDECREF(fast);
    PyMem_Free(recs);
    PyMem_Free(sc.pairs);
    PyMem_Free(sc.compressed);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Pulled records -> the buffers of the Arrow columns (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decodec", "C helper of cometmq.spark.decode", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__decodec(void) { return PyModule_Create(&module); }
