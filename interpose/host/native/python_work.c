/* The Python work a thread executes, counted: phantora's deterministic host clock.

   A C trace function (PyEval_SetTrace) counts, per thread, the bytecode instructions the
   interpreter runs (those that call something apart) and the Python frames it enters, weighted by
   a cost for each (set by set_costs, in picoseconds of the reference host), so `now_ps()` reads a clock that
   only the program's own Python advances: the same program gives the same reading whatever
   this machine's load. phantora's own work pauses the clock (pause/resume), so none of it counts.

   Instructions are counted per line: at each line event, the number of instructions from the
   current one up to the next change of line in code order (precomputed once per code object and
   kept in the code object's co_extra slot). A jump within one line makes that an estimate. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030B0000  /* 3.10: no accessors yet, and f_lasti counts code units */
static PyObject *PyCode_GetCode(PyCodeObject *code) { return Py_NewRef(code->co_code); }
static int PyFrame_GetLasti(PyFrameObject *frame) { return frame->f_lasti * 2; }
#endif

#if PY_VERSION_HEX >= 0x030C0000
#define GET_EXTRA PyUnstable_Code_GetExtra
#define SET_EXTRA PyUnstable_Code_SetExtra
#define REQUEST_EXTRA PyUnstable_Eval_RequestCodeExtraIndex
#else
#define GET_EXTRA _PyCode_GetExtra
#define SET_EXTRA _PyCode_SetExtra
#define REQUEST_EXTRA _PyEval_RequestCodeExtraIndex
#endif

static Py_ssize_t extra_index = -1;
static uint64_t instruction_ps = 0, call_site_ps = 0, call_ps = 0;
static unsigned char call_opcode[256];  /* opcodes that call something (set_call_opcodes) */

typedef struct {
    uint64_t clock_ps;   /* weighted work counted on this thread */
    uint64_t instructions, call_sites, calls, lines;
    int installed, paused;
} ThreadWork;

static _Thread_local ThreadWork tw;
/* every thread's counts together (threads count under the GIL, one at a time): for probes that
   compare a program with and without phantora, whose backward runs on the autograd engine's threads */
static uint64_t all_instructions, all_call_sites, all_calls;
static PyObject *by_code = NULL;  /* when set (profile_by_code): instructions per (file, function, line), to find leaks */

static PyObject *excluded = NULL;  /* tuple of path prefixes whose code is phantora's own */

/* counts[i]: instructions from code unit i up to the next change of line, in code order (a line
   event can land mid-line: a loop's back edge jumps to its FOR_ITER); calls[i]: how many of them
   call something (a Python function or a C one: the cost of a call site is mostly its callee's
   C work, which no instruction count sees). Both arrays follow the struct. */
typedef struct { Py_ssize_t n; int excluded; uint16_t data[]; } LineRuns;
#define RUN_COUNTS(r) ((r)->data)
#define RUN_CALLS(r) ((r)->data + (r)->n)

static void free_runs(void *p) { PyMem_RawFree(p); }

static LineRuns *build_runs(PyCodeObject *code) {
    PyObject *raw = PyCode_GetCode(code);
    if (raw == NULL) return NULL;
    Py_ssize_t nbytes = PyBytes_GET_SIZE(raw);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(raw);
    Py_ssize_t n = nbytes / 2;
    LineRuns *r = PyMem_RawCalloc(1, sizeof(LineRuns) + 2 * n * sizeof(uint16_t));
    if (r == NULL) { Py_DECREF(raw); return NULL; }
    r->n = n;
    if (excluded != NULL && code->co_filename != NULL) {
        PyObject *hit = PyObject_CallMethod(code->co_filename, "startswith", "(O)", excluded);
        r->excluded = hit == Py_True;
        Py_XDECREF(hit);
        PyErr_Clear();
    }
    /* the line of each code unit, from co_lines() */
    int *line = PyMem_RawMalloc((n ? n : 1) * sizeof(int));
    for (Py_ssize_t i = 0; i < n; i++) line[i] = -1;
    PyObject *it = PyObject_CallMethod((PyObject *)code, "co_lines", NULL);
    if (it != NULL) {
        PyObject *t;
        PyObject *iter = PyObject_GetIter(it);
        while (iter && (t = PyIter_Next(iter)) != NULL) {
            long start = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
            long end = PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
            PyObject *l = PyTuple_GET_ITEM(t, 2);
            int ln = l == Py_None ? -1 : (int)PyLong_AsLong(l);
            for (long o = start / 2; o < end / 2 && o < n; o++) line[o] = ln;
            Py_DECREF(t);
        }
        Py_XDECREF(iter);
        Py_DECREF(it);
    }
    PyErr_Clear();
    /* CACHE entries (opcode 0) are inline data, not instructions */
    uint32_t run = 0, calls = 0;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        if (i + 1 < n && line[i + 1] != line[i]) run = calls = 0;
        if (b[2 * i] != 0) run++;
        if (call_opcode[b[2 * i]]) calls++;
        RUN_COUNTS(r)[i] = run > 65535 ? 65535 : (uint16_t)run;
        RUN_CALLS(r)[i] = calls > 65535 ? 65535 : (uint16_t)calls;
    }
    PyMem_RawFree(line);
    Py_DECREF(raw);
    return r;
}

static LineRuns *runs_of(PyCodeObject *code) {
    void *p = NULL;
    if (GET_EXTRA((PyObject *)code, extra_index, &p) == 0 && p != NULL) return (LineRuns *)p;
    LineRuns *r = build_runs(code);
    if (r != NULL && SET_EXTRA((PyObject *)code, extra_index, r) != 0) {
        PyErr_Clear();
        PyMem_RawFree(r);
        return NULL;
    }
    return r;
}

