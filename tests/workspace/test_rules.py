"""The workspace environment's rules, one test each (Claude Code's file tools, as real sessions show them)."""

from __future__ import annotations

from composer_pipeline.workspace.files import (
    EISDIR,
    NOT_FOUND,
    NOT_READ,
    Event,
    Workspace,
    observed_ok,
    strip_gutter,
)
from composer_pipeline.workspace.shell import may_write

D = "/home/u/p"
F = f"{D}/app.py"


def _ws(*events: Event) -> Workspace:
    ws = Workspace(D)
    for ev in events:
        ws.observe(ev)
    return ws


def _read(path=F, text="a\nb\nc", **args) -> Event:
    lines = text.split("\n")
    start = args.get("offset") or 1
    part = lines[start - 1 : start - 1 + (args.get("limit") or len(lines))]
    gutter = "\n".join(f"{n:>6}→{s}" for n, s in enumerate(part, start))
    file = {"filePath": path, "content": "\n".join(part), "numLines": len(part), "startLine": start}
    return Event(
        "Read", {"file_path": path, **args}, True, gutter, {"type": "text", "file": {**file, "totalLines": len(lines)}}
    )


def test_read_results_are_known_text_without_the_gutter_and_offset_limit_are_respected():
    ws = _ws(_read(text="alpha\nbeta\ngamma"))
    out = ws.execute("Read", {"file_path": F, "offset": 2, "limit": 1})
    assert out.ok is True and out.observation == "     2→beta"
    # a partial read only teaches its own lines; the gutter of the raw text is removed
    assert strip_gutter("     7→x = 1\n     8\ty = 2\n<system-reminder>r</system-reminder>") == {7: "x = 1", 8: "y = 2"}
    part = _ws(_read(text="l1\nl2\nl3\nl4", offset=3, limit=2))
    assert part.files[F].text is None and part.files[F].lines == {3: "l3", 4: "l4"}
    assert part.execute("Read", {"file_path": F}).ok is None  # the whole file is not known


def test_write_contents_and_edits_in_order_make_the_known_text():
    ws = _ws(Event("Write", {"file_path": F, "content": "x = 1\ny = 2"}, True, f"File created successfully at: {F}"))
    ws.observe(Event("Edit", {"file_path": F, "old_string": "x = 1", "new_string": "x = 10"}, True, "updated"))
    edits = [{"old_string": "y = 2", "new_string": "y = 20"}, {"old_string": "y = 20", "new_string": "y = 3"}]
    ws.observe(Event("MultiEdit", {"file_path": F, "edits": edits}, True, "Applied 2 edits"))
    assert ws.files[F].text == "x = 10\ny = 3"
    assert ws.execute("Read", {"file_path": F}).observation == "     1→x = 10\n     2→y = 3"


def test_glob_results_are_known_paths_and_a_complete_listing_rules_out_the_rest():
    listing = Event(
        "Glob",
        {"pattern": "*.py", "path": D},
        True,
        F,
        {"filenames": [F], "numFiles": 1, "truncated": False},
    )
    ws = _ws(listing)
    out = ws.execute("Write", {"file_path": F, "content": "new"})
    assert out.ok is False and NOT_READ in out.observation
    assert ws.execute("Write", {"file_path": f"{D}/other.py", "content": "x"}).ok is True  # not listed: new
    assert ws.execute("Write", {"file_path": f"{D}/sub/deep.py", "content": "x"}).ok is None  # *.py is one level


def test_edit_needs_a_prior_read():
    ws = _ws(Event("Glob", {"pattern": "*.py"}, True, F, {"filenames": [F], "truncated": False}))
    out = ws.execute("Edit", {"file_path": F, "old_string": "a", "new_string": "b"})
    assert out.ok is False and out.observation == f"<tool_use_error>{NOT_READ}</tool_use_error>"
    ws.observe(_read(text="a\nz"))
    assert ws.execute("Edit", {"file_path": F, "old_string": "a", "new_string": "b"}).ok is True


