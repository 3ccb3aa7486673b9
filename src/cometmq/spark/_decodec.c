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
 *   malformed or truncated record, a property value or name that is not UTF-8, 2 GiB of records or more. The
 *   caller then decodes with the pure-Python path, which raises the error or handles the case.
 *
 *   layout() -> dict
 *       The record-layout constants below and the positions derived from them for each of the four host
 *       layouts: a test checks them against cometmq.protocol.record_layout, the owner of the layout.
 *
 * Semantics, as the Python path: the records are found by walking the sizes from the start of each buffer; each
 * property string is split at \x02 into pairs, each pair at its first \x01 into name and value (a pair without
 * \x01, or with an empty name, is dropped); the last pair of a wanted name gives its column (null when none); the map keeps the
 * other pairs, in order, whose names are not hidden; msgId is UNIQ_KEY, else the offset message id (store host
 * and commit-log offset, 32 upper-case hex digits, 56 with an IPv6 store host). Compressed bodies are copied as
 * stored (the caller inflates).
 *
 * Records: RocketMQ's v1 layout (cometmq/protocol/record_layout.py). Fields up to the born host are at fixed
 * positions; a host is 8 bytes (IPv4 + port) or, flagged in SYSFLAG, 20 (IPv6 + port), which moves the fields
 * after it: their positions come from the record's entry in LAYOUTS.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The record layout: copies of cometmq.protocol.record_layout's values (tests/spark/test_decode_c.py checks). */
#define MAGIC_CODE 0xDAA320A7u
#define MAGIC_CODE_POS 4
#define QUEUE_ID_POS 12
#define QUEUE_OFFSET_POS 20
#define PHYSICAL_OFFSET_POS 28
#define SYS_FLAG_POS 36
#define BORN_TIMESTAMP_POS 40
#define BORN_HOST_POS 48
#define IPV4_HOST_SIZE 8
#define IPV6_HOST_SIZE 20
#define BORNHOST_V6_FLAG 0x10
#define STOREHOST_V6_FLAG 0x20
#define HOST_FLAGS_SHIFT 4 /* (sys_flag >> HOST_FLAGS_SHIFT) & 3 indexes LAYOUTS */
#define MIN_RECORD_SIZE 91 /* the smallest record of any layout: both hosts IPv4 */
#define COMPRESSED 0x1
#if BORNHOST_V6_FLAG != (1 << HOST_FLAGS_SHIFT) || STOREHOST_V6_FLAG != (2 << HOST_FLAGS_SHIFT)
#error "the host flags must be bits 0 and 1 of the layout index"
#endif
#define MAX_HIDDEN 32

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Where the fields after the born host are, for one pair of host widths. Constants, so that the code for records
 * with IPv4 hosts (LAYOUTS[0], named as such) compiles to fixed offsets. */
typedef struct {
    int32_t store_timestamp, store_host, store_host_size, reconsume_times, body_length, body_at, min_size;
} Layout;

/* STORETIMESTAMP after the born host, STOREHOSTADDRESS, RECONSUMETIMES (4) and PREPAREDTRANSACTIONOFFSET (8), the
 * body length (4), the body; a record holds at least a topic length byte and a properties length (2) more. */
#define LAYOUT_OF(born, store)                                                                                   \
    {BORN_HOST_POS + (born), BORN_HOST_POS + (born) + 8, (store), BORN_HOST_POS + (born) + 8 + (store),          \
     BORN_HOST_POS + (born) + 8 + (store) + 4 + 8, BORN_HOST_POS + (born) + 8 + (store) + 4 + 8 + 4,             \
     BORN_HOST_POS + (born) + 8 + (store) + 4 + 8 + 4 + 1 + 2}

static const Layout LAYOUTS[4] = {LAYOUT_OF(IPV4_HOST_SIZE, IPV4_HOST_SIZE), LAYOUT_OF(IPV6_HOST_SIZE, IPV4_HOST_SIZE),
                                  LAYOUT_OF(IPV4_HOST_SIZE, IPV6_HOST_SIZE), LAYOUT_OF(IPV6_HOST_SIZE, IPV6_HOST_SIZE)};
