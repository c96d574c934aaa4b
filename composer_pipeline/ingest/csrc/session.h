// One session's records -> trace_messages / trace_states rows: the native twin of states.py.
//
// Every function here mirrors the Python function of the same name in states.py, rule for rule
// (the tests ingest every real trace, the bundled samples, the pitfall fixtures and randomly
// mutated sessions both ways and compare all three tables). Where the reference would apply
// Python's ``str()`` to a value that is not a string, or a value needs a float re-serialized, the
// session is handed back to Python (``bail``): rare, and exact by construction.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "columns.h"
#include "flatmap.h"
#include "json.h"
#include "records.h"
#include "sha256.h"

namespace cp {

struct MessagesCols {
  StrCol stream_id, session_key, uuid, parent_uuid, logical_parent_uuid, record_type, subtype, message_key, role;
  BoolCol is_meta, is_compact_summary, is_sidechain;
  StrCol source_file;
  I64Col line_no;
  StrCol timestamp, raw;

  template <class F> void each(F&& f) {
    f(stream_id); f(session_key); f(uuid); f(parent_uuid); f(logical_parent_uuid); f(record_type); f(subtype);
    f(message_key); f(role); f(is_meta); f(is_compact_summary); f(is_sidechain); f(source_file); f(line_no);
    f(timestamp); f(raw);
  }
};

struct StatesCols {
  StrCol state_id, session_id, session_key, stream_id, stream_kind, agent_id, parent_tool_use_id, source_file;
  ListCol<I64Col> source_lines;
  ListCol<StrCol> record_uuids;
  StrCol message_id, request_id, prefix_leaf_uuid;
  I64Col n_prefix_messages;
  StrCol action, error_after;
  BoolCol has_error;
  StrCol model, version, timestamp, usage;

  template <class F> void each(F&& f) {
    f(state_id); f(session_id); f(session_key); f(stream_id); f(stream_kind); f(agent_id); f(parent_tool_use_id);
    f(source_file); f(source_lines); f(record_uuids); f(message_id); f(request_id); f(prefix_leaf_uuid);
    f(n_prefix_messages); f(action); f(error_after); f(has_error); f(model); f(version); f(timestamp); f(usage);
  }
};

struct QuarantineCols {
  StrCol session_key, source_file;
  I64Col line_no;
  StrCol reason, text, salvaged_uuid, salvaged_parent_uuid;

