"""Sessions from a team: object-store trace roots (``s3://bucket/prefix``) and ``sessions push``.

In:  a trace root URL (read side) or local trace roots and a destination URL (push side), through
fsspec / s3fs (``AWS_ENDPOINT_URL`` and the usual AWS variables).
Out:

* :func:`mirror`: the session files under the URL copied into a local mirror
  (``$COMPOSER_PIPELINE_HOME/trace_mirrors/<sha256(url)[:16]>/``, the same relative layout), downloading
  only what is new or changed by ETag and size (a manifest beside the mirror remembers both), and
  removing what is gone. Discovery, session keys, fingerprints and ingest then read the mirror as
  any local root: a changed object gets a new file (new mtime, new fingerprint), an unchanged one keeps
  its file, so the sensor sees exactly the changed sessions.
* :func:`push`: every session file under the local roots, **scrubbed on this machine** (the built-in
  and recipe secret patterns plus a URL's password, ``codex.scrub_url_credentials``; names cleaned as
  ingest cleans them, ``SessionFiles.rel``), uploaded to ``<to>/<path under its root>``. Nothing
  unscrubbed is sent. A manifest (``$COMPOSER_PIPELINE_HOME/push/<sha256(to)[:16]>.json``) keeps each
  file's size, mtime, scrubbed MD5 and the ETag its upload got: a re-push reads only files whose
  size or mtime changed and uploads only those whose scrubbed bytes changed or whose object is not
  the one it uploaded.

Deliberately simplified: only ``*.jsonl`` files are mirrored or pushed (sessions, agent files,
rollouts); a symbolic link is not followed and not pushed (as ingest, ``files.read_session_file``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from composer_pipeline.home import default_home
from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.ingest.files import read_session_file
from composer_pipeline.scrub import Scrubber


def is_remote(root: str | Path) -> bool:
    return "://" in str(root) and not str(root).startswith("file://")


def _etag(info: dict) -> str:
    return str(info.get("ETag") or info.get("etag") or "").strip('"')


def _objects(fs, base: str) -> dict[str, dict]:
    """``*.jsonl`` objects under ``base``: path relative to it -> ``{etag, size}``."""
    if not fs.exists(base):
        return {}
    found = fs.find(base, detail=True)
    prefix = base.rstrip("/") + "/"
    return {
        p[len(prefix) :]: {"etag": _etag(info), "size": int(info.get("size") or 0)}
        for p, info in found.items()
        if p.endswith(".jsonl") and p.startswith(prefix)
    }


@dataclass
class MirrorReport:
    # the local mirror: what discovery and ingest read
    root: Path
    downloaded: int = 0
    unchanged: int = 0
    removed: int = 0


def mirror_dir(url: str) -> Path:
    return default_home() / "trace_mirrors" / hashlib.sha256(url.encode()).hexdigest()[:16]


def mirror(url: str) -> MirrorReport:
    """Bring the local mirror of the trace root ``url`` up to date (see the module docstring)."""
    # (not at import: ~0.1 CPU-s of every ingest start)
    import fsspec

    fs, base = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    local = mirror_dir(url)
    manifest_path = local.with_suffix(".json")
    known = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    objects = _objects(fs, base)
    rep = MirrorReport(local)
    for rel, obj in sorted(objects.items()):
        target = local / rel
        if known.get(rel) == obj and target.is_file():
            rep.unchanged += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        tmp.write_bytes(fs.cat_file(f"{base.rstrip('/')}/{rel}"))
        tmp.replace(target)
        rep.downloaded += 1
    for rel in sorted(set(known) - set(objects)):
        (local / rel).unlink(missing_ok=True)
        rep.removed += 1
    local.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(objects, sort_keys=True))
    return rep


def local_root(root: str | Path) -> Path:
    """A trace root as a local directory: itself, or its mirror brought up to date (an ``s3://`` root)."""
    return mirror(str(root)).root if is_remote(root) else Path(root)


@dataclass
class PushReport:
    to: str
    uploaded: list[str] = field(default_factory=list)
    unchanged: int = 0
    secrets: Counter = field(default_factory=Counter)

    def summary(self) -> dict:
        return {
            "to": self.to,
            "uploaded": len(self.uploaded),
            "unchanged": self.unchanged,
            "secrets_scrubbed": dict(self.secrets),
        }


# Claude Code's sessions, Codex CLI's rollouts
DEFAULT_TRACE_ROOTS = ("~/.claude/projects", "~/.codex/sessions")


def push(roots: list[str | Path], to: str, extra_secret_patterns: dict[str, str] | None = None) -> PushReport:
    """Upload scrubbed copies of every session file under ``roots`` to ``to`` (see the module docstring)."""
    import fsspec

    # (not at import either: `ingest` imports this module, and the Codex reader loads msgspec and the renderer)
    from composer_pipeline.ingest import codex

    fs, base = fsspec.core.url_to_fs(to)
    fs.invalidate_cache()
    base = base.rstrip("/")
    manifest_path = default_home() / "push" / f"{hashlib.sha256(to.encode()).hexdigest()[:16]}.json"
    known = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    remote = _objects(fs, base)
    scrubber = Scrubber(extra_secret_patterns)
    rep = PushReport(to)
    manifest: dict[str, dict] = {}
    for root in roots:
        root = Path(root).expanduser()
        if not root.is_dir():
            continue
        for sf in discover_sessions(root):
            for p in sf.files:
                rel = sf.rel(p)  # (names cleaned as ingest cleans them)
                if os.path.islink(p) or not p.is_file():
                    continue
                st = p.stat()
                entry = known.get(rel)
                stat = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
                on_bucket = remote.get(rel, {}).get("etag")
                if entry and {k: entry[k] for k in stat} == stat and on_bucket == entry["etag"]:
                    manifest[rel] = entry
                    rep.unchanged += 1
                    continue
                data, error = read_session_file(p)
                if data is None:
                    raise OSError(f"cannot read {p}: {error}")
                scrubber.counts = Counter()
                clean = codex.scrub_url_credentials(scrubber.scrub_bytes(data), scrubber.counts)
                rep.secrets.update(scrubber.counts)
                md5 = hashlib.md5(clean).hexdigest()
                if entry and entry["md5"] == md5 and on_bucket == entry["etag"]:
                    manifest[rel] = {**entry, **stat}
                    rep.unchanged += 1
                    continue
                fs.pipe_file(f"{base}/{rel}", clean)
                etag = _etag(fs.info(f"{base}/{rel}"))
                manifest[rel] = {**stat, "md5": md5, "etag": etag}
                rep.uploaded.append(rel)
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps({**known, **manifest}, sort_keys=True))
    return rep
