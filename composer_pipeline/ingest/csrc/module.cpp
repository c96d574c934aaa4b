// composer_pipeline.ingest._native: the compiled ingest path (see composer_pipeline/ingest/native.py).
//
//   b = Builder()
//   b.add_session(session_key, default_session_id, files, classify, compaction_full, drop_warmup)
//       files: [(rel, data: bytes | None, splices, is_main, stream_id, kind, agent_id, pre_quarantine | None)]
//           splices: [(start, end, line: bytes)] in file order: whole lines (newline excluded) of
//           ``data`` to read as ``line`` instead (the scrubbed file without splicing it: no copy)
//       classify(file_index, line_no, line) -> None (only Python can read this line: hand the
//           session back) | (reason, text, salvaged_uuid, salvaged_parent_uuid, salvaged_sidechain
//           (None: unreadable), parent_lost, subtype) (parser.classify_line)
//       -> (True, (streams, warmup_dropped, states, messages),
//               [(lines, records, bad_lines, no_uuid [(type, n)], states, subagents_linked,
//                 compactions_crossed, warmup_dropped, damaged_bridged) per file])
//        | (False, reason): nothing of the session was kept; run the Python path for it
//   b.rows() / b.nbytes(): pending trace_messages rows / bytes
//   b.flush() -> {table: [column spec, ...]} (schema order; see native.py), and the builder is empty
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "columns.h"
#include "json.h"
#include "records.h"
#include "session.h"

namespace cp {

constexpr size_t kFirstRaw = size_t(32) << 20;  // about one CLI batch of raw lines (FLUSH_BYTES)

struct BuilderObject {
  PyObject_HEAD
  Tables* tables;
};

static PyObject* builder_new(PyTypeObject* type, PyObject*, PyObject*) {
  BuilderObject* self = reinterpret_cast<BuilderObject*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->tables = new Tables();
  ++pool().builders;
  return reinterpret_cast<PyObject*>(self);
}

static void builder_dealloc(PyObject* obj) {
  delete reinterpret_cast<BuilderObject*>(obj)->tables;
  if (--pool().builders <= 0) std::vector<std::string>().swap(pool().free);  // the last one: keep nothing
  Py_TYPE(obj)->tp_free(obj);
}

static bool utf8_of(PyObject* o, std::string& out) {
  Py_ssize_t n;
  const char* s = PyUnicode_AsUTF8AndSize(o, &n);
  if (!s) return false;
  out.assign(s, size_t(n));
  return true;
}

// A Python str or None -> Val (kept in the arena)
static bool val_of(PyObject* o, Arena& arena, Val& v) {
  v = Val{};
  if (o == Py_None) return true;
  std::string s;
  if (!utf8_of(o, s)) return false;
  v.kind = Kind::String;
  v.truthy = !s.empty();
  v.s = arena.keep(std::move(s));
  return true;
}

struct Marks {
  std::vector<StrCol::Mark> s;
  std::vector<I64Col::Mark> i;
  std::vector<BoolCol::Mark> b;
  std::vector<ListCol<I64Col>::Mark> li;
  std::vector<ListCol<StrCol>::Mark> ls;
};

struct MarkVisitor {
  Marks& m;
  void operator()(StrCol& c) { m.s.push_back(c.mark()); }
  void operator()(I64Col& c) { m.i.push_back(c.mark()); }
  void operator()(BoolCol& c) { m.b.push_back(c.mark()); }
  void operator()(ListCol<I64Col>& c) { m.li.push_back(c.mark()); }
  void operator()(ListCol<StrCol>& c) { m.ls.push_back(c.mark()); }
};

struct RollbackVisitor {
  Marks& m;
  size_t s = 0, i = 0, b = 0, li = 0, ls = 0;
  void operator()(StrCol& c) { c.rollback(m.s[s++]); }
  void operator()(I64Col& c) { c.rollback(m.i[i++]); }
  void operator()(BoolCol& c) { c.rollback(m.b[b++]); }
  void operator()(ListCol<I64Col>& c) { c.rollback(m.li[li++]); }
  void operator()(ListCol<StrCol>& c) { c.rollback(m.ls[ls++]); }
};

struct OverflowVisitor {
  bool over = false;
  void operator()(StrCol& c) { over |= c.data.size() > size_t(INT32_MAX); }
  void operator()(I64Col&) {}
  void operator()(BoolCol&) {}
  void operator()(ListCol<I64Col>& c) { over |= c.child.size() > size_t(INT32_MAX); }
  void operator()(ListCol<StrCol>& c) { over |= c.child.data.size() > size_t(INT32_MAX) || c.child.size() > size_t(INT32_MAX); }
};

template <class F>
static void each_column(Tables& t, F& f) {
  t.messages.each(f);
  t.states.each(f);
  t.quarantine.each(f);
}

static PyObject* bail_result(const std::string& reason) {
  return Py_BuildValue("(Os)", Py_False, reason.c_str());
}

// ``[(start, end, line: bytes)]`` -> f.splices, checked: in order, each a whole line of the file
// (starting at its start or after a newline, ending at a newline or the end) replaced by text
// without a newline, so the file's lines stay the lines the Python engine splits.
static bool splices_of(PyObject* obj, FileIn& f) {
  if (obj == Py_None) return true;
  if (!PyList_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "splices must be a list or None");
    return false;
  }
  size_t prev = 0;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(obj); ++k) {
    Py_ssize_t a, b;
    PyObject* text;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(obj, k), "nnO!", &a, &b, &PyBytes_Type, &text)) return false;
    Splice sp{size_t(a), size_t(b), PyBytes_AS_STRING(text), size_t(PyBytes_GET_SIZE(text))};
    if (a < 0 || b < a || sp.end > f.size || sp.start < prev || (k > 0 && sp.start == prev) ||
        (sp.start > 0 && f.data[sp.start - 1] != '\n') || (sp.end < f.size && f.data[sp.end] != '\n') ||
        std::memchr(sp.text, '\n', sp.n) != nullptr) {
      PyErr_SetString(PyExc_ValueError, "a splice must replace one whole line, in file order");
      return false;
    }
    prev = sp.end;
    f.splices.push_back(sp);
  }
  return true;
}

