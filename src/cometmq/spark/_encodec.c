/* Optional C helper of the Spark sink (cometmq.spark.encode): Arrow columns -> SEND_BATCH_MESSAGE bodies, read
 * straight from the Arrow buffers (the C data interface), with no Python object per row.
 *
 *   encode(body, tags, keys, props, rows, cuts, prefix, first, reserved, max_props[, suffix]) -> list[bytes] | None
 *       body, tags, keys, props   (schema capsule, array capsule) as pyarrow's __arrow_c_array__() gives them,
 *                                 or None for a column the batch does not have (body is required)
 *       rows       int64 row indices, native-endian (any buffer), in sending order
 *       cuts       int64 ends (exclusive, into rows) of the bodies to make, increasing, the last = len(rows)
 *       prefix     bytes: the 20 hex digits the message ids start with; rows[k] gets prefix + %012X(first + k)
 *       reserved   tuple of bytes: property names a user property may not have
 *       max_props  the longest properties string an item may have
 *       suffix     optional tuple of (name bytes, value bytes) pairs every item also gets, as dict.update() after
 *                  the user properties (an exactly-once write's ids and what makes an item a transaction's half):
 *                  a user property of one of these names keeps its place and takes the suffix's value; the other
 *                  pairs follow the user properties, in order, before TAGS and KEYS. At most 64 pairs; names
 *                  neither empty nor reserved, nothing holding a separator (else None).
 *
 *   None when anything is not the common case the Python code (the reference, encode.encode_rows_py) handles the
 *   same way: a column layout other than binary/string (32- or 64-bit offsets), list<string> for keys,
 *   map<string,string> for properties; a row index out of range; a null or empty body; a property the reference
 *   refuses (empty or reserved name, a \x01 or \x02 in a name, value, tag or key); properties longer than
 *   max_props; an item of 2 GiB or more; ids past 48 bits. The caller then runs the reference, which raises the
 *   error (naming the row) or handles the case.
 *
 * Semantics, as the reference (Message(...).batch_properties_head() + UNIQ_KEY and WAIT, then
 * cometmq.protocol.batch.encode_batch_raw, the owner of the item layout): per row, big-endian
 *     TOTALSIZE(4) MAGICCODE(4)=0 BODYCRC(4)=0 FLAG(4)=0 BODYLEN(4) BODY PROPLEN(2) PROPS
 * PROPS = the user properties as dict() keeps them (first occurrence's place, last occurrence's value; a null
 * value is written "None", as str(None)), then the suffix's pairs no user property named, then TAGS when the tag
 * is not empty, then KEYS when the keys are: a
 * string split at ' ' with the empty pieces dropped, or a list's non-empty elements, joined by ' '; then
 * UNIQ_KEY and WAIT=true. Each pair is name \x01 value \x02.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The Arrow C data interface (https://arrow.apache.org/docs/format/CDataInterface.html). */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#define ITEM_HEAD 20     /* TOTALSIZE MAGICCODE BODYCRC FLAG BODYLEN */
#define ID_DIGITS 12     /* the hex digits after the prefix */
#define PREFIX_LEN 20
#define VALUE_LIMIT ((uint64_t)1 << 48)

/* A binary or string array: the value of row i (plus base, for a struct's children) is data[o[j]:o[j+1]],
 * j = off + i. */
typedef struct {
    const uint8_t *valid; /* NULL: no nulls */
    const int32_t *o32;
    const int64_t *o64;
    const char *data;
    int64_t off, len;
} Bin;

/* A list (or map) array's offsets. */
typedef struct {
    const uint8_t *valid;
    const int32_t *o32;
    const int64_t *o64;
    int64_t off, len;
} Lst;

static const uint8_t *validity(const struct ArrowArray *a) {
    return (a->null_count != 0 && a->n_buffers > 0) ? (const uint8_t *)a->buffers[0] : NULL;
}

static int is_valid(const uint8_t *valid, int64_t j) { return valid == NULL || ((valid[j >> 3] >> (j & 7)) & 1); }