#define V4_LAYOUT (&LAYOUTS[0])

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

/* Where the separators are in a block of up to 64 bytes of a property string: bit j of *one / *two is set when
 * byte j is \x01 / \x02, and bit j of *high when byte j is 128 or more (not ASCII). Only the first len bytes
 * (1..64) count; end is the end of the readable memory (the buffer), so whole 16-byte loads are used wherever
 * they stay inside it (the bytes past len belong to the next record and are masked off). */
#if defined(__SSE2__) && !defined(DECODEC_NO_SIMD)
#include <emmintrin.h>

/* The masks of the 16 bytes at p + c, or-ed into m1, m2, hi at bit c. */
#define CHUNK(x, c)                                                                          \
    do {                                                                                     \
        m1 |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8((x), ones)) << (c);      \
        m2 |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8((x), twos)) << (c);      \
        hi |= (uint64_t)(unsigned)_mm_movemask_epi8(x) << (c);                              \
    } while (0)
#define LOAD(c) _mm_loadu_si128((const __m128i *)(p + (c)))

static inline void block_masks(const unsigned char *p, Py_ssize_t len, const unsigned char *end, uint64_t *one,
                               uint64_t *two, uint64_t *high) {
    const __m128i ones = _mm_set1_epi8(1), twos = _mm_set1_epi8(2);
    uint64_t m1 = 0, m2 = 0, hi = 0;
    Py_ssize_t chunks = (len + 15) >> 4;
    if (end - p >= 16 * chunks) { /* the usual case: whole loads, as many as the block needs, no loop */
        switch (chunks) {
        case 4: CHUNK(LOAD(48), 48); /* fall through */
        case 3: CHUNK(LOAD(32), 32); /* fall through */
        case 2: CHUNK(LOAD(16), 16); /* fall through */
        default: CHUNK(LOAD(0), 0);
        }
    } else { /* the last bytes of the buffer: the last chunk is copied, so that nothing past the buffer is read */
        for (Py_ssize_t c = 0; c < len; c += 16) {
            if (end - (p + c) >= 16) {
                CHUNK(LOAD(c), c);
            } else {
                unsigned char tmp[16] = {0};
                memcpy(tmp, p + c, (size_t)(len - c));
                CHUNK(_mm_loadu_si128((const __m128i *)tmp), c);
            }
        }
    }
    if (len < 64) { /* the bytes past the block (the next record's) do not count */
        uint64_t keep = ((uint64_t)1 << len) - 1;
        m1 &= keep;
        m2 &= keep;
        hi &= keep;
    }
    *one = m1;
    *two = m2;
    *high = hi;
}
#undef CHUNK
#undef LOAD
#elif defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && \
    !defined(DECODEC_NO_SWAR)
#define LOW7 0x7F7F7F7F7F7F7F7Full

/* The top bit of each byte of w -> bit j for byte j: the multiply moves bit 8j + 7 (shifted down to 8j) to bit
 * 56 + j; the other partial products land on distinct bits outside 56..63, so nothing carries in. */
static inline uint64_t gather(uint64_t tops) { return ((tops >> 7) * 0x0102040810204080ull) >> 56; }

/* Bytes of w equal to the byte in pat (repeated): an exact test, with no borrow from one byte into the next. */
static inline uint64_t equal_bytes(uint64_t w, uint64_t pat) {
    uint64_t x = w ^ pat;
    return gather(~(((x & LOW7) + LOW7) | x | LOW7));
}

static inline void block_masks(const unsigned char *p, Py_ssize_t len, const unsigned char *end, uint64_t *one,
                               uint64_t *two, uint64_t *high) {
    uint64_t m1 = 0, m2 = 0, hi = 0;
    for (Py_ssize_t c = 0; c < len; c += 8) {
        uint64_t w = 0;
        if (end - (p + c) >= 8) memcpy(&w, p + c, 8);
        else memcpy(&w, p + c, (size_t)(len - c));
        m1 |= equal_bytes(w, 0x0101010101010101ull) << c;
        m2 |= equal_bytes(w, 0x0202020202020202ull) << c;
        hi |= gather(w & ~LOW7) << c;
    }
    uint64_t keep = len < 64 ? ((uint64_t)1 << len) - 1 : ~(uint64_t)0;
    *one = m1 & keep;
    *two = m2 & keep;
    *high = hi & keep;
}
#else