  template <class F> void each(F&& f) {
    f(session_key); f(source_file); f(line_no); f(reason); f(text); f(salvaged_uuid); f(salvaged_parent_uuid);
  }
};

struct Tables {
  MessagesCols messages;
  StatesCols states;
  QuarantineCols quarantine;
};

// A string-or-None helper for nullable string columns.
inline void add_opt(StrCol& c, const Val& v) {
  if (v.is_str()) c.add(v.s);
  else c.add_null();
}

struct Bail {  // thrown to hand the session back to Python; ``reason`` is reported
  std::string reason;
};

// A line the secret scrubber changed: bytes [start, end) of the file (a whole line, without its
// newline) read as ``text`` instead (Python keeps the text alive for the call).
struct Splice {
  size_t start = 0, end = 0;
  const char* text = nullptr;
  size_t n = 0;
};

struct FileIn {
  std::string rel;  // relative to the trace root
  const char* data = nullptr;  // as read; with ``splices`` applied, the scrubbed file
  size_t size = 0;
  std::vector<Splice> splices;  // in file order
  bool is_main = false;
  std::string stream_id, kind, agent_id;  // agent files: computed by the Python side
};

struct FileOut {
  uint32_t lines = 0, records = 0, bad_lines = 0;
  std::vector<std::pair<std::string_view, uint32_t>> no_uuid;  // record type -> count, first seen first
  uint32_t states = 0, subagents_linked = 0, compactions_crossed = 0, warmup_dropped = 0, damaged_bridged = 0;
};

// A damaged line that looks like a record cut off before its uuid (parser.ParsedFile.cut).
struct Cut {
  uint32_t line_no = 0;
  Val parent;            // salvaged parentUuid (absent when unreadable)
  std::string_view raw;  // the line
  Val subtype;           // salvage.SALVAGED_RESULTS when the line still holds tool results, else absent
};

constexpr size_t kLeafScan = 256;  // parser.LEAF_SCAN

// parser._attach_point: among the kLeafScan records before recs[end], the nearest with flag ``side``
// that has no child; else ``nearest``, else ``other``.
inline Val attach_point(const std::vector<Rec>& recs, size_t end, int side, const FlatSet& named, const Val& nearest,
                        const Val& other) {
  const size_t stop = end > kLeafScan ? end - kLeafScan : 0;
  for (size_t j = end; j-- > stop;) {
    const Rec& q = recs[j];
    if (q.has_uuid() && int(q.is_sidechain) == side && !named.contains(q.uuid.s)) return q.uuid;
  }
  return nearest.is_str() ? nearest : other;
}

// parser.bridge_damaged: records whose parent names no record of the file get it back as a
// ``damaged`` pass-through record at the nearest earlier unused cut line (continuing through earlier
// cut lines while the salvaged parent names none); a damaged record whose parent reference is lost
// is attached where the damaged line most likely hung from, one whose isSidechain is lost takes the
// latest record's flag. Returns the bridges inserted.
inline uint32_t bridge_damaged(std::vector<Rec>& recs, const std::vector<Cut>& cut, bool any_lost,
                               uint32_t file_index) {
  if (cut.empty() && !any_lost) return 0;
  FlatSet known(recs.size());
  FlatSet named(recs.size());  // records that have a child
  for (const Rec& r : recs) {
    if (r.has_uuid()) known.try_emplace(r.uuid.s);
    if (r.parent.is_str() && !r.parent.s.empty()) named.try_emplace(r.parent.s);
  }
  struct Open {
    const Cut* c;
    size_t before;  // records before the cut line
    Val last[2];    // the latest record's uuid before the cut line: [main, sidechain]
  };
  std::vector<Open> unused;  // nearest last
  std::vector<Rec> bridges;
  Val last[2];
  const Val none;
  bool flag = false;  // isSidechain of the latest record
  size_t ci = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    Rec& r = recs[i];
    while (ci < cut.size() && cut[ci].line_no < r.line_no) {
      unused.push_back(Open{&cut[ci], i, {last[0], last[1]}});
      ++ci;
    }
    if (r.damaged && r.side_lost) r.is_sidechain = flag;
    const int side = r.is_sidechain ? 1 : 0;
    if (r.parent.is_none() && r.damaged && r.parent_lost) {
      r.parent = attach_point(recs, i, side, named, last[side], last[1 - side]);
      if (r.parent.is_str()) named.try_emplace(r.parent.s);
    } else if (r.parent.is_str() && !r.parent.s.empty() && !known.contains(r.parent.s) && !unused.empty()) {
      Val child = r.parent;
      for (;;) {
        Open o = unused.back();
        unused.pop_back();
        const Val salvaged = o.c->parent;
        const bool go_on = salvaged.is_str() && !known.contains(salvaged.s) && salvaged.s != child.s &&
                           !unused.empty();
        Rec b;
        b.type = "damaged";
        b.uuid = child;
        b.parent = (salvaged.is_str() && (go_on || known.contains(salvaged.s)))
                       ? salvaged
                       : attach_point(recs, o.before, side, named, o.last[side], none);
        b.is_sidechain = side == 1;
        b.subtype = o.c->subtype;
        b.damaged = true;
        b.raw = o.c->raw;
        b.line_no = o.c->line_no;
        b.file = file_index;
        known.try_emplace(child.s);
        if (b.parent.is_str()) named.try_emplace(b.parent.s);
        bridges.push_back(b);
        if (!go_on) break;
        child = salvaged;
      }
    }
    if (r.has_uuid()) {
      last[side] = r.uuid;
      flag = side == 1;
    }
  }
  if (bridges.empty()) return 0;
  // ``sorted(records + bridges, key=line_no)``: the records are in line order already and every line
  // number is unique, so the few bridges are merged in from the back (no sort of the whole file)
  std::sort(bridges.begin(), bridges.end(), [](const Rec& a, const Rec& b) { return a.line_no < b.line_no; });
  const size_t n = bridges.size();
  size_t i = recs.size(), j = n, k = recs.size() + n;
  recs.resize(k);
  while (j > 0) {
    if (i > 0 && recs[i - 1].line_no > bridges[j - 1].line_no) recs[--k] = recs[--i];
    else recs[--k] = bridges[--j];
  }
  return uint32_t(n);
}

struct Stream {
  std::string stream_id;
  std::string_view kind;  // main | inline_sidechain | sibling_agent_file | subagents_dir
  uint32_t file = 0;
  bool has_agent = false;
  std::string agent_id;
  bool has_parent_tool_use = false;
  std::string parent_tool_use_id;
  std::vector<Rec*> recs;
};

struct Options {
  bool compaction_full = false;
  bool drop_warmup = true;
};

using SV = std::string_view;

// ``s[:n]`` on a UTF-8 string in code points (stream ids use root[:8]).
inline std::string head_chars(SV s, size_t n) { return std::string(py_prefix(s, n)); }

// ---------------------------------------------------------------------------------------------------
// Python-semantics helpers over records.

// ``str(x or "")`` of an Any value that must be a string when truthy.
inline SV str_or_empty(const Val& v) {
  if (v.is_str()) return v.s;
  if (v.truthy) throw Bail{"str() of a non-string value"};
  return SV();
}

