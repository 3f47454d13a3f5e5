"""DLPack's C structures through ctypes (bindings/dlpack.hpp's layouts), for tests that build
capsules field by field or read what rag exported."""
import ctypes


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class Managed(ctypes.Structure):
    """DLManagedTensor: the legacy "dltensor" capsule's."""
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class Versioned(ctypes.Structure):
    """DLManagedTensorVersioned: the "dltensor_versioned" capsule's."""
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


def name_of(kind):
    return b"dltensor_versioned" if kind is Versioned else b"dltensor"


def capsule_name(cap):
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype, get.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get(cap).decode()


def opened(cap, kind):
    """The Managed or Versioned struct a capsule holds (read in place)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return kind.from_address(get(cap, name_of(kind)))


def new_capsule(struct):
    """A capsule over a Managed or Versioned struct, without a capsule destructor: the caller
    keeps the struct and what it points at alive."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(struct), name_of(type(struct)), None)