// Parse one file's lines into records; bad lines go to ``classify``. Returns false with a Python
// error set, or with ``bail`` set when the session must go to Python.
static bool parse_file(Tables& t, const std::string& key, FileIn& f, uint32_t file_index, PyObject* classify,
                       std::vector<Rec>& recs, FileOut& out, std::vector<Block>& blocks, Arena& arena,
                       std::string& bail) {
  if (!f.data) return true;
  const char* data = f.data;
  size_t size = f.size;
  // the scrubbed file is valid UTF-8 iff each piece is (they meet at line boundaries: ASCII)
  auto valid = [](const char* q, size_t n) { return utf8_valid(reinterpret_cast<const unsigned char*>(q), n); };
  bool ok_utf8 = true;
  size_t pos = 0;
  for (const Splice& sp : f.splices) {
    ok_utf8 = ok_utf8 && valid(data + pos, sp.start - pos) && valid(sp.text, sp.n);
    pos = sp.end;
  }
  if (!ok_utf8 || !valid(data + pos, size - pos)) {
    bail = "invalid UTF-8 (the Python path repairs it line by line)";
    return true;
  }
  RecordParser parser(blocks, arena);
  recs.reserve(size / 1024 + 16);
  const char* p = data;
  const char* end = data + size;
  uint32_t line_no = 0;
  size_t si = 0;  // next splice
  std::vector<Cut> cut;  // damaged lines without a uuid that start like a record: bridge candidates
  bool any_lost = false;  // a damaged record whose parent reference or isSidechain is unreadable
  for (;;) {  // data is non-empty: Python passes None for an empty or all-whitespace file
    const char* nl;  // the newline ending the line in ``data`` (null: the last line has none)
    const char* le;  // the end of the line's text
    const char* lp = p;  // the line's text: in ``data``, or its scrubbed replacement
    if (si < f.splices.size() && size_t(p - data) == f.splices[si].start) {
      const Splice& sp = f.splices[si++];
      lp = sp.text;
      le = sp.text + sp.n;
      nl = data + sp.end < end ? data + sp.end : nullptr;
    } else {
      nl = static_cast<const char*>(std::memchr(p, '\n', size_t(end - p)));
      le = nl ? nl : end;
    }
    ++line_no;
    recs.emplace_back();
    Rec& r = recs.back();
    if (parser.parse(lp, le, r)) {
      r.raw = std::string_view(lp, size_t(le - lp));
      r.line_no = line_no;
      r.file = file_index;
    } else {
      recs.pop_back();
      PyObject* line = PyBytes_FromStringAndSize(lp, Py_ssize_t(le - lp));
      if (!line) return false;
      PyObject* got = PyObject_CallFunction(classify, "InN", file_index, Py_ssize_t(line_no), line);
      if (!got) return false;
      if (got == Py_None) {
        Py_DECREF(got);
        bail = "a line only the Python reader accepts";
        return true;
      }
      PyObject *reason, *text, *su, *sp, *side, *lost, *sub;
      if (!PyArg_ParseTuple(got, "OOOOOOO", &reason, &text, &su, &sp, &side, &lost, &sub)) {
        Py_DECREF(got);
        return false;
      }
      std::string sreason, stext;
      Val vsu, vsp, vsub;
      bool ok = utf8_of(reason, sreason) && utf8_of(text, stext) && val_of(su, arena, vsu) &&
                val_of(sp, arena, vsp) && val_of(sub, arena, vsub);
      const bool side_lost = side == Py_None;  // isSidechain unreadable
      int is_side = ok ? PyObject_IsTrue(side) : -1;
      int is_lost = is_side >= 0 ? PyObject_IsTrue(lost) : -1;
      Py_DECREF(got);
      if (!ok || is_side < 0 || is_lost < 0) return false;
      QuarantineCols& q = t.quarantine;
      q.session_key.add(key);
      q.source_file.add(f.rel);
      q.line_no.add(line_no);
      q.reason.add(sreason);
      q.text.add(stext);
      add_opt(q.salvaged_uuid, vsu);
      add_opt(q.salvaged_parent_uuid, vsp);
      out.bad_lines += 1;
      if (!vsu.is_str() && le > lp && *lp == '{')
        cut.push_back(Cut{line_no, vsp, std::string_view(lp, size_t(le - lp)), vsub});
      if (vsu.is_str()) {  // a salvaged chain link: a pass-through record with only its ids
        recs.emplace_back();
        Rec& d = recs.back();
        d.type = "damaged";
        d.uuid = vsu;
        d.parent = vsp;
        d.is_sidechain = is_side != 0;
        d.subtype = vsub;
        d.damaged = true;
        d.parent_lost = is_lost != 0;
        d.side_lost = side_lost;
        any_lost = any_lost || d.parent_lost || d.side_lost;
        d.raw = std::string_view(lp, size_t(le - lp));
        d.line_no = line_no;
        d.file = file_index;
      }
    }
    if (!nl) break;
    p = nl + 1;
    if (p == end) break;  // a final newline ends the last line (no empty line after it)
  }
  out.lines = line_no;
  out.records = uint32_t(recs.size());
  for (Rec& r : recs) {
    if (r.has_uuid()) continue;
    auto it = std::find_if(out.no_uuid.begin(), out.no_uuid.end(), [&](auto& kv) { return kv.first == r.type; });
    if (it == out.no_uuid.end()) out.no_uuid.emplace_back(r.type, 1);
    else it->second += 1;
  }
  out.damaged_bridged = bridge_damaged(recs, cut, any_lost, file_index);
  return true;
}

