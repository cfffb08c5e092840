/* PostgreSQL timestamps as datetimes in C (the reference is ``_from_micros`` in pgtime.py).
 *
 * Every transaction carries a commit time, microseconds since 2000-01-01; in Python the
 * datetime costs a timedelta (whose constructor normalises its arguments with Python number
 * arithmetic) and an addition. Here the civil date is computed directly (days to year, month
 * and day as in Howard Hinnant's ``civil_from_days``) and the datetime built by the datetime
 * C API. A value a datetime cannot hold raises OverflowError, as the reference does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>

#define DAY_US INT64_C(86400000000)
/* Days from 1970-01-01 to 2000-01-01. */
#define PG_EPOCH_UNIX_DAYS 10957
/* Days from 2000-01-01 to 0001-01-01 and to 9999-12-31: the span a datetime can hold. */
#define MIN_DAYS (-730119)
#define MAX_DAYS 2921939

static void
civil_from_days(int64_t days_since_1970, int *year, int *month, int *day)
{
    int64_t z = days_since_1970 + 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;                                    /* [0, 146096] */
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; /* [0, 399] */
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);             /* [0, 365] */
    int64_t mp = (5 * doy + 2) / 153;                                  /* [0, 11], from March */
    *day = (int)(doy - (153 * mp + 2) / 5 + 1);
    *month = (int)(mp < 10 ? mp + 3 : mp - 9);
    *year = (int)(yoe + era * 400 + (*month <= 2));
}

PyDoc_STRVAR(from_micros_doc,
             "from_micros(micros, tzinfo=UTC) -> datetime\n\n"
             "The datetime ``micros`` microseconds after 2000-01-01 00:00 (``tzinfo`` None: "
             "naive); OverflowError when a datetime cannot hold it.");

static PyObject *
from_micros(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "from_micros() takes micros and an optional tzinfo");
        return NULL;
    }
    PyObject *tzinfo = nargs == 2 ? args[1] : PyDateTime_TimeZone_UTC;
    if (tzinfo != Py_None && !PyTZInfo_Check(tzinfo)) {
        PyErr_SetString(PyExc_TypeError, "from_micros() tzinfo must be a tzinfo or None");
        return NULL;
    }
    int overflow = 0;
    long long micros = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    if (micros == -1 && PyErr_Occurred())
        return NULL;
    int64_t days = overflow ? 0 : micros / DAY_US;
    int64_t of_day = overflow ? 0 : micros % DAY_US;
    if (of_day < 0) {
        of_day += DAY_US;
        days -= 1;
    }
    if (overflow || days < MIN_DAYS || days > MAX_DAYS) {
        PyErr_SetString(PyExc_OverflowError, "date value out of range");
        return NULL;
    }
    int year, month, day;
    civil_from_days(days + PG_EPOCH_UNIX_DAYS, &year, &month, &day);
    int64_t seconds = of_day / 1000000;
    return PyDateTimeAPI->DateTime_FromDateAndTime(
        year, month, day, (int)(seconds / 3600), (int)(seconds / 60 % 60), (int)(seconds % 60),
        (int)(of_day % 1000000), tzinfo, PyDateTimeAPI->DateTimeType);
}

static PyMethodDef methods[] = {
    {"from_micros", (PyCFunction)(void (*)(void))from_micros, METH_FASTCALL, from_micros_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pgcdc._pgtime",
    "PostgreSQL timestamps as datetimes in C (see pgtime.py).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__pgtime(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    return PyModule_Create(&module);
}
