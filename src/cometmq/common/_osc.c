/* Optional C helpers for two system calls a server makes, so that it does not load ctypes (and libffi) for
 * them: 0.35 MiB of an idle broker (issue [16]).
 *
 *   populate_write(buffer, start, length) -> int
 *       madvise(MADV_POPULATE_WRITE) over ``length`` bytes from ``start`` of a writable buffer (a store file's
 *       mmap): the kernel faults the pages in, writable, without touching their contents. The call runs without
 *       the GIL; the buffer export keeps the mapping alive meanwhile (the caller also holds the file's lock).
 *       Returns 0, or the errno of the failure (EINVAL: the kernel has no MADV_POPULATE_WRITE, before 5.14).
 *       ``start`` must be a multiple of the page size; the range must lie inside the buffer (ValueError).
 *
 *   malloc_trim() -> bool
 *       glibc's malloc_trim(0): the C heap's free pages back to the system. False where the C library has none.
 *
 *   malloc_thresholds(mmap_threshold, trim_threshold) -> bool
 *       glibc's mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD) (which also end their dynamic adjustment).
 *       False where the C library has no mallopt or refuses a value.
 *
 * The fallback, without a compiler, is ctypes (cometmq.store.mapped_file, cometmq.common.gc_tuning).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <unistd.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

static PyObject *populate_write(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, length;
    if (!PyArg_ParseTuple(args, "w*nn", &view, &start, &length))
        return NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (start < 0 || length < 0 || start > view.len || length > view.len - start || (page > 0 && start % page)) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "populate_write: range %zd+%zd is not a page-aligned part of %zd bytes",
                     start, length, view.len);
        return NULL;
    }
    int err = 0;
    if (length > 0) {
        char *addr = (char *)view.buf + start;
        Py_BEGIN_ALLOW_THREADS
        if (madvise(addr, (size_t)length, MADV_POPULATE_WRITE) != 0)
            err = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyLong_FromLong(err);
}

static PyObject *trim(PyObject *self, PyObject *unused) {
#ifdef __GLIBC__
    malloc_trim(0);
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *thresholds(PyObject *self, PyObject *args) {
    int mmap_threshold, trim_threshold;
    if (!PyArg_ParseTuple(args, "ii", &mmap_threshold, &trim_threshold)) return NULL;
#ifdef __GLIBC__
    if (mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 && mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1)
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"populate_write", populate_write, METH_VARARGS, "madvise(MADV_POPULATE_WRITE) without the GIL; 0 or errno"},
    {"malloc_trim", trim, METH_NOARGS, "glibc's malloc_trim(0); False without it"},
    {"malloc_thresholds", thresholds, METH_VARARGS, "glibc's mallopt of the mmap and trim thresholds; False without it"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_osc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__osc(void) { return PyModule_Create(&module); }