static inline void block_masks(const unsigned char *p, Py_ssize_t len, const unsigned char *end, uint64_t *one,
                               uint64_t *two, uint64_t *high) {
    (void)end;
    uint64_t m1 = 0, m2 = 0, hi = 0;
    for (Py_ssize_t j = 0; j < len; j++) {
        m1 |= (uint64_t)(p[j] == 0x01) << j;
        m2 |= (uint64_t)(p[j] == 0x02) << j;
        hi |= (uint64_t)(p[j] >> 7) << j;
    }
    *one = m1;
    *two = m2;
    *high = hi;
}
#endif

/* The index of the lowest set bit of m (not 0). */
static inline int lowest_bit(uint64_t m) {
#if defined(__GNUC__)
    return __builtin_ctzll(m);
#else
    int j = 0;
    while (!((m >> j) & 1)) j++;
    return j;
#endif
}

/* The bytes of a name from its first 8 on: a few, compared without a call. */
static inline int same_tail(const unsigned char *p, const unsigned char *q, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] != q[i]) return 0;
    return 1;
}

/* The first 8 bytes of a name of n bytes at p (1..63) as one integer, the bytes past the name zeroed, as the
 * known names' heads are made: one load and a mask where 8 bytes can be read before end. */
static inline uint64_t name_head(const unsigned char *p, Py_ssize_t n, const unsigned char *end) {
    uint64_t h = 0;
    if (end - p >= 8) {
        memcpy(&h, p, 8);
        if (n < 8) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            h &= ~(uint64_t)0 << (64 - 8 * n);
#else
            h &= ((uint64_t)1 << (8 * n)) - 1;
#endif
        }
    } else {
        memcpy(&h, p, (size_t)(n < 8 ? n : 8));
    }
    return h;
}

/* A wanted or hidden property name (each name once): its head (name_head), the column it gives (0..2, or -1)
 * and whether the map leaves it out. Found through a small hash table on (head, length): a pair's name is
 * compared with the one or two known names of its slot, not with all of them. */
typedef struct {
    uint64_t head;
    const unsigned char *p;
    Py_ssize_t n;
    int want, hide;
    int next; /* the next known name in the same slot, or -1 */
} Known;

#define SLOT_BITS 7

static inline unsigned slot_of(uint64_t head, Py_ssize_t n) {
    return (unsigned)(((head ^ (uint64_t)n) * 0x9E3779B97F4A7C15ull) >> (64 - SLOT_BITS));
}

typedef struct {
    const unsigned char *start;  /* the record */
    int layout;                  /* where its fields after the born host are: its index in LAYOUTS */
    const unsigned char *at[3];  /* wanted[k]'s value, or NULL */
    int32_t len[3];
    int32_t body_len;
    int32_t map_count;           /* kept map pairs */
} Rec;

typedef struct {
    const unsigned char *name, *value;
    int32_t name_len, value_len;
} Pair;

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

/* memcpy for the short values most properties are (up to 32 bytes): two loads and stores of a fixed size, which
 * overlap when n is not that size, instead of a call into libc. Touches only d[0..n) and s[0..n). */
static inline void copy_short(char *d, const unsigned char *s, size_t n) {
    if (n >= 8) {
        if (n > 32) {
            memcpy(d, s, n);
        } else if (n >= 16) {
            memcpy(d, s, 16);
            memcpy(d + n - 16, s + n - 16, 16);
        } else {
            memcpy(d, s, 8);
            memcpy(d + n - 8, s + n - 8, 8);
        }
    } else if (n >= 4) {
        memcpy(d, s, 4);
        memcpy(d + n - 4, s + n - 4, 4);
    } else if (n > 0) { /* 1 to 3 bytes: the first, the middle and the last */
        d[0] = (char)s[0];
        d[n / 2] = (char)s[n / 2];
        d[n - 1] = (char)s[n - 1];
    }
}

