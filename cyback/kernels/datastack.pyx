# cython: language_level=3, boundscheck=False, wraparound=False
"""Running a compiled function's plan on a Python frame stack of its own.

CPython 3.11 and 3.12 keep Python frames in chunks of memory. A caller that
stands near the end of a chunk makes every Python call it makes allocate a
new chunk, and free it on return: an mmap and an munmap per call, which with
the OpenMP team's threads alive costs 10-20 us (the munmap shoots down their
TLB entries). A plan's steps make hundreds of such calls, so where the caller
of ``K.function`` happened to stand on the stack decided whether NASNetMobile
ran in 11 ms or 20 (CPython issue gh-142183; 3.13 and later keep a spare
chunk instead).

``call`` runs a function with the thread's data stack pointed at a chunk that
belongs to the thread (kept in the thread state's dict, freed with it), so
the plan's frames always start at the bottom of a large chunk. Where the
interpreter has no such chunks to manage (other versions, PyPy, free-threaded
builds) it is a plain call.
"""

cdef extern from *:
    """
    #if !defined(PYPY_VERSION) && !defined(Py_GIL_DISABLED) && \\
        PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
    #define CB_OWN_STACK 1
    /* far more than a plan's frames take: overflowing it only means CPython
       chains a chunk of its own on top, as it would anyway */
    #define CB_STACK_BYTES (256 * 1024)
    #define CB_STACK_CAPSULE "cyback.datastack"

    typedef struct {
        _PyStackChunk *chunk;
        int busy;                       /* a call on it is running */
    } cb_stack;

    static void cb_stack_free(PyObject *capsule)
    {
        cb_stack *s = (cb_stack *)PyCapsule_GetPointer(capsule, CB_STACK_CAPSULE);
        if (s != NULL) {
            PyMem_RawFree(s->chunk);
            PyMem_RawFree(s);
        }
    }

    /* The calling thread's chunk, made on its first call; NULL with an
       exception set when memory or the thread state's dict fails. */
    static cb_stack *cb_thread_stack(PyObject *key)
    {
        PyObject *dict = PyThreadState_GetDict();
        if (dict == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "cyback: no thread state dict");
            return NULL;
        }
        PyObject *capsule = PyDict_GetItemWithError(dict, key);
        if (capsule != NULL)
            return (cb_stack *)PyCapsule_GetPointer(capsule, CB_STACK_CAPSULE);
        if (PyErr_Occurred())
            return NULL;
        cb_stack *s = (cb_stack *)PyMem_RawCalloc(1, sizeof(cb_stack));
        _PyStackChunk *chunk = (_PyStackChunk *)PyMem_RawMalloc(CB_STACK_BYTES);
        if (s == NULL || chunk == NULL) {
            PyMem_RawFree(s);
            PyMem_RawFree(chunk);
            PyErr_NoMemory();
            return NULL;
        }
        chunk->previous = NULL;
        chunk->size = CB_STACK_BYTES;
        chunk->top = 0;
        s->chunk = chunk;
        capsule = PyCapsule_New(s, CB_STACK_CAPSULE, cb_stack_free);
        if (capsule == NULL) {
            PyMem_RawFree(chunk);
            PyMem_RawFree(s);
            return NULL;
        }
        int failed = PyDict_SetItem(dict, key, capsule);
        Py_DECREF(capsule);             /* the dict holds it */
        return failed ? NULL : s;
    }

    static PyObject *cb_call_on_own_stack(PyObject *fn, PyObject *args, PyObject *key)
    {
        cb_stack *s = cb_thread_stack(key);
        if (s == NULL)
            return NULL;
        if (s->busy)                    /* a plan run from inside a plan */
            return PyObject_Call(fn, args, NULL);
        PyThreadState *ts = PyThreadState_Get();
        _PyStackChunk *chunk = s->chunk, *saved_chunk = ts->datastack_chunk;
        PyObject **saved_top = ts->datastack_top, **saved_limit = ts->datastack_limit;
        if (saved_chunk != NULL)        /* as CPython records it when it chains a chunk */
            saved_chunk->top = saved_top - &saved_chunk->data[0];
        chunk->previous = saved_chunk;
        chunk->top = 0;
        ts->datastack_chunk = chunk;
        /* CPython frees a chunk when the frame at its data[0] returns:
           starting at data[1] keeps this one */
        ts->datastack_top = &chunk->data[1];
        ts->datastack_limit = (PyObject **)((char *)chunk + chunk->size);
        s->busy = 1;
        PyObject *result = PyObject_Call(fn, args, NULL);
        s->busy = 0;
        ts->datastack_chunk = saved_chunk;
        ts->datastack_top = saved_top;
        ts->datastack_limit = saved_limit;
        return result;
    }
    #else
    #define CB_OWN_STACK 0
    static PyObject *cb_call_on_own_stack(PyObject *fn, PyObject *args, PyObject *key)
    {
        (void)key;
        return PyObject_Call(fn, args, NULL);
    }
    #endif
    """
    int CB_OWN_STACK
    object cb_call_on_own_stack(object fn, tuple args, object key)


cdef str _KEY = "cyback.datastack"

#: whether ``call`` switches stacks on this interpreter (False: a plain call)
OWN_STACK = bool(CB_OWN_STACK)


def call(fn, tuple args):
    """``fn(*args)``, its Python frames on the calling thread's own chunk of
    the interpreter's frame stack (see the module's docstring)."""
    return cb_call_on_own_stack(fn, args, _KEY)
