/* phantora's stand-in for Transformer Engine's PyTorch extension (transformer_engine_torch).
 *
 * TE's Python loads its extension by file path (transformer_engine/common/__init__.py
 * load_framework_extension: spec_from_file_location on the .so it finds beside the package), so
 * the stand-in has to be a real extension module. This one holds no kernels: its exec slot fills
 * the module from interpose/device/transformer_engine/extension.py, where every function issues
 * torch ops that phantora observes and times (see that file).
 */
#include <Python.h>

static int exec_extension(PyObject *module) {
    PyObject *impl = PyImport_ImportModule("interpose.device.transformer_engine.extension");
    if (impl == NULL) return -1;
    PyObject *done = PyObject_CallMethod(impl, "populate", "O", module);
    Py_DECREF(impl);
    if (done == NULL) return -1;
    Py_DECREF(done);
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_extension},
    {0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, "transformer_engine_torch",
    "phantora stand-in for Transformer Engine's PyTorch extension", 0, NULL, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_transformer_engine_torch(void) { return PyModuleDef_Init(&definition); }