// decoded text of a JVal string, ``str(x or "")`` semantics
inline std::string text_or_empty(const JVal& v) {
  if (v.is_str()) return decoded(v);
  if (v.truthy) throw Bail{"str() of a non-string text"};
  return std::string();
}

// ``_first_text``: content string, or the concatenated text of its text blocks with string text
inline std::string first_text(const Rec& r, const std::vector<Block>& blocks) {
  if (!r.has_msg) return std::string();
  if (r.content == Content::Str) return decoded(r.content_str);
  std::string out;
  if (r.content == Content::List)
    for (uint32_t i = r.b0; i < r.b1; ++i) {
      const Block& b = blocks[i];
      if (b.btype == BType::Text && b.text.is_str()) decode_string(b.text, out);
    }
  return out;
}

// ---------------------------------------------------------------------------------------------------
class SessionBuild {
 public:
  SessionBuild(Tables& t, const Options& o, std::string key, std::string default_session_id, Arena& arena,
               std::vector<Block>& blocks)
      : t_(t), opts_(o), key_(std::move(key)), default_sid_(std::move(default_session_id)), arena_(arena),
        blocks_(blocks) {}

  // files[i] and recs[i]: records of each file in line order (damaged ones included)
  void run(std::vector<FileIn>& files, std::vector<std::vector<Rec>>& recs, std::vector<FileOut>& out) {
    files_ = &files;
    out_ = &out;
    std::vector<Stream> streams;
    Stream* main = nullptr;
    size_t first_agent = 0;
    if (!files.empty() && files[0].is_main) {
      split_main(0, recs[0], streams);
      first_agent = 1;
    }
    for (size_t i = first_agent; i < files.size(); ++i) {
      Stream s;
      s.stream_id = files[i].stream_id;
      s.kind = files[i].kind == "subagents_dir" ? SV("subagents_dir") : SV("sibling_agent_file");
      s.file = uint32_t(i);
      s.has_agent = true;
      s.agent_id = files[i].agent_id;
      for (Rec& r : recs[i])
        if (r.has_uuid()) s.recs.push_back(&r);
      streams.push_back(std::move(s));
    }
    if (first_agent == 1) main = &streams[0];
    std::vector<Stream*> kept;
    for (Stream& s : streams) {
      if (opts_.drop_warmup && s.kind != SV("main") && is_warmup(s)) {
        ++warmup_dropped_;
        (*out_)[s.file].warmup_dropped += 1;
        continue;
      }
      kept.push_back(&s);
    }
    if (main) link(kept, *main);
    session_id_ = session_id(recs);
    for (Stream* s : kept) {
      if (s->recs.empty()) continue;
      ++streams_;
      if (s->kind != SV("main") && s->has_parent_tool_use && !s->parent_tool_use_id.empty())
        (*out_)[s->file].subagents_linked += 1;
      emit_stream(*s);
    }
  }

  uint32_t streams_ = 0, warmup_dropped_ = 0, states_ = 0, messages_ = 0;

 private:
  // ---- streams ------------------------------------------------------------------------------------
  void split_main(uint32_t file, std::vector<Rec>& recs, std::vector<Stream>& streams) {
    Stream main;
    main.stream_id = key_ + ":main";
    main.kind = "main";
    main.file = file;
    FlatMap<Rec*> side_by_uuid;  // last record wins (a dict comprehension)
    for (Rec& r : recs)
      if (r.is_sidechain && r.has_uuid()) side_by_uuid[r.uuid.s] = &r;
    if (side_by_uuid.size() == 0) {
      main.recs.reserve(recs.size());
      for (Rec& r : recs)
        if (r.has_uuid()) main.recs.push_back(&r);
      streams.push_back(std::move(main));
      return;
    }
    FlatMap<SV> root_of;
    FlatMap<size_t> side_index;  // root -> index in sides (insertion order)
    std::vector<Stream> sides;
    std::vector<SV> chain;
    for (Rec& r : recs) {
      if (!r.has_uuid()) continue;
      if (!r.is_sidechain) {
        main.recs.push_back(&r);
        continue;
      }
      chain.clear();
      SV u = r.uuid.s;
      for (;;) {
        Rec** side = side_by_uuid.find(u);
        if (!side || root_of.contains(u) || std::find(chain.begin(), chain.end(), u) != chain.end()) break;
        chain.push_back(u);
        const Val& p = (*side)->parent;
        if (!p.is_str() || !side_by_uuid.contains(p.s)) break;
        u = p.s;
      }
      SV* known = root_of.find(u);
      SV root = known ? *known : (!chain.empty() ? chain.back() : r.uuid.s);
      for (SV c : chain) root_of[c] = root;
      auto [si, fresh] = side_index.try_emplace(root);
      if (fresh) {
        Stream s;
        s.stream_id = key_ + ":side-" + head_chars(root, 8);
        s.kind = "inline_sidechain";
        s.file = file;
        *si = sides.size();
        sides.push_back(std::move(s));
      }
      sides[*si].recs.push_back(&r);
    }
    streams.push_back(std::move(main));
    for (Stream& s : sides) streams.push_back(std::move(s));
  }