def test_old_string_must_occur_exactly_once_unless_replace_all():
    ws = _ws(_read(text="x\nx\ny"))
    missing = ws.execute("Edit", {"file_path": F, "old_string": "q", "new_string": "r"})
    assert missing.ok is False and "String to replace not found in file." in missing.observation
    twice = ws.execute("Edit", {"file_path": F, "old_string": "x", "new_string": "r"})
    assert twice.ok is False and "Found 2 matches of the string to replace" in twice.observation
    assert ws.execute("Edit", {"file_path": F, "old_string": "x", "new_string": "r", "replace_all": True}).ok
    # a predicted success is applied for the next step
    assert ws.files[F].text == "r\nr\ny"
    same = _ws(_read()).execute("Edit", {"file_path": F, "old_string": "a", "new_string": "a"})
    assert same.ok is False and "No changes to make" in same.observation


def test_write_to_an_existing_file_needs_a_prior_read():
    listed = Event("Glob", {"pattern": "*.py"}, True, F, {"filenames": [F], "truncated": False})
    assert _ws(listed).execute("Write", {"file_path": F, "content": "x"}).ok is False
    assert _ws(listed, _read()).execute("Write", {"file_path": F, "content": "x"}).ok is True


def test_read_of_a_path_known_missing_fails():
    gone = Event("Read", {"file_path": F}, False, f"<tool_use_error>{NOT_FOUND}</tool_use_error>", "Error")
    out = _ws(gone).execute("Read", {"file_path": F})
    assert out.ok is False and NOT_FOUND in out.observation
    assert _ws(gone).execute("Write", {"file_path": F, "content": "x"}).ok is True  # creating it is fine


def test_read_over_the_size_limit_fails_as_the_tool_said():
    said = (
        "File content (31245 tokens) exceeds maximum allowed tokens (25000). Please use offset and limit "
        "parameters to read specific portions of the file, or use the GrepTool to search for specific content."
    )
    ws = _ws(Event("Read", {"file_path": F}, False, f"<tool_use_error>{said}</tool_use_error>", f"Error: {said}"))
    out = ws.execute("Read", {"file_path": F})
    assert out.ok is False and said in out.observation
    assert ws.execute("Read", {"file_path": F, "offset": 1, "limit": 100}).ok is None  # a part may fit
    big = _ws(Event("Write", {"file_path": F, "content": "x" * 30000}, True, "created"))
    assert big.execute("Read", {"file_path": F}).ok is None  # 30 kB may or may not be 25k tokens


def test_a_directory_read_fails():
    ws = _ws(_read(path=f"{D}/src/a.py"))
    out = ws.execute("Read", {"file_path": f"{D}/src"})
    assert out.ok is False and out.observation == EISDIR


def test_what_the_history_does_not_decide_is_cannot_tell():
    ws = _ws()
    assert ws.execute("Read", {"file_path": F}).ok is None
    assert ws.execute("Write", {"file_path": F, "content": "x"}).ok is None
    # an unread file fails either way: missing ("File does not exist.") or unread
    assert ws.execute("Edit", {"file_path": F, "old_string": "a", "new_string": "b"}).ok is False
    partial = _ws(_read(text="a\nb\nc\nd", offset=1, limit=2))
    assert partial.execute("Edit", {"file_path": F, "old_string": "d", "new_string": "e"}).ok is None


def test_a_shell_command_that_may_write_makes_contents_unknown_and_a_listing_one_does_not():
    ws = _ws(_read(text="a\nb"), Event("Bash", {"command": f"ls -la {D} 2>/dev/null | head"}, True, ""))
    assert ws.files[F].text == "a\nb"
    ws.observe(Event("Bash", {"command": "npm run format"}, True, "done"))
    assert ws.files[F].text is None and ws.files[F].read  # the harness still knows it was read
    assert ws.execute("Edit", {"file_path": F, "old_string": "a", "new_string": "b"}).ok is None
    # the command may have rewritten the file after the read: Write's mtime check ("File has been modified
    # since read") may refuse it, so a Write is not known to work either
    write = ws.execute("Write", {"file_path": F, "content": "c"})
    assert write.ok is None and "modified since read" in write.reason
    ws.observe(_read(text="a\nb"))  # read again: the check passes
    assert ws.execute("Write", {"file_path": F, "content": "c"}).ok is True