static PyObject* builder_add_session(PyObject* obj, PyObject* args) {
  BuilderObject* self = reinterpret_cast<BuilderObject*>(obj);
  const char *key_c, *sid_c;
  PyObject *files_obj, *classify;
  int compaction_full, drop_warmup;
  if (!PyArg_ParseTuple(args, "ssO!Opp", &key_c, &sid_c, &PyList_Type, &files_obj, &classify, &compaction_full,
                        &drop_warmup))
    return nullptr;
  std::string key(key_c);
  Tables& t = *self->tables;
  Options opts;
  opts.compaction_full = compaction_full != 0;
  opts.drop_warmup = drop_warmup != 0;

  Py_ssize_t nfiles = PyList_GET_SIZE(files_obj);
  std::vector<FileIn> files(static_cast<size_t>(nfiles));
  std::vector<PyObject*> pre_q(static_cast<size_t>(nfiles), nullptr);
  for (Py_ssize_t i = 0; i < nfiles; ++i) {
    PyObject* item = PyList_GET_ITEM(files_obj, i);
    PyObject *rel, *data, *splices, *stream_id, *kind, *agent_id, *pq;
    int is_main;
    if (!PyArg_ParseTuple(item, "OOOpOOOO", &rel, &data, &splices, &is_main, &stream_id, &kind, &agent_id, &pq))
      return nullptr;
    FileIn& f = files[size_t(i)];
    if (!utf8_of(rel, f.rel)) return nullptr;
    if (data != Py_None) {
      if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "file data must be bytes or None");
        return nullptr;
      }
      f.data = PyBytes_AS_STRING(data);
      f.size = size_t(PyBytes_GET_SIZE(data));
      if (!splices_of(splices, f)) return nullptr;
    }
    f.is_main = is_main != 0;
    if (stream_id != Py_None && !utf8_of(stream_id, f.stream_id)) return nullptr;
    if (kind != Py_None && !utf8_of(kind, f.kind)) return nullptr;
    if (agent_id != Py_None && !utf8_of(agent_id, f.agent_id)) return nullptr;
    if (pq != Py_None) pre_q[size_t(i)] = pq;
  }

  Marks marks;
  MarkVisitor mv{marks};
  each_column(t, mv);
  auto rollback = [&]() {
    RollbackVisitor rv{marks};
    each_column(t, rv);
  };

  // the raw lines are most of the bytes: grow that column geometrically, once per session, starting
  // at kFirstRaw (address space only until written: no doubling chain of copies for the first batch)
  size_t total = 0;
  for (const FileIn& f : files) total += f.size;
  t.messages.raw.reserve();  // (first the batch's own reservation, if this is its first session)
  std::string& raw = t.messages.raw.data;
  if (raw.capacity() < raw.size() + total) grow(raw, std::max({raw.size() + total, 2 * raw.capacity(), kFirstRaw}));

  Arena arena;
  std::vector<Block> blocks;
  blocks.reserve(1024);
  std::vector<std::vector<Rec>> recs(files.size());
  std::vector<FileOut> out(files.size());
  std::string bail;
  for (size_t i = 0; i < files.size(); ++i) {
    if (pre_q[i]) {  // a whole-file problem found by Python (unreadable file): its quarantine row
      PyObject *reason, *text;
      Py_ssize_t line_no;
      if (!PyArg_ParseTuple(pre_q[i], "nOO", &line_no, &reason, &text)) { rollback(); return nullptr; }
      std::string sreason, stext;
      if (!utf8_of(reason, sreason) || !utf8_of(text, stext)) { rollback(); return nullptr; }
      QuarantineCols& q = t.quarantine;
      q.session_key.add(key);
      q.source_file.add(files[i].rel);
      q.line_no.add(line_no);
      q.reason.add(sreason);
      q.text.add(stext);
      q.salvaged_uuid.add_null();
      q.salvaged_parent_uuid.add_null();
      out[i].bad_lines += 1;
    }
    if (!parse_file(t, key, files[i], uint32_t(i), classify, recs[i], out[i], blocks, arena, bail)) {
      rollback();
      return nullptr;
    }
    if (!bail.empty()) {
      rollback();
      return bail_result(bail);
    }
  }

  SessionBuild sb(t, opts, key, sid_c, arena, blocks);
  try {
    sb.run(files, recs, out);
  } catch (const Bail& b) {
    rollback();
    return bail_result(b.reason);
  } catch (const std::bad_alloc&) {
    rollback();
    return PyErr_NoMemory();
  }
  OverflowVisitor ov;
  each_column(t, ov);
  if (ov.over) {
    rollback();
    return bail_result("more than 2 GiB in one column: the Python path chunks it");
  }

  PyObject* per_file = PyList_New(Py_ssize_t(files.size()));
  if (!per_file) { rollback(); return nullptr; }
  for (size_t i = 0; i < files.size(); ++i) {
    const FileOut& o = out[i];
    PyObject* nu = PyList_New(Py_ssize_t(o.no_uuid.size()));
    if (!nu) { Py_DECREF(per_file); rollback(); return nullptr; }
    for (size_t k = 0; k < o.no_uuid.size(); ++k) {
      PyObject* pair = Py_BuildValue("(s#I)", o.no_uuid[k].first.data(), Py_ssize_t(o.no_uuid[k].first.size()),
                                     o.no_uuid[k].second);
      if (!pair) { Py_DECREF(nu); Py_DECREF(per_file); rollback(); return nullptr; }
      PyList_SET_ITEM(nu, Py_ssize_t(k), pair);
    }
    PyObject* row = Py_BuildValue("(IIINIIIII)", o.lines, o.records, o.bad_lines, nu, o.states, o.subagents_linked,
                                  o.compactions_crossed, o.warmup_dropped, o.damaged_bridged);
    if (!row) { Py_DECREF(per_file); rollback(); return nullptr; }
    PyList_SET_ITEM(per_file, Py_ssize_t(i), row);
  }
  return Py_BuildValue("(O(IIII)N)", Py_True, sb.streams_, sb.warmup_dropped_, sb.states_, sb.messages_, per_file);
}