  bool is_warmup(const Stream& s) const {
    for (const Rec* r : s.recs)
      if (r->rtype == RType::User) return py_strip(first_text(*r, blocks_)) == SV("Warmup");
    return false;
  }

  void link(std::vector<Stream*>& streams, Stream& main) {
    std::unordered_map<std::string, std::string> by_agent;  // first wins (setdefault)
    std::unordered_map<std::string, std::vector<std::string>> prompts;
    std::unordered_map<std::string, size_t> prompt_next;
    for (Rec* rp : main.recs) {
      const Rec& r = *rp;
      if (r.rtype == RType::Progress) {
        if (r.has_data && r.data_agent_id.truthy && r.parent_tool_use_id.truthy) {
          if (!r.data_agent_id.is_str() || !r.parent_tool_use_id.is_str()) throw Bail{"non-string agent link"};
          by_agent.emplace(std::string(r.data_agent_id.s), std::string(r.parent_tool_use_id.s));
        }
      } else if (r.rtype == RType::User) {
        const JVal& tur = r.tool_use_result;
        if (tur.present() && r.raw.find("\"agentId\"") != SV::npos) {
          Val agent = tur_agent_id(tur);
          if (agent.truthy) {
            if (!agent.is_str()) throw Bail{"non-string agentId"};
            if (r.has_msg && r.content == Content::List) {
              const Block* first = nullptr;
              for (uint32_t i = r.b0; i < r.b1; ++i)
                if (blocks_[i].btype == BType::ToolResult) { first = &blocks_[i]; break; }
              if (first) {
                if (!first->tool_use_id.is_str()) throw Bail{"non-string tool_use_id"};
                by_agent.emplace(std::string(agent.s), std::string(first->tool_use_id.s));
              }
            }
          }
        }
      } else if (r.rtype == RType::Assistant) {
        if (r.has_msg && r.content == Content::List)
          for (uint32_t i = r.b0; i < r.b1; ++i) {
            const Block& b = blocks_[i];
            if (b.btype != BType::ToolUse || !(b.name.eq("Task") || b.name.eq("Agent"))) continue;
            if (b.input.kind != Kind::Object) continue;
            JVal prompt = object_member(b.input, "prompt");
            if (!prompt.is_str()) continue;
            if (!b.id.is_str()) throw Bail{"non-string tool_use id"};
            prompts[std::string(py_strip(decoded(prompt)))].push_back(std::string(b.id.s));
          }
      }
    }
    for (Stream* s : streams) {
      if (s->kind == SV("sibling_agent_file") || s->kind == SV("subagents_dir")) {
        auto it = by_agent.find(s->agent_id);
        if (it != by_agent.end()) {
          s->has_parent_tool_use = true;
          s->parent_tool_use_id = it->second;
        }
      } else if (s->kind == SV("inline_sidechain")) {
        const Rec* first = nullptr;
        for (const Rec* r : s->recs)
          if (r->rtype == RType::User) { first = r; break; }
        if (!first) continue;
        std::string text(py_strip(first_text(*first, blocks_)));
        auto it = prompts.find(text);
        if (it == prompts.end()) continue;
        size_t& next = prompt_next[text];
        if (next < it->second.size()) {
          s->has_parent_tool_use = true;
          s->parent_tool_use_id = it->second[next++];
        }
      }
    }
  }

  // ``tur.get("agentId")`` when the toolUseResult is an object (the last such key wins)
  static Val tur_agent_id(const JVal& tur) {
    Val out;
    if (tur.kind != Kind::Object) return out;
    JVal v = object_member(tur, "agentId");
    out.kind = v.kind;
    out.truthy = v.truthy;
    if (v.is_str()) {
      // a decoded copy lives as long as the session: keep it in a static-free way via the caller's arena
      out.s = SV(v.p, v.n);
      if (v.esc) throw Bail{"escaped agentId"};
    }
    return out;
  }

  // The value of ``key`` in a validated object span (the last occurrence); absent if missing.
  static JVal object_member(const JVal& obj, SV key) {
    Scanner s(obj.p, obj.p + obj.n);
    JVal found, v;
    s.members([&](const JVal& k) {
      bool match = k.esc ? decoded(k) == key : SV(k.p, k.n) == key;
      if (!s.value(v)) return false;
      if (match) found = v;
      return true;
    });
    return found;
  }

  std::string session_id(std::vector<std::vector<Rec>>& recs) {
    std::string sid;
    bool have = false;
    for (auto& file : recs) {
      for (Rec& r : file)
        if (r.session_id.is_str()) {
          sid = std::string(r.session_id.s);
          have = true;
          break;
        }
      if (have && !sid.empty()) break;
    }
    return (have && !sid.empty()) ? sid : default_sid_;
  }

