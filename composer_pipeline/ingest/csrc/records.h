// One JSONL line -> Rec: the native twin of parser.py's typed ``Record`` and ``record_from_obj``.
//
// Same reading rules as the Python reference: only the keys ingest uses are read (everything
// else is validated and skipped); a key declared ``str | None`` with a value of another type reads
// as absent; "Any" keys keep their kind so the session code can apply Python's truthiness and
// ``str()`` rules (or hand the session to Python where ``str()`` of a non-string would be needed);
// a repeated key: the last one wins (as in msgspec and in a Python dict).
#pragma once

#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "json.h"

namespace cp {

// Owned storage for decoded strings that had escapes (and damaged lines' text).
struct Arena {
  std::deque<std::string> strs;
  std::string_view keep(std::string&& s) {
    strs.push_back(std::move(s));
    return strs.back();
  }
  void clear() { strs.clear(); }
};

// A scalar as ingest reads it: the decoded string (kind String) or just its kind and truthiness.
struct Val {
  std::string_view s;
  Kind kind = Kind::Absent;
  bool truthy = false;

  bool is_str() const { return kind == Kind::String; }
  bool is_none() const { return kind == Kind::Absent || kind == Kind::Null; }
  bool eq(std::string_view x) const { return kind == Kind::String && s == x; }
};

inline Val make_val(const JVal& v, Arena& arena) {
  Val out;
  out.kind = v.kind;
  out.truthy = v.truthy;
  if (v.kind == Kind::String) out.s = v.esc ? arena.keep(decoded(v)) : std::string_view(v.p, v.n);
  return out;
}

// ``str | None`` keys: a value of another type reads as absent.
inline Val str_or_absent(const JVal& v, Arena& arena) {
  if (v.kind != Kind::String) return Val{};
  return make_val(v, arena);
}

enum class BType : uint8_t { Text, Thinking, ToolUse, ToolResult, Other };

struct Block {
  BType btype = BType::Other;
  Val type, id, name, tool_use_id;
  JVal text, thinking, input, content;  // kept undecoded; absent when the key is missing
  bool is_error = false;                 // ``is_error is True``
};

enum class Content : uint8_t { None, Str, List };

// The record types the session code branches on (the string itself is kept in ``type``).
enum class RType : uint8_t { User, Assistant, System, Progress, Attachment, Other };

inline RType rtype_of(std::string_view t) {
  switch (t.size()) {
    case 4: return t == "user" ? RType::User : RType::Other;
    case 6: return t == "system" ? RType::System : RType::Other;
    case 8: return t == "progress" ? RType::Progress : RType::Other;
    case 9: return t == "assistant" ? RType::Assistant : RType::Other;
    case 10: return t == "attachment" ? RType::Attachment : RType::Other;
    default: return RType::Other;
  }
}

struct Rec {
  std::string_view raw;  // the scrubbed line (a damaged record: its text)
  uint32_t line_no = 0;
  uint32_t file = 0;
  std::string_view type = "<none>";
  RType rtype = RType::Other;
  Val uuid, parent, logical_parent, timestamp, version;  // str | None
  Val subtype, session_id, request_id, parent_tool_use_id;  // Any
  bool is_sidechain = false, is_meta = false, is_compact_summary = false, api_error = false;  // ``is True``
  bool damaged = false;
  bool parent_lost = false;  // a damaged record whose own parent reference is unreadable (ParsedFile.parent_lost)
  bool side_lost = false;    // ... whose isSidechain is unreadable (ParsedFile.side_lost)
  // message
  bool has_msg = false;
  Val msg_id, role, model;  // id: Any; role/model: str | None
  Content content = Content::None;
  JVal content_str;
  uint32_t b0 = 0, b1 = 0;  // blocks [b0, b1) in the session's block vector
  JVal usage;
  JVal tool_use_result;
  bool has_data = false, has_attachment = false;
  Val data_type, data_agent_id, attachment_type;