struct ExportVisitor {
  PyObject* list;
  bool ok = true;
  template <class C>
  void operator()(C& c) {
    if (!ok) return;
    PyObject* spec = c.export_and_clear();
    if (!spec || PyList_Append(list, spec) < 0) ok = false;
    Py_XDECREF(spec);
  }
};

template <class T>
static bool export_table(PyObject* dict, const char* name, T& cols) {
  PyObject* lst = PyList_New(0);
  if (!lst) return false;
  ExportVisitor ev{lst};
  cols.each(ev);
  if (!ev.ok || PyDict_SetItemString(dict, name, lst) < 0) {
    Py_DECREF(lst);
    return false;
  }
  Py_DECREF(lst);
  return true;
}

static PyObject* builder_flush(PyObject* obj, PyObject*) {
  Tables& t = *reinterpret_cast<BuilderObject*>(obj)->tables;
  PyObject* d = PyDict_New();
  if (!d) return nullptr;
  if (!export_table(d, "trace_states", t.states) || !export_table(d, "trace_messages", t.messages) ||
      !export_table(d, "quarantine", t.quarantine)) {
    Py_DECREF(d);
    return nullptr;
  }
  return d;
}

static PyObject* builder_rows(PyObject* obj, PyObject*) {
  return PyLong_FromSize_t(reinterpret_cast<BuilderObject*>(obj)->tables->messages.uuid.size());
}