  // ---- the per-stream index (states.py _StreamIndex) -------------------------------------------------
  struct Index {
    explicit Index(size_t n) : by_uuid(n), key(n), tools_of_key(n / 4), n_tools_of_key(n / 4), tool_uses(n / 4),
                               results(n / 4), group_of(n) {}
    FlatMap<Rec*> by_uuid;  // first record wins
    FlatMap<SV> key;        // uuid -> message key (assistant records; last wins)
    FlatMap<std::vector<SV>> tools_of_key;
    FlatMap<uint32_t> n_tools_of_key;
    FlatSet tool_uses;
    FlatMap<std::pair<Rec*, const Block*>> results;  // first wins
    FlatSet synthetic;
    std::vector<std::pair<size_t, Val>> fixes;  // (record index, subtype) where not the record's own
    std::vector<std::pair<SV, std::vector<Rec*>>> groups;  // message key -> records, first appearance order
    FlatMap<size_t> group_of;
    uint32_t compactions = 0;
  };

  // ``(m.id if m else None) or r.request_id or r.uuid`` as a string
  static SV message_key(const Rec& r) {
    if (r.has_msg && r.msg_id.truthy) {
      if (!r.msg_id.is_str()) throw Bail{"non-string message id"};
      return r.msg_id.s;
    }
    if (r.request_id.truthy) {
      if (!r.request_id.is_str()) throw Bail{"non-string requestId"};
      return r.request_id.s;
    }
    return r.uuid.s;  // truthy: stream records have a uuid
  }

  void build_index(Stream& s, Index& ix) {
    for (auto it = s.recs.rbegin(); it != s.recs.rend(); ++it) ix.by_uuid[(*it)->uuid.s] = *it;
    for (size_t i = 0; i < s.recs.size(); ++i) {
      Rec& r = *s.recs[i];
      if (r.rtype == RType::Assistant) {
        SV k = message_key(r);
        ix.key[r.uuid.s] = k;
        if (r.api_error || (r.has_msg && r.model.eq("<synthetic>"))) {
          ix.synthetic.try_emplace(k);
          Val st;
          st.kind = Kind::String;
          st.s = "synthetic";
          ix.fixes.emplace_back(i, st);
        }
        if (r.has_msg && r.content == Content::List)
          for (uint32_t b = r.b0; b < r.b1; ++b) {
            const Block& bl = blocks_[b];
            if (bl.btype != BType::ToolUse) continue;
            if (!bl.id.is_str()) throw Bail{"non-string tool_use id"};
            ix.tool_uses.try_emplace(bl.id.s);
            auto& own = ix.tools_of_key[k];
            if (std::find(own.begin(), own.end(), bl.id.s) == own.end()) own.push_back(bl.id.s);
            ix.n_tools_of_key[k] += 1;
          }
      } else if (r.rtype == RType::User) {
        if (r.has_msg && r.content == Content::List)
          for (uint32_t b = r.b0; b < r.b1; ++b) {
            const Block& bl = blocks_[b];
            if (bl.btype != BType::ToolResult) continue;
            if (!bl.tool_use_id.is_str()) throw Bail{"non-string tool_use_id"};
            auto [slot, fresh] = ix.results.try_emplace(bl.tool_use_id.s);
            if (fresh) *slot = std::make_pair(&r, &bl);
          }
      } else if (r.rtype == RType::Progress) {
        if (r.has_data) ix.fixes.emplace_back(i, r.data_type);
      } else if (r.rtype == RType::Attachment) {
        if (r.has_attachment) ix.fixes.emplace_back(i, r.attachment_type);
      } else if (r.rtype == RType::System) {
        if (r.subtype.eq("compact_boundary") && r.logical_parent.is_str() && ix.by_uuid.contains(r.logical_parent.s))
          ix.compactions += 1;
      }
    }
    for (Rec* r : s.recs) {
      SV* k = ix.key.find(r->uuid.s);
      if (!k) continue;
      auto [g, fresh] = ix.group_of.try_emplace(*k);
      if (fresh) {
        *g = ix.groups.size();
        ix.groups.emplace_back(*k, std::vector<Rec*>{r});
      } else {
        ix.groups[*g].second.push_back(r);
      }
    }
  }

  // ---- prefix counts (states.py _prefix_counts) -------------------------------------------------------
  struct Counts {
    SessionBuild& sb;
    Stream& s;
    Index& ix;
    FlatMap<int64_t> memo;
    int depth = 0;

    bool has_user_parts(const Rec& r) const {
      if (!r.has_msg) return false;
      if (r.content == Content::Str) return r.content_str.truthy;
      if (r.content != Content::List) return false;
      for (uint32_t i = r.b0; i < r.b1; ++i) {
        const Block& b = sb.blocks_[i];
        if (b.btype == BType::Text) {
          if (b.text.truthy) return true;
        } else if (b.btype != BType::ToolResult || !b.tool_use_id.is_str() || !ix.tool_uses.contains(b.tool_use_id.s)) {
          return true;  // image, unknown block type, or an orphan tool result
        }
      }
      return false;
    }