static int bin_init(Bin *b, const struct ArrowSchema *s, const struct ArrowArray *a) {
    const char *f = s->format;
    int wide;
    if (f == NULL || a == NULL || a->release == NULL)
        return -1;
    if (strcmp(f, "z") == 0 || strcmp(f, "u") == 0)
        wide = 0;
    else if (strcmp(f, "Z") == 0 || strcmp(f, "U") == 0)
        wide = 1;
    else
        return -1;
    if (a->n_buffers != 3 || a->length < 0 || a->offset < 0)
        return -1;
    b->valid = validity(a);
    b->o32 = wide ? NULL : (const int32_t *)a->buffers[1];
    b->o64 = wide ? (const int64_t *)a->buffers[1] : NULL;
    b->data = (const char *)a->buffers[2];
    b->off = a->offset;
    b->len = a->length;
    if (b->len > 0 && b->o32 == NULL && b->o64 == NULL)
        return -1;
    return 0;
}

/* 1 and the value of row i, or 0 for a null (or an index outside the array: -1). */
static int bin_get(const Bin *b, int64_t i, const char **p, int64_t *n) {
    int64_t j, s, e;
    if (i < 0 || i >= b->len)
        return -1;
    j = b->off + i;
    if (!is_valid(b->valid, j))
        return 0;
    if (b->o32) {
        s = b->o32[j];
        e = b->o32[j + 1];
    } else {
        s = b->o64[j];
        e = b->o64[j + 1];
    }
    if (e < s || (e > s && b->data == NULL))
        return -1;
    *p = e > s ? b->data + s : "";
    *n = e - s;
    return 1;
}

static int lst_init(Lst *l, const struct ArrowSchema *s, const struct ArrowArray *a, const char *want) {
    int wide;
    if (s->format == NULL || a == NULL || a->release == NULL)
        return -1;
    if (strcmp(s->format, want) == 0)
        wide = 0;
    else if (strcmp(want, "+l") == 0 && strcmp(s->format, "+L") == 0)
        wide = 1;
    else
        return -1;
    if (a->n_buffers != 2 || a->n_children != 1 || s->n_children != 1 || a->length < 0 || a->offset < 0)
        return -1;
    l->valid = validity(a);
    l->o32 = wide ? NULL : (const int32_t *)a->buffers[1];
    l->o64 = wide ? (const int64_t *)a->buffers[1] : NULL;
    l->off = a->offset;
    l->len = a->length;
    if (l->len > 0 && l->o32 == NULL && l->o64 == NULL)
        return -1;
    return 0;
}

/* 1 and the child range of row i, 0 for a null, -1 outside the array. */
static int lst_get(const Lst *l, int64_t i, int64_t *s, int64_t *e) {
    int64_t j;
    if (i < 0 || i >= l->len)
        return -1;
    j = l->off + i;
    if (!is_valid(l->valid, j))
        return 0;
    if (l->o32) {
        *s = l->o32[j];
        *e = l->o32[j + 1];
    } else {
        *s = l->o64[j];
        *e = l->o64[j + 1];
    }
    return *e >= *s ? 1 : -1;
}

/* A column handed over as (schema capsule, array capsule). */
static int column(PyObject *obj, struct ArrowSchema **s, struct ArrowArray **a) {
    PyObject *sc, *ac;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 2)
        return -1;
    sc = PyTuple_GET_ITEM(obj, 0);
    ac = PyTuple_GET_ITEM(obj, 1);
    if (!PyCapsule_IsValid(sc, "arrow_schema") || !PyCapsule_IsValid(ac, "arrow_array"))
        return -1;
    *s = (struct ArrowSchema *)PyCapsule_GetPointer(sc, "arrow_schema");
    *a = (struct ArrowArray *)PyCapsule_GetPointer(ac, "arrow_array");
    return (*s == NULL || *a == NULL) ? -1 : 0;
}

