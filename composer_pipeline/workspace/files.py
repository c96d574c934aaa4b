"""The workspace as the agent had seen it, and Claude Code's file-tool rules over it.

In:  the session's history as :class:`Event` s (each a tool call and what really came back), applied in
     order with :meth:`Workspace.observe`; then a tool call to :meth:`Workspace.execute`.
Out: an :class:`Outcome`: ``ok`` True/False, or None ("cannot tell": the history does not decide it), the
     observation in the tool's own words, and the reason. ``execute`` also applies a predicted success
     to the workspace, so a multi-step episode can go on.

What the workspace knows, per absolute path: exists / missing / unknown; the full text (a Read that covered
the whole file, a Write, an Edit's ``originalFile`` with its edit applied) or only some lines (a partial
Read, line-number gutter removed, offset/limit respected); read or written by this agent (Claude Code's
read-before-write state, kept by the harness per agent); a Read seen failing for size; known directories.

The rules (Claude Code's, as its tool errors state them; the texts are the ones seen in real sessions):

* Read: a known directory fails (``EISDIR``); a path known missing fails (``File does not exist.``); a
  path whose unchanged file already failed for size without offset/limit fails again with that text; a
  file whose full text is known and small enough (UTF-8 bytes <= the token limit) or that was read whole
  before and has not changed since is returned with the gutter, ``offset``/``limit`` respected.
* Edit / MultiEdit: ``old_string == new_string`` fails; an empty ``old_string`` creates a missing file and
  fails on an existing one; a path known missing fails; a file this agent has not read (or written) fails
  ``File has not been read yet`` (it fails either way: missing or unread); with the full text known,
  ``old_string`` must occur exactly once unless ``replace_all``, edits applied in order; with only some
  lines known, two occurrences in them already fail; otherwise cannot tell.
* Write: to a file known to exist that this agent has not read: fails; to a path known missing, or a
  file it has read: succeeds; otherwise cannot tell.
* A file written by a shell redirection after this agent's read, or read before a command that may write
  anywhere, is "stale": Claude Code compares its mtime with the read's time ("File has been modified since
  read"), so a Write or Edit of it is cannot tell until the agent reads it again. (Another agent's Write/Edit does not: a real session's main agent Edits with
  success a file its subagent edited after the main agent's read.)
* Existence: a path under a directory known missing is missing; ``mkdir`` of a directory known missing
  makes an empty one (nothing under it exists).
* Compaction: Claude Code empties the agent's read state when it compacts the conversation and re-reads only
  some recent files into it (1.0.x: every ``readFileState`` key deleted, then recent files restored; 2.x:
  ``createPostCompactFileAttachments``, a bounded number of files within a token budget, chosen by the read
  state's timestamps, which the trace does not show): a file read before the boundary and not since is cannot tell for
  Edit/Write; one never read still fails.
* A Write or Edit refused with ``File has not been read yet`` is the harness's own word on its read state:
  the file counts as unread for that agent until it reads (or writes) it again, even where the agent had
  read or written it before (a 1.0.98 session's inline subagents were refused right after their own Write).
* NotebookEdit: unread fails; otherwise cannot tell. Glob / Grep / LS succeed (their failures are not
  workspace rules: rejections, permissions); their listing is what the workspace knows.

Deliberately simplified: "cannot tell" wherever the history does not decide; files changed outside the
agent's view (a shell command that may write, another agent's edits, the user's editor) turn what was known
about contents and existence back into unknown (a shell command whose only writes are redirections into
literal paths changes only those files); permission prompts and user rejections are never predicted;
the Edit/Write success texts give the edited lines, not Claude Code's exact snippet window.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from composer_pipeline.workspace.shell import glob_regex, listing, may_write, shell_cwd_after, written_files

FILE_TOOLS = ("Read", "Edit", "MultiEdit", "Write", "Glob", "Grep", "LS", "NotebookEdit")

# Claude Code's own words (as seen in tool results of real sessions)
NOT_READ = "File has not been read yet. Read it first before writing to it."
NOT_FOUND = "File does not exist."
EISDIR = "EISDIR: illegal operation on a directory, read"
SAME_STRINGS = "No changes to make: old_string and new_string are exactly the same."
CREATE_EXISTS = "Cannot create new file - file already exists."
EMPTY_FILE = "<system-reminder>Warning: the file exists but the contents are empty.</system-reminder>"
STRING_NOT_FOUND = "String to replace not found in file.\nString: {old}"
MANY_MATCHES = (
    "Found {n} matches of the string to replace, but replace_all is false. To replace all occurrences, set "
    "replace_all to true. To replace only one occurrence, please provide more context to uniquely identify "
    "the instance.\nString: {old}"
)
OVERSIZE_MARK = "exceeds maximum allowed"
UNRELIABLE_READS = (
    "the rule holds but this agent's read state is not reliable: in Claude Code 1.0.x inline subagents, "
    "Read and Write were seen not to register (Edit after Read failed 'File has not been read yet')"
)
COMPACTED = (
    "read only before a compaction: Claude Code then empties the read state and restores only some recent files "
    "(which ones, the trace does not show)"
)
# the pseudo tool call history.py puts where the agent's conversation was compacted
COMPACTION = "(compaction)"
STALE = (
    "a shell command wrote (or may have written) the file since this agent's read: "
    "Claude Code then compares the file's mtime with the read's time ('File has been modified since read')"
)
# Read's limits: lines returned by default, characters per line, and the token limit of one read
READ_LINES, READ_LINE_CHARS, READ_MAX_TOKENS = 2000, 2000, 25000

_GUTTER = re.compile(r"^ *(\d+)(?:→|\t)(.*)$")
_REMINDER = re.compile(r"\n*<system-reminder>.*?</system-reminder>\n*", re.S)
# tools that never touch files; any other tool (Bash, MCP tools, ...) may
_READ_ONLY_TOOLS = frozenset(
    {"Read", "Glob", "Grep", "LS", "TodoWrite", "TodoRead", "WebFetch", "WebSearch", "ExitPlanMode", "BashOutput",
     "KillBash", "KillShell", "AskUserQuestion", "NotebookRead", "ListMcpResourcesTool", "ReadMcpResourceTool"}
)  # fmt: skip


@dataclass
class Outcome:
    """A file-tool call's result: ``ok`` None is "cannot tell"."""

    ok: bool | None
    observation: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "observation": self.observation, "reason": self.reason}