    int64_t assistant(const Rec& r) const {
      const SV* kp = ix.key.find(r.uuid.s);
      if (!kp || ix.synthetic.contains(*kp)) return 0;
      SV k = *kp;
      static const std::vector<SV> empty;
      const std::vector<SV>* op = ix.tools_of_key.find(k);
      const std::vector<SV>& own = op ? *op : empty;
      Val u = r.parent;
      int hops = 0;
      while (u.is_str() && !u.s.empty() && hops < 10000) {
        ++hops;
        Rec* const* pp = ix.by_uuid.find(u.s);
        if (!pp) break;
        const Rec& p = **pp;
        if (p.rtype == RType::Assistant) {
          const SV* pk = ix.key.find(p.uuid.s);
          if (pk && *pk == k) return 0;
          if (!pk || !ix.synthetic.contains(*pk)) break;
        } else if (p.rtype == RType::User) {
          bool all_own = p.has_msg && p.content == Content::List && p.b1 > p.b0;
          if (all_own)
            for (uint32_t i = p.b0; i < p.b1; ++i) {
              const Block& b = sb.blocks_[i];
              if (b.btype != BType::ToolResult || !b.tool_use_id.is_str() ||
                  std::find(own.begin(), own.end(), b.tool_use_id.s) == own.end()) {
                all_own = false;
                break;
              }
            }
          if (!all_own) break;
        }
        u = p.parent;
      }
      const uint32_t* n = ix.n_tools_of_key.find(k);
      return 1 + (n ? *n : 0);
    }

    int64_t user(const Rec& r, int64_t crossed) const {
      if (r.is_meta || (crossed && r.is_compact_summary)) return 0;
      return has_user_parts(r) ? 1 : 0;
    }

    int64_t contrib(const Rec& r, int64_t crossed) const {
      if (r.rtype == RType::Assistant) return assistant(r);
      if (r.rtype == RType::User) return user(r, crossed);
      return 0;
    }

    int64_t value(Val start) {
      if (++depth > 64) throw Bail{"compaction chain too deep"};
      std::vector<Rec*> stack;
      FlatSet seen;
      int64_t base = 2;  // the system prompt, not crossed
      Val u = start;
      while (u.is_str()) {
        const int64_t* known = memo.find(u.s);
        if (known) { base = *known; break; }
        Rec* const* rp = ix.by_uuid.find(u.s);
        if (!rp || seen.contains(u.s)) break;
        seen.try_emplace(u.s);
        Rec& r = **rp;
        if (r.rtype == RType::System && r.subtype.eq("compact_boundary")) {
          const Val& lp = r.logical_parent;
          int64_t m;
          if (sb.opts_.compaction_full && lp.is_str() && ix.by_uuid.contains(lp.s) && !seen.contains(lp.s))
            m = (value(lp) & ~int64_t(1)) | 1;
          else
            m = 2;
          memo[u.s] = m;
          base = m;
          break;
        }
        stack.push_back(&r);
        u = r.parent;
      }
      int64_t v = base;
      int64_t crossed = v & 1;
      for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
        v += 2 * contrib(**it, crossed);
        memo[(*it)->uuid.s] = v;
      }
      --depth;
      return v;
    }