typedef struct {
    Known known[3 + MAX_HIDDEN];
    Py_ssize_t n_known;
    int8_t slot[1 << SLOT_BITS]; /* the first known name of each slot, or -1 */
    uint64_t lengths; /* bit n set: some wanted or hidden name is n bytes long (n < 64) */
    const unsigned char *buf_end; /* the end of the buffer being scanned: loads may reach up to it */
    int want_map;
    Pair *pairs;
    Py_ssize_t n_pairs, pairs_cap;
    int64_t *compressed;
    Py_ssize_t n_compressed, compressed_cap;
    Py_ssize_t body_total, id_total, text_total[2], nulls[2], names_total, values_total;
} Scan;

/* Adds a wanted (want 0..2) or hidden (want -1) name, merged with an equal one already there: the first wanted
 * name that matches gives the column, as a scan through wanted in order would. */
static void add_known(Scan *sc, const Name *name, int want) {
    const unsigned char *p = (const unsigned char *)name->p;
    for (Py_ssize_t k = 0; k < sc->n_known; k++) {
        Known *kn = &sc->known[k];
        if (kn->n == name->n && same_tail(kn->p, p, name->n)) {
            if (want < 0) kn->hide = 1;
            else if (kn->want < 0) kn->want = want;
            return;
        }
    }
    Known *kn = &sc->known[sc->n_known];
    kn->head = 0;
    memcpy(&kn->head, p, (size_t)(name->n < 8 ? name->n : 8));
    kn->p = p;
    kn->n = name->n;
    kn->want = want;
    kn->hide = want < 0;
    unsigned s = slot_of(kn->head, kn->n);
    kn->next = sc->slot[s];
    sc->slot[s] = (int8_t)sc->n_known++;
}

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

/* One name\x01value pair (name at p, ending at the first \x01 sep, the value up to q): its column if its name is
 * wanted, appended to the map unless hidden. 0, or -1 with an exception set. UTF-8 is checked by the caller. */