/* -- output ---------------------------------------------------------------------------------------------------- */
typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static int grow(Buf *b, size_t more) {
    size_t want = b->n + more, cap = b->cap ? b->cap : 4096;
    char *p;
    if (want <= b->cap)
        return 0;
    while (cap < want)
        cap *= 2;
    p = (char *)realloc(b->p, cap);
    if (p == NULL)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int put(Buf *b, const void *src, size_t n) {
    if (grow(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
    return 0;
}

static int has_sep(const char *p, int64_t n) {
    return n > 0 && (memchr(p, '\x01', (size_t)n) != NULL || memchr(p, '\x02', (size_t)n) != NULL);
}

static void be32(char *p, uint32_t v) {
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

/* The outcome of one row: 0 written, 1 give up (the reference decides), -1 out of memory. */
#define GIVE_UP 1

typedef struct {
    const char *p;
    Py_ssize_t n;
} Name;

typedef struct {
    Bin body, tags, keys_str, keys_elem, names, values;
    Lst keys_list, map;
    int has_tags, keys_kind, has_props; /* keys_kind: 0 none, 1 string, 2 list<string> */
    int64_t map_base;                   /* the map's struct child's offset */
    const Name *reserved;
    Py_ssize_t n_reserved;
    int64_t max_props;
    const Name *sfx_names, *sfx_values; /* the suffix's pairs */
    Py_ssize_t n_sfx;
    const char *sfx_all; /* all of them encoded, for an item no user property of theirs overrides */
    size_t sfx_all_n;
} Cols;

#define MAX_SUFFIX 64

static int reserved_name(const Cols *c, const char *p, int64_t n) {
    Py_ssize_t k;
    for (k = 0; k < c->n_reserved; k++)
        if (c->reserved[k].n == n && memcmp(c->reserved[k].p, p, (size_t)n) == 0)
            return 1;
    return 0;
}

static int same(const Bin *b, int64_t i, const char *p, int64_t n) {
    const char *q;
    int64_t m;
    return bin_get(b, i, &q, &m) == 1 && m == n && memcmp(p, q, (size_t)n) == 0;
}

static int put_pair(Buf *out, const char *name, size_t nn, const char *v, size_t vn) {
    if (grow(out, nn + vn + 2) < 0)
        return -1;
    memcpy(out->p + out->n, name, nn);
    out->n += nn;
    out->p[out->n++] = '\x01';
    if (vn)
        memcpy(out->p + out->n, v, vn);
    out->n += vn;
    out->p[out->n++] = '\x02';
    return 0;
}

/* The suffix pair named p[:n] (its index), or -1. */
static Py_ssize_t suffix_name(const Cols *c, const char *p, int64_t n) {
    Py_ssize_t k;
    for (k = 0; k < c->n_sfx; k++)
        if (c->sfx_names[k].n == n && memcmp(c->sfx_names[k].p, p, (size_t)n) == 0)
            return k;
    return -1;
}

/* The user properties; *taken gets a bit per suffix pair written in a user property's place. */
static int put_props(const Cols *c, int64_t row, Buf *out, uint64_t *taken) {
    int64_t s, e, j, k, n, vn;
    const char *p, *v;
    int r;
    Py_ssize_t x;
    if (!c->has_props)
        return 0;
    r = lst_get(&c->map, row, &s, &e);
    if (r < 0)
        return GIVE_UP;
    if (r == 0)
        return 0;
    for (j = s; j < e; j++) {
        int dup = 0;
        int64_t last = j;
        if (bin_get(&c->names, c->map_base + j, &p, &n) != 1)
            return GIVE_UP; /* a map key is never null in Arrow; anything else is not ours to judge */
        for (k = s; k < j && !dup; k++)
            dup = same(&c->names, c->map_base + k, p, n);
        if (dup)
            continue; /* dict() keeps the first place ... */
        for (k = j + 1; k < e; k++)
            if (same(&c->names, c->map_base + k, p, n))
                last = k; /* ... and the last value */
        if (n == 0 || reserved_name(c, p, n) || has_sep(p, n))
            return GIVE_UP;
        if (c->n_sfx && (x = suffix_name(c, p, n)) >= 0) { /* dict.update(): the suffix's value, here */
            *taken |= (uint64_t)1 << x;
            if (put_pair(out, p, (size_t)n, c->sfx_values[x].p, (size_t)c->sfx_values[x].n) < 0)
                return -1;
            continue;
        }
        r = bin_get(&c->values, c->map_base + last, &v, &vn);
        if (r < 0)
            return GIVE_UP;
        if (r == 0) {
            v = "None";
            vn = 4;
        } else if (has_sep(v, vn)) {
            return GIVE_UP;
        }
        if (put_pair(out, p, (size_t)n, v, (size_t)vn) < 0)
            return -1;
    }
    return 0;
}

static int put_suffix(const Cols *c, uint64_t taken, Buf *out) {
    Py_ssize_t k;
    if (taken == 0)
        return put(out, c->sfx_all, c->sfx_all_n);
    for (k = 0; k < c->n_sfx; k++)
        if (!((taken >> k) & 1) && put_pair(out, c->sfx_names[k].p, (size_t)c->sfx_names[k].n, c->sfx_values[k].p,
                                            (size_t)c->sfx_values[k].n) < 0)
            return -1;
    return 0;
}

static int put_tags(const Cols *c, int64_t row, Buf *out) {
    const char *p;
    int64_t n;
    int r;
    if (!c->has_tags)
        return 0;
    r = bin_get(&c->tags, row, &p, &n);
    if (r < 0)
        return GIVE_UP;
    if (r == 0 || n == 0)
        return 0;
    if (has_sep(p, n))
        return GIVE_UP;
    return put_pair(out, "TAGS", 4, p, (size_t)n);
}

/* Appends one key to the KEYS pair being written (opening it on the first). */
static int put_key(Buf *out, int *opened, const char *p, size_t n) {
    if (has_sep(p, (int64_t)n))
        return GIVE_UP;
    if (!*opened) {
        if (put(out, "KEYS\x01", 5) < 0)
            return -1;
        *opened = 1;
    } else if (put(out, " ", 1) < 0) {
        return -1;
    }
    return put(out, p, n);
}

static int put_keys(const Cols *c, int64_t row, Buf *out) {
    const char *p;
    int64_t n, s, e, j;
    int r, opened = 0;
    if (c->keys_kind == 1) {
        int64_t a = 0, b;
        r = bin_get(&c->keys_str, row, &p, &n);
        if (r < 0)
            return GIVE_UP;
        if (r == 0)
            return 0;
        while (a < n) { /* str.split(" ") without the empty pieces */
            if (p[a] == ' ') {
                a++;
                continue;
            }
            for (b = a; b < n && p[b] != ' '; b++)
                ;
            r = put_key(out, &opened, p + a, (size_t)(b - a));
            if (r)
                return r;
            a = b;
        }
    } else if (c->keys_kind == 2) {
        r = lst_get(&c->keys_list, row, &s, &e);
        if (r < 0)
            return GIVE_UP;
        if (r == 0)
            return 0;
        for (j = s; j < e; j++) {
            r = bin_get(&c->keys_elem, j, &p, &n);
            if (r < 0)
                return GIVE_UP;
            if (r == 0 || n == 0)
                continue;
            r = put_key(out, &opened, p, (size_t)n);
            if (r)
                return r;
        }
    }
    if (opened && put(out, "\x02", 1) < 0)
        return -1;
    return 0;
}

static const char HEX[] = "0123456789ABCDEF";

static int put_item(const Cols *c, int64_t row, const char *prefix, uint64_t id, Buf *out) {
    const char *body;
    int64_t body_n, props_n, total;
    size_t start = out->n, props_at;
    uint64_t taken = 0;
    char *q;
    int r, d;
    r = bin_get(&c->body, row, &body, &body_n);
    if (r != 1 || body_n == 0)
        return GIVE_UP;
    if (grow(out, ITEM_HEAD + (size_t)body_n + 2) < 0)
        return -1;
    out->n += ITEM_HEAD;
    memcpy(out->p + out->n, body, (size_t)body_n);
    out->n += (size_t)body_n + 2;
    props_at = out->n;
    if ((r = put_props(c, row, out, &taken)) != 0 || (c->n_sfx && (r = put_suffix(c, taken, out)) != 0) ||
        (r = put_tags(c, row, out)) != 0 || (r = put_keys(c, row, out)) != 0)
        return r;
    if (grow(out, 9 + PREFIX_LEN + ID_DIGITS + 11) < 0)
        return -1;
    q = out->p + out->n;
    memcpy(q, "UNIQ_KEY\x01", 9);
    memcpy(q + 9, prefix, PREFIX_LEN);
    for (d = 0; d < ID_DIGITS; d++)
        q[9 + PREFIX_LEN + d] = HEX[(id >> (4 * (ID_DIGITS - 1 - d))) & 0xF];
    memcpy(q + 9 + PREFIX_LEN + ID_DIGITS, "\x02WAIT\x01true\x02", 11);
    out->n += 9 + PREFIX_LEN + ID_DIGITS + 11;
    props_n = (int64_t)(out->n - props_at);
    total = ITEM_HEAD + body_n + 2 + props_n;
    if (props_n > c->max_props || props_n > 32767 || total > INT32_MAX)
        return GIVE_UP;
    q = out->p + start;
    be32(q, (uint32_t)total);
    memset(q + 4, 0, 12); /* MAGICCODE, BODYCRC, FLAG */
    be32(q + 16, (uint32_t)body_n);
    q = out->p + props_at - 2;
    q[0] = (char)(props_n >> 8);
    q[1] = (char)props_n;
    return 0;
}

static int cols_init(Cols *c, PyObject *body, PyObject *tags, PyObject *keys, PyObject *props) {
    struct ArrowSchema *s;
    struct ArrowArray *a;
    memset(c, 0, sizeof(*c));
    if (column(body, &s, &a) < 0 || bin_init(&c->body, s, a) < 0)
        return -1;
    if (tags != Py_None) {
        if (column(tags, &s, &a) < 0 || bin_init(&c->tags, s, a) < 0)
            return -1;
        c->has_tags = 1;
    }
    if (keys != Py_None) {
        if (column(keys, &s, &a) < 0)
            return -1;
        if (bin_init(&c->keys_str, s, a) == 0) {
            c->keys_kind = 1;
        } else {
            if (lst_init(&c->keys_list, s, a, "+l") < 0 || bin_init(&c->keys_elem, s->children[0], a->children[0]) < 0)
                return -1;
            c->keys_kind = 2;
        }
    }
    if (props != Py_None) {
        struct ArrowSchema *es;
        struct ArrowArray *ea;
        if (column(props, &s, &a) < 0 || lst_init(&c->map, s, a, "+m") < 0)
            return -1;
        es = s->children[0];
        ea = a->children[0];
        if (es == NULL || ea == NULL || es->format == NULL || strcmp(es->format, "+s") != 0 || es->n_children != 2 ||
            ea->n_children != 2 || ea->offset < 0 || ea->null_count != 0)
            return -1;
        if (bin_init(&c->names, es->children[0], ea->children[0]) < 0 ||
            bin_init(&c->values, es->children[1], ea->children[1]) < 0)
            return -1;
        c->map_base = ea->offset;
        c->has_props = 1;
    }
    return 0;
}

static PyObject *encode(PyObject *self, PyObject *args) {
    PyObject *body, *tags, *keys, *props, *rows_obj, *cuts_obj, *reserved, *suffix = NULL, *result = NULL;
    const char *prefix;
    Py_ssize_t prefix_n, k, n_rows, n_cuts, n_sfx = 0;
    unsigned long long first;
    long long max_props;
    Py_buffer rows = {0}, cuts = {0};
    Name *names = NULL, *sfx = NULL;
    Cols c;
    Buf out = {NULL, 0, 0}, sfx_all = {NULL, 0, 0};
    int give_up = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOy#KO!L|O!", &body, &tags, &keys, &props, &rows_obj, &cuts_obj, &prefix,
                          &prefix_n, &first, &PyTuple_Type, &reserved, &max_props, &PyTuple_Type, &suffix))
        return NULL;
    if (prefix_n != PREFIX_LEN) {
        PyErr_SetString(PyExc_ValueError, "the id prefix is 20 hex digits");
        return NULL;
    }
    if (PyObject_GetBuffer(rows_obj, &rows, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(cuts_obj, &cuts, PyBUF_SIMPLE) < 0)
        goto done;
    if (rows.len % 8 || cuts.len % 8) {
        PyErr_SetString(PyExc_ValueError, "rows and cuts are int64 buffers");
        goto done;
    }
    n_rows = rows.len / 8;
    n_cuts = cuts.len / 8;
    names = (Name *)PyMem_Calloc((size_t)PyTuple_GET_SIZE(reserved) + 1, sizeof(Name));
    if (names == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (k = 0; k < PyTuple_GET_SIZE(reserved); k++) {
        PyObject *r = PyTuple_GET_ITEM(reserved, k);
        if (!PyBytes_Check(r)) {
            PyErr_SetString(PyExc_TypeError, "reserved names are bytes");
            goto done;
        }
        names[k].p = PyBytes_AS_STRING(r);
        names[k].n = PyBytes_GET_SIZE(r);
    }
    if (suffix != NULL)
        n_sfx = PyTuple_GET_SIZE(suffix);
    if (n_sfx > MAX_SUFFIX) {
        give_up = 1;
        goto done;
    }
    sfx = (Name *)PyMem_Calloc(2 * (size_t)n_sfx + 1, sizeof(Name)); /* names, then values */
    if (sfx == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (k = 0; k < n_sfx; k++) {
        PyObject *pair = PyTuple_GET_ITEM(suffix, k), *name, *value;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "the suffix is a tuple of (name bytes, value bytes) pairs");
            goto done;
        }
        name = PyTuple_GET_ITEM(pair, 0);
        value = PyTuple_GET_ITEM(pair, 1);
        sfx[k].p = PyBytes_AS_STRING(name);
        sfx[k].n = PyBytes_GET_SIZE(name);
        sfx[n_sfx + k].p = PyBytes_AS_STRING(value);
        sfx[n_sfx + k].n = PyBytes_GET_SIZE(value);
    }
    if (cols_init(&c, body, tags, keys, props) < 0 || first + (unsigned long long)n_rows > VALUE_LIMIT) {
        give_up = 1;
        goto done;
    }
    c.reserved = names;
    c.n_reserved = PyTuple_GET_SIZE(reserved);
    c.max_props = max_props;
    c.sfx_names = sfx;
    c.sfx_values = sfx + n_sfx;
    c.n_sfx = n_sfx;
    for (k = 0; k < n_sfx; k++) {
        Py_ssize_t j;
        if (sfx[k].n == 0 || reserved_name(&c, sfx[k].p, sfx[k].n) || has_sep(sfx[k].p, sfx[k].n) ||
            has_sep(sfx[n_sfx + k].p, sfx[n_sfx + k].n)) {
            give_up = 1;
            goto done;
        }
        for (j = 0; j < k; j++)
            if (sfx[j].n == sfx[k].n && memcmp(sfx[j].p, sfx[k].p, (size_t)sfx[k].n) == 0) {
                give_up = 1; /* a name twice: not what dict.update() of a dict gives */
                goto done;
            }
        if (put_pair(&sfx_all, sfx[k].p, (size_t)sfx[k].n, sfx[n_sfx + k].p, (size_t)sfx[n_sfx + k].n) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    c.sfx_all = sfx_all.p ? sfx_all.p : "";
    c.sfx_all_n = sfx_all.n;
    result = PyList_New(n_cuts);
    if (result == NULL)
        goto done;
    {
        const int64_t *rv = (const int64_t *)rows.buf, *cv = (const int64_t *)cuts.buf;
        int64_t from = 0;
        for (k = 0; k < n_cuts; k++) {
            int64_t to = cv[k], i;
            PyObject *bytes;
            if (to <= from || to > n_rows) {
                give_up = 1;
                goto done;
            }
            out.n = 0;
            for (i = from; i < to; i++) {
                int r = put_item(&c, rv[i], prefix, (uint64_t)first + (uint64_t)i, &out);
                if (r < 0) {
                    PyErr_NoMemory();
                    goto done;
                }
                if (r) {
                    give_up = 1;
                    goto done;
                }
            }
            bytes = PyBytes_FromStringAndSize(out.p, (Py_ssize_t)out.n);
            if (bytes == NULL)
                goto done;
            PyList_SET_ITEM(result, k, bytes);
            from = to;
        }
        if (from != n_rows)
            give_up = 1;
    }
done:
    free(out.p);
    free(sfx_all.p);
    PyMem_Free(names);
    PyMem_Free(sfx);
    if (rows.obj)
        PyBuffer_Release(&rows);
    if (cuts.obj)
        PyBuffer_Release(&cuts);
    if (PyErr_Occurred()) {
        Py_XDECREF(result);
        return NULL;
    }
    if (give_up) {
        Py_XDECREF(result);
        Py_RETURN_NONE;
    }
    return result;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS, "Arrow columns -> SEND_BATCH_MESSAGE bodies (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encodec", "C helper of cometmq.spark.encode", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__encodec(void) { return PyModule_Create(&module); }