struct BytesVisitor {
  size_t n = 0;
  template <class C> void operator()(C& c) { n += c.nbytes(); }
};

static PyObject* builder_nbytes(PyObject* obj, PyObject*) {
  BytesVisitor bv;
  each_column(*reinterpret_cast<BuilderObject*>(obj)->tables, bv);
  return PyLong_FromSize_t(bv.n);
}

static PyMethodDef builder_methods[] = {
    {"add_session", builder_add_session, METH_VARARGS, "Append one session's rows (or report why Python must)."},
    {"flush", builder_flush, METH_NOARGS, "Hand over the pending rows as Arrow buffers and start empty."},
    {"rows", builder_rows, METH_NOARGS, "Pending trace_messages rows."},
    {"nbytes", builder_nbytes, METH_NOARGS, "Bytes held by the pending rows."},
    {nullptr, nullptr, 0, nullptr},
};

static PyTypeObject BuilderType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "composer_pipeline.ingest._native.Builder";
  t.tp_basicsize = sizeof(BuilderObject);
  t.tp_dealloc = builder_dealloc;
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_doc = "Native ingest: sessions in, Arrow column buffers out.";
  t.tp_methods = builder_methods;
  t.tp_new = builder_new;
  return t;
}();

// ---- test hooks: the JSON and text helpers, exposed so the tests can compare them with Python ----
static PyObject* fn_canonical(PyObject*, PyObject* arg) {  // orjson.dumps(msgspec.json.decode(x)) or None
  char* s;
  Py_ssize_t n;
  if (PyBytes_AsStringAndSize(arg, &s, &n) < 0) return nullptr;
  Scanner sc(s, s + n);
  std::string out;
  Canon c(out);
  if (!c.value(sc) || sc.ws()) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize(out.data(), Py_ssize_t(out.size()));
}