static int trace(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg) {
    if (tw.paused || (what != PyTrace_LINE && what != PyTrace_CALL)) return 0;
    PyCodeObject *code = PyFrame_GetCode(frame);
    LineRuns *r = runs_of(code);
    Py_DECREF(code);
    if (r != NULL && r->excluded) return 0;
    if (what == PyTrace_LINE) {
        int unit = PyFrame_GetLasti(frame) / 2;
        uint64_t k = 1, c = 0;
        if (r != NULL && unit >= 0 && unit < r->n && RUN_COUNTS(r)[unit]) {
            k = RUN_COUNTS(r)[unit];
            c = RUN_CALLS(r)[unit];
        }
        tw.instructions += k;
        tw.call_sites += c;
        all_instructions += k;
        all_call_sites += c;
        if (by_code != NULL) {
            PyCodeObject *c = PyFrame_GetCode(frame);
            PyFrameObject *back = PyFrame_GetBack(frame);
            PyCodeObject *bc = back ? PyFrame_GetCode(back) : NULL;
            PyObject *key = Py_BuildValue("(OOiOO)", c->co_filename, c->co_name, c->co_firstlineno,
                                          bc ? bc->co_filename : Py_None, bc ? bc->co_name : Py_None);
            Py_XDECREF(bc);
            Py_XDECREF(back);
            Py_DECREF(c);
            PyObject *old = key ? PyDict_GetItemWithError(by_code, key) : NULL;
            PyObject *nv = PyLong_FromUnsignedLongLong((old ? PyLong_AsUnsignedLongLong(old) : 0) + k);
            if (key && nv) PyDict_SetItem(by_code, key, nv);
            Py_XDECREF(key);
            Py_XDECREF(nv);
            PyErr_Clear();
        }
        tw.lines++;
        tw.clock_ps += (k - c) * instruction_ps + c * call_site_ps;
    } else {
        tw.calls++;
        all_calls++;
        tw.clock_ps += call_ps;
    }
    return 0;
}

static PyObject *resume(PyObject *self, PyObject *unused) {
    tw.paused = 0;
#if PY_VERSION_HEX < 0x030C0000
    PyEval_SetTrace(trace, NULL);
#else
    if (!tw.installed) PyEval_SetTrace(trace, NULL);
#endif
    tw.installed = 1;
    Py_RETURN_NONE;
}

static PyObject *pause_(PyObject *self, PyObject *unused) {
    tw.paused = 1;
#if PY_VERSION_HEX < 0x030C0000
    /* on 3.11 an untraced thread runs the interpreter's fast path: phantora's own Python
       (FakeTensor propagation) pays nothing for the counter */
    if (tw.installed) PyEval_SetTrace(NULL, NULL);
#endif
    Py_RETURN_NONE;
}

static PyObject *now_ps(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(tw.clock_ps);
}

static PyObject *counts(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(KKKK)", (unsigned long long)tw.instructions, (unsigned long long)tw.calls,
                         (unsigned long long)tw.call_sites, (unsigned long long)tw.lines);
}

static PyObject *all_counts(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(KKK)", (unsigned long long)all_instructions, (unsigned long long)all_calls,
                         (unsigned long long)all_call_sites);
}

static PyObject *profile_by_code(PyObject *self, PyObject *d) {
    Py_XSETREF(by_code, d == Py_None ? NULL : Py_NewRef(d));
    Py_RETURN_NONE;
}

static PyObject *set_costs(PyObject *self, PyObject *args) {
    unsigned long long ins, site, call;
    if (!PyArg_ParseTuple(args, "KKK", &ins, &site, &call)) return NULL;
    instruction_ps = ins;
    call_site_ps = site;
    call_ps = call;
    Py_RETURN_NONE;
}

static PyObject *set_call_opcodes(PyObject *self, PyObject *ops) {
    if (!PyBytes_Check(ops)) {
        PyErr_SetString(PyExc_TypeError, "set_call_opcodes() takes bytes");
        return NULL;
    }
    memset(call_opcode, 0, sizeof call_opcode);
    for (Py_ssize_t i = 0; i < PyBytes_GET_SIZE(ops); i++) call_opcode[(unsigned char)PyBytes_AS_STRING(ops)[i]] = 1;
    Py_RETURN_NONE;
}

static PyObject *exclude(PyObject *self, PyObject *prefixes) {
    if (!PyTuple_Check(prefixes)) {
        PyErr_SetString(PyExc_TypeError, "exclude() takes a tuple of path prefixes");
        return NULL;
    }
    Py_XSETREF(excluded, Py_NewRef(prefixes));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"exclude", exclude, METH_O, "path prefixes whose code never counts (phantora's own); set before counting"},
    {"resume", resume, METH_NOARGS, "count this thread's Python from now on (installs the counter)"},
    {"pause", pause_, METH_NOARGS, "stop counting this thread's Python"},
    {"now_ps", now_ps, METH_NOARGS, "this thread's counted work, in ps of the reference host"},
    {"counts", counts, METH_NOARGS, "(instructions, calls, call sites, lines) counted on this thread"},
    {"all_counts", all_counts, METH_NOARGS, "(instructions, calls, call sites) counted on every thread"},
    {"profile_by_code", profile_by_code, METH_O, "a dict to add instructions per (file, function, line) to, or None"},
    {"set_costs", set_costs, METH_VARARGS, "(instruction_ps, call_site_ps, call_ps): the weights"},
    {"set_call_opcodes", set_call_opcodes, METH_O, "the opcodes that call something; set before counting"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_phantora_python_work", NULL, -1, methods};

PyMODINIT_FUNC PyInit__phantora_python_work(void) {
    extra_index = REQUEST_EXTRA(free_runs);
    if (extra_index < 0) return NULL;
    return PyModule_Create(&module);
}