@dataclass
class Event:
    """One tool call of the history and what came back: ``ok`` None when no result came (interrupted)."""

    name: str
    arguments: dict[str, Any]
    ok: bool | None
    content: str = ""
    structured: Any = None  # Claude Code's ``toolUseResult``
    # made by the agent whose workspace this is (False: another agent of the session)
    own: bool = True
    cwd: str | None = None


@dataclass
class FileView:
    exists: bool | None = None
    text: str | None = None  # the full text, where known
    # 1-based line -> text, from partial reads
    lines: dict[int, str] = field(default_factory=dict)
    # read or written by this agent (read-before-write state)
    read: bool = False
    # a whole-file Read succeeded and nothing changed it since
    read_whole: bool = False
    # the size error a whole-file Read gave, while unchanged
    oversize: str | None = None
    # bytes, where a listing (ls -l) showed it, while unchanged
    size: int | None = None
    # written outside the file tools (a shell redirection) since; Claude Code then compares the file's mtime
    # with the read's time ("File has been modified since read"), which no trace shows: cannot tell
    stale: bool = False
    # read before a compaction and not since: the compaction may or may not have restored it
    read_before_compaction: bool = False

    def forget_contents(self) -> None:
        self.text, self.lines, self.read_whole, self.oversize, self.size = None, {}, False, None, None


def observed_ok(is_error: bool | None, content: str, structured: Any) -> bool:
    """What really happened, from a tool result: Claude Code marks failures with ``is_error``, a
    ``<tool_use_error>`` wrapper or a string ``toolUseResult`` (``Error: ...``, ``User rejected ...``)."""
    if is_error:
        return False
    if content.lstrip().startswith("<tool_use_error>"):
        return False
    return not isinstance(structured, str)