def test_ls_listing_gives_files_sizes_and_the_missing_rest():
    out = "total 8\ndrwxr-xr-x 2 u s 64 Jan 1 00:00 .\ndrwxr-xr-x 3 u s 96 Jan 1 00:00 ..\n"
    out += "-rw-r--r-- 1 u s 120 Jan 1 00:00 app.py\ndrwxr-xr-x 2 u s 64 Jan 1 00:00 lib"
    ws = _ws(Event("Bash", {"command": f"ls -la {D}"}, True, out))
    assert ws.execute("Read", {"file_path": F}).ok is True  # exists and 120 bytes: under the limit
    assert ws.execute("Read", {"file_path": f"{D}/lib"}).ok is False
    assert ws.execute("Read", {"file_path": f"{D}/nope.py"}).ok is False  # not in the complete listing
    # a relative listing: at the start the shell's cwd is the session's; after another agent's cd it is not known
    assert _ws(Event("Bash", {"command": "ls -la"}, True, out)).execute("Read", {"file_path": F}).ok is True
    moved = Event("Bash", {"command": "cd /elsewhere && ls"}, True, "x", own=False)
    assert _ws(moved, Event("Bash", {"command": "ls -la"}, True, out)).execute("Read", {"file_path": F}).ok is None
    followed = Event("Bash", {"command": "cd lib"}, True, "")
    assert _ws(followed, Event("Bash", {"command": "ls -la .."}, True, out)).execute("Read", {"file_path": F}).ok


def test_another_agents_write_makes_the_file_exist_but_not_read_by_this_one():
    other = Event("Write", {"file_path": F, "content": "x"}, True, "File created successfully", own=False)
    out = _ws(other).execute("Write", {"file_path": F, "content": "y"})
    assert out.ok is False and NOT_READ in out.observation


def test_inline_subagent_reads_are_not_relied_on():
    ws = _ws(_read(text="a\nb"))
    ws.reads_reliable = False
    assert ws.execute("Edit", {"file_path": F, "old_string": "a", "new_string": "c"}).ok is None
    assert ws.execute("Edit", {"file_path": F, "old_string": "q", "new_string": "c"}).ok is False  # still not found


def test_observed_ok_reads_the_recorded_result():
    assert observed_ok(None, "     1→x", {"type": "text"}) is True
    assert observed_ok(None, f"<tool_use_error>{NOT_READ}</tool_use_error>", f"Error: {NOT_READ}") is False
    assert observed_ok(True, "boom", None) is False
    assert observed_ok(None, "The user doesn't want to proceed", "User rejected tool use") is False


def test_snapshot_round_trip_keeps_every_rule_input():
    ws = _ws(
        _read(text="a\nb"),
        Event("Glob", {"pattern": "*.md", "path": D}, True, "", {"filenames": [], "truncated": False}),
    )
    again = Workspace.from_dict(ws.to_dict())
    assert again.to_dict() == ws.to_dict()
    assert again.execute("Read", {"file_path": f"{D}/x.md"}).ok is False


_EMPTY_LS = "total 0\ndrwxr-xr-x 2 u s 64 Jan 1 00:00 .\ndrwxr-xr-x 3 u s 96 Jan 1 00:00 .."


