"""What a shell command tells about the files: may it have written any, and which paths did it list.

In:  a Bash call's ``command``, its output and the agent's cwd.
Out: :func:`may_write` (False only for commands made of known read-only programs, no redirection into a
     file; a ``find`` with ``-delete``, ``-exec`` or ``-fprint`` writes); :func:`written_files` (the files such programs' redirections write, e.g. a ``cat > f << 'EOF'``
     here-document, or None where the command may write elsewhere); :func:`listing` — the files and directories it showed to exist, and the complete listings it
     gave (a directory's ``ls -l``, a ``find DIR -type f`` with only ``-name`` filters and nothing piped
     after it, an ``ls``/``find`` of a missing directory), as ``(base dir, regex over the path relative to it)``: a
     path under ``base`` that matches and is not listed did not exist.

Quoting is read as the shell reads it (:func:`split_commands`): a ``|``, ``;``, ``&&`` or ``>`` inside quotes is
text (``tree -I 'node_modules|.git'``, ``grep -E "(a|b)"``), a ``$(...)`` inside double quotes still runs.

Deliberately simplified: only ``cd``, ``ls -l`` and ``find`` are read, and only where the listed directory
is absolute or the shell's cwd is known (:func:`shell_cwd_after`: the session's cwd until a ``cd`` it cannot
follow; the record's ``cwd`` field is not the shell's: a ``cd`` persists between calls and parallel
subagents share one shell, real sessions show both); any other listing (``tree``,
``git ls-files``) teaches nothing; a command this module cannot read counts as one that may write.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

_READ_ONLY = frozenset(
    {"ls", "find", "cat", "head", "tail", "wc", "grep", "rg", "sort", "uniq", "echo", "pwd", "cd", "tree", "which",
     "file", "stat", "du", "df", "diff", "less", "more", "date", "whoami", "env", "printenv", "true", "test", "[",
     "basename", "dirname", "realpath", "readlink", "cut", "tr", "awk", "jq", "xargs", "type", "command", "mkdir"}
)  # fmt: skip
_GIT_READ_ONLY = frozenset({"status", "log", "diff", "show", "branch", "rev-parse", "ls-files", "remote", "blame"})
_NULL_REDIRECT = re.compile(r"\d?&?>\s*/dev/null|\d>&\d")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
_REDIRECT = re.compile(r"(?<![<\d&])\d?>>?\s*(\S+)")
# a command list's separators (``&&``, ``||``, ``;``, ``|``, ``&``, newline), found in the quote-masked text;
# the ``&`` of a redirection (``2>&1``, ``&>``, ``|&``) is not one
_SEPARATORS = re.compile(r"&&|\|\||\|&|;|\||(?<![>|])&(?!>)|\n")
# findutils actions that delete, run a command or write a file
_FIND_WRITES = frozenset({"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"})


def mask_quotes(command: str) -> str:
    """``command`` with what its quotes and backslashes make literal replaced by ``_`` (same length), so that
    an operator found in it is one the shell acts on. Inside double quotes ``$`` and backquotes stay: a command
    substitution runs there (POSIX sh, "Double-Quotes"); inside single quotes nothing does."""
    out: list[str] = []
    quote = None
    i = 0
    while i < len(command):
        c = command[i]
        if c == "\\" and quote != "'" and i + 1 < len(command):
            out.append("__")
            i += 2
            continue
        if quote is None:
            if c in "'\"":
                quote = c
            out.append(c)
        elif c == quote:
            quote = None
            out.append(c)
        elif quote == '"' and c in "$`(":
            out.append(c)
        else:
            out.append("_")
        i += 1
    return "".join(out)


def split_commands(command: str) -> list[str]:
    """The simple commands of a command list, split at the separators the shell acts on (not quoted ones)."""
    masked = mask_quotes(command)
    out, start = [], 0
    for m in _SEPARATORS.finditer(masked):
        out.append(command[start : m.start()])
        start = m.end()
    out.append(command[start:])
    return out


def strip_heredocs(command: str) -> str:
    """The command without its here-documents' bodies (``cat > f << 'EOF'`` ... ``EOF``): their text is data."""
    lines, out, i = command.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        for m in _HEREDOC.finditer(line):
            while i < len(lines) and lines[i].strip() != m.group(2):
                i += 1
            i += 1
    return "\n".join(out)


def written_files(command: str, cwd: str | None) -> list[str] | None:
    """The files a command writes when its only writes are redirections (``cat > f << 'EOF'``,
    ``echo x >> f``) of otherwise read-only programs into literal paths; None where it may write elsewhere."""
    cmd = _NULL_REDIRECT.sub(" ", strip_heredocs(command))
    if "$(" in cmd or "`" in cmd:
        return None
    out: list[str] = []
    for seg in split_commands(cmd):
        words = seg.split()
        if words[:1] == ["cd"]:
            cwd = shell_cwd_after(seg, cwd)
            continue
        # a '>' inside quotes is text: redirections are found in the quote-masked segment
        found = list(_REDIRECT.finditer(mask_quotes(seg)))
        targets = [_unquote(seg[m.start(1) : m.end(1)]) for m in found]
        rest = seg
        for m in reversed(found):
            rest = rest[: m.start()] + " " + rest[m.end() :]
        if may_write(_HEREDOC.sub(" ", rest)):
            return None
        for t in targets:
            if not t or any(c in t for c in "$*?{~&") or (cwd is None and not t.startswith("/")):
                return None
            out.append(posixpath.normpath(posixpath.join(cwd or "/", t)))
    return out