    void run() {
      memo.reserve(s.recs.size());
      for (Rec* rp : s.recs) {
        SV u = rp->uuid.s;
        if (memo.contains(u)) continue;
        Rec& r = **ix.by_uuid.find(u);  // the first record with this uuid, as value() resolves it
        const Val& p = r.parent;
        if (p.is_str() && p.s != u) {
          const int64_t* known = memo.find(p.s);
          if (known) {  // records come parent-first: one step on a known parent
            int64_t v = *known;
            if (r.rtype == RType::User) { memo[u] = v + 2 * user(r, v & 1); continue; }
            if (r.rtype == RType::Assistant) { memo[u] = v + 2 * assistant(r); continue; }
            if (r.type != SV("system")) { memo[u] = v; continue; }
          }
        }
        value(r.uuid);
      }
    }
  };

  // ---- text of a tool result (render.flatten_content) -------------------------------------------------
  // Appends flatten_content(decoded value) to ``out``.
  void flatten(const JVal& v, std::string& out) {
    switch (v.kind) {
      case Kind::Absent: case Kind::Null: return;
      case Kind::String: decode_string(v, out); return;
      case Kind::Array: {
        Scanner s(v.p, v.p + v.n);
        bool any = false;
        JVal item;
        s.elements([&] {
          if (!s.value(item)) return false;
          if (item.kind == Kind::String) {
            if (any) out.push_back('\n');
            any = true;
            decode_string(item, out);
          } else if (item.kind == Kind::Object) {
            if (any) out.push_back('\n');
            any = true;
            JVal t = object_member(item, "type");
            if (t.is_str()) {
              std::string type = decoded(t);
              if (type == "text") {
                out += text_or_empty(object_member(item, "text"));
              } else if (type == "image") {
                out += "[image]";
              } else if (type == "tool_result") {
                flatten(object_member(item, "content"), out);
              } else {
                out += "[" + type + "]";
              }
            } else if (t.is_none()) {
              out += "[None]";
            } else {
              throw Bail{"non-string content block type"};
            }
          }
          return true;
        });
        return;
      }
      default: {  // number, bool, object: orjson.dumps(content).decode()
        std::string tmp;
        Canon c(tmp);
        Scanner s(v.p, v.p + v.n);
        if (!c.value(s)) throw Bail{"content needs Python to re-serialize"};
        out += tmp;
        return;
      }
    }
  }

  static void canon_into(std::string& out, const JVal& v) {
    Canon c(out);
    Scanner s(v.p, v.p + v.n);
    if (!c.value(s)) throw Bail{"a value needs Python to re-serialize (float, big integer or repeated key)"};
  }

  // ---- emit (states.py _emit_stream) -------------------------------------------------------------------
  void emit_stream(Stream& s) {
    Index ix(s.recs.size());
    build_index(s, ix);
    const FileIn& f = (*files_)[s.file];
    MessagesCols& m = t_.messages;
    size_t n = s.recs.size();
    messages_ += uint32_t(n);
    std::vector<const Val*> subtypes(n);
    for (size_t i = 0; i < n; ++i) subtypes[i] = &s.recs[i]->subtype;
    for (auto& fx : ix.fixes) subtypes[fx.first] = &fx.second;
    for (size_t i = 0; i < n; ++i) {
      const Rec& r = *s.recs[i];
      m.stream_id.add(s.stream_id);
      m.session_key.add(key_);
      m.uuid.add(r.uuid.s);
      add_opt(m.parent_uuid, r.parent);
      add_opt(m.logical_parent_uuid, r.logical_parent);
      m.record_type.add(r.type);
      add_opt(m.subtype, *subtypes[i]);
      const SV* k = ix.key.find(r.uuid.s);
      if (r.damaged || !k) m.message_key.add_null();
      else m.message_key.add(*k);
      if (r.has_msg) add_opt(m.role, r.role);
      else m.role.add_null();
      m.is_meta.add(r.is_meta);
      m.is_compact_summary.add(r.is_compact_summary);
      m.is_sidechain.add(r.is_sidechain);
      m.source_file.add(f.rel);
      m.line_no.add(r.line_no);
      add_opt(m.timestamp, r.timestamp);
      m.raw.add(r.raw);
    }
    if (ix.compactions) (*out_)[s.file].compactions_crossed += ix.compactions;

    Counts counts{*this, s, ix, FlatMap<int64_t>(s.recs.size()), 0};
    counts.run();

    StatesCols& st = t_.states;
    uint32_t nstates = 0;
    Sha256 base;  // the id prefix "<session_key>|<stream_id>|", hashed once per stream
    base.update(key_);
    base.update("|", 1);
    base.update(s.stream_id);
    base.update("|", 1);
    FlatSet own;
    std::string& text_buf = text_buf_;
    for (auto& g : ix.groups) {
      SV k = g.first;
      if (ix.synthetic.contains(k)) continue;
      ++nstates;
      std::vector<Rec*>& grp = g.second;
      const Rec& first = *grp.front();
      const Rec& last = *grp.back();
      Val leaf = first.parent;
      if (grp.size() > 1) {
        own.clear();
        for (Rec* r : grp) own.try_emplace(r->uuid.s);
        size_t hops = 0;
        while (leaf.is_str() && own.contains(leaf.s) && hops < grp.size()) {
          leaf = (*ix.by_uuid.find(leaf.s))->parent;
          ++hops;
        }
      }
      Sha256 hasher = base;
      hasher.update(k);
      st.state_id.add(hasher.hexdigest(20));
      st.session_id.add(session_id_);
      st.session_key.add(key_);
      st.stream_id.add(s.stream_id);
      st.stream_kind.add(s.kind);
      if (s.has_agent) st.agent_id.add(s.agent_id);
      else st.agent_id.add_null();
      if (s.has_parent_tool_use) st.parent_tool_use_id.add(s.parent_tool_use_id);
      else st.parent_tool_use_id.add_null();
      st.source_file.add(f.rel);
      for (Rec* r : grp) st.source_lines.child.add(r->line_no);
      st.source_lines.close();
      for (Rec* r : grp) st.record_uuids.child.add(r->uuid.s);
      st.record_uuids.close();
      if (first.has_msg && first.msg_id.is_str()) st.message_id.add(first.msg_id.s);
      else st.message_id.add_null();
      add_opt(st.request_id, first.request_id);
      add_opt(st.prefix_leaf_uuid, leaf);
      int64_t npre = 1;
      if (leaf.is_str()) {
        const int64_t* c = counts.memo.find(leaf.s);
        if (c) npre = *c >> 1;
      }
      st.n_prefix_messages.add(npre);

      // action (states.py action_json_of) and error_after
      // text: "\n".join(t for t in texts if t and not t.isspace()).strip(); thinking: "\n".join(...).strip()
      std::vector<const Block*>& calls = calls_;
      calls.clear();
      text_buf.clear();
      thinking_buf_.clear();
      bool any_text = false, any_thinking = false;
      for (Rec* r : grp) {
        if (!r->has_msg || r->content != Content::List) continue;
        for (uint32_t b = r->b0; b < r->b1; ++b) {
          const Block& bl = blocks_[b];
          if (bl.btype == BType::Text) {
            scratch_.clear();
            if (bl.text.is_str()) decode_string(bl.text, scratch_);
            else if (bl.text.truthy) throw Bail{"str() of a non-string text"};
            if (scratch_.empty() || py_isspace(scratch_)) continue;
            if (any_text) text_buf.push_back('\n');
            any_text = true;
            text_buf += scratch_;
          } else if (bl.btype == BType::Thinking) {
            if (any_thinking) thinking_buf_.push_back('\n');
            any_thinking = true;
            if (bl.thinking.is_str()) decode_string(bl.thinking, thinking_buf_);
            else if (bl.thinking.truthy) throw Bail{"str() of a non-string thinking"};
          } else if (bl.btype == BType::ToolUse) {
            calls.push_back(&bl);
          }
        }
      }
      std::string& a = st.action.buffer();
      a += "{\"text\":";
      write_json_string(a, py_strip(text_buf));
      a += ",\"thinking\":";
      write_json_string(a, py_strip(thinking_buf_));
      a += ",\"tool_calls\":[";
      for (size_t i = 0; i < calls.size(); ++i) {
        const Block& b = *calls[i];
        if (i) a.push_back(',');
        a += "{\"id\":";
        write_json_string(a, str_or_empty(b.id));
        a += ",\"name\":";
        write_json_string(a, str_or_empty(b.name));
        a += ",\"arguments\":";
        if (b.input.kind == Kind::Object) {
          canon_into(a, b.input);
        } else {
          a += "{\"input\":";
          if (b.input.is_none()) a += "null";
          else canon_into(a, b.input);
          a.push_back('}');
        }
        a.push_back('}');
      }
      a += "]}";
      st.action.commit();

      bool has_errors = false;
      std::string errors;
      for (const Block* c : calls) {
        SV id = str_or_empty(c->id);
        const auto* res = ix.results.find(id);
        if (!res) continue;
        const Rec& rr = *res->first;
        const Block& rb = *res->second;
        std::string tur_text;
        bool tur_is_str = rr.tool_use_result.is_str();
        if (tur_is_str) tur_text = decoded(rr.tool_use_result);
        if (!(rb.is_error || (tur_is_str && contains_error_ci(tur_text)))) continue;
        std::string text;
        flatten(rb.content, text);
        if (text.empty()) text = tur_text;  // ``or _tool_use_result_text(...) or ""``
        errors += has_errors ? "," : "[";
        has_errors = true;
        errors += "{\"tool_use_id\":";
        write_json_string(errors, id);
        errors += ",\"tool_name\":";
        write_json_string(errors, str_or_empty(c->name));
        errors += ",\"content\":";
        write_json_string(errors, py_prefix(text, 2000));
        errors += "}";
      }
      if (has_errors) {
        errors += "]";
        st.error_after.add(errors);
      } else {
        st.error_after.add_null();
      }
      st.has_error.add(has_errors);
      const Val* model = nullptr;
      if (last.has_msg && last.model.is_str() && !last.model.s.empty()) model = &last.model;
      else if (first.has_msg) model = &first.model;
      if (model) add_opt(st.model, *model);
      else st.model.add_null();
      add_opt(st.version, last.version);
      add_opt(st.timestamp, first.timestamp);
      if (last.has_msg && !last.usage.is_none()) {
        canon_into(st.usage.buffer(), last.usage);
        st.usage.commit();
      } else {
        st.usage.add_null();
      }
    }
    if (nstates) (*out_)[s.file].states += nstates;
    states_ += nstates;
  }

  Tables& t_;
  const Options& opts_;
  std::string key_, default_sid_, session_id_;
  Arena& arena_;
  std::vector<Block>& blocks_;
  std::vector<FileIn>* files_ = nullptr;
  std::string text_buf_, thinking_buf_, scratch_;
  std::vector<const Block*> calls_;
  std::vector<FileOut>* out_ = nullptr;
};

}  // namespace cp
