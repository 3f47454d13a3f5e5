// Python objects of rag's classes that hold no C++ value. `rag.Tensor.__new__(rag.Tensor)`, or
// unpickling a rag.Tensor whose state never arrives, gives an instance whose value was never
// constructed; pybind11 would hand a method of it uninitialised memory (it allocates the value
// lazily, unconstructed), so every use crashed or read garbage. Each class of the module has a
// caster that refuses such an instance with a rag.Error saying how to make one: the one place
// through which a method's `self`, an argument and every `obj.cast<T>()` pass.
#pragma once
#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <pybind11/pybind11.h>

#include <memory>

namespace rag::bind {

// What a class is called and how a user makes one; specialised beside each class.
template <class T> struct Made;

// Throws rag::Error when `src` is an instance of T (or a subclass) whose value is not
// constructed.
template <class T> void check_initialised(pybind11::handle src) {
    namespace detail = pybind11::detail;
    const detail::type_info* type = detail::get_type_info(typeid(T));
    if (!type || !src || !PyObject_TypeCheck(src.ptr(), type->type)) return;
    auto* inst = reinterpret_cast<detail::instance*>(src.ptr());
    if (!inst->get_value_and_holder(type, false).holder_constructed())
        fail("this ", Made<T>::name, " is not initialised (made by ", Made<T>::name,
             ".__new__, or unpickled without its state); ", Made<T>::how);
}

// The caster of T (by value, reference or pointer) with that check first.
template <class T> class InitialisedCaster : public pybind11::detail::type_caster_base<T> {
  public:
    bool load(pybind11::handle src, bool convert) {
        check_initialised<T>(src);
        return pybind11::detail::type_caster_base<T>::load(src, convert);
    }
};

// The caster of a std::shared_ptr<T> holder (a class held by shared_ptr) with that check first.
template <class T>
class InitialisedHolderCaster
    : public pybind11::detail::copyable_holder_caster<T, std::shared_ptr<T>> {
  public:
    bool load(pybind11::handle src, bool convert) {
        check_initialised<T>(src);
        return pybind11::detail::copyable_holder_caster<T, std::shared_ptr<T>>::load(src, convert);
    }
};

template <> struct Made<RaggedTensor> {
    static constexpr const char* name = "rag.Tensor";
    static constexpr const char* how =
        "make tensors with rag.ragged, rag.tensor, rag.from_padded, rag.from_packed or "
        "rag.from_dlpack";
};

} // namespace rag::bind

// Every translation unit that converts Python objects to T must see its caster (ODR): this
// header for rag.Tensor (included by convert.hpp and pickle.hpp), bindings/rag_py.cpp for the
// classes it defines.
#define RAG_INITIALISED_CASTER(T)                                                                  \
    namespace pybind11::detail {                                                                   \
    template <> class type_caster<T> : public rag::bind::InitialisedCaster<T> {};                  \
    }

RAG_INITIALISED_CASTER(rag::RaggedTensor)
