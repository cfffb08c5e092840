/* The replication stream's hot path in C: take every CopyData message libpq already holds.
 *
 * The reference is ``_StreamCore.poll_many`` in replication.py, which calls psycopg's
 * ``get_copy_data`` and ``parse_xlog_data`` for each message: a dozen Python objects a message,
 * most of a busy receiver's transport cost. This does the same with libpq's own functions
 * (their addresses and the PGconn pointer come from psycopg's libpq, see copyread.py) and
 * builds only what the receiver keeps: an XLogData with its LSN and payload bytes.
 *
 * Anything but a well-formed XLogData (a keepalive, a truncated or oversized message, a send
 * time out of range) is returned as its bytes, for the Python path to parse or to raise on, so
 * every error is still raised by the one reference. Messages keep their order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*get_copy_data_fn)(void *conn, char **buffer, int async);
typedef void (*free_mem_fn)(void *ptr);
typedef int (*consume_input_fn)(void *conn);

/* What the last libpq call said, returned beside the messages. */
enum {
    DRAINED = 0,         /* nothing more is buffered, the socket included */
    LIMIT = 1,           /* ``limit`` messages taken; more may be buffered */
    COPY_ENDED = -1,     /* the server left COPY mode */
    COPY_FAILED = -2,    /* PQgetCopyData failed: PQerrorMessage says why */
    CONSUME_FAILED = -3, /* PQconsumeInput failed: PQerrorMessage says why */
};

#define XLOG_HEADER_SIZE 25 /* 'w', data_start, wal_end, send_time */

static inline uint64_t
big_endian_u64(const unsigned char *p)
{
    return ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) |
           ((uint64_t)p[3] << 32) | ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) |
           ((uint64_t)p[6] << 8) | (uint64_t)p[7];
}

/* XLogData(LSN(data_start), wal_end, send_time, payload), or NULL with an exception set. */
static PyObject *
make_xlog_data(PyObject *xlog_type, PyObject *lsn_type, const unsigned char *buf, int size,
               int64_t sent)
{
    PyObject *start = NULL, *start_args = NULL, *lsn = NULL, *wal_end = NULL, *send_time = NULL;
    PyObject *payload = NULL, *result = NULL;

    start = PyLong_FromUnsignedLongLong(big_endian_u64(buf + 1));
    if (start == NULL)
        goto done;
    start_args = PyTuple_Pack(1, start);
    if (start_args == NULL)
        goto done;
    /* int.__new__(LSN, value): an unsigned 64-bit field is always a valid LSN, so LSN's own
     * range check (in Python) is skipped, as parse_xlog_data skips it. */
    lsn = PyLong_Type.tp_new((PyTypeObject *)lsn_type, start_args, NULL);
    if (lsn == NULL)
        goto done;
    wal_end = PyLong_FromUnsignedLongLong(big_endian_u64(buf + 9));
    send_time = PyLong_FromLongLong(sent);
    payload = PyBytes_FromStringAndSize((const char *)buf + XLOG_HEADER_SIZE,
                                        (Py_ssize_t)size - XLOG_HEADER_SIZE);
    if (wal_end == NULL || send_time == NULL || payload == NULL)
        goto done;
    {
        PyObject *args[4] = {lsn, wal_end, send_time, payload};
        result = PyObject_Vectorcall(xlog_type, args, 4, NULL);
    }
done:
    Py_XDECREF(start);
    Py_XDECREF(start_args);
    Py_XDECREF(lsn);
    Py_XDECREF(wal_end);
    Py_XDECREF(send_time);
    Py_XDECREF(payload);
    return result;
}

PyDoc_STRVAR(read_copy_data_doc,
             "read_copy_data(conn, get_copy_data, free_mem, consume_input, limit, max_size,\n"
             "               xlog_type, lsn_type, min_send_time, max_send_time)\n"
             "-> (messages, status, raw)\n\n"
             "Up to ``limit`` CopyData messages libpq holds, reading the socket once when its\n"
             "buffer runs dry (it never blocks). ``messages`` holds XLogData objects and, for\n"
             "any other message, its bytes (``raw`` of them); ``status``: 0 drained, 1 limit\n"
             "reached, -1 copy ended, -2 PQgetCopyData failed, -3 PQconsumeInput failed.");

static PyObject *
read_copy_data(PyObject *module, PyObject *args)
{
    unsigned long long conn_address, get_address, free_address, consume_address;
    Py_ssize_t limit, max_size;
    long long min_sent, max_sent;
    PyObject *xlog_type, *lsn_type;

    if (!PyArg_ParseTuple(args, "KKKKnnOOLL", &conn_address, &get_address, &free_address,
                          &consume_address, &limit, &max_size, &xlog_type, &lsn_type,
                          &min_sent, &max_sent))
        return NULL;
    if (conn_address == 0 || get_address == 0 || free_address == 0 || consume_address == 0) {
        PyErr_SetString(PyExc_ValueError, "read_copy_data: a null connection or function");
        return NULL;
    }
    if (!PyType_Check(lsn_type) || !PyType_IsSubtype((PyTypeObject *)lsn_type, &PyLong_Type)) {
        PyErr_SetString(PyExc_TypeError, "read_copy_data: lsn_type must be an int subclass");
        return NULL;
    }
    void *conn = (void *)(uintptr_t)conn_address;
    get_copy_data_fn get_copy_data = (get_copy_data_fn)(uintptr_t)get_address;
    free_mem_fn free_mem = (free_mem_fn)(uintptr_t)free_address;
    consume_input_fn consume_input = (consume_input_fn)(uintptr_t)consume_address;

    PyObject *messages = PyList_New(0);
    if (messages == NULL)
        return NULL;
    Py_ssize_t taken = 0, raw = 0;
    int status = LIMIT, socket_read = 0;
    while (taken < limit) {
        char *buffer = NULL;
        int size = get_copy_data(conn, &buffer, 1);
        if (size == 0) {
            if (socket_read) {
                status = DRAINED;
                break;
            }
            /* Take in what the kernel already holds, as poll_many does, once a call. */
            socket_read = 1;
            if (consume_input(conn) != 1) {
                status = CONSUME_FAILED;
                break;
            }
            continue;
        }
        if (size < 0) {
            if (buffer != NULL)
                free_mem(buffer);
            status = size == -1 ? COPY_ENDED : COPY_FAILED;
            break;
        }
        const unsigned char *bytes = (const unsigned char *)buffer;
        PyObject *message = NULL;
        int is_xlog = 0;
        int64_t sent = 0;
        if (bytes[0] == 'w' && size >= XLOG_HEADER_SIZE && (Py_ssize_t)size <= max_size) {
            sent = (int64_t)big_endian_u64(bytes + 17);
            is_xlog = min_sent <= sent && sent <= max_sent;
        }
        if (is_xlog) {
            message = make_xlog_data(xlog_type, lsn_type, bytes, size, sent);
        } else {
            message = PyBytes_FromStringAndSize(buffer, size);
            raw++;
        }
        free_mem(buffer);
        if (message == NULL || PyList_Append(messages, message) < 0) {
            Py_XDECREF(message);
            Py_DECREF(messages);
            return NULL;
        }
        Py_DECREF(message);
        taken++;
    }
    PyObject *result = Py_BuildValue("(Nin)", messages, status, raw);
    return result;
}

static PyMethodDef methods[] = {
    {"read_copy_data", read_copy_data, METH_VARARGS, read_copy_data_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pgcdc.connection._copyread",
    "The replication stream's CopyData reader in C (see copyread.py).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__copyread(void)
{
    return PyModule_Create(&module);
}