static PyObject* fn_strip(PyObject*, PyObject* arg) {
  std::string s;
  if (!utf8_of(arg, s)) return nullptr;
  std::string_view r = py_strip(s);
  return PyUnicode_FromStringAndSize(r.data(), Py_ssize_t(r.size()));
}

static PyObject* fn_sha256_hex(PyObject*, PyObject* args) {
  char* s;
  Py_ssize_t n;
  int portable = 0;
  if (!PyArg_ParseTuple(args, "y#|p", &s, &n, &portable)) return nullptr;
  Sha256 h;
  h.set_portable(portable != 0);
  h.update(s, size_t(n));
  std::string d = h.hexdigest();
  return PyUnicode_FromStringAndSize(d.data(), Py_ssize_t(d.size()));
}

static PyObject* fn_utf8_valid(PyObject*, PyObject* arg) {
  char* s;
  Py_ssize_t n;
  if (PyBytes_AsStringAndSize(arg, &s, &n) < 0) return nullptr;
  return PyBool_FromLong(utf8_valid(reinterpret_cast<const unsigned char*>(s), size_t(n)));
}

static PyObject* fn_valid_line(PyObject*, PyObject* arg) {  // would the record parser read this line?
  char* s;
  Py_ssize_t n;
  if (PyBytes_AsStringAndSize(arg, &s, &n) < 0) return nullptr;
  std::vector<Block> blocks;
  Arena arena;
  RecordParser parser(blocks, arena);
  Rec r;
  return PyBool_FromLong(parser.parse(s, s + n, r));
}

static PyMethodDef module_methods[] = {
    {"canonical_json", fn_canonical, METH_O, "Canonical re-serialization of a JSON value (None: ask Python)."},
    {"py_strip", fn_strip, METH_O, "str.strip() as the native code implements it."},
    {"sha256_hex", fn_sha256_hex, METH_VARARGS, "SHA-256 hex digest (portable=True: without SHA-NI)."},
    {"utf8_valid", fn_utf8_valid, METH_O, "Strict UTF-8 check."},
    {"reads_line", fn_valid_line, METH_O, "Whether the native record parser reads this line."},
    {nullptr, nullptr, 0, nullptr},
};

static PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native", "Compiled ingest path (composer_pipeline/ingest/native.py).", -1,
    module_methods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace cp

PyMODINIT_FUNC PyInit__native(void) {
  if (PyType_Ready(&cp::BufType) < 0 || PyType_Ready(&cp::BuilderType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&cp::module_def);
  if (!m) return nullptr;
  Py_INCREF(&cp::BuilderType);
  if (PyModule_AddObject(m, "Builder", reinterpret_cast<PyObject*>(&cp::BuilderType)) < 0) {
    Py_DECREF(&cp::BuilderType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