def test_a_path_under_a_missing_directory_is_missing_and_mkdir_makes_an_empty_one():
    ws = _ws(Event("Bash", {"command": "ls -la"}, True, _EMPTY_LS))  # the session's directory is empty
    # lib was not listed, so nothing under it exists
    assert ws.existence(f"{D}/lib/deep/a.py") is False
    assert ws.execute("Write", {"file_path": f"{D}/lib/a.py", "content": "x"}).ok is True
    made = _ws(Event("Bash", {"command": "ls -la"}, True, _EMPTY_LS), Event("Bash", {"command": "mkdir -p src"}, True))
    assert made.execute("Read", {"file_path": f"{D}/src"}).ok is False  # now a directory (EISDIR)
    assert made.execute("Write", {"file_path": f"{D}/src/b.py", "content": "x"}).ok is True  # new, hence empty
    # a directory that existed before mkdir -p keeps its unknown contents
    known = Event("Bash", {"command": f"ls -la {D}/old"}, True, _EMPTY_LS + "\n-rw-r--r-- 1 u s 3 Jan 1 00:00 f")
    kept = _ws(Event("Bash", {"command": "ls -la"}, True, _EMPTY_LS), known)
    kept.observe(Event("Bash", {"command": f"mkdir -p {D}/old"}, True))
    assert kept.existence(f"{D}/old/g.py") is None


def test_a_shell_redirection_writes_only_its_file_and_a_read_before_it_is_stale():
    other = f"{D}/other.py"
    ws = _ws(_read(text="a\nb"), _read(path=other, text="o"))
    heredoc = "cat > app.py << 'EOF'\nx = 1 > 0\nrm -rf /\nEOF"  # the here-document's text is data
    ws.observe(Event("Bash", {"command": heredoc}, True, ""))
    assert ws.files[other].text == "o"  # untouched
    assert ws.files[F].text is None and ws.files[F].exists
    # Claude Code compares the file's mtime with the read's time ("File has been modified since read")
    assert ws.execute("Write", {"file_path": F, "content": "y"}).ok is None
    assert ws.execute("Edit", {"file_path": F, "old_string": "x", "new_string": "y"}).ok is None
    ws.observe(_read(text="x = 1 > 0"))  # read again: no longer stale
    assert ws.execute("Edit", {"file_path": F, "old_string": "x = 1", "new_string": "x = 2"}).ok is True
    # a known text does not help: the Edit's mtime check comes first
    ws.observe(Event("Bash", {"command": "echo x >> app.py"}, True, ""))
    ws.files[F].text = "x = 2 > 0\nx"
    assert ws.execute("Edit", {"file_path": F, "old_string": "x = 2", "new_string": "x = 3"}).ok is None
    # another agent's Edit after this agent's read leaves the read in force (a 2.0.74 session shows it)
    theirs = Event("Edit", {"file_path": other, "old_string": "o", "new_string": "p"}, True, "updated", own=False)
    ws.observe(theirs)
    assert ws.execute("Edit", {"file_path": other, "old_string": "p", "new_string": "q"}).ok is True
    # a redirection the module cannot place (unknown program, variable target) may have written anywhere
    anywhere = _ws(_read(path=other, text="o"), Event("Bash", {"command": 'echo x > "$OUT"'}, True, ""))
    assert anywhere.files[other].text is None
    quoted = _ws(Event("Bash", {"command": 'echo "a > b"'}, True, "a > b"))  # no file b is written
    assert f"{D}/b" not in quoted.files


def test_in_a_shared_shell_another_agents_cd_is_followed():
    cd = Event("Bash", {"command": f"cd {D}/app"}, True, "", own=False)
    ls = Event("Bash", {"command": "ls -la"}, True, _EMPTY_LS)
    # unshared: the shell's cwd is no longer known
    assert _ws(cd, ls).existence(f"{D}/app/x.py") is None
    ws = Workspace(D)
    # Claude Code 1.0.x: inline subagents run in the main agent's shell
    ws.shell_shared = True
    for ev in (cd, ls):
        ws.observe(ev)
    assert ws.existence(f"{D}/app/x.py") is False
    assert Workspace.from_dict(ws.to_dict()).shell_shared


