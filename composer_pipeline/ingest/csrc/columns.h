// Arrow columns built natively: string, int64, bool, list<int64>, list<string>.
//
// Rows accumulate over many sessions; ``export_*`` hands the buffers to Python without copying
// (a ``Buf`` object owns the bytes and exposes them through the buffer protocol, which
// ``pyarrow.py_buffer`` wraps). ``Mark``/``rollback`` undo a session that turned out to need the
// Python path after some of its rows were appended. Large buffers come back to a pool when Python
// releases them (``recycle``) and hold the next batch (``storage``).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cp {

// ---- recycled storage ---------------------------------------------------------------------------
// Every batch's column buffers go to Python (zero-copy) and are freed once the batch is written. The
// next batch would then write into freshly mapped memory, and every 4 KiB page of it costs a page
// fault in which the kernel zeroes the page: the raw lines alone are ~1 fault per 4 KiB of sessions
// (a third of the process's system time). Instead, a released buffer of at least ``kRecycleMin``
// bytes keeps its (mapped) storage here, and the next batch's column of about the same size takes it.
// At most ``kPoolMax`` buffers (a batch's large columns); emptied when the last Builder is gone, so a
// long-lived process keeps nothing after ingesting. Touched only with the GIL held.
constexpr size_t kRecycleMin = size_t(64) << 10;
constexpr size_t kPoolMax = 48;

struct Pool {
  std::vector<std::string> free;
  int builders = 0;
};

inline Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: Buf objects may outlive module teardown
  return *p;
}

inline void recycle(std::string&& s) {
  Pool& p = pool();
  if (p.builders <= 0 || s.capacity() < kRecycleMin) return;  // freed by the caller's string
  if (p.free.size() >= kPoolMax) {  // full: drop the smallest
    auto it = std::min_element(p.free.begin(), p.free.end(),
                               [](const std::string& a, const std::string& b) { return a.capacity() < b.capacity(); });
    if (it->capacity() >= s.capacity()) return;
    *it = std::string();
    std::swap(*it, p.free.back());
    p.free.pop_back();
  }
  s.clear();
  p.free.push_back(std::move(s));
}

// An empty string with room for ``want`` bytes: the smallest recycled buffer that holds them (and is
// not more than 4x larger: a big buffer is kept for a big column), else a new allocation rounded up to
// a power of two. (Sized exactly, the next batch's column, a little larger than the last, found no
// recycled buffer to fit about every other batch and faulted in a fresh one, page by page; the unused
// part of a rounded-up buffer is address space only.)
inline std::string storage(size_t want) {
  std::string s;
  Pool& p = pool();
  if (want >= kRecycleMin / 2) {
    size_t best = p.free.size();
    for (size_t i = 0; i < p.free.size(); ++i) {
      size_t cap = p.free[i].capacity();
      if (cap >= want && cap / 4 <= want && (best == p.free.size() || cap < p.free[best].capacity())) best = i;
    }
    if (best < p.free.size()) {
      std::swap(p.free[best], p.free.back());
      s = std::move(p.free.back());
      p.free.pop_back();
      return s;
    }
  }
  if (want >= kRecycleMin / 2) {
    size_t cap = kRecycleMin;
    while (cap < want) cap *= 2;
    want = cap;
  }
  s.reserve(want);
  return s;
}

// ``s.reserve(want)`` through the pool: the contents move into recycled storage where one fits.
inline void grow(std::string& s, size_t want) {
  if (s.capacity() >= want) return;
  std::string n = storage(want);
  n.append(s);
  std::swap(s, n);
  recycle(std::move(n));
}

// ---- a bytes-like owner of one buffer ----------------------------------------------------------
struct BufObject {
  PyObject_HEAD
  std::string* data;
};

inline void buf_dealloc(PyObject* self) {
  std::string* d = reinterpret_cast<BufObject*>(self)->data;
  recycle(std::move(*d));
  delete d;
  Py_TYPE(self)->tp_free(self);
}

inline int buf_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  std::string* d = reinterpret_cast<BufObject*>(self)->data;
  // std::string's storage is never null (an empty one points at its terminating NUL): Arrow
  // refuses a null buffer pointer even for zero bytes
  return PyBuffer_FillInfo(view, self, d->data(), Py_ssize_t(d->size()), 1, flags);
}

inline PyBufferProcs buf_as_buffer = {buf_getbuffer, nullptr};

inline PyTypeObject BufType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "composer_pipeline.ingest._native.Buf";
  t.tp_basicsize = sizeof(BufObject);
  t.tp_dealloc = buf_dealloc;
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_as_buffer = &buf_as_buffer;
  t.tp_doc = "bytes owned by the native ingest builder (buffer protocol)";
  return t;
}();

inline PyObject* make_buf(std::string&& s) {
  BufObject* b = PyObject_New(BufObject, &BufType);
  if (!b) return nullptr;
  b->data = new std::string(std::move(s));
  return reinterpret_cast<PyObject*>(b);
}

// Validity / boolean values as bytes (one per row) packed into an LSB-first bitmap on export.
inline std::string pack_bits(const std::vector<uint8_t>& v) {
  std::string out((v.size() + 7) / 8, '\0');
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i]) out[i >> 3] = char(uint8_t(out[i >> 3]) | uint8_t(1u << (i & 7)));
  return out;
}

template <class T>
inline std::string as_bytes(const std::vector<T>& v) {
  std::string s = storage(v.size() * sizeof(T));
  s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  return s;
}