def strip_gutter(content: str) -> dict[int, str]:
    """Read's ``cat -n`` output (``     1→text`` or ``     1\\ttext``) -> {line: text}; reminders dropped."""
    out: dict[int, str] = {}
    for line in _REMINDER.sub("\n", content).split("\n"):
        m = _GUTTER.match(line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def with_gutter(lines: list[str], first: int) -> str:
    return "\n".join(f"{n:>6}→{line[:READ_LINE_CHARS]}" for n, line in enumerate(lines, start=first))


def _error(text: str) -> str:
    return f"<tool_use_error>{text}</tool_use_error>"


class Workspace:
    """What one agent had seen of the files at one point of a session."""

    def __init__(self, cwd: str | None = None):
        self.cwd = cwd or "/"
        # the Bash shell's cwd while it can be followed
        self.shell_cwd: str | None = self.cwd
        self.files: dict[str, FileView] = {}
        self.dirs: set[str] = set()
        # complete listings seen (Glob, ls -la, find): (base dir, regex over the relative path); a path that
        # matches and was not listed did not exist
        self.complete: list[tuple[str, str]] = []
        # False where this agent's read-before-write state is observed not to follow the rule
        self.reads_reliable = True
        # Claude Code 1.0.x runs its inline subagents in the main agent's shell: another agent's cd moves ours
        self.shell_shared = False

    # -- paths ---------------------------------------------------------------------------------------
    def path(self, p: Any, cwd: str | None = None) -> str | None:
        if not isinstance(p, str) or not p:
            return None
        if not p.startswith("/"):
            p = posixpath.join(cwd or self.cwd, p)
        return posixpath.normpath(p)

    def view(self, path: str) -> FileView:
        v = self.files.get(path)
        if v is None:
            v = self.files[path] = FileView()
        return v

    def _exists(self, path: str) -> None:
        self.view(path).exists = True
        d = posixpath.dirname(path)
        while d and d not in self.dirs:
            self.dirs.add(d)
            d = posixpath.dirname(d) if d != "/" else ""

    def _set_text(self, path: str, text: str) -> None:
        v = self.view(path)
        self._exists(path)
        v.text, v.lines, v.oversize = text, {}, None

    def _outside_change(self) -> None:
        """Something may have written anywhere: contents and existence are unknown again; read state stays, but
        a file read before may have been rewritten since (stale: Claude Code's mtime check may refuse it)."""
        for v in self.files.values():
            v.forget_contents()
            v.exists = None
            # it may have rewritten a file read before: the mtime check may refuse
            v.stale = v.stale or v.read
        self.complete = []

    # -- learning from the history ---------------------------------------------------------------------
    def observe(self, ev: Event) -> None:
        """Apply one past tool call with what really came back."""
        name, args = ev.name, ev.arguments
        if name == COMPACTION:
            self._compacted()
            return
        if name not in FILE_TOOLS:
            if name not in _READ_ONLY_TOOLS:
                self._observe_other_tool(ev)
            return
        if name in ("Glob", "Grep"):
            self._observe_listing(ev)
            return
        if name == "LS":
            if ev.ok:
                d = self.path(args.get("path"), ev.cwd)
                if d:
                    self.dirs.add(d)
            return
        path = self.path(args.get("file_path") or args.get("notebook_path"), ev.cwd)
        if path is None:
            return
        v = self.view(path)
        # interrupted: it may or may not have run
        if ev.ok is None:
            if name != "Read":
                v.forget_contents()
            return
        if not ev.ok:
            # another agent's failure may predate changes this agent saw
            if ev.own:
                self._observe_failure(ev, path, v)
            return
        read_before, stale_before = v.read, v.stale
        self._observe_file_success(ev, path, v)
        # read-before-write state is each agent's own
        if not ev.own:
            # another agent's Write or Edit does not make this agent's read stale: a 2.0.74 session's main agent
            # Edits a file with success, unread since its subagent Edited it (kfischer-okarin b3edadab)
            v.read, v.stale = read_before, stale_before
        else:
            v.stale = v.read_before_compaction = False

    def _compacted(self) -> None:
        """The agent's conversation was compacted: its read state is emptied, some recent files restored."""
        for v in self.files.values():
            if v.read:
                v.read, v.read_before_compaction = False, True

    def _observe_other_tool(self, ev: Event) -> None:
        """A tool outside the file tools that may write (Bash, or one this model does not know): what it wrote
        is stale (a shell redirection names its file), or everything is unknown again; Bash moves the shell."""
        command = str(ev.arguments.get("command", "")) if ev.name == "Bash" else None
        if ev.ok is not False and (command is None or may_write(command)):
            written = written_files(command, self.shell_cwd) if command is not None and ev.ok else None
            if written is None:
                self._outside_change()
            # a redirection writes its file only, outside the file tools
            for path in written or ():
                self._exists(path)
                self.view(path).forget_contents()
                self.view(path).stale = True
        if command is not None and ev.ok:
            self._observe_shell_listing(command, ev)
        # another agent's cd moves a shared shell (Claude Code 1.0.x subagents)
        if command is not None:
            follow = ev.own or self.shell_shared or "cd " not in command
            self.shell_cwd = shell_cwd_after(command, self.shell_cwd) if follow else None

    def _observe_file_success(self, ev: Event, path: str, v: FileView) -> None:
        """A Read, Write or edit that succeeded: what the file holds now, and that it was read."""
        name, args = ev.name, ev.arguments
        if name == "Read":
            self._observe_read(ev, path, v)
        elif name == "Write":
            self._set_text(path, str(args.get("content", "")))
            v.read = True
        elif name in ("Edit", "MultiEdit", "NotebookEdit"):
            self._exists(path)
            v.read = True
            before = _original(ev.structured)
            if before is None:
                before = v.text
            after = (
                _apply_edits(before, _edit_list(name, args)) if before is not None and name != "NotebookEdit" else None
            )
            if isinstance(after, str):
                self._set_text(path, after)
            else:
                v.forget_contents()
            v.read_whole = False

    def _observe_listing(self, ev: Event) -> None:
        if not ev.ok:
            return
        names = ev.structured.get("filenames") if isinstance(ev.structured, dict) else None
        # files_with_matches output: "Found N files\n/a\n/b"
        if not isinstance(names, list):
            names = [ln for ln in ev.content.split("\n") if ln.startswith("/")]
        base = self.path(ev.arguments.get("path"), ev.cwd) or ev.cwd or self.cwd
        if names:
            self.dirs.add(base)
        for n in names:
            p = self.path(n, base)
            if p:
                self._exists(p)
        complete = isinstance(ev.structured, dict) and ev.structured.get("truncated") is False
        if ev.name == "Glob" and complete and isinstance(ev.arguments.get("pattern"), str):
            self.complete.append((base, glob_regex(ev.arguments["pattern"])))

    def _observe_shell_listing(self, command: str, ev: Event) -> None:
        cwd = self.shell_cwd
        for seg in command.split("&&"):
            words = seg.split()
            if words[:1] == ["cd"]:
                cwd = shell_cwd_after(seg, cwd)
            if words[:1] != ["mkdir"]:
                continue
            for w in words[1:]:
                if w.startswith("-"):
                    continue
                made = self.path(w.strip("'\""), cwd) if cwd or w.startswith("/") else None
                if made is None or "$" in made or "*" in made:
                    self.complete = []  # where it made a directory is not known
                    continue
                # mkdir: an earlier listing of it is void; a directory it had to make is new, hence empty
                was_missing = made not in self.dirs and self.existence(made) is False
                self.complete = [c for c in self.complete if c[0] != made]
                self._exists(made)
                self.files.pop(made, None)
                self.dirs.add(made)
                if was_missing:
                    self.complete.append((made, ".*"))
        seen = listing(command, ev.content, self.shell_cwd)
        for d in seen.dirs:
            self._exists(d)
            self.files.pop(d, None)
            self.dirs.add(d)
        for f, size in seen.files.items():
            self._exists(f)
            if size is not None:
                self.files[f].size = size
        self.complete.extend(seen.complete)

    def existence(self, path: str) -> bool | None:
        """True / False / None (unknown): a file seen, or a path a complete listing would have shown; a path
        under a directory known missing is missing too."""
        v = self.files.get(path)
        if v is not None and v.exists is not None:
            return v.exists
        if self._listed_missing(path):
            return False
        d = posixpath.dirname(path)
        while d not in ("", "/") and d not in self.dirs:
            if self._listed_missing(d) or (d in self.files and self.files[d].exists is False):
                return False
            d = posixpath.dirname(d)
        return None

    def _listed_missing(self, path: str) -> bool:
        for base, regex in self.complete:
            if path.startswith(base.rstrip("/") + "/") and re.fullmatch(regex, posixpath.relpath(path, base)):
                return True
        return False

    def _observe_read(self, ev: Event, path: str, v: FileView) -> None:
        if ev.content.startswith(EISDIR.split(":")[0]):
            self.dirs.add(path)
            return
        self._exists(path)
        v.read = True
        f = ev.structured.get("file") if isinstance(ev.structured, dict) else None
        if isinstance(f, dict) and isinstance(f.get("content"), str):
            start, n, total = f.get("startLine") or 1, f.get("numLines"), f.get("totalLines")
            text = f["content"]
            if start == 1 and n is not None and n == total:
                self._set_text(path, text)
                v.read_whole = True
                return
            lines = text.split("\n")
            v.lines.update({start + i: line for i, line in enumerate(lines)})
            return
        lines = strip_gutter(ev.content)
        if EMPTY_FILE in ev.content:
            self._set_text(path, "")
            v.read_whole = True
        elif lines:
            v.lines.update(lines)

    def _observe_failure(self, ev: Event, path: str, v: FileView) -> None:
        text = ev.content.replace("<tool_use_error>", "").replace("</tool_use_error>", "").strip()
        if text.startswith(NOT_FOUND.rstrip(".")):
            v.exists = False
            v.forget_contents()
        elif text.startswith(NOT_READ.split(".")[0]):
            # only an existing file gets this error, and it says what the harness's read state held: this
            # agent's next Write/Edit of it is refused the same way until it reads the file again, whatever
            # emptied the entry (1.0.98 inline subagents were refused right after their own Write)
            self._exists(path)
            v.read = v.read_before_compaction = False
        elif text.startswith(EISDIR.split(":")[0]):
            self.dirs.add(path)
            self.files.pop(path, None)
        elif OVERSIZE_MARK in text and ev.name == "Read":
            self._exists(path)
            if not ev.arguments.get("offset") and not ev.arguments.get("limit"):
                v.oversize = ev.content

    # -- executing an action -------------------------------------------------------------------------
    def execute(self, name: str, arguments: dict[str, Any]) -> Outcome:
        """Claude Code's result of one file-tool call here; a predicted success is applied."""
        if name not in FILE_TOOLS:
            return Outcome(None, "", f"{name} is not a file tool")
        if name in ("Glob", "Grep", "LS"):
            return self._listing(name, arguments)
        path = self.path(arguments.get("file_path") or arguments.get("notebook_path"))
        if path is None:
            return Outcome(False, _error("InputValidationError: a file path is required"), "no file path")
        out = getattr(self, f"_{name.lower()}")(path, arguments)
        if out.ok:
            self.observe(Event(name, arguments, True, out.observation, None))
        return out

    def _read(self, path: str, args: dict[str, Any]) -> Outcome:
        if path in self.dirs:
            return Outcome(False, EISDIR, "the path is a directory the agent has seen")
        exists = self.existence(path)
        if exists is None:
            return Outcome(None, "", "the agent never saw whether this file exists")
        if exists is False:
            return Outcome(False, _error(NOT_FOUND), "the file is known to be missing")
        v = self.files[path]
        offset, limit = args.get("offset"), args.get("limit")
        if v.oversize and not offset and not limit:
            return Outcome(False, v.oversize, "a whole read of this unchanged file already failed for size")
        if v.text is None:
            if v.size is not None and v.size <= READ_MAX_TOKENS:  # a token is at least one byte
                return Outcome(True, "", "the file exists and is small enough; its contents are not known")
            return Outcome(None, "", "the file exists but its contents are not known")
        if not (v.read_whole or len(v.text.encode()) <= READ_MAX_TOKENS):
            return Outcome(None, "", "the file may be over the read size limit")
        if v.text == "":
            return Outcome(True, EMPTY_FILE, "an empty file")
        lines = v.text.split("\n")
        first = int(offset) if offset else 1
        count = int(limit) if limit else READ_LINES
        part = lines[first - 1 : first - 1 + count]
        if not part:
            return Outcome(
                True,
                f"<system-reminder>Warning: the file exists but is shorter than the provided offset ({first}). "
                f"The file has {len(lines)} lines.</system-reminder>",
                "offset past the end",
            )
        return Outcome(True, with_gutter(part, first), "contents known")

    def _needs_read(self, path: str) -> Outcome | None:
        """Edit/MultiEdit/NotebookEdit: a missing or unread file fails; None when the read rule is met."""
        exists = self.existence(path)
        if exists is False:
            return Outcome(False, _error(NOT_FOUND), "the file is known to be missing")
        v = self.files.get(path)
        if v is not None and not v.read and v.read_before_compaction:
            return Outcome(None, "", COMPACTED)
        if v is None or not v.read:
            if exists:
                return Outcome(False, _error(NOT_READ), "the file exists and this agent has not read it")
            return Outcome(False, _error(NOT_READ), "this agent has not read it (if missing: File does not exist.)")
        return None

    def _edit(self, path: str, args: dict[str, Any]) -> Outcome:
        return self._edits(path, "Edit", _edit_list("Edit", args))

    def _multiedit(self, path: str, args: dict[str, Any]) -> Outcome:
        return self._edits(path, "MultiEdit", _edit_list("MultiEdit", args))

    def _edits(self, path: str, name: str, edits: list[tuple[str, str, bool]]) -> Outcome:
        if not edits:
            return Outcome(False, _error("InputValidationError: no edits"), "no edits")
        if any(old == new for old, new, _ in edits):
            return Outcome(False, _error(SAME_STRINGS), "old_string equals new_string")
        if edits[0][0] == "":
            exists = self.existence(path)
            if exists is False:
                return Outcome(True, f"File created successfully at: {path}", "an empty old_string creates the file")
            if exists:
                return Outcome(False, _error(CREATE_EXISTS), "an empty old_string on an existing file")
            return Outcome(None, "", "an empty old_string creates a missing file; existence unknown")
        failed = self._needs_read(path)
        if failed is not None:
            return failed
        v = self.files[path]
        if v.stale:
            return Outcome(None, "", STALE)
        if v.text is not None:
            after = _apply_edits(v.text, edits)
            if isinstance(after, Outcome):
                return after
            if not self.reads_reliable:
                return Outcome(None, "", UNRELIABLE_READS)
            return Outcome(True, _edited(path, name, edits, after), "the edits apply to the known text")
        old, _, replace_all = edits[0]
        n = sum(run.count(old) for run in _known_runs(v.lines))
        if n > 1 and not replace_all:
            return Outcome(
                False, _error(MANY_MATCHES.format(n=n, old=old)), "old_string occurs twice in the lines read"
            )
        return Outcome(None, "", "the file's full text is not known")

    def _write(self, path: str, args: dict[str, Any]) -> Outcome:
        exists = self.existence(path)
        v = self.files.get(path)
        read = v is not None and v.read
        if v is not None and not read and v.read_before_compaction:
            return Outcome(None, "", COMPACTED)
        if exists and not read:
            return Outcome(False, _error(NOT_READ), "the file exists and this agent has not read it")
        if exists is False:
            return Outcome(True, f"File created successfully at: {path}", "a new file")
        if read:
            if not self.reads_reliable:
                return Outcome(None, "", UNRELIABLE_READS)
            if v is not None and v.stale:
                return Outcome(None, "", STALE)
            text = str(args.get("content", ""))
            return Outcome(True, _updated(path, text.split("\n"), 1), "the agent read or wrote it before")
        return Outcome(None, "", "the agent never saw whether this file exists")

    def _notebookedit(self, path: str, args: dict[str, Any]) -> Outcome:
        failed = self._needs_read(path)
        return failed if failed is not None else Outcome(None, "", "notebook cells are not modelled")

    def _listing(self, name: str, args: dict[str, Any]) -> Outcome:
        base = self.path(args.get("path")) or self.cwd
        pattern = args.get("pattern") if name == "Glob" else None
        known = sorted(
            p
            for p, v in self.files.items()
            if v.exists
            and p.startswith(base.rstrip("/") + "/")
            and (pattern is None or re.fullmatch(glob_regex(pattern), posixpath.relpath(p, base)))
        )
        if name == "Glob":
            return Outcome(True, "\n".join(known) or "No files found", "listing from the paths the agent has seen")
        if name == "LS":
            return Outcome(True, "\n".join(f"- {p}" for p in known), "listing from the paths the agent has seen")
        return Outcome(True, f"Found {len(known)} files\n" + "\n".join(known), "listing from the paths seen")

    # -- snapshots (the GRPO reward and the environment carry one per state) ---------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "cwd": self.cwd,
            "dirs": sorted(self.dirs),
            "complete": [list(c) for c in self.complete],
            "reads_reliable": self.reads_reliable,
            "shell_shared": self.shell_shared,
            "shell_cwd": self.shell_cwd,
            "files": {
                p: {
                    "exists": v.exists,
                    "text": v.text,
                    "lines": {str(k): s for k, s in v.lines.items()},
                    "read": v.read,
                    "read_whole": v.read_whole,
                    "oversize": v.oversize,
                    "size": v.size,
                    "stale": v.stale,
                    "read_before_compaction": v.read_before_compaction,
                }
                for p, v in self.files.items()
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workspace:
        ws = cls(d.get("cwd"))
        ws.dirs = set(d.get("dirs") or ())
        ws.complete = [(str(b), str(r)) for b, r in d.get("complete") or ()]
        ws.reads_reliable = bool(d.get("reads_reliable", True))
        ws.shell_cwd = d.get("shell_cwd")
        ws.shell_shared = bool(d.get("shell_shared", False))
        for p, f in (d.get("files") or {}).items():
            ws.files[p] = FileView(
                exists=f.get("exists"),
                text=f.get("text"),
                lines={int(k): s for k, s in (f.get("lines") or {}).items()},
                read=bool(f.get("read")),
                read_whole=bool(f.get("read_whole")),
                oversize=f.get("oversize"),
                size=f.get("size"),
                stale=bool(f.get("stale")),
                read_before_compaction=bool(f.get("read_before_compaction")),
            )
        return ws


def _edit_list(name: str, args: dict[str, Any]) -> list[tuple[str, str, bool]]:
    raw: list[Any] = [args]
    if name == "MultiEdit":
        edits = args.get("edits")
        raw = edits if isinstance(edits, list) else []
    return [
        (str(e.get("old_string", "")), str(e.get("new_string", "")), bool(e.get("replace_all")))
        for e in raw
        if isinstance(e, dict)
    ]


def _original(structured: Any) -> str | None:
    if isinstance(structured, dict):
        for k in ("originalFile", "originalFileContents"):
            if isinstance(structured.get(k), str):
                return structured[k]
    return None


def _apply_edits(text: str, edits: list[tuple[str, str, bool]]) -> str | Outcome:
    """The text after the edits in order, or the failure of the first edit that does not apply."""
    for old, new, replace_all in edits:
        n = text.count(old) if old else 0
        if n == 0:
            return Outcome(False, _error(STRING_NOT_FOUND.format(old=old)), "old_string is not in the file")
        if n > 1 and not replace_all:
            return Outcome(False, _error(MANY_MATCHES.format(n=n, old=old)), "old_string occurs more than once")
        text = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    return text


def _known_runs(lines: dict[int, str]) -> list[str]:
    """The text of each run of consecutive known lines."""
    runs: list[list[str]] = []
    prev = None
    for n in sorted(lines):
        if prev is None or n != prev + 1:
            runs.append([])
        runs[-1].append(lines[n])
        prev = n
    return ["\n".join(r) for r in runs]


def _updated(path: str, lines: list[str], first: int) -> str:
    return (
        f"The file {path} has been updated. Here's the result of running `cat -n` on a snippet of the edited "
        f"file:\n{with_gutter(lines, first)}"
    )


def _edited(path: str, name: str, edits: list[tuple[str, str, bool]], after: str) -> str:
    if name == "MultiEdit":
        items = [f'{i}. Replaced "{old[:50]}..." with "{new[:50]}"' for i, (old, new, _) in enumerate(edits, 1)]
        return f"Applied {len(edits)} edits to {path}:\n" + "\n".join(items)
    new = edits[-1][1]
    at = after.find(new) if new else 0
    first = after.count("\n", 0, max(at, 0)) + 1
    lines = after.split("\n")
    lo = max(1, first - 4)
    hi = min(len(lines), first + new.count("\n") + 4)
    return _updated(path, lines[lo - 1 : hi], lo)