def test_shell_operators_inside_quotes_are_text():
    # POSIX shell quoting: a '|', ';', '&&' or '>' inside quotes is an argument, not a pipe, list or redirection
    # (real sessions: `tree -I 'node_modules|.git'`, `grep -E "(hook|state)"`, `sed 's|types/||'`)
    for command in (
        f"tree {D} -I 'node_modules|.git' -L 3",
        f'find {D} -name "*.ts" | grep -v node_modules | grep -E "(hook|useTodos|state)"',
        f'find {D} -name "*.ts" | xargs grep -l "useTodos\\|useStore"',
        "tree types/ 2>/dev/null || find types/ -type f -name '*.ts' | sed 's|types/||' | sort",
        "grep -n 'a > b; c && d' app.py",
        # the '&' of a redirection does not end a command
        "ls -la 2>&1 | head",
        "ls &> /dev/null",
    ):
        ws = _ws(_read(text="a\nb"), Event("Bash", {"command": command}, True, "out"))
        assert ws.files[F].text == "a\nb", command
        assert ws.execute("Read", {"file_path": F}).ok is True, command
    # an unquoted operator still splits, and a command substitution runs inside double quotes (not single)
    for command, writes in (
        ("grep -c x app.py | tee out.txt", True),
        # a background '&' and a newline end one
        ("ls & rm -f x", True),
        ("ls\nrm -f x", True),
        ('echo "$(touch x)"', True),
        ("echo '$(touch x)'", False),
    ):
        ws = _ws(_read(path=f"{D}/other.py", text="o"), Event("Bash", {"command": command}, True, ""))
        assert (ws.files[f"{D}/other.py"].text is None) is writes, command
    assert not may_write("ls -la 2>&1 | head") and not may_write("cat a |& head") and may_write("ls & rm -f x")
    # the unquoted '>' redirects (into that file only); the quoted one is echo's text
    ws = _ws(_read(path=f"{D}/other.py", text="o"), Event("Bash", {"command": 'echo "a > b" > out.txt'}, True, ""))
    assert ws.files[f"{D}/out.txt"].exists and f"{D}/b" not in ws.files and ws.files[f"{D}/other.py"].text == "o"


def test_a_find_that_deletes_or_executes_may_write():
    # findutils: -delete removes what it matches; -exec/-execdir/-ok run any command; -fprint writes a file
    for command in (f"find {D} -name '*.pyc' -delete", f"find {D} -name x -exec rm {{}} \\;", "find . -fprint out"):
        ws = _ws(_read(text="a\nb"), Event("Bash", {"command": command}, True, ""))
        assert ws.files[F].text is None, command
    listed = _ws(_read(text="a\nb"), Event("Bash", {"command": f"find {D} -name '*.py'"}, True, F))
    assert listed.files[F].text == "a\nb"


def test_a_refusal_as_unread_holds_until_the_agent_reads_the_file():
    """Claude Code's own "File has not been read yet" says what its read state held: the next Write or Edit
    of that file by the same agent, with no Read of it between, is refused the same way, whatever made the
    state so (a 1.0.98 session's inline subagents were refused right after their own Write). A Read ends it."""
    refused = Event("Edit", {"file_path": F, "old_string": "x", "new_string": "y"}, False, f"<tool_use_error>{NOT_READ}</tool_use_error>", f"Error: {NOT_READ}")  # fmt: skip
    wrote = Event("Write", {"file_path": F, "content": "x = 1"}, True, f"File created successfully at: {F}")
    for reliable in (True, False):
        ws = _ws(wrote, refused)
        ws.reads_reliable = reliable
        again = ws.execute("MultiEdit", {"file_path": F, "edits": [{"old_string": "x", "new_string": "z"}]})
        assert again.ok is False and NOT_READ in again.observation, (reliable, again)
        assert ws.execute("Write", {"file_path": F, "content": "x = 2"}).ok is False
        # the agent reads it: the refusal no longer decides (1.0.x inline subagents: cannot tell again)
        ws.observe(_read(text="x = 1"))
        after = ws.execute("Edit", {"file_path": F, "old_string": "x", "new_string": "y"})
        assert after.ok is (True if reliable else None), (reliable, after)
    # another agent's refusal says nothing of this agent's read state
    ws = _ws(wrote, Event(**{**refused.__dict__, "own": False}))
    assert ws.execute("Write", {"file_path": F, "content": "x = 2"}).ok is True