static ALWAYS_INLINE int take_pair(Scan *sc, Rec *rec, const unsigned char *p, const unsigned char *sep,
                                   const unsigned char *q) {
    Py_ssize_t name_len = sep - p;
    if (name_len == 0) return 0; /* a nameless pair: dropped */
    const unsigned char *v = sep + 1;
    Py_ssize_t value_len = q - v;
    int keep = 1;
    if (name_len < 64 && (sc->lengths >> name_len) & 1) {
        uint64_t head = name_head(p, name_len, sc->buf_end);
        for (int i = sc->slot[slot_of(head, name_len)]; i >= 0; i = sc->known[i].next) {
            const Known *k = &sc->known[i];
            if (k->head == head && k->n == name_len && (name_len <= 8 || same_tail(p + 8, k->p + 8, name_len - 8))) {
                if (k->want >= 0) {
                    rec->at[k->want] = v;
                    rec->len[k->want] = (int32_t)value_len;
                }
                keep = !k->hide;
                break;
            }
        }
    }
    if (keep && sc->want_map) {
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
    return 0;
}

/* Checks one record at r (size bytes, the size field read already) and fills rec; appends its map pairs.
 * 0: fine; 1: not the common case (the caller falls back); -1: an exception is set. */
static int scan_record(Scan *sc, const unsigned char *r, Py_ssize_t size, Py_ssize_t index, Rec *rec) {
    rec->start = r;
    if (be32(r + MAGIC_CODE_POS) != MAGIC_CODE) return 1;
    int32_t sys_flag = (int32_t)be32(r + SYS_FLAG_POS);
    int k = (sys_flag >> HOST_FLAGS_SHIFT) & 3;
    const Layout *layout = k ? &LAYOUTS[k] : V4_LAYOUT;
    rec->layout = k;
    if (k && size < layout->min_size) return 1; /* too short for its IPv6 hosts */
    Py_ssize_t body_at = k ? layout->body_at : V4_LAYOUT->body_at;
    int32_t body_len = (int32_t)be32(r + (k ? layout->body_length : V4_LAYOUT->body_length));
    if (body_len < 0 || body_at + (Py_ssize_t)body_len + 3 > size) return 1;
    Py_ssize_t props_len_at = body_at + (Py_ssize_t)body_len + 1 + r[body_at + body_len];
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
    Py_ssize_t first_pair = sc->n_pairs;
    /* The split, 64 bytes at a time from the separators' bit masks: a pair starts at p and ends at the next \x02
     * (or at the end); its first \x01 (sep) ends the name, later ones are part of the value; a pair without
     * \x01 is dropped. sep carries over when a pair goes on into the next block. The non-ASCII bytes are noted
     * on the way. */
    const unsigned char *b = r + props_len_at + 2, *e = b + props_len, *p = b, *sep = NULL;
    uint64_t high = 0;
    for (; b < e; b += 64) {
        uint64_t one, two, hi;
        block_masks(b, e - b < 64 ? e - b : 64, sc->buf_end, &one, &two, &hi);
        high |= hi;
        while (two) {
            int j = lowest_bit(two);
            if (sep == NULL) {
                uint64_t before = one & (((uint64_t)1 << j) - 1); /* this block's \x01s of the pair */
                if (before) sep = b + lowest_bit(before);
            }
            if (sep != NULL && take_pair(sc, rec, p, sep, b + j) < 0) return -1;
            p = b + j + 1;
            sep = NULL;
            one &= ~(((uint64_t)2 << j) - 1); /* the \x01s up to this \x02 are done with */
            two &= two - 1;
        }
        if (sep == NULL && one) sep = b + lowest_bit(one); /* the last pair of the block goes on */
    }
    if (sep != NULL && take_pair(sc, rec, p, sep, e) < 0) return -1; /* the last pair has no \x02 */
    /* UTF-8: all ASCII (the usual case) is valid; otherwise the values that end up in a column are checked one
     * by one: the kept pairs and the wanted values (a hidden or dropped pair's bytes do not matter). */
    if (high) {
        for (Py_ssize_t j = first_pair; j < sc->n_pairs; j++) {
            const Pair *pr = &sc->pairs[j];
            if (!utf8_ok(pr->name, pr->name_len) || !utf8_ok(pr->value, pr->value_len)) return 1;
        }
        for (int k = 0; k < 3; k++)
            if (rec->at[k] != NULL && !utf8_ok(rec->at[k], rec->len[k])) return 1;
    }
    for (int k = 0; k < 3; k++) {
        if (rec->at[k] == NULL) {
            if (k == 2) sc->id_total += 2 * (layout->store_host_size + 8);
            else sc->nulls[k]++;
        } else {
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
    memset(sc.slot, 0xFF, sizeof(sc.slot));
    for (Py_ssize_t k = 0; k < 3 + n_hidden; k++) {
        const Name *name = k < 3 ? &wanted[k] : &hidden[k - 3];
        if (name->n == 0 || name->n >= 64) {
            PyErr_SetString(PyExc_ValueError, "property names must be 1 to 63 bytes");
            goto done;
        }
        sc.lengths |= (uint64_t)1 << name->n;
        add_known(&sc, name, k < 3 ? (int)k : -1);
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
        sc.buf_end = buf + end;
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
        qid[i] = (int32_t)be32(r + QUEUE_ID_POS);
        qoff[i] = (int64_t)be64(r + QUEUE_OFFSET_POS);
        born[i] = (int64_t)(be64(r + BORN_TIMESTAMP_POS) * 1000u); /* (wraps as the reference's numpy product) */
        /* The fields an IPv6 host moves, written for a constant layout in the common case (fixed offsets). */
#define MOVED_FIELDS(layout)                                                                                     \
    do {                                                                                                         \
        store[i] = (int64_t)(be64(r + (layout)->store_timestamp) * 1000u);                                     \
        rc[i] = (int32_t)be32(r + (layout)->reconsume_times);                                                  \
        memcpy(bdata + bo, r + (layout)->body_at, (size_t)rec->body_len);                                      \
        if (rec->at[2] == NULL) { /* the offset message id: store host and commit-log offset in hex */         \
            char *h = idata + io;                                                                                \
            const unsigned char *host = r + (layout)->store_host;                                              \
            for (int32_t b = 0; b < (layout)->store_host_size; b++) {                                          \
                h[2 * b] = HEX[host[b] >> 4];                                                                    \
                h[2 * b + 1] = HEX[host[b] & 15];                                                                \
            }                                                                                                    \
            h += 2 * (layout)->store_host_size;                                                                  \
            for (int b = 0; b < 8; b++) {                                                                        \
                h[2 * b] = HEX[r[PHYSICAL_OFFSET_POS + b] >> 4];                                                 \
                h[2 * b + 1] = HEX[r[PHYSICAL_OFFSET_POS + b] & 15];                                             \
            }                                                                                                    \
            io += 2 * ((layout)->store_host_size + 8);                                                           \
        }                                                                                                        \
    } while (0)
        if (rec->layout == 0) MOVED_FIELDS(V4_LAYOUT);
        else MOVED_FIELDS(&LAYOUTS[rec->layout]);
#undef MOVED_FIELDS
        bo += rec->body_len;
        boff[i + 1] = bo;
        if (rec->at[2] != NULL) {
            copy_short(idata + io, rec->at[2], (size_t)rec->len[2]);
            io += rec->len[2];
        }
        ioff[i + 1] = io;
        for (int k = 0; k < 2; k++) {
            if (rec->at[k] != NULL) {
                copy_short(tdata[k] + to[k], rec->at[k], (size_t)rec->len[k]);
                to[k] += rec->len[k];
                if (valid[k]) valid[k][i >> 3] |= (uint8_t)(1u << (i & 7));
            }
            toff[k][i + 1] = to[k];
        }
        if (want_map) {
            for (int32_t j = 0; j < rec->map_count; j++, pi++) {
                const Pair *pr = &sc.pairs[pi];
                copy_short(ndata + nmo, pr->name, (size_t)pr->name_len);
                nmo += pr->name_len;
                noff[pi + 1] = nmo;
                copy_short(vdata + vo, pr->value, (size_t)pr->value_len);
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

/* layout(): the constants and each layout's positions, for the test that checks them against the owner. */
static PyObject *layout(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *layouts = PyList_New(4);
    if (layouts == NULL) return NULL;
    for (int k = 0; k < 4; k++) {
        const Layout *l = &LAYOUTS[k];
        PyObject *d = Py_BuildValue("{sisisisisisisi}", "store_timestamp_pos", l->store_timestamp, "store_host_pos",
                                    l->store_host, "store_host_size", l->store_host_size, "reconsume_times_pos",
                                    l->reconsume_times, "body_length_pos", l->body_length, "body_pos", l->body_at,
                                    "min_record_size", l->min_size);
        if (d == NULL) {
            Py_DECREF(layouts);
            return NULL;
        }
        PyList_SET_ITEM(layouts, k, d);
    }
    return Py_BuildValue("{sksisisisisisisisisisisisisisisN}", "MAGIC_CODE", (unsigned long)MAGIC_CODE,
                         "MAGIC_CODE_POS", MAGIC_CODE_POS, "QUEUE_ID_POS", QUEUE_ID_POS, "QUEUE_OFFSET_POS",
                         QUEUE_OFFSET_POS, "PHYSICAL_OFFSET_POS", PHYSICAL_OFFSET_POS, "SYS_FLAG_POS", SYS_FLAG_POS,
                         "BORN_TIMESTAMP_POS", BORN_TIMESTAMP_POS, "BORN_HOST_POS", BORN_HOST_POS, "IPV4_HOST_SIZE",
                         IPV4_HOST_SIZE, "IPV6_HOST_SIZE", IPV6_HOST_SIZE, "BORNHOST_V6_FLAG", BORNHOST_V6_FLAG,
                         "STOREHOST_V6_FLAG", STOREHOST_V6_FLAG, "HOST_FLAGS_SHIFT", HOST_FLAGS_SHIFT,
                         "MIN_RECORD_SIZE", MIN_RECORD_SIZE, "COMPRESSED", COMPRESSED, "LAYOUTS", layouts);
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Pulled records -> the buffers of the Arrow columns (see the module source)."},
    {"layout", layout, METH_NOARGS, "The record-layout constants and positions this helper uses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decodec", "C helper of cometmq.spark.decode", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__decodec(void) { return PyModule_Create(&module); }
