/* Instances of slotted classes made from their slots' values, in C (the reference is
 * ``_python_builder`` in events.py).
 *
 * The decoders make an event per change and the assembler a CommittedTransaction per
 * transaction: frozen dataclasses, whose ``__init__`` sets each field through
 * ``object.__setattr__``. The hot paths skip it (``object.__new__`` and each slot's setter), but
 * that is still a Python call per field. A Builder is one call: ``object.__new__(cls)``, then
 * each slot's member descriptor sets its value directly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    PyObject *descriptors; /* a tuple of cls's member descriptors, in argument order */
    PyObject *no_args;     /* () for object.__new__ */
    vectorcallfunc vectorcall;
} Builder;

static PyObject *
builder_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Builder *builder = (Builder *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t count = PyTuple_GET_SIZE(builder->descriptors);
    if (nargs != count || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_Format(PyExc_TypeError, "a %s takes %zd positional values, got %zd",
                     builder->cls->tp_name, count, nargs);
        return NULL;
    }
    PyObject *made = PyBaseObject_Type.tp_new(builder->cls, builder->no_args, NULL);
    if (made == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *descriptor = PyTuple_GET_ITEM(builder->descriptors, i);
        if (Py_TYPE(descriptor)->tp_descr_set(descriptor, made, args[i]) < 0) {
            Py_DECREF(made);
            return NULL;
        }
    }
    return made;
}

static PyObject *
builder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *cls, *names;
    static char *keywords[] = {"cls", "names", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!:Builder", keywords, &PyType_Type, &cls,
                                     &PyTuple_Type, &names))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    PyObject *descriptors = PyTuple_New(count);
    if (descriptors == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *descriptor = PyObject_GetAttr(cls, PyTuple_GET_ITEM(names, i));
        if (descriptor == NULL) {
            Py_DECREF(descriptors);
            return NULL;
        }
        if (!Py_IS_TYPE(descriptor, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%R of %R is not a slot", PyTuple_GET_ITEM(names, i),
                         cls);
            Py_DECREF(descriptor);
            Py_DECREF(descriptors);
            return NULL;
        }
        PyTuple_SET_ITEM(descriptors, i, descriptor);
    }
    Builder *self = (Builder *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(descriptors);
        return NULL;
    }
    Py_INCREF(cls);
    self->cls = (PyTypeObject *)cls;
    self->descriptors = descriptors;
    self->no_args = PyTuple_New(0);
    self->vectorcall = builder_call;
    if (self->no_args == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
builder_traverse(Builder *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cls);
    Py_VISIT(self->descriptors);
    return 0;
}

static int
builder_clear(Builder *self)
{
    Py_CLEAR(self->cls);
    Py_CLEAR(self->descriptors);
    Py_CLEAR(self->no_args);
    return 0;
}

static void
builder_dealloc(Builder *self)
{
    PyObject_GC_UnTrack(self);
    builder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(builder_doc,
             "Builder(cls, names): called with one value per name, an instance of cls with\n"
             "those slots set, made without calling cls's __init__.");

static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pgcdc._slotted.Builder",
    .tp_basicsize = sizeof(Builder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = builder_doc,
    .tp_new = builder_new,
    .tp_dealloc = (destructor)builder_dealloc,
    .tp_traverse = (traverseproc)builder_traverse,
    .tp_clear = (inquiry)builder_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Builder, vectorcall),
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pgcdc._slotted",
    "Instances of slotted classes made from their slots' values, in C (see events.py).",
    -1,
    NULL,
};

PyMODINIT_FUNC
PyInit__slotted(void)
{
    if (PyType_Ready(&BuilderType) < 0)
        return NULL;
    PyObject *made = PyModule_Create(&module);
    if (made == NULL)
        return NULL;
    Py_INCREF(&BuilderType);
    if (PyModule_AddObject(made, "Builder", (PyObject *)&BuilderType) < 0) {
        Py_DECREF(&BuilderType);
        Py_DECREF(made);
        return NULL;
    }
    return made;
}