def may_write(command: str) -> bool:
    command = strip_heredocs(command)
    masked = _NULL_REDIRECT.sub(lambda m: " " * len(m.group(0)), mask_quotes(command))
    if ">" in masked or "$(" in masked or "`" in masked:
        return True
    for seg in split_commands(command):
        words = [w for w in seg.split() if "=" not in w or w.startswith("-")]
        if not words:
            continue
        w0 = words[0]
        if w0 == "find" and _FIND_WRITES.intersection(words):
            return True
        if w0 == "git" and len(words) > 1 and words[1] in _GIT_READ_ONLY:
            continue
        if w0 == "sed" and not any(w.startswith("-i") for w in words[1:]):
            continue
        if w0 == "xargs" and len(words) > 1 and words[1] in _READ_ONLY:
            continue
        if w0 in _READ_ONLY and w0 != "xargs":
            continue
        return True
    return False


@dataclass
class Listing:
    # path -> size in bytes where ls -l gave it
    files: dict[str, int | None] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    # (base dir, regex over the relative path)
    complete: list[tuple[str, str]] = field(default_factory=list)


def glob_regex(pattern: str) -> str:
    """A Glob pattern (``**``, ``*``, ``?``, ``{a,b}``) as a regex over a path relative to its base."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "{":
            j = pattern.find("}", i)
            if j < 0:
                out.append(re.escape(c))
            else:
                out.append("(?:" + "|".join(re.escape(p) for p in pattern[i + 1 : j].split(",")) + ")")
                i = j + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def shell_cwd_after(command: str, cwd: str | None) -> str | None:
    """The shell's cwd after ``command`` (a ``cd`` persists between Bash calls); None once it is unknown."""
    for seg in re.split(r"&&|\|\||;|\|", command):
        words = seg.split()
        if words[:1] == ["cd"]:
            target = _unquote(words[1]) if len(words) == 2 else ""
            if target.startswith("/"):
                cwd = posixpath.normpath(target)
            elif cwd is not None and target and not target.startswith(("~", "-", "$")):
                cwd = posixpath.normpath(posixpath.join(cwd, target))
            else:
                cwd = None
    return cwd


def listing(command: str, output: str, cwd: str | None) -> Listing:
    """The paths one Bash call listed (see the module docstring); empty where it cannot be read."""
    found = Listing()
    cmd = _NULL_REDIRECT.sub(" ", command).strip()
    piped = "|" in cmd.replace("||", "")
    steps = [s.strip() for s in re.split(r"&&", cmd.split("||")[0])]
    listers = [s for s in steps if s.split()[:1] in (["ls"], ["find"])]
    if len(listers) != 1 or any(s.split()[:1] not in (["cd"], ["ls"], ["find"], ["pwd"], ["mkdir"]) for s in steps):
        return found
    cwd = shell_cwd_after("&&".join(s for s in steps if s.split()[:1] == ["cd"]), cwd)
    words = listers[0].split()
    target = next((_unquote(w) for w in words[1:] if not w.startswith("-")), ".")
    if cwd is None and not target.startswith("/"):
        return found
    cwd = cwd or "/"
    if words[0] == "ls":
        _ls(words, output, cwd, piped, found)
    else:
        _find(words, output, cwd, piped, found)
    return found


def _unquote(w: str) -> str:
    return w.strip("'\"")


def _ls(words: list[str], output: str, cwd: str, piped: bool, found: Listing) -> None:
    flags = "".join(w[1:] for w in words[1:] if w.startswith("-"))
    args = [_unquote(w) for w in words[1:] if not w.startswith("-")]
    if len(args) > 1 or "R" in flags or "d" in flags:
        return
    base = posixpath.normpath(posixpath.join(cwd, args[0] if args else "."))
    if "No such file or directory" in output and output.count("\n") <= 1:
        found.complete.append((base, ".*"))  # the directory itself is missing
        return
    if "l" not in flags or not output.startswith("total"):
        return
    found.dirs.add(base)
    for line in output.split("\n")[1:]:
        parts = line.split(None, 8)
        if len(parts) < 9 or parts[8] in (".", ".."):
            continue
        name = parts[8].split(" -> ")[0]
        path = posixpath.join(base, name)
        if parts[0].startswith("d"):
            found.dirs.add(path)
        elif parts[0].startswith("-"):
            found.files[path] = int(parts[4]) if parts[4].isdigit() else None
    if not piped and "a" in flags:
        found.complete.append((base, "[^/]+"))


def _find(words: list[str], output: str, cwd: str, piped: bool, found: Listing) -> None:
    if len(words) < 2 or words[1].startswith("-"):
        return
    root = _unquote(words[1])
    base = posixpath.normpath(posixpath.join(cwd, root))
    rest = [_unquote(w) for w in words[2:]]
    files_only = "-type" in rest and rest[rest.index("-type") + 1 : rest.index("-type") + 2] == ["f"]
    if "No such file or directory" in output and output.count("\n") <= 1:
        found.complete.append((base, ".*"))
        return
    if not files_only:
        return
    prefix = root.rstrip("/") + "/"
    for line in output.split("\n"):
        if line.startswith(prefix):
            found.files[posixpath.normpath(posixpath.join(cwd, line))] = None
    names, i, simple = [], 0, True
    while i < len(rest):
        w = rest[i]
        if w in ("-type", "-name") and i + 1 < len(rest):
            if w == "-name":
                names.append(glob_regex(rest[i + 1]))
            i += 2
        elif w == "-o":
            i += 1
        else:
            simple = False
            break
    if simple and not piped:
        found.complete.append((base, "(?:.*/)?(?:" + "|".join(names) + ")" if names else ".*"))