  bool has_uuid() const { return uuid.is_str() && !uuid.s.empty(); }  // ``if r.uuid``
};

// ---- key ids -------------------------------------------------------------------------------------
enum Key : uint8_t {
  K_OTHER, K_TYPE, K_UUID, K_PARENT, K_LOGICAL_PARENT, K_IS_SIDECHAIN, K_IS_META, K_IS_COMPACT_SUMMARY,
  K_SUBTYPE, K_SESSION_ID, K_TIMESTAMP, K_VERSION, K_REQUEST_ID, K_API_ERROR, K_PARENT_TOOL_USE_ID,
  K_MESSAGE, K_TOOL_USE_RESULT, K_DATA, K_ATTACHMENT,
  // message / block / data keys
  K_ID, K_ROLE, K_MODEL, K_CONTENT, K_USAGE, K_TEXT, K_THINKING, K_NAME, K_INPUT, K_TOOL_USE_ID, K_IS_ERROR,
  K_AGENT_ID,
};

struct KeyName { std::string_view name; Key key; };

// Names bucketed by length: a lookup compares against the one or two names of that length.
class KeyIndex {
 public:
  template <size_t N>
  explicit KeyIndex(const KeyName (&table)[N]) {
    for (size_t i = 0; i < N; ++i)
      if (table[i].name.size() < kMaxLen) by_len_[table[i].name.size()].push_back(table[i]);
  }
  Key operator()(std::string_view k) const {
    if (k.size() >= kMaxLen) return K_OTHER;
    for (const KeyName& e : by_len_[k.size()])
      if (e.name[0] == k[0] && e.name[k.size() - 1] == k[k.size() - 1] &&
          std::memcmp(e.name.data(), k.data(), k.size()) == 0)
        return e.key;
    return K_OTHER;
  }

 private:
  static constexpr size_t kMaxLen = 24;
  std::vector<KeyName> by_len_[kMaxLen];
};

inline const KeyName kRecordKeys[] = {
    {"type", K_TYPE}, {"uuid", K_UUID}, {"parentUuid", K_PARENT}, {"logicalParentUuid", K_LOGICAL_PARENT},
    {"isSidechain", K_IS_SIDECHAIN}, {"isMeta", K_IS_META}, {"isCompactSummary", K_IS_COMPACT_SUMMARY},
    {"subtype", K_SUBTYPE}, {"sessionId", K_SESSION_ID}, {"timestamp", K_TIMESTAMP}, {"version", K_VERSION},
    {"requestId", K_REQUEST_ID}, {"isApiErrorMessage", K_API_ERROR}, {"parentToolUseID", K_PARENT_TOOL_USE_ID},
    {"message", K_MESSAGE}, {"toolUseResult", K_TOOL_USE_RESULT}, {"data", K_DATA}, {"attachment", K_ATTACHMENT},
};
inline const KeyName kMessageKeys[] = {
    {"id", K_ID}, {"role", K_ROLE}, {"model", K_MODEL}, {"content", K_CONTENT}, {"usage", K_USAGE},
};
inline const KeyName kBlockKeys[] = {
    {"type", K_TYPE}, {"text", K_TEXT}, {"thinking", K_THINKING}, {"id", K_ID}, {"name", K_NAME},
    {"input", K_INPUT}, {"tool_use_id", K_TOOL_USE_ID}, {"is_error", K_IS_ERROR}, {"content", K_CONTENT},
};
inline const KeyName kDataKeys[] = {{"type", K_TYPE}, {"agentId", K_AGENT_ID}};
inline const KeyName kAttachmentKeys[] = {{"type", K_TYPE}};

inline const KeyIndex kRecordIndex(kRecordKeys), kMessageIndex(kMessageKeys), kBlockIndex(kBlockKeys),
    kDataIndex(kDataKeys), kAttachmentIndex(kAttachmentKeys);

inline Key key_of(const JVal& k, const KeyIndex& index) {
  if (k.n == 0) return K_OTHER;
  if (!k.esc) return index(std::string_view(k.p, k.n));
  std::string d = decoded(k);
  return d.empty() ? K_OTHER : index(d);
}

// ---- the parser -----------------------------------------------------------------------------------
class RecordParser {
 public:
  RecordParser(std::vector<Block>& blocks, Arena& arena) : blocks_(blocks), arena_(arena) {}

  // false: not a record this parser can read (invalid JSON, not an object, too deep): the caller
  // asks Python about the line. Blocks appended by a failed parse are removed again.
  bool parse(const char* b, const char* e, Rec& r) {
    size_t nblocks = blocks_.size();
    Scanner s(b, e);
    if (!record(s, r) || (s.ws() && s.p != s.end)) {
      blocks_.resize(nblocks);
      return false;
    }
    r.rtype = rtype_of(r.type);
    return true;
  }