// ("kind", length, null_count, [buffers...]) -- the Python side maps it onto pyarrow.
inline PyObject* col_tuple(const char* kind, size_t len, int64_t nulls, std::vector<std::string>&& bufs,
                           bool has_validity) {
  PyObject* lst = PyList_New(Py_ssize_t(bufs.size()));
  if (!lst) return nullptr;
  for (size_t i = 0; i < bufs.size(); ++i) {
    PyObject* item;
    if (i == 0 && !has_validity) {
      item = Py_None;
      Py_INCREF(item);
    } else {
      item = make_buf(std::move(bufs[i]));
      if (!item) { Py_DECREF(lst); return nullptr; }
    }
    PyList_SET_ITEM(lst, Py_ssize_t(i), item);
  }
  return Py_BuildValue("(snnN)", kind, Py_ssize_t(len), Py_ssize_t(nulls), lst);
}

// ---- columns ------------------------------------------------------------------------------------
struct StrCol {
  std::vector<int32_t> offsets{0};
  std::string data;
  std::vector<uint8_t> valid;
  int64_t nulls = 0;
  // Bytes to reserve at the next batch's first value (export_and_clear): reserved then rather than at
  // the export, the exported batch's buffer has by then been written and released to the pool, so the
  // next batch reuses its pages instead of faulting in fresh ones (the second batch did: ~5k page
  // faults per run).
  size_t reserve_next = 0;

  void reserve() {
    if (reserve_next) {
      grow(data, reserve_next);
      reserve_next = 0;
    }
  }

  size_t size() const { return valid.size(); }
  // false when the 32-bit offsets would overflow (the caller falls back for the session)
  bool add(std::string_view s) {
    reserve();
    if (data.size() + s.size() > size_t(INT32_MAX)) return false;
    if (data.size() + s.size() > data.capacity()) grow(data, std::max(data.size() + s.size(), 2 * data.capacity()));
    data.append(s.data(), s.size());
    offsets.push_back(int32_t(data.size()));
    valid.push_back(1);
    return true;
  }
  void add_null() {
    offsets.push_back(int32_t(data.size()));
    valid.push_back(0);
    ++nulls;
  }
  // append directly into ``data`` (JSON written in place), then commit
  std::string& buffer() {
    reserve();
    return data;
  }
  bool commit() {
    if (data.size() > size_t(INT32_MAX)) return false;
    offsets.push_back(int32_t(data.size()));
    valid.push_back(1);
    return true;
  }

  struct Mark { size_t rows, bytes; int64_t nulls; };
  Mark mark() const { return {size(), data.size(), nulls}; }
  void rollback(const Mark& m) {
    offsets.resize(m.rows + 1);
    valid.resize(m.rows);
    data.resize(m.bytes);
    nulls = m.nulls;
  }
  size_t nbytes() const { return data.size() + offsets.size() * 4 + valid.size(); }

  PyObject* export_and_clear() {
    std::vector<std::string> bufs;
    bufs.push_back(nulls ? pack_bits(valid) : std::string());
    bufs.push_back(as_bytes(offsets));
    size_t n = size(), bytes = data.size();
    bufs.push_back(std::move(data));
    int64_t k = nulls;
    offsets.assign(1, 0);
    data = std::string();
    reserve_next = bytes + bytes / 4;  // the next batch is about as large: no regrowth copies
    offsets.reserve(n + n / 4 + 1);
    valid.clear();
    valid.reserve(n + n / 4);
    nulls = 0;
    return col_tuple("string", n, k, std::move(bufs), k > 0);
  }
};

struct I64Col {
  std::vector<int64_t> values;
  size_t size() const { return values.size(); }
  void add(int64_t v) { values.push_back(v); }
  struct Mark { size_t rows; };
  Mark mark() const { return {size()}; }
  void rollback(const Mark& m) { values.resize(m.rows); }
  size_t nbytes() const { return values.size() * 8; }
  PyObject* export_and_clear() {
    std::vector<std::string> bufs;
    bufs.push_back(std::string());
    bufs.push_back(as_bytes(values));
    size_t n = size();
    values.clear();
    return col_tuple("int64", n, 0, std::move(bufs), false);
  }
};

struct BoolCol {
  std::vector<uint8_t> values;
  size_t size() const { return values.size(); }
  void add(bool v) { values.push_back(v ? 1 : 0); }
  struct Mark { size_t rows; };
  Mark mark() const { return {size()}; }
  void rollback(const Mark& m) { values.resize(m.rows); }
  size_t nbytes() const { return values.size(); }
  PyObject* export_and_clear() {
    std::vector<std::string> bufs;
    bufs.push_back(std::string());
    bufs.push_back(pack_bits(values));
    size_t n = size();
    values.clear();
    return col_tuple("bool", n, 0, std::move(bufs), false);
  }
};

// list<int64> and list<string> (never null in the ingest contracts)
template <class Child>
struct ListCol {
  std::vector<int32_t> offsets{0};
  Child child;
  size_t size() const { return offsets.size() - 1; }
  void close() { offsets.push_back(int32_t(child.size())); }
  struct Mark { size_t rows; typename Child::Mark child; };
  Mark mark() const { return {size(), child.mark()}; }
  void rollback(const Mark& m) { offsets.resize(m.rows + 1); child.rollback(m.child); }
  size_t nbytes() const { return offsets.size() * 4 + child.nbytes(); }
  PyObject* export_and_clear() {
    std::vector<std::string> bufs;
    bufs.push_back(std::string());
    bufs.push_back(as_bytes(offsets));
    size_t n = size();
    offsets.assign(1, 0);
    PyObject* c = child.export_and_clear();
    if (!c) return nullptr;
    PyObject* head = col_tuple("list", n, 0, std::move(bufs), false);
    if (!head) { Py_DECREF(c); return nullptr; }
    PyObject* out = Py_BuildValue("(NN)", head, c);
    return out;
  }
};

}  // namespace cp