 private:
  bool record(Scanner& s, Rec& r) {
    if (!s.ws()) return false;
    JVal v;
    return s.members([&](const JVal& k) {
      Key key = key_of(k, kRecordIndex);
      if (key == K_MESSAGE) return message(s, r);
      if (key == K_DATA || key == K_ATTACHMENT) return small_object(s, r, key);
      if (!s.value(v)) return false;
      switch (key) {
        case K_TYPE: r.type = v.is_str() ? (v.esc ? arena_.keep(decoded(v)) : std::string_view(v.p, v.n))
                                         : std::string_view("<none>"); break;
        case K_UUID: r.uuid = str_or_absent(v, arena_); break;
        case K_PARENT: r.parent = str_or_absent(v, arena_); break;
        case K_LOGICAL_PARENT: r.logical_parent = str_or_absent(v, arena_); break;
        case K_TIMESTAMP: r.timestamp = str_or_absent(v, arena_); break;
        case K_VERSION: r.version = str_or_absent(v, arena_); break;
        case K_IS_SIDECHAIN: r.is_sidechain = v.is_true(); break;
        case K_IS_META: r.is_meta = v.is_true(); break;
        case K_IS_COMPACT_SUMMARY: r.is_compact_summary = v.is_true(); break;
        case K_API_ERROR: r.api_error = v.is_true(); break;
        case K_SUBTYPE: r.subtype = make_val(v, arena_); break;
        case K_SESSION_ID: r.session_id = make_val(v, arena_); break;
        case K_REQUEST_ID: r.request_id = make_val(v, arena_); break;
        case K_PARENT_TOOL_USE_ID: r.parent_tool_use_id = make_val(v, arena_); break;
        case K_TOOL_USE_RESULT: r.tool_use_result = v; break;
        default: break;
      }
      return true;
    });
  }

  // "message": an object -> Message (all its fields reset: the last "message" key wins); any other
  // value -> None.
  bool message(Scanner& s, Rec& r) {
    r.has_msg = false;
    r.msg_id = r.role = r.model = Val{};
    r.content = Content::None;
    r.content_str = JVal{};
    r.b0 = r.b1 = 0;
    r.usage = JVal{};
    JVal v;
    if (*s.p != '{') return s.value(v);
    r.has_msg = true;
    return s.members([&](const JVal& k) {
      Key key = key_of(k, kMessageIndex);
      if (key == K_CONTENT) return content(s, r);
      if (!s.value(v)) return false;
      switch (key) {
        case K_ID: r.msg_id = make_val(v, arena_); break;
        case K_ROLE: r.role = str_or_absent(v, arena_); break;
        case K_MODEL: r.model = str_or_absent(v, arena_); break;
        case K_USAGE: r.usage = v; break;
        default: break;
      }
      return true;
    });
  }

  // "content": a string, a list (object entries become blocks, others are skipped), else None.
  bool content(Scanner& s, Rec& r) {
    r.content = Content::None;
    r.content_str = JVal{};
    JVal v;
    if (*s.p != '[') {
      if (!s.value(v)) return false;
      if (v.is_str()) {
        r.content = Content::Str;
        r.content_str = v;
      }
      return true;
    }
    r.content = Content::List;
    r.b0 = uint32_t(blocks_.size());
    bool ok = s.elements([&] {
      if (*s.p != '{') return s.value(v);
      blocks_.emplace_back();
      return block(s, blocks_.back());
    });
    r.b1 = uint32_t(blocks_.size());
    return ok;
  }

  bool block(Scanner& s, Block& b) {
    JVal v;
    bool ok = s.members([&](const JVal& k) {
      Key key = key_of(k, kBlockIndex);
      if (!s.value(v)) return false;
      switch (key) {
        case K_TYPE: b.type = make_val(v, arena_); break;
        case K_TEXT: b.text = v; break;
        case K_THINKING: b.thinking = v; break;
        case K_ID: b.id = make_val(v, arena_); break;
        case K_NAME: b.name = make_val(v, arena_); break;
        case K_INPUT: b.input = v; break;
        case K_TOOL_USE_ID: b.tool_use_id = make_val(v, arena_); break;
        case K_IS_ERROR: b.is_error = v.is_true(); break;
        case K_CONTENT: b.content = v; break;
        default: break;
      }
      return true;
    });
    b.btype = !b.type.is_str() ? BType::Other
              : b.type.s == "text" ? BType::Text
              : b.type.s == "thinking" ? BType::Thinking
              : b.type.s == "tool_use" ? BType::ToolUse
              : b.type.s == "tool_result" ? BType::ToolResult
              : BType::Other;
    return ok;
  }

  // "data" (progress) / "attachment": an object -> its ``type`` (and data's ``agentId``); else None.
  bool small_object(Scanner& s, Rec& r, Key which) {
    bool is_data = which == K_DATA;
    if (is_data) { r.has_data = false; r.data_type = r.data_agent_id = Val{}; }
    else { r.has_attachment = false; r.attachment_type = Val{}; }
    JVal v;
    if (*s.p != '{') return s.value(v);
    (is_data ? r.has_data : r.has_attachment) = true;
    return s.members([&](const JVal& k) {
      Key key = is_data ? key_of(k, kDataIndex) : key_of(k, kAttachmentIndex);
      if (!s.value(v)) return false;
      if (key == K_TYPE) (is_data ? r.data_type : r.attachment_type) = make_val(v, arena_);
      else if (key == K_AGENT_ID) r.data_agent_id = make_val(v, arena_);
      return true;
    });
  }

  std::vector<Block>& blocks_;
  Arena& arena_;
};

}  // namespace cp
